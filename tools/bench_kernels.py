"""Benchmark glowpy's generated Conv and GEMM kernels on their own, and the standalone JIT harness the
kernel tests share.

    python tools/bench_kernels.py [--repeats N] [--threads 1 2] [--no-ort] [--pools] [--small] [--cold]
    python tools/bench_kernels.py --model MODEL.onnx --shares [--threads 1 2 3]
    python tools/bench_kernels.py --winograd MODEL.onnx [...] [--cpu-clock]

For every distinct ResNet-50 conv layer shape (batch 1), and gemm at 512^3, prints GFLOP/s single- and
two-threaded next to numpy's matmul of the same FLOPs, then the sum of the conv layer times against
onnxruntime's whole-model latency on the random-weight ResNet-50 (tools/prepare_models.py). Numbers are
medians of several repeats; the machine is shared, so expect noise of several percent. `--pools`: the
vector MaxPool / AveragePool kernel on the zoo's pooling layers instead (ms and input taps per ns).
`--small` times the small-map layers (P = OH*OW <= 300) of inception_v3, googlenet and densenet121 instead;
`--cold` evicts the caches before every call, as a whole model does (its weights never stay cached).
`--model` times the distinct conv layers of that model instead. `--shares`: per thread count T > 1, each
thread's share (tid of T) runs alone, timed in thread CPU time, and the slowest share is reported: the
kernel's critical path on T idle cores, which other processes on a loaded machine barely disturb (an uneven
split or work every thread repeats shows; contention for memory bandwidth does not).
`--winograd`: per 3x3 stride-1 conv of the given models, the time and float64 error of each kernel choice
(what conv.winograd_tile's selection is measured against).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from llvmlite import binding as llvm
from llvmlite import ir

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from glowpy.backends.cpu.kernels.common import KernelInfo  # noqa: E402


def host_target_machine() -> llvm.TargetMachine:
    """A fresh host target machine: an MCJIT engine takes ownership of (and frees) the one it gets."""
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    target = llvm.Target.from_default_triple()
    return target.create_target_machine(cpu=llvm.get_host_cpu_name(),
                                        features=llvm.get_host_cpu_features().flatten(), opt=3)


def host_vector_width() -> int:
    feats = llvm.get_host_cpu_features()
    if feats.get("avx512f"):
        return 16
    if feats.get("avx2") or feats.get("avx"):
        return 8
    return 4


def _aligned(nbytes: int, offset: int = 0) -> np.ndarray:
    """A float32 buffer of nbytes whose data starts `offset` bytes past a 64-byte boundary."""
    n = max(nbytes, 4) // 4 + 32
    raw = np.zeros(n + 32, np.float32)
    skip = ((-raw.ctypes.data) % 64 + offset) // 4
    return raw[skip:skip + n]


class JitKernel:
    """One generated kernel in its own module: optimized for the host (new pass manager, speed level 3),
    MCJIT-compiled and callable on numpy arrays through ctypes (the GIL is released during the call)."""

    def __init__(self, build: Callable[[ir.Module, str], KernelInfo], name: str = "kernel",
                 misalign: bool = False, keep_asm: bool = False) -> None:
        tm = host_target_machine()
        module = ir.Module(name=name)
        module.triple = tm.triple
        module.data_layout = str(tm.target_data)
        self.info = build(module, name)
        self.llvm_ir = str(module)
        llmod = llvm.parse_assembly(self.llvm_ir)
        llmod.verify()
        pto = llvm.create_pipeline_tuning_options(speed_level=3)
        pb = llvm.create_pass_builder(tm, pto)
        pb.getModulePassManager().run(llmod, pb)
        self.asm = tm.emit_assembly(llmod) if keep_asm else None
        self.engine = llvm.create_mcjit_compiler(llmod, tm)
        self.engine.finalize_object()
        addr = self.engine.get_function_address(name)
        n_ptr = 4 + len(self.info.packed)
        self.cfunc = ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * n_ptr), ctypes.c_int32, ctypes.c_int32)(addr)
        off = 4 if misalign else 0  # prove the kernel assumes no alignment
        self.packed = []
        for p in self.info.packed:
            buf = _aligned(p.nbytes, off)[:p.size]
            buf[:] = np.asarray(p, np.float32).ravel()
            self.packed.append(buf)
        self._misalign = off
        self._scratch: list[np.ndarray] = []

    def _scratch_for(self, nthreads: int) -> list[np.ndarray]:
        while len(self._scratch) < nthreads:
            self._scratch.append(_aligned(self.info.scratch_bytes_per_thread, self._misalign))
        return self._scratch

    def __call__(self, out: np.ndarray, x: np.ndarray, third: np.ndarray | None = None,
                 nthreads: int = 1) -> None:
        ptrs = [out.ctypes.data, x.ctypes.data, None if third is None else third.ctypes.data]
        scratch = self._scratch_for(nthreads)
        packed = [p.ctypes.data for p in self.packed]
        if nthreads == 1:
            self.cfunc(*ptrs, scratch[0].ctypes.data, *packed, 0, 1)
            return
        threads = [threading.Thread(target=self.cfunc, args=(*ptrs, scratch[t].ctypes.data, *packed, t, nthreads))
                   for t in range(nthreads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()


class ThreadPool:
    """Persistent worker threads that call a kernel with tid 1..n-1 while the caller runs tid 0: the
    benchmark then measures the kernel, not Python thread creation."""

    def __init__(self, nthreads: int) -> None:
        self.n = nthreads
        self.go = [threading.Event() for _ in range(nthreads)]
        self.done = [threading.Event() for _ in range(nthreads)]
        self.job = None
        for t in range(1, nthreads):
            threading.Thread(target=self._worker, args=(t,), daemon=True).start()

    def _worker(self, t: int) -> None:
        while True:
            self.go[t].wait()
            self.go[t].clear()
            self.job(t)
            self.done[t].set()

    def run(self, job: Callable[[int], None]) -> None:
        self.job = job
        for t in range(1, self.n):
            self.go[t].set()
        job(0)
        for t in range(1, self.n):
            self.done[t].wait()
            self.done[t].clear()


def time_kernel(k: JitKernel, out, x, third=None, nthreads: int = 1, repeats: int = 7,
                pool: ThreadPool | None = None, min_time: float = 0.02, cpu_clock: bool = False) -> float:
    """Median seconds per call over `repeats` batches (each batch runs >= min_time)."""
    ptrs = [out.ctypes.data, x.ctypes.data, None if third is None else third.ctypes.data]
    scratch = k._scratch_for(nthreads)
    packed = [p.ctypes.data for p in k.packed]

    def job(t: int) -> None:
        k.cfunc(*ptrs, scratch[t].ctypes.data, *packed, t, nthreads)

    def once() -> None:
        if nthreads == 1:
            job(0)
        else:
            pool.run(job)

    return time_numpy(once, repeats, min_time, cpu_clock=cpu_clock and nthreads == 1)


def blas_threads(n: int) -> bool:
    """Set numpy's OpenBLAS thread count (the scipy-openblas build numpy wheels ship); False if not found."""
    import glob
    import os

    libs = glob.glob(os.path.join(os.path.dirname(np.__file__), "..", "numpy.libs", "*openblas*.so*"))
    for path in libs:
        lib = ctypes.CDLL(path)
        for sym in ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads", "openblas_set_num_threads"):
            fn = getattr(lib, sym, None)
            if fn is not None:
                fn(ctypes.c_int(n))
                return True
    return False


def time_numpy(fn: Callable[[], object], repeats: int = 7, min_time: float = 0.02, cpu_clock: bool = False) -> float:
    """Median seconds per call of fn over `repeats` batches. cpu_clock: this thread's CPU time instead of
    wall time (single-threaded work only; robust when other processes compete for the cores)."""
    clock = time.thread_time if cpu_clock else time.perf_counter
    fn()
    t0 = time.perf_counter()
    fn()
    inner = max(1, int(min_time / max(time.perf_counter() - t0, 1e-7)))
    samples = []
    for _ in range(repeats):
        t0 = clock()
        for _ in range(inner):
            fn()
        samples.append((clock() - t0) / inner)
    return statistics.median(samples)


# --- the benchmark -------------------------------------------------------------------------------

def resnet50_convs() -> list[dict]:
    """Distinct conv layers of the random-weight ResNet-50 (batch 1), with how often each occurs."""
    from tools.prepare_models import prepare

    return model_convs(prepare("resnet50"))


def model_convs(path) -> list[dict]:
    """Distinct conv layers of an ONNX model with static shapes, with how often each occurs."""
    import onnx
    from onnx import numpy_helper, shape_inference

    model = shape_inference.infer_shapes(onnx.load(str(path)))
    g = model.graph
    shapes = {vi.name: tuple(d.dim_value for d in vi.type.tensor_type.shape.dim)
              for vi in list(g.value_info) + list(g.input) + list(g.output)}
    inits = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    layers: dict[tuple, dict] = {}
    for node in g.node:
        if node.op_type != "Conv":
            continue
        a = {x.name: onnx.helper.get_attribute_value(x) for x in node.attribute}
        w = inits[node.input[1]]
        key = (shapes[node.input[0]], w.shape, tuple(a.get("strides", (1, 1))), tuple(a.get("pads", (0,) * 4)),
               tuple(a.get("dilations", (1, 1))), int(a.get("group", 1)))
        if key in layers:
            layers[key]["count"] += 1
            continue
        b = inits[node.input[2]] if len(node.input) > 2 else np.zeros(w.shape[0], np.float32)
        layers[key] = dict(x_shape=key[0], w=w, bias=b, strides=key[2], pads=key[3], dilations=key[4],
                           group=key[5], count=1)
    return list(layers.values())


# (C, H, W, M, KH, KW, stride, pads): small-map convs of the zoo's inception_v3 (17x17, 8x8), googlenet
# (7x7 inception5*), densenet121 (block 4 at 7x7) and mobilenet_v2's pointwise convs, random weights
SMALL_MAP_CONVS = (
    (768, 17, 17, 192, 1, 1, 1, (0, 0, 0, 0)), (768, 17, 17, 128, 1, 1, 1, (0, 0, 0, 0)),
    (128, 17, 17, 128, 1, 7, 1, (0, 3, 0, 3)), (160, 17, 17, 192, 7, 1, 1, (3, 0, 3, 0)),
    (1280, 8, 8, 320, 1, 1, 1, (0, 0, 0, 0)), (2048, 8, 8, 448, 1, 1, 1, (0, 0, 0, 0)),
    (448, 8, 8, 384, 3, 3, 1, (1, 1, 1, 1)), (384, 8, 8, 384, 1, 3, 1, (0, 1, 0, 1)),
    (832, 7, 7, 384, 1, 1, 1, (0, 0, 0, 0)), (160, 7, 7, 320, 3, 3, 1, (1, 1, 1, 1)),
    (48, 7, 7, 128, 3, 3, 1, (1, 1, 1, 1)), (992, 7, 7, 128, 1, 1, 1, (0, 0, 0, 0)),
    (128, 7, 7, 32, 3, 3, 1, (1, 1, 1, 1)),
    (96, 14, 14, 576, 1, 1, 1, (0, 0, 0, 0)), (576, 14, 14, 96, 1, 1, 1, (0, 0, 0, 0)),
    (960, 7, 7, 160, 1, 1, 1, (0, 0, 0, 0)),
)


def small_map_convs() -> list[dict]:
    rng = np.random.default_rng(1)
    out = []
    for c, h, w, m, kh, kw, s, pads in SMALL_MAP_CONVS:
        wt = (rng.standard_normal((m, c, kh, kw)) / np.sqrt(c * kh * kw)).astype(np.float32)
        out.append(dict(x_shape=(1, c, h, w), w=wt, bias=rng.standard_normal(m).astype(np.float32), strides=(s, s),
                        pads=pads, dilations=(1, 1), group=1, count=1))
    return out


def time_shares(k: JitKernel, out, x, third=None, nthreads: int = 2, repeats: int = 7) -> list[float]:
    """Median thread CPU seconds of each tid's share of a call with nthreads, the shares run one at a time."""
    ptrs = [out.ctypes.data, x.ctypes.data, None if third is None else third.ctypes.data]
    scratch = k._scratch_for(nthreads)
    packed = [p.ctypes.data for p in k.packed]
    return [time_numpy(lambda t=t: k.cfunc(*ptrs, scratch[t].ctypes.data, *packed, t, nthreads), repeats,
                       cpu_clock=True) for t in range(nthreads)]


def time_cold(k: JitKernel, out, x, third=None, repeats: int = 7, cpu_clock: bool = False) -> float:
    """Median seconds of single-threaded calls, each after a pass over 64 MiB evicts the caches."""
    clock = time.thread_time if cpu_clock else time.perf_counter
    flush = np.zeros(16 << 20, np.float32)
    samples = []
    for _ in range(max(repeats, 5) * 3):
        flush += 1.0
        t0 = clock()
        k(out, x, third)
        samples.append(clock() - t0)
    return statistics.median(samples)


def _conv_flops(layer: dict) -> float:
    from glowpy.backends.cpu.kernels.conv import conv_out_dim

    n, c, h, w = layer["x_shape"]
    m, cg, kh, kw = layer["w"].shape
    oh = conv_out_dim(h, kh, layer["strides"][0], layer["pads"][0] + layer["pads"][2], layer["dilations"][0])
    ow = conv_out_dim(w, kw, layer["strides"][1], layer["pads"][1] + layer["pads"][3], layer["dilations"][1])
    return 2.0 * n * m * oh * ow * cg * kh * kw, (n, m, oh, ow)


def ort_latency(threads: int, repeats: int, cpu_clock: bool = False) -> float:
    import onnxruntime as ort

    from tools.prepare_models import prepare

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    sess = ort.InferenceSession(str(prepare("resnet50")), opts, providers=["CPUExecutionProvider"])
    inp = sess.get_inputs()[0]
    x = np.random.default_rng(0).standard_normal([d if isinstance(d, int) else 1 for d in inp.shape]).astype(np.float32)
    # one intra-op thread runs on the calling thread, so its CPU time is the model's
    return time_numpy(lambda: sess.run(None, {inp.name: x}), repeats=repeats, min_time=0.3,
                      cpu_clock=cpu_clock and threads == 1)


# (name, kind, x shape, kernel, strides, pads, ceil_mode, count_include_pad): googlenet, inception_v3, squeezenet
POOLS = [
    ("googlenet maxpool1", "max", (1, 64, 112, 112), (3, 3), (2, 2), (0, 0, 0, 0), True, False),
    ("googlenet 3a branch4", "max", (1, 192, 28, 28), (3, 3), (1, 1), (1, 1, 1, 1), True, False),
    ("googlenet 4e branch4", "max", (1, 528, 14, 14), (3, 3), (1, 1), (1, 1, 1, 1), True, False),
    ("googlenet 5b branch4", "max", (1, 832, 7, 7), (3, 3), (1, 1), (1, 1, 1, 1), True, False),
    ("inception_v3 maxpool1", "max", (1, 64, 147, 147), (3, 3), (2, 2), (0, 0, 0, 0), False, False),
    ("inception_v3 Mixed_5b avg", "avg", (1, 192, 35, 35), (3, 3), (1, 1), (1, 1, 1, 1), False, False),
    ("inception_v3 Mixed_6b avg", "avg", (1, 768, 17, 17), (3, 3), (1, 1), (1, 1, 1, 1), False, False),
    ("squeezenet maxpool1", "max", (1, 64, 111, 111), (3, 3), (2, 2), (0, 0, 0, 0), True, False),
]


def bench_pools(args, vw: int, pools: dict) -> None:
    from glowpy.backends.cpu.kernels.pool import emit_pool_2d
    from glowpy.ir.ops.nn import _pool_out
    from glowpy.ir.types import TensorType

    print(f"{'pool':<28}{'x shape':<20}" + "".join(f" | {t}T     ms  taps/ns" for t in args.threads))
    for name, kind, xs, k, s, p, ceil, count_pad in POOLS:
        attrs = {"kernel_shape": k, "strides": s, "pads": p, "ceil_mode": int(ceil)}
        oshape = (*xs[:2], *_pool_out(attrs, TensorType(np.float32, xs)))
        kern = JitKernel(lambda m, n, o=oshape, a=(kind, k, s, p, count_pad), x_=xs: emit_pool_2d(
            m, n, x_, o, a[0], a[1], a[2], a[3], a[4], vw), name="pool")
        x = np.random.default_rng(0).standard_normal(xs).astype(np.float32)
        out = np.empty(oshape, np.float32)
        taps = float(np.prod(oshape)) * k[0] * k[1]
        row = ""
        for t in args.threads:
            sec = time_kernel(kern, out, x, nthreads=t, repeats=args.repeats, pool=pools.get(t),
                              cpu_clock=args.cpu_clock)
            row += f" | {sec * 1e3:9.3f} {taps / sec / 1e9:7.2f}"
        print(f"{name:<28}{str(xs[1:]):<20}{row}", flush=True)


@contextlib.contextmanager
def forced_winograd(tile: tuple[int, int] | None):
    """Every qualifying 3x3 conv takes Winograd F(mh x mw) = tile (None: no Winograd) while inside, whatever
    conv.winograd_tile's selection says: the per-layer comparison that selection is tuned against."""
    from glowpy.backends.cpu.kernels import conv

    chosen = conv.winograd_tile
    conv.winograd_tile = lambda geo, vw: tile if conv.use_winograd(geo) else None
    try:
        yield
    finally:
        conv.winograd_tile = chosen


def _conv_ref64(x: np.ndarray, w: np.ndarray, pads) -> np.ndarray:
    """Stride-1 3x3 conv in float64 (im2col + matmul), batch 1."""
    xp = np.pad(x[0].astype(np.float64), ((0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    oh, ow = xp.shape[1] - 2, xp.shape[2] - 2
    cols = np.stack([xp[:, i:i + oh, j:j + ow] for i in range(3) for j in range(3)], 1)
    return (w.reshape(w.shape[0], -1).astype(np.float64) @ cols.reshape(-1, oh * ow)).reshape(1, -1, oh, ow)


def winograd_table(paths: list[str], repeats: int, cpu_clock: bool, cold: bool = False) -> None:
    """Per distinct 3x3 stride-1 conv of these models: 1-thread time of the non-Winograd kernel, F(2x2),
    F(2x4) and F(4x4) (cold: caches evicted before every call), each one's largest error against float64
    relative to the largest output (ReLU-like input, He-scaled weights: the model's own weights are not what
    the error depends on), and the selection's pick."""
    from glowpy.backends.cpu.kernels import conv

    vw = host_vector_width()
    rng = np.random.default_rng(0)
    print(f"Winograd per layer, vector width {vw}; 1 thread, medians of {repeats} repeats "
          f"({'thread CPU time' if cpu_clock else 'wall clock'}{', cold caches' if cold else ''}); err = max |y - y64| / max |y64|")
    tiles = (None, (2, 2), (2, 4), (4, 4))
    names = ["none" if t is None else f"{t[0]}x{t[1]}" for t in tiles]
    print(f"{'model':<15}{'layer C,HxW->M':<17}{'n':>2} | ms " + " ".join(f"{n:>6}" for n in names)
          + " | err " + " ".join(f"{n:>8}" for n in names) + " | pick")
    for path in paths:
        for layer in model_convs(path):
            n, c, h, w_ = layer["x_shape"]
            geo = conv._Geometry(layer["x_shape"], layer["w"].shape, layer["strides"], layer["pads"],
                                 layer["dilations"], layer["group"])
            if not conv.use_winograd(geo) or n != 1:
                continue
            x = np.maximum(rng.standard_normal(layer["x_shape"]), 0).astype(np.float32)
            wt = (rng.standard_normal(layer["w"].shape) * np.sqrt(2 / (9 * c))).astype(np.float32)
            ref = _conv_ref64(x, wt, layer["pads"])
            out = np.empty(ref.shape, np.float32)
            times, errs = [], []
            for tile in tiles:
                with forced_winograd(tile):
                    k = JitKernel(lambda m, nm, L=layer, W=wt: conv.emit_conv2d(
                        m, nm, x_shape=L["x_shape"], w=W, bias=None, strides=L["strides"], pads=L["pads"],
                        dilations=L["dilations"], group=1, activation="none", activation_params=(),
                        has_residual=False, vector_width=vw), name="conv")
                timer = time_cold if cold else time_kernel
                times.append(timer(k, out, x, repeats=repeats, cpu_clock=cpu_clock))
                k(out, x)
                errs.append(np.abs(out - ref).max() / np.abs(ref).max())
            pick = names[tiles.index(conv.winograd_tile(geo, vw))]
            desc = f"{c},{h}x{w_}->{geo.M}"
            print(f"{Path(path).name.split('.')[0]:<15}{desc:<17}{layer['count']:>2} |    "
                  + " ".join(f"{t * 1e3:6.3f}" for t in times) + " |     "
                  + " ".join(f"{e:8.1e}" for e in errs) + f" | {pick}", flush=True)


def main(argv: list[str] | None = None) -> int:
    from glowpy.backends.cpu.kernels.conv import emit_conv2d
    from glowpy.backends.cpu.kernels.gemm import emit_gemm

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=7, help="timed batches per measurement (median is reported)")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--no-ort", action="store_true", help="skip the onnxruntime whole-model comparison")
    ap.add_argument("--layers", type=int, nargs="*", help="only these layer indices")
    ap.add_argument("--vector-width", type=int, help="lanes of the generated code (default: the host's; 8 on an "
                    "AVX-512 host approximates AVX2)")
    ap.add_argument("--small", action="store_true", help="the zoo's small-map conv layers instead of ResNet-50's")
    ap.add_argument("--cold", action="store_true", help="evict the caches before every call (1 thread only)")
    ap.add_argument("--model", metavar="MODEL.onnx", help="the distinct conv layers of this model instead")
    ap.add_argument("--shares", action="store_true",
                    help="T > 1: the slowest thread's share run alone, in thread CPU time (see above)")
    ap.add_argument("--cpu-clock", action="store_true",
                    help="single-thread columns in thread CPU time (robust on a loaded machine); 2T stays wall")
    ap.add_argument("--pools", action="store_true", help="the pooling kernels instead of conv and gemm")
    ap.add_argument("--winograd", nargs="+", metavar="MODEL.onnx",
                    help="instead: per 3x3 stride-1 conv of these models, no Winograd vs F(2x2), F(2x4), F(4x4)")
    args = ap.parse_args(argv)
    if args.winograd:
        winograd_table(args.winograd, args.repeats, args.cpu_clock, args.cold)
        return 0
    vw = args.vector_width or host_vector_width()
    pools = {t: ThreadPool(t) for t in args.threads if t > 1}
    if args.pools:
        bench_pools(args, vw, pools)
        return 0
    rng = np.random.default_rng(0)
    clock = "1T: thread CPU time, 2T+: wall" if args.cpu_clock else "wall clock"
    if args.shares:
        clock = ("1T: thread CPU time" if args.cpu_clock else "1T: wall") + ", 2T+: the slowest share's CPU time"
    print(f"glowpy kernels, vector width {vw}; medians of {args.repeats} repeats, {clock} (shared machine: noisy)")
    cols = "".join(f" | {t}T GF/s   ms  numpy" for t in args.threads)
    print(f"{'#':>2} {'layer (C,H,W)->(M,C/g,KH,KW) stride pad':<44}{'n':>3}{cols}")
    totals = dict.fromkeys(args.threads, 0.0)
    if args.cold and args.threads != [1]:
        ap.error("--cold measures one thread only")
    layers = model_convs(args.model) if args.model else small_map_convs() if args.small else resnet50_convs()
    for i, layer in enumerate(layers):
        if args.layers and i not in args.layers:
            continue
        flops, oshape = _conv_flops(layer)
        k = JitKernel(lambda m, n, L=layer: emit_conv2d(
            m, n, x_shape=L["x_shape"], w=L["w"], bias=L["bias"], strides=L["strides"], pads=L["pads"],
            dilations=L["dilations"], group=L["group"], activation="relu", activation_params=(),
            has_residual=False, vector_width=vw), name="conv")
        x = rng.standard_normal(layer["x_shape"]).astype(np.float32)
        out = np.empty(oshape, np.float32)
        # numpy: the same FLOPs as one matmul (W[M, K] @ X[K, P]), what BLAS does after an im2col
        m, cg, kh, kw = layer["w"].shape
        wa = rng.standard_normal((m, cg * kh * kw)).astype(np.float32)
        xa = rng.standard_normal((cg * kh * kw, oshape[2] * oshape[3])).astype(np.float32)
        row = ""
        for t in args.threads:
            if args.cold:
                sec = time_cold(k, out, x, repeats=args.repeats, cpu_clock=args.cpu_clock)
            elif args.shares and t > 1:
                sec = max(time_shares(k, out, x, nthreads=t, repeats=args.repeats))
            else:
                sec = time_kernel(k, out, x, nthreads=t, repeats=args.repeats, pool=pools.get(t),
                                  cpu_clock=args.cpu_clock)
            totals[t] += sec * layer["count"]
            blas_threads(t)
            np_sec = time_numpy(lambda a=wa, b=xa: a @ b, args.repeats, cpu_clock=args.cpu_clock and t == 1)
            row += f" | {flops / sec / 1e9:7.1f} {sec * 1e3:6.3f} {flops / np_sec / 1e9:6.1f}"
        desc = (f"{tuple(layer['x_shape'][1:])}->{tuple(int(d) for d in layer['w'].shape)} s{layer['strides'][0]} "
                f"p{layer['pads'][0]}")
        print(f"{i:>2} {desc:<44}{layer['count']:>3}{row}", flush=True)

    # gemm: 512^3 with B constant (packed at compile time) and B a runtime operand, and ResNet-50's
    # classifier (batch 1: a matrix-vector product, memory-bound on the 8 MB weight)
    gemms = () if args.small or args.model else ((512, 512, 512, True, False), (512, 512, 512, False, False),
                                   (1, 1000, 2048, True, True))
    for m_, n_, k_, const, b_trans in gemms:
        a = rng.standard_normal((m_, k_)).astype(np.float32)
        bmat = rng.standard_normal((n_, k_) if b_trans else (k_, n_)).astype(np.float32)
        out = np.empty((m_, n_), np.float32)
        k = JitKernel(lambda mod, nm, M=m_, N=n_, K=k_, c=const, bt=b_trans, B=bmat: emit_gemm(
            mod, nm, M=M, N=N, K=K, a_trans=False, b=B if c else None, b_trans=bt, alpha=1.0, bias=None,
            bias_kind="none", activation="none", activation_params=(), vector_width=vw), name="gemm")
        opb = bmat.T if b_trans else bmat
        flops = 2.0 * m_ * n_ * k_
        row = ""
        for t in args.threads:
            third = None if const else bmat
            if args.cold:
                sec = time_cold(k, out, a, third, repeats=args.repeats, cpu_clock=args.cpu_clock)
            elif args.shares and t > 1:
                sec = max(time_shares(k, out, a, third, nthreads=t, repeats=args.repeats))
            else:
                sec = time_kernel(k, out, a, third, nthreads=t, repeats=args.repeats, pool=pools.get(t),
                                  cpu_clock=args.cpu_clock)
            blas_threads(t)
            np_sec = time_numpy(lambda a=a, b=opb: a @ b, args.repeats, cpu_clock=args.cpu_clock and t == 1)
            row += f" | {flops / sec / 1e9:7.1f} {sec * 1e3:6.3f} {flops / np_sec / 1e9:6.1f}"
        desc = f"gemm {m_}x{n_}x{k_}, B{'^T' if b_trans else ''} {'constant' if const else 'runtime'}"
        print(f"{'':>2} {desc:<44}{'':>3}{row}", flush=True)

    if args.layers or args.small or args.model:
        return 0
    print()
    for t in args.threads:
        line = f"ResNet-50 conv layers, {t} thread(s): sum {totals[t] * 1e3:.1f} ms"
        if not args.no_ort:
            ort_s = ort_latency(t, args.repeats, args.cpu_clock)
            line += f"; onnxruntime whole model {ort_s * 1e3:.1f} ms (ratio {totals[t] / ort_s:.2f})"
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
