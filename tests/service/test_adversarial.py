"""Findings of the adversarial pass (issue 14) through the real app and its SQLite ledger and
outcome log: each test failed before its fix."""

from __future__ import annotations

from fastapi.testclient import TestClient

from pointsman.estimator.estimate import FixedDifficulty
from pointsman.policy.engine import RoutingEngine
from pointsman.policy.fleet import load_fleet
from pointsman.policy.rules.compiler import DEFAULT_POLICY_PATH, load_policy
from pointsman.service.app import create_app
from pointsman.service.bootstrap import build_state
from pointsman.service.settings import Settings

USER = {"role": "user", "content": "What is the capital of France?"}


def _client(tmp_path, **kw) -> TestClient:
    fleet = load_fleet()
    settings = Settings(data_dir=tmp_path, watch_policy=False, watch_fleet=False, scrape_interval_s=0, **kw)
    engine = RoutingEngine(fleet, load_policy(DEFAULT_POLICY_PATH, fleet), FixedDifficulty(0.2),
                           state=build_state(settings, fleet))
    return TestClient(create_app(settings, engine=engine, owns_engine=True))


def test_an_unknown_served_target_is_422_and_the_hold_stays_settleable(tmp_path):
    """An outcome naming a target the fleet lacks was acknowledged 'stored' but could never settle:
    its decision's budget hold and in-flight load stayed taken, and the gateway's retry with the
    same id was a conflict or a duplicate that failed again."""
    with _client(tmp_path) as c:
        d = c.post("/v1/route", json={"messages": [USER], "routing": {"tenant": "acme"}}).json()
        state = c.app.state.fleet_state
        usage = {"prompt_tokens": 10, "completion_tokens": 30}
        r = c.post("/v1/outcomes", json={"decision_id": d["decision_id"], "served_target": "onprem-8c", "usage": usage})
        assert r.status_code == 422, r.text
        assert r.json()["error"]["param"] == "served_target"
        assert "did you mean 'onprem-8b'" in r.json()["error"]["message"]
        batch = c.post("/v1/outcomes", json=[{"decision_id": d["decision_id"], "served_target": "nope", "usage": usage}])
        assert batch.json()["acks"][0]["status"] == "invalid"
        assert "[0].served_target" in batch.json()["acks"][0]["message"]
        assert state.record(d["decision_id"]) is not None  # nothing settled, nothing stored
        ok = c.post("/v1/outcomes", json={"decision_id": d["decision_id"], "served_target": d["target"], "usage": usage})
        assert ok.status_code == 200 and ok.json()["acks"][0]["status"] == "stored"
        assert ok.json()["acks"][0]["settlement"]["replayed"] is False
        assert state.record(d["decision_id"]) is None
