"""Cold compiles in pieces: one LLVM module per distinct kernel, compiled on all cores, identical kernels
once, and a per-kernel cache shared across models; the results equal the interpreter's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import glowpy
from glowpy.backends.cpu import CpuBackend, codegen, parallel
from glowpy.backends.cpu.target import host_target
from glowpy.backends.interpreter import InterpreterBackend
from glowpy.ir.graph import Graph
from glowpy.ir.types import TensorType
from tests.backends.cpu.test_model_cache import FEED, conv_model


def chain(n: int, extra: bool = False) -> Graph:
    """n identical Conv+Relu layers (other weights each); `extra` appends a Sigmoid."""
    rng = np.random.default_rng(0)
    g = Graph("chain")
    v = g.add_input("x", TensorType(np.float32, (1, 8, 10, 10)))
    for i in range(n):
        w = g.add_constant(f"w{i}", rng.standard_normal((8, 8, 3, 3)).astype(np.float32) * 0.2)
        b = g.add_constant(f"b{i}", rng.standard_normal(8).astype(np.float32) * 0.1)
        v = g.add_node("Conv", [v, w, b], {"strides": (1, 1), "pads": (1, 1, 1, 1), "dilations": (1, 1)},
                       name=f"conv{i}").outputs[0]
        v = g.add_node("Tanh", [v], name=f"tanh{i}").outputs[0]
    if extra:
        v = g.add_node("Sigmoid", [v], name="sig").outputs[0]
    g.outputs = [v]
    return g


X = {"x": np.random.default_rng(1).standard_normal((1, 8, 10, 10)).astype(np.float32)}


@pytest.fixture
def fresh_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "cache"
    monkeypatch.setenv("GLOWPY_CACHE_DIR", str(d))
    return d


@pytest.fixture
def compiled_units(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The text of every unit LLVM compiles from now on."""
    seen: list[str] = []
    real = parallel.compile_unit

    def spy(text, target, speed_level=3):
        seen.append(text)
        return real(text, target, speed_level)

    monkeypatch.setattr(parallel, "compile_unit", spy)
    return seen


def units_of(graph: Graph) -> list[parallel.Unit]:
    program = CpuBackend().build(graph, threads=1)
    return parallel.split_units(str(program.module), program.kernel_defs, program.kernel_decls, "salt")[1]


def test_identical_kernels_are_one_unit() -> None:
    one, four = units_of(chain(1)), units_of(chain(4))
    assert len(four) == len(one)  # four identical layers: the kernels of one
    assert all(u.name.startswith("glowpy.k.") and u.key for u in four)


def test_results_match_the_interpreter(fresh_dir: Path, compiled_units: list[str]) -> None:
    g = chain(4)
    want = InterpreterBackend().compile(g).run([X["x"]])[0]
    for threads in (1, 2):
        ex = CpuBackend().compile(g, threads=threads)
        np.testing.assert_allclose(ex.run([X["x"]])[0], want, rtol=1e-4, atol=1e-4)
    assert compiled_units  # LLVM ran, unit by unit


def test_a_second_model_compiles_only_its_new_kernels(fresh_dir: Path, compiled_units: list[str]) -> None:
    CpuBackend().compile(chain(2), threads=1)
    first = len(compiled_units)
    compiled_units.clear()
    g = chain(3, extra=True)
    ex = CpuBackend().compile(g, threads=1)
    new = [t for t in compiled_units if "glowpy_run" not in t]
    assert len(new) < len(units_of(g)) and len(new) <= first  # the convs came from the kernel cache
    assert any("glowpy_run" in t for t in compiled_units)  # the entry is the model's own
    np.testing.assert_allclose(ex.run([X["x"]])[0], InterpreterBackend().compile(g).run([X["x"]])[0], rtol=1e-4,
                               atol=1e-4)


def test_pieces_equal_one_module_bit_for_bit(fresh_dir: Path) -> None:
    """The kernels compiled apart give the same numbers as the whole program in one module."""
    from glowpy.backends.cpu import load_object
    from glowpy.backends.cpu.target import compile_object

    data = conv_model()
    graph = glowpy.optimize(glowpy.load(data), "cpu")
    program = CpuBackend().build(graph, threads=1)
    whole = cpu_executable(graph, program, load_object(compile_object(program.ir_text), host_target()))
    split = glowpy.compile(data, threads=1, cache=False)
    np.testing.assert_array_equal(whole.run([FEED["x"]])[0], split.run(FEED)["y"])


def cpu_executable(graph: Graph, program: codegen.Program, engine):
    from glowpy.backends.cpu import CpuExecutable

    return CpuExecutable(graph, program, engine, cached=False)


def test_bundles_round_trip_and_refuse_truncation() -> None:
    blob = parallel.pack([b"abc", b"", b"de"])
    assert parallel.unpack(blob) == [b"abc", b"", b"de"]
    assert parallel.unpack(b"\x7fELF...") == [b"\x7fELF..."]
    with pytest.raises(ValueError):
        parallel.unpack(blob[:-1])


def test_compile_threads_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GLOWPY_COMPILE_THREADS", "1")
    assert parallel.workers() == 1
    monkeypatch.setenv("GLOWPY_COMPILE_THREADS", "junk")
    assert parallel.workers() >= 1


def test_threads_compiling_at_once_give_the_same_objects() -> None:
    """Units compiled outside llvmlite's lock, four threads at a time, equal the serial compile."""
    from concurrent.futures import ThreadPoolExecutor

    units = units_of(chain(2, extra=True))
    target = host_target()
    serial = [parallel.compile_unit(u.text, target) for u in units]
    with ThreadPoolExecutor(4) as pool:
        for _ in range(3):
            assert list(pool.map(lambda u: parallel.compile_unit(u.text, target), units)) == serial


def test_compile_unit_frees_its_pass_pipeline(monkeypatch: pytest.MonkeyPatch) -> None:
    """Compiling a unit leaves nothing of LLVM's pass state behind: the module pass manager (which
    llvmlite never frees itself) is disposed when the unit is compiled, and compiling the same unit
    again and again does not grow the process (Linux: anonymous RSS)."""
    import ctypes
    import sys

    program = CpuBackend().build(chain(2, extra=True), threads=1)
    _, units = parallel.split_units(str(program.module), program.kernel_defs, program.kernel_decls, "test")
    text = max(units, key=lambda u: len(u.text)).text
    made = []
    real = parallel.pass_pipeline

    def spy(*args, **kwargs):
        builder, manager = real(*args, **kwargs)
        made.append(manager)
        return builder, manager

    monkeypatch.setattr(parallel, "pass_pipeline", spy)
    target = host_target()
    parallel.compile_unit(text, target)
    assert made and made[0]._closed  # disposed, though this test still holds the Python object
    if not sys.platform.startswith("linux"):
        return

    def anon_kib() -> int:
        ctypes.CDLL(None).malloc_trim(0)
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("RssAnon:"))

    made.clear()
    before = anon_kib()
    for _ in range(20):
        parallel.compile_unit(text, target)
    made.clear()
    assert anon_kib() - before < 2048  # the pass managers leaked ~370 KiB per compile of this unit
