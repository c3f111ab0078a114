"""Small-graph builders and the check every pass test makes: the rewrite has the expected
structure and the outputs still match the interpreter on the graph before the pass."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from glowpy.backends.base import Backend, Executable
from glowpy.backends.interpreter import InterpreterBackend
from glowpy.ir import Graph, Node, TensorType, Value
from glowpy.optimizer import Pass, clone, run_pass

F32 = np.float32


def rand(shape: Sequence[int], seed: int = 0, dtype: Any = F32) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(tuple(shape)).astype(dtype)


def randpos(shape: Sequence[int], seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(0.5, 1.5, tuple(shape)).astype(F32)


class G:
    """A tiny graph builder: g = G(); x = g.input("x", 1, 3, 8, 8); y = g("Relu", x); g.ret(y)."""

    def __init__(self) -> None:
        self.graph = Graph("t")
        self._seed = 0

    def input(self, name: str, *shape: int, dtype: Any = F32) -> Value:
        return self.graph.add_input(name, TensorType(dtype, shape))

    def const(self, data: Any, name: str = "w") -> Value:
        return self.graph.add_constant(name, np.asarray(data), unique=True)

    def weight(self, *shape: int, name: str = "w", positive: bool = False) -> Value:
        self._seed += 1
        return self.const(randpos(shape, self._seed) if positive else rand(shape, self._seed), name)

    def __call__(self, op: str, *inputs: Value, name: str | None = None, **attrs: Any) -> Value:
        return self.node(op, *inputs, name=name, **attrs).outputs[0]

    def node(self, op: str, *inputs: Value, name: str | None = None, **attrs: Any) -> Node:
        return self.graph.add_node(op, list(inputs), attrs, name=name)

    def ret(self, *values: Value) -> Graph:
        self.graph.outputs = list(values)
        self.graph.verify()
        return self.graph

    def conv(self, x: Value, cout: int, k: int = 3, group: int = 1, name: str | None = None, **attrs: Any) -> Value:
        cin = x.shape[1]
        w = self.weight(cout, cin // group, k, k, name="conv_w")
        b = self.weight(cout, name="conv_b")
        p = k // 2
        return self("Conv", x, w, b, name=name, group=group, strides=(1, 1), pads=(p, p, p, p),
                    dilations=(1, 1), **attrs)

    def bn(self, x: Value, eps: float = 1e-5) -> Value:
        c = x.shape[1]
        return self("BatchNormalization", x, self.weight(c, name="gamma", positive=True), self.weight(c, name="beta"),
                    self.weight(c, name="mean"), self.weight(c, name="var", positive=True), epsilon=eps)


def run(graph: Graph, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return InterpreterBackend().compile(graph).run([feeds[v.name] for v in graph.inputs])


def feeds_for(graph: Graph, seed: int = 1) -> dict[str, np.ndarray]:
    return {v.name: rand(v.shape, seed + i, v.dtype) for i, v in enumerate(graph.inputs)}


def apply(fn: Callable[..., bool], graph: Graph, *, backend: Backend | None = None, expect: bool = True,
          rtol: float = 1e-5, atol: float = 1e-5) -> Graph:
    """Run one pass (verifying the result) on `graph` in place; check it reports `expect` as its
    change flag and that outputs (same names) match the interpreter on the graph before the pass."""
    before = clone(graph)
    feeds = feeds_for(graph)
    p = Pass(fn.__name__, fn, uses_backend=backend is not None)
    changed = run_pass(graph, p, backend, verify=True)
    assert changed is expect, f"{fn.__name__} returned {changed}, expected {expect}"
    assert [v.name for v in graph.outputs] == [v.name for v in before.outputs]
    for got, want in zip(run(graph, feeds), run(before, feeds)):
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)
    return graph


def ops(graph: Graph) -> list[str]:
    return [n.op for n in graph.nodes]


class LoweringBackend(Backend):
    """The interpreter, but it asks for every node whose op is in `lower` to be lowered and
    declines the ops in `unsupported`."""

    name = "lowering-test"

    def __init__(self, lower: Sequence[str] = (), unsupported: Sequence[str] = ()) -> None:
        self.lower = set(lower)
        self.unsupported = set(unsupported)

    def should_lower(self, node: Node) -> bool:
        return node.op in self.lower

    def is_op_supported(self, node: Node) -> bool:
        return node.op not in self.unsupported

    def compile(self, graph: Graph, **options: Any) -> Executable:
        return InterpreterBackend().compile(graph)
