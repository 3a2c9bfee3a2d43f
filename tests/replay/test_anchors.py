"""The anchor baselines (llm-d, Dynamo, SGLang) on hand-made fleet states whose choice follows
from each one's formula, and end to end in the simulator (their state follows first tokens and
completions)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pytest

from pointsman.datasets.traces import TraceRequest
from pointsman.replay.baselines import ANCHORS, DynamoKv, LlmD, SglangCacheAware
from pointsman.replay.hardware import FrontierSpec, ReplicaSpec
from pointsman.replay.results import RequestResult
from pointsman.replay.runs import baseline_routers
from pointsman.replay.sim_fleet import OnPremTarget, SimFleet
from pointsman.replay.simulator import simulate

BT = 512


@dataclass
class View:
    """A ``ReplicaView`` with the numbers a test sets."""

    num_requests_waiting: int = 0
    num_requests_running: int = 0
    kv_cache_usage: float = 0.0
    kv_capacity_tokens: int = 100 * BT
    resident: Sequence[int] = ()
    tree: int = 0
    target: str = "op"
    role: str = "aggregated"
    index: int = 0
    waiting_prompt_tokens: int = 0

    def cached_prefix_blocks(self, block_hashes: Sequence[int]) -> int:
        n = 0
        for h in block_hashes:
            if h not in self.resident:
                break
            n += 1
        return n

    def cached_prefix_tokens(self, request: TraceRequest) -> int:
        return self.cached_prefix_blocks(request.block_hashes or ()) * BT

    @property
    def cached_blocks(self) -> int:
        return self.tree

    def busy_s(self, now_s: float) -> tuple[float, float]:
        return 0.0, 0.0


def req(p: int, hashes: Sequence[int] | None = None) -> TraceRequest:
    return TraceRequest(0.0, p, 10, tuple(hashes) if hashes is not None else None)


def done(index: int) -> RequestResult:
    return RequestResult(index, 0.0, 1, 1, "op", "op", "aggregated", 0, None, False, False, None, 0.0, 0.1, None,
                         0.1, 0.1, 0, 0, 0.0, 0.0)


def test_llm_d_scores_queue_kv_and_approximate_prefix() -> None:
    views = (View(num_requests_waiting=2, kv_cache_usage=0.5), View(num_requests_waiting=0, kv_cache_usage=0.9),
             View(num_requests_waiting=4, kv_cache_usage=0.1))
    r = LlmD(seed=0)
    r.start(views)
    r.index[2].add(list(range(4)))  # replica 2 was routed the first 4 blocks
    r.index[0].add([0])  # replica 0 only the first
    request = req(12 * BT, range(12))  # 12 blocks, of which only the first 8 (4,096 tokens) are hashed
    # queue: (4-2)/4, (4-0)/4, (4-4)/4 = 0.5, 1, 0; kv: 0.5, 0.1, 0.9; prefix: the run any
    # replica holds is blocks 0-3: replica 0 holds 1 of 8, replica 2 holds 4 of 8
    assert r.scores(request, views) == pytest.approx([2 * 0.5 + 2 * 0.5 + 3 / 8, 2 * 1 + 2 * 0.1,
                                                      2 * 0 + 2 * 0.9 + 3 * 4 / 8])
    assert r.choose(request, views) == 2
    r.record(0, request, 2)
    assert len(r.index[2]) == 8  # the 8 hashed blocks, not the 12


def test_llm_d_equal_queues_score_one_and_ties_break_at_random() -> None:
    views = (View(num_requests_waiting=3), View(num_requests_waiting=3))
    picks = set()
    for seed in range(20):
        r = LlmD(seed=seed)
        r.start(views)
        assert r.scores(req(100), views) == [2 + 2, 2 + 2]  # queue 1.0 each, kv 1.0, no prefix
        picks.add(r.choose(req(100), views))
    assert picks == {0, 1}


def test_dynamo_cost_is_overlap_weighted_prefill_blocks_plus_decode_blocks() -> None:
    # Dynamo's documented example: prefill / decode blocks 8/10, 5/5, 2/9 cost 18, 10, 11.
    views = (View(), View(resident=(0,)), View(resident=(0, 1, 2)))
    r = DynamoKv()
    r.start(views)
    request = req(5 * BT, range(5))  # 5 blocks
    # queued prefill tokens so that (queued + new) / 512 = 8, 5, 2 with overlaps 0, 1, 3 blocks
    r.prefill_tokens = [3 * BT, 1 * BT, 0]
    # decode blocks: active distinct blocks + this request's blocks not among them = 10, 5, 9
    r.active[0].update(range(5, 10))  # 5 + 5 new
    r.active[1].update(range(5))  # 5 + 0 new
    r.active[2].update([0, 1, 2, 3, 4, 20, 21, 22, 23])  # 9 + 0 new
    assert r.logits(request, views) == pytest.approx([18, 10, 11])
    assert r.choose(request, views) == 1
    r.record(7, request, 1)
    assert r.prefill_tokens[1] == BT + 4 * BT  # its 4 uncached blocks are queued there
    r.on_first_token(7, 1.0)
    assert r.prefill_tokens[1] == BT
    r.on_complete(done(7))
    assert set(r.active[1]) == set(range(5)) and r.active[1][0] == 1


def test_dynamo_ties_go_to_the_smallest_tree() -> None:
    views = (View(tree=30), View(tree=10), View(tree=20))
    r = DynamoKv()
    r.start(views)
    assert r.choose(req(BT), views) == 1
    hot = DynamoKv(temperature=1.0, seed=3)
    hot.start(views)
    hot.prefill_tokens = [0, 100 * BT, 0]
    picks = [hot.choose(req(BT), views) for _ in range(200)]
    assert 0 < picks.count(1) < picks.count(0)  # softmax: the costly one is drawn, less often


def test_sglang_routes_to_the_deepest_match_when_balanced() -> None:
    views = (View(), View(), View())
    r = SglangCacheAware()
    r.start(views)
    r.load = [3, 2, 5]
    r.tree[2].add(list(range(4)))
    assert r.choose(req(10 * BT, range(10)), views) == 2  # 4/10 = 0.4 > 0.3
    r.tree[2] = type(r.tree[2])(r.MAX_TREE_BLOCKS)
    r.tree[2].add([0, 1])
    assert r.choose(req(10 * BT, range(10)), views) == 1  # 2/10 = 0.2: the least loaded
    assert r.MAX_TREE_BLOCKS == 32768


def test_sglang_balances_by_load_when_imbalanced() -> None:
    views = (View(), View(), View())
    r = SglangCacheAware()
    r.start(views)
    r.tree[0].add(list(range(10)))
    r.load = [70, 2, 5]  # 70 - 2 > 64 and 70 > 1.5 x 2
    assert r.choose(req(10 * BT, range(10)), views) == 1
    r.load = [60, 2, 5]  # 58 <= 64: balanced, the full match on replica 0 wins
    assert r.choose(req(10 * BT, range(10)), views) == 0
    r.record(1, req(10 * BT, range(10)), 0)
    assert r.load[0] == 61
    r.on_complete(done(1))
    assert r.load[0] == 60


SPEC = ReplicaSpec(name="t", gpus=1, kv_capacity_blocks=100, kv_bytes_per_token=1000, prefill_s_per_token=1e-5,
                   prefill_s_per_token_pair=0.0, decode_base_s=0.010, decode_per_seq_s=1e-5,
                   decode_per_kv_token_s=0.0, max_num_seqs=8)


def test_anchors_run_in_the_simulator_and_keep_their_state_balanced() -> None:
    fleet = SimFleet(on_prem=(OnPremTarget(name="op", replica=SPEC, aggregated_replicas=3),),
                     frontier=(FrontierSpec(name="fr"),))
    trace = [TraceRequest(i * 0.01, 2 * BT, 5, (i % 3, 100 + i)) for i in range(60)]
    routers = baseline_routers(fleet)
    assert set(ANCHORS) <= set(routers)
    for name in ANCHORS:
        r = routers[name]
        assert isinstance(r, (LlmD, DynamoKv, SglangCacheAware))
        res = simulate(trace, fleet, r, on_complete=r.on_complete, on_first_token=r.on_first_token)
        assert all(x.rejected is None for x in res.requests)
        assert len({x.replica for x in res.requests}) > 1
        assert not r.routed
        if isinstance(r, DynamoKv):
            assert r.prefill_tokens == [0, 0, 0] and not any(r.active)
        if isinstance(r, SglangCacheAware):
            assert r.load == [0, 0, 0]
