"""The generated GEMM kernel against numpy: edge sizes, transposes, constant and runtime B, bias kinds,
alpha, activations, 1-3 threads, with NaN guards around the output."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_harness import VW, act_ref, gemm_kernel, guarded, guards_intact

from glowpy.errors import GlowpyError

RTOL = ATOL = 1e-4


def _check(M, N, K, *, a_trans=False, const_b=True, b_trans=False, alpha=1.0, bias_kind="none",
           activation="none", params=(), threads=(1, 2, 3), vector_width=VW, seed=0) -> None:
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((K, M) if a_trans else (M, K)).astype(np.float32)
    b = (rng.standard_normal((N, K) if b_trans else (K, N)) / np.sqrt(K)).astype(np.float32)
    bias = None
    if bias_kind == "col":
        bias = rng.standard_normal(N).astype(np.float32)
    elif bias_kind == "full":
        bias = rng.standard_normal((M, N)).astype(np.float32)
    kern = gemm_kernel(M, N, K, a_trans=a_trans, b=b if const_b else None, b_trans=b_trans, alpha=alpha, bias=bias,
                       bias_kind=bias_kind, activation=activation, params=params, vector_width=vector_width)
    opa = (a.T if a_trans else a).astype(np.float64)
    opb = (b.T if b_trans else b).astype(np.float64)
    ref = alpha * (opa @ opb) + (0.0 if bias is None else bias)
    ref = act_ref(ref, activation, params)
    for nt in threads:
        out, whole = guarded((M, N))
        kern(out, a, None if const_b else b, nthreads=nt)
        assert guards_intact(whole), f"write outside the output at nthreads={nt}"
        np.testing.assert_allclose(out, ref, rtol=RTOL, atol=ATOL, err_msg=f"nthreads={nt}")


SIZES = [(1, 1, 1), (1, 1000, 64), (15, 17, 64), (17, 15, 1000), (64, 64, 64), (1000, 17, 15), (17, 1000, 17),
         (64, 15, 1)]


@pytest.mark.parametrize("const_b", [True, False], ids=["constB", "runtimeB"])
@pytest.mark.parametrize("b_trans", [False, True], ids=["B", "Bt"])
@pytest.mark.parametrize("a_trans", [False, True], ids=["A", "At"])
@pytest.mark.parametrize("M,N,K", SIZES, ids=[f"{m}x{n}x{k}" for m, n, k in SIZES])
def test_gemm_shapes(M, N, K, a_trans, b_trans, const_b) -> None:
    _check(M, N, K, a_trans=a_trans, b_trans=b_trans, const_b=const_b, bias_kind="col")


@pytest.mark.parametrize("bias_kind", ["none", "col", "full"])
@pytest.mark.parametrize("const_b", [True, False], ids=["constB", "runtimeB"])
def test_gemm_bias_alpha(bias_kind: str, const_b: bool) -> None:
    _check(33, 47, 29, alpha=0.37, bias_kind=bias_kind, const_b=const_b)


ACTS = [("relu", ()), ("clip", (-0.3, 0.4)), ("leaky_relu", (0.01,)), ("sigmoid", ()), ("tanh", ())]


@pytest.mark.parametrize("activation,params", ACTS, ids=[a for a, _ in ACTS])
def test_gemm_activations(activation: str, params) -> None:
    _check(9, 40, 64, bias_kind="col", activation=activation, params=params, threads=(1, 2))


@pytest.mark.parametrize("vector_width", [8, 4])
@pytest.mark.parametrize("b_trans", [False, True])
def test_gemm_narrow_vectors(vector_width: int, b_trans: bool) -> None:
    for const_b in (True, False):
        _check(13, 37, 21, b_trans=b_trans, const_b=const_b, bias_kind="col", activation="relu",
               vector_width=vector_width, threads=(1, 3))


def test_gemm_mlp_and_fc_shapes() -> None:
    """The batch-1 shapes models run: a 64-wide MLP layer and ResNet's 2048 -> 1000 classifier."""
    _check(1, 64, 64, b_trans=True, bias_kind="col", activation="relu")
    _check(1, 1000, 2048, b_trans=True, bias_kind="col", threads=(1, 2))


def test_gemm_rejects_bad_arguments() -> None:
    with pytest.raises(GlowpyError):
        gemm_kernel(4, 5, 6, b=np.ones((5, 5), np.float32))
    with pytest.raises(GlowpyError):
        gemm_kernel(4, 5, 6, bias=np.ones(4, np.float32), bias_kind="col")
    with pytest.raises(GlowpyError):
        gemm_kernel(4, 5, 6, bias_kind="row")
    with pytest.raises(GlowpyError):
        gemm_kernel(0, 5, 6)
