"""One pipeline: glowpy.compile, ONNXIFI, the onnx backend face and the CLI give the same optimized
graph, the same code and bit-identical outputs for the same model and options."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import glowpy
from glowpy.backend import GlowpyBackend
from glowpy.onnxifi.host import GraphCache, OnnxifiOp
from glowpy.pipeline import optimized_graph

ROOT = Path(__file__).resolve().parents[1]
MODELS = ("mlp", "squeezenet", "resnet50")


@pytest.fixture(scope="module")
def model_paths(random_model, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from tools.prepare_models import mlp_model

    mlp = tmp_path_factory.mktemp("pipeline") / "mlp.onnx"
    onnx.save(mlp_model(), str(mlp))
    return {"mlp": mlp, "squeezenet": random_model("squeezenet"), "resnet50": random_model("resnet50")}


def _feed(proto: onnx.ModelProto) -> tuple[str, np.ndarray]:
    inits = {t.name for t in proto.graph.initializer}
    (inp,) = [i for i in proto.graph.input if i.name not in inits]
    shape = [d.dim_value for d in inp.type.tensor_type.shape.dim]
    return inp.name, np.random.default_rng(7).standard_normal(shape).astype(np.float32)


def _code_key(compiled: glowpy.CompiledModel) -> str:
    return compiled.executable.code_key


@pytest.mark.parametrize("name", [pytest.param(m, marks=pytest.mark.heavy) if m == "resnet50" else m for m in MODELS])
def test_every_entry_runs_the_same_pipeline(name: str, model_paths: dict[str, Path], tmp_path: Path) -> None:
    path = model_paths[name]
    proto = onnx.load(str(path))
    in_name, x = _feed(proto)
    out_names = [o.name for o in proto.graph.output]

    direct = glowpy.compile(str(path), threads=1)
    want = direct.run({in_name: x})
    graph_text = str(direct.graph)

    # The optimized graph alone (what `glowpy dump` prints) is the one glowpy.compile compiled.
    assert str(optimized_graph(str(path))) == graph_text

    # The onnx.backend face.
    rep = GlowpyBackend.prepare(proto, threads=1)
    assert str(rep.compiled.graph) == graph_text
    assert _code_key(rep.compiled) == _code_key(direct)
    for got, n in zip(rep.run([x]), out_names):
        np.testing.assert_array_equal(got, want[n])

    # ONNXIFI: weights handed over as tensor descriptors, the model bytes without payloads.
    workspace = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
    env = os.environ.get("GLOWPY_NUM_THREADS")
    os.environ["GLOWPY_NUM_THREADS"] = "1"
    try:
        with OnnxifiOp(proto, f"pipeline-{name}", 0, workspace, cache=GraphCache()) as op:
            got = op.run({in_name: x})
            from glowpy.onnxifi.objects import GRAPHS

            compiled = [c.model for g in GRAPHS.values() for c in g._compiled.values()
                        if g.model.graph.name == proto.graph.name]
            assert compiled, "the ONNXIFI graph kept no compilation"
            assert str(compiled[-1].graph) == graph_text
            assert _code_key(compiled[-1]) == _code_key(direct)
    finally:
        if env is None:
            os.environ.pop("GLOWPY_NUM_THREADS")
        else:
            os.environ["GLOWPY_NUM_THREADS"] = env
    for n in out_names:
        np.testing.assert_array_equal(got[n], want[n])

    # The CLI: `glowpy run` saves its outputs; `glowpy dump` prints the optimized graph.
    np.save(tmp_path / "x.npy", x)
    cli_env = {**os.environ, "PYTHONPATH": str(ROOT), "GLOWPY_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "-m", "glowpy.cli", "run", str(path), "-i", f"{in_name}={tmp_path / 'x.npy'}",
                          "-n", "1", "-o", str(tmp_path / "out.npz")], capture_output=True, text=True, env=cli_env,
                         timeout=600)
    assert run.returncode == 0, run.stderr
    saved = np.load(tmp_path / "out.npz")
    for n in out_names:
        np.testing.assert_array_equal(saved[n], want[n])
    dump = subprocess.run([sys.executable, "-m", "glowpy.cli", "dump", str(path)], capture_output=True, text=True,
                          env=cli_env, timeout=600)
    assert dump.returncode == 0, dump.stderr
    assert dump.stdout.rstrip("\n") == graph_text.rstrip("\n")
