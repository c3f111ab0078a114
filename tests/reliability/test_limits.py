"""The memory budget: sizes over it are refused before anything is allocated, naming the node and size."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import glowpy
from glowpy import limits
from glowpy.errors import ConfigurationError, MemoryLimitExceeded, Status

ROOT = Path(__file__).resolve().parents[2]
BOMB_DIMS = [4000, 1000, 1000, 1000]  # 4e12 floats: 14.6 TiB


def bomb_model(declare_shapes: bool = True) -> bytes:
    """y = x + ConstantOfShape([4000, 1000, 1000, 1000]); with ONNX's inferred shapes declared, as
    exporters write them (the compatibility check reads declared types, never weights)."""
    shape = numpy_helper.from_array(np.array(BOMB_DIMS, dtype=np.int64), "shape")
    nodes = [helper.make_node("ConstantOfShape", ["shape"], ["big"], name="bomb",
                              value=numpy_helper.from_array(np.array([1.0], np.float32))),
             helper.make_node("Add", ["x", "big"], ["y"], name="add")]
    g = helper.make_graph(nodes, "bomb", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializer=[shape])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    if declare_shapes:
        m = onnx.shape_inference.infer_shapes(m)
    return m.SerializeToString()


def small_model() -> bytes:
    w = numpy_helper.from_array(np.arange(64 * 64, dtype=np.float32).reshape(64, 64), "w")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "small",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])], initializer=[w])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString()


@pytest.mark.parametrize("text, value", [("1024", 1024), ("4G", 4 << 30), ("512M", 512 << 20), ("512m", 512 << 20),
                                         ("1.5GiB", 3 << 29), ("2K", 2048), ("100B", 100), ("1T", 1 << 40)])
def test_parse_size(text, value):
    assert limits.parse_size(text) == value


@pytest.mark.parametrize("text", ["lots", "-1G", "0", "4X", "1e9", "G"])
def test_bad_limit_is_a_clear_error(text, monkeypatch):
    monkeypatch.setenv(limits.ENV, text)
    with pytest.raises(ConfigurationError, match=r"GLOWPY_MAX_MEMORY=.*expected a positive size"):
        limits.check_bytes(1, "a test tensor")


def test_empty_limit_means_the_default(monkeypatch):
    monkeypatch.setenv(limits.ENV, "")
    assert limits.memory_budget()[1].startswith("75% of available memory")


def test_default_budget_is_a_fraction_of_available_memory(monkeypatch):
    monkeypatch.delenv(limits.ENV, raising=False)
    budget, source = limits.memory_budget()
    available = limits.available_memory()
    assert budget == int(available * limits.AVAILABLE_FRACTION)
    assert 0 < available <= os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert "available memory" in source


def test_check_tensor_names_the_tensor_and_size(monkeypatch):
    monkeypatch.setenv(limits.ENV, "1M")
    limits.check_tensor("w", np.float32, [512, 512])  # exactly 1 MiB
    with pytest.raises(MemoryLimitExceeded) as e:
        limits.check_tensor("w", np.float32, [512, 513], node="conv1", op="Conv")
    assert e.value.status == Status.NO_SYSTEM_MEMORY
    assert str(e.value) == ("node 'conv1' (Conv): tensor 'w' (float32[512, 513]) needs 1.0 MiB, over the memory "
                            "limit of 1.0 MiB (GLOWPY_MAX_MEMORY)")
    with pytest.raises(MemoryLimitExceeded, match=r"needs 8388608\.0 TiB"):
        limits.check_tensor("huge", np.float64, [1 << 30, 1 << 30])  # Python ints: no int64 overflow


@pytest.mark.parametrize("backend", ["interpreter", "cpu"])
def test_compile_refuses_the_bomb_fast(backend):
    t = time.perf_counter()
    with pytest.raises(MemoryLimitExceeded) as e:
        glowpy.compile(bomb_model(), backend=backend)
    assert time.perf_counter() - t < 1.0
    assert e.value.status == Status.NO_SYSTEM_MEMORY
    assert e.value.node == "bomb" and "14.6 TiB" in str(e.value) and "[4000, 1000, 1000, 1000]" in str(e.value)


def test_check_reports_no_system_memory_for_the_bomb():
    t = time.perf_counter()
    report = glowpy.check(bomb_model(), backend="cpu")
    assert time.perf_counter() - t < 1.0
    assert report.status == Status.NO_SYSTEM_MEMORY
    bad = [n for n in report.nodes if n.status == Status.NO_SYSTEM_MEMORY]
    assert [n.name for n in bad] == ["bomb", "add"] and "14.6 TiB" in bad[0].reason


def test_onnxifi_refuses_the_bomb_with_no_system_memory():
    """onnxGetBackendCompatibility and onnxInitGraph, on both backends, without allocating it."""
    from glowpy.onnxifi import api

    data = bomb_model()
    ids = (ctypes.c_void_p * 2)()
    n = ctypes.c_size_t(2)
    assert api.onnxGetBackendIDs(ids, ctypes.byref(n)) == Status.SUCCESS
    try:
        for i in ids[: n.value]:
            assert api.onnxGetBackendCompatibility(i, len(data), data) == Status.NO_SYSTEM_MEMORY
            backend, graph = ctypes.c_void_p(), ctypes.c_void_p(1)
            assert api.onnxInitBackend(i, None, ctypes.byref(backend)) == Status.SUCCESS
            t = time.perf_counter()
            assert api.onnxInitGraph(backend, None, len(data), data, 0, None, ctypes.byref(graph)) == \
                Status.NO_SYSTEM_MEMORY
            assert time.perf_counter() - t < 1.0 and not graph.value
            assert "14.6 TiB" in api.last_error()
            assert api.onnxReleaseBackend(backend) == Status.SUCCESS
    finally:
        for i in ids[: n.value]:
            api.onnxReleaseBackendID(i)


RSS_PROBE = textwrap.dedent("""
    import resource, subprocess, sys, time
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    from glowpy.cli import main
    import glowpy, onnx, numpy  # imports are not what we measure
    after_import = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t = time.process_time()  # CPU time: a loaded machine does not stretch it
    code = main(sys.argv[1:])
    took = time.process_time() - t
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print("PROBE", code, after_import, peak, took, file=sys.stderr)
""")


def test_cli_run_refuses_the_bomb_in_one_line_without_allocating(tmp_path):
    path = tmp_path / "bomb.onnx"
    path.write_bytes(bomb_model(declare_shapes=False))
    proc = subprocess.run([sys.executable, "-c", RSS_PROBE, "run", str(path), "-b", "cpu", "-n", "1"],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    lines = proc.stderr.splitlines()
    probe = [x for x in lines if x.startswith("PROBE")]
    errors = [x for x in lines if not x.startswith("PROBE")]
    _, code, base_kib, peak_kib, took = probe[0].split()
    assert int(code) == 2
    assert len(errors) == 1 and errors[0].startswith("glowpy run: error: node 'bomb' (ConstantOfShape, opset 13):"), proc.stderr
    assert "14.6 TiB" in errors[0] and "NO_SYSTEM_MEMORY" not in errors[0]
    assert float(took) < 1.0
    assert int(peak_kib) - int(base_kib) < 64 * 1024, (base_kib, peak_kib)  # no tensor was made


def test_max_memory_refuses_a_small_model_then_allows_it(monkeypatch):
    data = small_model()
    x = np.ones((1, 64), np.float32)
    monkeypatch.setenv(limits.ENV, "8K")  # the 16 KiB weight does not fit
    with pytest.raises(MemoryLimitExceeded, match=r"needs 16\.0 KiB, over the memory limit of 8\.0 KiB"):
        glowpy.compile(data, backend="cpu")
    assert glowpy.check(data).status == Status.NO_SYSTEM_MEMORY
    monkeypatch.setenv(limits.ENV, "64M")
    out = glowpy.compile(data, backend="cpu").run({"x": x})
    np.testing.assert_allclose(out["y"], x @ np.arange(64 * 64, dtype=np.float32).reshape(64, 64), rtol=1e-5)


def test_arena_plan_is_checked(monkeypatch):
    from glowpy.backends.cpu.memory import Interval, plan_arena

    ivs = [Interval("a", 3 << 20, 0, 1), Interval("b", 3 << 20, 1, 2)]  # both live at step 1: 6 MiB
    monkeypatch.setenv(limits.ENV, "5M")
    with pytest.raises(MemoryLimitExceeded, match=r"the activation arena needs 6\.0 MiB"):
        plan_arena(ivs)
    monkeypatch.setenv(limits.ENV, "6M")
    assert plan_arena(ivs).size == 6 << 20


def test_cli_bad_limit_is_one_line(tmp_path):
    path = tmp_path / "small.onnx"
    path.write_bytes(small_model())
    proc = subprocess.run([sys.executable, "-m", "glowpy.cli", "check", str(path)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT), limits.ENV: "plenty"})
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == ["glowpy check: error: GLOWPY_MAX_MEMORY='plenty': expected a positive size "
                                        "in bytes or with a unit, like 4G or 512M"], proc.stderr


def test_check_flags_the_bomb_without_declared_shapes():
    """The shape operand is a 4-element int64 initializer: the check reads such tiny integer tensors
    (as the full path does), so the size is known without any declared shape and without allocating."""
    t = time.perf_counter()
    report = glowpy.check(bomb_model(declare_shapes=False), backend="cpu")
    assert time.perf_counter() - t < 1.0
    assert report.status == Status.NO_SYSTEM_MEMORY
    assert report.nodes[0].name == "bomb" and "14.6 TiB" in report.nodes[0].reason
