"""The fused attention kernel (kernels/attention.py, IR op Attention) against onnx's reference evaluator
and the interpreter: the unfused chain MatMul(Q, K^T) -> scale -> mask -> Softmax -> MatMul(V) as the
exporters write it, which the optimizer turns into one Attention op. Sizes off the vector width, head
dims 64 / 40 / odd, scores longer than a reduction chunk, padding / causal / per-head / broadcast masks,
fully masked rows behind the NaN guard, host ISA and AVX2, threads 1..3 bit-identical."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import glowpy
from glowpy.backends.cpu.target import isa_available
from glowpy.errors import MismatchingShape
from glowpy.ir.graph import Graph
from glowpy.ir.types import TensorType
from glowpy.pipeline import optimized_graph

F32 = np.float32
ISAS = ["host"] + (["avx2"] if isa_available("avx2") else [])


def _model(b, h, s, t, d, e, *, mask=None, mask_kind="input", scale=0.125, div=False, guard=False):
    """q (b, h, s, d), k (b, h, t, d), v (b, h, t, e) -> softmax(q @ k^T * scale [+ mask]) @ v; the mask
    (shape `mask`) is an input, or a constant causal mask (mask_kind="causal")."""
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, shp)
              for n, shp in (("q", [b, h, s, d]), ("k", [b, h, t, d]), ("v", [b, h, t, e]))]
    inits = [numpy_helper.from_array(np.array(1 / scale if div else scale, F32), "c"),
             numpy_helper.from_array(np.array(0.0, F32), "zero")]
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["qk"]),
             helper.make_node("Div" if div else "Mul", ["qk", "c"], ["scaled"])]
    x = "scaled"
    if mask is not None:
        if mask_kind == "causal":
            inits.append(numpy_helper.from_array(np.triu(np.full(mask, -np.inf, F32), 1), "mask"))
        else:
            inputs.append(helper.make_tensor_value_info("mask", TensorProto.FLOAT, list(mask)))
        nodes.append(helper.make_node("Add", ["mask", x], ["masked"]))
        x = "masked"
    nodes.append(helper.make_node("Softmax", [x], ["p"], axis=-1))
    p = "p"
    if guard:
        nodes += [helper.make_node("IsNaN", ["p"], ["nan"]), helper.make_node("Where", ["nan", "zero", "p"], ["pz"])]
        p = "pz"
    nodes.append(helper.make_node("MatMul", [p, "v"], ["y"]))
    g = helper.make_graph(nodes, "attn", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _feeds(model, seed=0, masked_rows=()):
    rng = np.random.default_rng(seed)
    feeds = {}
    for i in model.graph.input:
        shape = [dim.dim_value for dim in i.type.tensor_type.shape.dim]
        x = rng.standard_normal(shape).astype(F32)
        if i.name == "mask":  # a padding-like mask: some scores -inf, the rest small biases
            x = np.where(rng.random(shape) < 0.3, -np.inf, x).astype(F32)
            for r in masked_rows:
                x[..., r, :] = -np.inf
        feeds[i.name] = x
    return feeds


def _check(model, feeds, isa="host", threads=1):
    assert sum(n.op == "Attention" for n in optimized_graph(model, "cpu").nodes) == 1
    want = ReferenceEvaluator(model).run(None, feeds)[0]
    got = glowpy.compile(model, backend="cpu", threads=threads, isa=isa, cache=False).run(feeds)["y"]
    interp = glowpy.compile(model, backend="interpreter").run(feeds)["y"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-5, err_msg=f"cpu {isa} {threads}")
    np.testing.assert_allclose(interp, want, rtol=1e-5, atol=1e-6, err_msg="interpreter")
    return got


CASES = {  # (b, h, s, t, d, e), mask shape
    "bert_like": ((1, 2, 16, 16, 64, 64), (1, 1, 1, 16)),
    "odd_rows": ((1, 3, 13, 19, 40, 40), (1, 1, 13, 19)),
    "odd_head_dim": ((2, 2, 9, 23, 7, 5), (2, 1, 1, 23)),
    "long_scores": ((1, 1, 11, 600, 64, 64), None),  # T over two reduction chunks of 256
    "per_head_bias": ((1, 3, 17, 17, 64, 40), (1, 3, 17, 17)),
    "row_mask": ((1, 2, 10, 33, 16, 16), (1, 1, 10, 1)),
    "single_row": ((2, 2, 1, 37, 64, 64), (1, 1, 1, 37)),
}


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_kernel_matches_reference(case, isa):
    dims, mask = CASES[case]
    model = _model(*dims, mask=mask)
    _check(model, _feeds(model), isa=isa)


@pytest.mark.parametrize("isa", ISAS)
def test_causal_mask_divided_scale(isa):
    model = _model(1, 2, 21, 21, 40, 40, mask=(21, 21), mask_kind="causal", div=True)
    _check(model, _feeds(model), isa=isa)


@pytest.mark.parametrize("isa", ISAS)
def test_fully_masked_rows_behind_the_nan_guard_are_zero(isa):
    model = _model(1, 2, 12, 20, 64, 64, mask=(1, 1, 12, 20), guard=True)
    feeds = _feeds(model, masked_rows=(0, 7))
    got = _check(model, feeds, isa=isa)
    assert not got[:, :, [0, 7]].any() and np.abs(got[:, :, 1]).sum() > 0


def test_fully_masked_rows_without_the_guard_are_nan():
    model = _model(1, 1, 6, 20, 16, 16, mask=(1, 1, 6, 20))
    feeds = _feeds(model, masked_rows=(2,))
    got = glowpy.compile(model, backend="cpu", cache=False).run(feeds)["y"]
    assert np.isnan(got[0, 0, 2]).all() and not np.isnan(np.delete(got, 2, axis=2)).any()


def test_threads_bit_identical():
    model = _model(1, 3, 29, 29, 64, 64, mask=(1, 1, 1, 29))
    feeds = _feeds(model)
    runs = [glowpy.compile(model, backend="cpu", threads=n, cache=False).run(feeds)["y"] for n in (1, 2, 3)]
    for n, r in zip((2, 3), runs[1:]):
        np.testing.assert_array_equal(r, runs[0], err_msg=f"{n} threads")


def test_bad_operands_name_the_op():
    g = Graph("bad")
    q = g.add_input("q", TensorType(F32, (2, 5, 8)))
    kt = g.add_input("kt", TensorType(F32, (2, 7, 9)))
    v = g.add_input("v", TensorType(F32, (2, 9, 4)))
    with pytest.raises(MismatchingShape, match="Attention needs Q") as err:
        g.add_node("Attention", [q, kt, v], {})
    assert err.value.op == "Attention"
    kt2 = g.add_input("kt2", TensorType(F32, (2, 8, 9)))
    mask = g.add_input("mask", TensorType(F32, (3, 5, 9)))
    with pytest.raises(MismatchingShape, match="mask must broadcast") as err:
        g.add_node("Attention", [q, kt2, v, mask], {})
    assert err.value.expected == (2, 5, 9)
