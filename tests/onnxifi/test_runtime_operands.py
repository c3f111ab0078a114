"""Operands fed either way through the ONNXIFI Python layer: every onnx node case, with its operand
inputs (those an op row lists in `const_inputs`) as weights (initializers) and as run-time inputs.
Wherever onnxGetBackendCompatibility says SUCCESS (or FALLBACK), onnxInitGraph, onnxSetGraphIO,
onnxRunGraph and the run must succeed and give onnx's expected outputs; wherever it refuses, onnxInitGraph must
refuse too. The interpreter backend serves every case (the cpu one a sample): the verdicts and the
graphs are the same, only the code differs."""

from __future__ import annotations

import ctypes
import re
import warnings
from functools import cache

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from glowpy.errors import Status
from glowpy.importer.table import TABLE, normalize_domain
from glowpy.onnxifi import api
from glowpy.onnxifi import constants as C
from glowpy.onnxifi.objects import GRAPHS

from .conftest import Tensors, backend_ids, fence

OK = (Status.SUCCESS, Status.FALLBACK)
# The cpu sample: operands that bound values, give a shape, slice and reduce, compiled natively.
CPU_SAMPLE = re.compile(r"^test_(clip_splitbounds|reshape_reordered_all_dims|slice_neg_steps|reduce_sum_keepdims_example)$")


@cache
def node_cases() -> list:
    from onnx.backend.test.loader import load_node_model_tests

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_node_model_tests()


def _array(x) -> np.ndarray:
    return numpy_helper.to_array(x) if isinstance(x, onnx.TensorProto) else np.asarray(x)


def operand_inputs(model: onnx.ModelProto) -> set[str]:
    """Graph inputs that sit at an operand position a row lists in const_inputs."""
    fed = {i.name for i in model.graph.input}
    out = set()
    for n in model.graph.node:
        entry = TABLE.get((normalize_domain(n.domain), n.op_type))
        if entry is not None:
            out |= {n.input[k] for k in entry.const_inputs if k < len(n.input) and n.input[k] in fed}
    return out


def as_weights(model: onnx.ModelProto, feeds: dict[str, np.ndarray], names: set[str]) -> onnx.ModelProto:
    m = onnx.ModelProto()
    m.CopyFrom(model)
    keep = [i for i in m.graph.input if i.name not in names]
    del m.graph.input[:]
    m.graph.input.extend(keep)
    m.graph.initializer.extend(numpy_helper.from_array(feeds[n], n) for n in sorted(names))
    return m


class Session:
    def __init__(self, kind: int) -> None:
        self.ids = backend_ids(api)
        self.backend = ctypes.c_void_p()
        assert api.onnxInitBackend(self.ids[kind], None, ctypes.byref(self.backend)) == Status.SUCCESS

    def close(self) -> None:
        api.onnxReleaseBackend(self.backend)
        for i in self.ids:
            api.onnxReleaseBackendID(i)

    def compatibility(self, data: bytes, kind: int) -> Status:
        return Status(api.onnxGetBackendCompatibility(self.ids[kind], len(data), data))

    def run(self, data: bytes, feeds: dict[str, np.ndarray], outputs: dict[str, np.ndarray]) -> str:
        """'' on success, else what failed."""
        g = ctypes.c_void_p()
        st = api.onnxInitGraph(self.backend, None, len(data), data, 0, None, ctypes.byref(g))
        if st not in OK:
            return f"onnxInitGraph: {Status(st).name}: {api.last_error()}"
        try:
            ins, outs = Tensors(**feeds), Tensors(**outputs)
            st = api.onnxSetGraphIO(g, ins.count, ins.array, outs.count, outs.array)
            if st != Status.SUCCESS:
                return f"onnxSetGraphIO: {Status(st).name}: {api.last_error()}"
            ev = ctypes.c_void_p()
            assert api.onnxInitEvent(self.backend, ctypes.byref(ev)) == Status.SUCCESS
            fin, fout = fence(ev), fence()
            st = api.onnxRunGraph(g, ctypes.byref(fin), ctypes.byref(fout))
            api.onnxSignalEvent(ev)
            if st == Status.SUCCESS:
                api.onnxWaitEvent(fout.event)
                api.onnxReleaseEvent(fout.event)
            api.onnxReleaseEvent(ev)
            if st != Status.SUCCESS:
                return f"onnxRunGraph: {Status(st).name}: {api.last_error()}"
            if GRAPHS.get(g.value).runs_failed:  # the run itself happens after RunGraph returned
                return "the run failed (logged)"
            return ""
        finally:
            api.onnxReleaseGraph(g)


def close(case, got: dict[str, np.ndarray], expected: list[np.ndarray]) -> bool:
    for a, e in zip(got.values(), expected):
        if e.dtype.kind in "fc":
            floor = 2e-3 if e.dtype == np.float16 else 1e-3
            if not np.allclose(a, e, rtol=max(case.rtol, floor), atol=max(case.atol, 1e-5 if e.dtype != np.float16
                                                                             else floor), equal_nan=True):
                return False
        elif not np.array_equal(a, e):
            return False
    return True


def drive(kind: int, pattern: re.Pattern | None) -> tuple[dict[str, int], list[str]]:
    """Every (sampled) tensor-only case, both ways: counts and the disagreements."""
    s = Session(kind)
    counts = {"runs": 0, "refused": 0, "runtime operands": 0}
    bad: list[str] = []
    try:
        for case in node_cases():
            if pattern is not None and not pattern.search(case.name):
                continue
            model = case.model
            if any(i.type.WhichOneof("value") != "tensor_type" for i in list(model.graph.input) + list(model.graph.output)):
                continue
            inits = {t.name for t in model.graph.initializer}
            names = [i.name for i in model.graph.input if i.name not in inits]
            inputs, expected = case.data_sets[0]
            feeds = dict(zip(names, (np.require(_array(x), requirements='C') for x in inputs)))
            expected = [_array(x) for x in expected]
            operands = operand_inputs(model) & set(feeds)
            ways = [("run-time", model, feeds)]
            if operands:
                counts["runtime operands"] += 1
                ways.append(("weights", as_weights(model, feeds, operands),
                             {k: v for k, v in feeds.items() if k not in operands}))
            for way, m, fed in ways:
                data = m.SerializeToString()
                verdict = s.compatibility(data, kind)
                outputs = {o.name: np.zeros(e.shape, e.dtype) for o, e in zip(m.graph.output, expected)}
                arrays = list(fed.values()) + list(outputs.values())
                if any(a.size == 0 or a.dtype not in C.DATATYPE_OF_NUMPY for a in arrays):
                    continue  # ONNXIFI descriptors carry neither a zero dim nor every element type (bool, str)
                failed = s.run(data, fed, outputs)
                if verdict not in OK:
                    counts["refused"] += 1
                    if not failed:
                        bad.append(f"{case.name} ({way}): check says {verdict.name}, the full path runs it")
                    continue
                counts["runs"] += 1
                if failed:
                    bad.append(f"{case.name} ({way}): check says {verdict.name}; {failed}")
                elif not close(case, outputs, expected):
                    bad.append(f"{case.name} ({way}): wrong outputs")
    finally:
        s.close()
    return counts, bad


@pytest.mark.heavy
def test_every_node_case_both_ways_on_the_interpreter():
    counts, bad = drive(1, None)
    assert not bad, f"{len(bad)} disagreement(s):\n" + "\n".join(bad[:40])
    assert counts["runtime operands"] > 120 and counts["runs"] > 700, counts


def test_a_cpu_sample_both_ways():
    counts, bad = drive(0, CPU_SAMPLE)
    assert not bad, "\n".join(bad)
    assert counts == {"runs": 8, "refused": 0, "runtime operands": 4}, counts
