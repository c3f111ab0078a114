"""Peak RSS of loading, compiling and running a model once: glowpy cold, glowpy cached, onnxruntime.

    python -m tools.bench_rss --models resnet50.torchscript bert_base.torchscript --rounds 2
    python -m tools.bench_rss --models /tmp/zoo/bert_base.torchscript.*.onnx --engines cold ort

A model is an .onnx path or a zoo name (tests/zoo/skeletons), realized once into --work-dir.

Each figure is one fresh process (glowpy.bench's worker: load, compile, one run) and its peak RSS is
the ru_maxrss os.wait4 reports when it has exited, so memory a process touches after its own
measurement (the model cache's write-behind thread, interpreter exit) counts too. "cold" runs on an
empty GLOWPY_CACHE_DIR of its own, "cached" on a directory a first cold process filled, "ort" is an
onnxruntime session. The engines take turns for --rounds rounds (the machine may be shared); the table
shows the median and the largest peak RSS, and the median load time (import + compile, or session
creation). Every engine gets the same input, made by the first glowpy process.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

ENGINES = ("cold", "cached", "ort")


def run_process(spec: dict, env: dict[str, str]) -> dict:
    """glowpy.bench's worker in a fresh process; its result plus the whole process's peak RSS."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen([sys.executable, "-m", "glowpy.bench", json.dumps(spec)], stdout=out, stderr=err,
                                env={**os.environ, "PYTHONPATH": path, **env})
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if proc.returncode != 0:
            lines = err.read().strip().splitlines()
            raise RuntimeError(f"{spec['engine']} worker failed: {lines[-1] if lines else proc.returncode}")
        result = json.loads((out.read().strip().splitlines() or ["{}"])[-1])
    result["process_rss_mib"] = usage.ru_maxrss / 1024.0  # Linux: KiB
    return result


def measure(model: Path, engines: list[str], rounds: int, threads: int, work: Path) -> dict[str, list[dict]]:
    inputs = work / "inputs.npz"
    warm = work / "warm-cache"
    per: dict[str, list[dict]] = {e: [] for e in engines}
    base = {"model": str(model), "threads": threads, "iterations": 1, "warmup": 0, "inputs": str(inputs)}
    if "cached" in engines or not inputs.exists():  # fills the warm cache and writes the input
        run_process({**base, "engine": "glowpy"}, {"GLOWPY_CACHE_DIR": str(warm)})
    for r in range(rounds):
        for e in engines:
            if e == "ort":
                per[e].append(run_process({**base, "engine": "onnxruntime"}, {}))
                continue
            cache = warm if e == "cached" else Path(tempfile.mkdtemp(prefix=f"cold{r}-", dir=work))
            res = run_process({**base, "engine": "glowpy"}, {"GLOWPY_CACHE_DIR": str(cache)})
            if res.get("cached") != (e == "cached"):
                raise RuntimeError(f"the {e} round {r} of {model.name} was {'not ' * (e == 'cached')}a cache hit")
            per[e].append(res)
    return per


def model_path(name: str, work_dir: Path | None) -> Path:
    """An .onnx path as given; a zoo name as its realized model file."""
    if name.endswith(".onnx"):
        return Path(name)
    from tools.bench_zoo import DEFAULT_WORK_DIR, model_file

    return model_file(name, work_dir or DEFAULT_WORK_DIR)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", required=True, help="ONNX model files or zoo names")
    ap.add_argument("--engines", nargs="+", choices=ENGINES, default=list(ENGINES))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", type=Path, help="also write the per-round figures here")
    ap.add_argument("--work-dir", type=Path, help="where zoo names are realized (default: bench_zoo's)")
    args = ap.parse_args(argv)
    everything = {}
    print("| model | engine | peak RSS MiB (median) | max | load s (median) |")
    print("| --- | --- | ---: | ---: | ---: |")
    for name in args.models:
        model = model_path(name, args.work_dir)
        with tempfile.TemporaryDirectory(prefix="glowpy-rss-") as tmp:
            per = measure(model, args.engines, args.rounds, args.threads, Path(tmp))
        everything[str(model)] = per
        for e, rs in per.items():
            rss = [r["process_rss_mib"] for r in rs]
            load = [r["load_seconds"] for r in rs]
            print(f"| {model.name.split('.')[0]} | {e} | {np.median(rss):.0f} | {max(rss):.0f} | "
                  f"{np.median(load):.2f} |", flush=True)
    if args.json:
        args.json.write_text(json.dumps(everything, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
