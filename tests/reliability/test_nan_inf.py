"""NaN and Inf through every kernel where their handling is a choice (max pool, reductions, relu,
softmax, clip, min/max, ...), on both backends, against onnxruntime, on small shapes and on shapes long
enough for the CPU backend's vector loops and their remainders.

glowpy's rule: a NaN anywhere in a max window or reduction makes the result NaN (ArgMax: the index of
the first NaN), as numpy, onnx's reference ReduceMax/ArgMax/GlobalMaxPool and onnxruntime's Max/Min
do. onnxruntime's own max kernels are order dependent there (MaxPool over [1, NaN] gives NaN, over
[NaN, 3] gives 3; GlobalMaxPool and ReduceMax skip a NaN unless it comes first), so at those outputs
glowpy is held to its rule, and everywhere else to onnxruntime's value exactly.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import glowpy

NAN, INF = np.float32(np.nan), np.float32(np.inf)


def special(shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Random values with NaN, +Inf and -Inf sprinkled in, and rows that are all special."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32)
    flat = x.reshape(-1)
    idx = rng.permutation(flat.size)
    k = max(flat.size // 8, 1)
    flat[idx[:k]] = NAN
    flat[idx[k:2 * k]] = INF
    flat[idx[2 * k:3 * k]] = -INF
    x2 = x.reshape(-1, shape[-1])
    x2[0, :] = NAN  # a row of only NaN
    if x2.shape[0] > 1:
        x2[1, :] = -INF  # a row of only -Inf
    if x2.shape[0] > 2:
        x2[2, :] = INF
        x2[2, 0] = -INF  # +Inf and -Inf together
    return x


def model(op: str, x_shape, attrs=None, extra=(), n_inputs=1, opset=13, out_type=TensorProto.FLOAT):
    inputs = [helper.make_tensor_value_info(f"x{i}" if i else "x", TensorProto.FLOAT, list(x_shape))
              for i in range(n_inputs)]
    names = [i.name for i in inputs] + [e.name for e in extra]
    node = helper.make_node(op, names, ["y"], **(attrs or {}))
    g = helper.make_graph([node], op, inputs, [helper.make_tensor_value_info("y", out_type, None)],
                          list(extra))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def scalar(name: str, v: float):
    return numpy_helper.from_array(np.array(v, np.float32), name)


def axes(name: str, a):
    return numpy_helper.from_array(np.array(a, np.int64), name)


SHAPES = {"small": (3, 4, 5, 6), "long": (2, 3, 21, 37)}
SHAPE = SHAPES["small"]
# op -> the model that marks (> 0) the outputs whose window holds a NaN, fed isnan(x)
MAX_LIKE = {"MaxPool", "MaxPool_pad", "GlobalMaxPool", "ReduceMax", "ReduceMax_all", "ArgMax"}
CASES = {
    "MaxPool": (model("MaxPool", SHAPE, {"kernel_shape": [2, 2], "strides": [1, 1]}), 1),
    "MaxPool_pad": (model("MaxPool", SHAPE, {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}), 1),
    "GlobalMaxPool": (model("GlobalMaxPool", SHAPE), 1),
    "AveragePool": (model("AveragePool", SHAPE, {"kernel_shape": [2, 2]}), 1),
    "GlobalAveragePool": (model("GlobalAveragePool", SHAPE), 1),
    "ReduceMax": (model("ReduceMax", SHAPE, {"axes": [3], "keepdims": 0}), 1),
    "ReduceMax_all": (model("ReduceMax", SHAPE, {"keepdims": 1}), 1),
    "ReduceSum": (model("ReduceSum", SHAPE, {"keepdims": 0}, extra=[axes("a", [3])]), 1),
    "ReduceMean": (model("ReduceMean", SHAPE, {"axes": [3]}), 1),
    "Relu": (model("Relu", SHAPE), 1),
    "LeakyRelu": (model("LeakyRelu", SHAPE, {"alpha": 0.1}), 1),
    "Sigmoid": (model("Sigmoid", SHAPE), 1),
    "Tanh": (model("Tanh", SHAPE), 1),
    "Softmax": (model("Softmax", SHAPE, {"axis": -1}), 1),
    "Softmax_axis1": (model("Softmax", SHAPE, {"axis": 1}), 1),
    "LogSoftmax": (model("LogSoftmax", SHAPE, {"axis": -1}), 1),
    "Clip": (model("Clip", SHAPE, extra=[scalar("lo", -0.5), scalar("hi", 0.5)]), 1),
    "Clip_inf_bounds": (model("Clip", SHAPE, extra=[scalar("lo", -np.inf), scalar("hi", np.inf)]), 1),
    "Min": (model("Min", SHAPE, n_inputs=2), 2),
    "Max": (model("Max", SHAPE, n_inputs=2), 2),
    "Max3": (model("Max", SHAPE, n_inputs=3), 3),
    "Add": (model("Add", SHAPE, n_inputs=2), 2),
    "Mul": (model("Mul", SHAPE, n_inputs=2), 2),
    "Div": (model("Div", SHAPE, n_inputs=2), 2),
    "Sub": (model("Sub", SHAPE, n_inputs=2), 2),
    "Abs": (model("Abs", SHAPE), 1),
    "Neg": (model("Neg", SHAPE), 1),
    "Exp": (model("Exp", SHAPE), 1),
    "Sqrt": (model("Sqrt", SHAPE), 1),
    "Erf": (model("Erf", SHAPE), 1),
    "ArgMax": (model("ArgMax", SHAPE, {"axis": 3}, out_type=TensorProto.INT64), 1),
}


def ort_run(m, feeds):
    import onnxruntime as ort

    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)[0]


def nan_windows(case: str, m, x: np.ndarray) -> np.ndarray:
    """True at the outputs whose window (pool window, reduced row) holds a NaN."""
    if case == "ArgMax":
        return np.isnan(x).any(axis=3, keepdims=True)
    probe = type(m)()
    probe.CopyFrom(m)
    return ort_run(probe, {"x": np.isnan(x).astype(np.float32)}) > 0


def cases():
    return [(case, shape) for case in sorted(CASES) for shape in SHAPES]


def shaped(case: str, shape: tuple[int, ...]):
    m, n = CASES[case]
    if shape != SHAPE:
        m = type(m)()
        m.CopyFrom(CASES[case][0])
        for i in m.graph.input:
            for d, v in zip(i.type.tensor_type.shape.dim, shape):
                d.dim_value = v
    return m, n


@pytest.mark.parametrize("backend", ["interpreter", "cpu"])
@pytest.mark.parametrize("case, size", cases())
def test_nan_inf_like_onnxruntime(case, size, backend):
    shape = SHAPES[size]
    m, n = shaped(case, shape)
    names = ["x"] + [f"x{i}" for i in range(1, n)]
    feeds = {name: special(shape, seed) for seed, name in enumerate(names)}
    if n > 1:  # NaN against a number, and a number against NaN, in both operand orders
        feeds["x1"][0, 0, 0, :3] = [1.0, NAN, -INF]
        feeds["x"][0, 0, 0, :3] = [NAN, 2.0, NAN]
    if case in MAX_LIKE:  # windows without NaN (but with both infinities) too
        last = feeds["x"][:, -1]
        last[np.isnan(last)] = 0.5
    want = ort_run(m, feeds)
    with np.errstate(all="ignore"):
        (got,) = glowpy.compile(m.SerializeToString(), backend=backend).run(feeds).values()
    assert got.shape == want.shape and got.dtype == want.dtype
    if case in MAX_LIKE:
        mask = nan_windows(case, m, feeds["x"])
        assert mask.shape == want.shape and mask.any() and (want.size == 1 or not mask.all())
        if case == "ArgMax":
            first_nan = np.argmax(np.isnan(feeds["x"]), axis=3, keepdims=True)
            np.testing.assert_array_equal(got[mask], first_nan[mask])
        else:
            assert np.isnan(got[mask]).all()
        got, want = got[~mask], want[~mask]
    if want.dtype.kind == "f":
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-6, equal_nan=True)
        assert np.array_equal(np.isnan(got), np.isnan(want))
        assert np.array_equal(np.isposinf(got), np.isposinf(want)) and np.array_equal(np.isneginf(got),
                                                                                      np.isneginf(want))
    else:
        np.testing.assert_array_equal(got, want)


def test_variadic_max_keeps_the_output_name():
    m, _ = CASES["Max3"]
    x = np.ones((3, 4, 5, 6), np.float32)
    assert set(glowpy.compile(m.SerializeToString(), backend="interpreter").run(
        {"x": x, "x1": x, "x2": x})) == {"y"}
