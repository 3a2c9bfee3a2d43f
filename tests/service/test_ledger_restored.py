"""``pointsman serve`` books again what its Redis budget ledger lost: a real redis-server (append-only,
``everysec``) FLUSHALLed under a running service gets every scope's spend back from the replica's spend
journal, once, and ``pointsman_spend_restored_total`` counts the settlements (``FleetState.restore_spend``,
run by ``Runtime.replay_spend``)."""

from __future__ import annotations

import re
import time

import httpx

from pointsman.policy.budget.redis_ledger import RedisLedger
from tests.policy.test_ledger_restore import Redis, _redis_binary  # noqa: F401 - the fixture skips without redis-server

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
