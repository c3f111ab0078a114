"""SiLU as written by the exporters (Mul(x, Sigmoid(x))) into a fused Swish epilogue of x's producer."""

from __future__ import annotations

from typing import TYPE_CHECKING

from glowpy.ir.graph import Graph, Node
from glowpy.optimizer.rewrite import ACTIVATION_CARRIERS, is_graph_output, rebuild

if TYPE_CHECKING:
    from glowpy.backends.base import Backend


def _silu_mul(graph: Graph, sig: Node) -> Node | None:
    """The Mul of `sig`'s input by `sig`'s output, when that Mul is the Sigmoid's only user."""
    s = sig.outputs[0]
    if len(s.users) != 1 or is_graph_output(graph, s):
        return None
    mul = s.users[0]
    if mul.op != "Mul" or len(mul.inputs) != 2:
        return None
    other = mul.inputs[1] if mul.inputs[0] is s else mul.inputs[0]
    if other is not sig.inputs[0] or mul.outputs[0].type != other.type:
        return None
    return mul


def fuse_swish(graph: Graph, backend: Backend | None = None) -> bool:
    """Mul(x, Sigmoid(x)) (either operand order) with x = Conv / Gemm / MatMul / FullyConnected output
    without an epilogue, used by nothing else -> that producer with activation 'swish' (alpha 1), where
    the backend supports the epilogue. The sigmoid is then computed in the producer's registers instead
    of two passes over memory."""
    changed = False
    for sig in list(graph.nodes):
        if sig.op != "Sigmoid":
            continue
        x = sig.inputs[0]
        p = x.producer
        if p is None or p.op not in ACTIVATION_CARRIERS or p.attrs["activation"] != "none":
            continue
        mul = _silu_mul(graph, sig)
        if mul is None or is_graph_output(graph, x) or {id(u) for u in x.users} != {id(sig), id(mul)}:
            continue
        if backend is not None and not backend.supports_fused_activation(p, "swish"):
            continue
        rebuild(graph, p, attrs={**p.attrs, "activation": "swish", "activation_params": (1.0,)}, replaces=mul)
        graph.remove_node(sig)
        graph.remove_node(p)
        changed = True
    return changed
