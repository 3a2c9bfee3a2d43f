"""A verify reaching a process that does not hold its decision is relayed to the one that does
(``service/verify_relay.py``): ``pointsman serve --workers 2`` with live state in a real Redis, each
request on a fresh connection (either worker). Before the relay about half of these verifies were
410 ``decision_expired`` (the other worker held the decision), so the gateway kept every such draft."""

from __future__ import annotations

import uuid
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.slow

REFUSAL = "I'm sorry, but I cannot help with that request."


def _post(base: str, path: str, body: dict) -> httpx.Response:
    with httpx.Client(base_url=base, timeout=10) as c:  # a new connection: either worker
        return c.post(path, json=body)


def test_every_verify_is_answered_by_the_worker_holding_its_decision(tmp_path, serve, redis_url):
    policy = Path(__file__).resolve().parents[1] / "fixtures" / "cascade_policy.yaml"
    prefix = f"%7Brelay-{uuid.uuid4().hex[:8]}%7D:"
    _, base = serve(tmp_path / "data", workers="2", watch_policy="false", policy_path=str(policy),
                    state_url=f"{redis_url}?prefix={prefix}")
    verify_statuses, settled = [], []
    for i in range(16):
        did = _post(base, "/v1/route", {"messages": [{"role": "user", "content": f"question {i}"}]}).json()["decision_id"]
        body = {"decision_id": did, "draft": {"text": REFUSAL, "finish_reason": "stop"}, "usage": {"completion_tokens": 11}}
        r = _post(base, "/v1/verify", body)
        verify_statuses.append(r.status_code)
        if r.status_code != 200:
            continue
        v = r.json()
        assert (v["action"], v["target"], v["rule"]) == ("escalate", "frontier-large", "refusal")
        again = _post(base, "/v1/verify", body).json()  # replayed, whichever worker answers
        assert again["replayed"] is True and again["escalation_id"] == v["escalation_id"]
        ack = _post(base, "/v1/outcomes", {"decision_id": v["escalation_id"], "status": "ok",
                                           "served_target": "frontier-large",
                                           "usage": {"prompt_tokens": 9, "completion_tokens": 120}}).json()["acks"][0]
        settled.append((ack["status"], ack["settlement"]["decision_id"] == v["escalation_id"],
                        ack["settlement"]["target"]))
    assert verify_statuses == [200] * 16
    assert settled == [("stored", True, "frontier-large")] * 16
    unknown = _post(base, "/v1/verify", {"decision_id": "0" * 32, "draft": {"text": "x"}})
    assert (unknown.status_code, unknown.json()["error"]["code"]) == (404, "unknown_decision")
