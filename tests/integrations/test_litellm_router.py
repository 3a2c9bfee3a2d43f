"""The LiteLLM integration against a live ``pointsman serve`` (a subprocess on a free port).

The real ``litellm.Router`` holds two deployments of one model group, an on-prem-like one
(``onprem-8b``) and a frontier-like one (``frontier-large``), each answering with LiteLLM's
documented ``mock_response`` (no network). A small policy routes on ``routing.slo_class``
so each prompt's target is known in advance; the tests check that the Router sent each call
where Pointsman decided and that the outcomes were acknowledged by ``/v1/outcomes`` and are
in the service's outcome log.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch of LiteLLM's price map

import litellm  # noqa: E402

from pointsman.integrations.client import DECISION_HEADER, BudgetExhausted, PointsmanClient, forward_target  # noqa: E402
from pointsman.integrations.litellm_router import (  # noqa: E402
    PointsmanRoutingStrategy,
    _usage,
    attach,
    pick_deployment,
)
from pointsman.outcome_log.store import OutcomeLog  # noqa: E402

POLICY = """\
apiVersion: pointsman/v1
kind: RoutingPolicy
metadata: {name: litellm-test}
rules:
  - name: long-context-slo
    when: request.slo_class == "long-context"
    route: {target: frontier-large, fallbacks: [onprem-70b]}
  - name: interactive-slo
    when: request.slo_class == "interactive"
    route: {target: onprem-70b, fallbacks: [frontier-large]}
  - name: default
    route: {target: onprem-8b, fallbacks: [frontier-small]}
"""

GATEWAY_KEY = "gw-secret-for-tests"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def policy_text() -> str:
    """The policy the ``service`` fixture (conftest.py) serves."""
    return POLICY


DEPLOYMENTS = [
    {"model_name": "chat",
     "litellm_params": {"model": "hosted_vllm/meta-llama/Llama-3.1-8B-Instruct", "api_base": "http://onprem:8000/v1",
                        "mock_response": "answer from on-prem"},
     "model_info": {"id": "onprem-dep", "pointsman_target": "onprem-8b", "pointsman_default": True}},
    {"model_name": "chat",
     "litellm_params": {"model": "openai/gpt-4o-2024-08-06", "api_key": "sk-not-used",
                        "mock_response": "answer from frontier"},
     "model_info": {"id": "frontier-dep", "pointsman_target": "frontier-large"}},
]


def _router(client: PointsmanClient) -> litellm.Router:
    router = litellm.Router(model_list=[dict(d) for d in DEPLOYMENTS], num_retries=0)
    attach(router, client)
    return router


async def _settle(client: PointsmanClient, n_acks: int) -> None:
    """Wait (up to 5 s) until LiteLLM has logged the calls and ``n_acks`` outcomes are acknowledged,
    then close the client. LiteLLM runs its success callbacks in tasks after the call returns."""
    for _ in range(250):
        await client.aflush()
        if len(client.acks) >= n_acks:
            break
        await asyncio.sleep(0.02)
    await client.aclose()


def _call(router: litellm.Router, text: str, slo: str | None, **kw):
    metadata = {"pointsman": {"slo_class": slo, "tenant": "acme"}} if slo else {}
    return router.acompletion(model="chat", messages=[{"role": "user", "content": text}], metadata=metadata, **kw)


def test_router_sends_each_call_where_pointsman_decided_and_reports_outcomes(service: dict) -> None:
    async def run() -> tuple[list, PointsmanClient]:
        client = PointsmanClient(service["url"], api_key=GATEWAY_KEY, route_timeout_s=5.0, flush_interval_s=0.01)
        router = _router(client)
        responses = [
            await _call(router, "Prove that there are infinitely many primes.", "long-context"),
            await _call(router, "Say hello.", None),
            await _call(router, "Summarise this log file.", "interactive"),  # onprem-70b has no deployment
        ]
        await _settle(client, 3)
        return responses, client

    responses, client = asyncio.run(run())
    served = [r._hidden_params["model_id"] for r in responses]
    assert served == ["frontier-dep", "onprem-dep", "frontier-dep"]
    assert [r.choices[0].message.content for r in responses] == [
        "answer from frontier", "answer from on-prem", "answer from frontier"]
    assert client.stats["routed"] == 3 and client.stats["route_failed"] == 0
    assert client.stats["outcomes_acked"] == 3 and client.stats["outcomes_dropped"] == 0
    acks = list(client.acks)
    assert [a["status"] for a in acks] == ["stored"] * 3
    # the interactive call was decided for onprem-70b, which has no deployment: it ran on the
    # decision's first fallback that has one, the outcome names the target that served it,
    # and the service settled it there
    # (acks arrive in the order LiteLLM's callbacks ran, not the calls': compared as a sorted list)
    with OutcomeLog(service["outcome_log"]) as outcome_log:
        stored = [outcome_log.outcome(a["outcome_id"]) for a in acks]
        decided = [outcome_log.decision(a["decision_id"]) for a in acks]
    assert sorted((d.target, d.rule, d.tenant, o.served_target, a["settlement"]["target"])
                  for d, o, a in zip(decided, stored, acks, strict=True)) == [
        ("frontier-large", "long-context-slo", "acme", "frontier-large", "frontier-large"),
        ("onprem-70b", "interactive-slo", "acme", "frontier-large", "frontier-large"),
        ("onprem-8b", "default", None, "onprem-8b", "onprem-8b")]
    assert all(o.status == "ok" and o.usage.prompt_tokens and o.usage.completion_tokens for o in stored)
    assert all(o.e2e_latency_ms is not None and o.e2e_latency_ms >= 0 for o in stored)


def test_streamed_calls_report_ttft(service: dict) -> None:
    async def run():
        client = PointsmanClient(service["url"], api_key=GATEWAY_KEY, route_timeout_s=5.0, flush_interval_s=0.01)
        router = _router(client)
        stream = await _call(router, "Write a poem.", "long-context", stream=True)
        text = "".join([c.choices[0].delta.content or "" async for c in stream])
        await _settle(client, 1)
        return text, client

    text, client = asyncio.run(run())
    assert text == "answer from frontier"
    (ack,) = list(client.acks)
    assert ack["status"] == "stored" and ack["settlement"]["target"] == "frontier-large"
    with OutcomeLog(service["outcome_log"]) as outcome_log:
        outcome = outcome_log.outcome(ack["outcome_id"])
    assert outcome.ttft_ms is not None and outcome.ttft_ms <= outcome.e2e_latency_ms


class _Upstream(BaseHTTPRequestHandler):
    """A minimal OpenAI-compatible upstream that records the decision header it receives."""

    seen: list[str | None] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        self.rfile.read(int(self.headers.get("content-length", 0)))
        type(self).seen.append(self.headers.get(DECISION_HEADER))
        body = json.dumps({"id": "c-1", "object": "chat.completion", "created": 0, "model": "llama",
                           "choices": [{"index": 0, "finish_reason": "stop",
                                        "message": {"role": "assistant", "content": "real upstream"}}],
                           "usage": {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9}}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:  # quiet
        pass


def test_decision_id_is_forwarded_to_the_upstream(service: dict) -> None:
    upstream = HTTPServer(("127.0.0.1", 0), _Upstream)
    thread = threading.Thread(target=upstream.serve_forever, daemon=True)
    thread.start()
    model_list = [
        {"model_name": "chat", "model_info": {"id": "onprem-live", "pointsman_target": "onprem-8b"},
         "litellm_params": {"model": "openai/llama", "api_key": "none",
                            "api_base": f"http://127.0.0.1:{upstream.server_port}/v1"}},
        DEPLOYMENTS[1],
    ]

    async def run():
        client = PointsmanClient(service["url"], api_key=GATEWAY_KEY, route_timeout_s=5.0, flush_interval_s=0.01)
        router = litellm.Router(model_list=model_list, num_retries=0)
        attach(router, client)
        response = await _call(router, "Say hello.", None)
        await _settle(client, 1)
        return response, client

    try:
        response, client = asyncio.run(run())
    finally:
        upstream.shutdown()
    assert response.choices[0].message.content == "real upstream"
    (ack,) = list(client.acks)
    assert _Upstream.seen == [ack["decision_id"]]
    assert ack["settlement"]["target"] == "onprem-8b"


def test_failed_upstream_call_is_reported_as_error(service: dict) -> None:
    async def run():
        client = PointsmanClient(service["url"], api_key=GATEWAY_KEY, route_timeout_s=5.0, flush_interval_s=0.01)
        router = _router(client)
        with pytest.raises(Exception, match="upstream down"):  # noqa: B017 - LiteLLM wraps the mock's error in its own types
            await _call(router, "Prove Fermat's last theorem.", "long-context", mock_response=Exception("upstream down"))
        await _settle(client, 1)
        return client

    client = asyncio.run(run())
    (ack,) = list(client.acks)
    assert ack["status"] == "stored" and ack["released"] is True  # no usage: the budget hold was dropped
    with OutcomeLog(service["outcome_log"]) as outcome_log:
        outcome = outcome_log.outcome(ack["outcome_id"])
    assert outcome.status == "error" and "upstream down" in (outcome.error or "")


def test_unreachable_pointsman_falls_back_to_the_default_deployment() -> None:
    async def run():
        client = PointsmanClient(f"http://127.0.0.1:{_free_port()}", route_timeout_s=0.2)
        router = _router(client)
        response = await _call(router, "Prove that there are infinitely many primes.", "long-context")
        await client.aclose()
        return response, client

    response, client = asyncio.run(run())
    assert response._hidden_params["model_id"] == "onprem-dep"  # model_info.pointsman_default
    assert client.stats["route_failed"] == 1 and client.stats["routed"] == 0
    assert not client.acks and client.stats["outcomes_dropped"] == 0  # no decision, no outcome


def test_wrong_key_is_rejected_and_the_call_still_succeeds(service: dict) -> None:
    async def run():
        client = PointsmanClient(service["url"], api_key="not-a-key", route_timeout_s=5.0)
        router = _router(client)
        response = await _call(router, "Prove that there are infinitely many primes.", "long-context")
        await client.aclose()
        return response, client

    response, client = asyncio.run(run())
    assert response._hidden_params["model_id"] == "onprem-dep"
    assert client.stats["route_failed"] == 1


def test_a_budget_refusal_is_not_routed_around(service: dict) -> None:
    """Tenant ``broke`` has $0 a day: Pointsman refuses its call (429 ``budget_exhausted``) and the
    call raises. Before, the client took the refusal (then a 422) for a failure to fail open on, and
    the Router served the call on its default deployment, unbudgeted and with no outcome reported."""
    async def run():
        client = PointsmanClient(service["url"], api_key=GATEWAY_KEY, route_timeout_s=5.0)
        router = _router(client)
        try:
            with pytest.raises(BudgetExhausted, match="tenant:broke"):
                await router.acompletion(model="chat", messages=[{"role": "user", "content": "hello"}],
                                         metadata={"pointsman": {"tenant": "broke"}})
        finally:
            await client.aclose()
        return client

    client = asyncio.run(run())
    assert client.stats["budget_refused"] == 1 and client.stats["route_failed"] == 0 and not client.acks


def test_an_audio_answer_is_decided_as_one(service: dict) -> None:
    """A call asking for an audio answer (``modalities``, ``audio``) needs a target that takes audio, which the
    packaged fleet has none of: Pointsman refuses it (422 no_eligible_target) and the Router fails open. The
    route body carried only the tools, caps, n and user, so Pointsman decided it as text: onprem-8b (Llama,
    text only), its decision logged and its estimate held as if the request were the text one."""
    async def run():
        client = PointsmanClient(service["url"], api_key=GATEWAY_KEY, route_timeout_s=5.0)
        router = _router(client)
        try:
            await router.acompletion(model="chat", messages=[{"role": "user", "content": "Say hello out loud."}],
                                     modalities=["text", "audio"], audio={"voice": "alloy", "format": "wav"})
        finally:
            await client.aclose()
        return client

    client = asyncio.run(run())
    assert client.stats["routed"] == 0 and client.stats["route_failed"] == 1


def test_pick_deployment_maps_by_target_then_upstream_model_then_endpoint() -> None:
    deployments = [
        {"model_name": "chat", "litellm_params": {"model": "hosted_vllm/meta-llama/Llama-3.1-8B-Instruct",
                                                  "api_base": "http://llama-8b-0:8000/v1"}, "model_info": {}},
        {"model_name": "chat", "litellm_params": {"model": "hosted_vllm/meta-llama/Llama-3.1-8B-Instruct",
                                                  "api_base": "http://llama-8b-1:8000/v1/"}, "model_info": {}},
        {"model_name": "chat", "litellm_params": {"model": "openai/gpt-4o-mini"},
         "model_info": {"pointsman_target": "frontier-small"}},
    ]
    decision = {"decision_id": "abc", "target": "onprem-8b", "model": "meta-llama/Llama-3.1-8B-Instruct",
                "base_url": "http://llama-8b-1:8000/v1",
                "endpoints": [{"url": "http://llama-8b-1:8000/v1", "role": "aggregated"}],
                "fallbacks": [{"target": "frontier-small", "model": "gpt-4o-mini-2024-07-18",
                               "base_url": "https://api.openai.com/v1", "mode": "aggregated"}]}
    assert pick_deployment(deployments, decision) is deployments[1]  # the replica Pointsman picked
    assert pick_deployment(deployments[2:], decision) is deployments[2]  # fallback by pointsman_target
    assert pick_deployment(deployments[:1], {**decision, "target": "onprem-70b", "model": "x", "fallbacks": []}) is None


def test_disaggregated_decision_goes_to_the_decode_endpoint_with_the_prefiller_header() -> None:
    """The P/D contract: the deployment is base_url's (decode), never endpoints[0] (prefill), and the
    prefill endpoint travels as x-prefiller-host-port."""
    model = "hosted_vllm/meta-llama/Llama-3.3-70B-Instruct"
    deployments = [{"model_name": "chat", "litellm_params": {"model": model, "api_base": f"http://{host}:8000/v1"},
                    "model_info": {"pointsman_target": "onprem-70b"}} for host in ("prefill-0", "decode-0", "decode-1")]
    decision = {"decision_id": "d1", "target": "onprem-70b", "model": "meta-llama/Llama-3.3-70B-Instruct",
                "base_url": "http://decode-1:8000/v1", "mode": "disaggregated",
                "endpoints": [{"url": "http://prefill-0:8000/v1", "role": "prefill"},
                              {"url": "http://decode-1:8000/v1", "role": "decode"},
                              {"url": "http://decode-0:8000/v1", "role": "decode"}],
                "prefill_url": "http://prefill-0:8000/v1",
                "forward_headers": {"x-pointsman-decision-id": "d1", "x-prefiller-host-port": "prefill-0:8000"},
                "fallbacks": []}
    assert pick_deployment(deployments, decision) is deployments[2]
    strategy = PointsmanRoutingStrategy(None, PointsmanClient("http://127.0.0.1:1"))
    kwargs: dict = {"metadata": {}}
    assert strategy._apply(decision, deployments, kwargs) is deployments[2]
    assert kwargs["extra_headers"] == {"x-pointsman-decision-id": "d1", "x-prefiller-host-port": "prefill-0:8000"}
    assert forward_target(decision) == ("http://decode-1:8000/v1", decision["forward_headers"])
    old = {k: v for k, v in decision.items() if k not in ("prefill_url", "forward_headers")}
    assert forward_target(old) == ("http://decode-1:8000/v1", {"x-pointsman-decision-id": "d1"})


def test_sync_completion_is_routed_and_reported(service: dict) -> None:
    client = PointsmanClient(service["url"], api_key=GATEWAY_KEY, route_timeout_s=5.0)
    router = _router(client)
    response = router.completion(model="chat", messages=[{"role": "user", "content": "Prove it."}],
                                 metadata={"pointsman": {"slo_class": "long-context"}})
    for _ in range(250):  # LiteLLM posts sync outcomes from its logging thread
        if client.acks:
            break
        time.sleep(0.02)
    client.close()
    assert response._hidden_params["model_id"] == "frontier-dep"
    (ack,) = list(client.acks)
    assert ack["status"] == "stored" and ack["settlement"]["target"] == "frontier-large"


def test_anthropic_usage_from_litellm_keeps_its_cache_reads_and_writes() -> None:
    """LiteLLM's own translation of an Anthropic usage object: what the integration reports, and the
    object as a LiteLLM Proxy upstream would send it, read into the same priced counts."""
    from litellm.llms.anthropic.chat.transformation import AnthropicConfig

    from pointsman.outcome import parse_outcomes
    from pointsman.usage_shapes import read_usage

    raw = {"input_tokens": 100, "output_tokens": 80, "cache_read_input_tokens": 2000,
           "cache_creation_input_tokens": 1500,
           "cache_creation": {"ephemeral_5m_input_tokens": 1000, "ephemeral_1h_input_tokens": 500}}
    usage = AnthropicConfig().calculate_usage(raw, reasoning_content=None)
    reported = _usage({"usage": usage})
    assert reported == {"prompt_tokens": 3600, "completion_tokens": 80, "cached_tokens": 2000,
                        "cache_write_tokens": 1000, "cache_write_1h_tokens": 500}
    want = (3600, 2000, 1000, 500, 80)
    for sent in (reported, json.loads(usage.model_dump_json())):
        u = parse_outcomes({"decision_id": "d1", "usage": sent})[0].usage
        assert (u.prompt_tokens, u.cached_tokens, u.cache_write_tokens, u.cache_write_1h_tokens,
                u.completion_tokens) == want
    assert read_usage(raw).counts() == read_usage(reported).counts()


class _BrokenStream(BaseHTTPRequestHandler):
    """An OpenAI-compatible upstream whose stream sends one chunk and then drops the connection."""

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.end_headers()
        chunk = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
                 "choices": [{"index": 0, "delta": {"role": "assistant", "content": "Once upon"}, "finish_reason": None}]}
        self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        self.wfile.flush()
        self.close_connection = True
        self.connection.shutdown(socket.SHUT_RDWR)

    def log_message(self, *args: object) -> None:
        pass


def test_a_stream_that_fails_after_its_first_token_is_booked_not_released(service: dict) -> None:
    """The upstream answered and then failed: it ran and bills what it generated, so the error outcome carries
    its ``ttft_ms`` and the service books the decision's estimate (docs/service.md). Before, the failure was
    reported without it, and the service released the hold: the call's spend was never booked."""
    upstream = HTTPServer(("127.0.0.1", 0), _BrokenStream)
    thread = threading.Thread(target=upstream.serve_forever, daemon=True)
    thread.start()
    deployments = [{"model_name": "chat", "model_info": {"id": "onprem-dep", "pointsman_target": "onprem-8b"},
                    "litellm_params": {"model": "hosted_vllm/meta-llama/Llama-3.1-8B-Instruct", "api_key": "none",
                                       "api_base": f"http://127.0.0.1:{upstream.server_port}/v1"}}]

    async def run():
        client = PointsmanClient(service["url"], api_key=GATEWAY_KEY, route_timeout_s=5.0, flush_interval_s=0.01)
        router = litellm.Router(model_list=deployments, num_retries=0)
        attach(router, client)
        stream = await _call(router, "Write a poem.", None, stream=True)
        with pytest.raises(Exception):  # noqa: B017 - whichever type LiteLLM wraps the broken stream in
            async for _ in stream:
                pass
        await _settle(client, 1)
        return client

    try:
        client = asyncio.run(run())
    finally:
        upstream.shutdown()
    (ack,) = list(client.acks)
    with OutcomeLog(service["outcome_log"]) as outcome_log:
        outcome = outcome_log.outcome(ack["outcome_id"])
    assert outcome.status == "error" and outcome.ttft_ms is not None
    assert ack["released"] is False and ack["settlement"]["actual_cost_usd"] > 0


class _FlakyUpstream(_Upstream):
    """``_Upstream`` that answers its first request 500 (a provider error after the decision), then as usual."""

    failed: list[str | None] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        if type(self).failed:
            super().do_POST()
            return
        self.rfile.read(int(self.headers.get("content-length", 0)))
        type(self).failed.append(self.headers.get(DECISION_HEADER))
        body = json.dumps({"error": {"message": "overloaded", "type": "server_error"}}).encode()
        self.send_response(500)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def test_a_retried_call_reports_each_attempt_under_its_own_decision(service: dict) -> None:
    """LiteLLM retries a 500 (``num_retries=1``): each attempt was decided on its own, so the first decision gets
    the ``error`` outcome and the second the ``ok`` one with the upstream's usage, booked."""
    _FlakyUpstream.seen, _FlakyUpstream.failed = [], []
    upstream = HTTPServer(("127.0.0.1", 0), _FlakyUpstream)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    model_list = [{"model_name": "chat", "model_info": {"id": "onprem-live", "pointsman_target": "onprem-8b"},
                   "litellm_params": {"model": "openai/llama", "api_key": "none",
                                      "api_base": f"http://127.0.0.1:{upstream.server_port}/v1"}}]

    async def run():
        client = PointsmanClient(service["url"], api_key=GATEWAY_KEY, route_timeout_s=5.0, flush_interval_s=0.01)
        router = litellm.Router(model_list=model_list, num_retries=1, retry_after=0)
        attach(router, client)
        response = await _call(router, "Say hello.", None)
        await _settle(client, 2)
        return response, client

    try:
        response, client = asyncio.run(run())
    finally:
        upstream.shutdown()
    assert response.choices[0].message.content == "real upstream"
    acks = {a["decision_id"]: a for a in client.acks}
    (failed,), (answered,) = _FlakyUpstream.failed, _FlakyUpstream.seen
    assert failed != answered and set(acks) == {failed, answered}
    assert acks[failed]["status"] == "stored" and acks[failed]["released"] is True
    assert acks[answered]["status"] == "stored" and acks[answered]["settlement"]["actual_cost_usd"] > 0
    with OutcomeLog(service["outcome_log"]) as outcome_log:
        ok = outcome_log.outcome(acks[answered]["outcome_id"])
    assert (ok.status, ok.usage.prompt_tokens, ok.usage.completion_tokens) == ("ok", 7, 2)
