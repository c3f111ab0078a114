"""The interpreter gives bitwise-equal results for output channels with equal inputs and weights,
whichever OpenBLAS kernels the host's vector width selects.

numpy's OpenBLAS is built for every x86 core (DYNAMIC_ARCH) and picks its kernels when it loads;
OPENBLAS_CORETYPE overrides the pick. Each check runs in a fresh process forced to Haswell (AVX2,
what an AMD Zen 3 host gets) and to SkylakeX (AVX-512, what this project's Zen 4 hosts get), and
first asserts that OpenBLAS reports that core, so both vector widths are covered on one host
whatever OPENBLAS_* variables the machine exports. SkylakeX kernels cannot run on a CPU without
AVX-512: there that case is skipped, saying why.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PROBE = Path(__file__).with_name("channels_probe.py")
CORES = ("Haswell", "SkylakeX")


def has_avx512() -> bool:
    try:
        return any(line.startswith("flags") and " avx512f" in line for line in Path("/proc/cpuinfo").open())
    except OSError:
        return False


def probe(core: str, *args: str) -> dict:
    """channels_probe.py's report from a process whose OpenBLAS runs `core`'s kernels."""
    if core == "SkylakeX" and not has_avx512():
        pytest.skip("this CPU has no AVX-512, so OpenBLAS's SkylakeX kernels cannot run on it")
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENBLAS_")}
    env["OPENBLAS_CORETYPE"] = core
    proc = subprocess.run([sys.executable, str(PROBE), *args], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stdout}{proc.stderr}"
    report = json.loads(proc.stdout)
    if report["corename"] is None:
        pytest.skip("numpy is not linked with OpenBLAS: no core type to force")
    assert report["corename"].lower() == core.lower(), f"asked OpenBLAS for {core}, it runs {report['corename']}"
    return report["results"]


@pytest.mark.parametrize("core", CORES)
def test_equal_channels_are_bitwise_equal(core: str) -> None:
    """Conv, grouped Conv, ConvTranspose, Gemm (plain and transB), MatMul (plain and batched) and
    FullyConnected, at odd sizes that put channels in BLAS's full tiles and its edge kernels: output
    channels whose weights are equal, and output rows whose inputs are equal, agree to the bit."""
    results = probe(core)
    ours = {k: v for k, v in results.items() if not k.startswith("raw ")}
    assert len(ours) >= 40
    assert [k for k, ok in ours.items() if not ok] == []
    # The sizes do reach position-dependent kernels: numpy's own f32 product at the same sizes
    # gives equal channels unequal results (so the checks above could fail).
    raw = {k: v for k, v in results.items() if k.startswith("raw ")}
    assert not all(raw.values()), raw


@pytest.mark.parametrize("core", CORES)
def test_light_squeezenet_is_uniform(core: str) -> None:
    """onnx's light SqueezeNet (every weight equal, logits near 1.6e10): all 1000 probabilities are
    one value, the shipped 0.001, under both kernel sets (test_models checks it on the host's own)."""
    results = probe(core, "squeezenet")
    assert results["distinct_outputs"] == 1
    assert results["max_rel_error"] < 1e-3
