"""What a target's engines report holding in their KV caches, from their KV-cache events.

For a target whose fleet entry has ``kv_events`` (its tokenizer and hash settings) and whose
endpoints name their event sockets, ``EngineCache`` is the prefix index of record: a
``PrefixIndex`` keyed by the engines' own block hashes (``BlockStored`` adds an endpoint's
blocks, ``BlockRemoved`` removes them, ``AllBlocksCleared`` or a gap in the stream drops the
endpoint's entries), fed by ``kv_events.EventApplier`` (it is a ``kv_events.KVBlockSink``). A
request is matched against it through the same hashes, computed from its prompt's token ids
as the engine computes them (``engine_hashes``: the target's tokenizer and chat template,
vLLM's or SGLang's block hashing).

Media: ``BlockStored``/``BlockRemoved`` name the medium (``GPU`` from vLLM's block pool; its offloading
connector's tier, ``CPU`` for the built-in CPU offload), not whether that tier is the replica's own or shared
by the fleet: the fleet says (``kv_events.shared_media``). Blocks on a shared medium are the target's
``shared_kv`` tier (restorable on every endpoint at its bandwidth; counted only without one). Blocks on any other
medium than the GPU are the reporting replica's own (vLLM's CPU offload lives in that engine's host memory): they
extend that endpoint's match after its GPU blocks, as vLLM's scheduler looks its offloaded tier up after its GPU
prefix hit, and count as held there (the reload over PCIe is not priced), nowhere else; its ``AllBlocksCleared``,
a restart or a gap in its stream drops them with its GPU blocks.

Memory: the index holds one entry per (block, endpoints) plus per-endpoint LRU order;
``scripts/bench_state.py`` measures bytes per block.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from pointsman.policy.fleet import TargetEvents
from pointsman.policy.signals.engine_hashes import EngineHasher, TargetTokenizer, hashed_extra_keys
from pointsman.policy.signals.kv_events import FULL_ATTENTION, GPU, BlockStored, hash_key
from pointsman.policy.signals.prefix_index import PrefixIndex, PrefixLookup, SharedKVTier
from pointsman.request import RequestView

#: Blocks an endpoint may hold in the index at most when the fleet gives no KV capacity (the
#: engine's removals keep it exact below this; beyond it the oldest blocks go first).
DEFAULT_MAX_BLOCKS = 4_000_000


def root_extra_keys(event: BlockStored) -> tuple[object, ...] | None:
    """The extra keys vLLM hashed a chain-starting ``event``'s first block with: its ``extra_keys[0]`` as hashed
    (``engine_hashes.hashed_extra_keys``); None when the event sends none (vLLM < 0.17, SGLang: the first block then
    hashes as a plain one, but for a LoRA adapter's, whose keys are unknown). Raises ValueError when they cannot be read
    (that adapter's, or keys in no form vLLM hashes)."""
    if event.extra_keys:
        return hashed_extra_keys(event.extra_keys[0])
    if event.lora_name is not None:
        raise ValueError(f"LoRA adapter {event.lora_name!r}'s blocks without their extra keys")
    return None


class EngineCache:
    """One target's engine-reported KV cache (see the module).

    ``EngineCache(settings, base_dir, capacity_tokens=None)``: ``settings`` the target's
    ``kv_events`` section, file paths relative to ``base_dir``; ``capacity_tokens`` an
    endpoint's KV capacity (its pool's ``kv_cache_capacity_tokens``; bounds the index per
    endpoint); ``shared``: the target's shared KV tier (its contents: the blocks reported on other media than
    the GPU; None: such blocks are not matched). Raises ``TargetTokenizerError`` for an unreadable tokenizer or
    template. Thread-safe: events arrive on subscriber threads while decisions read."""

    def __init__(self, settings: TargetEvents, base_dir: Path, capacity_tokens: int | None = None,
                 shared: SharedKVTier | None = None) -> None:
        self.settings = settings
        self.block_tokens = settings.block_size
        self.hasher = EngineHasher(settings.hash_algo, settings.block_size, settings.hash_seed,
                                   max_tokens=settings.max_tokens, engine=settings.engine)
        self.tokenizer = TargetTokenizer.from_files(
            base_dir / settings.tokenizer,
            tokenizer_config=None if settings.tokenizer_config is None else base_dir / settings.tokenizer_config,
            chat_template_file=None if settings.chat_template is None else base_dir / settings.chat_template,
            max_tokens=settings.max_tokens)
        capacity = capacity_tokens or DEFAULT_MAX_BLOCKS * settings.block_size
        self.index = PrefixIndex(block_tokens=settings.block_size, default_capacity_tokens=capacity,
                                 shared=None if shared is None else replace(shared, write_through=False))
        self._lock = threading.Lock()
        self._offloaded: dict[str, set[int]] = {}  # endpoint -> blocks in its own non-GPU tier
        self._roots: dict[str, list[int]] = {}

    # -- kv_events.KVBlockSink

    def store_blocks(self, endpoint_id: str, keys: Sequence[int], medium: str) -> None:
        """The endpoint's engine holds these blocks now on ``medium`` (idempotent; module docstring)."""
        if medium == GPU:
            self.index.record(endpoint_id, list(keys))
            return
        if medium not in self.settings.shared_media:
            with self._lock:
                self._offloaded.setdefault(endpoint_id, set()).update(keys)
            return
        self.index.offload(keys)  # no-op without a shared tier

    def remove_blocks(self, endpoint_id: str, keys: Sequence[int], medium: str) -> None:
        """The endpoint's engine evicted these blocks from ``medium``."""
        if medium == GPU:
            self.index.remove(endpoint_id, keys)
        elif medium in self.settings.shared_media:
            self.index.remove_shared(keys)
        else:
            with self._lock:
                self._offloaded.get(endpoint_id, set()).difference_update(keys)

    def clear_endpoint(self, endpoint_id: str) -> None:
        """The endpoint holds nothing we know of (cleared, restarted, or a gap in its stream): its GPU blocks and
        its own offloaded ones."""
        self.index.clear(endpoint_id)
        with self._lock:
            self._offloaded.pop(endpoint_id, None)

    def remove_endpoint(self, endpoint_id: str) -> None:
        """Forget ``endpoint_id`` (left the fleet)."""
        self.index.remove_endpoint(endpoint_id)
        with self._lock:
            self._offloaded.pop(endpoint_id, None)

    # -- is the feed hashed as configured?

    def check_root(self, endpoint_id: str, event: BlockStored) -> bool | None:
        """Whether a chain-starting ``BlockStored`` (no parent) hashes its first block as this target's
        settings do (``kv_events``: engine, block size, algorithm, seed), counted per endpoint
        (``root_checks``). The block is hashed with the extra keys the event reports for it (vLLM ≥ 0.17: its
        adapter's name, ``cache_salt``, multimodal keys; ``root_extra_keys``), so such a block is checked exactly;
        without them, as a plain block. None, uncounted: not checkable (a parent, a LoRA adapter's blocks without
        their keys, extra keys in no form vLLM hashes, a group that is not full attention, bigram tokens, or fewer
        tokens than a block). A feed hashed any other way is matched by no request, so its engine's cache reads as
        empty: this is how that is seen."""
        bs = self.block_tokens
        tokens = [t for t in event.token_ids[:bs] if isinstance(t, int)]  # bigram pairs (EAGLE) are not checked
        if event.parent_block_hash is not None or not event.block_hashes \
                or event.kv_cache_spec_kind not in (None, FULL_ATTENTION) or len(tokens) < bs:
            return None
        try:
            extra = root_extra_keys(event)
        except ValueError:
            return None
        ok = event.block_size == bs and self.hasher.root_key(tokens, extra) == hash_key(event.block_hashes[0])
        with self._lock:
            counts = self._roots.setdefault(endpoint_id, [0, 0])
            counts[0] += 1
            counts[1] += not ok
        return ok

    @staticmethod
    def scheme_of(event: BlockStored) -> str | None:
        """The ``kv_events`` settings that do hash a chain-starting ``event``'s first block (``engine: sglang,
        block_size: 16``), among vLLM's unseeded algorithms and SGLang's; None when none does."""
        tokens, bs = [t for t in event.token_ids[:event.block_size] if isinstance(t, int)], event.block_size
        want = hash_key(event.block_hashes[0])
        try:
            extra = root_extra_keys(event)
        except ValueError:
            return None
        for engine, algo in (("vllm", "sha256"), ("vllm", "sha256_cbor"), ("sglang", "sha256")):
            if len(tokens) == bs and EngineHasher(algo, bs, engine=engine).root_key(tokens, extra) == want:  # type: ignore[arg-type]
                return f"engine: {engine}, block_size: {bs}" + (f", hash_algo: {algo}" if algo != "sha256" else "")
        return None

    def root_checks(self) -> dict[str, tuple[int, int]]:
        """Per endpoint: (chain-starting blocks checked, those hashed otherwise than configured)."""
        with self._lock:
            return {e: (c[0], c[1]) for e, c in self._roots.items()}

    # -- reads

    def request_keys(self, view: RequestView, lora_name: str | None = None) -> tuple[list[int], int | None]:
        """(the request's block hashes as its engines publish them (leading ``max_tokens`` tokens, full
        blocks only; keyed by its LoRA adapter ``lora_name`` on this target, ``Fleet.lora_adapter``, and salted by its
        ``cache_salt``, as vLLM keys them), the prompt's length in the engines' tokens: None when longer than what was
        hashed). Raises ``TargetTokenizerError`` when the chat template fails."""
        ids, whole = self.tokenizer.request_tokens(view.request)
        whole = whole and len(ids) <= self.hasher.max_tokens
        return self.hasher.keys(ids, view.request.cache_salt, lora_name), len(ids) if whole else None

    @property
    def approximate(self) -> bool:
        """True without a chat template: the keys are Pointsman's, never an engine's."""
        return bool(self.tokenizer.approximate)

    def lookup(self, keys: Sequence[int], *, prompt_tokens: int | None, hashed_tokens: int | None) -> PrefixLookup:
        """``keys`` (``request_keys``) matched as ``PrefixIndex.lookup``, each endpoint's match extended by the
        consecutive blocks after it in its own offloaded tier (module docstring)."""
        found = self.index.lookup(keys, prompt_tokens=prompt_tokens, hashed_tokens=hashed_tokens)
        with self._lock:
            if not any(self._offloaded.values()):
                return found
            matched = dict(found.matched)
            for endpoint, held in self._offloaded.items():
                m = matched.get(endpoint, 0)
                while m < len(keys) and keys[m] in held:
                    m += 1
                if m:
                    matched[endpoint] = m
        return PrefixLookup(matched, found.shared_runs, found.block_tokens, found.total_tokens)

    def offloaded_blocks(self, endpoint_id: str) -> int:
        """Blocks the endpoint's engine reports in its own tiers other than the GPU."""
        with self._lock:
            return len(self._offloaded.get(endpoint_id, ()))

    def blocks(self, endpoint_id: str) -> int:
        """GPU blocks the endpoint's engine reports holding."""
        return self.index.cached_blocks(endpoint_id)

