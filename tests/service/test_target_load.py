"""`load[target]` through POST /v1/route: the target's endpoints' readings, as docs/policy-signals.md
reads them, whichever endpoints Pointsman dispatched to."""

from pathlib import Path

from fastapi.testclient import TestClient

from pointsman.service.app import create_app

POLICY = """\
apiVersion: pointsman/v1
kind: RoutingPolicy
rules:
  - name: force
    when: request.tenant == "force"
    route: {target: onprem-8b}
  - name: overflow
    when: load["onprem-8b"].outstanding_requests > 8
    route: {target: frontier-small}
  - name: default
    route: {target: onprem-8b}
"""


def _route(c: TestClient, tenant: str | None = None) -> dict:
    body: dict = {"messages": [{"role": "user", "content": "hi"}], "routing": {"explain": True}}
    if tenant:
        body["routing"]["tenant"] = tenant
    r = c.post("/v1/route", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def test_outstanding_requests_keeps_a_reported_queue_when_another_endpoint_gets_a_request(tmp_path: Path, monkeypatch):
    """llama-8b-0 reports 3 running + 10 waiting: `load["onprem-8b"].outstanding_requests` read 13 and the
    overflow rule fired. One request dispatched to llama-8b-1 (no telemetry, 1 in flight) made the target's
    running/waiting sums null, and outstanding fell back to the in-flight count alone: 1, so the rule
    stopped firing while the target held one request more. Now it is the sum of each endpoint's own
    outstanding requests (running + waiting where reported, else in flight): 14."""
    (tmp_path / "p.yaml").write_text(POLICY)
    monkeypatch.setenv("POINTSMAN_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("POINTSMAN_POLICY_PATH", str(tmp_path / "p.yaml"))
    with TestClient(create_app()) as c:
        load = {"num_requests_running": 3, "num_requests_waiting": 10}
        assert c.post("/v1/telemetry", json={"endpoint": "llama-8b-0", "load": load}).status_code == 200
        before = _route(c)
        assert before["rule"] == "overflow"
        assert before["trace"]["signals"]['load["onprem-8b"].outstanding_requests']["value"] == 13
        forced = _route(c, "force")
        assert forced["base_url"] == "http://llama-8b-1.inference.internal:8000/v1"
        after = _route(c)
    assert after["trace"]["signals"]['load["onprem-8b"].outstanding_requests']["value"] == 14
    assert after["rule"] == "overflow"


def test_a_stale_reading_keeps_its_age(tmp_path: Path):
    """Under `signals.load.on_stale: unknown` (the default) a reading older than `max_age_s` turns into
    in-flight accounting, and `load[target].age_s` (with the trace's `age_s` of every load signal) read 0,
    "current", beside `stale: true`: a rule `age_s > 30` meant to leave a target whose telemetry died never
    fired. The stale reading's age is kept."""
    from pointsman.estimator.estimate import FixedDifficulty
    from pointsman.policy.engine import RoutingEngine
    from pointsman.policy.fleet import load_fleet
    from pointsman.policy.rules.compiler import load_policy
    from pointsman.service.bootstrap import build_state
    from pointsman.service.settings import Settings

    (tmp_path / "p.yaml").write_text(
        "apiVersion: pointsman/v1\nkind: RoutingPolicy\nrules:\n"
        "  - name: telemetry-dead\n    when: load[\"onprem-8b\"].age_s > 30.0 && load[\"onprem-8b\"].stale\n"
        "    route: {target: frontier-small}\n"
        "  - name: default\n    route: {target: onprem-8b}\n")
    fleet = load_fleet()
    settings = Settings(data_dir=tmp_path, policy_path=tmp_path / "p.yaml", watch_policy=False)
    state = build_state(settings, fleet)
    clock = [1000.0]
    state.monotonic = lambda: clock[0]
    engine = RoutingEngine(fleet, load_policy(tmp_path / "p.yaml", fleet), FixedDifficulty(0.2), state=state)
    with TestClient(create_app(settings, engine=engine, owns_engine=True)) as c:
        for ep in ("llama-8b-0", "llama-8b-1"):
            load = {"num_requests_running": 1, "num_requests_waiting": 0}
            assert c.post("/v1/telemetry", json={"endpoint": ep, "load": load}).status_code == 200
        fresh = _route(c)
        clock[0] += 60.0
        stale = _route(c)
    assert fresh["rule"] == "default"
    assert fresh["trace"]["signals"]['load["onprem-8b"].age_s']["value"] == 0.0
    signals = stale["trace"]["signals"]
    assert signals['load["onprem-8b"].stale']["value"] is True
    assert signals['load["onprem-8b"].age_s']["value"] == 60.0
    assert signals['load["onprem-8b"].age_s']["age_s"] == 60.0
    assert stale["rule"] == "telemetry-dead"


def test_a_queue_sum_does_not_turn_unknown_when_a_request_goes_to_an_endpoint_without_telemetry(tmp_path: Path,
                                                                                              monkeypatch):
    """`load[target].num_requests_waiting` sums the endpoints that report a queue. With telemetry from
    llama-8b-0 alone (10 waiting) it read 10, and a rule `num_requests_waiting > 8` fired, until Pointsman sent
    one request to llama-8b-1: from then on the sum read null (that endpoint's in-flight accounting has no
    queue) and the rule errored, skipped, with one request more on the target. An endpoint without telemetry
    now adds its requests in flight, which no engine has reported, to the queue (the merge rule's pending
    dispatches): 11. A target no endpoint of which reports still reads null."""
    (tmp_path / "p.yaml").write_text(POLICY.replace("outstanding_requests > 8", "num_requests_waiting > 8"))
    monkeypatch.setenv("POINTSMAN_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("POINTSMAN_POLICY_PATH", str(tmp_path / "p.yaml"))
    key = 'load["onprem-8b"].num_requests_waiting'
    with TestClient(create_app()) as c:
        cold = _route(c)
        assert cold["base_url"] == "http://llama-8b-0.inference.internal:8000/v1"
        load = {"num_requests_running": 3, "num_requests_waiting": 10}
        assert c.post("/v1/telemetry", json={"endpoint": "llama-8b-0", "load": load}).status_code == 200
        before = _route(c)
        assert _route(c, "force")["base_url"] == "http://llama-8b-1.inference.internal:8000/v1"
        after = _route(c)
    assert (cold["trace"]["signals"][key]["value"], cold["rule"]) == (None, "default")
    assert [d["trace"]["signals"][key]["value"] for d in (before, after)] == [10, 11]
    assert [d["rule"] for d in (before, after)] == ["overflow", "overflow"]
