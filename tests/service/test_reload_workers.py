"""A reload through an admin endpoint reaches every worker: ``pointsman serve --workers 2`` with live state
in a real Redis and the file watchers off, each request on a fresh connection (either worker). Before,
``POST /v1/budgets/reload`` answered ``ok`` but only the worker that took the call applied the file: the
other went on admitting a tenant whose budget had been cut to $0 (half of its requests routed and spent)."""

from __future__ import annotations

import time
import uuid

import httpx
import pytest

pytestmark = pytest.mark.slow

BUDGETS = "apiVersion: pointsman/v1\nkind: Budgets\nbudgets:\n  - {{scope: 'tenant:t1', window: day, limit_usd: {}}}\n"


def _call(base: str, method: str, path: str, body: dict | None = None) -> httpx.Response:
    with httpx.Client(base_url=base, timeout=10) as c:  # a new connection: either worker
        return c.request(method, path, json=body)


def test_a_budgets_reload_applies_on_every_worker(tmp_path, serve, redis_url):
    budgets = tmp_path / "budgets.yaml"
    budgets.write_text(BUDGETS.format(100))
    prefix = f"%7Breload-{uuid.uuid4().hex[:8]}%7D:"
    _, base = serve(tmp_path / "data", workers="2", watch_budgets="false", watch_policy="false",
                    watch_fleet="false", budgets_path=str(budgets), state_url=f"{redis_url}?prefix={prefix}",
                    budget_ledger=f"{redis_url}?prefix={prefix}b:")
    route = {"messages": [{"role": "user", "content": "Say hello."}], "routing": {"tenant": "t1"}}
    assert [_call(base, "POST", "/v1/route", route).status_code for _ in range(6)] == [200] * 6
    budgets.write_text(BUDGETS.format(0))
    reloaded = _call(base, "POST", "/v1/budgets/reload")
    assert reloaded.status_code == 200 and reloaded.json()["changed"] is True
    revision = reloaded.json()["revision"]
    # each worker answers with the revision it applies: wait until 12 fresh connections in a row see the new one
    deadline, seen = time.monotonic() + 20, 0
    while seen < 12:
        seen = seen + 1 if _call(base, "GET", "/v1/budgets").json()["revision"] == revision else 0
        assert time.monotonic() < deadline, "a worker still applies the old budgets after the reload"
    statuses = [_call(base, "POST", "/v1/route", route).status_code for _ in range(12)]
    assert statuses == [429] * 12
