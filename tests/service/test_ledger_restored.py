"""``pointsman serve`` books again what its Redis budget ledger lost: a real redis-server (append-only,
``everysec``) FLUSHALLed under a running service gets every scope's spend back from the replica's spend
journal, once, and ``pointsman_spend_restored_total`` counts the settlements (``FleetState.restore_spend``,
run by ``Runtime.replay_spend``)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import httpx

from pointsman.policy.budget.journal import DEFAULT_JOURNAL_NAME, Booked, Seen, SettleArgs, SpendJournal
from pointsman.policy.budget.redis_ledger import RedisLedger
from pointsman.policy.budget.units import to_nusd
from tests.policy.test_ledger_restore import Redis, _redis_binary  # noqa: F401 - the fixture skips without redis-server
from tests.service.conftest import free_port

SCOPES = ("tenant:acme", "tenant:zeta")


def spend(ledger: RedisLedger) -> dict[str, float]:
    return {s.scope: round(s.settled_usd, 9) for s in ledger.snapshot(list(SCOPES)).statuses if s.window == "month"}


def restored(base: str) -> float:
    m = re.search(r"^pointsman_spend_restored_total (\S+)$", httpx.get(f"{base}/metrics", timeout=10).text, re.M)
    return float(m.group(1)) if m else 0.0


def test_serve_books_again_the_spend_a_flushed_redis_lost(tmp_path, serve):
    (tmp_path / "redis").mkdir()
    redis = Redis(tmp_path / "redis")
    budgets = tmp_path / "budgets.yaml"
    budgets.write_text("kind: Budgets\nbudgets:\n  - {scope: 'tenant:acme', window: day, limit_usd: 1000}\n")
    ledger = RedisLedger.from_url(redis.url)
    try:
        _, base = serve(tmp_path / "data", budgets_path=str(budgets), budget_ledger=redis.url, watch_policy="false")
        with httpx.Client(base_url=base, timeout=30) as c:
            for n in range(6):
                d = c.post("/v1/route", json={"messages": [{"role": "user", "content": f"question {n}"}],
                                              "routing": {"tenant": SCOPES[n % 2].split(":")[1]}})
                assert d.status_code == 200, d.text
                r = c.post("/v1/outcomes", json={"decision_id": d.json()["decision_id"],
                                                  "usage": {"prompt_tokens": 100 + n, "completion_tokens": 10 + n}})
                assert r.status_code == 200 and r.json()["acks"][0]["status"] == "stored", r.text
        booked = spend(ledger)
        assert all(v > 0 for v in booked.values()), booked
        redis.flushall()
        assert all(v == 0 for v in spend(ledger).values())
        deadline = time.monotonic() + 60  # no timing claim: the service checks every second
        while spend(ledger) != booked and time.monotonic() < deadline:
            time.sleep(0.2)
        assert spend(ledger) == booked
        while restored(base) < 6 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert restored(base) == 6
        time.sleep(2.5)  # a few more checks by the service: restored once, not again
        assert spend(ledger) == booked and restored(base) == 6
    finally:
        ledger.close()
        redis.stop()


def test_serve_killed_mid_restore_resumes_where_it_stopped(tmp_path, serve):
    """A flushed Redis, a spend journal of 5,000 settlements to book again: ``pointsman serve`` is SIGKILLed half way
    through its restore pass (Redis has run 2,500 of its scripts), then started again on the same data folder. The pass
    kept how far it got (every ``RESTORE_NOTE_ROWS`` rows, with its mark): the new process resumes there (before, from
    the first row: all 5,000 again), and each scope's spend is each settlement once."""
    import redis as redis_py

    (tmp_path / "redis").mkdir()
    redis = Redis(tmp_path / "redis")
    budgets = tmp_path / "budgets.yaml"
    budgets.write_text("kind: Budgets\nbudgets:\n  - {scope: 'tenant:acme', window: day, limit_usd: 1000}\n")
    ledger = RedisLedger.from_url(redis.url)
    client = redis_py.Redis(port=redis.port)
    data, n = tmp_path / "data", 5000
    journal = SpendJournal(data / DEFAULT_JOURNAL_NAME)
    now, expected = time.time(), dict.fromkeys(SCOPES, 0)
    rows = []
    for i in range(n):
        cost = 0.001 + (i % 97) * 1e-6
        expected[SCOPES[i % 2]] += to_nusd(cost)
        args: SettleArgs = {"actual_cost_usd": cost, "now": now, "target": None, "prompt_tokens": 100,
                            "cached_tokens": 0, "completion_tokens": 10, "scopes": [SCOPES[i % 2]], "issued_s": now}
        rows.append(Booked(f"d-{i:05d}", args, now, now + ledger.config.record_retention_s))
    journal._book_many(rows)
    journal.see(Seen(*ledger.incarnation(), time.time()))  # the replica saw this store; then it is flushed
    redis.flushall()

    def nusd() -> dict[str, int]:
        return {s: round(v * 1e9) for s, v in spend(ledger).items()}

    def scripts_run() -> int:
        return int(client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))

    env = {**os.environ, "POINTSMAN_DATA_DIR": str(data), "POINTSMAN_BUDGETS_PATH": str(budgets),
           "POINTSMAN_BUDGET_LEDGER": redis.url, "POINTSMAN_WATCH_POLICY": "false", "HF_HUB_OFFLINE": "1",
           "ORT_DISABLE_TELEMETRY": "1", "MLFLOW_DISABLE_TELEMETRY": "true"}
    first = subprocess.Popen([sys.executable, "-m", "pointsman", "serve", "--port", str(free_port()), "--log-level",
                              "warning"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120  # no timing claim: a start takes seconds on a loaded machine
        while scripts_run() < n // 2:
            assert first.poll() is None and time.monotonic() < deadline
            time.sleep(0.01)
        first.send_signal(signal.SIGKILL)
        first.wait()
        assert journal.restore_unfinished()  # killed mid-pass
        client.config_resetstat()
        _, base = serve(data, budgets_path=str(budgets), budget_ledger=redis.url, watch_policy="false")
        deadline = time.monotonic() + 120
        while nusd() != expected and time.monotonic() < deadline:
            time.sleep(0.2)
        assert nusd() == expected
        assert scripts_run() <= n - 1000  # resumed after the rows the killed pass noted (1,999 at least), not at the first
        time.sleep(2.5)  # a few more checks by the service: restored once, not again
        assert nusd() == expected
        assert not journal.restore_unfinished()
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
        client.close()
        ledger.close()
        redis.stop()
