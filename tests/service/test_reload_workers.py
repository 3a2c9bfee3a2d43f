"""A reload through an admin endpoint reaches every worker: ``pointsman serve --workers 2`` with live state
in a real Redis and the file watchers off, each request on a fresh connection (either worker). Before,
``POST /v1/budgets/reload`` answered ``ok`` but only the worker that took the call applied the file: the
other went on admitting a tenant whose budget had been cut to $0 (half of its requests routed and spent)."""

from __future__ import annotations

import shutil
import subprocess
import time
import uuid

import httpx
import pytest

from tests.conftest import _answers_ping
from tests.service.conftest import free_port, stop

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


def _redis_on(port: int) -> subprocess.Popen:
    proc = subprocess.Popen([shutil.which("redis-server") or "redis-server", "--port", str(port), "--bind", "127.0.0.1",
                             "--save", "", "--appendonly", "no", "--daemonize", "no", "--loglevel", "warning"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while not _answers_ping(port):
        assert proc.poll() is None and time.monotonic() < deadline, "redis-server did not start"
        time.sleep(0.05)
    return proc


def test_a_budgets_reload_while_redis_is_down_reaches_every_worker_when_it_is_back(tmp_path, serve, redis_url):
    """The reload endpoint answers ok while Redis is down (the worker that took it applied the file); once
    Redis is back every worker applies it. Before, the announce was dropped: with Redis back, a worker kept
    the old budgets for good (4 of 10 fresh connections saw the old revision; routes alternated 200/429)."""
    port = free_port()
    redis = _redis_on(port)
    try:
        budgets = tmp_path / "budgets.yaml"
        budgets.write_text(BUDGETS.format(100))
        _, base = serve(tmp_path / "data", workers="2", watch_budgets="false", watch_policy="false",
                        watch_fleet="false", budgets_path=str(budgets), state_url=f"redis://127.0.0.1:{port}/0")
        stop(redis)
        budgets.write_text(BUDGETS.format(0))
        reloaded = _call(base, "POST", "/v1/budgets/reload")
        assert reloaded.status_code == 200 and reloaded.json()["changed"] is True
        revision = reloaded.json()["revision"]
        redis = _redis_on(port)
        deadline, seen = time.monotonic() + 30, 0
        while seen < 12:
            seen = seen + 1 if _call(base, "GET", "/v1/budgets").json()["revision"] == revision else 0
            if time.monotonic() >= deadline:  # say what each worker's shared state knew (a CI failure left no trace)
                states = [_call(base, "GET", "/v1/fleet").json()["shared_state"] for _ in range(6)]
                raise AssertionError(f"a worker still applies the old budgets after Redis came back: {states}")
    finally:
        stop(redis)


def test_a_fleet_reload_applies_on_every_worker(tmp_path, serve, redis_url):
    """The fleet: a reload rebuilds the worker's live state, whose start re-checked the shared reload counts
    from inside the announced reload and reloaded again, recursively (a ``RecursionError`` after 161 nested
    "ok" reloads): the worker that did not take the call kept the old fleet, its decisions priced at the old
    prices (6 of 12 fresh connections), while ``pointsman_fleet_reloads_total`` counted the reloads ``ok``."""
    from pointsman.policy.fleet import DEFAULT_FLEET_PATH

    fleet = tmp_path / "fleet.yaml"
    text = DEFAULT_FLEET_PATH.read_text()
    fleet.write_text(text)
    prefix = f"%7Bfleet-{uuid.uuid4().hex[:8]}%7D:"
    _, base = serve(tmp_path / "data", workers="2", watch_budgets="false", watch_policy="false", watch_fleet="false",
                    fleet_path=str(fleet), state_url=f"{redis_url}?prefix={prefix}")
    before = {_call(base, "GET", "/v1/fleet").json()["fleet_revision"] for _ in range(6)}
    assert len(before) == 1
    old = "      usd_per_1m_output_tokens: 0.60\n"
    assert text.count(old) == 1  # frontier-small's output price
    fleet.write_text(text.replace(old, "      usd_per_1m_output_tokens: 6.00\n"))
    reloaded = _call(base, "POST", "/v1/fleet/reload")
    assert reloaded.status_code == 200 and reloaded.json()["changed"] is True
    revision = reloaded.json()["revision"]
    assert revision not in before
    deadline, seen = time.monotonic() + 20, 0
    while seen < 12:
        seen = seen + 1 if _call(base, "GET", "/v1/fleet").json()["fleet_revision"] == revision else 0
        assert time.monotonic() < deadline, "a worker still serves the old fleet after the reload"
    route = {"messages": [{"role": "user", "content": "Say hello."}]}
    assert {_call(base, "POST", "/v1/route", route).json()["fleet_revision"] for _ in range(12)} == {revision}
    while True:  # both workers' counts (serve's multiprocess metrics); a worker counts its reload after the swap
        metrics = _call(base, "GET", "/metrics").text
        reloads = [line for line in metrics.splitlines() if line.startswith("pointsman_fleet_reloads_total")]
        if 'pointsman_fleet_reloads_total{result="ok",source="endpoint"} 2.0' in reloads:  # one each
            break
        assert time.monotonic() < deadline, reloads
        time.sleep(0.1)
