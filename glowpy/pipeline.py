"""The one compile pipeline: import -> optimize for the backend -> backend compile.

Every entry calls it: `glowpy.compile`, ONNXIFI's `onnxInitGraph` (and each later binding of symbolic
dims), the `onnx.backend` face and the CLI. So the same model with the same options gives the same
optimized graph, the same code and bit-identical outputs whichever door it came in by.

    optimized_graph(model, backend)   # import + optimize: what `glowpy dump` prints
    compile_model(model, backend)     # ... + backend.compile: a CompiledModel
    check(model, backend)             # the importer's walk, types only: a verdict per node
    partition(model, backend)         # the same verdicts, grouped into offloadable subgraphs

Backends are named here (`"cpu"`, `"interpreter"`) and handed down as objects: the importer and the
optimizer below only ever see a Backend.
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import Any

from glowpy import optimizer
from glowpy.backends import DEFAULT_BACKEND, Backend, find_backend, get_backend
from glowpy.backends.progress import Progress, reporting
from glowpy.compiled import CompiledModel, ImportSummary
from glowpy.importer import ModelLike, ShapeMap, import_model
from glowpy.importer import compat as _compat
from glowpy.importer import partition as _partition
from glowpy.ir import Graph
from glowpy.optimizer import OptimizeStats


def load(model: ModelLike | Graph, shapes: ShapeMap | None = None) -> Graph:
    """Import an ONNX model (bytes, path or ModelProto) into a verified IR graph; a Graph passes through."""
    if isinstance(model, Graph):
        return model
    return import_model(model, shapes)


def _summary(graph: Graph, seconds: float) -> ImportSummary:
    return ImportSummary(len(graph.nodes), graph.num_parameters,
                         sum(c.type.nbytes for c in graph.constants.values()), seconds)


def optimized_graph(
    model: ModelLike | Graph,
    backend: str | Backend = DEFAULT_BACKEND,
    shapes: ShapeMap | None = None,
    *,
    optimize: bool = True,
    verify: bool | None = None,
    stats: OptimizeStats | None = None,
    stop_after: str | None = None,
) -> Graph:
    """Import `model` and run the optimizer for `backend` on it: the graph `compile_model` hands the
    backend. A caller's Graph is left untouched (the passes work on a copy)."""
    be = get_backend(backend)
    owned = not isinstance(model, Graph)
    graph = load(model, shapes)
    if not optimize:
        return graph
    return optimizer.optimize(graph, be, in_place=owned, verify=verify, stats=stats, stop_after=stop_after)


def compile_model(
    model: ModelLike | Graph,
    backend: str | Backend = DEFAULT_BACKEND,
    shapes: ShapeMap | None = None,
    *,
    optimize: bool = True,
    progress: bool | None = False,
    **options: Any,
) -> CompiledModel:
    """Import, optimize for `backend` (unless `optimize=False`) and compile. Backend options go in
    `**options` (cpu: `threads`, `cache`, `fast_kernels`, `profile`, `release_weights`); an option the
    backend does not know raises UnsupportedAttribute. `progress`: a progress line on stderr for a
    compile longer than a second (None: when stderr is a TTY, glowpy.compile's default; False: never)."""
    name = Path(model).name if isinstance(model, (str, os.PathLike)) else ""
    held = [model]  # handed over, so the model's bytes can die as soon as it is imported
    del model
    with reporting(Progress(progress, name)) as bar:
        return _compile_model(held, backend, shapes, optimize, bar, options)


def _compile_model(held: list[ModelLike | Graph], backend: str | Backend, shapes: ShapeMap | None, optimize: bool,
                   bar: Progress, options: dict[str, Any]) -> CompiledModel:
    model = held.pop()
    be = get_backend(backend)
    owned = not isinstance(model, Graph)  # imported here: nobody else sees this graph
    start = time.perf_counter()
    # A backend with a model cache may hand back the whole result of an earlier identical compile.
    key = be.model_cache_key(model, shapes, optimize, options) if owned and hasattr(be, "model_cache_key") else None
    hit = be.load_compiled(key, options) if key is not None else None
    if hit is not None:
        graph, executable, imported = hit
        return CompiledModel(graph, executable, be.name, compile_seconds=time.perf_counter() - start, cached=True,
                             imported=ImportSummary(*imported[:3], 0.0))
    bar.stage("import")
    graph = load(model, shapes)
    del model
    imported = _summary(graph, time.perf_counter() - start)
    start = time.perf_counter()
    if optimize:
        bar.stage("optimize")
        # A graph we own is rewritten in place, so weights the passes replace (BatchNorm folding) die
        # as they go instead of doubling the peak; a caller's graph is copied first.
        graph = optimizer.optimize(graph, be, in_place=owned)
    if (optimize or owned) and "release_weights" in be.options:
        # Our private graph: once its weights are packed into kernels it need not keep them alive.
        options.setdefault("release_weights", True)
    executable = be.compile(graph, **options)
    if key is not None:
        be.store_compiled(key, graph, executable, dataclasses.astuple(imported))
    return CompiledModel(graph, executable, be.name, compile_seconds=time.perf_counter() - start,
                         cached=getattr(executable, "cached", False), imported=imported)


def optimize(graph: Graph, backend: str | Backend | None = None, **kwargs: Any) -> Graph:
    """The optimizer pipeline for `backend` (a name, a Backend, or None: keep every op) on a copy of
    `graph` (unless `in_place=True`); the other keywords are `glowpy.optimizer.optimize`'s."""
    return optimizer.optimize(graph, None if backend is None else get_backend(backend), **kwargs)


def check(model: ModelLike, backend: str | Backend | None = DEFAULT_BACKEND,
          shapes: ShapeMap | None = None) -> _compat.CompatReport:
    """Can `backend` run `model`? One verdict per node without reading a weight (see
    `glowpy.importer.compat.check`). A backend that cannot be created here leaves the op table to decide."""
    name = backend if isinstance(backend, str) else None
    return _compat.check(model, find_backend(backend), shapes, backend_name=name)


def partition(model: ModelLike, backend: str | Backend | None = DEFAULT_BACKEND,
              shapes: ShapeMap | None = None) -> _partition.Partition:
    """`model` split into subgraphs `backend` runs and the nodes left to the host."""
    name = backend if isinstance(backend, str) else None
    return _partition.partition(model, find_backend(backend), shapes, backend_name=name)


__all__ = ["check", "compile_model", "load", "optimize", "optimized_graph", "partition"]
