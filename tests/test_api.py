"""The Python API: load / compile / run, and the checks that guard every run."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import glowpy
from glowpy.errors import (
    InvalidDatatype,
    InvalidName,
    InvalidShape,
    MismatchingDatatype,
    MismatchingShape,
    UnidentifiedName,
    UnsupportedAttribute,
)


def two_input_model():
    nodes = [helper.make_node("MatMul", ["A", "W"], ["M"]), helper.make_node("Add", ["M", "B"], ["Y"]),
             helper.make_node("Relu", ["Y"], ["Z"])]
    w = numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(3, 4) / 10, "W")
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info("A", TensorProto.FLOAT, [2, 3]),
         helper.make_tensor_value_info("B", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("Z", TensorProto.FLOAT, [2, 4]),
         helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 4])],
        [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.fixture
def compiled(backend):
    return glowpy.compile(two_input_model(), backend=backend)


def test_run_returns_outputs_in_graph_order(compiled) -> None:
    a = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    b = np.full((1, 4), -0.5, np.float32)
    out = compiled.run({"A": a, "B": b})
    assert list(out) == ["Z", "Y"] == compiled.output_names
    assert compiled.input_names == ["A", "B"]
    y = a @ (np.arange(12, dtype=np.float32).reshape(3, 4) / 10) + b
    np.testing.assert_allclose(out["Y"], y, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out["Z"], np.maximum(y, 0), rtol=1e-5, atol=1e-6)


def test_unknown_input_name(compiled) -> None:
    feeds = {"A": np.zeros((2, 3), np.float32), "B": np.zeros((1, 4), np.float32), "C": np.zeros(1)}
    with pytest.raises(InvalidName, match="'C' is not an input of the model"):
        compiled.run(feeds)


def test_weight_fed_as_input(compiled) -> None:
    feeds = {"A": np.zeros((2, 3), np.float32), "B": np.zeros((1, 4), np.float32), "W": np.zeros((3, 4))}
    with pytest.raises(InvalidName, match="it is a weight"):
        compiled.run(feeds)


def test_missing_input(compiled) -> None:
    with pytest.raises(UnidentifiedName, match=r"no value given for input\(s\) \['B'\]"):
        compiled.run({"A": np.zeros((2, 3), np.float32)})


def test_wrong_dtype(compiled) -> None:
    with pytest.raises(MismatchingDatatype, match="input 'A' has the wrong element type .expected float32, found float64"):
        compiled.run({"A": np.zeros((2, 3)), "B": np.zeros((1, 4), np.float32)})


def test_unknown_dtype(compiled) -> None:
    with pytest.raises(InvalidDatatype, match="input 'A' has an element type glowpy does not know"):
        compiled.run({"A": np.array([["x"] * 3] * 2), "B": np.zeros((1, 4), np.float32)})


def test_wrong_shape(compiled) -> None:
    with pytest.raises(MismatchingShape, match=r"input 'A' has the wrong shape \(expected \[2, 3\], found \[3, 2\]\)"):
        compiled.run({"A": np.zeros((3, 2), np.float32), "B": np.zeros((1, 4), np.float32)})
    with pytest.raises(MismatchingShape, match="wrong shape"):
        compiled.run({"A": np.zeros((2, 3, 1), np.float32), "B": np.zeros((1, 4), np.float32)})


def test_zero_dim(compiled) -> None:
    with pytest.raises(InvalidShape, match="input 'A' has a zero dim"):
        compiled.run({"A": np.zeros((0, 3), np.float32), "B": np.zeros((1, 4), np.float32)})


def test_non_contiguous_input_is_accepted(compiled) -> None:
    a = np.asfortranarray(np.random.default_rng(1).standard_normal((2, 3)).astype(np.float32))
    b = np.zeros((1, 4), np.float32)
    out = compiled.run({"A": a, "B": b})
    np.testing.assert_allclose(out["Y"], np.ascontiguousarray(a) @ (np.arange(12, dtype=np.float32).reshape(3, 4) / 10),
                               rtol=1e-5, atol=1e-6)


def test_unknown_backend() -> None:
    with pytest.raises(UnsupportedAttribute, match="unknown backend 'tpu'"):
        glowpy.compile(two_input_model(), backend="tpu")


def test_load_returns_graph_and_compile_accepts_it() -> None:
    g = glowpy.load(two_input_model())
    assert isinstance(g, glowpy.Graph)
    assert glowpy.compile(g, backend="interpreter").output_names == ["Z", "Y"]


def test_import_glowpy_is_light() -> None:
    """`import glowpy` pulls in none of the heavy dependencies; they load when first needed."""
    import subprocess
    import sys

    code = ("import sys, glowpy; heavy = [m for m in ('onnx', 'llvmlite', 'numpy') if m in sys.modules]; "
            "print(heavy); glowpy.Status; glowpy.check; print('onnx' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[0] == "[]"
    assert out[1] == "True"  # the lazy attributes do resolve
