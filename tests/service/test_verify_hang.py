"""A shared state Redis that hangs (SIGSTOPped) does not hold relayed verifies (``service/verify_relay.py``): every
verify reaching the replica that does not hold its decision is answered (410 ``decision_expired``: no holder answered,
so the gateway keeps its draft) within a client timeout, however many arrive. Real redis-server, two ``pointsman serve``
on their own data folders sharing the decision key; B routes, every verify goes to A.

The check that they answered is a client timeout (``ANSWERED_S``), not a latency claim. Before the relay went through
the shared state's hang gate (``pointsman.redis_client``) each relayed verify's ``PUBLISH`` waited the relay's socket
timeout (4 s), 40 at a time (the service's worker threads): the ``BURST`` verifies took at least 4 rounds, 16 s, and
this test failed (ReadTimeout); with the gate, calls after one timed out are refused at once."""

from __future__ import annotations

import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from tests.policy.test_ledger_restore import Redis, _redis_binary  # noqa: F401 - the fixture skips without redis-server

#: Seconds a call may take before the test calls it unanswered (no timing claim: see the module).
ANSWERED_S = 12.0
#: Verifies posted at once while Redis is stopped.
BURST = 160
REFUSAL = "I'm sorry, but I cannot help with that request."


def test_a_hung_shared_state_holds_no_relayed_verify(tmp_path, serve):
    policy = Path(__file__).resolve().parents[1] / "fixtures" / "cascade_policy.yaml"
    (tmp_path / "redis").mkdir()
    redis = Redis(tmp_path / "redis")
    try:
        common = {"watch_policy": "false", "policy_path": str(policy), "state_url": redis.url,
                  "decision_key": "one secret both replicas share", "scrape_interval_s": "0"}
        _, a = serve(tmp_path / "a", **common)
        _, b = serve(tmp_path / "b", **common)
        with httpx.Client(timeout=ANSWERED_S, limits=httpx.Limits(max_connections=BURST + 10)) as c:
            decided = [c.post(f"{b}/v1/route", json={"messages": [{"role": "user", "content": f"question {i}"}]})
                       .json()["decision_id"] for i in range(BURST)]

            def verify(decision_id: str) -> tuple[int, str]:
                r = c.post(f"{a}/v1/verify", json={"decision_id": decision_id, "usage": {"completion_tokens": 11},
                                                   "draft": {"text": REFUSAL, "finish_reason": "stop"}})
                return r.status_code, str(r.json().get("error", {}).get("code"))

            assert redis.proc is not None
            redis.proc.send_signal(signal.SIGSTOP)
            try:
                with ThreadPoolExecutor(BURST) as pool:
                    answers = list(pool.map(verify, decided))
            finally:
                redis.proc.send_signal(signal.SIGCONT)
            assert answers == [(410, "decision_expired")] * BURST
            deadline = time.monotonic() + 30  # Redis answers again: relayed to B, which holds it (no timing claim)
            while (relayed := verify(decided[0])) != (200, "None") and time.monotonic() < deadline:
                time.sleep(0.3)
            assert relayed == (200, "None")
    finally:
        redis.stop()
