"""Transformer ops against onnx.reference: TensorScatter (opset 24, a native row: ScatterElements along
the sequence axis) and Attention (opsets 23 / 24, imported through its ONNX function body onto MatMul,
Softmax, Where, ...), on the interpreter and the cpu backend."""

from __future__ import annotations

import numpy as np
import pytest

from glowpy.errors import InvalidModel, MismatchingShape, UnsupportedAttribute

from .util import check, expect_error, randn

BACKENDS = ("interpreter", "cpu")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", ["linear", "circular"])
def test_tensor_scatter_4d(backend, mode):
    past, update = randn(3, 2, 6, 4, seed=1), randn(3, 2, 3, 4, seed=2)
    # circular: rows 1 and 2 wrap around the end of the cache
    idx = np.array([0, 4, 5] if mode == "circular" else [0, 3, 1], dtype=np.int64)
    check(backend, "TensorScatter", [past, update, idx], opset=24, attrs={"mode": mode})


@pytest.mark.parametrize("backend", BACKENDS)
def test_tensor_scatter_3d_axis_and_no_indices(backend):
    past, update = randn(2, 5, 7, seed=3), randn(2, 5, 2, seed=4)
    check(backend, "TensorScatter", [past, update, None], opset=24, attrs={"axis": 2})
    check(backend, "TensorScatter", [past, update, np.array([5, 2], dtype=np.int64)], opset=24, attrs={"axis": -1})


def test_tensor_scatter_int_cache():
    past = np.arange(2 * 4 * 3, dtype=np.int32).reshape(2, 4, 3)
    update = -np.ones((2, 2, 3), dtype=np.int32)
    check("interpreter", "TensorScatter", [past, update, np.array([1, 3], dtype=np.int64)], opset=24,
          attrs={"axis": 1, "mode": "circular"})


def test_tensor_scatter_refusals():
    past, update = randn(2, 4, 3), randn(2, 2, 3)
    expect_error(UnsupportedAttribute, "TensorScatter", [past, update], opset=24, attrs={"mode": "ring"},
                 mentions=["mode", "ring"])
    expect_error(UnsupportedAttribute, "TensorScatter", [past, update], opset=24, attrs={"axis": 0},
                 mentions=["batch axis"])
    expect_error(MismatchingShape, "TensorScatter", [past, randn(2, 2, 5)], opset=24, attrs={"axis": 1},
                 mentions=["update must match past_cache"])
    expect_error(InvalidModel, "TensorScatter", [past, randn(2, 6, 3)], opset=24, attrs={"axis": 1},
                 mentions=["longer than the cache"])
    expect_error(MismatchingShape, "TensorScatter", [past, update, np.zeros(3, np.int64)], opset=24,
                 attrs={"axis": 1}, mentions=["write_indices"])


# --- Attention -----------------------------------------------------------------------------------


def _qkv(b, hq, hkv, sq, skv, d, dv=None, seed=0):
    return (randn(b, hq, sq, d, seed=seed), randn(b, hkv, skv, d, seed=seed + 1),
            randn(b, hkv, skv, dv or d, seed=seed + 2))


@pytest.mark.parametrize("backend", BACKENDS)
def test_attention_gqa_causal_softcap_scale(backend):
    q, k, v = _qkv(2, 4, 2, 3, 5, 8, dv=6)
    check(backend, "Attention", [q, k, v], opset=23, attrs={"is_causal": 1, "softcap": 2.0, "scale": 0.3})


@pytest.mark.parametrize("backend", BACKENDS)
def test_attention_3d_bool_mask_past_present(backend):
    b, sq, skv, past = 2, 3, 4, 2
    q, k, v = randn(b, sq, 4 * 8, seed=5), randn(b, skv, 2 * 8, seed=6), randn(b, skv, 2 * 8, seed=7)
    pk, pv = randn(b, 2, past, 8, seed=8), randn(b, 2, past, 8, seed=9)
    mask = np.random.default_rng(3).integers(0, 2, (sq, skv + past)).astype(bool)
    mask[:, 0] = True  # no fully masked row
    check(backend, "Attention", [q, k, v, mask, pk, pv], opset=23, outputs=["Y", "present_key", "present_value"],
          attrs={"q_num_heads": 4, "kv_num_heads": 2})


@pytest.mark.parametrize("mode", [0, 1, 2, 3])
def test_attention_qk_matmul_output_modes_float_mask(mode):
    # No softcap here: onnx.reference returns the softcapped product for mode 0 where the function body
    # (glowpy's import) returns the raw Q K^T, so the two disagree by design, not by a glowpy bug.
    q, k, v = _qkv(1, 2, 2, 3, 4, 4, seed=10)
    mask = randn(1, 2, 3, 4, seed=11)
    check("interpreter", "Attention", [q, k, v, mask, None, None], opset=23,
          outputs=["Y", "", "", "qk"], attrs={"qk_matmul_output_mode": mode, "scale": 0.7})


@pytest.mark.parametrize("backend", BACKENDS)
def test_attention_nonpad_kv_seqlen_opset24(backend):
    q, k, v = _qkv(2, 2, 1, 2, 5, 4, seed=12)
    check(backend, "Attention", [q, k, v, None, None, None, np.array([3, 5], dtype=np.int64)], opset=24,
          attrs={"is_causal": 0})


# LinearAttention (opset 27) imports through its context-dependent function body, whose Scan body reads
# the function's local constants: the instantiation renames those reads (importer/functions.py).
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("rule", ["linear", "gated"])
def test_linear_attention_function_body(backend, rule):
    b, s, h, d = 1, 3, 2, 4
    q, k, v = randn(b, s, h * d, seed=20), randn(b, s, h * d, seed=21), randn(b, s, h * d, seed=22)
    operands = [q, k, v]
    if rule == "gated":
        past = randn(b, h, d, d, seed=23)
        decay = (-np.abs(randn(b, s, h, seed=24))).astype(np.float32)
        operands += [past, decay]
    check(backend, "LinearAttention", operands, opset=27, outputs=["out", "state"],
          attrs={"q_num_heads": h, "kv_num_heads": h, "update_rule": rule}, atol=1e-4)
