"""Mutated models through the C library never kill the host; the `glowpy onnxifi` command."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

FUZZ = r'''
import ctypes, random, sys
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from glowpy.errors import Status
from glowpy.onnxifi.host import load_library

lib = load_library(sys.argv[1])
n = ctypes.c_size_t(0)
lib.onnxGetBackendIDs(None, ctypes.byref(n))
ids = (ctypes.c_void_p * n.value)()
lib.onnxGetBackendIDs(ids, ctypes.byref(n))
backend = ctypes.c_void_p()
assert lib.onnxInitBackend(ids[1], None, ctypes.byref(backend)) == 0

rng = random.Random(1234)
nrng = np.random.default_rng(0)

def vi(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)

def seeds():
    w = numpy_helper.from_array(nrng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(nrng.standard_normal(4).astype(np.float32), "b")
    conv = helper.make_model(helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["y"])],
        "conv", [vi("x", [1, 3, 6, 6])], [vi("y", [1, 4, 6, 6])], [w, b]), opset_imports=[helper.make_opsetid("", 13)])
    relu = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu",
        [vi("x", [2, 3])], [vi("y", [2, 3])]), opset_imports=[helper.make_opsetid("", 13)])
    shape = numpy_helper.from_array(np.array([3, 2], np.int64), "s")
    reshape = helper.make_model(helper.make_graph(
        [helper.make_node("Reshape", ["x", "s"], ["r"]), helper.make_node("Softmax", ["r"], ["y"], axis=1)],
        "reshape", [vi("x", [2, 3])], [vi("y", [3, 2])], [shape]), opset_imports=[helper.make_opsetid("", 13)])
    return [conv, relu, reshape]

OPS = ["Relu", "Conv", "Add", "Nope", "", "Softmax", "Reshape", "MatMul", "Gemm", "Concat", "If", "Loop"]

def edit(m):
    g = m.graph
    kind = rng.randrange(10)
    if kind == 0 and len(g.node):
        rng.choice(g.node).op_type = rng.choice(OPS)
    elif kind == 1:
        m.ir_version = rng.choice([0, 1, 2, 3, 7, 8, 99, -1 & 0x7FFFFFFF])
    elif kind == 2 and len(m.opset_import):
        m.opset_import[0].version = rng.choice([0, 1, 6, 7, 13, 500])
    elif kind == 3:
        vals = list(g.input) + list(g.output)
        t = rng.choice(vals).type.tensor_type
        if len(t.shape.dim):
            rng.choice(t.shape.dim).dim_value = rng.choice([0, 1, 2, 7, -3, 1 << 40])
    elif kind == 4:
        rng.choice(list(g.input) + list(g.output)).type.tensor_type.elem_type = rng.randrange(0, 25)
    elif kind == 5 and len(g.initializer):
        t = rng.choice(g.initializer)
        if len(t.dims):
            t.dims[rng.randrange(len(t.dims))] = rng.choice([0, 1, 5, 1 << 31])
        else:
            t.data_type = rng.randrange(0, 25)
    elif kind == 6 and len(g.node):
        node = rng.choice(g.node)
        if len(node.input):
            node.input[rng.randrange(len(node.input))] = rng.choice(["", "zz", "y", "x"])
    elif kind == 7 and len(g.node):
        node = rng.choice(g.node)
        node.attribute.append(helper.make_attribute(rng.choice(["axis", "pads", "group", "junk"]),
                                                    rng.choice([1, -7, [1, 2], 2.5, "s"])))
    elif kind == 8 and len(g.node):
        g.node.append(g.node[rng.randrange(len(g.node))])  # a value produced twice
    else:
        del g.output[:]
    return m.SerializeToString()

def mutate(seed):
    m = onnx.ModelProto()
    m.CopyFrom(seed)
    how = rng.randrange(3)
    if how == 0:
        data = bytearray(m.SerializeToString())
        for _ in range(rng.randrange(1, 8)):
            i = rng.randrange(len(data))
            data[i] ^= 1 << rng.randrange(8)
        return bytes(data)
    if how == 1:
        data = m.SerializeToString()
        return data[: rng.randrange(1, len(data))]
    return edit(m)

defined = {int(s) for s in Status}
counts = {}
for i in range(1000):
    data = mutate(rng.choice(seeds()))
    st = lib.onnxGetBackendCompatibility(ids[1], len(data), data)
    assert st in defined, (i, st)
    g = ctypes.c_void_p()
    st2 = lib.onnxInitGraph(backend, None, len(data), data, 0, None, ctypes.byref(g))
    assert st2 in defined, (i, st2)
    assert (g.value is not None) == (st2 in (0, 1)), (i, st2, g.value)
    if g.value:
        assert lib.onnxReleaseGraph(g) == 0
    for s in (st, st2):
        counts[Status(s).name] = counts.get(Status(s).name, 0) + 1
# Malformed input must get a status that says what is wrong; INTERNAL_ERROR here would be a glowpy bug.
assert "INTERNAL_ERROR" not in counts, counts
assert lib.onnxReleaseBackend(backend) == 0
for i in ids:
    lib.onnxReleaseBackendID(i)
print("fuzz ok", sorted(counts.items(), key=lambda kv: -kv[1]))
'''


def test_mutated_models_never_kill_the_process(lib_path, tmp_path):
    """1,000 mutated model byte strings (bit flips, truncations, field edits) through
    onnxGetBackendCompatibility and onnxInitGraph of the C library, in a separate process: never a
    crash, never an undefined status, never INTERNAL_ERROR."""
    script = tmp_path / "fuzz.py"
    script.write_text(FUZZ)
    proc = subprocess.run([sys.executable, str(script), str(lib_path)], capture_output=True, text=True, timeout=600,
                          cwd=ROOT)
    print(proc.stdout[-3000:])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "fuzz ok" in proc.stdout


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "glowpy.cli", "onnxifi", *args], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)


def test_cli_build_and_path(tmp_path):
    out = tmp_path / "lib"
    built = _cli("build", "--output", str(out))
    assert built.returncode == 0, built.stderr
    lib = Path(built.stdout.strip().splitlines()[-1])
    assert lib == out / "libonnxifi-glowpy.so" and lib.is_file()
    mtime = lib.stat().st_mtime_ns
    found = _cli("path", "--output", str(out))
    assert found.returncode == 0 and found.stdout.strip().splitlines() == [str(lib)]  # current: no rebuild
    assert lib.stat().st_mtime_ns == mtime
    (out / "libonnxifi-glowpy.so.stamp").write_text("stale\n")
    rebuilt = _cli("path", "--output", str(out))
    assert rebuilt.returncode == 0 and rebuilt.stdout.strip().splitlines()[-1] == str(lib)
    assert "building" in rebuilt.stdout
    nothing = subprocess.run([sys.executable, "-m", "glowpy.cli", "onnxifi"], capture_output=True, text=True,
                             timeout=120, cwd=ROOT)
    assert nothing.returncode == 2
