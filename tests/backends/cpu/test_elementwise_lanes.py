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


def _check(g: Graph, feeds: list[np.ndarray], what: str, steps: int | None = None) -> None:
    """Bit-identical to the interpreter on the host's vectors (one and two threads) and AVX2's (two);
    `steps`: the kernel calls the graph compiles to."""
    want = InterpreterBackend().compile(g).run(feeds)
    for isa, threads in [("host", 1), ("host", 2)] + [("avx2", 2)] * (len(_isas()) - 1):
        ex = CpuBackend().compile(g, threads=threads, isa=isa, cache=False)
        for k, (a, b) in enumerate(zip(ex.run(feeds), want)):
            _assert_same_bits(a, np.asarray(b), f"{what} isa={isa} threads={threads} output {k}")
        assert steps is None or ex.steps == steps, f"{what}: {ex.steps} steps"


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
    _check(g, feeds, f"hw={hw}", steps=2)


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
    """Arithmetic, selects and activations on float32 do (exp / tanh / erf as the fused epilogues compute
    them); other libm math (Exp) and other dtypes keep the scalar loop, which LLVM may still vectorize."""
    assert EW.lane_group(_group("Relu")) and EW.lane_group(_group("Clip", attrs={"min": 0.0, "max": 6.0}))
    assert EW.lane_group(_group("Sigmoid")) and EW.lane_group(_group("Gelu", attrs={"approximate": "none"}))
    assert not EW.lane_group(_group("Exp"))
    assert not EW.lane_group(_group("Relu", np.float16))
    assert not EW.lane_group(_group("Relu", np.float64))
    for vw in (8, 16):
        text = str(EW.emit_fused(ir.Module(), "k", _group("Relu"), vw))
        assert f"<{vw} x float>" in text and f"llvm.masked.store.v{vw}f32" in text  # 35 = 2 * 16 + 3
    assert "x float>" not in str(EW.emit_fused(ir.Module(), "k", _group("Relu")))
    assert "x float>" not in str(EW.emit_fused(ir.Module(), "k", _group("Exp"), 16))
    assert "erf" not in str(EW.emit_fused(ir.Module(), "k", _group("Gelu", attrs={"approximate": "none"}), 16))


@pytest.mark.parametrize("axis", [1, 2, -1])
@pytest.mark.parametrize("op", ["Relu", "Floor"])  # vector rows, and the scalar loop
def test_concat_joins_its_only_readers_loop(axis, op) -> None:
    """A Concat whose output only an elementwise group reads is no step of its own: each part's slab is
    a loop of the group's kernel, along any axis, a part repeated, odd part sizes."""
    rng = np.random.default_rng(2)
    shapes = [(2, 3, 5, 7), (2, 3, 5, 7), (2, 3, 5, 7)]
    ax = axis % 4
    for s, size in zip(shapes, (3, 1, 4)):
        s_ = list(s)
        s_[ax] = size
        shapes[shapes.index(s)] = tuple(s_)
    g = Graph("concat_group")
    xs = [g.add_input(f"x{i}", TensorType(F32, s)) for i, s in enumerate(shapes)]
    cat = _node(g, "Concat", xs[0], xs[1], xs[2], xs[0], axis=axis)
    out_shape = cat.shape
    bias = g.add_constant("bias", rng.standard_normal(out_shape[ax:]).astype(F32))
    g.outputs = [_node(g, "Transpose", _node(g, op, _node(g, "Add", cat, bias)), perm=[3, 2, 1, 0])]
    feeds = [_specials(rng.standard_normal(s).astype(F32)) for s in shapes]
    _check(g, feeds, f"{op} axis={axis}", steps=2)


def test_concat_read_elsewhere_stays_a_step() -> None:
    g = Graph("concat_shared")
    a = g.add_input("a", TensorType(F32, (1, 3, 4, 4)))
    b = g.add_input("b", TensorType(F32, (1, 5, 4, 4)))
    cat = _node(g, "Concat", a, b, axis=1)
    g.outputs = [_node(g, "Relu", cat), _node(g, "Transpose", cat, perm=[0, 2, 3, 1])]
    rng = np.random.default_rng(3)
    _check(g, [rng.standard_normal((1, 3, 4, 4)).astype(F32), rng.standard_normal((1, 5, 4, 4)).astype(F32)], "shared",
           steps=3)


def test_integer_concat_group_agrees() -> None:
    """The scalar loop of a non-float group over a Concat (int32 Add, bool Where)."""
    i32 = np.dtype(np.int32)
    g = Graph("concat_int")
    a = g.add_input("a", TensorType(i32, (2, 3, 9)))
    b = g.add_input("b", TensorType(i32, (2, 2, 9)))
    cat = _node(g, "Concat", a, b, axis=1)
    one = g.add_constant("one", np.array(7, i32))
    s = _node(g, "Add", cat, one)
    g.outputs = [_node(g, "Where", _node(g, "Greater", s, one), s, cat)]
    rng = np.random.default_rng(4)
    feeds = [rng.integers(-20, 20, (2, 3, 9), dtype=i32), rng.integers(-20, 20, (2, 2, 9), dtype=i32)]
    want = InterpreterBackend().compile(g).run(feeds)[0]
    for threads in (1, 2):
        ex = CpuBackend().compile(g, threads=threads, cache=False)
        np.testing.assert_array_equal(ex.run(feeds)[0], want, err_msg=f"threads={threads}")
        assert ex.steps == 1
