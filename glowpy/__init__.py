"""glowpy: a Glow-style graph compiler for ONNX models.

    import glowpy
    graph = glowpy.load("model.onnx")                  # ONNX -> IR (typed, static shapes)
    model = glowpy.compile("model.onnx")               # import, optimize, compile for a backend
    outputs = model.run({"input": array})              # {output name: array}
"""

from __future__ import annotations

from typing import Any

from glowpy.backends import DEFAULT_BACKEND
from glowpy.compiled import CompiledModel
from glowpy.errors import GlowpyError, Status
from glowpy.importer import ModelLike, ShapeMap
from glowpy.importer.compat import CompatReport, check
from glowpy.importer.partition import Partition, partition
from glowpy.ir import Graph
from glowpy.optimizer import optimize
from glowpy.pipeline import compile_model, load

__version__ = "0.1.0"


def compile(  # noqa: A001  (the verb users expect)
    model: ModelLike | Graph,
    backend: str = DEFAULT_BACKEND,
    shapes: ShapeMap | None = None,
    optimize: bool = True,
    **options: Any,
) -> CompiledModel:
    """Import `model`, optimize it for `backend` (unless `optimize=False`) and compile it for
    `backend`: "cpu" (the default: llvmlite JIT for the host CPU) or "interpreter" (numpy, the oracle).

    Backend options go in `**options`; the cpu backend takes `threads` (default $GLOWPY_NUM_THREADS, else
    the machine's CPU count), `cache` (reuse compiled code from the on-disk cache, default True),
    `fast_kernels`, `profile` and `release_weights` (default: True when the optimizer made a private copy).
    An option the backend does not know raises UnsupportedAttribute. This is `glowpy.pipeline.compile_model`,
    the pipeline every entry (ONNXIFI, the onnx backend face, the CLI) runs."""
    return compile_model(model, backend, shapes, optimize=optimize, **options)


__all__ = ["CompatReport", "CompiledModel", "Graph", "GlowpyError", "Partition", "Status", "__version__", "check",
           "compile", "load", "optimize", "partition"]
