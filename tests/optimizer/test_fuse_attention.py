"""fuse_attention (glowpy/optimizer/attention.py): MatMul(Q, KT) [* / scalar] [+ mask] -> Softmax(last
axis) [-> Where(IsNaN(p), 0, p)] -> MatMul(., V) becomes one Attention op, in the forms the exporters
write, and stays as it is where a piece is used elsewhere or the softmax is not over the scores' rows."""

from __future__ import annotations

import numpy as np
import pytest

from glowpy.backends.cpu import CpuBackend
from glowpy.ir import Value
from glowpy.optimizer import fuse_attention

from .util import G, apply, ops

F32 = np.float32


def _attention(scale_op="Mul", scale_first=False, mask="input", mask_first=False, guard=False, axis=-1,
               outputs=(), shape=(1, 2, 6, 8)):
    """The scores chain on Q (b, h, s, d), KT (b, h, d, t), V (b, h, t, d); `outputs` names values to
    also return as graph outputs (a second use)."""
    b, h, s, d = shape
    t = s + 3
    g = G()
    q, kt, v = g.input("q", b, h, s, d), g.input("kt", b, h, d, t), g.input("v", b, h, t, d)
    vals: dict[str, Value] = {"qk": g("MatMul", q, kt)}
    x = vals["qk"]
    if scale_op is not None:
        c = g.const(np.array(0.5 if scale_op == "Mul" else 2.0, F32), "scale")
        x = g(scale_op, *((c, x) if scale_first else (x, c)))
    if mask is not None:
        m = g.input("mask", 1, 1, s, t) if mask == "input" else g.const(np.triu(np.full((s, t), -1e9, F32), 1))
        x = g("Add", *((m, x) if mask_first else (x, m)))
    vals["scores"] = x
    p = vals["p"] = g("Softmax", x, axis=axis)
    if guard:
        p = g("Where", g("IsNaN", p), g.const(np.array(0.0, F32), "zero"), p)
    y = g("MatMul", p, v)
    return g.ret(y, *(vals[o] for o in outputs))


@pytest.mark.parametrize("form", [
    dict(), dict(scale_op="Div"), dict(scale_first=True), dict(scale_op=None), dict(mask=None),
    dict(mask="causal", mask_first=True), dict(guard=True), dict(scale_op=None, mask=None, guard=True),
])
def test_fires(form):
    g = apply(fuse_attention, _attention(**form), rtol=1e-5, atol=1e-6)
    assert ops(g) == ["Attention"]
    (att,) = list(g.nodes)
    assert att.attrs["nan_to_zero"] == int(form.get("guard", False))
    assert att.attrs["scale"] == pytest.approx(1.0 if form.get("scale_op", "Mul") is None else 0.5)
    assert len(att.inputs) == (3 if form.get("mask", "input") is None else 4)


def test_fires_when_k_has_other_users():
    """Q, KT and V are operands the fused op reads as they are: their other users keep them."""
    g = G()
    q, k, v = g.input("q", 1, 2, 6, 8), g.input("k", 1, 2, 9, 8), g.input("v", 1, 2, 9, 8)
    kt = g("Transpose", k, perm=(0, 1, 3, 2))
    y = g("MatMul", g("Softmax", g("MatMul", q, kt), axis=-1), v)
    apply(fuse_attention, g.ret(y, g("Relu", kt)))
    assert sorted(ops(g.graph)) == ["Attention", "Relu", "Transpose"]


def test_fires_for_the_cpu_backend():
    g = apply(fuse_attention, _attention(guard=True), backend=CpuBackend())
    assert ops(g) == ["Attention"]


@pytest.mark.parametrize("form", [
    dict(axis=2),  # softmax over the query axis
    dict(outputs=("p",)),  # the probabilities are a model output (attention weights)
    dict(outputs=("scores",)),  # the masked scores are used elsewhere
    dict(outputs=("qk",)),  # the raw scores are used elsewhere
])
def test_does_not_fire(form):
    g = _attention(**form)
    before = ops(g)
    apply(fuse_attention, g, expect=False)
    assert ops(g) == before


def test_does_not_fire_on_a_non_scalar_scale_or_probabilities_as_the_right_operand():
    g = G()
    q, kt, v = g.input("q", 1, 4, 5), g.input("kt", 1, 5, 4), g.input("v", 1, 4, 3)
    s = g("Mul", g("MatMul", q, kt), g.weight(1, 4, 4))  # per-score weights, not a scale
    g.ret(g("MatMul", g("Softmax", s, axis=-1), v))
    apply(fuse_attention, g.graph, expect=False)
    h = G()
    q, kt, v = h.input("q", 1, 4, 5), h.input("kt", 1, 5, 4), h.input("v", 1, 3, 4)
    h.ret(h("MatMul", v, h("Softmax", h("MatMul", q, kt), axis=-1)))  # V @ P: P is not the left operand
    apply(fuse_attention, h.graph, expect=False)
