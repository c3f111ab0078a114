"""How far glowpy and onnxruntime each are from a float64 reference, on zoo models.

    python tools/zoo/truth.py t5_encoder.torchscript [MODEL.EXPORTER ...]

The zoo test compares glowpy with onnxruntime at rtol 1e-3 / atol 1e-4. Where a deep model misses that by
a few elements, the question is whose rounding it is: this script rewrites the realized model to float64
(every float32 tensor, input, output, value_info, Cast / ConstantOfShape / Constant target) and runs it with
onnxruntime as the reference (glowpy's interpreter, numpy in float64, where onnxruntime has no float64
kernel), then prints each float32 engine's largest error against it and the
fraction of elements outside the zoo tolerance. Where both engines are that far from float64, a looser
per-model tolerance in tests/zoo/harness.py is justified; where only glowpy is, it is a bug.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, numpy_helper

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import glowpy  # noqa: E402
from tests.zoo.harness import ATOL, RTOL, SEED, realized  # noqa: E402
from tests.zoo.realize import make_inputs  # noqa: E402

F32, F64 = TensorProto.FLOAT, TensorProto.DOUBLE


def _tensor64(t: onnx.TensorProto) -> None:
    if t.data_type == F32:
        t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float64), t.name))


def _discrete_cone(g: onnx.GraphProto) -> set[str]:
    """Values that only feed float -> integer casts (T5's relative-position buckets: Log, Div, Floor of
    positions): rounding them in float64 moves bucket boundaries and changes the model, so they stay
    float32, as the model defines them."""
    producer = {o: n for n in g.node for o in n.output}
    ints = {TensorProto.INT64, TensorProto.INT32, TensorProto.INT8, TensorProto.UINT8, TensorProto.BOOL}
    cone: set[str] = set()
    todo = [n.input[0] for n in g.node if n.op_type == "Cast" and
            any(a.name == "to" and a.i in ints for a in n.attribute)]
    while todo:
        v = todo.pop()
        if v in cone or not v:
            continue
        cone.add(v)
        node = producer.get(v)
        if node is not None:
            todo.extend(node.input)
    return cone


def _graph64(g: onnx.GraphProto) -> None:
    keep = _discrete_cone(g)
    for t in g.initializer:
        if t.name not in keep:
            _tensor64(t)
    for vi in (*g.input, *g.output, *g.value_info):
        if vi.type.tensor_type.elem_type == F32 and vi.name not in keep:
            vi.type.tensor_type.elem_type = F64
    for node in g.node:
        if node.output and all(o in keep for o in node.output):
            continue
        for a in node.attribute:
            if a.type == onnx.AttributeProto.TENSOR:
                _tensor64(a.t)
            elif a.type == onnx.AttributeProto.GRAPH:
                _graph64(a.g)
            elif a.name in ("to", "dtype") and a.i == F32:
                a.i = F64


def to_float64(model: onnx.ModelProto) -> onnx.ModelProto:
    m = onnx.ModelProto()
    m.CopyFrom(model)
    _graph64(m.graph)
    return m


def _ort(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.intra_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # no fused f32-only kernels
    s = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return s.run(None, feeds)


def report(name: str) -> str:
    model = realized(name)
    feeds = make_inputs(model, SEED + 1)[0]
    feeds64 = {k: v.astype(np.float64) if v.dtype == np.float32 else v for k, v in feeds.items()}
    model64 = to_float64(model)
    try:
        truth, judge = _ort(model64, feeds64), "onnxruntime"
    except ort.capi.onnxruntime_pybind11_state.NotImplemented:  # no float64 kernel (Conv): numpy's
        truth, judge = list(glowpy.compile(model64, backend="interpreter").run(feeds64).values()), "interpreter"
    engines = {"onnxruntime": _ort(model, feeds),
               "glowpy": list(glowpy.compile(model, backend="cpu").run(feeds).values())}
    lines = [f"{name} (float64 reference: {judge})"]
    for engine, outs in engines.items():
        for i, (got, want) in enumerate(zip(outs, truth)):
            if want.dtype != np.float64:
                continue
            err = np.abs(got.astype(np.float64) - want)
            outside = np.mean(err > ATOL + RTOL * np.abs(want))
            lines.append(f"  {engine:12s} output {i}: max abs error {err.max():.2e}, "
                         f"{outside:.2e} of elements outside rtol {RTOL} / atol {ATOL}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    for name in argv:
        print(report(name), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
