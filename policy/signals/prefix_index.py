"""KV-cache locality: which endpoint probably holds a prompt's prefix in its KV cache.

**Block hashes.** A prompt is cut into fixed-size blocks; block *i*'s hash covers
block *i* and, through its parent, every block before it
(``h_i = xxh3_64(block_i, seed=h_{i-1})``), so two prompts share their
first *k* hashes exactly when they share their first *k* blocks. This is the
scheme of vLLM's automatic prefix caching (hash of the parent block's hash, the
block's tokens and extra keys; xxHash is one of its ``prefix_caching_hash_algo``
choices) and of Dynamo's KV router (per-block hashes chained into sequence hashes).
xxh3 seeded by the parent costs one call per block, about a tenth of a blake2b
state per block (``scripts/bench_signals.py``); the hashes only index Pointsman's
own estimate, never an engine's blocks (those are ``engine_hashes.py``'s).
Three sources, each with its own root so they never mix:

- ``block_hashes_from_tokens(token_ids)``: blocks of ``block_tokens`` token ids.
- ``block_hashes_from_text(text)``: when only the rendered conversation is known,
  blocks of ``block_tokens × CHARS_PER_TOKEN`` bytes of its UTF-8 (≈4 characters
  per token for English BPE, ``estimator.features.CHARS_PER_TOKEN``). The block
  boundaries are not the engine's, but the prefix property holds: two texts with a
  common prefix of *n* bytes share ⌊n / block bytes⌋ hashes, so the shared length
  is estimated to within one block.
- ``block_hashes_from_ids(hash_ids)``: block ids a gateway supplies (Mooncake
  traces' ``hash_ids``, 512 tokens per block), chained again so that ids which are
  per-block content hashes also become prefix-aware.

Only full blocks are hashed (as in vLLM); a 100k-token conversation costs about
0.7–1.3 ms as text (``scripts/bench_signals.py``). The engine hashes with ``reuse``
(``session_texts``): a conversation's next turn reuses the hashes of the blocks it shares with the
session's last text (checked byte for byte), so a long conversation's turns cost their new blocks.

**The index.** ``PrefixIndex`` keeps, per endpoint, an approximate set of cached
block hashes bounded by the endpoint's KV capacity in blocks, evicting least
recently used blocks (a prompt's blocks are touched tail first, so its tail is
evicted before its head, as vLLM frees blocks). It is updated at dispatch
(``record``) rather than from engine KV events as Dynamo's indexer is, so it is an
estimate: what the engine evicted under memory pressure we only learn by capacity.
With ``block_ttl_s`` (a frontier provider's prompt cache, which clears a prefix unused for
5-10 minutes) a block also expires that long after its last touch: each block keeps its
last-touch time, the LRU order is the touch order, so expired blocks sit at the old end and
are dropped lazily before each query (amortised O(1) per recorded block). Records arriving
out of order (another replica's, by the sync's clock skew) can keep a block up to that skew longer.
``match(block_hashes)`` walks the chain from the first block over a global map
``block hash → bitmask of endpoints`` (the flattened form of Dynamo's radix-tree
indexer), intersecting masks until no endpoint is left; each endpoint's score is
the number of leading blocks it holds. Cost is one dict lookup and one big-int AND
per block, independent of the number of endpoints.

**Sessions.** ``session_id → last endpoint`` with a TTL (affinity for multi-turn chats
and agents).

**Shared KV tier.** Optional (``SharedKVTier``): prefixes offloaded to shared storage
(LMCache-style CPU/disk/remote store, or a vendor's KV accelerator) can be restored
on any endpoint at ``restore_s(tokens)`` instead of being recomputed;
``hit_tokens`` returns per candidate ``(local_hit_tokens, shared_hit_tokens)`` so a
picker can weigh restore time against recompute time (``tokens / prefill_tokens_per_s``).

All ``PrefixIndex`` methods are thread-safe (one lock).
"""

from __future__ import annotations

import array
import functools
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from xxhash import xxh3_64_intdigest

from pointsman.estimator.features import CHARS_PER_TOKEN
from pointsman.session_texts import SESSION_TEXTS

#: Default block size of the index, in tokens (coarser than engines' 16-token blocks to
#: bound memory and cost; the hit estimate is low by less than one block).
BLOCK_TOKENS = 128
#: Block size of Mooncake traces' ``hash_ids``, in tokens.
MOONCAKE_BLOCK_TOKENS = 512
#: KV capacity assumed for an endpoint whose capacity was never set, tokens.
DEFAULT_CAPACITY_TOKENS = 500_000
#: Session affinity lifetime after the last request of a session, seconds.
SESSION_TTL_S = 900.0
#: Most sessions remembered (least recently used dropped first).
MAX_SESSIONS = 200_000

def _owner(names: list[str | None], position: int) -> str:
    """The endpoint at bit ``position`` (a set bit always has one: freed positions are cleared first)."""
    name = names[position]
    assert name is not None, f"bit {position} is set but no endpoint holds it"
    return name


@functools.lru_cache(maxsize=64)
def _root(kind: bytes, salt: bytes) -> int:
    """The chain's root (the first block's parent) for ``kind`` and ``salt``, a 64-bit int (computed once each)."""
    return xxh3_64_intdigest(b"pointsman/prefix/v2/" + kind + b"/" + salt)


def _chain(data: bytes, block_bytes: int, root: int, start: int = 0, parent_hash: int | None = None) -> list[int]:
    """The chained hashes of ``data``'s full blocks from block ``start`` on (``parent_hash``: block ``start - 1``'s
    hash; None: ``root`` is the first block's parent): each block's xxh3_64 seeded with its parent's hash, read
    through a view of the block (no copies of the data)."""
    parent = root if parent_hash is None else parent_hash
    view = memoryview(data)
    out: list[int] = []
    append = out.append
    for i in range(start * block_bytes, len(data) - block_bytes + 1, block_bytes):
        parent = xxh3_64_intdigest(view[i:i + block_bytes], parent)
        append(parent)
    return out


#: Bytes of text per block ``block_hashes_from_text`` hashes by default.
TEXT_BLOCK_BYTES = max(1, int(round(BLOCK_TOKENS * CHARS_PER_TOKEN)))


def block_hashes_from_text(text: str | bytes, block_tokens: int = BLOCK_TOKENS, *,
                           chars_per_token: float = CHARS_PER_TOKEN, salt: bytes = b"",
                           reuse: bool = False, key: object = None) -> list[int]:
    """Chained 64-bit hashes of the full ``block_tokens × chars_per_token``-byte blocks of
    ``text``'s UTF-8 (``text`` may be given encoded already; see the module docstring for the
    approximation). ``salt`` separates caches that must not match (a request's vLLM ``cache_salt``; a LoRA
    adapter's, per target: ``namespaced``). ``reuse``: hash only past what the text kept under ``key`` (None: the
    same first KiB) has in common with this one (``session_texts.SESSION_TEXTS``); the same hashes either way."""
    block_bytes = max(1, int(round(block_tokens * chars_per_token)))
    data = text if isinstance(text, bytes) else text.encode("utf-8")
    if reuse:
        return SESSION_TEXTS.hashes(data, key, block_bytes, _root(b"text", salt), _chain)
    return _chain(data, block_bytes, _root(b"text", salt))


def block_hashes_from_tokens(token_ids: Sequence[int], block_tokens: int = BLOCK_TOKENS, *,
                             salt: bytes = b"") -> list[int]:
    """Chained 64-bit hashes of the full ``block_tokens``-token blocks of ``token_ids``
    (ids in 0..2**32-1; raises OverflowError otherwise)."""
    data = array.array("I")
    data.fromlist(token_ids if isinstance(token_ids, list) else list(token_ids))
    return _chain(data.tobytes(), block_tokens * data.itemsize, _root(b"tokens", salt))


def block_hashes_from_ids(hash_ids: Iterable[int | str], *, salt: bytes = b"") -> list[int]:
    """Chained 64-bit hashes of gateway-supplied block ids (ints or strings, oldest block
    first; Mooncake's ``hash_ids``). ``1`` and ``"1"`` are different ids."""
    parent, out = _root(b"ids", salt), []
    for h in hash_ids:
        if isinstance(h, bool) or not isinstance(h, (int, str)):
            raise TypeError(f"block ids must be int or str, got {type(h).__name__} {h!r}")
        tag = b"i" if isinstance(h, int) else b"s"
        parent = xxh3_64_intdigest(tag + str(h).encode("utf-8"), parent)
        out.append(parent)
    return out


def namespaced(hashes: Sequence[int], namespace: str) -> list[int]:
    """``hashes`` (a chain of any ``block_hashes_*``, 64-bit ints) re-keyed into ``namespace`` (a LoRA adapter's
    name): each hash becomes the xxh3_64 of its 8 bytes seeded by the namespace's root, so two chains still share
    their first *k* keys exactly when they share their first *k* blocks within one namespace, and no key of one
    namespace is another's, or an un-namespaced one (up to 64-bit collisions). One short xxh3 call a block: ~0.3 us,
    250 us for a 100k-token text's 791 blocks (one core, loaded machine), against ~600 us to hash the text again."""
    seed = _root(b"namespace", namespace.encode("utf-8"))
    return [xxh3_64_intdigest(h.to_bytes(8, "little"), seed) for h in hashes]


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, dtype_bytes: int = 2) -> int:
    """KV-cache bytes one token occupies: 2 (K and V) × layers × KV heads × head dim × bytes
    per element. E.g. Llama-3-70B (80 layers, 8 KV heads, dim 128, bf16) → 327,680 B."""
    return 2 * layers * kv_heads * head_dim * dtype_bytes


@dataclass(frozen=True)
class SharedKVTier:
    """A shared KV store reachable from every endpoint (LMCache-style offload).

    ``capacity_tokens``: tokens of KV it holds; ``bytes_per_token``: KV bytes per
    token (``kv_bytes_per_token``); ``bandwidth_bytes_per_s``: restore bandwidth into
    one endpoint; ``latency_s``: fixed cost per restore; ``write_through``: every
    recorded prompt's blocks are also stored here (LMCache's default of storing each
    prefill's KV). Raises ValueError naming a bad field.
    """

    capacity_tokens: int
    bytes_per_token: int
    bandwidth_bytes_per_s: float
    latency_s: float = 0.0
    write_through: bool = True

    def __post_init__(self) -> None:
        for name in ("capacity_tokens", "bytes_per_token", "bandwidth_bytes_per_s"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name}: must be a finite number > 0, got {value!r}")
        if not (math.isfinite(self.latency_s) and self.latency_s >= 0):
            raise ValueError(f"latency_s: must be >= 0, got {self.latency_s!r}")

    def restore_s(self, tokens: int) -> float:
        """Seconds to restore ``tokens`` tokens of KV onto an endpoint: latency + bytes / bandwidth
        (0 for 0 tokens)."""
        if tokens <= 0:
            return 0.0
        return self.latency_s + tokens * self.bytes_per_token / self.bandwidth_bytes_per_s


@dataclass(frozen=True)
class PrefixLookup:
    """One prompt's prefix matched against the index once (``PrefixIndex.lookup``), read per
    endpoint in O(1): ``matched`` (endpoint -> leading blocks held; only endpoints holding
    the first block), ``shared_runs`` (``shared_runs[i]``: consecutive blocks from block
    ``i`` on that the shared tier holds; None without one or when empty),
    ``block_tokens`` (this prompt's tokens per block: the index's block size, or for text blocks the
    prompt's own tokens per block of its bytes, ``PrefixIndex.lookup``), ``total_tokens`` (the prompt's
    tokens, the cap of every hit). Hits are whole tokens, rounded down."""

    matched: dict[str, int]
    shared_runs: list[int] | None
    block_tokens: float
    total_tokens: int

    def hit(self, endpoint: str) -> tuple[int, int]:
        """``(local_hit_tokens, shared_hit_tokens)`` on ``endpoint``, as ``PrefixIndex.hit_tokens``."""
        m = self.matched.get(endpoint, 0)
        local = min(int(m * self.block_tokens), self.total_tokens)
        runs = self.shared_runs
        if runs is None:
            return local, 0
        return local, min(int(runs[m] * self.block_tokens), self.total_tokens - local)

    def best(self, endpoints: Iterable[str]) -> tuple[str | None, int]:
        """The endpoint among ``endpoints`` holding the longest prefix and its local hit tokens
        ((None, 0) when none holds any); O(endpoints holding the first block)."""
        wanted = endpoints if isinstance(endpoints, (set, frozenset, dict)) else set(endpoints)
        best, blocks = None, 0
        for e, m in self.matched.items():
            if m > blocks and e in wanted:
                best, blocks = e, m
        return best, min(int(blocks * self.block_tokens), self.total_tokens)


class _Endpoint:
    __slots__ = ("bit", "capacity_blocks", "blocks")

    def __init__(self, bit: int, capacity_blocks: int) -> None:
        self.bit = bit
        self.capacity_blocks = capacity_blocks
        self.blocks: OrderedDict[int, float] = OrderedDict()  # block -> last touch (monotonic s), LRU first


def _bits(mask: int) -> Iterable[int]:
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


class PrefixIndex:
    """Approximate per-endpoint prefix caches, session affinity and an optional shared tier.

    ``block_tokens``: tokens per block (must match the hashes' block size);
    ``default_capacity_tokens``: KV capacity of an endpoint until ``set_capacity``;
    ``session_ttl_s`` / ``max_sessions``: session affinity bounds; ``shared``: the
    shared KV tier, if the fleet has one; ``block_ttl_s``: a block not touched for this long is
    no longer held (None: only capacity evicts; a frontier provider's prompt-cache lifetime).
    Times are monotonic seconds (``now`` arguments; default ``time.monotonic()``).
    """

    def __init__(self, *, block_tokens: int = BLOCK_TOKENS, default_capacity_tokens: int = DEFAULT_CAPACITY_TOKENS,
                 session_ttl_s: float = SESSION_TTL_S, max_sessions: int = MAX_SESSIONS,
                 shared: SharedKVTier | None = None, block_ttl_s: float | None = None) -> None:
        if block_tokens < 1:
            raise ValueError(f"block_tokens: must be >= 1, got {block_tokens}")
        if default_capacity_tokens < block_tokens:
            raise ValueError(f"default_capacity_tokens: must hold at least one block ({block_tokens} tokens)")
        if not session_ttl_s > 0 or max_sessions < 1:
            raise ValueError("session_ttl_s and max_sessions must be > 0")
        if block_ttl_s is not None and not (math.isfinite(block_ttl_s) and block_ttl_s >= 0):
            raise ValueError(f"block_ttl_s: must be a finite number >= 0, got {block_ttl_s!r}")
        self.block_ttl_s = block_ttl_s
        self.block_tokens = block_tokens
        self.default_capacity_tokens = default_capacity_tokens
        self.session_ttl_s = float(session_ttl_s)
        self.max_sessions = max_sessions
        self.shared = shared
        self._lock = threading.Lock()
        self._endpoints: dict[str, _Endpoint] = {}
        self._names: list[str | None] = []  # bit position -> endpoint
        self._free_bits: list[int] = []
        self._owners: dict[int, int] = {}  # block hash -> bitmask of endpoints holding it
        self._sessions: OrderedDict[str, tuple[str, float]] = OrderedDict()  # id -> (endpoint, expires_at)
        self._shared_blocks: OrderedDict[int, None] = OrderedDict()
        self._shared_capacity_blocks = (max(1, shared.capacity_tokens // block_tokens) if shared else 0)

    # -- endpoints and capacity

    def set_capacity(self, endpoint: str, capacity_tokens: int) -> None:
        """Bound ``endpoint``'s cached blocks by its KV capacity (tokens; e.g. the fleet's
        ``kv_cache_capacity_tokens`` or the scraped one); evicts LRU blocks if now over."""
        if capacity_tokens < self.block_tokens:
            raise ValueError(f"capacity_tokens: must hold at least one block ({self.block_tokens} tokens)")
        with self._lock:
            ep = self._endpoint(endpoint)
            ep.capacity_blocks = capacity_tokens // self.block_tokens
            self._evict(ep)

    def endpoint_names(self) -> list[str]:
        """Endpoints the index holds state for."""
        with self._lock:
            return list(self._endpoints)

    def capacities(self) -> dict[str, int]:
        """``{endpoint: KV capacity in tokens}`` as set (``set_capacity``) or defaulted."""
        with self._lock:
            return {name: ep.capacity_blocks * self.block_tokens for name, ep in self._endpoints.items()}

    def remove(self, endpoint: str, block_hashes: Iterable[int]) -> int:
        """``endpoint`` no longer holds these blocks (an engine's ``BlockRemoved``); returns how
        many it held. Unknown endpoints and blocks are ignored."""
        with self._lock:
            ep = self._endpoints.get(endpoint)
            if ep is None:
                return 0
            owners, clear, n = self._owners, ~ep.bit, 0
            for h in block_hashes:
                if ep.blocks.pop(h, None) is not None:
                    n += 1
                    mask = owners.get(h, 0) & clear
                    if mask:
                        owners[h] = mask
                    else:
                        owners.pop(h, None)
            return n

    def clear(self, endpoint: str) -> int:
        """``endpoint`` holds nothing any more (an engine's ``AllBlocksCleared``, a restart, or a
        gap in its event stream); keeps its capacity and sessions. Returns the blocks dropped."""
        with self._lock:
            ep = self._endpoints.get(endpoint)
            blocks = list(ep.blocks) if ep is not None else []
        return self.remove(endpoint, blocks)

    def remove_endpoint(self, endpoint: str) -> None:
        """Forget ``endpoint`` (left the fleet, or restarted with an empty cache) and its sessions."""
        with self._lock:
            ep = self._endpoints.pop(endpoint, None)
            if ep is None:
                return
            owners, clear = self._owners, ~ep.bit
            for h in ep.blocks:
                mask = owners[h] & clear
                if mask:
                    owners[h] = mask
                else:
                    del owners[h]
            position = ep.bit.bit_length() - 1
            self._names[position] = None
            self._free_bits.append(position)
            for sid in [s for s, (e, _) in self._sessions.items() if e == endpoint]:
                del self._sessions[sid]

    def cached_blocks(self, endpoint: str) -> int:
        """Blocks the index believes ``endpoint`` holds."""
        with self._lock:
            ep = self._endpoints.get(endpoint)
            return 0 if ep is None else len(ep.blocks)

    # -- updates

    def record(self, endpoint: str, block_hashes: Sequence[int], *, session_id: str | None = None,
               now: float | None = None) -> None:
        """A request with these block hashes was dispatched to ``endpoint``: after its prefill
        the endpoint holds them. Touches them (tail first), evicts LRU blocks beyond capacity,
        writes them through to the shared tier if configured, and sets session affinity.
        ``now``: monotonic seconds of the dispatch (the blocks' touch time)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            ep = self._endpoint(endpoint)
            bit, blocks, owners, timed = ep.bit, ep.blocks, self._owners, self.block_ttl_s is not None
            for h in reversed(block_hashes):
                if h in blocks:
                    blocks.move_to_end(h)
                    if timed:  # without a lifetime the touch time is never read: skip the store
                        blocks[h] = now
                else:
                    blocks[h] = now
                    owners[h] = owners.get(h, 0) | bit
            self._evict(ep)
            if self.shared is not None and self.shared.write_through:
                self._offload(block_hashes)
            if session_id:
                self._touch_session(session_id, endpoint, now)

    def offload(self, block_hashes: Sequence[int]) -> None:
        """Store these blocks in the shared tier (e.g. an idle agent session's KV); no-op without one."""
        with self._lock:
            if self.shared is not None:
                self._offload(block_hashes)

    def set_shared(self, shared: SharedKVTier | None) -> None:
        """Use ``shared`` as the shared tier from now on (a fleet reload): its blocks are kept up to the new
        capacity (least recently stored dropped first), all of them without one."""
        with self._lock:
            self.shared = shared
            self._shared_capacity_blocks = max(1, shared.capacity_tokens // self.block_tokens) if shared else 0
            blocks = self._shared_blocks
            while len(blocks) > self._shared_capacity_blocks:
                blocks.popitem(last=False)

    def remove_shared(self, block_hashes: Iterable[int]) -> None:
        """The shared tier no longer holds these blocks (an engine's ``BlockRemoved`` on that medium)."""
        with self._lock:
            for h in block_hashes:
                self._shared_blocks.pop(h, None)

    # -- queries

    def match(self, block_hashes: Sequence[int], *, now: float | None = None) -> dict[str, int]:
        """Endpoint -> number of leading ``block_hashes`` it holds at ``now`` (monotonic s), for
        endpoints holding at least the first block (others: 0, absent). O(blocks matched), one lock."""
        with self._lock:
            self._expire(now)
            return self._match(block_hashes)

    def hit_ratios(self, block_hashes: Sequence[int], endpoints: Iterable[str], *,
                   prompt_tokens: int | None = None, now: float | None = None) -> dict[str, float]:
        """``prefix_hit_ratio`` (0–1) per endpoint in ``endpoints``: matched blocks × block_tokens
        ÷ ``prompt_tokens`` (capped at 1), or matched ÷ number of blocks when
        ``prompt_tokens`` is None. 0 for a prompt without a full block."""
        matched = self.match(block_hashes, now=now)
        if prompt_tokens is not None:
            denominator = float(prompt_tokens) / self.block_tokens
        else:
            denominator = float(len(block_hashes))
        if denominator <= 0:
            return {e: 0.0 for e in endpoints}
        return {e: min(1.0, matched.get(e, 0) / denominator) for e in endpoints}

    def lookup(self, block_hashes: Sequence[int], *, prompt_tokens: int | None = None,
               text_bytes: int | None = None, hashed_tokens: int | None = None,
               now: float | None = None) -> PrefixLookup:
        """Match ``block_hashes`` once (one lock) for reading many endpoints' hits
        (``PrefixLookup.hit``, ``best``); ``prompt_tokens`` caps every hit (default: all
        hashed blocks). ``text_bytes``: the blocks are ``block_hashes_from_text``'s of a text of this
        many UTF-8 bytes, so a block counts ``prompt_tokens x block bytes / text_bytes`` tokens (the
        prompt's own density), not ``block_tokens``: hits are the matched share of the prompt's text,
        and the text after the matched blocks (a follow-up's new turn) is uncached. ``hashed_tokens``: the
        blocks are an engine's, of a prompt of this many of its tokens (all hashed), so a block counts
        ``prompt_tokens x block_tokens / hashed_tokens`` tokens: hits are the share of the prompt the engine
        holds in its own tokens, whatever the tokenizer ``prompt_tokens`` was counted with. ``now``: monotonic
        seconds of the query (blocks older than ``block_ttl_s`` then are not held)."""
        bt: float = self.block_tokens
        if text_bytes and prompt_tokens is not None:
            bt = prompt_tokens * max(1, int(round(self.block_tokens * CHARS_PER_TOKEN))) / text_bytes
        elif hashed_tokens and prompt_tokens is not None:
            bt = prompt_tokens * self.block_tokens / hashed_tokens
        total = int(len(block_hashes) * bt) if prompt_tokens is None else int(prompt_tokens)
        with self._lock:
            self._expire(now)
            matched = self._match(block_hashes)
            runs: list[int] | None = None
            if self.shared is not None and self._shared_blocks:
                # runs[i]: consecutive blocks from i on held by the shared tier (one pass, from the end)
                shared = self._shared_blocks
                runs = [0] * (len(block_hashes) + 1)
                for i in range(len(block_hashes) - 1, -1, -1):
                    if block_hashes[i] in shared:
                        runs[i] = runs[i + 1] + 1
        return PrefixLookup(matched, runs, bt, total)

    def hit_tokens(self, block_hashes: Sequence[int], endpoints: Iterable[str], *,
                   prompt_tokens: int | None = None, now: float | None = None) -> dict[str, tuple[int, int]]:
        """Per endpoint, ``(local_hit_tokens, shared_hit_tokens)``: tokens of the prompt's prefix
        in the endpoint's KV cache, and tokens right after them that the shared tier holds
        (restorable at ``shared.restore_s``; 0 without a shared tier). Both capped so their
        sum is at most ``prompt_tokens`` (default: all hashed blocks)."""
        found = self.lookup(block_hashes, prompt_tokens=prompt_tokens, now=now)
        return {e: found.hit(e) for e in endpoints}

    # -- sessions

    def touch_session(self, session_id: str, endpoint: str, now: float | None = None) -> None:
        """Remember that ``session_id``'s last request went to ``endpoint`` (renews the TTL)."""
        with self._lock:
            self._touch_session(session_id, endpoint, time.monotonic() if now is None else now)

    def session_endpoint(self, session_id: str, now: float | None = None) -> str | None:
        """The endpoint of ``session_id``'s last request, or None if unknown or older than the TTL."""
        now = time.monotonic() if now is None else now
        with self._lock:
            self._expire_sessions(now)
            entry = self._sessions.get(session_id)
            return None if entry is None else entry[0]

    def stats(self) -> dict[str, int]:
        """Sizes: endpoints, distinct blocks, cached blocks summed over endpoints, sessions, shared blocks."""
        with self._lock:
            return {"endpoints": len(self._endpoints), "distinct_blocks": len(self._owners),
                    "cached_blocks": sum(len(e.blocks) for e in self._endpoints.values()),
                    "sessions": len(self._sessions), "shared_blocks": len(self._shared_blocks)}

    # -- internals (lock held)

    def _endpoint(self, name: str) -> _Endpoint:
        ep = self._endpoints.get(name)
        if ep is None:
            if self._free_bits:
                position = self._free_bits.pop()
                self._names[position] = name
            else:
                position = len(self._names)
                self._names.append(name)
            ep = self._endpoints[name] = _Endpoint(1 << position, self.default_capacity_tokens // self.block_tokens)
        return ep

    def _expire(self, now: float | None) -> None:
        """Drop blocks last touched more than ``block_ttl_s`` before ``now`` (no-op without a TTL)."""
        ttl = self.block_ttl_s
        if ttl is None:
            return
        cutoff = (time.monotonic() if now is None else now) - ttl
        owners = self._owners
        for ep in self._endpoints.values():
            blocks, clear = ep.blocks, ~ep.bit
            while blocks:
                victim, touched = next(iter(blocks.items()))
                if touched >= cutoff:  # held while used within the lifetime, as replay's PromptCache
                    break
                del blocks[victim]
                mask = owners[victim] & clear
                if mask:
                    owners[victim] = mask
                else:
                    del owners[victim]

    def _evict(self, ep: _Endpoint) -> None:
        blocks, owners, clear = ep.blocks, self._owners, ~ep.bit
        while len(blocks) > ep.capacity_blocks:
            victim, _ = blocks.popitem(last=False)
            mask = owners[victim] & clear
            if mask:
                owners[victim] = mask
            else:
                del owners[victim]

    def _match(self, block_hashes: Sequence[int]) -> dict[str, int]:
        if not block_hashes:
            return {}
        owners = self._owners
        active = owners.get(block_hashes[0], 0)
        if not active:
            return {}
        names = self._names
        out: dict[str, int] = {}
        depth = 1
        for h in block_hashes[1:]:
            still = active & owners.get(h, 0)
            if still != active:
                for position in _bits(active ^ still):
                    out[_owner(names, position)] = depth
                active = still
                if not active:
                    return out
            depth += 1
        for position in _bits(active):
            out[_owner(names, position)] = depth
        return out

    def _offload(self, block_hashes: Sequence[int]) -> None:
        blocks = self._shared_blocks
        for h in reversed(block_hashes):  # head last: evicted last
            if h in blocks:
                blocks.move_to_end(h)
            else:
                blocks[h] = None
        while len(blocks) > self._shared_capacity_blocks:
            blocks.popitem(last=False)

    def _touch_session(self, session_id: str, endpoint: str, now: float) -> None:
        sessions = self._sessions
        sessions[session_id] = (endpoint, now + self.session_ttl_s)
        sessions.move_to_end(session_id)
        self._expire_sessions(now)
        while len(sessions) > self.max_sessions:
            sessions.popitem(last=False)

    def _expire_sessions(self, now: float) -> None:
        sessions = self._sessions
        while sessions:
            _, (_, expires_at) = next(iter(sessions.items()))
            if expires_at > now:
                break
            sessions.popitem(last=False)
