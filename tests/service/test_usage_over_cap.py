"""``POST /v1/outcomes`` with more completion tokens than the request's output cap (``max_tokens`` x ``n``, every
prompt of a batch): no upstream generates that, so the report is wrong somewhere (a gateway summing its retries'
usage, or another request's). The spend may have happened (each retry is billed), so it is stored and booked as
reported, not refused; but not silently: the ack's ``message`` says so and
``pointsman_outcome_usage_over_cap_total{target}`` counts it (once, where it is stored)."""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient

from pointsman.estimator.estimate import FixedDifficulty
from pointsman.policy.engine import RoutingEngine
from pointsman.policy.fleet import load_fleet
from pointsman.policy.rules.compiler import STATIC_POLICY_PATH, load_policy
from pointsman.service.app import create_app
from pointsman.service.bootstrap import build_state
from pointsman.service.settings import Settings


@pytest.fixture
def client(tmp_path):
    fleet = load_fleet()
    settings = Settings(data_dir=tmp_path, watch_policy=False, watch_fleet=False, scrape_interval_s=0)
    engine = RoutingEngine(fleet, load_policy(STATIC_POLICY_PATH, fleet), FixedDifficulty(0.1),
                           state=build_state(settings, fleet))
    with TestClient(create_app(settings, engine=engine, owns_engine=True)) as c:
        yield c


def _over_cap(c: TestClient) -> dict[str, float]:
    text = c.get("/metrics").text
    return {m[0]: float(m[1]) for m in re.findall(r'^pointsman_outcome_usage_over_cap_total\{target="([^"]+)"\} (\S+)$',
                                                   text, re.M)}


def _outcome(c: TestClient, body: dict, completion: int, **extra) -> tuple[dict, dict]:
    d = c.post("/v1/route", json=body)
    assert d.status_code == 200, d.text
    decision = d.json()
    r = c.post("/v1/outcomes", json=[{"decision_id": decision["decision_id"], "status": "ok",
                                      "usage": {"prompt_tokens": 12, "completion_tokens": completion}, **extra}])
    assert r.status_code == 200, r.text
    (ack,) = r.json()["acks"]
    return decision, ack


def test_completion_tokens_beyond_the_output_cap_are_booked_and_flagged(client):
    say = {"messages": [{"role": "user", "content": "Say hi."}]}
    decision, ack = _outcome(client, {**say, "max_tokens": 20}, 200)  # three retries of 20, summed? not one call
    assert ack["status"] == "stored"
    assert "usage.completion_tokens 200 is above the request's output cap of 20 tokens" in ack["message"]
    assert ack["settlement"]["actual_cost_usd"] > 0  # booked as reported: the spend may have happened
    assert _over_cap(client) == {decision["target"]: 1.0}
    # the same outcome again is a duplicate: said again, counted once
    r = client.post("/v1/outcomes", json=[{"decision_id": decision["decision_id"], "status": "ok",
                                           "usage": {"prompt_tokens": 12, "completion_tokens": 200}}])
    (again,) = r.json()["acks"]
    assert again["status"] == "duplicate" and "output cap" in again["message"]
    assert _over_cap(client) == {decision["target"]: 1.0}
    # within the cap, or within the tokenizers' tolerance of it: nothing said
    for body, completion in (({**say, "max_tokens": 20}, 20), ({**say, "max_tokens": 20}, 22),
                             ({**say, "max_tokens": 20, "n": 3}, 60),  # every answer of n is generated
                             ({"prompt": ["Name a river.", "Name a lake."], "max_tokens": 20, "n": 2}, 80),
                             (say, 5000)):  # no cap asked for: none to be above
        _, ack = _outcome(client, body, completion)
        assert ack["status"] == "stored" and ack["message"] is None, (body, ack)
    assert _over_cap(client) == {decision["target"]: 1.0}
    _, ack = _outcome(client, {"prompt": ["Name a river.", "Name a lake."], "max_tokens": 20, "n": 2}, 81 + 8)
    assert "output cap of 80 tokens" in ack["message"]
    # a shadow outcome is another model's answer, asked for by the evaluation: not checked against this cap
    _, ack = _outcome(client, {**say, "max_tokens": 20}, 200, shadow=True, served_target="frontier-large",
                      outcome_id="shadow-1")
    assert ack["status"] == "stored" and (ack["message"] is None or "output cap" not in ack["message"])
