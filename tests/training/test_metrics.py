"""Router metrics on small cases computed by hand (RouteLLM's APGR/CPT, AUC, ECE)."""

import math

import numpy as np
import pytest

from pointsman.training import metrics as M

WEAK = np.array([0.0, 0.0, 1.0, 1.0])
STRONG = np.array([1.0, 1.0, 1.0, 1.0])  # gaps 1, 1, 0, 0; total gap 2


def test_perfect_router_curve_and_area():
    p = np.array([0.9, 0.8, 0.1, 0.2])
    c = M.pgr_curve(WEAK, STRONG, p)
    assert np.allclose(c.call_share, [0, 0.25, 0.5, 0.75, 1.0])
    assert np.allclose(c.pgr, [0, 0.5, 1.0, 1.0, 1.0])
    # trapezoids: .25*(0+.5)/2 + .25*(.5+1)/2 + .25*1 + .25*1
    assert M.apgr(WEAK, STRONG, p) == pytest.approx(0.75)
    assert M.oracle_apgr(WEAK, STRONG) == pytest.approx(0.75)


def test_worst_router():
    p = np.array([0.1, 0.2, 0.9, 0.8])
    # curve 0, 0, 0, .5, 1 -> .25*.5/2 + .25*1.5/2
    assert M.apgr(WEAK, STRONG, p) == pytest.approx(0.25)


def test_random_router_is_exactly_half_and_cpt_is_target():
    assert M.random_apgr(WEAK, STRONG) == pytest.approx(0.5, abs=1e-12)
    const = np.zeros(4)
    assert M.cpt(WEAK, STRONG, const, 0.5) == pytest.approx(0.5)
    assert M.cpt(WEAK, STRONG, const, 0.8) == pytest.approx(0.8)


def test_ties_are_averaged():
    weak = np.array([0.0, 1.0, 0.0, 1.0])
    strong = np.ones(4)  # gaps 1, 0, 1, 0
    p = np.array([1.0, 1.0, 0.0, 0.0])  # each tied group holds one gap of two prompts
    # group ends at c=.5 (pgr .5) and c=1 (pgr 1): .5*(0+.5)/2 + .5*(.5+1)/2 = 0.5
    assert M.apgr(weak, strong, p) == pytest.approx(0.5)
    # Order inside the tie must not matter.
    assert M.apgr(weak[::-1], strong, p) == pytest.approx(0.5)


def test_cpt_interpolates():
    p = np.array([0.9, 0.8, 0.1, 0.2])
    assert M.cpt(WEAK, STRONG, p, 0.5) == pytest.approx(0.25)
    # between (0.25, 0.5) and (0.5, 1.0): 0.25 + 0.3/0.5*0.25
    assert M.cpt(WEAK, STRONG, p, 0.8) == pytest.approx(0.4)


def test_oracle_with_negative_gap_exceeds_one():
    weak = np.array([0.0, 1.0, 0.0])
    strong = np.array([1.0, 0.0, 1.0])  # gaps 1, -1, 1; total 1
    # oracle curve: (1/3, 1), (2/3, 2), (1, 1) -> 1/6 + 1/2 + 1/2
    assert M.oracle_apgr(weak, strong) == pytest.approx(7 / 6)


def test_nan_rows_are_ignored():
    weak = np.array([0.0, 0.0, 1.0, 1.0, np.nan])
    strong = np.array([1.0, 1.0, 1.0, 1.0, 1.0])
    p = np.array([0.9, 0.8, 0.1, 0.2, 0.95])
    assert M.apgr(weak, strong, p) == pytest.approx(0.75)
    assert M.router_report(weak, strong, p)["n"] == 4


def test_no_gap_is_an_error():
    with pytest.raises(ValueError, match="not better"):
        M.apgr(np.ones(3), np.ones(3), np.arange(3.0))


def test_judge_scores():
    weak = np.array([3.0, 9.0, 5.0])
    strong = np.array([9.0, 9.0, 8.0])  # gaps 6, 0, 3; total 9
    p = np.array([0.2, 0.1, 0.7])  # order: gap 3, gap 6, gap 0
    # curve (1/3, 1/3), (2/3, 1), (1, 1): (1/3)(1/3)/2 + (1/3)(4/3)/2 + 1/3
    assert M.apgr(weak, strong, p) == pytest.approx(1 / 18 + 4 / 18 + 1 / 3)


def test_auc_and_weak_worse():
    lab = M.weak_worse(np.array([0.0, 1.0, np.nan]), np.array([1.0, 1.0, 1.0]))
    assert lab[0] == 1.0 and lab[1] == 0.0 and math.isnan(lab[2])
    assert M.roc_auc(np.array([0, 1, 0, 1.0]), np.array([0.1, 0.9, 0.2, 0.8])) == pytest.approx(1.0)
    assert M.roc_auc(np.array([0, 1.0]), np.array([0.5, 0.5])) == pytest.approx(0.5)
    assert math.isnan(M.roc_auc(np.ones(3), np.arange(3.0)))


def test_ece():
    # two bins, each off by 0.1
    assert M.ece(np.array([0, 0, 1, 1.0]), np.array([0.1, 0.1, 0.9, 0.9])) == pytest.approx(0.1)
    assert M.ece(np.array([0, 1, 0, 1.0]), np.full(4, 0.5)) == pytest.approx(0.0)
    # soft labels: mean label 0.3 in the 0.3 bin
    assert M.ece(np.array([0.2, 0.4]), np.array([0.3, 0.3])) == pytest.approx(0.0)
    # p == 1.0 falls in the last bin
    assert M.ece(np.array([1.0]), np.array([1.0])) == pytest.approx(0.0)
