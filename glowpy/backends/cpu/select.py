"""Kernel selection: the table from IR op to the function that emits its step (KERNELS), and those
functions. The matrix products and convolutions take the activation and residual operand the
optimizer fused into them (Epilogue) and pick the tiled float32 generator (kernels/conv.py,
kernels/gemm.py) or the plain one (kernels/linalg.py); the other ops map to one kernel each."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
from llvmlite import ir

from glowpy.backends.cpu import irutil as U
from glowpy.backends.cpu.fusion import post_elementwise
from glowpy.backends.cpu.kernels import elementwise as EW
from glowpy.backends.cpu.kernels import (
    grid_sample,
    indexing,
    linalg,
    movement,
    norm,
    pool,
    qgemm,
    qlinear,
    reduce,
    resize,
    rnn,
)
from glowpy.backends.cpu.kernels.attention import emit_attention
from glowpy.backends.cpu.kernels.batched import emit_batched_gemm
from glowpy.backends.cpu.kernels.conv import (
    emit_conv2d,
    panel_pixels,
    reads_panels,
    splits_pixels,
    splits_rows,
)
from glowpy.backends.cpu.kernels.gemm import emit_gemm
from glowpy.backends.cpu.kernels.quant import KERNELS as QUANT_KERNELS
from glowpy.backends.cpu.kernels.squeeze_excite import emit_squeeze_excite
from glowpy.backends.cpu.loops import emit_loop
from glowpy.backends.cpu.module_text import ident
from glowpy.backends.cpu.steps import NULL, SCRATCH, SYNC, Arg, Epilogue, Step
from glowpy.errors import GlowpyError, UnsupportedOperator
from glowpy.ir.graph import Node, Value
from glowpy.ir.ops import OPS
from glowpy.ir.ops.nn import col2im_table, unpool_shape
from glowpy.ir.ops.resize import tables_for
from glowpy.ir.ops.rnn import CELLS, activations_of
from glowpy.ir.types import TensorType

if TYPE_CHECKING:
    from glowpy.backends.cpu.lowering import Lowering

# Ops whose node carries a fused epilogue (glowpy.ir.ops.nn FUSED).
HEAVY_OPS = frozenset({"Conv", "Gemm", "MatMul", "FullyConnected"})


def lower_heavy_node(low: Lowering, node: Node) -> None:
    lower_heavy(low, node, Epilogue.of(node))


def lower_heavy(low: Lowering, node: Node, epi: Epilogue) -> None:
    first_step = len(low.steps)
    try:
        HEAVY[node.op](low, node, epi)
    except GlowpyError as e:
        raise e.at(node=node.name, op=node.op)
    if low.release_weights:
        # Constants folded or packed into the kernel's arrays: once every use of one is, the graph's
        # copy is dead weight (the packed arrays are what runs).
        passed = {id(a.value) for s in low.steps[first_step:] for a in s.args if a.kind == "value"}
        for n in epi.nodes:
            for v in n.inputs:
                if v.is_constant and id(v) not in passed:
                    k = low._packed_uses[id(v)] = low._packed_uses.get(id(v), 0) + 1
                    if k == len(v.users) and id(v) not in low._outputs:
                        v.data = None


def _temp(like: Value, name: str) -> Value:
    """A kernel-private intermediate (not in the graph) that still gets arena memory."""
    return Value(f"{like.name}.{name}", like.type, "node")


def _conv_geometry(node: Node, vector_width: int) -> dict:
    a = node.attrs
    return dict(x_shape=node.inputs[0].shape, w_shape=node.inputs[1].shape, strides=a["strides"], pads=a["pads"],
                dilations=a["dilations"], group=a["group"], vector_width=vector_width)


DEPTHWISE_WORK_FACTOR = 4


def _conv_splits_rows(low: Lowering, conv: Node) -> bool:
    """Whether a direct conv (depthwise, or a stem over a few input channels) splits bands of rows: where
    its geometry allows, a stem always (each thread then copies only its band of the input, not all of
    it), a depthwise conv when its input was written by pixel ranges."""
    if conv.inputs[0].type.rank != 4 or conv.inputs[1].type.rank != 4:
        return False
    if not splits_rows(**_conv_geometry(conv, low.vector_width), has_residual=len(conv.inputs) > 3):
        return False
    return conv.inputs[1].shape[1] > 1 or _written_by_pixels(low, conv.inputs[0])


def _written_by_pixels(low: Lowering, x: Value) -> bool:
    """Whether threads write `x` by ranges of pixels: a 2-D conv on the pixel path produced it, or a direct
    conv that splits rows."""
    p = x.producer
    if low.nthreads < 2 or not low.fast_kernels or p is None or p.op != "Conv" or x is not p.outputs[0]:
        return False
    if p.inputs[0].type.rank != 4 or p.inputs[1].type.rank != 4:
        return False
    return splits_pixels(**_conv_geometry(p, low.vector_width)) or _conv_splits_rows(low, p)


def _split_like_neighbours(low: Lowering, node: Node, x: Value, epi: Epilogue) -> str:
    """How a 2-D conv's threads should split its output (emit_conv2d's `split`) so that neighbouring steps
    read what their own core wrote: a direct conv (depthwise, stem) splits bands of rows where
    _conv_splits_rows says so; a pixel-path conv whose only readers are depthwise convs that split by
    planes splits by channels."""
    if low.nthreads < 2 or not low.fast_kernels or x.type.rank != 4 or node.inputs[1].type.rank != 4:
        return ""
    if _conv_splits_rows(low, node):
        return "pixels"
    users = epi.out.users
    if users and all(u.op == "Conv" and u.inputs[0] is epi.out and u.attrs["group"] > 1 and u.inputs[1].type.rank == 4
                     and not splits_rows(**_conv_geometry(u, low.vector_width), has_residual=len(u.inputs) > 3)
                     for u in users):
        return "channels"
    return ""


# Activations written by a pixel-path conv and read only by convs that can take it are kept panel-major
# (kernels/conv.py, PANEL LAYOUT): the reading 1x1 convs then take their pixel panels in place instead of
# copying rows a plane apart (ResNet-50, Xeon: 2.2-2.4% of the run at 1 and 2 threads). A switch for
# measurements.
PANEL_LAYOUT = True


def _fast_conv(low: Lowering, node: Node) -> bool:
    """Whether this Conv is lowered by emit_conv2d (its float32 1-D and 2-D kernels)."""
    x, w, bv = node.inputs[0], node.inputs[1], node.inputs[2]
    return low.fast_kernels and x.dtype == np.float32 and x.type.rank in (3, 4) and w.is_constant and bv.is_constant


def _fast_conv2d(low: Lowering, node: Node) -> bool:
    """Whether this Conv is lowered by emit_conv2d as a 2-D conv (panel-major operands are 2-D)."""
    return _fast_conv(low, node) and node.inputs[0].type.rank == 4


def _panel_widths(low: Lowering, user: Node, v: Value) -> set[int] | None:
    """The panel widths in which `user` can read `v` panel-major in every role it has there (-1: any), or
    None: as its input, its own width (a 1x1 conv on the pixel path, which reads panels in place) or any (a
    conv that packs its input by gathers); as its residual, its own width (the pixel path)."""
    if user.op != "Conv" or not _fast_conv2d(low, user) or any(i is v for i in user.inputs[1:3]):
        return None
    geo = _conv_geometry(user, low.vector_width)
    as_x, as_res = user.inputs[0] is v, len(user.inputs) > 3 and user.inputs[3] is v
    widths = {-1}
    if as_x:
        widths = {reads_panels(**geo)}
    if as_res:
        own = panel_pixels(**geo)
        widths = {own} if widths in ({-1}, {own}) else {0}
    return None if 0 in widths else widths


def panel_major(low: Lowering) -> dict[int, int]:
    """id(value) -> panel width, for the conv outputs kept panel-major: written by a pixel-path conv, read
    only by convs that take that layout (in the width the 1x1 and residual readers need, else the writer's
    own), not a graph output (planned once per lowering)."""
    if low.panel_major is None:
        plan: dict[int, int] = {}
        for node in low.graph.nodes if PANEL_LAYOUT else ():
            if node.op != "Conv" or not _fast_conv2d(low, node):
                continue
            out = node.outputs[0]
            own = panel_pixels(**_conv_geometry(node, low.vector_width))
            if not own or not out.users or id(out) in low._outputs:
                continue
            readers = [_panel_widths(low, u, out) for u in out.users]
            if any(r is None for r in readers):
                continue
            needed = set().union(*readers) - {-1}
            if len(needed) <= 1 and all(w % low.vector_width == 0 for w in needed):
                plan[id(out)] = needed.pop() if needed else own
        low.panel_major = plan
    return low.panel_major


def _heavy_Conv(low: Lowering, node: Node, epi: Epilogue) -> None:
    x, wv, bv = node.inputs[0], node.inputs[1], node.inputs[2]
    out = epi.out
    dt = x.dtype
    a = node.attrs
    nsp = x.type.rank - 2
    name = low.fname(epi.nodes)
    res_arg = low.val(epi.residual) if epi.residual is not None else NULL
    work = 2.0 * out.type.size * wv.type.size / max(wv.shape[0], 1)
    if a["group"] > 1 and wv.shape[1] == 1:
        # a depthwise conv is memory-bound: ~4x slower per FLOP than the GEMM-like convs the split threshold
        # is set for (MobileNet-v2's 14x14 -> 7x7 one, 0.5 MFLOP, ran 24 us on one thread; Xeon)
        work *= DEPTHWISE_WORK_FACTOR
    plan = panel_major(low)
    panels = (plan.get(id(x), 0), plan.get(id(out), 0), plan.get(id(epi.residual), 0) if epi.residual is not None else 0)
    if wv.is_constant and bv.is_constant:
        w = np.asarray(wv.data)
        bias = np.asarray(bv.data)
        info = None
        gen = emit_conv2d if _fast_conv(low, node) else None
        if gen is not None:
            x_shape, w2, strides, pads, dil = x.shape, w, a["strides"], a["pads"], a["dilations"]
            if nsp == 1:  # a 1-D conv is a 2-D conv of height 1
                x_shape = (x.shape[0], x.shape[1], 1, x.shape[2])
                w2 = w.reshape(w.shape[0], w.shape[1], 1, w.shape[2])
                strides, pads, dil = (1, strides[0]), (0, pads[0], 0, pads[1]), (1, dil[0])
            try:
                info = low.generate(gen, name, ("w", "bias"), x_shape=tuple(x_shape), w=w2, bias=bias,
                                     strides=tuple(strides), pads=tuple(pads), dilations=tuple(dil),
                                     group=a["group"], activation=epi.activation,
                                     activation_params=tuple(epi.params), has_residual=epi.residual is not None,
                                     vector_width=low.vector_width,
                                     split=_split_like_neighbours(low, node, x, epi), panels=panels)
                low.used_fast.append(name)
            except (NotImplementedError, GlowpyError):
                if any(panels):  # a neighbour reads or writes this conv's operands panel-major
                    raise
                info = None
        if info is None:
            info = low.generate(
                linalg.generic_conv2d, name, ("w", "bias"), x_shape=tuple(x.shape), w=w, bias=bias,
                strides=tuple(a["strides"]), pads=tuple(a["pads"]), dilations=tuple(a["dilations"]),
                group=a["group"], activation=epi.activation, activation_params=tuple(epi.params),
                has_residual=epi.residual is not None, vector_width=low.vector_width)
        args = [low.val(out), low.val(x), res_arg, SCRATCH] + [low.array(p) for p in info.packed]
        inplace = _residual_inplace(out, epi) if panels[1] == panels[2] else []  # one layout or no sharing
        low.add(Step(info.function.name, info.function, args, [out], epi.nodes, work=work,
                      scratch=info.scratch_bytes_per_thread, inplace=inplace))
        return
    fn, scratch = linalg.emit_conv_generic(
        low.kmod(), name, dt, x_shape=x.shape, w_shape=wv.shape, strides=a["strides"], pads=a["pads"],
        dilations=a["dilations"], group=a["group"], activation=epi.activation,
        activation_params=epi.params, has_residual=epi.residual is not None)
    args = [low.val(out), low.val(x), res_arg, SCRATCH, low.val(wv), low.val(bv)]
    low.add(Step(fn.name, fn, args, [out], epi.nodes, work=work, scratch=scratch,
                  inplace=_residual_inplace(out, epi)))


def _residual_inplace(out: Value, epi: Epilogue) -> list[tuple[Value, Value]]:
    """Both conv kernels read each residual element before writing that output element (the
    contract in kernels/conv.py), so the output may take over a residual that dies here."""
    r = epi.residual
    return [(out, r)] if r is not None and r.shape == out.shape and r.dtype == out.dtype else []


def _gemm(low: Lowering, nodes: list[Node], out: Value, a: Value, *, M: int, N: int, K: int, a_trans: bool,
          b: Value, b_trans: bool, alpha: float, bias: np.ndarray | None, bias_kind: str, activation: str,
          params: tuple, work: float) -> None:
    """One matrix product step out(M, N) = act(alpha * op(A) op(B) + bias)."""
    dt = out.dtype
    name = low.fname(nodes)
    b_arr = np.asarray(b.data) if b.is_constant else None
    info = None
    gen = emit_gemm if low.fast_kernels and dt == np.float32 else None
    kwargs = dict(M=M, N=N, K=K, a_trans=a_trans, b=b_arr, b_trans=b_trans, alpha=float(alpha),
                  bias=bias, bias_kind=bias_kind, activation=activation, activation_params=tuple(params),
                  vector_width=low.vector_width)
    if gen is not None:
        try:
            info = low.generate(gen, name, ("b", "bias"), **kwargs)
            low.used_fast.append(name)
        except (NotImplementedError, GlowpyError):
            info = None
    if info is None:
        info = low.generate(linalg.generic_gemm, name, ("b", "bias"), dtype=dt, **kwargs)
    args = [low.val(out), low.val(a), NULL if b_arr is not None else low.val(b), SCRATCH]
    args += [low.array(p) for p in info.packed]
    low.add(Step(info.function.name, info.function, args, [out], nodes, work=work,
                  scratch=info.scratch_bytes_per_thread))


def _heavy_Gemm(low: Lowering, node: Node, epi: Epilogue) -> None:
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
        _gemm(low, epi.nodes, epi.out, a_v, M=M, N=N, K=K, a_trans=bool(at["transA"]), b=b_v,
                   b_trans=bool(at["transB"]), alpha=at["alpha"], bias=bias, bias_kind=kind,
                   activation=epi.activation, params=epi.params, work=work)
        return
    tmp = _temp(epi.out, "acc")
    _gemm(low, epi.nodes, tmp, a_v, M=M, N=N, K=K, a_trans=bool(at["transA"]), b=b_v,
               b_trans=bool(at["transB"]), alpha=at["alpha"], bias=bias, bias_kind=kind,
               activation="none", params=(), work=work)
    post_elementwise(low, epi.nodes, tmp, epi.out, post, at["beta"], epi.activation, epi.params)


def _heavy_FullyConnected(low: Lowering, node: Node, epi: Epilogue) -> None:
    x, w, b_v = node.inputs
    M, N = node.outputs[0].shape
    K = x.shape[1]
    dt = node.outputs[0].dtype
    work = 2.0 * M * N * K
    if b_v.is_constant:
        bias, kind = np.asarray(b_v.data).astype(dt), "col"
        if _batched_matmul(low, epi, x, w, M=M, N=N, K=K, bias=bias, work=work):
            return
        _gemm(low, epi.nodes, epi.out, x, M=M, N=N, K=K, a_trans=False, b=w, b_trans=False, alpha=1.0,
                   bias=bias, bias_kind=kind, activation=epi.activation, params=epi.params, work=work)
        return
    tmp = _temp(epi.out, "acc")
    _gemm(low, epi.nodes, tmp, x, M=M, N=N, K=K, a_trans=False, b=w, b_trans=False, alpha=1.0,
               bias=None, bias_kind="none", activation="none", params=(), work=work)
    post_elementwise(low, epi.nodes, tmp, epi.out, b_v, 1.0, epi.activation, epi.params)


def _heavy_MatMul(low: Lowering, node: Node, epi: Epilogue) -> None:
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
        if _batched_matmul(low, epi, a_v, b_v, M=M, N=N, K=K, work=work):
            return
        if dt.kind == "f":
            _gemm(low, epi.nodes, out, a_v, M=M, N=N, K=K, a_trans=False, b=b_v, b_trans=False, alpha=1.0,
                       bias=None, bias_kind="none", activation=epi.activation, params=epi.params, work=work)
            return
        batch, a_bs, b_bs = (), (), ()
    else:
        M = a2[-2]
        batch = tuple(np.broadcast_shapes(a2[:-2], b2[:-2]))
        a_bs = _batch_strides(a2[:-2], batch, M * K)
        b_bs = _batch_strides(b2[:-2], batch, K * N)
        work = 2.0 * math.prod(batch) * M * N * K
        if not b_v.is_constant and _batched_matmul(low, epi, a_v, b_v, M=M, N=N, K=K, batch=batch, a_bs=a_bs,
                                                   b_bs=b_bs, work=work):
            return
    fn, scratch = linalg.emit_matmul_generic(
        low.kmod(), low.fname(epi.nodes), dt, M=M, N=N, K=K, batch=batch, a_batch_strides=a_bs,
        b_batch_strides=b_bs, activation=epi.activation, activation_params=epi.params)
    args = [low.val(out), low.val(a_v), low.val(b_v), SCRATCH, NULL]
    low.add(Step(fn.name, fn, args, [out], epi.nodes, work=work, scratch=scratch))


# --- batched matrix products on gemm's micro-kernel with a K-blocked reduction (kernels/batched.py) ---


def _batched_matmul(low: Lowering, epi: Epilogue, a: Value, b: Value, *, M: int, N: int, K: int,
                    batch: tuple[int, ...] = (), a_bs: tuple[int, ...] = (), b_bs: tuple[int, ...] = (),
                    bias: np.ndarray | None = None, work: float) -> bool:
    """One step out = act(A @ B + bias) from kernels/batched.py, for float32 MatMul / FullyConnected
    (B a constant matrix, or a runtime operand per batch); False when that kernel does not apply."""
    out = epi.out
    if not low.fast_kernels or out.dtype != np.float32 or epi.residual is not None:
        return False
    b_arr = np.asarray(b.data, np.float32).reshape(K, N) if b.is_constant else None
    name = low.fname(epi.nodes)
    try:
        info = low.generate(emit_batched_gemm, name, ("b", "bias"), M=M, N=N, K=K, batch=batch,
                            a_batch_strides=a_bs, b_batch_strides=b_bs, b=b_arr, bias=bias,
                            activation=epi.activation, activation_params=tuple(epi.params),
                            vector_width=low.vector_width)
    except (NotImplementedError, GlowpyError):
        return False
    low.used_fast.append(name)
    args = [low.val(out), low.val(a), NULL if b_arr is not None else low.val(b), SCRATCH]
    args += [low.array(p) for p in info.packed]
    low.add(Step(info.function.name, info.function, args, [out], epi.nodes, work=work,
                 scratch=info.scratch_bytes_per_thread))
    return True


def _batch_strides(shape: tuple[int, ...], batch: tuple[int, ...], matrix: int) -> tuple[int, ...]:
    padded = (1,) * (len(batch) - len(shape)) + tuple(shape)
    st = U.contiguous_strides(padded)
    return tuple(0 if padded[d] == 1 and batch[d] != 1 else st[d] * matrix for d in range(len(batch)))


def _simple(low: Lowering, node: Node, fn: ir.Function, ins: list[Arg], work: float, scratch: int = 0,
            outs: list[Value] | None = None) -> None:
    outs = outs if outs is not None else [node.outputs[0]]
    args = [low.val(o) for o in outs] + ins
    low.add(Step(fn.name, fn, args, outs, [node], work=work, scratch=scratch))


def _lower_ConvTranspose(low: Lowering, node: Node) -> None:
    x, w, b = node.inputs
    a = node.attrs
    out = node.outputs[0]
    fn, scratch = linalg.emit_conv_transpose(
        low.kmod(), low.fname([node]), x.dtype, x_shape=x.shape, w_shape=w.shape, out_shape=out.shape,
        strides=a["strides"], pads=a["pads"], dilations=a["dilations"], group=a["group"])
    work = 2.0 * out.type.size * w.type.size / max(w.shape[1], 1)
    _simple(low, node, fn, [low.val(x), low.val(w), low.val(b), SCRATCH], work, scratch)


def _pool(low: Lowering, node: Node, kind: str) -> None:
    x, out = node.inputs[0], node.outputs[0]
    a = node.attrs
    nsp = x.type.rank - 2
    dil = a.get("dilations") or (1,) * nsp
    index_order = a["storage_order"] if a.get("indices") else None
    work = out.type.size * math.prod(a["kernel_shape"])
    if low.fast_kernels and pool.fast_2d(x.dtype, x.shape, out.shape, kind, a["kernel_shape"], a["strides"], dil,
                                             index_order, low.vector_width):
        info = pool.emit_pool_2d(low.kmod(), low.fname([node]), x.shape, out.shape, kind, a["kernel_shape"],
                                 a["strides"], a["pads"], bool(a.get("count_include_pad", 0)), low.vector_width,
                                 split_rows=_written_by_pixels(low, x))
        low.used_fast.append(info.function.name)
        args = [low.val(out), low.val(x), NULL, SCRATCH] + [low.array(t) for t in info.packed]
        low.add(Step(info.function.name, info.function, args, [out], [node], work=work,
                     scratch=info.scratch_bytes_per_thread))
        return
    fn = pool.emit_pool(low.kmod(), low.fname([node]), x.dtype, x.shape, out.shape, kind, a["kernel_shape"],
                        a["strides"], a["pads"], dil, bool(a.get("count_include_pad", 0)),
                        index_order=index_order, norm_p=a.get("p", 0))
    _simple(low, node, fn, [low.val(x)], work, outs=list(node.outputs))


def _lower_MaxPool(low: Lowering, node: Node) -> None:
    _pool(low, node, "max")


def _lower_AveragePool(low: Lowering, node: Node) -> None:
    _pool(low, node, "avg")


def _lower_LpPool(low: Lowering, node: Node) -> None:
    _pool(low, node, "lp")


def _lower_GridSample(low: Lowering, node: Node) -> None:
    x, grid = node.inputs
    a = node.attrs
    fn = grid_sample.emit_grid_sample(low.kmod(), low.fname([node]), x.dtype, x.shape, grid.shape, a["mode"],
                                      a["padding_mode"], bool(a["align_corners"]))
    taps = {"nearest": 1, "linear": 2, "cubic": 4}[a["mode"]] ** (x.type.rank - 2)
    _simple(low, node, fn, [low.val(x), low.val(grid)], float(node.outputs[0].type.size * taps))


def _lower_RoiAlign(low: Lowering, node: Node) -> None:
    x, rois, idx = node.inputs
    out = node.outputs[0]
    fn = grid_sample.emit_roi_align(low.kmod(), low.fname([node]), x.dtype, x.shape, idx.dtype, rois.shape[0],
                                    node.attrs)
    _simple(low, node, fn, [low.val(x), low.val(rois), low.val(idx)], float(out.type.size * 16))


def _lower_Col2Im(low: Lowering, node: Node) -> None:
    x, out = node.inputs[0], node.outputs[0]
    planes = out.shape[0] * out.shape[1]
    fn = pool.emit_col2im(low.kmod(), low.fname([node]), x.dtype, planes, x.type.size // max(planes, 1),
                          math.prod(out.shape[2:]))
    _simple(low, node, fn, [low.val(x), low.array(col2im_table(node.attrs).astype(np.int32))],
            float(x.type.size + out.type.size))


def _lower_MaxUnpool(low: Lowering, node: Node) -> None:
    x, idx = node.inputs
    out = node.outputs[0]
    fn = pool.emit_unpool(low.kmod(), low.fname([node]), x.dtype, x.type.size, unpool_shape(node.attrs, x.shape),
                          out.shape)
    _simple(low, node, fn, [low.val(x), low.val(idx)], float(out.type.size + x.type.size))


def _reduce(low: Lowering, node: Node, axes: tuple[int, ...], kind: str) -> None:
    x = node.inputs[0]
    fn = reduce.emit_reduce(low.kmod(), low.fname([node]), x.dtype, x.shape, axes, kind)
    _simple(low, node, fn, [low.val(x)], x.type.size)


def _lower_GlobalAveragePool(low: Lowering, node: Node) -> None:
    _reduce(low, node, tuple(range(2, node.inputs[0].type.rank)), "mean")


def _lower_GlobalMaxPool(low: Lowering, node: Node) -> None:
    _reduce(low, node, tuple(range(2, node.inputs[0].type.rank)), "max")


def _lower_ReduceSum(low: Lowering, node: Node) -> None:
    _reduce(low, node, tuple(node.attrs["axes"]), "sum")


def _lower_ReduceMean(low: Lowering, node: Node) -> None:
    _reduce(low, node, tuple(node.attrs["axes"]), "mean")


def _lower_ReduceMax(low: Lowering, node: Node) -> None:
    _reduce(low, node, tuple(node.attrs["axes"]), "max")


def _lower_ReduceMin(low: Lowering, node: Node) -> None:
    _reduce(low, node, tuple(node.attrs["axes"]), "min")


def _lower_ReduceProd(low: Lowering, node: Node) -> None:
    _reduce(low, node, tuple(node.attrs["axes"]), "prod")


def _lower_ArgMax(low: Lowering, node: Node) -> None:
    x = node.inputs[0]
    fn = reduce.emit_argmax(low.kmod(), low.fname([node]), x.dtype, x.shape, node.attrs["axis"],
                            bool(node.attrs["select_last_index"]))
    _simple(low, node, fn, [low.val(x)], x.type.size)


def _lower_Softmax(low: Lowering, node: Node, log: bool = False) -> None:
    x = node.inputs[0]
    axis = node.attrs["axis"] % x.type.rank
    if not log and x.dtype == np.float32 and axis == x.type.rank - 1 and low.fast_kernels:
        n = x.shape[-1]
        fn = norm.emit_softmax_rows(low.kmod(), low.fname([node]), x.type.size // max(n, 1), n, low.vector_width)
        _simple(low, node, fn, [low.val(x)], 8.0 * x.type.size)
        return
    fn = norm.emit_softmax(low.kmod(), low.fname([node]), x.dtype, x.shape, node.attrs["axis"], log)
    _simple(low, node, fn, [low.val(x)], 8.0 * x.type.size)


def _lower_LogSoftmax(low: Lowering, node: Node) -> None:
    _lower_Softmax(low, node, log=True)


def _lower_LayerNormalization(low: Lowering, node: Node) -> None:
    x, scale = node.inputs[0], node.inputs[1]
    bias = node.inputs[2] if len(node.inputs) > 2 else None
    fn = norm.emit_layer_norm(low.kmod(), low.fname([node]), x.dtype, x.shape, node.attrs["axis"],
                              node.attrs["epsilon"], scale.shape, bias.shape if bias is not None else None)
    _simple(low, node, fn, [low.val(x), low.val(scale), low.val(bias) if bias is not None else NULL],
                 6.0 * x.type.size)


def _lower_LRN(low: Lowering, node: Node) -> None:
    x = node.inputs[0]
    a = node.attrs
    fn = norm.emit_lrn(low.kmod(), low.fname([node]), x.dtype, x.shape, a["size"], a["alpha"], a["beta"],
                       a["bias"])
    _simple(low, node, fn, [low.val(x)], x.type.size * (a["size"] + 8))


def _copies(low: Lowering, node: Node, copies: list[movement.Copy], outs: list[Value], ins: list[Value]) -> None:
    names = [ident(v.name) for v in outs] + [ident(v.name) for v in ins]
    dt = ins[0].dtype
    fn = movement.emit_copies(low.kmod(), low.fname([node]), dt, names, copies)
    work = sum(math.prod(c.shape) for c in copies)
    _simple(low, node, fn, [low.val(v) for v in ins], work, outs=outs)


def _lower_Transpose(low: Lowering, node: Node) -> None:
    x = node.inputs[0]
    _copies(low, node, [movement.transpose_copy(x.shape, node.attrs["perm"])], node.outputs, [x])


def _lower_Slice(low: Lowering, node: Node) -> None:
    x, out = node.inputs[0], node.outputs[0]
    a = node.attrs
    _copies(low, node, [movement.slice_copy(x.shape, out.shape, a["starts"], a["axes"], a["steps"])],
                 node.outputs, [x])


def _lower_Expand(low: Lowering, node: Node) -> None:
    x, out = node.inputs[0], node.outputs[0]
    _copies(low, node, [movement.expand_copy(x.shape, out.shape)], node.outputs, [x])


def _lower_Concat(low: Lowering, node: Node) -> None:
    out = node.outputs[0]
    axis = node.attrs["axis"] % out.type.rank
    _copies(low, node, movement.concat_copies([v.shape for v in node.inputs], out.shape, axis),
                 node.outputs, list(node.inputs))


def _lower_Split(low: Lowering, node: Node) -> None:
    x = node.inputs[0]
    axis = node.attrs["axis"] % x.type.rank
    _copies(low, node, movement.split_copies(x.shape, node.attrs["split"], axis), list(node.outputs), [x])


def _lower_Pad(low: Lowering, node: Node) -> None:
    x, out = node.inputs[0], node.outputs[0]
    a = node.attrs
    fn = movement.emit_pad(low.kmod(), low.fname([node]), x.dtype, x.shape, out.shape, a["pads"], a["mode"],
                           a["value"])
    _simple(low, node, fn, [low.val(x)], 2.0 * out.type.size)


def _lower_Gather(low: Lowering, node: Node) -> None:
    x, idx = node.inputs
    axis = node.attrs["axis"] % x.type.rank
    fn = movement.emit_gather(low.kmod(), low.fname([node]), x.dtype, idx.dtype, x.shape, idx.type.size, axis)
    _simple(low, node, fn, [low.val(x), low.val(idx)], node.outputs[0].type.size)


# --- indexing (kernels/indexing.py) -----------------------------------------------------------------


def _lower_GatherElements(low: Lowering, node: Node) -> None:
    x, idx = node.inputs
    fn = indexing.emit_gather_elements(low.kmod(), low.fname([node]), x.dtype, idx.dtype, x.shape, idx.shape,
                                       node.attrs["axis"] % x.type.rank)
    _simple(low, node, fn, [low.val(x), low.val(idx)], node.outputs[0].type.size)


def _lower_GatherND(low: Lowering, node: Node) -> None:
    x, idx = node.inputs
    fn = indexing.emit_gather_nd(low.kmod(), low.fname([node]), x.dtype, idx.dtype, x.shape, idx.shape,
                                 node.attrs["batch_dims"])
    _simple(low, node, fn, [low.val(x), low.val(idx)], node.outputs[0].type.size)


def _lower_ScatterND(low: Lowering, node: Node) -> None:
    x, idx, upd = node.inputs
    fn = indexing.emit_scatter_nd(low.kmod(), low.fname([node]), x.dtype, idx.dtype, x.shape, idx.shape,
                                  node.attrs["reduction"])
    _simple(low, node, fn, [low.val(x), low.val(idx), low.val(upd)], 0.0)  # serial: updates apply in order


def _lower_ScatterElements(low: Lowering, node: Node) -> None:
    x, idx, upd = node.inputs
    fn = indexing.emit_scatter_elements(low.kmod(), low.fname([node]), x.dtype, idx.dtype, x.shape, idx.shape,
                                        node.attrs["axis"] % x.type.rank, node.attrs["reduction"])
    _simple(low, node, fn, [low.val(x), low.val(idx), low.val(upd)], 0.0)  # serial: updates apply in order


def _cumulative(low: Lowering, node: Node, kind: str) -> None:
    x = node.inputs[0]
    a = node.attrs
    fn = indexing.emit_cumulative(low.kmod(), low.fname([node]), x.dtype, x.shape, a["axis"] % x.type.rank, kind,
                                  bool(a["exclusive"]), bool(a["reverse"]))
    _simple(low, node, fn, [low.val(x)], x.type.size)


def _lower_CumSum(low: Lowering, node: Node) -> None:
    _cumulative(low, node, "sum")


def _lower_CumProd(low: Lowering, node: Node) -> None:
    _cumulative(low, node, "prod")


def _lower_TopK(low: Lowering, node: Node) -> None:
    x = node.inputs[0]
    a = node.attrs
    fn = indexing.emit_topk(low.kmod(), low.fname([node]), x.dtype, x.shape, a["axis"] % x.type.rank, a["k"],
                            bool(a["largest"]))
    _simple(low, node, fn, [low.val(x)], x.type.size * max(a["k"], 1), outs=list(node.outputs))


def _lower_OneHot(low: Lowering, node: Node) -> None:
    idx, values = node.inputs
    out = node.outputs[0]
    fn = indexing.emit_onehot(low.kmod(), low.fname([node]), values.dtype, idx.dtype, idx.shape, node.attrs["depth"],
                              node.attrs["axis"] % out.type.rank)
    _simple(low, node, fn, [low.val(idx), low.val(values)], out.type.size)


def _lower_ReverseSequence(low: Lowering, node: Node) -> None:
    x, lens = node.inputs
    fn = indexing.emit_reverse_sequence(low.kmod(), low.fname([node]), x.dtype, lens.dtype, x.shape,
                                        node.attrs["batch_axis"], node.attrs["time_axis"])
    _simple(low, node, fn, [low.val(x), low.val(lens)], x.type.size)


def _lower_Resize(low: Lowering, node: Node) -> None:
    """One resample step per resized axis (tables from the IR op's), through float32 (float64)
    intermediates; no resized axis is a copy."""
    x, out = node.inputs[0], node.outputs[0]
    passes = tables_for(node.attrs, x.shape)
    if not passes or out.type.size == 0:
        _copies(low, node, [movement.plain_copy(out.shape)], [out], [x])
        return
    acc = np.dtype(np.float32) if x.dtype in (np.float16, np.float32) else np.dtype(np.float64)
    src, shape = x, tuple(x.shape)
    for k, (axis, idx, w, extrap) in enumerate(passes):
        n_out = idx.shape[0]
        new_shape = shape[:axis] + (n_out,) + shape[axis + 1:]
        last = k == len(passes) - 1
        dst = out if last else Value(f"{out.name}.resize{k}", TensorType(acc, new_shape), "node")
        vw = low.vector_width
        stride = -(-n_out // vw) * vw  # tap-major tables padded to whole vectors (index 0, weight 0)
        tab_i = np.zeros((idx.shape[1], stride), np.int32)
        tab_w = np.zeros((idx.shape[1], stride), acc)
        tab_i[:, :n_out], tab_w[:, :n_out] = idx.T, w.T
        fn = resize.emit_resample(low.kmod(), low.fname([node]), src.dtype, dst.dtype, shape, axis, n_out,
                                  idx.shape[1], stride, extrap is not None, vw)
        args = [low.val(dst), low.val(src), low.array(tab_i), low.array(tab_w)]
        if extrap is not None:
            bias = np.zeros(stride, acc)
            bias[:n_out] = np.where(extrap, node.attrs["extrapolation_value"], 0.0)
            args.append(low.array(bias))
        low.add(Step(fn.name, fn, args, [dst], [node], work=float(dst.type.size * idx.shape[1])))
        src, shape = dst, new_shape


def _lower_Det(low: Lowering, node: Node) -> None:
    x = node.inputs[0]
    n = x.shape[-1]
    fn, scratch = linalg.emit_det(low.kmod(), low.fname([node]), x.dtype, math.prod(x.shape[:-2]), n)
    _simple(low, node, fn, [low.val(x), SCRATCH], x.type.size * n, scratch)


def _lower_SqueezeExcite(low: Lowering, node: Node) -> None:
    x, w1, b1, w2, b2 = node.inputs
    a = node.attrs
    if not all(v.is_constant for v in (w1, b1, w2, b2)):
        raise UnsupportedOperator("the squeeze-excite kernel takes constant weights", op=node.op,
                                  expected="constant W1, B1, W2, B2", found="run-time weights")
    n, c, h, w = x.shape
    # On several threads the channel means are a step of their own, split by planes like the scaling: fused,
    # every thread read all of x for them (MobileNet-v3 and EfficientNet's SE blocks ran no faster on two)
    split = low.nthreads > 1
    ins = [low.val(x)]
    if split:
        means = Value(f"{node.outputs[0].name}.means", TensorType(x.dtype, (n, c, 1, 1)), "node")
        fn = reduce.emit_reduce(low.kmod(), low.fname([node]), x.dtype, x.shape, (2, 3), "mean")
        low.add(Step(fn.name, fn, [low.val(means), low.val(x)], [means], [node], work=x.type.size))
        ins.append(low.val(means))
    info = emit_squeeze_excite(low.kmod(), low.fname([node]), n=n, c=c, hw=h * w, r=w1.shape[0],
                               activation=a["activation"], activation_params=tuple(a["activation_params"]),
                               gate=a["gate"], gate_params=tuple(a["gate_params"]), vector_width=low.vector_width,
                               means_given=split)
    args = ins + [low.array(np.asarray(v.data, np.float32)) for v in (w1, b1, w2, b2)] + [SCRATCH]
    _simple(low, node, info.function, args, (1.0 if split else 2.0) * x.type.size, info.scratch_bytes_per_thread)


def _lower_Attention(low: Lowering, node: Node) -> None:
    q, kt, v, *mask = node.inputs
    out = node.outputs[0]
    if out.dtype != np.float32:
        raise UnsupportedOperator("the attention kernel is float32", op=node.op, node=node.name,
                                  expected="float32", found=str(out.dtype))
    (s, d), (t, e), batch = q.shape[-2:], v.shape[-2:], out.shape[:-2]
    scores = (*batch, s, t)
    ms = EW.broadcast_strides(mask[0].shape, scores) if mask else None
    info = low.generate(emit_attention, low.fname([node]), (), batch=batch, s=s, t=t, d=d, e=e,
                        q_strides=_batch_strides(q.shape[:-2], batch, s * d),
                        kt_strides=_batch_strides(kt.shape[:-2], batch, d * t),
                        v_strides=_batch_strides(v.shape[:-2], batch, t * e),
                        mask_strides=tuple(ms[:-2]) if ms else None, mask_row=ms[-2] if ms else 0,
                        mask_col=ms[-1] if ms else 0, scale=float(node.attrs["scale"]),
                        nan_to_zero=bool(node.attrs["nan_to_zero"]), vector_width=low.vector_width)
    args = [low.val(q), low.val(kt), low.val(v), low.val(mask[0]) if mask else NULL, SCRATCH]
    _simple(low, node, info.function, args, 2.0 * math.prod(scores) * (d + e), info.scratch_bytes_per_thread)


# The op -> kernel emitter table: every op the backend has a kernel for, besides elementwise groups
# (fusion.py) and aliases (ALIAS_OPS).
HEAVY = {
    "Conv": _heavy_Conv,
    "Gemm": _heavy_Gemm,
    "FullyConnected": _heavy_FullyConnected,
    "MatMul": _heavy_MatMul,
}
KERNELS: dict[str, Callable[[Lowering, Node], None]] = {
    "ConvTranspose": _lower_ConvTranspose,
    "MaxPool": _lower_MaxPool,
    "AveragePool": _lower_AveragePool,
    "LpPool": _lower_LpPool,
    "MaxUnpool": _lower_MaxUnpool,
    "Col2Im": _lower_Col2Im,
    "GridSample": _lower_GridSample,
    "RoiAlign": _lower_RoiAlign,
    "GlobalAveragePool": _lower_GlobalAveragePool,
    "GlobalMaxPool": _lower_GlobalMaxPool,
    "ReduceSum": _lower_ReduceSum,
    "ReduceMean": _lower_ReduceMean,
    "ReduceMax": _lower_ReduceMax,
    "ReduceMin": _lower_ReduceMin,
    "ReduceProd": _lower_ReduceProd,
    "ArgMax": _lower_ArgMax,
    "Softmax": _lower_Softmax,
    "LogSoftmax": _lower_LogSoftmax,
    "LayerNormalization": _lower_LayerNormalization,
    "LRN": _lower_LRN,
    "Transpose": _lower_Transpose,
    "Slice": _lower_Slice,
    "Expand": _lower_Expand,
    "Concat": _lower_Concat,
    "Split": _lower_Split,
    "Pad": _lower_Pad,
    "Gather": _lower_Gather,
    "GatherElements": _lower_GatherElements,
    "GatherND": _lower_GatherND,
    "ScatterND": _lower_ScatterND,
    "ScatterElements": _lower_ScatterElements,
    "CumSum": _lower_CumSum,
    "CumProd": _lower_CumProd,
    "TopK": _lower_TopK,
    "OneHot": _lower_OneHot,
    "ReverseSequence": _lower_ReverseSequence,
    "Resize": _lower_Resize,
    "Det": _lower_Det,
    "SqueezeExcite": _lower_SqueezeExcite,
    "Attention": _lower_Attention,
    "Conv": lower_heavy_node,
    "Gemm": lower_heavy_node,
    "FullyConnected": lower_heavy_node,
    "MatMul": lower_heavy_node,
    "Loop": emit_loop,
}
# QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear (kernels/quant.py)
KERNELS.update(QUANT_KERNELS)


# --- recurrent ops (kernels/rnn.py): the input projection of every step and direction is one packed
# GEMM step, then one native kernel runs the time loop (recurrent GEMM plus gates) ---


def _lower_recurrent(low: Lowering, node: Node) -> None:
    """float16 / float64 operands are converted to float32 around the kernel (the interpreter computes
    float16 in float32 too; float64 loses precision to float32)."""
    x, w, r, b, seq, h0, *extra = node.inputs
    a = node.attrs
    f32 = np.dtype(np.float32)
    dirs, gh, size = w.shape
    steps, batch = (x.shape[1], x.shape[0]) if a["layout"] else x.shape[:2]

    def cast(src: Value, dst: Value) -> None:
        group = EW.FusedElementwise(dst.shape, dst.dtype, [EW.Operand(src.shape, src.dtype)],
                                    [EW.Expr("Cast", OPS["Cast"].make_attrs({"to": dst.dtype}), [("in", 0)], [src.dtype],
                                             dst.dtype)], ["src"])
        fn = EW.emit_fused(low.kmod(), low.fname([node]), group)
        low.add(Step(fn.name, fn, [low.val(dst), low.val(src)], [dst], [node], work=dst.type.size))

    def runtime(v: Value) -> Value:  # v itself, or a float32 copy made before the kernel
        if v.dtype == f32:
            return v
        tmp = Value(f"{v.name}.f32", TensorType(f32, v.shape), "node")
        cast(v, tmp)
        return tmp

    def operand(v: Value) -> Arg:
        return low.array(np.asarray(v.data, f32)) if v.is_constant and v.dtype != f32 else low.val(runtime(v))

    xw = Value(f"{node.outputs[0].name}.xw", TensorType(f32, (steps * batch, dirs * gh)), "node")
    w2 = runtime(w) if not w.is_constant else Value(f"{w.name}.2d", TensorType(f32, (dirs * gh, size)), "constant",
                                                     data=np.asarray(w.data, f32).reshape(dirs * gh, size))
    coop = rnn.cooperates(low.nthreads, constant_r=r.is_constant, cell=node.op, steps=steps, batch=batch,
                          hidden=a["hidden_size"], dirs=dirs, linear_before_reset=a.get("linear_before_reset", 0),
                          vector_width=low.vector_width)
    # Before a serial recurrence, splitting a projection smaller than it (input size < hidden size) saves
    # less than waking the threads costs (LSTM 64 -> 128: 2 threads 340 us, serial 250 us).
    work = 2.0 * xw.type.size * size if coop or size >= a["hidden_size"] else 0.0
    _gemm(low, [node], xw, runtime(x), M=steps * batch, N=dirs * gh, K=size, a_trans=False, b=w2, b_trans=True,
          alpha=1.0, bias=None, bias_kind="none", activation="none", params=(), work=work)
    lstm = node.op == "LSTM"
    outs = [o if o.dtype == f32 else Value(f"{o.name}.f32", TensorType(f32, o.shape), "node") for o in node.outputs]
    args = [low.val(outs[0]), low.val(outs[1]), low.val(outs[2]) if lstm else NULL, low.val(xw),
            NULL if r.is_constant else operand(r), operand(b), low.val(seq), operand(h0),
            operand(extra[0]) if lstm else NULL, operand(extra[1]) if lstm else NULL, SCRATCH, SYNC]
    cell = CELLS[node.op]
    info = low.generate(
        rnn.emit_rnn, low.fname([node]), ("r",), cell=node.op, steps=steps, batch=batch, hidden=a["hidden_size"],
        directions=tuple(a["direction"] == "reverse" or d == 1 for d in range(dirs)), layout=a["layout"],
        acts=tuple(tuple(map(tuple, acts)) for acts in activations_of(cell, a)), clip=a["clip"],
        input_forget=a.get("input_forget", 0), linear_before_reset=a.get("linear_before_reset", 0),
        r=np.asarray(r.data, f32) if r.is_constant else None, vector_width=low.vector_width,
        threads=low.nthreads if coop else 1)
    args += [low.array(p) for p in info.packed]
    low.add(Step(info.function.name, info.function, args, outs, [node], work=0.0,
                 scratch=info.scratch_bytes_per_thread, cooperative=coop))
    for tmp, o in zip(outs, node.outputs):
        if tmp is not o:
            cast(tmp, o)


KERNELS.update({"LSTM": _lower_recurrent, "GRU": _lower_recurrent, "RNN": _lower_recurrent})

# --- int8 products and convolutions (kernels/qgemm.py), QLinearAdd and its pool (kernels/qlinear.py) ---
KERNELS.update(qgemm.KERNELS)
KERNELS.update(qlinear.KERNELS)
