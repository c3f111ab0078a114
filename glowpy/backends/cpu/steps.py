"""What lowering produces: steps (one call each in the generated entry) and their arguments, and the
fused epilogue a heavy op's node carries."""

from __future__ import annotations

from dataclasses import dataclass, field

from llvmlite import ir

from glowpy.ir.graph import Node, Value


@dataclass(frozen=True, eq=False)
class Arg:
    """One pointer argument of a step: a graph value's buffer, a weights-block array, this thread's
    scratch, null, or graph output `index` (for final copies)."""

    kind: str  # value | array | scratch | sync | null | output
    value: Value | None = None
    index: int = -1


NULL = Arg("null")
SCRATCH = Arg("scratch")
SYNC = Arg("sync")  # a cooperative step's words in the thread pool (threads.coop_block); null unthreaded


@dataclass(eq=False)
class Step:
    name: str
    fn: ir.Function | None
    args: list[Arg]
    writes: list[Value]
    nodes: list[Node]
    work: float = 0.0
    scratch: int = 0  # bytes per thread
    inplace: list[tuple[Value, Value]] = field(default_factory=list)  # (out, operand) that may share memory
    alias: tuple[Value, Value] | None = None  # (out, source) for Reshape-like steps
    position: int = 0
    parallel: bool = False
    guard: tuple[Value, bool] | None = None  # (condition, value): the step runs only then (guards.py)
    # split into chunks that synchronize among themselves (through its SYNC words): its scratch is one
    # block the chunks share, not one per thread
    cooperative: bool = False

    @property
    def scratch_per_thread(self) -> bool:
        """Each thread gets its own scratch block (a split step that does not cooperate)."""
        return self.parallel and not self.cooperative

    @property
    def reads(self) -> list[Value]:
        return [a.value for a in self.args if a.kind == "value" and a.value not in self.writes] + (
            [self.alias[1]] if self.alias else []) + ([self.guard[0]] if self.guard else [])

    def describe(self) -> str:
        return ", ".join(f"{n.name} ({n.op})" for n in self.nodes)


@dataclass
class Epilogue:
    """A heavy op's fused epilogue, as the optimizer set it on the node (glowpy/optimizer/fuse.py)."""

    nodes: list[Node]
    out: Value
    activation: str = "none"
    params: tuple = ()
    residual: Value | None = None

    @classmethod
    def of(cls, node: Node) -> Epilogue:
        residual = node.inputs[3] if node.op == "Conv" and len(node.inputs) > 3 else None
        return cls([node], node.outputs[0], node.attrs.get("activation", "none"),
                   tuple(node.attrs.get("activation_params", ())), residual)
