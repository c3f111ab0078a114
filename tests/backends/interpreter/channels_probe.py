"""Run by test_host_determinism.py in a fresh process (OpenBLAS reads OPENBLAS_CORETYPE once, when it
loads): prints one JSON object saying which OpenBLAS core the process got and, for each reduction
op, whether the interpreter's output channels with equal inputs and weights are bitwise equal.
With the argument `squeezenet` it runs onnx's light SqueezeNet instead (all weights equal, so all
1000 class probabilities should be equal) and reports how far its output is from the shipped one.

Not a test module itself (pytest does not collect it): `python channels_probe.py [squeezenet]`.
"""

from __future__ import annotations

import ctypes
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from glowpy.backends.interpreter import InterpreterBackend  # noqa: E402
from glowpy.ir import Graph, TensorType  # noqa: E402

F32 = np.float32


def openblas_corename() -> str | None:
    """The core type numpy's OpenBLAS runs with (what threadpoolctl reports as `architecture`)."""
    with open("/proc/self/maps") as f:
        libs = {line.split()[-1] for line in f if "openblas" in line.lower() and line.rstrip().endswith(".so")}
    for path in sorted(libs):
        lib = ctypes.CDLL(path)
        for sym in ("scipy_openblas_get_corename64_", "scipy_openblas_get_corename", "openblas_get_corename64_",
                    "openblas_get_corename"):
            fn = getattr(lib, sym, None)
            if fn is not None:
                fn.restype = ctypes.c_char_p
                return fn().decode()
    return None


def run_one(op: str, inputs: list[np.ndarray], attrs: dict) -> np.ndarray:
    """`op` on `inputs` through the interpreter backend (first input a placeholder, rest weights)."""
    g = Graph(op)
    x = g.add_input("x", TensorType.of(inputs[0]))
    ws = [g.add_constant(f"w{i}", a) for i, a in enumerate(inputs[1:])]
    g.outputs = g.add_node(op, [x, *ws], attrs, name="n").outputs
    (y,) = InterpreterBackend().compile(g).run([inputs[0]])
    return y


def duplicated(rng: np.random.Generator, n: int, shape: tuple[int, ...], axis: int) -> tuple[np.ndarray, np.ndarray]:
    """A random array of `shape` whose slices along `axis` repeat 3 distinct ones; returns it and the
    index (0..2) of the distinct slice each position holds."""
    which = rng.integers(0, 3, n)
    which[:3] = (0, 1, 2)
    distinct = rng.standard_normal((*shape[:axis], 3, *shape[axis + 1:])).astype(F32)
    return np.take(distinct, which, axis=axis), which


def channels_equal(y: np.ndarray, which: np.ndarray, axis: int) -> bool:
    """Every slice of `y` along `axis` is bitwise equal to the first slice with the same `which`."""
    y = np.moveaxis(y, axis, 0)
    first = {int(k): int(np.argmax(which == k)) for k in np.unique(which)}
    return all(np.array_equal(y[i].view(np.uint32), y[first[int(k)]].view(np.uint32)) for i, k in enumerate(which))


def light_squeezenet() -> dict:
    import onnx
    from onnx import numpy_helper

    import glowpy
    from glowpy.models import light_model_path, light_output_path

    compiled = glowpy.compile(light_model_path("squeezenet"), backend="interpreter")
    feeds = {n: np.ones(t.shape, t.dtype) for n, t in compiled.input_types.items()}
    (out,) = compiled.run(feeds).values()
    expected = numpy_helper.to_array(onnx.load_tensor(str(light_output_path("squeezenet"))))
    return {"distinct_outputs": len(np.unique(out)), "max_abs_error": float(np.abs(out - expected).max()),
            "max_rel_error": float((np.abs(out - expected) / np.abs(expected)).max())}


def main() -> None:
    if sys.argv[1:] == ["squeezenet"]:
        print(json.dumps({"corename": openblas_corename(), "results": light_squeezenet()}))
        return
    rng = np.random.default_rng(0)
    results: dict[str, bool] = {}
    # Odd sizes everywhere, so that output channels land both in BLAS's full tiles and in its edge
    # kernels (16/8-wide on AVX-512, 8/4-wide on AVX2).
    for m, k, n in ((7, 300, 37), (33, 129, 50), (100, 1000, 17), (5, 77, 1000)):
        # output channels = columns of the weight; input rows (tokens, batch) repeat as well
        x, rows = duplicated(rng, m, (m, k), 0)
        w, cols = duplicated(rng, n, (k, n), 1)
        bias = np.take(rng.standard_normal(3).astype(F32), cols)
        for op, ins, attrs in (("MatMul", [x, w], {}), ("FullyConnected", [x, w, bias], {}),
                               ("Gemm", [x, w, bias], {}), ("Gemm", [x, np.ascontiguousarray(w.T), bias], {"transB": 1})):
            y = run_one(op, ins, attrs)
            tag = f"{op}{'.transB' if attrs else ''} {m}x{k}x{n}"
            results[f"{tag} channels"] = channels_equal(y, cols, 1)
            results[f"{tag} rows"] = channels_equal(y, rows, 0)
        raw = x @ w  # numpy's own f32 product: what the interpreter must not depend on
        results[f"raw f32 matmul {m}x{k}x{n} channels"] = channels_equal(raw, cols, 1)
        results[f"raw f32 matmul {m}x{k}x{n} rows"] = channels_equal(raw, rows, 0)
    xb, rows = duplicated(rng, 6, (2, 6, 45, 129), 1)  # batched, rows repeating within each batch entry
    w, cols = duplicated(rng, 37, (129, 37), 1)
    y = run_one("MatMul", [xb, w], {})
    results["MatMul batched channels"] = channels_equal(y, cols, 3)
    results["MatMul batched rows"] = channels_equal(y, rows, 1)
    conv = {"strides": (1, 1), "pads": (1, 1, 1, 1), "dilations": (1, 1)}
    for cin, cout, hw in ((3, 37, 15), (16, 100, 13), (64, 1000, 7)):
        x = rng.standard_normal((1, cin, hw, hw)).astype(F32)
        w, cols = duplicated(rng, cout, (cout, cin, 3, 3), 0)
        b = np.take(rng.standard_normal(3).astype(F32), cols)
        results[f"Conv {cin}->{cout} {hw}x{hw} channels"] = channels_equal(run_one("Conv", [x, w, b], conv), cols, 1)
        # two groups reading equal halves of the input: equal channels in both groups
        y = run_one("Conv", [np.concatenate([x, x], 1), np.concatenate([w, w]), np.concatenate([b, b])],
                    {**conv, "group": 2})
        results[f"Conv group=2 {cin}->{cout} channels"] = channels_equal(y, np.concatenate([cols, cols]), 1)
        wt, tcols = duplicated(rng, cout, (cin, cout, 3, 3), 1)
        results[f"ConvTranspose {cin}->{cout} {hw}x{hw} channels"] = channels_equal(
            run_one("ConvTranspose", [x, wt, np.zeros(cout, F32)], {**conv, "output_padding": (0, 0)}), tcols, 1)
    print(json.dumps({"corename": openblas_corename(), "results": results}))


if __name__ == "__main__":
    main()
