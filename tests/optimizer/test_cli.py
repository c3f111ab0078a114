"""`glowpy dump` and `glowpy run --no-opt`."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from glowpy.cli import main
from glowpy.models import LIGHT_MODELS


def _tiny(tmp_path) -> str:
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Identity", ["m"], ["i"]),
             helper.make_node("Relu", ["i"], ["y"])]
    graph = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])], [w])
    path = tmp_path / "tiny.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    return str(path)


@pytest.mark.parametrize("name", LIGHT_MODELS)
def test_dump_stats_on_light_models(name: str, capsys: pytest.CaptureFixture) -> None:
    assert main(["dump", name, "--stats", "--verify"]) == 0
    out = capsys.readouterr().out
    total = next(line for line in out.splitlines() if line.startswith("total"))
    before, after = map(int, total.split()[1:])
    assert after < before
    assert "fold_batchnorm" in out and "optimizer" in out


def test_dump_text_dot_and_after(tmp_path, capsys: pytest.CaptureFixture) -> None:
    path = _tiny(tmp_path)
    assert main(["dump", path]) == 0
    text = capsys.readouterr().out
    assert text.startswith("graph tiny(") and "MatMul" in text and "activation='relu'" in text
    assert "Identity" not in text and "%y:" in text
    assert main(["dump", path, "--after", "none"]) == 0
    assert "Identity" in capsys.readouterr().out
    assert main(["dump", path, "--after", "remove_noops"]) == 0
    out = capsys.readouterr().out
    assert "Identity" not in out and "Relu(" in out
    assert main(["dump", path, "--format", "dot", "--after", "all"]) == 0
    dot = capsys.readouterr().out
    assert dot.startswith("digraph") and "+relu" in dot
    assert main(["dump", path, "--after", "none", "--stats"]) == 0
    total = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("total"))
    assert total.split()[1:] == ["3", "3"]


def test_dump_errors_are_one_line_exit_2(tmp_path, capsys: pytest.CaptureFixture) -> None:
    assert main(["dump", str(tmp_path / "missing.onnx")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "missing.onnx" in err
    assert main(["dump", _tiny(tmp_path), "--after", "bogus"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "fold_batchnorm" in err


def test_run_no_opt(tmp_path, capsys: pytest.CaptureFixture) -> None:
    path = _tiny(tmp_path)
    results = []
    for flags in ([], ["--no-opt"]):
        out_file = tmp_path / f"out{len(results)}.npz"
        assert main(["run", path, "-n", "1", "-o", str(out_file), *flags]) == 0
        results.append(np.load(out_file)["y"])
    np.testing.assert_allclose(results[0], results[1], rtol=1e-6)
    assert "latency" in capsys.readouterr().out
