"""The fleet simulator against hand-computed cases.

The test replica has round numbers: a step takes max(10 ms, 1 ms per scheduled token)
(decode_base_s 10 ms; prefill and decode tokens 1 ms each), no attention or KV-read term
unless a test sets one, no overhead; 10-token blocks and 10-token KV pages; KV 1000 bytes
per token; a token budget of 8192 per step unless a test sets one.
"""

from __future__ import annotations

import dataclasses

import pytest

from pointsman.datasets.traces import TraceRequest
from pointsman.replay.baselines import RandomPick, RoundRobin
from pointsman.replay.hardware import FrontierSpec, LinkSpec, ReplicaSpec, SharedKVTierSpec
from pointsman.replay.router import Assignment
from pointsman.replay.sim_fleet import OnPremTarget, SimFleet
from pointsman.replay.simulator import simulate

SPEC = ReplicaSpec(
    name="test",
    gpus=1,
    kv_capacity_blocks=100,
    kv_bytes_per_token=1000,
    prefill_s_per_token=0.001,
    prefill_s_per_token_pair=0.0,
    decode_base_s=0.010,
    decode_per_seq_s=0.001,
    decode_per_kv_token_s=0.0,
    block_tokens=10,
    kv_block_tokens=10,
    max_num_seqs=8,
    max_model_len=10_000,
)


def fleet(spec: ReplicaSpec = SPEC, *, spill: bool = False, **target: object) -> SimFleet:
    target.setdefault("aggregated_replicas", 1)
    return SimFleet(
        on_prem=(OnPremTarget(name="op", replica=spec, **target),),
        frontier=(FrontierSpec(name="fr"),),
        spill_target="fr" if spill else None,
    )


def req(t: float, p: int, o: int, hashes: tuple[int, ...] | None = None) -> TraceRequest:
    return TraceRequest(arrival_s=t, prompt_tokens=p, output_tokens=o, block_hashes=hashes)


def to(target: str = "op", mode: str = "aggregated", replica: int | None = None, decode: int | None = None):
    """A router that sends everything to one place."""
    return lambda request, view: Assignment(target, mode, replica, decode)


def test_one_request_alone() -> None:
    # one step prefills 100 tokens: max(0.010, 0.100) = 0.100 s = TTFT; then 4 decode steps of
    # max(0.010, 0.001) = 0.010 s
    (r,) = simulate([req(0.0, 100, 5)], fleet(), to()).requests
    assert r.ttft_s == pytest.approx(0.100)
    assert r.e2e_s == pytest.approx(0.100 + 4 * 0.010)
    assert r.tpot_s == pytest.approx(0.010)
    assert r.queue_s == 0.0 and r.prefix_hit_tokens == 0 and not r.frontier and r.replica == 0


def test_decode_step_grows_with_kv_and_prefill_has_attention_term() -> None:
    spec = dataclasses.replace(SPEC, decode_per_kv_token_s=1e-5, prefill_s_per_token_pair=1e-6)
    (r,) = simulate([req(0.0, 100, 5)], fleet(spec), to()).requests
    # prefill: 100 * 0.001 + (100*101/2 = 5050 pairs) * 1e-6 = 0.10505
    assert r.ttft_s == pytest.approx(0.10505)
    # steps read contexts of 101, 102, 103, 104 tokens: 4*0.010 + 1e-5*(101+102+103+104)
    assert r.e2e_s - r.ttft_s == pytest.approx(4 * 0.010 + 1e-5 * 410)


def test_step_time_is_the_roofline_of_its_tokens() -> None:
    spec = dataclasses.replace(SPEC, step_overhead_s=0.002, prefill_overhead_s=0.003)
    assert spec.step_s(5, 0) == pytest.approx(0.002 + 0.010)  # memory floor: reading the weights
    assert spec.step_s(30, 0) == pytest.approx(0.002 + 0.030)  # compute-bound
    assert spec.step_s(2, 0, 40, 100.0) == pytest.approx(0.002 + 0.042 + 0.003)
    assert spec.prefill_s(40, 10) == spec.step_s(0, 0, 40, 40 * 10 + 40 * 41 / 2)


def test_queueing_behind_another_request() -> None:
    # A prefills 0 -> 0.100. B arrives at 0.050 and waits for the step boundary; at 0.100 one
    # step runs A's first decode token and B's 50 prompt tokens: max(0.010, 0.051) -> 0.151
    # (B's first token). Then both decode one token: 0.010 -> 0.161, finishing both.
    a, b = simulate([req(0.0, 100, 3), req(0.050, 50, 2)], fleet(), to()).requests
    assert b.queue_s == pytest.approx(0.050)
    assert b.ttft_s == pytest.approx(0.151 - 0.050)
    assert b.e2e_s == pytest.approx(0.161 - 0.050)
    assert a.ttft_s == pytest.approx(0.100)
    assert a.finish_s == pytest.approx(0.161)
    assert a.tpot_s == pytest.approx((0.161 - 0.100) / 2)


def test_arrival_during_decode_waits_for_the_step_in_flight() -> None:
    # A decodes from 0.100 in steps of 0.010: boundaries 0.110, 0.120, 0.130, ...
    # B arrives at 0.125 -> admitted at the boundary 0.130 next to A's decode token:
    # max(0.010, 0.001 + 0.020) -> 0.151 (B's first token; A has 5 tokens). Both decode:
    # 0.161 finishes B; A has 11 - 6 = 5 steps left of 0.010.
    a, b = simulate([req(0.0, 100, 11), req(0.125, 20, 2)], fleet(), to()).requests
    assert b.queue_s == pytest.approx(0.130 - 0.125)
    assert b.ttft_s == pytest.approx(0.151 - 0.125)
    assert b.finish_s == pytest.approx(0.161)
    assert a.finish_s == pytest.approx(0.161 + 5 * 0.010)


def test_chunked_prefill_interleaves_with_decodes() -> None:
    # Token budget 50 per step. A (20 prompt tokens, 10 output) prefills 0 -> 0.020 and
    # decodes in steps of 0.010 (boundaries 0.030, 0.040, 0.050). B (120 prompt tokens)
    # arrives at 0.045; from the boundary 0.050 every step runs A's decode token first and
    # a chunk of B filling the rest of the budget:
    #   0.050: A 1 + B 49 -> max(0.010, 0.050) -> 0.100
    #   0.100: A 1 + B 49 -> 0.150
    #   0.150: A 1 + B 22 (the rest) -> max(0.010, 0.023) -> 0.173: B's first token
    #   0.173: A 1 + B 1 -> 0.183: B's second and last token
    # A's tokens: first at 0.020, 3 in the pure-decode steps, 4 in the mixed ones, then 2
    # alone: 0.183 + 2 * 0.010 = 0.203.
    spec = dataclasses.replace(SPEC, max_num_batched_tokens=50)
    a, b = simulate([req(0.0, 20, 10), req(0.045, 120, 2)], fleet(spec), to()).requests
    assert a.ttft_s == pytest.approx(0.020)
    assert b.queue_s == pytest.approx(0.005)
    assert b.ttft_s == pytest.approx(0.173 - 0.045)
    assert b.finish_s == pytest.approx(0.183)
    assert a.finish_s == pytest.approx(0.203)
    assert a.tpot_s == pytest.approx((0.203 - 0.020) / 9)


def test_kv_is_allocated_incrementally_and_the_newest_request_is_preempted() -> None:
    # 6 pages of 10 tokens. A (25 + 30 tokens) prefills 0 -> 0.025 (3 pages). B (25 + 30)
    # arrives at 0.001 and is admitted at 0.025 with A's first decode token (3 pages: the KV
    # is full; up front, A alone would have reserved 6): max(0.010, 0.026) -> 0.051.
    # Both decode from 0.051 (A holds 26 tokens, B 25). After 4 steps (0.091) A's context
    # reaches 30 tokens: its next token needs a 4th page and none is free, so B, the newest
    # running request, is preempted (freed; back to the head of the queue, 5 tokens generated)
    # and no request is admitted in that step. A decodes alone to its 30th token: 24 steps,
    # 0.091 -> 0.331 (its 5th and 6th pages fit in B's freed ones; B's recompute needs 3
    # pages, only 2 are free: it waits). At 0.331 B recomputes its 25 + 5 tokens in one
    # step (0.030 -> 0.361, its 6th token) and decodes the other 24: 0.601.
    spec = dataclasses.replace(SPEC, kv_capacity_blocks=6)
    res = simulate([req(0.0, 25, 30), req(0.001, 25, 30)], fleet(spec), to())
    a, b = res.requests
    assert a.ttft_s == pytest.approx(0.025)
    assert a.finish_s == pytest.approx(0.331)
    assert b.ttft_s == pytest.approx(0.051 - 0.001)  # the first token stays the first
    assert b.finish_s == pytest.approx(0.601)
    (stats,) = res.replicas
    assert stats.preemptions == 1
    assert stats.prefill_tokens == 25 + 25 + 30  # B's recompute is prefill work again


def test_prefix_cache_hit_prefills_only_the_uncached_suffix() -> None:
    spec = dataclasses.replace(SPEC, prefill_s_per_token_pair=1e-6)
    trace = [
        req(0.0, 50, 2, (1, 2, 3, 4, 5)),
        req(1.0, 50, 2, (1, 2, 3, 9, 10)),  # 3 leading blocks = 30 tokens cached
        req(2.0, 50, 2, (1, 2, 3, 4, 5)),  # whole prompt cached: the last token is still computed
    ]
    a, b, c = simulate(trace, fleet(spec), to()).requests
    assert a.prefix_hit_tokens == 0
    assert a.ttft_s == pytest.approx(0.050 + (50 * 51 / 2) * 1e-6)
    # 20 new tokens after 30 cached: 20*0.001 + (20*30 + 20*21/2 = 810 pairs) * 1e-6
    assert b.prefix_hit_tokens == 30
    assert b.ttft_s == pytest.approx(0.020 + 810e-6)
    # 1 new token after 49 cached: max(0.010, 0.001) + (49 + 1) * 1e-6
    assert c.prefix_hit_tokens == 49
    assert c.ttft_s == pytest.approx(0.010 + 50e-6)


def test_only_full_blocks_are_cached() -> None:
    # 45 tokens: 5 hashes, the last for a partial block, which vLLM does not cache
    trace = [req(0.0, 45, 2, (1, 2, 3, 4, 5)), req(1.0, 45, 2, (1, 2, 3, 4, 5))]
    _, b = simulate(trace, fleet(), to()).requests
    assert b.prefix_hit_tokens == 40


def test_disaggregated_request_pays_the_kv_transfer() -> None:
    f = fleet(aggregated_replicas=0, prefill_replicas=1, decode_replicas=1, link=LinkSpec(bytes_per_s=1e6, latency_s=0.005))
    trace = [req(0.0, 100, 3, tuple(range(10))), req(1.0, 100, 3, tuple(range(10)))]
    a, b = simulate(trace, f, to(mode="disaggregated")).requests
    # prefill 0.100 (TTFT); KV 100 tokens * 1000 B = 1e5 B over 1e6 B/s + 5 ms = 0.105 s;
    # admitted on the decode replica at 0.205; 2 steps of 0.010 -> 0.225.
    assert (a.mode, a.replica, a.decode_replica) == ("disaggregated", 0, 0)
    assert a.ttft_s == pytest.approx(0.100)
    assert a.transfer_s == pytest.approx(0.105)
    assert a.finish_s == pytest.approx(0.225)
    assert a.tpot_s == pytest.approx((0.225 - 0.100) / 2)
    # B: prompt cached on the prefill replica (1 token computed, a 0.010 step) and on the
    # decode replica (nothing to transfer)
    assert b.ttft_s == pytest.approx(0.010)
    assert b.transfer_s == 0.0
    assert b.finish_s == pytest.approx(1.010 + 2 * 0.010)


def test_disaggregated_decode_joins_running_batch_at_step_boundary() -> None:
    f = fleet(aggregated_replicas=0, prefill_replicas=1, decode_replicas=1, link=LinkSpec(bytes_per_s=1e9, latency_s=0.0))
    # A: prefill 0 -> 0.100, transfer 1e5 B / 1e9 = 1e-4 s, decodes from 0.1001 in steps of 0.010.
    # B (50 tokens) arrives at 0.050, prefills 0.100 -> 0.150 behind A, transfer 5e-5 s ->
    # 0.15005; A's boundaries are 0.1001 + 0.010*j, the first at or after is j=5 (0.1501).
    # B needs 1 step next to A (0.010): 0.1601. A: 21 - 7 = 14 steps left.
    a, b = simulate([req(0.0, 100, 21), req(0.050, 50, 2)], f, to(mode="disaggregated")).requests
    assert b.ttft_s == pytest.approx(0.150 - 0.050)
    assert b.finish_s == pytest.approx(0.1601)
    assert a.finish_s == pytest.approx(0.1601 + 14 * 0.010)


def test_two_transfers_share_the_prefill_replicas_link() -> None:
    f = fleet(aggregated_replicas=0, prefill_replicas=1, decode_replicas=2,
              link=LinkSpec(bytes_per_s=1e6, latency_s=0.005))
    # A (150 tokens) prefills 0 -> 0.150; B (100 tokens, arrives at 0.050) 0.150 -> 0.250.
    # A's 1.5e5 B move alone at 1e6 B/s until 0.250 (1e5 B sent), then both share the link at
    # 5e5 B/s each: A's last 5e4 B take 0.100 -> 0.350, + 5 ms set-up -> 0.355 (alone: 0.305).
    # B sent 5e4 B by 0.350 and has the link to itself for the rest: 0.400 + 5 ms = 0.405
    # (alone: 0.355). Each then decodes its second and last token in one 0.010 step.
    a, b = simulate([req(0.0, 150, 2), req(0.050, 100, 2)], f, to(mode="disaggregated", decode=None)).requests
    assert {a.decode_replica, b.decode_replica} == {0, 1}
    assert a.transfer_s == pytest.approx(0.355 - 0.150)
    assert b.transfer_s == pytest.approx(0.405 - 0.250)
    assert a.finish_s == pytest.approx(0.365)
    assert b.finish_s == pytest.approx(0.415)


def test_eviction_under_pressure_is_lru_tail_first() -> None:
    spec = dataclasses.replace(SPEC, kv_capacity_blocks=6)
    # Each request: 3 hashed blocks, then a private page from its first decode token on.
    trace = [
        req(0.0, 30, 10, (1, 2, 3)),
        req(1.0, 30, 10, (4, 5, 6)),  # 3 free pages; its first decode page evicts A's tail block 3
        req(2.0, 30, 10, (1, 2, 3)),  # blocks 1, 2 still cached, 3 evicted -> 20 tokens hit
        req(3.0, 30, 10, (7, 8, 9)),
        req(4.0, 30, 10, (4, 5, 6)),  # B's blocks were evicted by C and D: miss
    ]
    res = simulate(trace, fleet(spec), to()).requests
    assert [r.prefix_hit_tokens for r in res] == [0, 0, 20, 0, 0]


def test_request_too_large_is_rejected_or_spilled() -> None:
    spec = dataclasses.replace(SPEC, kv_capacity_blocks=5, max_model_len=100)
    trace = [req(0.0, 90, 20), req(0.0, 45, 10)]  # 110 > max_model_len; 55 tokens = 6 blocks > 5
    a, b = simulate(trace, fleet(spec), to()).requests
    assert (a.rejected, b.rejected) == ("context_length", "kv_capacity")
    assert a.ttft_s is None and a.finish_s is None
    a, b = simulate(trace, fleet(spec, spill=True), to()).requests
    assert a.spilled and b.spilled and a.target == b.target == "fr" and a.routed_target == "op"
    assert a.rejected is None and a.cost_usd == pytest.approx((90 * 2.5 + 20 * 10.0) / 1e6)


def test_queue_limit_spills() -> None:
    # A prefills at once, B waits (1 waiting = the limit), C finds the queue full.
    trace = [req(0.0, 100, 2), req(0.01, 100, 2), req(0.02, 100, 2)]
    res = simulate(trace, fleet(max_waiting=1, spill=True), to()).requests
    assert [r.spilled for r in res] == [False, False, True]
    assert res[2].frontier and res[2].target == "fr"
    res = simulate(trace, fleet(max_waiting=1), to()).requests
    assert [r.rejected for r in res] == [None, None, "queue_full"]


def test_shared_kv_tier_restores_instead_of_recomputing() -> None:
    tier = SharedKVTierSpec(capacity_blocks=100, restore_bytes_per_s=1e7, latency_s=0.001)
    f = fleet(aggregated_replicas=2, shared_kv=tier)
    trace = [req(0.0, 50, 2, (1, 2, 3, 4, 5)), req(1.0, 50, 2, (1, 2, 3, 4, 6))]
    a, b = simulate(trace, f, RoundRobin("op")).requests
    assert (a.replica, b.replica) == (0, 1)
    # B on replica 1: no local hit; blocks 1-4 (40 tokens, 4e4 B) restore in 0.004 s + 1 ms,
    # then 10 new tokens in one step: 0.010 s. Recomputing would take 0.050 s.
    assert b.prefix_hit_tokens == 0 and b.restored_tokens == 40
    assert b.ttft_s == pytest.approx(0.015)


def test_concurrent_restores_share_the_tiers_bandwidth() -> None:
    tier = SharedKVTierSpec(capacity_blocks=100, restore_bytes_per_s=1e7, latency_s=0.001)
    f = fleet(aggregated_replicas=3, shared_kv=tier)
    trace = [req(0.0, 50, 2, (1, 2, 3, 4, 5)), req(1.0, 50, 2, (1, 2, 3, 4, 6)), req(1.0, 50, 2, (1, 2, 3, 4, 7))]
    _, b, c = simulate(trace, f, RoundRobin("op")).requests
    # B and C restore 4e4 B each onto replicas 1 and 2 at once: 5e6 B/s each, 0.008 s + 1 ms
    # (alone: 0.004 s + 1 ms), then their 10 new tokens in a 0.010 step.
    assert (b.replica, c.replica) == (1, 2)
    assert b.restored_tokens == c.restored_tokens == 40
    assert b.ttft_s == pytest.approx(0.019) and c.ttft_s == pytest.approx(0.019)


def test_closed_loop_clients_send_the_next_request_at_completion() -> None:
    # 2 clients, 4 requests of 100 + 2 tokens: the first two share steps: 0.200 prefill, 0.010
    # decode -> both done at 0.210; the next two are sent then and done at 0.420.
    res = simulate([req(0.0, 100, 2) for _ in range(4)], fleet(), to(), closed_loop_clients=2).requests
    assert [r.arrival_s for r in res] == pytest.approx([0.0, 0.0, 0.210, 0.210])
    assert [r.finish_s for r in res] == pytest.approx([0.210, 0.210, 0.420, 0.420])


def test_first_token_callback() -> None:
    seen: list[tuple[int, float]] = []
    # arriving together, both prefill in one step of 1000 tokens
    simulate([req(0.0, 100, 3), req(0.0, 900, 2)], fleet(), to(), on_first_token=lambda i, t: seen.append((i, t)))
    assert seen == [(0, pytest.approx(1.000)), (1, pytest.approx(1.000))]


def test_frontier_latency_and_cost() -> None:
    (r,) = simulate([req(0.0, 1000, 101)], fleet(), to("fr")).requests
    assert r.frontier and r.replica is None and r.queue_s == 0.0
    assert r.cost_usd == pytest.approx((1000 * 2.5 + 101 * 10.0) / 1e6)
    assert r.e2e_s == pytest.approx(r.ttft_s + 100 * r.tpot_s)
    assert 0.05 < r.ttft_s < 10 and 0.001 < r.tpot_s < 0.2


def _synthetic_trace(n: int) -> list[TraceRequest]:
    """Deterministic mixed workload: shared system prompts, multi-turn prefixes, varied lengths."""
    out = []
    for i in range(n):
        p = 40 + (i * 37) % 300
        blocks = -(-p // 10)
        conv = i % 7
        hashes = tuple(conv * 1000 + j if j < blocks // 2 else 10**6 + i * 100 + j for j in range(blocks))
        out.append(req(i * 0.013, p, 1 + (i * 11) % 40, hashes))
    return out


def test_deterministic_under_seed() -> None:
    trace = _synthetic_trace(400)
    f = SimFleet(
        on_prem=(OnPremTarget(name="op", replica=SPEC, aggregated_replicas=2, prefill_replicas=1, decode_replicas=1),),
        frontier=(FrontierSpec(name="fr"),),
    )

    def router(seed: int):
        pick = RandomPick("op", seed=seed)

        def route(request, view):
            if request.output_tokens % 5 == 0:
                return Assignment("fr")
            if request.output_tokens % 3 == 0:
                return Assignment("op", "disaggregated")
            return pick(request, view)

        return route

    one = simulate(trace, f, router(1), seed=7)
    two = simulate(trace, f, router(1), seed=7)
    assert one.requests == two.requests and one.replicas == two.replicas and one.timeline == two.timeline
    other = simulate(trace, f, router(2), seed=8)
    assert other.requests != one.requests
    assert all(r.rejected is None for r in one.requests)


def test_unsorted_trace_and_bad_router_answers() -> None:
    a, b = simulate([req(1.0, 10, 2), req(0.0, 10, 2)], fleet(), to()).requests
    assert b.finish_s < a.finish_s  # served in arrival order, reported in trace order
    with pytest.raises(ValueError, match="unknown target 'nope'"):
        simulate([req(0.0, 10, 2)], fleet(), to("nope"))
    with pytest.raises(ValueError, match="no disaggregated pool"):
        simulate([req(0.0, 10, 2)], fleet(), to(mode="disaggregated"))
    with pytest.raises(ValueError, match="replica index 3"):
        simulate([req(0.0, 10, 2)], fleet(), to(replica=3))
    with pytest.raises(ValueError, match="block hashes"):
        simulate([req(0.0, 100, 2, (1, 2))], fleet(), to())


def test_busy_time_split_into_prefill_and_decode() -> None:
    res = simulate([req(0.0, 100, 5)], fleet(), to(), timeline_bin_s=0.05)
    (stats,) = res.replicas
    assert stats.prefill_busy_s == pytest.approx(0.100)
    assert stats.decode_busy_s == pytest.approx(0.040)
    assert stats.prefill_tokens == 100 and stats.decode_steps == 5  # engine steps: 1 prefill + 4 decode
    tl = res.timeline["op"]
    assert tl["prefill_busy_gpu_s"] == pytest.approx([0.05, 0.05, 0.0])
    assert tl["decode_busy_gpu_s"] == pytest.approx([0.0, 0.0, 0.040])
    assert res.window_s == pytest.approx(0.140)


@pytest.mark.parametrize("seed", range(5))
def test_invariants_under_random_stress(seed: int) -> None:
    """Tight KV and batch limits, mixed modes: every request ends, latencies respect the physics."""
    import random

    rng = random.Random(seed)
    spec = dataclasses.replace(SPEC, kv_capacity_blocks=12, max_num_seqs=3, decode_per_kv_token_s=1e-5)
    f = SimFleet(
        on_prem=(
            OnPremTarget(
                name="op", replica=spec, aggregated_replicas=2, prefill_replicas=2, decode_replicas=1,
                shared_kv=SharedKVTierSpec(capacity_blocks=20), max_waiting=2,
            ),
        ),  # fmt: skip
        frontier=(FrontierSpec(name="fr"),),
        spill_target="fr",
    )
    trace, t = [], 0.0
    for _ in range(300):
        t += rng.expovariate(40.0)
        p = rng.randint(1, 60)
        nb = -(-p // 10)
        base = rng.randrange(4) * 100
        trace.append(req(t, p, rng.randint(1, 30), tuple(base + j if j < 3 else rng.randrange(10**9) for j in range(nb))))

    def route(request, view):
        x = rng.random()
        if x < 0.1:
            return Assignment("fr")
        if x < 0.5:
            return Assignment("op", "disaggregated", rng.choice([None, 0, 1]), rng.choice([None, 0]))
        return Assignment("op", "aggregated", rng.choice([None, 0, 1]))

    res = simulate(trace, f, route)  # raises if any replica is left holding KV or requests
    for r in res.requests:
        assert r.rejected is None  # everything fits; overflow spills
        assert r.queue_s >= 0 and r.ttft_s > 0 and r.finish_s >= r.arrival_s + r.ttft_s
        if not r.frontier:
            assert 0 <= r.prefix_hit_tokens + r.restored_tokens <= r.prompt_tokens - 1
            assert r.e2e_s >= r.ttft_s + (r.output_tokens - 1) * spec.decode_base_s - 1e-9
    # the run exercised spills, restores from the shared tier, P/D transfers and queueing
    assert all(any(map(f, res.requests)) for f in (
        lambda r: r.spilled, lambda r: r.restored_tokens, lambda r: r.transfer_s, lambda r: r.queue_s,
    ))  # fmt: skip
    assert sum(st.preemptions for st in res.replicas)  # and KV running out mid-decode
    for st in res.replicas:  # one activity at a time
        assert st.prefill_busy_s + st.decode_busy_s <= res.window_s + 1e-9
