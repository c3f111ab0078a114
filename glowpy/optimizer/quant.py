"""QDQ rewrites: the DequantizeLinear -> float op -> QuantizeLinear patterns of a QDQ model become
integer ops (what onnxruntime does with them too), and Q/DQ pairs around pure data movement vanish.

Only patterns whose integer form is defined by ONNX ops are rewritten: 8-bit activations quantized
per tensor, constant 8-bit weights per tensor or per output channel, an int32 bias dequantized with
exactly x_scale * w_scale and zero point 0 (as quantizers write it). Anything else stays float.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from glowpy.ir.graph import Graph, Node, Value
from glowpy.ir.ops.quant import MATMUL_INT_TYPES, is_scalar
from glowpy.optimizer.rewrite import add_weight, rebuild, replace_node, sole_user, transposed

if TYPE_CHECKING:
    from glowpy.backends.base import Backend

DATA_MOVEMENT = frozenset({"MaxPool", "Reshape", "Transpose", "Squeeze", "Unsqueeze"})
F32 = np.dtype(np.float32)


def _dq(v: Value) -> Node | None:
    """The DequantizeLinear producing `v` (8-bit or int32 input, float32 output, constant parameters,
    not blocked), else None."""
    n = v.producer
    if n is None or n.op != "DequantizeLinear" or n.attrs["block_size"] or v.dtype != F32:
        return None
    return n if n.inputs[1].is_constant and n.inputs[2].is_constant else None


def _per_tensor_dq(v: Value) -> Node | None:
    n = _dq(v)
    ok = n is not None and n.inputs[0].dtype in MATMUL_INT_TYPES and is_scalar(n.inputs[1].type)
    return n if ok and n.inputs[1].dtype == F32 else None


def _weight_dq(v: Value, axis: int) -> Node | None:
    """DequantizeLinear of a constant 8-bit weight, per tensor or per index of `axis`."""
    n = _dq(v)
    if n is None or not n.inputs[0].is_constant or n.inputs[0].dtype not in MATMUL_INT_TYPES:
        return None
    if n.inputs[1].dtype != F32 or not (is_scalar(n.inputs[1].type) or n.attrs["axis"] == axis):
        return None
    return n


def _int_bias(v: Value | None, scale: np.ndarray, channels: int) -> np.ndarray | None:
    """The int32 bias behind `v` when it is DequantizeLinear(int32 constant, scale, 0) with the given
    (per channel) scale bit for bit; None if absent or of another form."""
    n = _dq(v) if v is not None else None
    if n is None or not n.inputs[0].is_constant or n.inputs[0].dtype != np.int32 or n.inputs[0].shape != (channels,):
        return None
    s, z = n.inputs[1].data.reshape(-1), n.inputs[2].data.reshape(-1)
    if np.any(z != 0) or not np.array_equal(np.broadcast_to(s, (channels,)), np.broadcast_to(scale, (channels,))):
        return None
    return n.inputs[0].data


def _quantize_of(graph: Graph, v: Value) -> tuple[Node, bool] | None:
    """The per-tensor 8-bit QuantizeLinear that alone consumes `v`, possibly through a Relu or a
    Clip(0, hi) whose hi the quantization saturates at anyway (then True); None otherwise."""
    user = sole_user(graph, v)
    act = user if user is not None and user.op in ("Relu", "Clip") else None
    if act is not None:
        user = sole_user(graph, act.outputs[0])
    if user is None or user.op != "QuantizeLinear" or user.inputs[0].dtype != F32:
        return None
    s, z = user.inputs[1], user.inputs[2]
    if not (s.is_constant and z.is_constant and is_scalar(s.type) and s.dtype == F32):
        return None
    if z.dtype not in MATMUL_INT_TYPES or user.attrs["precision"] is not None:
        return None
    if act is not None and act.op == "Clip" and not _clip_is_relu(act, user):
        return None
    return user, act is not None


def _clip_is_relu(clip: Node, q: Node) -> bool:
    """Whether QuantizeLinear(Clip(x, 0, hi)) == QuantizeLinear(Relu(x)): hi quantizes to the type's
    maximum (or beyond), so values above it saturate there either way (ReLU6 into a range up to 6)."""
    lo, hi = clip.attrs["min"], clip.attrs["max"]
    scale, zp = q.inputs[1].data.reshape(()), q.inputs[2].data.reshape(())
    return lo == 0 and float(np.rint(np.float32(hi) / scale)) + float(zp) >= np.iinfo(zp.dtype).max


def _param(graph: Graph, base: str, v: Value) -> Value:
    """A per-tensor parameter as rank 0 (the form the integer ops take it in)."""
    return v if v.shape == () else add_weight(graph, base, v.data.reshape(()))


def rewrite_qdq_conv(graph: Graph, backend: Backend | None = None) -> bool:
    """QuantizeLinear([Relu](Conv(DequantizeLinear(x), DequantizeLinear(w), [DequantizeLinear(b)])))
    -> QLinearConv(x, ..., w, ..., b) with `relu`, requantizing in float32 as onnxruntime; w an 8-bit constant per tensor or per output
    channel, b int32 with scale x_scale * w_scale (a missing bias becomes zeros)."""
    changed = False
    for conv in list(graph.nodes):
        if conv.op != "Conv" or conv.attrs["activation"] != "none" or len(conv.inputs) > 3:
            continue
        xdq, wdq = _per_tensor_dq(conv.inputs[0]), _weight_dq(conv.inputs[1], 0)
        found = _quantize_of(graph, conv.outputs[0])
        if xdq is None or wdq is None or found is None:
            continue
        q, relu = found
        w = wdq.inputs[0]
        m = w.shape[0]
        bias_scale = (xdq.inputs[1].data.reshape(()) * wdq.inputs[1].data).astype(np.float32)
        b = np.zeros(m, np.int32) if len(conv.inputs) < 3 else _int_bias(conv.inputs[2], bias_scale, m)
        if b is None:
            continue
        ops = [xdq.inputs[0], _param(graph, conv.name + ".x_scale", xdq.inputs[1]),
               _param(graph, conv.name + ".x_zero_point", xdq.inputs[2]), w, wdq.inputs[1], wdq.inputs[2],
               _param(graph, conv.name + ".y_scale", q.inputs[1]), _param(graph, conv.name + ".y_zero_point", q.inputs[2]),
               add_weight(graph, conv.name + ".bias", b)]
        attrs = {k: conv.attrs[k] for k in ("group", "strides", "pads", "dilations")}
        rebuild(graph, conv, op="QLinearConv", inputs=ops, attrs={**attrs, "relu": relu, "float32": True},
                replaces=q)
        changed = True
    return changed


def rewrite_qdq_matmul(graph: Graph, backend: Backend | None = None) -> bool:
    """QuantizeLinear([Relu]([Add(bias)](MatMul(DequantizeLinear(a), DequantizeLinear(w))))) and the
    same with Gemm (alpha = beta = 1, transA 0, optional transB and bias) -> QLinearMatMul with an int32
    bias, `relu` and float32 requantization; w a 2-D 8-bit constant per tensor or per output column, a per tensor."""
    changed = False
    for mm in list(graph.nodes):
        gemm = mm.op == "Gemm"
        if mm.op not in ("MatMul", "Gemm") or (gemm and (mm.attrs["alpha"] != 1 or mm.attrs["beta"] != 1
                                                         or mm.attrs["transA"])):
            continue
        if mm.attrs.get("activation", "none") != "none":
            continue
        trans = gemm and mm.attrs["transB"]
        adq, wdq = _per_tensor_dq(mm.inputs[0]), _weight_dq(mm.inputs[1], 0 if trans else 1)
        if adq is None or wdq is None or wdq.inputs[0].type.rank != 2:
            continue
        out, bias_v = mm.outputs[0], mm.inputs[2] if gemm and len(mm.inputs) > 2 else None
        user = sole_user(graph, out)
        if bias_v is None and user is not None and user.op == "Add":
            other = user.inputs[1] if user.inputs[0] is out else user.inputs[0]
            if _dq(other) is not None:
                bias_v, out = other, user.outputs[0]
        found = _quantize_of(graph, out)
        if found is None:
            continue
        q, relu = found
        w = wdq.inputs[0].data
        w = transposed(w) if trans else w
        n = w.shape[1]
        bias_scale = (adq.inputs[1].data.reshape(()) * wdq.inputs[1].data).astype(np.float32)
        b = np.zeros(n, np.int32) if bias_v is None else _int_bias(bias_v, bias_scale, n)
        if b is None:
            continue
        name = mm.name
        ops = [adq.inputs[0], _param(graph, name + ".a_scale", adq.inputs[1]),
               _param(graph, name + ".a_zero_point", adq.inputs[2]),
               add_weight(graph, name + ".weight", w) if trans else wdq.inputs[0], wdq.inputs[1], wdq.inputs[2],
               _param(graph, name + ".y_scale", q.inputs[1]), _param(graph, name + ".y_zero_point", q.inputs[2]),
               add_weight(graph, name + ".bias", b)]
        new = graph.add_node("QLinearMatMul", ops, {"relu": relu, "float32": True}, name=name, before=mm)
        replace_node(graph, q, new.outputs, adopt_names=True)  # the float nodes left are dead code now
        changed = True
    return changed


def _same_params(dq: Node, q: Node) -> bool:
    """Whether `q` quantizes with exactly the per-tensor scale, zero point and type `dq` dequantizes with
    (then q(dq(x)) == x)."""
    (s1, z1), (s2, z2) = dq.inputs[1:3], q.inputs[1:3]
    if not all(v.is_constant and is_scalar(v.type) for v in (s1, z1, s2, z2)) or q.attrs["precision"] is not None:
        return False
    return (z1.dtype == z2.dtype and s1.dtype == s2.dtype and s1.data.reshape(()) == s2.data.reshape(())
            and z1.data.reshape(()) == z2.data.reshape(()))


def fold_qdq_data_movement(graph: Graph, backend: Backend | None = None) -> bool:
    """QuantizeLinear(M(DequantizeLinear(x))) with the same per-tensor parameters -> M(x) for M moving
    data only (MaxPool, Reshape, Transpose, Squeeze, Unsqueeze), and Concat when every operand is such
    a DequantizeLinear: exact, since quantization maps each dequantized value back to itself."""
    changed = False
    for q in list(graph.nodes):
        if q.op != "QuantizeLinear":
            continue
        m = q.inputs[0].producer
        if m is None or len(m.outputs) != 1 or sole_user(graph, m.outputs[0]) is not q:
            continue
        if m.op in DATA_MOVEMENT:
            operands = m.inputs[:1]
        elif m.op == "Concat":
            operands = m.inputs
        else:
            continue
        dqs = [_dq(v) for v in operands]
        if not all(d is not None and _same_params(d, q) for d in dqs):
            continue
        rebuild(graph, m, inputs=[d.inputs[0] for d in dqs] + list(m.inputs[len(operands):]), replaces=q)
        changed = True
    return changed


def _relu_saturates(q: Node) -> bool:
    """Whether a Relu before `q` is a no-op: its zero point is its type's minimum, so every negative
    value saturates to quantize(0) anyway (onnxruntime drops such a Relu, then fuses what precedes it)."""
    zp = q.inputs[2]
    return bool(zp.data.reshape(()) == np.iinfo(zp.dtype).min)


def rewrite_qdq_add(graph: Graph, backend: Backend | None = None) -> bool:
    """QuantizeLinear([Relu](Add(DequantizeLinear(a), DequantizeLinear(b)))), all per tensor and 8-bit ->
    QLinearAdd(a, ..., b, ...) (onnxruntime's int8 arithmetic for it). The Relu only where its output's
    zero point is the type's minimum (then it is a no-op); with another Relu the Add stays float, as
    onnxruntime runs it."""
    changed = False
    for add in list(graph.nodes):
        if add.op != "Add":
            continue
        dqs = [_per_tensor_dq(v) for v in add.inputs]
        found = _quantize_of(graph, add.outputs[0])
        if None in dqs or found is None or (found[1] and not _relu_saturates(found[0])):
            continue
        q = found[0]
        name = add.name
        ops = [v for i, d in enumerate(dqs) for v in (d.inputs[0], _param(graph, f"{name}.{'ab'[i]}_scale", d.inputs[1]),
                                                        _param(graph, f"{name}.{'ab'[i]}_zero_point", d.inputs[2]))]
        ops += [_param(graph, name + ".y_scale", q.inputs[1]), _param(graph, name + ".y_zero_point", q.inputs[2])]
        rebuild(graph, add, op="QLinearAdd", inputs=ops, attrs={}, replaces=q)
        changed = True
    return changed


def rewrite_qdq_global_average_pool(graph: Graph, backend: Backend | None = None) -> bool:
    """QuantizeLinear(GlobalAveragePool(DequantizeLinear(x))), per tensor and 8-bit ->
    QLinearGlobalAveragePool(x, ...) (onnxruntime's int8 arithmetic for it)."""
    changed = False
    for gap in list(graph.nodes):
        if gap.op != "GlobalAveragePool":
            continue
        dq, found = _per_tensor_dq(gap.inputs[0]), _quantize_of(graph, gap.outputs[0])
        if dq is None or found is None or found[1]:
            continue
        q, name = found[0], gap.name
        ops = [dq.inputs[0], _param(graph, name + ".x_scale", dq.inputs[1]),
               _param(graph, name + ".x_zero_point", dq.inputs[2]),
               _param(graph, name + ".y_scale", q.inputs[1]), _param(graph, name + ".y_zero_point", q.inputs[2])]
        rebuild(graph, gap, op="QLinearGlobalAveragePool", inputs=ops, attrs={}, replaces=q)
        changed = True
    return changed
