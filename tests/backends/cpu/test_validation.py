"""Wrong inputs are rejected before the native call; no kernel ever sees a buffer of the wrong size."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import glowpy
from glowpy.errors import (
    InvalidDatatype,
    InvalidName,
    InvalidShape,
    MismatchingDatatype,
    MismatchingShape,
    UnidentifiedName,
)


@pytest.fixture(scope="module")
def model():
    node = helper.make_node("Add", ["a", "b"], ["y"], name="add")
    graph = helper.make_graph([node], "g", [
        helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 3]),
        helper.make_tensor_value_info("b", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    m = glowpy.compile(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), backend="cpu")

    def forbidden(*args):
        raise AssertionError("the native entry was called with invalid inputs")

    m.ok_entry, m.forbidden = m.executable._entry, forbidden
    m.executable._entry = forbidden
    yield m
    m.executable._entry = m.ok_entry


A = np.ones((2, 3), np.float32)

CASES = {
    "shape": ({"a": A, "b": np.ones((3, 2), np.float32)}, MismatchingShape),
    "bigger": ({"a": A, "b": np.ones((2, 4), np.float32)}, MismatchingShape),
    "rank": ({"a": A, "b": np.ones((6,), np.float32)}, MismatchingShape),
    "zero-dim": ({"a": A, "b": np.ones((0, 3), np.float32)}, InvalidShape),
    "dtype": ({"a": A, "b": np.ones((2, 3), np.float64)}, MismatchingDatatype),
    "int-dtype": ({"a": A, "b": np.ones((2, 3), np.int32)}, MismatchingDatatype),
    "unknown-dtype": ({"a": A, "b": np.ones((2, 3), np.complex64)}, InvalidDatatype),
    "not-array": ({"a": A, "b": object()}, InvalidDatatype),
    "unknown-name": ({"a": A, "b": A, "c": A}, InvalidName),
    "missing": ({"a": A}, UnidentifiedName),
    "other-name-same-count": ({"a": A, "c": A}, InvalidName),
    "read-only-wrong-shape": ({"a": A, "b": np.broadcast_to(np.float32(1), (3, 2))}, MismatchingShape),
}


@pytest.mark.parametrize("case", list(CASES))
def test_rejected_before_the_native_call(model, case: str) -> None:
    feeds, error = CASES[case]
    with pytest.raises(error):
        model.run(feeds)


def test_valid_inputs_still_run(model) -> None:
    model.executable._entry = model.ok_entry
    try:
        b = np.arange(6, dtype=np.float32).reshape(2, 3)
        np.testing.assert_array_equal(model.run({"a": A, "b": b})["y"], A + b)
        # non-contiguous input: made contiguous, same result
        bt = np.arange(6, dtype=np.float32).reshape(3, 2).T
        np.testing.assert_array_equal(model.run({"a": A, "b": bt})["y"], A + bt)
        # a Mapping that is not a dict, a read-only input
        from types import MappingProxyType

        np.testing.assert_array_equal(model.run(MappingProxyType({"a": A, "b": b}))["y"], A + b)
        ro = b.copy()
        ro.flags.writeable = False
        np.testing.assert_array_equal(model.run({"a": A, "b": ro})["y"], A + b)
    finally:
        model.executable._entry = model.forbidden


@pytest.mark.parametrize("bad,error", [
    (np.ones((3, 2, 1), np.float32), MismatchingShape),
    (np.ones((2, 3), np.float64), MismatchingDatatype),
    (np.ones((0, 3), np.float32), InvalidShape),
    ([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], InvalidDatatype),
])
def test_executable_checks_on_its_own(model, bad, error) -> None:
    """The executable is the last line of defence when called directly (ONNXIFI, tools)."""
    with pytest.raises(error):
        model.executable.run([A, bad])
