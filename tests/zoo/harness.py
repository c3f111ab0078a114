"""One zoo model end to end: realize its skeleton, compile it with glowpy, compare with onnxruntime.

The outcome of a compile is what tests/zoo/expected.json records per model: "pass", or the error class and
the op it names when glowpy refuses the model. The test and tools/zoo/expect.py (which rewrites that file)
both go through `compile_outcome`, so the two cannot disagree on what an outcome is.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

import glowpy
from glowpy.errors import GlowpyError
from tests.zoo.realize import SKELETON_DIR, make_inputs, realize

EXPECTED_PATH = Path(__file__).with_name("expected.json")
RTOL, ATOL = 1e-3, 1e-4
# Per-model (rtol, atol) where float32 rounding across a deep model reaches the default tolerance, with the
# float64 reference's verdict (python tools/zoo/truth.py NAME: largest error of each engine against float64).
TOLERANCE = {
    # ResNet-50 backbone with dilated convs, 21 x 520 x 520 logits: both engines are far from float64
    # (onnxruntime 4.9e-4 / 4.5e-4, 0.7% / 0.8% of elements past the default; glowpy 6.0e-4 / 5.0e-4).
    "fcn_resnet50.torchscript": (1e-3, 1e-3),
    "fcn_resnet50.dynamo": (1e-3, 1e-3),
}
SEED = 0  # weights; the inputs use SEED + 1, the input the calibration saw

Outcome = str | dict[str, Any]


def skeleton_names() -> list[str]:
    """Every committed skeleton, as MODEL.EXPORTER."""
    return sorted(p.name.removesuffix(".onnx") for p in SKELETON_DIR.glob("*.onnx"))


def load_expected() -> dict[str, Outcome]:
    return json.loads(EXPECTED_PATH.read_text())


def realized(name: str) -> onnx.ModelProto:
    return realize(SKELETON_DIR / f"{name}.onnx", SEED)


def compile_outcome(model: onnx.ModelProto) -> tuple[glowpy.CompiledModel | None, Outcome]:
    """(the compiled model or None, "pass" or {"error": class name, "op": the op it names})."""
    try:
        return glowpy.compile(model, backend="cpu"), "pass"
    except GlowpyError as e:
        return None, {"error": type(e).__name__, "op": e.op}


def onnxruntime_outputs(model: onnx.ModelProto) -> list[dict[str, np.ndarray]]:
    """onnxruntime's outputs on every seeded feed of `model` (one per flag value)."""
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = 1  # the oracle need not be fast; spinning threads on a shared machine are slow
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return [dict(zip(names, session.run(names, feeds))) for feeds in make_inputs(model, SEED + 1)]


def mismatches(model: onnx.ModelProto, compiled: glowpy.CompiledModel, model_name: str = "") -> list[str]:
    """Every output, on every seeded feed, where glowpy and onnxruntime differ beyond RTOL / ATOL (or the
    model's TOLERANCE)."""
    rtol, atol = TOLERANCE.get(model_name, (RTOL, ATOL))
    problems = []
    for feeds, expected in zip(make_inputs(model, SEED + 1), onnxruntime_outputs(model)):
        got = compiled.run(feeds)
        flags = {k: bool(v) for k, v in feeds.items() if v.dtype == np.bool_}
        if set(got) != set(expected):
            problems.append(f"outputs {sorted(got)} != onnxruntime's {sorted(expected)}")
            continue
        for name, want in expected.items():
            try:
                np.testing.assert_allclose(got[name], want, rtol=rtol, atol=atol)
            except AssertionError as e:
                problems.append(f"output '{name}'{f' {flags}' if flags else ''}: {str(e).strip()}")
    return problems
