"""Simulator features a policy engine router uses, against hand-computed cases: fallbacks,
router rejections, local prefill on a decode replica, the frontier prompt cache, the
completion callback, and the fleet-wide baselines.

Same test replica as test_simulator.py: a step takes max(10 ms, 1 ms per scheduled token),
10-token blocks and KV pages, KV 1000 bytes per token.
"""

from __future__ import annotations

import pytest

from pointsman.datasets.traces import TraceRequest
from pointsman.replay.baselines import CacheAware, LeastLoaded, OnPremWide
from pointsman.replay.hardware import FrontierSpec, LinkSpec, ReplicaSpec
from pointsman.replay.router import Assignment
from pointsman.replay.sim_fleet import OnPremTarget, SimFleet
from pointsman.replay.simulator import simulate

SPEC = ReplicaSpec(name="test", gpus=1, kv_capacity_blocks=100, kv_bytes_per_token=1000, prefill_s_per_token=0.001,
                   prefill_s_per_token_pair=0.0, decode_base_s=0.010, decode_per_seq_s=0.001,
                   decode_per_kv_token_s=0.0, block_tokens=10, kv_block_tokens=10, max_num_seqs=8,
                   max_model_len=10_000)
FR = FrontierSpec(name="fr", block_tokens=10, prompt_cache_min_tokens=20)


def fleet(*, spill: bool = False, max_waiting: int | None = None, **pools: int) -> SimFleet:
    pools.setdefault("aggregated_replicas", 1)
    return SimFleet(on_prem=(OnPremTarget(name="op", replica=SPEC, max_waiting=max_waiting,
                                          link=LinkSpec(bytes_per_s=1e6, latency_s=0.0), **pools),
                             OnPremTarget(name="op2", replica=SPEC, aggregated_replicas=1)),
                    frontier=(FR,), spill_target="fr" if spill else None)


def req(t: float, p: int, o: int, hashes: tuple[int, ...] | None = None) -> TraceRequest:
    return TraceRequest(arrival_s=t, prompt_tokens=p, output_tokens=o, block_hashes=hashes)


def test_fallbacks_are_tried_in_order_before_the_spill_target() -> None:
    trace = [req(0.0, 100, 2), req(0.01, 100, 2), req(0.02, 100, 2)]
    a = Assignment("op", fallbacks=(Assignment("op2"),))
    res = simulate(trace, fleet(max_waiting=1, spill=True), lambda r, v: a).requests
    # A prefills on op, B waits there (the limit), C is refused by op and runs on op2 at once.
    assert [r.target for r in res] == ["op", "op", "op2"]
    assert [r.spilled for r in res] == [False, False, True]
    assert res[2].routed_target == "op" and res[2].ttft_s == pytest.approx(0.100)


def test_router_rejection_has_no_latency_and_is_reported_at_arrival() -> None:
    seen = []
    res = simulate([req(0.0, 100, 2), req(0.5, 10, 2)], fleet(),
                   lambda r, v: Assignment.reject("no_eligible_target") if r.prompt_tokens == 100 else Assignment("op"),
                   on_complete=seen.append).requests
    assert res[0].rejected == "no_eligible_target" and res[0].routed_target is None and res[0].ttft_s is None
    # completion order: the rejection at its arrival (t=0), then B at 0.5 + 0.010 + 0.010
    assert [r.index for r in seen] == [0, 1]
    assert seen[1].finish_s == pytest.approx(0.520)
    assert seen[1] == res[1]


def test_completion_callback_runs_before_later_arrivals_are_routed() -> None:
    finished: list[float] = []
    at_routing: list[int] = []

    def router(r: TraceRequest, view) -> Assignment:
        at_routing.append(len(finished))
        return Assignment("op")

    # A: prefill 0.1 s, 1 decode step 0.010 -> done at 0.110; B arrives at 0.2.
    simulate([req(0.0, 100, 2), req(0.2, 10, 2)], fleet(), router, on_complete=lambda r: finished.append(r.finish_s))
    assert at_routing == [0, 1]
    assert finished[0] == pytest.approx(0.110)


def test_local_prefill_on_a_decode_replica_holding_the_prefix() -> None:
    f = fleet(aggregated_replicas=0, prefill_replicas=1, decode_replicas=1)
    hashes = tuple(range(10))
    trace = [req(0.0, 100, 3, hashes), req(1.0, 105, 3, hashes + (99,))]
    routes = iter([Assignment("op", "disaggregated"), Assignment("op", replica=0, replica_pool="decode")])
    a, b = simulate(trace, f, lambda r, v: next(routes)).requests
    assert a.mode == "disaggregated" and a.transfer_s == pytest.approx(0.1)  # 1e5 B at 1e6 B/s
    # B prefills on the decode replica: 100 tokens cached there, 5 new tokens in one 0.010 s
    # step (the memory floor), no transfer; then 2 decode steps of 0.010 s.
    assert (b.mode, b.replica, b.transfer_s) == ("aggregated", 0, 0.0)
    assert b.prefix_hit_tokens == 100 and b.ttft_s == pytest.approx(0.010)
    assert b.finish_s == pytest.approx(1.010 + 2 * 0.010)


def test_frontier_prompt_cache_bills_cached_prefix_within_ttl() -> None:
    h = (1, 2, 3)
    trace = [req(0.0, 30, 2, h), req(1.0, 30, 2, h), req(400.0, 30, 2, h), req(401.0, 15, 2, (1, 2))]
    a, b, c, d = simulate(trace, fleet(), lambda r, v: Assignment("fr")).requests
    full = (30 * 2.5 + 2 * 10.0) / 1e6
    assert a.prefix_hit_tokens == 0 and a.cost_usd == pytest.approx(full)
    # B within 300 s: 3 blocks (30 tokens) at the cached-input price 1.25
    assert b.prefix_hit_tokens == 30 and b.cost_usd == pytest.approx((30 * 1.25 + 2 * 10.0) / 1e6)
    assert c.prefix_hit_tokens == 0  # 399 s later: expired
    assert d.prefix_hit_tokens == 0  # 15 tokens: under the 20-token minimum


def test_on_prem_wide_baseline_uses_every_pool() -> None:
    f = fleet(aggregated_replicas=1, prefill_replicas=1, decode_replicas=1)
    trace = [req(0.0, 100, 2), req(0.0, 100, 2), req(0.0, 100, 2)]
    res = simulate(trace, f, OnPremWide(LeastLoaded(""))).requests
    # slots: op aggregated 0, op prefill 0 (disaggregated), op2 aggregated 0 — one request each
    assert [(r.target, r.mode) for r in res] == [("op", "aggregated"), ("op", "disaggregated"),
                                                  ("op2", "aggregated")]
    res = simulate(trace, f, OnPremWide(CacheAware(""), ("op2",))).requests
    assert {r.target for r in res} == {"op2"}


def test_frontier_context_window_is_enforced_on_routes_and_spills() -> None:
    fr = FrontierSpec(name="fr", max_model_len=500)
    f = SimFleet(on_prem=(OnPremTarget(name="op", replica=SPEC, aggregated_replicas=1),), frontier=(fr,),
                 spill_target="fr")
    trace = [req(0.0, 600, 2), req(0.0, 20_000, 2), req(1.0, 100, 2)]
    a, b, c = simulate(trace, f, lambda r, v: Assignment("fr" if r.prompt_tokens == 600 else "op")).requests
    assert a.rejected == "context_length" and a.target == "fr"  # routed there, too long for it
    assert b.rejected == "context_length" and b.target == "op"  # too long on-prem, and for the spill target
    assert c.rejected is None and not c.spilled
