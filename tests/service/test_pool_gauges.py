"""``pointsman_pool_*_utilization`` is the utilization decisions price at: the mean over the pool's healthy
endpoints' readings as the policy reads them (``live.LiveSignals``: ``mean_reading`` of the readings with its
staleness applied). Before, the gauge averaged every endpoint's raw reading: an endpoint marked unhealthy, which
routing and pricing leave out, still moved it (0.55 on /metrics while decisions priced the pool at 0.2)."""

from fastapi.testclient import TestClient

from pointsman.estimator.estimate import FixedDifficulty
from pointsman.policy.engine import RoutingEngine
from pointsman.policy.fleet import load_fleet
from pointsman.policy.rules.compiler import STATIC_POLICY_PATH, load_policy
from pointsman.service.app import create_app
from pointsman.service.bootstrap import build_state
from pointsman.service.settings import Settings

GAUGE = 'pointsman_pool_prefill_utilization{pool="aggregated",target="onprem-8b"}'


def test_the_pool_gauge_is_the_utilization_decisions_price_at(tmp_path):
    fleet = load_fleet()
    settings = Settings(data_dir=tmp_path, watch_policy=False, watch_fleet=False, scrape_interval_s=0)
    engine = RoutingEngine(fleet, load_policy(STATIC_POLICY_PATH, fleet), FixedDifficulty(0.1),
                           state=build_state(settings, fleet))
    with TestClient(create_app(settings, engine=engine, owns_engine=True)) as c:
        r = c.post("/v1/telemetry", json=[
            {"endpoint": "llama-8b-0", "load": {"prefill_utilization": 0.9}, "healthy": False, "reason": "draining"},
            {"endpoint": "llama-8b-1", "load": {"prefill_utilization": 0.2}}])
        assert r.status_code == 200, r.text
        d = c.post("/v1/route", json={"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 20,
                                      "routing": {"explain": True}}).json()
        metrics = c.get("/metrics").text
    assert (d["target"], d["endpoints"][0]["name"]) == ("onprem-8b", "llama-8b-1")
    assert d["trace"]["cost"]["prefill_utilization"] == 0.2
    assert f"{GAUGE} 0.2\n" in metrics


def test_inflight_is_zero_not_absent_when_nothing_is_in_flight(tmp_path):
    """``pointsman_inflight_requests`` had no series for an endpoint with nothing in flight (and none at all on an
    idle service), so a panel or alert on it read "no data". Every endpoint of the fleet is exported: 0 before any
    request, 1 on the endpoint a decision went to, 0 again once its outcome settles."""
    fleet = load_fleet()
    settings = Settings(data_dir=tmp_path, watch_policy=False, watch_fleet=False, scrape_interval_s=0)
    engine = RoutingEngine(fleet, load_policy(STATIC_POLICY_PATH, fleet), FixedDifficulty(0.1),
                           state=build_state(settings, fleet))

    def inflight(metrics: str) -> dict[str, float]:
        return {line.split('endpoint="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
                for line in metrics.splitlines() if line.startswith("pointsman_inflight_requests{")}

    with TestClient(create_app(settings, engine=engine, owns_engine=True)) as c:
        idle = inflight(c.get("/metrics").text)
        d = c.post("/v1/route", json={"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 20}).json()
        busy = inflight(c.get("/metrics").text)
        r = c.post("/v1/outcomes", json={"decision_id": d["decision_id"], "usage": {"prompt_tokens": 5,
                                                                                     "completion_tokens": 3}})
        assert r.status_code == 200, r.text
        settled = inflight(c.get("/metrics").text)
    names = {e.name or eid for eid, e in fleet.endpoints.items()}
    assert idle == settled == dict.fromkeys(names, 0.0)
    assert busy == {**idle, d["endpoints"][0]["name"]: 1.0}
