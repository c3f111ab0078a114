"""Acceptance through a C host: tests/onnxifi/host.c, compiled with the machine's cc, dlopens the built
libonnxifi-glowpy.so RTLD_LOCAL under an empty environment (`env -i`) and drives it from a script."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from glowpy.onnxifi.build import INCLUDE_DIR

from .chost import build_host, write_case
from .conftest import model, vi


def _cpu_landed() -> bool:
    from glowpy.backends import get_backend

    try:
        get_backend("cpu")
    except Exception:  # noqa: BLE001
        return False
    return True


# The backend ResNet-50 runs on: the CPU JIT once it is there, the interpreter before (override with
# GLOWPY_ONNXIFI_TEST_BACKEND=CPU|Interpreter, a substring of the ONNXIFI backend name).
RUN_BACKEND = os.environ.get("GLOWPY_ONNXIFI_TEST_BACKEND") or ("CPU" if _cpu_landed() else "Interpreter")


@pytest.fixture(scope="session")
def host(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cc = shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler (cc) on this machine")
    return build_host(tmp_path_factory.mktemp("onnxifi-host"))


def run_host(host: Path, lib: Path, script: str, tmp: Path, timeout: int = 300) -> str:
    path = tmp / "script.txt"
    path.write_text(script)
    # env -i: no PATH, no PYTHONPATH, no virtualenv; the library must find its Python by itself.
    proc = subprocess.run(["env", "-i", str(host), str(lib), str(path)], capture_output=True, text=True,
                          timeout=timeout, cwd=tmp)
    print(proc.stdout)
    print(proc.stderr)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert " 0 failed" in proc.stdout.splitlines()[-1]
    return proc.stdout


def onnxruntime_outputs(proto: onnx.ModelProto, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    import onnxruntime as ort

    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, inputs)


def test_c_host_contract_and_small_model(host, lib_path, tmp_path, relu_model, add_model, unknown_op_model):
    (tmp_path / "relu.onnx").write_bytes(relu_model)
    (tmp_path / "add.onnx").write_bytes(add_model)
    (tmp_path / "unknown.onnx").write_bytes(unknown_op_model)
    rng = np.random.default_rng(0)
    conv_w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "conv_w")
    conv_b = numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "conv_b")
    fc_w = numpy_helper.from_array(rng.standard_normal((64, 5)).astype(np.float32), "fc_w")
    proto = onnx.ModelProto.FromString(model(
        [helper.make_node("Conv", ["x", "conv_w", "conv_b"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2]),
         helper.make_node("Relu", ["c"], ["r"]),
         helper.make_node("Flatten", ["r"], ["f"]),
         helper.make_node("MatMul", ["f", "fc_w"], ["y"])],
        [vi("x", [2, 3, 8, 8])], [vi("y", [2, 5])], initializers=[conv_w, conv_b, fc_w]))
    x = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
    expected = onnxruntime_outputs(proto, {"x": x})
    cpu_compat = "0" if _cpu_landed() else "1"
    case = write_case(tmp_path, proto, {"x": x}, expected, "small") + "tolerance 1e-4 1e-4\nrun 2\n"
    script = (f"backend Interpreter\ncompat {tmp_path / 'relu.onnx'} 0\ncompat {tmp_path / 'unknown.onnx'} 0x203\n"
              f"contract {tmp_path / 'relu.onnx'} {tmp_path / 'add.onnx'}\n" + case
              + f"backend CPU\ncompat {tmp_path / 'relu.onnx'} {cpu_compat}\ncompat {tmp_path / 'unknown.onnx'} 0x203\n"
              + (case if _cpu_landed() else ""))
    out = run_host(host, lib_path, script, tmp_path)
    assert 'backend 0: "Glowpy CPU JIT"' in out and 'backend 1: "Glowpy Interpreter"' in out
    assert out.count("output y matches") == (4 if _cpu_landed() else 2)


def test_c_host_resnet50_matches_onnxruntime(host, lib_path, tmp_path, random_model):
    """Random-weight ResNet-50, its 100 MB of weights given as descriptors and freed by the host
    right after onnxInitGraph, run with events from host threads; compared with onnxruntime."""
    path = random_model("resnet50")
    proto = onnx.load(str(path))
    name = proto.graph.input[0].name
    x = np.random.default_rng(1).standard_normal((1, 3, 224, 224)).astype(np.float32)
    expected = onnxruntime_outputs(proto, {name: x})
    script = (f"backend {RUN_BACKEND}\n" + write_case(tmp_path, proto, {name: x}, expected, "resnet50")
              + "tolerance 5e-5 5e-3\nrun 2\n")
    del proto
    out = run_host(host, lib_path, script, tmp_path)
    assert f"using backend \"Glowpy {'CPU JIT' if RUN_BACKEND == 'CPU' else 'Interpreter'}\"" in out
    assert out.count("output gpu_0/softmax_1 matches") == 2


def test_header_compiles_as_cpp(tmp_path):
    """Hosts in C++ include the same header."""
    cxx = shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    src = tmp_path / "h.cc"
    src.write_text('#include "onnxifi.h"\nstatic_assert(sizeof(onnxTensorDescriptorV1) == 56, "");\n'
                   'static_assert(sizeof(onnxMemoryFenceV1) == 24, "");\nint main() { return 0; }\n')
    subprocess.run([cxx, "-std=c++11", "-Wall", "-I", str(INCLUDE_DIR), str(src), "-o", str(tmp_path / "h")],
                   check=True)


def test_lib_is_loadable_with_ctypes_and_uses_this_interpreter(clib, relu_model):
    """In a Python process the library serves calls with the running interpreter: objects it makes
    are visible to the Python layer."""
    import ctypes

    from glowpy.onnxifi import api

    before = api.live_counts()["ids"]
    n = ctypes.c_size_t(0)
    clib.onnxGetBackendIDs(None, ctypes.byref(n))
    ids = (ctypes.c_void_p * n.value)()
    assert clib.onnxGetBackendIDs(ids, ctypes.byref(n)) == 0
    assert api.live_counts()["ids"] == 2
    assert api.onnxGetBackendCompatibility(ids[1], len(relu_model), relu_model) == 0  # the same registry
    for i in ids:
        assert clib.onnxReleaseBackendID(i) == 0
    assert api.live_counts()["ids"] == before


def test_lib_under_a_python_host_subprocess(lib_path, tmp_path):
    """A fresh Python that is not glowpy-aware loads the library through ctypes."""
    import sys

    code = ("import ctypes, sys\n"
            f"lib = ctypes.CDLL({str(lib_path)!r})\n"
            "n = ctypes.c_size_t(0)\n"
            "assert lib.onnxGetBackendIDs(None, ctypes.byref(n)) == 1, 'count'\n"
            "print('backends', n.value, 'glowpy' in sys.modules)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "backends 2 True" in proc.stdout


BROKEN_HOST = r"""
#include <dlfcn.h>
#include <stdio.h>
#include "onnxifi.h"
int main(int argc, char** argv) {
  void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) { printf("dlopen failed\n"); return 2; }
  onnxGetBackendIDsFunction ids = (onnxGetBackendIDsFunction)dlsym(lib, "onnxGetBackendIDs");
  onnxReleaseGraphFunction release = (onnxReleaseGraphFunction)dlsym(lib, "onnxReleaseGraph");
  size_t n = 0;
  onnxStatus a = ids(NULL, &n);
  onnxStatus b = release(NULL);
  printf("statuses 0x%04x 0x%04x count %zu\n", (unsigned)a, (unsigned)b, n);
  return 0;
}
"""


def test_failed_python_start_is_an_error_not_success(host, tmp_path, monkeypatch):
    """If the library's Python side cannot start, cffi would return 0 (SUCCESS) from every call; the
    exported functions turn that into INTERNAL_ERROR."""
    from glowpy.onnxifi import build as build_mod

    monkeypatch.setattr(build_mod, "_INIT_CODE", "raise RuntimeError('init broken on purpose')\n")
    broken = build_mod.build(tmp_path / "broken")
    src = tmp_path / "broken.c"
    src.write_text(BROKEN_HOST)
    exe = tmp_path / "broken_host"
    subprocess.run([shutil.which("cc") or "cc", "-I", str(INCLUDE_DIR), str(src), "-o", str(exe), "-ldl"], check=True)
    proc = subprocess.run(["env", "-i", str(exe), str(broken)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "statuses 0x0406 0x0406 count 0" in proc.stdout
    assert "init broken on purpose" in proc.stderr
