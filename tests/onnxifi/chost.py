"""The C host of tests/onnxifi/host.c as a tool: build it, and write a model as its script (weights as
descriptors from a blob file). Used by test_c_host.py and tools/bench_compile.py."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from glowpy.onnxifi.build import INCLUDE_DIR

HERE = Path(__file__).resolve().parent


def build_host(directory: Path) -> Path:
    """Compile host.c with the machine's cc into `directory`; the executable's path."""
    cc = shutil.which("cc")
    if cc is None:
        raise FileNotFoundError("no C compiler (cc) on this machine")
    exe = directory / "host"
    subprocess.run([cc, "-O1", "-Wall", "-Werror", "-Wno-unused-result", "-I", str(INCLUDE_DIR),
                    str(HERE / "host.c"), "-o", str(exe), "-ldl", "-lpthread", "-lm"], check=True)
    return exe


def _dtype_code(a: np.ndarray) -> int:
    return helper.np_dtype_to_tensor_dtype(a.dtype)


def write_case(tmp: Path, proto: onnx.ModelProto, inputs: dict[str, np.ndarray], expected: list[np.ndarray],
               tag: str) -> str:
    """Split the model's initializers into a weight blob (the host passes them as descriptors), write
    the weight-free model, the inputs and the expected outputs; return the script lines."""
    weights = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
    stripped = onnx.ModelProto()
    stripped.CopyFrom(proto)
    del stripped.graph.initializer[:]
    declared = {i.name for i in stripped.graph.input}
    for name, a in weights.items():
        if name not in declared:
            stripped.graph.input.append(helper.make_tensor_value_info(name, _dtype_code(a), list(a.shape)))
    (tmp / f"{tag}.onnx").write_bytes(stripped.SerializeToString())
    lines = [f"model {tmp / f'{tag}.onnx'}"]
    offset = 0
    with open(tmp / f"{tag}.weights", "wb") as blob:
        for name, a in weights.items():
            a = np.ascontiguousarray(a)
            blob.write(a.tobytes())
            dims = " ".join(str(d) for d in a.shape)
            lines.append(f"weight {name} {_dtype_code(a)} {a.ndim} {dims} {tmp / f'{tag}.weights'} {offset}")
            offset += a.nbytes
    for i, (name, a) in enumerate(inputs.items()):
        f = tmp / f"{tag}.in{i}"
        f.write_bytes(np.ascontiguousarray(a).tobytes())
        lines.append(f"input {name} {_dtype_code(a)} {a.ndim} {' '.join(map(str, a.shape))} {f}")
    for i, (info, a) in enumerate(zip(proto.graph.output, expected)):
        f = tmp / f"{tag}.out{i}"
        f.write_bytes(np.ascontiguousarray(a, np.float32).tobytes())
        lines.append(f"output {info.name} {_dtype_code(a)} {a.ndim} {' '.join(map(str, a.shape))} {f}")
    return "\n".join(lines) + "\n"


