"""Baseline routers behave as named."""

from __future__ import annotations

from pointsman.datasets.traces import TraceRequest
from pointsman.replay.baselines import BASELINES, CacheAware, LeastLoaded, RandomPick, RoundRobin
from pointsman.replay.hardware import FrontierSpec, ReplicaSpec
from pointsman.replay.sim_fleet import OnPremTarget, SimFleet
from pointsman.replay.simulator import simulate

SPEC = ReplicaSpec(
    name="test", gpus=1, kv_capacity_blocks=100, kv_bytes_per_token=1000, prefill_s_per_token=0.001,
    prefill_s_per_token_pair=0.0, decode_base_s=0.010, decode_per_seq_s=0.001, decode_per_kv_token_s=0.0,
    block_tokens=10, kv_block_tokens=10,
)  # fmt: skip
FLEET = SimFleet(
    on_prem=(OnPremTarget(name="op", replica=SPEC, aggregated_replicas=3, prefill_replicas=2, decode_replicas=1),),
    frontier=(FrontierSpec(name="fr"),),
)


def req(t: float, p: int = 20, o: int = 2, hashes: tuple[int, ...] | None = None) -> TraceRequest:
    return TraceRequest(t, p, o, hashes)


def test_round_robin_cycles() -> None:
    res = simulate([req(i * 10.0) for i in range(7)], FLEET, RoundRobin("op")).requests
    assert [r.replica for r in res] == [0, 1, 2, 0, 1, 2, 0]
    res = simulate([req(i * 10.0) for i in range(3)], FLEET, RoundRobin("op", "disaggregated")).requests
    assert [(r.mode, r.replica, r.decode_replica) for r in res] == [("disaggregated", i, 0) for i in (0, 1, 0)]


def test_random_is_seeded() -> None:
    trace = [req(i * 10.0) for i in range(30)]
    picks = [r.replica for r in simulate(trace, FLEET, RandomPick("op", seed=5)).requests]
    assert picks == [r.replica for r in simulate(trace, FLEET, RandomPick("op", seed=5)).requests]
    assert picks != [r.replica for r in simulate(trace, FLEET, RandomPick("op", seed=6)).requests]
    assert set(picks) == {0, 1, 2}


def test_least_loaded_spreads_a_burst() -> None:
    res = simulate([req(0.0) for _ in range(4)], FLEET, LeastLoaded("op")).requests
    assert [r.replica for r in res] == [0, 1, 2, 0]


def test_cache_aware_follows_the_prefix() -> None:
    trace = [
        req(0.0, 50, 2, (1, 2, 3, 4, 5)),  # nothing cached anywhere: least loaded -> 0
        req(0.0, 20, 2, (7, 8)),  # replica 0 busy -> 1
        req(5.0, 30, 2, (7, 8, 9)),  # prefix on 1
        req(5.0, 30, 2, (1, 2, 6)),  # prefix on 0
        req(5.0, 20, 2, (11, 12)),  # no prefix: least loaded, 0 and 1 busy -> 2
    ]
    res = simulate(trace, FLEET, CacheAware("op")).requests
    assert [r.replica for r in res] == [0, 1, 1, 0, 2]
    assert [r.prefix_hit_tokens for r in res] == [0, 0, 20, 20, 0]


def test_all_frontier_and_registry() -> None:
    res = simulate([req(0.0), req(1.0)], FLEET, RoundRobin("fr")).requests
    assert all(r.frontier and r.target == "fr" for r in res)
    assert set(BASELINES) == {"round-robin", "random", "least-loaded", "cache-aware"}
