"""Profile-guided quantization, as Glow's `-dump-profile` / `-load-profile`.

    ranges = profile(model, calibration)            # run the float model, record per-tensor ranges
    qdq = quantize(model, calibration)              # ... and write a QDQ model (an onnx.ModelProto)
    save_profile(ranges, "p.json"); quantize(model, ranges=load_profile("p.json"))   # in two steps

`profile` runs the float model on glowpy (the interpreter by default: the graph as imported, nothing
fused away) with the activations to quantize exposed as extra graph outputs, and records each one's
range over the calibration set: min / max, the `percentile` of its histogram, the entropy threshold
(least KL divergence between the observed and the quantized distribution), or the least expected
squared quantization error ('mse'); the last three take a second pass, a histogram over the range the
first found.

`quantize` rewrites the ONNX model in QDQ form, the format onnxruntime's `quantize_static` writes and
runs, so that glowpy's QDQ rewrites (optimizer/quant.py) find integer ops in it: every float input and
output of a Conv, MatMul or Gemm (the output after a Relu / Clip that alone consumes it), the operands
and output of an Add of two activations and of a GlobalAveragePool go through QuantizeLinear ->
DequantizeLinear with per-tensor parameters from their range (uint8 or int8, asymmetric, the range
widened to include 0; the output of MaxPool / Flatten / Reshape / Transpose / Squeeze / Unsqueeze takes
its input's, so the pair around it folds away). Every weight (an initializer in the weight position) is
stored as int8, symmetric, per output channel (axis 0 of a Conv weight, the N axis of a MatMul / Gemm
weight), and every Conv / Gemm bias as int32 with scale x_scale * w_scale, each behind a
DequantizeLinear. Per-axis DequantizeLinear needs opset 13: older models are converted to opset 13 first.

Calibration data is an .npz file (or a mapping) with one array per model input: either one batch of
the input's shape, or a stack of S batches, shape (S, *input_shape).
"""

from __future__ import annotations

import json
import os
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import ModelProto, helper, numpy_helper

from glowpy.errors import (
    InternalError,
    InvalidModel,
    InvalidName,
    InvalidShape,
    MismatchingDatatype,
    MismatchingShape,
    UnidentifiedName,
    UnsupportedAttribute,
    UnsupportedVersion,
)
from glowpy.importer import read_model
from glowpy.importer.onnx_import import declared_type
from glowpy.ir.ops import get_op

METHODS = ("minmax", "percentile", "entropy", "mse")
WEIGHT_RANGES = ("max", "mse")
ACTIVATION_TYPES = {"uint8": np.dtype(np.uint8), "int8": np.dtype(np.int8)}
TARGET_OPS = ("Conv", "MatMul", "Gemm")
ACTIVATION_OPS = ("Relu", "Clip")  # after a target op: quantized at their output, the integer op applies them
DATA_MOVEMENT_OPS = ("MaxPool", "Flatten", "Reshape", "Transpose", "Squeeze", "Unsqueeze")
QDQ_OPSET = 13  # per-axis DequantizeLinear
HISTOGRAM_BINS = 2048
CLIP_CANDIDATES = 128  # the scale-downs of the observed range the 'mse' methods compare: k / 128, k = 1..128

Calibration = str | os.PathLike | Mapping[str, np.ndarray]


@dataclass(frozen=True)
class Range:
    """The range of values a tensor takes over the calibration set."""

    min: float
    max: float


# --- calibration data ------------------------------------------------------------------------------


def _runtime_inputs(model: ModelProto) -> dict[str, tuple[np.dtype | None, list | None]]:
    inits = {t.name for t in model.graph.initializer}
    return {i.name: declared_type(i) for i in model.graph.input if i.name not in inits}


def _fits(shape: tuple[int, ...], dims: list | None) -> bool:
    """Does `shape` match declared dims (symbolic and unknown dims match anything)?"""
    if dims is None:
        return True
    return len(shape) == len(dims) and all(not isinstance(d, int) or d <= 0 or d == s for d, s in zip(dims, shape))


def _read_npz(path: Path) -> dict[str, np.ndarray]:
    expected = "an .npz archive of one array per model input"
    if not path.is_file():
        raise InvalidModel(f"calibration file '{path}' does not exist", expected=expected)
    try:
        data = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:
        raise InvalidModel(f"calibration file '{path}' is not an .npz archive ({e})", expected=expected) from None
    if not isinstance(data, np.lib.npyio.NpzFile):
        raise InvalidModel(f"calibration file '{path}' is not an .npz archive", expected=expected,
                           found=f"one .npy array of shape {list(np.shape(data))}")
    try:
        return {k: data[k] for k in data.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        raise InvalidModel(f"calibration file '{path}' cannot be read ({e})", expected=expected) from None
    finally:
        data.close()


def calibration_batches(model: ModelProto, calibration: Calibration) -> list[dict[str, np.ndarray]]:
    """The calibration set as a list of feeds, checked against the model's inputs: one line naming
    what is wrong (a missing or unknown input, a wrong shape or element type) otherwise."""
    data = dict(calibration) if isinstance(calibration, Mapping) else _read_npz(Path(calibration))
    inputs = _runtime_inputs(model)
    missing = [n for n in inputs if n not in data]
    if missing:
        raise UnidentifiedName(f"calibration data has no array for model input(s) {missing}",
                               expected=sorted(inputs), found=sorted(data))
    unknown = sorted(set(data) - set(inputs))
    if unknown:
        raise InvalidName(f"calibration data names no model input: {unknown}", expected=sorted(inputs), found=unknown)
    stacks: dict[str, np.ndarray] = {}
    for name, (dtype, dims) in inputs.items():
        arr = np.asarray(data[name])
        if dtype is not None and arr.dtype != dtype:
            raise MismatchingDatatype(f"calibration array '{name}' has the wrong element type", expected=str(dtype),
                                      found=str(arr.dtype))
        if dims is not None and arr.ndim == len(dims) and _fits(arr.shape, dims):
            arr = arr[None]
        elif not (dims is None or arr.ndim == len(dims) + 1 and _fits(arr.shape[1:], dims)):
            shown = "[" + ", ".join(str(d) if isinstance(d, int) and d > 0 else "?" for d in dims) + "]"
            raise MismatchingShape(f"calibration array '{name}' has the wrong shape", expected=f"{shown} or "
                                   f"[samples, {shown[1:-1]}]", found=list(arr.shape))
        if arr.shape[0] == 0:
            raise InvalidShape(f"calibration array '{name}' holds no samples", found=list(arr.shape))
        stacks[name] = arr
    counts = {n: a.shape[0] for n, a in stacks.items()}
    if len(set(counts.values())) > 1:
        raise MismatchingShape("calibration arrays hold different numbers of samples", found=counts)
    count = next(iter(counts.values()), 1)
    return [{n: np.ascontiguousarray(a[i]) for n, a in stacks.items()} for i in range(count)]


# --- what gets quantized ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Use:
    node: int  # index in graph.node
    input: int  # operand position
    # the output-channel axis if the operand is a weight (-1: a weight quantized per tensor), None if an activation
    weight_axis: int | None


def _uses(model: ModelProto) -> list[_Use]:
    """The float operands of Conv / MatMul / Gemm nodes to put behind Q/DQ."""
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    out = []
    for i, node in enumerate(g.node):
        if node.op_type not in TARGET_OPS or node.domain not in ("", "ai.onnx"):
            continue
        for pos in (0, 1):
            if pos >= len(node.input) or not node.input[pos]:
                continue
            name = node.input[pos]
            init = inits.get(name)
            if init is not None and init.data_type != onnx.TensorProto.FLOAT:
                continue
            axis = None
            if init is not None and pos == 0:
                axis = -1  # a constant first operand: a weight, per tensor
            elif init is not None:
                rank = len(init.dims)
                if node.op_type == "Conv":
                    axis = 0
                elif node.op_type == "Gemm":
                    trans = next((a.i for a in node.attribute if a.name == "transB"), 0)
                    axis = 0 if trans else 1
                else:
                    axis = rank - 1 if rank >= 2 else -1  # -1: a vector weight, per tensor
            out.append(_Use(i, pos, axis))
    return out


def _activations(model: ModelProto, uses: list[_Use], residual: bool = True) -> tuple[list[str], dict[str, str]]:
    """The activations to put behind Q/DQ, and for some the tensor whose range they take.

    The float operands of Conv / MatMul / Gemm, and what makes their integer forms apply: the op's output
    (after a sole Relu / Clip consumer, which the integer op's requantization takes in), both operands and
    the output of an Add of two activations (QLinearAdd; with `residual` False the Add and the outputs
    feeding it stay float), the input and output of GlobalAveragePool. The output of a data-movement op
    whose input is quantized takes the input's range (the Q/DQ pair around it then folds away exactly)."""
    g = model.graph
    inits = {t.name for t in g.initializer}
    graph_outputs = {o.name for o in g.output}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in g.node:
        for x in node.input:
            consumers.setdefault(x, []).append(node)
    names: list[str] = []

    def add(t: str) -> None:
        if t and t not in inits and t not in names:
            names.append(t)

    for u in uses:
        if u.weight_axis is None:
            add(g.node[u.node].input[u.input])

    def output(t: str) -> None:
        users = consumers.get(t, [])
        if len(users) == 1 and users[0].op_type in ACTIVATION_OPS and t not in graph_outputs:
            t = users[0].output[0]
        float_users = [n for n in consumers.get(t, []) if n.op_type == "Add" and not residual]
        if t not in graph_outputs and consumers.get(t) and not float_users:
            add(t)

    for node in g.node:
        if node.domain not in ("", "ai.onnx"):
            continue
        if node.op_type in TARGET_OPS:
            output(node.output[0])
        elif node.op_type == "Add" and residual and len(node.input) == 2 and not set(node.input) & inits:
            add(node.input[0])
            add(node.input[1])
            output(node.output[0])
        elif node.op_type == "GlobalAveragePool":
            add(node.input[0])
            output(node.output[0])
    shared: dict[str, str] = {}
    for node in reversed(g.node):
        if node.op_type in DATA_MOVEMENT_OPS and node.domain in ("", "ai.onnx") and node.output[0] in names:
            add(node.input[0])
            shared[node.output[0]] = node.input[0]
    return names, shared


def _range_source(shared: Mapping[str, str], t: str) -> str:
    while t in shared:
        t = shared[t]
    return t


# --- profiling -------------------------------------------------------------------------------------


def _with_outputs(model: ModelProto, names: list[str]) -> ModelProto:
    out = ModelProto()
    out.CopyFrom(model)
    present = {o.name for o in out.graph.output} | {i.name for i in out.graph.input}
    out.graph.output.extend(helper.make_empty_tensor_value_info(n) for n in names if n not in present)
    return out


def profile(model: Any, calibration: Calibration, *, method: str = "minmax", percentile: float = 99.99,
            backend: str = "interpreter", tensors: list[str] | None = None) -> dict[str, Range]:
    """Run the float model on every calibration batch; the range of each tensor in `tensors` (default:
    the activations `quantize` puts behind Q/DQ). `method` is 'minmax', 'mse' (see `_mse_range`), 'percentile' (the
    `percentile` and 100 - `percentile` points of each tensor's histogram) or 'entropy'."""
    from glowpy.pipeline import compile_model

    if method not in METHODS:
        raise UnsupportedAttribute("unknown calibration method", expected=list(METHODS), found=method)
    if not 50.0 < percentile <= 100.0:
        raise UnsupportedAttribute("percentile out of range", expected="50 < percentile <= 100", found=percentile)
    proto, _ = read_model(model)
    batches = calibration_batches(proto, calibration)
    if tensors is None:
        names, shared = _activations(proto, _uses(proto))
        names = [n for n in names if n not in shared]
    else:
        names = list(tensors)
    shapes = {n: a.shape for n, a in batches[0].items()}
    # The interpreter runs the graph as imported (the oracle); another backend runs it optimized.
    compiled = compile_model(_with_outputs(proto, names), backend, shapes, optimize=backend != "interpreter")

    def observed():
        for feeds in batches:
            outs = compiled.run(feeds)
            yield {n: (feeds[n] if n in feeds else outs[n]) for n in names}

    lo = dict.fromkeys(names, np.inf)
    hi = dict.fromkeys(names, -np.inf)
    for values in observed():
        for n, v in values.items():
            if v.size:
                lo[n], hi[n] = min(lo[n], float(v.min())), max(hi[n], float(v.max()))
    ranges = {n: Range(lo[n], hi[n]) for n in names}
    if method == "minmax":
        return ranges
    # Second pass: a histogram per tensor, over its range (percentile; mse, without the exact zeros) or
    # over |x| (entropy).
    spans = {n: (0.0, max(abs(r.min), abs(r.max))) if method == "entropy" else (r.min, r.max)
             for n, r in ranges.items()}
    hist = {n: np.zeros(HISTOGRAM_BINS, np.int64) for n in names}
    for values in observed():
        for n, v in values.items():
            if spans[n][1] > spans[n][0]:
                v = np.abs(v) if method == "entropy" else v[v != 0] if method == "mse" else v
                hist[n] += np.histogram(v, HISTOGRAM_BINS, spans[n])[0]
    if method == "percentile":
        return {n: _percentile_range(ranges[n], hist[n], percentile) for n in names}
    if method == "mse":
        return {n: _mse_range(ranges[n], hist[n]) for n in names}
    return {n: _entropy_range(ranges[n], hist[n]) for n in names}


def _mse_range(full: Range, hist: np.ndarray) -> Range:
    """The observed range (widened to 0) scaled by the a in (0, 1] that minimizes the expected squared
    error of quantizing the histogram's values (over `full`, exact zeros left out: 0 is exact at every
    range) to 256 levels: step^2 / 12 for a value inside the range (rounding), its distance to the
    bound squared beyond it (clipping)."""
    lo, hi = min(full.min, 0.0), max(full.max, 0.0)
    if hist.sum() == 0 or full.max <= full.min:
        return full
    edges = np.linspace(full.min, full.max, len(hist) + 1)
    centers = (edges[:-1] + edges[1:]) / 2
    a = np.arange(1, CLIP_CANDIDATES + 1) / CLIP_CANDIDATES
    los, his = (a * lo)[:, None], (a * hi)[:, None]
    under, over = np.minimum(centers - los, 0.0), np.maximum(centers - his, 0.0)
    rounding = np.where((under == 0) & (over == 0), ((his - los) / 255) ** 2 / 12, 0.0)
    best = a[int(np.argmin((under**2 + over**2 + rounding) @ hist))]
    return Range(max(full.min, best * lo), min(full.max, best * hi))


def _percentile_range(full: Range, hist: np.ndarray, percentile: float) -> Range:
    """The [100 - p, p] percentile points of a histogram over `full` (bin edges, never beyond full)."""
    total = hist.sum()
    if total == 0 or full.max <= full.min:
        return full
    edges = np.linspace(full.min, full.max, len(hist) + 1)
    cdf = np.cumsum(hist) / total
    tail = 1.0 - percentile / 100.0
    lo_bin = int(np.searchsorted(cdf, tail, side="right"))
    hi_bin = int(np.searchsorted(cdf, 1.0 - tail, side="left"))
    return Range(float(edges[min(lo_bin, len(hist) - 1)]), float(edges[min(hi_bin + 1, len(hist))]))


def _entropy_range(full: Range, hist: np.ndarray) -> Range:
    """The range clipped at the threshold t on |x| whose quantized distribution is closest to the
    observed one (least KL divergence, TensorRT's calibration): values beyond t fold into the last
    bin, the bins below t merge into as many levels as the range gets (256 one-sided, 128 a side
    otherwise). `hist` is over [0, max|x|]."""
    amax = max(abs(full.min), abs(full.max))
    levels = 256 if full.min >= 0 else 128
    hist = hist.copy()
    # The first bin holds the exact zeros of ReLU outputs and padding: exact at any threshold, and a spike
    # that would otherwise decide the divergence alone (clipping a ReLU output to a fraction of its range).
    hist[0] = 0
    total = hist.sum()
    if total == 0 or amax == 0 or len(hist) <= levels:
        return full
    best, best_i = np.inf, len(hist)
    for i in range(levels, len(hist) + 1):
        p = hist[:i].astype(np.float64)
        p[-1] += hist[i:].sum()
        # the first i bins merged into `levels` groups, each group's mass spread over its nonzero bins
        groups = np.minimum(np.arange(i) * levels // i, levels - 1)
        nonzero = hist[:i] > 0
        mass = np.bincount(groups, weights=hist[:i], minlength=levels)
        count = np.bincount(groups, weights=nonzero, minlength=levels)
        q = np.where(nonzero, mass[groups] / np.maximum(count[groups], 1), 0.0)
        keep = p > 0
        qk = np.maximum(q[keep], 1e-12)
        kl = float(np.sum(p[keep] / p.sum() * np.log((p[keep] / p.sum()) / (qk / q.sum()))))
        if kl < best:
            best, best_i = kl, i
    t = amax * best_i / len(hist)
    return Range(max(full.min, -t), min(full.max, t))


# --- profiles on disk (Glow's -dump-profile / -load-profile) -----------------------------------------

PROFILE_FORMAT = "glowpy-profile-1"


def save_profile(ranges: Mapping[str, Range], path: str | os.PathLike) -> None:
    """Write profiled ranges as JSON: {"format": ..., "tensors": {name: {"min": .., "max": ..}}}."""
    doc = {"format": PROFILE_FORMAT, "tensors": {n: {"min": r.min, "max": r.max} for n, r in ranges.items()}}
    try:
        Path(path).write_text(json.dumps(doc, indent=1) + "\n")
    except OSError as e:
        raise InvalidName(f"cannot write profile '{path}': {e.strerror}") from None


def load_profile(path: str | os.PathLike) -> dict[str, Range]:
    """Ranges written by `save_profile`; one line naming what is wrong with the file otherwise."""
    p = Path(path)
    if not p.is_file():
        raise InvalidModel(f"profile '{p}' does not exist")
    try:
        doc = json.loads(p.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InvalidModel(f"profile '{p}' is not JSON ({e})", expected=f"a {PROFILE_FORMAT} file") from None
    if not isinstance(doc, dict) or doc.get("format") != PROFILE_FORMAT or not isinstance(doc.get("tensors"), dict):
        raise InvalidModel(f"profile '{p}' is not a glowpy profile", expected=f"format {PROFILE_FORMAT!r}",
                           found=doc.get("format") if isinstance(doc, dict) else type(doc).__name__)
    ranges = {}
    for name, r in doc["tensors"].items():
        ok = isinstance(r, dict) and all(isinstance(r.get(k), (int, float)) for k in ("min", "max"))
        if not ok or not r["min"] <= r["max"]:
            raise InvalidModel(f"profile '{p}': tensor '{name}' has no valid range", expected="{min <= max}",
                               found=r)
        ranges[name] = Range(float(r["min"]), float(r["max"]))
    return ranges


# --- quantization parameters -----------------------------------------------------------------------


def activation_params(r: Range, dtype: np.dtype) -> tuple[np.float32, np.ndarray]:
    """Asymmetric per-tensor (scale, zero point) for a range, widened to include 0 so that 0 (padding,
    ReLU's floor) is exact."""
    info = np.iinfo(dtype)
    lo, hi = min(r.min, 0.0), max(r.max, 0.0)
    if not np.isfinite(lo) or not np.isfinite(hi):
        raise InvalidModel("a profiled tensor has no finite range", expected="finite values", found=(r.min, r.max))
    scale = np.float32((hi - lo) / (int(info.max) - int(info.min))) if hi > lo else np.float32(1.0)
    zp = np.clip(np.rint(info.min - lo / float(scale)), info.min, info.max)
    return scale, np.array(zp, dtype=dtype)


def weight_params(w: np.ndarray, axis: int | None, clip: str = "max") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Symmetric int8 (range -127..127) weights: (quantized, scales, zero points), per channel along
    `axis` (None: per tensor). `clip` 'max' maps each channel's max |w| to 127; 'mse' the fraction k / 128
    of it (k = 1..128) that minimizes the channel's squared rounding and clipping error. An all-zero
    channel gets scale 1."""
    if clip not in WEIGHT_RANGES:
        raise UnsupportedAttribute("unknown weight range", expected=list(WEIGHT_RANGES), found=clip)
    rows = w.reshape(1, -1) if axis is None else np.moveaxis(w, axis, 0).reshape(w.shape[axis], -1)
    amax = np.abs(rows).max(axis=1) if w.size else np.zeros(len(rows), w.dtype)
    if clip == "mse" and w.size:
        best, best_err = amax.astype(np.float64), np.full(len(rows), np.inf)
        r64 = rows.astype(np.float64)
        for k in range(CLIP_CANDIDATES, 0, -1):
            t = amax.astype(np.float64) * (k / CLIP_CANDIDATES)
            s = np.where(t > 0, t / 127.0, 1.0)[:, None]
            err = ((np.clip(np.rint(r64 / s), -127, 127) * s - r64) ** 2).sum(axis=1)
            better = err < best_err
            best, best_err = np.where(better, t, best), np.where(better, err, best_err)
        amax = best
    scale = np.where(amax > 0, amax / 127.0, 1.0).astype(np.float32)
    if axis is None:
        scale = scale.reshape(())
    zp = np.zeros(scale.shape, np.int8)
    q = get_op("QuantizeLinear").compute({"axis": 0 if axis is None else axis, "block_size": 0,
                                          "dtype": np.dtype(np.int8), "precision": None}, w, scale, zp)
    return q, scale, zp


# --- the QDQ rewrite -------------------------------------------------------------------------------


class _Names:
    """Fresh tensor and node names that collide with nothing in the model."""

    def __init__(self, model: ModelProto) -> None:
        g = model.graph
        self.taken = {t.name for t in g.initializer} | {i.name for i in g.input} | {o.name for o in g.output}
        for n in g.node:
            self.taken.update(n.output)
            self.taken.update(n.input)
            self.taken.add(n.name)

    def __call__(self, base: str) -> str:
        name, k = base, 1
        while name in self.taken:
            k += 1
            name = f"{base}_{k}"
        self.taken.add(name)
        return name


def _opset13(model: ModelProto) -> ModelProto:
    version = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    if version is None or version >= QDQ_OPSET:
        return model
    from onnx import version_converter

    try:
        converted = version_converter.convert_version(model, QDQ_OPSET)
    except Exception as e:  # noqa: BLE001  (onnx raises several types; any means "cannot upgrade")
        raise UnsupportedVersion(f"the model's opset {version} cannot be converted to opset {QDQ_OPSET}, which "
                                 f"per-channel DequantizeLinear needs: {e}", expected=f">= {QDQ_OPSET}",
                                 found=version) from None
    # opset 13 belongs to IR version 7, which no longer lists initializers among the graph inputs
    converted.ir_version = max(converted.ir_version, 7)
    return converted


def _int32_bias(node: onnx.NodeProto, inits: Mapping[str, onnx.TensorProto], act_scale: Mapping[str, np.float32],
                w_scale: Mapping[str, np.ndarray], names: _Names) -> tuple[list[onnx.TensorProto], onnx.NodeProto] | None:
    """The float bias of a Conv / Gemm whose operands are quantized as int32 with scale x_scale * w_scale
    and zero point 0 behind a DequantizeLinear, the form QLinearConv / QLinearMatMul take a bias in; None
    for another node, a bias of another shape, or one that does not fit int32."""
    if node.op_type not in ("Conv", "Gemm") or len(node.input) < 3 or node.input[2] not in inits:
        return None
    x, w, b = node.input[0], node.input[1], inits[node.input[2]]
    if x not in act_scale or w not in w_scale or b.data_type != onnx.TensorProto.FLOAT or len(b.dims) != 1:
        return None
    bias = numpy_helper.to_array(b)
    scale = (act_scale[x] * w_scale[w]).astype(np.float32)
    if scale.size not in (1, bias.size) or not np.all(scale > 0):
        return None
    q = np.rint(bias.astype(np.float64) / np.broadcast_to(scale, bias.shape).astype(np.float64))
    if np.abs(q).max(initial=0) > np.iinfo(np.int32).max:
        return None
    src = node.input[2]
    params = [numpy_helper.from_array(q.astype(np.int32), names(f"{src}_quantized")),
              numpy_helper.from_array(scale, names(f"{src}_scale")),
              numpy_helper.from_array(np.zeros(scale.shape, np.int32), names(f"{src}_zero_point"))]
    attrs = {"axis": 0} if scale.ndim else {}
    dq = helper.make_node("DequantizeLinear", [p.name for p in params], [names(f"{src}_dequantized")],
                          name=names(f"{src}_DequantizeLinear"), **attrs)
    return params, dq


def quantize(model: Any, calibration: Calibration | None = None, *, ranges: Mapping[str, Range] | None = None,
             method: str = "minmax", percentile: float = 99.99, activations: str = "uint8",
             per_channel: bool = True, weight_range: str = "max", residual: bool = True,
             backend: str = "interpreter") -> ModelProto:
    """The QDQ model of `model` (bytes, a path or a ModelProto), calibrated on `calibration` (an .npz path
    or {input: array}) or on precomputed `ranges` (from `profile`). `activations` is 'uint8' or 'int8';
    `weight_range` is 'max' or 'mse' (see `weight_params`); `residual` False keeps Adds of two activations (residual connections) and the outputs feeding them in
    float (more accurate, but those producers then run float convolutions)."""
    if activations not in ACTIVATION_TYPES:
        raise UnsupportedAttribute("unknown activation type", expected=sorted(ACTIVATION_TYPES), found=activations)
    if weight_range not in WEIGHT_RANGES:
        raise UnsupportedAttribute("unknown weight range", expected=list(WEIGHT_RANGES), found=weight_range)
    act_dtype = ACTIVATION_TYPES[activations]
    proto, _ = read_model(model)
    if ranges is None:
        if calibration is None:
            raise InvalidName("quantize needs calibration data or profiled ranges", expected="calibration or ranges",
                              found="neither")
        ranges = profile(proto, calibration, method=method, percentile=percentile, backend=backend)
    out = ModelProto()
    out.CopyFrom(proto)
    out = _opset13(out)
    g = out.graph
    uses = _uses(out)
    tensors, shared = _activations(out, uses, residual)
    missing = [n for n in tensors if _range_source(shared, n) not in ranges]
    if missing:
        raise UnidentifiedName(f"no profiled range for tensor(s) {missing[:5]}", expected="a range per activation",
                               found=sorted(ranges)[:5])
    names = _Names(out)
    inits = {t.name: t for t in g.initializer}
    producer = {o: i for i, n in enumerate(g.node) for o in n.output}
    after: dict[int, list[onnx.NodeProto]] = {}  # nodes to insert after node i (-1: before every node)
    new_inits: list[onnx.TensorProto] = []
    act_scale: dict[str, np.float32] = {}
    dequantized: dict[str, str] = {}
    for t in tensors:
        scale, zp = activation_params(ranges[_range_source(shared, t)], act_dtype)
        params = [numpy_helper.from_array(np.asarray(scale, np.float32), names(f"{t}_scale")),
                  numpy_helper.from_array(zp, names(f"{t}_zero_point"))]
        q, dq = names(f"{t}_quantized"), names(f"{t}_dequantized")
        after.setdefault(producer.get(t, -1), []).extend([
            helper.make_node("QuantizeLinear", [t, params[0].name, params[1].name], [q],
                             name=names(f"{t}_QuantizeLinear")),
            helper.make_node("DequantizeLinear", [q, params[0].name, params[1].name], [dq],
                             name=names(f"{t}_DequantizeLinear"))])
        new_inits += params
        act_scale[t], dequantized[t] = scale, dq
    weights: dict[tuple[str, int | None], str] = {}
    w_scale: dict[str, np.ndarray] = {}  # dequantized weight -> its scales
    for u in uses:
        node = g.node[u.node]
        src = node.input[u.input]
        if u.weight_axis is None:
            continue
        key = (src, u.weight_axis)
        if key not in weights:
            w = numpy_helper.to_array(inits[src])
            axis = u.weight_axis if per_channel and u.weight_axis >= 0 else None
            qw, scale, zp = weight_params(w, axis, weight_range)
            params = [numpy_helper.from_array(qw, names(f"{src}_quantized")),
                      numpy_helper.from_array(scale, names(f"{src}_scale")),
                      numpy_helper.from_array(zp, names(f"{src}_zero_point"))]
            dq = names(f"{src}_dequantized")
            attrs = {"axis": axis} if axis is not None else {}
            after.setdefault(-1, []).append(helper.make_node("DequantizeLinear", [p.name for p in params], [dq],
                                                             name=names(f"{src}_DequantizeLinear"), **attrs))
            new_inits += params
            weights[key], w_scale[dq] = dq, scale
        node.input[u.input] = weights[key]
    for node in g.node:
        bias = _int32_bias(node, inits, act_scale, w_scale, names)
        if bias is not None:
            new_inits += bias[0]
            after.setdefault(-1, []).append(bias[1])
            node.input[2] = bias[1].output[0]
        if node.op_type == "Add" and not residual:
            continue
        for k, x in enumerate(node.input):
            if x in dequantized:
                node.input[k] = dequantized[x]
    order = list(after.get(-1, []))
    for i, node in enumerate(g.node):
        order.append(node)
        order += after.get(i, [])
    del g.node[:]
    g.node.extend(order)
    used = {x for n in g.node for x in n.input} | {o.name for o in g.output}
    kept = [t for t in g.initializer if t.name in used]
    del g.initializer[:]
    g.initializer.extend(kept + new_inits)
    # Initializers listed among the inputs stay there while used, unless only IR version 3's rule put
    # them there (the model was upgraded): onnxruntime does not treat a listed initializer as a constant.
    legacy = proto.ir_version < 4
    graph_inputs = [i for i in g.input if i.name not in inits or (i.name in used and not legacy)]
    del g.input[:]
    g.input.extend(graph_inputs)
    try:
        onnx.checker.check_model(out)
    except onnx.checker.ValidationError as e:
        raise InternalError(f"the QDQ model glowpy wrote is not valid ONNX: {e}") from None
    return out


__all__ = ["METHODS", "Range", "activation_params", "calibration_batches", "load_profile", "profile", "quantize",
           "save_profile", "weight_params"]
