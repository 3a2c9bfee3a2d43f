"""schemathesis against the service's own OpenAPI schema, in process (ASGI): generated requests
for every operation, valid and invalid, never get a 5xx, and every response matches the
schema (status code documented, body valid, content type declared). Bounded: a few examples
per operation, no deadline (the machine is shared), with auth on so the auth paths are covered."""

from __future__ import annotations

import shutil

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import content_type_conformance, response_schema_conformance, status_code_conformance

from pointsman.estimator.estimate import FixedDifficulty
from pointsman.policy.engine import RoutingEngine
from pointsman.policy.fleet import load_fleet
from pointsman.policy.rules.compiler import STATIC_POLICY_PATH, load_policy
from pointsman.service.app import create_app
from pointsman.service.bootstrap import build_state
from pointsman.service.settings import Settings

ADMIN = "admin-secret-0123"
CHECKS = [not_a_server_error, response_schema_conformance, status_code_conformance, content_type_conformance]


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    """The app (lifespan running) and its schema loaded by schemathesis from ``/openapi.json``."""
    tmp = tmp_path_factory.mktemp("schemathesis")
    policy_path = tmp / "policy.yaml"
    shutil.copy(STATIC_POLICY_PATH, policy_path)
    fleet = load_fleet()
    s = Settings(data_dir=tmp, policy_path=policy_path, watch_policy=False, admin_api_keys=f"ops={ADMIN}",
                 gateway_api_keys="edge=gw-secret-0123")
    engine = RoutingEngine(fleet, load_policy(policy_path, fleet), FixedDifficulty(0.3), state=build_state(s, fleet))
    app = create_app(s, engine=engine, owns_engine=True)
    with TestClient(app):  # runs the lifespan: the runtime serves while schemathesis calls the app
        yield schemathesis.openapi.from_asgi("/openapi.json", app)


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=["valid", "invalid"])
def test_no_5xx_and_every_response_matches_the_schema(api, mode):
    operations = [result.ok() for result in api.get_all_operations()]
    assert len(operations) == 14  # + GET /v1/budgets, POST /v1/budgets/reload
    for operation in operations:
        if mode is GenerationMode.NEGATIVE and not len(operation.body):
            continue  # nothing to make invalid (no body, no parameters)

        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(max_examples=10, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        def check(case):
            case.call_and_validate(headers={"authorization": f"Bearer {ADMIN}"}, checks=CHECKS)

        check()
