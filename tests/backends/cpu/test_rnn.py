"""The cpu backend's LSTM / GRU / RNN kernels (kernels/rnn.py) against the interpreter (glowpy/ir/ops/rnn.py,
itself checked against onnx.reference and onnxruntime in tests/ops/test_rnn.py), on the host's vector
width and on AVX2 (8 lanes), over directions, layouts, activations with alpha / beta, clip,
input_forget, linear_before_reset, ragged sequence_lens, runtime and constant weights, batch sizes that
leave a partial row block and hidden sizes that leave a partial vector."""

from __future__ import annotations

import numpy as np
import pytest

from glowpy.backends.cpu import CpuBackend
from glowpy.backends.cpu.target import isa_available
from glowpy.backends.interpreter import InterpreterBackend
from glowpy.ir.graph import Graph
from glowpy.ir.types import TensorType

from .util import assert_close

pytestmark = pytest.mark.heavy  # recurrent kernels at several sizes: the suite's second step

F32 = np.float32
GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
DEFAULTS = {"LSTM": ("Sigmoid", "Tanh", "Tanh"), "GRU": ("Sigmoid", "Tanh"), "RNN": ("Tanh",)}
ISAS = ("host", "avx2")


def add_recurrent(g: Graph, feeds: list[np.ndarray], op: str, *, steps: int, batch: int, size: int, hidden: int,
                  direction: str = "forward", layout: int = 0, const_weights: bool = True,
                  outputs: tuple[int, ...] | None = None, seed: int = 0, dtype=F32, **attrs) -> None:
    """One recurrent node in g (several share one compile); X, sequence_lens and the initial states are
    inputs (appended to feeds), the weights constants or inputs; its outputs join g's."""
    r = np.random.default_rng(seed)
    dirs = 2 if direction == "bidirectional" else 1
    gh = GATES[op] * hidden
    tag = f"n{len(g.outputs)}_"

    def randn(*shape: int, scale: float = 1.0) -> np.ndarray:
        return (scale * r.standard_normal(shape)).astype(dtype)

    def operand(name: str, data: np.ndarray, const: bool):
        if const:
            return g.add_constant(tag + name, data)
        feeds.append(data)
        return g.add_input(tag + name, TensorType.of(data))

    state = (batch, dirs, hidden) if layout else (dirs, batch, hidden)
    x = operand("x", randn(*((batch, steps, size) if layout else (steps, batch, size))), False)
    w = operand("w", randn(dirs, gh, size, scale=0.5), const_weights)
    rr = operand("r", randn(dirs, gh, hidden, scale=0.5), const_weights)
    b = operand("b", randn(dirs, 2 * gh, scale=0.5), const_weights)
    lens = r.integers(0, steps + 1, batch).astype(np.int32)
    lens[0] = steps  # one full-length entry, so the whole Y is exercised
    seq = operand("seq", lens, False)
    h0 = operand("h0", randn(*state), False)
    ins = [x, w, rr, b, seq, h0]
    if op == "LSTM":
        ins += [operand("c0", randn(*state), False), operand("p", randn(dirs, 3 * hidden, scale=0.5), const_weights)]
    node = g.add_node(op, ins, {"hidden_size": hidden, "direction": direction, "layout": layout, **attrs},
                      name=tag + op)
    g.outputs = g.outputs + [node.outputs[i] for i in (outputs if outputs is not None else range(len(node.outputs)))]


def recurrent_graph(op: str, **kw) -> tuple[Graph, list[np.ndarray]]:
    g, feeds = Graph(op.lower()), []
    add_recurrent(g, feeds, op, **kw)
    return g, feeds


def check(g: Graph, feeds: list[np.ndarray], isa: str = "host", what: str = "", threads: int = 1) -> None:
    if not isa_available(isa):
        pytest.fail(f"this host cannot run {isa} code")  # every x86 host of this project has AVX2
    got = CpuBackend().compile(g, threads=threads, isa=isa, cache=False).run(feeds)
    want = InterpreterBackend().compile(g).run(feeds)
    assert_close(got, want, what)


def acts(op: str, dirs: int, names: tuple[str, ...] | None = None) -> tuple:
    names = names or DEFAULTS[op]
    params = {"Affine": (0.7, -0.2), "LeakyRelu": (0.1, None), "ThresholdedRelu": (0.3, None),
              "ScaledTanh": (1.3, 0.6), "HardSigmoid": (0.3, 0.4), "Elu": (0.8, None)}
    return tuple((n, *params.get(n, (None, None))) for n in names) * dirs


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_directions_layouts_ragged(op: str, isa: str) -> None:
    """Every direction in both layouts; batch 5 (a partial row block), hidden 11 (a partial vector),
    ragged lengths including 0."""
    g, feeds = Graph(op.lower()), []
    for seed, (direction, layout) in enumerate((d, lay) for d in ("forward", "reverse", "bidirectional")
                                               for lay in (0, 1)):
        add_recurrent(g, feeds, op, steps=6, batch=5, size=7, hidden=11, direction=direction, layout=layout,
                      seed=seed)
    check(g, feeds, isa, f"{op} on {isa}")


def build(configs: list[tuple[str, dict]]) -> tuple[Graph, list[np.ndarray]]:
    g, feeds = Graph("rnns"), []
    for seed, (op, kw) in enumerate(configs):
        add_recurrent(g, feeds, op, **{"seed": seed, **kw})
    return g, feeds


@pytest.mark.parametrize("isa", ISAS)
def test_hidden_blocks_and_groups(isa: str) -> None:
    """Hidden sizes spanning several vector blocks (full groups, a remainder group, a partial vector),
    batches of one to nine rows; two nodes of one configuration."""
    configs = [(op, {"steps": 4, "batch": batch, "size": 5, "hidden": hidden, "direction": "bidirectional"})
               for op, hidden, batch in (("LSTM", 40, 3), ("GRU", 56, 9), ("RNN", 72, 2), ("LSTM", 16, 1),
                                         ("GRU", 8, 2), ("LSTM", 33, 7), ("LSTM", 40, 3))]
    check(*build(configs), isa)  # the two LSTMs of hidden 40 share one kernel, each with its own weights


@pytest.mark.parametrize("isa", ISAS)
def test_runtime_weights(isa: str) -> None:
    """W, R, B (and P) fed at run time: R is packed into scratch once per run."""
    configs = [(op, {"steps": 5, "batch": 3, "size": 4, "hidden": 19, "direction": "bidirectional", "layout": lay,
                     "const_weights": False}) for op in ("LSTM", "GRU", "RNN") for lay in (0, 1)]
    check(*build(configs), isa)


ALL = ("Relu", "Tanh", "Sigmoid", "Affine", "LeakyRelu", "ThresholdedRelu", "ScaledTanh", "HardSigmoid", "Elu",
       "Softsign", "Softplus")


def test_every_activation_with_alpha_beta() -> None:
    """Each ONNX recurrent activation in each gate role of each op, with non-default alpha / beta, and clip."""
    configs = []
    for op in ("LSTM", "GRU", "RNN"):
        k = len(DEFAULTS[op])
        for start in range(0, len(ALL), k):
            names = tuple(ALL[(start + i) % len(ALL)] for i in range(k))
            both = acts(op, 1, names) + acts(op, 1, tuple(reversed(names)))
            configs.append((op, {"steps": 4, "batch": 2, "size": 3, "hidden": 9, "direction": "bidirectional",
                                 "activations": both, "clip": 2.5}))
    check(*build(configs), "host")


@pytest.mark.parametrize("isa", ISAS)
def test_lstm_input_forget_clip_and_gru_linear_before_reset(isa: str) -> None:
    lstm = {"steps": 5, "batch": 4, "size": 6, "hidden": 13, "direction": "bidirectional"}
    gru = {"steps": 5, "batch": 6, "size": 6, "hidden": 21}
    configs = [("LSTM", {**lstm, **a}) for a in ({"input_forget": 1}, {"input_forget": 1, "clip": 0.7},
                                                 {"clip": 0.3})]
    configs += [("GRU", {**gru, "direction": d, "linear_before_reset": lbr, "clip": 1.5 if lbr else None})
                for lbr in (0, 1) for d in ("forward", "bidirectional")]
    check(*build(configs), isa)


def test_optional_outputs() -> None:
    """Outputs the model does not name still get memory; each subset and order of outputs is right."""
    configs = [(op, {"steps": 3, "batch": 2, "size": 4, "hidden": 10, "direction": "reverse", "outputs": outs})
               for op, outs in (("LSTM", (1,)), ("LSTM", (2, 0)), ("LSTM", (1, 2)), ("GRU", (1,)), ("RNN", (0,)))]
    check(*build(configs), "host")


def test_long_sequence_matches() -> None:
    """The bench shape, shortened: error does not grow along 40 steps."""
    g, feeds = recurrent_graph("LSTM", steps=40, batch=1, size=64, hidden=128, seed=7)
    check(g, feeds, "host")
    check(g, feeds, "avx2")


@pytest.fixture
def cooperate_always(monkeypatch):
    """Small test shapes cooperate too (the work thresholds are for speed, not for correctness)."""
    from glowpy.backends.cpu.kernels import rnn

    monkeypatch.setattr(rnn, "COOP_MIN_STEP_FLOPS", 0)
    monkeypatch.setattr(rnn, "COOP_MIN_FLOPS", 0)


def test_cooperation_needs_work_and_groups() -> None:
    """The zoo's LSTM and GRU (hidden 128, batch 1, 100 steps) cooperate at 2 threads, one direction or
    two; a small one, a runtime R or one thread does not."""
    from glowpy.backends.cpu.kernels.rnn import cooperates

    lstm = {"constant_r": True, "cell": "LSTM", "steps": 100, "batch": 1, "hidden": 128, "dirs": 1,
            "linear_before_reset": 0, "vector_width": 16}
    assert cooperates(2, **lstm) and cooperates(2, **{**lstm, "dirs": 2}) and cooperates(2, **{**lstm, "vector_width": 8})
    assert not cooperates(1, **lstm) and not cooperates(2, **{**lstm, "constant_r": False})
    assert cooperates(2, **{**lstm, "cell": "GRU", "linear_before_reset": 1})  # the zoo's GRU
    assert not cooperates(2, **{**lstm, "hidden": 32}) and not cooperates(2, **{**lstm, "hidden": 16, "dirs": 2})
    assert not cooperates(2, **{**lstm, "cell": "RNN", "batch": 8})  # 128 units: one group of 8 x 16 lanes


def test_two_threads(cooperate_always) -> None:
    """An input wider than the hidden size: the projection GEMM and the cooperative recurrent step both
    run on both threads."""
    g, feeds = recurrent_graph("GRU", steps=6, batch=3, size=96, hidden=40, direction="bidirectional", seed=8)
    program = CpuBackend().build(g, threads=2)
    assert [(s.parallel, s.cooperative) for s in program.steps] == [(True, False), (True, True)]
    check(g, feeds, "host", threads=2)


def run_threads(g: Graph, feeds: list[np.ndarray], threads: int, isa: str = "host") -> list[np.ndarray]:
    return CpuBackend().compile(g, threads=threads, isa=isa, cache=False).run(feeds)


COOPERATIVE = [  # (op, kw): one direction (shares of hidden groups per sub-step) and two (whole directions)
    ("LSTM", {"steps": 9, "batch": 3, "size": 5, "hidden": 40}),
    ("LSTM", {"steps": 7, "batch": 1, "size": 64, "hidden": 128, "direction": "reverse"}),
    ("GRU", {"steps": 8, "batch": 5, "size": 6, "hidden": 56, "linear_before_reset": 0}),  # two passes a step
    ("GRU", {"steps": 6, "batch": 2, "size": 4, "hidden": 21, "linear_before_reset": 1, "layout": 1}),
    ("RNN", {"steps": 5, "batch": 2, "size": 3, "hidden": 72}),
    ("RNN", {"steps": 5, "batch": 4, "size": 3, "hidden": 8}),  # one group: not cooperative
    ("LSTM", {"steps": 6, "batch": 3, "size": 7, "hidden": 33, "direction": "bidirectional"}),
    ("GRU", {"steps": 6, "batch": 2, "size": 7, "hidden": 19, "direction": "bidirectional", "layout": 1}),
]


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("threads", [2, 3])
def test_cooperative_chunks_match_one_thread_bit_for_bit(isa: str, threads: int, cooperate_always) -> None:
    """The chunks of a cooperative recurrent step split each sub-step's hidden groups (one direction) or
    take whole directions (two); every unit is computed by the same code whichever thread runs it, so
    the outputs equal one thread's bit for bit, over ragged lengths (zeros past each length), every
    cell, two-pass GRU, both layouts, more threads than groups; and again on later runs (the sync words
    are back to zero after each run)."""
    g, feeds = build(COOPERATIVE)
    program = CpuBackend().build(g, threads=threads, isa=isa)
    coop = [s.cooperative for s in program.steps if any(a.kind == "sync" for a in s.args)]
    assert len(coop) == len(COOPERATIVE) and sum(coop) >= len(COOPERATIVE) - 2  # RNN: one group of 72 on 16 lanes
    one = run_threads(g, feeds, 1, isa)
    model = CpuBackend().compile(g, threads=threads, isa=isa, cache=False)
    for _ in range(20):
        for a, b in zip(model.run(feeds), one):
            np.testing.assert_array_equal(a, b)
    assert_close(one, InterpreterBackend().compile(g).run(feeds), "one thread vs the interpreter")


class DirectKernel:
    """emit_rnn's kernel on its own, MCJIT-compiled, called through ctypes on arrays we hold, so a test
    can run its chunks in any order and read its sync words."""

    def __init__(self, op: str, threads: int, *, steps: int, batch: int, hidden: int, dirs: int, seed: int = 0,
                 isa: str = "host", lbr: int = 0) -> None:
        import ctypes

        import llvmlite.binding as llvm
        from llvmlite import ir

        from glowpy.backends.cpu.kernels.rnn import ARG_NAMES, emit_rnn
        from glowpy.backends.cpu.target import compile_object, host_target, new_machine
        from glowpy.ir.ops.rnn import CELLS, activations_of

        target = host_target(isa)
        module = ir.Module("rnn")
        module.triple, module.data_layout = target.triple, target.data_layout
        r = np.random.default_rng(seed)
        gh = GATES[op] * hidden
        rw = (0.5 * r.standard_normal((dirs, gh, hidden))).astype(F32)
        acts = activations_of(CELLS[op], {"activations": (), "direction": "bidirectional" if dirs == 2 else "forward"})
        self.info = emit_rnn(module, "rnn", cell=op, steps=steps, batch=batch, hidden=hidden,
                             directions=tuple(d == 1 for d in range(dirs)), layout=0, acts=tuple(acts), clip=None,
                             input_forget=0, linear_before_reset=lbr, r=rw, vector_width=target.vector_width,
                             threads=threads)
        self.info.function.linkage = "external"  # kernels are internal until the program's compile exports them
        self.engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), new_machine(target))
        self.engine.add_object_file(llvm.ObjectFileRef.from_data(compile_object(str(module), target)))
        self.engine.finalize_object()
        nptr = len(ARG_NAMES) + len(self.info.packed)
        self.fn = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * nptr, ctypes.c_int32, ctypes.c_int32)(
            self.engine.get_function_address("rnn"))
        lens = r.integers(0, steps + 1, batch).astype(np.int32)
        lens[0] = steps
        self.arrays = {
            "y": np.zeros((steps, dirs, batch, hidden), F32), "y_h": np.zeros((dirs, batch, hidden), F32),
            "y_c": np.zeros((dirs, batch, hidden), F32), "xw": r.standard_normal((steps * batch, dirs * gh)).astype(F32),
            "b": (0.5 * r.standard_normal((dirs, 2 * gh))).astype(F32), "seq": lens,
            "h0": r.standard_normal((dirs, batch, hidden)).astype(F32), "c0": r.standard_normal((dirs, batch, hidden)).astype(F32),
            "p": (0.5 * r.standard_normal((dirs, 3 * hidden))).astype(F32),
            "scratch": np.zeros(self.info.scratch_bytes_per_thread // 4 + 16, F32),
            "sync": np.zeros(4096, np.int32)}
        self.packed = [np.ascontiguousarray(a) for a in self.info.packed]

    def call(self, chunk: int, chunks: int, sync: bool = True) -> None:
        from glowpy.backends.cpu.kernels.rnn import ARG_NAMES

        ptrs = [None if n == "r" or (n == "sync" and not sync) else self.arrays[n].ctypes.data for n in ARG_NAMES]
        self.fn(*ptrs, *[a.ctypes.data for a in self.packed], chunk, chunks)

    def outputs(self) -> list[np.ndarray]:
        return [self.arrays[n].copy() for n in ("y", "y_h", "y_c")]


DIRECT = [("LSTM", {"steps": 7, "batch": 3, "hidden": 40, "dirs": 1}),
          ("GRU", {"steps": 5, "batch": 2, "hidden": 24, "dirs": 1}),  # two passes a step
          ("LSTM", {"steps": 6, "batch": 2, "hidden": 19, "dirs": 2})]


@pytest.mark.parametrize("op, kw", DIRECT)
def test_cooperative_kernel_chunks_in_any_order(op: str, kw: dict, cooperate_always) -> None:
    """Chunks run one after the other (a thread so late that the other did all the work): the first
    claims every share (or direction), the second finds nothing left, and as the last to leave zeroes
    the sync words; the outputs equal the serial kernel's bit for bit, in either order, every run."""
    want = DirectKernel(op, 1, **kw)
    want.call(0, 1)
    coop = DirectKernel(op, 2, **kw)
    for order in ((0, 1), (1, 0), (0, 1)):
        for a in ("y", "y_h", "y_c") if op == "LSTM" else ("y", "y_h"):
            coop.arrays[a][...] = 7.0  # every element must be written
        for chunk in order:
            coop.call(chunk, 2)
        for got, exp in zip(coop.outputs(), want.outputs()):
            np.testing.assert_array_equal(got, exp)
        assert not coop.arrays["sync"].any(), "sync words left non-zero after the run"


def test_cooperative_kernel_alone_leaves_sync_words(cooperate_always) -> None:
    """Called as the only chunk (the pool's other thread never started), the kernel runs everything and
    never touches its sync words; with no sync words (an unthreaded program) likewise."""
    want = DirectKernel("LSTM", 1, steps=5, batch=2, hidden=40, dirs=1)
    want.call(0, 1)
    coop = DirectKernel("LSTM", 2, steps=5, batch=2, hidden=40, dirs=1)
    coop.arrays["sync"][...] = -1
    coop.call(0, 1)
    assert (coop.arrays["sync"] == -1).all()
    for got, exp in zip(coop.outputs(), want.outputs()):
        np.testing.assert_array_equal(got, exp)
    coop.arrays["y"][...] = 0
    coop.call(0, 2, sync=False)
    for got, exp in zip(coop.outputs(), want.outputs()):
        np.testing.assert_array_equal(got, exp)


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_float16_float64_compute_in_float32(dtype) -> None:
    """Operands converted to float32 around the kernel, outputs back; runtime and constant weights."""
    g, feeds = Graph("rnns"), []
    add_recurrent(g, feeds, "LSTM", steps=3, batch=2, size=4, hidden=9, direction="bidirectional", dtype=dtype)
    add_recurrent(g, feeds, "GRU", steps=3, batch=2, size=4, hidden=9, const_weights=False, dtype=dtype, seed=1)
    got = CpuBackend().compile(g, threads=1, cache=False).run(feeds)
    want = InterpreterBackend().compile(g).run(feeds)
    for a, b in zip(got, want):
        assert a.dtype == b.dtype == dtype
        np.testing.assert_allclose(a, b, rtol=2e-3 if dtype == np.float16 else 1e-5, atol=2e-3 if dtype == np.float16 else 1e-6)


def test_runtime_r_too_large_for_gather_indices() -> None:
    """A runtime R is packed with 32-bit gathers: one of 2^31 elements or more is refused before codegen."""
    from llvmlite import ir

    from glowpy.backends.cpu.kernels.rnn import emit_rnn
    from glowpy.errors import UnsupportedShape

    with pytest.raises(UnsupportedShape, match="32-bit gather indices") as info:
        emit_rnn(ir.Module(), "k", cell="LSTM", steps=1, batch=1, hidden=16384, directions=(False, True), layout=0,
                 acts=(), clip=None, input_forget=0, linear_before_reset=0, r=None, vector_width=8)
    assert "2147483648" in str(info.value)
