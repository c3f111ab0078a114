"""Code generation: readable LLVM IR, fusion into few kernels, unsupported nodes named, vector code."""

from __future__ import annotations

import numpy as np
import pytest

import glowpy
import glowpy.backends.cpu as cpu_mod
from glowpy.backends import DEFAULT_BACKEND, get_backend
from glowpy.backends.cpu import SUPPORTED_OPS, CpuBackend
from glowpy.backends.cpu.target import isa_available
from glowpy.backends.interpreter import InterpreterBackend
from glowpy.errors import UnsupportedAttribute, UnsupportedDatatype, UnsupportedOperator
from glowpy.ir.graph import Graph, Node
from glowpy.ir.ops import OPS
from glowpy.ir.types import TensorType

from .util import assert_close, run_both

F32 = np.float32


def test_cpu_is_registered_and_the_default() -> None:
    assert DEFAULT_BACKEND == "cpu"
    assert isinstance(get_backend("cpu"), CpuBackend)


WITHOUT_KERNEL: set[str] = set()
WITHOUT_KERNEL |= {"If", "Scan"}  # the optimizer makes them straight-line code for cpu (should_lower)


def test_every_ir_op_has_a_kernel() -> None:
    assert set(OPS) - set(SUPPORTED_OPS) == WITHOUT_KERNEL
    assert set(SUPPORTED_OPS) <= set(OPS)


def block_graph() -> Graph:
    """conv -> BN -> add(residual) -> relu, then an elementwise chain with broadcasting."""
    rng = np.random.default_rng(0)
    g = Graph("block")
    x = g.add_input("x", TensorType(F32, (1, 4, 6, 6)))
    w = g.add_constant("w", rng.standard_normal((4, 4, 3, 3)).astype(F32) * 0.3)
    b = g.add_constant("b", rng.standard_normal(4).astype(F32))
    c = g.add_node("Conv", [x, w, b], {"strides": (1, 1), "pads": (1, 1, 1, 1), "dilations": (1, 1)},
                   name="conv").outputs[0]
    bn = [g.add_constant(f"bn{i}", rng.uniform(0.5, 1.5, 4).astype(F32)) for i in range(4)]
    y = g.add_node("BatchNormalization", [c, *bn], name="bn").outputs[0]
    y = g.add_node("Add", [y, x], name="residual").outputs[0]
    y = g.add_node("Relu", [y], name="relu").outputs[0]
    s = g.add_constant("s", rng.standard_normal((4, 1, 1)).astype(F32))
    z = g.add_node("Mul", [y, s], name="scale").outputs[0]
    z = g.add_node("Sigmoid", [z], name="sig").outputs[0]
    z = g.add_node("Sub", [z, g.add_constant("half", np.float32(0.5))], name="center").outputs[0]
    g.outputs = [z]
    return g


def optimized_block() -> Graph:
    return glowpy.optimize(block_graph(), "cpu")


def test_fusion_makes_two_kernels() -> None:
    """The optimizer folds the BN into the conv and fuses residual and Relu (one fused Conv node); the
    backend emits that node as one kernel and groups the elementwise chain after it into one loop."""
    g = optimized_block()
    conv = g.nodes[0]
    assert conv.op == "Conv" and conv.attrs["activation"] == "relu" and len(conv.inputs) == 4
    prog = CpuBackend().build(g, threads=1)
    kernels = [s for s in prog.steps if s.fn is not None]
    assert [[n.op for n in s.nodes] for s in kernels] == [["Conv"], ["Mul", "Sigmoid", "Sub"]]
    feeds = [np.random.default_rng(1).standard_normal((1, 4, 6, 6)).astype(F32)]
    got, want = run_both(g, feeds)
    assert_close(got, want)


def test_unoptimized_graph_gets_separate_kernels() -> None:
    """Without the optimizer nothing is folded: the Conv is one kernel, the elementwise chain after it
    (BatchNormalization included, as a per-channel affine) another, and the result agrees."""
    prog = CpuBackend().build(block_graph(), threads=1)
    kernels = [s for s in prog.steps if s.fn is not None]
    assert [[n.op for n in s.nodes] for s in kernels] == [
        ["Conv"], ["BatchNormalization", "Add", "Relu", "Mul", "Sigmoid", "Sub"]]
    feeds = [np.random.default_rng(1).standard_normal((1, 4, 6, 6)).astype(F32)]
    got, want = run_both(block_graph(), feeds)
    assert_close(got, want)


def test_llvm_ir_is_readable() -> None:
    text = CpuBackend().emit_llvm(optimized_block(), threads=1)
    assert 'define void @"glowpy_run"(i8** %"weights", i8* %"arena", i8** %"inputs", i8** %"outputs")' in text
    assert "k001.Mul.scale.Sigmoid.Sub" in text  # kernels are named after their nodes
    assert "i0.body:" in text  # named loop blocks
    assert "glowpy.worker" in text


def test_optimized_fused_forms_are_supported() -> None:
    """The optimizer's output (activation attributes, Conv's residual operand) compiles and agrees."""
    g = block_graph()
    feeds = {"x": np.random.default_rng(2).standard_normal((1, 4, 6, 6)).astype(F32)}
    want = glowpy.compile(block_graph(), backend="interpreter", optimize=False).run(feeds)
    got = glowpy.compile(g, backend="cpu").run(feeds)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-5)


def test_unsupported_op_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    g = block_graph()
    monkeypatch.setattr(cpu_mod, "SUPPORTED_OPS", SUPPORTED_OPS - {"Sigmoid"})
    be = CpuBackend()
    sig = next(n for n in g.nodes if n.op == "Sigmoid")
    assert not be.is_op_supported(sig)
    assert be.is_op_supported(g.nodes[0])
    with pytest.raises(UnsupportedOperator, match="'sig'"):
        be.compile(g)
    assert not be.is_op_supported(Node("NoSuchOp", "n", [], [], {}))


def test_unsupported_dtype_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    g = Graph("half")
    x = g.add_input("x", TensorType(np.float16, (4,)))
    g.outputs = [g.add_node("Exp", [x], name="exp16").outputs[0]]
    be = CpuBackend()
    monkeypatch.setattr(be, "_dtype_ok", lambda dt: np.dtype(dt) != np.float16)
    assert not be.is_op_supported(g.nodes[0])
    with pytest.raises(UnsupportedDatatype, match="'exp16'"):
        be.compile(g)


@pytest.mark.skipif(CpuBackend().target.vector_width < 16, reason="host has no AVX-512")
def test_elementwise_loops_vectorize() -> None:
    g = Graph("vec")
    x = g.add_input("x", TensorType(F32, (4096,)))
    y = g.add_node("Mul", [x, g.add_constant("k", np.float32(3.0))], name="mul").outputs[0]
    g.outputs = [g.add_node("Relu", [y], name="relu").outputs[0]]
    asm = CpuBackend().emit_assembly(g, threads=1)
    assert "zmm" in asm


def test_avx2_build_has_no_avx512() -> None:
    """isa="avx2" builds 8-lane code without AVX-512 on any x86 host with AVX2 (on an AVX2-only host it
    is the host's own code); it agrees with the interpreter where the host can run it."""
    be = CpuBackend()
    if not isa_available("avx2"):
        with pytest.raises(UnsupportedAttribute, match="cannot run avx2"):
            be.build(optimized_block(), isa="avx2")
        return
    asm = be.emit_assembly(optimized_block(), threads=1, isa="avx2")
    assert "ymm" in asm and "zmm" not in asm
    feeds = [np.random.default_rng(1).standard_normal((1, 4, 6, 6)).astype(F32)]
    got = be.compile(optimized_block(), threads=1, isa="avx2", cache=False).run(feeds)
    assert_close(got, InterpreterBackend().compile(block_graph()).run(feeds))
    with pytest.raises(UnsupportedAttribute, match="unknown instruction set"):
        be.build(optimized_block(), isa="sse9")


def test_profile_reports_every_step() -> None:
    g = optimized_block()
    ex = CpuBackend().compile(g, threads=1, profile=True)
    ex.run([np.ones((1, 4, 6, 6), F32)])
    prof = ex.profile()
    assert [s.kernel.split(".")[1] for s in prof.steps] == ["Conv", "Mul"]
    assert prof.threads == 1 and [k for k, *_ in prof.spans] == [s.index for s in prof.steps]
    assert all(prof.begin <= start <= end <= prof.end for _, _, start, end in prof.spans)


def test_unfoldable_batchnorm_is_lowered_for_the_elementwise_fuser() -> None:
    """A BatchNormalization after a Concat cannot fold into weights: CpuBackend.should_lower makes it a
    per-channel Mul + Add (scale and shift computed at compile time), one loop with the Relu after it and
    the Concat, which only it reads, before it (fusion.grow_group)."""
    rng = np.random.default_rng(5)
    g = Graph("concat_bn")
    a = g.add_input("a", TensorType(F32, (1, 3, 5, 5)))
    b = g.add_input("b", TensorType(F32, (1, 2, 5, 5)))
    c = g.add_node("Concat", [a, b], {"axis": 1}, name="cat").outputs[0]
    bn = [g.add_constant(f"bn{i}", rng.uniform(0.5, 1.5, 5).astype(F32)) for i in range(4)]
    y = g.add_node("BatchNormalization", [c, *bn], name="bn").outputs[0]
    g.outputs = [g.add_node("Relu", [y], name="relu").outputs[0]]
    be = CpuBackend()
    assert be.should_lower(g.nodes[1]) and not be.should_lower(g.nodes[0])
    opt = glowpy.optimize(g, be)
    assert [n.op for n in opt.nodes] == ["Concat", "Mul", "Add", "Relu"]
    kernels = [s for s in be.build(opt, threads=1).steps if s.fn is not None]
    assert [[n.op for n in s.nodes] for s in kernels] == [["Concat", "Mul", "Add", "Relu"]]
    feeds = [rng.standard_normal((1, 3, 5, 5)).astype(F32), rng.standard_normal((1, 2, 5, 5)).astype(F32)]
    got, want = run_both(opt, feeds)
    assert_close(got, want)
    assert_close(got, InterpreterBackend().compile(g).run(feeds))
