"""IR graph -> a list of kernel steps.

A `Step` is one call in the generated entry: an LLVM function plus what to pass it (graph values,
compile-time arrays that go into the weights block, a per-thread scratch region, null). Graph
rewrites (BatchNorm folding, epilogue fusion) are the optimizer's; here:

- **epilogues**: a Conv / Gemm / MatMul / FullyConnected emits the activation and residual operand
  the optimizer fused into it (its `activation` attributes and Conv's 4th input);
- **elementwise groups**: a tree of elementwise ops whose intermediate values have no consumer outside
  the tree (and the tree's output shape) is one loop; BatchNormalization counts as elementwise
  (a per-channel affine).
- Reshape, and Identity / Dropout on their own, are aliases (no code, same memory).

Each step sits at the position of its last node, so every operand it reads is computed before it.
The input graph is never modified.
"""

from __future__ import annotations

import math
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from llvmlite import ir

from glowpy.backends.cpu import irutil as U
from glowpy.backends.cpu.kernels import elementwise as EW
from glowpy.backends.cpu.kernels import linalg, movement, norm, pool, reduce
from glowpy.backends.cpu.kernels.common import KernelInfo
from glowpy.errors import GlowpyError, InternalError, UnsupportedOperator
from glowpy.ir.activations import ACTIVATIONS
from glowpy.ir.graph import Graph, Node, Value

# Below this much work (roughly element-ops) a kernel runs on one thread: a barrier costs more.
PARALLEL_MIN_WORK = 1 << 16

ELEMENTWISE_OPS = EW.SCALAR_OPS
HEAVY_OPS = frozenset({"Conv", "Gemm", "MatMul", "FullyConnected"})
ALIAS_OPS = frozenset({"Reshape", "Identity", "Dropout"})


@dataclass(frozen=True, eq=False)
class Arg:
    """One pointer argument of a step: a graph value's buffer, a weights-block array, this thread's
    scratch, null, or graph output `index` (for final copies)."""

    kind: str  # value | array | scratch | null | output
    value: Value | None = None
    index: int = -1


NULL = Arg("null")
SCRATCH = Arg("scratch")


@dataclass(eq=False)
class Step:
    name: str
    fn: ir.Function | None
    args: list[Arg]
    writes: list[Value]
    nodes: list[Node]
    work: float = 0.0
    scratch: int = 0  # bytes per thread
    inplace: list[tuple[Value, Value]] = field(default_factory=list)  # (out, operand) that may share memory
    alias: tuple[Value, Value] | None = None  # (out, source) for Reshape-like steps
    position: int = 0
    parallel: bool = False

    @property
    def reads(self) -> list[Value]:
        return [a.value for a in self.args if a.kind == "value" and a.value not in self.writes] + (
            [self.alias[1]] if self.alias else [])

    def describe(self) -> str:
        return ", ".join(f"{n.name} ({n.op})" for n in self.nodes)


@dataclass
class Epilogue:
    """A heavy op's fused epilogue, as the optimizer set it on the node (glowpy/optimizer/fuse.py)."""

    nodes: list[Node]
    out: Value
    activation: str = "none"
    params: tuple = ()
    residual: Value | None = None

    @classmethod
    def of(cls, node: Node) -> Epilogue:
        residual = node.inputs[3] if node.op == "Conv" and len(node.inputs) > 3 else None
        return cls([node], node.outputs[0], node.attrs.get("activation", "none"),
                   tuple(node.attrs.get("activation_params", ())), residual)


def _ident(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.]", "_", text)


_GLOBAL_NAME = re.compile(r'@"((?:[^"\\]|\\.)*)"|@([-a-zA-Z$._][-a-zA-Z$._0-9]*)')


def split_module_text(text: str) -> list[tuple[str, str, str]]:
    """Top-level items of a printed llvmlite module: ("define" | "declare", name, text). Anything else
    (globals, metadata, attribute groups) is refused: kernels must not use module-level state."""
    items: list[tuple[str, str, str]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("define "):
            j = i
            while lines[j] != "}":
                j += 1
            m = _GLOBAL_NAME.search(line)
            items.append(("define", m.group(1) or m.group(2), "\n".join(lines[i:j + 1])))
            i = j + 1
            continue
        if line.startswith("declare "):
            m = _GLOBAL_NAME.search(line)
            items.append(("declare", m.group(1) or m.group(2), line))
        elif line.strip() and not line.startswith((";", "target ", "source_filename")):
            raise InternalError("a kernel module holds more than functions", found=line[:80])
        i += 1
    return items


def _freeze(v: Any) -> Any:
    if isinstance(v, (list, tuple)):
        return tuple(_freeze(x) for x in v)
    if isinstance(v, np.ndarray):
        return (v.shape, str(v.dtype), v.tobytes())
    if isinstance(v, np.dtype):
        return str(v)
    return v


def _flat_weights(values: dict[str, np.ndarray]) -> np.ndarray:
    """0 (for padding), then every weight array raveled in order: what position codes index."""
    return np.concatenate([np.zeros(1, np.float32)] + [np.asarray(v, np.float32).ravel() for v in values.values()])


def _packer_for(gen: Callable[..., KernelInfo]) -> Callable[..., list[np.ndarray]] | None:
    """emit_conv2d -> pack_conv2d (same keyword arguments, the packed arrays only), when it exists."""
    module = sys.modules.get(gen.__module__)
    name = "pack_" + gen.__name__.removeprefix("emit_")
    return getattr(module, name, None) if module is not None else None


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a.view(np.uint8), b.view(np.uint8))


def _verify_packers() -> bool:
    """GLOWPY_VERIFY=1 (as for the optimizer's graph checks) also checks packers against their kernels."""
    return os.environ.get("GLOWPY_VERIFY", "") not in ("", "0")


def _looks_like_gather(values: dict[str, np.ndarray], packed: list[np.ndarray]) -> bool:
    """Cheap test before learning a packing layout: a rearrangement (plus zero padding) of the weights
    keeps the sum of absolute values; a transform (Winograd) does not."""
    want = sum(float(np.abs(np.asarray(v, np.float64)).sum()) for v in values.values())
    got = sum(float(np.abs(np.asarray(p, np.float64)).sum()) for p in packed)
    return abs(got - want) <= 1e-5 * max(want, 1e-30)


def _conv_generator() -> Callable[..., KernelInfo] | None:
    try:
        from glowpy.backends.cpu.kernels.conv import emit_conv2d
    except ImportError:
        return None
    return emit_conv2d


def _gemm_generator() -> Callable[..., KernelInfo] | None:
    try:
        from glowpy.backends.cpu.kernels.gemm import emit_gemm
    except ImportError:
        return None
    return emit_gemm


class Lowering:
    """Turns a graph into steps inside `module`. `arrays` collects compile-time weights-block data."""

    def __init__(self, graph: Graph, module: ir.Module, *, nthreads: int, vector_width: int,
                 fast_kernels: bool = True, release_weights: bool = False) -> None:
        self.graph = graph
        self.module = module  # the entry's module; kernels are built in their own (kmod)
        self.nthreads = nthreads
        self.vector_width = vector_width
        self.fast_kernels = fast_kernels
        self.steps: list[Step] = []
        self.arrays: list[np.ndarray] = []
        self._array_keys: dict[int, int] = {}
        self._index = {id(n): i for i, n in enumerate(graph.nodes)}
        self._outputs = {id(v) for v in graph.outputs}
        self._claimed: set[int] = set()
        self.used_fast: list[str] = []
        self._shared: dict[tuple, dict[str, Any]] = {}
        self.release_weights = release_weights
        self._packed_uses: dict[int, int] = {}
        self._sealed: dict[str, ir.Function] = {}
        self.kernel_defs: dict[str, str] = {}  # name -> printed definition
        self.kernel_decls: dict[str, str] = {}  # name -> printed declaration (intrinsics, libm, libc)

    # --- helpers ------------------------------------------------------------------------------

    def array(self, a: np.ndarray) -> Arg:
        """Place a compile-time array in the weights block (deduplicated by identity)."""
        a = np.ascontiguousarray(a)
        key = self._array_keys.get(id(a))
        if key is None:
            key = len(self.arrays)
            self.arrays.append(a)
            self._array_keys[id(a)] = key
        return Arg("array", index=key)

    @staticmethod
    def val(v: Value) -> Arg:
        return Arg("value", v)

    def fname(self, nodes: list[Node]) -> str:
        """k<step>.<op>.<node>[.<fused ops>]: the first node names the kernel, the rest were fused in."""
        first = nodes[0]
        tail = "".join(f".{n.op}" for n in nodes[1:4]) + (f".and{len(nodes) - 4}" if len(nodes) > 4 else "")
        return _ident(f"k{len(self.steps):03d}.{first.op}.{first.name}{tail}")

    # --- kernel modules -----------------------------------------------------------------------
    #
    # Every kernel is built in a module of its own, printed, and dropped: the Python objects of a
    # large model's IR (tens of MB) never exist all at once. The entry's module only declares the
    # kernels; Program.ir_text splices the printed definitions in.

    def kmod(self) -> ir.Module:
        m = ir.Module(name="glowpy.kernel")
        m.triple, m.data_layout = self.module.triple, self.module.data_layout
        return m

    def seal(self, fn: ir.Function) -> ir.Function:
        """Print fn's module into the kernel texts; return fn's declaration in the entry's module."""
        if fn.module is self.module:
            return fn
        decl = self._sealed.get(fn.name)
        if decl is not None:
            return decl
        for kind, name, text in split_module_text(str(fn.module)):
            if kind == "define":
                seen = self.kernel_defs.get(name)
                if seen is not None and seen != text:
                    raise InternalError(f"two kernels define different functions named '{name}'")
                self.kernel_defs[name] = text
            else:
                self.kernel_decls.setdefault(name, text)
        decl = ir.Function(self.module, fn.function_type, name=fn.name)
        self._sealed[fn.name] = decl
        return decl

    def add(self, step: Step) -> None:
        if step.fn is not None:
            step.fn = self.seal(step.fn)
        step.position = max(self._index[id(n)] for n in step.nodes) if step.nodes else len(self.graph.nodes)
        step.parallel = self.nthreads > 1 and step.work >= PARALLEL_MIN_WORK and step.fn is not None
        self.steps.append(step)
        for n in step.nodes:
            self._claimed.add(id(n))

    # --- shared kernels -----------------------------------------------------------------------

    def generate(self, gen: Callable[..., KernelInfo], name: str, weight_keys: tuple[str, ...],
                 **kwargs: Any) -> KernelInfo:
        """Call a kernel generator; steps with the same configuration share one function.

        A generator's code depends on shapes and attributes, its weights travel as packed arrays
        (pointers), so a second conv of the same configuration only needs its own packed arrays. Their
        layout is learned once per configuration by packing position-coded weights (1, 2, 3, ...)
        in a throwaway module, and checked bit for bit against the real packing of the first
        occurrence; a generator whose packing is not a pure rearrangement is simply called again.
        """
        values = {k: kwargs[k] for k in weight_keys if kwargs.get(k) is not None}
        config = (gen.__module__, gen.__qualname__) + tuple(
            (k, _freeze(v)) for k, v in sorted(kwargs.items()) if k not in values) + tuple(
            (k, v.shape, str(v.dtype)) for k, v in sorted(values.items()))
        entry = self._shared.get(config)
        if entry is None:
            info = gen(self.kmod(), name, **kwargs)
            # The first weights are kept to learn or check packings, unless a packer makes that moot
            # and the caller wants weights released as soon as they are packed.
            keep = not self.release_weights or _packer_for(gen) is None or _verify_packers()
            self._shared[config] = {"info": info, "first": values if keep else {}, "maps": None, "failed": False}
            return info
        first: KernelInfo = entry["info"]
        packer = _packer_for(gen)
        if packer is not None:
            # The generator packs without generating code (kernels/conv.py: pack_conv2d).
            packed = packer(**kwargs)
            if _verify_packers() and not entry.get("packer_checked"):
                again = packer(**{**kwargs, **entry["first"]})
                if len(again) != len(first.packed) or not all(_same_bits(a, b) for a, b in zip(again, first.packed)):
                    raise InternalError(f"{packer.__qualname__} disagrees with the packing of the kernel it serves")
                entry["packer_checked"] = True
            return KernelInfo(first.function, list(packed), first.scratch_bytes_per_thread)
        if entry["maps"] is None and not entry["failed"]:
            gather = _looks_like_gather(entry["first"], first.packed)
            entry["maps"] = self._packing_maps(gen, name, kwargs, values, entry) if gather else None
            entry["failed"] = entry["maps"] is None
        if entry["failed"]:
            # The packing transforms values (e.g. Winograd): pack this one in a throwaway module and
            # still share the code, which never depends on weight values (they come in as pointers).
            own = gen(ir.Module(name="glowpy.pack"), name, **kwargs)
            if len(own.packed) != len(first.packed) or own.scratch_bytes_per_thread != first.scratch_bytes_per_thread:
                return gen(self.kmod(), f"{name}.own", **kwargs)
            return KernelInfo(first.function, own.packed, first.scratch_bytes_per_thread)
        flat = _flat_weights(values)
        return KernelInfo(first.function, [flat[m] for m in entry["maps"]], first.scratch_bytes_per_thread)

    def _packing_maps(self, gen, name, kwargs, values, entry) -> list[np.ndarray] | None:
        total = sum(v.size for v in values.values())
        if total >= 1 << 24 or any(v.dtype != np.float32 for v in values.values()):
            return None  # position codes must stay exact in float32
        coded, at = {}, 1
        for k, v in values.items():
            coded[k] = np.arange(at, at + v.size, dtype=np.float64).astype(np.float32).reshape(v.shape)
            at += v.size
        probe = gen(ir.Module(name="glowpy.probe"), name, **{**kwargs, **coded})
        first: KernelInfo = entry["info"]
        if len(probe.packed) != len(first.packed):
            return None
        maps = []
        flat_first = _flat_weights(entry["first"])
        for p, real in zip(probe.packed, first.packed):
            p = np.asarray(p)
            if p.dtype != np.float32 or p.shape != np.asarray(real).shape:
                return None
            idx = p.astype(np.int32)
            if not (np.array_equal(idx, p) and idx.min(initial=0) >= 0 and idx.max(initial=0) <= total):
                return None
            if not np.array_equal(flat_first[idx].view(np.uint32), np.asarray(real, np.float32).view(np.uint32)):
                return None
            maps.append(idx)
        return maps

    # --- driver -------------------------------------------------------------------------------

    def run(self) -> list[Step]:
        for node in self.graph.nodes:
            if node.op in HEAVY_OPS:
                self._lower_heavy(node, Epilogue.of(node))
        for node in reversed(self.graph.nodes):
            if id(node) in self._claimed or node.op not in ELEMENTWISE_OPS or node.op in ("Identity", "Dropout"):
                continue
            self._lower_group(self._grow_group(node))
        for node in self.graph.nodes:
            if id(node) in self._claimed:
                continue
            try:
                self._lower_node(node)
            except GlowpyError as e:
                raise e.at(node=node.name, op=node.op)
        self.steps.sort(key=lambda s: s.position)
        return self.steps

    def _lower_node(self, node: Node) -> None:
        if node.op in ALIAS_OPS:
            self.add(Step(self.fname([node]), None, [], [node.outputs[0]], [node],
                          alias=(node.outputs[0], node.inputs[0])))
            return
        method = getattr(self, f"_lower_{node.op}", None)
        if method is None:
            raise UnsupportedOperator("the CPU backend has no kernel for this op", node=node.name, op=node.op)
        method(node)

    # --- fusion: elementwise groups -----------------------------------------------------------

    def _grow_group(self, root: Node) -> list[Node]:
        shape = root.outputs[0].shape
        members = {id(root): root}
        changed = True
        while changed:
            changed = False
            for g in list(members.values()):
                for v in g.inputs:
                    p = v.producer
                    if (p is None or id(p) in members or id(p) in self._claimed or p.op not in ELEMENTWISE_OPS
                            or len(p.outputs) != 1 or id(v) in self._outputs or v.shape != shape
                            or not all(id(u) in members for u in v.users)):
                        continue
                    members[id(p)] = p
                    changed = True
        return sorted(members.values(), key=lambda n: self._index[id(n)])

    def _lower_group(self, nodes: list[Node]) -> None:
        out = nodes[-1].outputs[0]
        produced = {id(n.outputs[0]): j for j, n in enumerate(nodes)}
        operands: list[EW.Operand] = []
        names: list[str] = []
        args: list[Arg] = [self.val(out)]
        keys: dict[int, int] = {}
        exprs: list[EW.Expr] = []
        inplace: list[tuple[Value, Value]] = []

        def operand(key: int, arg: Arg, shape: tuple[int, ...], dtype: np.dtype, name: str) -> tuple[str, int]:
            if key not in keys:
                keys[key] = len(operands)
                operands.append(EW.Operand(tuple(shape), np.dtype(dtype)))
                names.append(_ident(name))
                args.append(arg)
            return ("in", keys[key])

        def ref(v: Value, view: tuple[int, ...] | None = None) -> tuple[str, Any]:
            if id(v) in produced:
                return ("expr", produced[id(v)])
            if v.is_constant and v.type.size == 1 and view is None:
                return ("imm", np.asarray(v.data).reshape(-1)[0].item())
            if (v.kind != "constant" and view is None and v.shape == out.shape
                    and v.dtype.itemsize == out.dtype.itemsize):
                inplace.append((out, v))
            return operand(id(v), self.val(v), view if view is not None else v.shape, v.dtype, v.name)

        for n in nodes:
            if n.op == "BatchNormalization":
                # Parameters broadcast over dim 1. The optimizer lowers a BatchNormalization it could
                # not fold into a per-channel Mul and Add (CpuBackend.should_lower); this serves
                # unoptimized graphs.
                x = n.inputs[0]
                view = (1, x.shape[1]) + (1,) * (x.type.rank - 2)
                refs = [ref(x)] + [ref(v, view) for v in n.inputs[1:]]
                exprs.append(EW.Expr("BatchNormalization", n.attrs, refs, [x.dtype] * 5, x.dtype, n.name))
                continue
            exprs.append(EW.Expr(n.op, n.attrs, [ref(v) for v in n.inputs], [v.dtype for v in n.inputs],
                                 n.outputs[0].dtype, n.name))
        group = EW.FusedElementwise(out.shape, out.dtype, operands, exprs, names)
        fn = EW.emit_fused(self.kmod(), self.fname(nodes), group)
        self.add(Step(fn.name, fn, args, [out], nodes, work=out.type.size * len(exprs), inplace=inplace))

    def _post_elementwise(self, nodes: list[Node], src: Value, out: Value, addend: Value | None, beta: float,
                          activation: str, params: tuple) -> None:
        """out = act(src + beta * addend) as its own loop (a runtime bias a kernel cannot take)."""
        dt = out.dtype
        operands = [EW.Operand(src.shape, dt)]
        args = [self.val(out), self.val(src)]
        exprs: list[EW.Expr] = []
        cur: tuple[str, Any] = ("in", 0)
        if addend is not None:
            operands.append(EW.Operand(addend.shape, addend.dtype))
            args.append(self.val(addend))
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
        fn = EW.emit_fused(self.kmod(), self.fname(nodes) + ".post", group)
        inplace = [(out, src)]
        self.add(Step(fn.name, fn, args, [out], nodes, work=out.type.size * len(exprs), inplace=inplace))

    # --- heavy ops ----------------------------------------------------------------------------

    def _lower_heavy(self, node: Node, epi: Epilogue) -> None:
        first_step = len(self.steps)
        try:
            getattr(self, f"_heavy_{node.op}")(node, epi)
        except GlowpyError as e:
            raise e.at(node=node.name, op=node.op)
        if self.release_weights:
            # Constants folded or packed into the kernel's arrays: once every use of one is, the graph's
            # copy is dead weight (the packed arrays are what runs).
            passed = {id(a.value) for s in self.steps[first_step:] for a in s.args if a.kind == "value"}
            for n in epi.nodes:
                for v in n.inputs:
                    if v.is_constant and id(v) not in passed:
                        k = self._packed_uses[id(v)] = self._packed_uses.get(id(v), 0) + 1
                        if k == len(v.users) and id(v) not in self._outputs:
                            v.data = None

    def _temp(self, like: Value, name: str) -> Value:
        """A kernel-private intermediate (not in the graph) that still gets arena memory."""
        return Value(f"{like.name}.{name}", like.type, "node")

    def _heavy_Conv(self, node: Node, epi: Epilogue) -> None:
        x, wv, bv = node.inputs[0], node.inputs[1], node.inputs[2]
        out = epi.out
        dt = x.dtype
        a = node.attrs
        nsp = x.type.rank - 2
        name = self.fname(epi.nodes)
        res_arg = self.val(epi.residual) if epi.residual is not None else NULL
        work = 2.0 * out.type.size * wv.type.size / max(wv.shape[0], 1)
        if wv.is_constant and bv.is_constant:
            w = np.asarray(wv.data)
            bias = np.asarray(bv.data)
            info = None
            gen = _conv_generator() if self.fast_kernels and dt == np.float32 and nsp in (1, 2) else None
            if gen is not None:
                x_shape, w2, strides, pads, dil = x.shape, w, a["strides"], a["pads"], a["dilations"]
                if nsp == 1:  # a 1-D conv is a 2-D conv of height 1
                    x_shape = (x.shape[0], x.shape[1], 1, x.shape[2])
                    w2 = w.reshape(w.shape[0], w.shape[1], 1, w.shape[2])
                    strides, pads, dil = (1, strides[0]), (0, pads[0], 0, pads[1]), (1, dil[0])
                try:
                    info = self.generate(gen, name, ("w", "bias"), x_shape=tuple(x_shape), w=w2, bias=bias,
                                         strides=tuple(strides), pads=tuple(pads), dilations=tuple(dil),
                                         group=a["group"], activation=epi.activation,
                                         activation_params=tuple(epi.params), has_residual=epi.residual is not None,
                                         vector_width=self.vector_width)
                    self.used_fast.append(name)
                except (NotImplementedError, GlowpyError):
                    info = None
            if info is None:
                info = self.generate(
                    linalg.generic_conv2d, name, ("w", "bias"), x_shape=tuple(x.shape), w=w, bias=bias,
                    strides=tuple(a["strides"]), pads=tuple(a["pads"]), dilations=tuple(a["dilations"]),
                    group=a["group"], activation=epi.activation, activation_params=tuple(epi.params),
                    has_residual=epi.residual is not None, vector_width=self.vector_width)
            args = [self.val(out), self.val(x), res_arg, SCRATCH] + [self.array(p) for p in info.packed]
            self.add(Step(info.function.name, info.function, args, [out], epi.nodes, work=work,
                          scratch=info.scratch_bytes_per_thread, inplace=self._residual_inplace(out, epi)))
            return
        fn, scratch = linalg.emit_conv_generic(
            self.kmod(), name, dt, x_shape=x.shape, w_shape=wv.shape, strides=a["strides"], pads=a["pads"],
            dilations=a["dilations"], group=a["group"], activation=epi.activation,
            activation_params=epi.params, has_residual=epi.residual is not None)
        args = [self.val(out), self.val(x), res_arg, SCRATCH, self.val(wv), self.val(bv)]
        self.add(Step(fn.name, fn, args, [out], epi.nodes, work=work, scratch=scratch,
                      inplace=self._residual_inplace(out, epi)))

    @staticmethod
    def _residual_inplace(out: Value, epi: Epilogue) -> list[tuple[Value, Value]]:
        """Both conv kernels read each residual element before writing that output element (the
        contract in kernels/conv.py), so the output may take over a residual that dies here."""
        r = epi.residual
        return [(out, r)] if r is not None and r.shape == out.shape and r.dtype == out.dtype else []

    def _gemm(self, nodes: list[Node], out: Value, a: Value, *, M: int, N: int, K: int, a_trans: bool,
              b: Value, b_trans: bool, alpha: float, bias: np.ndarray | None, bias_kind: str, activation: str,
              params: tuple, work: float) -> None:
        """One matrix product step out(M, N) = act(alpha * op(A) op(B) + bias)."""
        dt = out.dtype
        name = self.fname(nodes)
        b_arr = np.asarray(b.data) if b.is_constant else None
        info = None
        gen = _gemm_generator() if self.fast_kernels and dt == np.float32 else None
        kwargs = dict(M=M, N=N, K=K, a_trans=a_trans, b=b_arr, b_trans=b_trans, alpha=float(alpha),
                      bias=bias, bias_kind=bias_kind, activation=activation, activation_params=tuple(params),
                      vector_width=self.vector_width)
        if gen is not None:
            try:
                info = self.generate(gen, name, ("b", "bias"), **kwargs)
                self.used_fast.append(name)
            except (NotImplementedError, GlowpyError):
                info = None
        if info is None:
            info = self.generate(linalg.generic_gemm, name, ("b", "bias"), dtype=dt, **kwargs)
        args = [self.val(out), self.val(a), NULL if b_arr is not None else self.val(b), SCRATCH]
        args += [self.array(p) for p in info.packed]
        self.add(Step(info.function.name, info.function, args, [out], nodes, work=work,
                      scratch=info.scratch_bytes_per_thread))

    def _heavy_Gemm(self, node: Node, epi: Epilogue) -> None:
        a_v, b_v = node.inputs[0], node.inputs[1]
        c_v = node.inputs[2] if len(node.inputs) > 2 else None
        at = node.attrs
        M, N = node.outputs[0].shape
        K = a_v.shape[0] if at["transA"] else a_v.shape[1]
        dt = node.outputs[0].dtype
        bias, kind = None, "none"
        post = None
        if c_v is not None:
            if c_v.is_constant:
                c = np.asarray(c_v.data, dtype=np.float64) * at["beta"]
                if c.size == 1 or (c.ndim >= 1 and c.shape[-1] == N and c.size == N):
                    bias, kind = np.broadcast_to(c.reshape(-1), (N,)).astype(dt), "col"
                else:
                    bias, kind = np.ascontiguousarray(np.broadcast_to(c, (M, N))).astype(dt), "full"
            else:
                post = c_v
        work = 2.0 * M * N * K
        if post is None:
            self._gemm(epi.nodes, epi.out, a_v, M=M, N=N, K=K, a_trans=bool(at["transA"]), b=b_v,
                       b_trans=bool(at["transB"]), alpha=at["alpha"], bias=bias, bias_kind=kind,
                       activation=epi.activation, params=epi.params, work=work)
            return
        tmp = self._temp(epi.out, "acc")
        self._gemm(epi.nodes, tmp, a_v, M=M, N=N, K=K, a_trans=bool(at["transA"]), b=b_v,
                   b_trans=bool(at["transB"]), alpha=at["alpha"], bias=bias, bias_kind=kind,
                   activation="none", params=(), work=work)
        self._post_elementwise(epi.nodes, tmp, epi.out, post, at["beta"], epi.activation, epi.params)

    def _heavy_FullyConnected(self, node: Node, epi: Epilogue) -> None:
        x, w, b_v = node.inputs
        M, N = node.outputs[0].shape
        K = x.shape[1]
        dt = node.outputs[0].dtype
        work = 2.0 * M * N * K
        if b_v.is_constant:
            bias, kind = np.asarray(b_v.data).astype(dt), "col"
            self._gemm(epi.nodes, epi.out, x, M=M, N=N, K=K, a_trans=False, b=w, b_trans=False, alpha=1.0,
                       bias=bias, bias_kind=kind, activation=epi.activation, params=epi.params, work=work)
            return
        tmp = self._temp(epi.out, "acc")
        self._gemm(epi.nodes, tmp, x, M=M, N=N, K=K, a_trans=False, b=w, b_trans=False, alpha=1.0,
                   bias=None, bias_kind="none", activation="none", params=(), work=work)
        self._post_elementwise(epi.nodes, tmp, epi.out, b_v, 1.0, epi.activation, epi.params)

    def _heavy_MatMul(self, node: Node, epi: Epilogue) -> None:
        a_v, b_v = node.inputs
        out = epi.out
        dt = out.dtype
        ash, bsh = a_v.shape, b_v.shape
        a2 = (1, *ash) if len(ash) == 1 else ash
        b2 = (*bsh, 1) if len(bsh) == 1 else bsh
        K = a2[-1]
        N = b2[-1]
        if len(b2) == 2:
            M = math.prod(a2[:-1])
            work = 2.0 * M * N * K
            if dt.kind == "f":
                self._gemm(epi.nodes, out, a_v, M=M, N=N, K=K, a_trans=False, b=b_v, b_trans=False, alpha=1.0,
                           bias=None, bias_kind="none", activation=epi.activation, params=epi.params, work=work)
                return
            batch, a_bs, b_bs = (), (), ()
        else:
            M = a2[-2]
            batch = tuple(np.broadcast_shapes(a2[:-2], b2[:-2]))
            a_bs = self._batch_strides(a2[:-2], batch, M * K)
            b_bs = self._batch_strides(b2[:-2], batch, K * N)
            work = 2.0 * math.prod(batch) * M * N * K
        fn, scratch = linalg.emit_matmul_generic(
            self.kmod(), self.fname(epi.nodes), dt, M=M, N=N, K=K, batch=batch, a_batch_strides=a_bs,
            b_batch_strides=b_bs, activation=epi.activation, activation_params=epi.params)
        args = [self.val(out), self.val(a_v), self.val(b_v), SCRATCH, NULL]
        self.add(Step(fn.name, fn, args, [out], epi.nodes, work=work, scratch=scratch))

    @staticmethod
    def _batch_strides(shape: tuple[int, ...], batch: tuple[int, ...], matrix: int) -> tuple[int, ...]:
        padded = (1,) * (len(batch) - len(shape)) + tuple(shape)
        st = U.contiguous_strides(padded)
        return tuple(0 if padded[d] == 1 and batch[d] != 1 else st[d] * matrix for d in range(len(batch)))

    # --- other ops ----------------------------------------------------------------------------

    def _simple(self, node: Node, fn: ir.Function, ins: list[Arg], work: float, scratch: int = 0,
                outs: list[Value] | None = None) -> None:
        outs = outs if outs is not None else [node.outputs[0]]
        args = [self.val(o) for o in outs] + ins
        self.add(Step(fn.name, fn, args, outs, [node], work=work, scratch=scratch))

    def _lower_ConvTranspose(self, node: Node) -> None:
        x, w, b = node.inputs
        a = node.attrs
        out = node.outputs[0]
        fn, scratch = linalg.emit_conv_transpose(
            self.kmod(), self.fname([node]), x.dtype, x_shape=x.shape, w_shape=w.shape, out_shape=out.shape,
            strides=a["strides"], pads=a["pads"], dilations=a["dilations"], group=a["group"])
        work = 2.0 * out.type.size * w.type.size / max(w.shape[1], 1)
        self._simple(node, fn, [self.val(x), self.val(w), self.val(b), SCRATCH], work, scratch)

    def _pool(self, node: Node, kind: str) -> None:
        x, out = node.inputs[0], node.outputs[0]
        a = node.attrs
        nsp = x.type.rank - 2
        dil = a.get("dilations") or (1,) * nsp
        fn = pool.emit_pool(self.kmod(), self.fname([node]), x.dtype, x.shape, out.shape, kind, a["kernel_shape"],
                            a["strides"], a["pads"], dil, bool(a.get("count_include_pad", 0)))
        self._simple(node, fn, [self.val(x)], out.type.size * math.prod(a["kernel_shape"]))

    def _lower_MaxPool(self, node: Node) -> None:
        self._pool(node, "max")

    def _lower_AveragePool(self, node: Node) -> None:
        self._pool(node, "avg")

    def _reduce(self, node: Node, axes: tuple[int, ...], kind: str) -> None:
        x = node.inputs[0]
        fn = reduce.emit_reduce(self.kmod(), self.fname([node]), x.dtype, x.shape, axes, kind)
        self._simple(node, fn, [self.val(x)], x.type.size)

    def _lower_GlobalAveragePool(self, node: Node) -> None:
        self._reduce(node, tuple(range(2, node.inputs[0].type.rank)), "mean")

    def _lower_GlobalMaxPool(self, node: Node) -> None:
        self._reduce(node, tuple(range(2, node.inputs[0].type.rank)), "max")

    def _lower_ReduceSum(self, node: Node) -> None:
        self._reduce(node, tuple(node.attrs["axes"]), "sum")

    def _lower_ReduceMean(self, node: Node) -> None:
        self._reduce(node, tuple(node.attrs["axes"]), "mean")

    def _lower_ReduceMax(self, node: Node) -> None:
        self._reduce(node, tuple(node.attrs["axes"]), "max")

    def _lower_ArgMax(self, node: Node) -> None:
        x = node.inputs[0]
        fn = reduce.emit_argmax(self.kmod(), self.fname([node]), x.dtype, x.shape, node.attrs["axis"],
                                bool(node.attrs["select_last_index"]))
        self._simple(node, fn, [self.val(x)], x.type.size)

    def _lower_Softmax(self, node: Node, log: bool = False) -> None:
        x = node.inputs[0]
        fn = norm.emit_softmax(self.kmod(), self.fname([node]), x.dtype, x.shape, node.attrs["axis"], log)
        self._simple(node, fn, [self.val(x)], 8.0 * x.type.size)

    def _lower_LogSoftmax(self, node: Node) -> None:
        self._lower_Softmax(node, log=True)

    def _lower_LayerNormalization(self, node: Node) -> None:
        x, scale = node.inputs[0], node.inputs[1]
        bias = node.inputs[2] if len(node.inputs) > 2 else None
        fn = norm.emit_layer_norm(self.kmod(), self.fname([node]), x.dtype, x.shape, node.attrs["axis"],
                                  node.attrs["epsilon"], scale.shape, bias.shape if bias is not None else None)
        self._simple(node, fn, [self.val(x), self.val(scale), self.val(bias) if bias is not None else NULL],
                     6.0 * x.type.size)

    def _lower_LRN(self, node: Node) -> None:
        x = node.inputs[0]
        a = node.attrs
        fn = norm.emit_lrn(self.kmod(), self.fname([node]), x.dtype, x.shape, a["size"], a["alpha"], a["beta"],
                           a["bias"])
        self._simple(node, fn, [self.val(x)], x.type.size * (a["size"] + 8))

    def _copies(self, node: Node, copies: list[movement.Copy], outs: list[Value], ins: list[Value]) -> None:
        names = [_ident(v.name) for v in outs] + [_ident(v.name) for v in ins]
        dt = ins[0].dtype
        fn = movement.emit_copies(self.kmod(), self.fname([node]), dt, names, copies)
        work = sum(math.prod(c.shape) for c in copies)
        self._simple(node, fn, [self.val(v) for v in ins], work, outs=outs)

    def _lower_Transpose(self, node: Node) -> None:
        x = node.inputs[0]
        self._copies(node, [movement.transpose_copy(x.shape, node.attrs["perm"])], node.outputs, [x])

    def _lower_Slice(self, node: Node) -> None:
        x, out = node.inputs[0], node.outputs[0]
        a = node.attrs
        self._copies(node, [movement.slice_copy(x.shape, out.shape, a["starts"], a["axes"], a["steps"])],
                     node.outputs, [x])

    def _lower_Expand(self, node: Node) -> None:
        x, out = node.inputs[0], node.outputs[0]
        self._copies(node, [movement.expand_copy(x.shape, out.shape)], node.outputs, [x])

    def _lower_Concat(self, node: Node) -> None:
        out = node.outputs[0]
        axis = node.attrs["axis"] % out.type.rank
        self._copies(node, movement.concat_copies([v.shape for v in node.inputs], out.shape, axis),
                     node.outputs, list(node.inputs))

    def _lower_Split(self, node: Node) -> None:
        x = node.inputs[0]
        axis = node.attrs["axis"] % x.type.rank
        self._copies(node, movement.split_copies(x.shape, node.attrs["split"], axis), list(node.outputs), [x])

    def _lower_Pad(self, node: Node) -> None:
        x, out = node.inputs[0], node.outputs[0]
        a = node.attrs
        fn = movement.emit_pad(self.kmod(), self.fname([node]), x.dtype, x.shape, out.shape, a["pads"], a["mode"],
                               a["value"])
        self._simple(node, fn, [self.val(x)], 2.0 * out.type.size)

    def _lower_Gather(self, node: Node) -> None:
        x, idx = node.inputs
        axis = node.attrs["axis"] % x.type.rank
        fn = movement.emit_gather(self.kmod(), self.fname([node]), x.dtype, idx.dtype, x.shape, idx.type.size, axis)
        self._simple(node, fn, [self.val(x), self.val(idx)], node.outputs[0].type.size)


def copy_function(module: ir.Module, name: str, value: Value) -> ir.Function:
    """A plain copy of one buffer (aliases that cannot alias, outputs that are inputs or repeated)."""
    return movement.emit_copies(module, _ident(name), value.dtype, ["out", "src"],
                                [movement.plain_copy(value.shape)])
