"""``GET /metrics`` of ``pointsman serve --workers 2`` (live state in a real Redis) counts what every worker
did, whichever worker answers the scrape. Before, a scrape was answered by the worker that accepted it with
its own counters alone: after 16 decisions spread over fresh connections, one scrape said 9 and the next 7,
and Prometheus, which keeps its connection open, saw one worker's count for good (44 of 87 decisions). So does
``GET /v1/fleet``'s ``shadow_spent_usd`` (read from those counters)."""

from __future__ import annotations

import re
import uuid

import httpx
import pytest

from tests.service.test_spend_reports import SHADOW_USD

pytestmark = pytest.mark.slow


def _decisions(text: str) -> float:
    return sum(float(v) for v in re.findall(r"^pointsman_decisions_total\{[^}]*\} (\S+)$", text, re.M))


def test_every_scrape_counts_the_decisions_of_both_workers(tmp_path, serve, redis_url):
    prefix = f"%7Bmetrics-{uuid.uuid4().hex[:8]}%7D:"
    _, base = serve(tmp_path / "data", workers="2", state_url=f"{redis_url}?prefix={prefix}")
    route = {"messages": [{"role": "user", "content": "Say hello."}]}
    decided = []
    for _ in range(16):
        with httpx.Client(base_url=base, timeout=10) as c:  # a new connection: either worker
            r = c.post("/v1/route", json=route)
            assert r.status_code == 200
            decided.append(r.json()["decision_id"])
    for _ in range(8):
        with httpx.Client(base_url=base, timeout=10) as c:
            text = c.get("/metrics").text
        assert _decisions(text) == 16
        assert 'pointsman_outcomes_total{status="stored"} 0.0' in text  # pre-made series are still there
    with httpx.Client(base_url=base, timeout=10) as c:  # one kept-alive connection, as Prometheus scrapes
        assert [_decisions(c.get("/metrics").text) for _ in range(4)] == [16] * 4
    for i, decision_id in enumerate(decided):  # shadow answers of 1k/1k tokens on frontier-large, either worker
        with httpx.Client(base_url=base, timeout=10) as c:
            r = c.post("/v1/outcomes", json={"decision_id": decision_id, "outcome_id": f"shadow-{i}", "shadow": True,
                                             "served_target": "frontier-large",
                                             "usage": {"prompt_tokens": 1000, "completion_tokens": 1000}})
            assert r.json()["acks"][0]["status"] == "stored", r.text
    for _ in range(8):
        with httpx.Client(base_url=base, timeout=10) as c:
            shadow = c.get("/v1/fleet").json()["targets"]["frontier-large"]["shadow_spent_usd"]
        assert round(shadow, 9) == round(16 * SHADOW_USD, 9)
