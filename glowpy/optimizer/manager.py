"""The pass manager: runs the pipeline (stages of named passes), verifies, and keeps statistics.

A pass is a function `pass_(graph) -> bool` (or `pass_(graph, backend) -> bool` when it asks the
backend what it keeps) that rewrites the graph in place and says whether it changed anything.
A stage runs its passes in order, repeating the whole list until nothing changes when it is a
fixed-point stage. With `verify`, `graph.verify()` runs after every pass; a failure (or any
exception inside a pass) is re-raised as an InternalError that names the pass.
"""

from __future__ import annotations

import contextlib
import gc
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from glowpy.errors import GlowpyError, InternalError
from glowpy.ir.graph import Graph

if TYPE_CHECKING:
    from glowpy.backends.base import Backend

PassFn = Callable[..., bool]

# Enough for every model we know (most stages settle in 2-3 rounds); reaching it means two passes
# undo each other, which the stats then show as "did not settle".
MAX_ROUNDS = 16


@dataclass(frozen=True)
class Pass:
    name: str
    fn: PassFn
    uses_backend: bool = False

    @property
    def doc(self) -> str:
        return (self.fn.__doc__ or "").strip().split("\n")[0]


@dataclass(frozen=True)
class Stage:
    name: str
    passes: tuple[Pass, ...]
    fixed_point: bool = False


@dataclass
class PassRecord:
    """What one pass did over the whole pipeline run (summed over fixed-point rounds)."""

    stage: str
    name: str
    runs: int = 0
    changed: int = 0  # runs that changed the graph
    nodes: int = 0  # change in node count
    constants: int = 0  # change in constant count
    seconds: float = 0.0


@dataclass
class OptimizeStats:
    before: dict[str, int] = field(default_factory=dict)  # node count by op
    after: dict[str, int] = field(default_factory=dict)
    passes: list[PassRecord] = field(default_factory=list)
    rounds: dict[str, int] = field(default_factory=dict)  # stage -> rounds run
    unsettled: list[str] = field(default_factory=list)  # fixed-point stages that hit MAX_ROUNDS
    seconds: float = 0.0

    def record(self, stage: str, name: str) -> PassRecord:
        for r in self.passes:
            if r.stage == stage and r.name == name:
                return r
        r = PassRecord(stage, name)
        self.passes.append(r)
        return r


class _Stop(Exception):
    """Internal: the pipeline reached `stop_after`."""


def verify_by_default() -> bool:
    """Verification after every pass is on when GLOWPY_VERIFY=1 (the test suite sets it)."""
    return os.environ.get("GLOWPY_VERIFY", "") not in ("", "0")


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """No cyclic garbage collection inside the block.

    A full collection scans every live object, and a pass over a graph of thousands of nodes
    allocates enough to trigger one again and again, so the passes' cost grew with the square of
    the graph (eliminate_common_subexpressions on 24,000 nodes: 1.1 s, 0.19 s without). Passes make little
    cyclic garbage (Graph.remove_node breaks a removed node's cycles, so its weights go at once);
    what there is waits for the next collection after the block.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def stage_and_pass_names(pipeline: Sequence[Stage]) -> list[str]:
    names: list[str] = []
    for stage in pipeline:
        names.append(stage.name)
        names += [p.name for p in stage.passes if p.name not in names]
    return names


def call_pass(graph: Graph, p: Pass, backend: Backend | None) -> bool:
    """Run one pass; any exception inside it is re-raised as an InternalError naming the pass."""
    try:
        return bool(p.fn(graph, backend) if p.uses_backend else p.fn(graph))
    except GlowpyError as e:
        raise InternalError(f"pass '{p.name}' failed: {e.reason}", node=e.node, op=e.op, expected=e.expected,
                            found=e.found) from e
    except Exception as e:  # noqa: BLE001  (a bug in a pass: report which pass, keep the cause)
        raise InternalError(f"pass '{p.name}' failed: {type(e).__name__}: {e}") from e


def verify_after(graph: Graph, p: Pass) -> None:
    """`graph.verify()`, with a failure re-raised as an InternalError naming the pass."""
    try:
        graph.verify()
    except GlowpyError as e:
        raise InternalError(f"pass '{p.name}' broke the graph: {e.reason}", node=e.node, op=e.op,
                            expected=e.expected, found=e.found) from e


def run_pass(graph: Graph, p: Pass, backend: Backend | None = None, *, verify: bool = False) -> bool:
    """Run one pass (and with `verify`, check the graph afterwards); errors name the pass."""
    changed = call_pass(graph, p, backend)
    if verify:
        verify_after(graph, p)
    return changed


def run_pipeline(
    graph: Graph,
    pipeline: Sequence[Stage],
    backend: Backend | None = None,
    *,
    verify: bool = False,
    stats: OptimizeStats | None = None,
    stop_after: str | None = None,
) -> Graph:
    """Run `pipeline` on `graph` in place. `stop_after` names a stage or pass: the pipeline stops
    after that stage, or after the first run of that pass."""
    if stop_after is not None and stop_after not in stage_and_pass_names(pipeline):
        raise InternalError("unknown pass or stage", expected=stage_and_pass_names(pipeline), found=stop_after)
    stats = stats if stats is not None else OptimizeStats()
    stats.before = graph.count_ops()
    start = time.perf_counter()
    with paused_gc():
        try:
            for stage in pipeline:
                _run_stage(graph, stage, backend, verify=verify, stats=stats, stop_after=stop_after)
                if stage.name == stop_after:
                    raise _Stop
        except _Stop:
            pass
    stats.after = graph.count_ops()
    stats.seconds = time.perf_counter() - start
    return graph


def _run_stage(graph: Graph, stage: Stage, backend: Backend | None, *, verify: bool, stats: OptimizeStats,
               stop_after: str | None) -> None:
    for round_ in range(1, MAX_ROUNDS + 1):
        stats.rounds[stage.name] = round_
        any_change = False
        for p in stage.passes:
            rec = stats.record(stage.name, p.name)
            nodes, consts = len(graph.nodes), len(graph.constants)
            t = time.perf_counter()
            changed = call_pass(graph, p, backend)
            rec.seconds += time.perf_counter() - t
            if verify:
                verify_after(graph, p)
            rec.runs += 1
            rec.changed += changed
            rec.nodes += len(graph.nodes) - nodes
            rec.constants += len(graph.constants) - consts
            any_change |= changed
            if p.name == stop_after:
                raise _Stop
        if not stage.fixed_point or not any_change:
            return
    stats.unsettled.append(stage.name)
