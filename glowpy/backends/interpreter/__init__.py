"""The interpreter backend: numpy execution of every IR op, the oracle other backends are tested against.

It runs each node's reference semantics (declared with the op in `glowpy.ir.ops`) in topological
order; it keeps every op as it is (nothing is lowered for it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from glowpy.backends.base import Backend, Executable
from glowpy.errors import GlowpyError, InternalError
from glowpy.ir.graph import Graph


class InterpreterExecutable(Executable):
    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        # Resolve op declarations once, and which activations die after each step (so a run's peak
        # memory stays near the live set instead of holding every intermediate).
        keep = {id(v) for v in graph.outputs}
        last: dict[int, int] = {}
        for i, n in enumerate(graph.nodes):
            for v in n.inputs:
                if v.kind == "node" and id(v) not in keep:
                    last[id(v)] = i
        dying: dict[int, list[int]] = {}
        for key, i in last.items():
            dying.setdefault(i, []).append(key)
        self._steps = [(n, n.opdef, dying.get(i, [])) for i, n in enumerate(graph.nodes)]

    def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        env: dict[int, np.ndarray] = {id(v): a for v, a in zip(self.graph.inputs, inputs)}
        for v in self.graph.constants.values():
            env[id(v)] = v.data
        for node, opdef, dead in self._steps:
            try:
                results = opdef.run(node.attrs, [env[id(v)] for v in node.inputs])
            except GlowpyError as e:
                raise e.at(node=node.name, op=node.op)
            except (ValueError, TypeError, IndexError, FloatingPointError) as e:
                raise InternalError(f"interpreter failed: {type(e).__name__}: {e}", node=node.name,
                                    op=node.op) from e
            for out, res in zip(node.outputs, results):
                env[id(out)] = res
            for key in dead:
                del env[key]
        return [np.asarray(env[id(v)]) for v in self.graph.outputs]


class InterpreterBackend(Backend):
    name = "interpreter"

    def compile(self, graph: Graph, **options: Any) -> InterpreterExecutable:
        return InterpreterExecutable(graph)
