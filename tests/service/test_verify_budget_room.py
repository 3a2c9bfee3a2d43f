"""The escalation of a verify is judged against the budget the verify leaves: the draft it settles
counts at its booked cost, not at the hold its decision took (``POST /v1/route`` then ``/v1/verify``
through the app, a real SQLite budget ledger)."""

from __future__ import annotations

from fastapi.testclient import TestClient

from pointsman.estimator.estimate import FixedDifficulty
from pointsman.policy.engine import RoutingEngine
from pointsman.policy.fleet import load_fleet
from pointsman.policy.rules.compiler import load_policy
from pointsman.service.app import create_app
from pointsman.service.bootstrap import build_state
from pointsman.service.settings import Settings

REFUSAL = "I'm sorry, but I cannot help with that request."
POLICY = ("apiVersion: pointsman/v1\nkind: RoutingPolicy\nrules:\n"
          "  - name: default\n    route: {target: onprem-8b}\n"
          "verify:\n  rules:\n"
          "    - name: refusal\n      when: draft.refusal\n      action: escalate\n"
          "      escalate: {target: frontier-small}\n"
          "    - name: accept\n      action: accept\n")


def _cascade(client: TestClient, tenant: str) -> tuple[dict, dict]:
    d = client.post("/v1/route", json={"max_tokens": 200, "routing": {"tenant": tenant},
                                       "messages": [{"role": "user", "content": "Explain the rules of kickball."}]})
    assert d.status_code == 200, d.text
    v = client.post("/v1/verify", json={"decision_id": d.json()["decision_id"], "usage": {"completion_tokens": 11},
                                        "draft": {"text": REFUSAL, "finish_reason": "stop"}})
    assert v.status_code == 200, v.text
    return d.json(), v.json()


def test_an_escalation_that_fits_once_the_draft_is_booked_is_made(tmp_path):
    """A refused draft of onprem-8b held ~$6.6e-6 and booked ~$2e-7 at the verify; its escalation to
    frontier-small estimates ~$1.2e-4. With the tenant's limit between (escalation + draft booked) and
    (escalation + draft's hold), the verify refused the escalation ("has $0.000118 of $0.000125 left":
    the draft's hold still counted) and accepted the refusal, though $0.000124815 was left once the
    verify had booked the draft, and the escalation fit."""
    policy, budgets = tmp_path / "policy.yaml", tmp_path / "budgets.yaml"
    policy.write_text(POLICY)
    budgets.write_text("apiVersion: pointsman/v1\nkind: Budgets\nbudgets: []\n")
    fleet = load_fleet()
    s = Settings(data_dir=tmp_path / "svc", policy_path=policy, watch_policy=False, watch_fleet=False,
                 watch_budgets=False, scrape_interval_s=0, budgets_path=budgets)
    engine = RoutingEngine(fleet, load_policy(policy, fleet), FixedDifficulty(0.3), state=build_state(s, fleet))
    with TestClient(create_app(s, engine=engine, owns_engine=True)) as client:
        d, v = _cascade(client, "probe")  # unlimited: what the draft holds, books, and the escalation holds
        assert (d["target"], v["action"], v["target"]) == ("onprem-8b", "escalate", "frontier-small")
        hold, booked = d["estimated_cost_usd"], v["draft_settlement"]["actual_cost_usd"]
        escalation = v["estimated_cost_usd"]
        assert booked < hold / 4
        limit = escalation + (hold + booked) / 2  # fits after the draft is booked, not beside its hold
        budgets.write_text("apiVersion: pointsman/v1\nkind: Budgets\nbudgets:\n"
                           f"  - {{scope: 'tenant:tight', window: day, limit_usd: {limit!r}}}\n")
        assert client.post("/v1/budgets/reload").json()["ok"] is True
        d, v = _cascade(client, "tight")
        assert d["estimated_cost_usd"] == hold
        assert (v["action"], v["target"]) == ("escalate", "frontier-small"), v["trace"]["rules"]
        b = client.get("/v1/budgets").json()["budgets"][0]
        assert b["scope"] == "tenant:tight" and b["spent_usd"] <= limit  # never over the limit
