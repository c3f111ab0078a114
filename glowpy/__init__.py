"""glowpy: a Glow-style graph compiler for ONNX models.

    import glowpy
    graph = glowpy.load("model.onnx")                  # ONNX -> IR (typed, static shapes)
    model = glowpy.compile("model.onnx")               # import, optimize, compile for a backend
    outputs = model.run({"input": array})              # {output name: array}
"""

from __future__ import annotations

import time
from typing import Any

from glowpy import optimizer as _optimizer
from glowpy.backends import DEFAULT_BACKEND, get_backend
from glowpy.compiled import CompiledModel, ImportSummary
from glowpy.errors import GlowpyError, Status
from glowpy.importer import ModelLike, ShapeMap, import_model
from glowpy.importer.compat import CompatReport, check
from glowpy.importer.partition import Partition, partition
from glowpy.ir import Graph
from glowpy.optimizer import optimize

__version__ = "0.1.0"


def load(model: ModelLike | Graph, shapes: ShapeMap | None = None) -> Graph:
    """Import an ONNX model (bytes, path or ModelProto) into a verified IR graph."""
    if isinstance(model, Graph):
        return model
    return import_model(model, shapes)


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
    An option the backend does not know raises UnsupportedAttribute."""
    be = get_backend(backend)
    owned = not isinstance(model, Graph)  # imported here: nobody else sees this graph
    start = time.perf_counter()
    graph = load(model, shapes)
    del model
    imported = ImportSummary(len(graph.nodes), graph.num_parameters,
                             sum(c.type.nbytes for c in graph.constants.values()), time.perf_counter() - start)
    start = time.perf_counter()
    if optimize:
        # A graph we own is rewritten in place, so weights the passes replace (BatchNorm folding) die
        # as they go instead of doubling the peak; a caller's graph is copied first.
        graph = _optimizer.optimize(graph, be, in_place=owned)
    if (optimize or owned) and "release_weights" in be.options:
        # Our private graph: once its weights are packed into kernels it need not keep them alive.
        options.setdefault("release_weights", True)
    executable = be.compile(graph, **options)
    return CompiledModel(graph, executable, be.name, compile_seconds=time.perf_counter() - start,
                         cached=getattr(executable, "cached", False), imported=imported)


__all__ = ["CompatReport", "CompiledModel", "Graph", "GlowpyError", "Partition", "Status", "__version__", "check",
           "compile", "load", "optimize", "partition"]
