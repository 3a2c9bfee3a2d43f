"""``served_endpoint`` and ``upstream_status`` on ``POST /v1/outcomes``: the outcome breaker counts an outcome on
the endpoint that served it, and an upstream client error (400, 404, 413, 422...) as that endpoint answering.

Before, an HTTP gateway could say neither: five ``error`` outcomes of malformed client requests (upstream 400)
marked a healthy replica unhealthy and it got no traffic, and errors of a request the gateway retried on another
replica of the target counted on the picked one."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st

from pointsman.estimator.estimate import FixedDifficulty
from pointsman.outcome import OutcomeIn
from pointsman.outcome_log.store import _payload_hash
from pointsman.policy.engine import RoutingEngine
from pointsman.policy.fleet import load_fleet
from pointsman.policy.rules.compiler import STATIC_POLICY_PATH, load_policy
from pointsman.service.app import create_app
from pointsman.service.bootstrap import build_state
from pointsman.service.settings import Settings

URL_1 = "http://llama-8b-1.inference.internal:8000/v1"
#: How a gateway may name llama-8b-1: the fleet id (URL), the name, Envoy's host:port, a base URL without /v1.
FORMS_1 = [URL_1, "llama-8b-1", "llama-8b-1.inference.internal:8000", "http://llama-8b-1.inference.internal:8000/"]


@pytest.fixture
def client(tmp_path):
    fleet = load_fleet()
    settings = Settings(data_dir=tmp_path, watch_policy=False, watch_fleet=False, scrape_interval_s=0)
    engine = RoutingEngine(fleet, load_policy(STATIC_POLICY_PATH, fleet), FixedDifficulty(0.1),
                           state=build_state(settings, fleet))
    with TestClient(create_app(settings, engine=engine, owns_engine=True)) as c:
        yield c


def _route(c: TestClient, i: int) -> dict:
    r = c.post("/v1/route", json={"messages": [{"role": "user", "content": f"Say hi, take {i}."}], "max_tokens": 20})
    assert r.status_code == 200, r.text
    return r.json()


def _health(c: TestClient) -> dict[str, bool]:
    endpoints = c.get("/readyz").json()["endpoints"]
    return {e["name"]: e["healthy"] for e in endpoints.values() if e["target"] == "onprem-8b"}


def test_client_errors_leave_the_replica_healthy(client):
    picked = []
    for i in range(6):
        d = _route(client, i)
        picked.append(d["endpoints"][0]["name"])
        r = client.post("/v1/outcomes", json={"decision_id": d["decision_id"], "status": "error", "upstream_status": 400,
                                              "served_endpoint": "llama-8b-1", "error": "HTTP 400: bad request"})
        assert r.status_code == 200, r.text
    assert _health(client) == {"llama-8b-0": True, "llama-8b-1": True}
    # 408 and 429 are the endpoint too slow or too busy: they count
    for i, status in enumerate([503, 429, 408, 500, 502]):
        d = _route(client, 10 + i)
        r = client.post("/v1/outcomes", json={"decision_id": d["decision_id"], "status": "error",
                                              "upstream_status": status, "served_endpoint": "llama-8b-1"})
        assert r.status_code == 200, r.text
    assert _health(client) == {"llama-8b-0": True, "llama-8b-1": False}


def test_errors_count_on_the_served_endpoint_not_the_picked_one(client):
    picked = []
    for i in range(5):  # the gateway retried each on llama-8b-1, whichever replica was picked; each form once
        d = _route(client, i)
        picked.append(d["endpoints"][0]["name"])
        r = client.post("/v1/outcomes", json={"decision_id": d["decision_id"], "status": "error",
                                              "upstream_status": 503, "served_endpoint": FORMS_1[i % len(FORMS_1)]})
        assert r.status_code == 200, r.text
    assert "llama-8b-0" in picked
    assert _health(client) == {"llama-8b-0": True, "llama-8b-1": False}


def test_an_ok_on_the_served_endpoint_clears_its_count_not_the_picked_ones(client):
    for i in range(4):
        d = _route(client, i)
        client.post("/v1/outcomes", json={"decision_id": d["decision_id"], "status": "error", "served_endpoint": URL_1})
    for i in range(3):  # answered by llama-8b-0 (a retry), whichever was picked
        d = _route(client, 10 + i)
        client.post("/v1/outcomes", json={"decision_id": d["decision_id"], "served_endpoint": "llama-8b-0"})
    d = _route(client, 20)
    client.post("/v1/outcomes", json={"decision_id": d["decision_id"], "status": "error", "served_endpoint": URL_1})
    assert _health(client) == {"llama-8b-0": True, "llama-8b-1": False}


@pytest.mark.parametrize("field, value, says", [
    ("served_endpoint", "", "at least 1 character"),
    ("served_endpoint", 3, "valid string"),
    ("upstream_status", 99, "greater than or equal to 100"),
    ("upstream_status", 600, "less than or equal to 599"),
    ("upstream_status", "503", "valid integer"),
    ("upstream_status", True, "valid integer"),
    ("upstream_status", 503.5, "valid integer"),
])
def test_bad_values_are_422s_naming_the_field_and_store_nothing(client, field, value, says):
    d = _route(client, 0)
    body = {"decision_id": d["decision_id"], "status": "error", "usage": {"prompt_tokens": 9, "completion_tokens": 0},
            field: value}
    r = client.post("/v1/outcomes", json=body)
    assert r.status_code == 422, r.text
    err = r.json()["error"]
    assert err["param"] == field and says in err["message"], err
    # nothing was stored: the gateway resends it without the field (or fixed), and the spend is booked
    del body[field]
    r = client.post("/v1/outcomes", json=body)
    assert r.status_code == 200 and r.json()["acks"][0]["status"] == "stored", r.text
    assert r.json()["acks"][0]["settlement"]["actual_cost_usd"] > 0  # booked, not released


@pytest.mark.parametrize("named, says", [
    ("llama-8b-7", "is no endpoint of target 'onprem-8b'"),
    ("http://llama-8b-1.inference.internal:9000/v1", "is no endpoint of target 'onprem-8b'"),
    ("llama-70b-0", "is an endpoint of target 'onprem-70b', not of target 'onprem-8b'"),
])
def test_an_unknown_endpoint_is_stored_as_sent_and_the_breaker_leaves_it_out(client, named, says):
    """An outcome whose ``served_endpoint`` the fleet does not know was a 422 with nothing stored: its spend and
    quality were lost unless the client resent it. It is stored (booked, its quality kept), the ack says the
    endpoint was not recognised, and the breaker counts it on no endpoint, not even the decision's."""
    for i in range(6):
        d = _route(client, i)
        r = client.post("/v1/outcomes", json={"decision_id": d["decision_id"], "status": "error", "upstream_status": 503,
                                              "usage": {"prompt_tokens": 9, "completion_tokens": 2},
                                              "quality": {"user_rating": 0.0}, "served_endpoint": named})
        assert r.status_code == 200, r.text
        ack = r.json()["acks"][0]
        assert ack["status"] == "stored" and ack["settlement"]["actual_cost_usd"] > 0, ack
        assert ack["message"].startswith("served_endpoint: not recognised, stored as sent; the outcome breaker does "
                                         f"not count this outcome on any endpoint. '{named}' {says}"), ack
        assert "llama-8b-0 (http://llama-8b-0.inference.internal:8000/v1)" in ack["message"]  # the valid ones listed
        stored = client.app.state.runtime.outcome_log.outcome(d["decision_id"])
        assert (stored.served_endpoint, stored.upstream_status, stored.quality.user_rating) == (named, 503, 0.0)
    assert all(e["healthy"] for e in client.get("/readyz").json()["endpoints"].values())
    r = client.post("/v1/outcomes", json={"decision_id": d["decision_id"], "status": "error", "upstream_status": 503,
                                          "usage": {"prompt_tokens": 9, "completion_tokens": 2},
                                          "quality": {"user_rating": 0.0}, "served_endpoint": named})
    assert r.json()["acks"][0]["status"] == "duplicate", r.text


@pytest.mark.parametrize("upstream", [500, 503, 429, 404])
def test_ok_with_an_upstream_error_is_refused_as_contradictory(client, upstream):
    """``status: ok`` (the default) with an ``upstream_status`` of 400 or above was taken as ok: the breaker counted
    the endpoint answering. It is a 422 naming ``upstream_status``, nothing stored; sent as an error it is stored."""
    d = _route(client, 0)
    body = {"decision_id": d["decision_id"], "upstream_status": upstream, "served_endpoint": "llama-8b-1",
            "usage": {"prompt_tokens": 9, "completion_tokens": 2}}
    r = client.post("/v1/outcomes", json=body)
    assert r.status_code == 422, r.text
    err = r.json()["error"]
    assert err["param"] == "upstream_status" and err["message"].startswith(f"{upstream} contradicts status 'ok'"), err
    assert client.app.state.runtime.outcome_log.outcome(d["decision_id"]) is None
    r = client.post("/v1/outcomes", json={**body, "status": "error"})
    assert r.status_code == 200 and r.json()["acks"][0]["status"] == "stored", r.text


def test_a_batch_stores_an_unknown_endpoint_as_sent_and_the_known_one_as_its_id(client):
    d0, d1 = _route(client, 0), _route(client, 1)
    r = client.post("/v1/outcomes", json=[
        {"decision_id": d0["decision_id"], "status": "error", "upstream_status": 503,
         "served_endpoint": "llama-8b-1.inference.internal:8000"},
        {"decision_id": d1["decision_id"], "served_endpoint": "nowhere:1"},
    ])
    assert r.status_code == 200, r.text
    acks = r.json()["acks"]
    assert [a["status"] for a in acks] == ["stored", "stored"]
    assert acks[0]["message"] is None
    assert acks[1]["message"].startswith("[1].served_endpoint: not recognised, stored as sent")
    assert "'nowhere:1' is no endpoint of target 'onprem-8b'" in acks[1]["message"]
    stored = client.app.state.runtime.outcome_log.outcome(d0["decision_id"])
    assert (stored.served_endpoint, stored.upstream_status) == (URL_1, 503)
    # stored as the fleet names it, so the same outcome sent with another form of the same endpoint is a duplicate
    r = client.post("/v1/outcomes", json={"decision_id": d0["decision_id"], "status": "error", "upstream_status": 503,
                                          "served_endpoint": "llama-8b-1"})
    assert r.status_code == 200 and r.json()["acks"][0]["status"] == "duplicate", r.text


def test_a_frontier_fallbacks_endpoint_is_its_target(client):
    d = _route(client, 0)
    r = client.post("/v1/outcomes", json={"decision_id": d["decision_id"], "served_target": "frontier-small",
                                          "served_endpoint": "https://api.openai.com/v1", "upstream_status": 200})
    assert r.status_code == 200, r.text


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(["ok", "error", "timeout"]), st.none() | st.integers(100, 599))
def test_counts_as_answered_is_ok_or_a_status_below_500_but_408_and_429(status, upstream):
    if status == "ok" and upstream is not None and upstream >= 400:
        with pytest.raises(ValueError, match="contradicts status 'ok'"):
            OutcomeIn(decision_id="d1", status=status, upstream_status=upstream)
        return
    o = OutcomeIn(decision_id="d1", status=status, upstream_status=upstream)
    answered = status == "ok" or (upstream is not None and upstream < 500 and upstream not in (408, 429))
    assert o.counts_as_answered == answered


def test_an_outcome_without_the_new_fields_hashes_as_before():
    """Outcomes stored before ``served_endpoint``/``upstream_status`` existed and sent again are duplicates
    (the hash is main's at cf5165d), not conflicts."""
    o = OutcomeIn(decision_id="d1", status="error", error="upstream HTTP 503",
                  usage={"prompt_tokens": 10, "completion_tokens": 2}, ttft_ms=12.5)
    assert _payload_hash(o) == "3a118649a4abd5e63705addb5c546564ba0fd0e6fe4f69dd012a3fd2f34afafc"


def test_a_conflict_with_an_unknown_endpoint_does_not_say_it_was_stored(client):
    """An outcome that conflicts with the one stored under its id is not stored: its ack said "conflict ...; not
    recognised, stored as sent", telling the gateway its spend was kept when the stored outcome stands unchanged."""
    d = _route(client, 0)
    first = {"decision_id": d["decision_id"], "usage": {"prompt_tokens": 9, "completion_tokens": 2}}
    assert client.post("/v1/outcomes", json=first).json()["acks"][0]["status"] == "stored"
    r = client.post("/v1/outcomes", json={**first, "served_endpoint": "llama-8b-7"})
    ack = r.json()["acks"][0]
    assert r.status_code == 409 and ack["status"] == "conflict", r.text
    assert "stored as sent" not in ack["message"] and "already stored with different content" in ack["message"], ack
    assert client.app.state.runtime.outcome_log.outcome(d["decision_id"]).served_endpoint is None
