"""Time `glowpy.optimize(graph, backend)` on a large transformer-like graph built directly as IR.

The graph is a stack of encoder blocks the way a TorchScript export spells them: weights
transposed by Transpose nodes, MatMul + Add pairs, Reshape chains, head transposes, Identity and
Dropout leftovers, a scale computed from a constant, LayerNormalization, Softmax, Relu. Every
simplify / fold / fuse pass has work to do on each block, so this measures the passes' cost per
node rather than the cost of an idle sweep.

    python tools/bench_optimizer.py [--blocks 140] [--repeat 3] [--backend cpu]

It uses only the Graph construction API (add_input / add_constant / add_node), so it runs against
any checkout: `PYTHONPATH=/path/to/checkout python tools/bench_optimizer.py`.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import glowpy
from glowpy.ir import Graph, TensorType

SEQ, HIDDEN, HEADS, FF = 16, 32, 4, 64


def _block(g: Graph, x, i: int, rng: np.random.Generator):
    def w(name: str, *shape: int):
        return g.add_constant(f"b{i}.{name}", (rng.standard_normal(shape) * 0.1).astype(np.float32))

    def node(op: str, *inputs, **attrs):
        return g.add_node(op, list(inputs), attrs, name=f"b{i}.{op.lower()}").outputs[0]

    def linear(v, name: str, n_in: int, n_out: int):
        wt = node("Transpose", w(name + ".weight", n_out, n_in), perm=(1, 0))  # folded to a constant
        return node("Add", node("MatMul", v, wt), w(name + ".bias", n_out))

    def heads(v):
        r = node("Reshape", v, shape=(SEQ, HEADS, HIDDEN // HEADS))
        return node("Identity", node("Transpose", r, perm=(1, 0, 2)))

    h = node("LayerNormalization", x, w("ln1.scale", HIDDEN), w("ln1.bias", HIDDEN), axis=-1)
    q, k, v = (heads(linear(h, n, HIDDEN, HIDDEN)) for n in ("q", "k", "v"))
    scores = node("MatMul", q, node("Transpose", k, perm=(0, 2, 1)))
    scale = node("Sqrt", g.add_constant(f"b{i}.dk", np.array(HIDDEN // HEADS, np.float32)))
    probs = node("Dropout", node("Softmax", node("Div", scores, scale), axis=-1))
    ctx = node("Transpose", node("MatMul", probs, v), perm=(1, 0, 2))
    ctx = node("Reshape", node("Reshape", ctx, shape=(SEQ, HEADS * (HIDDEN // HEADS))), shape=(SEQ, HIDDEN))
    x = node("Add", x, linear(ctx, "proj", HIDDEN, HIDDEN))
    h = node("LayerNormalization", x, w("ln2.scale", HIDDEN), w("ln2.bias", HIDDEN), axis=-1)
    h = linear(node("Relu", linear(h, "ff1", HIDDEN, FF)), "ff2", FF, HIDDEN)
    return node("Add", x, node("Dropout", h))


def build(blocks: int) -> Graph:
    rng = np.random.default_rng(0)
    g = Graph("bench_transformer")
    x = g.add_input("x", TensorType(np.float32, (SEQ, HIDDEN)))
    for i in range(blocks):
        x = _block(g, x, i, rng)
    g.outputs = [g.add_node("Softmax", [x], {"axis": -1}, name="head").outputs[0]]
    return g


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--blocks", type=int, default=140, help="encoder blocks (43 nodes each)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--backend", default="cpu")
    args = ap.parse_args()
    graph = build(args.blocks)
    times = []
    for _ in range(args.repeat):
        t = time.perf_counter()
        opt = glowpy.optimize(graph, args.backend, verify=False)
        times.append(time.perf_counter() - t)
    print(f"graph: {len(graph.nodes)} nodes, {len(graph.constants)} constants -> "
          f"{len(opt.nodes)} nodes, {len(opt.constants)} constants after optimize({args.backend!r})")
    print(f"optimize: best {min(times):.3f} s, median {sorted(times)[len(times) // 2]:.3f} s over {len(times)} runs")


if __name__ == "__main__":
    main()
