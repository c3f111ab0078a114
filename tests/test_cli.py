"""`glowpy run`: the default model, inputs from files, and one-line errors with exit code 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from glowpy.cli import main


@pytest.fixture
def small_model(tmp_path: Path) -> Path:
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((8, 10)).astype(np.float32), "W")
    nodes = [helper.make_node("MatMul", ["x", "W"], ["logits"]), helper.make_node("Softmax", ["logits"], ["prob"])]
    graph = helper.make_graph(nodes, "clf", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
                              [helper.make_tensor_value_info("prob", TensorProto.FLOAT, None)], [w])
    path = tmp_path / "clf.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    return path


def test_default_model_console_script() -> None:
    """The README's first command: no arguments, the embedded ResNet-50."""
    proc = subprocess.run([sys.executable, "-m", "glowpy.cli", "run", "--iterations", "2"], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "light_resnet50.onnx" in out
    assert "input     gpu_0/data_0: f32[1, 3, 224, 224]" in out
    assert "graph     " in out and "parameters" in out
    assert "top-5     " in out
    assert "latency   p50" in out and "p90" in out


def test_run_with_inputs_and_output_file(small_model: Path, tmp_path: Path, capsys, backend: str) -> None:
    x = np.random.default_rng(3).standard_normal((2, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    out_file = tmp_path / "out.npz"
    rc = main(["run", str(small_model), "--input", f"x={tmp_path / 'x.npy'}", "--shape", "N=2",
               "--backend", backend, "-n", "1", "--output", str(out_file)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "result    prob: shape [2, 10] float32" in text
    assert "top-5" in text
    saved = np.load(out_file)["prob"]
    logits = x @ numpy_helper.to_array(onnx.load(str(small_model)).graph.initializer[0])
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    np.testing.assert_allclose(saved, e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-6)


def test_tensorproto_input(small_model: Path, tmp_path: Path, capsys) -> None:
    x = np.ones((1, 8), np.float32)
    (tmp_path / "x.pb").write_bytes(numpy_helper.from_array(x).SerializeToString())
    assert main(["run", str(small_model), "-i", f"x={tmp_path / 'x.pb'}", "-s", "x=1x8", "-n", "1"]) == 0


@pytest.mark.parametrize("args, message", [
    (["run", "/no/such/model.onnx"], "cannot read model file '/no/such/model.onnx': no such file"),
    (["run", "{bad}"], "not an ONNX model"),
    (["run", "{model}", "-s", "N=1", "-i", "y={x}"], "'y' is not an input of the model"),
    (["run", "{model}", "-s", "N=1", "-i", "x={wrong}"], "input 'x' has the wrong shape (expected [1, 8], found [3, 3])"),
    (["run", "{model}"], "symbolic dim 'N'"),
    (["run", "{model}", "-s", "N=0"], "bad shape '0'"),
    (["run", "{model}", "-s", "N=1", "-i", "x=/no/file.npy"], "input file '/no/file.npy' does not exist"),
    (["run", "{model}", "-s", "N=1", "-n", "0"], "--iterations must be at least 1"),
])
def test_user_errors_are_one_line_exit_2(args, message, small_model: Path, tmp_path: Path, capsys) -> None:
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"this is not a protobuf at all")
    np.save(tmp_path / "x.npy", np.zeros((1, 8), np.float32))
    np.save(tmp_path / "wrong.npy", np.zeros((3, 3), np.float32))
    args = [a.format(model=small_model, bad=bad, x=tmp_path / "x.npy", wrong=tmp_path / "wrong.npy") for a in args]
    rc = main(args)
    err = capsys.readouterr().err
    assert rc == 2
    assert message in err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("glowpy run: error: ")


def test_no_command_prints_help(capsys) -> None:
    assert main([]) == 2
    assert "usage: glowpy" in capsys.readouterr().out


def test_dump_llvm_and_assembly(small_model: Path, capsys) -> None:
    """The CPU backend's generated code is printable: named kernels in LLVM IR, vector FMAs in assembly."""
    assert main(["dump", str(small_model), "-s", "N=4", "--format", "llvm", "-b", "cpu"]) == 0
    llvm = capsys.readouterr().out
    assert "define " in llvm and "target triple" in llvm
    assert main(["dump", str(small_model), "-s", "N=4", "--format", "asm", "-b", "cpu"]) == 0
    asm = capsys.readouterr().out
    assert ".file" in asm and "\tret" in asm
    assert main(["dump", str(small_model), "-s", "N=4", "--format", "llvm", "-b", "interpreter"]) == 2
    assert "the interpreter backend generates no code" in capsys.readouterr().err


def _glowpy(*argv: str, **kw) -> subprocess.CompletedProcess:
    root = Path(__file__).resolve().parents[1]
    import os

    return subprocess.run([sys.executable, "-m", "glowpy.cli", *argv], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(root)}, **kw)


def test_argparse_errors_are_one_line_exit_2() -> None:
    for argv, message in ((["run", "--bogus"], "glowpy: error: unrecognized arguments: --bogus"),
                          (["run", "-n", "abc"], "glowpy run: error: argument --iterations/-n: invalid int value"),
                          (["frobnicate"], "glowpy: error: argument COMMAND: invalid choice: 'frobnicate'")):
        proc = _glowpy(*argv)
        assert proc.returncode == 2
        assert len(proc.stderr.splitlines()) == 1 and proc.stderr.startswith(message), proc.stderr


def test_special_files_are_refused_before_opening(tmp_path: Path, small_model: Path, capsys) -> None:
    import os

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # opening it for reading would block forever
    np.save(tmp_path / "x.npy", np.zeros((1, 8), np.float32))
    for args, message in ((["run", str(fifo)], f"model '{fifo}' is a fifo: expected a file"),
                          (["check", str(tmp_path)], f"model '{tmp_path}' is a directory: expected a file"),
                          (["dump", str(fifo)], f"model '{fifo}' is a fifo: expected a file"),
                          (["run", "/dev/null"], "model '/dev/null' is not a regular file: expected a file"),
                          (["run", str(small_model), "-s", "N=1", "-i", f"x={fifo}"],
                           f"input '{fifo}' is a fifo: expected a file")):
        assert main(args) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, err


def test_unreadable_model_is_one_line(capsys) -> None:
    assert main(["check", "/proc/self/mem"]) == 2  # a regular file whose read fails (EIO), even for root
    err = capsys.readouterr().err
    assert err == "glowpy check: error: cannot read model file '/proc/self/mem': Input/output error\n"


def test_internal_error_is_one_line_exit_3(small_model: Path, monkeypatch, capsys) -> None:
    import glowpy.cli

    def broken(*args, **kwargs):
        raise TypeError("an invariant broke\nacross lines")

    monkeypatch.setattr(glowpy.cli, "cmd_run", broken)
    assert main(["run", str(small_model), "-s", "N=1", "-n", "1"]) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("glowpy: internal error: TypeError: an invariant broke across lines")
    assert "please report" in err


def test_interrupt_exits_130_quietly(small_model: Path, monkeypatch, capsys) -> None:
    import glowpy.cli

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(glowpy.cli, "cmd_run", interrupted)
    assert main(["run", str(small_model), "-s", "N=1"]) == 130
    assert capsys.readouterr().err == ""


def test_closed_pipe_exits_141_quietly() -> None:
    root = Path(__file__).resolve().parents[1]
    # `true` exits without reading, long before glowpy writes: the write meets a closed pipe
    shell = f"PYTHONPATH={root} {sys.executable} -m glowpy.cli dump squeezenet | true; " \
            "echo ${PIPESTATUS[0]}"
    proc = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip() == "141" and proc.stderr == "", proc.stderr


def test_help_documents_exit_codes() -> None:
    proc = _glowpy("--help")
    assert proc.returncode == 0
    text = " ".join(proc.stdout.split())
    assert "3 an internal error in glowpy (a bug: please report it)" in text and "130 interrupted" in text
