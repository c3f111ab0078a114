"""Generated code must not depend on helpers a process happens to have loaded.

x86 has no f64 -> f16 instruction: left to itself LLVM calls compiler-rt's __truncdfhf2, which MCJIT
resolves only if something (libgcc_s from GCC 12, pulled in by onnxruntime, say) is already loaded,
and otherwise jumps to address 0. Run such casts in a fresh interpreter that imports nothing else.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

SCRIPT = r"""
import numpy as np, glowpy
from onnx import TensorProto, helper
x = np.array([0.1, 1.0 / 3, 65519.99, 70000.0, -2.5e-8, np.nan, np.inf, 2049.0, 2051.0, 0.0], np.float64)
cases = [(TensorProto.DOUBLE, TensorProto.FLOAT16, x), (TensorProto.FLOAT16, TensorProto.DOUBLE, x.astype(np.float16)),
         (TensorProto.FLOAT, TensorProto.FLOAT16, x.astype(np.float32))]
for src, dst, data in cases:
    g = helper.make_graph([helper.make_node("Cast", ["x"], ["y"], to=dst)], "g",
                          [helper.make_tensor_value_info("x", src, [x.size])],
                          [helper.make_tensor_value_info("y", dst, [x.size])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    y = glowpy.compile(m, backend="cpu", cache=False).run({"x": data})["y"]
    want = data.astype(y.dtype)
    ok = (y == want) | (np.isnan(y) & np.isnan(want))
    if not ok.all():
        raise SystemExit(f"cast {src}->{dst}: {y} != {want}")
print("ok")
"""


def test_half_casts_in_a_bare_process() -> None:
    proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stdout}{proc.stderr}"
    assert proc.stdout.strip() == "ok"
