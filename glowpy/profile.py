"""Kernel profiles of compiled models: what `glowpy run --profile trace.json` writes and prints.

A model compiled with the cpu option `profile=True` times each kernel call on each thread inside the
native run (backends/cpu/codegen.py; without the option no timing code exists). After each run,
`executable.profile()` gives that run's `RunProfile`; this module turns a list of them into

- a Chrome trace-event JSON object (chrome://tracing, https://ui.perfetto.dev): one complete ("X")
  event per kernel call per run on the track of the thread that made it (a parallel kernel has one
  event per thread), each run as an enclosing "run" event on thread 0's track;
- a per-kernel table: calls, total and mean time, share of the run time, and achieved GFLOP/s of the
  convolution and matrix-product kernels (the lowering counts their FLOPs).

A kernel shared by several steps (backends/cpu/sharing.py) is one row of the table; its calls add up.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from glowpy.backends.cpu import RunProfile
    from glowpy.compiled import CompiledModel

FLOP_OPS = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul", "FullyConnected"})
TRACE_PID = 1


def record(compiled: CompiledModel, feeds: Mapping[str, np.ndarray], runs: int) -> list[RunProfile]:
    """Run `compiled` (built with profile=True) `runs` times on `feeds`; the profile of each run."""
    out = []
    for _ in range(runs):
        compiled.run(feeds)
        out.append(compiled.executable.profile())
    return out


def step_seconds(run: RunProfile) -> dict[int, float]:
    """Wall time of each step in one run: first start to last end over the threads that ran it."""
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for k, _tid, start, end in run.spans:
        first[k] = min(first.get(k, start), start)
        last[k] = max(last.get(k, end), end)
    return {k: (last[k] - first[k]) * 1e-9 for k in first}


def chrome_trace(runs: Sequence[RunProfile], *, name: str = "glowpy") -> dict[str, Any]:
    """The runs as Chrome trace events (times in microseconds from the first run's start)."""
    if not runs:
        return {"traceEvents": [], "displayTimeUnit": "ms"}
    base = runs[0].begin
    threads = max(r.threads for r in runs)
    events: list[dict[str, Any]] = [
        {"ph": "M", "pid": TRACE_PID, "tid": 0, "name": "process_name", "args": {"name": name}}]
    events += [{"ph": "M", "pid": TRACE_PID, "tid": t, "name": "thread_name", "args": {"name": f"thread {t}"}}
               for t in range(threads)]
    for r, run in enumerate(runs):
        info = {s.index: s for s in run.steps}
        events.append({"ph": "X", "cat": "run", "name": f"run {r}", "pid": TRACE_PID, "tid": 0,
                       "ts": (run.begin - base) / 1e3, "dur": (run.end - run.begin) / 1e3,
                       "args": {"run": r, "threads": run.threads, "wall_ms": run.wall * 1e3}})
        for k, tid, start, end in run.spans:
            s = info[k]
            args: dict[str, Any] = {"run": r, "step": k, "nodes": s.nodes, "parallel": s.parallel}
            if s.op in FLOP_OPS:
                args["flops"] = s.work
            events.append({"ph": "X", "cat": "kernel", "name": s.kernel, "pid": TRACE_PID, "tid": tid,
                           "ts": (start - base) / 1e3, "dur": (end - start) / 1e3, "args": args})
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_trace(runs: Sequence[RunProfile], path: str | Path, *, name: str = "glowpy") -> None:
    Path(path).write_text(json.dumps(chrome_trace(runs, name=name)))


def kernel_table(runs: Sequence[RunProfile]) -> list[dict[str, Any]]:
    """One row per kernel, slowest first: calls, total / mean seconds, share of the runs' wall time,
    GFLOP/s (None for kernels that are not a convolution or a matrix product), the nodes it ran."""
    rows: dict[str, dict[str, Any]] = {}
    wall = sum(r.wall for r in runs)
    for run in runs:
        info = {s.index: s for s in run.steps}
        for k, seconds in step_seconds(run).items():
            s = info[k]
            row = rows.setdefault(s.kernel, {"kernel": s.kernel, "op": s.op, "calls": 0, "seconds": 0.0,
                                             "flops": 0.0, "nodes": []})
            row["calls"] += 1
            row["seconds"] += seconds
            row["flops"] += s.work if s.op in FLOP_OPS else 0.0
            if s.nodes not in row["nodes"]:
                row["nodes"].append(s.nodes)
    out = []
    for row in rows.values():
        row["mean_seconds"] = row["seconds"] / row["calls"]
        row["share"] = row["seconds"] / wall if wall > 0 else 0.0
        row["gflops"] = row["flops"] / row["seconds"] / 1e9 if row["op"] in FLOP_OPS and row["seconds"] > 0 else None
        out.append(row)
    return sorted(out, key=lambda r: -r["seconds"])


def format_table(runs: Sequence[RunProfile], top: int = 10) -> str:
    """The `top` slowest kernels, then what all kernels cover of the run time."""
    rows = kernel_table(runs)
    wall = sum(r.wall for r in runs)
    width = max([len("kernel")] + [len(r["kernel"]) for r in rows[:top]])
    lines = [f"{'kernel':<{width}}  {'calls':>5}  {'total ms':>9}  {'mean ms':>8}  {'share':>6}  {'GFLOP/s':>7}"]
    for r in rows[:top]:
        gf = f"{r['gflops']:.1f}" if r["gflops"] is not None else "-"
        lines.append(f"{r['kernel']:<{width}}  {r['calls']:>5}  {r['seconds'] * 1e3:>9.3f}  "
                     f"{r['mean_seconds'] * 1e3:>8.3f}  {r['share'] * 100:>5.1f}%  {gf:>7}")
    covered = sum(r["seconds"] for r in rows)
    flops = sum(r["flops"] for r in rows)
    flop_seconds = sum(r["seconds"] for r in rows if r["gflops"] is not None)
    more = f" ({len(rows) - top} more not shown)" if len(rows) > top else ""
    lines.append(f"{len(rows)} kernels{more} cover {covered * 1e3:.3f} ms of {wall * 1e3:.3f} ms over {len(runs)} "
                 f"run{'s' if len(runs) != 1 else ''} ({covered / wall * 100 if wall else 0:.1f}%); "
                 f"conv and matmul kernels {flops / max(flop_seconds, 1e-12) / 1e9:.1f} GFLOP/s")
    return "\n".join(lines)
