"""The declared signals (SIGNALS) and the snapshot builders agree, and the reference lists them."""

import math
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pointsman.estimator.estimate import DifficultyEstimate
from pointsman.estimator.features import extract_features
from pointsman.policy.budget.config import BudgetConfig
from pointsman.policy.budget.ledger import build_snapshot
from pointsman.policy.signals.load_board import EndpointLoad
from pointsman.policy.signals.namespaces import (
    SIGNALS,
    budget_signals,
    cache_signals,
    difficulty_signals,
    endpoint_signals,
    example_endpoint,
    example_signals,
    load_signals,
    reference_markdown,
    request_signals,
)
from pointsman.request import RequestView, parse_route_request

CEL_TYPES = {"int": int, "double": float, "bool": bool, "string": str}


def test_request_snapshot_matches_the_declaration():
    req = parse_route_request({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                               "routing": {"tenant": "acme"}})
    snap = request_signals(extract_features(req), RequestView.of(req), 256)
    assert set(snap) == set(SIGNALS["request"].fields)
    for name, value in snap.items():
        assert type(value) is CEL_TYPES[SIGNALS["request"].fields[name].type], name
    assert (snap["tenant"], snap["session_id"], snap["max_output_tokens"], snap["max_output_tokens_set"]) == ("acme", "", 256, False)


def test_difficulty_snapshot_matches_the_declaration():
    assert difficulty_signals(DifficultyEstimate(0.3, True, 1.0)) == {"p_hard": 0.3, "available": True}
    assert difficulty_signals(DifficultyEstimate(0.3, False, 1.0, "x")) == {"p_hard": None, "available": False}
    assert set(difficulty_signals(DifficultyEstimate(None, False, 0.0))) == set(SIGNALS["difficulty"].fields)


def test_example_snapshot_declares_every_field():
    ex = example_signals({"a": 1}, ["t1", "t2"])
    for name in ("request", "difficulty", "budget"):
        assert set(ex[name]) == set(SIGNALS[name].fields)
    assert set(ex["load"]) == {"t1", "t2"} and set(ex["load"]["t1"]) == set(SIGNALS["load"].fields)
    assert set(ex["_cache"]["t2"]) == set(SIGNALS["cache"].fields)
    assert set(example_endpoint()) == set(SIGNALS["endpoint"].fields)
    assert ex["variables"] == {"a": 1}


def test_builders_match_the_declarations():
    reading = EndpointLoad("e", "push", 10.0, num_requests_running=3, num_requests_waiting=1, kv_cache_usage=0.5)
    load = load_signals(reading, 12.5, endpoints=2, healthy_endpoints=1, prefill_queue_s=0.2)
    assert set(load) == set(SIGNALS["load"].fields)
    assert (load["outstanding_requests"], load["age_s"], load["healthy_endpoints"]) == (4, 2.5, 1)
    assert set(load_signals(None, 0.0, endpoints=1, healthy_endpoints=1)) == set(SIGNALS["load"].fields)
    ep = endpoint_signals(reading, 11.0, name="e", url="http://e/v1", healthy=True, prefix_hit_ratio=0.5, cost_s=0.1)
    assert set(ep) == set(SIGNALS["endpoint"].fields)
    assert set(cache_signals()) == set(SIGNALS["cache"].fields)


def test_budget_signals_unlimited_and_paced():
    now = datetime(2025, 3, 14, 18, tzinfo=UTC).timestamp()  # 75% of the UTC day elapsed
    free = budget_signals(None, now)
    assert set(free) == set(SIGNALS["budget"].fields)
    assert free["limited"] is False and free["remaining_usd"] == math.inf and free["pace_gap"] == 0.0
    assert free["window_elapsed_fraction"] == pytest.approx(0.75)
    config = BudgetConfig.from_dict({"budgets": [{"scope": "tenant:a", "window": "day", "limit_usd": 10.0},
                                                 {"scope": "tenant:a", "window": "month", "limit_usd": 0.0}]})
    snap = build_snapshot(config, ["tenant:a"], now, {("tenant:a", "day:2025-03-14"): (0, 9 * 10**9)})
    b = budget_signals(snap, now)  # the zero month budget binds: nothing remains
    assert (b["limited"], b["window"], b["remaining_usd"], b["spent_fraction"]) == (True, "month", 0.0, 1.0)
    config = BudgetConfig.from_dict({"budgets": [{"scope": "tenant:a", "window": "day", "limit_usd": 10.0}]})
    b = budget_signals(build_snapshot(config, ["tenant:a"], now, {("tenant:a", "day:2025-03-14"): (0, 9 * 10**9)}), now)
    assert b["spent_fraction"] == pytest.approx(0.9) and b["pace_gap"] == pytest.approx(0.15)
    assert b["remaining_usd"] == pytest.approx(1.0) and b["scope"] == "tenant:a"


def test_reference_lists_every_signal():
    text = reference_markdown()
    for ns in SIGNALS.values():
        prefix = f'{ns.name}["<target>"]' if ns.shape == "by_target" else ns.name
        for name in ns.fields or {}:
            assert f"`{prefix}.{name}`" in text
    assert "`cost(target: string) -> double`" in text


def test_the_committed_reference_page_is_the_generated_one():
    page = Path(__file__).parents[2] / "docs" / "policy-signals.md"
    assert page.read_text(encoding="utf-8") == reference_markdown(), (
        "docs/policy-signals.md is out of date: run `pointsman policy signals --output docs/policy-signals.md`")


@given(spent=st.lists(st.tuples(st.integers(0, 2 * 10**10), st.integers(0, 10**10)), min_size=4, max_size=4),
       limits=st.lists(st.one_of(st.none(), st.floats(0.0, 20.0)), min_size=4, max_size=4),
       now=st.floats(datetime(2025, 1, 1, tzinfo=UTC).timestamp(), datetime(2026, 12, 31, tzinfo=UTC).timestamp()))
def test_budget_signals_read_the_binding_budget_and_the_largest_fractions(spent, limits, now):
    """For any budgets of two scopes in both windows: remaining_usd, scope and window are the binding budget's
    (least USD left), and spent_fraction and pace_gap the largest over every limited budget (the safe side), each
    the value of one of them."""
    from pointsman.policy.budget.units import window_of

    scopes = ["tenant:a", "team:b"]
    keys = [(s, w) for s in scopes for w in ("day", "month")]
    config = BudgetConfig.from_dict({"budgets": [{"scope": s, "window": w, "limit_usd": lim}
                                                 for (s, w), lim in zip(keys, limits) if lim is not None]})
    counters = {(s, window_of(w, now).id): (held, settled) for (s, w), (held, settled) in zip(keys, spent)}
    snap = build_snapshot(config, scopes, now, counters)
    b = budget_signals(snap, now)
    limited = [x for x in snap.statuses if x.limit_usd is not None]
    assert b["limited"] == bool(limited)
    if not limited:
        return
    assert b["remaining_usd"] == min(x.remaining_usd for x in limited)
    assert (b["scope"], b["window"]) == (snap.binding.scope, snap.binding.window)

    def elapsed(x):
        w = window_of(x.window, now)
        return min(1.0, max(0.0, (now - w.start_s) / (w.end_s - w.start_s)))
    fractions = [x.spent_usd / x.limit_usd if x.limit_usd > 0 else 1.0 for x in limited]
    assert b["spent_fraction"] == max(fractions)
    assert b["pace_gap"] == max(f - elapsed(x) for f, x in zip(fractions, limited))
    assert b["pace_gap"] >= b["spent_fraction"] - 1.0
