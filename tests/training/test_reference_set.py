"""The reference prompt mix and threshold derivation from published quantiles."""

import numpy as np
import pytest

from pointsman.datasets.sources import shared_datasets_dir
from pointsman.training.reference_set import (
    LEVELS,
    REFERENCE_SETS,
    reference_prompts,
    reference_quantiles,
    threshold_for_share,
)


def test_reference_prompts_are_deterministic_and_bounded():
    rel, col = REFERENCE_SETS[0]
    a = reference_prompts(shared_datasets_dir() / rel, col, 50)
    b = reference_prompts(shared_datasets_dir() / rel, col, 50)
    assert a == b and len(a) == 50 and all(t.strip() for t in a)
    assert len(reference_prompts(shared_datasets_dir() / REFERENCE_SETS[1][0], REFERENCE_SETS[1][1], 10_000)) == 160


def test_quantiles_and_thresholds_by_hand():
    scores = {"a": list(np.linspace(0.0, 1.0, 101)), "b": []}
    ref = reference_quantiles(scores)
    assert ref["n"] == 101 and len(ref["quantiles"]) == len(LEVELS)
    assert ref["quantiles"]["0.50"] == pytest.approx(0.5) and ref["quantiles"]["0.85"] == pytest.approx(0.85)
    # top 15% of the mix -> the 0.85 quantile; between levels it interpolates linearly
    assert threshold_for_share(ref, 0.15) == pytest.approx(0.85)
    assert threshold_for_share(ref, 0.125) == pytest.approx(0.875)
    # outside the published 0.05..0.95 levels it clamps
    assert threshold_for_share(ref, 0.01) == pytest.approx(0.95)
    with pytest.raises(ValueError):
        threshold_for_share(ref, 1.0)
    with pytest.raises(ValueError):
        reference_quantiles({"a": []})
