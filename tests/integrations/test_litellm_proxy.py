"""The real LiteLLM Proxy (``litellm --config deploy/litellm/config.yaml``, a process) with Pointsman's
callback enabled, in front of stand-in OpenAI-compatible upstreams (one tiny HTTP server per deployment,
in this test) and a live ``pointsman serve``. A small policy routes on ``routing.slo_class`` (sent as
``metadata.pointsman`` in the proxy request), so each request's target is known in advance.

Checked: each request lands on the upstream Pointsman decided, carrying ``x-pointsman-decision-id``;
its outcome (usage, status) arrives in Pointsman's outcome log; an upstream failure is an ``error``
outcome; with Pointsman stopped the proxy still answers, from the deployment marked
``pointsman_default`` (fail-open). One proxy start (~20-40 s) serves the whole module.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from pointsman.outcome_log.store import OutcomeLog
from pointsman.policy.fleet import DEFAULT_FLEET_PATH

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "deploy" / "litellm" / "config.yaml"
MASTER_KEY = "sk-proxy-test-0123456789"
#: A client key of the proxy's custom auth (``CUSTOM_AUTH``, in ``keyed_stack``): organisation ``broke`` (Pointsman's
#: tenant, $0 a day), team ``t1``.
BROKE_KEY = "sk-client-of-broke-0123"
CUSTOM_AUTH = f"""\
from litellm.proxy._types import LitellmUserRoles, UserAPIKeyAuth


async def user_api_key_auth(request, api_key):
    key = api_key.removeprefix("Bearer ").strip()
    if key == {MASTER_KEY!r}:
        return UserAPIKeyAuth(api_key=key, user_role=LitellmUserRoles.PROXY_ADMIN)
    if key == {BROKE_KEY!r}:
        return UserAPIKeyAuth(api_key=key, org_id="broke", team_id="t1")
    raise Exception("unknown key")
"""
#: A second proxy callback (``keyed_stack``), after Pointsman's: it rejects, before any upstream call, a request whose
#: messages say ``REJECT-AFTER-ROUTING`` (as a guardrail or a rate limiter of the proxy would).
REJECT_HOOK = """\
import json
from fastapi import HTTPException
from litellm.integrations.custom_logger import CustomLogger


class Rejecter(CustomLogger):
    async def async_pre_call_hook(self, user_api_key_dict, cache, data, call_type):
        if "REJECT-AFTER-ROUTING" in json.dumps(data.get("messages"), default=str):
            raise HTTPException(status_code=400, detail="rejected by another hook")
        return data


handler = Rejecter()
"""
LLAMA_8B_1 = "http://llama-8b-1.inference.internal:8000/v1"
POLICY = """\
apiVersion: pointsman/v1
kind: RoutingPolicy
metadata: {name: litellm-proxy-test}
rules:
  - name: long-context-slo
    when: request.slo_class == "long-context"
    route: {target: frontier-large, fallbacks: [onprem-70b]}
  - name: interactive-slo
    when: request.slo_class == "interactive"
    route: {target: onprem-70b, fallbacks: [frontier-large]}
  - name: no-deployment
    when: request.tenant == "fallback"
    route: {target: frontier-small, fallbacks: [frontier-large]}
  - name: default
    route: {target: onprem-8b, fallbacks: [frontier-small]}
verify:
  rules:
    - name: refusal
      when: draft.refusal
      action: escalate
      escalate: {target: frontier-large}
    - name: accept
      action: accept
"""

_PROXY_PACKAGES = ("litellm", "fastapi_sso", "apscheduler", "backoff", "mcp", "soundfile", "expression")
if any(importlib.util.find_spec(name) is None for name in _PROXY_PACKAGES):  # without importing the proxy here
    pytest.skip("the LiteLLM Proxy's packages are not installed (the litellm-proxy extra)", allow_module_level=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Upstream:
    """A stand-in OpenAI-compatible server: answers ``POST .../chat/completions`` with a fixed usage and
    its own ``name`` in the content; records each request's model and decision header. ``fail``: 500; a request
    whose messages say ``MALFORMED``: 400 (the client's request refused)."""

    def __init__(self, name: str, fail: bool = False) -> None:
        self.name, self.fail, self.fail_first = name, fail, 0
        self.seen: list[dict] = []
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
                upstream.seen.append({"path": self.path, "model": body.get("model"),
                                      "decision": self.headers.get("x-pointsman-decision-id"),
                                      "asked": {k: body[k] for k in ("max_tokens", "temperature", "tools") if k in body},
                                      "body": body})
                asked = json.dumps(body.get("messages"))
                content = "I'm sorry, but I cannot help with that." if "REFUSE" in asked and \
                    upstream.name.startswith("llama") else f"answer from {upstream.name}"
                if upstream.fail or upstream.fail_first > 0:
                    upstream.fail_first -= 1
                    payload, status = {"error": {"message": "upstream is down", "type": "server_error"}}, 500
                elif "MALFORMED" in asked:
                    payload, status = {"error": {"message": "bad request", "type": "invalid_request_error"}}, 400
                else:
                    status = 200
                    payload = {"id": "cmpl-1", "object": "chat.completion", "created": int(time.time()),
                               "model": body.get("model"),
                               "choices": [{"index": 0, "finish_reason": "stop",
                                            "message": {"role": "assistant", "content": content}}],
                               "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}}
                if status == 200 and body.get("stream"):
                    self._stream(body, content, "NO-STREAM-USAGE" not in asked)
                    return
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _stream(self, body: dict, content: str, usage_if_asked: bool) -> None:
                """Server-sent events: the content a word a chunk, then (only when ``stream_options.include_usage``
                asks, as OpenAI and vLLM do, and ``usage_if_asked``) a usage chunk, then ``[DONE]``."""
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.end_headers()
                base = {"id": "cmpl-1", "object": "chat.completion.chunk", "created": int(time.time()),
                        "model": body.get("model")}
                words = content.split(" ")
                chunks = [{**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": w if i == 0
                                                                      else " " + w}, "finish_reason": None}]}
                          for i, w in enumerate(words)]
                chunks.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
                if usage_if_asked and (body.get("stream_options") or {}).get("include_usage"):
                    chunks.append({**base, "choices": [],
                                   "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}})
                for chunk in chunks:
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.write(b"data: [DONE]\n\n")

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _wait(url: str, proc: subprocess.Popen, timeout_s: float, what: str, output: Path | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            out = proc.stdout.read().decode(errors="replace") if proc.stdout else \
                output.read_text(errors="replace") if output is not None else ""
            pytest.fail(f"{what} exited: {out[-3000:]}")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            pytest.fail(f"{what} did not answer {url} within {timeout_s:.0f} s")
        time.sleep(0.2)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """Pointsman (its own process), three stand-in upstreams and the LiteLLM Proxy with the shipped config."""
    yield from _stack(tmp_path_factory.mktemp("litellm-proxy"), {}, lambda config: config)


def _stack(tmp: Path, fail_first: dict[str, int], edit: Callable[[str], str]) -> Iterator[dict]:
    """``stack`` with the upstreams named in ``fail_first`` answering that many first requests 500, and the
    shipped config changed by ``edit``."""
    policy = tmp / "policy.yaml"
    policy.write_text(POLICY)
    budgets = tmp / "budgets.yaml"  # tenant broke may spend $0 a day
    budgets.write_text("apiVersion: pointsman/v1\nkind: Budgets\nbudgets:\n"
                       "  - {scope: 'tenant:broke', window: day, limit_usd: 0}\n"
                       "  - {scope: 'tenant:rich', window: day, limit_usd: 1000}\n")
    upstreams = {"llama-8b": Upstream("llama-8b"), "llama-70b": Upstream("llama-70b", fail=True),
                 "gpt-4o": Upstream("gpt-4o")}
    for name, n in fail_first.items():
        upstreams[name].fail_first = n
    base_env = {**os.environ, "ORT_DISABLE_TELEMETRY": "1", "MLFLOW_DISABLE_TELEMETRY": "true", "HF_HUB_OFFLINE": "1"}
    p_port, l_port = _free_port(), _free_port()
    # the fleet's llama-8b-1 is the 8B stand-in, so the endpoint LiteLLM called (its api_base) is a fleet endpoint
    fleet = tmp / "fleet.yaml"
    fleet.write_text(DEFAULT_FLEET_PATH.read_text().replace(LLAMA_8B_1, upstreams["llama-8b"].url))
    pointsman = subprocess.Popen(
        [sys.executable, "-m", "pointsman", "serve", "--port", str(p_port), "--policy", str(policy),
         "--log-level", "warning"],
        env={**base_env, "POINTSMAN_DATA_DIR": str(tmp), "POINTSMAN_WATCH_POLICY": "false",
             "POINTSMAN_BUDGETS_PATH": str(budgets), "POINTSMAN_WATCH_BUDGETS": "false",
             "POINTSMAN_DECISION_LOG_FLUSH_MS": "5", "POINTSMAN_FLEET_PATH": str(fleet),
             "POINTSMAN_WATCH_FLEET": "false"}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    # the shipped config, copied so the proxy resolves nothing beside the repository's file
    config = tmp / "config.yaml"
    config.write_text(edit(CONFIG.read_text()))
    (tmp / "custom_auth.py").write_text(CUSTOM_AUTH)
    (tmp / "reject_hook.py").write_text(REJECT_HOOK)
    proxy_env = {**base_env, "POINTSMAN_URL": f"http://127.0.0.1:{p_port}", "POINTSMAN_ROUTE_TIMEOUT_S": "2",
                 "POINTSMAN_CASCADE": "true", "POINTSMAN_VERIFY_TIMEOUT_S": "5",
                 "LITELLM_MASTER_KEY": MASTER_KEY, "LLAMA_8B_API_BASE": upstreams["llama-8b"].url,
                 "LLAMA_70B_API_BASE": upstreams["llama-70b"].url, "OPENAI_API_BASE": upstreams["gpt-4o"].url,
                 "OPENAI_API_KEY": "sk-upstream-not-checked", "LITELLM_OFFLINE_MODE": "true",
                 "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_TELEMETRY_DISABLED": "true",
                 "LITELLM_LOG": "ERROR"}
    proxy_env.pop("DATABASE_URL", None)
    litellm_cli = shutil.which("litellm", path=str(Path(sys.executable).parent)) or "litellm"
    # its output to a file: a pipe nobody reads fills up (64 KiB: a few failed calls' tracebacks) and blocks the proxy
    proxy_log = (tmp / "litellm.log").open("wb")
    proxy = subprocess.Popen([litellm_cli, "--config", str(config), "--host", "127.0.0.1", "--port", str(l_port)],
                             env=proxy_env, stdout=proxy_log, stderr=subprocess.STDOUT, cwd=tmp)
    try:
        _wait(f"http://127.0.0.1:{p_port}/readyz", pointsman, 60, "pointsman serve")
        _wait(f"http://127.0.0.1:{l_port}/health/liveliness", proxy, 120, "the LiteLLM Proxy", tmp / "litellm.log")
        yield {"proxy": f"http://127.0.0.1:{l_port}", "pointsman": pointsman, "upstreams": upstreams,
               "outcomes": tmp / "outcomes.db", "pointsman_url": f"http://127.0.0.1:{p_port}"}
    finally:
        _stop(proxy)
        proxy_log.close()
        _stop(pointsman)
        for u in upstreams.values():
            u.close()


def _ask(stack: dict, slo: str | None, text: str = "What is the capital of France?",
         tenant: str = "acme", **params: object) -> httpx.Response:
    body: dict = {"model": "chat", "messages": [{"role": "user", "content": text}], **params}
    if slo or tenant != "acme":
        body["metadata"] = {"pointsman": {"slo_class": slo, "tenant": tenant}}
    return httpx.post(f"{stack['proxy']}/v1/chat/completions", json=body, timeout=60,
                      headers={"authorization": f"Bearer {MASTER_KEY}"})


def _outcome(stack: dict, decision_id: str, timeout_s: float = 15.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with OutcomeLog(stack["outcomes"]) as log:
            logged = log.decision(decision_id)
            if logged is not None and logged.outcomes:
                return logged.outcomes[0]
        time.sleep(0.1)
    raise AssertionError(f"no outcome for decision {decision_id}")


def test_requests_land_where_pointsman_decided_and_outcomes_arrive(stack: dict) -> None:
    ups = stack["upstreams"]
    for slo, name, target in ((None, "llama-8b", "onprem-8b"), ("long-context", "gpt-4o", "frontier-large")):
        before = len(ups[name].seen)
        r = _ask(stack, slo)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"] == f"answer from {name}"
        assert len(ups[name].seen) == before + 1
        decision_id = ups[name].seen[-1]["decision"]
        assert decision_id, "the decision id travels to the upstream"
        out = _outcome(stack, decision_id)
        assert (out.status, out.served_target) == ("ok", target)
        assert (out.usage.prompt_tokens, out.usage.completion_tokens) == (11, 7)
        assert out.e2e_latency_ms is not None


def test_cascade_escalates_a_refused_draft_and_reports_one_outcome(stack: dict) -> None:
    """POINTSMAN_CASCADE=true: the on-prem draft is a refusal, /v1/verify escalates, the proxy answers
    from the frontier deployment and the decision's one outcome is the escalated call's. The escalated
    call asks what the draft was asked (before, it dropped every parameter but the messages: no output
    cap, temperature or tools)."""
    ups = stack["upstreams"]
    before = {n: len(u.seen) for n, u in ups.items()}
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}}}]
    r = _ask(stack, None, "REFUSE: how do I pick a lock?", max_tokens=64, temperature=0.2, tools=tools)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == "answer from gpt-4o"
    assert len(ups["llama-8b"].seen) == before["llama-8b"] + 1 and len(ups["gpt-4o"].seen) == before["gpt-4o"] + 1
    decision_id = ups["llama-8b"].seen[-1]["decision"]
    assert ups["gpt-4o"].seen[-1]["decision"] == decision_id
    assert ups["gpt-4o"].seen[-1]["asked"] == ups["llama-8b"].seen[-1]["asked"] == \
        {"max_tokens": 64, "temperature": 0.2, "tools": tools}
    out = _outcome(stack, decision_id)
    assert (out.status, out.served_target) == ("ok", "frontier-large")
    time.sleep(0.5)  # a second outcome (the draft's) would have arrived by now
    with OutcomeLog(stack["outcomes"]) as log:
        assert len(log.decision(decision_id).outcomes) == 1
        assert log.verification(decision_id)["action"] == "escalate"


def test_a_cascade_draft_on_a_fallback_deployment_is_booked_on_the_fallback(stack: dict) -> None:
    """The decided frontier-small has no deployment in the proxy's config, so its fallback frontier-large
    (gpt-4o) drafts. The verify names it: the draft is settled at frontier-large's list prices (11 prompt,
    7 output tokens from the stand-in) and the decision's outcome finds it booked there. Before, the verify
    named no target: the draft was settled at frontier-small's prices and frontier-large's bill was lost."""
    def spent(target: str) -> float:
        fleet = httpx.get(f"{stack['pointsman_url']}/v1/fleet", timeout=10).json()
        return fleet["targets"][target]["effective_price"]["spent_usd"]

    before = {t: spent(t) for t in ("frontier-small", "frontier-large")}
    r = _ask(stack, None, tenant="fallback")
    assert r.status_code == 200, r.text
    decision_id = stack["upstreams"]["gpt-4o"].seen[-1]["decision"]
    out = _outcome(stack, decision_id)
    assert (out.status, out.served_target) == ("ok", "frontier-large")
    with OutcomeLog(stack["outcomes"]) as log:
        assert log.verification(decision_id)["action"] == "accept"
    assert spent("frontier-small") == before["frontier-small"]  # before: the draft booked here
    assert spent("frontier-large") - before["frontier-large"] == pytest.approx((11 * 2.50 + 7 * 10.0) / 1e6)


def test_upstream_failure_is_reported_as_an_error_outcome(stack: dict) -> None:
    ups = stack["upstreams"]
    r = _ask(stack, "interactive")  # onprem-70b: its stand-in answers 500
    assert r.status_code >= 500
    decision_id = ups["llama-70b"].seen[-1]["decision"]
    out = _outcome(stack, decision_id)
    assert out.status == "error" and out.served_target == "onprem-70b"
    # the 70B stand-in is no fleet endpoint: stored as LiteLLM named it (before: refused, then sent again without)
    assert out.upstream_status == 500 and out.served_endpoint.startswith(ups["llama-70b"].url)


def test_client_errors_leave_the_endpoint_healthy(stack: dict) -> None:
    """Upstream 400s (malformed requests) are error outcomes on the endpoint LiteLLM called, with the upstream's
    status: the endpoint answered, so Pointsman's outcome breaker leaves it healthy. Before, five marked it
    unhealthy (the breaker counted every error on the decision's endpoint)."""
    ups = stack["upstreams"]["llama-8b"]
    for i in range(10):  # both replicas picked in turn: five each would have tripped both
        r = _ask(stack, None, f"MALFORMED request {i}")
        assert r.status_code == 400, r.text
        out = _outcome(stack, ups.seen[-1]["decision"])
        assert (out.status, out.upstream_status, out.served_endpoint) == ("error", 400, ups.url)
    endpoints = httpx.get(f"{stack['pointsman_url']}/readyz", timeout=10).json()["endpoints"]
    assert {e["name"]: e["healthy"] for e in endpoints.values() if e["target"] == "onprem-8b"} == \
        {"llama-8b-0": True, "llama-8b-1": True}


def test_a_budget_refusal_is_answered_429_not_routed_around(stack: dict) -> None:
    """Tenant ``broke`` has $0 a day: the proxy answers 429 and no upstream is called. Before, the
    callback failed open on Pointsman's refusal and llama-8b served it, unbudgeted, no outcome."""
    ups = stack["upstreams"]
    before = {n: len(u.seen) for n, u in ups.items()}
    r = _ask(stack, None, tenant="broke")
    assert r.status_code == 429, r.text
    assert "budget exhausted" in r.text and "tenant:broke" in r.text
    assert {n: len(u.seen) for n, u in ups.items()} == before


def test_a_text_completion_batch_is_routed_and_budgeted(stack: dict) -> None:
    """A text completion whose ``prompt`` is a list (a batch, or token ids) was not routed at all: the
    callback asked Pointsman only for a string prompt, so tenant ``broke`` ($0 a day) was served by
    LiteLLM's own pick, unbudgeted, with no decision and no outcome. Its prompt goes to ``/v1/route`` as a
    Completions body now, so the budget refuses it like a chat request."""
    ups = stack["upstreams"]
    before = {n: len(u.seen) for n, u in ups.items()}
    r = httpx.post(f"{stack['proxy']}/v1/completions", timeout=60, headers={"authorization": f"Bearer {MASTER_KEY}"},
                   json={"model": "chat", "prompt": ["What is the capital of France?", "And of Spain?"],
                         "max_tokens": 16, "metadata": {"pointsman": {"tenant": "broke"}}})
    assert r.status_code == 429, r.text
    assert "budget exhausted" in r.text and "tenant:broke" in r.text
    assert {n: len(u.seen) for n, u in ups.items()} == before


@pytest.mark.parametrize("path,body", [
    ("/v1/responses", {"input": "What is the capital of France?", "max_output_tokens": 16}),
    ("/v1/messages", {"system": "Be brief.", "max_tokens": 16,
                      "messages": [{"role": "user", "content": "What is the capital of France?"}]}),
], ids=["responses", "anthropic-messages"])
def test_responses_and_messages_calls_are_routed_and_budgeted(stack: dict, path: str, body: dict) -> None:
    """The proxy's /v1/responses and /v1/messages (Anthropic's API) were not routed at all: the callback
    routed only chat and text completions, so tenant broke ($0 a day) was served there by LiteLLM's own pick,
    unbudgeted, with no decision and no outcome. They are routed (and refused) like a chat request now."""
    ups = stack["upstreams"]
    before = {n: len(u.seen) for n, u in ups.items()}
    r = httpx.post(f"{stack['proxy']}{path}", timeout=60, headers={"authorization": f"Bearer {MASTER_KEY}"},
                   json={"model": "chat", **body, "metadata": {"pointsman": {"tenant": "broke"}}})
    assert r.status_code == 429, r.text
    assert "budget exhausted" in r.text and "tenant:broke" in r.text
    assert {n: len(u.seen) for n, u in ups.items()} == before


def test_a_messages_call_is_reported_with_its_usage(stack: dict) -> None:
    """A routed /v1/messages call reports its outcome, Anthropic's usage read into Pointsman's keys."""
    ups = stack["upstreams"]
    r = httpx.post(f"{stack['proxy']}/v1/messages", timeout=60, headers={"authorization": f"Bearer {MASTER_KEY}"},
                   json={"model": "chat", "max_tokens": 16, "messages": [{"role": "user", "content": "Hello?"}]})
    assert r.status_code == 200, r.text
    out = _outcome(stack, ups["llama-8b"].seen[-1]["decision"])
    assert (out.status, out.served_target) == ("ok", "onprem-8b")
    assert (out.usage.prompt_tokens, out.usage.completion_tokens) == (11, 7)


def test_a_messages_calls_routing_context_does_not_reach_the_upstream(stack: dict) -> None:
    """An Anthropic /v1/messages call carries its routing context in ``metadata.pointsman``, and ``metadata``
    is Anthropic's own field, which LiteLLM forwards (Anthropic's API refuses keys but ``user_id``). The
    context routes the call (the decision is the tenant's) and does not reach the upstream: LiteLLM 1.110
    keeps only Anthropic's ``user_id`` (``validate_anthropic_api_metadata``, for every provider) and a Chat
    Completions upstream gets none of it. A guard: a LiteLLM that forwards the whole object fails it."""
    ups = stack["upstreams"]
    r = httpx.post(f"{stack['proxy']}/v1/messages", timeout=60, headers={"authorization": f"Bearer {MASTER_KEY}"},
                   json={"model": "chat", "max_tokens": 16, "messages": [{"role": "user", "content": "Hello?"}],
                         "metadata": {"user_id": "u-1", "pointsman": {"tenant": "messages-tenant"}}})
    assert r.status_code == 200, r.text
    sent = ups["llama-8b"].seen[-1]
    assert "pointsman" not in json.dumps(sent["body"]) and "messages-tenant" not in json.dumps(sent["body"])
    assert sent["decision"]
    with OutcomeLog(stack["outcomes"]) as log:
        deadline = time.monotonic() + 15
        while (logged := log.decision(sent["decision"])) is None and time.monotonic() < deadline:
            time.sleep(0.1)
    assert logged is not None and logged.tenant == "messages-tenant"


@pytest.mark.parametrize("text", ["Stream it.", "NO-STREAM-USAGE, stream it."], ids=["upstream-usage", "no-usage"])
def test_a_stream_whose_client_asked_no_usage_is_booked_with_a_usage(stack: dict, text: str) -> None:
    """A streamed request without ``stream_options.include_usage``: LiteLLM (1.110) asks the upstream for its usage
    anyway (and strips that chunk from the client's stream), so the outcome books the upstream's count, not nothing.
    An upstream that sends none anyway (``NO-STREAM-USAGE``) is booked with LiteLLM's count of the streamed text, at
    least one token per streamed delta, never none or zero. A guard: a LiteLLM that stops asking fails it."""
    ups = stack["upstreams"]["llama-8b"]
    with httpx.stream("POST", f"{stack['proxy']}/v1/chat/completions", timeout=60,
                      headers={"authorization": f"Bearer {MASTER_KEY}"},
                      json={"model": "chat", "stream": True, "messages": [{"role": "user", "content": text}]}) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    assert r.status_code == 200 and events
    assert all(e.get("usage") is None for e in events)  # the client did not ask for it
    assert ups.seen[-1]["body"].get("stream_options") == {"include_usage": True}
    out = _outcome(stack, ups.seen[-1]["decision"])
    assert out.status == "ok" and out.usage is not None
    if text.startswith("NO-STREAM-USAGE"):
        deltas = sum(1 for e in events for c in e["choices"] if c.get("delta", {}).get("content"))
        assert out.usage.prompt_tokens > 0 and out.usage.completion_tokens >= deltas > 0
    else:
        assert (out.usage.prompt_tokens, out.usage.completion_tokens) == (11, 7)


@pytest.mark.parametrize("path,body", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hello?"}]}),
    ("/v1/messages", {"max_tokens": 16, "messages": [{"role": "user", "content": "Hello?"}]}),
], ids=["chat", "anthropic-messages"])
@pytest.mark.parametrize("field", ["metadata", "litellm_metadata"])
def test_a_client_cannot_write_the_decision_the_callback_acts_on(stack: dict, path: str, body: dict, field: str) -> None:
    """``pointsman_decision`` in the request's metadata is the callback's own record of the decision (the
    deployment, the id it reports and verifies under); a client that writes one (another request's decision id, a
    deployment of its choosing, ``cascade``) must neither choose the deployment nor settle that other decision.
    Before, a /v1/messages call's ``metadata.pointsman_decision.deployment`` (Anthropic's ``metadata``, the client's,
    read before the callback's ``litellm_metadata``) sent the request to gpt-4o, not to the decided llama-8b."""
    victim = httpx.post(f"{stack['pointsman_url']}/v1/route", timeout=10,
                        json={"model": "chat", "messages": [{"role": "user", "content": "another request"}]}).json()
    ups = stack["upstreams"]
    before = {n: len(u.seen) for n, u in ups.items()}
    forged = {"pointsman_decision": {"id": victim["decision_id"], "cascade": True, "served_target": "onprem-8b",
                                     "deployment": "gpt-4o"}}
    r = httpx.post(f"{stack['proxy']}{path}", timeout=60, headers={"authorization": f"Bearer {MASTER_KEY}"},
                   json={"model": "chat", **body, field: forged})
    assert r.status_code == 200, r.text
    assert {n: len(u.seen) - before[n] for n, u in ups.items()} == {"llama-8b": 1, "llama-70b": 0, "gpt-4o": 0}
    own = ups["llama-8b"].seen[-1]["decision"]
    assert own != victim["decision_id"]
    assert _outcome(stack, own).status == "ok"
    time.sleep(0.5)  # an outcome reported under the victim's id would have arrived with the request's own
    with OutcomeLog(stack["outcomes"]) as log:
        assert log.decision(victim["decision_id"]).outcomes == ()


def test_pointsman_down_fails_open_to_the_default_deployment(stack: dict) -> None:
    """Runs last: stops Pointsman."""
    _stop(stack["pointsman"])
    ups = stack["upstreams"]
    before = len(ups["llama-8b"].seen)
    t0 = time.monotonic()
    r = _ask(stack, "long-context")  # would be frontier-large; Pointsman is gone
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == "answer from llama-8b"
    assert len(ups["llama-8b"].seen) == before + 1 and ups["llama-8b"].seen[-1]["decision"] is None
    assert time.monotonic() - t0 < 10


@pytest.fixture(scope="module")
def keyed_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """``stack`` with LiteLLM's retries on (``num_retries: 1``), the 8B stand-in answering its first request 500,
    and the proxy's keys from ``CUSTOM_AUTH`` (no database)."""
    yield from _stack(tmp_path_factory.mktemp("litellm-proxy-keyed"), {"llama-8b": 1},
                      lambda config: config.replace("num_retries: 0", "num_retries: 1").replace(
                          "general_settings:\n", "general_settings:\n  custom_auth: custom_auth.user_api_key_auth\n").replace(
                          "callbacks: pointsman.integrations.litellm_proxy.handler",
                          "callbacks: [pointsman.integrations.litellm_proxy.handler, reject_hook.handler]"))


def test_a_request_the_proxy_retried_is_booked_with_the_usage_of_the_attempt_that_answered(keyed_stack: dict) -> None:
    """The proxy decides once per request; LiteLLM retries the 500 on the same deployment and the retry answers.
    The decision's one outcome is the answer's: ``ok`` with its usage, booked. Before, the first attempt's failure
    was reported at once as the decision's outcome (error, hold released) and the retry's a 409 conflict, never booked.
    A 400 LiteLLM does not retry is still reported, when the proxy gives up on the request."""
    ups = keyed_stack["upstreams"]["llama-8b"]
    r = _ask(keyed_stack, None)
    assert r.status_code == 200, r.text
    assert len(ups.seen) == 2 and ups.seen[0]["decision"] == ups.seen[1]["decision"]
    out = _outcome(keyed_stack, ups.seen[1]["decision"])
    assert (out.status, out.usage and (out.usage.prompt_tokens, out.usage.completion_tokens)) == ("ok", (11, 7))
    r = _ask(keyed_stack, None, "MALFORMED request")
    assert r.status_code == 400, r.text
    out = _outcome(keyed_stack, ups.seen[-1]["decision"])
    assert (out.status, out.upstream_status) == ("error", 400)


@pytest.mark.parametrize("routing", [None, {"tenant": "acme"}, {"tenant": "acme", "team": "t2"}])
def test_a_clients_budget_is_its_keys_whatever_its_metadata_says(keyed_stack: dict, routing: dict | None) -> None:
    """A client of the proxy authenticated as organisation ``broke`` ($0 a day): its request is refused 429 whether
    its ``metadata.pointsman`` names no tenant or another one. Before, the callback took the tenant from the client's
    metadata, so leaving it out (or naming ``acme``) spent unbudgeted."""
    body: dict = {"model": "chat", "messages": [{"role": "user", "content": "What is 2 + 2?"}]}
    if routing is not None:
        body["metadata"] = {"pointsman": routing}
    r = httpx.post(f"{keyed_stack['proxy']}/v1/chat/completions", json=body, timeout=60,
                   headers={"authorization": f"Bearer {BROKE_KEY}"})
    assert r.status_code == 429, r.text
    assert "tenant:broke" in r.text


@pytest.mark.parametrize("path,body", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "REJECT-AFTER-ROUTING"}]}),
    ("/v1/messages", {"max_tokens": 16, "messages": [{"role": "user", "content": "REJECT-AFTER-ROUTING"}]}),
], ids=["chat", "anthropic-messages"])
def test_a_request_rejected_after_routing_releases_its_hold(keyed_stack: dict, path: str, body: dict) -> None:
    """Another callback of the proxy (``REJECT_HOOK``, after Pointsman's) rejects the routed request before any
    upstream call: the decision gets an ``error`` outcome at once, releasing its budget hold (tenant ``rich``), rather
    than holding it until the reservation TTL (600 s)."""
    def rich() -> dict:
        budgets = httpx.get(f"{keyed_stack['pointsman_url']}/v1/budgets", timeout=10).json()["budgets"]
        return next(b for b in budgets if b["scope"] == "tenant:rich")

    since = time.time()
    before = {n: len(u.seen) for n, u in keyed_stack["upstreams"].items()}
    r = httpx.post(f"{keyed_stack['proxy']}{path}", timeout=60, headers={"authorization": f"Bearer {MASTER_KEY}"},
                   json={"model": "chat", **body, "metadata": {"pointsman": {"tenant": "rich"}}})
    assert r.status_code == 400 and "rejected by another hook" in r.text, r.text
    assert {n: len(u.seen) for n, u in keyed_stack["upstreams"].items()} == before
    deadline = time.monotonic() + 15
    while True:
        with OutcomeLog(keyed_stack["outcomes"]) as log:
            decisions = [d for d in log.joined(since_s=since - 1) if d.tenant == "rich"]
        if (decisions and decisions[-1].outcomes) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert decisions, "the request was routed (a decision for tenant rich)"
    assert [o.status for o in decisions[-1].outcomes] == ["error"]
    while rich()["held_usd"] != 0.0 and time.monotonic() < deadline:  # settled just after the outcome is stored
        time.sleep(0.1)
    assert rich()["held_usd"] == 0.0
