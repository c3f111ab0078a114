"""IR graph -> a list of kernel steps: the driver. Kernel selection is select.py (op -> emitter), the
elementwise grouping fusion.py, kernel sharing and weight packing sharing.py, module text
module_text.py.

A `Step` is one call in the generated entry: an LLVM function plus what to pass it (graph values,
compile-time arrays that go into the weights block, a per-thread scratch region, null). Graph
rewrites (BatchNorm folding, epilogue fusion) are the optimizer's; here:

- **epilogues**: a Conv / Gemm / MatMul / FullyConnected emits the activation and residual operand
  the optimizer fused into it (its `activation` attributes and Conv's 4th input);
- **elementwise groups**: a tree of elementwise ops whose intermediate values have no consumer outside
  the tree (and the tree's output shape) is one loop; BatchNormalization counts as elementwise
  (a per-channel affine).
- Reshape, and Identity / Dropout on their own, are aliases (no code, same memory).

Each step sits at the position of its last node, so every operand it reads is computed before it.
The input graph is never modified.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

import numpy as np
from llvmlite import ir

from glowpy.backends.cpu.fusion import ELEMENTWISE_OPS, grow_group, lower_group
from glowpy.backends.cpu.guards import branch_guards, step_guard
from glowpy.backends.cpu.kernels import movement
from glowpy.backends.cpu.kernels.common import KernelInfo
from glowpy.backends.cpu.module_text import KernelTexts, ident
from glowpy.backends.cpu.select import HEAVY_OPS, KERNELS, lower_heavy_node
from glowpy.backends.cpu.sharing import KernelSharing
from glowpy.backends.cpu.steps import Arg, Step
from glowpy.errors import GlowpyError, UnsupportedOperator
from glowpy.ir.graph import Graph, Node, Value

# Below this much work a kernel runs on one thread: splitting it saves less than the wait after it
# costs (~0.5-1 us when both threads spin; a serial step between split ones that depend on it costs a
# wait on each side and leaves the other threads idle, so a step is worth splitting from ~3 us of one thread's
# work: MobileNet-v2's 14x14 and 7x7 depthwise convs, 13-25 us, ran on one thread at 1 << 15).
# Work counts elements, and FLOPs for HEAVY_OPS, which do ~64 FLOPs in the time of one element of the
# others (measured on one Zen 5 thread: Gemm 16x256x256, 2 MFLOP, 8 us; Transpose 512x64, 32 K
# elements, 17 us).
PARALLEL_MIN_WORK = 1 << 13
FLOPS_PER_ELEMENT = 64

# The compile runs with the cyclic collector paused, and a sealed kernel's llvmlite IR is cyclic
# garbage: collecting the youngest generation before a kernel is built, once this many objects are
# new, lets the next kernels reuse that memory. Without it the build held every kernel's IR at once,
# and the few objects that outlive the build pinned its memory (ResNet-50: 24 MiB more at the peak);
# the collections cost ~3% of the build.
COLLECT_OBJECTS = 10_000

ALIAS_OPS = frozenset({"Reshape", "Identity", "Dropout"})
__all__ = ["ALIAS_OPS", "ELEMENTWISE_OPS", "HEAVY_OPS", "KERNELS", "Lowering", "copy_function"]


class Lowering:
    """Turns a graph into steps inside `module`. `arrays` collects compile-time weights-block data."""

    def __init__(self, graph: Graph, module: ir.Module, *, nthreads: int, vector_width: int,
                 fast_kernels: bool = True, release_weights: bool = False, prefix: str = "") -> None:
        self.graph = graph
        self.prefix = prefix  # of every kernel name: a Loop body's steps are named after the loop's
        self.module = module  # the entry's module; kernels are built in their own (kmod)
        self.nthreads = nthreads
        self.vector_width = vector_width
        self.fast_kernels = fast_kernels
        self.steps: list[Step] = []
        self.arrays: list[np.ndarray] = []
        self._array_keys: dict[int, int] = {}
        self._index = {id(n): i for i, n in enumerate(graph.nodes)}
        self._outputs = {id(v) for v in graph.outputs}
        self._claimed: set[int] = set()
        self.used_fast: list[str] = []
        self.release_weights = release_weights
        self._packed_uses: dict[int, int] = {}
        self.texts = KernelTexts(module)
        self.kernel_defs = self.texts.defs
        self.kernel_decls = self.texts.decls
        self._sharing = KernelSharing(self.kmod, release_weights)
        self.panel_major: dict[int, int] | None = None  # select.panel_major's plan, made on first use

    def child(self, graph: Graph, module: ir.Module, prefix: str) -> Lowering:
        """The lowering of a Loop body (loops.py): single-threaded, its kernels named under `prefix`, its
        compile-time arrays in this lowering's weights."""
        sub = Lowering(graph, module, nthreads=1, vector_width=self.vector_width, fast_kernels=self.fast_kernels,
                       prefix=prefix)
        sub.arrays, sub._array_keys = self.arrays, self._array_keys
        return sub

    # --- helpers ------------------------------------------------------------------------------

    def array(self, a: np.ndarray) -> Arg:
        """Place a compile-time array in the weights block (deduplicated by identity)."""
        a = np.ascontiguousarray(a)
        key = self._array_keys.get(id(a))
        if key is None:
            key = len(self.arrays)
            self.arrays.append(a)
            self._array_keys[id(a)] = key
        return Arg("array", index=key)

    @staticmethod
    def val(v: Value) -> Arg:
        return Arg("value", v)

    def fname(self, nodes: list[Node]) -> str:
        """k<step>.<op>.<node>[.<fused ops>]: the first node names the kernel, the rest were fused in."""
        first = nodes[0]
        tail = "".join(f".{n.op}" for n in nodes[1:4]) + (f".and{len(nodes) - 4}" if len(nodes) > 4 else "")
        return ident(f"{self.prefix}k{len(self.steps):03d}.{first.op}.{first.name}{tail}")

    def kmod(self) -> ir.Module:
        """The module a new kernel is built in (the earlier kernels are sealed: their IR is garbage)."""
        if gc.get_count()[0] >= COLLECT_OBJECTS:
            gc.collect(0)
        return self.texts.kmod()

    def seal(self, fn: ir.Function) -> ir.Function:
        return self.texts.seal(fn)

    def generate(self, gen: Callable[..., KernelInfo], name: str, weight_keys: tuple[str, ...],
                 **kwargs: Any) -> KernelInfo:
        """A kernel from `gen`, shared with earlier steps of the same configuration (sharing.py)."""
        info = self._sharing.generate(gen, name, weight_keys, **kwargs)
        # Sealed now: the sharing table then keeps a declaration, not the kernel module's IR objects.
        info.function = self.seal(info.function)
        return info

    def add(self, step: Step) -> None:
        if step.fn is not None:
            step.fn = self.seal(step.fn)
        step.position = max(self._index[id(n)] for n in step.nodes) if step.nodes else len(self.graph.nodes)
        heavy = bool(step.nodes) and step.nodes[0].op in HEAVY_OPS
        least = PARALLEL_MIN_WORK * (FLOPS_PER_ELEMENT if heavy else 1)
        step.parallel = self.nthreads > 1 and (step.cooperative or step.work >= least) and step.fn is not None
        self.steps.append(step)
        for n in step.nodes:
            self._claimed.add(id(n))

    # --- driver -------------------------------------------------------------------------------

    def run(self) -> list[Step]:
        for node in self.graph.nodes:
            if node.op in HEAVY_OPS:
                lower_heavy_node(self, node)
        for node in reversed(self.graph.nodes):
            if id(node) in self._claimed or node.op not in ELEMENTWISE_OPS or node.op in ("Identity", "Dropout"):
                continue
            lower_group(self, grow_group(self, node))
        for node in self.graph.nodes:
            if id(node) in self._claimed:
                continue
            try:
                self._lower_node(node)
            except GlowpyError as e:
                raise e.at(node=node.name, op=node.op)
        self.steps.sort(key=lambda s: s.position)
        guards = branch_guards(self.graph)
        if guards:
            for s in self.steps:
                if s.fn is not None:
                    s.guard = step_guard(s.nodes, guards)
        return self.steps

    def _lower_node(self, node: Node) -> None:
        if node.op in ALIAS_OPS:
            self.add(Step(self.fname([node]), None, [], [node.outputs[0]], [node],
                          alias=(node.outputs[0], node.inputs[0])))
            return
        emit = KERNELS.get(node.op)
        if emit is None:
            raise UnsupportedOperator("the CPU backend has no kernel for this op", node=node.name, op=node.op)
        emit(self, node)


def copy_function(module: ir.Module, name: str, value: Value) -> ir.Function:
    """A plain copy of one buffer (aliases that cannot alias, outputs that are inputs or repeated)."""
    return movement.emit_copies(module, ident(name), value.dtype, ["out", "src"],
                                [movement.plain_copy(value.shape)])
