"""DFT (opsets 17 and 20: axis attribute, then input) and STFT against onnx.reference, on the
interpreter and the cpu backend; both import as one MatMul by a constant DFT matrix."""

from __future__ import annotations

import numpy as np
import pytest

from glowpy.errors import InvalidModel, UnsupportedAttribute

from .util import Const, check, expect_error, randn

BACKENDS = ("interpreter", "cpu")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("inverse,onesided,c_in", [(0, 0, 2), (1, 0, 2), (0, 1, 1), (1, 1, 2)])
def test_dft_opset20(backend, inverse, onesided, c_in):
    x = randn(2, 7, 3, c_in, seed=inverse + 2 * onesided)
    # dft_length 6 truncates the 7 positions (forward) or is the real length rebuilt (irfft: 4 bins used)
    check(backend, "DFT", [x, Const(np.array(6, np.int64)), Const(np.array(-3, np.int64))], opset=20,
          attrs={"inverse": inverse, "onesided": onesided}, atol=1e-4)


@pytest.mark.parametrize("backend", BACKENDS)
def test_dft_opset17_axis_attribute_and_padding(backend):
    x = randn(3, 5, 2, seed=9)
    check(backend, "DFT", [x, Const(np.array(8, np.int64))], opset=17, attrs={"axis": 1}, atol=1e-4)
    check(backend, "DFT", [randn(4, 5, 1, seed=3)], opset=17, attrs={"axis": 0, "onesided": 1}, atol=1e-4)


def test_dft_refusals():
    expect_error(UnsupportedAttribute, "DFT", [randn(3, 5, 2), None, Const(np.array(-1, np.int64))], opset=20,
                 mentions=["axis"])
    expect_error(InvalidModel, "DFT", [randn(3, 5, 3)], opset=20, mentions=["last dim"])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("onesided", [0, 1])
def test_stft_window_at_run_time(backend, onesided):
    x = randn(2, 20, 1, seed=4)
    window = np.hanning(8).astype(np.float32)
    check(backend, "STFT", [x, Const(np.array(3, np.int64)), window, Const(np.array(8, np.int64))], opset=17,
          attrs={"onesided": onesided}, atol=1e-4)


def test_stft_complex_signal_without_window():
    check("interpreter", "STFT", [randn(1, 9, 2, seed=5), Const(np.array(2, np.int64)), None,
                                  Const(np.array(4, np.int64))], opset=17, attrs={"onesided": 0}, atol=1e-4)

