"""PrefixIndex: chained block hashes, LRU bound per endpoint, leading-block matches and ratios,
session affinity with TTL, the shared KV tier, and block lifetimes (a provider prompt cache)."""

import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pointsman.policy.signals.prefix_index import (
    PrefixIndex,
    SharedKVTier,
    block_hashes_from_ids,
    block_hashes_from_text,
    block_hashes_from_tokens,
    kv_bytes_per_token,
)

A, B, C = "a", "b", "c"


# ---------------------------------------------------------------- hashing

def test_text_hashes_share_exactly_the_common_full_blocks():
    block = 16 * 4  # block_tokens=16 x 4 chars per token = 64 bytes
    system = "S" * (3 * block + 10)  # 3 full blocks, then 10 shared bytes of the 4th
    a = block_hashes_from_text(system + "question one" + "x" * 200, block_tokens=16)
    b = block_hashes_from_text(system + "question two" + "x" * 200, block_tokens=16)
    assert a[:3] == b[:3]
    assert a[3] != b[3]  # the 4th block differs in its tail, so it and every later hash diverge
    assert all(x != y for x, y in zip(a[3:], b[3:]))
    assert len(a) == (len(system) + 12 + 200) // block  # full blocks only
    assert block_hashes_from_text("short", block_tokens=16) == []


def test_hashes_are_chained_not_per_block():
    # the same block content after a different prefix gets a different hash
    blk = "B" * 64
    a = block_hashes_from_text("A" * 64 + blk, block_tokens=16)
    b = block_hashes_from_text("C" * 64 + blk, block_tokens=16)
    assert a[1] != b[1]
    # deterministic, 64-bit, salted
    assert a == block_hashes_from_text("A" * 64 + blk, block_tokens=16)
    assert all(0 <= h < 2**64 for h in a)
    assert block_hashes_from_text("A" * 64, block_tokens=16, salt=b"lora-1") != a[:1]


def test_token_hashes_and_divergence_point():
    base = list(range(1000, 1000 + 100))
    a = block_hashes_from_tokens(base + [1, 2, 3] * 20, block_tokens=10)
    b = block_hashes_from_tokens(base[:95] + [7] * 5 + [1, 2, 3] * 20, block_tokens=10)
    assert a[:9] == b[:9] and a[9] != b[9]  # token 95 lies in block 9
    assert len(a) == 16  # 160 tokens, 10 per block
    assert block_hashes_from_tokens(base, block_tokens=10) != block_hashes_from_text(str(base), block_tokens=10)[:10]


def test_gateway_ids_are_chained_and_typed():
    a = block_hashes_from_ids([1, 2, 3])
    b = block_hashes_from_ids([1, 2, 4])
    c = block_hashes_from_ids([9, 2, 3])
    assert a[:2] == b[:2] and a[2] != b[2]
    assert a[1] != c[1]  # same id after a different parent
    assert block_hashes_from_ids(["1", "2", "3"])[0] != a[0]
    with pytest.raises(TypeError):
        block_hashes_from_ids([1.5])


# ---------------------------------------------------------------- match, LRU bound

def chain(n, start=0):
    return [start + i for i in range(n)]


def test_match_counts_leading_blocks_per_endpoint():
    idx = PrefixIndex(block_tokens=16)
    idx.record(A, chain(10))  # the whole prompt
    idx.record(B, chain(4))  # a shorter conversation with the same start
    idx.record(C, chain(5, start=100))  # unrelated
    assert idx.match(chain(10)) == {A: 10, B: 4}
    assert idx.match(chain(3)) == {A: 3, B: 3}
    assert idx.match([0, 1, 99, 3]) == {A: 2, B: 2}  # stops at the first block nobody has
    assert idx.match([42]) == {} and idx.match([]) == {}


def test_hit_ratios_in_blocks_and_tokens():
    idx = PrefixIndex(block_tokens=16)
    idx.record(A, chain(8))
    idx.record(B, chain(2))
    ratios = idx.hit_ratios(chain(8), [A, B, C])
    assert ratios == {A: 1.0, B: 0.25, C: 0.0}
    # 8 full blocks of a 136-token prompt (8 x 16 = 128 hashed, 8 tokens in a partial block)
    ratios = idx.hit_ratios(chain(8), [A, B], prompt_tokens=136)
    assert ratios[A] == pytest.approx(128 / 136) and ratios[B] == pytest.approx(32 / 136)
    assert idx.hit_ratios([], [A]) == {A: 0.0}


def test_lru_bound_evicts_least_recently_used_tail_first():
    idx = PrefixIndex(block_tokens=16, default_capacity_tokens=16 * 6)  # 6 blocks
    idx.record(A, chain(4))  # blocks 0..3
    idx.record(A, chain(4, start=100))  # blocks 100..103: 8 > 6, evict the 2 LRU: the tail of chain 0
    assert idx.cached_blocks(A) == 6
    assert idx.match(chain(4)) == {A: 2}  # head kept, tail evicted
    idx.record(A, chain(2))  # touch 0, 1
    idx.record(A, chain(3, start=200))  # evicts the tail of the 100-chain, not 0..1
    assert idx.match(chain(2)) == {A: 2}
    assert idx.match(chain(4, start=100)) == {A: 1}
    assert idx.stats()["cached_blocks"] == 6


def test_prompt_longer_than_capacity_keeps_its_head():
    idx = PrefixIndex(block_tokens=16, default_capacity_tokens=16 * 3)
    idx.record(A, chain(10))
    assert idx.match(chain(10)) == {A: 3}


def test_set_capacity_shrinks_and_eviction_clears_owners():
    idx = PrefixIndex(block_tokens=16)
    idx.record(A, chain(10))
    idx.record(B, chain(10))
    idx.set_capacity(A, 16 * 4)
    assert idx.match(chain(10)) == {A: 4, B: 10}
    idx.remove_endpoint(B)
    assert idx.match(chain(10)) == {A: 4}
    assert idx.stats()["distinct_blocks"] == 4  # nobody holds blocks 4..9 any more
    idx.record(C, chain(2))  # reuses B's freed bit
    assert idx.match(chain(10)) == {A: 4, C: 2}
    with pytest.raises(ValueError, match="capacity_tokens"):
        idx.set_capacity(A, 8)


def test_match_over_many_endpoints():
    idx = PrefixIndex(block_tokens=16)
    for i in range(256):
        idx.record(f"e{i}", chain(i % 50 + 1))  # endpoint i holds the first i%50+1 blocks
    m = idx.match(chain(200))
    assert len(m) == 256
    assert all(m[f"e{i}"] == i % 50 + 1 for i in range(256))


# ---------------------------------------------------------------- sessions

def test_session_affinity_ttl_and_bound():
    idx = PrefixIndex(session_ttl_s=60.0, max_sessions=2)
    idx.record(A, chain(3), session_id="s1", now=0.0)
    assert idx.session_endpoint("s1", now=59.0) == A
    idx.touch_session("s1", B, now=50.0)  # next turn went to B; TTL renewed
    assert idx.session_endpoint("s1", now=100.0) == B
    assert idx.session_endpoint("s1", now=110.0) is None  # 60 s after the last touch
    idx.touch_session("s2", A, now=200.0)
    idx.touch_session("s3", A, now=201.0)
    idx.touch_session("s4", A, now=202.0)  # over max_sessions: the least recent (s2) goes
    assert idx.session_endpoint("s2", now=203.0) is None
    assert idx.session_endpoint("s4", now=203.0) == A
    idx.remove_endpoint(A)
    assert idx.session_endpoint("s4", now=203.0) is None


# ---------------------------------------------------------------- shared tier

def test_shared_tier_hit_tokens_and_restore_cost():
    tier = SharedKVTier(capacity_tokens=16 * 100, bytes_per_token=kv_bytes_per_token(80, 8, 128),
                        bandwidth_bytes_per_s=25e9, latency_s=0.002)
    idx = PrefixIndex(block_tokens=16, shared=tier)
    idx.record(A, chain(10))  # written through to the shared tier
    idx.set_capacity(A, 16 * 4)  # A itself now holds only the first 4
    idx.record(B, chain(2))
    hits = idx.hit_tokens(chain(12), [A, B, C], prompt_tokens=12 * 16 + 5)
    assert hits[A] == (4 * 16, 6 * 16)  # blocks 4..9 restorable, 10..11 never stored
    assert hits[B] == (2 * 16, 8 * 16)
    assert hits[C] == (0, 10 * 16)
    # restore: 2 ms + tokens x 327,680 B / 25 GB/s
    assert kv_bytes_per_token(80, 8, 128) == 327_680
    assert tier.restore_s(1000) == pytest.approx(0.002 + 1000 * 327_680 / 25e9)
    assert tier.restore_s(0) == 0.0


def test_shared_tier_bounded_and_offload_without_write_through():
    tier = SharedKVTier(capacity_tokens=16 * 3, bytes_per_token=1, bandwidth_bytes_per_s=1.0,
                        write_through=False)
    idx = PrefixIndex(block_tokens=16, shared=tier)
    idx.record(A, chain(5))
    assert idx.hit_tokens(chain(5), [B]) == {B: (0, 0)}  # nothing written through
    idx.offload(chain(5))  # e.g. an idle agent session's KV; bounded to 3 blocks, head kept
    assert idx.hit_tokens(chain(5), [B]) == {B: (0, 3 * 16)}
    assert idx.stats()["shared_blocks"] == 3
    assert PrefixIndex().hit_tokens(chain(3), [A]) == {A: (0, 0)}  # no tier: shared always 0


@pytest.mark.parametrize("kwargs, field", [
    ({"capacity_tokens": 0}, "capacity_tokens"),
    ({"bandwidth_bytes_per_s": float("inf")}, "bandwidth_bytes_per_s"),
    ({"latency_s": -1.0}, "latency_s"),
])
def test_shared_tier_validation(kwargs, field):
    base = {"capacity_tokens": 100, "bytes_per_token": 1, "bandwidth_bytes_per_s": 1.0}
    with pytest.raises(ValueError, match=field):
        SharedKVTier(**{**base, **kwargs})


def test_concurrent_record_and_match_stay_consistent():
    idx = PrefixIndex(block_tokens=16, default_capacity_tokens=16 * 50)

    def worker(k):
        for i in range(300):
            idx.record(f"e{k}", chain(20, start=(i % 7) * 1000))
            idx.match(chain(20, start=(i % 7) * 1000))

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stats = idx.stats()
    assert stats["cached_blocks"] == 4 * 50
    # every owner bit corresponds to a block its endpoint really holds
    assert sum(bin(m).count("1") for m in idx._owners.values()) == stats["cached_blocks"]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.floats(0, 400)), min_size=1, max_size=12))
def test_blocks_expire_a_lifetime_after_their_last_touch(uses):
    """With ``block_ttl_s`` a prompt's blocks are held exactly while touched within the lifetime
    (as replay's ``PromptCache``), whatever the order of prompts; expired blocks are dropped."""
    ttl, prompts = 300.0, [block_hashes_from_ids([1, 2, 3][: k + 1]) for k in range(3)]
    idx, now, last = PrefixIndex(block_tokens=1, block_ttl_s=ttl), 0.0, {}
    for which, gap in uses:
        now += gap
        if which < 3:
            idx.record("api", prompts[which], now=now)
            for h in prompts[which]:
                last[h] = now
        held = [h for h in prompts[2] if h in last and last[h] >= now - ttl]
        expected = next((i for i, h in enumerate(prompts[2]) if h not in held), len(prompts[2]))
        assert idx.match(prompts[2], now=now).get("api", 0) == expected
        assert idx.cached_blocks("api") == len(held)
    assert PrefixIndex(block_tokens=1).match(prompts[2], now=1e9) == {}  # nothing recorded: no credit


def test_block_hashes_reuse_gives_the_same_hashes_for_a_conversations_turns():
    """A long conversation and its next turn, hashed with and without reuse (the engine's path), under a session
    key and without: the same hashes; the next turn's first blocks are the first turn's."""
    from pointsman.policy.signals.prefix_index import block_hashes_from_text
    from pointsman.session_texts import MIN_BYTES

    turn1 = ("user\n" + "é lorem ipsum 😀 " * 4000 + "\n").encode()
    turn2 = turn1 + ("assistant\nan answer\nuser\n" + "more " * 300 + "\n").encode()
    assert len(turn1) > MIN_BYTES
    for key in (None, ("k", "t", "s")):
        first = block_hashes_from_text(turn1, reuse=True, key=key)
        assert first == block_hashes_from_text(turn1)
        second = block_hashes_from_text(turn2, reuse=True, key=key)
        assert second == block_hashes_from_text(turn2)
        assert second[:len(first)] == first


@settings(max_examples=200, deadline=None)
@given(engine_tokens=st.integers(16, 4000), held_share=st.floats(0, 1), prompt_tokens=st.integers(1, 8000))
def test_an_engines_blocks_count_as_their_share_of_the_prompt(engine_tokens, held_share, prompt_tokens):
    """Blocks an engine reports for a prompt of ``engine_tokens`` of its tokens count as that share of the
    prompt, whatever the tokenizer ``prompt_tokens`` was counted with (to within a token): before, 16 tokens
    each against ``prompt_tokens``, so a prompt the estimator counts 20% above the engine read 20% less cached."""
    keys = block_hashes_from_tokens(list(range(engine_tokens)), block_tokens=16)
    held = int(held_share * len(keys))
    index = PrefixIndex(block_tokens=16)
    index.record("e", keys[:held])
    local, _ = index.lookup(keys, prompt_tokens=prompt_tokens, hashed_tokens=engine_tokens).hit("e")
    assert abs(local - held * 16 / engine_tokens * prompt_tokens) <= 1
