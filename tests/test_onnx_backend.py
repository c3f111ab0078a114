"""glowpy behind ONNX's own backend test runner, and the full node-test conformance sweep."""

from __future__ import annotations

import onnx.backend.test
import pytest

import glowpy.backend
from glowpy.backend import GlowpyBackend
from tools.conformance import node_cases, run_case

# A representative slice through ONNX's runner itself (it builds unittest classes from the backend):
# proves the Backend face (prepare / run / supports_device) works the way ONNX drives it.
_RUNNER_CASES = [
    "test_relu", "test_add_bcast", "test_conv_with_strides_and_asymmetric_padding", "test_maxpool_2d_ceil",
    "test_averagepool_2d_pads_count_include_pad", "test_batchnorm_epsilon", "test_gemm_all_attributes",
    "test_matmul_4d", "test_softmax_axis_1", "test_concat_3d_axis_negative_1", "test_transpose_all_permutations_3",
    "test_gather_negative_indices", "test_flatten_negative_axis2", "test_split_2d_uneven_split_opset18",
    "test_lrn", "test_convtranspose_dilations", "test_where_long_example", "test_argmax_keepdims_random",
]
_backend_test = onnx.backend.test.BackendTest(GlowpyBackend, __name__)
_wanted = {f"{n}_cpu" for n in _RUNNER_CASES}
for _name in _RUNNER_CASES:
    _backend_test.include(rf"^{_name}_cpu$")
_classes = _backend_test.test_cases  # a property that builds new classes on each access: read it once
for _cls in _classes.values():
    # ONNX's runner would report ~4000 "no matched include pattern" skips; keep only the chosen methods.
    for _attr in [a for a in vars(_cls) if a.startswith("test_") and a not in _wanted]:
        delattr(_cls, _attr)
globals().update({k: c for k, c in _classes.items() if any(a.startswith("test_") for a in vars(c))})


def test_module_level_backend_api() -> None:
    assert glowpy.backend.supports_device("CPU")
    assert not glowpy.backend.supports_device("CUDA")


@pytest.fixture(scope="module")
def cases():
    return node_cases()


SWEEP_SHARDS = 8  # one test per shard, so the workers share the sweep (as one test it ran 10 minutes on one)
MIN_PASS = 1500  # of onnx's node cases on cpu (1604 when last counted); each shard holds its share


@pytest.mark.heavy
@pytest.mark.parametrize("shard", range(SWEEP_SHARDS))
def test_node_conformance_sweep(cases, backend: str, shard: int) -> None:
    """Every node case onnx ships (every SWEEP_SHARDS-th, from `shard`): glowpy either matches the
    expected outputs or refuses cleanly with an Unsupported* error. A wrong number or any other error is a bug."""
    mine = cases[shard::SWEEP_SHARDS]
    results = {c.name: run_case(c, backend) for c in mine}
    bad = {n: r for n, r in results.items() if r[0] in ("mismatch", "error")}
    assert not bad, "\n".join(f"{n}: {v} {d}" for n, (v, d) in sorted(bad.items()))
    passed = sum(1 for v, _ in results.values() if v == "pass")
    floor = MIN_PASS * len(mine) // len(cases)
    assert passed >= floor, f"only {passed} of {len(mine)} node cases pass on {backend} (at least {floor})"
