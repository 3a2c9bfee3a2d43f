"""The decision trace's notes say what happened (over HTTP, ``routing.explain``)."""

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
