"""Measuring glowpy, alone or against onnxruntime: the logic behind `glowpy bench` and tools/bench.py.

Each engine runs in its own fresh process (a worker: `python -m glowpy.bench SPEC`), the engines
alternate for a few rounds, and figures are medians over the rounds. A fresh process per run keeps
the engines apart (onnxruntime's pool threads spin after a run and would take the cores from the
other engine's threads) and gives an honest peak RSS (the high-water mark, VmHWM, of a process that loaded, compiled
and ran one model).

    result = compare(path, engines=("glowpy", "onnxruntime"), threads=1, iterations=30, rounds=3)

A worker's SPEC is a JSON object (see `worker`); it prints its figures as one JSON line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

ENGINES = ("glowpy", "onnxruntime")
PEERS = ("onnxruntime", "openvino")  # engines glowpy is measured against; openvino only where installed
EXIT_MODEL_ERROR = 3  # a worker's exit status when glowpy refused the model (its message on stdout)
PERCENTILES = (50, 90, 99)


# --- measuring inside one process ------------------------------------------------------------------


def deterministic_input(dtype: np.dtype, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    """The input `glowpy run` and `glowpy bench` use when none is given: seeded, the same on every machine."""
    rng = np.random.default_rng(seed)
    if dtype.kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, shape).astype(dtype)
    return rng.integers(0, 10, shape).astype(dtype)


def time_runs(run: Callable[[], Any], iterations: int, warmup: int = 0) -> list[float]:
    """Wall time of each of `iterations` calls of `run`, after `warmup` untimed calls."""
    for _ in range(warmup):
        run()
    times = []
    for _ in range(iterations):
        t = time.perf_counter()
        run()
        times.append(time.perf_counter() - t)
    return times


def latency_stats(times: Sequence[float]) -> dict[str, float]:
    """p50 / p90 / p99 / min of run times, in seconds."""
    out = {f"p{q}": float(np.percentile(times, q)) for q in PERCENTILES}
    out["min"] = float(min(times))
    return out


def peak_rss_mib() -> float:
    """This process's peak resident set size: Linux's VmHWM, the high-water mark of this program's own
    memory (ru_maxrss carries the parent's through fork and exec: a worker started by a process holding
    300 MiB reported 300 MiB for a 5 MiB model); elsewhere ru_maxrss."""
    import resource

    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1024.0 if sys.platform != "darwin" else 1 << 20)


def ort_session(path: str | Path, threads: int):
    """An onnxruntime CPU session with `threads` intra-op threads (what glowpy's `threads` means)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def have_engine(name: str) -> bool:
    """Whether the peer engine's package (onnxruntime, openvino) can be imported here."""
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except ValueError:  # sys.modules[name] is None: import blocked
        return False


def openvino_model(path: str | Path, threads: int):
    """An OpenVINO CPU compiled model with `threads` inference threads (0: its default)."""
    import openvino as ov

    # f32: on hosts with AVX-512 BF16 or AMX OpenVINO otherwise computes in bf16 (errors ~1e-2)
    config: dict[str, Any] = {"INFERENCE_PRECISION_HINT": "f32"}
    if threads:
        config["INFERENCE_NUM_THREADS"] = threads
    return ov.Core().compile_model(str(path), "CPU", config)


# --- the worker (one engine, one fresh process) ----------------------------------------------------


def worker(spec: Mapping[str, Any]) -> dict[str, Any]:
    """Load one model in one engine, run it `iterations` times after a warm-up, report the figures.

    spec: engine ("glowpy" | "onnxruntime"), model (path), threads (int or None: the backend's
    default), iterations, warmup (default max(3, iterations // 10)), inputs (an .npz path: feeds
    read from it; if the file is missing, a glowpy worker makes deterministic inputs for the
    compiled input types and writes them there), outputs (optional .npz path: the first run's
    outputs are written there); glowpy only: backend, shapes ({name: dims}), optimize, options
    (more compile options, e.g. release_weights).
    """
    engine, path, threads = spec["engine"], spec["model"], spec.get("threads")
    iterations = int(spec["iterations"])
    inputs = Path(spec["inputs"])
    result: dict[str, Any] = {"engine": engine}
    start = time.perf_counter()
    if engine == "glowpy":
        import glowpy

        options = dict(spec.get("options", {}))
        if threads is not None:
            options["threads"] = threads
        shapes = {k: tuple(v) for k, v in (spec.get("shapes") or {}).items()}
        model = glowpy.compile(path, backend=spec.get("backend"), shapes=shapes or None,
                               optimize=spec.get("optimize", True), **options)
        if not inputs.exists():  # a model that compiles per input shape says here which dims to bind
            feeds = {n: deterministic_input(t.dtype, t.shape) for n, t in model.input_types.items()}
            np.savez(inputs, **feeds)
        feeds = dict(np.load(inputs))
        if model.imported is None:  # compiles on its first run, for these feeds
            model.run(feeds)
        result["load_seconds"] = time.perf_counter() - start
        # A cold compile stores the model cache entry on a background thread (seconds for hundreds of
        # MB of weights); the timed runs measure the steady state after it.
        from glowpy.backends.cpu.model_cache import flush

        flush()
        result.update(import_seconds=model.imported.seconds, compile_seconds=model.compile_seconds,
                      cached=model.cached, arena_bytes=model.arena_size)

        def run() -> dict[str, np.ndarray]:
            return model.run(feeds)
    elif engine == "onnxruntime":
        session = ort_session(path, threads or 0)
        result["load_seconds"] = time.perf_counter() - start
        result["compile_seconds"] = result["load_seconds"]  # session creation parses and optimizes
        feeds = dict(np.load(inputs))
        names = [o.name for o in session.get_outputs()]

        def run() -> dict[str, np.ndarray]:
            return dict(zip(names, session.run(None, feeds)))
    elif engine == "openvino":
        compiled = openvino_model(path, threads or 0)
        result["load_seconds"] = result["compile_seconds"] = time.perf_counter() - start
        feeds = dict(np.load(inputs))
        request = compiled.create_infer_request()
        names = [o.get_any_name() for o in compiled.outputs]

        def run() -> dict[str, np.ndarray]:
            outs = request.infer(feeds)
            return {n: np.array(outs[o]) for n, o in zip(names, compiled.outputs)}
    else:
        raise ValueError(f"unknown engine '{engine}'")
    first = run()
    if spec.get("outputs"):
        np.savez(spec["outputs"], **first)
    warmup = spec.get("warmup")
    result["times"] = time_runs(run, iterations, max(3, iterations // 10) if warmup is None else int(warmup))
    result["peak_rss_mib"] = peak_rss_mib()
    return result


def run_worker(spec: Mapping[str, Any], env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """`worker(spec)` in a fresh process of this Python; its stderr tail on failure."""
    # The worker imports the glowpy this process runs, wherever the caller's working directory is.
    root = str(Path(__file__).resolve().parents[1])
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    proc = subprocess.run([sys.executable, "-m", "glowpy.bench", json.dumps(spec)], capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": path, **(env or {})})
    last = (proc.stdout.strip().splitlines() or ["{}"])[-1]
    if proc.returncode == EXIT_MODEL_ERROR:
        raise WorkerError(spec.get("engine", "?"), json.loads(last)["error"], proc.stderr, model_error=True)
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines()
        raise WorkerError(spec.get("engine", "?"), lines[-1] if lines else f"exit status {proc.returncode}",
                          proc.stderr)
    return json.loads(last)


class WorkerError(RuntimeError):
    """A worker process failed. `model_error`: glowpy refused the model (a GlowpyError, the user's
    to fix), `line` its message; otherwise `line` is the last line of the worker's stderr."""

    def __init__(self, engine: str, line: str, stderr: str, *, model_error: bool = False) -> None:
        super().__init__(line if model_error else f"the {engine} worker failed: {line}")
        self.engine, self.line, self.stderr, self.model_error = engine, line, stderr, model_error


def alternate(engines: Sequence[str], rounds: int, measure: Callable[[str, int], dict[str, Any]]
              ) -> dict[str, list[dict[str, Any]]]:
    """measure(engine, round) for each round, the engines taking turns; {engine: [round results]}."""
    per: dict[str, list[dict[str, Any]]] = {e: [] for e in engines}
    for r in range(rounds):
        for e in engines:
            per[e].append(measure(e, r))
    return per


def max_abs_diff(a: Mapping[str, np.ndarray], b: Mapping[str, np.ndarray]) -> float:
    """Largest absolute difference between two engines' outputs (matched by name)."""
    missing = sorted(set(a) ^ set(b))
    if missing:
        raise ValueError(f"the engines' outputs differ in names: {missing}")
    return max(float(np.max(np.abs(a[k].astype(np.float64) - b[k].astype(np.float64)), initial=0.0)) for k in a)


# --- the comparison ----------------------------------------------------------------------------------


def summarize(rounds: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One engine's figures from its rounds: each percentile is the median over the rounds of that
    round's percentile (so p50 <= p90 <= p99 still holds), min the smallest run of all, throughput
    the median of the rounds' runs per second; compile figures are the first round's (the user's
    cache as it was; later rounds hit it); peak RSS the largest of the rounds."""
    per_round = [latency_stats(r["times"]) for r in rounds]
    latency = {k: float(np.median([s[k] for s in per_round])) for k in per_round[0]}
    latency["min"] = min(s["min"] for s in per_round)
    first = rounds[0]
    out: dict[str, Any] = {
        "compile_seconds": first["compile_seconds"],
        "latency_seconds": latency,
        "throughput_per_second": float(np.median([len(r["times"]) / sum(r["times"]) for r in rounds])),
        "peak_rss_mib": max(r["peak_rss_mib"] for r in rounds),
        "runs": sum(len(r["times"]) for r in rounds),
    }
    for key in ("import_seconds", "cached", "arena_bytes"):
        if key in first:
            out[key] = first[key]
    return out


def compare(model: str | Path, *, engines: Sequence[str] = ("glowpy",), backend: str | None = None,
            threads: int | None = None, iterations: int = 30, rounds: int = 3,
            shapes: Mapping[str, Sequence[int]] | None = None, inputs: Mapping[str, np.ndarray] | None = None,
            optimize: bool = True, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Benchmark `model` in each engine (glowpy first: it also makes the inputs), alternating rounds.

    Returns {"model", "threads", "iterations", "rounds", <engine>: summarize(...)} and, with more
    than one engine, "ratio" (first engine's p50 / second's; below 1: the first is faster) and
    "max_abs_error" between their first-round outputs, and "ratios" / "max_abs_errors": the same
    for the first engine against each other one."""
    if engines[0] != "glowpy" and inputs is None:
        raise ValueError("glowpy goes first (it makes the inputs), or pass inputs")
    with tempfile.TemporaryDirectory(prefix="glowpy-bench-") as tmp:
        feeds = Path(tmp) / "inputs.npz"
        if inputs is not None:
            np.savez(feeds, **inputs)

        def measure(engine: str, r: int) -> dict[str, Any]:
            spec = {"engine": engine, "model": str(model), "threads": threads, "iterations": iterations,
                    "inputs": str(feeds), "outputs": str(Path(tmp) / f"{engine}.npz") if r == 0 else None,
                    "backend": backend, "shapes": {k: list(v) for k, v in (shapes or {}).items()},
                    "optimize": optimize}
            return run_worker(spec, env)

        per = alternate(engines, rounds, measure)
        result: dict[str, Any] = {"model": str(model), "threads": threads, "iterations": iterations,
                                  "rounds": rounds}
        result.update({e: summarize(per[e]) for e in engines})
        if len(engines) >= 2:
            first = engines[0]
            outs = {e: dict(np.load(Path(tmp) / f"{e}.npz")) for e in engines}
            p50 = result[first]["latency_seconds"]["p50"]
            result["ratios"] = {e: p50 / result[e]["latency_seconds"]["p50"] for e in engines[1:]}
            result["max_abs_errors"] = {e: max_abs_diff(outs[first], outs[e]) for e in engines[1:]}
            result["ratio"] = result["ratios"][engines[1]]
            result["max_abs_error"] = result["max_abs_errors"][engines[1]]
    return result


# --- printing -------------------------------------------------------------------------------------------


def fmt_time(s: float) -> str:
    if s < 1e-3:
        return f"{s * 1e6:.1f} µs"
    if s < 1:
        return f"{s * 1e3:.2f} ms"
    return f"{s:.2f} s"


def table(result: Mapping[str, Any]) -> str:
    """The human form of `compare`'s result: one column per engine."""
    engines = [e for e in ("glowpy", *PEERS) if e in result]
    rows: list[tuple[str, list[str]]] = []

    def compile_cell(f: Mapping[str, Any]) -> str:
        text = fmt_time(f["compile_seconds"])
        if "cached" in f:
            text += " (cached)" if f["cached"] else " (cold)"
        return text

    rows.append(("compile", [compile_cell(result[e]) for e in engines]))
    for q in (*(f"p{p}" for p in PERCENTILES), "min"):
        rows.append((f"latency {q}", [fmt_time(result[e]["latency_seconds"][q]) for e in engines]))
    rows.append(("throughput", [f"{result[e]['throughput_per_second']:.1f} /s" for e in engines]))
    rows.append(("peak RSS", [f"{result[e]['peak_rss_mib']:.0f} MiB" for e in engines]))
    head = ["", *engines]
    cells = [head, *[[name, *vals] for name, vals in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(head))]
    widths[0] = max(widths[0], len("max abs error"))
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))).rstrip()
             for row in cells]
    if "ratio" in result:
        lines.append(f"{'ratio':<{widths[0]}}  {result['ratio']:.2f}x  (glowpy p50 / {engines[1]} p50)")
        lines.append(f"{'max abs error':<{widths[0]}}  {result['max_abs_error']:.2e}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """The worker entry: `python -m glowpy.bench SPEC`."""
    from glowpy.errors import GlowpyError

    argv = sys.argv[1:] if argv is None else argv
    try:
        print(json.dumps(worker(json.loads(argv[0]))))
    except GlowpyError as e:
        print(json.dumps({"error": str(e)}))
        return EXIT_MODEL_ERROR
    return 0


if __name__ == "__main__":
    sys.exit(main())
