"""Numpy references and the JIT harness for the Conv / GEMM kernel tests."""

from __future__ import annotations

import numpy as np

from glowpy.backends.cpu.kernels.conv import conv_out_dim, emit_conv2d
from glowpy.backends.cpu.kernels.gemm import emit_gemm
from tools.bench_kernels import JitKernel, host_vector_width

VW = host_vector_width()


def act_ref(x: np.ndarray, kind: str, params=()) -> np.ndarray:
    if kind == "relu":
        return np.maximum(x, 0)
    if kind == "clip":
        return np.clip(x, params[0], params[1])
    if kind == "leaky_relu":
        return np.where(x >= 0, x, x * params[0])
    if kind == "sigmoid":
        return 1.0 / (1.0 + np.exp(-x))
    if kind == "tanh":
        return np.tanh(x)
    return x


def conv_ref(x, w, b, strides, pads, dilations, group, residual=None, activation="none", params=()):
    """Direct float64 convolution: a sum over kernel taps of shifted, strided input slices."""
    n, c, h, wd = x.shape
    m, cg, kh, kw = w.shape
    sh, sw = strides
    pt, pl, pb, pr = pads
    dh, dw = dilations
    oh = conv_out_dim(h, kh, sh, pt + pb, dh)
    ow = conv_out_dim(wd, kw, sw, pl + pr, dw)
    xp = np.zeros((n, c, h + pt + pb + sh * oh + dh * kh, wd + pl + pr + sw * ow + dw * kw))
    xp[:, :, pt:pt + h, pl:pl + wd] = x
    mg = m // group
    out = np.zeros((n, m, oh, ow))
    for g in range(group):
        wg = w[g * mg:(g + 1) * mg].astype(np.float64)
        for i in range(kh):
            for j in range(kw):
                sl = xp[:, g * cg:(g + 1) * cg, i * dh:i * dh + sh * oh:sh, j * dw:j * dw + sw * ow:sw]
                out[:, g * mg:(g + 1) * mg] += np.einsum("mc,nchw->nmhw", wg[:, :, i, j], sl)
    out += b.reshape(1, m, 1, 1)
    if residual is not None:
        out += residual
    return act_ref(out, activation, params)


def guarded(shape) -> tuple[np.ndarray, np.ndarray]:
    """An output array with NaN guard zones either side (to catch stray writes): (view, whole)."""
    size = int(np.prod(shape))
    whole = np.full(size + 64, np.nan, np.float32)
    return whole[32:32 + size].reshape(shape), whole


def guards_intact(whole: np.ndarray) -> bool:
    return bool(np.isnan(whole[:32]).all() and np.isnan(whole[-32:]).all())


def conv_kernel(x_shape, w, b, *, strides=(1, 1), pads=(0, 0, 0, 0), dilations=(1, 1), group=1,
                activation="none", params=(), residual=False, vector_width=VW, misalign=False, split="",
                panels=(0, 0, 0)) -> JitKernel:
    return JitKernel(lambda m, n: emit_conv2d(
        m, n, x_shape=x_shape, w=w, bias=b, strides=strides, pads=pads, dilations=dilations, group=group,
        activation=activation, activation_params=params, has_residual=residual, vector_width=vector_width,
        split=split, panels=panels),
        name="conv", misalign=misalign)


def gemm_kernel(M, N, K, *, a_trans=False, b=None, b_trans=False, alpha=1.0, bias=None, bias_kind="none",
                activation="none", params=(), vector_width=VW) -> JitKernel:
    return JitKernel(lambda m, n: emit_gemm(
        m, n, M=M, N=N, K=K, a_trans=a_trans, b=b, b_trans=b_trans, alpha=alpha, bias=bias, bias_kind=bias_kind,
        activation=activation, activation_params=params, vector_width=vector_width), name="gemm")
