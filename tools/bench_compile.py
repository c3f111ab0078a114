"""Start-up figures, side by side: glowpy's import, cold and cached compile against onnxruntime's session.

    python tools/bench_compile.py                         # ResNet-50, SqueezeNet, BERT-base, ViT-B (zoo)
    python tools/bench_compile.py --models resnet50.dynamo --rounds 3

Each model is a zoo skeleton realized with seeded weights (tests/zoo/realize.py), saved once to a
temporary file. Every figure comes from a fresh process:
- import: `import glowpy` and then the modules a compile needs (onnx, numpy, llvmlite, the cpu backend);
- cold: `glowpy.compile(path)` on an empty cache directory (import + optimize + codegen + LLVM);
- cached: the same in a second process on the cache the cold one filled;
- onnxruntime: `InferenceSession(path)` (after `import onnxruntime`, whose own import time is shown apart);
- onnxInitGraph (where `cc` exists): the C host of tests/onnxifi/host.c dlopens libonnxifi-glowpy.so in a
  fresh process with only GLOWPY_CACHE_DIR in its environment and times onnxInitGraph of the model, its
  weights given as descriptors, on a cache an earlier such process filled.
With --rounds N the cached and onnxruntime figures are the median over N alternating processes.
A model glowpy refuses prints "refused: <op>". Prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODELS = ("resnet50.dynamo", "squeezenet1_1.dynamo", "bert_base.dynamo", "vit_b_16.dynamo")

_GLOWPY = r"""
import json, sys, time
t0 = time.perf_counter()
import glowpy
t1 = time.perf_counter()
import glowpy.pipeline, glowpy.backends.cpu  # what the first compile pulls in (onnx, numpy, llvmlite)
t2 = time.perf_counter()
out = {"import_glowpy": t1 - t0, "import_deps": t2 - t1}
try:
    m = glowpy.compile(sys.argv[1], backend="cpu")
except glowpy.GlowpyError as e:
    out["refused"] = e.op or type(e).__name__
else:
    out.update(compile=time.perf_counter() - t2, cached=bool(m.cached))
print(json.dumps(out))
"""

_ORT = r"""
import json, sys, time
t0 = time.perf_counter()
import onnxruntime as ort
t1 = time.perf_counter()
so = ort.SessionOptions()
so.log_severity_level = 3
ort.InferenceSession(sys.argv[1], so, providers=["CPUExecutionProvider"])
print(json.dumps({"import": t1 - t0, "session": time.perf_counter() - t1}))
"""


def _run(code: str, path: Path, env: dict[str, str]) -> dict:
    pythonpath = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    proc = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": pythonpath, **env})
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
        raise RuntimeError(f"{path.name}: {tail}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def realized_file(name: str, directory: Path) -> Path:
    """The zoo skeleton `name` with seeded weights, written once per run."""
    path = directory / f"{name}.onnx"
    if not path.exists():
        import onnx

        if str(ROOT) not in sys.path:
            sys.path.insert(0, str(ROOT))
        from tests.zoo.harness import realized

        onnx.save(realized(name), str(path))
    return path


class CHost:
    """The ONNXIFI C host and library, built once per run."""

    def __init__(self, directory: Path) -> None:
        if str(ROOT) not in sys.path:
            sys.path.insert(0, str(ROOT))
        from glowpy.onnxifi.build import build
        from tests.onnxifi.chost import build_host

        self.dir = directory
        self.lib = build(directory / "lib")
        self.exe = build_host(directory)

    def script(self, path: Path) -> Path:
        import numpy as np
        import onnx
        import onnxruntime as ort

        from tests.onnxifi.chost import write_case
        from tests.zoo.realize import make_inputs

        proto = onnx.load(str(path))
        feeds = {k: np.asarray(v) for k, v in make_inputs(proto, 1)[0].items()}
        expected = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
        case = self.dir / path.stem
        case.mkdir(exist_ok=True)
        script = case / "script.txt"
        # the zoo's tolerance: the host checks the run too, so a fast but wrong init would show
        script.write_text("backend CPU\n" + write_case(case, proto, feeds, expected, "model")
                          + "tolerance 1e-4 1e-3\nrun 1\n")
        return script

    def init_graph(self, script: Path, cache: str) -> float:
        """Seconds onnxInitGraph took, as the host printed it."""
        proc = subprocess.run([str(self.exe), str(self.lib), str(script)], capture_output=True, text=True,
                              env={"GLOWPY_CACHE_DIR": cache}, timeout=600)
        lines = proc.stdout.splitlines()
        if proc.returncode == 0 and lines and lines[-1].endswith(" 0 failed"):
            for line in lines:
                if line.startswith("InitGraph:"):
                    return float(line.split()[1]) / 1e3
        raise RuntimeError(f"C host: {(proc.stdout + proc.stderr).strip().splitlines()[-1:]}")


def measure(path: Path, rounds: int, chost: CHost | None = None) -> dict:
    with tempfile.TemporaryDirectory(prefix="glowpy-bench-compile-cache-") as cache:
        env = {"GLOWPY_CACHE_DIR": cache}
        cold = _run(_GLOWPY, path, env)
        if "refused" in cold:
            return {"refused": cold["refused"], "import": cold["import_glowpy"] + cold["import_deps"]}
        cached, ort, init = [], [], []
        script = chost.script(path) if chost else None
        if script:
            chost.init_graph(script, cache)  # ONNXIFI's key hashes the weights it is given: fill its entry
        for _ in range(rounds):
            cached.append(_run(_GLOWPY, path, env))
            ort.append(_run(_ORT, path, {}))
            if script:
                init.append(chost.init_graph(script, cache))
    med = statistics.median
    return {"onnxifi": med(init) if init else None, "import_glowpy": med(c["import_glowpy"] for c in cached), "import": med(c["import_glowpy"] + c["import_deps"]
                                                                                      for c in cached),
            "cold": cold["compile"], "cached": med(c["compile"] for c in cached),
            "hit": all(c["cached"] for c in cached), "ort_import": med(o["import"] for o in ort),
            "ort": med(o["session"] for o in ort)}


def fmt(s: float) -> str:
    return f"{s * 1e3:.0f} ms" if s < 10 else f"{s:.1f} s"


def table(rows: list[tuple[str, dict]]) -> str:
    head = ("| model | import glowpy (+ onnx, numpy, llvmlite) | cold compile | cached compile | "
            "onnxruntime session (import) | cached / onnxruntime | onnxInitGraph, cached (C host) |")
    lines = [head, "|" + " --- |" * (head.count("|") - 1)]
    for name, r in rows:
        if "refused" in r:
            lines.append(f"| {name} | {fmt(r['import'])} | refused: {r['refused']} | | | | |")
            continue
        lines.append(f"| {name} | {r['import_glowpy'] * 1e3:.1f} ms ({fmt(r['import'])}) | {fmt(r['cold'])} | "
                     f"{fmt(r['cached'])}{'' if r['hit'] else ' (miss!)'} | {fmt(r['ort'])} ({fmt(r['ort_import'])}) | "
                     f"{r['cached'] / r['ort']:.2f}x | {fmt(r['onnxifi']) if r['onnxifi'] is not None else 'no cc'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS), help="zoo names MODEL.EXPORTER")
    ap.add_argument("--rounds", type=int, default=3, help="cached / onnxruntime processes per model (median)")
    ap.add_argument("--json", type=Path, help="also write the raw figures here")
    ap.add_argument("--no-onnxifi", action="store_true", help="leave out the onnxInitGraph column")
    args = ap.parse_args(argv)
    import llvmlite.binding as llvm

    print(f"{llvm.get_host_cpu_name()}, {os.cpu_count()} CPUs, Python {sys.version.split()[0]}", file=sys.stderr)
    rows = []
    with tempfile.TemporaryDirectory(prefix="glowpy-bench-compile-models-") as models:
        chost = None
        if not args.no_onnxifi and shutil.which("cc"):
            chost = CHost(Path(models))
        for name in args.models:
            r = measure(realized_file(name, Path(models)), args.rounds, chost)
            rows.append((name, r))
            print(f"  {name}: {json.dumps(r)}", file=sys.stderr, flush=True)
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps(dict(rows), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
