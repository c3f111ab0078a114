"""Neural-network ops: convolution, pooling, normalization, matrix products, softmax.

Spatial attributes are always explicit and normalized by the importer: `pads` is
(begin_0, .., begin_n, end_0, .., end_n) like ONNX, auto_pad already resolved, strides and
dilations one per spatial dim. Conv, Gemm, MatMul and FullyConnected carry an optional fused
activation (`activation`, `activation_params`, see glowpy/ir/activations.py) that the optimizer
sets and backends emit as an epilogue; Conv also takes an optional residual operand added before
the activation.
"""

from __future__ import annotations

import math
from itertools import product

import numpy as np

from glowpy.errors import MismatchingDatatype, MismatchingShape, UnsupportedAttribute, UnsupportedShape
from glowpy.ir.activations import apply_activation, check_fused
from glowpy.ir.ops.elementwise import broadcast_shapes
from glowpy.ir.ops.registry import FROM_ONNX, REQUIRED, op
from glowpy.ir.types import FLOAT_TYPES, NUMERIC_TYPES, TensorType

FUSED = {"activation": "none", "activation_params": ()}


def accumulator(a: np.ndarray) -> np.ndarray:
    """`a` in the type its products are summed in: float64 for f16/f32, long double for f64.

    BLAS picks its kernel and summation order by an element's position in the output tile, and the
    tiles differ between AVX2 and AVX-512 hosts, so two output channels with equal inputs and
    weights can differ by ulps when summed in their own type (onnx's light models, all weights
    equal, then give a softmax that is not uniform). Products of f32 values are exact in f64 and
    the f64 sum is rounded once to f32, so those differences vanish. f64 operands go to long double,
    which numpy sums without BLAS, in one order (k = 0, 1, ...) for every element.
    """
    if a.dtype.kind != "f":
        return a
    return a.astype(np.longdouble if a.dtype == np.float64 else np.float64, copy=False)


def conv_out_dim(size: int, k: int, stride: int, pad_total: int, dilation: int) -> int:
    """Output size of a convolution along one spatial dim (`pad_total` = begin + end padding)."""
    return (size + pad_total - (k - 1) * dilation - 1) // stride + 1


def _spatial_check(name: str, x: TensorType, nspatial: int, attrs: dict) -> None:
    for key in ("strides", "dilations"):
        if key in attrs and len(attrs[key]) != nspatial and not (key == "dilations" and not attrs[key]):
            raise UnsupportedAttribute(
                f"'{key}' needs one value per spatial dim", op=name, expected=nspatial, found=len(attrs[key])
            )
    if len(attrs["pads"]) != 2 * nspatial:
        raise UnsupportedAttribute("'pads' needs begin and end per spatial dim", op=name,
                                   expected=2 * nspatial, found=len(attrs["pads"]))


def _pad_spatial(x: np.ndarray, pads: tuple, value: float, extra_end: tuple = (), extra_value=None) -> np.ndarray:
    """Pad the spatial dims by `pads` with `value`, then by `extra_end` more at the end with `extra_value`."""
    n = len(pads) // 2
    widths = [(0, 0), (0, 0)] + [(pads[i], pads[i + n]) for i in range(n)]
    if any(a or b for a, b in widths):
        x = np.pad(x, widths, constant_values=value)
    if any(extra_end):
        x = np.pad(x, [(0, 0), (0, 0)] + [(0, e) for e in extra_end],
                   constant_values=value if extra_value is None else extra_value)
    return x


def _window(xp: np.ndarray, offs: tuple, strides: tuple, out: tuple) -> np.ndarray:
    sl = tuple(slice(o, o + s * (n - 1) + 1, s) for o, s, n in zip(offs, strides, out))
    return xp[(Ellipsis, *sl)]


# --- Conv ------------------------------------------------------------------------------------


def _conv_infer(attrs: dict, x: TensorType, w: TensorType, b: TensorType, *res: TensorType) -> TensorType:
    nsp = x.rank - 2
    if nsp < 1 or w.rank != x.rank:
        raise UnsupportedShape("Conv needs N x C x spatial input and matching weight rank", op="Conv",
                               expected=f"rank {x.rank}", found=f"weight rank {w.rank}")
    _spatial_check("Conv", x, nsp, attrs)
    check_fused("Conv", attrs)
    g = attrs["group"]
    if x.shape[1] != w.shape[1] * g or w.shape[0] % g:
        raise MismatchingShape("input channels do not match weight and group", op="Conv",
                               expected=f"C = {w.shape[1]} x group {g}", found=x.shape[1])
    if b.shape != (w.shape[0],):
        raise MismatchingShape("bias must have one value per output channel", op="Conv",
                               expected=(w.shape[0],), found=b.shape)
    if w.dtype != x.dtype or b.dtype != x.dtype:
        raise MismatchingDatatype("weight/bias type differs from input", op="Conv",
                                  expected=str(x.dtype), found=f"{w.dtype}, {b.dtype}")
    pads = attrs["pads"]
    spatial = tuple(
        conv_out_dim(x.shape[2 + i], w.shape[2 + i], attrs["strides"][i], pads[i] + pads[i + nsp],
                     attrs["dilations"][i])
        for i in range(nsp)
    )
    if any(d <= 0 for d in spatial):
        raise UnsupportedShape("kernel larger than padded input", op="Conv", expected="positive output dims",
                               found=spatial)
    out = TensorType(x.dtype, (x.shape[0], w.shape[0], *spatial))
    if res and res[0].shape != out.shape:
        raise MismatchingShape("residual operand must have the output shape", op="Conv",
                               expected=out.shape, found=res[0].shape)
    return out


@op(
    "Conv",
    infer=_conv_infer,
    inputs=(3, 4),
    dtypes=FLOAT_TYPES,
    attrs={"group": FROM_ONNX, "strides": REQUIRED, "pads": REQUIRED, "dilations": REQUIRED, **FUSED},
)
def conv(attrs: dict, x: np.ndarray, w: np.ndarray, b: np.ndarray, *res: np.ndarray) -> np.ndarray:
    """N-d grouped convolution (cross-correlation), bias, optional residual, fused activation."""
    nsp = x.ndim - 2
    g, strides, dil = attrs["group"], attrs["strides"], attrs["dilations"]
    n, c = x.shape[:2]
    m, cg = w.shape[:2]
    ks = w.shape[2:]
    out_sp = _conv_infer(attrs, TensorType.of(x), TensorType.of(w), TensorType.of(b)).shape[2:]
    xp = _pad_spatial(x, attrs["pads"], 0.0)
    xg = xp.reshape(n, g, cg, *xp.shape[2:])
    wg = accumulator(w).reshape(g, m // g, cg * math.prod(ks))
    # im2col, one image at a time (the columns are kernel-size times the image): every kernel
    # offset's window, in w's (cg, *ks) order, so that one product sums it all
    offsets = list(product(*(range(k) for k in ks)))
    cols = np.empty((g, cg, len(offsets), math.prod(out_sp)), dtype=wg.dtype)
    acc = np.empty((n, g, m // g, math.prod(out_sp)), dtype=wg.dtype)
    for i in range(n):
        for j, offs in enumerate(offsets):
            start = tuple(o * d for o, d in zip(offs, dil))
            cols[:, :, j] = _window(xg[i], start, strides, out_sp).reshape(g, cg, -1)
        np.matmul(wg, cols.reshape(g, cg * len(offsets), -1), out=acc[i])
    y = acc.reshape(n, m, *out_sp) + b.reshape(1, m, *([1] * nsp))
    if res:
        y = y + res[0]
    return apply_activation(y.astype(x.dtype), attrs)


def _convt_infer(attrs: dict, x: TensorType, w: TensorType, b: TensorType) -> TensorType:
    nsp = x.rank - 2
    _spatial_check("ConvTranspose", x, nsp, attrs)
    g = attrs["group"]
    if w.shape[0] != x.shape[1]:
        raise MismatchingShape("weight dim 0 must equal input channels", op="ConvTranspose",
                               expected=x.shape[1], found=w.shape[0])
    pads, op_ = attrs["pads"], attrs["output_padding"]
    spatial = tuple(
        attrs["strides"][i] * (x.shape[2 + i] - 1) + op_[i] + (w.shape[2 + i] - 1) * attrs["dilations"][i] + 1
        - pads[i] - pads[i + nsp]
        for i in range(nsp)
    )
    return TensorType(x.dtype, (x.shape[0], w.shape[1] * g, *spatial))


@op(
    "ConvTranspose",
    infer=_convt_infer,
    inputs=(3, 3),
    dtypes=FLOAT_TYPES,
    attrs={"group": FROM_ONNX, "strides": REQUIRED, "pads": REQUIRED, "dilations": REQUIRED,
           "output_padding": REQUIRED},
)
def conv_transpose(attrs: dict, x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Transposed convolution: scatter each input pixel through the kernel."""
    nsp = x.ndim - 2
    g, strides, dil, pads = attrs["group"], attrs["strides"], attrs["dilations"], attrs["pads"]
    n, c = x.shape[:2]
    mg = w.shape[1]
    ks = w.shape[2:]
    full = tuple(strides[i] * (x.shape[2 + i] - 1) + (ks[i] - 1) * dil[i] + 1 + attrs["output_padding"][i]
                 for i in range(nsp))
    xg = accumulator(x).reshape(n, g, c // g, -1)
    wg = accumulator(w).reshape(g, c // g, mg, *ks)
    out = np.zeros((n, g, mg, *full), dtype=xg.dtype)
    for offs in product(*(range(k) for k in ks)):
        contrib = np.matmul(np.swapaxes(wg[(Ellipsis, *offs)], 1, 2)[None], xg)  # n, g, mg, pixels
        contrib = contrib.reshape(n, g, mg, *x.shape[2:])
        sl = tuple(slice(o * d, o * d + s * (sz - 1) + 1, s) for o, d, s, sz in zip(offs, dil, strides, x.shape[2:]))
        out[(slice(None), slice(None), slice(None), *sl)] += contrib
    out = out.reshape(n, g * mg, *full)
    crop = tuple(slice(pads[i], full[i] - pads[i + nsp]) for i in range(nsp))
    y = out[(slice(None), slice(None), *crop)] + b.reshape(1, -1, *([1] * nsp))
    return y.astype(x.dtype)


# --- Pooling ---------------------------------------------------------------------------------


def _pool_out(attrs: dict, x: TensorType) -> tuple[int, ...]:
    nsp = x.rank - 2
    ks, st, pads = attrs["kernel_shape"], attrs["strides"], attrs["pads"]
    dil = attrs.get("dilations") or (1,) * nsp
    out = []
    for i in range(nsp):
        size = x.shape[2 + i] + pads[i] + pads[i + nsp]
        eff = (ks[i] - 1) * dil[i] + 1
        if attrs["ceil_mode"]:
            o = -(-(size - eff) // st[i]) + 1
            # The last window must start inside the input or the begin padding.
            if (o - 1) * st[i] >= x.shape[2 + i] + pads[i]:
                o -= 1
        else:
            o = (size - eff) // st[i] + 1
        out.append(o)
    return tuple(out)


def _pool_infer(name: str):
    def infer(attrs: dict, x: TensorType) -> TensorType:
        nsp = x.rank - 2
        if nsp < 1:
            raise UnsupportedShape("pooling needs N x C x spatial input", op=name, expected="rank >= 3", found=x.rank)
        if len(attrs["kernel_shape"]) != nsp:
            raise UnsupportedAttribute("'kernel_shape' needs one value per spatial dim", op=name,
                                       expected=nsp, found=len(attrs["kernel_shape"]))
        _spatial_check(name, x, nsp, attrs)
        out = _pool_out(attrs, x)
        if any(d <= 0 for d in out):
            raise UnsupportedShape("window larger than padded input", op=name, expected="positive output dims",
                                   found=out)
        return TensorType(x.dtype, (*x.shape[:2], *out))

    return infer


def _pool(x: np.ndarray, attrs: dict, pad_value, reduce, extra_value=None) -> np.ndarray:
    """Reduce every window with `reduce`; explicit padding holds pad_value, ceil_mode overhang extra_value."""
    nsp = x.ndim - 2
    out = _pool_out(attrs, TensorType.of(x))
    ks, st, pads = attrs["kernel_shape"], attrs["strides"], attrs["pads"]
    dil = attrs.get("dilations") or (1,) * nsp
    extra = tuple(
        max(0, (out[i] - 1) * st[i] + (ks[i] - 1) * dil[i] + 1 - (x.shape[2 + i] + pads[i] + pads[i + nsp]))
        for i in range(nsp)
    )
    xp = _pad_spatial(x, pads, pad_value, extra, extra_value)
    acc = None
    for offs in product(*(range(k) for k in ks)):
        win = _window(xp, tuple(o * d for o, d in zip(offs, dil)), st, out)
        acc = win.copy() if acc is None else reduce(acc, win)
    return acc


def _max_pool_infer(attrs: dict, x: TensorType) -> TensorType | list[TensorType]:
    y = _pool_infer("MaxPool")(attrs, x)
    if attrs["storage_order"] not in (0, 1):
        raise UnsupportedAttribute("storage_order must be 0 (row major) or 1 (column major)", op="MaxPool",
                                   expected="0, 1", found=attrs["storage_order"])
    return [y, TensorType(np.int64, y.shape)] if attrs["indices"] else y


def _max_pool_indices(x: np.ndarray, attrs: dict) -> tuple[np.ndarray, np.ndarray]:
    """Max and the flat input index of its first occurrence in window order (strictly greater wins)."""
    nsp = x.ndim - 2
    out = _pool_out(attrs, TensorType.of(x))
    ks, st, pads, dil = attrs["kernel_shape"], attrs["strides"], attrs["pads"], attrs["dilations"]
    sp = x.shape[2:]
    # storage_order 1 numbers the spatial dims column major
    if attrs["storage_order"]:
        flat = [math.prod(sp[:d]) for d in range(nsp)]
    else:
        flat = [math.prod(sp[d + 1:]) for d in range(nsp)]
    planes = np.arange(x.shape[0] * x.shape[1]).reshape(x.shape[0], x.shape[1], *([1] * nsp)) * math.prod(sp)
    grids = np.meshgrid(*[np.arange(o) * s - p for o, s, p in zip(out, st, pads[:nsp])], indexing="ij")
    best = np.full((*x.shape[:2], *out), -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min, dtype=x.dtype)
    idx = np.full(best.shape, -1, dtype=np.int64)
    for offs in product(*(range(k) for k in ks)):
        pos = [g + o * d for g, o, d in zip(grids, offs, dil)]
        ok = np.ones(out, dtype=bool)
        for p, n in zip(pos, sp):
            ok &= (p >= 0) & (p < n)
        safe = [np.clip(p, 0, n - 1) for p, n in zip(pos, sp)]
        v = x[(slice(None), slice(None), *safe)]
        take = ok & ((v > best) | (idx < 0))
        best = np.where(take, v, best)
        idx = np.where(take, planes + sum(p * s for p, s in zip(safe, flat)), idx)
    return best, idx


@op(
    "MaxPool",
    infer=_max_pool_infer,
    dtypes=NUMERIC_TYPES,
    attrs={"kernel_shape": REQUIRED, "strides": REQUIRED, "pads": REQUIRED, "dilations": REQUIRED,
           "ceil_mode": FROM_ONNX, "storage_order": 0, "indices": 0},
    num_outputs=lambda a: 2 if a["indices"] else 1,
)
def max_pool(attrs: dict, x: np.ndarray) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """Max over each window; padding never wins. With `indices`, also the flat index into x of each
    max (row major over the spatial dims, or column major for storage_order 1)."""
    if attrs["indices"]:
        return _max_pool_indices(x, attrs)
    init = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
    return _pool(x, attrs, init, np.maximum)


@op(
    "AveragePool",
    infer=_pool_infer("AveragePool"),
    dtypes=FLOAT_TYPES,
    attrs={"kernel_shape": REQUIRED, "strides": REQUIRED, "pads": REQUIRED, "dilations": (), "ceil_mode": FROM_ONNX,
           "count_include_pad": FROM_ONNX},
)
def average_pool(attrs: dict, x: np.ndarray) -> np.ndarray:
    """Mean over each window; the divisor counts explicit padding only if count_include_pad."""
    total = _pool(x.astype(np.float64), attrs, 0.0, np.add)
    # Per output position, the cells that are input (or explicit padding, when counted).
    ones = np.ones((1, 1, *x.shape[2:]))
    count = _pool(ones, attrs, 1.0 if attrs["count_include_pad"] else 0.0, np.add, extra_value=0.0)
    return (total / count).astype(x.dtype)


@op(
    "LpPool",
    infer=_pool_infer("LpPool"),
    dtypes=FLOAT_TYPES,
    attrs={"kernel_shape": REQUIRED, "strides": REQUIRED, "pads": REQUIRED, "dilations": (), "ceil_mode": 0,
           "p": FROM_ONNX},
)
def lp_pool(attrs: dict, x: np.ndarray) -> np.ndarray:
    """(sum over each window of |x| ** p) ** (1 / p); padding contributes nothing."""
    p = attrs["p"]
    total = _pool(np.abs(x.astype(np.float64)) ** p, attrs, 0.0, np.add)
    return (total ** (1.0 / p)).astype(x.dtype)


def _unpool_infer(attrs: dict, x: TensorType, idx: TensorType) -> TensorType:
    if idx.shape != x.shape or idx.dtype != np.int64:
        raise MismatchingShape("MaxUnpool indices must be int64 of the input's shape", op="MaxUnpool",
                               expected=f"int64 {x.shape}", found=f"{idx.dtype} {idx.shape}")
    full = unpool_shape(attrs, x.shape)
    out = tuple(attrs["output_shape"]) or full
    if len(out) != x.rank or any(o < f for o, f in zip(out, full)):
        raise UnsupportedShape("output_shape must be at least the unpooled shape", op="MaxUnpool",
                               expected=f">= {full}", found=out)
    return TensorType(x.dtype, out)


def unpool_shape(attrs: dict, x_shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape MaxPool's indices number: (in - 1) * stride - pads + kernel per spatial dim."""
    n = len(attrs["kernel_shape"])
    return tuple(x_shape[:2]) + tuple(
        (x_shape[2 + d] - 1) * attrs["strides"][d] - attrs["pads"][d] - attrs["pads"][d + n] + attrs["kernel_shape"][d]
        for d in range(n))


@op("MaxUnpool", infer=_unpool_infer, inputs=(2, 2), dtypes=FLOAT_TYPES,
    attrs={"kernel_shape": REQUIRED, "strides": REQUIRED, "pads": REQUIRED, "output_shape": ()})
def max_unpool(attrs: dict, x: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """Scatter x to the flat positions `idx` of the unpooled shape (zeros elsewhere; a later duplicate
    index wins), placed at the start of each dim of `output_shape` when that is larger."""
    full = unpool_shape(attrs, x.shape)
    y = np.zeros(math.prod(full), dtype=x.dtype)
    y[idx.reshape(-1)] = x.reshape(-1)
    out = np.zeros(tuple(attrs["output_shape"]) or full, dtype=x.dtype)
    out[tuple(slice(0, f) for f in full)] = y.reshape(full)
    return out


def _global_infer(attrs: dict, x: TensorType) -> TensorType:
    if x.rank < 3:
        raise UnsupportedShape("global pooling needs N x C x spatial input", expected="rank >= 3", found=x.rank)
    return TensorType(x.dtype, (*x.shape[:2], *([1] * (x.rank - 2))))


@op("GlobalAveragePool", infer=_global_infer, dtypes=FLOAT_TYPES)
def global_average_pool(attrs: dict, x: np.ndarray) -> np.ndarray:
    """Mean over all spatial dims, kept as size-1 dims."""
    return x.mean(axis=tuple(range(2, x.ndim)), keepdims=True, dtype=np.float64).astype(x.dtype)


@op("GlobalMaxPool", infer=_global_infer, dtypes=NUMERIC_TYPES)
def global_max_pool(attrs: dict, x: np.ndarray) -> np.ndarray:
    """Max over all spatial dims, kept as size-1 dims."""
    return x.max(axis=tuple(range(2, x.ndim)), keepdims=True)


# --- Col2Im ----------------------------------------------------------------------------------


def col2im_table(attrs: dict) -> np.ndarray:
    """For each (kernel offset k, block l) of a column, the flat image position it adds to (-1: padding)."""
    img, blk = attrs["image_shape"], attrs["block_shape"]
    n = len(img)
    st, dil, pads = attrs["strides"], attrs["dilations"], attrs["pads"]
    blocks = [conv_out_dim(img[d], blk[d], st[d], pads[d] + pads[d + n], dil[d]) for d in range(n)]
    k = np.stack(np.meshgrid(*[np.arange(b) for b in blk], indexing="ij"), -1).reshape(-1, 1, n)
    q = np.stack(np.meshgrid(*[np.arange(b) for b in blocks], indexing="ij"), -1).reshape(1, -1, n)
    pos = q * np.array(st) - np.array(pads[:n]) + k * np.array(dil)
    inside = ((pos >= 0) & (pos < np.array(img))).all(-1)
    flat = (pos * np.array([math.prod(img[d + 1:]) for d in range(n)])).sum(-1)
    return np.where(inside, flat, -1).reshape(-1)


def _col2im_infer(attrs: dict, x: TensorType) -> TensorType:
    img, blk = tuple(attrs["image_shape"]), tuple(attrs["block_shape"])
    n = len(img)
    if x.rank != 3 or len(blk) != n or any(len(attrs[k]) != n for k in ("strides", "dilations")) \
            or len(attrs["pads"]) != 2 * n:
        raise UnsupportedShape("Col2Im needs input (N, C * prod(block), L) and per-dim attributes", op="Col2Im",
                               expected=f"rank 3, {n} values per attribute", found=f"rank {x.rank}")
    k = math.prod(blk)
    blocks = [conv_out_dim(img[d], blk[d], attrs["strides"][d], attrs["pads"][d] + attrs["pads"][d + n],
                           attrs["dilations"][d]) for d in range(n)]
    if x.shape[1] % k or x.shape[2] != math.prod(blocks) or min(blocks) < 1:
        raise MismatchingShape("input does not match the blocks of image_shape", op="Col2Im",
                               expected=f"(N, C * {k}, {math.prod(blocks)})", found=x.shape)
    return TensorType(x.dtype, (x.shape[0], x.shape[1] // k, *img))


@op("Col2Im", infer=_col2im_infer, dtypes=NUMERIC_TYPES,
    attrs={"image_shape": REQUIRED, "block_shape": REQUIRED, "strides": REQUIRED, "dilations": REQUIRED,
           "pads": REQUIRED})
def col2im(attrs: dict, x: np.ndarray) -> np.ndarray:
    """Sum each column entry into the image position its kernel offset and block reach (the inverse
    of im2col's gather)."""
    y = _col2im_infer(attrs, TensorType.of(x))
    tab = col2im_table(attrs)
    cols = x.reshape(y.shape[0] * y.shape[1], -1)
    out = np.zeros((cols.shape[0], math.prod(attrs["image_shape"]) + 1), dtype=np.float64 if x.dtype.kind == "f"
                   else x.dtype)
    np.add.at(out, (slice(None), np.where(tab < 0, out.shape[1] - 1, tab)), cols)
    return out[:, :-1].astype(x.dtype).reshape(y.shape)


# --- Normalization ---------------------------------------------------------------------------


def _bn_infer(attrs: dict, x: TensorType, *params: TensorType) -> TensorType:
    c = x.shape[1] if x.rank > 1 else None
    for p in params:
        if p.shape != (c,):
            raise MismatchingShape("BatchNormalization parameters need one value per channel",
                                   op="BatchNormalization", expected=(c,), found=p.shape)
    return x


def batchnorm_scale_shift(scale: np.ndarray, bias: np.ndarray, mean: np.ndarray, var: np.ndarray,
                          epsilon: float) -> tuple[np.ndarray, np.ndarray]:
    """Inference BatchNormalization as y = x * s + t per channel: s = scale / sqrt(var + eps),
    t = bias - mean * s (float64)."""
    s = scale.astype(np.float64) / np.sqrt(var.astype(np.float64) + epsilon)
    return s, bias.astype(np.float64) - mean.astype(np.float64) * s


@op("BatchNormalization", infer=_bn_infer, inputs=(5, 5), dtypes=FLOAT_TYPES, attrs={"epsilon": FROM_ONNX})
def batch_norm(attrs: dict, x, scale, bias, mean, var) -> np.ndarray:
    """Inference-mode batch normalization over dim 1."""
    shape = (1, -1) + (1,) * (x.ndim - 2)
    s, t = batchnorm_scale_shift(scale, bias, mean, var, attrs["epsilon"])
    return (x * s.reshape(shape) + t.reshape(shape)).astype(x.dtype)


@op("LRN", infer=lambda a, x: x, dtypes=FLOAT_TYPES,
    attrs={"size": REQUIRED, "alpha": FROM_ONNX, "beta": FROM_ONNX, "bias": FROM_ONNX})
def lrn(attrs: dict, x: np.ndarray) -> np.ndarray:
    """Local response normalization across channels."""
    size = attrs["size"]
    sq = np.square(x.astype(np.float64))
    c = x.shape[1]
    lo, hi = (size - 1) // 2, size // 2  # ONNX: floor((size-1)/2) before, ceil((size-1)/2) after
    hi = math.ceil((size - 1) / 2)
    padded = np.pad(sq, [(0, 0), (lo, hi)] + [(0, 0)] * (x.ndim - 2))
    s = sum(padded[:, i:i + c] for i in range(size))
    return (x / (attrs["bias"] + attrs["alpha"] / size * s) ** attrs["beta"]).astype(x.dtype)


def _ln_infer(attrs: dict, x: TensorType, scale: TensorType, *bias: TensorType) -> TensorType:
    axis = attrs["axis"]
    if not -x.rank <= axis < x.rank:
        raise UnsupportedAttribute("axis out of range", op="LayerNormalization", expected=f"< {x.rank}", found=axis)
    norm_shape = x.shape[axis % x.rank:]
    for t in (scale, *bias):
        broadcast_shapes(t.shape, norm_shape, op="LayerNormalization")
    return x


@op("LayerNormalization", infer=_ln_infer, inputs=(2, 3), dtypes=FLOAT_TYPES, attrs={"axis": FROM_ONNX,
    "epsilon": FROM_ONNX})
def layer_norm(attrs: dict, x: np.ndarray, scale: np.ndarray, *bias: np.ndarray) -> np.ndarray:
    """Normalize over dims axis..end, then scale and shift."""
    axes = tuple(range(attrs["axis"] % x.ndim, x.ndim))
    xd = x.astype(np.float64)
    mean = xd.mean(axis=axes, keepdims=True)
    var = np.square(xd - mean).mean(axis=axes, keepdims=True)
    y = (xd - mean) / np.sqrt(var + attrs["epsilon"]) * scale
    if bias:
        y = y + bias[0]
    return y.astype(x.dtype)


def _softmax_infer(name: str):
    def infer(attrs: dict, x: TensorType) -> TensorType:
        if not -x.rank <= attrs["axis"] < x.rank:
            raise UnsupportedAttribute("axis out of range", op=name, expected=f"-{x.rank}..{x.rank - 1}",
                                       found=attrs["axis"])
        return x

    return infer


@op("Softmax", infer=_softmax_infer("Softmax"), dtypes=FLOAT_TYPES, attrs={"axis": FROM_ONNX})
def softmax(attrs: dict, x: np.ndarray) -> np.ndarray:
    """exp(x - max) / sum over one axis (opset-13 semantics; the importer reshapes older ones)."""
    e = np.exp(x - x.max(axis=attrs["axis"], keepdims=True))
    return (e / e.sum(axis=attrs["axis"], keepdims=True)).astype(x.dtype)


@op("LogSoftmax", infer=_softmax_infer("LogSoftmax"), dtypes=FLOAT_TYPES, attrs={"axis": FROM_ONNX})
def log_softmax(attrs: dict, x: np.ndarray) -> np.ndarray:
    """x - max - log(sum(exp(x - max))) over one axis."""
    s = x - x.max(axis=attrs["axis"], keepdims=True)
    return (s - np.log(np.exp(s).sum(axis=attrs["axis"], keepdims=True))).astype(x.dtype)


# --- Matrix products -------------------------------------------------------------------------


def _gemm_infer(attrs: dict, a: TensorType, b: TensorType, *c: TensorType) -> TensorType:
    if a.rank != 2 or b.rank != 2:
        raise UnsupportedShape("Gemm operands must be matrices", op="Gemm", expected="rank 2",
                               found=f"{a.rank} and {b.rank}")
    check_fused("Gemm", attrs)
    m, k = a.shape[::-1] if attrs["transA"] else a.shape
    k2, n = b.shape[::-1] if attrs["transB"] else b.shape
    if k != k2:
        raise MismatchingShape("inner dimensions differ", op="Gemm", expected=k, found=k2)
    if c:
        broadcast_shapes(c[0].shape, (m, n), op="Gemm")
        if np.broadcast_shapes(c[0].shape, (m, n)) != (m, n):
            raise MismatchingShape("C must broadcast to the output", op="Gemm", expected=(m, n), found=c[0].shape)
    return TensorType(a.dtype, (m, n))


@op(
    "Gemm",
    infer=_gemm_infer,
    inputs=(2, 3),
    dtypes=FLOAT_TYPES,
    attrs={"alpha": FROM_ONNX, "beta": FROM_ONNX, "transA": FROM_ONNX, "transB": FROM_ONNX, **FUSED},
)
def gemm(attrs: dict, a: np.ndarray, b: np.ndarray, *c: np.ndarray) -> np.ndarray:
    """alpha * op(A) @ op(B) + beta * C, then the fused activation."""
    a = a.T if attrs["transA"] else a
    b = b.T if attrs["transB"] else b
    y = attrs["alpha"] * (accumulator(a) @ accumulator(b))
    if c:
        y = y + attrs["beta"] * c[0]
    return apply_activation(y.astype(a.dtype), attrs)


def matmul_shape(a: tuple, b: tuple, name: str = "MatMul") -> tuple:
    """numpy matmul shape rule, 1-D operands promoted and squeezed again."""
    a2 = (1, *a) if len(a) == 1 else a
    b2 = (*b, 1) if len(b) == 1 else b
    if len(a2) < 2 or len(b2) < 2 or a2[-1] != b2[-2]:
        raise MismatchingShape("inner dimensions differ", op=name, expected=a2[-1:], found=b2[-2:-1])
    batch = broadcast_shapes(a2[:-2], b2[:-2], op=name)
    out = (*batch, a2[-2], b2[-1])
    if len(a) == 1:
        out = out[:-2] + out[-1:]
    if len(b) == 1:
        out = out[:-1]
    return out


def _matmul_infer(attrs: dict, a: TensorType, b: TensorType) -> TensorType:
    if a.dtype != b.dtype:
        raise MismatchingDatatype("operands differ in element type", op="MatMul", expected=str(a.dtype),
                                  found=str(b.dtype))
    check_fused("MatMul", attrs)
    return TensorType(a.dtype, matmul_shape(a.shape, b.shape))


@op("MatMul", infer=_matmul_infer, inputs=(2, 2), dtypes=NUMERIC_TYPES, attrs=dict(FUSED))
def matmul(attrs: dict, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """numpy matmul (batched, broadcasting) summed in `accumulator`'s type, then the fused activation."""
    return apply_activation(np.matmul(accumulator(a), accumulator(b)).astype(a.dtype), attrs)


def _fc_infer(attrs: dict, x: TensorType, w: TensorType, b: TensorType) -> TensorType:
    if x.rank != 2 or w.rank != 2 or x.shape[1] != w.shape[0] or b.shape != (w.shape[1],):
        raise MismatchingShape("FullyConnected needs X (M, K), W (K, N), B (N)", op="FullyConnected",
                               expected="(M, K) (K, N) (N,)", found=f"{x.shape} {w.shape} {b.shape}")
    check_fused("FullyConnected", attrs)
    return TensorType(x.dtype, (x.shape[0], w.shape[1]))


@op("FullyConnected", infer=_fc_infer, inputs=(3, 3), dtypes=FLOAT_TYPES, attrs=dict(FUSED))
def fully_connected(attrs: dict, x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """X @ W + B with W stored (K, N), then the fused activation. Made by the optimizer from
    MatMul + Add and Gemm; never imported directly."""
    return apply_activation((accumulator(x) @ accumulator(w) + b).astype(x.dtype), attrs)


# --- SqueezeExcite (made by optimizer/squeeze_excite.py, never imported) ---------------------------

SE_GATES = ("sigmoid", "hard_sigmoid")


def _se_infer(attrs: dict, x: TensorType, w1: TensorType, b1: TensorType, w2: TensorType,
              b2: TensorType) -> TensorType:
    c = x.shape[1] if x.rank == 4 else None
    r = w1.shape[0] if w1.rank == 2 else None
    if c is None or w1.shape != (r, c) or b1.shape != (r,) or w2.shape != (c, r) or b2.shape != (c,):
        raise MismatchingShape("SqueezeExcite needs X (N, C, H, W), W1 (R, C), B1 (R), W2 (C, R), B2 (C)",
                               op="SqueezeExcite", expected="(N, C, H, W) (R, C) (R,) (C, R) (C,)",
                               found=f"{x.shape} {w1.shape} {b1.shape} {w2.shape} {b2.shape}")
    if any(t.dtype != x.dtype for t in (w1, b1, w2, b2)):
        raise MismatchingDatatype("weights differ from the input's type", op="SqueezeExcite",
                                  expected=str(x.dtype), found=[str(t.dtype) for t in (w1, b1, w2, b2)])
    if attrs["gate"] not in SE_GATES:
        raise UnsupportedAttribute("squeeze-excite gate", op="SqueezeExcite", expected=SE_GATES, found=attrs["gate"])
    check_fused("SqueezeExcite", attrs)
    check_fused("SqueezeExcite", {"activation": attrs["gate"], "activation_params": attrs["gate_params"]})
    return x


@op("SqueezeExcite", infer=_se_infer, inputs=(5, 5), dtypes=FLOAT_TYPES,
    attrs={**FUSED, "gate": "sigmoid", "gate_params": ()})
def squeeze_excite(attrs: dict, x: np.ndarray, w1: np.ndarray, b1: np.ndarray, w2: np.ndarray,
                   b2: np.ndarray) -> np.ndarray:
    """x * gate(W2 act(W1 mean_hw(x) + b1) + b2), the gate per (image, channel): GlobalAveragePool, a 1x1
    Conv with activation `activation`, a 1x1 Conv with activation `gate`, and the Mul by x, rounded as
    those ops are."""
    m = x.mean(axis=(2, 3), dtype=np.float64).astype(x.dtype)
    h = apply_activation((accumulator(m) @ accumulator(w1).T + b1).astype(x.dtype), attrs)
    s = (accumulator(h) @ accumulator(w2).T + b2).astype(x.dtype)
    s = apply_activation(s, {"activation": attrs["gate"], "activation_params": attrs["gate_params"]})
    return (x * s[:, :, None, None]).astype(x.dtype)


# --- Attention (made by optimizer/attention.py, never imported) ----------------------------------


def _attention_infer(attrs: dict, q: TensorType, kt: TensorType, v: TensorType, *mask: TensorType) -> TensorType:
    if min(q.rank, kt.rank, v.rank) < 2 or q.shape[-1] != kt.shape[-2] or kt.shape[-1] != v.shape[-2]:
        raise MismatchingShape("Attention needs Q (..., S, D), KT (..., D, T), V (..., T, E)", op="Attention",
                               expected="(..., S, D) (..., D, T) (..., T, E)", found=f"{q.shape} {kt.shape} {v.shape}")
    if any(t.dtype != q.dtype for t in (kt, v, *mask)):
        raise MismatchingDatatype("operands differ in element type", op="Attention", expected=str(q.dtype),
                                  found=[str(t.dtype) for t in (kt, v, *mask)])
    batch = broadcast_shapes(broadcast_shapes(q.shape[:-2], kt.shape[:-2], op="Attention"), v.shape[:-2],
                             op="Attention")
    scores = (*batch, q.shape[-2], kt.shape[-1])
    m = mask[0].shape if mask else ()
    if mask and (len(m) > len(scores) or any(a not in (1, c) for a, c in zip(m[::-1], scores[::-1]))):
        raise MismatchingShape("the mask must broadcast to the scores", op="Attention", expected=scores,
                               found=mask[0].shape)
    return TensorType(q.dtype, (*batch, q.shape[-2], v.shape[-1]))


@op("Attention", infer=_attention_infer, inputs=(3, 4), dtypes=FLOAT_TYPES, attrs={"scale": 1.0, "nan_to_zero": 0})
def attention(attrs: dict, q: np.ndarray, kt: np.ndarray, v: np.ndarray, *mask: np.ndarray) -> np.ndarray:
    """Softmax(Q @ KT * scale + mask) @ V, the softmax along the last axis; with nan_to_zero, NaN
    probabilities (a row masked to -inf throughout) are 0. Rounded as those ops are, one by one."""
    s = matmul(FUSED, q, kt)
    if attrs["scale"] != 1.0:
        s = (s * np.asarray(attrs["scale"], s.dtype)).astype(s.dtype)
    if mask:
        s = (s + mask[0]).astype(s.dtype)
    p = softmax({"axis": -1}, s)
    if attrs["nan_to_zero"]:
        p = np.where(np.isnan(p), np.zeros((), p.dtype), p)
    return matmul(FUSED, p, v)
