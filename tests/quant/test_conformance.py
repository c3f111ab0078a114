"""Every onnx node test case of the quantization ops (onnx.backend.test.case.node, as
tools/conformance.py collects them) on the interpreter: each passes (float8 and float4 included), or, for
the `_expanded` function bodies, is refused for another op of the body glowpy lacks."""

from __future__ import annotations

import pytest

import glowpy.importer.quant  # noqa: F401  (the quantization rows of the op table)
from tools.conformance import node_cases, run_case

QUANT_OPS = {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "QLinearConv", "QLinearMatMul",
             "ConvInteger", "MatMulInteger"}

CASES = [c for c in node_cases() if {n.op_type for n in c.model.graph.node} & QUANT_OPS]


def test_every_quantization_op_has_cases():
    ops = {n.op_type for c in CASES for n in c.model.graph.node}
    assert QUANT_OPS <= ops, QUANT_OPS - ops


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_node_case(case):
    verdict, detail = run_case(case, "interpreter")
    if case.name.endswith("_expanded") and verdict != "pass":
        assert verdict == "unsupported" and detail.startswith("UnsupportedOperator"), detail
        refused = detail.split("(", 1)[1].split(")", 1)[0]
        assert refused not in QUANT_OPS, detail
    else:
        assert verdict == "pass", detail
