"""glowpy: a Glow-style graph compiler for ONNX models.

    import glowpy
    graph = glowpy.load("model.onnx")                  # ONNX -> IR (typed, static shapes)
    model = glowpy.compile("model.onnx")               # import, optimize, compile for a backend
    outputs = model.run({"input": array})              # {output name: array}
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from glowpy.compiled import CompiledModel, SpecializingModel
    from glowpy.importer import ModelLike, ShapeMap
    from glowpy.ir import Graph

__version__ = "0.1.0"

# Public names and the module each lives in. They are imported on first use (PEP 562), so
# `import glowpy` costs milliseconds and pulls in neither onnx, numpy nor llvmlite.
_LAZY = {
    "CompatReport": "glowpy.importer.compat",
    "check": "glowpy.pipeline",
    "CompiledModel": "glowpy.compiled",
    "SpecializingModel": "glowpy.compiled",
    "GlowpyError": "glowpy.errors",
    "Status": "glowpy.errors",
    "Graph": "glowpy.ir",
    "Partition": "glowpy.importer.partition",
    "partition": "glowpy.pipeline",
    "optimize": "glowpy.pipeline",
    "load": "glowpy.pipeline",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'glowpy' has no attribute '{name}'")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


def compile(  # noqa: A001  (the verb users expect)
    model: ModelLike | Graph,
    backend: str | None = None,
    shapes: ShapeMap | None = None,
    optimize: bool = True,
    **options: Any,
) -> CompiledModel | SpecializingModel:
    """Import `model`, optimize it for `backend` (unless `optimize=False`) and compile it for
    `backend`: "cpu" (None: the default: llvmlite JIT for the host CPU) or "interpreter" (numpy, the oracle).

    Backend options go in `**options`; the cpu backend takes `threads` (default $GLOWPY_NUM_THREADS, else
    the machine's CPU count), `cache` (reuse compiled code from the on-disk cache, default True),
    `fast_kernels`, `profile` and `release_weights` (default: True when the optimizer made a private copy).
    `progress` (default None: on stderr when it is a TTY and the compile takes over a second; True, False).
    An option the backend does not know raises UnsupportedAttribute. A model with unbound symbolic input
    dims (and no `shapes=`) or with graph inputs that decide shapes (Reshape's shape, Slice's starts, ...)
    gives a SpecializingModel: it compiles on first run per input shapes and operand values, keeping the
    `specializations=` (default 8) most recently used. This is `glowpy.pipeline.compile_model`,
    the pipeline every entry (ONNXIFI, the onnx backend face, the CLI) runs."""
    from glowpy.backends import DEFAULT_BACKEND
    from glowpy.pipeline import compile_model

    options.setdefault("progress", None)
    return compile_model(model, backend or DEFAULT_BACKEND, shapes, optimize=optimize, **options)


__all__ = ["CompatReport", "CompiledModel", "Graph", "GlowpyError", "Partition", "SpecializingModel", "Status",
           "__version__", "check", "compile", "load", "optimize", "partition"]
