"""The promotion gate refuses an APGR gain the paired bootstrap cannot tell from noise, and a
challenger whose sanity-suite concordance falls more than the tolerance below the champion's.

604 held-out rows (the size of the issue's example) with real APGR and the real paired bootstrap
(``compare.bootstrap_delta``): a challenger whose gain is positive but inside resampling noise is
refused by default, one whose gain is clear passes, and the threshold is configurable."""

from __future__ import annotations

import numpy as np

from pointsman.training.compare import Comparison, ModelScore, bootstrap_delta
from pointsman.training.logged_examples import LoggedExamples
from pointsman.training.metrics import apgr
from pointsman.training.promote import Gate, evaluate_gate
from pointsman.training.sanity import PairScore, SanityReport

N = 604


def examples(rng: np.random.Generator) -> LoggedExamples:
    weak = rng.integers(0, 2, N).astype(float)
    strong = np.maximum(weak, rng.integers(0, 2, N)).astype(float)  # the frontier is at least as good
    empty = np.array([""] * N, dtype=object)
    return LoggedExamples(decision_id=np.array([f"d{i}" for i in range(N)], dtype=object), time_s=np.arange(N, dtype=float),
                          group=empty, y=strong - weak, weak_score=weak, strong_score=strong, signal=empty,
                          p_hard_logged=np.full(N, np.nan), estimator_version=empty, feature_space=empty,
                          head_input=[None] * N, features=[],
                          has_text=np.zeros(N, dtype=bool))


def comparison(ex: LoggedExamples, p_champion: np.ndarray, p_challenger: np.ndarray) -> Comparison:
    def score(role: str, p: np.ndarray) -> ModelScore:
        return ModelScore(role, role, role, None, {"apgr": apgr(ex.weak_score, ex.strong_score, p), "cpt50": 0.5,
                                                   "auc": 0.5, "ece": 0.05, "n": float(N)}, p)

    a, b = score("champion", p_champion), score("challenger", p_challenger)
    return Comparison(ex, a, b, b.metrics["apgr"] - a.metrics["apgr"], bootstrap_delta(ex, p_champion, p_challenger))


def test_a_gain_within_noise_is_refused_and_a_clear_one_passes():
    rng = np.random.default_rng(7)
    ex = examples(rng)
    gap = ex.strong_score - ex.weak_score
    champion = 0.3 * gap + rng.random(N)
    base = apgr(ex.weak_score, ex.strong_score, champion)
    noisy = champion
    while apgr(ex.weak_score, ex.strong_score, noisy) <= base:  # the first noisy redraw that gains a little
        noisy = champion + 0.35 * rng.standard_normal(N)  # about the same model
    cmp = comparison(ex, champion, noisy)
    lo, hi = cmp.apgr_delta_ci90
    assert cmp.apgr_delta > 0 and lo < 0 < hi
    reasons, checks = evaluate_gate(cmp, Gate())
    # before: promoted on the positive point gain alone
    assert [r for r in reasons if "within resampling noise" in r], reasons
    assert any(c.startswith("APGR challenger") for c in checks)  # the point gain itself passed
    assert not evaluate_gate(cmp, Gate(min_apgr_gain_ci_low=lo - 0.01))[0]  # configurable

    clear = comparison(ex, champion, 1.5 * gap + rng.random(N))
    assert clear.apgr_delta_ci90[0] > 0
    reasons, checks = evaluate_gate(clear, Gate())
    assert reasons == [] and any("paired bootstrap interval" in c for c in checks)


def sanity_report(concordant: int, n: int = 100) -> SanityReport:
    """A report in which ``concordant`` of ``n`` pairs are ranked the right way."""
    pairs = [PairScore(f"p{i}", "code", "en", 0.2, 0.8, 10, 10) if i < concordant else
             PairScore(f"p{i}", "code", "en", 0.8, 0.2, 10, 10) for i in range(n)]
    return SanityReport("pairs.jsonl", "m", "m", pairs, [])


def test_the_sanity_gate_allows_a_drop_up_to_the_tolerance_and_refuses_more():
    rng = np.random.default_rng(7)
    ex = examples(rng)
    gap = ex.strong_score - ex.weak_score
    cmp = comparison(ex, 0.3 * gap + rng.random(N), 1.5 * gap + rng.random(N))  # a clear APGR gain
    champion = sanity_report(90)
    assert evaluate_gate(cmp, Gate(), (champion, sanity_report(88)))[0] == []  # 0.88 >= 0.90 - 0.02
    reasons, _ = evaluate_gate(cmp, Gate(), (champion, sanity_report(87)))
    assert reasons == ["sanity concordance challenger 0.8700 (95% CI 0.7902-0.9224) vs champion 0.9000 on 100 easy/hard "
                       "pairs (allowed down to 0.8800 = champion - 0.02): the challenger ranks obviously easy requests "
                       "above obviously hard ones more often"]
    reasons, checks = evaluate_gate(cmp, Gate(max_sanity_drop=1.0), (champion, sanity_report(0)))  # the override
    assert reasons == [] and checks[-1].endswith("on 100 easy/hard pairs (not checked: --max-sanity-drop 1)")
    assert evaluate_gate(cmp, Gate())[0] == []  # no sanity reports: not checked
