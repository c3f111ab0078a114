"""Differential test: seeded random small graphs run on the CPU backend and on the interpreter.

Each seed builds a graph of 3..8 ops drawn from every family the backend generates code for
(elementwise chains with broadcasting and constants, comparisons and Where, casts, BatchNorm, reductions,
ArgMax, softmax, data movement, pooling, convolution with fused activation and residual, matrix
products, normalizations), over small random shapes, and compares every graph output. Some seeds also
go through the optimizer (fused forms) or run on two threads.
"""

from __future__ import annotations

import numpy as np
import pytest

import glowpy
from glowpy.backends.cpu import CpuBackend
from glowpy.backends.cpu.target import isa_available
from glowpy.backends.interpreter import InterpreterBackend
from glowpy.ir.graph import Graph, Value

from .util import assert_close

pytestmark = pytest.mark.heavy  # random graphs, one compile each: the suite's second step

F32 = np.dtype(np.float32)


class RandomGraph:
    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.g = Graph(f"random{seed}")
        self.feeds: list[np.ndarray] = []
        self.pool: list[Value] = []
        self.n = 0

    # --- helpers ------------------------------------------------------------------------------

    def name(self, base: str) -> str:
        self.n += 1
        return f"{base}{self.n}"

    def input(self, shape: tuple[int, ...], dtype=F32) -> Value:
        v = self.g.add_input(self.name("in"), glowpy.ir.types.TensorType(dtype, shape))
        self.feeds.append(self.rng.standard_normal(shape).astype(dtype))
        self.pool.append(v)
        return v

    def const(self, array: np.ndarray) -> Value:
        return self.g.add_constant(self.name("c"), np.asarray(array))

    def node(self, op: str, inputs: list[Value], attrs: dict | None = None) -> Value:
        n = self.g.add_node(op, inputs, attrs or {}, name=self.name(op.lower()))
        for out in n.outputs:
            if out.dtype == F32:
                self.pool.append(out)
        return n.outputs[0]

    def pick(self, min_rank: int = 0, rank: int | None = None) -> Value | None:
        cands = [v for v in self.pool if v.type.rank >= min_rank and (rank is None or v.type.rank == rank)]
        if not cands:
            return None
        # prefer recent values, so graphs grow chains rather than fans
        k = len(cands)
        i = int(min(k - 1, k - 1 - abs(self.rng.normal(0, 2))))
        return cands[max(i, 0)]

    def bcast_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        drop = int(self.rng.integers(0, len(shape) + 1))
        s = list(shape[drop:])
        for i in range(len(s)):
            if self.rng.random() < 0.3:
                s[i] = 1
        return tuple(s)

    def small(self, shape: tuple[int, ...]) -> np.ndarray:
        return (self.rng.standard_normal(shape) * 0.5).astype(np.float32)

    # --- op families --------------------------------------------------------------------------

    def unary(self) -> None:
        x = self.pick()
        op = str(self.rng.choice(["Relu", "Sigmoid", "Tanh", "Abs", "Neg", "LeakyRelu", "Clip", "HardSigmoid",
                                  "Softplus", "Gelu", "Erf", "Exp"]))
        attrs = {"LeakyRelu": {"alpha": 0.2}, "Clip": {"min": -0.5, "max": 0.7}}.get(op, {})
        if op == "Exp":
            x = self.node("Tanh", [x])
        self.node(op, [x], attrs)

    def binary(self) -> None:
        x = self.pick()
        op = str(self.rng.choice(["Add", "Sub", "Mul", "Max", "Min", "Div", "Pow"]))
        shape = self.bcast_shape(x.shape)
        if self.rng.random() < 0.5:
            y = self.const(self.small(shape) + (2.0 if op == "Div" else 0.0))
        else:
            y = self.input(shape)
            if op == "Div":
                y = self.node("Add", [self.node("Abs", [y]), self.const(np.float32(1.0))])
        if op == "Pow":
            x = self.node("Add", [self.node("Abs", [x]), self.const(np.float32(0.5))])
        swap = op not in ("Div", "Pow") and self.rng.random() < 0.3
        out = self.node(op, [y, x] if swap else [x, y])
        if out.shape != x.shape and self.rng.random() < 0.5:
            self.node("Relu", [out])

    def select(self) -> None:
        x = self.pick()
        y = self.input(self.bcast_shape(x.shape))
        c = self.node(str(self.rng.choice(["Greater", "Less", "Equal"])), [x, y])
        z = self.const(self.small(self.bcast_shape(x.shape)))
        self.node("Where", [c, x, z])

    def cast(self) -> None:
        x = self.pick()
        to = np.dtype(self.rng.choice([np.int32, np.int64, np.float16, np.float64, np.bool_, np.uint8]))
        scaled = self.node("Mul", [x, self.const(np.float32(3.0))])
        mid = self.node("Cast", [scaled], {"to": to})
        self.node("Cast", [mid], {"to": F32})

    def batchnorm(self) -> None:
        x = self.pick(min_rank=2)
        if x is None:
            return
        c = x.shape[1]
        params = [self.const(self.rng.uniform(0.5, 1.5, c).astype(np.float32)), self.const(self.small((c,))),
                  self.const(self.small((c,))), self.const(self.rng.uniform(0.5, 1.5, c).astype(np.float32))]
        self.node("BatchNormalization", [x, *params], {"epsilon": 1e-3})

    def reduce(self) -> None:
        x = self.pick(min_rank=1)
        if x is None:
            return
        op = str(self.rng.choice(["ReduceSum", "ReduceMean", "ReduceMax", "ArgMax"]))
        if op == "ArgMax":
            out = self.node("ArgMax", [x], {"axis": int(self.rng.integers(-x.type.rank, x.type.rank)),
                                             "keepdims": int(self.rng.integers(0, 2)),
                                             "select_last_index": int(self.rng.integers(0, 2))})
            self.node("Cast", [out], {"to": F32})
            return
        k = int(self.rng.integers(0, x.type.rank + 1))
        axes = tuple(sorted(self.rng.choice(x.type.rank, size=k, replace=False).tolist()))
        self.node(op, [x], {"axes": axes, "keepdims": int(self.rng.integers(0, 2))})

    def softmax(self) -> None:
        x = self.pick(min_rank=1)
        if x is None:
            return
        op = str(self.rng.choice(["Softmax", "LogSoftmax", "LayerNormalization"]))
        axis = int(self.rng.integers(-x.type.rank, x.type.rank))
        if op == "LayerNormalization":
            norm = x.shape[axis % x.type.rank:]
            ins = [x, self.const(self.rng.uniform(0.5, 1.5, norm).astype(np.float32))]
            if self.rng.random() < 0.5:
                ins.append(self.const(self.small(norm[1:] if len(norm) > 1 else norm)))
            self.node(op, ins, {"axis": axis, "epsilon": 1e-5})
        else:
            self.node(op, [x], {"axis": axis})

    def movement(self) -> None:
        x = self.pick(min_rank=1)
        if x is None:
            return
        r = x.type.rank
        op = str(self.rng.choice(["Transpose", "Reshape", "Slice", "Concat", "Split", "Expand", "Pad", "Gather"]))
        if op == "Transpose":
            self.node(op, [x], {"perm": tuple(self.rng.permutation(r).tolist())})
        elif op == "Reshape":
            self.node(op, [x], {"shape": (x.type.size,) if r > 1 else (1, x.type.size)})
        elif op == "Slice":
            a = int(self.rng.integers(0, r))
            n = x.shape[a]
            if self.rng.random() < 0.3:
                start, end, step = n - 1, -1, -int(self.rng.integers(1, 3))
            else:
                start = int(self.rng.integers(0, n))
                end, step = int(self.rng.integers(start + 1, n + 1)), int(self.rng.integers(1, 3))
            self.node(op, [x], {"starts": (start,), "ends": (end,), "axes": (a,), "steps": (step,)})
        elif op == "Concat":
            y = self.node("Sigmoid", [x])
            self.node(op, [x, y, x], {"axis": int(self.rng.integers(0, r))})
        elif op == "Split":
            a = int(self.rng.integers(0, r))
            n = x.shape[a]
            if n < 2:
                return
            cut = int(self.rng.integers(1, n))
            self.node(op, [x], {"axis": a, "split": (cut, n - cut)})
        elif op == "Expand":
            shape = tuple(2 if d == 1 else d for d in x.shape)
            self.node(op, [x], {"shape": (2, *shape) if self.rng.random() < 0.3 else shape})
        elif op == "Pad":
            mode = str(self.rng.choice(["constant", "reflect", "edge"]))
            pads = []
            for _ in range(2):
                for d in x.shape:
                    lim = d - 1 if mode == "reflect" else 2
                    pads.append(int(self.rng.integers(-1 if d > 1 and mode == "constant" else 0, max(lim, 0) + 1)))
            self.node(op, [x], {"pads": tuple(pads), "mode": mode, "value": 0.25})
        else:
            a = int(self.rng.integers(0, r))
            n = x.shape[a]
            idx = self.rng.integers(-n, n, size=tuple(self.rng.integers(1, 3, size=int(self.rng.integers(0, 3)))))
            self.node(op, [x, self.const(idx.astype(self.rng.choice([np.int64, np.int32])))], {"axis": a})

    def spatial(self) -> None:
        x = self.pick(rank=4)
        if x is None:
            n, c = int(self.rng.integers(1, 3)), int(self.rng.integers(1, 5))
            x = self.input((n, c, int(self.rng.integers(3, 9)), int(self.rng.integers(3, 9))))
        c = x.shape[1]
        op = str(self.rng.choice(["Conv", "Conv", "MaxPool", "AveragePool", "GlobalAveragePool", "LRN"]))
        k = (int(self.rng.integers(1, 4)), int(self.rng.integers(1, 4)))
        pads = tuple(int(self.rng.integers(0, kk)) for kk in k) * 2
        strides = (int(self.rng.integers(1, 3)), int(self.rng.integers(1, 3)))
        if op == "Conv":
            group = int(self.rng.choice([g for g in (1, 2, c) if c % g == 0]))
            m = group * int(self.rng.integers(1, 3))
            dil = (int(self.rng.integers(1, 3)), 1)
            if any((x.shape[2 + i] + pads[i] + pads[i + 2] - (k[i] - 1) * dil[i] - 1) < 0 for i in range(2)):
                return
            w = self.const(self.small((m, c // group, *k)))
            b = self.const(self.small((m,)))
            act = str(self.rng.choice(["none", "relu", "clip", "leaky_relu", "sigmoid", "tanh"]))
            params = {"clip": (-0.3, 0.4), "leaky_relu": (0.1,)}.get(act, ())
            attrs = {"group": group, "strides": strides, "pads": pads, "dilations": dil, "activation": act,
                     "activation_params": params}
            ins = [x, w, b]
            out_shape = glowpy.ir.ops.get_op("Conv").infer_types(attrs, [v.type for v in ins])[0].shape
            if self.rng.random() < 0.4:
                # the residual may be the conv's own input (then it cannot be overwritten in place)
                same = out_shape == x.shape and self.rng.random() < 0.5
                ins.append(x if same else self.input(out_shape))
            self.node("Conv", ins, attrs)
        elif op in ("MaxPool", "AveragePool"):
            attrs = {"kernel_shape": k, "strides": strides, "pads": pads, "ceil_mode": int(self.rng.integers(0, 2))}
            if op == "MaxPool":
                attrs["dilations"] = (1, 1)
            else:
                attrs["count_include_pad"] = int(self.rng.integers(0, 2))
            try:
                self.node(op, [x], attrs)
            except glowpy.GlowpyError:
                return
        elif op == "LRN":
            self.node(op, [x], {"size": int(self.rng.choice([1, 2, 3, 5])), "alpha": 1e-2, "beta": 0.75,
                                "bias": 1.0})
        else:
            self.node(op, [x])

    def matrix(self) -> None:
        x = self.pick(min_rank=1)
        if x is None:
            return
        k = x.shape[-1]
        n = int(self.rng.integers(1, 9))
        op = str(self.rng.choice(["MatMul", "MatMul", "Gemm"]))
        if op == "Gemm":
            if x.type.rank != 2:
                x = self.node("Reshape", [x], {"shape": (x.type.size // k, k)})
            ta, tb = int(self.rng.integers(0, 2)), int(self.rng.integers(0, 2))
            if ta:
                x = self.node("Transpose", [x], {"perm": (1, 0)})
            m = x.shape[1] if ta else x.shape[0]
            b = self.const(self.small((n, k) if tb else (k, n))) if self.rng.random() < 0.7 else \
                self.input((n, k) if tb else (k, n))
            c_shape = [(n,), (1, n), (m, n), (m, 1), ()][int(self.rng.integers(0, 5))]
            ins = [x, b] + ([self.const(self.small(c_shape))] if self.rng.random() < 0.8 else [])
            self.node(op, ins, {"alpha": 0.5, "beta": 1.5, "transA": ta, "transB": tb})
            return
        if self.rng.random() < 0.5 or x.type.rank < 3:
            b = self.const(self.small((k, n)))
        else:
            b = self.input((*self.bcast_shape(x.shape[:-2]), k, n))
        self.node(op, [x, b])

    FAMILIES = ("unary", "unary", "binary", "binary", "select", "cast", "batchnorm", "reduce", "softmax",
                "movement", "movement", "movement", "spatial", "spatial", "matrix")

    def build(self) -> tuple[Graph, list[np.ndarray]]:
        rank = int(self.rng.integers(1, 5))
        shape = tuple(int(d) for d in self.rng.integers(1, 6, size=rank))
        self.input(shape)
        for _ in range(int(self.rng.integers(3, 9))):
            getattr(self, str(self.rng.choice(self.FAMILIES)))()
        nodes = [n for n in self.g.nodes if n.outputs[0].dtype == F32]
        outs = [nodes[-1].outputs[0]] if nodes else [self.g.inputs[0]]
        if len(nodes) > 2 and self.rng.random() < 0.5:
            extra = nodes[int(self.rng.integers(0, len(nodes) - 1))].outputs[0]
            if extra not in outs:
                outs.append(extra)
        if self.rng.random() < 0.1:
            outs.append(self.g.inputs[0])  # an input that is also an output: copied
        self.g.outputs = outs
        self.g.verify()
        return self.g, self.feeds


SEEDS = range(64)


def _isas() -> list[str]:
    """The vector widths this host runs: its own (16 float lanes with AVX-512, else 8), and on an AVX-512
    host also the AVX2 build (8 lanes, no AVX-512 features: the code a Zen 3 host gets). On an AVX2-only
    host the two are the same code, so only "host" runs; the 16-lane code needs an AVX-512 host."""
    host = CpuBackend().target
    return ["host", "avx2"] if host.vector_width > 8 and isa_available("avx2") else ["host"]


ISAS = _isas()


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("seed", SEEDS)
def test_random_graph_matches_interpreter(seed: int, isa: str) -> None:
    graph, feeds = RandomGraph(seed).build()
    want = InterpreterBackend().compile(graph).run(feeds)
    threads = 2 if seed % 4 == 3 else 1
    got = CpuBackend().compile(graph, threads=threads, isa=isa).run(feeds)
    assert_close(got, want, f"seed {seed} isa {isa}\n{graph}")


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("seed", range(100, 116))
def test_random_graph_optimized_matches_interpreter(seed: int, isa: str) -> None:
    """Through glowpy.compile: the optimizer's fused forms (activation attributes, residual
    operands, folded BatchNorm) reach the backend."""
    graph, feeds = RandomGraph(seed).build()
    want = InterpreterBackend().compile(graph).run(feeds)
    model = glowpy.compile(graph, backend="cpu", threads=1 + seed % 2, isa=isa)
    got = list(model.run(dict(zip([v.name for v in graph.inputs], feeds))).values())
    assert_close(got, want, f"seed {seed}\n{graph}")
