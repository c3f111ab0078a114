"""The agreement property on the model zoo (issue 10): `glowpy.check` accepts exactly the zoo models the full
compile accepts, and for a refused model names the node and op the compile names; both with the
initializers as weights and with the operands that decide shapes fed as run-time inputs.

The check runs on what a host would send: the skeleton itself (initializers with dims and no data; its
dropped Constant payloads filled, a Constant being part of the graph, not a weight). The full compile of
every zoo model with realized weights is tests/zoo/test_zoo.py's (heavy): its outcome is what
tests/zoo/expected.json records, so the weights case compares the check with that record, and compiles
again only the refused models (their compile stops at import). Fed at run time, the operands make the full
path a specialization: it is compiled here for the operands' values, on the interpreter (the verdicts are
the backend's op table and the shared importer; the cpu check is asserted to give the same verdict).
"""

from __future__ import annotations

import functools

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import glowpy
from glowpy.compiled import SpecializingModel
from glowpy.errors import GlowpyError, Status
from glowpy.importer import specialize
from glowpy.importer.table import TABLE, normalize_domain
from tests.zoo.harness import load_expected, skeleton_names
from tests.zoo.realize import DROPPED, SKELETON_DIR, iter_graphs, make_inputs

NAMES = skeleton_names()
EXPECTED = load_expected()
OK = (Status.SUCCESS, Status.FALLBACK)


@functools.cache
def skeleton(name: str) -> onnx.ModelProto:
    return onnx.load(str(SKELETON_DIR / f"{name}.onnx"))


def _pattern(tensor: TensorProto) -> TensorProto:
    """Positive, non-uniform values of the tensor's type and dims, cheap to make for 100M elements (what
    they are does not decide a verdict: every value that does, the skeleton kept)."""
    dims = tuple(int(d) for d in tensor.dims)
    values = 0.5 + 0.125 * (np.arange(int(np.prod(dims, dtype=np.int64))) % 7)
    return numpy_helper.from_array(values.astype(helper.tensor_dtype_to_np_dtype(tensor.data_type)).reshape(dims),
                                   tensor.name)


def filled(model: onnx.ModelProto, initializers: bool) -> onnx.ModelProto:
    """A copy of a skeleton with its dropped Constant payloads filled, and its dropped initializers too
    when `initializers`."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for graph in iter_graphs(out.graph):
        for t in graph.initializer if initializers else ():
            if t.doc_string == DROPPED:
                t.CopyFrom(_pattern(t))
        for node in graph.node:
            for a in node.attribute:
                if node.op_type == "Constant" and a.name == "value" and a.t.doc_string == DROPPED:
                    a.t.CopyFrom(_pattern(a.t))
    return out


def operands_as_inputs(model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A copy of `model` whose operands (the inputs an op row lists in `const_inputs`: Reshape's shape, Slice's
    starts, Clip's bounds, ...) that are initializers or Constant nodes of the main graph are graph inputs
    instead, and the values to feed them."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    tensors = {t.name: t for t in g.initializer}
    tensors.update({n.output[0]: n.attribute[0].t for n in g.node if n.op_type == "Constant"
                    and len(n.attribute) == 1 and n.attribute[0].name == "value"})
    names: list[str] = []
    for n in g.node:
        entry = TABLE.get((normalize_domain(n.domain), n.op_type))
        for k in entry.const_inputs if entry is not None else ():
            if k < len(n.input) and n.input[k] in tensors:
                names.append(n.input[k])
    names = list(dict.fromkeys(names))
    feeds = {x: numpy_helper.to_array(tensors[x]) for x in names}
    fed = set(names)
    kept_nodes = [n for n in g.node if not (n.op_type == "Constant" and n.output[0] in fed)]
    kept_inits = [t for t in g.initializer if t.name not in fed]
    declared = {i.name for i in g.input}
    del g.node[:], g.initializer[:]
    g.node.extend(kept_nodes)
    g.initializer.extend(kept_inits)
    g.input.extend(helper.make_tensor_value_info(x, tensors[x].data_type, list(tensors[x].dims))
                   for x in names if x not in declared)
    return out, feeds


def first_refused(report) -> tuple[str, str]:
    """(node name, op) of the node the check's verdict names first."""
    v = next(v for v in report.nodes if not v.supported)
    return v.name, v.op


@pytest.mark.parametrize("name", NAMES)
def test_the_check_agrees_with_the_full_compile_with_weights(name: str) -> None:
    report = glowpy.check(filled(skeleton(name), initializers=False), backend="cpu")
    expected = EXPECTED[name]
    if expected == "pass":
        assert report.supported, f"{name} compiles, the check refuses it: {report.reason}"
        return
    assert not report.supported, f"{name}: the compile refuses it ({expected}), the check accepts it"
    with pytest.raises(GlowpyError) as info:
        glowpy.compile(filled(skeleton(name), initializers=True), backend="cpu")
    err = info.value
    assert {"error": type(err).__name__, "op": err.op} == expected
    assert report.status == err.status
    assert first_refused(report) == (err.node, err.op)


RUNTIME_OPERANDS = [n for n in NAMES if operands_as_inputs(skeleton(n))[1]]


@pytest.mark.heavy
@pytest.mark.parametrize("name", RUNTIME_OPERANDS)
def test_the_check_agrees_with_the_full_compile_with_operands_fed_at_run_time(name: str) -> None:
    cheap, operands = operands_as_inputs(filled(skeleton(name), initializers=False))
    report = glowpy.check(cheap, backend="interpreter")
    assert glowpy.check(cheap, backend="cpu").status == report.status
    full, _ = operands_as_inputs(filled(skeleton(name), initializers=True))
    feeds = {**make_inputs(full)[0], **operands}
    if report.supported:
        # What the compile does on the first run with these feeds (operands that decide shapes compiled in).
        compiled = glowpy.compile(full, backend="interpreter")
        assert isinstance(compiled, SpecializingModel), f"{name}: its operands decide no shape"
        compiled.specialization(feeds)
        return
    # The compile refuses up front with the check's verdict; what its first run would do refuses alike.
    shape_operands = specialize.shape_operands(full)
    bound = specialize.specialize(full, feeds, shape_operands)
    with pytest.raises(GlowpyError) as info:
        glowpy.compile(bound, backend="interpreter", shapes=specialize.feed_shapes(feeds, shape_operands))
    err = info.value
    assert report.status == err.status and first_refused(report) == (err.node, err.op), (report.reason, str(err))
