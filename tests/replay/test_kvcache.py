"""PrefixCache and SharedKVStore: hits, pins, LRU order, capacity."""

from __future__ import annotations

import pytest

from pointsman.replay.kvcache import PrefixCache, SharedKVStore


def test_prefix_hit_counts_leading_blocks_only() -> None:
    c = PrefixCache(10)
    assert c.acquire((1, 2, 3), 1) == 0
    assert c.used_blocks == 4 and c.usage == pytest.approx(0.4)
    c.release((1, 2, 3), 1)
    assert c.used_blocks == 0 and c.resident_blocks == 3
    assert c.cached_prefix_blocks((1, 2, 9, 3)) == 2
    assert c.cached_prefix_blocks((9, 1, 2)) == 0
    # the hit stops at the first miss even though block 3 is resident
    assert c.acquire((1, 2, 9, 3), 0) == 2
    assert c.resident_blocks == 4


def test_pinned_blocks_are_never_evicted() -> None:
    c = PrefixCache(4)
    assert c.acquire((1, 2), 1) == 0  # 3 pinned
    assert c.acquire((5, 6), 0) is None  # would need 2, only 1 free, nothing evictable
    assert c.resident_blocks == 3  # refused without side effects
    assert c.acquire((5,), 0) == 0
    assert c.used_blocks == 4


def test_lru_evicts_least_recently_released_tail_first() -> None:
    c = PrefixCache(4)
    c.acquire((1, 2), 0)
    c.acquire((3, 4), 0)
    c.release((3, 4), 0)  # evictable order: 4, 3
    c.release((1, 2), 0)  # then 2, 1
    assert c.acquire((7,), 0) == 0  # evicts 4
    assert c.cached_prefix_blocks((3, 4)) == 1
    assert c.acquire((8, 9), 0) == 0  # evicts 3, then 2
    assert c.cached_prefix_blocks((1, 2)) == 1 and c.cached_prefix_blocks((3,)) == 0


def test_shared_blocks_are_pinned_once_per_user() -> None:
    c = PrefixCache(5)
    assert c.acquire((1, 2), 0) == 0
    assert c.acquire((1, 2, 3), 1) == 2  # shares 1 and 2
    assert c.used_blocks == 4
    c.release((1, 2), 0)
    assert c.used_blocks == 4  # still pinned by the second request
    c.release((1, 2, 3), 1)
    assert c.used_blocks == 0
    with pytest.raises(ValueError, match="not pinned"):
        c.release((1,), 0)


def test_own_evictable_blocks_do_not_count_as_room() -> None:
    c = PrefixCache(3)
    c.acquire((1, 2, 3), 0)
    c.release((1, 2, 3), 0)
    # re-using 1, 2, 3 and adding a private block needs 4 > 3: must refuse, not evict its own prefix
    assert c.acquire((1, 2, 3), 1) is None
    assert c.acquire((1, 2), 1) == 2  # evicts 3 only
    assert c.cached_prefix_blocks((1, 2, 3)) == 2


def test_shared_store_prefix_and_capacity() -> None:
    s = SharedKVStore(3)
    s.put((1, 2, 3))
    assert s.prefix_blocks((1, 2, 3)) == 3 and s.prefix_blocks((1, 2, 3), start=1) == 2
    s.put((4,))  # evicts the tail of the older prefix first
    assert len(s) == 3 and s.prefix_blocks((1, 2, 3)) == 2


def test_prompt_cache_keeps_blocks_used_within_the_ttl() -> None:
    from pointsman.replay.kvcache import PromptCache

    c = PromptCache(ttl_s=10.0)
    assert c.use((1, 2, 3), now=0.0) == 0
    assert c.peek((1, 2, 9), now=5.0) == 2 and c.peek((2,), now=5.0) == 1
    assert c.use((1, 2), now=8.0) == 2  # refreshes 1 and 2, not 3
    assert c.peek((1, 2, 3), now=15.0) == 2  # block 3 last used at 0: expired
    assert c.use((1, 2, 3), now=30.0) == 0
