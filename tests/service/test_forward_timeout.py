"""An outcome whose forward to the logging replica's inbox times out (Redis hung: the script may still be applied
when Redis answers again) is acknowledged ``forwarded`` and kept in the forwarder's outbox, never stored where it
arrived; the owner stores it once (whether the hung send is applied, or the outbox sends it again, or both).
Real redis-server SIGSTOPped across the forward, two ``pointsman serve`` on their own data folders. Before the
outbox the forwarder stored it ("stored here, not forwarded") and the owner too once Redis applied the send: one
outcome in two logs (this test failed; under load, 30 pairs/s with Redis stopped 10 s, 4 of 4 forward timeouts)."""

from __future__ import annotations

import signal
import time

import httpx

from tests.policy.test_ledger_restore import Redis, _redis_binary  # noqa: F401 - the fixture skips without redis-server
from tests.service.conftest import logged


def test_a_timed_out_forward_is_logged_once(tmp_path, serve):
    (tmp_path / "redis").mkdir()
    redis = Redis(tmp_path / "redis")
    try:
        _, a = serve(tmp_path / "a", state_url=redis.url, watch_policy="false")
        _, b = serve(tmp_path / "b", state_url=redis.url, watch_policy="false")
        d = httpx.post(f"{a}/v1/route", json={"messages": [{"role": "user", "content": "hello"}]}, timeout=30)
        assert d.status_code == 200, d.text
        decision_id = d.json()["decision_id"]
        assert redis.proc is not None
        redis.proc.send_signal(signal.SIGSTOP)
        try:
            o = httpx.post(f"{b}/v1/outcomes", json={"decision_id": decision_id,
                                                      "usage": {"prompt_tokens": 100, "completion_tokens": 10}}, timeout=60)
        finally:
            redis.proc.send_signal(signal.SIGCONT)
        ack = o.json()["acks"][0]
        assert o.status_code == 202 and ack["status"] == "forwarded" and "kept here" in ack["message"], o.text  # timed out
        deadline = time.monotonic() + 15  # no timing claim: the owner reads its inbox within a second or two
        while not logged(tmp_path / "a", decision_id) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert logged(tmp_path / "a", decision_id) and not logged(tmp_path / "b", decision_id)
    finally:
        redis.stop()
