"""A Redis budget ledger that hangs (the process stopped, a partition that drops packets: connections open,
no answer) costs ``pointsman serve`` one socket timeout, not one per call: the decisions meanwhile are
refused at once (503, budget ledger unavailable) instead of each holding the event loop for the timeout,
and decisions go through again once Redis answers. Real redis-server, SIGSTOPped."""

from __future__ import annotations

import signal
import time

import httpx

from tests.policy.test_ledger_restore import Redis, _redis_binary  # noqa: F401 - the fixture skips without redis-server


def route(c: httpx.Client) -> httpx.Response:
    return c.post("/v1/route", json={"messages": [{"role": "user", "content": "hello"}], "routing": {"tenant": "acme"}})


def test_a_hung_ledger_is_waited_for_once_then_refused_at_once(tmp_path, serve):
    (tmp_path / "redis").mkdir()
    redis = Redis(tmp_path / "redis")
    budgets = tmp_path / "budgets.yaml"
    budgets.write_text("kind: Budgets\nbudgets:\n  - {scope: 'tenant:acme', window: day, limit_usd: 1000}\n")
    try:
        _, base = serve(tmp_path / "data", budgets_path=str(budgets), budget_ledger=redis.url, watch_policy="false")
        with httpx.Client(base_url=base, timeout=60) as c:
            assert route(c).status_code == 200
            assert redis.proc is not None
            redis.proc.send_signal(signal.SIGSTOP)
            try:
                answers = [route(c) for _ in range(4)]
            finally:
                redis.proc.send_signal(signal.SIGCONT)
            assert [a.status_code for a in answers] == [503] * 4, [a.text for a in answers]
            waited = [a.json()["error"]["message"] for a in answers if "Timeout" in a.json()["error"]["message"]]
            assert len(waited) <= 1, waited  # the first waits for the socket timeout; the others are refused at once
            deadline = time.monotonic() + 30  # no timing claim: Redis answers again, and so do decisions
            while route(c).status_code != 200 and time.monotonic() < deadline:
                time.sleep(0.2)
            assert route(c).status_code == 200
    finally:
        redis.stop()
