"""Shapes and operands known only at run time: `glowpy.compile` on a model with unbound symbolic dims
or shape-deciding graph inputs compiles on first run per key (LRU-bounded); run-time Clip bounds stay
run-time values; explicit `shapes=` keeps the eager compile; bound dims are still checked."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import glowpy
from glowpy.compiled import CompiledModel, SpecializingModel
from glowpy.errors import (
    ConfigurationError,
    InvalidName,
    MismatchingDatatype,
    MismatchingShape,
    UnidentifiedName,
    UnsupportedOperator,
    UnsupportedShape,
)
from glowpy.importer.specialize import shape_operands

BACKENDS = ["interpreter", "cpu"]
D, H, VOCAB, MAX_LEN = 8, 2, 11, 16


def _init(name: str, array: np.ndarray) -> TensorProto:
    return numpy_helper.from_array(array, name)


def bert_like() -> onnx.ModelProto:
    """Embedding + positions sliced to the sequence length, one attention block with a padding mask and
    head reshapes computed from Shape: what BERT's exported graphs do with a symbolic 'seq' dim."""
    rng = np.random.default_rng(0)
    w = {k: (rng.standard_normal(s) * 0.3).astype(np.float32)
         for k, s in [("emb", (VOCAB, D)), ("pos", (MAX_LEN, D)), ("wq", (D, D)), ("wk", (D, D)), ("wv", (D, D)),
                      ("wo", (D, D))]}
    inits = [_init(k, v) for k, v in w.items()] + [
        _init("zero", np.array([0], np.int64)), _init("one", np.array(1, np.int64)),
        _init("heads", np.array([H, D // H], np.int64)), _init("b1", np.array([1], np.int64)),
        _init("neg", np.array(-1e4, np.float32)), _init("fone", np.array(1.0, np.float32)),
        _init("scale", np.array(1 / np.sqrt(D // H), np.float32)), _init("ax12", np.array([1, 2], np.int64)),
        _init("dmodel", np.array([D], np.int64)), _init("gamma", np.ones(D, np.float32)),
        _init("beta", np.zeros(D, np.float32))]
    n = helper.make_node
    nodes = [
        n("Gather", ["emb", "ids"], ["tok"]),
        n("Shape", ["ids"], ["ids_shape"]),
        n("Gather", ["ids_shape", "one"], ["seq"], axis=0),
        n("Unsqueeze", ["seq", "zero"], ["seq1"]),
        n("Slice", ["pos", "zero", "seq1", "zero"], ["pos_seq"]),
        n("Add", ["tok", "pos_seq"], ["h0"]),
        n("LayerNormalization", ["h0", "gamma", "beta"], ["h"], axis=-1, epsilon=1e-5),
        n("Concat", ["b1", "seq1", "heads"], ["split_shape"], axis=0),
        n("Concat", ["b1", "seq1", "dmodel"], ["merge_shape"], axis=0),
    ]
    for p in "qkv":
        nodes += [n("MatMul", ["h", f"w{p}"], [f"{p}0"]), n("Reshape", [f"{p}0", "split_shape"], [f"{p}1"]),
                  n("Transpose", [f"{p}1"], [f"{p}h"], perm=[0, 2, 3, 1] if p == "k" else [0, 2, 1, 3])]
    nodes += [
        n("MatMul", ["qh", "kh"], ["s0"]), n("Mul", ["s0", "scale"], ["s1"]),
        n("Sub", ["fone", "mask"], ["m0"]), n("Mul", ["m0", "neg"], ["m1"]), n("Unsqueeze", ["m1", "ax12"], ["m2"]),
        n("Add", ["s1", "m2"], ["s2"]), n("Softmax", ["s2"], ["p"], axis=-1),
        n("MatMul", ["p", "vh"], ["c0"]), n("Transpose", ["c0"], ["c1"], perm=[0, 2, 1, 3]),
        n("Reshape", ["c1", "merge_shape"], ["c2"]), n("MatMul", ["c2", "wo"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "bert_like", [
        helper.make_tensor_value_info("ids", TensorProto.INT64, [1, "seq"]),
        helper.make_tensor_value_info("mask", TensorProto.FLOAT, [1, "seq"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "seq", D])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def bert_feeds(length: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(length)
    mask = np.ones((1, length), np.float32)
    mask[0, length - 1:] = 0  # the last token is padding
    return {"ids": rng.integers(0, VOCAB, (1, length)).astype(np.int64), "mask": mask}


@pytest.mark.parametrize("backend", BACKENDS)
def test_bert_like_runs_at_any_sequence_length(backend):
    model = bert_like()
    compiled = glowpy.compile(model, backend=backend)
    assert isinstance(compiled, SpecializingModel) and compiled.compilations == 0
    assert shape_operands(model) == []  # the shapes come from Shape(ids): only the dims specialize
    ref = ReferenceEvaluator(model)
    for length in (3, 7, 5, 3):
        feeds = bert_feeds(length)
        got = compiled.run(feeds)["y"]
        assert got.shape == (1, length, D)
        np.testing.assert_allclose(got, ref.run(None, feeds)[0], rtol=1e-4, atol=1e-5)
    assert compiled.compilations == 3  # length 3 came back from the cache
    assert len(compiled.specializations) == 3 and compiled.graph.inputs[0].shape == (1, 3)


def test_specializations_are_a_bounded_lru():
    compiled = glowpy.compile(bert_like(), backend="interpreter", specializations=2)
    for length in (3, 4, 3, 5, 3, 4):  # 4 is evicted by 5 (3 was used more recently)
        compiled.run(bert_feeds(length))
    assert compiled.compilations == 4
    assert [m.graph.inputs[0].shape[1] for m in compiled.specializations] == [3, 4]
    with pytest.raises(ConfigurationError, match="at least one"):
        glowpy.compile(bert_like(), backend="interpreter", specializations=0)


def test_explicit_shapes_compile_now_and_bound_dims_are_checked():
    compiled = glowpy.compile(bert_like(), backend="interpreter", shapes={"seq": 4})
    assert isinstance(compiled, CompiledModel)
    with pytest.raises(MismatchingShape, match="input 'ids' has the wrong shape"):
        compiled.run(bert_feeds(5))
    dynamic = glowpy.compile(bert_like(), backend="interpreter")
    feeds = bert_feeds(4)
    with pytest.raises(MismatchingShape, match="shape given for input 'ids' disagrees with the model"):
        dynamic.run({"ids": np.zeros((2, 4), np.int64), "mask": feeds["mask"]})  # dim 0 is bound to 1
    with pytest.raises(InvalidName, match="'x' is not an input"):
        dynamic.run({**feeds, "x": feeds["mask"]})
    with pytest.raises(UnidentifiedName, match=r"no value given for input\(s\) \['mask'\]"):
        dynamic.run({"ids": feeds["ids"]})
    with pytest.raises(UnsupportedShape, match="input 'ids' has a zero dim"):
        dynamic.run({"ids": np.zeros((1, 0), np.int64), "mask": np.zeros((1, 0), np.float32)})
    with pytest.raises(UnsupportedShape, match="graph input 'ids' has symbolic dim 'seq'"):
        dynamic.graph  # noqa: B018  (nothing is compiled before the first run)


def reshape_model() -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Reshape", ["r", "shape"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6]),
         helper.make_tensor_value_info("shape", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])


@pytest.mark.parametrize("backend", BACKENDS)
def test_shape_operands_specialize_per_value(backend):
    model = reshape_model()
    assert shape_operands(model) == ["shape"]
    compiled = glowpy.compile(model, backend=backend)
    x = np.arange(12, dtype=np.float32).reshape(2, 6) - 6
    for shape in ([3, 4], [4, 3], [3, 4], [12, 1]):
        got = compiled.run({"x": x, "shape": np.array(shape, np.int64)})["y"]
        np.testing.assert_array_equal(got, np.maximum(x, 0).reshape(shape))
    assert compiled.compilations == 3  # keyed on the bytes of 'shape'
    assert "shape" not in compiled.specializations[0].input_names  # a weight of each specialization
    with pytest.raises(MismatchingDatatype, match="input 'shape' has the wrong element type"):
        compiled.run({"x": x, "shape": np.array([3, 4], np.int32)})
    with pytest.raises(MismatchingShape, match=r"input 'shape' has the wrong shape \(expected \[2\], found \[3\]\)"):
        compiled.run({"x": x, "shape": np.array([3, 4, 1], np.int64)})


def test_an_operand_through_a_function_body_specializes():
    """CenterCropPad has no row: its (context-dependent) body's Pad and Slice read 'shape'."""
    graph = helper.make_graph([helper.make_node("CenterCropPad", ["x", "shape"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 5]),
                               helper.make_tensor_value_info("shape", TensorProto.INT64, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    assert shape_operands(model) == ["shape"]
    x = np.arange(20, dtype=np.float32).reshape(4, 5)
    compiled = glowpy.compile(model, backend="interpreter")
    for shape in ([2, 7], [6, 3]):
        feeds = {"x": x, "shape": np.array(shape, np.int64)}
        np.testing.assert_array_equal(compiled.run(feeds)["y"], ReferenceEvaluator(model).run(None, feeds)[0])


def clip_model(bounds: list[str], dtype: int = TensorProto.FLOAT) -> onnx.ModelProto:
    inputs = [helper.make_tensor_value_info("x", dtype, [3, 5])]
    inputs += [helper.make_tensor_value_info(b, dtype, []) for b in bounds if b]
    graph = helper.make_graph([helper.make_node("Clip", ["x", *bounds], ["y"])], "g", inputs,
                              [helper.make_tensor_value_info("y", dtype, [3, 5])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("bounds", [["lo", "hi"], ["lo"], ["", "hi"]])
def test_clip_bounds_are_run_time_values(backend, bounds):
    model = clip_model(bounds)
    compiled = glowpy.compile(model, backend=backend)
    assert isinstance(compiled, CompiledModel)  # no specialization: one compile serves every bound
    assert "Clip" not in {n.op for n in compiled.graph.nodes}
    x = np.linspace(-2, 2, 15, dtype=np.float32).reshape(3, 5)
    ref = ReferenceEvaluator(model)
    for lo, hi in ((-0.5, 0.5), (0.25, 1.5), (1.0, -1.0)):  # min > max: every element is max
        feeds = {"x": x, **{b: np.array(v, np.float32) for b, v in zip(["lo", "hi"], (lo, hi)) if b in bounds}}
        np.testing.assert_array_equal(compiled.run(feeds)["y"], ref.run(None, feeds)[0])


def test_clip_with_one_constant_bound_and_int_types():
    hi = helper.make_tensor("hi", TensorProto.INT32, [], [3])
    graph = helper.make_graph([helper.make_node("Clip", ["x", "lo", "hi"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.INT32, [6]),
                               helper.make_tensor_value_info("lo", TensorProto.INT32, [])],
                              [helper.make_tensor_value_info("y", TensorProto.INT32, [6])], [hi])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    for backend in BACKENDS:
        compiled = glowpy.compile(model, backend=backend)
        assert sorted(n.op for n in compiled.graph.nodes) == ["Clip", "Max"]
        feeds = {"x": np.arange(-3, 3, dtype=np.int32) * 2, "lo": np.array(-2, np.int32)}
        np.testing.assert_array_equal(compiled.run(feeds)["y"], ReferenceEvaluator(model).run(None, feeds)[0])


def test_a_refused_op_is_refused_at_compile_not_at_the_first_run():
    graph = helper.make_graph([helper.make_node("FrobnicateX", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])])
    with pytest.raises(UnsupportedOperator, match="FrobnicateX"):
        glowpy.compile(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), backend="interpreter")
