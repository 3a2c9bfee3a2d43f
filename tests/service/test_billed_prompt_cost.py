"""A prompt the estimator's WordPiece undercounts (Thai, emoji, a hex run, Chinese) is priced at no less than
its real cost over HTTP: the decision's ``estimated_cost_usd`` and its budget hold are at or above the
cost of the largest real token count (o200k, cl100k, Claude's, DeepSeek-V3's; litellm ships them), and a
request whose real cost exceeds the budget left is refused, where it was admitted at a fraction of it.
The real app (``create_app``: the bundled estimator, the packaged fleet, a policy sending everything to
frontier-large at $2.50 per 1M input tokens)."""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr

from pointsman.estimator.features import TOKENS_PER_MESSAGE, count_tokens
from pointsman.estimator.model_source import load_estimator
from pointsman.policy.cost import estimate_cost
from pointsman.policy.fleet import load_fleet
from pointsman.service.app import create_app
from pointsman.service.settings import Settings

_spec = importlib.util.spec_from_file_location("token_texts", Path(__file__).parents[2] / "scripts" / "token_texts.py")
token_texts = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(token_texts)
REFS = token_texts.reference_tokenizers()
pytestmark = pytest.mark.skipif(len(REFS) < 4, reason="litellm's tokenizer files not installed")

ADMIN = {"Authorization": "Bearer admin-secret-0123"}
GATEWAY = {"Authorization": "Bearer gateway-secret-0123"}
POLICY = "apiVersion: pointsman/v1\nkind: RoutingPolicy\nrules:\n  - name: default\n    route: {target: frontier-large}\n"


def _client(tmp_path, day_usd: float) -> TestClient:
    (tmp_path / "policy.yaml").write_text(POLICY)
    (tmp_path / "budgets.yaml").write_text(
        f"apiVersion: pointsman/v1\nkind: Budgets\nbudgets:\n  - {{scope: 'tenant:acme', window: day, limit_usd: {day_usd}}}\n")
    settings = Settings(data_dir=tmp_path / "data", policy_path=tmp_path / "policy.yaml", watch_policy=False,
                        watch_fleet=False, watch_budgets=False, scrape_interval_s=0, budgets_path=tmp_path / "budgets.yaml",
                        gateway_api_keys=SecretStr("gw=gateway-secret-0123"), admin_api_keys=SecretStr("ops=admin-secret-0123"))
    return TestClient(create_app(settings))


def _cost(tokens: int) -> float:
    """frontier-large's price of ``tokens`` prompt tokens and 1 output token, nothing cached."""
    target = load_fleet().targets["frontier-large"]
    return estimate_cost("frontier-large", target, target.modes[0], tokens, 1).usd


def _body(text: str) -> dict:
    return {"messages": [{"role": "user", "content": text}], "max_tokens": 1, "routing": {"tenant": "acme"}}


def _held(c: TestClient) -> float:
    r = c.get("/v1/budgets", headers=ADMIN)
    assert r.status_code == 200, r.text
    return r.json()["budgets"][0]["held_usd"]


@pytest.mark.parametrize("category", ["thai", "emoji", "hex run", "chinese"])
def test_the_estimate_and_the_hold_are_at_least_the_real_cost(tmp_path, category):
    text = token_texts.CATEGORIES[category](random.Random(7), 6000)
    real = _cost(max(count(text) for count in REFS.values()) + TOKENS_PER_MESSAGE)
    with _client(tmp_path, 100.0) as c:
        r = c.post("/v1/route", json=_body(text), headers=GATEWAY)
        assert r.status_code == 200, r.text
        assert r.json()["target"] == "frontier-large"
        assert r.json()["estimated_cost_usd"] >= real
        assert _held(c) >= real


def test_a_request_costing_more_than_the_budget_left_is_refused(tmp_path):
    text = token_texts.CATEGORIES["thai"](random.Random(8), 6000)
    real = _cost(max(count(text) for count in REFS.values()) + TOKENS_PER_MESSAGE)
    wordpiece = _cost(count_tokens(text, load_estimator("bundled").tokenizer) + TOKENS_PER_MESSAGE)
    limit = 0.8 * real
    assert wordpiece < limit  # priced at the estimator's count, it fitted the budget
    with _client(tmp_path, limit) as c:
        r = c.post("/v1/route", json=_body(text), headers=GATEWAY)
        assert r.status_code == 429, r.text
        assert r.json()["error"]["code"] == "budget_exhausted"
        assert _held(c) == 0.0
