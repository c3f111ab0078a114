"""int8 kernels on the CPU (kernels/qgemm.py, kernels/qlinear.py): QLinearConv, ConvInteger, QLinearMatMul,
MatMulInteger, QLinearAdd and QLinearGlobalAveragePool agree with the interpreter bit for bit, on the
host's code (AVX-512 VNNI here) and on AVX2 code, across edges: K not a multiple of 4, odd channel and
column counts, strides, pads, dilations, groups and depthwise, non-zero zero points, per-tensor and
per-channel parameters, int8 and uint8 operands, the float32 and float64 requantization, fused relu,
and more than one thread."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from glowpy.backends.cpu import CpuBackend
from glowpy.backends.cpu.target import isa_available
from glowpy.backends.interpreter import InterpreterBackend
from glowpy.ir.graph import Graph
from glowpy.ir.types import TensorType

ISAS = ["host", "avx2"] if isa_available("avx2") else ["host"]
U8, I8, I32, F32 = np.dtype(np.uint8), np.dtype(np.int8), np.dtype(np.int32), np.dtype(np.float32)


def _ints(rng, dtype, shape):
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, shape, endpoint=True).astype(dtype)


def _check(g: Graph, feeds: list[np.ndarray], isa: str, threads: int = 1) -> None:
    want = InterpreterBackend().compile(g).run(feeds)
    got = CpuBackend().compile(g, isa=isa, threads=threads).run(feeds)
    for w, o in zip(want, got):
        assert o.dtype == w.dtype and o.shape == w.shape
        np.testing.assert_array_equal(o, w)


def _qconv_graph(rng, x_shape, w_shape, *, group=1, strides=None, pads=None, dilations=None, xdt=U8, wdt=I8,
                 per_channel=True, wz_zero=False, ydt=U8, float32=True, relu=False, integer=False) -> Graph:
    nsp = len(x_shape) - 2
    attrs = {"group": group, "strides": tuple(strides or (1,) * nsp), "pads": tuple(pads or (0,) * (2 * nsp)),
             "dilations": tuple(dilations or (1,) * nsp)}
    M = w_shape[0]
    g = Graph("qconv")
    x = g.add_input("x", TensorType(xdt, x_shape))
    w = g.add_constant("w", _ints(rng, wdt, w_shape))
    wz_vals = np.zeros(M, wdt) if wz_zero else rng.integers(-6 if wdt == I8 else 120, 7 if wdt == I8 else 136,
                                                            M).astype(wdt)
    wz = g.add_constant("wz", wz_vals if per_channel else wz_vals[:1].reshape(()))
    xz = g.add_constant("xz", np.array(9 if xdt == U8 else -7, xdt))
    if integer:
        g.outputs = [g.add_node("ConvInteger", [x, w, xz, wz], attrs, name="conv").outputs[0]]
        return g
    ws_vals = (rng.random(M) * 0.004 + 0.0005).astype(F32)
    ws = g.add_constant("ws", ws_vals if per_channel else ws_vals[:1].reshape(()))
    xs = g.add_constant("xs", np.array(0.031, F32))
    ys = g.add_constant("ys", np.array(0.047, F32))
    yz = g.add_constant("yz", np.array(117 if ydt == U8 else -3, ydt))
    b = g.add_constant("b", rng.integers(-3000, 3000, M).astype(I32))
    attrs.update(float32=float32, relu=relu)
    g.outputs = [g.add_node("QLinearConv", [x, xs, xz, w, ws, wz, ys, yz, b], attrs, name="conv").outputs[0]]
    return g


CONV_CASES = {
    "1x1": dict(x_shape=(1, 8, 5, 5), w_shape=(16, 8, 1, 1)),
    "1x1_int8_odd": dict(x_shape=(2, 7, 5, 7), w_shape=(11, 7, 1, 1), xdt=I8, ydt=I8, float32=False),
    "1x1_s2": dict(x_shape=(1, 8, 9, 11), w_shape=(12, 8, 1, 1), strides=(2, 2)),
    "dilated_s2": dict(x_shape=(1, 5, 13, 12), w_shape=(7, 5, 3, 3), strides=(2, 3), dilations=(2, 1),
                       pads=(1, 2, 0, 1)),
    "7x7_s2": dict(x_shape=(1, 3, 20, 19), w_shape=(8, 3, 7, 7), strides=(2, 2), pads=(3, 3, 3, 3)),
    "3x3_pad_stride": dict(x_shape=(2, 6, 7, 9), w_shape=(5, 6, 3, 3), strides=(2, 1), pads=(1, 1, 1, 1)),
    "k_odd_rows_odd": dict(x_shape=(1, 3, 11, 6), w_shape=(13, 3, 3, 1), pads=(0, 0, 2, 0)),
    "dilated": dict(x_shape=(1, 5, 9, 8), w_shape=(7, 5, 3, 2), dilations=(2, 3), pads=(2, 1, 0, 3)),
    "depthwise": dict(x_shape=(1, 6, 7, 9), w_shape=(6, 1, 3, 3), group=6, pads=(1, 0, 1, 2)),
    "depthwise_s2": dict(x_shape=(1, 19, 10, 10), w_shape=(19, 1, 3, 3), group=19, strides=(2, 2),
                         pads=(1, 1, 1, 1)),
    "depthwise_dilated_wide": dict(x_shape=(2, 5, 9, 37), w_shape=(5, 1, 3, 3), group=5, strides=(1, 2),
                                   dilations=(2, 1), pads=(2, 1, 2, 0), xdt=I8, ydt=I8, relu=True),
    "depthwise_float64": dict(x_shape=(1, 4, 6, 6), w_shape=(4, 1, 3, 3), group=4, float32=False, per_channel=False),
    "groups": dict(x_shape=(1, 6, 7, 9), w_shape=(9, 2, 3, 3), group=3, pads=(1, 0, 1, 2), per_channel=False),
    "int8_x_uint8_w": dict(x_shape=(1, 7, 6, 6), w_shape=(10, 7, 2, 2), xdt=I8, wdt=U8, ydt=I8),
    "wz_zero_relu": dict(x_shape=(1, 9, 8, 8), w_shape=(24, 9, 1, 1), wz_zero=True, relu=True),
    "float64": dict(x_shape=(1, 4, 6, 6), w_shape=(8, 4, 3, 3), float32=False, pads=(1, 1, 1, 1)),
    "conv1d": dict(x_shape=(2, 5, 17), w_shape=(6, 5, 3), strides=(2,), pads=(1, 2)),
    "wide": dict(x_shape=(1, 16, 12, 12), w_shape=(40, 16, 1, 1)),
}


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("case", sorted(CONV_CASES))
def test_qlinear_conv_matches_interpreter(case: str, isa: str) -> None:
    rng = np.random.default_rng(zlib.crc32(case.encode()))
    spec = CONV_CASES[case]
    g = _qconv_graph(rng, **spec)
    _check(g, [_ints(rng, spec.get("xdt", U8), spec["x_shape"])], isa)


# Few columns against many weight rows and a long reduction: on VNNI hosts the transposed layout
# (qgemm.transposed_tile: rows on lanes, columns broadcast, results through the scratch tile); each
# shape also runs as AVX2 code, in the usual layout.
TRANSPOSED_CASES = {
    "1x1_colsum": dict(x_shape=(1, 400, 3, 11), w_shape=(90, 400, 1, 1)),
    "groups_int8_relu": dict(x_shape=(1, 800, 3, 11), w_shape=(180, 400, 1, 1), group=2, xdt=I8, ydt=I8, relu=True),
    "3x3_pad_float64": dict(x_shape=(1, 48, 5, 7), w_shape=(30, 48, 3, 3), pads=(1, 1, 1, 1), float32=False),
    "conv1d_integer": dict(x_shape=(2, 400, 17), w_shape=(30, 400, 1), integer=True, wdt=U8, per_channel=False),
}


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("case", sorted(TRANSPOSED_CASES))
def test_few_columns_match_interpreter(case: str, isa: str) -> None:
    from glowpy.backends.cpu.kernels.qgemm import transposed_tile
    from glowpy.backends.cpu.target import host_target

    rng = np.random.default_rng(zlib.crc32(case.encode()))
    spec = TRANSPOSED_CASES[case]
    g = _qconv_graph(rng, **spec)
    target = host_target(isa)
    w_shape = spec["w_shape"]
    cols = int(np.prod(g.outputs[0].shape[2:]))  # the product's columns: output pixels
    layout = transposed_tile(w_shape[0] // spec.get("group", 1), cols, int(np.prod(w_shape[1:])), target.vector_width)
    assert (layout is not None) == (target.vector_width == 16 and target.has("avx512vnni"))
    _check(g, [_ints(rng, spec.get("xdt", U8), spec["x_shape"])], isa)


def test_few_columns_threads_split_row_blocks() -> None:
    """Two threads over (unit, row block) items: a thread starting mid-unit packs its own panel."""
    rng = np.random.default_rng(12)
    g = _qconv_graph(rng, (3, 400, 3, 11), (300, 400, 1, 1))
    _check(g, [_ints(rng, U8, (3, 400, 3, 11))], "host", threads=2)


@pytest.mark.parametrize("isa", ISAS)
def test_conv_integer_matches_interpreter(isa: str) -> None:
    rng = np.random.default_rng(5)
    for spec in (dict(x_shape=(1, 5, 7, 7), w_shape=(6, 5, 3, 3), pads=(1, 1, 1, 1)),
                 dict(x_shape=(2, 4, 6, 5), w_shape=(4, 1, 3, 3), group=4, xdt=I8, wdt=U8, per_channel=False)):
        g = _qconv_graph(rng, integer=True, **spec)
        _check(g, [_ints(rng, spec.get("xdt", U8), spec["x_shape"])], isa)


def test_qlinear_conv_threads_split_panels() -> None:
    rng = np.random.default_rng(8)
    g = _qconv_graph(rng, (1, 12, 20, 20), (20, 12, 3, 3), pads=(1, 1, 1, 1))
    _check(g, [_ints(rng, U8, (1, 12, 20, 20))], "host", threads=2)


def _qmatmul_graph(rng, a_shape, K, N, *, adt=U8, bdt=I8, ydt=U8, per_column=True, bias=False, float32=True,
                   relu=False, integer=False) -> Graph:
    g = Graph("qmatmul")
    a = g.add_input("a", TensorType(adt, a_shape))
    b = g.add_constant("b", _ints(rng, bdt, (K, N)))
    bz_vals = rng.integers(-5 if bdt == I8 else 100, 6 if bdt == I8 else 150, N).astype(bdt)
    bz = g.add_constant("bz", bz_vals if per_column else bz_vals[:1].reshape(()))
    az = g.add_constant("az", np.array(131 if adt == U8 else 11, adt))
    if integer:
        g.outputs = [g.add_node("MatMulInteger", [a, b, az, bz], {}, name="mm").outputs[0]]
        return g
    bs_vals = (rng.random(N) * 0.01 + 0.001).astype(F32)
    ops = [a, g.add_constant("as", np.array(0.02, F32)), az, b,
           g.add_constant("bs", bs_vals if per_column else bs_vals[:1].reshape(())), bz,
           g.add_constant("ys", np.array(0.09, F32)), g.add_constant("yz", np.array(100 if ydt == U8 else 4, ydt))]
    if bias:
        ops.append(g.add_constant("bias", rng.integers(-5000, 5000, N).astype(I32)))
    g.outputs = [g.add_node("QLinearMatMul", ops, {"float32": float32, "relu": relu}, name="mm").outputs[0]]
    return g


MATMUL_CASES = {
    "fc": dict(a_shape=(1, 67), K=67, N=37, bias=True, relu=True),
    "2d": dict(a_shape=(19, 33), K=33, N=21),
    "3d_int8": dict(a_shape=(2, 5, 12), K=12, N=9, adt=I8, bdt=U8, ydt=I8, per_column=False),
    "float64": dict(a_shape=(7, 10), K=10, N=18, float32=False),
    "vector_a": dict(a_shape=(31,), K=31, N=5),
    "few_rows": dict(a_shape=(3, 200), K=200, N=50, bias=True, relu=True),
    "few_rows_3d_int8": dict(a_shape=(2, 2, 300), K=300, N=21, adt=I8, bdt=U8, ydt=I8, float32=False),
    "matrix_vector": dict(a_shape=(1, 640), K=640, N=300),
}


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("case", sorted(MATMUL_CASES))
def test_qlinear_matmul_matches_interpreter(case: str, isa: str) -> None:
    rng = np.random.default_rng(zlib.crc32(case.encode()))
    spec = MATMUL_CASES[case]
    g = _qmatmul_graph(rng, **spec)
    _check(g, [_ints(rng, spec.get("adt", U8), spec["a_shape"])], isa)


@pytest.mark.parametrize("isa", ISAS)
def test_matmul_integer_matches_interpreter(isa: str) -> None:
    rng = np.random.default_rng(6)
    for spec in (dict(a_shape=(9, 14), K=14, N=11), dict(a_shape=(3, 4, 7), K=7, N=33, adt=I8, bdt=U8)):
        g = _qmatmul_graph(rng, integer=True, **spec)
        _check(g, [_ints(rng, spec.get("adt", U8), spec["a_shape"])], isa)


@pytest.mark.parametrize("isa", ISAS)
def test_runtime_operands_run_the_plain_kernels(isa: str) -> None:
    """Weights, scales and zero points computed at run time (graph inputs): per-row A parameters,
    broadcast batches, float16 scales, a grouped strided conv with per-channel weight parameters."""
    rng = np.random.default_rng(9)
    F16 = np.dtype(np.float16)
    g = Graph("runtime_q")
    a = g.add_input("a", TensorType(U8, (2, 3, 5, 6)))
    b = g.add_input("b", TensorType(I8, (3, 6, 4)))
    az = g.add_input("az", TensorType(U8, (2, 3, 5, 1)))
    bz = g.add_input("bz", TensorType(I8, (4,)))
    ascale = g.add_input("as", TensorType(F16, (2, 3, 5, 1)))
    bs = g.add_input("bs", TensorType(F16, (4,)))
    mm = g.add_node("QLinearMatMul", [a, ascale, az, b, bs, bz, g.add_constant("ys", np.array(0.5, F16)),
                                      g.add_constant("yz", np.array(-2, I8))], {}, name="mm").outputs[0]
    mi = g.add_node("MatMulInteger", [a, b, az, bz], {}, name="mi").outputs[0]
    x = g.add_input("x", TensorType(I8, (1, 4, 9, 8)))
    w = g.add_input("w", TensorType(U8, (6, 2, 3, 3)))
    c = lambda n, v, t=F32: g.add_constant(n, np.asarray(v, t))  # noqa: E731
    conv = g.add_node("QLinearConv", [x, c("xs", 0.03), c("xz", -4, I8), w, c("ws", rng.random(6) * 0.01 + 1e-3),
                                      c("wz", rng.integers(120, 136, 6), U8), c("cys", 0.2), c("cyz", 7, U8),
                                      c("bias", rng.integers(-900, 900, 6), I32)],
                      {"group": 2, "strides": (2, 1), "pads": (1, 0, 1, 2), "dilations": (1, 2), "relu": True},
                      name="conv").outputs[0]
    g.outputs = [mm, mi, conv]
    feeds = [_ints(rng, U8, (2, 3, 5, 6)), _ints(rng, I8, (3, 6, 4)), _ints(rng, U8, (2, 3, 5, 1)),
             rng.integers(-3, 4, 4).astype(I8), (rng.random((2, 3, 5, 1)) * 0.1 + 0.01).astype(F16),
             (rng.random(4) * 0.1 + 0.01).astype(F16), _ints(rng, I8, (1, 4, 9, 8)), _ints(rng, U8, (6, 2, 3, 3))]
    _check(g, feeds, isa)


@pytest.mark.parametrize("isa", ISAS)
def test_qlinear_add_and_global_average_pool(isa: str) -> None:
    rng = np.random.default_rng(7)
    g = Graph("qadd")
    a = g.add_input("a", TensorType(U8, (2, 5, 7, 9)))
    b = g.add_input("b", TensorType(U8, (1, 5, 1, 9)))
    c = lambda n, v, t=F32: g.add_constant(n, np.array(v, t))  # noqa: E731
    s = g.add_node("QLinearAdd", [a, c("as", 0.05), c("az", 120, U8), b, c("bs", 0.11), c("bz", 3, U8),
                                  c("ys", 0.07), c("yz", 128, U8)], {}, name="add").outputs[0]
    p = g.add_node("QLinearGlobalAveragePool", [s, c("ps", 0.07), c("pz", 128, U8), c("qs", 0.013),
                                                c("qz", 5, U8)], {}, name="gap").outputs[0]
    g.outputs = [s, p]
    _check(g, [_ints(rng, U8, (2, 5, 7, 9)), _ints(rng, U8, (1, 5, 1, 9))], isa)


@pytest.mark.parametrize("isa", ISAS)
def test_product_kernel_uses_the_dot_product_instructions(isa: str) -> None:
    """VNNI hosts get vpdpbusd; AVX2 code (and AVX-512 without VNNI) pmaddwd, never vpmaddubsw
    (whose int16 saturation would break exactness)."""
    from llvmlite import ir

    from glowpy.backends.cpu.kernels import qgemm
    from glowpy.backends.cpu.target import assembly, host_target

    target = host_target(isa)
    rng = np.random.default_rng(2)
    spec = qgemm.QProduct(units=1, R=16, K=32, P=64, x_unit=(0, 0), groups=1, out_unit=(0, 0), out_rs=64, out_ps=1,
                          H=1, W=1, x_unsigned=True, out_kind="u8", dense=True)
    module = ir.Module("q")
    qgemm.emit_qproduct(module, "q", spec=spec, w=_ints(rng, I8, (1, 16, 32)), wz=np.zeros(16, I8), bias=None, xz=3,
                        k_tables=np.stack([np.arange(32) * 64, np.zeros(32), np.zeros(32)]).astype(np.int32),
                        p_tables=np.zeros((3, 64), np.int32), mult=np.full(16, 0.01, np.float32), yz=0,
                        vector_width=target.vector_width)
    asm = assembly(str(module), target)
    if target.vector_width == 16 and target.has("avx512vnni"):
        assert "vpdpbusd" in asm
    else:  # vpdpwssd: LLVM's fusion of pmaddwd + add where the host has AVX-VNNI (as exact)
        assert "vpmaddwd" in asm or ("vpdpwssd" in asm and target.has("avxvnni"))
    assert "vpmaddubsw" not in asm
    if isa == "avx2":
        assert "zmm" not in asm
