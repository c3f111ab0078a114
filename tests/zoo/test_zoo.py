"""The public model zoo: every committed skeleton, from both torch exporters, realized with seeded weights.

A model glowpy compiles must match onnxruntime within RTOL / ATOL on every seeded feed. A model it refuses
must be refused exactly as tests/zoo/expected.json records, and a recorded refusal that now compiles fails
too: the file is a ratchet, rewritten by `python tools/zoo/expect.py` when glowpy learns a model.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.zoo.harness import (
    EXPECTED_PATH,
    compile_outcome,
    load_expected,
    mismatches,
    onnxruntime_outputs,
    realized,
    skeleton_names,
)

NAMES = skeleton_names()
EXPECTED = load_expected()
# Every zoo model runs in the test command's second step (-m heavy), which issue 10 allows for the zoo:
# together they are minutes of cold compiles.
REGENERATE = "run `python tools/zoo/expect.py` and commit tests/zoo/expected.json"


def test_every_skeleton_has_an_expectation() -> None:
    assert NAMES, "no skeletons under tests/zoo/skeletons"
    assert sorted(EXPECTED) == NAMES, f"{EXPECTED_PATH.name} and the skeletons disagree: {REGENERATE}"


@pytest.mark.heavy
@pytest.mark.parametrize("name", NAMES)
def test_zoo_model(name: str) -> None:
    expected = EXPECTED.get(name)
    assert expected is not None, f"{name} has no entry in {EXPECTED_PATH.name}: {REGENERATE}"
    model = realized(name)
    compiled, found = compile_outcome(model)
    if compiled is None:
        assert found == expected, f"{name}: glowpy refuses it with {found}, {EXPECTED_PATH.name} records {expected}"
        # The realized model itself is sound: onnxruntime runs it to finite, non-constant outputs.
        for outputs in onnxruntime_outputs(model):
            for out_name, value in outputs.items():
                if np.issubdtype(value.dtype, np.floating):
                    assert np.isfinite(value).all(), f"{name}: onnxruntime output '{out_name}' is not finite"
                    assert value.size == 1 or value.std() > 1e-6, f"{name}: onnxruntime output '{out_name}' is constant"
        return
    assert expected == "pass", f"{name} compiles now, {EXPECTED_PATH.name} records {expected}: {REGENERATE}"
    problems = mismatches(model, compiled, name)
    assert not problems, f"{name} differs from onnxruntime:\n" + "\n".join(problems)
