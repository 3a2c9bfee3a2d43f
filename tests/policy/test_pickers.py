"""Endpoint selection: scorers in seconds (hand-computed), the bounded-load guard, health,
the shared KV tier's restore-vs-recompute, and fallback endpoint order."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pointsman.policy.fleet import EndpointInfo, Pool
from pointsman.policy.selection.pickers import (
    DecodeLoadScorer,
    EndpointSelectionSpec,
    InOrderPicker,
    MinCostPicker,
    PickInput,
    PoolView,
    PrefillWorkScorer,
    QueueScorer,
    TransferScorer,
    bounded_load_cap,
)
from pointsman.policy.signals.load_board import SATURATED_WAITING, EndpointLoad
from pointsman.policy.signals.prefix_index import PrefixIndex, SharedKVTier

POOL = Pool(gpus_per_replica=2, prefill_tokens_per_s=10_000, decode_tokens_per_s=5_000,
            endpoints=[f"http://e{i}:8000/v1" for i in range(4)])
EPS = [EndpointInfo(f"http://e{i}:8000/v1", f"http://e{i}:8000/v1", f"e{i}", "t", "aggregated", POOL) for i in range(4)]


def reading(i, running=0, waiting=0, pending=0, pending_tokens=0, inflight=0, inflight_tokens=0, saturated=False):
    return EndpointLoad(EPS[i].id, "push", 0.0, num_requests_running=running, num_requests_waiting=waiting,
                        pending_requests=pending, pending_prompt_tokens=pending_tokens, inflight_requests=inflight,
                        inflight_prompt_tokens=inflight_tokens, saturated=saturated)


def view(loads=None, healthy=None, prefix=None, shared=None):
    return PoolView("t", "aggregated", POOL, EPS, loads or [None] * 4, healthy or [True] * 4, prefix, shared)


def picker(**kw):
    return MinCostPicker(EndpointSelectionSpec(**kw))


def test_prefill_work_counts_only_the_uncached_part():
    idx = PrefixIndex(block_tokens=100)
    hashes = list(range(1, 51))  # 50 blocks = 5,000 tokens
    idx.record(EPS[1].id, hashes[:30])  # 3,000 tokens cached on e1
    v = view(prefix=idx.lookup(hashes, prompt_tokens=5000))
    got = PrefillWorkScorer().score(PickInput(5000, 100), v)
    assert got == pytest.approx([0.5, 0.2, 0.5, 0.5])  # (5000 - 3000) / 10,000 tok/s on e1


def test_shared_tier_restores_when_faster_than_recompute():
    tier = SharedKVTier(capacity_tokens=1_000_000, bytes_per_token=100_000, bandwidth_bytes_per_s=1e9, latency_s=0.01)
    idx = PrefixIndex(block_tokens=100, shared=tier)
    hashes = list(range(1, 51))
    idx.offload(hashes[:40])  # 4,000 tokens in the shared tier, nowhere local
    v = view(prefix=idx.lookup(hashes, prompt_tokens=5000), shared=tier)
    # restore 4,000 tokens: 0.01 + 4000 * 1e5 / 1e9 = 0.41 s < recompute 0.4 s? no: recompute wins
    assert PrefillWorkScorer().score(PickInput(5000, 100), v)[0] == pytest.approx(0.1 + 0.4)
    fast = SharedKVTier(capacity_tokens=1_000_000, bytes_per_token=10_000, bandwidth_bytes_per_s=1e9, latency_s=0.01)
    idx = PrefixIndex(block_tokens=100, shared=fast)
    idx.offload(hashes[:40])
    v = view(prefix=idx.lookup(hashes, prompt_tokens=5000), shared=fast)
    # restore: 0.01 + 4000 * 1e4 / 1e9 = 0.05 s instead of 0.4 s recompute
    assert PrefillWorkScorer().score(PickInput(5000, 100), v)[0] == pytest.approx(0.1 + 0.05)


def test_queue_and_decode_scorers_by_hand():
    loads = [reading(0), reading(1, running=4, waiting=3, pending=1, pending_tokens=2000, inflight=2, inflight_tokens=3000),
             None, reading(3, saturated=True, waiting=1_000_000)]
    v = view(loads)
    q = QueueScorer().score(PickInput(1000, 200), v)
    # e1: (2000 pending tokens + (3 - 1) waiting x 1500 mean in-flight prompt) / 10,000
    assert q[:3] == pytest.approx([0.0, 0.5, 0.0]) and q[3] > 100
    d = DecodeLoadScorer().score(PickInput(1000, 200), v)
    # 200 tokens x (outstanding + 1) / 5,000 tok/s; e1 has 4 running + 3 waiting
    assert d[:3] == pytest.approx([0.04, 0.32, 0.04])


def test_min_cost_prefers_the_cached_endpoint_and_lists_fallbacks():
    idx = PrefixIndex(block_tokens=100)
    hashes = list(range(1, 51))
    idx.record(EPS[2].id, hashes)
    pick = picker(fallback_endpoints=2).pick(PickInput(5000, 100), view(prefix=idx.lookup(hashes, prompt_tokens=5000)))
    assert pick.order == (2, 0, 1)
    assert [c.name for c in pick.choices()] == ["e2", "e0", "e1"]
    trace = pick.trace()
    assert trace["candidates"][0]["endpoint"] == "e2" and trace["candidates"][0]["local_hit_tokens"] == 5000
    assert trace["candidates"][0]["rank"] == 0 and set(trace["candidates"][0]) >= {"prefill-work", "queue", "decode-load"}


def test_transfer_counts_the_kv_the_decode_endpoint_lacks():
    idx = PrefixIndex(block_tokens=100)
    hashes = list(range(1, 51))
    idx.record(EPS[1].id, hashes[:30])  # 3,000 of 5,000 tokens held on e1
    idx.record(EPS[2].id, hashes)  # all of it on e2
    v = PoolView("t", "decode", POOL, EPS, [None] * 4, [True] * 4, idx.lookup(hashes, prompt_tokens=5000),
                 kv_link=(1e-4, 0.002))
    # 0.002 s + untransferred tokens x 1e-4 s
    assert TransferScorer().score(PickInput(5000, 10), v) == pytest.approx([0.502, 0.202, 0.0, 0.502])
    assert picker().pick(PickInput(5000, 10), v).chosen == 2
    assert TransferScorer().score(PickInput(5000, 10), view()) == [0.0] * 4  # no link known


def test_bounded_load_keeps_a_hot_prefix_from_piling_on_one_endpoint():
    idx = PrefixIndex(block_tokens=100)
    hashes = list(range(1, 51))
    idx.record(EPS[0].id, hashes)
    lk = idx.lookup(hashes, prompt_tokens=5000)
    # e0 holds the prefix but 6 of the pool's 6 outstanding requests: cap = max(2, ceil(1.25 * 7 / 4)) = 3
    loads = [reading(0, running=6), reading(1), reading(2), reading(3)]
    pick = picker(bounded_load_floor=2).pick(PickInput(5000, 10), view(loads, prefix=lk))
    assert pick.cap == 3 and pick.excluded == {0: "over-cap"}
    assert pick.chosen != 0 and 0 not in pick.order  # 3 endpoints under the cap fill chosen + 2 fallbacks
    assert picker(bounded_load_floor=2, fallback_endpoints=3).pick(PickInput(5000, 10), view(loads, prefix=lk)).order[-1] == 0
    # the default floor is what a replica batches (the pool's max_num_seqs): under a full batch the cache wins
    assert picker().pick(PickInput(5000, 10), view(loads, prefix=lk)).chosen == 0
    small = PoolView("t", "aggregated", POOL.model_copy(update={"max_num_seqs": 6}), EPS, loads, [True] * 4, lk)
    assert picker().pick(PickInput(5000, 10), small).excluded == {0: "over-cap"}
    # without the guard the cache wins: its prefill saving outweighs its decode load
    assert picker(bounded_load_epsilon=None).pick(PickInput(5000, 10), view(loads, prefix=lk)).chosen == 0


def test_bounded_load_cap_formula():
    assert bounded_load_cap([0, 0, 0, 0], [True] * 4, 0.25) == 1  # floor 1: ceil(1.25 * 1 / 4) = 1
    assert bounded_load_cap([0, 0, 0, 0], [True] * 4, 0.25, floor=2) == 2
    assert bounded_load_cap([10, 10, 10, 9], [True] * 4, 0.25) == 13  # ceil(1.25 * 40 / 4) = 12.5 -> 13
    assert bounded_load_cap([100, 0], [False, True], 0.0) == 1  # unhealthy endpoints do not count
    assert bounded_load_cap([1, 2], [True, True], None) is None


def test_unhealthy_endpoints_are_never_chosen():
    pick = picker(fallback_endpoints=8).pick(PickInput(100, 10), view(healthy=[False, True, False, True]))
    assert set(pick.order) == {1, 3} and pick.excluded == {0: "unhealthy", 2: "unhealthy"}
    none = picker().pick(PickInput(100, 10), view(healthy=[False] * 4))
    assert none.chosen is None and none.choices() == ()


def test_ties_go_to_the_session_endpoint_then_file_order():
    assert picker().pick(PickInput(100, 10), view()).chosen == 0
    assert picker().pick(PickInput(100, 10, session_endpoint=EPS[3].id), view()).chosen == 3


def test_in_order_picker_skips_unhealthy_endpoints():
    pick = InOrderPicker(EndpointSelectionSpec(fallback_endpoints=1)).pick(
        PickInput(100, 10), view(healthy=[False, True, True, True]))
    assert pick.order == (1, 2)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 50), st.booleans()), min_size=4, max_size=4),
       st.integers(SATURATED_WAITING, 10 * SATURATED_WAITING), st.sampled_from([0.0, 0.25, 1.0]))
def test_a_saturated_reading_never_moves_the_bounded_load_cap(loads, waiting, eps):
    """``on_stale: saturated`` reads a stale endpoint as ``SATURATED_WAITING`` or more waiting requests: a made-up
    count, so the cap is the one over the other endpoints, whatever it is (before, one such endpoint lifted
    the cap off the pool: 1,000,000 waiting over 4 endpoints is a cap of ~312,500)."""
    stale = [reading(i, waiting=waiting, saturated=True) if sat else reading(i, running=b)
             for i, (b, sat) in enumerate(loads)]
    fresh = [(i, x) for i, x in enumerate(stale) if not x.saturated]
    got = picker(bounded_load_epsilon=eps, bounded_load_floor=1).pick(PickInput(100, 10), view(stale))
    alone = bounded_load_cap([x.num_requests_running for _, x in fresh], [True] * len(fresh), eps)
    assert got.cap == alone
    assert got.cap is None or all(got.excluded.get(i) == "over-cap" for i, x in enumerate(stale) if x.saturated)
