"""An outcome acknowledged ``forwarded`` (202) by one replica for a decision another replica logs survives a
Redis that comes back empty (``FLUSHALL``, a new volume) before the owner read its inbox: the forwarder keeps it
in its log's outbox until the owner confirms it stored it, and sends it again to the new epoch
(``pointsman.redis_epoch``, as the spend journals do for budgets). Real redis-server, two ``pointsman serve`` on
their own data folders (two pods), the logging one SIGKILLed before the outcome arrives and started again on its
folder after the flush. Before the outbox the outcome lived only in the inbox stream (this test failed: in no
log); under load 2 of 900 outcomes acknowledged ``forwarded`` at 30 pairs/s were in no log after a FLUSHALL."""

from __future__ import annotations

import signal
import time

import httpx

from tests.policy.test_ledger_restore import Redis, _redis_binary  # noqa: F401 - the fixture skips without redis-server
from tests.service.conftest import logged


def test_a_forwarded_outcome_survives_a_flushed_redis(tmp_path, serve):
    (tmp_path / "redis").mkdir()
    redis = Redis(tmp_path / "redis")
    try:
        owner, a = serve(tmp_path / "a", state_url=redis.url, watch_policy="false")
        _, b = serve(tmp_path / "b", state_url=redis.url, watch_policy="false")
        d = httpx.post(f"{a}/v1/route", json={"messages": [{"role": "user", "content": "hello"}]}, timeout=30)
        assert d.status_code == 200, d.text
        decision_id = d.json()["decision_id"]
        owner.send_signal(signal.SIGKILL)
        owner.wait(10)
        o = httpx.post(f"{b}/v1/outcomes", json={"decision_id": decision_id,
                                                  "usage": {"prompt_tokens": 100, "completion_tokens": 10}}, timeout=30)
        assert o.status_code == 202 and o.json()["acks"][0]["status"] == "forwarded", o.text
        redis.flushall()
        serve(tmp_path / "a", state_url=redis.url, watch_policy="false")  # the owner starts again on its data folder
        deadline = time.monotonic() + 30  # no timing claim: the owner reads its inbox within a second or two
        while not logged(tmp_path / "a", decision_id) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert logged(tmp_path / "a", decision_id) and not logged(tmp_path / "b", decision_id)
    finally:
        redis.stop()
