"""The whole zoo, glowpy against onnxruntime (and OpenVINO where it is installed), as one table.

    python tools/bench_zoo.py                           # every zoo model glowpy compiles, 1 and 2 threads
    python tools/bench_zoo.py --threads 1 --models resnet18.dynamo mobilenet_v2.torchscript
    python tools/bench_zoo.py --json zoo.json --rounds 5

Each zoo skeleton (tests/zoo/skeletons) is realized with the zoo's seeded weights (tests/zoo/realize.py)
and written to a model file once (--work-dir, reused while the skeleton is unchanged). Per model and
thread count every engine runs in its own fresh process, the engines alternate for --rounds rounds, and
the figures are medians (glowpy.bench.compare: the same measurement as `glowpy bench`). The feed is the
zoo test's own seeded input. The ratio is glowpy p50 / peer p50 (below 1: glowpy is faster); the last
row per thread count is the geometric mean of the ratios. Models glowpy refuses are listed with the op.
The machine may be shared: look at the spread between runs before trusting a few percent.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import onnx  # noqa: E402

from glowpy.bench import PEERS, WorkerError, compare, fmt_time, have_engine  # noqa: E402
from tests.zoo.harness import SEED, load_expected, realized, skeleton_names  # noqa: E402
from tests.zoo.realize import SKELETON_DIR, make_inputs  # noqa: E402

DEFAULT_WORK_DIR = Path("/tmp/glowpy-zoo-bench")


def model_file(name: str, work_dir: Path) -> Path:
    """The realized model of zoo entry `name`, written once per skeleton content."""
    skeleton = SKELETON_DIR / f"{name}.onnx"
    digest = hashlib.sha256(skeleton.read_bytes()).hexdigest()[:16]
    path = work_dir / f"{name}.{digest}.onnx"
    if not path.exists():
        work_dir.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        onnx.save(realized(name), str(tmp))
        tmp.replace(path)
    return path


def iterations_for(path: Path) -> int:
    """Enough runs per round for a stable median without spending minutes on the big models."""
    size = path.stat().st_size
    return 10 if size > 200e6 else 20 if size > 40e6 else 40


def measure(name: str, threads: int, engines: tuple[str, ...], rounds: int, work_dir: Path) -> dict:
    path = model_file(name, work_dir)
    feeds = make_inputs(onnx.load(str(path), load_external_data=False), SEED + 1)[0]
    try:
        return compare(path, engines=engines, backend="cpu", threads=threads, iterations=iterations_for(path),
                       rounds=rounds, inputs=feeds)
    except WorkerError as e:
        return {"error": e.line if e.model_error else str(e)}


def table(rows: list[dict], peers: tuple[str, ...]) -> str:
    head = ["model", "threads", "glowpy p50"]
    for p in peers:
        head += [f"{p} p50", f"ratio vs {p}"]
    head.append("max abs error")
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for threads in sorted({r["threads"] for r in rows}):
        group = [r for r in rows if r["threads"] == threads]
        for r in group:
            res = r["result"]
            if "error" in res:
                lines.append(f"| {r['model']} | {threads} | {res['error']} |" + " |" * (len(head) - 3))
                continue
            cells = [r["model"], str(threads), fmt_time(res["glowpy"]["latency_seconds"]["p50"])]
            for p in peers:
                cells += [fmt_time(res[p]["latency_seconds"]["p50"]), f"{res['ratios'][p]:.2f}x"]
            cells.append(f"{max(res['max_abs_errors'].values()):.1e}")
            lines.append("| " + " | ".join(cells) + " |")
        mean = ["**geometric mean**", str(threads), ""]
        for p in peers:
            ratios = [r["result"]["ratios"][p] for r in group if "error" not in r["result"]]
            mean += ["", f"**{math.exp(sum(map(math.log, ratios)) / len(ratios)):.2f}x**" if ratios else "-"]
        mean.append("")
        lines.append("| " + " | ".join(mean) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", metavar="MODEL.EXPORTER",
                    help="zoo entries (default: every one tests/zoo/expected.json records as pass)")
    ap.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds per engine (default: 3)")
    ap.add_argument("--no-openvino", action="store_true", help="leave OpenVINO out even where it is installed")
    ap.add_argument("--work-dir", type=Path, default=DEFAULT_WORK_DIR, help="where realized models are kept")
    ap.add_argument("--json", type=Path, help="also write the raw figures here")
    args = ap.parse_args(argv)

    known = skeleton_names()
    expected = load_expected()
    names = args.models or [n for n in known if expected.get(n) == "pass"]
    unknown = [n for n in names if n not in known]
    if unknown:
        ap.error(f"not in the zoo: {', '.join(unknown)} (known: {', '.join(known)})")
    peers = tuple(p for p in PEERS if have_engine(p) and not (p == "openvino" and args.no_openvino))
    if "onnxruntime" not in peers:
        ap.error("onnxruntime is not installed: pip install onnxruntime")
    rows = []
    for threads in args.threads:
        for name in names:
            result = measure(name, threads, ("glowpy", *peers), args.rounds, args.work_dir)
            rows.append({"model": name, "threads": threads, "result": result})
            status = result.get("error") or " ".join(f"{p} {result['ratios'][p]:.2f}x" for p in peers)
            print(f"# {name} threads={threads}: {status}", file=sys.stderr, flush=True)
    refused = [n for n in known if n not in names and expected.get(n) != "pass"]
    print(table(rows, peers))
    if refused and not args.models:
        print("\nnot compiled by glowpy (tests/zoo/expected.json): "
              + ", ".join(f"{n} ({expected[n]['op']})" for n in refused))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
