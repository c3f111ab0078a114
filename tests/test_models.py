"""Whole models: onnx's light models against the outputs onnx ships, random-weight versions against
onnxruntime. Run on every available backend."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

import glowpy
from glowpy.models import LIGHT_MODELS, light_model_path, light_output_path

RANDOM_MODELS = ("resnet50", "squeezenet", "densenet121", "inception_v2", "shufflenet")
# The light models whose cold compiles take seconds each run in the test command's second step (-m heavy).
BIG_LIGHT_MODELS = {"densenet121", "inception_v1", "inception_v2", "shufflenet", "vgg19", "zfnet512"}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.heavy) if n in BIG_LIGHT_MODELS else n
                                  for n in LIGHT_MODELS])
def test_light_model_matches_shipped_output(name: str, backend: str) -> None:
    compiled = glowpy.compile(light_model_path(name), backend=backend)
    feeds = {n: np.ones(t.shape, t.dtype) for n, t in compiled.input_types.items()}
    (out,) = compiled.run(feeds).values()
    expected = numpy_helper.to_array(onnx.load_tensor(str(light_output_path(name))))
    np.testing.assert_allclose(out, expected, rtol=1e-3, atol=1e-5)


@pytest.mark.heavy
@pytest.mark.parametrize("name", RANDOM_MODELS)
def test_random_weight_model_matches_onnxruntime(name: str, backend: str, random_model) -> None:
    path = random_model(name)
    compiled = glowpy.compile(path, backend=backend)
    (in_name, in_type), = compiled.input_types.items()
    x = np.random.default_rng(7).standard_normal(in_type.shape).astype(np.float32)
    (out,) = compiled.run({in_name: x}).values()
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (expected,) = session.run(None, {in_name: x})
    np.testing.assert_allclose(out, expected, rtol=1e-3, atol=1e-4)
    # The weights are non-trivial: the prediction is not the uniform distribution.
    assert expected.std() > 1e-5
    assert int(out.argmax()) == int(expected.argmax())
