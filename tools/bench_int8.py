"""Int8 acceptance figures (issue 14): zoo models quantized by onnxruntime.quantization.quantize_static
(QDQ, per-channel int8 weights, uint8 activations, seeded calibration data); glowpy's int8 result against
onnxruntime's (share of output elements within one quantization step of the output) and latency at one
thread: glowpy int8 vs onnxruntime int8 vs glowpy fp32 (and onnxruntime fp32 for scale).

    PYTHONPATH=$PWD python tools/bench_int8.py [--models resnet50.torchscript mobilenet_v2.torchscript]
        [--calibration 8] [--runs 5] [--top1 200 [--top1-calibration 16] [--method minmax]
        [--weight-range max] [--residual int8]]

glowpy int8 runs on the cpu backend when it compiles the quantized model, else on the interpreter
(accuracy only; its latency is not a figure of merit and is printed as such).

`--top1 N` measures glowpy's own quantizer instead (glowpy.quantize, profiled on the cpu backend): the model quantized
from calibration feeds drawn by the zoo's input rules (seeds 10000...), then the share of N other seeded
feeds (seeds 1000...) whose top-1 class is the float model's, both run on glowpy (cpu, else the
interpreter), with onnxruntime's quantize_static model on the same feeds for comparison; also the std of
the logit error against the float logits (beside the float model's median top-1 / top-2 margin), and the
integer and float ops the cpu backend's optimized int8 graph holds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnxruntime import quantization

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import glowpy  # noqa: E402
from glowpy.errors import GlowpyError  # noqa: E402
from tests.zoo.realize import SKELETON_DIR, make_inputs, realize  # noqa: E402


def session(path: str) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def quantize_static(model: onnx.ModelProto, feeds: list[dict], work: Path) -> onnx.ModelProto:
    class Reader(quantization.CalibrationDataReader):
        def __init__(self) -> None:
            self.it = iter(feeds)

        def get_next(self):
            return next(self.it, None)

    src, dst = work / "float.onnx", work / "qdq.onnx"
    onnx.save(model, src)
    quantization.quantize_static(str(src), str(dst), Reader(), quant_format=quantization.QuantFormat.QDQ,
                                 per_channel=True, activation_type=quantization.QuantType.QUInt8,
                                 weight_type=quantization.QuantType.QInt8)
    return onnx.load(str(dst))


def output_step(qdq: onnx.ModelProto, name: str) -> float:
    """The quantization step of graph output `name`: the scale of the DequantizeLinear producing it,
    else of the one feeding the op that does (onnxruntime leaves a float op such as Softmax last)."""
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in qdq.graph.initializer}
    producers = {o: n for n in qdq.graph.node for o in n.output}
    node = producers[name]
    for _ in range(4):
        if node.op_type == "DequantizeLinear":
            return float(inits[node.input[1]].reshape(-1)[0])
        node = producers[node.input[0]]
    raise SystemExit(f"no DequantizeLinear before output {name}")


def timed_together(fns: dict, runs: int) -> dict[str, tuple[float, float]]:
    """(median, min) ms of each engine, run in turn round by round so that load from elsewhere on the
    machine falls on all of them alike."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    for fn in fns.values():
        fn()
    for _ in range(runs):
        for k, fn in fns.items():
            t = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t)
    return {k: (statistics.median(v) * 1e3, min(v) * 1e3) for k, v in times.items()}


def bench(name: str, calibration: int, runs: int) -> None:
    model = realize(SKELETON_DIR / f"{name}.onnx", 0)
    feed = make_inputs(model, 1)[0]
    (input_name, x), = feed.items()
    rng = np.random.default_rng(3)
    calib = [{input_name: rng.standard_normal(x.shape).astype(x.dtype)} for _ in range(calibration)]
    with tempfile.TemporaryDirectory() as d:
        qdq = quantize_static(model, calib, Path(d))
        onnx.save(model, Path(d) / "f.onnx")
        onnx.save(qdq, Path(d) / "q.onnx")
        ort_fp32, ort_int8 = session(str(Path(d) / "f.onnx")), session(str(Path(d) / "q.onnx"))
    out = ort_int8.get_outputs()[0].name
    want = ort_int8.run([out], feed)[0]
    step = output_step(qdq, out)
    try:
        g_int8, backend = glowpy.compile(qdq, backend="cpu", threads=1), "cpu"
    except GlowpyError as e:
        print(f"  glowpy cpu refuses the int8 model: {type(e).__name__}: {e}")
        g_int8, backend = glowpy.compile(qdq, backend="interpreter"), "interpreter"
    t = time.perf_counter()
    got = g_int8.run(feed)[out]
    first = (time.perf_counter() - t) * 1e3
    within = float(np.mean(np.abs(got - want) <= step * 1.0001))
    exact = float(np.mean(got == want))
    g_fp32 = glowpy.compile(model, backend="cpu", threads=1)
    fns = {
        "onnxruntime int8": lambda: ort_int8.run([out], feed),
        "onnxruntime fp32": lambda: ort_fp32.run(None, feed),
        "glowpy fp32 (cpu)": lambda: g_fp32.run(feed),
    }
    if backend == "cpu":
        fns["glowpy int8 (cpu)"] = lambda: g_int8.run(feed)
    ms = timed_together(fns, runs)
    print(f"{name}: output {out} {list(want.shape)}, step {step:.4g}; glowpy int8 on {backend}: "
          f"{within:.2%} within one step, {exact:.2%} equal, max |diff| {np.abs(got - want).max():.4g}")
    print(f"  {'':20s} {'median':>9s} {'min':>9s}  (ms, 1 thread, {runs} interleaved rounds)")
    for k, (med, lo) in ms.items():
        print(f"  {k:20s} {med:9.2f} {lo:9.2f}")
    if backend == "cpu":
        for i, what in ((0, "median"), (1, "min")):
            g8, o8, g32 = ms["glowpy int8 (cpu)"][i], ms["onnxruntime int8"][i], ms["glowpy fp32 (cpu)"][i]
            print(f"  {what:6s}: glowpy int8 / onnxruntime int8 = {g8 / o8:.2f}x, glowpy int8 / glowpy fp32 = "
                  f"{g8 / g32:.2f}x")
    else:
        print(f"  glowpy int8 (interpreter, one run) {first:9.2f} ms")


def top1(name: str, count: int, calibration: int, method: str, weight_range: str, residual: bool) -> None:
    """Top-1 agreement of glowpy's own calibrated int8 model with the float model (see the docstring)."""
    from glowpy.pipeline import optimized_graph
    from glowpy.quantize import quantize

    model = realize(SKELETON_DIR / f"{name}.onnx", 0)
    (input_name,) = make_inputs(model, 1)[0]
    calib = [make_inputs(model, 10_000 + s)[0] for s in range(calibration)]
    qdq = quantize(model, {input_name: np.stack([f[input_name] for f in calib])}, method=method,
                   weight_range=weight_range, residual=residual, backend="cpu")
    with tempfile.TemporaryDirectory() as d:
        ort_qdq = quantize_static(model, calib, Path(d))
    try:
        g_int8, backend = glowpy.compile(qdq, backend="cpu"), "cpu"
    except GlowpyError as e:
        print(f"  glowpy cpu refuses its own int8 model: {type(e).__name__}: {e}")
        g_int8, backend = glowpy.compile(qdq, backend="interpreter"), "interpreter"
    ops: dict[str, int] = {}
    for node in optimized_graph(qdq, "cpu").nodes:
        ops[node.op] = ops.get(node.op, 0) + 1
    float_ops = {k: v for k, v in ops.items() if k in ("Conv", "FullyConnected", "MatMul", "Gemm", "Add")}
    g_fp32, o_int8 = glowpy.compile(model, backend="cpu"), session(ort_qdq.SerializeToString())
    out = model.graph.output[0].name
    agree = ort_agree = 0
    errors, ort_errors, margins = [], [], []
    for s in range(count):
        feed = make_inputs(model, 1000 + s)[0]
        ref = g_fp32.run(feed)[out].ravel()
        got, ort_got = g_int8.run(feed)[out].ravel(), o_int8.run([out], feed)[0].ravel()
        want = int(np.argmax(ref))
        agree += int(np.argmax(got)) == want
        ort_agree += int(np.argmax(ort_got)) == want
        errors.append(got - ref)
        ort_errors.append(ort_got - ref)
        top = np.sort(ref)
        margins.append(top[-1] - top[-2])
    options = f"{method}, weights {weight_range}, residual {'int8' if residual else 'float'}"
    print(f"{name}: glowpy int8 ({options}, {calibration} calibration feeds, on {backend}) top-1 = fp32 on "
          f"{agree}/{count} = {agree / count:.1%}; onnxruntime quantize_static on the same feeds: "
          f"{ort_agree}/{count} = {ort_agree / count:.1%}")
    print(f"  logit error std: glowpy {np.std(errors):.4f}, onnxruntime {np.std(ort_errors):.4f}; fp32 median "
          f"top-2 margin {np.median(margins):.4f}")
    print(f"  integer ops on cpu: {', '.join(f'{k} {v}' for k, v in sorted(ops.items()) if k.startswith('QLinear'))}"
          f"; float ops left: {', '.join(f'{k} {v}' for k, v in sorted(float_ops.items())) or 'none'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["resnet50.torchscript", "mobilenet_v2.torchscript"])
    ap.add_argument("--calibration", type=int, default=8)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--top1", type=int, default=0, help="top-1 agreement of glowpy's own int8 on this many feeds")
    ap.add_argument("--top1-calibration", type=int, default=16)
    ap.add_argument("--method", default="minmax", help="glowpy.quantize calibration method")
    ap.add_argument("--weight-range", default="max", help="glowpy.quantize weight range ('max' or 'mse')")
    ap.add_argument("--residual", choices=("int8", "float"), default="int8",
                    help="glowpy.quantize: quantize residual Adds (QLinearAdd) or keep them float")
    args = ap.parse_args()
    import llvmlite.binding as llvm

    print(f"host cpu {llvm.get_host_cpu_name()}, onnxruntime {ort.__version__}")
    for name in args.models:
        if args.top1:
            top1(name, args.top1, args.top1_calibration, args.method, args.weight_range, args.residual == "int8")
        else:
            bench(name, args.calibration, args.runs)


if __name__ == "__main__":
    main()
