"""The hot paths (``app.PointsmanApp``: ``POST /v1/route`` and ``/v1/outcomes`` without FastAPI's
layers) answer exactly as the FastAPI routes do, which still serve them under a ``root_path``;
``JSONAnswer`` (orjson) writes the JSON ``JSONResponse`` writes, and ``decode_json`` (orjson first)
reads and refuses what ``json.loads`` does."""

import asyncio
import collections
import json
import math

import pytest
from fastapi.responses import JSONResponse
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import SecretStr
from starlette.requests import Request

from pointsman.estimator.estimate import FixedDifficulty
from pointsman.policy.engine import RoutingEngine
from pointsman.policy.fleet import load_fleet
from pointsman.policy.rules.compiler import load_policy
from pointsman.service import app as app_module
from pointsman.service.app import create_app
from pointsman.service.bodies import JSONAnswer, decode_json, json_answer, read_body
from pointsman.service.bootstrap import build_state
from pointsman.service.http_errors import HTTPError
from pointsman.service.settings import Settings

KEY = "gateway-secret-0123"
BODY = {"model": "chat", "messages": [{"role": "user", "content": "Summarise the plot of Hamlet."}],
        "routing": {"tenant": "acme"}}


def _app(tmp_path, **extra):
    """The app on a fixed difficulty, its estimator's deadline (the pool, as served) a minute: on a loaded
    machine the pool's hand-off can pass the 50 ms default, and one path's ``p_hard`` would then be null
    (CI saw ``difficulty_available: false`` on one side; the answers must compare)."""
    fleet = load_fleet()
    s = Settings(data_dir=tmp_path, watch_policy=False, gateway_api_keys=SecretStr(f"edge={KEY}"),
                 estimator_timeout_ms=60_000, **extra)
    engine = RoutingEngine(fleet, load_policy(s.policy_path, fleet), FixedDifficulty(0.2), state=build_state(s, fleet))
    return create_app(s, engine=engine, owns_engine=True)


def _exchange(c: TestClient, calls: list[int]) -> list[tuple[int, object, dict[str, str]]]:
    """The answers to a fixed series of calls (decision ids and timings blanked)."""
    auth = {"Authorization": f"Bearer {KEY}"}
    out = []

    def keep(r):
        body = r.json()
        text = json.dumps(body, sort_keys=True)
        for value in {body.get("decision_id"), *(a.get("decision_id") for a in body.get("acks", []))} - {None}:
            text = text.replace(value, "<id>")
        kept = json.loads(text)
        kept.pop("timings_ms", None)
        headers = {k: v for k, v in r.headers.items() if k in ("www-authenticate", "content-type", "x-pointsman-target")}
        out.append((r.status_code, kept, headers))
        return body

    keep(c.post("/v1/route", json=BODY))  # no key
    keep(c.post("/v1/route", json=BODY, headers={"x-api-key": "wrong-key-123"}))
    keep(c.post("/v1/route", json=BODY, headers={"Authorization": f"Basic {KEY}"}))  # not a bearer: no key
    keep(c.post("/v1/route", content=b"{nope", headers=auth))
    keep(c.post("/v1/route", json={**BODY, "routing": {"tenat": "x"}}, headers=auth))
    keep(c.post("/v1/route", content=b"", headers=auth))
    decision = keep(c.post("/v1/route", json=BODY, headers={"x-api-key": KEY}))
    keep(c.post("/v1/route", json={**BODY, "routing": {"explain": True}}, headers={"authorization": f"bearer {KEY}"}))
    outcome = {"decision_id": decision["decision_id"], "status": "ok", "served_target": decision["target"],
               "usage": {"prompt_tokens": 12, "completion_tokens": 40}, "e2e_latency_ms": 900.0}
    keep(c.post("/v1/outcomes", json=outcome))
    keep(c.post("/v1/outcomes", json=outcome, headers=auth))
    keep(c.post("/v1/outcomes", json=outcome, headers=auth))  # duplicate
    keep(c.post("/v1/outcomes", json={**outcome, "status": "bogus"}, headers=auth))
    keep(c.post("/v1/outcomes", json=[outcome, {"decision_id": "nope"}], headers=auth))
    calls.append(len(out))
    return out


def test_hot_paths_answer_as_the_fastapi_routes(tmp_path, monkeypatch):
    served: list[str] = []
    hot = dict(app_module.HOT_PATHS)
    for path, handler in hot.items():
        async def counted(request, handler=handler, path=path):
            served.append(path)
            return await handler(request)
        monkeypatch.setitem(app_module.HOT_PATHS, path, counted)
    calls: list[int] = []
    with TestClient(_app(tmp_path / "hot")) as c:
        direct = _exchange(c, calls)
    assert len(served) == calls[0]  # every call took the hot path
    with TestClient(_app(tmp_path / "routed"), root_path="/pointsman") as c:
        routed = _exchange(c, calls)
    assert len(served) == calls[0]  # none did under a root_path: the FastAPI routes answered
    assert [r[0] for r in direct] == [401, 401, 401, 400, 422, 400, 200, 200, 401, 200, 200, 422, 200]
    assert direct == routed


def test_deciding_in_the_threadpool_answers_as_on_the_loop(tmp_path):
    """``POINTSMAN_ROUTE_IN_THREADPOOL``: the whole route in a worker thread (``route_async(in_thread=True)``)
    answers every call of the series exactly as the event loop's path does."""
    calls: list[int] = []
    with TestClient(_app(tmp_path / "loop")) as c:
        on_loop = _exchange(c, calls)
    with TestClient(_app(tmp_path / "thread", route_in_threadpool=True)) as c:
        in_thread = _exchange(c, calls)
    assert in_thread == on_loop and [r[0] for r in on_loop].count(200) == 5


def test_an_unexpected_error_on_a_hot_path_is_the_logged_500(tmp_path, monkeypatch, caplog):
    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr("pointsman.service.routes_decisions.decide", broken)
    with TestClient(_app(tmp_path), raise_server_exceptions=False) as c:
        r = c.post("/v1/route", json=BODY, headers={"x-api-key": KEY})
    assert r.status_code == 500
    assert r.json() == {"error": {"message": "internal error; the service log has the details",
                                  "type": "internal_error", "param": None, "code": "internal_error"}}
    assert "boom" in caplog.text


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20)


@settings(max_examples=150, deadline=None)
@given(json_values)
def test_json_answer_writes_what_json_response_writes(value):
    assert json.loads(JSONAnswer(value).body) == json.loads(JSONResponse(value).body)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_json_answer_refuses_what_json_response_refuses(bad):
    for value in (bad, {"a": [1, {"b": bad}]}, [None, bad]):
        with pytest.raises(ValueError):
            JSONResponse(value)
        with pytest.raises(ValueError):
            JSONAnswer(value)


header_values = st.text(st.characters(max_codepoint=255, exclude_categories=["Cs"]), max_size=12)


@settings(max_examples=150, deadline=None)
@given(json_values, header_values, header_values)
def test_json_answer_of_raw_headers_is_the_json_answer_of_a_header_dict(value, decision_id, target):
    """``json_answer`` (``/v1/route``'s answer, its headers given as raw pairs) is ``JSONAnswer`` of the same
    content and header dict: the same status, body and raw headers, in the same order."""
    expected = JSONAnswer(value, headers={"x-pointsman-decision-id": decision_id, "x-pointsman-target": target})
    got = json_answer(value, [(b"x-pointsman-decision-id", decision_id.encode("latin-1")),
                              (b"x-pointsman-target", target.encode("latin-1"))])
    assert (got.status_code, got.body, got.raw_headers, got.background) == \
        (expected.status_code, expected.body, expected.raw_headers, expected.background)
    assert dict(got.headers) == dict(expected.headers)


def test_a_body_read_in_chunks_that_wait_is_the_whole_body(tmp_path):
    """``read_body`` reads a body whose chunks are not there yet (each receive waits on the event loop, the
    deadline's timer armed meanwhile), and a client that goes away mid-body is a 400; the deadline: ``test_bad_input``."""
    settings_ = Settings(data_dir=tmp_path, watch_policy=False)
    chunks = [b'{"a": ', b"[1, 2", b"]}"]

    async def read(messages):
        queue: asyncio.Queue = asyncio.Queue()

        async def feed():
            for m in messages:
                await asyncio.sleep(0.01)
                await queue.put(m)
        task = asyncio.create_task(feed())
        scope = {"type": "http", "method": "POST", "path": "/v1/route", "headers": [], "query_string": b""}
        try:
            return await read_body(Request(scope, queue.get), settings_)
        finally:
            await task
    body = asyncio.run(read([{"type": "http.request", "body": c, "more_body": i < 2} for i, c in enumerate(chunks)]))
    assert body == b"".join(chunks)
    with pytest.raises(HTTPError) as gone:
        asyncio.run(read([{"type": "http.request", "body": chunks[0], "more_body": True}, {"type": "http.disconnect"}]))
    assert gone.value.status == 400 and gone.value.code == "client_disconnected"


json_values_nan = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=4) | st.lists(inner, max_size=3).map(tuple)
    | st.dictionaries(st.text(max_size=4), inner, max_size=4)
    | st.dictionaries(st.text(max_size=4), inner, max_size=3).map(collections.OrderedDict),
    max_leaves=20)


@settings(max_examples=200, deadline=None)
@given(json_values_nan)
def test_json_answer_refuses_exactly_what_json_response_refuses(value):
    """NaN and infinities anywhere (lists, tuples, dicts and a dict subclass): ``JSONAnswer`` refuses what
    ``JSONResponse`` refuses and writes the same JSON otherwise."""
    try:
        expected = JSONResponse(value).body
    except ValueError:
        with pytest.raises(ValueError):
            JSONAnswer(value)
        return
    assert json.loads(JSONAnswer(value).body) == json.loads(expected)


def _reading(raw: bytes) -> str:
    """What the standard library reads from ``raw`` (as JSON text, so int/float and NaN compare), or ERROR."""
    try:
        return json.dumps(json.loads(raw.decode("utf-8")))
    except (ValueError, RecursionError):
        return "ERROR"


def _decoded(raw: bytes) -> str:
    try:
        return json.dumps(decode_json(raw))
    except HTTPError:
        return "ERROR"


wide_json = st.recursive(
    st.none() | st.booleans() | st.integers(-2**80, 2**80) | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20)


@settings(max_examples=200, deadline=None)
@given(wide_json, st.sampled_from([None, "utf-8", "ascii"]))
def test_decode_json_reads_what_json_loads_reads(value, encoding):
    raw = json.dumps(value, ensure_ascii=encoding == "ascii").encode("utf-8")
    assert _decoded(raw) == _reading(raw)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=40) | st.sampled_from([b'"\\ud800"', b"[1e400]", b"NaN", b'{"a":1,"a":2}', b"\xef\xbb\xbf{}",
                                                  b'"\xed\xa0\x80"', b"[" * 2000 + b"]" * 2000, b"[1,]", b'"\xc0\xaf"']))
def test_decode_json_refuses_what_json_loads_refuses(raw):
    if raw.strip():
        assert _decoded(raw) == _reading(raw)
