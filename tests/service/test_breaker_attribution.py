"""The outcome breaker counts an outcome against the endpoint that served it, over HTTP.

A gateway that falls back from the decision's on-prem endpoint to another target reports the
outcome with ``served_target``: that outcome says nothing of the decision's endpoint. Before, every
such outcome was counted on it: five errors of the frontier fallback marked both healthy 8B
replicas unhealthy (``5 error outcomes in a row``) and moved the traffic to the 70B pool, and an
``ok`` of the fallback cleared the count of an on-prem endpoint whose own requests kept failing."""

from fastapi.testclient import TestClient

from pointsman.estimator.estimate import FixedDifficulty
from pointsman.policy.engine import RoutingEngine
from pointsman.policy.fleet import load_fleet
from pointsman.policy.rules.compiler import STATIC_POLICY_PATH, load_policy
from pointsman.service.app import create_app
from pointsman.service.bootstrap import build_state
from pointsman.service.settings import Settings


def _client(tmp_path) -> TestClient:
    fleet = load_fleet()
    settings = Settings(data_dir=tmp_path, watch_policy=False, watch_fleet=False, scrape_interval_s=0)
    engine = RoutingEngine(fleet, load_policy(STATIC_POLICY_PATH, fleet), FixedDifficulty(0.1),
                           state=build_state(settings, fleet))
    return TestClient(create_app(settings, engine=engine, owns_engine=True))


def _route(c: TestClient, i: int) -> dict:
    r = c.post("/v1/route", json={"messages": [{"role": "user", "content": f"Say hi, take {i}."}], "max_tokens": 20})
    assert r.status_code == 200, r.text
    return r.json()


def _outcome(c: TestClient, decision_id: str, status: str, served_target: str | None = None) -> None:
    body = {"decision_id": decision_id, "status": status}
    if served_target is not None:
        body["served_target"] = served_target
    r = c.post("/v1/outcomes", json=body)
    assert r.status_code == 200, r.text


def _health(c: TestClient) -> dict[str, bool]:
    endpoints = c.get("/readyz").json()["endpoints"]
    return {e["name"]: e["healthy"] for e in endpoints.values() if e["target"] == "onprem-8b"}


def test_a_fallback_targets_errors_do_not_trip_the_decisions_endpoint(tmp_path):
    with _client(tmp_path) as c:
        served = []
        for i in range(12):
            d = _route(c, i)
            served.append((d["target"], d["endpoints"][0]["name"]))
            _outcome(c, d["decision_id"], "error", served_target="frontier-small")
        assert _health(c) == {"llama-8b-0": True, "llama-8b-1": True}
    assert {t for t, _ in served} == {"onprem-8b"}  # the 8B replicas kept their traffic


def test_a_fallback_targets_ok_does_not_clear_the_decisions_endpoint(tmp_path):
    with _client(tmp_path) as c:
        errors = {"llama-8b-0": 0, "llama-8b-1": 0}

        def errors_up_to(n: int) -> None:  # one replica's own requests fail until each has failed n times
            for i in range(20):
                if min(errors.values()) >= n:
                    return
                d = _route(c, i)
                name = d["endpoints"][0]["name"]
                if errors[name] < n:
                    errors[name] += 1
                    _outcome(c, d["decision_id"], "error")
                else:  # says nothing about the endpoint
                    _outcome(c, d["decision_id"], "cancelled")
            raise AssertionError(f"errors {errors} after 20 decisions")

        errors_up_to(4)
        for i in range(2):  # the frontier fallback answers: nothing about the replicas
            _outcome(c, _route(c, 100 + i)["decision_id"], "ok", served_target="frontier-small")
        errors_up_to(5)  # the fifth error of each replica's own requests trips it
        assert _health(c) == {"llama-8b-0": False, "llama-8b-1": False}
