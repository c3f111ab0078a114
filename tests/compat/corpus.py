"""Models for the agreement property: the cheap check against the full import + compile.

Each `Case` pairs the model a host would send for the cheap check (weights may be declared inputs
without data) with the model the full path compiles (the same node(s), weights as initializers,
symbolic dims bound from test data). Three sources:

- `onnx_node_cases()`: every node test case of the installed onnx package
  (`onnx.backend.test.case.node`), compile-time operands given as initializers from the case's data;
- `light_model_cases()`: onnx's light models whole;
- `light_node_cases()`: every distinct node of onnx's light models as a one-node model, its operand
  and result types declared (ONNX shape inference), its weights absent;
- `ops_cases()`: every one-node model the per-op tests (tests/ops) build, harvested by running
  their test functions with `check` / `expect_error` replaced by recorders.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import itertools
import pkgutil
import sys
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper, shape_inference

import glowpy
from glowpy.errors import GlowpyError, InternalError, Status
from glowpy.importer.compat import CompatReport, NodeVerdict
from glowpy.importer.specialize import inputs_reaching
from glowpy.models import LIGHT_MODELS, light_model_path

OK = (Status.SUCCESS, Status.FALLBACK)


@dataclass
class Case:
    name: str
    cheap: onnx.ModelProto  # what the host sends
    full: onnx.ModelProto  # the same with its weights
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)  # bindings for the full path


@dataclass
class Outcome:
    case: Case
    report: CompatReport
    full_status: Status
    full_error: GlowpyError | None

    @property
    def cheap_ok(self) -> bool:
        return self.report.supported

    @property
    def full_ok(self) -> bool:
        return self.full_status in OK

    def assumed_failure(self) -> NodeVerdict | str | None:
        """The accepted verdict whose assumption the full path's failure contradicts: the failure names
        that node, or (an error about a graph input, naming no node) a value the assumption names."""
        err = self.full_error
        name = getattr(err, "node", None)
        for v in self.report.nodes:
            if not (v.supported and v.assumes):
                continue
            if name is not None and v.name == name:
                return v
            if name is None and err is not None and any(f"'{w}'" in str(err) for a in v.assumes
                                                        for w in a.split("'")[1::2]):
                return v
        for a in self.report.assumes:  # model-level: a value no node reads
            if name is None and err is not None and any(f"'{w}'" in str(err) for w in a.split("'")[1::2]):
                return a
        return None

    def describe(self) -> str:
        full = str(self.full_error) if self.full_error is not None else self.full_status.name
        return f"{self.case.name}: cheap {self.report.status.name} ({self.report.reason}) | full {full}"


def full_path(case: Case, backend: str) -> tuple[Status, GlowpyError | None]:
    try:
        glowpy.compile(case.full, backend=backend, shapes=case.shapes or None)
    except GlowpyError as e:
        return e.status, e
    except Exception as e:  # noqa: BLE001  (a crash of the full path is a finding, reported as such)
        return Status.INTERNAL_ERROR, InternalError(f"the full path crashed: {type(e).__name__}: {e}")
    return Status.SUCCESS, None


def compare(case: Case, backend: str) -> Outcome:
    report = glowpy.check(case.cheap, backend=backend)
    status, err = full_path(case, backend)
    return Outcome(case, report, status, err)


def disagreements(outcomes: list[Outcome]) -> tuple[list[Outcome], list[Outcome]]:
    """(real disagreements, value-dependent ones). A value-dependent one: the cheap path accepted the
    node with an explicit assumption about an operand value it may not read, and the full path failed
    on exactly that node."""
    real, assumed = [], []
    for o in outcomes:
        if o.cheap_ok == o.full_ok:
            continue
        if o.cheap_ok and o.assumed_failure() is not None:
            assumed.append(o)
        else:
            real.append(o)
    return real, assumed


# --- onnx's node test cases -----------------------------------------------------------------------------


def _const_operand_inputs(graph: onnx.GraphProto, available: set[str]) -> set[str]:
    """Graph inputs that compile-time operands (table const_inputs) depend on, transitively."""
    return inputs_reaching(graph.node, lambda row, _node: row.const_inputs, available)


def _with_weights(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> tuple[onnx.ModelProto, dict]:
    full = onnx.ModelProto()
    full.CopyFrom(model)
    g = full.graph
    consts = _const_operand_inputs(g, set(feeds))
    keep = [i for i in g.input if i.name not in consts]
    for name in sorted(consts):
        g.initializer.append(numpy_helper.from_array(feeds[name], name))
    del g.input[:]
    g.input.extend(keep)
    shapes = {i.name: tuple(feeds[i.name].shape) for i in keep if i.name in feeds
              and any(d.dim_param or not d.HasField("dim_value") for d in i.type.tensor_type.shape.dim)}
    return full, shapes


@functools.cache
def onnx_node_cases() -> tuple[Case, ...]:
    from onnx.backend.test.case import node as node_cases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        collected = node_cases.collect_testcases(None)
    out = []
    for c in collected:
        inputs = c.data_sets[0][0] if c.data_sets else []
        feeds = {i.name: np.asarray(v) for i, v in zip(c.model.graph.input, inputs)
                 if isinstance(v, (np.ndarray, np.generic))}
        full, shapes = _with_weights(c.model, feeds)
        out.append(Case(c.name, c.model, full, shapes))
    return tuple(out)


# --- light models, node by node -------------------------------------------------------------------------


def _light_nodes(path: Path) -> Iterator[Case]:
    model = onnx.load(str(path))
    g = shape_inference.infer_shapes(model).graph
    types = {vi.name: vi for vi in list(g.value_info) + list(g.input) + list(g.output)}
    inits = {t.name: t for t in g.initializer}
    for t in g.initializer:
        types.setdefault(t.name, helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    seen = set()
    for n in g.node:
        ins = list(dict.fromkeys(x for x in n.input if x))
        # Light models repeat the same node shape many times; one of each is enough.
        key = (n.op_type, tuple(a.SerializeToString() for a in n.attribute),
               tuple(types[x].type.SerializeToString() for x in ins),
               tuple(types[o].type.SerializeToString() if o in types else b"" for o in n.output))
        if key in seen:
            continue
        seen.add(key)

        def one(with_weights: bool, n: onnx.NodeProto = n, ins: list[str] = ins) -> onnx.ModelProto:
            declared = [types[x] for x in ins if not (with_weights and x in inits)]
            weights = [inits[x] for x in ins if with_weights and x in inits]
            outs = [types[o] if o in types else helper.make_empty_tensor_value_info(o) for o in n.output if o]
            gr = helper.make_graph([n], f"{path.stem}_{n.name or n.output[0]}", declared, outs, initializer=weights)
            m = helper.make_model(gr, opset_imports=list(model.opset_import))
            m.ir_version = max(model.ir_version, 4)
            return m

        yield Case(f"{path.stem}/{n.name or n.output[0]} ({n.op_type})", one(False), one(True))


@functools.cache
def light_node_cases() -> tuple[Case, ...]:
    return tuple(c for name in LIGHT_MODELS for c in _light_nodes(light_model_path(name)))


@functools.cache
def light_model_cases() -> tuple[Case, ...]:
    """The light models whole, as files (the cheap path reads their initializers' dims only)."""
    out = []
    for name in LIGHT_MODELS:
        m = onnx.load(str(light_model_path(name)))
        out.append(Case(f"light_{name}", m, m))
    return tuple(out)


# --- the per-op tests' models ---------------------------------------------------------------------------


class _Anything:
    """What a stubbed `check` returns: tolerates the indexing and calls test bodies do afterwards."""

    def __getattr__(self, name: str) -> Any:
        return _Anything()

    def __getitem__(self, key: Any) -> Any:
        return _Anything()

    def __call__(self, *a: Any, **k: Any) -> Any:
        return _Anything()

    def __iter__(self) -> Iterator[Any]:
        return iter(())


def _expand(fn: Callable) -> Iterator[dict[str, Any]]:
    """The keyword arguments of every parametrization of a pytest test function."""
    params = inspect.signature(fn).parameters
    axes: list[list[dict[str, Any]]] = []
    for mark in getattr(fn, "pytestmark", []):
        if mark.name != "parametrize":
            continue
        names = mark.args[0]
        names = [x.strip() for x in names.split(",")] if isinstance(names, str) else list(names)
        values = []
        for v in mark.args[1]:
            v = v.values if hasattr(v, "values") and hasattr(v, "marks") else v
            v = v if len(names) > 1 else (v[0] if isinstance(v, tuple) and len(v) == 1 else v,)
            values.append(dict(zip(names, v)))
        axes.append(values)
    for combo in itertools.product(*axes):
        kwargs: dict[str, Any] = {}
        for part in combo:
            kwargs.update(part)
        if "backend" in params:
            kwargs["backend"] = "interpreter"
        if set(params) - set(kwargs):
            continue  # needs fixtures we do not provide
        yield kwargs


@functools.cache
def ops_cases() -> tuple[Case, ...]:
    tests_dir = Path(__file__).resolve().parents[1]
    if str(tests_dir) not in sys.path:
        sys.path.insert(0, str(tests_dir))
    try:
        ops_pkg = importlib.import_module("ops")
        util = importlib.import_module("ops.util")
    except ImportError:
        return ()
    built: list[tuple[str, onnx.ModelProto]] = []
    current = [""]
    real_node_model = util.node_model
    accepted = set(inspect.signature(real_node_model).parameters)

    def recording_node_model(*args: Any, **kwargs: Any) -> Any:
        model, feeds = real_node_model(*args, **kwargs)
        built.append((current[0], model))
        return model, feeds

    def stub(backend_first: bool) -> Callable:
        def run(*args: Any, **kwargs: Any) -> Any:
            args = args[1:] if backend_first else args  # check(backend, op, ...) / expect_error(cls, op, ...)
            recording_node_model(*args, **{k: v for k, v in kwargs.items() if k in accepted})
            return _Anything()

        return run

    modules = [importlib.import_module(f"ops.{m.name}") for m in pkgutil.iter_modules(ops_pkg.__path__)
               if m.name.startswith("test_")]
    saved = []
    try:
        for mod in [util, *modules]:
            for attr, value in (("node_model", recording_node_model), ("check", stub(True)),
                                ("expect_error", stub(True))):
                if hasattr(mod, attr):
                    saved.append((mod, attr, getattr(mod, attr)))
                    setattr(mod, attr, value)
        for mod in modules:
            for fname, fn in sorted(vars(mod).items()):
                if not fname.startswith("test_") or not callable(fn):
                    continue
                for kwargs in _expand(fn):
                    current[0] = f"{mod.__name__}::{fname}[{','.join(f'{k}={v!r:.20}' for k, v in kwargs.items())}]"
                    try:
                        with warnings.catch_warnings():
                            warnings.simplefilter("ignore")
                            fn(**kwargs)
                    except (KeyboardInterrupt, SystemExit):
                        raise
                    except BaseException:  # noqa: BLE001, S110  (skips, and checks of results we do not produce)
                        pass
    finally:
        for mod, attr, value in reversed(saved):
            setattr(mod, attr, value)
    cases, seen = [], set()
    for name, model in built:
        key = model.SerializeToString(deterministic=True)
        if key in seen:
            continue
        seen.add(key)
        cases.append(Case(name, model, model))
        stripped = strip_weights(model)
        if stripped is not None:
            cases.append(Case(name + " [weights as declared inputs]", stripped, model))
    return tuple(cases)


def strip_weights(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """The model as a host sends it for the cheap check: initializers become declared inputs."""
    if not model.graph.initializer:
        return None
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    infos = [helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in g.initializer]
    del g.initializer[:]
    g.input.extend(infos)
    return out
