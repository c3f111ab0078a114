"""One way to name a model: every subcommand takes a path or a light-model name through the same
argument, and a name that is neither is one line listing the light models (exit 2); `run --threads`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import glowpy
from glowpy.cli import main
from glowpy.models import LIGHT_MODELS, light_model_path

SUBCOMMANDS = ("run", "dump", "check", "bench")
LISTING = ", ".join(LIGHT_MODELS)


@pytest.fixture
def conv_model(tmp_path: Path) -> Path:
    """A 16-channel conv with relu: enough output channels for threads to share."""
    rng = np.random.default_rng(2)
    inits = [numpy_helper.from_array(rng.standard_normal((16, 8, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "b")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["y"])]
    graph = helper.make_graph(nodes, "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 12, 12])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 12, 12])], inits)
    path = tmp_path / "conv.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    return path


def test_run_by_light_model_name(capsys) -> None:
    assert main(["run", "squeezenet", "-n", "1", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert f"model     {light_model_path('squeezenet')}\n" in out and "result    softmaxout_1" in out


def test_dump_by_light_model_name(capsys) -> None:
    assert main(["dump", "squeezenet", "--after", "none"]) == 0
    assert capsys.readouterr().out.startswith("graph squeezenet")


def test_check_by_light_model_name(capsys) -> None:
    assert main(["check", "squeezenet", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["supported"] and report["nodes"]
    assert main(["check", "squeezenet"]) == 0
    assert f"model    {light_model_path('squeezenet')}\n" in capsys.readouterr().out


# bench by a light-model name: tests/tools/test_bench_cli.py::test_light_model_glowpy_only


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_unknown_name_is_one_line_listing_the_light_models(command: str, capsys, tmp_path: Path,
                                                           monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert main([command, "resnet5"]) == 2
    assert capsys.readouterr().err == (f"glowpy {command}: error: model 'resnet5' is neither a file nor a light "
                                       f"model ({LISTING})\n")


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_missing_path_is_the_importers_error(command: str, capsys) -> None:
    """Something that looks like a path (a directory or a suffix) is read as one."""
    assert main([command, "/no/such/model.onnx"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"glowpy {command}: error: ") and err.count("\n") == 1
    assert "'/no/such/model.onnx'" in err and "no such file" in err


def test_a_file_wins_over_a_light_model_name(conv_model: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    (tmp_path / "squeezenet").write_bytes(conv_model.read_bytes())
    monkeypatch.chdir(tmp_path)
    assert main(["dump", "squeezenet", "--after", "none"]) == 0
    assert capsys.readouterr().out.startswith("graph conv(")


def test_run_threads_sets_the_cpu_thread_count(conv_model: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    seen = []
    real = glowpy.compile

    def spy(*args, **kwargs):
        seen.append(kwargs.get("threads"))
        return real(*args, **kwargs)

    monkeypatch.setattr(glowpy, "compile", spy)
    outs = []
    for threads in ("1", "2"):
        out = tmp_path / f"y{threads}.npz"
        assert main(["run", str(conv_model), "-n", "1", "--threads", threads, "-o", str(out)]) == 0
        outs.append(np.load(out)["y"])
    assert main(["run", str(conv_model), "-n", "1"]) == 0
    assert seen == [1, 2, None]  # no --threads: the backend's default
    capsys.readouterr()
    x = np.load(tmp_path / "y1.npz")["y"]
    np.testing.assert_allclose(outs[1], x, rtol=1e-5, atol=1e-5)
    ref = glowpy.compile(str(conv_model), backend="interpreter").run(
        {"x": np.random.default_rng(0).standard_normal((1, 8, 12, 12)).astype(np.float32)})["y"]
    np.testing.assert_allclose(x, ref, rtol=1e-4, atol=1e-4)  # `run`'s input is the seeded one


@pytest.mark.parametrize("threads", ["0", "-1", "two", "1.5", ""])
def test_run_threads_must_be_a_positive_integer(threads: str, conv_model: Path, capsys) -> None:
    assert main(["run", str(conv_model), "--threads", threads]) == 2
    assert capsys.readouterr().err == f"glowpy run: error: --threads {threads}: expected a positive integer\n"


def test_run_threads_needs_a_backend_with_threads(conv_model: Path, capsys) -> None:
    assert main(["run", str(conv_model), "-b", "interpreter", "--threads", "2"]) == 2
    assert capsys.readouterr().err == "glowpy run: error: --threads: the interpreter backend has no thread count\n"
