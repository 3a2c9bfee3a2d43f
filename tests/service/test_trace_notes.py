"""The decision trace's notes say what happened (over HTTP, ``routing.explain``)."""

import pytest
from fastapi.testclient import TestClient

from pointsman.estimator.estimate import FixedDifficulty
from pointsman.policy.engine import RoutingEngine
from pointsman.policy.fleet import load_fleet
from pointsman.policy.rules.compiler import DEFAULT_POLICY_PATH, load_policy
from pointsman.service.app import create_app
from pointsman.service.bootstrap import build_state
from pointsman.service.settings import Settings


def test_a_decode_endpoint_holding_nothing_is_not_said_to_hold_the_prefix(tmp_path):
    """Both aggregated 70B endpoints down: a short prompt prefills on a decode endpoint that holds none
    of it; the trace used to say "holding the prefix" (prefix_hit_ratio 0.0)."""
    fleet = load_fleet()
    settings = Settings(data_dir=tmp_path, watch_policy=False, watch_fleet=False, scrape_interval_s=0)
    engine = RoutingEngine(fleet, load_policy(DEFAULT_POLICY_PATH, fleet), FixedDifficulty(0.2),
                           state=build_state(settings, fleet))
    with TestClient(create_app(settings, engine=engine, owns_engine=True)) as c:
        r = c.post("/v1/telemetry", json=[{"endpoint": f"llama-70b-{i}", "healthy": False} for i in (0, 1)])
        assert r.status_code == 200, r.text
        r = c.post("/v1/route", json={"messages": [{"role": "user", "content": "Hi."}], "routing": {"explain": True}})
        assert r.status_code == 200, r.text
    d = r.json()
    assert (d["target"], d["mode"], d["endpoints"][0]["name"]) == ("onprem-70b", "aggregated", "llama-70b-decode-0")
    assert d["trace"]["mode"]["inputs"]["prefix_hit_ratio"] == 0.0
    assert d["trace"]["endpoints"][0]["candidates"][0]["local_hit_tokens"] == 0
    assert d["trace"]["mode"]["note"] == ("prefilled locally on a decode endpoint holding none of the prefix "
                                          "(no healthy aggregated endpoint)")


def _client(tmp_path, policy_path=DEFAULT_POLICY_PATH, p_hard=0.665):
    fleet = load_fleet()
    settings = Settings(data_dir=tmp_path, watch_policy=False, watch_fleet=False, scrape_interval_s=0)
    engine = RoutingEngine(fleet, load_policy(policy_path, fleet), FixedDifficulty(p_hard),
                           state=build_state(settings, fleet))
    return TestClient(create_app(settings, engine=engine, owns_engine=True))


def test_the_signals_show_the_cost_a_rule_read(tmp_path):
    """A hard prompt of 18,918 tokens on the default policy: hard-prompt does not match because
    cost("frontier-large") ($0.049855: 18,918 input tokens at $2.50/M, 256 output at $10/M) is over
    hard_prompt_max_usd ($0.04). The trace's signals used to list p_hard and the variables only, which
    read as a true condition; the cost it read is there now, as the trace's candidates price it."""
    with _client(tmp_path) as c:
        r = c.post("/v1/route", json={"messages": [{"role": "user", "content": "Prove it."}],
                                      "routing": {"prompt_tokens": 18918, "explain": True}})
        assert r.status_code == 200, r.text
        plain = c.post("/v1/route", json={"messages": [{"role": "user", "content": "Prove it."}],
                                          "routing": {"prompt_tokens": 18918}})
    trace = r.json()["trace"]
    assert trace["rules"][0] == {"rule": "hard-prompt", "result": "no-match"}
    signals = trace["signals"]
    assert signals["difficulty.p_hard"]["value"] == 0.665 >= signals["variables.p_hard_frontier"]["value"]
    large = next(c["estimated_cost_usd"] for c in trace["candidates"] if c["target"] == "frontier-large")
    assert signals['cost("frontier-large")'] == {"value": large, "age_s": 0.0}
    assert large == pytest.approx(0.049855) and large > signals["variables.hard_prompt_max_usd"]["value"] == 0.04
    assert plain.status_code == 200 and "trace" not in plain.json()


def test_the_signals_show_calls_cel_made_with_a_computed_argument(tmp_path):
    """Conditions outside the closures' subset run on CEL (a computed argument, ``in``): the calls they
    made are in the trace too, named by the argument CEL passed."""
    policy = tmp_path / "policy.yaml"
    policy.write_text("""apiVersion: pointsman/v1
kind: RoutingPolicy
variables: {tier: frontier-small, cap: 0.0}
rules:
  - name: tier-over-cap
    when: cost(variables.tier) < variables.cap
    route: {target: frontier-small}
  - name: listed
    when: cost("onprem-70b") in [0.5, 1.5]
    route: {target: onprem-70b}
  - name: default
    route: {target: onprem-8b}
""")
    fleet = load_fleet()
    assert all(r.fast is None for r in load_policy(policy, fleet).rules[:2])  # CEL decides them
    with _client(tmp_path, policy) as c:
        r = c.post("/v1/route", json={"messages": [{"role": "user", "content": "Hi."}], "routing": {"explain": True}})
        assert r.status_code == 200, r.text
    trace = r.json()["trace"]
    assert [x["result"] for x in trace["rules"]] == ["no-match", "no-match", "matched"]
    prices = {c["target"]: c["estimated_cost_usd"] for c in trace["candidates"]}
    assert trace["signals"]['cost("frontier-small")'] == {"value": prices["frontier-small"], "age_s": 0.0}
    assert trace["signals"]['cost("onprem-70b")'] == {"value": prices["onprem-70b"], "age_s": 0.0}
