"""The ext_proc endpoint picker driven as Envoy drives it: a real gRPC client on the served port sending
the real protobuf messages in Envoy's order (request headers, body chunks of 64 KiB, response headers,
response body chunks), against the service's app (lifespan started by TestClient) with a fixed-difficulty
engine (p_hard 0.1: short prompts go to onprem-8b, long cold ones to onprem-70b disaggregated)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import json
import logging
import re
import socket
import time

import grpc
import httpx
import pytest
from fastapi.testclient import TestClient
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import given, settings
from hypothesis import strategies as st

from pointsman.estimator.estimate import FixedDifficulty
from pointsman.outcome import parse_outcomes
from pointsman.outcome_log.store import OutcomeLog
from pointsman.policy.decision import host_port
from pointsman.policy.engine import RoutingEngine
from pointsman.policy.fleet import load_fleet
from pointsman.policy.rules.compiler import STATIC_POLICY_PATH, load_policy
from pointsman.policy.signals.signed_ids import DecisionSigner
from pointsman.request import parse_route_request
from pointsman.service import ext_proc_wire as wire
from pointsman.service.app import create_app
from pointsman.service.bootstrap import build_state
from pointsman.service.ext_proc import destinations, not_generation
from pointsman.service.ext_proc_body import UsageReader, rewrite_request
from pointsman.service.settings import Settings

CHUNK = 64 * 1024
MAX_BODY = 2_000_000
ONPREM_8B = ("llama-8b-0.inference.internal:8000", "llama-8b-1.inference.internal:8000")
REQUEST_HEADERS = {":method": "POST", ":path": "/v1/chat/completions", ":authority": "gateway.local",
                   "content-type": "application/json", "x-pointsman-tenant": "acme"}


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    data = tmp_path_factory.mktemp("extproc")
    budgets = data / "budgets.yaml"
    budgets.write_text("apiVersion: pointsman/v1\nkind: Budgets\nbudgets:\n"
                       "  - {scope: 'tenant:broke', window: day, limit_usd: 1.0e-9}\n", encoding="utf-8")
    settings = Settings(data_dir=data, watch_policy=False, watch_fleet=False, scrape_interval_s=0, ext_proc_port=0,
                        max_body_bytes=MAX_BODY, budgets_path=budgets, decision_log_flush_ms=5)
    fleet = load_fleet()
    engine = RoutingEngine(fleet, load_policy(STATIC_POLICY_PATH, fleet), FixedDifficulty(0.1),
                           state=build_state(settings, fleet))
    application = create_app(settings, engine=engine, owns_engine=True)
    with TestClient(application) as client:
        yield client.app


def run(app, scenario):
    """Run ``scenario(stub)`` against the app's ext_proc port in a fresh event loop."""
    async def main():
        async with grpc.aio.insecure_channel(f"127.0.0.1:{app.state.ext_proc_port}") as channel:
            return await scenario(wire.stub(channel), channel)
    return asyncio.run(main())


def chat(content: str, **extra) -> bytes:
    return json.dumps({"model": "auto", "messages": [{"role": "user", "content": content}], **extra}).encode()


def set_headers(response: dict, phase: str = "request") -> dict[str, str]:
    key = f"{phase}Headers" if f"{phase}Headers" in response else f"{phase}Body"
    mutation = response[key]["response"].get("headerMutation", {})
    return {h["header"]["key"]: base64.b64decode(h["header"]["rawValue"]).decode() for h in mutation.get("setHeaders", [])}


def removed_headers(response: dict) -> list[str]:
    return response["requestHeaders"]["response"].get("headerMutation", {}).get("removeHeaders", [])


def streamed(response: dict, phase: str) -> tuple[bytes, bool]:
    sr = response[f"{phase}Body"]["response"]["bodyMutation"]["streamedResponse"]
    return base64.b64decode(sr.get("body", "")), bool(sr.get("endOfStream"))


async def request_phase(call, body: bytes, headers=REQUEST_HEADERS, metadata=None,
                        modes=("FULL_DUPLEX_STREAMED", "FULL_DUPLEX_STREAMED")) -> list[dict]:
    """Envoy's request phase: headers (with protocol_config), then the body in 64 KiB chunks, all
    written before reading (FULL_DUPLEX_STREAMED); returns the responses up to the body's end or an
    immediate response."""
    await call.write(wire.headers_request("request", headers, metadata=metadata, body_modes=modes))
    chunks = [body[i:i + CHUNK] for i in range(0, len(body), CHUNK)]
    for i, chunk in enumerate(chunks):
        await call.write(wire.body_request("request", chunk, i == len(chunks) - 1))
    out = []
    while True:
        r = wire.as_dict(await call.read())
        out.append(r)
        if "immediateResponse" in r or ("requestBody" in r and streamed(r, "request")[1]):
            return out


async def response_phase(call, status: int, content_type: str, chunks: list[bytes], served: str | None = None) -> list[dict]:
    """Envoy's response phase: response headers, then each body chunk (echoes read one by one)."""
    meta = {"envoy.lb": {"x-gateway-destination-endpoint-served": served}} if served else None
    await call.write(wire.headers_request("response", {":status": str(status), "content-type": content_type},
                                          metadata=meta))
    out = [wire.as_dict(await call.read())]
    for i, chunk in enumerate(chunks):
        await call.write(wire.body_request("response", chunk, i == len(chunks) - 1, metadata=meta))
        out.append(wire.as_dict(await call.read()))
    return out


def _budgeted_serve(serve, tmp_path, **settings) -> tuple[int, str]:
    """A real ``serve`` on ``tmp_path / "data"`` with its ext_proc port (returned with the HTTP base URL), no
    scraping and a $100/day budget on ``tenant:acme``; ``settings`` more of its settings."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    budgets = tmp_path / "budgets.yaml"
    budgets.write_text("apiVersion: pointsman/v1\nkind: Budgets\nbudgets:\n"
                       "  - {scope: 'tenant:acme', window: day, limit_usd: 100}\n", encoding="utf-8")
    _, base = serve(tmp_path / "data", ext_proc_port=port, scrape_interval_s=0, budgets_path=budgets, **settings)
    return port, base


def outcome_of(app, decision_id: str, timeout_s: float = 10.0):
    rt = app.state.runtime
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        logged = rt.outcome_log.decision(decision_id)
        if logged is not None and logged.outcomes:
            return logged.outcomes[0]
        time.sleep(0.02)
    raise AssertionError(f"no outcome recorded for {decision_id}")


def test_chat_request_is_routed_rewritten_and_its_outcome_recorded(app):
    body = chat("What is the capital of France?", max_tokens=64, metadata={"trace": "x" * 100_000})  # two chunks
    answer = {"id": "c1", "object": "chat.completion", "model": "meta-llama/Llama-3.1-8B-Instruct",
              "choices": [{"index": 0, "message": {"role": "assistant", "content": "Paris."}, "finish_reason": "stop"}],
              "usage": {"prompt_tokens": 31, "completion_tokens": 3, "total_tokens": 34,
                        "prompt_tokens_details": {"cached_tokens": 16}}}

    async def scenario(stub, _):
        call = stub.Process()
        req = await request_phase(call, body)
        served = set_headers(req[0])["x-gateway-destination-endpoint"].split(",")[0]
        resp = await response_phase(call, 200, "application/json", [json.dumps(answer).encode()], served=served)
        await call.done_writing()
        return req, resp

    req, resp = run(app, scenario)
    headers = set_headers(req[0])
    decision_id = headers["x-pointsman-decision-id"]
    dest = headers["x-gateway-destination-endpoint"].split(",")
    assert dest[0] in ONPREM_8B and set(dest) == set(ONPREM_8B)  # picked endpoint first, then its fallback
    assert req[0]["dynamicMetadata"]["envoy.lb"]["x-gateway-destination-endpoint"] == headers["x-gateway-destination-endpoint"]
    assert req[0]["requestHeaders"]["response"]["clearRouteCache"] is True
    assert headers["x-pointsman-target"] == "onprem-8b"
    assert headers["x-gateway-model-name"] == "meta-llama/Llama-3.1-8B-Instruct"
    assert removed_headers(req[0]) == ["x-prefiller-host-port"]  # a client cannot ask for a prefill hop
    forwarded = b"".join(streamed(r, "request")[0] for r in req[1:])
    assert [streamed(r, "request")[1] for r in req[1:]] == [False] * (len(req) - 2) + [True]
    assert all(len(streamed(r, "request")[0]) <= wire.MAX_CHUNK_BYTES for r in req[1:])
    assert int(headers["content-length"]) == len(forwarded)
    sent = json.loads(forwarded)
    assert sent == {**json.loads(body), "model": "meta-llama/Llama-3.1-8B-Instruct"}
    assert set_headers(resp[0], "response") == {"x-pointsman-decision-id": decision_id}
    assert streamed(resp[1], "response") == (json.dumps(answer).encode(), True)  # passed back as it came
    out = outcome_of(app, decision_id)
    assert (out.status, out.served_target, out.served_model) == ("ok", "onprem-8b", "meta-llama/Llama-3.1-8B-Instruct")
    assert (out.usage.prompt_tokens, out.usage.cached_tokens, out.usage.completion_tokens) == (31, 16, 3)
    assert out.e2e_latency_ms > 0 and out.ttft_ms is not None
    state, deadline = app.state.runtime.live.engine.state, time.monotonic() + 10.0
    while state.record(decision_id) is not None and time.monotonic() < deadline:
        time.sleep(0.02)  # stored, then settled, in the same background task: the log shows it first
    assert state.record(decision_id) is None  # settled: the load is released
    metrics = app.state.runtime.metrics.render().decode()
    assert 'pointsman_ext_proc_requests_total{result="routed"}' in metrics
    assert 'pointsman_decisions_total{rule="default",target="onprem-8b"}' in metrics


def test_streamed_sse_response_reports_usage_ttft_and_tpot(app):
    events = [{"choices": [{"delta": {"content": w}}], "model": "m", "usage": None} for w in ("Hel", "lo", " there")]
    events.append({"choices": [], "model": "meta-llama/Llama-3.1-8B-Instruct",
                   "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}})
    sse = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"
    cuts = [0, 17, 60, 61, 150, len(sse)]  # chunks split mid-line and mid-event
    chunks = [sse[a:b] for a, b in zip(cuts, cuts[1:])]

    async def scenario(stub, _):
        call = stub.Process()
        req = await request_phase(call, chat("Say hello.", stream=True, stream_options={"include_usage": True}))
        resp = await response_phase(call, 200, "text/event-stream", chunks)
        await call.done_writing()
        return req, resp

    req, resp = run(app, scenario)
    decision_id = set_headers(req[0])["x-pointsman-decision-id"]
    assert b"".join(streamed(r, "response")[0] for r in resp[1:]) == sse
    assert [streamed(r, "response")[1] for r in resp[1:]] == [False] * (len(chunks) - 1) + [True]
    out = outcome_of(app, decision_id)
    assert out.status == "ok" and (out.usage.prompt_tokens, out.usage.completion_tokens) == (12, 3)
    assert out.served_target is None or out.served_target == "onprem-8b"
    assert out.ttft_ms is not None and out.tpot_ms is not None and out.e2e_latency_ms >= out.ttft_ms


@pytest.mark.parametrize("deltas", [3, 900])
def test_a_stream_without_usage_books_at_least_the_deltas_it_streamed(app, deltas):
    """OpenAI streams carry no usage unless the client asks (``stream_options.include_usage``): a 900-delta
    answer to an uncapped request booked the fleet's default output estimate (256 tokens). Now it books at
    least what it streamed; a short one still books the estimate."""
    events = [{"choices": [{"delta": {"role": "assistant", "content": ""}}]}]
    events += [{"choices": [{"delta": {"content": f" w{i}"}}]} for i in range(deltas)]
    events.append({"choices": [{"delta": {}, "finish_reason": "stop"}]})
    sse = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"
    chunks = [sse[i:i + 4096] for i in range(0, len(sse), 4096)]

    async def scenario(stub, _):
        call = stub.Process()
        req = await request_phase(call, chat("Tell me a long story.", stream=True))
        await response_phase(call, 200, "text/event-stream", chunks)
        await call.done_writing()
        return req

    req = run(app, scenario)
    headers = set_headers(req[0])
    out = outcome_of(app, headers["x-pointsman-decision-id"])
    estimate = app.state.fleet_state.fleet.output_tokens(headers["x-pointsman-target"], None)
    assert out.status == "ok" and 3 < estimate < 900
    if deltas > estimate:
        assert out.usage is not None and out.usage.completion_tokens == deltas  # before: none, the estimate booked
    else:
        assert out.usage is None or out.usage.completion_tokens is None  # the estimate is booked


def test_disaggregated_decision_names_decode_destinations_and_the_prefill_endpoint(app):
    body = chat("Summarise this report. " + "The quarterly cache hit ratio rose again. " * 600, max_tokens=100)

    async def scenario(stub, _):
        call = stub.Process()
        req = await request_phase(call, body)
        await call.done_writing()
        call.cancel()
        return req

    req = run(app, scenario)
    headers = set_headers(req[0])
    assert headers["x-pointsman-target"] == "onprem-70b"
    # which replica among tied ones depends on the decisions before (fair ties take turns): any of the pool's
    assert re.fullmatch(r"llama-70b-prefill-\d\.inference\.internal:8000", headers["x-prefiller-host-port"])
    dest = headers["x-gateway-destination-endpoint"].split(",")
    assert re.fullmatch(r"llama-70b-decode-\d\.inference\.internal:8000", dest[0])
    assert all("decode" in d for d in dest)  # never a prefill endpoint: the decode side calls it
    assert "x-prefiller-host-port" not in removed_headers(req[0])
    sent = json.loads(b"".join(streamed(r, "request")[0] for r in req[1:]))
    assert "routing" not in sent and sent["model"] == "meta-llama/Llama-3.3-70B-Instruct"


def test_subset_hint_restricts_the_pick_and_an_unknown_subset_is_503(app):
    hint = {"envoy.lb.subset_hint": {"x-gateway-destination-endpoint-subset": ["llama-8b-1.inference.internal:8000"]}}
    bare = {"envoy.lb.subset_hint": {"x-gateway-destination-endpoint-subset": "llama-8b-0.inference.internal"}}
    nowhere = {"envoy.lb.subset_hint": {"x-gateway-destination-endpoint-subset": ["10.9.9.9:8000"]}}

    async def scenario(stub, _):
        out = []
        for meta in (hint, bare, nowhere):
            call = stub.Process()
            out.append(await request_phase(call, chat("Hi."), metadata=meta))
            call.cancel()
        return out

    one, port_less, none = run(app, scenario)
    assert set_headers(one[0])["x-gateway-destination-endpoint"] == "llama-8b-1.inference.internal:8000"
    assert set_headers(port_less[0])["x-gateway-destination-endpoint"] == "llama-8b-0.inference.internal:8000"
    imm = none[-1]["immediateResponse"]
    assert imm["status"]["code"] == "ServiceUnavailable"
    error = json.loads(base64.b64decode(imm["body"]))["error"]
    assert error["code"] == "no_eligible_target" and "health" in error["message"]


def test_budget_refusal_is_429_and_bad_or_oversized_bodies_are_400_and_413(app):
    shed_headers = {**REQUEST_HEADERS, "x-pointsman-tenant": "broke"}

    async def scenario(stub, _):
        out = []
        for body, headers in ((chat("Hi."), shed_headers), (b"{not json", REQUEST_HEADERS),
                              (b'{"messages": []}', REQUEST_HEADERS), (b"x" * (MAX_BODY + 1), REQUEST_HEADERS)):
            call = stub.Process()
            out.append((await request_phase(call, body, headers=headers))[-1]["immediateResponse"])
            assert await call.read() == grpc.aio.EOF  # the picker ends the stream after an immediate response
        return out

    shed, malformed, empty, large = run(app, scenario)
    assert shed["status"]["code"] == "TooManyRequests"
    assert json.loads(base64.b64decode(shed["body"]))["error"]["code"] == "budget_exhausted"
    assert malformed["status"]["code"] == "BadRequest"
    assert json.loads(base64.b64decode(malformed["body"]))["error"]["code"] == "malformed_json"
    assert json.loads(base64.b64decode(empty["body"]))["error"]["param"] == "messages"
    assert large["status"]["code"] == "PayloadTooLarge"
    assert json.loads(base64.b64decode(large["body"]))["error"]["param"] == "max_body_bytes"


def test_client_cancelling_mid_stream_is_recorded_as_cancelled(app):
    first = b'data: {"choices": [{"delta": {"content": "Once upon"}}]}\n\n'

    async def scenario(stub, _):
        call = stub.Process()
        req = await request_phase(call, chat("Tell me a long story.", stream=True))
        await response_phase(call, 200, "text/event-stream", [])
        await call.write(wire.body_request("response", first, False))
        echo = wire.as_dict(await call.read())
        call.cancel()  # the client went away: Envoy resets the ext_proc stream
        return req, echo

    req, echo = run(app, scenario)
    decision_id = set_headers(req[0])["x-pointsman-decision-id"]
    assert streamed(echo, "response") == (first, False)
    out = outcome_of(app, decision_id)
    assert out.status == "cancelled" and out.usage.completion_tokens is None
    deadline = time.monotonic() + 5  # the outcome can reach the log a moment before the hold is released
    while app.state.runtime.live.engine.state.record(decision_id) is not None:
        assert time.monotonic() < deadline, "the cancelled request's hold was never released"
        time.sleep(0.01)


def test_a_stream_cancelled_after_its_answer_started_books_its_estimate(app):
    """The upstream answered 200 and streamed a chunk, then the client went away: the request ran and the
    upstream bills what it generated, so the decision's estimate is booked. Before, the hold was released
    and $0 booked: a client cancelling each stream just before its usage chunk never spent its budget.
    A stream cancelled before any response byte still only releases its hold."""
    first = b'data: {"choices": [{"delta": {"content": "Once upon"}}]}\n\n'
    state = app.state.fleet_state

    def spent(target):
        return state.ledger.effective_price_per_token(target, "day").spent_usd

    async def scenario(stub, _, *, answer):
        call = stub.Process()
        req = await request_phase(call, chat("Tell me a long story.", stream=True))
        headers = set_headers(req[0])
        before = spent(headers["x-pointsman-target"])
        if answer:
            await response_phase(call, 200, "text/event-stream", [])
            await call.write(wire.body_request("response", first, False))
            await call.read()
        call.cancel()
        return headers["x-pointsman-decision-id"], headers["x-pointsman-target"], before

    for answer in (True, False):
        decision_id, target, before = run(app, functools.partial(scenario, answer=answer))
        out = outcome_of(app, decision_id)
        assert out.status == "cancelled" and (out.ttft_ms is not None) == answer
        deadline = time.monotonic() + 5  # the outcome can reach the log a moment before it settles
        while state.record(decision_id) is not None:
            assert time.monotonic() < deadline, "the cancelled request was never settled or released"
            time.sleep(0.01)
        booked = spent(target) - before
        estimate = state.claims(decision_id).estimated_cost_usd
        assert booked == pytest.approx(estimate if answer else 0.0, abs=1e-9), (answer, booked)  # before: 0 both


def test_buffered_mode_answers_each_message_and_carries_the_decision_in_the_body_response(app):
    async def scenario(stub, _):
        call = stub.Process()
        modes = ("BUFFERED", "BUFFERED")
        await call.write(wire.headers_request("request", REQUEST_HEADERS, body_modes=modes))
        headers_answer = wire.as_dict(await call.read())
        await call.write(wire.body_request("request", chat("Hi there."), True))
        body_answer = wire.as_dict(await call.read())
        await call.write(wire.headers_request("response", {":status": "503", "content-type": "application/json"}))
        await call.read()
        await call.write(wire.body_request("response", b'{"error": {"message": "overloaded"}}', True))
        last = wire.as_dict(await call.read())
        await call.done_writing()
        return headers_answer, body_answer, last

    headers_answer, body_answer, last = run(app, scenario)
    assert "requestHeaders" in headers_answer and not set_headers(headers_answer)
    headers = set_headers(body_answer)
    new_body = base64.b64decode(body_answer["requestBody"]["response"]["bodyMutation"]["body"])
    assert headers["x-gateway-destination-endpoint"].split(",")[0] in ONPREM_8B
    assert int(headers["content-length"]) == len(new_body) and json.loads(new_body)["model"].startswith("meta-llama/")
    assert "responseBody" in last and "bodyMutation" not in last["responseBody"].get("response", {})
    out = outcome_of(app, headers["x-pointsman-decision-id"])
    assert out.status == "error" and out.error == "upstream HTTP 503"


def test_a_request_to_an_api_that_is_no_generation_is_refused_not_rewritten_to_a_chat_model(app):
    """An embeddings body (``model`` + ``input``) read as a Responses request was routed with ``model`` rewritten to a
    chat model's -- found by the fresh-eyes tester. Such paths are a 400 naming the path; a chat path behind a
    prefix and with a query string is decided as before."""
    embeddings = json.dumps({"model": "text-embedding-3-small", "input": "hello"}).encode()

    async def scenario(stub, _):
        out = []
        for path, body in (("/v1/embeddings", embeddings), ("/openai/v1/audio/transcriptions?x=1", embeddings),
                           ("/v1/rerank", embeddings), ("/openai/v1/chat/completions?api-version=1", chat("Hi."))):
            call = stub.Process()
            out.append(await request_phase(call, body, headers={**REQUEST_HEADERS, ":path": path}))
            await call.done_writing()
        return out

    *refused, decided = run(app, scenario)
    for answers in refused:
        answer = answers[-1]
        assert answer["immediateResponse"]["status"]["code"] == "BadRequest"
        error = json.loads(base64.b64decode(answer["immediateResponse"]["body"]))["error"]
        assert error["code"] == "not_a_generation_request" and error["param"] == ":path"
    assert "immediateResponse" not in decided[-1] and set_headers(decided[0])  # routed: destination headers set
    assert not_generation("/v1/images/generations") and not not_generation("/v1beta/models/gemini-pro:generateContent")
    assert not not_generation("/v1/messages") and not not_generation("/v1/responses") and not not_generation("")


def test_bodyless_requests_pass_through_and_health_is_served(app):
    async def scenario(stub, channel):
        call = stub.Process()
        await call.write(wire.headers_request("request", {":method": "GET", ":path": "/v1/models"}, True))
        passthrough = wire.as_dict(await call.read())
        call.cancel()
        health = health_pb2_grpc.HealthStub(channel)
        statuses = [(await health.Check(health_pb2.HealthCheckRequest(service=s))).status
                    for s in ("", "liveness", "readiness", "envoy.service.ext_proc.v3.ExternalProcessor")]
        return passthrough, statuses

    passthrough, statuses = run(app, scenario)
    assert passthrough == {"requestHeaders": {"response": {"headerMutation": {}}}}
    assert statuses == [health_pb2.HealthCheckResponse.SERVING] * 4


def test_rewrite_and_usage_reader_edge_cases():
    raw = b'{"model": "auto", "tools": [{"function": {"parameters": {"properties": {"model": {"type": "string"}}}}}]}'
    body = json.loads(raw)
    assert json.loads(rewrite_request(raw, body, "m")) == {**body, "model": "m"}  # nested "model" key: re-serialized
    assert rewrite_request(b'{"model":"m","messages":[]}', {"model": "m", "messages": []}, "m") is None
    spliced = rewrite_request(b'{"messages": [], "model" : "a\\"b"}', {"messages": [], "model": 'a"b'}, "x/y")
    assert spliced == b'{"messages": [], "model" : "x/y"}'
    responses = UsageReader(True, 1000)
    for part in (b'event: response.completed\ndata: {"type": "response.completed", "response": {"model": "gpt",',
                 b' "usage": {"input_tokens": 5, "output_tokens": 7, "input_tokens_details": {"cached_tokens": 2}}}}\n'):
        responses.feed(part)
    s = responses.summary()
    assert (s.usage, s.model, s.complete) == ({"input_tokens": 5, "output_tokens": 7, "input_tokens_details": {"cached_tokens": 2}}, "gpt", True)
    big = UsageReader(False, 10)
    big.feed(b'{"usage": {"prompt_tokens": 1}}')
    assert big.summary().usage is None  # beyond the limit: not kept, not parsed


def test_pointsman_serve_runs_the_picker_beside_http(tmp_path, serve):
    """The real process (uvloop, the bundled estimator): ``--ext-proc-port`` via its setting; a decision
    over ext_proc is logged with its outcome, and /metrics counts it."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    _, base = serve(tmp_path, ext_proc_port=port, decision_log_flush_ms=5, scrape_interval_s=0)

    async def scenario():
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = wire.stub(channel).Process()
            req = await request_phase(call, chat("What is 2 + 2?"))
            await response_phase(call, 200, "application/json",
                                 [b'{"usage": {"prompt_tokens": 9, "completion_tokens": 2}}'])
            await call.done_writing()
            return req

    req = asyncio.run(scenario())
    decision_id = set_headers(req[0])["x-pointsman-decision-id"]
    deadline = time.monotonic() + 10
    while 'pointsman_outcomes_total{status="stored"} 1.0' not in (m := httpx.get(f"{base}/metrics").text):
        assert time.monotonic() < deadline, m
        time.sleep(0.05)
    assert 'pointsman_ext_proc_requests_total{result="routed"} 1.0' in m
    with OutcomeLog(tmp_path / "outcomes.db") as log:
        assert log.decision(decision_id).outcomes[0].usage.completion_tokens == 2


def test_destination_list_is_bounded_by_the_setting(app):
    engine = app.state.runtime.live.engine
    d = engine.route(parse_route_request({"messages": [{"role": "user", "content": "Hi."}]}), dispatch=False)
    assert destinations(d, None)[0] == host_port(d.base_url) and len(destinations(d, None)) == 2
    assert destinations(d, 1) == [host_port(d.base_url)]


def _anthropic_stream() -> bytes:
    """An Anthropic Messages stream: input and cache counts in message_start, the output count in message_delta."""
    events = [("message_start", {"type": "message_start", "message": {
                  "id": "msg_1", "model": "claude-sonnet-4-5", "usage": {
                      "input_tokens": 12, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 2048,
                      "output_tokens": 1}}}),
              ("content_block_delta", {"type": "content_block_delta", "index": 0,
                                       "delta": {"type": "text_delta", "text": "Paris."}}),
              ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn"},
                                 "usage": {"output_tokens": 9}}),
              ("message_stop", {"type": "message_stop"})]
    return b"".join(f"event: {name}\ndata: {json.dumps(e)}\n\n".encode() for name, e in events)


def test_anthropic_stream_usage_is_read_from_its_first_and_last_events(app):
    sse = _anthropic_stream()

    async def scenario(stub, _):
        call = stub.Process()
        req = await request_phase(call, chat("What is the capital of France?", stream=True))
        resp = await response_phase(call, 200, "text/event-stream", [sse[:100], sse[100:]])
        await call.done_writing()
        return req, resp

    req, _ = run(app, scenario)
    out = outcome_of(app, set_headers(req[0])["x-pointsman-decision-id"])
    assert out.status == "ok" and out.served_model == "claude-sonnet-4-5"
    assert (out.usage.prompt_tokens, out.usage.cached_tokens, out.usage.completion_tokens) == (12 + 2048, 2048, 9)


def test_unpriceable_upstream_usage_books_the_estimate_and_is_counted(app):
    answer = {"id": "c2", "object": "chat.completion", "model": "m", "choices": [],
              "usage": {"prompt_tokens": 40, "completion_tokens": 3, "prompt_tokens_details": {"audio_tokens": 30}}}
    metric = app.state.runtime.metrics.unpriced_usage.labels("ext_proc")
    before = metric._value.get()

    async def scenario(stub, _):
        call = stub.Process()
        req = await request_phase(call, chat("What is the capital of France?"))
        await response_phase(call, 200, "application/json", [json.dumps(answer).encode()])
        await call.done_writing()
        return req

    decision_id = set_headers(run(app, scenario)[0])["x-pointsman-decision-id"]
    out = outcome_of(app, decision_id)
    assert out.status == "ok" and out.usage.prompt_tokens is None  # stored without the usage it could not price
    assert metric._value.get() == before + 1
    state = app.state.runtime.live.engine.state
    deadline = time.monotonic() + 10
    while state.record(decision_id) is not None and time.monotonic() < deadline:
        time.sleep(0.02)
    settled = state.ledger.settle(decision_id, 0.0)  # a repeat returns the first settlement
    claims = state.claims(decision_id)  # the decision's estimate, carried by its signed id (no budget: no hold)
    assert settled.replayed and claims is not None and claims.estimated_cost_usd > 0
    assert settled.actual_cost_usd == pytest.approx(claims.estimated_cost_usd, abs=1e-9)  # booked (in nano-USD)


@pytest.mark.parametrize("sse,parts,usage,model", [
    (False, [b'{"candidates": [], "modelVersion": "gemini-2.5-flash", "usageMetadata": {"promptTokenCount": 9, ',
             b'"candidatesTokenCount": 4, "thoughtsTokenCount": 6, "totalTokenCount": 19}}'],
     {"promptTokenCount": 9, "candidatesTokenCount": 4, "thoughtsTokenCount": 6, "totalTokenCount": 19},
     "gemini-2.5-flash"),
    (True, [b'data: {"modelVersion": "gemini-2.5-flash", "usageMetadata": {"promptTokenCount": 9}}\r\n\r\n',
            b'data: {"modelVersion": "gemini-2.5-flash", "usageMetadata": {"promptTokenCount": 9, '
            b'"candidatesTokenCount": 4, "totalTokenCount": 13}}\r\n\r\n'],
     {"promptTokenCount": 9, "candidatesTokenCount": 4, "totalTokenCount": 13}, "gemini-2.5-flash"),
    (False, [b'{"output": {"message": {"role": "assistant"}}, "stopReason": "end_turn", "usage": {"inputTokens": 3, '
             b'"outputTokens": 2, "cacheReadInputTokens": 5, "totalTokens": 10}}'],
     {"inputTokens": 3, "outputTokens": 2, "cacheReadInputTokens": 5, "totalTokens": 10}, None),
])
def test_usage_reader_keeps_each_providers_shape(sse, parts, usage, model):
    reader = UsageReader(sse, 10_000)
    for part in parts:
        reader.feed(part)
    s = reader.summary()
    assert (s.usage, s.model) == (usage, model)
    parse_outcomes({"decision_id": "d1", "usage": s.usage})  # and the outcome schema reads it


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 40), st.integers(0, 5), st.lists(st.integers(1, 400), min_size=1, max_size=12))
def test_the_usage_reader_reads_every_event_after_a_line_past_its_limit(deltas, long_at, cuts):
    """An SSE line longer than the reader's limit is skipped, and reading resumes at the next line,
    however the stream is cut into chunks: the usage and the deltas after the long line are all read
    (before: resuming at a chunk's last newline dropped the complete lines inside that chunk)."""
    lines = [b'data: {"choices": [{"delta": {"content": "w"}}]}' for _ in range(deltas)]
    lines.insert(min(long_at, len(lines)), b"data: " + b"x" * 3000)
    lines.append(b'data: {"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": %d}}' % deltas)
    sse = b"\n".join(lines) + b"\n\ndata: [DONE]\n\n"
    reader, at = UsageReader(True, 1000), 0
    for cut in cuts * (len(sse) // sum(cuts) + 1):
        reader.feed(sse[at:at + cut])
        at += cut
    s = reader.summary()
    assert s.usage == {"prompt_tokens": 4, "completion_tokens": deltas} and s.complete
    assert s.streamed_tokens == deltas  # each delta before the long line and after it


@pytest.fixture(scope="module")
def keyed_app(tmp_path_factory):
    """The service with a gateway key configured and the picker on its own host setting."""
    data = tmp_path_factory.mktemp("extproc-keys")
    settings = Settings(data_dir=data, watch_policy=False, watch_fleet=False, scrape_interval_s=0, ext_proc_port=0,
                        ext_proc_host="127.0.0.1", gateway_api_keys="gw=s3cret-gateway-key",
                        decision_log_flush_ms=5)
    fleet = load_fleet()
    engine = RoutingEngine(fleet, load_policy(STATIC_POLICY_PATH, fleet), FixedDifficulty(0.1),
                           state=build_state(settings, fleet))
    with TestClient(create_app(settings, engine=engine, owns_engine=True)) as client:
        yield client.app


@pytest.mark.parametrize("metadata", [None, (("authorization", "Bearer wrong"),), (("x-api-key", ""),)],
                         ids=["no key", "unknown key", "empty key"])
def test_with_keys_configured_a_stream_without_a_valid_key_is_unauthenticated(keyed_app, metadata):
    """Finding C: the gRPC port no longer routes for anyone who reaches it once keys are configured."""
    async def scenario(stub, _):
        call = stub.Process(metadata=metadata)  # refused before any message is read
        return await call.code(), await call.details()

    code, details = run(keyed_app, scenario)
    assert code == grpc.StatusCode.UNAUTHENTICATED and "needs an API key" in details


@pytest.mark.parametrize("header", ["authorization", "x-api-key"])
def test_a_gateway_key_in_the_stream_metadata_routes_under_its_budget_scope(keyed_app, header):
    """Envoy's ``grpc_service.initial_metadata`` carries the key; the decision holds ``key:gw``, as over HTTP."""
    value = "Bearer s3cret-gateway-key" if header == "authorization" else "s3cret-gateway-key"

    async def scenario(stub, _):
        call = stub.Process(metadata=((header, value),))
        req = await request_phase(call, chat("What is 2 + 2?"))
        decision_id = set_headers(req[0])["x-pointsman-decision-id"]
        in_flight = keyed_app.state.fleet_state.record(decision_id)  # held until the stream ends
        call.cancel()
        return decision_id, in_flight

    decision_id, in_flight = run(keyed_app, scenario)
    assert "key:gw" in in_flight.scopes
    assert outcome_of(keyed_app, decision_id).status == "cancelled"


def test_an_exposed_picker_without_keys_is_refused_at_start():
    """A non-loopback ``POINTSMAN_EXT_PROC_HOST`` without API keys refuses to start, as the HTTP host does."""
    settings = Settings(ext_proc_port=0, ext_proc_host="0.0.0.0", watch_policy=False, watch_fleet=False)
    with pytest.raises(ValueError, match="refusing to serve on 0.0.0.0"):
        create_app(settings)


def test_the_end_clients_routing_object_is_dropped_and_the_gateways_headers_decide(app):
    """Behind a proxy the body is the client's: its ``routing`` (a tenant with budget left, a token count of
    its choosing) must not override the gateway's ``x-pointsman-tenant``. ``tenant:broke`` has no budget."""
    body = chat("What is 2 + 2?", routing={"tenant": "someone-else", "prompt_tokens": 1})

    async def scenario(stub, _):
        call = stub.Process()
        req = await request_phase(call, body, headers={**REQUEST_HEADERS, "x-pointsman-tenant": "broke"})
        call.cancel()
        return req

    req = run(app, scenario)
    assert req[-1]["immediateResponse"]["status"]["code"] == "TooManyRequests"  # the gateway's tenant's budget


def test_the_picker_port_may_take_no_key_and_a_bearer_token_wins_as_over_http():
    """``ext_proc_require_key=false`` (a Gateway API InferencePool sends no metadata) admits a keyless
    stream; with keys required, the bearer token decides even after a wrong ``x-api-key``, as over HTTP."""
    from types import SimpleNamespace

    from pointsman.service.ext_proc import ExtProcServer
    from pointsman.service.keys import KeySource

    keys = KeySource.from_settings(Settings(gateway_api_keys="gw=s3cret-gateway-key"))
    open_port = ExtProcServer(SimpleNamespace(settings=Settings(ext_proc_require_key=False)), keys)
    assert open_port.authenticate(()) is not None and open_port.authenticate(()).key_id is None
    keyed = ExtProcServer(SimpleNamespace(settings=Settings()), keys)
    assert keyed.authenticate(()) is None
    both = (("x-api-key", "wrong"), ("authorization", "Bearer s3cret-gateway-key"))
    assert keyed.authenticate(both).key_id == "gw"
    assert keyed.authenticate((("authorization", "Bearer wrong"), ("x-api-key", "s3cret-gateway-key"))) is None


def test_the_picker_binds_an_ipv6_loopback(tmp_path):
    """``POINTSMAN_EXT_PROC_HOST=::1`` is a loopback host: the address is bracketed for gRPC."""
    if not socket.has_ipv6:
        pytest.skip("no IPv6 here")
    settings = Settings(data_dir=tmp_path, watch_policy=False, watch_fleet=False, scrape_interval_s=0,
                        ext_proc_port=0, ext_proc_host="::1")
    try:
        with TestClient(create_app(settings)) as client:
            port = client.app.state.ext_proc_port
    except OSError as exc:  # an IPv6-less kernel
        pytest.skip(f"cannot bind ::1 here: {exc}")
    assert port > 0


def test_an_integer_past_the_conversion_limit_is_a_400_naming_its_field(app):
    """Issue 22: a 5,000-digit ``seed`` ended the stream INTERNAL (Python's int-conversion limit)."""
    body = b'{"model": "auto", "messages": [{"role": "user", "content": "Hi."}], "seed": ' + b"9" * 5000 + b"}"

    async def scenario(stub, _):
        call = stub.Process()
        return (await request_phase(call, body))[-1]["immediateResponse"]

    refused = run(app, scenario)
    assert refused["status"]["code"] == "BadRequest"
    error = json.loads(base64.b64decode(refused["body"]))["error"]
    assert error["code"] == "number_too_long" and error["param"] == "seed"


@pytest.mark.parametrize("first", ["request_body", "request_trailers"])
def test_a_request_phase_message_before_the_request_headers_ends_the_stream_invalid_argument(app, first):
    """Issue 22: a request body sent before its headers was decided on (no routing context, no
    headers to answer) instead of refused. Envoy never sends that order: the stream ends
    INVALID_ARGUMENT naming the order, and nothing is decided."""
    routed = app.state.runtime.metrics.ext_proc_requests.labels("routed")._value.get()

    async def scenario(stub, _):
        call = stub.Process()
        if first == "request_body":
            await call.write(wire.body_request("request", chat("Hi."), True))
        else:
            await call.write(wire.pb.ProcessingRequest(request_trailers=wire.pb.HttpTrailers()))
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call.read()
        return err.value

    err = run(app, scenario)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert first in err.details() and "request_headers" in err.details()
    assert app.state.runtime.metrics.ext_proc_requests.labels("routed")._value.get() == routed


def test_a_body_past_the_limit_in_64_kib_chunks_is_a_413_and_the_rest_is_read_and_dropped(app):
    """Issue 22: a 12 MiB body in 64 KiB chunks (limit 2 MB here) ended INTERNAL at the sender: the
    picker answered 413 and closed the stream while the sender still wrote the rest of the body."""
    body = chat("x" * (12 * 1024 * 1024))

    async def scenario(stub, _):
        call = stub.Process()
        answer = (await request_phase(call, body))[-1]
        return answer, await call.read(), await call.code()

    answer, after, code = run(app, scenario)
    refused = answer["immediateResponse"]
    assert refused["status"]["code"] == "PayloadTooLarge"
    assert json.loads(base64.b64decode(refused["body"]))["error"]["code"] == "body_too_large"
    assert after == grpc.aio.EOF and code == grpc.StatusCode.OK


def test_an_unknown_gie_objective_gets_the_default_class_and_an_unknown_slo_class_header_is_a_400(app, caplog):
    """GIE's objective header names a cluster InferenceObjective: one that is no SLO class of the fleet is
    routed with the default class and logged once; our own ``x-pointsman-slo-class`` must name a class."""
    async def scenario(stub, _):
        out = []
        for headers in ({**REQUEST_HEADERS, "x-gateway-inference-objective": "premium-chat"},
                        {**REQUEST_HEADERS, "x-gateway-inference-objective": "premium-chat"},
                        {**REQUEST_HEADERS, "x-pointsman-slo-class": "Interactive"}):
            call = stub.Process()
            out.append((await request_phase(call, chat("What is 2 + 2?"), headers=headers))[-1])
            call.cancel()
        return out

    with caplog.at_level(logging.WARNING, logger="pointsman.service.ext_proc"):
        gie, again, ours = run(app, scenario)
    assert "immediateResponse" not in gie and "immediateResponse" not in again  # routed
    warned = [r.getMessage() for r in caplog.records if "premium-chat" in r.getMessage()]
    assert warned == ["x-gateway-inference-objective 'premium-chat' is not an SLO class of the fleet "
                      "(interactive, long-context): such requests get the fleet's default class"]
    assert ours["immediateResponse"]["status"]["code"] == "BadRequest"
    error = json.loads(base64.b64decode(ours["immediateResponse"]["body"]))["error"]
    assert error["param"] == "routing.slo_class" and "did you mean 'interactive'" in error["message"]


@pytest.mark.parametrize("sse", [False, True], ids=["json", "sse"])
def test_a_gzip_encoded_response_has_its_usage_read(app, sse):
    """OpenAI answers gzip when the client accepts it (httpx and the OpenAI SDK send Accept-Encoding: gzip), and
    Envoy passes the upstream's encoded bytes to ext_proc: the usage must be read from the decoded body, not
    lost (an ok outcome without usage books the decision's estimate: 64 output tokens here, not 3,000)."""
    import gzip

    usage = {"prompt_tokens": 12, "completion_tokens": 3000, "total_tokens": 3012}
    if sse:
        events = [{"choices": [{"delta": {"content": "Hi"}}], "model": "m", "usage": None},
                  {"choices": [], "model": "m", "usage": usage}]
        raw = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"
    else:
        raw = json.dumps({"id": "c", "object": "chat.completion", "model": "m", "usage": usage,
                          "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hi"}}]}).encode()
    body = gzip.compress(raw)
    chunks = [body[:10], body[10:]]

    async def scenario(stub, _):
        call = stub.Process()
        req = await request_phase(call, chat("Say hello.", max_tokens=64, stream=sse))
        meta = None
        await call.write(wire.headers_request("response", {":status": "200", "content-encoding": "gzip",
                                                           "content-type": "text/event-stream" if sse
                                                           else "application/json"}, metadata=meta))
        out = [wire.as_dict(await call.read())]
        for i, chunk in enumerate(chunks):
            await call.write(wire.body_request("response", chunk, i == len(chunks) - 1))
            out.append(wire.as_dict(await call.read()))
        await call.done_writing()
        return req, out

    req, resp = run(app, scenario)
    assert b"".join(streamed(r, "response")[0] for r in resp[1:]) == body  # passed back as it came
    out = outcome_of(app, set_headers(req[0])["x-pointsman-decision-id"])
    assert out.status == "ok" and out.usage is not None
    assert (out.usage.prompt_tokens, out.usage.completion_tokens) == (12, 3000)


def test_usage_reader_decodes_gzip_and_deflate_in_any_cut_and_reads_nothing_from_brotli():
    import gzip
    import zlib

    raw = json.dumps({"model": "m", "usage": {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12}}).encode()
    for encoding, body in (("gzip", gzip.compress(raw)), ("deflate", zlib.compress(raw)), ("", raw)):
        for cut in (1, 3, len(body) // 2):
            reader = UsageReader(False, 1_000_000, encoding)
            for i in range(0, len(body), cut):
                reader.feed(body[i:i + cut])
            assert reader.summary().usage == {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12}
    reader = UsageReader(False, 1_000_000, "br")
    reader.feed(raw)
    assert reader.undecodable and reader.summary().usage is None
    reader = UsageReader(False, 1_000_000, "gzip")  # not gzip at all
    reader.feed(raw)
    assert reader.undecodable and reader.summary().usage is None


def test_a_completions_batch_prompt_counts_an_answer_per_prompt(app):
    """A Completions ``prompt`` list is a batch: the upstream answers each prompt (and ``n`` answers each),
    billing every answer's output; the decision's output estimate (its hold) must count them all, as it
    counts OpenAI's ``n``, not one answer for the whole batch."""
    async def scenario(stub, _):
        call = stub.Process()
        req = await request_phase(call, json.dumps({"model": "auto", "prompt": ["Name a river."] * 20,
                                                    "max_tokens": 100, "n": 2}).encode(),
                                  headers={**REQUEST_HEADERS, ":path": "/v1/completions"})
        await call.done_writing()
        return req

    req = run(app, scenario)
    decision_id = set_headers(req[0])["x-pointsman-decision-id"]
    claims = app.state.runtime.live.engine.state.claims(decision_id)
    assert claims is not None and claims.output_cap_tokens == 20 * 2 * 100


def test_a_completions_batch_needs_its_longest_prompt_to_fit_the_window(app):
    """Two ~75,000-token prompts of one Completions batch fit every target, each prompt being its own
    sequence: the picker refused them 503 no_eligible_target (context-window: the two joined, ~150,000
    tokens > window 131,072), as /v1/route did. It decides now, holding every prompt's tokens; a prompt
    over the window is still refused in a batch -- found by the fresh-eyes tester."""
    prompt = "the river runs to the sea " * 11_500

    async def scenario(stub, _):
        out = []
        for prompts in ([prompt, prompt[::-1]], ["Name a river.", prompt + prompt]):
            call = stub.Process()
            out.append(await request_phase(call, json.dumps({"model": "auto", "prompt": prompts,
                                                             "max_tokens": 100}).encode(),
                                           headers={**REQUEST_HEADERS, ":path": "/v1/completions"}))
            await call.done_writing()
        return out

    batch, over = run(app, scenario)
    assert "immediateResponse" not in batch[-1], batch[-1]
    claims = app.state.runtime.live.engine.state.claims(set_headers(batch[0])["x-pointsman-decision-id"])
    assert claims is not None and claims.prompt_tokens > 131_072 and claims.output_cap_tokens == 2 * 100
    message = json.loads(base64.b64decode(over[-1]["immediateResponse"]["body"]))["error"]["message"]
    assert "context-window: needs" in message


def test_a_completions_best_of_counts_every_answer_generated(app):
    """Completions' ``best_of`` answers are generated and billed server-side, ``n`` of them returned: the
    hold counted ``n`` (one answer's output for ``best_of: 5``)."""
    async def scenario(stub, _):
        out = []
        for body in ({"model": "auto", "prompt": "Name a river.", "max_tokens": 100, "best_of": 5},
                     {"model": "auto", "prompt": ["Name a river.", "Name a lake."], "max_tokens": 100, "n": 2,
                      "best_of": 3}):
            call = stub.Process()
            out.append(await request_phase(call, json.dumps(body).encode(),
                                           headers={**REQUEST_HEADERS, ":path": "/v1/completions"}))
            await call.done_writing()
        return out

    claims = app.state.runtime.live.engine.state.claims
    caps = [claims(set_headers(req[0])["x-pointsman-decision-id"]).output_cap_tokens for req in run(app, scenario)]
    assert caps == [5 * 100, 2 * 3 * 100]


def test_a_completions_prompt_of_token_ids_is_counted_exactly(app):
    """The OpenAI and vLLM Completions APIs take ``prompt`` as a string, a list of strings, a list of token
    ids or a list of token id lists. A prompt of ids was refused 400 'prompt is empty' (ids were dropped as
    "no text"), and an id list beside text prompts was not counted at all. The ids are the upstream's
    tokens: their number is the prompt's exact token count (and each id list of a batch is one prompt,
    answered ``n`` times). A list mixing the forms is in neither API: a 400 naming ``prompt``."""
    ids = list(range(1000, 1000 + 3000))

    async def scenario(stub, _):
        out = []
        for body in ({"model": "auto", "prompt": ids, "max_tokens": 50},
                     {"model": "auto", "prompt": [ids[:700], ids[700:1000], [42]], "max_tokens": 50, "n": 2},
                     {"model": "auto", "prompt": ["Name a river.", ids[:500]], "max_tokens": 50},
                     {"model": "auto", "prompt": [], "max_tokens": 50},
                     {"model": "auto", "prompt": [[]], "max_tokens": 50}):
            call = stub.Process()
            out.append(await request_phase(call, json.dumps(body).encode(),
                                           headers={**REQUEST_HEADERS, ":path": "/v1/completions"}))
            await call.done_writing()
        return out

    one, batch, *refused = run(app, scenario)
    claims = app.state.runtime.live.engine.state.claims
    first = claims(set_headers(one[0])["x-pointsman-decision-id"])
    assert first is not None and first.prompt_tokens == 3000 and first.output_cap_tokens == 50
    second = claims(set_headers(batch[0])["x-pointsman-decision-id"])
    assert second is not None and second.prompt_tokens == 1001 and second.output_cap_tokens == 3 * 2 * 50
    forwarded = json.loads(b"".join(streamed(r, "request")[0] for r in one[1:]))
    assert forwarded["prompt"] == ids  # forwarded as it came
    for req in refused:
        imm = req[-1]["immediateResponse"]
        assert imm["status"]["code"] == "BadRequest"
        assert json.loads(base64.b64decode(imm["body"]))["error"]["param"] == "prompt"


@pytest.mark.parametrize("path, body, prompt_floor", [
    ("/v1/responses", {"model": "auto", "instructions": "Be terse. " * 500, "max_output_tokens": 300,
                       "input": [{"role": "user", "content": [{"type": "input_text", "text": "Name a river."}]},
                                 {"type": "function_call", "name": "lookup", "arguments": "{\"q\": \"rivers\"}"},
                                 {"type": "function_call_output", "output": "Nile, Amazon"}]}, 1000),
    ("/v1/responses", {"model": "auto", "input": "Name a river."}, 1),
    ("/v1/messages", {"model": "auto", "max_tokens": 300, "system": "Be terse. " * 500,
                      "messages": [{"role": "user", "content": "Name a river."},
                                   {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "lookup",
                                                                      "input": {"q": "rivers"}}]},
                                   {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                                                 "content": "Nile, Amazon"}]}]}, 1000),
], ids=["responses", "responses-string", "anthropic-messages"])
def test_responses_and_anthropic_requests_are_routed_with_every_prompt_token(app, path, body, prompt_floor):
    """The picker reads the usage of Responses and Anthropic Messages answers, so their requests come through
    it too: a Responses body (``input``, ``instructions``) was refused 400 'messages: Field required', and an
    Anthropic body's top-level ``system`` prompt was not counted (nor were its tool blocks accepted). Both are
    routed now, the system prompt / instructions counted, the body forwarded as it came."""
    async def scenario(stub, _):
        call = stub.Process()
        req = await request_phase(call, json.dumps(body).encode(), headers={**REQUEST_HEADERS, ":path": path})
        await call.done_writing()
        return req

    req = run(app, scenario)
    assert "immediateResponse" not in req[0], req[0]
    decision_id = set_headers(req[0])["x-pointsman-decision-id"]
    claims = app.state.runtime.live.engine.state.claims(decision_id)
    assert claims is not None and claims.prompt_tokens >= prompt_floor
    assert claims.output_cap_tokens == (300 if "max" in json.dumps(body) else 0)
    forwarded = json.loads(b"".join(streamed(r, "request")[0] for r in req[1:]))
    assert {k: v for k, v in forwarded.items() if k != "model"} == {k: v for k, v in body.items() if k != "model"}


_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5), lambda c: st.lists(c, max_size=3) | st.dictionaries(st.sampled_from(["type", "text", "role", "content", "input", "system", "messages", "prompt", "n", "name", "output", "arguments", "source", "image_url", "refusal"]), c, max_size=4), max_leaves=15)  # noqa: E501


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["messages", "system", "input", "prompt", "n", "instructions",
                                        "max_output_tokens", "model"]), _JSON, max_size=4))
def test_any_json_body_reads_as_a_chat_request_or_a_clear_request_error(body):
    """Whatever a client sends, the picker's reading of it never raises anything but a ``RequestError``
    (a 400 naming the field), never a ``TypeError`` that would end the stream ``INTERNAL``."""
    from pointsman.errors import RequestError
    from pointsman.service.ext_proc_body import chat_request

    with contextlib.suppress(RequestError):
        parse_route_request(chat_request(body))


def test_a_cancelled_anthropic_stream_does_not_book_its_first_events_placeholder_output(app):
    """Anthropic's message_start carries the input counts and a placeholder output count (1); the real one
    comes in message_delta at the end. A client that went away mid-answer left only message_start's usage,
    which booked 1 output token for an answer the upstream had been generating (and bills): a client
    cancelling each stream before its end spent almost nothing. A cancelled stream's partial usage that
    counts fewer output tokens than the decision's estimate books the estimate instead."""
    start = _anthropic_stream().split(b"\n\n")[0] + b"\n\n"  # event: message_start, output_tokens 1
    delta = b'event: content_block_delta\ndata: {"type": "content_block_delta", "index": 0, ' \
            b'"delta": {"type": "text_delta", "text": "Once upon a time"}}\n\n'
    state = app.state.fleet_state

    async def scenario(stub, _):
        call = stub.Process()
        req = await request_phase(call, chat("Tell me a long story.", stream=True))
        await response_phase(call, 200, "text/event-stream", [])
        for chunk in (start, delta * 20):
            await call.write(wire.body_request("response", chunk, False))
            await call.read()
        call.cancel()
        return set_headers(req[0])

    # each target's count read before the stream: its outcome is recorded in the background, maybe settled
    # by the time the scenario returns
    before = {t: state.ledger.effective_price_per_token(t, "day").completion_tokens for t in state.fleet.targets}
    headers = run(app, scenario)
    decision_id, target = headers["x-pointsman-decision-id"], headers["x-pointsman-target"]
    out = outcome_of(app, decision_id)
    assert out.status == "cancelled"
    deadline = time.monotonic() + 5
    while state.record(decision_id) is not None:
        assert time.monotonic() < deadline, "the cancelled request was never settled"
        time.sleep(0.01)
    booked = state.ledger.effective_price_per_token(target, "day").completion_tokens - before[target]
    assert booked == app.state.runtime.live.engine.fleet.output_tokens(target, None)  # before: 1


def test_an_anthropic_cache_control_breakpoint_reaches_the_explicit_cache_estimate(tmp_path):
    """Anthropic's prompt caching is marked on content blocks (most often the system prompt's); the picker
    rebuilds an Anthropic body's system and blocks as chat parts, which dropped their ``cache_control``, so
    a marked request to a ``prompt_cache: explicit`` target was estimated as unmarked: its cache write
    (1.25x input) not priced, its repeat credited no cached prefix -- found by a fresh-eyes tester."""
    from pointsman.policy.fleet import DEFAULT_FLEET_PATH, parse_fleet
    from pointsman.policy.rules.compiler import DEFAULT_POLICY_PATH

    text = DEFAULT_FLEET_PATH.read_text(encoding="utf-8")
    for old, new in (("prompt_cache_ttl_s: 300\n", "prompt_cache_ttl_s: 300\n    prompt_cache: explicit\n"),
                     ("usd_per_1m_cache_write_input_tokens: 2.50  ", "usd_per_1m_cache_write_input_tokens: 3.125  ")):
        head, found, tail = text.rpartition(old)  # the last: frontier-large's, an Anthropic-style tier (writes 1.25x)
        assert found
        text = head + new + tail
    fleet = parse_fleet(text)
    settings_ = Settings(data_dir=tmp_path, watch_policy=False, watch_fleet=False, scrape_interval_s=0,
                         ext_proc_port=0, max_body_bytes=MAX_BODY, decision_log_flush_ms=5)
    engine = RoutingEngine(fleet, load_policy(DEFAULT_POLICY_PATH, fleet), FixedDifficulty(0.95),
                           state=build_state(settings_, fleet))
    system = " ".join(f"Paragraph {i}: the quarterly report lists revenue, costs and margins." for i in range(150))

    def body(marked: bool) -> bytes:
        block = {"type": "text", "text": system, **({"cache_control": {"type": "ephemeral"}} if marked else {})}
        return json.dumps({"model": "auto", "max_tokens": 300, "system": [block],
                           "messages": [{"role": "user", "content": [{"type": "text", "text": "Summarise it."}]}]}
                          ).encode()

    with TestClient(create_app(settings_, engine=engine, owns_engine=True)) as client:
        def estimate(marked: bool) -> float:
            async def scenario(stub, _):
                call = stub.Process()
                req = await request_phase(call, body(marked), headers={**REQUEST_HEADERS, ":path": "/v1/messages"})
                await call.done_writing()
                return req
            req = run(client.app, scenario)
            assert "immediateResponse" not in req[0], req[0]
            claims = engine.state.claims(set_headers(req[0])["x-pointsman-decision-id"])
            assert claims is not None and claims.target == "frontier-large"
            return claims.estimated_cost_usd

        cold = estimate(marked=False)
        assert estimate(marked=True) > cold  # the first marked request writes its prompt at the write price
        assert estimate(marked=True) < cold  # its repeat reads the prefix the marked one wrote


def test_a_buffered_body_over_grpcs_default_4_mib_is_decided_as_v1_route_decides_it(tmp_path, serve):
    """Envoy's BUFFERED mode sends the whole body in one message: a 5 MB body (an image; under the default
    8 MiB POINTSMAN_MAX_BODY_BYTES) is decided with /v1/route's target and cost, and a 9 MB one is the
    documented 413, on a real ``pointsman serve`` (before: grpc's default 4 MiB receive limit ended both
    streams RESOURCE_EXHAUSTED, so Envoy answered 500)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    _, base = serve(tmp_path, ext_proc_port=port, scrape_interval_s=0)

    def image_request(size: int) -> bytes:
        image = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * size}}
        return json.dumps({"model": "auto", "messages": [{"role": "user", "content": [
            {"type": "text", "text": "What is in this image?"}, image]}]}).encode()

    async def buffered(body: bytes) -> dict:
        options = [("grpc.max_receive_message_length", -1)]  # as Envoy's client: no limit unless configured
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=options) as channel:
            call = wire.stub(channel).Process()
            await call.write(wire.headers_request("request", REQUEST_HEADERS, body_modes=("BUFFERED", "BUFFERED")))
            await call.read()
            await call.write(wire.body_request("request", body, True))
            answer = wire.as_dict(await call.read())
            call.cancel()
            return answer

    def claims(decision_id: str) -> dict:  # the signed id's claims: target, mode, scopes, estimate, prompt tokens
        part = decision_id.split(".")[1]
        found = json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))
        return {k: found[k] for k in ("t", "m", "s", "e", "p")}

    body = image_request(5_000_000)
    routed = httpx.post(f"{base}/v1/route", timeout=60,
                        json={**json.loads(body), "routing": {"tenant": "acme"}}).json()
    answer = asyncio.run(buffered(body))
    assert set_headers(answer)["x-pointsman-target"] == routed["target"]
    assert claims(set_headers(answer)["x-pointsman-decision-id"]) == claims(routed["decision_id"])
    too_large = asyncio.run(buffered(image_request(9_000_000)))["immediateResponse"]
    assert too_large["status"]["code"] == "PayloadTooLarge"
    assert json.loads(base64.b64decode(too_large["body"]))["error"]["code"] == "body_too_large"


def test_a_stream_ended_mid_answer_books_at_least_the_deltas_its_partial_usage_undercounts(app):
    """An Anthropic stream can end mid-answer with an ``error`` event (``overloaded_error``) on an HTTP 200
    response: message_start's usage (its placeholder output count of 1) is all the usage it carried, while
    300 text deltas came. The outcome books at least the 300 streamed tokens (each delta is one or more),
    as a stream without usage does; before, 1 output token was booked for them."""
    start = _anthropic_stream().split(b"\n\n")[0] + b"\n\n"  # event: message_start, output_tokens 1
    delta = b'event: content_block_delta\ndata: {"type": "content_block_delta", "index": 0, ' \
            b'"delta": {"type": "text_delta", "text": " and"}}\n\n'
    error = b'event: error\ndata: {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}\n\n'
    state = app.state.fleet_state

    async def scenario(stub, _):
        call = stub.Process()
        req = await request_phase(call, chat("Tell me a long story.", stream=True, max_tokens=4000))
        await response_phase(call, 200, "text/event-stream", [start, delta * 300, error])
        await call.done_writing()
        return set_headers(req[0])

    # each target's count read before the stream: its outcome is recorded in the background, maybe settled
    # by the time the scenario returns
    before = {t: state.ledger.effective_price_per_token(t, "day").completion_tokens for t in state.fleet.targets}
    headers = run(app, scenario)
    decision_id, target = headers["x-pointsman-decision-id"], headers["x-pointsman-target"]
    out = outcome_of(app, decision_id)
    deadline = time.monotonic() + 5
    while state.record(decision_id) is not None:
        assert time.monotonic() < deadline, "the request was never settled"
        time.sleep(0.01)
    booked = state.ledger.effective_price_per_token(target, "day").completion_tokens - before[target]
    assert out.status == "ok" and out.usage.completion_tokens == 300 and booked == 300, (out.usage, booked)

    # a complete stream's usage is final, though its closing events repeat the text (Responses' *.done): 1 token
    events = [{"type": "response.output_text.delta", "delta": "Yes"}, {"type": "response.output_text.done", "text": "Yes"},
              {"type": "response.completed", "response": {"model": "gpt", "output": [{"content": [
                  {"type": "output_text", "text": "Yes"}]}], "usage": {"input_tokens": 5, "output_tokens": 1}}}]
    sse = b"".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events)

    async def complete(stub, _):
        call = stub.Process()
        req = await request_phase(call, chat("Yes or no?", stream=True))
        await response_phase(call, 200, "text/event-stream", [sse])
        await call.done_writing()
        return set_headers(req[0])

    assert outcome_of(app, run(app, complete)["x-pointsman-decision-id"]).usage.completion_tokens == 1


def test_an_upstream_model_name_that_is_no_valid_text_leaves_the_outcome_recorded_and_booked(app):
    """An upstream answer whose ``model`` is no valid Unicode (a lone surrogate escape, ``"\\ud800"``): the
    outcome is recorded and its usage booked, without the model name. Before: the outcome failed
    validation on ``served_model`` with and without its usage, was logged 'could not build the outcome'
    and dropped; its hold stayed until the reservation TTL and the spend was never booked."""
    answer = b'{"model": "llama\\ud800", "usage": {"prompt_tokens": 9, "completion_tokens": 7}}'

    async def scenario(stub, _):
        call = stub.Process()
        req = await request_phase(call, chat("What is 2 + 2?"))
        await response_phase(call, 200, "application/json", [answer])
        await call.done_writing()
        return set_headers(req[0])["x-pointsman-decision-id"]

    out = outcome_of(app, run(app, scenario))
    assert out.status == "ok" and out.usage.completion_tokens == 7 and out.served_model is None


@pytest.mark.parametrize("sse", [False, True])
def test_a_response_nested_past_the_json_parsers_depth_is_passed_back_and_its_outcome_recorded(app, sse):
    """An upstream body nested 100,000 arrays deep (JSON, or one SSE event naming usage): Python's JSON reader
    raises RecursionError, not ValueError. The body is passed back whole and the outcome recorded without its
    usage (the estimate booked). Before: the RecursionError ended the stream with an error (the last chunk never
    reached Envoy) and the outcome was lost."""
    deep = b'{"usage": {"prompt_tokens": 9, "completion_tokens": 7}, "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    body = b"data: " + deep + b"\n\ndata: [DONE]\n\n" if sse else deep

    async def scenario(stub, _):
        call = stub.Process()
        req = await request_phase(call, chat("What is 2 + 2?"))
        chunks = [body[i:i + 60_000] for i in range(0, len(body), 60_000)]
        resp = await response_phase(call, 200, "text/event-stream" if sse else "application/json", chunks)
        await call.done_writing()
        return set_headers(req[0])["x-pointsman-decision-id"], resp

    decision_id, resp = run(app, scenario)
    assert b"".join(streamed(r, "response")[0] for r in resp[1:]) == body and streamed(resp[-1], "response")[1]
    out = outcome_of(app, decision_id)
    assert out.status == "ok" and out.usage.completion_tokens is None  # the estimate is booked


def test_a_stream_that_ends_while_its_decision_is_made_leaves_no_hold_or_load(tmp_path, serve):
    """Envoy resets a stream (its client went away) while Pointsman is deciding: the gRPC call is cancelled
    mid-decision. The decision, once made, is logged and recorded ``cancelled``, which releases its hold and
    in-flight load. Before: the cancellation dropped a decision its route (in the threadpool here, or awaiting
    its shared-state write) had already dispatched, so its budget hold and load stayed until the reservation
    TTL (600 s) and it was never logged: 8 streams cancelled 2-60 ms after their body left $0.0089 held and
    2 requests in flight on a real serve. The streams are cancelled at spread delays, so some land mid-decision."""
    port, base = _budgeted_serve(serve, tmp_path, route_in_threadpool="true")
    body = chat(" ".join(f"word{i} alpha beta gamma" for i in range(6000)), max_tokens=300)  # ~40 ms to decide

    async def cancelled_after(delay_s: float) -> None:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = wire.stub(channel).Process()
            await call.write(wire.headers_request("request", REQUEST_HEADERS))
            chunks = [body[i:i + CHUNK] for i in range(0, len(body), CHUNK)]
            for i, chunk in enumerate(chunks):
                await call.write(wire.body_request("request", chunk, i == len(chunks) - 1))
            await asyncio.sleep(delay_s)
            call.cancel()

    for delay_s in (0.0, 0.002, 0.005, 0.01, 0.015, 0.02, 0.03, 0.04, 0.06, 0.08):
        asyncio.run(cancelled_after(delay_s))
    deadline = time.monotonic() + 10
    while True:
        acme = next(b for b in httpx.get(f"{base}/v1/budgets").json()["budgets"] if b["scope"] == "tenant:acme")
        eps = [ep for t in httpx.get(f"{base}/v1/fleet").json()["targets"].values() for ep in t["endpoints"]]
        inflight = sum((ep.get("load") or {}).get("inflight_requests", 0) for ep in eps)
        if acme["held_usd"] == 0 and inflight == 0:
            break
        assert time.monotonic() < deadline, (acme, inflight)  # before: held and in flight until the TTL
        time.sleep(0.1)


def test_a_lone_surrogate_escape_in_an_ignored_field_is_forwarded_as_it_came(app):
    """A client body with a ``routing`` object (rewritten: it is removed) and ``"user": "\\ud800"`` (a lone
    surrogate escape, valid JSON syntax, in a field Pointsman ignores): routed as /v1/route routes it, the
    escape forwarded as it came. Before: re-serializing the body raised UnicodeEncodeError after the decision,
    ending the stream with an error (Envoy answers 500) and recording the decision cancelled."""
    body = b'{"model": "auto", "routing": {"tenant": "x"}, "user": "\\ud800", ' \
           b'"messages": [{"role": "user", "content": "What is 2 + 2?"}]}'

    async def scenario(stub, _):
        call = stub.Process()
        req = await request_phase(call, body)
        call.cancel()
        return req

    req = run(app, scenario)
    forwarded = b"".join(streamed(r, "request")[0] for r in req[1:])
    assert b'"user":"\\ud800"' in forwarded and b"routing" not in forwarded
    assert json.loads(forwarded)["model"] == set_headers(req[0])["x-gateway-model-name"]


@pytest.mark.parametrize("key", [b'"m\\u006fdel"', b'"\\u006D\\u006f\\u0064\\u0065\\u006c"'])
def test_an_escaped_model_key_is_rewritten_at_the_top_level_not_in_a_nested_object(app, key):
    """``"m\\u006fdel"`` is the key ``model`` (JSON escapes), beside a nested ``"model"`` of the same value: the
    forwarded body's top-level ``model`` is the decided one and the nested one is left as it came. Before: the
    splice matched only the literal spelling, found the nested key alone and rewrote it, so the upstream got
    the client's own model (e.g. gpt-4o on a decision for, and priced as, gpt-4o-mini)."""
    body = b'{' + key + b': "auto", "metadata": {"model": "auto"}, ' \
           b'"messages": [{"role": "user", "content": "What is 2 + 2?"}]}'

    async def scenario(stub, _):
        call = stub.Process()
        req = await request_phase(call, body)
        call.cancel()
        return req

    req = run(app, scenario)
    forwarded = json.loads(b"".join(streamed(r, "request")[0] for r in req[1:]))
    assert forwarded["model"] == set_headers(req[0])["x-gateway-model-name"] == "meta-llama/Llama-3.1-8B-Instruct"
    assert forwarded["metadata"] == {"model": "auto"}


def test_a_stream_without_a_response_phase_records_nothing_and_the_gateways_outcome_is_booked(tmp_path, serve):
    """Envoy's filter with ``response_header_mode: SKIP`` and ``response_body_mode: NONE`` (the gateway
    reports outcomes) sends no response message and closes the stream after the request phase: a half-close
    (``ext_proc_graceful_grpc_close``), or by default a half-close and a reset, as for a client gone. Such a
    stream records nothing, so the hold stays until the gateway's ``POST /v1/outcomes`` books the usage it
    reports. Before: its end was recorded ``cancelled`` (the hold released) and the gateway's outcome was a 409
    conflict, its spend lost. A stream whose filter sends response bodies, half-closed after the request
    phase (the client gone before the upstream answered), is still recorded ``cancelled``. A real serve."""
    port, base = _budgeted_serve(serve, tmp_path, decision_log_flush_ms=5)
    no_response, full = ("FULL_DUPLEX_STREAMED", "NONE"), ("FULL_DUPLEX_STREAMED", "FULL_DUPLEX_STREAMED")

    async def stream(modes, reset: bool) -> dict[str, str]:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = wire.stub(channel).Process()
            req = await request_phase(call, chat("Tell me a story.", max_tokens=50), modes=modes)
            if reset:
                call.cancel()
            else:
                await call.done_writing()
                assert await call.code() == grpc.StatusCode.OK  # the picker's handler has returned: its end is seen
            return set_headers(req[0])

    closed, reset = asyncio.run(stream(no_response, False)), asyncio.run(stream(no_response, True))
    sentinel = asyncio.run(stream(full, False))["x-pointsman-decision-id"]
    deadline = time.monotonic() + 10
    with OutcomeLog(tmp_path / "data" / "outcomes.db") as log:
        while not (logged := log.decision(sentinel)) or not logged.outcomes:  # recorded after any of the first
            assert time.monotonic() < deadline, "the half-closed stream's outcome was never recorded"
            time.sleep(0.02)
    assert logged.outcomes[0].status == "cancelled"  # a response phase was to come: the client went away
    signer = DecisionSigner(bytes.fromhex((tmp_path / "data" / "decision.key").read_text()))
    for headers in (closed, reset):
        decision_id = headers["x-pointsman-decision-id"]
        usage = {"prompt_tokens": 20, "completion_tokens": 400}  # past the estimate's cap of 50
        r = httpx.post(f"{base}/v1/outcomes", json={"decision_id": decision_id, "status": "ok", "usage": usage,
                                                    "served_target": headers["x-pointsman-target"]})
        assert r.status_code == 200, r.text  # before: 409 conflict with the picker's 'cancelled'
        ack = r.json()["acks"][0]
        settled = ack["settlement"]
        assert ack["status"] == "stored" and settled["hold_state"] == "held"  # held until this report
        assert settled["reserved_usd"] == pytest.approx(signer.verify(decision_id).estimated_cost_usd, abs=1e-9)
        assert settled["actual_cost_usd"] > settled["reserved_usd"] and settled["overrun_usd"] > 0  # the usage
    deadline = time.monotonic() + 10
    while (acme := next(b for b in httpx.get(f"{base}/v1/budgets").json()["budgets"]
                        if b["scope"] == "tenant:acme"))["held_usd"] != 0:
        assert time.monotonic() < deadline, acme  # the cancelled stream's hold is released
        time.sleep(0.05)


@pytest.mark.parametrize("tenant", ["café-münchen", "株式会社-acme"])
def test_a_non_ascii_tenant_header_is_the_tenant_http_names(app, tenant):
    """Envoy sends header values as raw bytes (``raw_value``), UTF-8 for a non-ASCII tenant: the decision's budget
    scope is the one ``POST /v1/route`` gives the same tenant in its JSON body (read as Latin-1, ``café`` would be
    ``cafÃ©``: another tenant, another budget)."""
    state = app.state.fleet_state

    async def scenario(stub, _):
        call = stub.Process()
        req = await request_phase(call, chat("What is 2 + 2?"), headers={**REQUEST_HEADERS, "x-pointsman-tenant": tenant})
        scopes = state.record(set_headers(req[0])["x-pointsman-decision-id"]).scopes  # before the stream ends
        call.cancel()
        return scopes

    picked = run(app, scenario)
    over_http = TestClient(app).post("/v1/route", json={"messages": [{"role": "user", "content": "What is 2 + 2?"}],
                                                        "routing": {"tenant": tenant}}).json()["decision_id"]
    assert picked == state.record(over_http).scopes
