"""The decision + outcome log: records, joins, idempotency, privacy, payload validation."""

from __future__ import annotations

import numpy as np
import pytest

from pointsman.errors import DataError, RequestError
from pointsman.estimator.estimate import FixedDifficulty
from pointsman.estimator.feature_space import feature_space_of
from pointsman.estimator.features import extract_features
from pointsman.estimator.model_source import load_estimator
from pointsman.outcome import (
    MAX_BATCH,
    MAX_TOKENS,
    OutcomeIn,
    OutcomeItemError,
    Usage,
    check_usage_fits,
    parse_outcome_items,
    parse_outcomes,
)
from pointsman.outcome_log.records import FEATURE_FIELDS, DecisionRecord
from pointsman.outcome_log.store import OutcomeLog, default_log_path, record_decision
from pointsman.policy.engine import RoutingEngine
from pointsman.policy.fleet import load_fleet
from pointsman.policy.rules.compiler import STATIC_POLICY_PATH, load_policy
from pointsman.request import request_from_prompt


@pytest.fixture(scope="module")
def fleet_policy():
    fleet = load_fleet()
    return fleet, load_policy(STATIC_POLICY_PATH, fleet)


@pytest.fixture(scope="module")
def bundled():
    return load_estimator("bundled")


def decide(fleet_policy, estimator, prompt, **routing):
    fleet, policy = fleet_policy
    engine = RoutingEngine(fleet, policy, estimator)
    request = request_from_prompt(prompt, **routing)
    return engine.route(request), request


def test_decision_and_outcomes_join_by_decision_id(tmp_path, fleet_policy, bundled):
    log = OutcomeLog(tmp_path / "log.db")
    decision, request = decide(fleet_policy, bundled, "Prove that there are infinitely many primes.", tenant="acme")
    rec = record_decision(log, decision, request, bundled, time_s=1000.0)
    assert rec.head_input.dtype == np.float32 and rec.head_input.shape == (len(bundled.manifest.head.feature_names),)
    assert rec.feature_space == feature_space_of(bundled) and rec.feature_space.startswith("static-")
    acks = log.append_outcomes([
        {"decision_id": decision.decision_id, "usage": {"prompt_tokens": 20, "completion_tokens": 300,
                                                         "total_tokens": 320, "prompt_tokens_details": {"cached_tokens": 8}},
         "ttft_ms": 120.0, "tpot_ms": 20.0, "e2e_latency_ms": 6100.0, "quality": {"user_rating": 1.0}},
        {"decision_id": decision.decision_id, "outcome_id": f"{decision.decision_id}-shadow",
         "served_target": "frontier-large", "served_model": "gpt-4o", "shadow": True,
         "quality": {"judge_score": 8, "judge": "gpt4-1to10"}},
    ])
    assert [a.status for a in acks] == ["stored", "stored"]
    got = log.decision(decision.decision_id)
    assert (got.target, got.rule, got.tenant, got.time_s) == (decision.target, decision.rule, "acme", 1000.0)
    assert got.p_hard == pytest.approx(decision.p_hard) and got.estimator_version == bundled.version
    np.testing.assert_array_equal(got.head_input, rec.head_input)
    # The stored vector is the head's input: the logged p_hard comes back from it.
    assert float(bundled.predict_matrix(got.head_input[None, :])[0]) == pytest.approx(decision.p_hard, abs=1e-6)
    assert set(got.request_features) == set(FEATURE_FIELDS) and got.prompt_text is None
    assert len(got.prompt_sha256) == 64 and len(got.conversation_key) == 16
    first, shadow = got.outcomes
    assert first.served_target == decision.target and first.usage.cached_tokens == 8
    assert first.quality.user_rating == 1.0 and first.ttft_ms == 120.0
    assert shadow.shadow and shadow.served_target == "frontier-large" and shadow.quality.judge_score == 8.0
    assert log.counts() == {"decisions": 1, "outcomes": 2}


def test_the_estimate_carries_the_head_input(bundled):
    features = extract_features(request_from_prompt("Explain the CAP theorem."), bundled.tokenizer)
    est = bundled.estimate(features)
    np.testing.assert_array_equal(est.features, bundled.feature_vector(features)[0])
    assert float(bundled.predict_matrix(est.features[None, :])[0]) == pytest.approx(est.p_hard, abs=1e-6)


def test_prompt_text_only_when_the_operator_opts_in(tmp_path, fleet_policy):
    est = FixedDifficulty(0.3)
    for store, want in ((False, None), (True, "What is 2+2?")):
        log = OutcomeLog(tmp_path / f"log-{store}.db", store_prompts=store)
        decision, request = decide(fleet_policy, est, "What is 2+2?")
        rec = record_decision(log, decision, request, est)
        assert rec.head_input is None and rec.feature_space is None  # a fixed estimator has no head input
        got = log.decision(decision.decision_id)
        assert got.prompt_text == want
        assert got.features().query_text == (want or "") and got.features().prompt_tokens == rec.request_features["prompt_tokens"]
        raw = b"".join(p.read_bytes() for p in tmp_path.glob(f"log-{store}.db*"))  # the file and its WAL
        assert (b"What is 2+2?" in raw) is store


def test_outcomes_are_idempotent_per_outcome_id(tmp_path, fleet_policy):
    log = OutcomeLog(tmp_path / "log.db")
    decision, request = decide(fleet_policy, FixedDifficulty(0.5), "hello")
    record_decision(log, decision, request, FixedDifficulty(0.5))
    d = decision.decision_id
    one = {"decision_id": d, "quality": {"regenerated": True}}
    assert [a.status for a in log.append_outcomes([one])] == ["stored"]
    acks = log.append_outcomes([one, {"decision_id": d, "quality": {"regenerated": False}},
                                {"decision_id": "0" * 32}, {"decision_id": d, "outcome_id": "x1"},
                                {"decision_id": d, "outcome_id": "x1"}])
    assert [a.status for a in acks] == ["duplicate", "conflict", "unknown_decision", "stored", "duplicate"]
    assert "different content" in acks[1].message and "no decision" in acks[2].message
    assert [a.ok for a in acks] == [True, False, False, True, True]
    assert log.outcome(d).quality.regenerated is True
    assert log.counts()["outcomes"] == 2
    assert log.append_decision(DecisionRecord.from_decision(decision, request, extract_features(request))) is False


def test_joined_filters_by_time_and_outcomes(tmp_path, fleet_policy):
    log = OutcomeLog(tmp_path / "log.db")
    est = FixedDifficulty(0.5)
    ids = []
    for t in (10.0, 20.0, 30.0):
        decision, request = decide(fleet_policy, est, f"prompt at {t}")
        record_decision(log, decision, request, est, time_s=t)
        ids.append(decision.decision_id)
    log.append_outcomes([{"decision_id": ids[1]}])
    assert [d.time_s for d in log.joined()] == [10.0, 20.0, 30.0]
    assert [d.time_s for d in log.joined(since_s=15, until_s=30)] == [20.0]
    assert [d.decision_id for d in log.joined(with_outcomes_only=True)] == [ids[1]]
    assert [d.time_s for d in log.joined(batch=1)] == [10.0, 20.0, 30.0]
    assert list(log.p_hard_window(since_s=15)) == [0.5, 0.5]


def test_default_path_is_under_the_data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("POINTSMAN_DATA_DIR", str(tmp_path / "d"))
    assert default_log_path() == tmp_path / "d" / "outcomes.db"
    with OutcomeLog() as log:
        assert log.path.is_file()


def test_unreadable_file_is_a_data_error(tmp_path):
    bad = tmp_path / "bad.db"
    bad.write_bytes(b"this is not a database" * 100)
    with pytest.raises(DataError, match="cannot open the outcome log"):
        OutcomeLog(bad)
    log = OutcomeLog(tmp_path / "ok.db")
    log.close()
    with pytest.raises(DataError, match="closed"):
        log.append_outcomes([{"decision_id": "abc"}])


@pytest.mark.parametrize("body,field,message", [
    ([], None, "the outcome list is empty"),
    ({"decision_id": "a", "usage": {"prompt_tokens": -1}}, "usage.prompt_tokens", "greater than or equal to 0"),
    ([{"decision_id": "a"}, {"decision_id": "b", "ttft_ms": "fast"}], "[1].ttft_ms", "valid number"),
    ({"decision_id": "a", "quality": {"user_rating": 5}}, "quality.user_rating", "less than or equal to 1"),
    ({"decision_id": "a", "quality": {"judge_score": float("nan")}}, "quality.judge_score", "finite number"),
    ({"decision_id": "a", "qualty": {}}, "qualty", "unknown field"),
    ({"decision_id": "a b"}, "decision_id", "letters, digits"),
    ({}, "decision_id", "Field required"),
    ({"decision_id": "a", "status": "exploded"}, "status", "'ok', 'error', 'timeout' or 'cancelled'"),
    ({"decision_id": "a", "usage": {"prompt_tokens": 5, "cached_tokens": 6}}, "usage.cached_tokens", "exceeds prompt_tokens"),
    ([{"decision_id": "a"}, 7], "[1]", "expected a JSON object"),
    ({"decision_id": "a", "usage": {"completion_tokens": 2**63}}, "usage.completion_tokens", "less than or equal to"),
    ({"decision_id": "a", "usage": {"cached_tokens": MAX_TOKENS + 1}}, "usage.cached_tokens", "less than or equal"),
    ({"decision_id": "a", "tpot_ms": 1e300}, "tpot_ms", "less than or equal to"),
    ({"decision_id": "a", "time_s": 1e300}, "time_s", "less than or equal to"),
    ({"decision_id": "a", "quality": {"judge_reference_score": 1e300}}, "quality.judge_reference_score",
     "less than or equal to"),
])
def test_bad_outcomes_name_the_field(body, field, message):
    with pytest.raises(RequestError) as err:
        parse_outcomes(body)
    assert err.value.field == field
    assert message in err.value.message


def test_batch_limit_and_openai_usage():
    with pytest.raises(RequestError, match=f"limit is {MAX_BATCH}"):
        parse_outcomes([{"decision_id": "a"}] * (MAX_BATCH + 1))
    (o,) = parse_outcomes({"decision_id": "a", "usage": {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12}})
    assert isinstance(o, OutcomeIn) and o.key == "a" and o.usage.cached_tokens is None


def test_outcome_items_are_validated_one_by_one():
    items = parse_outcome_items([{"decision_id": "a", "usage": {"prompt_tokens": MAX_TOKENS, "completion_tokens": 0}},
                                 {"decision_id": "b", "status": "bogus", "ttft_ms": -1},
                                 {"outcome_id": "o-1"}])
    assert isinstance(items[0], OutcomeIn) and items[0].status == "ok"  # no status: ok
    bad = items[1]
    assert isinstance(bad, OutcomeItemError) and bad.field == "[1].status" and bad.decision_id == "b"
    assert [f for f, _ in bad.problems] == ["[1].status", "[1].ttft_ms"]
    assert bad.describe().startswith("[1].status: Input should be 'ok'") and "; [1].ttft_ms: " in bad.describe()
    assert isinstance(items[2], OutcomeItemError) and items[2].describe() == "[2].decision_id: Field required"
    assert items[2].decision_id is None and items[2].outcome_id == "o-1"
    with pytest.raises(RequestError, match="expected a JSON object") as err:
        parse_outcome_items([{"decision_id": "a"}, "x"])
    assert err.value.field == "[1]"
    with pytest.raises(OutcomeItemError):  # all or nothing
        parse_outcomes([{"decision_id": "a"}, {"decision_id": "b", "status": "bogus"}])


@pytest.mark.parametrize("usage,field", [
    (Usage(prompt_tokens=1000, completion_tokens=100), None),
    (Usage(prompt_tokens=1000, completion_tokens=100, cached_tokens=1000), None),
    (Usage(prompt_tokens=1100), None),  # window x 1.1 exactly: tokenizers differ
    (Usage(prompt_tokens=1101), "[2].usage.prompt_tokens"),
    (Usage(completion_tokens=5000), "[2].usage.completion_tokens"),
    (Usage(prompt_tokens=600, completion_tokens=600), "[2].usage"),
    (None, None),
])
def test_usage_must_fit_the_context_window(usage, field):
    err = check_usage_fits(usage, 1000, "small", "[2]")
    assert (err.field if err else None) == field
    if err:
        assert "'small'" in err.message and "1,000 tokens" in err.message and err.describe().startswith(field)
