"""The CLI on hostile input: mutated models, odd flags, unreadable paths, directories, a fifo, huge
shapes. Every case must exit 0, or 1 from `check` (a supported-or-not verdict, nothing on stderr), or 2
with exactly one line on stderr naming what went wrong; never a traceback, never a hang.

All cases run in one subprocess (a real interpreter: warnings and output streams as a user sees them),
each through `glowpy.cli.main`; the driver prints one JSON line per case.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SEED = int(os.environ.get("GLOWPY_FUZZ_SEED", "16"))  # another seed: GLOWPY_FUZZ_SEED=N
MUTATED_MODELS = 90
FLAG_CASES = 60

DRIVER = r'''
import contextlib, io, json, os, random, sys
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from glowpy.cli import main

seed, n_models, n_flags, tmp = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
rng = random.Random(seed)
nrng = np.random.default_rng(seed)

def vi(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)

def seeds():
    w = numpy_helper.from_array(nrng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(nrng.standard_normal(4).astype(np.float32), "b")
    fc = numpy_helper.from_array(nrng.standard_normal((64, 5)).astype(np.float32), "fc")
    s = numpy_helper.from_array(np.array([-1, 64], np.int64), "s")
    conv = helper.make_model(helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2], name="conv"),
         helper.make_node("Relu", ["c"], ["r"], name="relu"),
         helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2], name="pool"),
         helper.make_node("Reshape", ["p", "s"], ["f"], name="flat"),
         helper.make_node("MatMul", ["f", "fc"], ["m"], name="fc"),
         helper.make_node("Softmax", ["m"], ["y"], axis=1, name="prob")],
        "conv", [vi("x", ["N", 3, 16, 16])], [vi("y", None)], [w, b, fc, s]),
        opset_imports=[helper.make_opsetid("", 13)])
    relu = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu",
        [vi("x", [2, 3])], [vi("y", [2, 3])]), opset_imports=[helper.make_opsetid("", 13)])
    return [conv, relu]

OPS = ["Relu", "Conv", "Add", "Nope", "", "Softmax", "Reshape", "MatMul", "Gemm", "Concat", "If", "MaxPool"]
BIG = [0, -1, 1, 2, 7, 1 << 20, 1 << 31, (1 << 63) - 1]

def edit(m):
    g = m.graph
    kind = rng.randrange(9)
    if kind == 0 and len(g.node):
        rng.choice(g.node).op_type = rng.choice(OPS)
    elif kind == 1:
        m.ir_version = rng.choice([0, 1, 3, 7, 8, 99])
    elif kind == 2 and len(m.opset_import):
        m.opset_import[0].version = rng.choice([0, 1, 6, 13, 500])
    elif kind == 3:
        t = rng.choice(list(g.input) + list(g.output)).type.tensor_type
        if rng.random() < 0.5:
            t.elem_type = rng.choice([0, 2, 7, 8, 9, 16])  # valid enum values (99: see test_unknown_element_type)
        elif len(t.shape.dim):
            rng.choice(t.shape.dim).dim_value = rng.choice(BIG)
    elif kind == 4 and len(g.initializer):
        init = rng.choice(g.initializer)
        if rng.random() < 0.5 and len(init.dims):
            init.dims[rng.randrange(len(init.dims))] = rng.choice(BIG)
        else:
            init.raw_data = init.raw_data[: rng.randrange(len(init.raw_data) + 1)]
    elif kind == 5 and len(g.node):
        node = rng.choice(g.node)
        if len(node.input):
            node.input[rng.randrange(len(node.input))] = rng.choice(["", "ghost", "x", node.output[0]])
    elif kind == 6 and len(g.node):
        node = rng.choice(g.node)
        if len(node.attribute):
            a = rng.choice(node.attribute)
            if len(a.ints):
                a.ints[rng.randrange(len(a.ints))] = rng.choice(BIG)
            else:
                a.i = rng.choice(BIG)
    elif kind == 7 and len(g.node):
        del g.node[rng.randrange(len(g.node))]
    elif kind == 8:
        g.initializer.append(numpy_helper.from_array(np.zeros(1, np.float32), rng.choice(["w", "x", "y", "new"])))

def case(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as e:  # argparse: --help, --version and its errors
            code = e.code if isinstance(e.code, int) else 2
        except BaseException as e:  # noqa: BLE001  escaped main(): the test reports it
            import traceback
            code = "escaped"
            err.write(traceback.format_exc())
    print(json.dumps({"argv": argv, "code": code, "stderr": err.getvalue()}), flush=True)

# mutated models
base = seeds()
for k in range(n_models):
    m = onnx.ModelProto()
    seed_index = rng.randrange(len(base))
    m.CopyFrom(base[seed_index])
    for _ in range(rng.randint(1, 3)):
        edit(m)
    data = m.SerializeToString()
    if rng.random() < 0.2:  # byte-level damage on top
        b = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        data = bytes(b[: rng.randint(1, len(b))]) if rng.random() < 0.5 else bytes(b)
    path = os.path.join(tmp, f"m{k}.onnx")
    with open(path, "wb") as f:
        f.write(data)
    cmd = rng.choice(["run", "run", "check", "dump"])
    argv = [cmd, path] + (["-s", "N=" + str(rng.choice([1, 2]))] if seed_index == 0 else [])
    if cmd == "run":
        argv += ["-n", "1", "-b", rng.choice(["interpreter", "cpu"])]
    elif cmd == "dump":
        argv += rng.choice([[], ["--stats"], ["--format", "dot"]])
    case(argv)

# odd flags, special paths, huge shapes
good = os.path.join(tmp, "good.onnx")
onnx.save(base[0], good)
fifo = os.path.join(tmp, "fifo")
os.mkfifo(fifo)
empty = os.path.join(tmp, "empty.onnx")
open(empty, "wb").close()
npy = os.path.join(tmp, "x.npy")
np.save(npy, np.ones((1, 3, 16, 16), np.float32))
PATHS = [good, tmp, fifo, empty, "/proc/self/mem", "/dev/null", "/nonexistent/m.onnx", "", "-", "resnet50x",
         "/proc/self/fd"]
SHAPES = ["N=1", "N=0", "N=-3", "N=99999999999999999999", "N=1x", "N=abc", "x=1x3x16x16", "x=1x3x1000000000x1000000000",
          "x=2x3x16x16", "x=1x3", "N", "=2", "ghost=4", "N=1e9", "x=4000x1000x1000x1000", "N=" + "9" * 400]
FLAGS = [["-n", "0"], ["-n", "-5"], ["-n", "x"], ["-b", "gpu"], ["--bogus"], ["-o", tmp], ["-o", "/proc/nope/out.npz"],
         ["-i", "x=" + fifo], ["-i", "x=" + tmp], ["-i", "x=" + npy], ["-i", "x"], ["-i", "ghost=" + npy],
         ["-i", "x=/proc/self/mem"], ["-i", "x=" + good], ["--no-opt"], [], ["--after", "nope"], ["--format", "svg"],
         ["--json"], ["--partition"], ["-s"], ["--help"]]
for _ in range(n_flags):
    cmd = rng.choice(["run", "run", "check", "check", "dump", "dump", "onnxifi", "frobnicate", ""])
    argv = [cmd] if cmd else []
    if cmd == "onnxifi":
        argv += rng.choice([[], ["path", "--bogus"], ["build", "-o", fifo], ["nope"]])
    else:
        argv.append(rng.choice(PATHS))
        for _ in range(rng.randint(0, 3)):
            argv += rng.choice(FLAGS + [["-s", rng.choice(SHAPES)]] * 4)
        if cmd == "run" and "-n" not in argv:
            argv += ["-n", "1"]
    case(argv)
'''


def test_cli_fuzz(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GLOWPY_MAX_MEMORY": "512M",
           "GLOWPY_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "-c", DRIVER, str(SEED), str(MUTATED_MODELS), str(FLAG_CASES),
                           str(tmp_path)], capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(results) == MUTATED_MODELS + FLAG_CASES
    assert not proc.stderr, proc.stderr[-3000:]  # everything went through the redirected streams
    bad = []
    for r in results:
        lines = r["stderr"].splitlines()
        cmd = r["argv"][0] if r["argv"] else ""
        one_line = (len(lines) == 1 and lines[0].startswith("glowpy") and ": error: " in lines[0]
                    and len(lines[0].split(": error: ", 1)[1]) > 8)
        ok = (r["code"] == 0 or (r["code"] == 1 and cmd == "check" and not lines)
              or (r["code"] == 1 and cmd == "onnxifi" and one_line)  # the build failed (documented: exit 1)
              or (r["code"] == 2 and cmd == "" and r["stderr"] == "")  # bare `glowpy`: help on stdout
              or (r["code"] == 2 and one_line))
        if not ok or "Traceback" in r["stderr"]:
            bad.append(r)
    histogram = collections.Counter(r["code"] for r in results)
    print(f"cli fuzz: {len(results)} cases, exit codes {dict(sorted(histogram.items(), key=str))}")
    assert not bad, json.dumps(bad[:5], indent=1)
    assert histogram[2] >= len(results) // 3 and histogram[0] >= 5  # the fuzz reaches both outcomes


def _relu_model(path: Path, elem_type: int = 1, op_type: bytes = b"Relu") -> Path:
    import onnx
    from onnx import helper

    m = helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"], name="r")], "g",
        [helper.make_tensor_value_info("x", elem_type, [2, 3])],
        [helper.make_tensor_value_info("y", 1, [2, 3])]), opset_imports=[helper.make_opsetid("", 13)])
    data = m.SerializeToString().replace(b"Relu", op_type)
    path.write_bytes(data)
    onnx.ModelProto.FromString(data)  # still parses
    return path


def _cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "glowpy.cli", *argv], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_unknown_element_type_is_one_line(tmp_path):
    proc = _cli("run", str(_relu_model(tmp_path / "m.onnx", elem_type=99)), "-n", "1")
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1, proc.stderr


def test_non_utf8_op_type_in_check(tmp_path):
    proc = _cli("check", str(_relu_model(tmp_path / "m.onnx", op_type=b"R\xffl\xfe")))
    assert proc.returncode == 1 and not proc.stderr, proc.stderr
