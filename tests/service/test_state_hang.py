"""A shared state Redis that hangs (SIGSTOPped: connections open, nothing answers) does not hold ``pointsman serve``'s
answers: decisions are made from the local state and outcomes are acknowledged (forwarded ones kept in the outbox)
while it is stopped, and after SIGCONT every outcome ends up in its owner's log exactly once and the forwarder's
outbox empties. Real redis-server, two ``pointsman serve`` on their own data folders; every outcome is posted to the
replica that did not decide it, so each is released there and forwarded: two Redis calls per outcome.

The check that they answered is a client timeout (``ANSWERED_S``), not a latency claim. Before the shared hang gate
(``pointsman.redis_client``) every call to the stopped Redis waited the socket timeout (2 s), so each outcome took
two of them, 40 at a time (the service's worker threads): the ``BURST`` outcomes took at least 4 rounds of 4 s, 16 s,
and this test failed (ReadTimeout); with the gate, calls after one timed out are refused at once."""

from __future__ import annotations

import signal
import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from tests.policy.test_ledger_restore import Redis, _redis_binary  # noqa: F401 - the fixture skips without redis-server

#: Seconds a call may take before the test calls it unanswered (no timing claim: see the module).
ANSWERED_S = 12.0
#: Outcomes posted at once while Redis is stopped.
BURST = 160


def rows(data_dir: Path, sql: str, *args: object) -> int:
    with sqlite3.connect(f"file:{data_dir / 'outcomes.db'}?mode=ro", uri=True) as c:
        return int(c.execute(sql, args).fetchone()[0])


def outcomes_of(data_dir: Path, decision_id: str) -> int:
    return rows(data_dir, "SELECT COUNT(*) FROM outcomes WHERE decision_id = ?", decision_id)


def test_a_hung_shared_state_holds_no_answer_and_loses_no_outcome(tmp_path, serve):
    (tmp_path / "redis").mkdir()
    redis = Redis(tmp_path / "redis")
    try:
        _, a = serve(tmp_path / "a", state_url=redis.url, watch_policy="false", scrape_interval_s="0")
        _, b = serve(tmp_path / "b", state_url=redis.url, watch_policy="false", scrape_interval_s="0")
        with httpx.Client(timeout=ANSWERED_S, limits=httpx.Limits(max_connections=BURST + 10)) as c:
            def route(i: int) -> str:
                d = c.post(f"{a}/v1/route", json={"messages": [{"role": "user", "content": f"hello {i}"}]})
                assert d.status_code == 200, d.text
                return str(d.json()["decision_id"])

            def outcome(decision_id: str) -> str:
                o = c.post(f"{b}/v1/outcomes", json={"decision_id": decision_id,
                                                      "usage": {"prompt_tokens": 100, "completion_tokens": 10}})
                assert o.status_code == 202, o.text
                return str(o.json()["acks"][0]["status"])

            decided = [route(i) for i in range(BURST)]
            assert redis.proc is not None
            redis.proc.send_signal(signal.SIGSTOP)
            try:
                decided += [route(BURST + i) for i in range(3)]  # decided while Redis is stopped
                with ThreadPoolExecutor(BURST) as pool:  # released and forwarded, or kept in the outbox
                    statuses = list(pool.map(outcome, decided))
            finally:
                redis.proc.send_signal(signal.SIGCONT)
        assert statuses == ["forwarded"] * len(decided)
        deadline = time.monotonic() + 60  # no timing claim: the outbox sends again within seconds
        while time.monotonic() < deadline and (rows(tmp_path / "a", "SELECT COUNT(*) FROM outcomes") < len(decided)
                                               or rows(tmp_path / "b", "SELECT COUNT(*) FROM forwards")):
            time.sleep(0.3)
        assert [outcomes_of(tmp_path / "a", d) for d in decided] == [1] * len(decided)  # the owner's log, once
        assert rows(tmp_path / "b", "SELECT COUNT(*) FROM outcomes") == 0
        assert rows(tmp_path / "b", "SELECT COUNT(*) FROM forwards") == 0  # every one confirmed by its owner
    finally:
        redis.stop()
