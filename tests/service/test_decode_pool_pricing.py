"""An aggregated request that prefilled on a decode endpoint (the default policy's
``short_prompts_on_decode``) is settled on the pool it ran on, the decode pool, as its estimate was:
``pointsman serve --workers 2`` with real Redis, a fleet whose 70B decode pool runs on other hardware
than its aggregated pool, each call on a fresh connection (either worker settles). Before, the
settlement priced the usage on the aggregated pool: the estimate's own usage was booked at 1.49x the
estimate (and a slower decode pool would have been booked below its cost)."""

from __future__ import annotations

import uuid

import httpx
import pytest

from pointsman.policy.fleet import DEFAULT_FLEET_PATH

pytestmark = pytest.mark.slow

DECODE_POOL = "      decode:\n        gpus_per_replica: 2\n        prefill_tokens_per_s: 12192\n        decode_tokens_per_s: 6651"


def _post(base: str, path: str, body: dict) -> dict:
    with httpx.Client(base_url=base, timeout=10) as c:  # a new connection: either worker
        r = c.post(path, json=body)
    assert r.status_code in (200, 202), r.text
    return r.json()


def test_a_request_prefilled_on_a_decode_endpoint_is_settled_on_the_decode_pool(tmp_path, serve, redis_url):
    text = DEFAULT_FLEET_PATH.read_text()
    assert text.count(DECODE_POOL) == 1
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(text.replace(DECODE_POOL, DECODE_POOL.replace("gpus_per_replica: 2", "gpus_per_replica: 4")
                                  .replace("12192", "30000").replace("6651", "20000")))
    prefix = f"%7Bpools-{uuid.uuid4().hex[:8]}%7D:"
    _, base = serve(tmp_path / "data", workers="2", fleet_path=str(fleet), watch_policy="false",
                    state_url=f"{redis_url}?prefix={prefix}")
    on_decode = 0
    for i in range(8):
        d = _post(base, "/v1/route", {"max_tokens": 256, "messages": [
            {"role": "user", "content": f"Summarise the plot of Hamlet in two sentences, take {i}."}]})
        on_decode += d["mode"] == "aggregated" and d["endpoints"][0]["name"].startswith("llama-70b-decode")
        ack = _post(base, "/v1/outcomes", {"decision_id": d["decision_id"], "status": "ok",
                                           "usage": {"prompt_tokens": d["prompt_tokens"], "completion_tokens": 256}})
        # the estimate's own usage at the estimate's utilizations: the same USD
        assert ack["acks"][0]["settlement"]["actual_cost_usd"] == pytest.approx(d["estimated_cost_usd"], rel=1e-9)
    assert on_decode > 0
