"""Where glowpy gains or loses against onnxruntime, layer by layer: glowpy's per-step kernel times next to
onnxruntime's per-node profile, matched through the model's nodes, at the same thread count.

    python -m tools.bench_layers resnet50.torchscript --threads 1 --runs 30
    python -m tools.bench_layers /path/model.onnx --threads 2 --top 15 --clock cpu

glowpy's figure for a step is the median over runs of its slowest thread's time (`profile="wall"`, or each
thread's CPU time with --clock cpu: other processes barely move it); onnxruntime's is the median of its
node's kernel time (`enable_profiling`). onnxruntime's nodes are matched to glowpy's steps by name: a
node onnxruntime renamed after the value it writes (its NCHWc convs: `<output>_nchwc`) is traced back
through the model to the node that produces that value, and from a node glowpy fused into a step (a Relu,
a residual Add) back along its first computed input, to a node a step runs. What matches no step
(onnxruntime's layout reorders) is reported as a total. Both engines' sums leave out the gaps between
kernels, so they do not add up to the run's latency.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import glowpy  # noqa: E402
from tests.zoo.harness import SEED  # noqa: E402
from tests.zoo.realize import make_inputs  # noqa: E402
from tools.bench_zoo import DEFAULT_WORK_DIR, model_file  # noqa: E402


def step_node_names(described: str) -> list[str]:
    """The model node names in a step's description ("a.12 (Conv), b (Relu)"): the optimizer's numeric
    suffix (a fused node's new name) dropped."""
    return [re.sub(r"\.\d+$", "", part.rsplit(" (", 1)[0].strip()) for part in described.split("), ")]


def glowpy_steps(path: str, feeds: dict, threads: int, runs: int, clock: str) -> list[tuple[str, str, float]]:
    """(description, op, median us of the slowest thread) per step, in program order."""
    model = glowpy.compile(path, threads=threads, profile=clock)
    for _ in range(3):
        model.run(feeds)
    times: dict[int, list[float]] = {}
    steps = {}
    for _ in range(runs):
        model.run(feeds)
        prof = model.executable.profile()
        steps = {s.index: s for s in prof.steps}
        slowest: dict[int, float] = {}
        for k, _tid, start, end in prof.spans:
            slowest[k] = max(slowest.get(k, 0.0), (end - start) / 1e3)
        for k, v in slowest.items():
            times.setdefault(k, []).append(v)
    return [(steps[k].nodes, steps[k].op, float(np.median(v))) for k, v in sorted(times.items())]


def ort_nodes(path: str, feeds: dict, threads: int, runs: int) -> dict[str, float]:
    """Median kernel time in us per onnxruntime node (profile event name without `_kernel_time`)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.enable_profiling = True
    with tempfile.TemporaryDirectory() as tmp:
        opts.profile_file_prefix = os.path.join(tmp, "ort")
        sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
        for _ in range(runs + 3):
            sess.run(None, feeds)
        with open(sess.end_profiling()) as f:
            events = json.load(f)
    durs: dict[str, list[float]] = {}
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            durs.setdefault(e["name"][: -len("_kernel_time")], []).append(e["dur"])
    return {k: float(np.median(v[-runs:])) for k, v in durs.items()}


def match(graph: onnx.GraphProto, step_names: list[list[str]], ort_names: list[str]) -> dict[str, int]:
    """onnxruntime node -> index of the glowpy step it belongs to (see the module docstring)."""
    producer = {out: node for node in graph.node for out in node.output}
    by_name = {node.name: node for node in graph.node}
    owner = {name: i for i, names in enumerate(step_names) for name in names}
    found = {}
    for name in ort_names:
        node = by_name.get(name)
        if node is None and name.endswith("_nchwc"):
            node = producer.get(name[: -len("_nchwc")])
        seen = 0
        while node is not None and node.name not in owner and seen < 16:
            node = next((producer[i] for i in node.input if i in producer), None)
            seen += 1
        if node is not None and node.name in owner:
            found[name] = owner[node.name]
    return found


def report(name: str, threads: int, runs: int, top: int, work_dir: Path, clock: str) -> None:
    path = str(Path(name) if name.endswith(".onnx") else model_file(name, work_dir))
    model = onnx.load(path, load_external_data=False)
    feeds = make_inputs(model, SEED + 1)[0]
    steps = glowpy_steps(path, feeds, threads, runs, clock)
    peer = ort_nodes(path, feeds, threads, runs)
    owner = match(model.graph, [step_node_names(d) for d, _, _ in steps], list(peer))
    theirs = [0.0] * len(steps)
    for node, k in owner.items():
        theirs[k] += peer[node]
    unmatched = sum(t for node, t in peer.items() if node not in owner)
    ours = sum(t for _, _, t in steps)
    print(f"## {name}, {threads} thread(s), medians of {runs} runs ({clock} clock for glowpy): glowpy steps "
          f"{ours:.0f} us, onnxruntime nodes {sum(theirs):.0f} us matched + {unmatched:.0f} us unmatched")
    rows = [(t - theirs[k], k) for k, (_, _, t) in enumerate(steps)]
    shown = sorted(rows, reverse=True)[:top] if top else rows
    print("| step | op | glowpy us | onnxruntime us | difference | nodes |")
    print("| ---: | --- | ---: | ---: | ---: | --- |")
    for diff, k in shown:
        desc, op, t = steps[k]
        peer_t = f"{theirs[k]:.1f}" if theirs[k] else "-"
        print(f"| {k} | {op} | {t:.1f} | {peer_t} | {diff:+.1f} | {desc[:60]} |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+", help="zoo entries (e.g. resnet50.torchscript) or ONNX files")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--top", type=int, default=0, help="only the N steps glowpy loses most on (default: all)")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    ap.add_argument("--work-dir", type=Path, default=DEFAULT_WORK_DIR, help="where realized zoo models are kept")
    args = ap.parse_args(argv)
    for name in args.models:
        report(name, args.threads, args.runs, args.top, args.work_dir, args.clock)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
