"""Export the public model zoo with both torch exporters and commit each graph as a skeleton.

Needs torch, torchvision and transformers (the tools-only `zoo` extra; see docs/ZOO.md for the venv):

    /work/venv-zoo/bin/python tools/zoo/export.py [--out tests/zoo/skeletons] [NAME ...]

Every model is built with random weights (torchvision `weights=None`, transformers from a config; never
from a hub), seeded with `torch.manual_seed(0)`, in eval mode, batch 1, and exported with
`torch.onnx.export(..., dynamo=True)` and with `dynamo=False` (TorchScript), both at opset OPSET. An export
that fails is recorded with its error in tools/zoo/export_status.json and the run goes on.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import onnx
import torch

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.zoo.realize import INPUTS_KEY, SKELETON_DIR  # noqa: E402
from tools.zoo.skeleton import skeletonize  # noqa: E402

OPSET = 18
EXPORTERS = ("dynamo", "torchscript")
STATUS_PATH = Path(__file__).with_name("export_status.json")


@dataclass
class Spec:
    """What to export: the module (built for one exporter), example inputs, and how tests feed them.

    `inputs` maps each input name to its feed rule (see tests/zoo/realize.py, `make_inputs`)."""

    module: torch.nn.Module
    args: tuple[torch.Tensor, ...]
    inputs: dict[str, str]
    outputs: list[str]
    expect_op: str | None = None  # an op the exported graph must contain (the If of the control-flow model)


class FirstOutput(torch.nn.Module):
    """Unwrap a model whose forward returns a dict or a ModelOutput to its one tensor output; the inputs
    are passed by the names in `names` when given (transformers models' argument orders differ)."""

    def __init__(self, model: torch.nn.Module, key: str | None = None, names: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.model, self.key, self.names = model, key, names

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        out = self.model(**dict(zip(self.names, args))) if self.names else self.model(*args)
        if self.key is not None:
            return out[self.key]
        return out[0] if isinstance(out, tuple) else out.last_hidden_state


# ---------------------------------------------------------------------------------------------- builders


def _image(size: int = 224) -> tuple[torch.Tensor, ...]:
    return (torch.randn(1, 3, size, size),)


TORCHVISION_CLASSIFICATION = {
    "resnet18": {}, "resnet50": {}, "mobilenet_v2": {}, "mobilenet_v3_small": {}, "mobilenet_v3_large": {},
    "efficientnet_b0": {}, "regnet_y_400mf": {}, "convnext_tiny": {}, "densenet121": {},
    "googlenet": {"init_weights": True, "aux_logits": False}, "inception_v3": {"init_weights": True, "aux_logits": False},
    "shufflenet_v2_x1_0": {}, "squeezenet1_1": {}, "mnasnet0_5": {}, "vit_b_16": {}, "swin_t": {},
}
TORCHVISION_SEGMENTATION = ("deeplabv3_mobilenet_v3_large", "fcn_resnet50", "lraspp_mobilenet_v3_large")


def _classifier(name: str) -> Callable[[str], Spec]:
    def build(exporter: str) -> Spec:
        import torchvision

        model = torchvision.models.get_model(name, weights=None, **TORCHVISION_CLASSIFICATION[name])
        size = 299 if name == "inception_v3" else 224
        return Spec(model, _image(size), {"input": "normal"}, ["logits"])
    return build


def _segmenter(name: str) -> Callable[[str], Spec]:
    def build(exporter: str) -> Spec:
        import torchvision

        model = torchvision.models.get_model(name, weights=None, weights_backbone=None)
        return Spec(FirstOutput(model, "out"), _image(), {"input": "normal"}, ["out"])
    return build


class Detections(torch.nn.Module):
    """A torchvision detector on one image tensor, its one result dict as three tensors."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        found = self.model(list(x))[0]
        return found["boxes"], found["scores"], found["labels"]


def ssdlite320_mobilenet_v3_large(exporter: str) -> Spec:
    """torch.export (dynamo) cannot trace its batched NMS: it guards on data-dependent sizes, torchvision's
    coordinate-trick NMS too (export_status.json); the TorchScript export is the zoo's detector."""
    import torchvision

    model = torchvision.models.detection.ssdlite320_mobilenet_v3_large(weights=None, weights_backbone=None)
    return Spec(Detections(model), _image(320), {"input": "normal"}, ["boxes", "scores", "labels"])


SEQ = 128


def _text(model: torch.nn.Module, vocab: int) -> Spec:
    """Token ids and an attention mask whose last 16 positions are padding."""
    ids = torch.randint(0, vocab, (1, SEQ))
    attention = torch.ones(1, SEQ, dtype=torch.int64)
    attention[:, -16:] = 0
    return Spec(FirstOutput(model, names=("input_ids", "attention_mask")), (ids, attention),
                {"input_ids": f"randint:0:{vocab}", "attention_mask": "padmask:16"}, ["last_hidden_state"])


def bert_base(exporter: str) -> Spec:
    from transformers import BertConfig, BertModel

    config = BertConfig()
    return _text(BertModel(config, add_pooling_layer=False), config.vocab_size)


def distilbert(exporter: str) -> Spec:
    from transformers import DistilBertConfig, DistilBertModel

    config = DistilBertConfig()
    return _text(DistilBertModel(config), config.vocab_size)


def gpt2(exporter: str) -> Spec:
    from transformers import GPT2Config, GPT2Model

    config = GPT2Config(use_cache=False)
    return _text(GPT2Model(config), config.vocab_size)


def t5_encoder(exporter: str) -> Spec:
    from transformers import T5Config, T5EncoderModel

    config = T5Config(use_cache=False)  # the defaults are t5-small
    return _text(T5EncoderModel(config), config.vocab_size)


def vit_base(exporter: str) -> Spec:
    from transformers import ViTConfig, ViTModel

    return Spec(FirstOutput(ViTModel(ViTConfig(), add_pooling_layer=False)), _image(),
                {"pixel_values": "normal"}, ["last_hidden_state"])


def whisper_tiny_encoder(exporter: str) -> Spec:
    from transformers import WhisperConfig
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    config = WhisperConfig(d_model=384, encoder_layers=4, encoder_attention_heads=6, encoder_ffn_dim=1536,
                           decoder_layers=4, decoder_attention_heads=6, decoder_ffn_dim=1536, num_mel_bins=80)
    frames = 2 * config.max_source_positions  # the encoder takes exactly 30 s of 10 ms frames
    return Spec(FirstOutput(WhisperEncoder(config)), (torch.randn(1, config.num_mel_bins, frames),),
                {"input_features": "normal"}, ["last_hidden_state"])


def wav2vec2_base(exporter: str) -> Spec:
    from transformers import Wav2Vec2Config, Wav2Vec2Model

    return Spec(FirstOutput(Wav2Vec2Model(Wav2Vec2Config())), (torch.randn(1, 16000),),
                {"input_values": "normal"}, ["last_hidden_state"])


# Recurrent: input 64, hidden 128, 2 layers, sequence 100, batch 1 (the LSTM benchmark's shape).
RNN_INPUT, RNN_HIDDEN, RNN_SEQ = 64, 128, 100


class Recurrent(torch.nn.Module):
    """torch.nn.LSTM / GRU returning (output, h_n[, c_n]) as plain tensors."""

    def __init__(self, cell: type[torch.nn.Module], bidirectional: bool) -> None:
        super().__init__()
        self.rnn = cell(RNN_INPUT, RNN_HIDDEN, num_layers=2, bidirectional=bidirectional)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out, state = self.rnn(x)
        return (out, *state) if isinstance(state, tuple) else (out, state)


def _recurrent(cell: type[torch.nn.Module], bidirectional: bool) -> Callable[[str], Spec]:
    def build(exporter: str) -> Spec:
        outputs = ["output", "h_n", "c_n"] if cell is torch.nn.LSTM else ["output", "h_n"]
        return Spec(Recurrent(cell, bidirectional), (torch.randn(RNN_SEQ, 1, RNN_INPUT),), {"input": "normal"}, outputs)
    return build


class ConvLSTMIf(torch.nn.Module):
    """A conv front end over 40 feature channels, a 2-layer LSTM, and one of two heads chosen by an input
    flag: torch.cond, which the dynamo exporter turns into an ONNX If."""

    def __init__(self) -> None:
        super().__init__()
        self.front = torch.nn.Sequential(
            torch.nn.Conv1d(40, RNN_INPUT, 5, padding=2), torch.nn.ReLU(),
            torch.nn.Conv1d(RNN_INPUT, RNN_INPUT, 3, padding=1), torch.nn.ReLU())
        self.lstm = torch.nn.LSTM(RNN_INPUT, RNN_HIDDEN, num_layers=2)
        self.a = torch.nn.Linear(RNN_HIDDEN, 16)
        self.b = torch.nn.Linear(RNN_HIDDEN, 16)

    def encode(self, features: torch.Tensor) -> torch.Tensor:
        h = self.front(features).permute(2, 0, 1)  # (batch, channels, time) -> (time, batch, channels)
        out, _ = self.lstm(h)
        return out

    def head_b(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.b(x)) * 2.0

    def forward(self, features: torch.Tensor, flag: torch.Tensor) -> torch.Tensor:
        return torch.cond(flag, self.a, self.head_b, (self.encode(features),))


class ConvLSTMIfScripted(ConvLSTMIf):
    """The same model with a Python `if`, for torch.jit.script: the TorchScript exporter emits an If."""

    def forward(self, features: torch.Tensor, flag: torch.Tensor) -> torch.Tensor:
        out = self.encode(features)
        if bool(flag):
            return self.a(out)
        return self.head_b(out)


def conv_lstm_if(exporter: str) -> Spec:
    module = ConvLSTMIf() if exporter == "dynamo" else torch.jit.script(ConvLSTMIfScripted())
    return Spec(module, (torch.randn(1, 40, RNN_SEQ), torch.tensor(True)),
                {"features": "normal", "flag": "flag"}, ["logits"], expect_op="If")


MODELS: dict[str, Callable[[str], Spec]] = {
    **{name: _classifier(name) for name in TORCHVISION_CLASSIFICATION},
    **{name: _segmenter(name) for name in TORCHVISION_SEGMENTATION},
    "bert_base": bert_base, "distilbert": distilbert, "gpt2": gpt2, "t5_encoder": t5_encoder,
    "vit_base": vit_base, "whisper_tiny_encoder": whisper_tiny_encoder, "wav2vec2_base": wav2vec2_base,
    "lstm": _recurrent(torch.nn.LSTM, False), "lstm_bidirectional": _recurrent(torch.nn.LSTM, True),
    "gru": _recurrent(torch.nn.GRU, False), "gru_bidirectional": _recurrent(torch.nn.GRU, True),
    "conv_lstm_if": conv_lstm_if, "ssdlite320_mobilenet_v3_large": ssdlite320_mobilenet_v3_large,
}


# ---------------------------------------------------------------------------------------------- export


def _ops(graph: onnx.GraphProto) -> set[str]:
    """Every op type in a graph, subgraphs included."""
    found = set()
    for node in graph.node:
        found.add(node.op_type)
        for attr in node.attribute:
            for sub in [attr.g, *attr.graphs] if attr.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) else []:
                found |= _ops(sub)
    return found


def perturb(module: torch.nn.Module) -> None:
    """Give every constant-valued float parameter (ones, zeros) and BatchNorm statistic seeded values, as
    training would: exporters simplify an identity BatchNorm or a zero bias away, which a trained model
    never shows."""
    with torch.no_grad():
        for p in module.parameters():
            if p.is_floating_point() and p.numel() > 1 and bool((p == p.flatten()[0]).all()):
                p.add_(torch.randn_like(p) * 0.1)
        for m in module.modules():
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.running_mean is not None:
                m.running_mean.copy_(torch.randn_like(m.running_mean) * 0.1)
                m.running_var.copy_(torch.rand_like(m.running_var) + 0.5)


def export_one(name: str, exporter: str) -> onnx.ModelProto:
    """Build `name` for `exporter` and export it at OPSET; the full model (weights included)."""
    torch.manual_seed(0)
    spec = MODELS[name](exporter)
    spec.module.eval()
    perturb(spec.module)
    # TorchScript not under no_grad: there torch.nn.MultiheadAttention takes its fused fast path, which that
    # exporter cannot export (aten::_native_multi_head_attention). dynamo under no_grad: with grad enabled
    # its decomposition of T5's attention fails ("Cannot view a tensor with shape [1, 128, 8, 64]").
    grad = contextlib.nullcontext() if exporter == "torchscript" else torch.no_grad()
    with tempfile.TemporaryDirectory() as tmp, grad, warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        path = Path(tmp) / "model.onnx"
        torch.onnx.export(spec.module, spec.args, str(path), dynamo=exporter == "dynamo", opset_version=OPSET,
                          input_names=list(spec.inputs), output_names=spec.outputs, external_data=False)
        model = onnx.load(str(path))
    if spec.expect_op and spec.expect_op not in _ops(model.graph):
        raise RuntimeError(f"the exported graph has no {spec.expect_op} node")
    onnx.helper.set_model_props(model, {INPUTS_KEY: json.dumps(spec.inputs), "glowpy_zoo.model": name,
                                        "glowpy_zoo.exporter": exporter})
    return model


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", default=list(MODELS), help="models (default: all)")
    ap.add_argument("--out", type=Path, default=SKELETON_DIR)
    ap.add_argument("--exporter", choices=EXPORTERS, action="append", help="default: both")
    args = ap.parse_args(argv)
    unknown = set(args.names) - set(MODELS)
    if unknown:
        ap.error(f"unknown models {sorted(unknown)} (choose from {', '.join(MODELS)})")
    args.out.mkdir(parents=True, exist_ok=True)
    status = json.loads(STATUS_PATH.read_text()) if STATUS_PATH.exists() else {}
    for name in args.names:
        for exporter in args.exporter or EXPORTERS:
            key = f"{name}.{exporter}"
            start = time.perf_counter()
            target = args.out / f"{key}.onnx"
            try:
                skeleton = skeletonize(export_one(name, exporter))
            except Exception as e:  # noqa: BLE001  (any exporter failure is a result to record)
                status[key] = {"status": "failed", "error": f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300]}"
                               if str(e).strip() else type(e).__name__}
                target.unlink(missing_ok=True)
                print(f"{key:40s} FAILED {status[key]['error']}", flush=True)
                traceback.print_exc(limit=3, file=sys.stderr)
                continue
            onnx.save(skeleton, str(target))
            status[key] = {"status": "ok", "bytes": target.stat().st_size}
            print(f"{key:40s} ok {target.stat().st_size / 1024:8.1f} KiB  {time.perf_counter() - start:6.1f} s",
                  flush=True)
            STATUS_PATH.write_text(json.dumps(dict(sorted(status.items())), indent=1) + "\n")
    STATUS_PATH.write_text(json.dumps(dict(sorted(status.items())), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
