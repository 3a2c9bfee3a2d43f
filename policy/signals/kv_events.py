"""KV-cache events as vLLM and SGLang publish them: typed records, a decoder for every wire
layout, and a ZMQ subscriber per endpoint that keeps the stream in order.

**Wire format** (research notes ``/work/notes/protocols.md`` §1.2–1.6, §2; read from
``vllm==0.9.0…0.33.0:vllm/distributed/kv_events.py`` and
``sglang==0.4.9…0.5.23:sglang/srt/disaggregation/kv_events.py``). An engine's publisher is a
ZMQ ``PUB`` socket; every message has three frames ``[topic, seq, payload]``: ``seq`` is an
8-byte big-endian unsigned counter starting at 0 in each publisher process (+1 per batch), the
payload a msgpack ``EventBatch`` written by msgspec. Layouts seen across releases:

- the batch: an array ``[ts, events]`` (vLLM 0.9.0), ``[ts, events, dp_rank]`` (vLLM ≥ 0.9.1;
  SGLang's third element is ``attn_dp_rank``), or a map ``{"ts", "events",
  "data_parallel_rank"}`` (an unreleased vLLM revision; accepted because it costs nothing);
- each event: a positional array ``[tag, field, …]`` (vLLM ≤ 0.23, SGLang ≤ 0.5.19; one more
  trailing field every few releases, and every field present because msgspec ignores
  ``omit_defaults`` on array structs) or a tagged map ``{"type": tag, name: value, …}`` (vLLM ≥
  0.24, SGLang ≥ 0.5.20; fields equal to their default omitted). Positions, after the tag:
  ``BlockStored``: block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium,
  lora_name, extra_keys, group_idx, kv_cache_spec_kind, kv_cache_spec_sliding_window;
  ``BlockRemoved``: block_hashes, medium, group_idx; ``AllBlocksCleared``: none. Missing
  trailing positions read as None, extra ones (a newer release) are ignored; unknown tags are
  skipped and counted (``EventBatch.unknown``), never fatal.

**Hash values** arrive as ints (vLLM with ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1``, the default:
the digest's last 8 bytes as an unsigned u64; vLLM 0.9–0.10.1's builtin ``hash()`` and SGLang:
*signed* 64-bit) or as bytes (vLLM with that variable at 0: the raw 32- or 16-byte digest).
Decision: the records keep each hash as it arrived, except that ints are normalised to
unsigned 64 bits (``h & (2**64 - 1)``), so a signed hash and its u64 form — the same 64 bits —
compare equal, and every int key fits one machine word. ``hash_key(h)`` maps either form to the
u64 index key (bytes: the last 8 bytes big-endian, which is exactly vLLM's own int form), so an
index fed with raw-bytes events still matches hashes Pointsman computes
(``engine_hashes.EngineHasher.keys``).

**Replay** (notes §1.6): the publisher's optional ``ROUTER`` socket answers ``[identity, b"",
start_seq]`` with every buffered batch whose seq ≥ start (``[seq, payload]`` up to vLLM 0.25.1
and SGLang 0.5.21, ``[topic, seq, payload]`` after) and an end marker whose last frame is empty.
The client is a ``DEALER`` (a ``REQ`` socket would keep only the first reply), sending
``[b"", start_seq]``.

**The subscriber** (``KVEventSubscriber``) runs one thread per endpoint. A thread, not an
asyncio task: decoding is CPU work that would otherwise run on the service's event loop
between decisions (a 1,000-event batch is ~10 ms of Python), whereas a thread is preempted
at the interpreter's switch interval and blocks in libzmq without the GIL; it also works
unchanged in the CLI and in tests, which have no loop. Callbacks therefore run on the
subscriber's thread: the index they feed must be thread-safe (``PrefixIndex`` and
``ReportedBlocks`` are). In order, per message:

1. ``seq == last + 1``: ``on_batch(endpoint_id, batch)``.
2. ``seq > last + 1`` (a gap: the PUB high-water mark dropped messages, or a reconnect lost
   some): with a replay URL, replay from ``last + 1``; if the replies cover every missing seq
   they are delivered in order (a *resync*); otherwise — or without a replay URL —
   ``on_reset(endpoint_id, reason)`` (the index must drop what it holds for the endpoint: a
   missed ``BlockRemoved`` would leave a block it no longer has), then the replayed run that
   ends right before ``seq``, if any, then the batch.
3. ``seq <= last``: the engine restarted (its counter starts again at 0, its cache is empty):
   ``on_reset``, then a replay of what the new process already published, if possible.
4. An undecodable payload is a lost batch: ``on_reset``, and the stream goes on.

The first message after ``start()`` is accepted at any seq (with a replay URL and
``catch_up=True``, the buffered batches before it are replayed first: the engine's cache
already holds their blocks). A callback that raises is counted as an error and never reaches
the caller; after a failed ``on_batch`` (the index may hold half a batch) a reset is called,
and retried before the next batch while it keeps failing. Work per message is bounded
(``max_payload_bytes``, ``max_events_per_batch``; a replay by ``max_replay_batches`` and
``replay_timeout_s``). ``status()`` is a ``SubscriberStatus`` snapshot; ``stop()`` closes both
sockets (linger 0) and joins the thread.

**Applying events** (``EventApplier``): ``BlockStored`` → ``KVBlockSink.store_blocks`` (an
idempotent upsert: vLLM ≥ 0.33 may re-report cached blocks), ``BlockRemoved`` →
``remove_blocks``, ``AllBlocksCleared`` → ``clear_endpoint``; keys are ``hash_key`` u64s and the
medium defaults to ``"GPU"``. Hybrid models publish one event per KV-cache group: a group whose
``kv_cache_spec_kind`` is not ``"full_attention"`` (sliding window, Mamba) is remembered and its
stores and removals are skipped, since its blocks say nothing about prefix reuse (notes §1.3,
§1.8). ``ReportedBlocks`` is a small bounded in-memory sink (the reference for tests and the
ingestion benchmark). ``scripts/bench_kv_events.py`` measured, on one core of this 2-core
machine while it was shared (load average ≈ 6; best of 5 passes), ``decode_batch`` + ``apply``
at 83,000 events/s for the map layout and 109,000 for the positional one (46,000 / 90,000
in a run under heavier load; decoding alone 120,000–200,000), with ``ReportedBlocks`` at
≈ 87 MiB per million blocks.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Final, Protocol, TypeAlias, cast

import msgpack  # type: ignore[import-untyped]
import zmq
from zmq.utils.monitor import recv_monitor_message

from pointsman.errors import PointsmanError

log = logging.getLogger(__name__)

#: A block hash as published: an int (normalised to unsigned 64 bits) or the raw digest bytes.
BlockHash: TypeAlias = int | bytes
#: A token id; SGLang's EAGLE bigram mode publishes pairs.
TokenId: TypeAlias = int | tuple[int, ...]

MASK64: Final = (1 << 64) - 1
#: The medium of events that name none (vLLM before 0.10.2, SGLang before 0.5.10): the device cache.
GPU: Final = "GPU"
#: ``kv_cache_spec_kind`` of the groups whose blocks are prefix-cache blocks.
FULL_ATTENTION: Final = "full_attention"
#: Most events accepted in one batch (a scheduler step of a large engine emits hundreds).
DEFAULT_MAX_EVENTS: Final = 100_000
#: Largest payload accepted, bytes (also the SUB socket's ZMQ_MAXMSGSIZE).
DEFAULT_MAX_PAYLOAD_BYTES: Final = 64 * 1024 * 1024
#: The seq frame of the end-of-replay marker: -1 as 8 signed big-endian bytes.
END_SEQ: Final = b"\xff" * 8


class KVEventError(PointsmanError, ValueError):
    """A KV-event message or payload is malformed; the message names the frame, event and field."""


# -- records


@dataclass(frozen=True)
class BlockStored:
    """Full blocks an engine just cached, in prefix order (one request, one KV-cache group).

    ``block_hashes``: their hashes; ``parent_block_hash``: the block before the first of them
    (None: the chain starts at the prompt's beginning); ``token_ids``: the tokens they cover
    (normally ``len(block_hashes) * block_size``; SGLang: one page per event, the last page of a
    node may be partial); ``block_size``: tokens per block for this event; ``lora_name``: the
    adapter (vLLM ≥ 0.14, SGLang ≥ 0.5.22); ``medium``: ``"GPU"``, ``"CPU"``, ``"CPU_PINNED"``,
    … (None before vLLM 0.10.2 / SGLang 0.5.10); ``group_idx``, ``kv_cache_spec_kind``: the
    KV-cache group and its kind (vLLM ≥ 0.20 / ≥ 0.22); ``extra_keys``: per block, the extra keys vLLM hashed it with
    (vLLM ≥ 0.17: ``generate_block_hash_extra_keys``'s tuple, an adapter's name, the first block's ``cache_salt``,
    multimodal and prompt-embeds keys, as msgpack decodes it: a list, or None for a block without any; None: not
    sent).
    """

    block_hashes: tuple[BlockHash, ...]
    parent_block_hash: BlockHash | None
    token_ids: tuple[TokenId, ...]
    block_size: int
    lora_name: str | None = None
    medium: str | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    extra_keys: tuple[object, ...] | None = None


@dataclass(frozen=True)
class BlockRemoved:
    """Blocks an engine evicted (``medium``, ``group_idx`` as in ``BlockStored``)."""

    block_hashes: tuple[BlockHash, ...]
    medium: str | None = None
    group_idx: int | None = None


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    """The engine dropped its whole prefix cache (e.g. ``/reset_prefix_cache``)."""


KVEvent: TypeAlias = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True, slots=True)
class EventBatch:
    """One published batch: ``ts`` (the engine's ``time.time()``), ``events`` in order,
    ``dp_rank`` (vLLM's ``data_parallel_rank``, SGLang's ``attn_dp_rank``; None in vLLM 0.9.0)
    and ``unknown``, the number of events of an unknown type that were skipped."""

    ts: float
    events: tuple[KVEvent, ...]
    dp_rank: int | None = None
    unknown: int = 0


def hash_key(h: BlockHash) -> int:
    """The u64 index key of a published hash: an int masked to 64 bits, bytes read as vLLM does
    for its int events (the last 8 bytes, big-endian)."""
    if type(h) is int:
        return h & MASK64
    if type(h) is bytes:
        return int.from_bytes(h[-8:], "big")
    raise TypeError(f"a block hash is an int or bytes, not {type(h).__name__}")


# -- decoding


def _where(i: int, tag: str) -> str:
    return f"events[{i}] ({tag})"


def _kind(v: object) -> str:
    return "null" if v is None else type(v).__name__


def _hashes(v: object, where: str, name: str = "block_hashes") -> tuple[BlockHash, ...]:
    """Validate and normalise a hash list (the slow path: bytes present, or an error to name)."""
    if type(v) is not list:
        raise KVEventError(f"KV-event batch {where}: {name} must be an array of int or bytes, got {_kind(v)}")
    out: list[BlockHash] = []
    append = out.append
    for h in v:
        t = type(h)
        if t is int:
            append(h & MASK64)
        elif t is bytes:
            append(h)
        else:
            raise KVEventError(f"KV-event batch {where}: {name} holds a {_kind(h)}; hashes are int or bytes")
    return tuple(out)


def _fast_hashes(v: object, i: int, tag: str) -> tuple[BlockHash, ...]:
    if type(v) is list:
        try:
            return tuple([h & MASK64 for h in v])  # ints (the common case); bytes or junk raise TypeError
        except TypeError:
            pass
    return _hashes(v, _where(i, tag))


def _parent(v: object, where: str) -> BlockHash | None:
    if v is None:
        return None
    if type(v) is int:
        return v & MASK64
    if type(v) is bytes:
        return v
    raise KVEventError(f"KV-event batch {where}: parent_block_hash must be an int, bytes or null, got {_kind(v)}")


def _check(v: object, types: tuple[type, ...], where: str, name: str, what: str) -> None:
    if type(v) not in types:
        raise KVEventError(f"KV-event batch {where}: {name} must be {what}, got {_kind(v)}")


_STR_OR_NONE: Final = (str, type(None))
_INT_OR_NONE: Final = (int, type(None))
_LIST_OR_NONE: Final = (list, type(None))
_new = object.__new__
_set = object.__setattr__


def _stored(i: int, hashes: object, parent: object, tokens: object, block_size: object, lora_name: object,
            medium: object, group_idx: object, kind: object, extra: object) -> BlockStored:
    """A validated ``BlockStored`` (built without the dataclass ``__init__``: this is the hot path)."""
    if not (type(tokens) is list and type(block_size) is int and block_size >= 1
            and type(lora_name) in _STR_OR_NONE and type(medium) in _STR_OR_NONE
            and type(group_idx) in _INT_OR_NONE and type(kind) in _STR_OR_NONE and type(extra) in _LIST_OR_NONE):
        w = _where(i, "BlockStored")
        _check(tokens, (list,), w, "token_ids", "an array")
        if type(block_size) is not int or block_size < 1:
            raise KVEventError(f"KV-event batch {w}: block_size must be an integer >= 1, got {block_size!r}")
        _check(lora_name, _STR_OR_NONE, w, "lora_name", "a string or null")
        _check(medium, _STR_OR_NONE, w, "medium", "a string or null")
        _check(group_idx, _INT_OR_NONE, w, "group_idx", "an integer or null")
        _check(kind, _STR_OR_NONE, w, "kv_cache_spec_kind", "a string or null")
        _check(extra, _LIST_OR_NONE, w, "extra_keys", "an array or null")
    if type(parent) is int:
        parent &= MASK64
    elif parent is not None and type(parent) is not bytes:
        _parent(parent, _where(i, "BlockStored"))
    assert type(tokens) is list
    # Token ids are not checked one by one (cost); SGLang's bigram pairs become tuples.
    token_ids = tuple(tuple(t) if type(t) is list else t for t in tokens) if tokens and type(tokens[0]) is list \
        else tuple(tokens)
    ev = _new(BlockStored)
    _set(ev, "__dict__", {"block_hashes": _fast_hashes(hashes, i, "BlockStored"), "parent_block_hash": parent,
                          "token_ids": token_ids, "block_size": block_size, "lora_name": lora_name, "medium": medium,
                          "group_idx": group_idx, "kv_cache_spec_kind": kind,
                          "extra_keys": tuple(extra) if type(extra) is list else None})
    return ev


def _removed(i: int, hashes: object, medium: object, group_idx: object) -> BlockRemoved:
    if type(medium) not in _STR_OR_NONE or type(group_idx) not in _INT_OR_NONE:
        w = _where(i, "BlockRemoved")
        _check(medium, _STR_OR_NONE, w, "medium", "a string or null")
        _check(group_idx, _INT_OR_NONE, w, "group_idx", "an integer or null")
    ev = _new(BlockRemoved)
    _set(ev, "__dict__", {"block_hashes": _fast_hashes(hashes, i, "BlockRemoved"), "medium": medium,
                          "group_idx": group_idx})
    return ev


def _stored_array(ev: list[object], i: int) -> BlockStored:
    n = len(ev)
    if n < 5:
        raise KVEventError(f"KV-event batch {_where(i, 'BlockStored')}: an array of {n} elements; at least the tag, "
                           "block_hashes, parent_block_hash, token_ids and block_size are needed")
    if n > 10:  # vLLM 0.22/0.23 and anything newer that stayed positional
        return _stored(i, ev[1], ev[2], ev[3], ev[4], ev[7], ev[6], ev[9], ev[10], ev[8])
    return _stored(i, ev[1], ev[2], ev[3], ev[4], ev[7] if n > 7 else None, ev[6] if n > 6 else None,
                   ev[9] if n > 9 else None, None, ev[8] if n > 8 else None)


def _stored_map(ev: dict[object, object], i: int) -> BlockStored:
    get = ev.get
    try:
        hashes, tokens, block_size = ev["block_hashes"], ev["token_ids"], ev["block_size"]
    except KeyError as e:
        raise KVEventError(f"KV-event batch {_where(i, 'BlockStored')}: no {e.args[0]}") from None
    return _stored(i, hashes, get("parent_block_hash"), tokens, block_size, get("lora_name"), get("medium"),
                   get("group_idx"), get("kv_cache_spec_kind"), get("extra_keys"))


def _removed_array(ev: list[object], i: int) -> BlockRemoved:
    n = len(ev)
    if n < 2:
        raise KVEventError(f"KV-event batch {_where(i, 'BlockRemoved')}: no block_hashes")
    return _removed(i, ev[1], ev[2] if n > 2 else None, ev[3] if n > 3 else None)


def _removed_map(ev: dict[object, object], i: int) -> BlockRemoved:
    if "block_hashes" not in ev:
        raise KVEventError(f"KV-event batch {_where(i, 'BlockRemoved')}: no block_hashes")
    return _removed(i, ev["block_hashes"], ev.get("medium"), ev.get("group_idx"))


_CLEARED: Final = AllBlocksCleared()
_ARRAY_DECODERS: Final[dict[object, Callable[[list[object], int], KVEvent]]] = {
    "BlockStored": _stored_array, "BlockRemoved": _removed_array, "AllBlocksCleared": lambda ev, i: _CLEARED}
_MAP_DECODERS: Final[dict[object, Callable[[dict[object, object], int], KVEvent]]] = {
    "BlockStored": _stored_map, "BlockRemoved": _removed_map, "AllBlocksCleared": lambda ev, i: _CLEARED}


def decode_batch(payload: bytes, *, max_events: int = DEFAULT_MAX_EVENTS) -> EventBatch:
    """Decode one msgpack ``EventBatch`` payload in any layout of the module docstring.

    Raises ``KVEventError`` (naming the event and field) when the payload is not msgpack, is
    not a batch, holds more than ``max_events`` events, or an event of a known type has a
    field of the wrong type. Events of an unknown type are skipped and counted.
    """
    if not isinstance(payload, (bytes, bytearray, memoryview)):
        raise KVEventError(f"KV-event payload must be bytes, got {type(payload).__name__}")
    if not payload:
        raise KVEventError("KV-event payload is empty")
    try:
        obj: object = msgpack.unpackb(payload, raw=False, strict_map_key=False, use_list=True)
    except Exception as e:  # msgpack raises several unrelated types (ExtraData, FormatError, ValueError, ...)
        raise KVEventError(f"KV-event payload is not one msgpack value ({type(e).__name__}: {e})") from e
    rank: object
    if type(obj) is list:
        if len(obj) not in (2, 3):
            raise KVEventError(f"KV-event batch: expected [ts, events] or [ts, events, dp_rank], got an array of {len(obj)}")
        ts, events, rank = obj[0], obj[1], (obj[2] if len(obj) == 3 else None)
    elif type(obj) is dict:
        if "events" not in obj:
            raise KVEventError("KV-event batch: a map without 'events'")
        ts, events = obj.get("ts"), obj["events"]
        rank = obj.get("data_parallel_rank", obj.get("attn_dp_rank"))
    else:
        raise KVEventError(f"KV-event batch: expected an array or a map, got {_kind(obj)}")
    if type(ts) is int:
        ts = float(ts)
    if type(ts) is not float:
        raise KVEventError(f"KV-event batch: ts must be a number, got {_kind(ts)}")
    if rank is not None and type(rank) is not int:
        raise KVEventError(f"KV-event batch: the data-parallel rank must be an integer or null, got {_kind(rank)}")
    if type(events) is not list:
        raise KVEventError(f"KV-event batch: events must be an array, got {_kind(events)}")
    if len(events) > max_events:
        raise KVEventError(f"KV-event batch: {len(events)} events, more than the limit of {max_events}")
    out: list[KVEvent] = []
    append = out.append
    unknown = 0
    arrays, maps = _ARRAY_DECODERS, _MAP_DECODERS
    for i, ev in enumerate(events):
        t = type(ev)
        if t is list:
            if not ev:
                raise KVEventError(f"KV-event batch events[{i}]: an empty array (no type tag)")
            tag = ev[0]
            decode = arrays.get(tag) if type(tag) is str else None  # (an array or a map tag is unhashable)
            if decode is not None:
                append(decode(ev, i))
                continue
        elif t is dict:
            tag = ev.get("type")
            decode_map = maps.get(tag) if type(tag) is str else None
            if decode_map is not None:
                append(decode_map(ev, i))
                continue
        else:
            raise KVEventError(f"KV-event batch events[{i}]: expected an array or a map, got {_kind(ev)}")
        if type(tag) is not str:
            raise KVEventError(f"KV-event batch events[{i}]: the type tag must be a string, got {_kind(tag)}")
        unknown += 1
    return EventBatch(ts, tuple(out), rank, unknown)


def _seq(frame: bytes, what: str) -> int:
    if len(frame) != 8:
        raise KVEventError(f"KV-event {what}: the sequence frame has {len(frame)} bytes, expected 8 (big-endian)")
    return int.from_bytes(frame, "big")


def is_replay_end(frames: Sequence[bytes]) -> bool:
    """True for a replay's end-of-replay marker (its last frame is empty), in any of its shapes
    (``[seq, b""]``, ``[topic, seq, b""]``, either after a DEALER's empty delimiter)."""
    return 2 <= len(frames) <= 4 and not frames[-1]


def parse_message(frames: Sequence[bytes], *, max_events: int = DEFAULT_MAX_EVENTS) -> tuple[bytes, int, EventBatch]:
    """``(topic, seq, batch)`` of one message: a PUB message ``[topic, seq, payload]`` or a replay
    reply (``[seq, payload]`` or ``[topic, seq, payload]``, with or without the DEALER's leading
    empty frame; topic ``b""`` when absent). Raises ``KVEventError`` for any other shape, a seq
    frame that is not 8 bytes, an undecodable payload, or an end-of-replay marker (check
    ``is_replay_end`` first)."""
    n = len(frames)
    if not 2 <= n <= 4 or (n == 4 and frames[0] != b""):
        raise KVEventError(f"KV-event message: {n} frames; expected [topic, seq, payload] or a replay reply")
    if not frames[-1]:
        raise KVEventError("KV-event message: an end-of-replay marker, not a batch")
    seq = _seq(bytes(frames[-2]), "message")
    topic = bytes(frames[-3]) if n >= 3 else b""
    return topic, seq, decode_batch(bytes(frames[-1]), max_events=max_events)


# -- applying events to an index


def _keys(hashes: tuple[BlockHash, ...]) -> Sequence[int]:
    """``hash_key`` of each hash; the tuple itself when all are ints (already u64: the common case)."""
    if bytes in map(type, hashes):
        return [hash_key(h) for h in hashes]
    return cast(tuple[int, ...], hashes)


class KVBlockSink(Protocol):
    """What engines report, per endpoint: the index side of ``EventApplier``. Keys are
    ``hash_key`` u64s in prefix order; ``medium`` is ``"GPU"`` when the event names none.
    ``store_blocks`` must be idempotent (stores may repeat). Called from the subscriber's
    thread: implementations are thread-safe."""

    def store_blocks(self, endpoint_id: str, keys: Sequence[int], medium: str) -> None:
        """The endpoint now holds these blocks on ``medium``."""

    def remove_blocks(self, endpoint_id: str, keys: Sequence[int], medium: str) -> None:
        """The endpoint evicted these blocks from ``medium`` (unknown keys: no-op)."""

    def clear_endpoint(self, endpoint_id: str) -> None:
        """Forget everything the endpoint reported (a reset, or ``AllBlocksCleared``)."""


@dataclass(frozen=True, slots=True)
class Applied:
    """What one ``EventApplier.apply`` did: blocks stored and removed, clears, and events
    skipped because they belong to a group that is not full attention."""

    stored: int = 0
    removed: int = 0
    cleared: int = 0
    skipped: int = 0


class EventApplier:
    """Applies decoded batches to a ``KVBlockSink`` (see the module docstring), remembering per
    endpoint which KV-cache groups are not full attention. ``media``: the media to index
    (None: all; e.g. ``{"GPU"}`` to ignore CPU/disk offload tiers). Use ``apply`` as a
    subscriber's ``on_batch`` and ``reset`` as its ``on_reset``."""

    def __init__(self, sink: KVBlockSink, *, media: Iterable[str] | None = None) -> None:
        self.sink = sink
        self.media = None if media is None else frozenset(media)
        self._other_groups: dict[str, set[int]] = {}
        self._lock = threading.Lock()

    def apply(self, endpoint_id: str, batch: EventBatch) -> Applied:
        """Apply ``batch``'s events to the sink, in order."""
        sink, media = self.sink, self.media
        with self._lock:
            other = self._other_groups.setdefault(endpoint_id, set())
        stored = removed = cleared = skipped = 0
        for ev in batch.events:
            if type(ev) is BlockStored:
                kind = ev.kv_cache_spec_kind
                if kind is not None and kind != FULL_ATTENTION:
                    if ev.group_idx is not None:
                        other.add(ev.group_idx)
                    skipped += 1
                    continue
                medium = ev.medium or GPU
                if media is not None and medium not in media:
                    skipped += 1
                    continue
                keys = _keys(ev.block_hashes)
                sink.store_blocks(endpoint_id, keys, medium)
                stored += len(keys)
            elif type(ev) is BlockRemoved:
                medium = ev.medium or GPU
                if (ev.group_idx is not None and ev.group_idx in other) or (media is not None and medium not in media):
                    skipped += 1
                    continue
                keys = _keys(ev.block_hashes)
                sink.remove_blocks(endpoint_id, keys, medium)
                removed += len(keys)
            else:
                sink.clear_endpoint(endpoint_id)
                cleared += 1
        return Applied(stored, removed, cleared, skipped)

    def reset(self, endpoint_id: str, reason: str = "") -> None:
        """Drop the endpoint's entries (``on_reset``; ``reason`` is for the caller's log)."""
        with self._lock:
            self._other_groups.pop(endpoint_id, None)
        self.sink.clear_endpoint(endpoint_id)


class ReportedBlocks:
    """A bounded in-memory ``KVBlockSink``: per (endpoint, medium) the reported block keys in
    the order they were first stored; past ``max_blocks_per_endpoint`` the oldest are dropped
    (the engine reports their eviction anyway; the bound only guards against a lost removal).
    ``match(keys, medium)`` → endpoint → leading blocks held. Thread-safe (one lock)."""

    def __init__(self, *, max_blocks_per_endpoint: int = 1_000_000) -> None:
        if max_blocks_per_endpoint < 1:
            raise ValueError(f"max_blocks_per_endpoint: must be >= 1, got {max_blocks_per_endpoint}")
        self.max_blocks_per_endpoint = max_blocks_per_endpoint
        self._blocks: dict[tuple[str, str], OrderedDict[int, None]] = {}
        self._lock = threading.Lock()

    def store_blocks(self, endpoint_id: str, keys: Sequence[int], medium: str) -> None:
        with self._lock:
            blocks = self._blocks.get((endpoint_id, medium))
            if blocks is None:
                blocks = self._blocks[(endpoint_id, medium)] = OrderedDict()
            for k in keys:
                blocks[k] = None
            while len(blocks) > self.max_blocks_per_endpoint:
                blocks.popitem(last=False)

    def remove_blocks(self, endpoint_id: str, keys: Sequence[int], medium: str) -> None:
        with self._lock:
            blocks = self._blocks.get((endpoint_id, medium))
            if blocks is not None:
                pop = blocks.pop
                for k in keys:
                    pop(k, None)

    def clear_endpoint(self, endpoint_id: str) -> None:
        with self._lock:
            for key in [k for k in self._blocks if k[0] == endpoint_id]:
                del self._blocks[key]

    def blocks(self, endpoint_id: str, medium: str = GPU) -> int:
        """Blocks ``endpoint_id`` reported holding on ``medium``."""
        with self._lock:
            return len(self._blocks.get((endpoint_id, medium), ()))

    def holds(self, endpoint_id: str, key: int, medium: str = GPU) -> bool:
        """Whether ``endpoint_id`` reported holding block ``key`` on ``medium``."""
        with self._lock:
            return key in self._blocks.get((endpoint_id, medium), ())

    def match(self, keys: Sequence[int], medium: str = GPU) -> dict[str, int]:
        """Endpoint → number of leading ``keys`` it holds on ``medium`` (endpoints holding none: absent)."""
        out: dict[str, int] = {}
        with self._lock:
            for (endpoint, m), blocks in self._blocks.items():
                if m != medium:
                    continue
                n = 0
                for k in keys:
                    if k not in blocks:
                        break
                    n += 1
                if n:
                    out[endpoint] = n
        return out


# -- the subscriber

OnBatch: TypeAlias = Callable[[str, EventBatch], object]
OnReset: TypeAlias = Callable[[str, str], object]


@dataclass(frozen=True, slots=True)
class SubscriberStatus:
    """A snapshot of one subscriber.

    ``connected``: a ZMTP handshake with the publisher succeeded and no disconnect followed;
    ``last_seq``: the seq of the last batch handled (None before the first);
    ``last_batch_at``: ``time.monotonic()`` of the last delivered batch; ``batches`` /
    ``events`` / ``unknown_events``: delivered (unknown: skipped inside them); ``gaps``: gaps
    seen; ``resyncs``: gaps closed by a replay; ``resets``: ``on_reset`` calls; ``errors``:
    undecodable messages, failed replays and callbacks that raised; ``last_error`` /
    ``last_reset``: their latest message / reason; ``replay``: a replay URL is configured;
    ``running``: the thread is alive.
    """

    endpoint_id: str
    url: str
    connected: bool
    last_seq: int | None
    last_batch_at: float | None
    batches: int
    events: int
    unknown_events: int
    gaps: int
    resyncs: int
    resets: int
    errors: int
    last_error: str | None
    last_reset: str | None
    replay: bool
    running: bool


_MONITOR_EVENTS: Final = zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED | zmq.EVENT_MONITOR_STOPPED


def _check_url(url: str, what: str) -> str:
    if not isinstance(url, str) or "://" not in url:
        raise KVEventError(f"{what} must be a ZMQ address such as tcp://host:5557, got {url!r}")
    return url


class KVEventSubscriber:
    """Subscribes to one endpoint's KV-event stream on its own thread (see the module docstring).

    ``endpoint_id``: passed to the callbacks; ``url``: the publisher's address (vLLM's
    ``endpoint`` with ``*`` replaced by the engine's host, plus its data-parallel rank for
    ``tcp`` ports: one subscriber per rank); ``topic``: the publisher's topic (default ``""``);
    ``replay_url``: its ``replay_endpoint`` (None: no replay, a gap resets); ``bind``: bind
    ``url`` instead of connecting (for publishers configured to connect); ``catch_up``: replay
    what the publisher buffered before the first message; ``context``: a ZMQ context to share
    (default: an own one, terminated by ``stop``). ``on_batch(endpoint_id, batch)`` and
    ``on_reset(endpoint_id, reason)`` run on the subscriber's thread.
    """

    def __init__(self, endpoint_id: str, url: str, *, on_batch: OnBatch, on_reset: OnReset,
                 topic: str | bytes = b"", replay_url: str | None = None, bind: bool = False,
                 catch_up: bool = True, replay_timeout_s: float = 2.0, max_replay_batches: int = 20_000,
                 max_events_per_batch: int = DEFAULT_MAX_EVENTS,
                 max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES, rcvhwm: int = 100_000,
                 poll_interval_s: float = 0.05, context: zmq.Context[zmq.Socket[bytes]] | None = None) -> None:
        self.endpoint_id = endpoint_id
        self.url = _check_url(url, "url")
        self.replay_url = None if replay_url is None else _check_url(replay_url, "replay_url")
        self.topic = topic.encode("utf-8") if isinstance(topic, str) else bytes(topic)
        self.bind = bind
        self.catch_up = catch_up
        if not replay_timeout_s > 0 or max_replay_batches < 1 or max_events_per_batch < 1 or max_payload_bytes < 1:
            raise ValueError("replay_timeout_s, max_replay_batches, max_events_per_batch and max_payload_bytes must be > 0")
        self.replay_timeout_s = float(replay_timeout_s)
        self.max_replay_batches = max_replay_batches
        self.max_events_per_batch = max_events_per_batch
        self.max_payload_bytes = max_payload_bytes
        self.rcvhwm = rcvhwm
        self.poll_interval_s = poll_interval_s
        self._on_batch = on_batch
        self._on_reset = on_reset
        self._own_context = context is None
        self._context = context
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        # state (written by the subscriber thread; read under _lock by status())
        self._peers = 0
        self._last_seq: int | None = None
        self._last_batch_at: float | None = None
        self._batches = self._events = self._unknown = 0
        self._gaps = self._resyncs = self._resets = self._errors = 0
        self._last_error: str | None = None
        self._last_reset: str | None = None
        self._needs_reset = False

    # -- public

    def start(self) -> KVEventSubscriber:
        """Open the SUB socket (a bad address raises ``KVEventError`` here) and start the thread."""
        if self._thread is not None:
            raise RuntimeError(f"KV-event subscriber for {self.endpoint_id} already started")
        ctx = self._context if self._context is not None else zmq.Context()
        self._context = ctx
        sub = ctx.socket(zmq.SUB)
        monitor: zmq.Socket[bytes] | None = None
        try:
            sub.setsockopt(zmq.LINGER, 0)
            sub.setsockopt(zmq.RCVHWM, self.rcvhwm)
            sub.setsockopt(zmq.MAXMSGSIZE, self.max_payload_bytes)
            sub.setsockopt(zmq.SUBSCRIBE, self.topic)
            monitor = sub.get_monitor_socket(_MONITOR_EVENTS)
            (sub.bind if self.bind else sub.connect)(self.url)
        except zmq.ZMQError as e:
            if monitor is not None:
                sub.disable_monitor()
                monitor.close(linger=0)
            sub.close(linger=0)
            if self._own_context:
                ctx.term()
                self._context = None
            raise KVEventError(f"KV-event subscriber for {self.endpoint_id}: cannot "
                               f"{'bind' if self.bind else 'connect'} {self.url}: {e}") from e
        self._stopping.clear()
        self._thread = threading.Thread(target=self._run, args=(sub, monitor),
                                        name=f"kv-events:{self.endpoint_id}", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the thread and close its sockets (and the context, if it is the subscriber's own)."""
        thread = self._thread
        if thread is None:
            return
        self._stopping.set()
        thread.join(timeout_s)
        if thread.is_alive():
            log.warning("KV-event subscriber for %s did not stop within %.1f s", self.endpoint_id, timeout_s)
            return
        self._thread = None
        if self._own_context and self._context is not None:
            self._context.term()
            self._context = None

    def __enter__(self) -> KVEventSubscriber:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def status(self) -> SubscriberStatus:
        """The current counters (see ``SubscriberStatus``)."""
        with self._lock:
            return SubscriberStatus(
                self.endpoint_id, self.url, self._peers > 0, self._last_seq, self._last_batch_at, self._batches,
                self._events, self._unknown, self._gaps, self._resyncs, self._resets, self._errors,
                self._last_error, self._last_reset, self.replay_url is not None,
                self._thread is not None and self._thread.is_alive())

    # -- the thread

    def _run(self, sub: zmq.Socket[bytes], monitor: zmq.Socket[bytes]) -> None:
        poller = zmq.Poller()
        poller.register(sub, zmq.POLLIN)
        poller.register(monitor, zmq.POLLIN)
        timeout_ms = max(1, int(self.poll_interval_s * 1000))
        try:
            while not self._stopping.is_set():
                ready = dict(poller.poll(timeout_ms))
                if monitor in ready:
                    self._drain_monitor(monitor)
                if sub in ready:
                    for _ in range(1000):  # bounded, then look at the stop flag again
                        try:
                            frames = sub.recv_multipart(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        self._handle(frames)
        except Exception as e:  # never leave the thread silently
            self._error(f"subscriber stopped: {type(e).__name__}: {e}")
            log.exception("KV-event subscriber for %s stopped", self.endpoint_id)
        finally:
            try:
                sub.disable_monitor()
            except zmq.ZMQError:
                pass
            monitor.close(linger=0)
            sub.close(linger=0)
            with self._lock:
                self._peers = 0

    def _drain_monitor(self, monitor: zmq.Socket[bytes]) -> None:
        while True:
            try:
                event = recv_monitor_message(monitor, zmq.NOBLOCK)["event"]
            except zmq.Again:
                return
            with self._lock:
                if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                    self._peers += 1
                elif event == zmq.EVENT_DISCONNECTED:
                    self._peers = max(0, self._peers - 1)

    def _error(self, message: str) -> None:
        with self._lock:
            self._errors += 1
            self._last_error = message

    def _handle(self, frames: list[bytes]) -> None:
        seq: int | None
        batch: EventBatch | None
        try:
            _, seq, batch = parse_message(frames, max_events=self.max_events_per_batch)
        except KVEventError as e:
            self._error(str(e))
            try:
                seq = _seq(frames[-2], "message") if len(frames) >= 2 else None
            except KVEventError:
                seq = None
            if seq is None:
                return  # no usable seq: the next batch shows the hole as a gap
            batch = None
        self._sequence(seq, batch)

    def _sequence(self, seq: int, batch: EventBatch | None) -> None:
        last = self._last_seq
        if last is None:
            if seq > 0 and self.replay_url is not None and self.catch_up:
                got = self._replay(0, seq)
                for s, b in _contiguous_tail(got, seq):
                    self._deliver(s, b)
        elif seq <= last:
            self._reset(f"the sequence went back from {last} to {seq}: the engine restarted and its cache starts empty")
            if seq > 0 and self.replay_url is not None:
                for s, b in _contiguous_tail(self._replay(0, seq), seq):
                    self._deliver(s, b)
        elif seq > last + 1:
            with self._lock:
                self._gaps += 1
            missing = f"batch {last + 1}" if seq == last + 2 else f"batches {last + 1}..{seq - 1}"
            if self.replay_url is None:
                self._reset(f"sequence gap: {missing} lost (publisher high-water mark or reconnect) "
                            "and no replay endpoint is configured")
            else:
                got = self._replay(last + 1, seq)
                if [s for s, _ in got] == list(range(last + 1, seq)):
                    for s, b in got:
                        self._deliver(s, b)
                    with self._lock:
                        self._resyncs += 1
                else:
                    held = f"from {got[0][0]}" if got else "nothing"
                    self._reset(f"sequence gap: {missing} lost and the replay returned {held} "
                                f"(the publisher's buffer no longer holds them)")
                    for s, b in _contiguous_tail(got, seq):
                        self._deliver(s, b)
        self._deliver(seq, batch)

    def _deliver(self, seq: int, batch: EventBatch | None) -> None:
        if batch is None:
            self._reset(f"batch {seq} could not be decoded ({self._last_error})")
            with self._lock:
                self._last_seq = seq
            return
        if self._needs_reset:
            self._reset(self._last_reset or "retrying a failed reset")
        try:
            self._on_batch(self.endpoint_id, batch)
        except Exception as e:
            self._error(f"on_batch raised on batch {seq}: {type(e).__name__}: {e}")
            log.warning("KV-event on_batch for %s raised on batch %d", self.endpoint_id, seq, exc_info=True)
            self._reset(f"on_batch raised on batch {seq}: the index may hold part of it")
        with self._lock:
            self._last_seq = seq
            self._last_batch_at = time.monotonic()
            self._batches += 1
            self._events += len(batch.events)
            self._unknown += batch.unknown

    def _reset(self, reason: str) -> None:
        with self._lock:
            self._resets += 1
            self._last_reset = reason
        log.warning("KV events of %s: resetting the endpoint's entries: %s", self.endpoint_id, reason)
        try:
            self._on_reset(self.endpoint_id, reason)
            self._needs_reset = False
        except Exception as e:
            self._needs_reset = True
            self._error(f"on_reset raised: {type(e).__name__}: {e}")
            log.warning("KV-event on_reset for %s raised", self.endpoint_id, exc_info=True)

    def _replay(self, start: int, stop: int) -> list[tuple[int, EventBatch]]:
        """Batches ``start <= seq < stop`` replayed by the publisher, in order (possibly fewer)."""
        assert self.replay_url is not None and self._context is not None
        dealer = self._context.socket(zmq.DEALER)
        out: list[tuple[int, EventBatch]] = []
        try:
            dealer.setsockopt(zmq.LINGER, 0)
            dealer.setsockopt(zmq.MAXMSGSIZE, self.max_payload_bytes)
            dealer.setsockopt(zmq.SNDTIMEO, int(self.replay_timeout_s * 1000))
            dealer.connect(self.replay_url)
            dealer.send_multipart([b"", start.to_bytes(8, "big")])
            deadline = time.monotonic() + self.replay_timeout_s
            for _ in range(self.max_replay_batches + 1):
                remaining_ms = int((deadline - time.monotonic()) * 1000)
                if remaining_ms <= 0 or not dealer.poll(remaining_ms, zmq.POLLIN):
                    self._error(f"replay from {start} on {self.replay_url}: no end of replay within "
                                f"{self.replay_timeout_s:g} s")
                    break
                frames = dealer.recv_multipart()
                if is_replay_end(frames):
                    break
                try:
                    _, seq, batch = parse_message(frames, max_events=self.max_events_per_batch)
                except KVEventError as e:
                    self._error(f"replay: {e}")
                    continue
                if start <= seq < stop:
                    out.append((seq, batch))
                if seq >= stop - 1:
                    break
        except zmq.ZMQError as e:
            self._error(f"replay from {start} on {self.replay_url}: {e}")
        finally:
            dealer.close(linger=0)
        return out


def _contiguous_tail(got: list[tuple[int, EventBatch]], stop: int) -> list[tuple[int, EventBatch]]:
    """The replayed batches that run without a hole up to ``stop - 1`` (empty if ``stop - 1`` is missing)."""
    tail: list[tuple[int, EventBatch]] = []
    expect = stop - 1
    for s, b in reversed(got):
        if s != expect:
            break
        tail.append((s, b))
        expect -= 1
    tail.reverse()
    return tail
