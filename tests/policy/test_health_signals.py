"""An unhealthy endpoint feeds no signal: not load[...], not cache.*, not session affinity,
not the cached prefix a cost assumes; the trace names what was dropped and why."""

from __future__ import annotations

import json

import pytest

from pointsman.estimator.estimate import FixedDifficulty
from pointsman.policy.engine import RoutingEngine
from pointsman.policy.fleet import load_fleet
from pointsman.policy.rules.compiler import compile_policy
from pointsman.policy.signals.fleet_state import FleetState
from pointsman.request import parse_route_request

E0 = "http://llama-70b-0.inference.internal:8000/v1"
E1 = "http://llama-70b-1.inference.internal:8000/v1"
POLICY = """apiVersion: pointsman/v1
kind: RoutingPolicy
rules:
  - name: warm
    when: cache.prefix_hit_ratio >= 0.5
    route: {target: onprem-70b, mode: aggregated}
  - name: busy
    when: load["onprem-70b"].num_requests_waiting > 30
    route: {target: frontier-small}
  - name: default
    route: {target: onprem-70b, mode: aggregated}
"""
LONG = "The quarterly report covers revenue, costs and the outlook for each region. " * 40


@pytest.fixture
def engine():
    fleet = load_fleet()
    clock = {"t": 100.0}
    state = FleetState(fleet, monotonic=lambda: clock["t"])
    return RoutingEngine(fleet, compile_policy(POLICY, fleet), FixedDifficulty(0.2), state=state)


def route(engine, session=None):
    """Route the long prompt, then settle it (its outcome arrived: the endpoint is idle again)."""
    body = {"messages": [{"role": "user", "content": LONG}], "routing": {"explain": True}}
    if session:
        body["routing"]["session_id"] = session
    decision = engine.route(parse_route_request(body))
    engine.state.settle(decision.decision_id, prompt_tokens=decision.prompt_tokens, completion_tokens=10)
    return decision


def test_a_dead_replicas_cache_does_not_steer_the_warm_rule(engine):
    first = route(engine, session="s")                   # its prefix is now recorded on one endpoint
    holder = first.endpoints[0].url
    warm = route(engine)
    assert warm.rule == "warm" and warm.endpoints[0].url == holder  # a warm prompt, while the holder is healthy
    engine.state.set_health(holder, False, "connection refused")
    again = route(engine, session="s")
    assert again.rule == "default" and again.endpoints[0].url != holder
    trace = again.trace
    assert trace["dropped_endpoints"] == {holder: "connection refused"}
    assert trace["signals"]["cache.prefix_hit_ratio [onprem-70b]"]["value"] == 0.0
    assert json.loads(json.dumps(trace))["dropped_endpoints"]


def test_a_dead_replicas_queue_does_not_count_in_load(engine):
    engine.state.push_load(E0, {"num_requests_waiting": 40, "num_requests_running": 8})
    engine.state.push_load(E1, {"num_requests_waiting": 2, "num_requests_running": 8})
    assert route(engine).rule == "busy"
    engine.state.set_health(E0, False, "scrape failed 3x: timeout", source="scrape")
    decision = route(engine)
    assert decision.rule == "default" and decision.endpoints[0].url == E1
    assert decision.trace["signals"]['load["onprem-70b"].num_requests_waiting']["value"] == 2


def test_session_affinity_to_a_dead_endpoint_is_dropped(engine):
    first = route(engine, session="chat-1")
    engine.state.set_health(first.endpoints[0].url, False, "drained")
    decision = route(engine, session="chat-1")
    assert decision.endpoints[0].url != first.endpoints[0].url
    assert first.endpoints[0].url in decision.trace["dropped_endpoints"]
