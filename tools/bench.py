"""glowpy (cpu backend) against onnxruntime, side by side: same model, same input, same thread count.

    python tools/bench.py                      # every model below at 1 and 2 threads
    python tools/bench.py --models lstm gru --threads 1
    python tools/bench.py --models mlp --threads 1 --rounds 5

Per model and thread count it measures
- compile: glowpy cold (empty object-code cache: optimize + code generation + LLVM) and cached (a
  second process on the same cache; in parentheses with the ONNX import, as onnxruntime's figure
  includes its own parsing) against onnxruntime's session creation from the file; each in its own
  subprocess, which also gives an honest peak RSS (the high-water mark of a process that loads the model,
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
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from glowpy.bench import ENGINES, alternate, fmt_time, max_abs_diff, run_worker  # noqa: E402

MODELS = ("resnet50", "squeezenet", "mlp", "lstm", "gru")
# timed runs per round by default (the CNNs: 30)
RUNS = {"mlp": 5000, "lstm": 300, "gru": 300}
# the recurrent cases: input 64, hidden 128, sequence 100, batch 1 (issue 11)
RECURRENT = {"lstm": ("LSTM", 4), "gru": ("GRU", 3)}


def recurrent_model(op: str, gates: int, size: int = 64, hidden: int = 128, steps: int = 100, batch: int = 1,
                    seed: int = 0):
    """One forward LSTM / GRU with random constant weights and bias; outputs Y and Y_h."""
    import onnx
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(seed)
    scale = 1 / np.sqrt(hidden)
    inits = [numpy_helper.from_array(rng.uniform(-scale, scale, shape).astype(np.float32), name) for name, shape in
             (("W", (1, gates * hidden, size)), ("R", (1, gates * hidden, hidden)), ("B", (1, 2 * gates * hidden)))]
    node = helper.make_node(op, ["x", "W", "R", "B"], ["y", "y_h"], hidden_size=hidden, name=op.lower())
    f = onnx.TensorProto.FLOAT
    graph = helper.make_graph([node], op.lower(), [helper.make_tensor_value_info("x", f, [steps, batch, size])],
                              [helper.make_tensor_value_info("y", f, [steps, 1, batch, hidden]),
                               helper.make_tensor_value_info("y_h", f, [1, batch, hidden])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])


def model_path(name: str) -> Path:
    from tools.prepare_models import DEFAULT_OUT, mlp_model, prepare

    if name in ("mlp", *RECURRENT):
        import onnx

        path = DEFAULT_OUT / ("mlp_64x4.onnx" if name == "mlp" else f"{name}_64x128x100.onnx")
        if not path.exists():
            DEFAULT_OUT.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            onnx.save(mlp_model() if name == "mlp" else recurrent_model(*RECURRENT[name]), str(tmp))
            tmp.replace(path)
        return path
    return prepare(name)


def make_input(path: Path) -> tuple[str, np.ndarray]:
    from glowpy.importer import read_model

    # lean: the weights stay in the file (the input's name and shape are all this needs)
    m, _ = read_model(str(path), lean=True)
    inits = {t.name for t in m.graph.initializer}
    (inp,) = [i for i in m.graph.input if i.name not in inits]
    shape = tuple(d.dim_value or 1 for d in inp.type.tensor_type.shape.dim)
    return inp.name, np.random.default_rng(7).standard_normal(shape).astype(np.float32)


def measure(path: Path, threads: int, runs: int, rounds: int, optimize: bool) -> dict:
    """One model at one thread count, on an empty code cache of its own."""
    in_name, x = make_input(path)
    with tempfile.TemporaryDirectory(prefix="glowpy-bench-cache-") as cache:
        env = {"GLOWPY_CACHE_DIR": cache}
        feeds = Path(cache) / "inputs.npz"
        np.savez(feeds, **{in_name: x})
        outputs = {e: Path(cache) / f"{e}.npz" for e in ENGINES}

        def worker(engine: str, iterations: int, **extra) -> dict:
            return run_worker({"engine": engine, "model": str(path), "threads": threads, "iterations": iterations,
                               "inputs": str(feeds), "backend": "cpu", "optimize": optimize, **extra}, env)

        # compile figures: load (+ compile or session creation) and a few runs, each in a fresh process
        row = {"cold": worker("glowpy", 3, warmup=0), "cached": worker("glowpy", 3, warmup=0),
               "released": worker("glowpy", 3, warmup=0, options={"release_weights": True}),
               "ort": worker("onnxruntime", 3, warmup=0)}
        # rounds alternate the engines, each alone in a fresh process; median of the rounds' medians
        per = alternate(ENGINES, rounds, lambda e, r: worker(e, runs, outputs=str(outputs[e]) if r == 0 else None))
        lat = {e: float(np.median([np.median(res["times"]) for res in per[e]])) for e in ENGINES}
        lat["max_abs_diff"] = max_abs_diff(*(dict(np.load(outputs[e])) for e in ENGINES))
    return {**row, "lat": lat}


def bench(models: list[str], thread_counts: list[int], runs: dict[str, int], rounds: int,
          optimize: bool = True) -> list[dict]:
    rows = []
    for name in models:
        path = model_path(name)
        for threads in thread_counts:
            row = {"model": name, "threads": threads, **measure(path, threads, runs[name], rounds, optimize)}
            rows.append(row)
            lat = row["lat"]
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
            f"{fmt_time(cached['compile_seconds'])} ({fmt_time(cached['load_seconds'])})"
            f"{'' if cached['cached'] else ' (miss!)'} | {fmt_time(ort['load_seconds'])} | "
            f"{cold['peak_rss_mib']:.0f} / {cached['peak_rss_mib']:.0f} / {r['released']['peak_rss_mib']:.0f} MiB | "
            f"{ort['peak_rss_mib']:.0f} MiB | "
            f"{cached['arena_bytes'] / 2**20:.2f} MiB | {lat['max_abs_diff']:.1e} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    ap.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds per engine (default: 3)")
    ap.add_argument("--runs", type=int, default=None,
                    help="timed runs per round (default: 30 for CNNs, 5000 for the MLP, 300 for LSTM / GRU)")
    ap.add_argument("--json", type=Path, help="also write the raw figures here")
    ap.add_argument("--no-opt", action="store_true",
                    help="compile glowpy without the graph optimizer (to measure what the passes bring)")
    args = ap.parse_args(argv)
    runs = {m: args.runs or RUNS.get(m, 30) for m in args.models}
    import platform

    import llvmlite.binding as llvm
    import onnxruntime

    import glowpy

    print(f"glowpy {glowpy.__version__} (cpu backend, {llvm.get_host_cpu_name()}"
          f"{', optimizer off' if args.no_opt else ''}), onnxruntime "
          f"{onnxruntime.__version__}, {os.cpu_count()} CPUs, Python {platform.python_version()}", file=sys.stderr)
    rows = bench(args.models, args.threads, runs, args.rounds, optimize=not args.no_opt)
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
