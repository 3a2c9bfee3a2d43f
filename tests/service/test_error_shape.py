"""Every error answer has the OpenAI shape ``{"error": {...}}``, Starlette's own 404 and 405 too."""

from fastapi.testclient import TestClient

from pointsman.estimator.estimate import FixedDifficulty
from pointsman.policy.engine import RoutingEngine
from pointsman.policy.fleet import load_fleet
from pointsman.policy.rules.compiler import load_policy
from pointsman.service.app import create_app
from pointsman.service.bootstrap import build_state
from pointsman.service.settings import Settings


def _client(tmp_path):
    fleet = load_fleet()
    settings = Settings(data_dir=tmp_path, watch_policy=False)
    engine = RoutingEngine(fleet, load_policy(settings.policy_path, fleet), FixedDifficulty(0.2),
                           state=build_state(settings, fleet))
    return TestClient(create_app(settings, engine=engine, owns_engine=True))


def test_unknown_path_and_wrong_method_answer_in_the_error_shape(tmp_path):
    with _client(tmp_path) as c:
        r = c.get("/v1/nope")
        assert r.status_code == 404
        assert r.json()["error"]["code"] == "not_found" and "/v1/nope" in r.json()["error"]["message"]
        r = c.get("/v1/route")
        assert r.status_code == 405
        err = r.json()["error"]
        assert err["code"] == "method_not_allowed" and "GET" in err["message"]
        assert "POST" in r.headers["allow"]
        assert "detail" not in r.json()
