"""Shared fixtures: light models, random-weight models, and the backends every op test runs on."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from glowpy.backends import BACKENDS  # noqa: E402

# Every pass verifies the graph it leaves behind, in every test (the optimizer reads this).
os.environ.setdefault("GLOWPY_VERIFY", "1")


def _available_backends() -> list[str]:
    """Every registered backend. One that cannot be created is a failure here, not a silent skip."""
    for factory in BACKENDS.values():
        factory()  # raises if the backend is broken
    return list(BACKENDS)


AVAILABLE_BACKENDS = _available_backends()


@pytest.fixture(params=AVAILABLE_BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where random-weight models are written (the repo's models/ cache, shared across workers)."""
    d = ROOT / "models"
    d.mkdir(exist_ok=True)
    return d


@pytest.fixture(scope="session")
def random_model(models_dir: Path):
    """random_model(name) -> path of the seeded random-weight version of a light model."""
    from tools.prepare_models import prepare

    return lambda name: prepare(name, models_dir)


def rand(shape, dtype=np.float32, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.standard_normal(shape).astype(dtype)


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "heavy: the tests whose compiles dominate the suite's time (the full onnx node-case and op-test "
                   "sweeps, the big light models, the random-weight models, the model zoo, the random-graph differential "
                   "tests, the activation, recurrent and batched-matmul kernel sweeps): the second step of the README's test command (-m heavy; -m 'not heavy' "
                   "for the rest)")
