"""Replica and P/D choices that looked right and were not, through ``POST /v1/route`` on the app with a fleet
file and a policy file; the state's monotonic clock is the test's (a reading goes stale when the test says so,
no sleeps).

- The queue scorer counted a pending request's whole prompt as prefill queued on its endpoint, even the part
  of it that endpoint held cached: after a 9,600-token document settled on ``e0`` and its follow-up (the
  document and a short question) was sent there, ``e0`` read the follow-up's whole prompt as queued (0.96 s
  at 10,000 tokens/s) where its prefill there is the 48 tokens it did not hold (0.005 s).
- The small-pool guard (``disaggregation.min_pool_gpus``) counted the GPUs of endpoints marked unhealthy: a
  16-GPU prefill/decode fleet with 6 GPUs down was disaggregated as if it had 16.
- Under ``signals.load.on_stale: saturated``, one stale endpoint read as 1,000,000 waiting requests, which
  the bounded-load cap averaged over the pool: the cap rose to 312,501 and all 9 requests of a hot prefix
  went to the endpoint caching it.
- ``endpoint.*`` on a ``mode: auto`` route read the aggregated endpoint even where the route ran disaggregated.
"""

from __future__ import annotations

from collections import Counter

import pytest
import yaml
from fastapi.testclient import TestClient

from pointsman.estimator.estimate import FixedDifficulty
from pointsman.policy.engine import RoutingEngine
from pointsman.policy.fleet import load_fleet
from pointsman.policy.rules.compiler import load_policy
from pointsman.policy.signals.fleet_state import FleetState
from pointsman.service.app import create_app
from pointsman.service.settings import Settings


def _pool(n: int, prefix: str, gpus: int = 1, prefill: float = 10_000.0, decode: float = 50_000.0) -> dict:
    return {"gpus_per_replica": gpus, "prefill_tokens_per_s": prefill, "decode_tokens_per_s": decode,
            "endpoints": [{"name": f"{prefix}{i}", "url": f"http://{prefix}{i}.internal:8000/v1"} for i in range(n)]}


def _fleet(pools: dict) -> dict:
    return {"apiVersion": "pointsman/v1", "kind": "Fleet",
            "defaults": {"output_tokens": 32, "scrape_metrics": False},
            "targets": {"onprem-8b": {"kind": "onprem", "model": "meta-llama/Llama-3.1-8B-Instruct",
                                      "context_window_tokens": 131072, "usd_per_gpu_hour": 2.5, "pools": pools}}}


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _client(tmp_path, fleet_spec: dict, policy: dict, clock: Clock) -> TestClient:
    (tmp_path / "fleet.yaml").write_text(yaml.safe_dump(fleet_spec))
    (tmp_path / "policy.yaml").write_text(yaml.safe_dump({"apiVersion": "pointsman/v1", "kind": "RoutingPolicy",
                                                          **policy}))
    fleet = load_fleet(tmp_path / "fleet.yaml")
    settings = Settings(data_dir=tmp_path / "data", fleet_path=tmp_path / "fleet.yaml",
                        policy_path=tmp_path / "policy.yaml", watch_policy=False, watch_fleet=False,
                        scrape_interval_s=0)
    engine = RoutingEngine(fleet, load_policy(tmp_path / "policy.yaml", fleet), FixedDifficulty(0.2),
                           state=FleetState(fleet, monotonic=clock))
    return TestClient(create_app(settings, engine=engine, owns_engine=True))


def _route(c: TestClient, messages: list[dict]) -> dict:
    r = c.post("/v1/route", json={"messages": messages, "max_tokens": 32, "routing": {"explain": True}})
    assert r.status_code == 200, r.text
    return r.json()


def _candidates(d: dict, role: str) -> dict[str, dict]:
    pick = next(p for p in d["trace"]["endpoints"] if p["role"] == role)
    return {x["endpoint"]: x for x in pick["candidates"]}


DOC = " ".join(f"clause {i} of the agreement binds party {i % 7}." for i in range(600))


def test_a_pending_request_queues_only_its_uncached_prefill(tmp_path):
    policy = {"rules": [{"name": "default", "route": {"target": "onprem-8b"}}]}
    with _client(tmp_path, _fleet({"aggregated": _pool(2, "e")}), policy, Clock()) as c:
        first = [{"role": "user", "content": DOC}]
        d = _route(c, first)
        e0 = d["endpoints"][0]["name"]
        usage = {"prompt_tokens": 6000, "completion_tokens": 20}
        r = c.post("/v1/outcomes", json={"decision_id": d["decision_id"], "served_target": "onprem-8b", "usage": usage})
        assert r.status_code == 200, r.text
        follow = [*first, {"role": "assistant", "content": "Noted."}, {"role": "user", "content": "Who binds?"}]
        d2 = _route(c, follow)
        assert d2["endpoints"][0]["name"] == e0
        held = _candidates(d2, "aggregated")[e0]["local_hit_tokens"]
        assert held > 0
        # a third request, elsewhere in the conversation space: e0's queue is the follow-up's uncached prefill
        d3 = _route(c, [{"role": "user", "content": "Summarise the weather report for Tuesday."}])
        queue = _candidates(d3, "aggregated")[e0]["queue"]
        whole = _candidates(d2, "aggregated")[e0]["prefill-work"]  # the follow-up's own prefill on e0: uncached
        assert queue == pytest.approx(whole, rel=1e-6), (queue, whole, held)


def _pd_fleet() -> dict:
    # 16 GPUs of prefill/decode (4 + 4 replicas of 2 GPUs) beside an aggregated pool
    return _fleet({"aggregated": _pool(2, "a", gpus=2), "prefill": _pool(4, "p", gpus=2),
                   "decode": _pool(4, "d", gpus=2)})


def test_the_small_pool_guard_counts_healthy_gpus_only(tmp_path):
    policy = {"rules": [{"name": "default", "route": {"target": "onprem-8b", "mode": "disaggregated"}}]}
    with _client(tmp_path, _pd_fleet(), policy, Clock()) as c:
        long = [{"role": "user", "content": DOC}]
        assert _route(c, long)["mode"] == "disaggregated"  # 16 GPUs >= min_pool_gpus 12
        for name in ("p0", "p1", "d0"):  # 6 GPUs down: 10 left
            r = c.post("/v1/telemetry", json={"endpoint": name, "healthy": False, "reason": "test: down"})
            assert r.status_code == 200, r.text
        d = _route(c, long)
        assert d["trace"]["mode"]["inputs"]["pd_pool_gpus"] == 10
        assert d["mode"] == "aggregated", d["trace"]["mode"]
        for name in ("p0", "p1", "d0"):
            c.post("/v1/telemetry", json={"endpoint": name, "healthy": True})
        assert _route(c, long)["mode"] == "disaggregated"


def test_one_stale_saturated_endpoint_leaves_the_bounded_load_cap_on(tmp_path):
    clock = Clock()
    policy = {"signals": {"load": {"max_age_s": 5, "on_stale": "saturated"}},
              "endpoint_selection": {"bounded_load_floor": 2},  # the default, a replica's batch, would not bind here
              "rules": [{"name": "default", "route": {"target": "onprem-8b"}}]}
    with _client(tmp_path, _fleet({"aggregated": _pool(4, "e")}), policy, clock) as c:
        idle = {"num_requests_running": 0, "num_requests_waiting": 0}
        assert c.post("/v1/telemetry", json={"endpoint": "e3", "load": idle}).status_code == 200
        clock.t += 60  # e3's reading is 60 s old: stale, read as saturated
        for name in ("e0", "e1", "e2"):
            assert c.post("/v1/telemetry", json={"endpoint": name, "load": idle}).status_code == 200
        hot = [{"role": "user", "content": DOC}]  # one hot prefix, cached where it first ran
        chosen = Counter()
        for _ in range(9):
            clock.t += 0.1  # each dispatch after the fresh readings: pending on top of them
            d = _route(c, hot)
            pick = next(p for p in d["trace"]["endpoints"] if p["role"] == "aggregated")
            chosen[d["endpoints"][0]["name"]] += 1
            # the cap over the three fresh endpoints: max(2, ceil(1.25 * (N + 1) / 3))
            assert pick["bounded_load_cap"] <= 5, pick["bounded_load_cap"]
        assert "e3" not in chosen
        assert max(chosen.values()) <= 4, chosen  # without the cap all 9 went to the endpoint caching the prefix


FRONTIER = {"kind": "frontier", "provider": "openai", "model": "gpt-4o-mini", "base_url": "https://api.openai.com/v1",
            "context_window_tokens": 128000,
            "prices": {"usd_per_1m_input_tokens": 0.15, "usd_per_1m_cached_input_tokens": 0.075,
                       "usd_per_1m_output_tokens": 0.6}}


@pytest.mark.parametrize("by_prediction", [False, True])
def test_endpoint_on_an_auto_route_reads_where_the_route_would_run(tmp_path, by_prediction):
    """``endpoint.*`` on a ``mode: auto`` route read the aggregated pool's endpoint even when the route runs
    disaggregated (by the rules of thumb, or by prediction): with the aggregated replica 50 deep and the P/D
    pools idle, ``endpoint.num_requests_waiting < 5`` failed and the request went to the frontier, though the
    route would have sent it to an idle decode endpoint. It now reads the endpoint of the mode the route runs in."""
    fleet = _pd_fleet()
    fleet["targets"]["frontier-small"] = FRONTIER
    policy = {"disaggregation": {"by_prediction": by_prediction},
              "rules": [{"name": "local", "when": "endpoint.num_requests_waiting < 5",
                         "route": {"target": "onprem-8b", "mode": "auto"}},
                        {"name": "default", "route": {"target": "frontier-small"}}]}
    with _client(tmp_path, fleet, policy, Clock()) as c:
        for name in ("a0", "a1"):
            r = c.post("/v1/telemetry", json={"endpoint": name, "load": {"num_requests_running": 8,
                                                                          "num_requests_waiting": 50}})
            assert r.status_code == 200, r.text
        for name in ("p0", "p1", "p2", "p3", "d0", "d1", "d2", "d3"):
            r = c.post("/v1/telemetry", json={"endpoint": name, "load": {"num_requests_running": 0,
                                                                          "num_requests_waiting": 0}})
            assert r.status_code == 200, r.text
        d = _route(c, [{"role": "user", "content": DOC}])
        assert (d["rule"], d["target"], d["mode"]) == ("local", "onprem-8b", "disaggregated"), d["trace"].get("mode")
