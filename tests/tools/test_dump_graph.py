"""`glowpy dump -f dot|svg|png`: nodes coloured by op class, fused nodes labelled with what they
absorbed, edges with shapes; rendering through Graphviz when `dot` is installed, and a one-line
error (exit 2) when it is not (tested in every run, with `dot` hidden from PATH)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from glowpy.cli import main
from glowpy.ir.dot import CLASS_COLOURS, op_class
from glowpy.pipeline import optimized_graph

ROOT = Path(__file__).resolve().parents[2]
NO_DOT = "glowpy dump: error: Graphviz 'dot' is not installed: apt-get install graphviz, or use -f dot\n"


@pytest.fixture
def net(tmp_path: Path) -> Path:
    """Conv -> BatchNorm -> + x -> Relu (folds and fuses into one Conv), Conv -> Clip(0, 6), MaxPool, LRN,
    ReduceMean, Flatten, Softmax."""
    rng = np.random.default_rng(0)

    def init(name: str, *shape: int, positive: bool = False) -> onnx.TensorProto:
        a = rng.standard_normal(shape).astype(np.float32)
        return numpy_helper.from_array(np.abs(a) + 0.5 if positive else a, name)

    inits = [init("w1", 3, 3, 3, 3), init("b1", 3), init("g", 3, positive=True), init("beta", 3), init("mu", 3),
             init("var", 3, positive=True), init("w2", 4, 3, 1, 1), init("b2", 4),
             numpy_helper.from_array(np.array(0.0, np.float32), "lo"),
             numpy_helper.from_array(np.array(6.0, np.float32), "hi")]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c1", "g", "beta", "mu", "var"], ["bn"], name="bn1"),
        helper.make_node("Add", ["bn", "x"], ["sum"], name="add1"),
        helper.make_node("Relu", ["sum"], ["r"], name="relu1"),
        helper.make_node("Conv", ["r", "w2", "b2"], ["c2"], name="conv2"),
        helper.make_node("Clip", ["c2", "lo", "hi"], ["clip"], name="clip2"),
        helper.make_node("MaxPool", ["clip"], ["p"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("LRN", ["p"], ["n"], name="lrn", size=3),
        helper.make_node("ReduceMean", ["n"], ["m"], name="mean", axes=[1], keepdims=1),
        helper.make_node("Flatten", ["m"], ["f"], name="flat"),
        helper.make_node("Softmax", ["f"], ["y"], name="soft"),
    ]
    graph = helper.make_graph(nodes, "net", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])], inits)
    path = tmp_path / "net.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    return path


def _dot(args: list[str], capsys) -> str:
    assert main(["dump", *args, "-f", "dot"]) == 0
    return capsys.readouterr().out


def _nodes(dot: str) -> dict[str, dict[str, str]]:
    """DOT node statements: {id: {attribute: value}}."""
    out = {}
    for m in re.finditer(r'^  "([^"]+)" \[(.*)\];$', dot, re.M):
        out[m.group(1)] = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2)))
    return out


def test_op_classes_come_from_the_registry() -> None:
    expected = {"Conv": "conv/matmul", "FullyConnected": "conv/matmul", "MatMul": "conv/matmul",
                "Gemm": "conv/matmul", "ConvTranspose": "conv/matmul", "Relu": "elementwise/activation",
                "Add": "elementwise/activation", "Where": "elementwise/activation",
                "Softmax": "elementwise/activation", "BatchNormalization": "normalization",
                "LayerNormalization": "normalization", "MaxPool": "pooling", "GlobalAveragePool": "pooling",
                "Reshape": "data movement/shape", "Concat": "data movement/shape", "Gather": "data movement/shape",
                "ReduceMean": "reduction", "ArgMax": "reduction", "NoSuchOp": "other"}
    assert {op: op_class(op) for op in expected} == expected


def test_dot_colours_absorbed_and_shapes(net: Path, capsys) -> None:
    graph = optimized_graph(str(net), "cpu")
    dot = _dot([str(net)], capsys)
    nodes = _nodes(dot)
    ir = {f"node:{n.name}": n for n in graph.nodes}
    assert set(ir) == {k for k in nodes if k.startswith("node:")}
    for key, n in ir.items():
        assert nodes[key]["fillcolor"] == CLASS_COLOURS[op_class(n.op)], key
        assert nodes[key]["label"].split("\\n")[0].split()[0] == n.op
    labels = sorted(nodes[k]["label"] for k in ir)
    # BatchNorm folded, the residual Add and Relu fused into conv1; Clip(0, 6) into conv2
    assert "Conv 3x3\\n+residual add\\n+relu\\n+2 weights" in labels
    assert "Conv 1x1\\n+clip(0, 6)\\n+2 weights" in labels
    assert "MaxPool 2x2/2" in labels
    assert not any(n.op in ("BatchNormalization", "Add", "Relu", "Clip") for n in graph.nodes)
    colours = {nodes[k]["fillcolor"] for k in ir}
    assert colours == {CLASS_COLOURS[c] for c in ("conv/matmul", "pooling", "normalization", "reduction",
                                                   "data movement/shape", "elementwise/activation")}
    # every edge into a node is labelled with its value's type; the residual operand's edge is dashed
    for n in graph.nodes:
        for i, v in enumerate(n.inputs):
            if v.is_constant:
                continue
            src = f"node:{v.producer.name}" if v.producer else f"in:{v.name}"
            label = f"residual {v.type}" if n.op == "Conv" and i == 3 else str(v.type)
            style = ", style=dashed" if n.op == "Conv" and i == 3 else ""
            assert f'"{src}" -> "node:{n.name}" [label="{label}"{style}];' in dot
    (fused,) = [n for n in graph.nodes if n.op == "Conv" and len(n.inputs) == 4]
    assert f'"in:x" -> "node:{fused.name}" [label="residual f32[1, 3, 8, 8]", style=dashed];' in dot
    assert "<TD BGCOLOR" in dot and "conv/matmul</TD>" in dot and "other</TD>" not in dot  # legend: classes used


def test_dot_before_optimization(net: Path, capsys) -> None:
    nodes = _nodes(_dot([str(net), "--after", "none"], capsys))
    by_label = {a["label"].split("\\n")[0].split()[0]: a["fillcolor"] for k, a in nodes.items() if k.startswith("node:")}
    assert by_label["BatchNormalization"] == by_label["LRN"] == CLASS_COLOURS["normalization"]
    assert by_label["Add"] == by_label["Relu"] == by_label["Clip"] == CLASS_COLOURS["elementwise/activation"]
    assert "+relu" not in "".join(a["label"] for a in nodes.values())


def _svg_titles(path: Path) -> list[str]:
    svg = ET.parse(path).getroot()
    ns = {"s": "http://www.w3.org/2000/svg"}
    return [g.find("s:title", ns).text for g in svg.iter("{http://www.w3.org/2000/svg}g") if g.get("class") == "node"]


def test_render_svg_and_png_or_say_dot_is_missing(net: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    if shutil.which("dot") is None:
        assert main(["dump", str(net), "-f", "svg"]) == 2
        assert capsys.readouterr().err == NO_DOT
        assert not (tmp_path / "net.svg").exists()
        return
    graph = optimized_graph(str(net), "cpu")
    assert main(["dump", str(net), "-f", "svg"]) == 0  # default: MODEL's stem in the current directory
    assert capsys.readouterr().out == "net.svg\n"
    titles = _svg_titles(tmp_path / "net.svg")
    node_titles = [t for t in titles if t.startswith("node:")]
    assert sorted(node_titles) == sorted(f"node:{n.name}" for n in graph.nodes)  # one <g class="node"> each
    assert sorted(t for t in titles if not t.startswith("node:")) == ["in:x", "out:y"]
    out = tmp_path / "pic" / "before.png"
    out.parent.mkdir()
    assert main(["dump", str(net), "-f", "png", "--after", "none", "-o", str(out)]) == 0
    assert capsys.readouterr().out == f"{out}\n"
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_dot_missing_is_one_line_exit_2(net: Path, tmp_path: Path) -> None:
    """Whatever this machine has: `dot` hidden from PATH."""
    empty = tmp_path / "empty"
    empty.mkdir()
    env = {**os.environ, "PATH": str(empty), "PYTHONPATH": os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    for fmt in ("svg", "png"):
        proc = subprocess.run([sys.executable, "-m", "glowpy.cli", "dump", str(net), "-f", fmt], capture_output=True,
                              text=True, env=env, cwd=tmp_path, timeout=300)
        assert proc.returncode == 2 and proc.stderr == NO_DOT and proc.stdout == ""
    assert not list(tmp_path.glob("net.svg")) and not list(tmp_path.glob("net.png"))
