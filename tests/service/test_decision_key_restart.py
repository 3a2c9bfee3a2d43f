"""The decision signing key survives Redis losing its data (restarted without persistence): a replica
that restarts afterwards publishes the key it cached (``<data_dir>/decision.key``) rather than a new
random one, so ids it signs still verify on the replicas that kept running. Real ``pointsman serve``
processes with their own data folders and a real Redis. Before, the restarted replica signed with a
new key: an outcome for its decision posted to the other replica was not recognised as that replica's
(stored there as an orphan, never forwarded to the log that holds the decision)."""

from __future__ import annotations

import uuid

import httpx
import pytest
import redis

from tests.service.conftest import stop

pytestmark = pytest.mark.slow


def test_a_replica_restarted_after_redis_lost_its_data_keeps_the_shared_key(tmp_path, serve, redis_url):
    prefix = f"{{key-{uuid.uuid4().hex[:8]}}}:"
    settings = {"state_url": f"{redis_url}?prefix={prefix.replace('{', '%7B').replace('}', '%7D')}",
                "watch_policy": "false", "scrape_interval_s": "0"}
    _, a = serve(tmp_path / "a", **settings)
    b_proc, _ = serve(tmp_path / "b", **settings)
    key = (tmp_path / "a" / "decision.key").read_text()
    assert (tmp_path / "b" / "decision.key").read_text() == key
    client = redis.Redis.from_url(redis_url)
    client.delete(*client.keys(f"{prefix}*"))  # Redis restarted without its data
    stop(b_proc)
    _, b = serve(tmp_path / "b", **settings)
    assert (tmp_path / "b" / "decision.key").read_text() == key
    did = httpx.post(f"{b}/v1/route", json={"messages": [{"role": "user", "content": "hi"}]}).json()["decision_id"]
    r = httpx.post(f"{a}/v1/outcomes", json={"decision_id": did, "status": "ok",
                                              "usage": {"prompt_tokens": 5, "completion_tokens": 7}})
    assert (r.status_code, r.json()["acks"][0]["status"]) == (202, "forwarded")  # to b's log, which holds it
