"""CompiledModel: a compiled graph plus the checks that guard every run."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from glowpy.backends.base import Executable
from glowpy.errors import (
    InvalidDatatype,
    InvalidName,
    InvalidShape,
    MismatchingDatatype,
    MismatchingShape,
    UnidentifiedName,
)
from glowpy.ir.graph import Graph
from glowpy.ir.types import ALL_TYPES


def check_feed(name: str, array: Any, expected_dtype: np.dtype, expected_shape: tuple[int, ...]) -> np.ndarray:
    """Validate one input; the array comes back C-contiguous (no copy when it already is)."""
    if not isinstance(array, np.ndarray):
        try:
            array = np.asarray(array)
        except (TypeError, ValueError):
            raise InvalidDatatype(f"input '{name}' is not array-like", found=type(array).__name__) from None
    if array.dtype not in ALL_TYPES:
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

    def run(self, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
        outputs = self.executable.run(self.validate(feeds))
        return dict(zip(self.output_names, outputs))

    def __repr__(self) -> str:
        return (f"<CompiledModel backend={self.backend} inputs={self.input_names} outputs={self.output_names} "
                f"nodes={len(self.graph.nodes)}>")
