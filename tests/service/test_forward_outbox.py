"""What else can lose a forwarded outcome, and does not: a Redis restarted on an append-only file cut before the
forward it acknowledged (a new ``run_id``: the forwarder sends again what it sent to the old one), and a forwarder
SIGKILLed after acknowledging an outcome it could not send (Redis down: kept in its outbox, sent when it starts
again). Real redis-server (``appendfsync everysec``, cut as a dying machine leaves it), two ``pointsman serve`` on
their own data folders; the owner is down throughout, so nothing but the outbox can bring them to its log. Both
outcomes end in the owner's log, neither in the forwarder's, and the forwarder's outbox empties (the owner's
acknowledgements arrived). Before the outbox the first was in no log, the second in the forwarder's only."""

from __future__ import annotations

import signal
import sqlite3
import time

import httpx

from tests.policy.test_ledger_restore import Redis, _redis_binary  # noqa: F401 - the fixture skips without redis-server


def count(data_dir, sql: str, *args: str) -> int:
    with sqlite3.connect(f"file:{data_dir / 'outcomes.db'}?mode=ro", uri=True) as c:
        return int(c.execute(sql, args).fetchone()[0])


def logged(data_dir, decision_id: str) -> bool:
    return count(data_dir, "SELECT COUNT(*) FROM outcomes WHERE decision_id = ?", decision_id) > 0


def outcome(base: str, decision_id: str) -> dict:
    o = httpx.post(f"{base}/v1/outcomes", json={"decision_id": decision_id,
                                                "usage": {"prompt_tokens": 100, "completion_tokens": 10}}, timeout=60)
    assert o.status_code == 202, o.text
    return o.json()["acks"][0]


def outbox_metrics(url: str) -> tuple[float, float]:
    """(pointsman_forwarded_outcomes_pending, pointsman_forwarded_outcomes_oldest_age_seconds) scraped from ``url``."""
    text = httpx.get(f"{url}/metrics", timeout=30).text
    values = {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
              if line.startswith("pointsman_forwarded_outcomes_")}
    return values["pointsman_forwarded_outcomes_pending"], values["pointsman_forwarded_outcomes_oldest_age_seconds"]


def test_forwards_survive_a_cut_append_only_file_and_a_killed_forwarder(tmp_path, serve):
    (tmp_path / "redis").mkdir()
    redis = Redis(tmp_path / "redis")
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    try:
        owner, a = serve(a_dir, state_url=redis.url, watch_policy="false")
        forwarder, b = serve(b_dir, state_url=redis.url, watch_policy="false")
        ids = []
        for _ in range(2):
            d = httpx.post(f"{a}/v1/route", json={"messages": [{"role": "user", "content": "hello"}]}, timeout=30)
            assert d.status_code == 200, d.text
            ids.append(d.json()["decision_id"])
        owner.send_signal(signal.SIGKILL)
        owner.wait(10)
        mark = redis.mark()
        ack = outcome(b, ids[0])
        assert ack["status"] == "forwarded" and "kept here" not in ack["message"]  # Redis took it...
        redis.crash(mark)  # ...and loses it: the machine died before the file's fsync
        ack = outcome(b, ids[1])
        assert ack["status"] == "forwarded" and "kept here" in ack["message"]  # Redis is down: in the outbox only
        assert outbox_metrics(b)[0] == 2 and outbox_metrics(b)[1] >= 0  # what the alert reads
        forwarder.send_signal(signal.SIGKILL)
        forwarder.wait(10)
        redis.start()  # on the cut file: a new run_id, the same epoch
        _, b = serve(b_dir, state_url=redis.url, watch_policy="false")
        serve(a_dir, state_url=redis.url, watch_policy="false")
        deadline = time.monotonic() + 30  # no timing claim: resent within a second or two of Redis answering
        while time.monotonic() < deadline and not (all(logged(a_dir, i) for i in ids)
                                                   and count(b_dir, "SELECT COUNT(*) FROM forwards") == 0):
            time.sleep(0.2)
        assert [logged(a_dir, i) for i in ids] == [True, True]
        assert [logged(b_dir, i) for i in ids] == [False, False]
        assert count(b_dir, "SELECT COUNT(*) FROM forwards") == 0
        assert outbox_metrics(b) == (0, 0.0)
    finally:
        redis.stop()
