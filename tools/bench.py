"""glowpy (cpu backend) against onnxruntime, side by side: same model, same input, same thread count.

    python tools/bench.py                      # resnet50, squeezenet, mlp at 1 and 2 threads
    python tools/bench.py --models mlp --threads 1 --rounds 5

Per model and thread count it measures
- compile: glowpy cold (empty object-code cache: optimize + code generation + LLVM) and cached (a
  second process on the same cache; in parentheses with the ONNX import, as onnxruntime's figure
  includes its own parsing) against onnxruntime's session creation from the file; each in its own
  subprocess, which also gives an honest peak RSS (ru_maxrss of a process that loads the model,
  compiles and runs it; "release_weights": the same with compile(..., release_weights=True), where the
  graph's copies of packed weights are dropped);
- latency: each engine alone in a fresh process (onnxruntime's pool threads spin after a run and would
  take the cores from the other engine), the two alternating for a few rounds; the median of the
  rounds' medians, and the ratio glowpy / onnxruntime (below 1: glowpy is faster);
- agreement: the largest absolute difference between the two engines' outputs.
Prints a markdown table. The machine may be shared: run it more than once and look at the spread.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

MODELS = ("resnet50", "squeezenet", "mlp")


def model_path(name: str) -> Path:
    from tools.prepare_models import DEFAULT_OUT, mlp_model, prepare

    if name == "mlp":
        import onnx

        path = DEFAULT_OUT / "mlp_64x4.onnx"
        if not path.exists():
            DEFAULT_OUT.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            onnx.save(mlp_model(), str(tmp))
            tmp.replace(path)
        return path
    return prepare(name)


def make_input(path: Path) -> tuple[str, np.ndarray]:
    import onnx

    m = onnx.load(str(path), load_external_data=False)
    inits = {t.name for t in m.graph.initializer}
    (inp,) = [i for i in m.graph.input if i.name not in inits]
    shape = tuple(d.dim_value or 1 for d in inp.type.tensor_type.shape.dim)
    return inp.name, np.random.default_rng(7).standard_normal(shape).astype(np.float32)


def _optimize() -> bool:
    """--no-opt reaches the worker processes through the environment."""
    return os.environ.get("GLOWPY_BENCH_OPTIMIZE", "1") != "0"


def peak_rss_mib() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


# --- subprocess workers ----------------------------------------------------------------------------


def worker_compile(engine: str, path: Path, threads: int) -> dict:
    """Load + compile (or create the session) + run a few times, in a fresh process."""
    name, x = make_input(path)
    if engine.startswith("glowpy"):
        import glowpy

        # "glowpy-release": the optimizer's private copy of the graph gives up the weights the kernels packed
        extra = {"release_weights": True} if engine == "glowpy-release" else {}
        t = time.perf_counter()
        model = glowpy.compile(str(path), backend="cpu", threads=threads, optimize=_optimize(), **extra)
        total = time.perf_counter() - t
        model.run({name: x})
        for _ in range(3):
            model.run({name: x})
        # compile_seconds: optimizer + backend (what `glowpy run` prints); seconds: also the ONNX import
        result = {"seconds": total, "compile_seconds": model.compile_seconds, "cached": model.cached,
                  "arena": model.arena_size}
    else:
        import onnxruntime as ort

        t = time.perf_counter()
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        session = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        total = time.perf_counter() - t
        session.run(None, {name: x})
        for _ in range(3):
            session.run(None, {name: x})
        result = {"seconds": total}
    result["rss_mib"] = peak_rss_mib()
    return result


def worker_latency(engine: str, path: Path, threads: int, runs: int) -> dict:
    """Median latency of one engine alone in its process (onnxruntime's pool threads keep spinning
    after a run, so in a shared process they take the cores the other engine's threads need)."""
    name, x = make_input(path)
    feeds = {name: x}
    if engine == "glowpy":
        import glowpy

        model = glowpy.compile(str(path), backend="cpu", threads=threads, optimize=_optimize())
        f = lambda: model.run(feeds)  # noqa: E731
    else:
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        session = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        f = lambda: session.run(None, feeds)  # noqa: E731
    for _ in range(max(3, runs // 10)):
        f()
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    return {"median": float(np.median(times))}


def worker_agree(path: Path) -> dict:
    """Largest absolute difference between the two engines' outputs on the same input."""
    import onnxruntime as ort

    import glowpy

    name, x = make_input(path)
    mine = list(glowpy.compile(str(path), backend="cpu", threads=1).run({name: x}).values())
    theirs = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {name: x})
    return {"max_abs_diff": max(float(np.max(np.abs(a - b))) for a, b in zip(mine, theirs))}


def run_worker(args: list[str], env: dict[str, str] | None = None) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--worker", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, cwd=ROOT)
    if proc.returncode != 0:
        raise RuntimeError(f"worker {args} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# --- the table -----------------------------------------------------------------------------------


def fmt_time(s: float) -> str:
    if s < 1e-3:
        return f"{s * 1e6:.1f} µs"
    if s < 1:
        return f"{s * 1e3:.2f} ms"
    return f"{s:.2f} s"


def bench(models: list[str], thread_counts: list[int], runs: dict[str, int], rounds: int) -> list[dict]:
    rows = []
    for name in models:
        path = model_path(name)
        for threads in thread_counts:
            with tempfile.TemporaryDirectory(prefix="glowpy-bench-cache-") as cache:
                env = {"GLOWPY_CACHE_DIR": cache}
                cold = run_worker(["compile", "glowpy", str(path), str(threads)], env)
                cached = run_worker(["compile", "glowpy", str(path), str(threads)], env)
                released = run_worker(["compile", "glowpy-release", str(path), str(threads)], env)
                ort = run_worker(["compile", "onnxruntime", str(path), str(threads)], env)
                # rounds alternate the engines, each alone in a fresh process; median of the rounds' medians
                per: dict[str, list[float]] = {"glowpy": [], "onnxruntime": []}
                for _ in range(rounds):
                    for engine in per:
                        per[engine].append(run_worker(["latency", engine, str(path), str(threads),
                                                       str(runs[name])], env)["median"])
                lat = {k: float(np.median(v)) for k, v in per.items()}
                lat.update(run_worker(["agree", str(path)], env))
            rows.append({"model": name, "threads": threads, "cold": cold, "cached": cached, "released": released,
                         "ort": ort, "lat": lat})
            print(f"  {name} x{threads}: glowpy {fmt_time(lat['glowpy'])}, onnxruntime {fmt_time(lat['onnxruntime'])}",
                  file=sys.stderr, flush=True)
    return rows


def table(rows: list[dict]) -> str:
    head = ("| model | threads | glowpy latency | onnxruntime latency | ratio | glowpy compile cold | "
            "glowpy compile cached (+ import) | onnxruntime session | glowpy peak RSS (cold / cached / "
            "cached+release_weights) | onnxruntime peak RSS | arena | max abs diff |")
    lines = [head, "|" + " --- |" * (head.count("|") - 1)]
    for r in rows:
        lat, cold, cached, ort = r["lat"], r["cold"], r["cached"], r["ort"]
        lines.append(
            f"| {r['model']} | {r['threads']} | {fmt_time(lat['glowpy'])} | {fmt_time(lat['onnxruntime'])} | "
            f"{lat['glowpy'] / lat['onnxruntime']:.2f}x | {fmt_time(cold['compile_seconds'])} | "
            f"{fmt_time(cached['compile_seconds'])} ({fmt_time(cached['seconds'])})"
            f"{'' if cached['cached'] else ' (miss!)'} | {fmt_time(ort['seconds'])} | "
            f"{cold['rss_mib']:.0f} / {cached['rss_mib']:.0f} / {r['released']['rss_mib']:.0f} MiB | "
            f"{ort['rss_mib']:.0f} MiB | "
            f"{cached['arena'] / 2**20:.2f} MiB | {lat['max_abs_diff']:.1e} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--worker":
        kind = argv[1]
        if kind == "compile":
            out = worker_compile(argv[2], Path(argv[3]), int(argv[4]))
        elif kind == "latency":
            out = worker_latency(argv[2], Path(argv[3]), int(argv[4]), int(argv[5]))
        else:
            out = worker_agree(Path(argv[2]))
        print(json.dumps(out))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    ap.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds per engine (default: 3)")
    ap.add_argument("--runs", type=int, default=None,
                    help="timed runs per round (default: 30 for CNNs, 5000 for the MLP)")
    ap.add_argument("--json", type=Path, help="also write the raw figures here")
    ap.add_argument("--no-opt", action="store_true",
                    help="compile glowpy without the graph optimizer (to measure what the passes bring)")
    args = ap.parse_args(argv)
    if args.no_opt:
        os.environ["GLOWPY_BENCH_OPTIMIZE"] = "0"
    runs = {m: args.runs or (5000 if m == "mlp" else 30) for m in args.models}
    import platform

    import llvmlite.binding as llvm
    import onnxruntime

    import glowpy

    print(f"glowpy {glowpy.__version__} (cpu backend, {llvm.get_host_cpu_name()}"
          f"{', optimizer off' if args.no_opt else ''}), onnxruntime "
          f"{onnxruntime.__version__}, {os.cpu_count()} CPUs, Python {platform.python_version()}", file=sys.stderr)
    rows = bench(args.models, args.threads, runs, args.rounds)
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
