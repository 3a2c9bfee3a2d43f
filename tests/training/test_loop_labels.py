"""Labels from logged quality signals: each rule, their priority, filters, YAML config."""

from __future__ import annotations

import numpy as np
import pytest

from pointsman.errors import DataError
from pointsman.outcome import QualitySignals, Usage
from pointsman.outcome_log.records import LoggedDecision, LoggedOutcome
from pointsman.policy.fleet import load_fleet
from pointsman.training.outcome_labels import LabelRules, label_decision, load_label_rules

STRONG = frozenset({"frontier-large", "frontier-small"})


def outcome(target, *, model=None, shadow=False, status="ok", **quality):
    return LoggedOutcome(outcome_id=f"{target}-{model}-{len(quality)}", decision_id="d", received_s=0.0, time_s=None,
                         served_target=target, served_model=model, shadow=shadow, status=status, error=None,
                         usage=Usage(), ttft_ms=None, tpot_ms=None, e2e_latency_ms=None,
                         quality=QualitySignals(**quality))


def decision(*outcomes, target="onprem-8b"):
    return LoggedDecision(decision_id="d", time_s=0.0, tenant=None, target=target, model="m", mode="aggregated",
                          rule="default", p_hard=0.3, difficulty_available=True, estimated_cost_usd=0.0,
                          estimator_version="v", policy_revision="p", fleet_revision="f", request_features={},
                          feature_space=None, head_input=None, prompt_sha256="0" * 64, conversation_key="k",
                          prompt_text=None, outcomes=tuple(outcomes))


def label(d, **rules):
    return label_decision(d, LabelRules(**rules), STRONG)


def test_judge_pair_over_several_weak_models_is_a_soft_label():
    d = decision(outcome("onprem-8b", model="a", judge_score=0.0, judge="j"),
                 outcome("onprem-8b", model="b", judge_score=1.0, judge="j", shadow=True),
                 outcome("onprem-70b", model="c", judge_score=0.5, judge="j", shadow=True),
                 outcome("frontier-large", model="g", judge_score=1.0, judge="j", shadow=True))
    got = label(d)
    # strong - weak > 0 for a (1 > 0) and c (1 > 0.5), not b (1 = 1): 2 of 3 pairs.
    assert (got.signal, got.n) == ("judge_pair", 3) and got.y == pytest.approx(2 / 3)
    assert (got.weak_score, got.strong_score) == (pytest.approx(0.5), 1.0)
    graded = label(d, judge_graded=True, judge_scale=1.0)
    assert graded.y == pytest.approx((1.0 + 0.0 + 0.5) / 3)
    assert label(d, weak_models=("a",)).y == 1.0  # the served pair only
    assert label(d, use_shadow=False) is None  # the frontier answer was a shadow: no pair left
    assert label(d, judge_margin=0.6).y == pytest.approx(1 / 3)


def test_scores_of_different_judges_are_never_compared():
    d = decision(outcome("onprem-8b", judge_score=3.0, judge="1-10"), outcome("frontier-large", judge_score=1.0,
                                                                                judge="win-rate"))
    assert label(d, signals=("judge_pair",)) is None


def test_judge_reference_pass_mark_and_behavioural_signals():
    ref = decision(outcome("onprem-8b", judge_score=6.0, judge_reference_score=9.0),
                   outcome("onprem-8b", model="x", judge_score=9.0, judge_reference_score=8.0))
    got = label(ref)
    assert (got.signal, got.y, got.weak_score, got.strong_score) == ("judge_reference", 0.5, 7.5, 8.5)
    assert label(ref, judge_graded=True, judge_scale=9.0).y == pytest.approx((3 / 9 + 0) / 2)
    passmark = decision(outcome("onprem-8b", judge_score=4.0), outcome("onprem-8b", model="x", judge_score=8.0))
    assert label(passmark) is None  # no pass mark configured, no pair, no reference
    assert label(passmark, judge_pass_score=7.0).y == 0.5
    assert label(decision(outcome("onprem-8b", escalated=True))).y == 1.0
    assert label(decision(outcome("onprem-8b", escalated=False))).y == 0.0
    assert label(decision(outcome("onprem-8b", regenerated=True)), regenerated_label=0.8).y == 0.8
    rated = label(decision(outcome("onprem-8b", user_rating=0.25)))
    assert (rated.signal, rated.y, rated.weak_score, rated.strong_score) == ("user_rating", 0.75, 0.25, 1.0)
    failed = decision(outcome("onprem-8b", status="error"))
    assert label(failed) is None and label(failed, error_label=1.0).y == 1.0


def test_signal_priority_and_frontier_only_decisions():
    both = decision(outcome("onprem-8b", judge_score=0.0, judge_reference_score=1.0, user_rating=1.0, escalated=False))
    assert label(both).signal == "judge_reference"
    assert label(both, signals=("user_rating", "judge_reference")).signal == "user_rating"
    assert label(both, signals=("escalated",)).y == 0.0
    # A frontier answer alone says nothing about the cheaper tier.
    assert label(decision(outcome("frontier-large", user_rating=0.0), target="frontier-large")) is None
    # The tier comes from the target that answered, not the decision's target.
    fell_back = decision(outcome("onprem-70b", escalated=True), target="frontier-large")
    assert label(fell_back).y == 1.0


def test_strong_targets_come_from_the_fleet_or_the_rules():
    fleet = load_fleet()
    d = decision()
    assert LabelRules().strong_tier(fleet).of(d) == STRONG
    assert LabelRules().strong_tier(fleet, {"f": {"onprem-8b": "frontier"}}).of(d) == frozenset({"onprem-8b"})
    assert LabelRules(strong_targets=("onprem-70b",)).strong_tier(None).of(d) == frozenset({"onprem-70b"})
    with pytest.raises(DataError, match="strong_targets or a fleet"):
        LabelRules().strong_tier(None)


def test_yaml_rules_and_their_errors(tmp_path):
    good = tmp_path / "rules.yaml"
    good.write_text("signals: [judge_pair, escalated]\njudge_margin: 0.5\nweak_models: [llama-2-7b-chat-hf]\n")
    rules = load_label_rules(good)
    assert rules.signals == ("judge_pair", "escalated") and rules.weak_models == ("llama-2-7b-chat-hf",)
    assert load_label_rules(None) == LabelRules()
    for text, match in (("judge_margn: 1\n", "judge_margn: unknown field"),
                        ("signals: [judge_pair, vibes]\n", "signals.1"),
                        ("user_rating_pass: 0.5\n", "label rule fields: strong_targets"),
                        ("- a\n", "must be a mapping"),
                        ("a: [\n", "cannot read label rules")):
        bad = tmp_path / "bad.yaml"
        bad.write_text(text)
        with pytest.raises(DataError, match=match.replace("[", r"\[")):
            load_label_rules(bad)
    assert np.isfinite(LabelRules().judge_scale)
