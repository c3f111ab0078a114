"""What a backend is: it says which IR ops it keeps, and compiles a graph into an Executable."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import numpy as np

from glowpy.ir.graph import Graph, Node, Value


class Executable(ABC):
    """A compiled graph. `run` takes the inputs in graph order, already validated, and returns the
    outputs in graph order."""

    #: bytes of activation memory the executable plans (0 where it does not plan memory)
    arena_size: int = 0

    @abstractmethod
    def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]: ...


class Backend(ABC):
    name: str = ""
    #: keyword options `compile` accepts (glowpy.compile passes the caller's through)
    options: tuple[str, ...] = ()

    def is_op_supported(self, node: Node) -> bool:
        """Glow's isOpSupported: can this backend execute the node as it is (op and types)?"""
        return True

    def should_lower(self, node: Node) -> bool:
        """Glow's shouldLower: should the optimizer decompose this node into simpler IR ops?"""
        return False

    def supports_fused_activation(self, node: Node, activation: str) -> bool:
        """Glow's supportsFusedActivation: can `node` (a Conv, Gemm, MatMul or FullyConnected) carry
        `activation` (a name in glowpy.ir.activations.ACTIVATIONS) as its epilogue? A backend that
        runs the ops' reference semantics runs any."""
        return True

    def supports_fused_residual(self, node: Node) -> bool:
        """Can `node` (a Conv) take a residual operand added before its activation?"""
        return True

    def supports_squeeze_excite(self, x: Value, activation: str, gate: str) -> bool:
        """Can the backend run a SqueezeExcite op (optimizer/squeeze_excite.py) on input `x` with these
        fused activation and gate names?"""
        return True

    # A model-level cache: a backend that has one returns a key for a compile and keeps its result.
    def model_cache_key(self, model: Any, shapes: Any, optimize: bool, options: dict[str, Any]) -> str | None:
        """The key under which compiling `model` with `options` is cached, or None: not cached."""
        return None

    def load_compiled(self, key: str, options: dict[str, Any]) -> tuple[Graph, Executable, Any] | None:
        """(optimized graph, executable, import summary) of an earlier compile under `key`, or None."""
        return None

    def store_compiled(self, key: str, graph: Graph, executable: Executable, imported: Any) -> bool:
        """Keep a compile's result under `key`; False when it is not kept."""
        return False

    def flush_compiled(self) -> None:
        """Wait until what `store_compiled` began is kept (before a host may exit without Python's
        shutdown, which would otherwise drop a write still in flight)."""
        return None

    @abstractmethod
    def compile(self, graph: Graph, **options: Any) -> Executable: ...
