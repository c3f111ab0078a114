"""glowpy as an `onnx.backend.base.Backend`, so ONNX's own backend test suite runs against it.

    from glowpy.backend import GlowpyBackend
    rep = GlowpyBackend.prepare(model)          # compile once
    outputs = rep.run([x])                      # positional (graph input order) or {name: array}

The device string selects nothing but "CPU"; the glowpy backend (cpu JIT or interpreter) is the
`backend=` keyword, default glowpy's default.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import ModelProto, NodeProto
from onnx.backend.base import Backend, BackendRep, Device, DeviceType

from glowpy.compiled import CompiledModel


class GlowpyRep(BackendRep):
    """A prepared (compiled) model."""

    def __init__(self, compiled: CompiledModel) -> None:
        self.compiled = compiled

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:
        names = self.compiled.input_names
        if isinstance(inputs, Mapping):
            feeds = dict(inputs)
        else:
            if isinstance(inputs, np.ndarray):
                inputs = [inputs]
            feeds = dict(zip(names, inputs))
        result = self.compiled.run(feeds)
        return tuple(result[n] for n in self.compiled.output_names)


class GlowpyBackend(Backend):
    """prepare / run_model / run_node / supports_device over glowpy.compile."""

    @classmethod
    def prepare(cls, model: ModelProto, device: str = "CPU", **kwargs: Any) -> GlowpyRep:
        import glowpy

        if not cls.supports_device(device):
            raise ValueError(f"glowpy runs on CPU only, not {device}")
        shapes = kwargs.pop("shapes", None)
        backend = kwargs.pop("backend", None)
        opts = {"backend": backend} if backend else {}
        return GlowpyRep(glowpy.compile(model, shapes=shapes, **opts, **kwargs))

    @classmethod
    def run_model(cls, model: ModelProto, inputs: Any, device: str = "CPU", **kwargs: Any) -> tuple[Any, ...]:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node: NodeProto, inputs: Any, device: str = "CPU",
                 outputs_info: Sequence[tuple[np.dtype, tuple[int, ...]]] | None = None,
                 **kwargs: Any) -> tuple[Any, ...]:
        """Wrap one node in a model (inputs typed from the arrays given) and run it."""
        arrays = list(inputs.values()) if isinstance(inputs, Mapping) else list(inputs)
        in_names = [n for n in node.input if n]
        graph_inputs = [onnx.helper.make_tensor_value_info(n, onnx.helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
                        for n, a in zip(in_names, arrays)]
        graph_outputs = [onnx.helper.make_tensor_value_info(n, onnx.TensorProto.UNDEFINED, None)
                         for n in node.output if n]
        opset = kwargs.pop("opset_version", onnx.defs.onnx_opset_version())
        graph = onnx.helper.make_graph([node], "run_node", graph_inputs, graph_outputs)
        model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid(node.domain or "", opset)])
        return cls.run_model(model, dict(zip(in_names, arrays)), device, **kwargs)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return Device(device).type == DeviceType.CPU


prepare = GlowpyBackend.prepare
run_model = GlowpyBackend.run_model
run_node = GlowpyBackend.run_node
supports_device = GlowpyBackend.supports_device
