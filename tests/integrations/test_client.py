"""PointsmanClient against httpx's MockTransport: fail-open routing, batched background
outcome posts, retries and drops that never raise."""

from __future__ import annotations

import asyncio
import json

import httpx

from pointsman.integrations.client import PointsmanClient

DECISION = {"decision_id": "d-1", "target": "onprem-8b"}


def _client(handler, **kw) -> PointsmanClient:
    return PointsmanClient("http://pointsman.test", transport=httpx.MockTransport(handler), **kw)


def test_route_returns_the_decision_and_sends_the_key() -> None:
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.url.path, request.headers.get("authorization"), json.loads(request.content)))
        return httpx.Response(200, json=DECISION)

    async def run():
        client = _client(handler, api_key="k-1")
        decision = await client.aroute({"messages": [{"role": "user", "content": "hi"}]})
        await client.aclose()
        return decision, client

    decision, client = asyncio.run(run())
    assert decision == DECISION and client.stats["routed"] == 1
    assert seen == [("/v1/route", "Bearer k-1", {"messages": [{"role": "user", "content": "hi"}]})]


def test_route_fails_open_on_5xx_4xx_and_transport_errors() -> None:
    answers = iter([httpx.Response(503, json={"error": {"message": "not ready"}}),
                    httpx.Response(422, json={"error": {"message": "unknown field", "param": "routing.tenat"}}),
                    httpx.ConnectError("refused"), httpx.ReadTimeout("slow")])

    def handler(request: httpx.Request) -> httpx.Response:
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def run():
        client = _client(handler)
        results = [await client.aroute({"messages": []}) for _ in range(4)]
        await client.aclose()
        return results, client

    results, client = asyncio.run(run())
    assert results == [None] * 4
    assert client.stats["route_failed"] == 4 and client.stats["routed"] == 0


def test_outcomes_are_batched_in_the_background() -> None:
    posts = []

    def handler(request: httpx.Request) -> httpx.Response:
        batch = json.loads(request.content)
        posts.append(batch)
        return httpx.Response(200, json={"acks": [{"outcome_id": o["decision_id"], "decision_id": o["decision_id"],
                                                    "status": "stored"} for o in batch], "counts": {"stored": len(batch)}})

    async def run():
        client = _client(handler, flush_interval_s=0.01)
        for i in range(5):
            client.report({"decision_id": f"d-{i}", "status": "ok"})
        assert posts == []  # queued, not posted on the caller's path
        await client.aclose()
        return client

    client = asyncio.run(run())
    assert [[o["decision_id"] for o in batch] for batch in posts] == [[f"d-{i}" for i in range(5)]]
    assert client.stats["outcomes_acked"] == 5 and [a["status"] for a in client.acks] == ["stored"] * 5


def test_outcome_posts_are_retried_then_dropped_without_raising() -> None:
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        raise httpx.ConnectError("refused")

    async def run():
        client = _client(handler, flush_interval_s=0.0, outcome_attempts=2)
        client.report({"decision_id": "d-1", "status": "ok"})
        await client.aclose()
        return client

    client = asyncio.run(run())
    assert calls == ["/v1/outcomes"] * 2
    assert client.stats["outcomes_dropped"] == 1 and not client.acks


def test_rejected_outcome_batch_is_dropped_not_retried() -> None:
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        return httpx.Response(422, json={"error": {"message": "unknown field", "param": "[0].usage.foo"}})

    async def run():
        client = _client(handler, flush_interval_s=0.0)
        client.report({"decision_id": "d-1", "status": "ok", "usage": {"foo": 1}})
        await client.aclose()
        return client

    client = asyncio.run(run())
    assert calls == [1] and client.stats["outcomes_dropped"] == 1


def test_verify_returns_the_answer_and_fails_open() -> None:
    answers = iter([httpx.Response(200, json={"decision_id": "d-1", "action": "escalate", "target": "frontier-small"}),
                    httpx.Response(410, json={"error": {"message": "expired", "code": "decision_expired"}}),
                    httpx.Response(503, json={"error": {"message": "not ready"}}), httpx.ReadTimeout("slow")])
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.url.path, json.loads(request.content)))
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def run():
        client = _client(handler)
        out = [await client.averify("d-1", {"text": "I'm sorry"}, {"completion_tokens": 3}) for _ in range(4)]
        await client.aclose()
        return out, client

    out, client = asyncio.run(run())
    assert out[0]["action"] == "escalate" and out[1:] == [None, None, None]
    assert client.stats["verified"] == 1 and client.stats["verify_failed"] == 3
    assert seen[0] == ("/v1/verify", {"decision_id": "d-1", "draft": {"text": "I'm sorry"},
                                      "usage": {"completion_tokens": 3}})
