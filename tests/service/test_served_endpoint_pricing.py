"""An outcome whose ``served_endpoint`` names an endpoint of the decision's target in another pool (the gateway
retried there) is booked on the pool it ran on, as docs/service.md says ("priced by GPU-seconds on the pools the
request ran on"), through a real ``pointsman serve``. The fleet's 70B aggregated pool is TP4 (4 GPUs a replica)
beside its TP2 decode pool: a decision placed on an aggregated replica and answered by ``llama-70b-decode-0`` was
booked at the aggregated pool's 4 GPUs, twice what the request cost where it ran."""

from __future__ import annotations

import httpx
import pytest

from pointsman.policy.fleet import DEFAULT_FLEET_PATH

pytestmark = pytest.mark.slow

AGGREGATED = ("      aggregated:\n        gpus_per_replica: 2\n        # TensorRT-LLM perf overview, \"Llama 3.3 70B\", "
              "H100 TP2 FP8:")
USAGE = {"prompt_tokens": 1000, "completion_tokens": 100}  # within the request's max_tokens (no over-cap note)


def _usd_70b(gpus: int) -> float:
    """USD of ``USAGE`` on a 70B pool of ``gpus`` per replica (12,192 prefill and 6,651 decode tokens/s a replica,
    $2.50 a GPU-hour, at the assumed utilization 1.0)."""
    return (1000 / 12192 + 100 / 6651) * gpus * 2.50 / 3600


def test_an_outcome_served_on_another_pool_is_booked_on_that_pool(tmp_path, serve):
    text = DEFAULT_FLEET_PATH.read_text()
    assert text.count(AGGREGATED) == 1
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(text.replace(AGGREGATED, AGGREGATED.replace("gpus_per_replica: 2", "gpus_per_replica: 4")))
    _, base = serve(tmp_path / "data", fleet_path=str(fleet), watch_policy="false", watch_fleet="false")
    gpus = {"llama-70b-0": 4, "llama-70b-1": 4, "llama-70b-decode-0": 2, "llama-70b-decode-1": 2}
    with httpx.Client(base_url=base, timeout=10) as c:
        for other_pool in (True, False, True, False):
            r = c.post("/v1/route", json={"max_tokens": 100, "messages": [
                {"role": "user", "content": "hi, what's the capital of France?"}]})
            assert r.status_code == 200, r.text
            d = r.json()
            placed = d["endpoints"][0]["name"]
            assert (d["target"], d["mode"]) == ("onprem-70b", "aggregated") and placed in gpus, d
            # the gateway retried on a replica of the other pool, or of the same pool
            same_pool = [e for e in gpus if e != placed and gpus[e] == gpus[placed]]
            served = next(e for e in gpus if gpus[e] != gpus[placed]) if other_pool else same_pool[0]
            ack = c.post("/v1/outcomes", json={"decision_id": d["decision_id"], "usage": USAGE,
                                               "served_endpoint": served}).json()["acks"][0]
            assert ack["status"] == "stored" and ack["message"] is None, ack
            # booked on the pool that answered (TP2 decode or TP4 aggregated), not the one it was placed on
            assert ack["settlement"]["actual_cost_usd"] == pytest.approx(_usd_70b(gpus[served]), rel=1e-9), \
                (placed, served)
