"""``PointsmanClient`` against a live ``pointsman serve``: an outcome whose ``served_endpoint`` the fleet does not
have is stored at once, as sent (its spend booked, its ack saying the endpoint was not recognised); before, the
service refused it and the client sent it again without the endpoint. A fleet endpoint is stored as the fleet's id."""

from __future__ import annotations

import asyncio

import pytest

from pointsman.integrations.client import PointsmanClient
from pointsman.outcome_log.store import OutcomeLog
from pointsman.policy.rules.compiler import STATIC_POLICY_PATH
from tests.integrations.conftest import GATEWAY_KEY


@pytest.fixture(scope="module")
def policy_text() -> str:
    return STATIC_POLICY_PATH.read_text()


def _decide(client: PointsmanClient, i: int) -> str:
    d = client.route({"messages": [{"role": "user", "content": f"Say hi, take {i}."}], "max_tokens": 20})
    assert d is not None and d["target"] == "onprem-8b"
    return d["decision_id"]


def _stored(service: dict, decision_id: str):
    with OutcomeLog(service["outcome_log"]) as log:
        return log.outcome(decision_id)


def test_an_unknown_endpoint_is_stored_as_sent(service):
    client = PointsmanClient(service["url"], api_key=GATEWAY_KEY, route_timeout_s=5.0)
    try:
        ids = [_decide(client, i) for i in range(3)]
        usage = {"prompt_tokens": 12, "completion_tokens": 3}
        client.report({"decision_id": ids[0], "usage": usage, "served_endpoint": "http://10.9.9.9:8000/v1"})
        client.report({"decision_id": ids[1], "usage": usage, "served_endpoint": "http://10.9.9.9:8000/v1"})
        client.report({"decision_id": ids[2], "status": "error", "upstream_status": 400, "served_endpoint": "llama-8b-1"})
    finally:
        client.close()
    assert [a["status"] for a in client.acks] == ["stored", "stored", "stored"]
    assert all(a["settlement"]["actual_cost_usd"] > 0 for a in list(client.acks)[:2])  # booked
    assert [bool(a["message"]) for a in client.acks] == [True, True, False]
    assert "served_endpoint: not recognised" in client.acks[0]["message"]
    assert client.stats["outcomes_acked"] == 3 and not client.stats["outcomes_dropped"]
    assert [_stored(service, i).served_endpoint for i in ids] == [
        "http://10.9.9.9:8000/v1", "http://10.9.9.9:8000/v1", "http://llama-8b-1.inference.internal:8000/v1"]
    assert _stored(service, ids[2]).upstream_status == 400


def test_the_background_batches_store_it_too(service):
    async def run() -> PointsmanClient:
        client = PointsmanClient(service["url"], api_key=GATEWAY_KEY, route_timeout_s=5.0, flush_interval_s=0.01)
        d = await client.aroute({"messages": [{"role": "user", "content": "Say hi, async."}], "max_tokens": 20})
        assert d is not None
        client.report({"decision_id": d["decision_id"], "served_endpoint": "nowhere:1"})
        await client.aclose()
        return client
    client = asyncio.run(run())
    assert [a["status"] for a in client.acks] == ["stored"]
    assert client.acks[0]["message"].startswith("[0].served_endpoint: not recognised")
