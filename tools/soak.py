"""ONNXIFI soak: T host threads x N init/run/release cycles through the C library, in rounds with the
library closed and opened again between them, resident memory reported as it goes.

    python tools/soak.py [--threads 8] [--cycles 500] [--rounds 2] [--model squeezenet] [--backend CPU]

Builds libonnxifi-glowpy.so and tests/onnxifi/soak_host.c, writes the model (random weights for onnx's
light models, or `tiny`, a small conv net), an input and onnxruntime's output for it, then runs the host
under an empty environment (the library finds its Python by itself). Every output is compared with
onnxruntime's. `--cycles` is per thread and per round. RSS growth is measured from the end of warm-up
(the first `--warmup` fraction of the first round's cycles, by which every graph has been compiled and
cached) to the end. With T graphs compiling and running at once, RSS at one sample depends on how many
threads are mid-compile, so each end is the peak over a window: the samples of the next `--warmup`
fraction after warm-up, against the samples of the last such fraction of the whole run. The exit code is
1 if a check failed or the growth exceeds `--max-growth`.

    python tools/soak.py --from-log LOG    # the summary of a soak's printed output, again
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

HOST_SOURCE = ROOT / "tests" / "onnxifi" / "soak_host.c"
RSS_LINE = re.compile(r"^rss round=(\d+) cycles=(\d+) kib=(\d+)$")
SUMMARY_LINE = re.compile(r"^soak: (\d+) cycles, (\d+) failed$")
CLOSED_LINE = re.compile(r"^round (\d+): library closed \((.*)\)$")


def tiny_model() -> onnx.ModelProto:
    """Conv -> Relu -> MaxPool -> Flatten -> MatMul -> Softmax, seeded weights: compiles in a blink."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3, "w")
    fc = numpy_helper.from_array(rng.standard_normal((8 * 4 * 4, 10)).astype(np.float32) * 0.1, "fc")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("MatMul", ["f", "fc"], ["m"]),
             helper.make_node("Softmax", ["m"], ["y"], axis=1)]
    g = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], [w, fc])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


def load_model(name: str) -> onnx.ModelProto:
    if name == "tiny":
        return tiny_model()
    if Path(name).is_file():
        return onnx.load(name)
    from tools.prepare_models import prepare

    return onnx.load(str(prepare(name, ROOT / "models")))


def build_host(out_dir: Path) -> Path:
    from glowpy.onnxifi.build import INCLUDE_DIR

    cc = shutil.which("cc")
    if cc is None:
        raise SystemExit("soak: no C compiler (cc)")
    exe = out_dir / "soak_host"
    subprocess.run([cc, "-O1", "-Wall", "-Werror", "-Wno-unused-result", "-I", str(INCLUDE_DIR), str(HOST_SOURCE),
                    "-o", str(exe), "-ldl", "-lpthread", "-lm"], check=True)
    return exe


@dataclass
class SoakResult:
    cycles: int = 0
    failed: int = 0
    rss: list[tuple[int, int, int]] = field(default_factory=list)  # (round, cycles done, KiB)
    failures: list[str] = field(default_factory=list)
    closed: list[str] = field(default_factory=list)  # per round: whether dlclose unmapped the library
    seconds: float = 0.0
    returncode: int = 0
    warm_kib: int = 0
    end_kib: int = 0

    @property
    def growth(self) -> float:
        return (self.end_kib - self.warm_kib) / self.warm_kib if self.warm_kib else float("inf")


def soak(*, threads: int, cycles: int, rounds: int, model: str, backend: str, report: int | None = None,
         warmup: float = 0.2, library: Path | None = None, work_dir: Path | None = None,
         echo: bool = False) -> SoakResult:
    import onnxruntime as ort

    from glowpy.onnxifi.build import build

    work = Path(work_dir or tempfile.mkdtemp(prefix="glowpy-soak-"))
    work.mkdir(parents=True, exist_ok=True)
    lib = library or build(work / "lib")
    host = build_host(work)
    proto = load_model(model)
    weights = {t.name for t in proto.graph.initializer}
    inp = next(i for i in proto.graph.input if i.name not in weights)
    out = proto.graph.output[0]
    in_dims = [d.dim_value for d in inp.type.tensor_type.shape.dim]
    x = np.random.default_rng(1).standard_normal(in_dims).astype(np.float32)
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    y = np.ascontiguousarray(sess.run([out.name], {inp.name: x})[0], np.float32)
    (work / "model.onnx").write_bytes(proto.SerializeToString())
    (work / "x.bin").write_bytes(x.tobytes())
    (work / "y.bin").write_bytes(y.tobytes())
    report = report or max(1, threads * cycles // 20)
    (work / "soak.cfg").write_text(
        f"library {lib}\nmodel {work / 'model.onnx'}\nbackend {backend}\nthreads {threads}\ncycles {cycles}\n"
        f"rounds {rounds}\nreport {report}\ntolerance 1e-4 1e-3\n"
        f"input {inp.name} {x.ndim} {' '.join(map(str, x.shape))} {work / 'x.bin'}\n"
        f"output {out.name} {y.ndim} {' '.join(map(str, y.shape))} {work / 'y.bin'}\n")
    t = time.perf_counter()
    env = {"GLOWPY_CACHE_DIR": os.environ["GLOWPY_CACHE_DIR"]} if "GLOWPY_CACHE_DIR" in os.environ else {}
    proc = subprocess.Popen(["env", "-i", *(f"{k}={v}" for k, v in env.items()), str(host), str(work / "soak.cfg")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=work)
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if echo:
            print(line, end="", flush=True)
    result = parse_log("".join(lines), warmup)
    result.returncode = proc.wait()
    result.seconds = time.perf_counter() - t
    return result


def rss_window_peaks(rss: list[tuple[int, int, int]], warm_cycles: float, window: float) -> tuple[int, int]:
    """(peak KiB over the `window` cycles after warm-up, peak KiB over the last `window` cycles)."""
    if not rss:
        return 0, 0
    total = rss[-1][1]
    after = [kib for _, c, kib in rss if warm_cycles <= c <= warm_cycles + window] or [rss[-1][2]]
    last = [kib for _, c, kib in rss if c >= total - window] or [rss[-1][2]]
    return max(after), max(last)


def parse_log(text: str, warmup: float = 0.2) -> SoakResult:
    """A SoakResult from a soak host's printed output (its first line states rounds, threads, cycles)."""
    result = SoakResult()
    head = re.search(r"soak: (\d+) rounds x (\d+) threads x (\d+) cycles", text)
    for line in text.splitlines():
        if m := RSS_LINE.match(line):
            result.rss.append((int(m[1]), int(m[2]), int(m[3])))
        elif line.startswith("FAIL"):
            result.failures.append(line)
        elif m := CLOSED_LINE.match(line):
            result.closed.append(m[2])
        elif m := SUMMARY_LINE.match(line):
            result.cycles, result.failed = int(m[1]), int(m[2])
    if head:
        rounds, threads, cycles = map(int, head.groups())
        result.warm_kib, result.end_kib = rss_window_peaks(result.rss, warmup * threads * cycles,
                                                           warmup * threads * cycles * rounds)
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=8)
    p.add_argument("--cycles", type=int, default=500, help="per thread and round (default: %(default)s)")
    p.add_argument("--rounds", type=int, default=2, help="dlopen ... dlclose rounds (default: %(default)s)")
    p.add_argument("--model", default="squeezenet", help="a light model name, an .onnx path, or 'tiny'")
    p.add_argument("--backend", default="CPU", help="a substring of the ONNXIFI backend name (CPU, Interpreter)")
    p.add_argument("--report", type=int, help="print RSS every this many cycles (default: 1/20 of a round)")
    p.add_argument("--warmup", type=float, default=0.2, help="fraction of round 1 before RSS is the baseline")
    p.add_argument("--max-growth", type=float, default=0.05, help="allowed RSS growth after warm-up")
    p.add_argument("--work-dir", type=Path)
    p.add_argument("--from-log", type=Path, help="summarize the printed output of an earlier soak instead")
    args = p.parse_args(argv)
    if args.from_log:
        r = parse_log(args.from_log.read_text(), args.warmup)
        r.returncode = 0 if r.cycles else 1  # a log without the host's last line: the soak did not finish
    else:
        r = soak(threads=args.threads, cycles=args.cycles, rounds=args.rounds, model=args.model,
                 backend=args.backend, report=args.report, warmup=args.warmup, work_dir=args.work_dir, echo=True)
    done = r.rss[-1][1] if r.rss else 0
    start = r.rss[0][2] / 1024 if r.rss else 0
    print(f"soak summary: {r.cycles or done} cycles{'' if r.cycles else ' (unfinished)'}, "
          f"{r.failed if r.cycles else len(r.failures)} failed"
          + (f", {r.seconds:.0f} s" if r.seconds else "")
          + f"; RSS start {start:.1f} MiB, after warm-up {r.warm_kib / 1024:.1f} MiB, end {r.end_kib / 1024:.1f} MiB"
          f" (window peaks), growth {r.growth:+.1%}; dlclose: {', '.join(r.closed) or 'never reached'}")
    return 0 if r.returncode == 0 and r.failed == 0 and not r.failures and r.growth <= args.max_growth else 1


if __name__ == "__main__":
    sys.exit(main())
