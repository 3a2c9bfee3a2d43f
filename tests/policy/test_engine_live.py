"""The engine on live state: load, cache, health and budget signals change decisions; dispatch
reserves and counts; traces show every signal with its age and stay valid JSON."""

import json
from datetime import UTC, datetime

import pytest

from pointsman.estimator.estimate import FixedDifficulty
from pointsman.policy.budget.config import BudgetConfig
from pointsman.policy.budget.ledger import LedgerUnavailable
from pointsman.policy.budget.sqlite_ledger import SqliteLedger
from pointsman.policy.engine import RoutingEngine
from pointsman.policy.fleet import load_fleet
from pointsman.policy.rules.compiler import STATIC_POLICY_PATH, compile_policy, load_policy
from pointsman.policy.selection.filters import NoEligibleTarget
from pointsman.policy.signals.fleet_state import FleetState
from pointsman.request import parse_route_request

NOW = datetime(2025, 3, 14, 12, tzinfo=UTC).timestamp()
HEAD = "apiVersion: pointsman/v1\nkind: RoutingPolicy\n"


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture(scope="module")
def fleet():
    return load_fleet()


def make(fleet, policy_text=None, p_hard=0.1, ledger=None, **kw):
    policy = load_policy(STATIC_POLICY_PATH, fleet) if policy_text is None else compile_policy(HEAD + policy_text, fleet)
    clock = Clock()
    state = FleetState(fleet, ledger, clock=lambda: NOW, monotonic=clock, **kw)
    return RoutingEngine(fleet, policy, FixedDifficulty(p_hard), state=state), clock


def req(text="hello", tokens=None, **routing):
    body = {"messages": [{"role": "user", "content": text}], "routing": routing}
    if tokens is not None:
        body["routing"]["prompt_tokens"] = tokens
    return parse_route_request(body)


OVERFLOW = """\
rules:
  - name: overflow
    when: load["onprem-70b"].num_requests_waiting > 32
    route: {target: frontier-small}
  - name: default
    route: {target: onprem-70b, mode: aggregated}
"""


def test_pushed_load_trips_a_rule_and_its_age_is_traced(fleet):
    engine, clock = make(fleet, OVERFLOW)
    d = engine.route(req())
    # no telemetry: the engine fields are null, the rule errors and is skipped, named
    assert d.rule == "default" and d.trace["rules"][0]["error"].startswith("no such overload")
    for ep in ("llama-70b-0", "llama-70b-1"):
        engine.state.push_load(ep, {"num_requests_running": 10, "num_requests_waiting": 20}, now=clock.t)
    clock.t += 2.5
    d = engine.route(req())
    assert (d.target, d.rule) == ("frontier-small", "overflow")
    # 40 waiting; our first decision was dispatched before the snapshot was taken, so it is in them
    assert d.trace["signals"]['load["onprem-70b"].num_requests_waiting'] == {"value": 40, "age_s": 2.5}


def test_stale_load_follows_the_policy(fleet):
    unknown, clock = make(fleet, OVERFLOW)
    saturated, clock2 = make(fleet, OVERFLOW.replace("rules:", "signals: {load: {max_age_s: 5, on_stale: saturated}}\nrules:"))
    for engine, c in ((unknown, clock), (saturated, clock2)):
        for ep in ("llama-70b-0", "llama-70b-1"):
            engine.state.push_load(ep, {"num_requests_running": 1, "num_requests_waiting": 0}, now=c.t)
        c.t += 30
    assert unknown.route(req()).rule == "default"  # stale = unknown: the rule errors and is skipped
    assert saturated.route(req()).rule == "overflow"  # stale = saturated: the pool reads full


def test_a_session_returns_to_the_endpoint_holding_its_prefix(fleet):
    engine, _ = make(fleet)
    history = [{"role": "user", "content": "Summarize this report. " + "lorem ipsum dolor sit amet " * 600}]
    first = engine.route(parse_route_request({"messages": history, "routing": {"session_id": "s1"}}))
    assert (first.rule, first.mode) == ("long-cold-prompt", "disaggregated")
    decode = next(e for e in first.endpoints if e.role == "decode")
    engine.state.settle(first.decision_id, prompt_tokens=first.prompt_tokens, completion_tokens=200)
    turn2 = history + [{"role": "assistant", "content": "It says..."}, {"role": "user", "content": "Shorter please."}]
    second = engine.route(parse_route_request({"messages": turn2, "routing": {"session_id": "s1", "explain": True}}))
    # the prefix is cached on the decode endpoint: stay there, aggregated (local prefill)
    assert (second.rule, second.mode, second.endpoints[0].url) == ("long-warm-prompt", "aggregated", decode.url)
    assert second.trace["signals"]["cache.prefix_hit_ratio [onprem-70b]"]["value"] >= 0.8
    assert second.trace["mode"]["note"] == "prefilled locally on a decode endpoint holding the prefix"
    assert second.trace["cost"]["cached_prompt_tokens"] > 0.8 * second.prompt_tokens


def test_unhealthy_pools_switch_mode_or_target(fleet):
    engine, _ = make(fleet)
    for e in ("llama-70b-prefill-0", "llama-70b-prefill-1"):  # no prefill endpoint: the P/D guard trips
        engine.state.set_health(e, False, "down")
    d = engine.route(req(tokens=4000))
    assert (d.target, d.mode, d.rule) == ("onprem-70b", "aggregated", "long-cold-prompt")
    assert d.trace["mode"]["reason"] == "stay aggregated: the prefill/decode pools have 8 healthy GPUs < min_pool_gpus 12"
    engine = engine.with_policy(compile_policy(STATIC_POLICY_PATH.read_text() + "\ndisaggregation: {min_pool_gpus: 0}\n",
                                               fleet))
    d = engine.route(req(tokens=4000))
    assert d.trace["mode"]["reason"] == "stay aggregated: the prefill pool is saturated"
    engine, _ = make(fleet)
    engine = engine.with_policy(compile_policy(STATIC_POLICY_PATH.read_text() + "\ndisaggregation: {min_pool_gpus: 0}\n",
                                               fleet))
    for i in range(4):  # no decode endpoint (and no small-pool guard): placement moves to the target's other mode
        engine.state.set_health(f"llama-70b-decode-{i}", False, "down")
    d = engine.route(req(tokens=4000))
    assert (d.target, d.mode, d.rule) == ("onprem-70b", "aggregated", "long-cold-prompt")
    assert d.trace["mode"]["note"] == "no healthy endpoint for disaggregated; ran aggregated"
    assert {e.role for e in d.endpoints} == {"aggregated"}
    for e in ("llama-8b-0", "llama-8b-1"):
        engine.state.set_health(e, False, "down")
    d = engine.route(req(tokens=30))
    assert (d.target, d.rule) == ("onprem-70b", "default")  # the default rule's first fallback
    assert {c["target"]: c["excluded_by"] for c in d.trace["candidates"]}["onprem-8b"] == "health: no healthy endpoint"


def test_tenant_allow_list(fleet):
    text = """\
filters: {tenants: {frontier-large: [acme]}}
rules:
  - name: hard
    when: difficulty.p_hard > 0.5
    route: {target: frontier-large, fallbacks: [frontier-small]}
  - name: default
    route: {target: onprem-8b}
"""
    engine, _ = make(fleet, text, p_hard=0.9)
    assert engine.route(req(tenant="acme")).target == "frontier-large"
    d = engine.route(req(tenant="globex"))
    assert d.target == "frontier-small" and "not on its allow-list" in d.trace["rules"][0]["note"]


def test_budget_refusals_move_to_cheaper_targets_then_fail_clearly(fleet, tmp_path):
    text = """\
filters: {budget: false}   # only the reservation guards the budget here
rules:
  - name: hard
    when: difficulty.p_hard > 0.5
    route: {target: frontier-large, fallbacks: [onprem-70b]}
  - name: default
    route: {target: onprem-8b}
"""
    config = BudgetConfig.from_dict({"budgets": [{"scope": "tenant:acme", "window": "day", "limit_usd": 0.004}]})
    engine, _ = make(fleet, text, p_hard=0.9, ledger=SqliteLedger(tmp_path / "b.db", config))
    first = engine.route(req(tokens=1000, tenant="acme"))  # gpt-4o: 1000 in + 256 out = $0.00506 > $0.004
    assert first.target == "onprem-70b" and first.trace["budget"]["refusals"]["frontier-large"].startswith("budget:")
    spent = 0.0
    with pytest.raises(NoEligibleTarget, match=r"no eligible target: frontier-large \(budget: .*onprem-70b \(budget: "):
        for _ in range(1000):
            spent += engine.route(req(tokens=1000, tenant="acme")).estimated_cost_usd
    assert first.estimated_cost_usd + spent <= 0.004
    assert engine.route(req(tokens=1000, tenant="other")).target == "frontier-large"  # other tenants unaffected


def test_a_zero_budget_means_zero_and_unlimited_traces_are_valid_json(fleet, tmp_path):
    text = """\
rules:
  - name: rich
    when: budget.remaining_usd > cost("frontier-large")
    route: {target: frontier-large}
  - name: default
    route: {target: onprem-8b}
"""
    config = BudgetConfig.from_dict({"budgets": [{"scope": "team:free", "window": "month", "limit_usd": 0}]})
    engine, _ = make(fleet, text, ledger=SqliteLedger(tmp_path / "b.db", config))
    with pytest.raises(NoEligibleTarget) as info:
        engine.route(req(team="free"))
    assert {e.filter for e in info.value.exclusions.values()} == {"budget"}
    d = engine.route(req(explain=True))  # no budget: unlimited
    assert d.target == "frontier-large"
    body = json.dumps(d.to_dict(), allow_nan=False)
    assert json.loads(body)["trace"]["signals"]["budget.remaining_usd"] == {"value": None, "age_s": 0.0}


def test_dispatch_false_changes_nothing(fleet, tmp_path):
    config = BudgetConfig.from_dict({"budgets": [{"scope": "tenant:acme", "window": "day", "limit_usd": 1.0}]})
    engine, clock = make(fleet, ledger=SqliteLedger(tmp_path / "b.db", config))
    d = engine.route(req(tenant="acme"), dispatch=False)
    assert engine.state.record(d.decision_id) is None and d.trace["budget"]["reserved_usd"] is None
    assert engine.state.ledger.snapshot(["tenant:acme"], NOW).binding.spent_usd == 0.0
    assert engine.state.board.get_many(engine.state.fleet.endpoints, clock.t) == {}
    d = engine.route(req(tenant="acme"))
    assert engine.state.record(d.decision_id).scopes == ("tenant:acme",)
    assert engine.state.ledger.snapshot(["tenant:acme"], NOW).binding.spent_usd == pytest.approx(
        d.estimated_cost_usd, abs=1e-9)


class DownLedger:
    """A ledger whose backend is unreachable."""

    config = BudgetConfig.from_dict({"budgets": [{"scope": "tenant:acme", "window": "day", "limit_usd": 1.0}]})

    def snapshot(self, scopes, now=None):
        raise LedgerUnavailable("redis: connection refused")

    def reserve(self, *a, **k):
        raise LedgerUnavailable("redis: connection refused")


def test_an_unavailable_ledger_fails_closed_unless_told_otherwise(fleet):
    closed, _ = make(fleet, ledger=DownLedger())
    with pytest.raises(LedgerUnavailable):
        closed.route(req(tenant="acme"))
    assert closed.route(req(tenant="other")).target == "onprem-8b"  # no budget: routed, spend not recorded
    open_, _ = make(fleet, ledger=DownLedger(), budget_fail_open=True)
    d = open_.route(req(tenant="acme"))
    assert d.target == "onprem-8b" and not open_.state.record(d.decision_id).reserved


def test_endpoint_signals_read_the_picked_endpoint(fleet):
    text = """\
rules:
  - name: busy
    when: endpoint.num_requests_waiting > 5
    route: {target: onprem-8b, fallbacks: [onprem-70b]}
  - name: default
    route: {target: onprem-8b}
"""
    engine, clock = make(fleet, text)
    engine.state.push_load("llama-8b-0", {"num_requests_running": 8, "num_requests_waiting": 9}, now=clock.t)
    engine.state.push_load("llama-8b-1", {"num_requests_running": 2, "num_requests_waiting": 1}, now=clock.t)
    clock.t += 1.0
    d = engine.route(req())
    assert d.rule == "default" and d.endpoints[0].name == "llama-8b-1"  # the picker's choice, not busy
    assert d.trace["signals"]["endpoint.num_requests_waiting [onprem-8b]"] == {"value": 1, "age_s": 1.0}


def test_a_decision_leaves_no_reference_cycle(fleet):
    """Every decision's signals, pool views and picks are freed when the decision is dropped, not left
    to the cyclic garbage collector (whose full passes scan whatever it has not freed yet): the default
    policy reads load, predictions, cache and endpoint signals for an easy prompt and a hard one."""
    import gc

    from pointsman.policy.rules.compiler import DEFAULT_POLICY_PATH

    state = FleetState(fleet, clock=lambda: NOW, monotonic=Clock())
    for p_hard in (0.1, 0.9):
        engine = RoutingEngine(fleet, load_policy(DEFAULT_POLICY_PATH, fleet), FixedDifficulty(p_hard), state=state)
        engine.route(req("warm up", session_id="s"))
        gc.collect()
        gc.disable()
        try:
            for i in range(20):
                decision = engine.route(req(f"question {i} " * (i + 1), session_id=f"s{i % 3}", tenant="t"))
                assert decision.trace["rules"]  # built from the decision's signals, then dropped with it
                del decision
            assert gc.collect() == 0
        finally:
            gc.enable()
