"""Float32 elementwise groups run their innermost dim in vectors (kernels/elementwise.py `_lane_row`): an
operand broadcast along that dim is splatted once per row, the last vector is masked. The results are
bit-identical to the interpreter's at both vector widths, on one and two threads, and in place over a
Concat (DenseNet's BatchNorm -> Relu on the concatenated features)."""

from __future__ import annotations

import numpy as np
import pytest
from llvmlite import ir

from glowpy.backends.cpu import CpuBackend
from glowpy.backends.cpu.kernels import elementwise as EW
from glowpy.backends.cpu.target import isa_available
from glowpy.backends.interpreter import InterpreterBackend
from glowpy.ir.graph import Graph
from glowpy.ir.types import TensorType

F32 = np.dtype(np.float32)


def _isas() -> list[str]:
    return ["host", "avx2"] if isa_available("avx2") else ["host"]


def _specials(a: np.ndarray) -> np.ndarray:
    flat = a.reshape(-1)
    flat[:5] = [np.nan, np.inf, -np.inf, -0.0, 0.0][:flat.size]
    return a


def _assert_same_bits(got: np.ndarray, want: np.ndarray, what: str) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype, what
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan, err_msg=what)
    np.testing.assert_array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32), err_msg=what)


def _check(g: Graph, feeds: list[np.ndarray], what: str) -> None:
    want = InterpreterBackend().compile(g).run(feeds)
    for isa in _isas():
        for threads in (1, 2):
            got = CpuBackend().compile(g, threads=threads, isa=isa, cache=False).run(feeds)
            for k, (a, b) in enumerate(zip(got, want)):
                _assert_same_bits(a, np.asarray(b), f"{what} isa={isa} threads={threads} output {k}")


def _node(g: Graph, op: str, *ins, **attrs):
    return g.add_node(op, list(ins), attrs, name=f"{op.lower()}{len(g.nodes)}").outputs[0]


@pytest.mark.parametrize("hw", [(7, 7), (14, 14), (5, 3), (1, 1), (4, 4)], ids=str)
def test_batchnorm_relu_over_concat_agrees(hw) -> None:
    """Concat -> per-channel Mul -> Add -> Relu, its output read by a Transpose (so it lives in the arena,
    where it may take the Concat's buffer): plane sizes below, at and off the vector widths."""
    rng = np.random.default_rng(0)
    parts = (5, 3, 32)
    g = Graph("bn_relu_concat")
    xs = [g.add_input(f"x{i}", TensorType(F32, (1, c) + hw)) for i, c in enumerate(parts)]
    c = sum(parts)
    scale = g.add_constant("scale", rng.standard_normal((c, 1, 1)).astype(F32))
    shift = g.add_constant("shift", rng.standard_normal((c, 1, 1)).astype(F32))
    cat = _node(g, "Concat", *xs, axis=1)
    act = _node(g, "Relu", _node(g, "Add", _node(g, "Mul", cat, scale), shift))
    g.outputs = [_node(g, "Transpose", act, perm=[0, 2, 3, 1])]
    feeds = [_specials(rng.standard_normal((1, p) + hw).astype(F32)) for p in parts]
    _check(g, feeds, f"hw={hw}")


@pytest.mark.parametrize("shapes", [
    ((3, 37), (3, 37)),            # one flat dim, split between threads at run time
    ((2, 3, 5, 7), (3, 1, 7)),     # broadcast on outer dims, contiguous along the row
    ((2, 3, 5, 7), (5, 1)),        # constant along the row: splatted per row
    ((2, 19), (1,)),               # a scalar operand
], ids=lambda s: "x".join(map(str, s[0])) + "_" + "x".join(map(str, s[1])))
def test_arithmetic_chain_agrees(shapes) -> None:
    """Every op with a vector form, NaN and infinities included, over broadcasts of either kind."""
    xs, ys = shapes
    rng = np.random.default_rng(1)
    g = Graph("lanes")
    x = g.add_input("x", TensorType(F32, xs))
    y = g.add_input("y", TensorType(F32, ys))
    half = g.add_constant("half", np.array(0.5, F32))
    v = _node(g, "Div", _node(g, "Sub", x, y), _node(g, "Add", y, half))
    v = _node(g, "Max", _node(g, "Min", v, x), _node(g, "Neg", y))
    v = _node(g, "PRelu", _node(g, "Mul", v, half), y)
    v = _node(g, "LeakyRelu", v, alpha=0.25)
    v = _node(g, "HardSigmoid", _node(g, "Clip", v, min=-1.5, max=2.0), alpha=0.3, beta=0.4)
    g.outputs = [_node(g, "Relu", _node(g, "Sub", v, x))]
    _check(g, [_specials(rng.standard_normal(xs).astype(F32)), rng.standard_normal(ys).astype(F32)],
           f"shapes={shapes}")


def _group(op: str, dtype=F32, attrs=None) -> EW.FusedElementwise:
    dt = np.dtype(dtype)
    return EW.FusedElementwise((1, 8, 5, 7), dt, [EW.Operand((1, 8, 5, 7), dt), EW.Operand((8, 1, 1), dt)], [
        EW.Expr("Mul", {}, [("in", 0), ("in", 1)], [dt, dt], dt),
        EW.Expr(op, attrs or {}, [("expr", 0)], [dt], dt)], ["x", "s"])


def test_which_groups_run_in_vectors() -> None:
    """Arithmetic and selects on float32 do; libm math (exp in Sigmoid, Exp) and other dtypes keep the
    scalar loop, which LLVM may still vectorize."""
    assert EW.lane_group(_group("Relu")) and EW.lane_group(_group("Clip", attrs={"min": 0.0, "max": 6.0}))
    assert not EW.lane_group(_group("Sigmoid"))
    assert not EW.lane_group(_group("Exp"))
    assert not EW.lane_group(_group("Relu", np.float16))
    assert not EW.lane_group(_group("Relu", np.float64))
    for vw in (8, 16):
        text = str(EW.emit_fused(ir.Module(), "k", _group("Relu"), vw))
        assert f"<{vw} x float>" in text and f"llvm.masked.store.v{vw}f32" in text  # 35 = 2 * 16 + 3
    assert "x float>" not in str(EW.emit_fused(ir.Module(), "k", _group("Relu")))
    assert "x float>" not in str(EW.emit_fused(ir.Module(), "k", _group("Sigmoid"), 16))
