"""A budget refusal's message states amounts a reader can compare: a 429 through the app, with a real
SQLite ledger, whose estimate exceeds what is left by less than a micro-dollar."""

from __future__ import annotations

import re
import shutil

from fastapi.testclient import TestClient

from pointsman.estimator.estimate import FixedDifficulty
from pointsman.policy.engine import RoutingEngine
from pointsman.policy.fleet import load_fleet
from pointsman.policy.rules.compiler import STATIC_POLICY_PATH, load_policy
from pointsman.service.app import create_app
from pointsman.service.bootstrap import build_state
from pointsman.service.settings import Settings

BODY = {"model": "auto", "max_tokens": 100, "messages": [{"role": "user", "content": "Hello there"}]}


def test_a_refusal_names_an_estimate_above_what_is_left(tmp_path):
    """Two onprem-8b requests of ~$3.4e-6 under a limit of twice that less $1e-7: the second read
    "estimated $0.000003 does not fit the budget: tenant:tiny has $0.000003 of $0.000007 left" (six
    decimals), a refusal whose own numbers say it fits. The amounts are now written to the ledger's
    nano-dollar, so the estimate reads above what is left."""
    policy, budgets = tmp_path / "policy.yaml", tmp_path / "budgets.yaml"
    shutil.copy(STATIC_POLICY_PATH, policy)
    budgets.write_text("apiVersion: pointsman/v1\nkind: Budgets\nbudgets: []\n")
    fleet = load_fleet()
    s = Settings(data_dir=tmp_path / "svc", policy_path=policy, watch_policy=False, watch_fleet=False,
                 watch_budgets=False, scrape_interval_s=0, budgets_path=budgets)
    engine = RoutingEngine(fleet, load_policy(policy, fleet), FixedDifficulty(0.3), state=build_state(s, fleet))
    with TestClient(create_app(s, engine=engine, owns_engine=True)) as client:
        probe = client.post("/v1/route", json=BODY).json()  # no budget: the estimate
        estimate = probe["estimated_cost_usd"]
        assert probe["target"] == "onprem-8b" and 1e-6 < estimate < 1e-5
        limit = round(2 * estimate - 1e-7, 9)
        budgets.write_text("apiVersion: pointsman/v1\nkind: Budgets\nbudgets:\n"
                           f"  - {{scope: 'tenant:tiny', window: day, limit_usd: {limit!r}}}\n")
        assert client.post("/v1/budgets/reload").json()["ok"] is True
        tiny = {**BODY, "routing": {"tenant": "tiny"}}
        assert client.post("/v1/route", json=tiny).status_code == 200
        refused = client.post("/v1/route", json=tiny)
        assert refused.status_code == 429, refused.text
        message = refused.json()["error"]["message"]
        found = re.findall(r"estimated (?:at least )?\$([0-9.]+) does not fit the budget: tenant:tiny has \$([0-9.]+) of \$([0-9.]+)",
                           message)
        assert found, message
        for wanted, left, of in found:
            assert float(wanted) > float(left), message
            assert float(of) == limit, message
