"""Whole models through the optimizer: the ResNet-50 acceptance, the BN -> Mul -> Add models, and
every light model with optimization on and off against the output onnx ships."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

import glowpy
from glowpy.models import LIGHT_MODELS, light_model_path, light_output_path
from glowpy.optimizer import OptimizeStats

from .util import ops


def _against_onnxruntime(path, compiled) -> None:
    (name, t), = compiled.input_types.items()
    x = np.random.default_rng(5).standard_normal(t.shape).astype(np.float32)
    (got,) = compiled.run({name: x}).values()
    (want,) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {name: x})
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)
    assert want.std() > 1e-5 and int(got.argmax()) == int(want.argmax())


def test_resnet50_acceptance(random_model, backend: str) -> None:
    path = random_model("resnet50")
    imported = glowpy.load(path)
    stats = OptimizeStats()
    opt = glowpy.optimize(imported, backend, verify=True, stats=stats)
    counts = opt.count_ops()
    assert "BatchNormalization" not in counts and "Relu" not in counts
    assert len(opt.nodes) < len(imported.nodes)
    assert counts["Conv"] == 53 and sum(len(n.inputs) == 4 for n in opt.nodes if n.op == "Conv") == 16
    assert not stats.unsettled
    _against_onnxruntime(path, glowpy.compile(path, backend=backend))


def test_inception_v2_folds_bn_mul_add(random_model) -> None:
    path = random_model("inception_v2")
    opt = glowpy.optimize(glowpy.load(path), verify=True)
    counts = opt.count_ops()
    assert not {"BatchNormalization", "Mul", "Add", "Relu"} & set(counts)
    assert counts["Conv"] == 69
    _against_onnxruntime(path, glowpy.compile(path))


@pytest.mark.heavy  # nine light models compiled twice each: the second step
@pytest.mark.parametrize("optimize", [True, False], ids=["opt", "no-opt"])
@pytest.mark.parametrize("name", LIGHT_MODELS)
def test_light_model_with_and_without_optimizer(name: str, optimize: bool) -> None:
    compiled = glowpy.compile(light_model_path(name), optimize=optimize)
    feeds = {n: np.ones(t.shape, t.dtype) for n, t in compiled.input_types.items()}
    (out,) = compiled.run(feeds).values()
    expected = numpy_helper.to_array(onnx.load_tensor(str(light_output_path(name))))
    np.testing.assert_allclose(out, expected, rtol=1e-3, atol=1e-5)
    imported = len(glowpy.load(light_model_path(name)).nodes)
    assert (len(compiled.graph.nodes) < imported) if optimize else (len(compiled.graph.nodes) == imported)
    if optimize:
        assert "Dropout" not in ops(compiled.graph)
        if name != "densenet121":  # densenet normalizes Concat outputs: no producer to fold into
            assert "BatchNormalization" not in ops(compiled.graph)
