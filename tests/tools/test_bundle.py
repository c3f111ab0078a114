"""`glowpy bundle`: the bundle builds with cc via make, runs in a process without Python, and its
outputs equal glowpy.compile's (same code, same host) from raw input files and from the seeded pattern."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import glowpy
from glowpy.backends.cpu.target import isa_available
from glowpy.bundle import pattern, write_bundle
from glowpy.cli import main
from glowpy.errors import UnsupportedDatatype

pytestmark = pytest.mark.skipif(any(shutil.which(t) is None for t in ("cc", "make", "ar", "objdump")),
                                reason="building a bundle needs cc, make and binutils")


def _convnet(path: Path) -> Path:
    """x(2,3,36,36) -> Conv 16 3x3 -> Relu (output 'features') -> GlobalAveragePool -> Flatten -> Gemm 10
    + b (a second input): two inputs, two outputs, random weights."""
    rng = np.random.default_rng(7)
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32) * 0.3, n)
             for n, s in (("w", (16, 3, 3, 3)), ("c", (16,)), ("g", (10, 16)))]
    nodes = [helper.make_node("Conv", ["x", "w", "c"], ["conv"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["conv"], ["features"]),
             helper.make_node("GlobalAveragePool", ["features"], ["pool"]),
             helper.make_node("Flatten", ["pool"], ["flat"]),
             helper.make_node("Gemm", ["flat", "g", "b"], ["logits"], transB=1)]
    graph = helper.make_graph(
        nodes, "convnet",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 36, 36]),
         helper.make_tensor_value_info("b", TensorProto.FLOAT, [2, 10])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [2, 10]),
         helper.make_tensor_value_info("features", TensorProto.FLOAT, [2, 16, 36, 36])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    return path


def _make_and_run(directory: Path, name: str, *args: str, cwd: Path | None = None) -> str:
    subprocess.run(["make", "-C", str(directory), "CFLAGS=-O2 -std=c11 -Wall -Wextra -Werror"], check=True,
                   capture_output=True, timeout=120)
    exe = directory / f"{name}_main"
    # a process without Python: nothing of the interpreter in its environment or its libraries
    env = {"PATH": "/usr/bin:/bin"}
    proc = subprocess.run([str(exe), *args], cwd=cwd or directory, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "python" not in Path(exe).read_bytes().decode("latin-1").lower()
    return proc.stdout


def test_bundle_matches_compile_from_files_and_pattern(tmp_path: Path) -> None:
    model = _convnet(tmp_path / "convnet.onnx")
    out = tmp_path / "bundle"
    b = write_bundle(str(model), out, threads=2)
    assert b.name == "convnet" and b.threads == 2
    assert b.inputs == [("x", "float32", (2, 3, 36, 36)), ("b", "float32", (2, 10))]
    assert b.outputs == [("logits", "float32", (2, 10)), ("features", "float32", (2, 16, 36, 36))]
    header = (out / "convnet.h").read_text()
    assert "void convnet_entry(void **weights, void *arena, void **inputs, void **outputs);" in header
    assert "[0] x: float32 [2, 3, 36, 36]" in header and "[1] features: float32 [2, 16, 36, 36]" in header
    compiled = glowpy.compile(str(model), threads=2)

    rng = np.random.default_rng(3)
    feeds = {"x": rng.standard_normal((2, 3, 36, 36)).astype(np.float32),
             "b": rng.standard_normal((2, 10)).astype(np.float32)}
    for k, arr in enumerate(feeds.values()):
        arr.tofile(tmp_path / f"in{k}.bin")
    stdout = _make_and_run(out, "convnet", "-i", str(tmp_path / "in0.bin"), "-i", str(tmp_path / "in1.bin"),
                           "-o", str(tmp_path), "-n", "3")
    assert "output 0 logits: float32 [2, 10] sum" in stdout and "3 runs, mean" in stdout
    want = compiled.run(feeds)
    for j, name in enumerate(("logits", "features")):
        got = np.fromfile(tmp_path / f"output{j}.bin", np.float32).reshape(want[name].shape)
        np.testing.assert_array_equal(got, want[name])
    np.testing.assert_allclose(want["logits"], glowpy.compile(str(model), backend="interpreter").run(feeds)["logits"],
                               rtol=1e-5, atol=1e-5)

    # the seeded pattern is glowpy.bundle.pattern's
    _make_and_run(out, "convnet", "-s", "5", "-o", str(tmp_path))
    seeded = {name: pattern(np.float32, shape, 5, k) for k, (name, _, shape) in enumerate(b.inputs)}
    want = compiled.run(seeded)
    got = np.fromfile(tmp_path / "output0.bin", np.float32).reshape(2, 10)
    np.testing.assert_array_equal(got, want["logits"])


def test_bundle_avx2_with_awkward_tensor_names(tmp_path: Path) -> None:
    """Names that need escaping in C strings and comments; AVX2-only code (what a Zen 3 host runs); the
    program finds its weights beside itself when run from elsewhere."""
    if not isa_available("avx2"):
        pytest.fail("this host cannot run AVX2 code")
    rng = np.random.default_rng(2)
    x_name, y_name = 'x "in" */ ?', "y\\out"
    w = numpy_helper.from_array(rng.standard_normal((16, 24)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", [x_name, "w"], ["m"]), helper.make_node("Tanh", ["m"], [y_name])], "odd",
        [helper.make_tensor_value_info(x_name, TensorProto.FLOAT, [8, 16])],
        [helper.make_tensor_value_info(y_name, TensorProto.FLOAT, [8, 24])], [w])
    model = tmp_path / "odd.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(model))
    out = tmp_path / "bundle"
    write_bundle(str(model), out, isa="avx2")
    code = subprocess.run(["objdump", "-d", str(out / "odd_model.o")], capture_output=True, text=True, check=True)
    assert "ymm" in code.stdout and "zmm" not in code.stdout
    elsewhere = tmp_path / "run"
    elsewhere.mkdir()
    stdout = _make_and_run(out, "odd", "-s", "1", "-o", ".", cwd=elsewhere)
    assert f"output 0 {y_name}: float32 [8, 24]" in stdout
    want = glowpy.compile(str(model), isa="avx2", threads=1).run({x_name: pattern(np.float32, (8, 16), 1, 0)})
    got = np.fromfile(elsewhere / "output0.bin", np.float32).reshape(8, 24)
    np.testing.assert_array_equal(got, want[y_name])


def test_bundle_refuses_a_foreign_weights_file(tmp_path: Path) -> None:
    model = _convnet(tmp_path / "convnet.onnx")
    write_bundle(str(model), tmp_path / "a", name="net")
    write_bundle(str(model), tmp_path / "b", name="net", threads=2)
    subprocess.run(["make", "-C", str(tmp_path / "a")], check=True, capture_output=True, timeout=120)
    proc = subprocess.run([str(tmp_path / "a" / "net_main"), "-w", str(tmp_path / "b" / "net.weights")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "is not the weights file of this bundle" in proc.stderr


def test_bundle_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = _convnet(tmp_path / "convnet.onnx")
    assert main(["bundle", str(model), "-o", str(tmp_path / "out"), "--name", "cnn"]) == 0
    out = capsys.readouterr().out
    assert "bundle    cnn: 1 thread" in out and "input     x: float32 [2, 3, 36, 36]" in out
    assert sorted(os.listdir(tmp_path / "out")) == ["Makefile", "cnn.c", "cnn.h", "cnn.weights", "cnn_model.o",
                                                    "main.c"]
    assert main(["bundle", str(model), "-o", str(tmp_path / "out"), "--name", "9lives"]) == 2
    assert "a bundle name must be a C identifier (expected m_9lives, found 9lives)" in capsys.readouterr().err
    (tmp_path / "file").write_text("")
    assert main(["bundle", str(model), "-o", str(tmp_path / "file")]) == 2
    assert "is not a directory" in capsys.readouterr().err


def test_pattern_has_no_rule_for_half() -> None:
    with pytest.raises(UnsupportedDatatype, match="seeded pattern has no rule for this element type"):
        pattern(np.float16, (2,))
    # pinned: main.c's fill_pattern makes these numbers too (floats are checked against it above)
    assert pattern(np.int64, (5,), 1).tolist() == [8, 2, 8, 3, 8]
    assert pattern(np.bool_, (5,), 2).tolist() == [True, True, False, True, True]
    assert pattern(np.float32, (1000,)).min() >= -1 and pattern(np.float32, (1000,)).max() < 1


# A bundle's thread pool from C: started by the first run on a model's arena, joined by NAME_free.
DRIVER = r"""
#include "convnet.h"
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>

static int os_threads(void) {
    DIR *d = opendir("/proc/self/task");
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));) n += e->d_name[0] != '.';
    if (d) closedir(d);
    return n;
}

int main(int argc, char **argv) {
    void *in[CONVNET_NUM_INPUTS], *out[CONVNET_NUM_OUTPUTS];
    for (int k = 0; k < CONVNET_NUM_INPUTS; k++) in[k] = calloc(1, convnet_inputs[k].nbytes);
    for (int j = 0; j < CONVNET_NUM_OUTPUTS; j++) out[j] = calloc(1, convnet_outputs[j].nbytes);
    int before = os_threads(), during = 0;
    for (int c = 0; c < 40; c++) {
        convnet_model *m = convnet_load(argv[1]);
        if (!m) return 2;
        for (int r = 0; r < 3; r++) convnet_run(m, (const void *const *)in, out);
        int t = os_threads();
        if (t > during) during = t;
        convnet_free(m);
    }
    printf("%d %d %d\n", before, during, os_threads());
    return 0;
}
"""


def test_bundle_free_joins_the_pool(tmp_path: Path) -> None:
    out = tmp_path / "bundle"
    b = write_bundle(str(_convnet(tmp_path / "convnet.onnx")), out, threads=3)
    assert b.threads == 3
    assert "void convnet_release(void *arena);" in (out / "convnet.h").read_text()
    subprocess.run(["make", "-C", str(out), "libconvnet.a"], check=True, capture_output=True, timeout=120)
    (tmp_path / "driver.c").write_text(DRIVER)
    exe = tmp_path / "driver"
    subprocess.run(["cc", "-O2", "-std=c11", "-I", str(out), "-o", str(exe), str(tmp_path / "driver.c"),
                    str(out / "libconvnet.a"), "-lpthread", "-lm"], check=True, capture_output=True, timeout=120)
    proc = subprocess.run([str(exe), str(out / "convnet.weights")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["1", "3", "1"], "one thread, then the caller and two pool threads, then one"
