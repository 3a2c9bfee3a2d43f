"""A kept draft reported to another replica: two ``pointsman serve`` replicas with their own data folders
and live state and budget ledger in one real Redis. Replica A routes, verifies the draft's first 16 tokens
and escalates; the gateway's verify timed out, it kept the draft and reports it to B (any replica behind
the load balancer) under the decision id. B knows neither the escalation nor the verified prefix (A's
memory and outcome log): it forwards the outcome to A's log, and A settles the kept draft as if reported
there. Before, B's ack looked settled (the draft's id, replayed) while the draft's tokens beyond the prefix
were never booked (the spend was the prefix's $4.9e-06 of the draft's $2.8e-05) and the escalation's
$1.5e-04 frontier estimate stayed held until the reservation TTL."""

from __future__ import annotations

import time
import uuid

import httpx
import pytest

pytestmark = pytest.mark.slow

BUDGETS = "apiVersion: pointsman/v1\nkind: Budgets\nbudgets:\n  - {scope: 'tenant:acme', window: day, limit_usd: 100}\n"
REFUSAL = "I'm sorry, but I cannot help with that request."


def test_a_kept_draft_reported_to_another_replica_is_paid_once_and_closes_the_escalation(tmp_path, serve,
                                                                                           redis_url):
    budgets = tmp_path / "budgets.yaml"
    budgets.write_text(BUDGETS)
    prefix = f"%7Bkept-{uuid.uuid4().hex[:8]}%7D:"
    shared = {"budgets_path": str(budgets), "state_url": f"{redis_url}?prefix={prefix}",
              "budget_ledger": f"{redis_url}?prefix={prefix}b:"}
    _, a = serve(tmp_path / "a", **shared)
    _, b = serve(tmp_path / "b", **shared)

    def spend() -> tuple[float, float]:
        got = httpx.get(f"{a}/v1/budgets", timeout=10).json()["budgets"][0]
        return got["settled_usd"], got["held_usd"]

    def kept_on(replica: str) -> tuple[float, float]:
        """A decision of A's, verified and escalated there, its kept draft reported to ``replica``: (the
        verify's booking of the prefix, what the report's ack settled under the escalation id, else 0)."""
        d = httpx.post(f"{a}/v1/route", json={"model": "auto", "messages": [{"role": "user", "content": "Explain kickball."}],
                                              "routing": {"tenant": "acme"}}, timeout=10).json()
        v = httpx.post(f"{a}/v1/verify", json={"decision_id": d["decision_id"], "draft": {"text": REFUSAL[:24], "partial": True},
                                               "usage": {"prompt_tokens": 12, "completion_tokens": 16}}, timeout=10).json()
        assert v["action"] == "escalate" and v["draft"]["tokens"] == 16
        r = httpx.post(f"{replica}/v1/outcomes", json={"decision_id": d["decision_id"], "status": "ok",
                                                       "served_target": d["target"],
                                                       "usage": {"prompt_tokens": 12, "completion_tokens": 120}}, timeout=10)
        assert r.status_code in (200, 202), r.text
        s = r.json()["acks"][0].get("settlement") or {}
        return v["draft_settlement"]["actual_cost_usd"], s["actual_cost_usd"] if s.get("decision_id") == v["escalation_id"] \
            else 0.0

    before = spend()
    draft, rest = kept_on(a)  # the reference: reported where it was verified
    assert rest > 0 and spend() == (pytest.approx(before[0] + draft + rest, abs=1e-8), 0.0)
    middle = spend()
    draft_b, _ = kept_on(b)
    deadline = time.monotonic() + 20
    while spend()[0] < middle[0] + draft_b + rest - 1e-9:  # A settles it when the forwarded outcome arrives
        assert time.monotonic() < deadline, f"the kept draft's rest is not booked: {spend()} after {middle}"
        time.sleep(0.1)
    assert spend() == (pytest.approx(middle[0] + draft_b + rest, abs=1e-8), 0.0)  # paid once, nothing held
