"""Bad input and edges of issue 22 through the real app (FastAPI's TestClient over the ASGI app, its
SQLite ledger and outcome log): each test failed before its fix."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from pointsman.estimator.estimate import FixedDifficulty
from pointsman.policy.engine import RoutingEngine
from pointsman.policy.fleet import load_fleet
from pointsman.policy.rules.compiler import DEFAULT_POLICY_PATH, load_policy
from pointsman.service.app import create_app
from pointsman.service.bootstrap import build_state
from pointsman.service.settings import Settings

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
