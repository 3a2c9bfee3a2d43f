"""Every acknowledged outcome survives a SIGKILL: `pointsman serve` runs as a real process, a
client routes requests and posts their outcomes (single and batched) from two threads, the
server is killed with SIGKILL mid-stream, restarted on the same data folder, and every outcome
it acknowledged is in the outcome log (and a re-post is a duplicate, not a new outcome)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid

import httpx
import pytest

from pointsman.outcome_log.store import OutcomeLog

pytestmark = pytest.mark.slow


def client_loop(base: str, worker: int, acked: dict[str, dict], stop_event: threading.Event) -> None:
    """Route a request and post its outcome, over and over; 8 rounds one by one, then 8 rounds in
    batches of 4, and so on.
    Records each acknowledged outcome (by outcome id) until the connection dies."""
    with httpx.Client(base_url=base, timeout=10) as c:
        pending: list[dict] = []
        n = 0
        while not stop_event.is_set():
            n += 1
            try:
                d = c.post("/v1/route", json={"messages": [{"role": "user", "content": f"question {worker}-{n}"}]})
                assert d.status_code == 200, d.text
                pending.append({"decision_id": d.json()["decision_id"], "outcome_id": f"w{worker}-o{n}",
                                "usage": {"prompt_tokens": 10 + n, "completion_tokens": n}, "ttft_ms": float(n)})
                if (n // 8) % 2 == 1 and len(pending) < 4:  # rounds 8-15, 24-31, ...: batches of 4
                    continue
                body: dict | list = pending[0] if len(pending) == 1 else list(pending)
                r = c.post("/v1/outcomes", json=body)
            except httpx.TransportError:
                return  # the server died; what was not answered was not acknowledged
            assert r.status_code == 200, r.text
            for ack in r.json()["acks"]:
                assert ack["status"] == "stored", ack
                acked[ack["outcome_id"]] = next(o for o in pending if o["outcome_id"] == ack["outcome_id"])
            pending.clear()


def test_every_acknowledged_outcome_survives_sigkill(tmp_path, serve):
    proc, base = serve(tmp_path, watch_policy="false")
    acked: dict[str, dict] = {}
    stop_event = threading.Event()
    threads = [threading.Thread(target=client_loop, args=(base, w, acked, stop_event)) for w in range(2)]
    try:
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        while len(acked) < 80:
            assert time.monotonic() < deadline and all(t.is_alive() for t in threads), "clients stalled"
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)  # mid-stream: both clients are posting
        proc.wait(timeout=10)
        for t in threads:
            t.join(timeout=15)
    finally:
        stop_event.set()
    assert proc.returncode == -signal.SIGKILL
    acknowledged = dict(acked)
    assert len(acknowledged) >= 80

    serve(tmp_path, port=int(base.rsplit(":", 1)[1]), watch_policy="false")  # restart on the same data folder
    with OutcomeLog(tmp_path / "outcomes.db") as log:
        missing = [oid for oid in acknowledged if log.outcome(oid) is None]
        assert not missing, f"{len(missing)} acknowledged outcome(s) lost: {missing[:5]}"
        for oid, sent in acknowledged.items():
            assert log.outcome(oid).ttft_ms == sent["ttft_ms"]
    # re-posting what was acknowledged is a duplicate: the restarted service sees it stored
    some = list(acknowledged.values())[:10]
    r = httpx.post(f"{base}/v1/outcomes", json=some, timeout=10)
    assert r.status_code == 200 and r.json()["counts"] == {"duplicate": 10}


def test_two_workers_store_outcomes_whose_decision_another_worker_made(tmp_path, serve, redis_url):
    """With 2 worker processes (sharing live state through Redis) a decision can still be in one
    worker's memory queue when its outcome reaches the other: the outcome is retried after a
    flush interval and stored, and it releases the load the decision reserved, whichever worker
    made it (issue 11's experiment: 60 route + outcome pairs on fresh connections)."""
    prefix = f"%7Bdur-{uuid.uuid4().hex[:8]}%7D:"
    _, base = serve(tmp_path, workers="2", watch_policy="false", state_url=f"{redis_url}?prefix={prefix}")
    statuses, released = [], []
    for i in range(60):
        with httpx.Client(base_url=base, timeout=10) as c:  # a new connection: either worker
            d = c.post("/v1/route", json={"messages": [{"role": "user", "content": f"q{i}"}]}).json()
        with httpx.Client(base_url=base, timeout=10) as c:
            r = c.post("/v1/outcomes", json={"decision_id": d["decision_id"], "usage": {"prompt_tokens": 12, "completion_tokens": 3}})
        ack = r.json()["acks"][0]
        statuses.append(ack["status"])
        released.append(ack["settlement"]["released_load"])
    assert statuses == ["stored"] * 60
    assert all(n >= 1 for n in released), released


def test_two_workers_without_shared_state_refuse_to_start(tmp_path):
    env = {**os.environ, "POINTSMAN_DATA_DIR": str(tmp_path), "POINTSMAN_STATE_URL": ""}
    done = subprocess.run([sys.executable, "-m", "pointsman", "serve", "--workers", "2", "--port", "0"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "needs shared state: set POINTSMAN_STATE_URL=redis://" in done.stderr
