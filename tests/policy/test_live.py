"""Signal sources: the lazy load[target] equals the eager aggregate; contexts hold only what the
policy reads; static sources follow the ledger's budget rule."""

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from pointsman.policy.fleet import load_fleet
from pointsman.policy.live import StaticSignals, TargetLoad, build_context, finite_or_none
from pointsman.policy.rules.compiler import compile_policy
from pointsman.policy.signals.load_board import EndpointLoad, aggregate_loads
from pointsman.policy.signals.namespaces import SIGNALS, example_signals, load_signals

FLEET = load_fleet()
maybe_int = st.one_of(st.none(), st.integers(0, 500))
maybe_frac = st.one_of(st.none(), st.floats(0, 1))
readings = st.lists(st.builds(
    EndpointLoad, endpoint=st.just("e"), source=st.sampled_from(["push", "scrape", "inflight"]),
    updated_at=st.floats(0, 100), num_requests_running=maybe_int, num_requests_waiting=maybe_int,
    kv_cache_usage=maybe_frac, ttft_p50_ms=st.one_of(st.none(), st.floats(0, 5000)), tpot_p50_ms=maybe_frac,
    prefill_utilization=maybe_frac, decode_utilization=maybe_frac, inflight_requests=st.integers(0, 50),
    stale=st.booleans(), saturated=st.booleans()), max_size=12)


@settings(max_examples=200, deadline=None)
@given(readings)
def test_lazy_target_load_equals_the_aggregate(loads):
    lazy = TargetLoad(loads, 120.0, 7, 5, lambda: (0.25, False))
    eager = load_signals(aggregate_loads("t", loads), 120.0, endpoints=7, healthy_endpoints=5,
                         prefill_queue_s=0.25, prefill_saturated=False)
    got = dict(lazy)
    assert set(got) == set(SIGNALS["load"].fields)
    for key, value in eager.items():
        if isinstance(value, float):
            assert math.isclose(got[key], value, rel_tol=1e-9, abs_tol=1e-12), key
        else:
            assert got[key] == value, key


def test_context_holds_only_what_the_policy_reads():
    policy = compile_policy("""\
apiVersion: pointsman/v1
kind: RoutingPolicy
variables: {x: 1, unused: 2}
rules:
  - name: a
    when: load["onprem-70b"].num_requests_waiting > variables.x && cache.prefix_hit_ratio > 0.5
    route: {target: onprem-8b}
  - name: default
    route: {target: onprem-8b}
""", FLEET)
    signals = example_signals(policy.variables, FLEET.targets)
    ctx = build_context(policy, signals, StaticSignals(FLEET, policy, signals))
    assert ctx == {"load": {"onprem-70b": {"num_requests_waiting": 0}}, "variables": {"x": 1},
                   "_cache": {"onprem-8b": {"prefix_hit_ratio": 0.0}}}


def test_static_budget_checks_follow_the_ledger_rule():
    policy = compile_policy("apiVersion: pointsman/v1\nkind: RoutingPolicy\nrules:\n"
                            "  - name: default\n    route: {target: onprem-8b}\n", FLEET)
    signals = example_signals({}, FLEET.targets)
    source = StaticSignals(FLEET, policy, signals)
    assert not source.budget_limited() and source.budget_fits(1e9) and source.budget_binding() is None
    signals["budget"].update(limited=True, remaining_usd=0.5)
    assert source.budget_fits(0.5) and not source.budget_fits(0.51)
    signals["budget"].update(remaining_usd=0.0)
    assert not source.budget_fits(0.0)  # an exhausted budget refuses even $0


def test_finite_or_none():
    assert finite_or_none({"a": math.inf, "b": [1.0, -math.inf, math.nan], "c": "x"}) == {
        "a": None, "b": [1.0, None, None], "c": "x"}
