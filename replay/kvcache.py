"""KV-cache accounting with prefix caching: one ``PrefixCache`` per replica, plus a shared tier.

Model (vLLM's paged KV cache with automatic prefix caching, at two granularities):

- A replica has ``capacity_blocks`` **pages**, the allocation unit (vLLM's ``block_size``,
  16 tokens on CUDA). Prefix caching works on **hashed blocks** of the trace's block size
  (512 tokens for Mooncake), each ``pages_per_block`` pages. With ``pages_per_block=1``
  (the default) the two are the same.
- A request holds its prompt's *full* hashed blocks (shared with every other request
  carrying the same hash) and *private* pages (the rest of its context: the prompt's last,
  partial block and the output). Only full blocks are cached, as in vLLM.
- ``acquire`` pins a request's blocks at once; ``grow`` adds blocks and pages as a request's
  computed context grows (chunked prefill, decode), possibly converting private pages into
  a hashed block that another request already holds (then the pages are freed: dedup).
  Leading hashes already resident are a **prefix hit**; blocks after the first miss that
  happen to be resident are pinned, not duplicated, but do not count as hit.
- ``release`` unpins; a hashed block whose pin count drops to 0 stays resident and
  becomes evictable. Evictable blocks are evicted least-recently-released first; a
  request's blocks are released tail first, so a prefix's tail goes before its head.
- ``used_blocks`` counts pinned pages only (resident-but-evictable blocks are free for
  allocation), which is what vLLM reports as KV-cache usage.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


class PrefixCache:
    """Per-replica KV pages with prefix caching and LRU eviction of unpinned hashed blocks.

    ``capacity_blocks``: total pages; ``pages_per_block``: pages per hashed block (trace
    block tokens / page tokens). Block hashes are ints (Mooncake ``hash_ids``). Counts
    named ``*_blocks`` below are pages unless they say hashed blocks. All methods are
    O(number of hashes passed) amortised.
    """

    __slots__ = ("capacity_blocks", "pages_per_block", "_pins", "_evictable", "_private", "_pinned_hashed")

    def __init__(self, capacity_blocks: int, pages_per_block: int = 1) -> None:
        if capacity_blocks < 1 or pages_per_block < 1:
            raise ValueError(f"capacity_blocks and pages_per_block must be >= 1, got {capacity_blocks}, "
                             f"{pages_per_block}")
        self.capacity_blocks = capacity_blocks
        self.pages_per_block = pages_per_block
        self._pins: dict[int, int] = {}  # resident hashed block -> pin count
        self._evictable: OrderedDict[int, None] = OrderedDict()  # resident, pin count 0, LRU first
        self._private = 0  # private pages allocated
        self._pinned_hashed = 0  # resident hashed blocks with pin count > 0

    @property
    def used_blocks(self) -> int:
        """Pages pinned by requests (hashed blocks with pin count > 0, plus private pages)."""
        return self._pinned_hashed * self.pages_per_block + self._private

    @property
    def resident_blocks(self) -> int:
        """Pages holding data: pinned plus cached-but-evictable."""
        return len(self._pins) * self.pages_per_block + self._private

    @property
    def cached_blocks(self) -> int:
        """Hashed blocks resident (pinned or evictable): what a KV-event index holds for this replica."""
        return len(self._pins)

    @property
    def usage(self) -> float:
        """Fraction 0-1 of capacity pinned by requests (vLLM's ``kv_cache_usage``)."""
        return self.used_blocks / self.capacity_blocks

    @property
    def free_blocks(self) -> int:
        """Pages a private allocation can get now: capacity - pinned pages (evictable blocks count as free)."""
        return self.capacity_blocks - self.used_blocks

    def cached_prefix_blocks(self, hashes: Sequence[int]) -> int:
        """Number of leading ``hashes`` resident on this replica (no state change)."""
        pins = self._pins
        n = 0
        for h in hashes:
            if h not in pins:
                break
            n += 1
        return n

    def contains(self, block_hash: int) -> bool:
        """True if the block is resident (pinned or evictable)."""
        return block_hash in self._pins

    def _room(self, hashes: Sequence[int], private_blocks: int) -> tuple[int, int] | None:
        """(pages to evict, hashed blocks missing) for pinning ``hashes`` plus ``private_blocks``
        pages (may be negative), or None when it cannot fit even after evicting every other
        unpinned block."""
        pins = self._pins
        ppb = self.pages_per_block
        missing = len({h for h in hashes if h not in pins}) if hashes else 0
        need = missing * ppb + private_blocks
        free = self.capacity_blocks - len(pins) * ppb - self._private
        if need <= free:
            return 0, missing
        # evictable blocks this request is about to pin cannot make room for it
        own = sum(1 for h in set(hashes) if pins.get(h) == 0)
        if need > free + (len(self._evictable) - own) * ppb:
            return None
        return need - free, missing

    def can_grow(self, hashes: Sequence[int], private_blocks: int) -> bool:
        """True when ``grow(hashes, private_blocks)`` would succeed (no state change)."""
        return self._room(hashes, private_blocks) is not None

    def grow(self, hashes: Sequence[int], private_blocks: int) -> bool:
        """Pin ``hashes`` (each once more) and add ``private_blocks`` private pages (a negative
        number frees pages: private pages that became a hashed block); evict LRU unpinned
        blocks as needed. Returns False with no state change when it cannot fit."""
        room = self._room(hashes, private_blocks)
        if room is None:
            return False
        evict, _ = room
        pins = self._pins
        evictable = self._evictable
        new: list[int] = []
        for h in hashes:
            count = pins.get(h)
            if count is None:
                new.append(h)
                continue
            if count == 0:
                del evictable[h]
                self._pinned_hashed += 1
            pins[h] = count + 1
        ppb = self.pages_per_block
        for _ in range(-(-evict // ppb)):  # evict LRU unpinned blocks to make room
            victim, _ = evictable.popitem(last=False)
            del pins[victim]
        for h in new:
            count = pins.get(h)
            if count is None:
                pins[h] = 1
                self._pinned_hashed += 1
            else:  # the same hash twice in one request
                pins[h] = count + 1
        self._private += private_blocks
        return True

    def acquire(self, hashes: Sequence[int], private_blocks: int) -> int | None:
        """Pin ``hashes`` and allocate ``private_blocks`` pages; evict LRU unpinned blocks as needed.

        Returns the number of leading hashes that were resident (the prefix hit, in
        hashed blocks), or ``None`` with no state change when the blocks cannot fit even
        after evicting every unpinned block.
        """
        hit = self.cached_prefix_blocks(hashes)
        return hit if self.grow(hashes, private_blocks) else None

    def release(self, hashes: Sequence[int], private_blocks: int) -> None:
        """Unpin ``hashes`` (tail first) and free ``private_blocks`` pages; hashed blocks stay cached.

        Raises ValueError if a hash is not pinned or more private pages are freed than
        allocated (a simulator bug, never silent).
        """
        pins = self._pins
        evictable = self._evictable
        for h in reversed(hashes):
            count = pins.get(h, 0)
            if count <= 0:
                raise ValueError(f"release of block {h} that is not pinned")
            if count == 1:
                pins[h] = 0
                evictable[h] = None
                self._pinned_hashed -= 1
            else:
                pins[h] = count - 1
        if private_blocks > self._private:
            raise ValueError(f"release of {private_blocks} private blocks, only {self._private} allocated")
        self._private -= private_blocks


class SharedKVStore:
    """The shared KV tier's content: an LRU set of block hashes bounded by ``capacity_blocks``.

    ``put`` writes a prompt's blocks through (refreshing their recency);
    ``prefix_blocks(hashes, start)`` counts how many of ``hashes[start:]`` are present
    consecutively, i.e. how far a replica that holds the first ``start`` blocks could
    extend its prefix by restoring.
    """

    __slots__ = ("capacity_blocks", "_blocks")

    def __init__(self, capacity_blocks: int) -> None:
        if capacity_blocks < 1:
            raise ValueError(f"capacity_blocks must be >= 1, got {capacity_blocks}")
        self.capacity_blocks = capacity_blocks
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, block_hash: object) -> bool:
        """True when the tier holds ``block_hash`` (no recency change)."""
        return block_hash in self._blocks

    def put(self, hashes: Sequence[int]) -> None:
        """Insert or refresh ``hashes`` (head last, so a prefix's head is evicted last)."""
        blocks = self._blocks
        for h in reversed(hashes):
            if h in blocks:
                blocks.move_to_end(h)
            else:
                blocks[h] = None
        while len(blocks) > self.capacity_blocks:
            blocks.popitem(last=False)

    def prefix_blocks(self, hashes: Sequence[int], start: int = 0) -> int:
        """Count of consecutive ``hashes[start:]`` present in the store."""
        blocks = self._blocks
        n = 0
        for i in range(start, len(hashes)):
            if hashes[i] not in blocks:
                break
            n += 1
        return n


class PromptCache:
    """A frontier provider's prompt cache: block hashes kept while used at least every
    ``ttl_s`` seconds (OpenAI prompt caching: cleared after minutes of inactivity), no
    capacity bound. Times in seconds on the trace clock, non-decreasing across ``use``."""

    __slots__ = ("ttl_s", "_used")

    def __init__(self, ttl_s: float) -> None:
        if ttl_s < 0:
            raise ValueError(f"ttl_s must be >= 0, got {ttl_s}")
        self.ttl_s = ttl_s
        self._used: OrderedDict[int, float] = OrderedDict()  # block hash -> last use, oldest first

    def peek(self, hashes: Sequence[int], now: float) -> int:
        """Leading ``hashes`` cached at ``now`` (no state change)."""
        used, horizon, n = self._used, now - self.ttl_s, 0
        for h in hashes:
            t = used.get(h)
            if t is None or t < horizon:
                break
            n += 1
        return n

    def use(self, hashes: Sequence[int], now: float) -> int:
        """A prompt with ``hashes`` is sent at ``now``: returns its leading cached blocks, then
        drops expired blocks and marks all of ``hashes`` used at ``now``."""
        hit = self.peek(hashes, now)
        used, horizon = self._used, now - self.ttl_s
        while used:
            first = next(iter(used.values()))
            if first >= horizon:
                break
            used.popitem(last=False)
        for h in reversed(hashes):
            used[h] = now
            used.move_to_end(h)
        return hit
