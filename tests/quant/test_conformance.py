"""Every onnx node test case of the quantization ops (onnx.backend.test.case.node, as
tools/conformance.py collects them) on the interpreter: each passes, or is refused cleanly for an
element type glowpy does not quantize to or from (float8, float4), or,
for the `_expanded` function bodies, for another op of the body glowpy lacks."""

from __future__ import annotations

import pytest
from onnx import TensorProto

import glowpy.importer.quant  # noqa: F401  (the quantization rows of the op table)
from tools.conformance import node_cases, run_case

QUANT_OPS = {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "QLinearConv", "QLinearMatMul",
             "ConvInteger", "MatMulInteger"}
UNREPRESENTED = {TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT8E4M3FNUZ, TensorProto.FLOAT8E5M2,
                 TensorProto.FLOAT8E5M2FNUZ, TensorProto.FLOAT4E2M1}

CASES = [c for c in node_cases() if {n.op_type for n in c.model.graph.node} & QUANT_OPS]


def test_every_quantization_op_has_cases():
    ops = {n.op_type for c in CASES for n in c.model.graph.node}
    assert QUANT_OPS <= ops, QUANT_OPS - ops


def _unrepresented_types(model) -> set[str]:
    types = [v.type.tensor_type.elem_type for v in model.graph.input] + [t.data_type for t in model.graph.initializer]
    return {TensorProto.DataType.Name(t) for t in types if t in UNREPRESENTED}


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_node_case(case):
    verdict, detail = run_case(case, "interpreter")
    lacking = _unrepresented_types(case.model)
    if lacking:
        assert verdict == "unsupported" and detail.startswith("UnsupportedDatatype"), detail
        assert any(t in detail for t in lacking), detail
    elif case.name.endswith("_expanded") and verdict != "pass":
        assert verdict == "unsupported" and detail.startswith("UnsupportedOperator"), detail
        refused = detail.split("(", 1)[1].split(")", 1)[0]
        assert refused not in QUANT_OPS, detail
    else:
        assert verdict == "pass", detail
