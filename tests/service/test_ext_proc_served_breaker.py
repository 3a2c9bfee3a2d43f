"""The outcome breaker counts an ext_proc outcome on the endpoint Envoy served it from
(``x-gateway-destination-endpoint-served``), which may be a fallback of the picked one: a real gRPC client
driving the endpoint picker as Envoy does. Before, every outcome was counted on the picked endpoint: five
503s from llama-8b-1 (picked three times, a fallback twice) tripped neither 8B replica, the errors being
split over both, and a request Envoy retried on a fallback after the picked replica refused it cleared the
picked replica's count."""

from __future__ import annotations

import json
import time

import pytest
from fastapi.testclient import TestClient

from pointsman.estimator.estimate import FixedDifficulty
from pointsman.policy.engine import RoutingEngine
from pointsman.policy.fleet import load_fleet
from pointsman.policy.rules.compiler import STATIC_POLICY_PATH, load_policy
from pointsman.service.app import create_app
from pointsman.service.bootstrap import build_state
from pointsman.service.settings import Settings
from tests.service.test_ext_proc import chat, request_phase, response_phase, run, set_headers

SERVED = "llama-8b-1.inference.internal:8000"


@pytest.fixture
def picker_app(tmp_path):
    settings = Settings(data_dir=tmp_path, watch_policy=False, watch_fleet=False, scrape_interval_s=0, ext_proc_port=0,
                        decision_log_flush_ms=5)
    fleet = load_fleet()
    engine = RoutingEngine(fleet, load_policy(STATIC_POLICY_PATH, fleet), FixedDifficulty(0.1),
                           state=build_state(settings, fleet))
    with TestClient(create_app(settings, engine=engine, owns_engine=True)) as client:
        yield client.app


def _stream(app, status: int) -> str:
    """One request: decided, then answered ``status`` by llama-8b-1 (picked or a fallback), and settled; the
    endpoint picked."""
    async def scenario(stub, _):
        call = stub.Process()
        req = await request_phase(call, chat("Say hi."))
        await response_phase(call, status, "application/json", [json.dumps({"error": "x"}).encode()], served=SERVED)
        await call.done_writing()
        return set_headers(req[0])
    headers = run(app, scenario)
    state, deadline = app.state.runtime.live.engine.state, time.monotonic() + 10
    while state.record(headers["x-pointsman-decision-id"]) is not None and time.monotonic() < deadline:
        time.sleep(0.02)  # stored, then settled (the breaker fed) in the background
    return headers["x-gateway-destination-endpoint"].split(",")[0]


def _healthy(app) -> dict[str, bool]:
    state, fleet = app.state.runtime.live.engine.state, app.state.runtime.live.engine.fleet
    return {info.name: state.is_healthy(eid) for eid, info in fleet.endpoints.items() if info.target == "onprem-8b"}


def test_errors_count_on_the_endpoint_that_served_them(picker_app):
    picked = [_stream(picker_app, 503) for _ in range(5)]
    assert SERVED in picked and set(picked) != {SERVED}  # picked sometimes, a fallback other times
    assert _healthy(picker_app) == {"llama-8b-0": True, "llama-8b-1": False}


def test_client_errors_do_not_trip_the_endpoint(picker_app):
    """An upstream 4xx (a bad request, a prompt over the context window) is the endpoint answering: as Envoy's
    outlier detection counts only 5xx, it clears the endpoint's count instead of adding to it. Before, five 400s
    (say, a client sending malformed requests) marked the replica unhealthy; it then got no requests."""
    for _ in range(5):
        _stream(picker_app, 400)
    assert _healthy(picker_app) == {"llama-8b-0": True, "llama-8b-1": True}
    for _ in range(4):
        _stream(picker_app, 503)
    _stream(picker_app, 400)  # answered: the count starts again
    _stream(picker_app, 503)
    assert _healthy(picker_app) == {"llama-8b-0": True, "llama-8b-1": True}


def test_too_slow_or_too_busy_trips_the_endpoint(picker_app):
    """408 and 429 are the endpoint too slow or too busy, not the client's request refused: they count, as on
    ``POST /v1/outcomes`` (``OutcomeIn.counts_as_answered``). Before, every status below 500 cleared the count."""
    for status in (429, 408, 429, 503, 408):
        _stream(picker_app, status)
    assert _healthy(picker_app) == {"llama-8b-0": True, "llama-8b-1": False}
