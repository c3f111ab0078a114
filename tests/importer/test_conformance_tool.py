"""tools/conformance.py's counts by op."""

from __future__ import annotations

from types import SimpleNamespace

from onnx import helper

from tools.conformance import by_op_table, case_op


def _case(name: str, *ops: str) -> SimpleNamespace:
    nodes = [helper.make_node(op, ["x"], ["y"]) for op in ops]
    return SimpleNamespace(name=name, model=helper.make_model(helper.make_graph(nodes, "g", [], [])))


def test_case_op_is_the_op_the_case_name_names() -> None:
    assert case_op(_case("test_maxpool_2d_pads", "MaxPool")) == "MaxPool"
    assert case_op(_case("test_max_example", "Max")) == "Max"
    assert case_op(_case("test_hardswish_expanded", "HardSigmoid", "Mul")) == "HardSwish"
    assert case_op(_case("test_unknown_thing", "Relu", "Neg")) == "Neg"


def test_by_op_table_counts_each_verdict_per_op() -> None:
    results = {"a": ("pass", ""), "b": ("unsupported", "x"), "c": ("pass", ""), "d": ("error", "boom")}
    ops = {"a": "Relu", "b": "Relu", "c": "Add", "d": "Relu"}
    header, add, relu = by_op_table(results, ops)
    assert header.split() == ["op", "pass", "unsupported", "mismatch", "error", "total"]
    assert add.split() == ["Add", "1", "0", "0", "0", "1"]
    assert relu.split() == ["Relu", "1", "1", "0", "1", "3"]
