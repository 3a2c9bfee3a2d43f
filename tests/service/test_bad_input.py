"""Bad input and edges of issue 22 through the real app (FastAPI's TestClient over the ASGI app, its
SQLite ledger and outcome log): each test failed before its fix."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import httpx
import pytest
from fastapi.testclient import TestClient

from pointsman.estimator.estimate import FixedDifficulty
from pointsman.policy.engine import RoutingEngine
from pointsman.policy.fleet import load_fleet
from pointsman.policy.rules.compiler import DEFAULT_POLICY_PATH, load_policy
from pointsman.service.app import create_app
from pointsman.service.bootstrap import build_state
from pointsman.service.http_protocol import MAX_HEADER_BYTES
from pointsman.service.settings import Settings
from tests.service.conftest import free_port, stop

USER = '{"role": "user", "content": "What is the capital of France?"}'
HUGE = "9" * 5000  # past Python's int-conversion limit (4,300 digits)


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    data = tmp_path_factory.mktemp("bad_input")
    fleet = load_fleet()
    settings = Settings(data_dir=data, watch_policy=False, watch_fleet=False, scrape_interval_s=0)
    engine = RoutingEngine(fleet, load_policy(DEFAULT_POLICY_PATH, fleet), FixedDifficulty(0.2),
                           state=build_state(settings, fleet))
    with TestClient(create_app(settings, engine=engine, owns_engine=True), raise_server_exceptions=False) as c:
        yield c


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/route", '{"messages": [USER], "seed": HUGE}', "seed"),
    ("/v1/route", '{"messages": [USER], "routing": {"prefix_block_hashes": [1, -HUGE]}}', "routing.prefix_block_hashes[1]"),
    ("/v1/outcomes", '[{"decision_id": "d1", "usage": {"prompt_tokens": HUGE}}]', "[0].usage.prompt_tokens"),
    ("/v1/telemetry", '{"endpoint": "e", "load": {"num_requests_running": HUGE}}', "load.num_requests_running"),
])
def test_an_integer_past_the_conversion_limit_is_a_400_naming_its_field(client, path, body, param):
    body = body.replace("USER", USER).replace("HUGE", HUGE)
    r = client.post(path, content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["code"] == "number_too_long" and error["param"] == param
    assert "5,000 digits" in error["message"] and param in error["message"]


def _exchange(base: str, head: bytes, body_start: bytes, wait_s: float = 30.0) -> bytes:
    """Send ``head`` and the start of a body to a real server, then nothing; what it answers
    until it closes the connection (at most ``wait_s``: the bound of the test, not an assert)."""
    host, port = base.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=wait_s) as s:
        s.sendall(head + body_start)
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
        except TimeoutError:
            out += b"<no close>"
        return out


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_a_body_that_stalls_after_its_headers_is_a_408_and_the_connection_closes(tmp_path, serve, framing):
    """Issue 22: a client that sent its headers and part of a body, then nothing, held the
    connection with no timeout (40 s+, then logged as an internal error)."""
    _, base = serve(tmp_path, body_read_timeout_s="1", scrape_interval_s="0")
    start = b'{"messages": [{"role": "user", "content": "Hi'
    if framing == "chunked":
        head = b"POST /v1/route HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        start = f"{len(start) + 100:x}\r\n".encode() + start
    else:
        head = (b"POST /v1/route HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n" % (len(start) + 100))
    answer = _exchange(base, head, start)
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:300]
    assert answer.endswith(b"}"), answer[-300:]  # closed after the answer
    error = json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]
    assert error["code"] == "body_timeout" and error["param"] == "body_read_timeout_s"
    assert "POINTSMAN_BODY_READ_TIMEOUT_S" in error["message"]
    assert httpx.post(f"{base}/v1/route", json={"messages": [{"role": "user", "content": "Hi."}]}).status_code == 200


def test_request_headers_are_bounded_in_size_and_time_before_any_key_is_read(tmp_path, serve):
    """uvicorn read a request's line and headers without limit, before the app (and its API keys) saw them: eight
    connections of 100 MB of one unfinished header took a serve from 245 MB to 1,085 MB, and a connection that sent
    half a request line stayed open for good (each held a file descriptor). Found by a security review."""
    proc, base = serve(tmp_path, body_read_timeout_s="1", scrape_interval_s="0", gateway_api_keys="gw=gateway-secret-0")
    big = b"POST /v1/route HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * (MAX_HEADER_BYTES + 1000)
    answer = _exchange(base, big, b"")  # the header never ends (all read: closed with more unread, it would be a reset)
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:300]
    assert _exchange(base, b"POST /v1/ro", b"") == b""  # closed, nothing answered
    assert _exchange(base, b"POST /v1/route HTTP/1.1\r\nHost: x\r\nX-Pad: a", b"") == b""
    key = {"authorization": "Bearer gateway-secret-0"}
    with httpx.Client(base_url=base, headers=key) as c:  # one keep-alive connection: each request's headers in time
        for _ in range(3):
            assert c.post("/v1/route", json={"messages": [{"role": "user", "content": "Hi."}]},
                          headers={"x-pad": "a" * 60_000}).status_code == 200
    stop(proc)
    log = proc.stderr.read().decode()
    assert "Traceback" not in log, log


def test_a_client_gone_mid_body_is_no_internal_error(tmp_path, serve):
    proc, base = serve(tmp_path, scrape_interval_s="0")
    host, port = base.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port))) as s:
        s.sendall(b"POST /v1/route HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 1000\r\n\r\n{\"messages\": [")
    assert httpx.post(f"{base}/v1/route", json={"messages": [{"role": "user", "content": "Hi."}]}).status_code == 200
    stop(proc)
    log = proc.stderr.read().decode()
    assert "internal error" not in log and "Traceback" not in log, log


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/telemetry", {"endpoint": "http://llama-8b-0.inference.internal:8000/v1", "healthy": "yes"}, "healthy"),
    ("/v1/telemetry", {"endpoint": "http://llama-8b-0.inference.internal:8000/v1", "healthy": 0}, "healthy"),
    ("/v1/route", {"messages": [{"role": "user", "content": "Hi."}], "routing": {"explain": "on"}}, "routing.explain"),
    ("/v1/outcomes", {"decision_id": "d1", "shadow": "yes"}, "shadow"),
    ("/v1/outcomes", {"decision_id": "d1", "quality": {"regenerated": 1}}, "quality.regenerated"),
])
def test_a_boolean_field_takes_only_true_or_false(client, path, body, param):
    """Issue 22: ``healthy: "yes"`` was read as true (pydantic's lax bool: "yes", "on", 1, "1"), and
    ``shadow: "yes"`` made an outcome a shadow one, never settled."""
    r = client.post(path, json=body)
    assert r.status_code == 422, r.text
    assert r.json()["error"]["param"] == param
    assert "boolean" in r.json()["error"]["message"]


def test_a_key_in_the_query_string_is_not_read_and_not_logged(tmp_path):
    """Issue 22: ``?api_key=<secret>`` was written to the access log as it came. The service reads keys
    from headers only (docs/service.md, Auth); the access log keeps a query's names, not its values."""
    secret = "sk-live-0123456789abcdef"
    port = free_port()
    env = {**os.environ, "POINTSMAN_DATA_DIR": str(tmp_path), "POINTSMAN_SCRAPE_INTERVAL_S": "0",
           "POINTSMAN_GATEWAY_API_KEYS": f"gw={secret}"}
    proc = subprocess.Popen([sys.executable, "-m", "pointsman", "serve", "--port", str(port), "--log-level", "info"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{base}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                assert proc.poll() is None and time.monotonic() < deadline
                time.sleep(0.1)
        r = httpx.post(f"{base}/v1/route?api_key={secret}&x=1", json={"messages": [{"role": "user", "content": "Hi."}]})
        assert r.status_code == 401, r.text
        assert "query string" in r.json()["error"]["message"]
        assert httpx.get(f"{base}/healthz?token={secret}").status_code == 200
        ok = httpx.post(f"{base}/v1/route", json={"messages": [{"role": "user", "content": "Hi."}]},
                        headers={"authorization": f"Bearer {secret}"})
        assert ok.status_code == 200
    finally:
        stop(proc)
    log = proc.stdout.read().decode()
    assert "POST /v1/route?api_key=[redacted]&x=[redacted] HTTP/1.1" in log, log
    assert "GET /healthz?token=[redacted]" in log, log
    assert secret not in log


@pytest.mark.parametrize(("name", "hint"), [("Interactive", "; did you mean 'interactive'?"), ("batch", "")])
def test_an_unknown_slo_class_is_a_422_naming_the_fleets_classes(client, name, hint):
    """An SLO class the fleet does not declare used to get the default class's objectives silently."""
    r = client.post("/v1/route", json={"messages": [{"role": "user", "content": "Hi."}], "routing": {"slo_class": name}})
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["param"] == "routing.slo_class"
    assert error["message"] == f"unknown SLO class '{name}' (the fleet's classes: interactive, long-context){hint}"
    ok = client.post("/v1/route", json={"messages": [{"role": "user", "content": "Hi."}],
                                        "routing": {"slo_class": "long-context"}})
    assert ok.status_code == 200, ok.text


@pytest.mark.parametrize("field", ["tenant", "team", "session_id", "slo_class"])
@pytest.mark.parametrize("value", ["", "\u200b"])
def test_an_empty_routing_name_is_a_422_not_a_request_without_one(client, field, value):
    """``routing.tenant: ""`` (a gateway filling the tenant from an empty header) was taken as no tenant: the request
    ran unbudgeted (its signed claims held no scope) while docs/policy.md says an empty name is a 422, as one of only
    invisible characters already was."""
    r = client.post("/v1/route", json={"model": "auto", "messages": [{"role": "user", "content": "hi"}],
                                       "routing": {field: value}})
    assert r.status_code == 422 and r.json()["error"]["param"] == f"routing.{field}", r.text
    assert "empty" in r.json()["error"]["message"] or "invisible" in r.json()["error"]["message"]
