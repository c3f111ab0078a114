"""The cpu kernels of QuantizeLinear, DequantizeLinear and DynamicQuantizeLinear (kernels/quant.py): bit for
bit with the interpreter on the host's code and on AVX2 code, per tensor, per axis (inner and last axis)
and blocked (inner and last axis, a partial last block), every integer type, each division precision,
exact halves (round half to even), saturation, NaN and infinities, run tails and more than one thread;
and through ONNX models against onnx.reference.ReferenceEvaluator, the 4-bit types included."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import glowpy
import glowpy.importer.quant  # noqa: F401  (the quantization rows of the op table)
from glowpy.backends.cpu import CpuBackend
from glowpy.backends.cpu.target import isa_available
from glowpy.backends.interpreter import InterpreterBackend
from glowpy.ir.graph import Graph
from glowpy.ir.ops.quant import expand_param
from glowpy.ir.types import TensorType

ISAS = ["host", "avx2"] if isa_available("avx2") else ["host"]
I8, U8, I16, U16, I32 = (np.dtype(t) for t in (np.int8, np.uint8, np.int16, np.uint16, np.int32))
F16, F32 = np.dtype(np.float16), np.dtype(np.float32)
QTYPES = [I8, U8, I16, U16]


def ties(rng, shape, scale) -> np.ndarray:
    """x / scale: exact halves (ties), whole numbers and values past every type's range."""
    halves = rng.integers(-70000, 70000, shape) / 2.0
    x = np.where(rng.random(shape) < 0.85, halves, rng.uniform(-2e5, 2e5, shape)) * scale
    return x


def zps(rng, dtype, shape) -> np.ndarray:
    info = np.iinfo(dtype)
    return rng.integers(int(info.min) // 2, int(info.max) // 2 + 1, shape).astype(dtype)


def param_shape(shape, axis, block, kind) -> tuple[int, ...]:
    if kind == "tensor":
        return ()
    if kind == "axis":
        return (shape[axis],)
    return tuple(-(-d // block) if i == axis else d for i, d in enumerate(shape))


def run(g: Graph, feeds: list[np.ndarray], isa: str, threads: int = 1) -> None:
    """cpu output == interpreter output, bit for bit (and dtype, shape)."""
    want = InterpreterBackend().compile(g).run(feeds)
    got = CpuBackend().compile(g, isa=isa, threads=threads, cache=False).run(feeds)
    for w, o in zip(want, got):
        assert o.dtype == w.dtype and o.shape == w.shape
        np.testing.assert_array_equal(o, w)


def qgraph(op: str, x_type: TensorType, scale: np.ndarray, zp: np.ndarray, attrs: dict, runtime_params: bool) -> Graph:
    g = Graph(op)
    x = g.add_input("x", x_type)
    if runtime_params:
        s, z = g.add_input("s", TensorType(scale.dtype, scale.shape)), g.add_input("z", TensorType(zp.dtype, zp.shape))
    else:
        s, z = g.add_constant("s", scale), g.add_constant("z", zp)
    g.outputs = [g.add_node(op, [x, s, z], attrs, name="q").outputs[0]]
    return g


# (shape, axis, block, kind): per tensor over run tails and several chunks, per axis with elements after
# the axis and along the last axis, blocked both ways with a partial last block
GRANULARITIES = [
    ((37,), 0, 0, "tensor"),
    ((3, 40000), 1, 0, "tensor"),
    ((2, 5, 19), 1, 0, "axis"),
    ((4, 45), 1, 0, "axis"),
    ((3, 10, 7), 1, 4, "block"),
    ((6, 50), 1, 16, "block"),
]


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("shape,axis,block,kind", GRANULARITIES, ids=[g[3] + str(g[0]) for g in GRANULARITIES])
def test_quantize(isa, shape, axis, block, kind):
    """One node per output type, each with its own scales and zero points."""
    rng = np.random.default_rng(zlib.crc32(f"q{shape}{kind}".encode()))
    ps = param_shape(shape, axis, block, kind)
    g = Graph("q")
    x_in = g.add_input("x", TensorType(F32, shape))
    scale = (2.0 ** rng.integers(-4, 3, ps)).astype(F32)  # powers of two keep the ties exact
    x = (ties(rng, shape, 1.0) * expand_param(scale, shape, axis, block)).astype(F32)
    for k, dtype in enumerate(QTYPES):
        s = g.add_constant(f"s{k}", (scale * np.float32(2.0 ** -k)).astype(F32))
        z = g.add_constant(f"z{k}", zps(rng, dtype, ps))
        attrs = {"axis": axis, "block_size": block, "dtype": dtype, "precision": None}
        g.outputs.append(g.add_node("QuantizeLinear", [x_in, s, z], attrs, name=f"q{k}").outputs[0])
    run(g, [x], isa, threads=2)


PRECISIONS = [(F16, F16, None), (F16, F32, None), (F32, F32, F16), (I32, F32, None), (I32, F16, None),
              (I32, F32, F32), (F32, F16, None)]


@pytest.mark.parametrize("isa", ISAS)
def test_quantize_precisions(isa):
    """The division in numpy's promotion of x and scale (float64 for int32 x) or in `precision`
    (float16 rounds the quotient to half before rounding to an integer): one node per combination,
    scales and zero points fed at run time."""
    rng = np.random.default_rng(11)
    shape = (3, 4, 33)
    g, feeds = Graph("qp"), []
    for k, (x_dtype, scale_dtype, precision) in enumerate(PRECISIONS):
        if x_dtype == I32:
            feeds.append(rng.integers(-3000, 3000, shape).astype(I32))
        else:
            feeds.append((rng.standard_normal(shape) * 200).astype(x_dtype))
        feeds += [rng.uniform(0.01, 3.0, (4,)).astype(scale_dtype), zps(rng, U8, (4,))]
        x = g.add_input(f"x{k}", TensorType(x_dtype, shape))
        s = g.add_input(f"s{k}", TensorType(scale_dtype, (4,)))
        z = g.add_input(f"z{k}", TensorType(U8, (4,)))
        attrs = {"axis": 1, "block_size": 0, "dtype": U8, "precision": precision}
        g.outputs.append(g.add_node("QuantizeLinear", [x, s, z], attrs, name=f"q{k}").outputs[0])
    run(g, feeds, isa)


@pytest.mark.parametrize("isa", ISAS)
def test_quantize_specials(isa):
    """NaN gives 0 (the interpreter's rule; ONNX leaves it undefined), infinities saturate, a zero scale
    gives infinities and NaN (0 / 0)."""
    x = np.array([np.nan, np.inf, -np.inf, 0.0, 1.5, -2.5, 1e30, -1e30, 3.0, 0.0] * 3, F32)
    g = qgraph("QuantizeLinear", TensorType(F32, x.shape), np.array(0.0, F32), np.array(-5, I8),
               {"axis": 1, "block_size": 0, "dtype": I8, "precision": None}, runtime_params=True)
    for s in (np.float32(0.0), np.float32(1.0)):
        run(g, [x, np.array(s, F32), np.array(-5, I8)], isa)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("shape,axis,block,kind", GRANULARITIES, ids=[g[3] + str(g[0]) for g in GRANULARITIES])
def test_dequantize(isa, shape, axis, block, kind):
    """One node per input type (int32 included), each with its own scales and zero points."""
    rng = np.random.default_rng(zlib.crc32(f"dq{shape}{kind}".encode()))
    ps = param_shape(shape, axis, block, kind)
    g, feeds = Graph("dq"), []
    for k, dtype in enumerate([*QTYPES, I32]):
        info = np.iinfo(dtype)
        feeds.append(rng.integers(info.min, int(info.max) + 1, shape, dtype=np.int64).astype(dtype))
        x = g.add_input(f"x{k}", TensorType(dtype, shape))
        s = g.add_constant(f"s{k}", rng.uniform(1e-4, 2.0, ps).astype(F32))
        z = g.add_constant(f"z{k}", rng.integers(info.min, int(info.max) + 1, ps, dtype=np.int64).astype(dtype))
        attrs = {"axis": axis, "block_size": block, "dtype": F32}
        g.outputs.append(g.add_node("DequantizeLinear", [x, s, z], attrs, name=f"dq{k}").outputs[0])
    run(g, feeds, isa, threads=2)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("scale_dtype,out", [(F16, F16), (F32, F16), (F16, F32)], ids=str)
def test_dequantize_float16(isa, scale_dtype, out):
    rng = np.random.default_rng(5)
    x = rng.integers(-128, 128, (2, 3, 21)).astype(I8)
    scale = rng.uniform(0.01, 40.0, (3,)).astype(scale_dtype)
    zp = rng.integers(-20, 20, (3,)).astype(I8)
    g = qgraph("DequantizeLinear", TensorType(I8, x.shape), scale, zp, {"axis": 1, "block_size": 0, "dtype": out},
               runtime_params=True)
    run(g, [x, scale, zp], isa)


def dynamic_graph(shape) -> Graph:
    g = Graph("dql")
    x = g.add_input("x", TensorType(F32, shape))
    g.outputs = list(g.add_node("DynamicQuantizeLinear", [x], {}, name="d").outputs)
    return g


@pytest.mark.parametrize("isa", ISAS)
def test_dynamic_quantize(isa):
    """Mixed signs, one sign only, all zeros (empty range: scale 1 / 255), over run tails and two threads;
    one element; no elements."""
    rng = np.random.default_rng(9)
    x = (rng.standard_normal((7, 131)) * 4).astype(F32)
    g = dynamic_graph(x.shape)
    want, got = InterpreterBackend().compile(g), CpuBackend().compile(g, isa=isa, threads=2, cache=False)
    for feed in (x, np.abs(x) + 0.5, -np.abs(x) - 0.5, x * 0):
        for w, o in zip(want.run([feed]), got.run([feed])):
            assert o.dtype == w.dtype and o.shape == w.shape
            np.testing.assert_array_equal(o, w)
    for shape in ((1, 3), (0, 5)):
        run(dynamic_graph(shape), [(rng.standard_normal(shape) * 4).astype(F32)], isa)


@pytest.mark.parametrize("isa", ISAS)
def test_dynamic_quantize_nan(isa):
    """A NaN makes the range empty (the interpreter's max(0, NaN) is 0); the NaN itself becomes 0 (the
    interpreter's uint8 of NaN is the host's, so the check is on the other elements)."""
    x = (np.random.default_rng(10).standard_normal((7, 131)) * 4).astype(F32)
    x[3, 7] = np.nan
    y, scale, zp = CpuBackend().compile(dynamic_graph(x.shape), isa=isa, threads=2, cache=False).run([x])
    assert scale == np.float32(1) / np.float32(255) and scale.dtype == F32 and zp == 0 and zp.dtype == U8
    rest = np.delete(x.ravel(), 3 * 131 + 7)
    np.testing.assert_array_equal(np.delete(y.ravel(), 3 * 131 + 7),
                                  np.clip(np.rint(rest / scale), 0, 255).astype(U8))
    assert y[3, 7] == 0


# --- through ONNX models, against onnx.reference -------------------------------------------------------------


def onnx_q(op: str, x: np.ndarray, scale: np.ndarray, zp: np.ndarray | None, opset: int, backend: str = "cpu",
           **attrs):
    inits = [numpy_helper.from_array(scale, "s")] + ([numpy_helper.from_array(zp, "z")] if zp is not None else [])
    node = helper.make_node(op, ["x", "s", "z"] if zp is not None else ["x", "s"], ["y"], **attrs)
    graph = helper.make_graph([node], op, [helper.make_tensor_value_info("x", helper.np_dtype_to_tensor_dtype(x.dtype),
                                                                         x.shape)],
                              [helper.make_empty_tensor_value_info("y")], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    got = glowpy.compile(model, backend=backend).run({"x": x})["y"]
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got.astype(np.float64) if got.dtype.kind == "f" else got.astype(np.int64),
                                  want.astype(np.float64) if want.dtype.kind == "f" else want.astype(np.int64))


@pytest.mark.parametrize("signed", [True, False], ids=["int4", "uint4"])
def test_onnx_4bit_blocked_round_trip(signed):
    """Blocked int4 / uint4 (opset 21): QuantizeLinear then DequantizeLinear of the result."""
    import ml_dtypes

    rng = np.random.default_rng(2)
    dt = np.dtype(ml_dtypes.int4 if signed else ml_dtypes.uint4)
    tp = TensorProto.INT4 if signed else TensorProto.UINT4
    x = (rng.standard_normal((4, 10)) * 6).astype(F32)
    scale = np.array([[0.5, 1.0, 2.0]] * 4, F32)
    zp = np.array([[1, -2, 0]] * 4 if signed else [[3, 8, 15]] * 4, np.int64).astype(dt)
    onnx_q("QuantizeLinear", x, scale, zp, 21, axis=1, block_size=4, output_dtype=tp)
    q = rng.integers(-8 if signed else 0, 8 if signed else 16, (4, 10)).astype(dt)
    onnx_q("DequantizeLinear", q, scale, zp, 21, axis=1, block_size=4)


@pytest.mark.parametrize("opset", [19, 21, 23])
def test_onnx_per_axis(opset):
    rng = np.random.default_rng(3)
    x = ties(rng, (2, 3, 17), 0.25).astype(F32)
    onnx_q("QuantizeLinear", x, np.array([0.25, 0.5, 0.125], F32), np.array([3, -9, 100], np.int8), opset, axis=1)
    q = rng.integers(-128, 128, (2, 3, 17)).astype(np.int8)
    onnx_q("DequantizeLinear", q, np.array([0.25, 0.5, 0.125], F32), np.array([3, -9, 100], np.int8), opset, axis=1)


FLOAT_Q = [(TensorProto.FLOAT8E4M3FN, "float8_e4m3fn"), (TensorProto.FLOAT8E4M3FNUZ, "float8_e4m3fnuz"),
           (TensorProto.FLOAT8E5M2, "float8_e5m2"), (TensorProto.FLOAT8E5M2FNUZ, "float8_e5m2fnuz"),
           (TensorProto.FLOAT4E2M1, "float4_e2m1fn")]


@pytest.mark.parametrize("backend", ["cpu", "interpreter"])
@pytest.mark.parametrize("code,name", FLOAT_Q, ids=[n for _, n in FLOAT_Q])
def test_onnx_float_formats(backend, code, name):
    """One model: per-axis QuantizeLinear to a float8 / float4 format (opset 21, output_dtype) with and
    without saturation (overflow, NaN and infinities included; float4 always saturates) and
    DequantizeLinear of another tensor of the format back to float16."""
    import ml_dtypes

    rng = np.random.default_rng(4)
    x = (rng.standard_normal((2, 3, 9)) * 300).astype(F32)
    x[0, 0, :4] = [np.nan, np.inf, -np.inf, 1e9]
    q = rng.integers(0, 256 if code != TensorProto.FLOAT4E2M1 else 16, (2, 3, 9)).astype(np.uint8)
    q = q.view(np.dtype(getattr(ml_dtypes, name)))
    n = helper.make_node
    nodes = [n("QuantizeLinear", ["x", "s"], ["sat"], axis=1, saturate=1, output_dtype=code),
             n("DequantizeLinear", ["q", "s16"], ["dq"], axis=1)]
    if code != TensorProto.FLOAT4E2M1:
        nodes.append(n("QuantizeLinear", ["x", "s"], ["wrap"], axis=1, saturate=0, output_dtype=code))
    outs = [o for nd in nodes for o in nd.output]
    scale = np.array([0.5, 2.0, 0.03], F32)
    graph = helper.make_graph(nodes, "fq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape),
                                            helper.make_tensor_value_info("q", code, q.shape)],
                              [helper.make_empty_tensor_value_info(o) for o in outs],
                              initializer=[numpy_helper.from_array(scale, "s"),
                                           numpy_helper.from_array(scale.astype(F16), "s16")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    feeds = {"x": x, "q": q}
    want = ReferenceEvaluator(model).run(None, feeds)
    got = glowpy.compile(model, backend=backend).run(feeds)
    for o, w in zip(outs, want):
        assert got[o].dtype == w.dtype and got[o].shape == w.shape
        np.testing.assert_array_equal(got[o].astype(np.float64), w.astype(np.float64), err_msg=o)


def test_onnx_blocked_float8_is_refused():
    from glowpy.errors import UnsupportedAttribute

    node = helper.make_node("QuantizeLinear", ["x", "s"], ["y"], axis=1, block_size=2,
                            output_dtype=TensorProto.FLOAT8E4M3FN)
    graph = helper.make_graph([node], "q", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                              [helper.make_empty_tensor_value_info("y")],
                              initializer=[numpy_helper.from_array(np.ones((2, 2), F32), "s")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    with pytest.raises(UnsupportedAttribute, match="blocked quantization to or from a float format"):
        glowpy.compile(model, backend="cpu")
