"""Random-weight versions of onnx's light models, for tests and benchmarks that need real numerics.

The light models onnx ships build every weight with ConstantOfShape (all weights equal), which
makes every class score equal. This replaces each such weight with seeded random values of the
same shape, chosen by role so activations stay in range through 50+ layers: He-scaled conv and
Gemm weights, small biases, BatchNorm scales near 1 and variances strictly positive.

    python tools/prepare_models.py [--out DIR] [--seed N] [NAME ...]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from glowpy.models import LIGHT_MODELS, light_model_path  # noqa: E402

DEFAULT_OUT = ROOT / "models"


def _role(name: str, users: list[tuple[onnx.NodeProto, int]], by_output: dict[str, list]) -> str:
    """How a weight is used: conv_w, fc_w, bn_scale, bn_bias, bn_mean, bn_var, bias or other."""
    for node, idx in users:
        if node.op_type in ("Conv", "ConvTranspose"):
            return "conv_w" if idx == 1 else "bias"
        if node.op_type in ("Gemm", "MatMul"):
            return "fc_w" if idx == 1 else "bias"
        if node.op_type == "BatchNormalization":
            return ("x", "bn_scale", "bn_bias", "bn_mean", "bn_var")[idx]
        if node.op_type in ("Unsqueeze", "Reshape", "Identity"):
            # densenet / inception_v2 unsqueeze BN parameters before a Mul / Add
            inner = _role(node.output[0], by_output.get(node.output[0], []), by_output)
            if inner != "other":
                return inner
    lowered = name.lower()
    if "var" in lowered:
        return "bn_var"
    if "scale" in lowered or lowered.endswith("_s_0") or "bn_s" in lowered:
        return "bn_scale"
    return "other"


def _values(role: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    if role in ("conv_w", "fc_w"):
        fan_in = int(np.prod(shape[1:])) if role == "conv_w" else shape[0]
        return rng.normal(0.0, np.sqrt(2.0 / max(fan_in, 1)), shape)
    if role == "bn_var":
        return rng.uniform(0.5, 1.5, shape)
    if role == "bn_scale":
        return rng.uniform(0.5, 1.5, shape)
    if role == "bn_mean":
        return rng.normal(0.0, 0.1, shape)
    return rng.normal(0.0, 0.05, shape)


def randomize(model: onnx.ModelProto, seed: int = 0) -> onnx.ModelProto:
    """A copy of `model` whose ConstantOfShape weights are seeded random initializers."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    g = model.graph
    rng = np.random.default_rng(seed)
    inits = {t.name: t for t in g.initializer}
    users: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for node in g.node:
        for i, x in enumerate(node.input):
            users.setdefault(x, []).append((node, i))
    keep_nodes, new_inits = [], []
    for node in g.node:
        if node.op_type == "ConstantOfShape" and node.input[0] in inits:
            shape = tuple(int(d) for d in numpy_helper.to_array(inits[node.input[0]]))
            out = node.output[0]
            data = _values(_role(out, users.get(out, []), users), shape, rng).astype(np.float32)
            new_inits.append(numpy_helper.from_array(data, out))
        else:
            keep_nodes.append(node)
    used = {x for n in keep_nodes for x in n.input}
    del g.node[:]
    g.node.extend(keep_nodes)
    kept = [t for t in g.initializer if t.name in used]
    del g.initializer[:]
    g.initializer.extend(kept + new_inits)
    # IR v3 models list initializers among the inputs; keep only real inputs plus surviving weights.
    names = {t.name for t in g.initializer}
    real_inputs = [i for i in g.input if i.name not in inits or i.name in names]
    del g.input[:]
    g.input.extend(real_inputs)
    for t in new_inits:
        if not any(i.name == t.name for i in g.input) and model.ir_version < 4:
            g.input.append(helper.make_tensor_value_info(t.name, onnx.TensorProto.FLOAT, list(t.dims)))
    return model


def calibrate(model: onnx.ModelProto, seed: int = 1) -> onnx.ModelProto:
    """Set every BatchNormalization's mean and variance to the statistics of its actual input on a
    seeded random image, in topological order, so the random network stays normalized end to end
    (without it ResNet-50's logits reach 1e5 and its softmax is one-hot)."""
    import glowpy

    graph = glowpy.load(model)
    inits = {t.name: t for t in model.graph.initializer}
    rng = np.random.default_rng(seed)
    env = {id(v): rng.standard_normal(v.shape).astype(v.dtype) for v in graph.inputs}
    for v in graph.constants.values():
        env[id(v)] = v.data
    for node in graph.nodes:
        args = [env[id(v)] for v in node.inputs]
        if node.op == "BatchNormalization":
            x = args[0].astype(np.float64)
            axes = (0, *range(2, x.ndim))
            mean, var = x.mean(axis=axes), x.var(axis=axes) + 1e-3
            for idx, stat in ((3, mean), (4, var)):
                name = node.inputs[idx].name
                arr = stat.astype(np.float32)
                inits[name].CopyFrom(numpy_helper.from_array(arr, name))
                args[idx] = arr
        for out, res in zip(node.outputs, node.opdef.run(node.attrs, args)):
            env[id(out)] = res
    return model


def prepare(name: str, out_dir: Path = DEFAULT_OUT, seed: int = 0) -> Path:
    """Write `<out_dir>/<name>_random.onnx` (cached: reused when present) and return its path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}_random.onnx"
    if not path.exists():
        model = calibrate(randomize(onnx.load(str(light_model_path(name))), seed), seed + 1)
        tmp = path.with_suffix(f".tmp{np.random.randint(1 << 30)}")
        onnx.save(model, str(tmp))
        tmp.replace(path)  # atomic: parallel test workers may race to write it
    return path


def mlp_model(width: int = 64, layers: int = 4, batch: int = 1, seed: int = 0) -> onnx.ModelProto:
    """A Gemm+Relu MLP with random weights (the small-model benchmark)."""
    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    x = "x"
    for i in range(layers):
        w = rng.normal(0, np.sqrt(2.0 / width), (width, width)).astype(np.float32)
        b = rng.normal(0, 0.05, (width,)).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
        nodes.append(helper.make_node("Gemm", [x, f"w{i}", f"b{i}"], [f"h{i}"], name=f"fc{i}"))
        x = f"h{i}"
        if i < layers - 1:
            nodes.append(helper.make_node("Relu", [x], [f"r{i}"], name=f"relu{i}"))
            x = f"r{i}"
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [batch, width])],
                              [helper.make_tensor_value_info(x, onnx.TensorProto.FLOAT, [batch, width])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", default=list(LIGHT_MODELS), help="light model names (default: all)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output directory (default: %(default)s)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    for name in args.names:
        if name not in LIGHT_MODELS:
            ap.error(f"unknown model '{name}' (choose from {', '.join(LIGHT_MODELS)})")
        print(prepare(name, args.out, args.seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
