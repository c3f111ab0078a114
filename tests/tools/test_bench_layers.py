"""tools/bench_layers: onnxruntime's profiled nodes matched to glowpy's steps (by node name, through a
renamed node's output value, and from a fused node back to its step), and the table on a small model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tools import bench_layers


def _block(path: Path) -> Path:
    """Conv -> Relu -> Conv -> Add(residual) -> Relu on 32 channels: the fused conv blocks of a ResNet."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((32, 32, 3, 3)) * 0.05).astype(np.float32), n)
             for n in ("w1", "w2")]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c2", "x"], ["s"], name="add"),
             helper.make_node("Relu", ["s"], ["y"], name="relu2")]
    graph = helper.make_graph(nodes, "block", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32, 16, 16])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    return path


def test_step_node_names_drop_the_fusion_suffix() -> None:
    assert bench_layers.step_node_names("/conv1/Conv.19 (Conv)") == ["/conv1/Conv"]
    assert bench_layers.step_node_names("a.2 (Conv), b (Relu)") == ["a", "b"]


def test_match_by_name_by_output_value_and_through_fused_nodes(tmp_path: Path) -> None:
    graph = onnx.load(str(_block(tmp_path / "block.onnx"))).graph
    steps = [["conv1"], ["conv2"]]  # glowpy fused each Relu and the Add into a conv step
    names = ["conv1", "relu1", "r1_nchwc", "y_nchwc", "add", "ReorderInput", "s_nchwc"]
    assert bench_layers.match(graph, steps, names) == {
        "conv1": 0, "relu1": 0, "r1_nchwc": 0, "y_nchwc": 1, "add": 1, "s_nchwc": 1}


def test_report_on_a_small_model(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = _block(tmp_path / "block.onnx")
    assert bench_layers.main([str(path), "--threads", "1", "--runs", "3"]) == 0
    out = capsys.readouterr().out
    head, rows = out.splitlines()[0], [r for r in out.splitlines() if r.startswith("| ") and "Conv" in r]
    assert "1 thread(s)" in head and "onnxruntime nodes" in head
    assert len(rows) >= 1
    for row in rows:  # every conv step has a matched onnxruntime time
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert float(cells[2]) > 0 and cells[3] != "-" and float(cells[3]) > 0, row
