"""glowpy's batched MatMul kernel (kernels/batched.py) against onnxruntime's MatMul on the zoo's transformer
projection shapes, one thread.

    python tools/bench_matmul.py                          # every shape below, glowpy and onnxruntime
    python tools/bench_matmul.py vit_ff2 1500x384x1536    # named shapes or MxKxN
    python tools/bench_matmul.py --cold 64 --rounds 30    # B (the weights) evicted before every call

Both are B = a constant matrix (packed once), A a fresh (M, K) input. The engines alternate within each
round and every figure is the minimum over the rounds of a call's thread CPU time: on a shared machine
that is the run other processes disturbed least (medians drift with the load). `--cold N` writes N MiB
of other data before every call, as a whole model does (its weights never stay cached); A stays warm,
as the producing kernel leaves it.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from glowpy.backends.cpu.kernels.batched import emit_batched_gemm  # noqa: E402
from tools.bench_kernels import JitKernel, host_vector_width  # noqa: E402

# (M, K, N) of the zoo's projections at its input sizes (tokens x in x out)
SHAPES = {
    "t5_qkv": (128, 512, 512), "t5_ff1": (128, 512, 2048), "t5_ff2": (128, 2048, 512),
    "bert_o": (128, 768, 768), "bert_ff1": (128, 768, 3072), "bert_ff2": (128, 3072, 768),
    "vit_qkv": (197, 768, 2304), "vit_o": (197, 768, 768), "vit_ff1": (197, 768, 3072), "vit_ff2": (197, 3072, 768),
    "w2v_ff1": (49, 768, 3072), "w2v_ff2": (49, 3072, 768),
    "wh_o": (1500, 384, 384), "wh_ff1": (1500, 384, 1536), "wh_ff2": (1500, 1536, 384),
}


def ort_matmul(x: np.ndarray, b: np.ndarray):
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    (m, k), n = x.shape, b.shape[1]
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "mm",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])],
                          [numpy_helper.from_array(b, "w")])
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    sess = ort.InferenceSession(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString(),
                                opts, providers=["CPUExecutionProvider"])
    feed = {"x": x}
    return lambda: sess.run(None, feed)


def measure(m: int, k: int, n: int, rounds: int, ort: bool, junk: np.ndarray | None, keep: list) -> tuple:
    """(best seconds per engine, max abs error against float64) for one shape."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((m, k), np.float32)
    b = (rng.standard_normal((k, n), np.float32) / np.sqrt(k)).astype(np.float32)
    vw = host_vector_width()
    kern = JitKernel(lambda mod, nm: emit_batched_gemm(mod, nm, M=m, N=n, K=k, b=b, vector_width=vw))
    out = np.zeros((m, n), np.float32)
    keep.append((kern, out))  # an MCJIT engine freed mid-run can take the process down
    ptrs = [out.ctypes.data, x.ctypes.data, None, kern._scratch_for(1)[0].ctypes.data]
    ptrs += [p.ctypes.data for p in kern.packed]
    calls = [lambda: kern.cfunc(*ptrs, 0, 1)]
    if ort:
        calls.append(ort_matmul(x, b))
    for call in calls:
        call()
    err = float(np.abs(out - x.astype(np.float64) @ b).max())
    best = [float("inf")] * len(calls)
    for _ in range(rounds):
        for i, call in enumerate(calls):
            if junk is not None:
                junk += 1.0
                x += 0.0
            t0 = time.thread_time()
            call()
            best[i] = min(best[i], time.thread_time() - t0)
    return best, err


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("shapes", nargs="*", default=list(SHAPES), help="names above or MxKxN")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--cold", type=int, default=0, metavar="MIB", help="evict caches with this much data per call")
    ap.add_argument("--no-ort", action="store_true", help="glowpy only")
    args = ap.parse_args(argv)
    junk = np.ones(args.cold << 18, np.float32) if args.cold else None
    print(f"{'shape':28s} {'glowpy':>18s} {'onnxruntime':>18s}  ratio   (1 thread, thread CPU time, min of "
          f"{args.rounds}{', cold B' if args.cold else ''})")
    keep: list = []
    for name in args.shapes:
        m, k, n = SHAPES[name] if name in SHAPES else tuple(int(d) for d in name.split("x"))
        best, err = measure(m, k, n, args.rounds, not args.no_ort, junk, keep)
        flops = 2.0 * m * n * k
        cells = [f"{t * 1e3:7.3f} ms {flops / t / 1e9:5.0f} GF/s" for t in best]
        ratio = f"{best[0] / best[1]:5.2f}x" if len(best) > 1 else ""
        print(f"{name + f' {m}x{k}x{n}':28s} {cells[0]:>18s} {cells[1] if len(cells) > 1 else '':>18s}  {ratio}"
              f"   max err {err:.1e}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
