"""CompiledModel: a compiled graph plus the checks that guard every run."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from glowpy.backends.base import Executable
from glowpy.errors import (
    ConfigurationError,
    InvalidDatatype,
    InvalidName,
    InvalidShape,
    MismatchingDatatype,
    MismatchingShape,
    UnidentifiedName,
    UnsupportedShape,
)
from glowpy.ir.graph import Graph
from glowpy.ir.types import ANY_TYPES


def check_feed(name: str, array: Any, expected_dtype: np.dtype, expected_shape: tuple[int, ...]) -> np.ndarray:
    """Validate one input; the array comes back C-contiguous (no copy when it already is)."""
    if (type(array) is np.ndarray and array.dtype == expected_dtype and array.shape == expected_shape
            and array.size and array.flags.c_contiguous):
        return array  # the usual feed: right type, shape and layout, no zero dim (a run's fast path)
    if not isinstance(array, np.ndarray):
        try:
            array = np.asarray(array)
        except (TypeError, ValueError):
            raise InvalidDatatype(f"input '{name}' is not array-like", found=type(array).__name__) from None
    if array.dtype not in ANY_TYPES:
        raise InvalidDatatype(f"input '{name}' has an element type glowpy does not know",
                              expected=str(expected_dtype), found=str(array.dtype))
    if array.dtype != expected_dtype:
        raise MismatchingDatatype(f"input '{name}' has the wrong element type", expected=str(expected_dtype),
                                  found=str(array.dtype))
    if any(d == 0 for d in array.shape):
        raise InvalidShape(f"input '{name}' has a zero dim", expected=list(expected_shape), found=list(array.shape))
    if tuple(array.shape) != tuple(expected_shape):
        raise MismatchingShape(f"input '{name}' has the wrong shape", expected=list(expected_shape),
                               found=list(array.shape))
    return np.require(array, requirements="C")  # (ascontiguousarray would make a 0-d feed 1-d)


@dataclass(frozen=True)
class ImportSummary:
    """The model as imported, before optimization (what `glowpy run` reports)."""

    nodes: int
    parameters: int
    parameter_bytes: int
    seconds: float


class CompiledModel:
    """A model compiled for one backend. `run(feeds)` returns {output name: array} in graph order."""

    def __init__(self, graph: Graph, executable: Executable, backend: str, *, compile_seconds: float = 0.0,
                 cached: bool = False, imported: ImportSummary | None = None) -> None:
        self.graph = graph
        self.executable = executable
        self.backend = backend
        self.compile_seconds = compile_seconds
        self.cached = cached
        self.imported = imported
        self._inputs = {v.name: v for v in graph.inputs}
        self._output_names = [v.name for v in graph.outputs]
        self._checks = [(v.name, v.dtype, tuple(v.shape)) for v in graph.inputs]
        # what run's fast path accepts as is: every input by name, an ndarray of the compiled type and
        # shape, C-contiguous (a shape with a zero dim always takes the full checks, which refuse it)
        self._fast_feeds = None if any(0 in shape for _, _, shape in self._checks) else self._checks

    @property
    def input_names(self) -> list[str]:
        return [v.name for v in self.graph.inputs]

    @property
    def output_names(self) -> list[str]:
        return [v.name for v in self.graph.outputs]

    @property
    def input_types(self) -> dict[str, Any]:
        return {v.name: v.type for v in self.graph.inputs}

    @property
    def output_types(self) -> dict[str, Any]:
        return {v.name: v.type for v in self.graph.outputs}

    @property
    def arena_size(self) -> int:
        return self.executable.arena_size

    def validate(self, feeds: Mapping[str, Any]) -> list[np.ndarray]:
        """Check names, element types and shapes; return the inputs in graph order."""
        if len(feeds) == len(self._checks):  # every input given, so no other name: check the arrays only
            try:
                return [check_feed(name, feeds[name], dtype, shape) for name, dtype, shape in self._checks]
            except KeyError:
                pass
        for name in feeds:
            if name not in self._inputs:
                hint = " (it is a weight, not an input)" if name in self.graph.constants else ""
                raise InvalidName(f"'{name}' is not an input of the model{hint}", expected=self.input_names,
                                  found=name)
        missing = [n for n in self.input_names if n not in feeds]
        if missing:
            raise UnidentifiedName(f"no value given for input(s) {missing}", expected=self.input_names,
                                   found=sorted(feeds))
        return [check_feed(v.name, feeds[v.name], v.dtype, v.shape) for v in self.graph.inputs]

    def _feeds_as_is(self, feeds: Mapping[str, Any]) -> list[np.ndarray] | None:
        """The inputs in graph order when the feeds need no check beyond type, shape and layout, else None."""
        specs = self._fast_feeds
        if specs is None or not isinstance(feeds, dict) or len(feeds) != len(specs):
            return None
        arrays = []
        for name, dtype, shape in specs:
            a = feeds.get(name)
            if type(a) is not np.ndarray or a.dtype != dtype or a.shape != shape or not a.flags.c_contiguous:
                return None
            arrays.append(a)
        return arrays

    def run(self, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
        arrays = self._feeds_as_is(feeds)
        outputs = self.executable.run(self.validate(feeds) if arrays is None else arrays)
        return dict(zip(self._output_names, outputs))

    def close(self) -> None:
        """Release the executable's threads now (a cpu executable's pool; collecting the model does it
        too). The model stays usable: a later run starts them again."""
        close = getattr(self.executable, "close", None)
        if close is not None:
            close()

    def __repr__(self) -> str:
        return (f"<CompiledModel backend={self.backend} inputs={self.input_names} outputs={self.output_names} "
                f"nodes={len(self.graph.nodes)}>")


class SpecializingModel:
    """A model compiled on first use for each distinct key of its feeds (input shapes, and the bytes of
    the inputs that decide shapes: see `glowpy.importer.specialize`). The `capacity` most recently used
    specializations stay compiled (LRU). `compile_for(feeds)` compiles one; `key_of(feeds)` is its key.

    `run(feeds)` validates names here; each specialization's CompiledModel checks types and shapes as a
    static model does. Attributes of a compiled model (`graph`, `executable`, ...) are those of the
    specialization used last."""

    def __init__(self, input_names: list[str], output_names: list[str], backend: str,
                 compile_for: Callable[[Mapping[str, np.ndarray]], CompiledModel],
                 key_of: Callable[[Mapping[str, np.ndarray]], Hashable], operands: Sequence[str] = (),
                 capacity: int = 8, pending: str = "the model compiles on first run") -> None:
        if capacity < 1:
            raise ConfigurationError("specializations= must keep at least one compilation", expected=">= 1",
                               found=capacity)
        self.input_names = list(input_names)
        self.output_names = list(output_names)
        self.operands = tuple(operands)  # inputs whose values decide shapes (weights of each specialization)
        self.backend = backend
        self.capacity = capacity
        self._compile_for = compile_for
        self._key_of = key_of
        self._cache: OrderedDict[Hashable, CompiledModel] = OrderedDict()
        self._lock = threading.Lock()
        self._last: CompiledModel | None = None
        self.compilations = 0  # how many specializations were compiled (evicted ones included)
        self._pending = pending  # why nothing is compiled before the first run

    @property
    def specializations(self) -> list[CompiledModel]:
        """The compiled specializations, least recently used first."""
        return list(self._cache.values())

    def specialization(self, feeds: Mapping[str, Any]) -> CompiledModel:
        """The specialization for `feeds`, compiled now if it is not cached."""
        for name in feeds:
            if name not in self.input_names:
                raise InvalidName(f"'{name}' is not an input of the model", expected=self.input_names, found=name)
        missing = [n for n in self.input_names if n not in feeds]
        if missing:
            raise UnidentifiedName(f"no value given for input(s) {missing}", expected=self.input_names,
                                   found=sorted(feeds))
        arrays = {n: a if isinstance(a, np.ndarray) else np.asarray(a) for n, a in feeds.items()}
        key = self._key_of(arrays)
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
            else:
                hit = self._compile_for(arrays)
                self.compilations += 1
                self._cache[key] = hit
                while len(self._cache) > self.capacity:
                    self._cache.popitem(last=False)
            self._last = hit
        return hit

    def run(self, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
        model = self.specialization(feeds)
        return model.run({n: feeds[n] for n in model.input_names})  # the others are its weights

    def close(self) -> None:
        """Release every kept specialization's threads (see CompiledModel.close)."""
        for m in self.specializations:
            m.close()

    def _latest(self) -> CompiledModel:
        if self._last is None:
            raise UnsupportedShape(self._pending, expected="a compiled specialization", found="none yet")
        return self._last

    @property
    def input_types(self) -> dict[str, Any]:
        return self._latest().input_types

    @property
    def output_types(self) -> dict[str, Any]:
        return self._latest().output_types

    @property
    def graph(self) -> Graph:
        return self._latest().graph

    @property
    def executable(self) -> Executable:
        return self._latest().executable

    @property
    def arena_size(self) -> int:
        return self._latest().arena_size

    @property
    def compile_seconds(self) -> float:
        return sum(m.compile_seconds for m in self._cache.values())

    @property
    def cached(self) -> bool:
        return self._last is not None and self._last.cached

    @property
    def imported(self) -> ImportSummary | None:
        return self._last.imported if self._last is not None else None

    def __repr__(self) -> str:
        return (f"<SpecializingModel backend={self.backend} inputs={self.input_names} outputs={self.output_names} "
                f"specializations={len(self._cache)}/{self.capacity}>")
