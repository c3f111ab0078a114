"""Where a second thread's time goes, per step: best-of-runs kernel time at 1 thread against each thread's
time at N threads, the run's median and best, and the waits between steps.

    python -m tools.bench_threads squeezenet1_1.torchscript mobilenet_v2.torchscript --threads 2
    python -m tools.bench_threads /path/model.onnx --runs 50 --all
    python -m tools.bench_threads mobilenet_v2.torchscript --cpu-clock   # on a loaded machine

A step's speedup is its 1-thread time over the slowest thread's at N; the run minus the sum of those
slowest times is what waits, wake-ups and gaps cost. Minima over runs, so a shared machine's noise
inflates them less than medians (the run figures are both). --all lists every step, else the 15 that
lose most to splitting. --cpu-clock times each thread's kernel calls in its own CPU time (profile="cpu"):
other processes' load then barely moves the per-step figures, which show a split's imbalance and the
work its chunks repeat, but not the waits (the run figures stay wall time).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import glowpy  # noqa: E402
from glowpy import pipeline  # noqa: E402
from glowpy.backends.cpu import codegen, host_target  # noqa: E402
from tests.zoo.harness import SEED  # noqa: E402
from tests.zoo.realize import make_inputs  # noqa: E402
from tools.bench_zoo import DEFAULT_WORK_DIR, model_file  # noqa: E402


def waits(path: str, nthreads: int) -> tuple[int, int]:
    """(steps that wait for an earlier one, waits) in the model's program at `nthreads`."""
    prog = codegen.build(pipeline.optimized_graph(path, "cpu"), host_target(), nthreads=nthreads)
    return len(prog.waits), sum(len(on) for on in prog.waits.values())


def best_steps(path: str, feeds: dict, nthreads: int, runs: int, clock: str = "wall"
               ) -> tuple[dict, dict[int, dict[int, float]], list]:
    """(step infos by index, best time per step per thread in us, run times in us)."""
    model = glowpy.compile(path, threads=nthreads, profile=clock)
    for _ in range(5):
        model.run(feeds)
    best: dict[int, dict[int, float]] = {}
    totals = []
    for _ in range(runs):
        model.run(feeds)
        prof = model.executable.profile()
        totals.append(prof.wall * 1e6)
        for k, tid, start, end in prof.spans:
            row = best.setdefault(k, {})
            row[tid] = min(row.get(tid, np.inf), (end - start) / 1e3)
    return {s.index: s for s in prof.steps}, best, totals


def report(name: str, nthreads: int, runs: int, show_all: bool, work_dir: Path, clock: str = "wall") -> None:
    path = str(Path(name) if name.endswith(".onnx") else model_file(name, work_dir))
    feeds = make_inputs(onnx.load(path, load_external_data=False), SEED + 1)[0]
    steps1, one, t1 = best_steps(path, feeds, 1, runs, clock)
    steps, many, tn = best_steps(path, feeds, nthreads, runs, clock)
    # Steps are matched by the nodes they run: a node may take more steps on several threads than on one
    # (a squeeze-excite's means); its figures are then the sums over its steps.
    alone: dict[str, float] = {}
    for k, row in one.items():
        alone[steps1[k].nodes] = alone.get(steps1[k].nodes, 0.0) + row[0]
    first: dict[str, int] = {}
    per_thread: dict[str, dict[int, float]] = {}
    for k in sorted(many):
        key = steps[k].nodes
        first.setdefault(key, k)
        acc = per_thread.setdefault(key, {})
        for t, v in many[k].items():
            acc[t] = acc.get(t, 0.0) + v
    rows = []
    for key, k in first.items():
        slowest = max(per_thread[key].values())
        rows.append((slowest - alone.get(key, 0.0) / nthreads, k, slowest, key))
    bound = sum(r[2] for r in rows)
    waiting, nwaits = waits(path, nthreads)
    print(f"## {name}: 1 thread median {np.median(t1):.0f} us (best {min(t1):.0f}); {nthreads} threads median "
          f"{np.median(tn):.0f} us (best {min(tn):.0f}); sum of slowest threads {bound:.0f} us; "
          f"{waiting} of {len(many)} steps wait, {nwaits} waits" + ("; steps in thread CPU time" if clock == "cpu" else ""))
    for loss, k, slowest, key in rows if show_all else sorted(rows, reverse=True)[:15]:
        s = steps[k]
        per = " ".join(f"t{t}={v:7.1f}" for t, v in sorted(per_thread[key].items()))
        t_one = alone.get(key, 0.0)
        print(f"{k:4d} {'split ' if s.parallel else 'serial'} {s.op[:16]:16s} 1t={t_one:7.1f} {per} "
              f"speedup {t_one / slowest:4.2f} loss {loss:6.1f} us  {s.nodes[:50]}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="+", help="zoo names (tests/zoo/skeletons) or .onnx paths")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--runs", type=int, default=40)
    p.add_argument("--all", action="store_true", help="every step, in order")
    p.add_argument("--work-dir", type=Path, default=DEFAULT_WORK_DIR)
    p.add_argument("--cpu-clock", action="store_true", help="time steps in each thread's CPU time")
    args = p.parse_args(argv)
    for name in args.models:
        report(name, args.threads, args.runs, args.all, args.work_dir, "cpu" if args.cpu_clock else "wall")
    return 0


if __name__ == "__main__":
    sys.exit(main())
