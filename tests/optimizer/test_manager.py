"""The pass manager: pipeline shape, verification naming the pass, stats, stop_after, compile flag."""

from __future__ import annotations

import numpy as np
import pytest

import glowpy
from glowpy.backends import get_backend
from glowpy.errors import InternalError
from glowpy.ir import Graph
from glowpy.optimizer import PIPELINE, OptimizeStats, Pass, Stage, optimize, pass_names
from glowpy.optimizer.manager import MAX_ROUNDS

from .util import G, feeds_for, ops, run


def small_net() -> Graph:
    g = G()
    x = g.input("x", 1, 3, 6, 6)
    y = g("Relu", g.bn(g.conv(x, 4)))
    y = g("Relu", g("Add", g.bn(g.conv(y, 4)), y))
    flat = g("Reshape", g("GlobalAveragePool", y), shape=(1, 4))
    return g.ret(g("Softmax", g("Gemm", flat, g.weight(5, 4), g.weight(5), transB=1), axis=1, name="prob"))


def test_pipeline_is_a_readable_table_of_contents() -> None:
    assert [s.name for s in PIPELINE] == ["quantized", "simplify", "fold", "lower", "resimplify", "fuse", "cleanup"]
    for stage in PIPELINE:
        for p in stage.passes:
            assert p.doc, f"pass {p.name} has no docstring"
            assert p.fn.__name__ == p.name
    assert pass_names()[:2] == ["quantized", "rewrite_qdq_conv"]


def test_optimize_small_net_matches_and_leaves_input_alone() -> None:
    graph = small_net()
    before = str(graph)
    stats = OptimizeStats()
    opt = optimize(graph, stats=stats)
    assert str(graph) == before
    assert ops(opt) == ["Conv", "Conv", "GlobalAveragePool", "Reshape", "FullyConnected", "Softmax"]
    assert opt.nodes[1].attrs["activation"] == "relu" and len(opt.nodes[1].inputs) == 4
    assert [v.name for v in opt.outputs] == ["prob"]
    feeds = feeds_for(graph)
    np.testing.assert_allclose(run(opt, feeds)[0], run(graph, feeds)[0], rtol=1e-5, atol=1e-6)
    assert stats.before["BatchNormalization"] == 2 and "BatchNormalization" not in stats.after
    rec = {(r.stage, r.name): r for r in stats.passes}
    assert rec[("fold", "fold_batchnorm")].changed == 1 and rec[("fold", "fold_batchnorm")].nodes == -2
    assert rec[("fuse", "fuse_activation")].nodes == -2
    assert all(r.runs >= 1 and r.seconds >= 0 for r in stats.passes)
    assert not stats.unsettled


def _corrupt(graph: Graph) -> bool:
    """Breaks the graph on purpose: a Reshape whose attribute disagrees with its output type."""
    node = next(n for n in graph.nodes if n.op == "Reshape")
    node.attrs["shape"] = (4, 1)
    return True


def _pipeline_with(p: Pass, after: str = "fold") -> tuple[Stage, ...]:
    out = []
    for stage in PIPELINE:
        out.append(stage)
        if stage.name == after:
            out.append(Stage("injected", (p,)))
    return tuple(out)


def test_verifier_names_the_pass_that_broke_the_graph() -> None:
    with pytest.raises(InternalError) as info:
        optimize(small_net(), verify=True, pipeline=_pipeline_with(Pass("corrupt_reshape", _corrupt)))
    assert "pass 'corrupt_reshape' broke the graph" in str(info.value)
    assert info.value.op == "Reshape" and info.value.node is not None


def test_verification_follows_glowpy_verify_env(monkeypatch: pytest.MonkeyPatch) -> None:
    pipeline = _pipeline_with(Pass("corrupt_reshape", _corrupt))
    monkeypatch.setenv("GLOWPY_VERIFY", "0")
    optimize(small_net(), pipeline=pipeline)  # not checked: the corruption goes unnoticed
    monkeypatch.setenv("GLOWPY_VERIFY", "1")
    with pytest.raises(InternalError, match="corrupt_reshape"):
        optimize(small_net(), pipeline=pipeline)


def test_exception_inside_a_pass_names_the_pass() -> None:
    def explode(graph: Graph) -> bool:
        """Fails."""
        raise KeyError("boom")

    with pytest.raises(InternalError, match="pass 'explode' failed: KeyError"):
        optimize(small_net(), pipeline=_pipeline_with(Pass("explode", explode)))


def test_fixed_point_stage_that_never_settles_is_reported() -> None:
    calls = []

    def restless(graph: Graph) -> bool:
        """Always claims a change."""
        calls.append(1)
        return True

    stats = OptimizeStats()
    optimize(small_net(), stats=stats, pipeline=(Stage("loop", (Pass("restless", restless),), fixed_point=True),))
    assert len(calls) == MAX_ROUNDS and stats.unsettled == ["loop"]


@pytest.mark.parametrize("stop,present,absent", [
    ("fold_batchnorm", {"Relu", "Gemm"}, {"BatchNormalization"}),
    ("fold", {"Relu", "FullyConnected"}, {"Gemm"}),
    ("fuse_residual_add", {"Relu"}, {"Add"}),
])
def test_stop_after(stop: str, present: set, absent: set) -> None:
    got = set(ops(optimize(small_net(), stop_after=stop)))
    assert present <= got and not (absent & got)


def test_stop_after_unknown_name() -> None:
    with pytest.raises(InternalError, match="unknown pass or stage"):
        optimize(small_net(), stop_after="no_such_pass")


def test_compile_optimizes_by_default_and_not_when_asked() -> None:
    graph = small_net()
    on = glowpy.compile(graph)
    off = glowpy.compile(graph, optimize=False)
    assert len(on.graph.nodes) < len(off.graph.nodes) == len(graph.nodes)
    assert on.output_names == off.output_names == ["prob"]
    feeds = feeds_for(graph)
    np.testing.assert_allclose(on.run(feeds)["prob"], off.run(feeds)["prob"], rtol=1e-5, atol=1e-6)


def test_optimize_in_place_and_by_backend_name() -> None:
    graph = small_net()
    same = glowpy.optimize(graph, "interpreter", in_place=True)  # names resolve at the top, in glowpy.pipeline
    assert same is graph and "BatchNormalization" not in ops(graph)


def test_paused_gc_restores_the_collector_state() -> None:
    import gc

    from glowpy.optimizer.manager import paused_gc

    assert gc.isenabled()
    with pytest.raises(RuntimeError, match="inside"):
        with paused_gc():
            assert not gc.isenabled()
            raise RuntimeError("inside")
    assert gc.isenabled()
    gc.disable()
    try:
        with paused_gc():
            assert not gc.isenabled()
        assert not gc.isenabled()  # it was off before: it stays off
    finally:
        gc.enable()


def test_rewritten_weights_are_freed_without_the_cyclic_collector() -> None:
    """The pipeline runs with the collector paused, so anything a pass leaves in a reference cycle
    waits: a replaced node, or a probe node asking the backend, must not hold weights that way."""
    import gc
    import weakref

    graph = small_net()
    conv_weights = [weakref.ref(v.data) for v in graph.constants.values() if v.data.ndim == 4]
    gemm_weight = weakref.ref(next(n for n in graph.nodes if n.op == "Gemm").inputs[1].data)
    assert len(conv_weights) == 2
    gc.disable()
    try:
        optimize(graph, get_backend("cpu"), in_place=True)  # BatchNorm folds into new conv weights; Gemm -> FC
        assert [r() for r in conv_weights] == [None, None]
        assert gemm_weight() is None  # transposed for FullyConnected: the (5, 4) original is gone
    finally:
        gc.enable()
