"""`glowpy bench`: every figure in the table and in --json, sane and consistent; against onnxruntime
the outputs agree and the ratio is glowpy's p50 over onnxruntime's; bad flags are one line, exit 2."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from glowpy.cli import main

ENGINE_FIELDS = {"compile_seconds", "latency_seconds", "throughput_per_second", "peak_rss_mib", "runs"}
TABLE_ROWS = ("compile", "latency p50", "latency p90", "latency p99", "latency min", "throughput", "peak RSS")


def _mlp(path: Path, batch: int | str = 4) -> Path:
    """A two-layer MLP with random weights: 32 -> 64 -> 10."""
    rng = np.random.default_rng(1)
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32) * 0.3, n)
             for n, s in (("w1", (32, 64)), ("b1", (64,)), ("w2", (64, 10)), ("b2", (10,)))]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["m1"]), helper.make_node("Add", ["m1", "b1"], ["a1"]),
             helper.make_node("Relu", ["a1"], ["r1"]), helper.make_node("MatMul", ["r1", "w2"], ["m2"]),
             helper.make_node("Add", ["m2", "b2"], ["y"])]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 10])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    return path


@pytest.fixture
def mlp(tmp_path: Path) -> Path:
    return _mlp(tmp_path / "mlp.onnx")


def _seconds(text: str) -> float:
    value, unit = text.split()
    return float(value) * {"µs": 1e-6, "ms": 1e-3, "s": 1.0}[unit]


def _check_engine(fig: dict, runs: int) -> None:
    assert ENGINE_FIELDS <= set(fig)
    lat = fig["latency_seconds"]
    assert set(lat) == {"p50", "p90", "p99", "min"}
    assert 0 < lat["min"] <= lat["p50"] <= lat["p90"] <= lat["p99"]
    assert fig["compile_seconds"] > 0 and fig["peak_rss_mib"] > 10
    assert fig["runs"] == runs
    # runs per second of a round is its run count over its total time, so never above 1 / fastest run
    assert 0 < fig["throughput_per_second"] <= 1 / lat["min"]


def test_json_vs_onnxruntime(mlp: Path, capsys) -> None:
    assert main(["bench", str(mlp), "--vs", "onnxruntime", "--threads", "1", "--iterations", "6", "--rounds", "2",
                 "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["model"] == str(mlp) and result["threads"] == 1 and result["backend"] == "cpu"
    assert result["iterations"] == 6 and result["rounds"] == 2
    for engine in ("glowpy", "onnxruntime"):
        _check_engine(result[engine], runs=12)
    glowpy = result["glowpy"]
    # a model cache hit skips the import: 0 s
    assert isinstance(glowpy["cached"], bool) and glowpy["import_seconds"] >= 0 and glowpy["arena_bytes"] >= 0
    assert result["ratio"] == pytest.approx(
        glowpy["latency_seconds"]["p50"] / result["onnxruntime"]["latency_seconds"]["p50"], rel=1e-12)
    assert 0 <= result["max_abs_error"] < 1e-4


def test_table_vs_onnxruntime(mlp: Path, capsys) -> None:
    assert main(["bench", str(mlp), "--vs", "onnxruntime", "-t", "1", "-n", "5", "-r", "1"]) == 0
    out = capsys.readouterr().out
    assert f"model          {mlp}" in out
    assert "cpu backend, 1 thread, 1 round x 5 runs per engine" in out
    lines = out.splitlines()
    assert any(line.split() == ["glowpy", "onnxruntime"] for line in lines)
    rows = {}
    for name in TABLE_ROWS:
        line = next(line for line in lines if line.startswith(name + " "))
        rows[name] = re.split(r"\s{2,}", line[len(name):].strip())
        assert len(rows[name]) == 2, line
    assert re.fullmatch(r"[\d.]+ (µs|ms|s) \((cached|cold)\)", rows["compile"][0])
    for engine in (0, 1):
        p50, p90, p99, lo = (_seconds(rows[f"latency {q}"][engine]) for q in ("p50", "p90", "p99", "min"))
        assert 0 < lo <= p50 <= p90 <= p99
        assert float(rows["throughput"][engine].split()[0]) > 0
        assert float(rows["peak RSS"][engine].split()[0]) > 10
    ratio = re.search(r"^ratio\s+([\d.]+)x  \(glowpy p50 / onnxruntime p50\)$", out, re.M)
    p50s = [_seconds(rows["latency p50"][e]) for e in (0, 1)]
    assert ratio and float(ratio.group(1)) == pytest.approx(p50s[0] / p50s[1], rel=0.02, abs=0.01)
    error = re.search(r"^max abs error\s+(\S+)$", out, re.M)
    assert error and 0 <= float(error.group(1)) < 1e-4


def test_light_model_glowpy_only(capsys) -> None:
    """A light model by name; without --vs only glowpy's figures."""
    assert main(["bench", "squeezenet", "-n", "2", "-r", "1", "--threads", "1", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["model"].endswith("light_squeezenet.onnx")
    _check_engine(result["glowpy"], runs=2)
    assert "onnxruntime" not in result and "ratio" not in result and "max_abs_error" not in result


def test_shape_binding(tmp_path: Path, capsys) -> None:
    """--shape binds a symbolic dim as for `glowpy run`; without it the worker's refusal is one line."""
    path = _mlp(tmp_path / "sym.onnx", batch="N")
    assert main(["bench", str(path), "-s", "N=3", "-n", "2", "-r", "1", "-t", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["shapes"] == {"N": [3]}
    assert main(["bench", str(path), "-n", "2", "-r", "1", "-t", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("glowpy bench: error: ") and "symbolic dim 'N'" in err and err.count("\n") == 1


@pytest.mark.parametrize("args, message", [
    (["--threads", "0"], "--threads 0: expected a positive integer"),
    (["--threads", "two"], "--threads two: expected a positive integer"),
    (["--iterations", "0"], "--iterations 0: expected a positive integer"),
    (["--rounds", "-1"], "--rounds -1: expected a positive integer"),
    (["--vs", "tensorrt"], "--vs tensorrt: the engine to compare with must be one of onnxruntime, openvino"),
    (["--shape", "x=0"], "bad shape '0': dims must be positive integers"),
    (["--shape", "x"], "--shape x: expected NAME=VALUE"),
    (["-b", "interpreter", "--threads", "2"], "--threads: the interpreter backend has no thread count"),
])
def test_bad_flags_one_line_exit_2(args: list[str], message: str, mlp: Path, capsys) -> None:
    assert main(["bench", str(mlp), *args]) == 2
    err = capsys.readouterr().err
    assert err == f"glowpy bench: error: {message}\n"


def test_vs_onnxruntime_not_installed(mlp: Path, capsys, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import onnxruntime now fails
    assert main(["bench", str(mlp), "--vs", "onnxruntime"]) == 2
    err = capsys.readouterr().err
    assert err == "glowpy bench: error: --vs onnxruntime: onnxruntime is not installed (pip install onnxruntime)\n"


@pytest.mark.skipif(not __import__("glowpy.bench").bench.have_engine("openvino"),
                    reason="openvino is not installed (a benchmark peer only)")
def test_json_vs_openvino(mlp: Path, capsys) -> None:
    assert main(["bench", str(mlp), "--vs", "openvino", "-t", "1", "-n", "4", "-r", "1", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    _check_engine(result["openvino"], runs=4)
    assert result["ratios"] == {"openvino": result["ratio"]}
    assert 0 <= result["max_abs_error"] < 1e-4


def test_zoo_table_ratios_and_geometric_mean() -> None:
    """tools/bench_zoo.py's table: a row per model and thread count, refusals named, geometric mean."""
    from tools.bench_zoo import table

    def res(g: float, o: float) -> dict:
        lat = {e: {"latency_seconds": {"p50": t}} for e, t in (("glowpy", g), ("onnxruntime", o))}
        return {**lat, "ratios": {"onnxruntime": g / o}, "max_abs_errors": {"onnxruntime": 1e-6}}

    rows = [{"model": "a.dynamo", "threads": 1, "result": res(0.002, 0.004)},
            {"model": "b.dynamo", "threads": 1, "result": res(0.008, 0.004)},
            {"model": "c.dynamo", "threads": 1, "result": {"error": "node 'x' (Foo): operator Foo is not supported"}}]
    lines = table(rows, ("onnxruntime",)).splitlines()
    assert lines[0] == "| model | threads | glowpy p50 | onnxruntime p50 | ratio vs onnxruntime | max abs error |"
    assert lines[2] == "| a.dynamo | 1 | 2.00 ms | 4.00 ms | 0.50x | 1.0e-06 |"
    assert lines[3].startswith("| b.dynamo | 1 | 8.00 ms | 4.00 ms | 2.00x |")
    assert "operator Foo is not supported" in lines[4]
    assert lines[5] == "| **geometric mean** | 1 |  |  | **1.00x** |  |"


def test_bench_rss_takes_paths_and_zoo_names(tmp_path: Path) -> None:
    """tools/bench_rss: an .onnx argument is a path; a zoo name is its realized file in the work dir
    (made once: an existing one is used as is)."""
    import hashlib

    from tests.zoo.realize import SKELETON_DIR
    from tools.bench_rss import model_path

    assert model_path("some/where.onnx", None) == Path("some/where.onnx")
    name = "resnet50.torchscript"
    digest = hashlib.sha256((SKELETON_DIR / f"{name}.onnx").read_bytes()).hexdigest()[:16]
    made = tmp_path / f"{name}.{digest}.onnx"
    made.write_bytes(b"already realized")
    assert model_path(name, tmp_path) == made
    assert made.read_bytes() == b"already realized"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="VmHWM is read from Linux's /proc")
def test_worker_peak_rss_is_its_own_not_its_parents(mlp: Path, tmp_path: Path) -> None:
    """ru_maxrss carries a parent's high-water mark through fork and exec: a worker started by a process
    holding hundreds of MiB reported them as its own peak (tools/bench.py's RSS column had a ~310 MiB
    floor). The worker reports its own."""
    from glowpy.bench import run_worker

    held = np.ones(40_000_000)  # 305 MiB in this process
    spec = {"engine": "glowpy", "model": str(mlp), "threads": 1, "iterations": 2, "warmup": 0,
            "inputs": str(tmp_path / "in.npz"), "backend": "cpu"}
    peak = run_worker(spec, {"GLOWPY_CACHE_DIR": str(tmp_path / "cache")})["peak_rss_mib"]
    assert 10 < peak < held.nbytes / 2**20 - 50, f"the worker reported {peak:.0f} MiB"
