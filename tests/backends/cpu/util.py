"""Helpers for the CPU backend tests."""

from __future__ import annotations

import numpy as np

from glowpy.backends.cpu import CpuBackend
from glowpy.backends.interpreter import InterpreterBackend
from glowpy.ir.graph import Graph


def run_both(graph: Graph, feeds: list[np.ndarray], **options) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(cpu outputs, interpreter outputs) of the same graph, no optimizer in between."""
    got = CpuBackend().compile(graph, **options).run(feeds)
    want = InterpreterBackend().compile(graph).run(feeds)
    return got, want


def assert_close(got: list[np.ndarray], want: list[np.ndarray], what: str = "") -> None:
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        w = np.asarray(w)
        assert g.dtype == w.dtype, f"{what} output {i}: dtype {g.dtype} vs {w.dtype}"
        assert g.shape == w.shape, f"{what} output {i}: shape {g.shape} vs {w.shape}"
        if w.dtype.kind == "f":
            tol = 3e-3 if w.dtype == np.float16 else 1e-4
            np.testing.assert_allclose(g, w, rtol=tol, atol=tol / 10, err_msg=f"{what} output {i}")
        else:
            np.testing.assert_array_equal(g, w, err_msg=f"{what} output {i}")
