"""Neural-network ONNX ops: Conv, ConvTranspose, pooling, BatchNormalization, LRN, LayerNormalization,
Softmax/LogSoftmax, Gemm, MatMul. Every attribute's non-default values, 1-D/2-D/3-D spatial."""

from __future__ import annotations

import numpy as np
import pytest

import glowpy
from glowpy.errors import (
    InvalidModel,
    MismatchingShape,
    UnsupportedAttribute,
    UnsupportedDatatype,
    UnsupportedOperator,
)

from .util import Const, assert_same, check, expect_error, node_model, randint, randn, randpos, run_oracle

# --- Conv ------------------------------------------------------------------------------------------

# name -> (x shape, w shape, attrs, with bias)
CONV = {
    "2d-plain": ((1, 3, 7, 7), (4, 3, 3, 3), {}, True),
    "2d-no-bias": ((2, 3, 6, 5), (4, 3, 3, 3), {}, False),
    "2d-pads": ((1, 2, 5, 5), (3, 2, 3, 3), {"pads": [1, 1, 1, 1]}, True),
    "2d-asym-pads": ((1, 2, 5, 6), (3, 2, 3, 2), {"pads": [0, 2, 1, 0]}, True),
    "2d-strides": ((1, 2, 8, 7), (3, 2, 3, 3), {"strides": [2, 3]}, True),
    "2d-dilations": ((1, 2, 9, 8), (3, 2, 3, 2), {"dilations": [2, 3]}, True),
    "2d-all": ((2, 4, 9, 10), (6, 2, 3, 2), {"strides": [2, 1], "dilations": [1, 2], "pads": [1, 0, 2, 1],
                                             "group": 2}, True),
    "2d-group": ((1, 4, 5, 5), (6, 2, 3, 3), {"group": 2}, True),
    "2d-depthwise": ((1, 4, 6, 6), (4, 1, 3, 3), {"group": 4, "pads": [1, 1, 1, 1]}, True),
    "2d-depthwise-mult": ((1, 3, 5, 5), (6, 1, 3, 3), {"group": 3}, True),
    "2d-1x1": ((1, 5, 4, 4), (2, 5, 1, 1), {}, True),
    "2d-kernel-shape": ((1, 2, 5, 5), (3, 2, 3, 3), {"kernel_shape": [3, 3]}, True),
    "same-upper": ((1, 2, 7, 6), (3, 2, 3, 4), {"auto_pad": "SAME_UPPER"}, True),
    "same-lower": ((1, 2, 7, 6), (3, 2, 3, 4), {"auto_pad": "SAME_LOWER"}, True),
    "same-upper-stride": ((1, 2, 7, 8), (3, 2, 3, 3), {"auto_pad": "SAME_UPPER", "strides": [2, 3]}, True),
    "same-lower-stride": ((1, 2, 7, 8), (3, 2, 2, 3), {"auto_pad": "SAME_LOWER", "strides": [2, 3]}, True),
    "same-upper-dilated": ((1, 2, 7, 8), (3, 2, 3, 2), {"auto_pad": "SAME_UPPER", "dilations": [2, 2]}, True),
    "valid": ((1, 2, 7, 6), (3, 2, 3, 2), {"auto_pad": "VALID", "strides": [2, 2]}, True),
    "1d": ((2, 3, 10), (4, 3, 3), {"strides": [2], "pads": [1, 2]}, True),
    "1d-dilated": ((1, 2, 11), (2, 2, 4), {"dilations": [3]}, False),
    "3d": ((1, 2, 4, 5, 4), (3, 2, 2, 3, 2), {"pads": [1, 0, 1, 0, 1, 1], "strides": [1, 2, 1]}, True),
}


@pytest.mark.parametrize("case", list(CONV))
def test_conv(backend, case):
    xs, ws, attrs, bias = CONV[case]
    ins = [randn(*xs), Const(randn(*ws, seed=1))] + ([Const(randn(ws[0], seed=2))] if bias else [])
    check(backend, "Conv", ins, opset=11, attrs=attrs)


@pytest.mark.parametrize("opset", [7, 11, 22])
def test_conv_opsets(backend, opset):
    check(backend, "Conv", [randn(1, 2, 5, 5), Const(randn(3, 2, 3, 3, seed=1)), Const(randn(3, seed=2))],
          opset=opset, attrs={"pads": [1, 0, 0, 1]})


def test_conv_runtime_weight(backend):
    check(backend, "Conv", [randn(1, 2, 5, 5), randn(3, 2, 3, 3, seed=1), randn(3, seed=2)], opset=11)


def test_conv_f64(backend):
    check(backend, "Conv", [randn(1, 2, 5, 5, dtype=np.float64), Const(randn(3, 2, 3, 3, seed=1, dtype=np.float64))],
          opset=11, attrs={"strides": [2, 2]})


@pytest.mark.parametrize("attrs,word", [
    ({"auto_pad": "FOO"}, "auto_pad"),
    ({"bogus": 1}, "bogus"),
    ({"strides": [0, 1]}, "strides"),
    ({"group": 0}, "group"),
], ids=["auto_pad-FOO", "unknown-attr", "stride-0", "group-0"])
def test_conv_bad_attribute(attrs, word):
    expect_error(UnsupportedAttribute, "Conv", [randn(1, 2, 5, 5), Const(randn(3, 2, 3, 3))], opset=11,
                 attrs=attrs, mentions=[word])


def test_conv_int_unsupported():
    expect_error(UnsupportedDatatype, "Conv", [randint(1, 2, 5, 5, dtype=np.int32),
                                               Const(randint(3, 2, 3, 3, dtype=np.int32))], opset=11,
                 mentions=["int32"])


# --- ConvTranspose ---------------------------------------------------------------------------------

CONVT = {
    "plain": ((1, 2, 4, 4), (2, 3, 3, 3), {}, True),
    "no-bias": ((2, 2, 3, 4), (2, 3, 3, 2), {}, False),
    "strides": ((1, 2, 3, 4), (2, 3, 3, 3), {"strides": [2, 3]}, True),
    "pads": ((1, 2, 4, 4), (2, 3, 3, 3), {"strides": [2, 2], "pads": [1, 0, 1, 2]}, True),
    "dilations": ((1, 2, 4, 3), (2, 2, 3, 2), {"dilations": [2, 3]}, True),
    "output-padding": ((1, 2, 3, 3), (2, 3, 3, 3), {"strides": [2, 3], "output_padding": [1, 2]}, True),
    "output-shape": ((1, 2, 3, 3), (2, 3, 3, 3), {"strides": [2, 2], "output_shape": [6, 7]}, True),
    "output-shape-odd": ((1, 1, 3, 4), (1, 2, 3, 3), {"strides": [3, 2], "output_shape": [8, 7]}, True),
    "group": ((1, 4, 3, 3), (4, 2, 3, 3), {"group": 2, "strides": [2, 1]}, True),
    "depthwise": ((1, 3, 3, 3), (3, 1, 2, 2), {"group": 3, "strides": [2, 2]}, True),
    "same-upper": ((1, 2, 3, 4), (2, 3, 3, 3), {"auto_pad": "SAME_UPPER", "strides": [2, 2]}, True),
    "same-lower": ((1, 2, 3, 4), (2, 3, 3, 3), {"auto_pad": "SAME_LOWER", "strides": [2, 2]}, True),
    "same-upper-odd": ((1, 2, 3, 3), (2, 3, 4, 2), {"auto_pad": "SAME_UPPER", "strides": [1, 3]}, True),
    "same-lower-odd": ((1, 2, 3, 3), (2, 3, 4, 2), {"auto_pad": "SAME_LOWER", "strides": [1, 3]}, True),
    "valid": ((1, 2, 3, 4), (2, 3, 3, 3), {"auto_pad": "VALID", "strides": [2, 2]}, True),
    "1d": ((1, 2, 5), (2, 3, 3), {"strides": [2], "pads": [1, 1]}, True),
    "3d": ((1, 2, 2, 3, 2), (2, 2, 2, 2, 3), {"strides": [2, 1, 2]}, True),
}


@pytest.mark.parametrize("case", list(CONVT))
def test_conv_transpose(backend, case):
    xs, ws, attrs, bias = CONVT[case]
    m = ws[1] * attrs.get("group", 1)
    ins = [randn(*xs), Const(randn(*ws, seed=1))] + ([Const(randn(m, seed=2))] if bias else [])
    # onnx.reference's ConvTranspose fails on output_shape (it crops nothing) and on group > 1 (it
    # mixes up the per-group weights); onnxruntime is the oracle there.
    broken = "output_shape" in attrs or attrs.get("group", 1) > 1
    check(backend, "ConvTranspose", ins, opset=11, attrs=attrs, oracle="onnxruntime" if broken else "reference")


@pytest.mark.parametrize("auto_pad", ["NOTSET", "SAME_UPPER", "SAME_LOWER"])
def test_conv_transpose_output_shape_pads(backend, auto_pad):
    """output_shape crops the full output by pads that split the excess: the bigger half at the
    beginning, except SAME_UPPER (spec equations). Checked against explicit pads on the reference."""
    x, w = randn(1, 2, 3, 3), Const(randn(2, 3, 3, 3, seed=1))
    got = check(backend, "ConvTranspose", [x, w], opset=11, oracle="onnxruntime",
                attrs={"strides": [2, 2], "output_shape": [6, 6], "auto_pad": auto_pad})
    pads = [0, 0, 1, 1] if auto_pad == "SAME_UPPER" else [1, 1, 0, 0]
    model, feeds = node_model("ConvTranspose", [x, w], opset=11, attrs={"strides": [2, 2], "pads": pads})
    assert_same("explicit pads", got["out0"], run_oracle(model, feeds)[0])


@pytest.mark.parametrize("output_shape", [[9, 10], [10, 9]])
def test_conv_transpose_output_shape_larger_than_full(backend, output_shape):
    """A kernel smaller than the stride: the full output (8 x 8) is extended at the end to the requested
    size, the extension holding just the bias (onnxruntime; the reference agrees at batch 1, group 1)."""
    x, w, b = randn(1, 2, 3, 3), Const(randn(2, 3, 2, 2, seed=1)), Const(randn(3, seed=2))
    check(backend, "ConvTranspose", [x, w, b], opset=11, attrs={"strides": [3, 3], "output_shape": output_shape},
          oracle="onnxruntime")
    check(backend, "ConvTranspose", [x, w, b], opset=11, attrs={"strides": [3, 3], "output_shape": output_shape})


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER"])
def test_conv_transpose_same_kernel_smaller_than_stride(backend, auto_pad):
    """SAME asks for input * stride (9) from a full output of 8: the spec's pad equations give negative
    pads that extend it (onnx.reference; onnxruntime instead clamps the output to 8)."""
    x, w, b = randn(1, 2, 3, 3), Const(randn(2, 3, 2, 2, seed=1)), Const(randn(3, seed=2))
    check(backend, "ConvTranspose", [x, w, b], opset=11, attrs={"strides": [3, 3], "auto_pad": auto_pad})
    check(backend, "ConvTranspose", [x, w], opset=11, attrs={"strides": [3, 4], "auto_pad": auto_pad})


@pytest.mark.parametrize("opset", [7, 22])
def test_conv_transpose_opsets(backend, opset):
    check(backend, "ConvTranspose", [randn(1, 2, 3, 3), Const(randn(2, 2, 3, 3, seed=1))], opset=opset,
          attrs={"strides": [2, 2]})


def test_conv_transpose_bad_auto_pad():
    expect_error(UnsupportedAttribute, "ConvTranspose", [randn(1, 2, 3, 3), Const(randn(2, 2, 3, 3))], opset=11,
                 attrs={"auto_pad": "FOO"}, mentions=["auto_pad"])


# --- pooling ---------------------------------------------------------------------------------------

POOL = {
    "k2": ((1, 2, 6, 6), {"kernel_shape": [2, 2]}),
    "k3-s2": ((2, 3, 7, 8), {"kernel_shape": [3, 3], "strides": [2, 2]}),
    "k-rect-s-rect": ((1, 2, 9, 8), {"kernel_shape": [3, 2], "strides": [2, 3]}),
    "pads": ((1, 2, 5, 5), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),
    "asym-pads": ((1, 2, 6, 5), {"kernel_shape": [3, 2], "pads": [0, 1, 2, 0], "strides": [2, 1]}),
    "ceil": ((1, 2, 7, 6), {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1}),
    "ceil-k3": ((1, 2, 8, 8), {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
    "ceil-pads": ((1, 1, 6, 7), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1],
                                 "ceil_mode": 1}),
    "ceil-exact": ((1, 1, 7, 7), {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
    "same-upper": ((1, 2, 7, 6), {"kernel_shape": [3, 2], "strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    "same-lower": ((1, 2, 7, 6), {"kernel_shape": [3, 2], "strides": [2, 2], "auto_pad": "SAME_LOWER"}),
    "same-upper-s1": ((1, 2, 5, 5), {"kernel_shape": [2, 3], "auto_pad": "SAME_UPPER"}),
    "same-lower-s1": ((1, 2, 5, 5), {"kernel_shape": [2, 3], "auto_pad": "SAME_LOWER"}),
    "valid": ((1, 2, 7, 6), {"kernel_shape": [3, 2], "strides": [2, 2], "auto_pad": "VALID"}),
    "1d": ((2, 3, 9), {"kernel_shape": [3], "strides": [2], "pads": [1, 0]}),
    "3d": ((1, 2, 4, 5, 4), {"kernel_shape": [2, 2, 2], "strides": [2, 1, 2]}),
}


# onnx.reference's MaxPool gets these wrong (SAME_LOWER with strides: one row short; stride 1 with
# asymmetric pads: it reads the pads as (begin, end) per axis); onnxruntime is the oracle there.
MAXPOOL_REFERENCE_BROKEN = {"same-lower", "stride1-asym-pads"}
POOL["stride1-asym-pads"] = ((1, 2, 5, 5), {"kernel_shape": [2, 2], "pads": [1, 1, 0, 0]})


@pytest.mark.parametrize("case", list(POOL))
@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
def test_pool(backend, op, case):
    xs, attrs = POOL[case]
    broken = op == "MaxPool" and case in MAXPOOL_REFERENCE_BROKEN
    check(backend, op, [randn(*xs)], opset=11, attrs=attrs, oracle="onnxruntime" if broken else "reference")


@pytest.mark.parametrize("case", ["pads", "asym-pads", "ceil-pads", "1d", "k3-s2"])
def test_average_pool_count_include_pad(backend, case):
    xs, attrs = POOL[case]
    check(backend, "AveragePool", [randn(*xs)], opset=11, attrs={**attrs, "count_include_pad": 1})


@pytest.mark.parametrize("attrs", [
    {"kernel_shape": [2, 2], "dilations": [2, 2]},
    {"kernel_shape": [3, 2], "dilations": [2, 3], "strides": [2, 1], "pads": [1, 1, 2, 0]},
    {"kernel_shape": [2, 2], "dilations": [2, 2], "strides": [2, 2], "ceil_mode": 1},
], ids=["dil2", "dil-pads", "dil-ceil"])
def test_max_pool_dilations(backend, attrs):
    check(backend, "MaxPool", [randn(1, 2, 9, 8)], opset=12, attrs=attrs)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.float64, np.float16], ids=["i8", "u8", "f64", "f16"])
def test_max_pool_dtypes(backend, dtype):
    x = randint(1, 2, 5, 5, low=0 if np.dtype(dtype).kind == "u" else -100, high=100).astype(dtype)
    check(backend, "MaxPool", [x], opset=12, attrs={"kernel_shape": [3, 2], "strides": [2, 1]},
          oracle="reference" if np.dtype(dtype).kind == "f" else "onnxruntime")  # reference pads ints with NaN
    check(backend, "MaxPool", [x], opset=12, attrs={"kernel_shape": [2, 2], "pads": [1, 1, 0, 0]},
          oracle="onnxruntime")  # see MAXPOOL_REFERENCE_BROKEN


@pytest.mark.parametrize("opset", [7, 8, 10, 12, 22])
@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
def test_pool_opsets(backend, op, opset):
    check(backend, op, [randn(1, 2, 6, 5)], opset=opset, attrs={"kernel_shape": [3, 2], "pads": [1, 0, 1, 1],
                                                                 "strides": [2, 2]})


@pytest.mark.parametrize("storage_order", [0, 1])
@pytest.mark.parametrize("case", ["k2", "k3-s2", "pads", "ceil-pads", "1d", "3d", "dil"])
def test_max_pool_indices(backend, case, storage_order):
    xs, attrs = POOL[case] if case != "dil" else ((1, 2, 9, 8), {"kernel_shape": [3, 2], "dilations": [2, 3],
                                                                  "pads": [1, 1, 2, 0]})
    x = randint(*xs, low=-3, high=4).astype(np.float32)  # ties: the first in window order wins
    # onnx.reference's indices are wrong at stride 1 (they point outside the window): onnxruntime there
    stride1 = "strides" not in attrs
    check(backend, "MaxPool", [x], opset=12, attrs={**attrs, "storage_order": storage_order}, outputs=2,
          oracle="onnxruntime" if stride1 else "reference")


def test_max_pool_indices_only_output(backend):
    check(backend, "MaxPool", [randn(2, 3, 5, 6)], opset=8, attrs={"kernel_shape": [2, 3], "strides": [1, 2]},
          outputs=["", "idx"])


@pytest.mark.parametrize("attrs", [
    {"kernel_shape": [2, 2], "dilations": [2, 2]},
    {"kernel_shape": [3, 2], "dilations": [2, 3], "strides": [2, 1], "pads": [1, 1, 2, 0], "count_include_pad": 1},
    {"kernel_shape": [3, 2], "dilations": [2, 3], "strides": [2, 1], "pads": [1, 1, 2, 0]},
    {"kernel_shape": [2, 2], "dilations": [2, 2], "strides": [2, 2], "ceil_mode": 1},
], ids=["dil2", "dil-pads-count", "dil-pads", "dil-ceil"])
def test_average_pool_dilations(backend, attrs):
    check(backend, "AveragePool", [randn(1, 2, 9, 8)], opset=19, attrs=attrs)


@pytest.mark.parametrize("p", [1, 2, 3])
@pytest.mark.parametrize("case", ["k3-s2", "k-rect-s-rect", "1d", "3d", "pads", "same-upper", "dil"])
def test_lp_pool(backend, case, p):
    xs, attrs = POOL[case] if case != "dil" else ((1, 2, 9, 8), {"kernel_shape": [2, 2], "dilations": [2, 3]})
    # onnx.reference scales a window reaching into padding by kernel size / cells inside (it averages,
    # then multiplies by the kernel size): onnxruntime, which sums the cells, where there is padding
    padded = "pads" in attrs or "auto_pad" in attrs
    check(backend, "LpPool", [randn(*xs)], opset=19 if case == "dil" else 11, attrs={**attrs, "p": p},
          oracle="onnxruntime" if padded else "reference")


@pytest.mark.parametrize("opset", [7, 18, 22])
def test_lp_pool_opsets(backend, opset):
    check(backend, "LpPool", [randn(1, 3, 6, 7)], opset=opset, attrs={"kernel_shape": [3, 2], "strides": [2, 2]})


@pytest.mark.parametrize("p", [1, 2, 3])
@pytest.mark.parametrize("shape", [(2, 3, 5, 4), (1, 2, 7), (1, 2, 3, 2, 4)])
def test_global_lp_pool(backend, shape, p):
    # onnx.reference has no GlobalLpPool: onnxruntime
    check(backend, "GlobalLpPool", [randn(*shape)], opset=7, attrs={"p": p} if p != 2 else {}, oracle="onnxruntime")


@pytest.mark.parametrize("case", ["k2s2", "k3s2-pads", "1d", "output-shape"])
def test_max_unpool(backend, case):
    # the indices a MaxPool of the same attributes gives on an input of the unpooled shape (they number
    # that shape, as onnx.reference and onnx's node tests read them; output_shape pads it at the end)
    xs, attrs, out = {"k2s2": ((1, 2, 6, 6), {"kernel_shape": [2, 2], "strides": [2, 2]}, None),
                      "k3s2-pads": ((2, 1, 7, 5), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
                                    None),
                      "1d": ((1, 3, 9), {"kernel_shape": [3], "strides": [3]}, None),
                      "output-shape": ((1, 2, 4, 4), {"kernel_shape": [2, 2], "strides": [2, 2]}, (1, 2, 5, 6))}[case]
    model, feeds = node_model("MaxPool", [randn(*xs)], opset=12, attrs=attrs, outputs=2)
    y, idx = run_oracle(model, feeds)
    ins = [y, idx] + ([Const(np.array(out, dtype=np.int64))] if out else [])
    check(backend, "MaxUnpool", ins, opset=11, attrs=attrs)
    check(backend, "MaxUnpool", ins, opset=9 if not out else 11, attrs=attrs)


def test_max_unpool_bad_indices():
    expect_error(MismatchingShape, "MaxUnpool", [randn(1, 1, 2, 2), randint(1, 1, 2, 3, low=0, high=4)], opset=11,
                 attrs={"kernel_shape": [2, 2], "strides": [2, 2]}, mentions=["indices"])


def test_pool_missing_kernel_shape():
    expect_error(UnsupportedAttribute, "MaxPool", [randn(1, 2, 4, 4)], opset=12, mentions=["kernel_shape"])


def test_pool_bad_auto_pad():
    expect_error(UnsupportedAttribute, "AveragePool", [randn(1, 2, 4, 4)], opset=12,
                 attrs={"kernel_shape": [2, 2], "auto_pad": "SAME"}, mentions=["auto_pad"])


@pytest.mark.parametrize("shape", [(2, 3, 5, 4), (1, 2, 7), (1, 2, 3, 2, 4), (1, 1, 1, 1)],
                         ids=["2d", "1d", "3d", "1x1"])
@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
def test_global_pool(backend, op, shape):
    # onnx.reference's GlobalMaxPool reduces the wrong axes unless there are exactly 2 spatial dims.
    oracle = "onnxruntime" if op == "GlobalMaxPool" and len(shape) != 4 else "reference"
    check(backend, op, [randn(*shape)], opset=7, oracle=oracle)
    if oracle == "reference":  # (onnxruntime has no double GlobalMaxPool)
        check(backend, op, [randn(*shape, dtype=np.float64)], opset=22)


def test_global_max_pool_f16(backend):
    check(backend, "GlobalMaxPool", [randn(1, 3, 4, 4, dtype=np.float16)], opset=22)


# --- BatchNormalization ----------------------------------------------------------------------------


def _bn_inputs(shape, dtype=np.float32, param_dtype=None):
    c = shape[1]
    p = param_dtype or dtype
    return [randn(*shape, dtype=dtype), Const(randn(c, seed=1, dtype=p)), Const(randn(c, seed=2, dtype=p)),
            Const(randn(c, seed=3, dtype=p)), Const(randpos(c, seed=4, dtype=p))]


@pytest.mark.parametrize("attrs", [{}, {"epsilon": 1e-2}, {"epsilon": 0.3, "momentum": 0.5}],
                         ids=["default", "eps", "eps+momentum"])
@pytest.mark.parametrize("opset", [7, 9, 14, 15])
def test_batch_norm(backend, opset, attrs):
    # Before opset 14 onnx.reference runs BatchNormalization in training mode (momentum is always set),
    # and at opset 7 it fails outright; onnxruntime implements the inference semantics of the spec.
    check(backend, "BatchNormalization", _bn_inputs((2, 3, 4, 5)), opset=opset, attrs=attrs,
          oracle="reference" if opset >= 14 else "onnxruntime")


@pytest.mark.parametrize("shape", [(2, 3), (2, 3, 5), (1, 2, 2, 3, 2)], ids=["2d", "3d", "5d"])
def test_batch_norm_ranks(backend, shape):
    check(backend, "BatchNormalization", _bn_inputs(shape), opset=15)


def test_batch_norm_spatial_attr(backend):
    check(backend, "BatchNormalization", _bn_inputs((1, 3, 2, 2)), opset=7, attrs={"spatial": 1},
          oracle="onnxruntime")


def test_batch_norm_runtime_params(backend):
    ins = [x.array if isinstance(x, Const) else x for x in _bn_inputs((2, 3, 4))]
    check(backend, "BatchNormalization", ins, opset=15)


def test_batch_norm_f64(backend):
    check(backend, "BatchNormalization", _bn_inputs((2, 3, 4), dtype=np.float64), opset=15)


def test_batch_norm_mixed_param_type(backend):
    # opset 15: scale/bias (T1) and mean/var (T2) may differ from X.
    x, s, b, m, v = _bn_inputs((2, 3, 4), dtype=np.float16)
    s, b, m, v = (Const(c.array.astype(np.float32)) for c in (s, b, m, v))
    check(backend, "BatchNormalization", [x, s, b, m, v], opset=15)


def test_batch_norm_training_mode_unsupported():
    expect_error(UnsupportedAttribute, "BatchNormalization", _bn_inputs((2, 3, 4)), opset=14,
                 attrs={"training_mode": 1}, mentions=["training_mode"])


def test_batch_norm_spatial_0_unsupported():
    expect_error(UnsupportedAttribute, "BatchNormalization", _bn_inputs((2, 3, 4)), opset=7,
                 attrs={"spatial": 0}, mentions=["spatial"])


def test_batch_norm_training_outputs_unsupported():
    expect_error(UnsupportedOperator, "BatchNormalization", _bn_inputs((2, 3, 4)), opset=9,
                 outputs=3, mentions=["output"])


# --- LRN -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("attrs", [
    {"size": 1}, {"size": 2}, {"size": 3}, {"size": 4}, {"size": 5},
    {"size": 3, "alpha": 0.01, "beta": 0.5, "bias": 2.0},
    {"size": 7},
], ids=["s1", "s2", "s3", "s4", "s5", "s3-params", "s7-gt-C"])
def test_lrn(backend, attrs):
    # onnx.reference's LRN loops over range(N) instead of range(C): it is right only when N == C.
    check(backend, "LRN", [randn(5, 5, 3, 2) * 3], opset=13, attrs=attrs)


def test_lrn_opset7_3d(backend):
    """LRN on N x C x D equals LRN on N x C x D x 1 (the reference only takes 4-D input)."""
    x = randn(4, 4, 6)
    got = glowpy.compile(node_model("LRN", [x], opset=7, attrs={"size": 3, "alpha": 0.1})[0],
                         backend=backend).run({"in0": x})
    model, feeds = node_model("LRN", [x[..., None]], opset=7, attrs={"size": 3, "alpha": 0.1})
    assert_same("LRN 3-D", got["out0"], run_oracle(model, feeds)[0][..., 0])


def test_lrn_missing_size():
    expect_error(UnsupportedAttribute, "LRN", [randn(1, 4, 3, 3)], opset=13, mentions=["size"])


# --- LayerNormalization ----------------------------------------------------------------------------

LN = {
    "last": ((2, 3, 4), -1, (4,), True),
    "no-bias": ((2, 3, 4), -1, (4,), False),
    "axis1": ((2, 3, 4), 1, (3, 4), True),
    "axis-2": ((2, 3, 4), -2, (3, 4), True),
    "axis0": ((2, 3), 0, (2, 3), True),
    "bcast-scale": ((2, 3, 4), 1, (1, 4), True),
}


@pytest.mark.parametrize("eps", [None, 1e-2])
@pytest.mark.parametrize("case", list(LN))
def test_layer_norm(backend, case, eps):
    xs, axis, ps, bias = LN[case]
    attrs = {"axis": axis} | ({} if eps is None else {"epsilon": eps})
    ins = [randn(*xs) * 2 + 1, Const(randn(*ps, seed=1))] + ([Const(randn(*ps, seed=2))] if bias else [])
    check(backend, "LayerNormalization", ins, opset=17, attrs=attrs)


def test_layer_norm_default_axis_f64(backend):
    check(backend, "LayerNormalization", [randn(3, 5, dtype=np.float64), Const(randn(5, seed=1, dtype=np.float64))],
          opset=17)


@pytest.mark.parametrize("axis", [1, -1])
def test_layer_norm_mean_inv_std_outputs(backend, axis):
    check(backend, "LayerNormalization", [randn(2, 3, 4) * 3 + 1, Const(randn(3, 4)[-1:] if axis == -1 else randn(3, 4))],
          opset=17, attrs={"axis": axis, "epsilon": 1e-3}, outputs=3)
    check(backend, "LayerNormalization", [randn(2, 5), Const(randn(5))], opset=17, outputs=["y", "", "inv"])


# --- InstanceNormalization, GroupNormalization, RMSNormalization, MeanVarianceNormalization,
# LpNormalization ------------------------------------------------------------------------------------


@pytest.mark.parametrize("opset", [7, 22])
@pytest.mark.parametrize("shape", [(2, 3, 5, 4), (1, 4, 7), (1, 2, 3, 2, 4)])
def test_instance_norm(backend, shape, opset):
    c = shape[1]
    check(backend, "InstanceNormalization", [randn(*shape) * 2 + 1, Const(randn(c, seed=1)), Const(randn(c, seed=2))],
          opset=opset, attrs={"epsilon": 1e-3} if len(shape) == 4 else {})


def test_instance_norm_runtime_params(backend):
    check(backend, "InstanceNormalization", [randn(1, 3, 6) + 2, randn(3, seed=1), randn(3, seed=2)], opset=7)


def test_instance_norm_bad_scale():
    expect_error(InvalidModel, "InstanceNormalization", [randn(1, 3, 4), Const(randn(2)), Const(randn(3))], opset=7,
                 mentions=["per channel"])


@pytest.mark.parametrize("opset", [18, 21])
@pytest.mark.parametrize("groups", [1, 2, 4])
def test_group_norm(backend, opset, groups):
    per = groups if opset == 18 else 4
    check(backend, "GroupNormalization", [randn(2, 4, 3, 5) * 2 + 1, Const(randn(per, seed=1)),
                                          Const(randn(per, seed=2))],
          opset=opset, attrs={"num_groups": groups, "epsilon": 1e-3})


def test_group_norm_bad_groups():
    expect_error(UnsupportedAttribute, "GroupNormalization", [randn(1, 4, 3), Const(randn(4)), Const(randn(4))],
                 opset=21, attrs={"num_groups": 3}, mentions=["num_groups"])


@pytest.mark.parametrize("axis, scale", [(-1, (6,)), (1, (4, 6)), (0, (3, 4, 6)), (-2, (1, 6))])
def test_rms_norm(backend, axis, scale):
    check(backend, "RMSNormalization", [randn(3, 4, 6) + 0.5, Const(randn(*scale, seed=1))], opset=23,
          attrs={"axis": axis, "epsilon": 1e-3})


@pytest.mark.parametrize("opset, attrs", [(9, {}), (13, {"axes": [1, 2]}), (13, {"axes": [0]})])
def test_mean_variance_norm(backend, opset, attrs):
    check(backend, "MeanVarianceNormalization", [randn(2, 3, 4, 5) * 2 + 1], opset=opset, attrs=attrs)


@pytest.mark.parametrize("opset", [1, 22])
@pytest.mark.parametrize("p, axis", [(2, -1), (2, 0), (1, 1), (1, -1)])
def test_lp_norm(backend, p, axis, opset):
    # onnx.reference sums x ** p without |x| (wrong for p = 1 and negative x): positive data for p = 1
    x = randpos(3, 4, 5) if p == 1 else randn(3, 4, 5)
    x[0, 0] = 0.0  # a zero row along each axis: norm 0 gives 0
    x[:, :, 0] = 0.0
    check(backend, "LpNormalization", [x], opset=max(opset, 7), attrs={"p": p, "axis": axis})


def test_lp_norm_l1_negative(backend):
    # the spec's |x|: onnxruntime (onnx.reference omits the abs)
    check(backend, "LpNormalization", [randn(3, 5)], opset=7, attrs={"p": 1}, oracle="onnxruntime")


def test_layer_norm_stash_type_unsupported():
    expect_error(UnsupportedAttribute, "LayerNormalization", [randn(2, 4), Const(randn(4))], opset=17,
                 attrs={"stash_type": 0}, mentions=["stash_type"])


# --- Softmax / LogSoftmax --------------------------------------------------------------------------


@pytest.mark.parametrize("axis", [None, 0, 1, 2, -1, -2, -3])
@pytest.mark.parametrize("opset", [7, 11, 13])
@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_softmax(backend, op, opset, axis):
    # Before opset 13 the input is coerced to 2-D at `axis` (normalized over all the trailing dims);
    # onnx.reference ignores that (it normalizes over one axis), onnxruntime follows the spec.
    attrs = {} if axis is None else {"axis": axis}
    check(backend, op, [randn(2, 3, 4) * 3], opset=opset, attrs=attrs,
          oracle="reference" if opset >= 13 else "onnxruntime")


def test_softmax_pre13_coerces_to_2d(backend):
    """Softmax-11 at axis 1 of (2, 3, 4) is softmax over each row of the (2, 12) matrix."""
    x = randn(2, 3, 4)
    got = check(backend, "Softmax", [x], opset=11, attrs={"axis": 1}, oracle="onnxruntime")["out0"]
    e = np.exp(x.reshape(2, 12) - x.reshape(2, 12).max(axis=1, keepdims=True))
    np.testing.assert_allclose(got, (e / e.sum(axis=1, keepdims=True)).reshape(2, 3, 4), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_softmax_2d_and_4d(backend, op):
    check(backend, op, [randn(3, 5)], opset=13)
    check(backend, op, [randn(3, 5)], opset=11)  # axis 1 of a matrix: the same either way
    check(backend, op, [randn(2, 3, 2, 2)], opset=11, attrs={"axis": 2}, oracle="onnxruntime")
    check(backend, op, [randn(2, 3, 2, 2, dtype=np.float64)], opset=13, attrs={"axis": 1})


def test_softmax_axis_out_of_range():
    expect_error(UnsupportedAttribute, "Softmax", [randn(2, 3)], opset=13, attrs={"axis": 2}, mentions=["axis"])


# --- Gemm ------------------------------------------------------------------------------------------

GEMM = {
    "plain": ((3, 4), (4, 5), (3, 5), {}),
    "transA": ((4, 3), (4, 5), (3, 5), {"transA": 1}),
    "transB": ((3, 4), (5, 4), (3, 5), {"transB": 1}),
    "transAB": ((4, 3), (5, 4), (3, 5), {"transA": 1, "transB": 1}),
    "alpha-beta": ((3, 4), (4, 5), (3, 5), {"alpha": 0.5, "beta": 2.0}),
    "beta0": ((3, 4), (4, 5), (3, 5), {"beta": 0.0}),
    "c-row": ((3, 4), (4, 5), (5,), {}),
    "c-col": ((3, 4), (4, 5), (3, 1), {"alpha": -1.0}),
    "c-scalar": ((3, 4), (4, 5), (), {"beta": 3.0}),
    "c-1x1": ((3, 4), (4, 5), (1, 1), {}),
    "all": ((4, 3), (5, 4), (1, 5), {"transA": 1, "transB": 1, "alpha": 1.5, "beta": -0.5}),
}


@pytest.mark.parametrize("opset", [7, 9, 11, 13])
@pytest.mark.parametrize("case", list(GEMM))
def test_gemm(backend, case, opset):
    a, b, c, attrs = GEMM[case]
    check(backend, "Gemm", [randn(*a), Const(randn(*b, seed=1)), Const(randn(*c, seed=2))], opset=opset,
          attrs=attrs)


@pytest.mark.parametrize("attrs", [{}, {"transA": 1, "alpha": 2.0}], ids=["plain", "transA-alpha"])
@pytest.mark.parametrize("opset", [11, 13])
def test_gemm_without_c(backend, opset, attrs):
    a = (4, 3) if attrs.get("transA") else (3, 4)
    check(backend, "Gemm", [randn(*a), Const(randn(4, 5, seed=1))], opset=opset, attrs=attrs)


def test_gemm_runtime_operands(backend):
    check(backend, "Gemm", [randn(3, 4), randn(5, 4, seed=1), randn(5, seed=2)], opset=13, attrs={"transB": 1})


def test_gemm_f64(backend):
    check(backend, "Gemm", [randn(3, 4, dtype=np.float64), randn(4, 2, seed=1, dtype=np.float64)], opset=13)


# --- MatMul ----------------------------------------------------------------------------------------

MATMUL = {
    "2d": ((3, 4), (4, 5)),
    "1d-1d": ((4,), (4,)),
    "1d-2d": ((4,), (4, 5)),
    "2d-1d": ((3, 4), (4,)),
    "batched": ((2, 3, 4), (2, 4, 5)),
    "batched-bcast": ((2, 1, 3, 4), (5, 4, 2)),
    "3d-2d": ((2, 3, 4), (4, 5)),
    "2d-3d": ((3, 4), (2, 4, 5)),
    "1d-3d": ((4,), (2, 4, 5)),
    "3d-1d": ((2, 3, 4), (4,)),
    "size1": ((1, 1, 4), (3, 4, 1)),
}


@pytest.mark.parametrize("case", list(MATMUL))
def test_matmul(backend, case):
    a, b = MATMUL[case]
    check(backend, "MatMul", [randn(*a), randn(*b, seed=1)], opset=13)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float64, np.float16], ids=["i32", "i64", "f64", "f16"])
def test_matmul_dtypes(backend, dtype):
    if np.dtype(dtype).kind == "i":
        a, b = randint(2, 3, 4, dtype=dtype), randint(4, 2, seed=1, dtype=dtype)
    else:
        a, b = randn(2, 3, 4, dtype=dtype), randn(4, 2, seed=1, dtype=dtype)
    check(backend, "MatMul", [a, Const(b)], opset=13)


def test_matmul_opset7(backend):
    check(backend, "MatMul", [randn(2, 3, 4), Const(randn(4, 5, seed=1))], opset=7)
