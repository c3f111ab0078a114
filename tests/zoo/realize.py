"""Realize a zoo skeleton: fill its dropped weights with seeded values at sane scales, then calibrate.

A skeleton (tools/zoo/skeleton.py) is an exported model whose float payloads were dropped: each such
tensor keeps name, dtype and dims and carries `doc_string == DROPPED`. `realize(skeleton, seed)` gives each
a value drawn for its role, found from the op that reads it (through reshapes, transposes and casts):

- Conv / ConvTranspose / MatMul / Gemm weights: normal, std sqrt(gain / fan_in) (He for convs, gain 1 else);
- LSTM / GRU / RNN weights and biases: uniform(-1/sqrt(hidden), 1/sqrt(hidden)), torch's own init;
- normalization scales and multiplicative operands: 1 + small noise; biases and additive operands: small;
- embedding tables (Gather data) and other tensors: normal, std 0.02 / 0.05;
- divisors: uniform(0.5, 1.5), never near zero.

Then `calibrate` runs onnxruntime on a seeded input with the calibrated quantities exposed and sets, for
every BatchNormalization with realized statistics, mean and var to its input's batch statistics, and for
every Conv with a realized bias (exporters fold eval-mode BatchNorm into the Conv before it) its weight and
bias so that each output channel has mean 0 and variance 1: the calibration a folded BatchNorm would have
had. The upstream values change as each point is calibrated, so it iterates until every point is stable.
Deterministic for a seed. Depends only on onnx, numpy and onnxruntime.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

SKELETON_DIR = Path(__file__).with_name("skeletons")
DROPPED = "glowpy-zoo: payload dropped"
INPUTS_KEY = "glowpy_zoo.inputs"  # model metadata: JSON {input name: feed rule} (see make_inputs)

# Ops whose output is the weight reshaped, retyped or reordered: the role is decided past them.
_PASS_THROUGH = {"Identity", "Cast", "CastLike", "Transpose", "Reshape", "Unsqueeze", "Squeeze", "Flatten",
                 "Expand", "Tile", "Slice", "Split"}  # and Concat, at any input
_NORMS = {"BatchNormalization", "LayerNormalization", "InstanceNormalization", "GroupNormalization",
          "SimplifiedLayerNormalization", "RMSNormalization"}
_RECURRENT = {"LSTM", "GRU", "RNN"}
_FLOAT_TYPES = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.BFLOAT16)
MIN_CHANNEL_ELEMENTS = 16  # a Conv output channel with fewer elements (1x1 squeeze-excite) is not normalized


def iter_graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """`graph` and every subgraph (If branches, Loop and Scan bodies), depth first."""
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from iter_graphs(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    yield from iter_graphs(sub)


def load(model: onnx.ModelProto | str | Path) -> onnx.ModelProto:
    if isinstance(model, onnx.ModelProto):
        return onnx.ModelProto.FromString(model.SerializeToString())
    return onnx.load(str(model))


def dropped_tensors(model: onnx.ModelProto) -> Iterator[tuple[str, TensorProto]]:
    """(value name, tensor) for every tensor whose payload the skeleton dropped: initializers and Constants."""
    for graph in iter_graphs(model.graph):
        for t in graph.initializer:
            if t.doc_string == DROPPED:
                yield t.name, t
        for node in graph.node:
            if node.op_type == "Constant":
                for attr in node.attribute:
                    if attr.name == "value" and attr.t.doc_string == DROPPED:
                        yield node.output[0], attr.t


# ---------------------------------------------------------------------------------------------- roles


class _Graphs:
    """Consumers and inferred shapes of every value, across the model's graphs."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.consumers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
        for graph in iter_graphs(model.graph):
            for node in graph.node:
                for i, name in enumerate(node.input):
                    self.consumers.setdefault(name, []).append((node, i))
        self.shapes: dict[str, tuple[int, ...]] = {}
        try:
            inferred = onnx.shape_inference.infer_shapes(model).graph
        except Exception:  # noqa: BLE001  (roles fall back to the tensor's own dims)
            inferred = model.graph
        for vi in (*inferred.value_info, *inferred.input, *inferred.output):
            dims = vi.type.tensor_type.shape.dim
            if vi.type.tensor_type.HasField("shape") and all(d.HasField("dim_value") for d in dims):
                self.shapes[vi.name] = tuple(d.dim_value for d in dims)

    def role(self, name: str, shape: tuple[int, ...], depth: int = 0) -> tuple[str, float, tuple[int, ...]]:
        """(role, hidden size or 0, the weight's shape where the deciding op reads it)."""
        for node, idx in self.consumers.get(name, []):
            op = node.op_type
            if ((op in _PASS_THROUGH and idx == 0) or op == "Concat") and depth < 8:
                out = node.output[0]
                found = self.role(out, self.shapes.get(out, shape), depth + 1)
                if found[0] != "other":
                    return found
            elif op in ("Conv", "ConvTranspose"):
                return ("conv_w" if idx == 1 else "bias", 0, shape)
            elif op in ("MatMul", "Gemm"):
                if idx == 2:
                    return ("bias", 0, shape)
                attrs = {a.name: a.i for a in node.attribute}
                trans = attrs.get("transB" if idx == 1 else "transA", 0)
                return ("matmul_b" if (idx == 1) != bool(trans) else "matmul_a", 0, shape)
            elif op in _RECURRENT:
                hidden = next((a.i for a in node.attribute if a.name == "hidden_size"), 0)
                if 1 <= idx <= 3 and hidden:
                    return ("recurrent", hidden, shape)
            elif op in _NORMS:
                if op == "BatchNormalization" and idx in (3, 4):
                    return ("bn_mean" if idx == 3 else "bn_var", 0, shape)
                return ("norm_scale" if idx == 1 else "bias", 0, shape)
            elif op == "Gather" and idx == 0:
                return ("embedding", 0, shape)
            elif op == "Mul":
                return ("scale", 0, shape)
            elif op in ("Add", "Sub"):
                return ("bias", 0, shape)
            elif op == "Div":
                return ("divisor" if idx == 1 else "other", 0, shape)
            elif op == "PRelu" and idx == 1:
                return ("slope", 0, shape)
        return ("other", 0, shape)


def _normal(rng: np.random.Generator, shape: tuple[int, ...], mean: float, std: float) -> np.ndarray:
    x = rng.standard_normal(shape, dtype=np.float32)  # float32 draws: half the time of float64 on 100M weights
    x *= np.float32(std)
    x += np.float32(mean)
    return x


def _uniform(rng: np.random.Generator, shape: tuple[int, ...], low: float, high: float) -> np.ndarray:
    x = rng.random(shape, dtype=np.float32)
    x *= np.float32(high - low)
    x += np.float32(low)
    return x


def _values(role: str, hidden: float, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """float32 values for a tensor of `role` (see the module docstring), `shape` as its reader sees it."""
    if role in ("conv_w", "matmul_a", "matmul_b"):
        if role == "conv_w":
            fan_in, gain = int(np.prod(shape[1:])), 2.0
        else:
            fan_in, gain = (shape[-2] if role == "matmul_b" else shape[-1]) if shape else 1, 1.0
        return _normal(rng, shape, 0.0, np.sqrt(gain / max(fan_in, 1)))
    if role == "recurrent":
        bound = 1.0 / np.sqrt(hidden)
        return _uniform(rng, shape, -bound, bound)
    if role in ("norm_scale", "scale", "bn_var"):
        return _normal(rng, shape, 1.0, 0.1)
    if role == "bn_mean":
        return np.zeros(shape, np.float32)
    if role == "divisor":
        return _uniform(rng, shape, 0.5, 1.5)
    if role == "slope":
        return _uniform(rng, shape, 0.0, 0.25)
    return _normal(rng, shape, 0.0, 0.02 if role == "embedding" else 0.05)


def _fill(tensor: TensorProto, values: np.ndarray) -> None:
    tensor.CopyFrom(numpy_helper.from_array(values, tensor.name))


def draw(skeleton: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded values, by role, for every tensor the skeleton dropped (integer ones are zeros)."""
    graphs = _Graphs(skeleton)
    rng = np.random.default_rng(seed)
    values = {}
    for name, tensor in dropped_tensors(skeleton):
        shape = tuple(int(d) for d in tensor.dims)
        dtype = helper.tensor_dtype_to_np_dtype(tensor.data_type)
        if tensor.data_type not in _FLOAT_TYPES:
            values[name] = np.zeros(shape, dtype)
            continue
        role, hidden, seen = graphs.role(name, shape)
        if int(np.prod(seen, dtype=np.int64)) != int(np.prod(shape, dtype=np.int64)):
            seen = shape  # an Expand or Tile on the way changed the element count: draw at the own shape
        values[name] = _values(role, hidden, seen, rng).astype(dtype, copy=False).reshape(shape)
    return values


def fill(skeleton: onnx.ModelProto, values: dict[str, np.ndarray]) -> onnx.ModelProto:
    """`skeleton` (changed in place) with every dropped tensor set from `values`."""
    for name, tensor in list(dropped_tensors(skeleton)):
        _fill(tensor, values[name])
    return skeleton


def realize(skeleton: onnx.ModelProto | str | Path, seed: int = 0, calibrate_stats: bool = True) -> onnx.ModelProto:
    """A runnable model from a skeleton: dropped tensors get seeded values (`draw`), calibrated (`calibrate`,
    unless off) on the seeded input `make_inputs(model, seed + 1)[0]`."""
    model = load(skeleton)
    values = draw(model, seed)
    if calibrate_stats:
        calibrate(model, values, seed + 1)
    return fill(model, values)


# ---------------------------------------------------------------------------------------------- inputs


def make_inputs(model: onnx.ModelProto, seed: int = 1) -> list[dict[str, np.ndarray]]:
    """Seeded feeds for `model` by the rules in its metadata (INPUTS_KEY); one feed per flag value.

    Rules: "normal" (standard normal), "randint:LO:HI" (integers in [LO, HI)), "padmask:K" (ones, the last
    K positions 0: an attention mask with padding), "flag" (a bool scalar: one feed with True, one with False)."""
    rules = json.loads({p.key: p.value for p in model.metadata_props}.get(INPUTS_KEY, "{}"))
    rng = np.random.default_rng(seed)
    inits = {t.name for t in model.graph.initializer}
    feeds: dict[str, np.ndarray] = {}
    flags = []
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        dtype = helper.tensor_dtype_to_np_dtype(tt.elem_type)
        shape = tuple(d.dim_value for d in tt.shape.dim)
        rule, *args = rules.get(vi.name, "normal").split(":")
        if rule == "normal":
            feeds[vi.name] = rng.standard_normal(shape).astype(dtype)
        elif rule == "randint":
            feeds[vi.name] = rng.integers(int(args[0]), int(args[1]), shape).astype(dtype)
        elif rule == "padmask":
            mask = np.ones(shape, dtype)
            mask[..., shape[-1] - int(args[0]):] = 0
            feeds[vi.name] = mask
        elif rule == "flag":
            flags.append(vi.name)
        else:
            raise ValueError(f"input '{vi.name}': unknown feed rule '{rules[vi.name]}'")
    if not flags:
        return [feeds]
    return [{**feeds, **{f: np.array(value, np.bool_).reshape(_shape(model, f)) for f in flags}}
            for value in (True, False)]


def _shape(model: onnx.ModelProto, name: str) -> tuple[int, ...]:
    vi = next(v for v in model.graph.input if v.name == name)
    return tuple(d.dim_value for d in vi.type.tensor_type.shape.dim)


# ---------------------------------------------------------------------------------------------- calibration


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1  # one thread: the same sums in the same order every run
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


VAR_FLOOR = 1e-3  # added to every calibrated variance: a near-dead channel is not amplified a thousandfold


def _opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)


class _Probe:
    """The model rewritten so that each calibration point normalizes with its own batch statistics, computed
    in the graph, and exposes them as outputs: one forward pass calibrates every point in topological order
    (each sees its inputs already calibrated), which is what BatchNorm calibration layer by layer gives."""

    def __init__(self, skeleton: onnx.ModelProto, values: dict[str, np.ndarray]) -> None:
        """A copy of `skeleton` (small: no weight data) whose dropped main-graph initializers are inputs,
        fed from `values` (`self.feeds`), and whose other dropped tensors are filled from them."""
        self.model = load(skeleton)
        self.opset = _opset(skeleton)
        self.nodes: list[onnx.NodeProto] = []
        self.outputs: list[str] = []
        self._n = 0
        g = self.model.graph
        self.feeds = {t.name: values[t.name] for t in g.initializer if t.doc_string == DROPPED}
        kept = [t for t in g.initializer if t.name not in self.feeds]
        del g.initializer[:]
        g.initializer.extend(kept)
        g.input.extend(helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
                       for name, v in self.feeds.items())
        fill(self.model, values)

    def _name(self, stem: str) -> str:
        self._n += 1
        return f"glowpy_zoo_calibrate_{self._n}_{stem}"

    def _node(self, op: str, inputs: list[str], **attrs) -> str:
        out = self._name(op.lower())
        self.nodes.append(helper.make_node(op, inputs, [out], **attrs))
        return out

    def _mean(self, x: str, rank: int, keepdims: int) -> str:
        axes = [0, *range(2, rank)]
        if self.opset >= 18:
            axes_name = self._name("axes")
            self.model.graph.initializer.append(numpy_helper.from_array(np.array(axes, np.int64), axes_name))
            return self._node("ReduceMean", [x, axes_name], keepdims=keepdims)
        return self._node("ReduceMean", [x], axes=axes, keepdims=keepdims)

    def _constant(self, value: float) -> str:
        name = self._name("const")
        self.model.graph.initializer.append(numpy_helper.from_array(np.array(value, np.float32), name))
        return name

    def statistics(self, x: str, rank: int) -> tuple[str, str, str]:
        """(per-channel mean [C], variance + VAR_FLOOR [C], x normalized by them) of x, channels on axis 1;
        the two statistics become outputs of the probe."""
        centered = self._node("Sub", [x, self._mean(x, rank, 1)])
        square = self._node("Mul", [centered, centered])
        floor = self._constant(VAR_FLOOR)
        normalized = self._node("Div", [centered, self._node("Sqrt", [
            self._node("Add", [self._mean(square, rank, 1), floor])])])
        mean, var = self._mean(x, rank, 0), self._node("Add", [self._mean(square, rank, 0), floor])
        self.outputs += [mean, var]
        return mean, var, normalized

    def take(self) -> list[onnx.NodeProto]:
        """The nodes made since the last call, in the order they compute."""
        made, self.nodes = self.nodes, []
        return made

    def session(self, nodes: list[onnx.NodeProto]) -> ort.InferenceSession:
        g = self.model.graph
        del g.node[:]
        g.node.extend(nodes)
        onnx_outputs = {o.name for o in g.output}
        for name in self.outputs:
            if name not in onnx_outputs:
                g.output.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))
        return _session(self.model)


def calibrate(skeleton: onnx.ModelProto, values: dict[str, np.ndarray], seed: int = 1) -> int:
    """Calibrate the drawn `values` of `skeleton`'s dropped tensors in place (see the module docstring):
    BatchNormalization statistics and Conv weights that are main-graph initializers, on the seeded input
    `make_inputs(skeleton, seed)[0]`. Returns the number of points calibrated. A Conv output channel with
    fewer than MIN_CHANNEL_ELEMENTS elements (squeeze-excite convs on 1x1) keeps its drawn weights."""
    shapes = _Graphs(skeleton).shapes
    probe = _Probe(skeleton, values)
    fed = probe.feeds
    bns, convs, nodes = [], [], []
    for node in probe.model.graph.node:
        ins = list(node.input) + [""] * 5
        out = node.output[0]
        if node.op_type == "BatchNormalization" and ins[3] in fed and ins[4] in fed:
            mean, var, _ = probe.statistics(ins[0], len(shapes.get(ins[0], (0,) * 4)))
            node.input[3], node.input[4] = mean, var
            bns.append((ins[3], ins[4], mean, var))
            nodes += [*probe.take(), node]
        elif (node.op_type == "Conv" and ins[1] in fed and ins[2] in fed and out in shapes
              and int(np.prod(shapes[out][2:], dtype=np.int64)) >= MIN_CHANNEL_ELEMENTS):
            node.output[0] = raw = probe._name("conv")
            mean, var, normalized = probe.statistics(raw, len(shapes[out]))
            probe.nodes.append(helper.make_node("Identity", [normalized], [out]))
            convs.append((ins[1], ins[2], mean, var))
            nodes += [node, *probe.take()]
        else:
            nodes.append(node)
    if not bns and not convs:
        return 0
    session = probe.session(nodes)
    stats = dict(zip(probe.outputs, session.run(probe.outputs, {**make_inputs(skeleton, seed)[0], **fed})))
    for mean_name, var_name, mean, var in bns:
        values[mean_name] = stats[mean].astype(values[mean_name].dtype)
        values[var_name] = stats[var].astype(values[var_name].dtype)
    for w_name, b_name, mean, var in convs:
        w, b = values[w_name], values[b_name]
        std = np.sqrt(stats[var].astype(np.float64))
        shift = stats[mean].astype(np.float64)
        values[w_name] = (w / std.reshape((-1,) + (1,) * (w.ndim - 1))).astype(w.dtype)
        values[b_name] = ((b - shift) / std).astype(b.dtype)
    return len(bns) + len(convs)
