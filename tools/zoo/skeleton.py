"""Turn an exported model into a skeleton: its graph without the float payloads.

A skeleton keeps every node and attribute, every graph input, output and value_info, and for every tensor
(initializer, or the `value` of a Constant node, in subgraphs too) its name, dtype and dims. Values are kept
where they carry meaning rather than trained weights:

- tensors the graph uses as a shape, index, axis or bound (the operands in SHAPE_OPERANDS), whatever their type;
- integer and bool tensors up to MAX_KEPT_BYTES (T5's relative-position buckets are 128 KiB);
- float tensors of at most MAX_KEPT_FLOATS elements (epsilons, scale factors, Clip bounds, Pow exponents);
- float tensors up to MAX_KEPT_BYTES whose elements are all equal (zero initial states, the unit scales
  an exporter adds around InstanceNormalization): a fill, not a trained weight.

Every other tensor loses its data and gets `doc_string = DROPPED`: an initializer with dims and no data,
which onnx.load reads as it is and tests/zoo/realize.py fills with seeded values. Node doc_strings and
metadata (exporter stack traces) are dropped too: they are most of a skeleton's bytes otherwise.

    python tools/zoo/skeleton.py MODEL.onnx SKELETON.onnx
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.zoo.realize import DROPPED, iter_graphs  # noqa: E402

MAX_KEPT_FLOATS = 16
MAX_KEPT_BYTES = 128 * 1024

_REDUCE = ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
           "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare")
# op -> the input positions that decide shapes, index data or act as scalar parameters, not weights.
SHAPE_OPERANDS: dict[str, frozenset[int]] = {
    "Reshape": frozenset({1}), "Expand": frozenset({1}), "Tile": frozenset({1}), "ConstantOfShape": frozenset({0}),
    "Gather": frozenset({1}), "GatherElements": frozenset({1}), "GatherND": frozenset({1}),
    "ScatterND": frozenset({1}), "ScatterElements": frozenset({1}), "Slice": frozenset({1, 2, 3, 4}),
    "Squeeze": frozenset({1}), "Unsqueeze": frozenset({1}), "Split": frozenset({1}), "Pad": frozenset({1, 2, 3}),
    "Resize": frozenset({1, 2, 3}), "Upsample": frozenset({1}), "TopK": frozenset({1}), "Range": frozenset({0, 1, 2}),
    "OneHot": frozenset({1, 2}), "Clip": frozenset({1, 2}), "CumSum": frozenset({1}), "Trilu": frozenset({1}),
    "Where": frozenset({0}), "Pow": frozenset({1}), "Mod": frozenset({1}), "Loop": frozenset({0, 1}),
    "If": frozenset({0}), **{op: frozenset({1}) for op in _REDUCE},
}
_FLOATS = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.BFLOAT16}
_DATA_FIELDS = ("raw_data", "float_data", "int32_data", "int64_data", "double_data", "uint64_data", "string_data")


def _uses(model: onnx.ModelProto) -> dict[str, set[tuple[str, int]]]:
    """value name -> every (op type, input position) that reads it, in any graph of the model."""
    uses: dict[str, set[tuple[str, int]]] = {}
    for graph in iter_graphs(model.graph):
        for node in graph.node:
            for i, name in enumerate(node.input):
                uses.setdefault(name, set()).add((node.op_type, i))
    return uses


def _keeps_values(tensor: TensorProto, uses: set[tuple[str, int]]) -> bool:
    if tensor.doc_string == DROPPED:
        return False
    if any(i in SHAPE_OPERANDS.get(op, ()) for op, i in uses):
        return True
    count = int(np.prod(tensor.dims, dtype=np.int64))
    if count * helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize > MAX_KEPT_BYTES:
        return False
    if tensor.data_type not in _FLOATS or count <= MAX_KEPT_FLOATS:
        return True
    values = numpy_helper.to_array(tensor)
    return bool((values == values.flat[0]).all())


def _drop(tensor: TensorProto) -> None:
    for field in _DATA_FIELDS:
        tensor.ClearField(field)
    tensor.doc_string = DROPPED


def skeletonize(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` with weight payloads dropped (see the module docstring for what is kept)."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    uses = _uses(model)
    for graph in iter_graphs(model.graph):
        for tensor in graph.initializer:
            if tensor.data_location == TensorProto.EXTERNAL:
                raise ValueError(f"initializer '{tensor.name}' has external data: load the model with its data first")
            if not _keeps_values(tensor, uses.get(tensor.name, set())):
                _drop(tensor)
        for node in graph.node:
            node.doc_string = ""
            del node.metadata_props[:]
            if node.op_type == "Constant":
                for attr in node.attribute:
                    if attr.name == "value" and not _keeps_values(attr.t, uses.get(node.output[0], set())):
                        _drop(attr.t)
    return model


def main(argv: list[str] | None = None) -> int:
    src, dst = argv if argv is not None else sys.argv[1:]
    onnx.save(skeletonize(onnx.load(src)), dst)
    return 0


if __name__ == "__main__":
    sys.exit(main())
