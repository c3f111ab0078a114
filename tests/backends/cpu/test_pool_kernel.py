"""The vector 2-D pooling kernel (backends/cpu/kernels/pool.py emit_pool_2d) against the interpreter and,
bit for bit, against the generic window kernel (fast_kernels=False): max and average (count_include_pad
both ways), windows 1..7, strides 1 and 2, symmetric, asymmetric and window-wide pads, ceil_mode with and
without overhang, maps narrower than a vector, several vectors plus a tail, N*C planes not divisible by
the threads (and fewer planes than threads), NaN, infinities and zeros of both signs in the input; host ISA and AVX2 (8 lanes).
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import glowpy
import glowpy.backends.cpu.lowering as lowering
from glowpy.backends.cpu import CpuBackend, host_target, select
from glowpy.backends.cpu.kernels import pool
from glowpy.backends.cpu.target import isa_available
from glowpy.backends.interpreter import InterpreterBackend

from .util import assert_close

# id: (x shape, kernel, strides, pads, ceil_mode)
CASES = {
    "3x3s1p1_14_ceil": ((1, 5, 14, 14), (3, 3), (1, 1), (1, 1, 1, 1), 1),  # googlenet's branch pools
    "3x3s2_28_ceil": ((1, 5, 28, 28), (3, 3), (2, 2), (0, 0, 0, 0), 1),  # the last window overhangs
    "3x3s2_57_ceil": ((1, 2, 57, 57), (3, 3), (2, 2), (0, 0, 0, 0), 1),  # exact: no overhang
    "3x3s2_35": ((2, 2, 35, 35), (3, 3), (2, 2), (0, 0, 0, 0), 0),
    "2x2s2_floor": ((2, 3, 9, 11), (2, 2), (2, 2), (0, 0, 0, 0), 0),  # the last row and column unread
    "2x2s2_ceil_pads": ((1, 3, 9, 11), (2, 2), (2, 2), (1, 1, 1, 1), 1),
    "5x5s1p2": ((1, 3, 17, 17), (5, 5), (1, 1), (2, 2, 2, 2), 0),
    "7x7s1p3_7": ((1, 7, 7, 7), (7, 7), (1, 1), (3, 3, 3, 3), 0),
    "7x7s2p3": ((1, 2, 23, 30), (7, 7), (2, 2), (3, 3, 3, 3), 1),
    "3x2s21_asym": ((1, 3, 10, 13), (3, 2), (2, 1), (0, 1, 2, 0), 0),
    "1x3s12": ((1, 2, 6, 9), (1, 3), (1, 2), (0, 1, 0, 1), 0),
    "4x4s1_pads_wide": ((1, 2, 5, 6), (4, 4), (1, 1), (3, 0, 1, 3), 0),  # a window only padding
    "3x3s1p1_w1": ((1, 4, 9, 1), (3, 3), (1, 1), (1, 1, 1, 1), 0),
    "3x3s2p1_wide": ((1, 2, 5, 41), (3, 3), (2, 2), (1, 1, 1, 1), 1),  # 21 columns: vectors and a tail
    "3x3s1_wide": ((1, 1, 4, 37), (3, 3), (1, 1), (0, 0, 0, 0), 0),
    "2x2s1_2planes": ((1, 2, 3, 3), (2, 2), (1, 1), (0, 0, 0, 0), 0),  # fewer planes than threads
}
NEGATIVE_NAN = np.uint32(0xFFC00000).view(np.float32)  # what x86 arithmetic makes (0 * inf)
KINDS = {"max": ("MaxPool", {}), "avg": ("AveragePool", {}),
         "avg_pad": ("AveragePool", {"count_include_pad": 1})}


def _graph(kind: str):
    """One graph holding every case as its own input -> pool -> output."""
    op, extra = KINDS[kind]
    nodes, ins, outs, feeds = [], [], [], []
    rng = np.random.default_rng(7)
    for i, (name, (xs, k, s, p, ceil)) in enumerate(CASES.items()):
        attrs = {"kernel_shape": list(k), "strides": list(s), "pads": list(p), "ceil_mode": ceil, **extra}
        nodes.append(helper.make_node(op, [f"x{i}"], [name], name=name, **attrs))
        ins.append(helper.make_tensor_value_info(f"x{i}", TensorProto.FLOAT, list(xs)))
        outs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))
        x = rng.standard_normal(xs).astype(np.float32)
        x[x < -0.8] = -0.0  # windows whose max is a zero of either sign
        x[(x > -0.8) & (x < -0.4)] = 0.0
        flat = x.reshape(-1)
        flat[rng.choice(flat.size, 4, replace=False)] = [np.nan, NEGATIVE_NAN, np.inf, -np.inf]
        feeds.append(x)
    model = helper.make_model(helper.make_graph(nodes, kind, ins, outs), opset_imports=[helper.make_opsetid("", 19)])
    return glowpy.load(model), feeds


@pytest.mark.parametrize("rows", [False, True], ids=["planes", "rows"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_vector_pools_match_the_interpreter_and_the_generic_kernel(monkeypatch: pytest.MonkeyPatch,
                                                                   kind: str, rows: bool) -> None:
    """Threads split planes, or (rows) bands of output rows of every plane: halo rows, pads, ceil_mode
    overhang and more threads than rows."""
    monkeypatch.setattr(lowering, "PARALLEL_MIN_WORK", 0)  # every pool split over the threads
    if rows:  # as if every input came from a conv split by pixels, on any map size
        monkeypatch.setattr(pool, "ROW_SPLIT_MIN_PIXELS", 0)
        monkeypatch.setattr(select, "_written_by_pixels", lambda low, x: True)
    graph, feeds = _graph(kind)
    want = InterpreterBackend().compile(graph).run(feeds)
    generic = CpuBackend().compile(graph, threads=3, cache=False, fast_kernels=False).run(feeds)
    assert_close(generic, want, f"{kind} generic")
    if not isa_available("avx2"):
        pytest.fail("this host cannot run AVX2 code")
    for isa in ("host", "avx2"):
        ex = CpuBackend().compile(graph, threads=3, cache=False, isa=isa)
        assert len(ex.fast_kernels) == len(CASES), f"{kind} {isa}: not every pool took the vector kernel"
        got = ex.run(feeds)
        assert_close(got, want, f"{kind} {isa}")
        for name, g, r in zip(CASES, got, generic):
            # NaN where the generic kernel has one (which NaN, when a window holds two, may differ);
            # every other output the same bits, signed zeros included
            assert np.array_equal(np.isnan(g), np.isnan(r)), f"{kind} {isa} {name}: NaN elsewhere"
            nums = ~np.isnan(r)
            assert g[nums].tobytes() == r[nums].tobytes(), f"{kind} {isa} {name}: not the generic kernel's bits"


@pytest.mark.parametrize("dtype,kind,kernel,strides,dilations,indices", [
    (np.float16, "max", (3, 3), (2, 2), (1, 1), None),
    (np.float32, "lp", (3, 3), (2, 2), (1, 1), None),
    (np.float32, "max", (3, 3), (2, 2), (2, 2), None),
    (np.float32, "max", (3, 3), (2, 2), (1, 1), 0),
    (np.float32, "max", (8, 8), (1, 1), (1, 1), None),
    (np.float32, "avg", (3, 3), (3, 3), (1, 1), None),
    (np.float32, "avg", (3, 3, 3), (1, 1, 1), (1, 1, 1), None),
], ids=["f16", "lp", "dilated", "indices", "k8", "stride3", "3d"])
def test_other_pools_keep_the_generic_kernel(dtype, kind, kernel, strides, dilations, indices) -> None:
    nsp = len(kernel)
    x_shape, out_shape = (1, 2) + (20,) * nsp, (1, 2) + (6,) * nsp
    assert not pool.fast_2d(np.dtype(dtype), x_shape, out_shape, kind, kernel, strides, dilations, indices, 16)
    assert pool.fast_2d(np.dtype(np.float32), (1, 2, 20, 20), (1, 2, 6, 6), "avg", (3, 3), (2, 2), (1, 1), None, 16)


def test_pool_after_a_pixel_split_conv_splits_rows() -> None:
    """ResNet's stem: a conv whose threads write pixel ranges, then a 3x3 stride-2 max pool with a 56x56
    output; at 2 threads the pool splits rows (its input is written by pixel ranges), against the
    interpreter."""
    rng = np.random.default_rng(3)
    w = helper.make_tensor("w", TensorProto.FLOAT, (64, 3, 7, 7), rng.standard_normal((64, 3, 7, 7)).ravel() / 7)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], strides=[2, 2], pads=[3, 3, 3, 3]),
             helper.make_node("MaxPool", ["c"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])]
    model = helper.make_model(helper.make_graph(
        nodes, "stem", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 224, 224])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w]), opset_imports=[helper.make_opsetid("", 19)])
    graph = glowpy.load(model)
    conv_node, pool_node = graph.nodes

    class Low:
        fast_kernels, vector_width = True, host_target().vector_width

    for nthreads, expect in ((1, False), (2, True)):
        Low.nthreads = nthreads
        assert select._written_by_pixels(Low, pool_node.inputs[0]) is expect
    feeds = [rng.standard_normal((1, 3, 224, 224)).astype(np.float32)]
    want = InterpreterBackend().compile(graph).run(feeds)
    for nthreads in (2, 3):
        assert_close(CpuBackend().compile(graph, threads=nthreads, cache=False).run(feeds), want, f"{nthreads}")
