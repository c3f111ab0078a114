"""Convolution taps that only ever read padding (large dilations on small maps) dropped from the kernel."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from glowpy.ir.graph import Graph, Node
from glowpy.ir.ops.nn import conv_out_dim
from glowpy.optimizer.rewrite import add_weight, rebuild

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
