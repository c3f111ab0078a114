"""Kernel sharing: convs (and matrix products) of one configuration share one generated function, each
with its own packed weights. A generator's code depends on shapes and attributes only; its weights
travel as packed arrays (pointers). The packing of a second occurrence comes from the generator's
packer (kernels/conv.py: pack_conv2d), or from a layout learned once per configuration."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np
from llvmlite import ir

from glowpy.backends.cpu.hugepages import MIN_BYTES, NUMPY_BYTES, WeightBlock, inactive
from glowpy.backends.cpu.kernels import batched, conv, linalg
from glowpy.backends.cpu.kernels.common import KernelInfo
from glowpy.errors import InternalError


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


# Generators whose packing can run without generating code: generator -> packer (same keyword
# arguments, returns the packed arrays only).
PACKERS: dict[Callable[..., KernelInfo], Callable[..., list[np.ndarray]]] = {
    conv.emit_conv2d: conv.pack_conv2d,
    batched.emit_batched_gemm: batched.pack_batched_gemm,
    linalg.generic_conv2d: linalg.pack_generic_conv2d,
    linalg.generic_gemm: linalg.pack_generic_gemm,
}


def _packer_for(gen: Callable[..., KernelInfo]) -> Callable[..., list[np.ndarray]] | None:
    return PACKERS.get(gen)


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


class KernelSharing:
    """Generated kernels by configuration; `kmod` makes the module a new kernel is built in. The packed
    arrays of the kernels it hands out live in huge-page memory from the start (the generator's own
    copies die at once: the process never holds a model's packed weights twice)."""

    def __init__(self, kmod: Callable[[], ir.Module], release_weights: bool) -> None:
        self.kmod = kmod
        self.release_weights = release_weights
        self._shared: dict[tuple, dict[str, Any]] = {}
        self._block = WeightBlock()

    def _placed(self, info: KernelInfo) -> KernelInfo:
        """`info` with its packed arrays in the weight block: the packers' big ones are there already
        (hugepages.zeros / contiguous); others of MIN_BYTES or more are copied in, up to NUMPY_BYTES
        (numpy advises huge pages from there on itself, and a copy would hold a big weight a third
        time: graph, packer, copy)."""
        info.packed = [self._block.place(p) if (isinstance(p, np.ndarray) and MIN_BYTES <= p.nbytes < NUMPY_BYTES
                                                 and not self._block.owns(p)) else p for p in info.packed]
        return info

    def generate(self, gen: Callable[..., KernelInfo], name: str, weight_keys: tuple[str, ...],
                 **kwargs: Any) -> KernelInfo:
        """Call a kernel generator; steps with the same configuration share one function (`_generate`)."""
        with self._block.active():
            return self._placed(self._generate(gen, name, weight_keys, **kwargs))

    def _generate(self, gen: Callable[..., KernelInfo], name: str, weight_keys: tuple[str, ...],
                  **kwargs: Any) -> KernelInfo:
        """A generator's code depends on shapes and attributes, its weights travel as packed arrays
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
        with inactive():  # a throwaway packing: not in the weight block
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
