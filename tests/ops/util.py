"""One-node ONNX models, run through glowpy and through onnx.reference.ReferenceEvaluator.

`check(backend, op, inputs, opset=...)` builds a model whose single node is `op`, feeds the runtime
inputs to both, and compares every output: same dtype, same shape, values within rtol 1e-4 /
atol 1e-5 for floats (looser for float16), exact for integers and bools.

Where the reference evaluator itself is wrong (each such test says how), `oracle="onnxruntime"`
compares against onnxruntime instead; the test is skipped if onnxruntime is not installed.

`inputs` is a list, one entry per ONNX operand, in order:
  - an ndarray: a graph input fed at run time,
  - `Const(array)`: an initializer (compile-time operand: shapes, axes, pads, weights...),
  - None: an omitted optional operand (the node gets "" there).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import glowpy
from glowpy.errors import GlowpyError

NODE = "the_node"  # every test node carries this name, so error messages can be checked for it


@dataclass(frozen=True)
class Const:
    """An operand given as an initializer."""

    value: Any

    @property
    def array(self) -> np.ndarray:
        return np.asarray(self.value)


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def randn(*shape: int, dtype: Any = np.float32, seed: int = 0) -> np.ndarray:
    return rng(seed).standard_normal(shape).astype(dtype)


def randpos(*shape: int, dtype: Any = np.float32, seed: int = 0, low: float = 0.1, high: float = 2.0) -> np.ndarray:
    return rng(seed).uniform(low, high, shape).astype(dtype)


def randint(*shape: int, low: int = -5, high: int = 6, dtype: Any = np.int64, seed: int = 0) -> np.ndarray:
    return rng(seed).integers(low, high, shape).astype(dtype)


def randbool(*shape: int, seed: int = 0) -> np.ndarray:
    return rng(seed).integers(0, 2, shape).astype(np.bool_)


def _tensor_info(name: str, array: np.ndarray) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(array.dtype), array.shape)


def node_model(
    op_type: str,
    inputs: Sequence[Any],
    *,
    opset: int,
    attrs: dict[str, Any] | None = None,
    outputs: int | Sequence[str] = 1,
    domain: str = "",
    input_infos: Sequence[onnx.ValueInfoProto] = (),
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A model with one node (named NODE) and the feeds for its runtime inputs."""
    names, graph_inputs, inits, feeds = [], list(input_infos), [], {}
    for i, x in enumerate(inputs):
        if x is None:
            names.append("")
            continue
        name = f"in{i}"
        names.append(name)
        if isinstance(x, Const):
            inits.append(numpy_helper.from_array(x.array, name))
        else:
            x = np.asarray(x)
            graph_inputs.append(_tensor_info(name, x))
            feeds[name] = x
    out_names = [f"out{i}" for i in range(outputs)] if isinstance(outputs, int) else list(outputs)
    node = helper.make_node(op_type, names, out_names, name=NODE, domain=domain, **(attrs or {}))
    graph = helper.make_graph(
        [node], f"{op_type}_test", graph_inputs,
        [helper.make_empty_tensor_value_info(o) for o in out_names if o], initializer=inits,
    )
    opsets = [helper.make_opsetid("", opset)]
    if domain:
        opsets.append(helper.make_opsetid(domain, 1))
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = min(model.ir_version, onnx.IR_VERSION)
    return model, feeds


def run_oracle(model: onnx.ModelProto, feeds: dict[str, np.ndarray], oracle: str = "reference") -> list:
    if oracle == "reference":
        return ReferenceEvaluator(model).run(None, feeds)
    if oracle == "onnxruntime":
        ort = pytest.importorskip("onnxruntime")
        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        return session.run(None, feeds)
    raise ValueError(f"unknown oracle {oracle!r}")


def assert_compat_agrees(model: onnx.ModelProto, backend: str, err: GlowpyError | None) -> None:
    """The cheap compatibility path answers as the full importer does: supported where it compiles,
    and the same status where it raises."""
    report = glowpy.check(model, backend=backend)
    if err is None:
        assert report.supported, f"glowpy.check rejects a model that compiles: {report.reason}"
        return
    if report.supported and model.graph.initializer:
        return  # the cheap path never reads weights: a verdict that depends on their values is not its to give
    assert report.status == err.status, (
        f"glowpy.check says {report.status.name} ({report.reason}), the importer {err.status.name} ({err})")


def tolerances(dtype: np.dtype) -> dict[str, float]:
    if dtype == np.float16:
        return {"rtol": 2e-3, "atol": 2e-3}
    return {"rtol": 1e-4, "atol": 1e-5}


def assert_same(name: str, got: np.ndarray, want: np.ndarray, *, rtol: float | None = None,
                atol: float | None = None) -> None:
    want = np.asarray(want)
    got = np.asarray(got)
    assert got.dtype == want.dtype, f"{name}: dtype {got.dtype}, reference {want.dtype}"
    assert got.shape == want.shape, f"{name}: shape {got.shape}, reference {want.shape}"
    if want.dtype.kind == "f":
        tol = tolerances(want.dtype)
        tol = {"rtol": rtol if rtol is not None else tol["rtol"], "atol": atol if atol is not None else tol["atol"]}
        np.testing.assert_allclose(got, want, err_msg=name, **tol)
    else:
        np.testing.assert_array_equal(got, want, err_msg=name)


def check(
    backend: str,
    op_type: str,
    inputs: Sequence[Any],
    *,
    opset: int,
    attrs: dict[str, Any] | None = None,
    outputs: int | Sequence[str] = 1,
    rtol: float | None = None,
    atol: float | None = None,
    oracle: str = "reference",
) -> dict[str, np.ndarray]:
    """Run one node on glowpy and on the oracle; assert they agree; return glowpy's outputs."""
    model, feeds = node_model(op_type, inputs, opset=opset, attrs=attrs, outputs=outputs)
    want = run_oracle(model, feeds, oracle)
    assert_compat_agrees(model, backend, None)
    out_names = [o.name for o in model.graph.output]
    # What users get (optimized for the backend); on the interpreter also the IR ops as imported,
    # since the interpreter is the oracle other backends are tested against.
    runs = [True, False] if backend == "interpreter" else [True]
    for optimize in runs:
        got = glowpy.compile(model, backend=backend, optimize=optimize).run(feeds)
        assert list(got) == out_names
        for name, w in zip(out_names, want):
            assert_same(f"{op_type} (opset {opset}, optimize={optimize}) output {name}", got[name], w, rtol=rtol,
                        atol=atol)
    return got


def check_graph(
    backend: str,
    nodes: Sequence[onnx.NodeProto],
    feeds: dict[str, np.ndarray],
    outputs: Sequence[str],
    *,
    opset: int,
    initializers: dict[str, np.ndarray] | None = None,
    oracle: str = "reference",
) -> dict[str, np.ndarray]:
    """Like `check`, for a small multi-node graph (compile-time operands computed by other nodes)."""
    graph = helper.make_graph(
        list(nodes), "pattern", [_tensor_info(n, np.asarray(x)) for n, x in feeds.items()],
        [helper.make_empty_tensor_value_info(o) for o in outputs],
        initializer=[numpy_helper.from_array(np.asarray(v), n) for n, v in (initializers or {}).items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = min(model.ir_version, onnx.IR_VERSION)
    want = run_oracle(model, feeds, oracle)
    for optimize in ([True, False] if backend == "interpreter" else [True]):
        got = glowpy.compile(model, backend=backend, optimize=optimize).run(feeds)
        assert list(got) == list(outputs)
        for name, w in zip(outputs, want):
            assert_same(f"output {name} (optimize={optimize})", got[name], w)
    return got


def expect_error(
    cls: type[GlowpyError],
    op_type: str,
    inputs: Sequence[Any],
    *,
    opset: int,
    attrs: dict[str, Any] | None = None,
    outputs: int | Sequence[str] = 1,
    mentions: Sequence[str] = (),
    backend: str = "interpreter",
    domain: str = "",
    input_infos: Sequence[onnx.ValueInfoProto] = (),
    compat: bool = True,
) -> GlowpyError:
    """Compiling the one-node model raises `cls`; its message names the node, the op and `mentions`;
    and (unless `compat` is False) `glowpy.check` gives the same status."""
    model, _ = node_model(op_type, inputs, opset=opset, attrs=attrs, outputs=outputs, domain=domain,
                          input_infos=input_infos)
    with pytest.raises(cls) as info:
        glowpy.compile(model, backend=backend)
    err = info.value
    if compat:
        assert_compat_agrees(model, backend, err)
    text = str(err)
    assert type(err) is cls, f"{type(err).__name__}: {text}"
    for word in (f"'{NODE}'", op_type, *mentions):
        assert word in text, f"{word!r} not in {text!r}"
    return err
