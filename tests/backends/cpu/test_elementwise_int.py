"""Integer and bool elementwise code on the CPU: chains of bitwise, shift, Mod, comparison and logic ops
fuse into one loop, agree with the interpreter on the host's code and on AVX2 code, and the loops that
LLVM can vectorize (shifts, masks, compares, selects) are vector code."""

from __future__ import annotations

import numpy as np
import pytest

from glowpy.backends.cpu import CpuBackend
from glowpy.backends.cpu.target import isa_available
from glowpy.backends.interpreter import InterpreterBackend
from glowpy.ir.graph import Graph
from glowpy.ir.types import TensorType

N = 1027  # not a multiple of any vector width: the loops' remainders run too


def _bit_graph(dtype) -> Graph:
    """y = Where(a >= b and not a <= 3, (a << 3) & b, (a >> b) ^ ~b) for integer a, b."""
    dt = np.dtype(dtype)
    g = Graph(f"bits_{dt.name}")
    a = g.add_input("a", TensorType(dt, (N,)))
    b = g.add_input("b", TensorType(dt, (N,)))
    three = g.add_constant("three", np.array(3, dt))

    def node(op, *ins, **attrs):
        return g.add_node(op, list(ins), attrs, name=f"{op.lower()}{len(g.nodes)}").outputs[0]

    left = node("BitwiseAnd", node("BitShift", a, three, direction="LEFT"), b)
    right = node("BitwiseXor", node("BitShift", a, b, direction="RIGHT"), node("BitwiseNot", b))
    cond = node("And", node("GreaterOrEqual", a, b), node("Not", node("LessOrEqual", a, three)))
    g.outputs = [node("Where", cond, left, right)]
    return g


def _mod_graph(dtype, fmod: int) -> Graph:
    dt = np.dtype(dtype)
    g = Graph(f"mod_{dt.name}_{fmod}")
    a = g.add_input("a", TensorType(dt, (N,)))
    b = g.add_input("b", TensorType(dt, (N,)))
    m = g.add_node("Mod", [a, b], {"fmod": fmod}, name="mod").outputs[0]
    g.outputs = [g.add_node("Sign", [m], name="sign").outputs[0]]
    return g


def _feeds(dtype, seed: int = 0) -> list[np.ndarray]:
    dt = np.dtype(dtype)
    rng = np.random.default_rng(seed)
    info = np.iinfo(dt)
    a = rng.integers(info.min, info.max, N, dtype=dt, endpoint=True)
    b = rng.integers(0 if dt.kind == "u" else -9, dt.itemsize * 8 + 3, N).astype(dt)
    b[:4] = [0, 1, dt.itemsize * 8, dt.itemsize * 8 - 1]
    return [a, b]


def _isas() -> list[str]:
    return ["host", "avx2"] if isa_available("avx2") else ["host"]


@pytest.mark.parametrize("dtype", [np.uint8, np.int16, np.int32, np.uint64], ids=["u8", "i16", "i32", "u64"])
def test_bit_chain_is_one_loop_and_agrees(dtype) -> None:
    g = _bit_graph(dtype)
    feeds = _feeds(dtype)
    want = InterpreterBackend().compile(g).run(feeds)[0]
    for isa in _isas():
        ex = CpuBackend().compile(g, threads=1, cache=False, isa=isa)
        assert ex.steps == 1, f"isa={isa}: {ex.steps} kernels"
        np.testing.assert_array_equal(ex.run(feeds)[0], want, err_msg=f"isa={isa}")


@pytest.mark.parametrize("fmod", [0, 1])
@pytest.mark.parametrize("dtype", [np.int8, np.uint16, np.int64], ids=["i8", "u16", "i64"])
def test_mod_sign_agrees(dtype, fmod) -> None:
    g = _mod_graph(dtype, fmod)
    feeds = _feeds(dtype, seed=1)
    feeds[0][:2] = np.iinfo(dtype).min  # INT_MIN % -1 and % 0 must not trap
    feeds[1][4] = np.array(-1).astype(dtype)
    want = InterpreterBackend().compile(g).run(feeds)[0]
    for isa in _isas():
        got = CpuBackend().compile(g, threads=2, cache=False, isa=isa).run(feeds)[0]
        np.testing.assert_array_equal(got, want, err_msg=f"isa={isa}")


def test_bit_chain_vectorizes_on_avx2() -> None:
    if not isa_available("avx2"):
        pytest.skip("host cannot run AVX2 code")  # every x86-64 host this project targets has it
    asm = CpuBackend().emit_assembly(_bit_graph(np.uint32), threads=1, isa="avx2")
    assert "ymm" in asm and "zmm" not in asm
