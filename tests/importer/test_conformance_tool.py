"""tools/conformance.py's counts by op."""

from __future__ import annotations

from types import SimpleNamespace

from onnx import helper

from tools.conformance import by_op_table, by_reason, case_op, reason_of


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


def test_reason_of_drops_what_differs_between_cases_refused_alike() -> None:
    a = ("UnsupportedShape: node 'result' (NonZero): the output shape of NonZero depends on input values (the number "
         "of non-zero elements of X): glowpy compiles static shapes (expected static, found data-dependent)")
    assert reason_of(a) == ("UnsupportedShape: the output shape of <op> depends on input values "
                            "(the number of non-zero elements of X)")
    b = "UnsupportedOperator: node 'Y' (DeformConv): operator DeformConv is not supported"
    c = "UnsupportedOperator: node 'seq' (SplitToSequence, opset 11): operator SplitToSequence is not supported (and 1 more node(s))"
    assert reason_of(b) == reason_of(c) == "UnsupportedOperator: operator <op> is not supported"
    d = "UnsupportedDatatype: node 'y' (DequantizeLinear, opset 28): x: quantization with FLOAT8E5M2 is not implemented (expected [...])"
    assert reason_of(d) == "UnsupportedDatatype: quantization with FLOAT8E5M2 is not implemented"
    e = "UnsupportedShape: graph input 'like' has symbolic dim an unknown dim; bind it with shapes={'like': [...]}"
    assert reason_of(e) == "UnsupportedShape: graph input '…' has symbolic dim an unknown dim"
    assert reason_of("UnsupportedShape: the If branches give output 4 different shapes") == \
        reason_of("UnsupportedShape: the If branches give output 0 different shapes")


def test_by_reason_counts_each_reason_then_lists_its_cases_by_op() -> None:
    refused = "UnsupportedOperator: node 'n' ({op}): operator {op} is not supported"
    results = {"test_a": ("unsupported", refused.format(op="DeformConv")),
               "test_b": ("unsupported", refused.format(op="BitCast")),
               "test_c": ("unsupported", refused.format(op="BitCast")),
               "test_d": ("unsupported", "UnsupportedVersion: default-domain opset not supported (expected 7..28, found 1)"),
               "test_e": ("pass", "")}
    ops = {"test_a": "DeformConv", "test_b": "BitCast", "test_c": "BitCast", "test_d": "Not", "test_e": "Relu"}
    assert by_reason(results, ops, "unsupported") == [
        "unsupported: 4 case(s), 2 reason(s)",
        "    3  UnsupportedOperator: operator <op> is not supported",
        "       BitCast (2): test_b, test_c",
        "       DeformConv (1): test_a",
        "    1  UnsupportedVersion: default-domain opset not supported",
        "       Not (1): test_d",
    ]
