"""The optimizer: the pipeline of passes that rewrites an IR graph before a backend compiles it.

Read PIPELINE top to bottom: it is the table of contents. Each pass is a function in this package
with a docstring saying what it rewrites; `glowpy.optimize(graph, backend)` runs them on a copy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from glowpy.ir.graph import Graph
from glowpy.optimizer.attention import (
    fuse_attention,
    fuse_gelu,
    matmul_nd_add_to_fully_connected,
    sink_reshape_below_activation,
)
from glowpy.optimizer.control import inline_known_branches
from glowpy.optimizer.conv_taps import crop_dead_conv_taps, split_conv_by_live_taps
from glowpy.optimizer.fold import (
    fold_batchnorm,
    fold_channel_affine,
    gemm_to_fully_connected,
    matmul_add_to_fully_connected,
)
from glowpy.optimizer.fuse import fuse_activation, fuse_residual_add
from glowpy.optimizer.layout import cancel_transposes, merge_reshapes, sink_transposes
from glowpy.optimizer.lower import LOWERINGS, lower_nodes
from glowpy.optimizer.manager import (
    OptimizeStats,
    Pass,
    PassRecord,
    Stage,
    paused_gc,
    run_pass,
    run_pipeline,
    stage_and_pass_names,
    verify_by_default,
)
from glowpy.optimizer.quant import (
    fold_qdq_data_movement,
    rewrite_qdq_add,
    rewrite_qdq_conv,
    rewrite_qdq_global_average_pool,
    rewrite_qdq_matmul,
)
from glowpy.optimizer.simplify import (
    eliminate_common_subexpressions,
    eliminate_dead_code,
    fold_constants,
    merge_constants,
    remove_noops,
)
from glowpy.optimizer.squeeze_excite import fuse_squeeze_excite
from glowpy.optimizer.swish import fuse_swish

if TYPE_CHECKING:
    from glowpy.backends.base import Backend

def optimize_loop_bodies(graph: Graph, backend: Backend | None = None) -> bool:
    """The body of each Loop the backend keeps as a loop (`should_lower` false) through this pipeline,
    for that backend: its If nodes become selects, its fusable ops fuse, as in the enclosing graph."""
    if backend is None:
        return False
    changed = False
    for node in graph.nodes:
        if node.op == "Loop" and not backend.should_lower(node):
            node.attrs = {**node.attrs, "body": optimize(node.attrs["body"], backend)}
            changed = True
    return changed


SIMPLIFY = (
    Pass("eliminate_dead_code", eliminate_dead_code),
    Pass("remove_noops", remove_noops),
    Pass("inline_known_branches", inline_known_branches),
    Pass("fold_constants", fold_constants),
    Pass("merge_reshapes", merge_reshapes),
    Pass("cancel_transposes", cancel_transposes),
    Pass("sink_transposes", sink_transposes),
    Pass("eliminate_common_subexpressions", eliminate_common_subexpressions),
)

PIPELINE: tuple[Stage, ...] = (
    # QDQ patterns into integer ops, before constant folding turns their weights' DequantizeLinear
    # into float weights.
    Stage("quantized", (
        Pass("rewrite_qdq_conv", rewrite_qdq_conv),
        Pass("rewrite_qdq_matmul", rewrite_qdq_matmul),
        Pass("rewrite_qdq_add", rewrite_qdq_add),
        Pass("rewrite_qdq_global_average_pool", rewrite_qdq_global_average_pool),
        Pass("fold_qdq_data_movement", fold_qdq_data_movement),
        Pass("eliminate_dead_code", eliminate_dead_code),
    ), fixed_point=True),
    # Clean the imported graph: weights computed by the model become constants.
    Stage("simplify", SIMPLIFY, fixed_point=True),
    # Per-channel arithmetic into the weights of the op that produced it.
    Stage("fold", (
        Pass("fold_batchnorm", fold_batchnorm),
        Pass("fold_channel_affine", fold_channel_affine),
        Pass("gemm_to_fully_connected", gemm_to_fully_connected, uses_backend=True),
        Pass("crop_dead_conv_taps", crop_dead_conv_taps),
    ), fixed_point=True),
    # Decompose what the backend does not implement (Backend.should_lower), then tidy up after it.
    Stage("lower", (Pass("lower_nodes", lower_nodes, uses_backend=True),
                    Pass("optimize_loop_bodies", optimize_loop_bodies, uses_backend=True))),
    Stage("resimplify", SIMPLIFY, fixed_point=True),
    # Fewer, fatter nodes: epilogues the backend emits inside the producing loop.
    Stage("fuse", (
        Pass("fuse_gelu", fuse_gelu, uses_backend=True),
        Pass("fuse_attention", fuse_attention, uses_backend=True),
        Pass("matmul_add_to_fully_connected", matmul_add_to_fully_connected, uses_backend=True),
        Pass("matmul_nd_add_to_fully_connected", matmul_nd_add_to_fully_connected, uses_backend=True),
        Pass("sink_reshape_below_activation", sink_reshape_below_activation),
        Pass("fuse_residual_add", fuse_residual_add, uses_backend=True),
        Pass("fuse_swish", fuse_swish, uses_backend=True),
        Pass("fuse_activation", fuse_activation, uses_backend=True),
        Pass("fuse_squeeze_excite", fuse_squeeze_excite, uses_backend=True),
        Pass("split_conv_by_live_taps", split_conv_by_live_taps),
    ), fixed_point=True),
    # Weights with equal data are stored once (only now: sharing them earlier would make equal
    # convolutions one node with several users, which then could not absorb their normalizations).
    Stage("cleanup", (
        Pass("merge_constants", merge_constants),
        Pass("eliminate_common_subexpressions", eliminate_common_subexpressions),
        Pass("eliminate_dead_code", eliminate_dead_code),
    ), fixed_point=True),
)


def clone(graph: Graph) -> Graph:
    """A copy with the same names; constant arrays are shared (passes never write into them)."""
    g = Graph(graph.name)
    new = {}
    with paused_gc():
        for v in graph.inputs:
            new[id(v)] = g.add_input(v.name, v.type)
        for v in graph.constants.values():
            new[id(v)] = g.add_constant(v.name, v.data)
        for n in graph.nodes:
            copy = g.add_node(n.op, [new[id(v)] for v in n.inputs], dict(n.attrs), name=n.name,
                              output_names=[o.name for o in n.outputs])
            for a, b in zip(n.outputs, copy.outputs):
                new[id(a)] = b
    g.outputs = [new[id(v)] for v in graph.outputs]
    for key, value in vars(graph).items():  # anything else a graph carries (metadata) is shared
        g.__dict__.setdefault(key, value)
    return g


def optimize(
    graph: Graph,
    backend: Backend | None = None,
    *,
    verify: bool | None = None,
    stats: OptimizeStats | None = None,
    stop_after: str | None = None,
    in_place: bool = False,
    pipeline: tuple[Stage, ...] = PIPELINE,
) -> Graph:
    """Run the optimization pipeline for `backend` (None: keep every op) and return the result.

    The input graph is left as it is unless `in_place`. `verify` (default: on when GLOWPY_VERIFY=1)
    runs `graph.verify()` after every pass; `stats` collects op counts and per-pass figures;
    `stop_after` names a stage or pass to stop after (for `glowpy dump --after`).
    """
    g = graph if in_place else clone(graph)
    return run_pipeline(g, pipeline, backend, verify=verify_by_default() if verify is None else verify,
                        stats=stats, stop_after=stop_after)


def pass_names(pipeline: tuple[Stage, ...] = PIPELINE) -> list[str]:
    """Stage and pass names in pipeline order (what `stop_after` accepts)."""
    return stage_and_pass_names(pipeline)


__all__ = [
    "LOWERINGS",
    "PIPELINE",
    "OptimizeStats",
    "Pass",
    "PassRecord",
    "Stage",
    "cancel_transposes",
    "clone",
    "eliminate_common_subexpressions",
    "eliminate_dead_code",
    "fold_batchnorm",
    "fold_channel_affine",
    "fold_constants",
    "fold_qdq_data_movement",
    "fuse_activation",
    "fuse_attention",
    "fuse_residual_add",
    "gemm_to_fully_connected",
    "inline_known_branches",
    "lower_nodes",
    "matmul_add_to_fully_connected",
    "merge_constants",
    "merge_reshapes",
    "optimize",
    "pass_names",
    "remove_noops",
    "rewrite_qdq_add",
    "rewrite_qdq_conv",
    "rewrite_qdq_global_average_pool",
    "rewrite_qdq_matmul",
    "run_pass",
    "sink_transposes",
]
