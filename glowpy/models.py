"""Models that ship with the installed onnx package, used as glowpy's embedded defaults."""

from __future__ import annotations

import os
from pathlib import Path

import onnx

LIGHT_DIR = Path(os.path.dirname(onnx.__file__)) / "backend" / "test" / "data" / "light"
LIGHT_MODELS = ("bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50", "shufflenet",
                "squeezenet", "vgg19", "zfnet512")
DEFAULT_MODEL = "resnet50"


def light_model_path(name: str) -> Path:
    """Path of onnx's `light_<name>.onnx` (weights made by ConstantOfShape)."""
    return LIGHT_DIR / f"light_{name}.onnx"


def light_output_path(name: str) -> Path:
    """The reference output onnx ships beside the model (for an all-ones input)."""
    return LIGHT_DIR / f"light_{name}_output_0.pb"


def default_model_path() -> Path:
    return light_model_path(DEFAULT_MODEL)
