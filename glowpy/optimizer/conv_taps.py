"""Convolution taps that only ever read padding (large dilations on small maps) dropped from the kernel."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from glowpy.ir.graph import Graph, Node
from glowpy.ir.ops.nn import conv_out_dim
from glowpy.optimizer.rewrite import add_weight, rebuild, replace_node

if TYPE_CHECKING:
    from glowpy.backends.base import Backend


def _live_taps(size: int, k: int, stride: int, pad_begin: int, pad_end: int, dilation: int) -> range:
    """The taps along one axis that read an input element for some output position (first to last)."""
    out = conv_out_dim(size, k, stride, pad_begin + pad_end, dilation)
    live = [t for t in range(k) if any(0 <= o * stride + t * dilation - pad_begin < size for o in range(out))]
    return range(live[0], live[-1] + 1) if live else range(0)


def _cropped(node: Node) -> tuple[tuple[slice, ...], list[int]] | None:
    """(weight slices, new pads) when some leading or trailing taps of `node` (a Conv) read only
    padding, the pads stay non-negative and the dropped weights are finite (0 * inf is NaN)."""
    x, w = node.inputs[0], node.inputs[1]
    if not w.is_constant or x.type.rank < 3:
        return None
    a = node.attrs
    nsp = x.type.rank - 2
    pads = list(a["pads"])
    slices, new_pads, changed = [], list(pads), False
    for i in range(nsp):
        k = w.shape[2 + i]
        s, d = a["strides"][i], a["dilations"][i]
        live = _live_taps(x.shape[2 + i], k, s, pads[i], pads[nsp + i], d)
        if not live:
            return None
        new_pads[i] = pads[i] - live.start * d
        new_pads[nsp + i] = pads[nsp + i] - (k - live.stop) * d
        if new_pads[i] < 0 or new_pads[nsp + i] < 0:
            return None
        slices.append(slice(live.start, live.stop))
        changed |= len(live) < k
    if not changed:
        return None
    data = np.asarray(w.data)
    kept = np.zeros(data.shape, bool)
    kept[(slice(None), slice(None), *slices)] = True
    if not np.isfinite(data[~kept]).all():
        return None
    return (slice(None), slice(None), *slices), new_pads


def crop_dead_conv_taps(graph: Graph, backend: Backend | None = None) -> bool:
    """Conv whose first / last kernel rows or columns read only padding for every output position (a
    dilated 3x3 with dilation >= the map size, as in DeepLabV3's ASPP) -> the same Conv with those taps
    cut from the weight and the pads reduced by as much (dilation 1 along an axis left with one tap), so
    the output shape and values stay (up to summation order); a dilation 24 3x3 on a 14x14 map becomes a
    1x1 conv."""
    changed = False
    for node in list(graph.nodes):
        if node.op != "Conv":
            continue
        found = _cropped(node)
        if found is None:
            continue
        index, pads = found
        w = node.inputs[1]
        new_w = add_weight(graph, w.name, np.ascontiguousarray(np.asarray(w.data)[index]))
        dil = tuple(1 if sl.stop - sl.start == 1 else d for sl, d in zip(index[2:], node.attrs["dilations"]))
        rebuild(graph, node, inputs=[node.inputs[0], new_w, *node.inputs[2:]],
                attrs={**node.attrs, "pads": tuple(pads), "dilations": dil})
        changed = True
    return changed


def _bands(size: int, k: int, stride: int, pad_begin: int, pad_end: int, dilation: int) -> list[list[int]] | None:
    """Runs of output positions along one axis with the same live taps: [o0, o1, t0, t1) each, or None
    when some output reads no input at all."""
    bands: list[list[int]] = []
    for o in range(conv_out_dim(size, k, stride, pad_begin + pad_end, dilation)):
        live = [t for t in range(k) if 0 <= o * stride + t * dilation - pad_begin < size]
        if not live:
            return None
        if bands and bands[-1][2:] == [live[0], live[-1] + 1]:
            bands[-1][1] = o + 1
        else:
            bands.append([o, o + 1, live[0], live[-1] + 1])
    return bands


MAX_BLOCKS = 16


def split_conv_by_live_taps(graph: Graph, backend: Backend | None = None) -> bool:
    """A 2-D Conv (constant weight, no residual) that would multiply mostly padding (dilation 12 3x3 on a
    14x14 map: a fraction of the taps reach the image at each output) -> one Conv per block of outputs
    that share their live taps (the kernel cropped to them, the input sliced, no padding), joined by
    Concat; only where it at least halves the multiply-adds and gives at most MAX_BLOCKS blocks."""
    changed = False
    for node in list(graph.nodes):
        x = node.inputs[0] if node.op == "Conv" else None
        if x is None or x.type.rank != 4 or len(node.inputs) != 3 or not node.inputs[1].is_constant:
            continue
        a, wv = node.attrs, node.inputs[1]
        w = np.asarray(wv.data)
        (sh, sw), (dh, dw), (pt, pl, pb, pr) = a["strides"], a["dilations"], a["pads"]
        rows = _bands(x.shape[2], w.shape[2], sh, pt, pb, dh)
        cols = _bands(x.shape[3], w.shape[3], sw, pl, pr, dw)
        if rows is None or cols is None or len(rows) * len(cols) > MAX_BLOCKS:
            continue
        dense = (rows[-1][1] * cols[-1][1]) * w.shape[2] * w.shape[3]
        work = sum((r[1] - r[0]) * (r[3] - r[2]) for r in rows) * sum((c[1] - c[0]) * (c[3] - c[2]) for c in cols)
        if 2 * work > dense or not np.isfinite(w).all():  # a dropped inf weight times padding is NaN
            continue
        bands = []
        for r0, r1, tr0, tr1 in rows:
            parts = []
            for c0, c1, tc0, tc1 in cols:
                starts = (r0 * sh + tr0 * dh - pt, c0 * sw + tc0 * dw - pl)
                ends = ((r1 - 1) * sh + (tr1 - 1) * dh - pt + 1, (c1 - 1) * sw + (tc1 - 1) * dw - pl + 1)
                xs = x
                if starts != (0, 0) or ends != tuple(x.shape[2:]):
                    xs = graph.add_node("Slice", [x], {"starts": starts, "ends": ends, "axes": (2, 3), "steps": (1, 1)},
                                        name=f"{node.name}.in", before=node).outputs[0]
                wb = add_weight(graph, wv.name, np.ascontiguousarray(w[:, :, tr0:tr1, tc0:tc1]))
                dil = (dh if tr1 - tr0 > 1 else 1, dw if tc1 - tc0 > 1 else 1)
                parts.append(graph.add_node("Conv", [xs, wb, node.inputs[2]], {**a, "pads": (0, 0, 0, 0), "dilations": dil},
                                            name=f"{node.name}.block", before=node).outputs[0])
            bands.append(parts[0] if len(parts) == 1 else graph.add_node(
                "Concat", parts, {"axis": 3}, name=f"{node.name}.row", before=node).outputs[0])
        y = bands[0] if len(bands) == 1 else graph.add_node("Concat", bands, {"axis": 2}, name=f"{node.name}.rows",
                                                            before=node).outputs[0]
        replace_node(graph, node, [y], adopt_names=True)
        graph.remove_unused_constants(among=[wv])
        changed = True
    return changed
