"""Label builders on small frames."""

import numpy as np
import pytest

from pointsman.estimator.head import expand_soft_labels
from pointsman.training.labels import pairwise_gap_share, pairwise_worse_share


def test_worse_share_counts_pairs_and_skips_missing():
    weak = np.array([[0.0, 1.0], [1.0, np.nan], [np.nan, np.nan]])
    strong = np.array([[1.0], [1.0], [1.0]])
    y, n = pairwise_worse_share(weak, strong)
    assert y[0] == pytest.approx(0.5) and n[0] == 2
    assert y[1] == pytest.approx(0.0) and n[1] == 1
    assert np.isnan(y[2]) and n[2] == 0


def test_worse_share_margin_on_judge_scores():
    weak = np.array([[7.0, 8.0]])
    strong = np.array([[9.0, 8.0]])
    # pairs (7,9)->2 (7,8)->1 (8,9)->1 (8,8)->0
    assert pairwise_worse_share(weak, strong, margin=0.0)[0][0] == pytest.approx(3 / 4)
    assert pairwise_worse_share(weak, strong, margin=1.0)[0][0] == pytest.approx(1 / 4)


def test_gap_share_is_graded_and_clipped():
    weak = np.array([[1.0, 10.0]])
    strong = np.array([[10.0]])
    y, n = pairwise_gap_share(weak, strong, scale=9.0)
    assert n[0] == 2 and y[0] == pytest.approx((1.0 + 0.0) / 2)
    # with 0/1 scores it equals the worse share
    w01, s01 = np.array([[0.0, 1.0, 0.0]]), np.array([[1.0, 1.0]])
    assert pairwise_gap_share(w01, s01, 1.0)[0][0] == pytest.approx(pairwise_worse_share(w01, s01)[0][0])


def test_one_dimensional_inputs():
    y, n = pairwise_worse_share(np.array([0.0, 1.0]), np.array([1.0, 1.0]))
    assert list(y) == [1.0, 0.0] and list(n) == [1, 1]


def test_expand_soft_labels_weights():
    idx, lab, w = expand_soft_labels(np.array([0.25, 1.0]), np.array([2.0, 1.0]))
    pairs = sorted(zip(idx.tolist(), lab.tolist(), w.tolist()))
    # row 0: label 1 weight .5, label 0 weight 1.5; row 1: only label 1 weight 1 (zero-weight row dropped)
    assert pairs == [(0, 0, 1.5), (0, 1, 0.5), (1, 1, 1.0)]
