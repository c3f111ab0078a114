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
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from glowpy import optimizer
from glowpy.backends import DEFAULT_BACKEND, Backend, find_backend, get_backend
from glowpy.backends.progress import Progress, reporting
from glowpy.compiled import CompiledModel, ImportSummary, SpecializingModel
from glowpy.errors import GlowpyError, InternalError, Status, UnsupportedAttribute, UnsupportedShape
from glowpy.importer import ModelLike, ShapeMap, import_model
from glowpy.importer import compat as _compat
from glowpy.importer import partition as _partition
from glowpy.importer import specialize as _specialize
from glowpy.importer.onnx_import import read_model
from glowpy.ir import Graph
from glowpy.optimizer import OptimizeStats

DEFAULT_SPECIALIZATIONS = 8  # compilations a model with run-time shapes keeps (LRU)


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
    specializations: int = DEFAULT_SPECIALIZATIONS,
    progress: bool | None = False,
    **options: Any,
) -> CompiledModel | SpecializingModel:
    """Import, optimize for `backend` (unless `optimize=False`) and compile. Backend options go in
    `**options` (cpu: `threads`, `cache`, `fast_kernels`, `profile`, `release_weights`); an option the
    backend does not know raises UnsupportedAttribute. `progress`: a progress line on stderr for a
    compile longer than a second (None: when stderr is a TTY, glowpy.compile's default; False: never).

    A model with unbound symbolic input dims (and no `shapes=`), or with graph inputs that decide shapes
    (Reshape's shape, Slice's starts, ... fed at run time), gives a SpecializingModel: it compiles on
    first run for each distinct key (input shapes, the bytes of those inputs) through this same
    pipeline, and keeps the `specializations` most recently used compiled."""
    name = Path(model).name if isinstance(model, (str, os.PathLike)) else ""
    held = [model]  # handed over, so the model's bytes can die as soon as it is imported
    del model
    with reporting(Progress(progress, name)) as bar:
        return _compile_model(held, backend, shapes, optimize, specializations, bar, options)


def _compile_model(held: list[ModelLike | Graph], backend: str | Backend, shapes: ShapeMap | None, optimize: bool,
                   specializations: int, bar: Progress, options: dict[str, Any]
                   ) -> CompiledModel | SpecializingModel:
    model = held.pop()
    be = get_backend(backend)
    start = time.perf_counter()
    if isinstance(model, Graph):
        return _compile_graph(model, be, False, start, optimize, bar, options)
    # A backend with a model cache may hand back the whole result of an earlier identical compile.
    key = be.model_cache_key(model, shapes, optimize, options)
    hit = be.load_compiled(key, options) if key is not None else None
    if hit is not None:
        graph, executable, imported = hit
        return CompiledModel(graph, executable, be.name, compile_seconds=time.perf_counter() - start, cached=True,
                             imported=ImportSummary(*imported[:3], 0.0))
    bar.stage("import")
    proto, base_dir = read_model(model, lean=True)
    if _specialize.needs_specialization(proto, shapes):
        return _specializing(proto, base_dir, be, shapes, optimize, specializations, options)
    owned = proto is not model
    del model
    graph = import_model(proto, shapes, base_dir=base_dir, owned=owned)
    del proto
    return _compile_graph(graph, be, True, start, optimize, bar, options, key)


def _compile_graph(graph: Graph, be: Backend, owned: bool, start: float, optimize: bool, bar: Progress,
                   options: dict[str, Any], cache_key: str | None = None) -> CompiledModel:
    """Optimize and compile `graph`; `owned`: imported for this compile, nobody else sees it;
    `cache_key`: where the backend's model cache keeps the result."""
    imported = _summary(graph, time.perf_counter() - start) if owned else _summary(graph, 0.0)
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
    if cache_key is not None:
        be.store_compiled(cache_key, graph, executable, dataclasses.astuple(imported))
    return CompiledModel(graph, executable, be.name, compile_seconds=time.perf_counter() - start,
                         cached=getattr(executable, "cached", False), imported=imported)


def _specializing(proto: onnx.ModelProto, base_dir: str | None, be: Backend, shapes: ShapeMap | None,
                  optimize: bool, capacity: int, options: dict[str, Any]) -> SpecializingModel:
    """A model that binds its feeds (`importer.specialize`) and compiles per key: import, optimize and
    compile as `compile_model` does for a static model."""
    unknown = sorted(set(options) - set(be.options))
    if unknown:  # now, not at the first run
        raise UnsupportedAttribute(f"unknown compile option(s) {unknown} for the {be.name} backend",
                                   expected=list(be.options), found=unknown)
    report = _compat.check(proto, be, shapes, backend_name=be.name)
    if not report.supported:  # what no feed could make work is refused now, as for a static model
        raise _refusal(report)
    operands = _specialize.shape_operands(proto)

    def compile_for(feeds: Mapping[str, np.ndarray]) -> CompiledModel:
        empty = [n for n, a in feeds.items() if a.size == 0 and n not in operands]
        if empty:
            raise UnsupportedShape(f"input '{empty[0]}' has a zero dim: glowpy has no zero-size run-time buffers",
                                   expected="non-zero dims", found=list(feeds[empty[0]].shape))
        bound = _specialize.specialize(proto, feeds, operands)
        start = time.perf_counter()
        graph = import_model(bound, _specialize.feed_shapes(feeds, operands, shapes), base_dir=base_dir, owned=True)
        return _compile_graph(graph, be, True, start, optimize, Progress(False), dict(options))

    return SpecializingModel([i.name for i in _specialize.graph_inputs(proto)],
                             [o.name for o in proto.graph.output], be.name, compile_for,
                             lambda feeds: _specialize.key(feeds, operands), operands, capacity,
                             _specialize.pending_reason(proto, shapes))


def _refusal(report: _compat.CompatReport) -> GlowpyError:
    """The check's refusal as the error class of its status."""
    classes: dict[Status, type[GlowpyError]] = {}
    for c in GlowpyError.__subclasses__():
        if c.__module__ == GlowpyError.__module__:  # (not another layer's own subclasses)
            classes.setdefault(c.status, c)
    return classes.get(report.status, InternalError)(report.reason)


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
