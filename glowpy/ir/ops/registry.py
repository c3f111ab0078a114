"""The op registry: each IR op is declared exactly once.

A declaration gives the op's name, its attributes with defaults (`FROM_ONNX` where the default is
the ONNX schema's), the element types it accepts,
its type/shape inference and its reference semantics (numpy). The importer maps ONNX onto these
ops, the interpreter runs `compute`, constant folding reuses `compute`, and the compatibility
path and the verifier read `attrs`, `dtypes` and `infer`. Nothing else restates these facts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from glowpy.errors import InternalError, UnsupportedAttribute, UnsupportedDatatype
from glowpy.ir.types import ALL_TYPES, BFLOAT16, TensorType
from glowpy.limits import check_bytes

REQUIRED = object()  # sentinel default: the attribute must be given


class _FromOnnx:
    def __repr__(self) -> str:
        return "FROM_ONNX"


# Sentinel default: the ONNX schema's default for the attribute of the same name, of the ONNX op the IR op
# mirrors (`OpDef.onnx`, else the op of the IR op's name), at the newest opset. Read on first use, so
# importing glowpy.ir does not load onnx's schema registry.
FROM_ONNX = _FromOnnx()
_ONNX_DEFAULTS: dict[tuple[str, str], Any] = {}


def to_python(value: Any) -> Any:
    """An ONNX attribute value as glowpy holds it: str for bytes, tuple for lists, and a float32 float
    as the shortest decimal that rounds to it (1e-05, not 9.999999747378752e-06)."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, float):
        return float(np.format_float_positional(np.float32(value), unique=True, trim="-"))
    if isinstance(value, list):
        return tuple(to_python(v) for v in value)
    return value


def onnx_default(op_type: str, key: str) -> Any:
    """The default of attribute `key` of ONNX op `op_type` (default domain, newest opset)."""
    found = _ONNX_DEFAULTS.get((op_type, key), REQUIRED)
    if found is REQUIRED:
        import onnx.defs
        from onnx import helper

        attr = onnx.defs.get_schema(op_type).attributes.get(key)
        if attr is None or not attr.default_value.type:
            raise InternalError(f"ONNX {op_type} has no default for attribute '{key}'", op=op_type)
        found = to_python(helper.get_attribute_value(attr.default_value))
        _ONNX_DEFAULTS[(op_type, key)] = found
    return found

InferFn = Callable[..., "TensorType | Sequence[TensorType]"]
ComputeFn = Callable[..., "np.ndarray | Sequence[np.ndarray]"]


@dataclass(frozen=True)
class OpDef:
    """Declaration of one IR op.

    `infer(attrs, *input_types)` returns the output type(s); `compute(attrs, *arrays)` returns the
    output array(s). `inputs` is (min, max) arity, max None for variadic. `dtypes` is the set of
    element types accepted for input 0 (the op's main operand; index-like operands are checked in
    `infer`). `elementwise` marks ops a backend may fuse into one loop.
    """

    name: str
    infer: InferFn
    compute: ComputeFn
    attrs: dict[str, Any] = field(default_factory=dict)
    inputs: tuple[int, int | None] = (1, 1)
    num_outputs: int | Callable[[dict[str, Any]], int] = 1
    dtypes: frozenset = ALL_TYPES
    elementwise: bool = False
    # bfloat16 operands are computed in float32 and float32 results rounded back (ml_dtypes computes
    # many numpy functions so, but not all); off for ops that read the element type itself (Cast).
    bfloat16_in_float32: bool = True
    # The ONNX op (default domain) this IR op mirrors one to one: same operands, same attributes with
    # the same meaning. The importer then needs no row of its own for it.
    onnx: str | None = None
    doc: str = ""

    def outputs_for(self, attrs: dict[str, Any]) -> int:
        return self.num_outputs(attrs) if callable(self.num_outputs) else self.num_outputs

    def make_attrs(self, given: dict[str, Any], *, node: str | None = None) -> dict[str, Any]:
        """Attributes with defaults filled in; unknown or missing required ones raise."""
        unknown = set(given) - set(self.attrs)
        if unknown:
            raise UnsupportedAttribute(
                f"unknown attribute(s) {sorted(unknown)}", node=node, op=self.name,
                expected=sorted(self.attrs), found=sorted(given),
            )
        out = {}
        for key, default in self.attrs.items():
            if key in given:
                out[key] = given[key]
            elif default is REQUIRED:
                raise UnsupportedAttribute(f"attribute '{key}' is required", node=node, op=self.name)
            elif default is FROM_ONNX:
                out[key] = onnx_default(self.onnx or self.name, key)
            else:
                out[key] = default
        return out

    def infer_types(
        self, attrs: dict[str, Any], input_types: Sequence[TensorType], *, node: str | None = None
    ) -> list[TensorType]:
        lo, hi = self.inputs
        if len(input_types) < lo or (hi is not None and len(input_types) > hi):
            raise InternalError(
                "wrong number of inputs", node=node, op=self.name,
                expected=f"{lo}..{hi if hi is not None else 'n'}", found=len(input_types),
            )
        if input_types and input_types[0].dtype not in self.dtypes:
            raise UnsupportedDatatype(
                "element type not supported", node=node, op=self.name,
                expected=sorted(str(d) for d in self.dtypes), found=str(input_types[0].dtype),
            )
        result = self.infer(attrs, *input_types)
        types = [result] if isinstance(result, TensorType) else list(result)
        # Every size a node makes (folded at import, by the optimizer, or at run) passes here first.
        for what, group in (("input", input_types), ("output", types)):
            for i, t in enumerate(group):
                check_bytes(t.nbytes, f"{what} {i} ({t})", node=node, op=self.name)
        return types

    def run(self, attrs: dict[str, Any], arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        widen = self.bfloat16_in_float32 and any(a.dtype == BFLOAT16 for a in arrays)
        if widen:
            arrays = [a.astype(np.float32) if a.dtype == BFLOAT16 else a for a in arrays]
        result = self.compute(attrs, *arrays)
        results = [np.asarray(r) for r in result] if isinstance(result, (list, tuple)) else [np.asarray(result)]
        if widen:
            results = [r.astype(BFLOAT16) if r.dtype == np.float32 else r for r in results]
        return results  # np.asarray: numpy reductions of 0-d arrays give scalars


OPS: dict[str, OpDef] = {}


def register(opdef: OpDef) -> OpDef:
    if opdef.name in OPS:
        raise InternalError(f"IR op '{opdef.name}' declared twice")
    OPS[opdef.name] = opdef
    return opdef


def op(name: str, *, infer: InferFn, **kwargs: Any) -> Callable[[ComputeFn], ComputeFn]:
    """Decorator form: the decorated function is the op's reference semantics."""

    def wrap(compute: ComputeFn) -> ComputeFn:
        register(OpDef(name, infer=infer, compute=compute, doc=(compute.__doc__ or "").strip(), **kwargs))
        return compute

    return wrap


def get_op(name: str) -> OpDef:
    opdef = OPS.get(name)
    if opdef is None:
        raise InternalError(f"unknown IR op '{name}'")
    return opdef
