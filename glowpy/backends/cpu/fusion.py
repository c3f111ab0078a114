"""Elementwise grouping: a tree of elementwise ops whose intermediate values have no consumer outside the
tree (and the tree's output shape) becomes one loop (kernels/elementwise.py). BatchNormalization
counts as elementwise (a per-channel affine). This is loop-level fusion only; graph rewrites are the
optimizer's."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from glowpy.backends.cpu.kernels import elementwise as EW
from glowpy.backends.cpu.module_text import ident
from glowpy.backends.cpu.steps import Arg, Step
from glowpy.ir.activations import ACTIVATIONS
from glowpy.ir.graph import Node, Value

if TYPE_CHECKING:
    from glowpy.backends.cpu.lowering import Lowering

# Ops a group may hold.
ELEMENTWISE_OPS = EW.SCALAR_OPS


def grow_group(low: Lowering, root: Node) -> list[Node]:
    """`root` and the unclaimed elementwise producers whose values only the group uses, in graph order.
    One Concat of that kind may join too (its parts become the group's operands, its output is never
    stored): DenseNet's BatchNorm -> Relu over the features concatenated so far."""
    shape = root.outputs[0].shape
    members = {id(root): root}
    changed = True
    while changed:
        changed = False
        for g in list(members.values()):
            if g.op == "Concat":
                continue
            for v in g.inputs:
                p = v.producer
                if (p is None or id(p) in members or id(p) in low._claimed or len(p.outputs) != 1
                        or id(v) in low._outputs or v.shape != shape or not all(id(u) in members for u in v.users)):
                    continue
                if p.op not in ELEMENTWISE_OPS and (p.op != "Concat" or any(n.op == "Concat" for n in members.values())):
                    continue
                members[id(p)] = p
                changed = True
    return sorted(members.values(), key=lambda n: low._index[id(n)])


def lower_group(low: Lowering, nodes: list[Node]) -> None:
    """One fused elementwise loop step for a group from grow_group."""
    out = nodes[-1].outputs[0]
    produced: dict[int, int] = {}  # value -> its expr
    concat: tuple[int, list[int]] | None = None
    cat_value: Value | None = None
    operands: list[EW.Operand] = []
    names: list[str] = []
    args: list[Arg] = [low.val(out)]
    keys: dict[int, int] = {}
    exprs: list[EW.Expr] = []
    inplace: list[tuple[Value, Value]] = []

    def operand(key: int, arg: Arg, shape: tuple[int, ...], dtype: np.dtype, name: str) -> tuple[str, int]:
        if key not in keys:
            keys[key] = len(operands)
            operands.append(EW.Operand(tuple(shape), np.dtype(dtype)))
            names.append(ident(name))
            args.append(arg)
        return ("in", keys[key])

    def ref(v: Value, view: tuple[int, ...] | None = None) -> tuple[str, Any]:
        if id(v) in produced:
            return ("expr", produced[id(v)])
        if v is cat_value:
            return ("cat", 0)
        if v.is_constant and v.type.size == 1 and view is None:
            return ("imm", np.asarray(v.data).reshape(-1)[0].item())
        if (v.kind != "constant" and view is None and v.shape == out.shape
                and v.dtype.itemsize == out.dtype.itemsize):
            inplace.append((out, v))
        return operand(id(v), low.val(v), view if view is not None else v.shape, v.dtype, v.name)

    for n in nodes:
        if n.op == "Concat":
            cat_value = n.outputs[0]
            parts = [operand(id(v), low.val(v), v.shape, v.dtype, v.name)[1] for v in n.inputs]
            concat = (n.attrs["axis"] % cat_value.type.rank, parts)
            continue
        if n.op == "BatchNormalization":
            # Parameters broadcast over dim 1. The optimizer lowers a BatchNormalization it could
            # not fold into a per-channel Mul and Add (CpuBackend.should_lower); this serves
            # unoptimized graphs.
            x = n.inputs[0]
            view = (1, x.shape[1]) + (1,) * (x.type.rank - 2)
            refs = [ref(x)] + [ref(v, view) for v in n.inputs[1:]]
            exprs.append(EW.Expr("BatchNormalization", n.attrs, refs, [x.dtype] * 5, x.dtype, n.name))
        else:
            exprs.append(EW.Expr(n.op, n.attrs, [ref(v) for v in n.inputs], [v.dtype for v in n.inputs],
                                 n.outputs[0].dtype, n.name))
        produced[id(n.outputs[0])] = len(exprs) - 1
    group = EW.FusedElementwise(out.shape, out.dtype, operands, exprs, names, concat)
    fn = EW.emit_fused(low.kmod(), low.fname(nodes), group, low.vector_width)
    low.add(Step(fn.name, fn, args, [out], nodes, work=out.type.size * len(exprs), inplace=inplace))


def post_elementwise(low: Lowering, nodes: list[Node], src: Value, out: Value, addend: Value | None, beta: float,
                      activation: str, params: tuple) -> None:
    """out = act(src + beta * addend) as its own loop (a runtime bias a kernel cannot take)."""
    dt = out.dtype
    operands = [EW.Operand(src.shape, dt)]
    args = [low.val(out), low.val(src)]
    exprs: list[EW.Expr] = []
    cur: tuple[str, Any] = ("in", 0)
    if addend is not None:
        operands.append(EW.Operand(addend.shape, addend.dtype))
        args.append(low.val(addend))
        term: tuple[str, Any] = ("in", 1)
        if beta != 1.0:
            exprs.append(EW.Expr("Mul", {}, [("in", 1), ("imm", beta)], [dt, dt], dt))
            term = ("expr", len(exprs) - 1)
        exprs.append(EW.Expr("Add", {}, [cur, term], [dt, dt], dt))
        cur = ("expr", len(exprs) - 1)
    if activation != "none":
        act = ACTIVATIONS[activation]
        exprs.append(EW.Expr(act.op, act.attrs_of(params), [cur], [dt], dt))
    if not exprs:
        exprs.append(EW.Expr("Identity", {}, [cur], [dt], dt))
    group = EW.FusedElementwise(out.shape, dt, operands, exprs, ["acc", "addend"][:len(operands)])
    fn = EW.emit_fused(low.kmod(), low.fname(nodes) + ".post", group, low.vector_width)
    inplace = [(out, src)]
    low.add(Step(fn.name, fn, args, [out], nodes, work=out.type.size * len(exprs), inplace=inplace))
