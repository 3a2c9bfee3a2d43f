"""The budget ledger down, the service fail-closed (``POINTSMAN_BUDGET_FAIL_OPEN=false``, the default):
``PointsmanClient`` refuses a request with a budget, as the service answered, rather than routing it
without Pointsman. A real ``pointsman serve`` whose Redis ledger does not answer. Before, the client took
the 503 ``budget_ledger_unavailable`` for "Pointsman is down" and failed open: the request was served
with no decision id, so nothing was reserved or ever booked (with fail-open the service would at least
have journaled its spend)."""

from __future__ import annotations

import pytest

from pointsman.integrations.client import BudgetExhausted, BudgetUnavailable, PointsmanClient
from tests.service.conftest import free_port


def test_the_client_refuses_a_budgeted_request_the_fail_closed_service_refused(tmp_path, serve):
    budgets = tmp_path / "budgets.yaml"
    budgets.write_text("apiVersion: pointsman/v1\nkind: Budgets\nbudgets:\n"
                       "  - {scope: 'tenant:t1', window: day, limit_usd: 10}\n")
    _, base = serve(tmp_path / "data", budgets_path=str(budgets), watch_policy="false",
                    budget_ledger=f"redis://127.0.0.1:{free_port()}/0")  # nothing listens there
    client = PointsmanClient(base, route_timeout_s=10)
    with pytest.raises(BudgetUnavailable, match="budget ledger unavailable") as refused:
        client.route({"messages": [{"role": "user", "content": "hi"}], "routing": {"tenant": "t1"}})
    assert isinstance(refused.value, BudgetExhausted)  # the integrations refuse it as a budget refusal
    unbudgeted = client.route({"messages": [{"role": "user", "content": "hi"}], "routing": {"tenant": "t2"}})
    assert unbudgeted is not None and unbudgeted["decision_id"]  # no budget applies: decided as usual
    assert client.stats["budget_refused"] == 1 and client.stats["route_failed"] == 0
    client.close()
