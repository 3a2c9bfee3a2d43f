"""KV-cache events: decoding every wire layout vLLM and SGLang have published, the event
applier, and a live subscriber against the stand-in engine's publisher (tests/fixtures/
standin_engine.py): in-order delivery, gaps closed by replay, gaps replay cannot close, engine
restarts, undecodable batches and failing callbacks. Live tests poll with a deadline."""

from __future__ import annotations

import hashlib
import importlib.util
import pickle
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import msgpack
import pytest

from pointsman.errors import PointsmanError
from pointsman.policy.signals.engine_hashes import EngineHasher
from pointsman.policy.signals.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventApplier,
    EventBatch,
    KVEventError,
    KVEventSubscriber,
    ReportedBlocks,
    decode_batch,
    hash_key,
    is_replay_end,
    parse_message,
)


def _load_standin():
    if "standin_engine" in sys.modules:
        return sys.modules["standin_engine"]
    path = Path(__file__).resolve().parents[1] / "fixtures" / "standin_engine.py"
    spec = importlib.util.spec_from_file_location("standin_engine", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["standin_engine"] = module
    spec.loader.exec_module(module)
    return module


se = _load_standin()

H1, H2 = 14326325598179984835, 9711203402474442034
TS = 1700000000.5

# Payloads written by msgspec 0.23 from structs declared with each release's options and field
# order (notes §1.3, §1.5): the bytes a real engine sends for these events.
GOLDEN = {
    "0.9.0": "92cb41d954fc402000009396ab426c6f636b53746f72656491d3c6d1553a380b4383c0dc00100102030405060708090a0b0c0d0e0f1010c092ac426c6f636b52656d6f76656491d3c6d1553a380b438391b0416c6c426c6f636b73436c6561726564",
    "0.22.0": "93cb41d954fc40200000939cab426c6f636b53746f72656492cfc6d1553a381a85c3cf86c5200ada0dcd32c0dc00200102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f2010c0a3475055c092c0c000ae66756c6c5f617474656e74696f6ec094ac426c6f636b52656d6f76656491cfc6d1553a381a85c3a34750550091b0416c6c426c6f636b73436c656172656400",
    "0.24.0": "93cb41d954fc40200000938ba474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657391cfc6d1553a381a85c3b1706172656e745f626c6f636b5f68617368cf86c5200ada0dcd32a9746f6b656e5f696473dc00101112131415161718191a1b1c1d1e1f20aa626c6f636b5f73697a6510a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c0aa65787472615f6b65797391c0a967726f75705f69647800b26b765f63616368655f737065635f6b696e64ae66756c6c5f617474656e74696f6e84a474797065ac426c6f636b52656d6f766564ac626c6f636b5f68617368657391cfc6d1553a381a85c3a66d656469756da3475055a967726f75705f6964780081a474797065b0416c6c426c6f636b73436c656172656401",
    # 0.33's BlockStored has 16 fields with the tag: msgspec writes a map16 header even though
    # omit_defaults leaves 10 entries
    "0.33.0": "93cb41d954fc4020000093de000aa474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657392cf137bb037547f4cafcf16d077ad0843c577b1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f696473dc00200102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f20aa626c6f636b5f73697a6510a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c0a967726f75705f69647800b26b765f63616368655f737065635f6b696e64ae66756c6c5f617474656e74696f6e84a474797065ac426c6f636b52656d6f766564ac626c6f636b5f68617368657391cf137bb037547f4cafa66d656469756da3475055a967726f75705f6964780081a474797065b0416c6c426c6f636b73436c656172656400",
}
NEG = -4120418475530566781


def _golden_events(version: str) -> list:
    """The events GOLDEN[version] holds, as the stand-in's specs."""
    if version == "0.9.0":
        return [se.Stored([NEG], None, list(range(1, 17)), 16), se.Removed([NEG]), se.Cleared()]
    if version == "0.22.0":
        return [se.Stored([H1, H2], None, list(range(1, 33)), 16, extra_keys=[None, None]),
                se.Removed([H1]), se.Cleared()]
    if version == "0.24.0":
        return [se.Stored([H1], H2, list(range(17, 33)), 16, extra_keys=[None]), se.Removed([H1]), se.Cleared()]
    return [se.Stored([1403909460543360175, 1643945449041937783], None, list(range(1, 33)), 16),
            se.Removed([1403909460543360175]), se.Cleared()]


@pytest.mark.parametrize("version", sorted(GOLDEN))
def test_standin_encoder_writes_msgspec_bytes(version):
    dp_rank = {"0.9.0": 0, "0.22.0": 0, "0.24.0": 1, "0.33.0": 0}[version]
    payload = se.encode_batch(_golden_events(version), layout=se.vllm_layout(version), ts=TS, dp_rank=dp_rank)
    assert payload.hex() == GOLDEN[version]


def test_decode_vllm_0_9_0_two_element_batch_signed_hashes():
    batch = decode_batch(bytes.fromhex(GOLDEN["0.9.0"]))
    u64 = NEG & (2**64 - 1)
    assert batch == EventBatch(TS, (BlockStored((u64,), None, tuple(range(1, 17)), 16), BlockRemoved((u64,)),
                                    AllBlocksCleared()), None, 0)
    assert hash_key(NEG) == hash_key(u64) == u64


def test_decode_vllm_0_22_positional_with_trailing_defaults():
    batch = decode_batch(bytes.fromhex(GOLDEN["0.22.0"]))
    assert batch.dp_rank == 0 and batch.unknown == 0
    stored, removed, cleared = batch.events
    assert stored == BlockStored((H1, H2), None, tuple(range(1, 33)), 16, None, "GPU", 0, "full_attention", (None, None))
    assert removed == BlockRemoved((H1,), "GPU", 0)
    assert cleared == AllBlocksCleared()


@pytest.mark.parametrize("version", ["0.24.0", "0.33.0"])
def test_decode_vllm_map_layouts(version):
    batch = decode_batch(bytes.fromhex(GOLDEN[version]))
    stored = batch.events[0]
    assert isinstance(stored, BlockStored)
    assert (stored.medium, stored.group_idx, stored.kv_cache_spec_kind, stored.block_size) == ("GPU", 0, "full_attention", 16)
    if version == "0.24.0":
        assert batch.dp_rank == 1
        assert stored.block_hashes == (H1,) and stored.parent_block_hash == H2
        assert stored.token_ids == tuple(range(17, 33))
    assert isinstance(batch.events[1], BlockRemoved) and isinstance(batch.events[2], AllBlocksCleared)


VLLM_VERSIONS = ["0.9.0", "0.9.1", "0.10.2", "0.13.0", "0.14.0", "0.17.0", "0.20.0", "0.22.0", "0.23.0", "0.24.0",
                 "0.25.1", "0.26.0", "0.29.0", "0.30.0", "0.33.0"]


@pytest.mark.parametrize("version", VLLM_VERSIONS)
def test_decode_every_vllm_layout(version):
    v = tuple(int(x) for x in version.split("."))
    events = [se.Stored([H1, b"\x01" * 32], H2, list(range(32)), 16, medium="CPU", lora_name="adapter-a", group_idx=1,
                        kv_cache_spec_kind="full_attention", extra_keys=[["adapter-a", "salt"], ["adapter-a"]]),
              se.Removed([H1], medium="CPU", group_idx=1), se.Cleared()]
    batch = decode_batch(se.encode_batch(events, layout=se.vllm_layout(version), dp_rank=3))
    stored, removed, cleared = batch.events
    assert stored.block_hashes == (H1, b"\x01" * 32) and stored.parent_block_hash == H2
    assert stored.token_ids == tuple(range(32)) and stored.block_size == 16
    assert stored.medium == ("CPU" if v >= (0, 10, 2) else None)
    assert stored.lora_name == ("adapter-a" if v >= (0, 14) else None)
    assert stored.group_idx == (1 if v >= (0, 20) else None)
    assert stored.kv_cache_spec_kind == ("full_attention" if v >= (0, 22) else None)
    assert stored.extra_keys == ((["adapter-a", "salt"], ["adapter-a"]) if v >= (0, 17) else None)
    assert removed == BlockRemoved((H1,), "CPU" if v >= (0, 10, 2) else None, 1 if v >= (0, 20) else None)
    assert cleared == AllBlocksCleared()
    assert batch.dp_rank == (3 if v >= (0, 9, 1) else None)


@pytest.mark.parametrize("version", ["0.4.9", "0.5.10", "0.5.20", "0.5.22"])
def test_decode_sglang_layouts(version):
    v = tuple(int(x) for x in version.split("."))
    signed = -(2**62)  # SGLang's ids are signed 64-bit
    events = [se.Stored([signed], None, [5], 1, medium="CPU_PINNED"), se.Removed([signed], medium="CPU_PINNED")]
    batch = decode_batch(se.encode_batch(events, layout=se.sglang_layout(version), dp_rank=2))
    stored, removed = batch.events
    assert batch.dp_rank == 2  # attn_dp_rank
    assert stored.block_hashes == (signed & (2**64 - 1),) and stored.block_size == 1
    assert stored.medium == ("CPU_PINNED" if v >= (0, 5, 10) else None)
    assert removed.block_hashes == stored.block_hashes


def test_sglang_bigram_tokens_become_tuples():
    payload = msgpack.packb([TS, [["BlockStored", [1], None, [[1, 2], [2, 3]], 2, None]], 0])
    assert decode_batch(payload).events[0].token_ids == ((1, 2), (2, 3))


def test_outer_map_batch_is_accepted():
    payload = msgpack.packb({"ts": TS, "events": [{"type": "BlockRemoved", "block_hashes": [7], "medium": "GPU"}],
                             "data_parallel_rank": 4})
    assert decode_batch(payload) == EventBatch(TS, (BlockRemoved((7,), "GPU"),), 4, 0)


def test_unknown_tags_are_skipped_and_counted():
    events = [se.Unknown("BlockPinned", [[1], "GPU"]), se.Removed([9]), se.Unknown("Future", [])]
    for layout in (se.vllm_layout("0.22.0"), se.vllm_layout("0.26.0")):
        batch = decode_batch(se.encode_batch(events, layout=layout))
        assert batch.events == (BlockRemoved((9,), "GPU", 0),) and batch.unknown == 2


def test_positions_of_a_newer_release_are_ignored_and_missing_ones_are_none():
    newer = ["BlockStored", [1], None, [1, 2], 2, None, "GPU", None, None, 0, "full_attention", None, "x", "y"]
    oldest = ["BlockStored", [1], None, [1, 2], 2]
    a, b = decode_batch(msgpack.packb([TS, [newer, oldest], 0])).events
    assert a == BlockStored((1,), None, (1, 2), 2, None, "GPU", 0, "full_attention")
    assert b == BlockStored((1,), None, (1, 2), 2)


@pytest.mark.parametrize("payload, fragment", [
    (b"", "empty"),
    (b"\xc1", "not one msgpack value"),
    (msgpack.packb([TS, []]) + b"\x00", "not one msgpack value"),
    (msgpack.packb("hello"), "expected an array or a map"),
    (msgpack.packb([TS]), "array of 1"),
    (msgpack.packb(["now", []]), "ts must be a number"),
    (msgpack.packb([TS, {}]), "events must be an array"),
    (msgpack.packb([TS, [], "rank"]), "data-parallel rank"),
    (msgpack.packb([TS, [7]]), "events[0]: expected an array or a map"),
    (msgpack.packb([TS, [[]]]), "events[0]: an empty array"),
    (msgpack.packb([TS, [[5, 1]]]), "type tag must be a string"),
    (msgpack.packb([TS, [["BlockStored", "abc", None, [], 16]]]), "events[0] (BlockStored): block_hashes must be an array"),
    (msgpack.packb([TS, [["BlockStored", [1.5], None, [], 16]]]), "block_hashes holds a float"),
    (msgpack.packb([TS, [["BlockStored", [1], None, [], 0]]]), "block_size must be an integer >= 1"),
    (msgpack.packb([TS, [["BlockStored", [1], None, []]]]), "an array of 4 elements"),
    (msgpack.packb([TS, [["BlockStored", [1], "p", [], 16]]]), "parent_block_hash must be"),
    (msgpack.packb([TS, [["BlockStored", [1], None, [], 16, None, 5]]]), "medium must be a string"),
    (msgpack.packb([TS, [["BlockStored", [1], None, [], 16, None, "GPU", None, "salt"]]]), "extra_keys must be an array"),
    (msgpack.packb([TS, [{"type": "BlockStored", "block_hashes": [1], "token_ids": []}]]), "no block_size"),
    (msgpack.packb([TS, [{"type": "BlockRemoved"}]]), "events[0] (BlockRemoved): no block_hashes"),
    (msgpack.packb([TS, [{"type": "BlockRemoved", "block_hashes": [1], "group_idx": "0"}]]), "group_idx must be an integer"),
])
def test_malformed_payloads_raise_kv_event_error(payload, fragment):
    with pytest.raises(KVEventError) as err:
        decode_batch(payload)
    assert fragment in str(err.value)
    assert isinstance(err.value, PointsmanError)


def test_a_first_block_is_checked_with_the_extra_keys_its_event_reports():
    """vLLM >= 0.17 reports each block's extra keys (``generate_block_hash_extra_keys``): a chain's first block is
    hashed with its own, msgpack arrays inside them as the tuples vLLM hashed (a multimodal key is ``(identifier,
    offset)``), so it is checked exactly, and a first block whose keys differ from the hashed ones mismatches. Keys in
    no form vLLM hashes (a map) and an adapter's block without keys (vLLM 0.14-0.16) are not checked. The expected
    digests are vLLM's ``hash_block_tokens`` written out here: SHA-256 of the pickled (parent, tokens, keys)."""
    from pointsman.estimator.model_source import bundled_model_dir
    from pointsman.policy.fleet import TargetEvents
    from pointsman.policy.signals.engine_cache import EngineCache

    cache = EngineCache(TargetEvents(tokenizer=str(bundled_model_dir() / "tokenizer.json")), Path("/"))
    tokens = list(range(100, 116))
    none_hash = hashlib.sha256(pickle.dumps("vllm-none-hash", protocol=5)).digest()

    def root(keys: object, hashed_with: tuple | None, lora_name: str | None = None) -> BlockStored:
        digest = hashlib.sha256(pickle.dumps((none_hash, tuple(tokens), hashed_with), protocol=5)).digest()
        raw = ["BlockStored", [se.as_event_hash(digest)], None, tokens, 16, None, "GPU", lora_name, keys, 0,
               "full_attention"]
        return decode_batch(msgpack.packb([TS, [raw], 0])).events[0]

    image = (("9f3c-image", 3), "sql-lora", "tenant-a")
    assert cache.check_root("a", root([[["9f3c-image", 3], "sql-lora", "tenant-a"]], image)) is True
    assert cache.check_root("a", root([[["9f3c-image", 4], "sql-lora", "tenant-a"]], image)) is False
    assert cache.check_root("a", root([None, ["sql-lora"]], None)) is True
    assert cache.check_root("a", root([[{"name": "sql-lora"}]], ("sql-lora",))) is None
    assert cache.check_root("a", root(None, ("sql-lora",), lora_name="sql-lora")) is None
    assert cache.root_checks() == {"a": (3, 1)}


def test_batch_size_is_bounded():
    payload = msgpack.packb([TS, [["AllBlocksCleared"]] * 11, 0])
    assert len(decode_batch(payload, max_events=11).events) == 11
    with pytest.raises(KVEventError, match="11 events, more than the limit of 10"):
        decode_batch(payload, max_events=10)


def test_hash_key_of_bytes_is_vllms_int_form():
    digest = bytes(range(32))
    assert hash_key(digest) == int.from_bytes(digest, "big") & (2**64 - 1)
    with pytest.raises(TypeError):
        hash_key(1.0)  # type: ignore[arg-type]


def test_parse_message_shapes():
    payload = bytes.fromhex(GOLDEN["0.24.0"])
    seq = (5).to_bytes(8, "big")
    assert parse_message([b"kv", seq, payload])[:2] == (b"kv", 5)  # PUB
    assert parse_message([seq, payload])[:2] == (b"", 5)  # replay <= 0.25.1
    assert parse_message([b"", seq, payload])[:2] == (b"", 5)  # the same through a DEALER
    assert parse_message([b"", b"kv", seq, payload])[:2] == (b"kv", 5)  # replay >= 0.26 through a DEALER
    assert parse_message([b"kv", seq, payload])[2] == decode_batch(payload)
    for end in ([b"\xff" * 8, b""], [b"", b"\xff" * 8, b""], [b"", b"", b"\xff" * 8, b""]):
        assert is_replay_end(end)
        with pytest.raises(KVEventError, match="end-of-replay"):
            parse_message(end)
    assert not is_replay_end([b"", seq, payload])
    with pytest.raises(KVEventError, match="4 bytes, expected 8"):
        parse_message([b"", b"\x00" * 4, payload])
    with pytest.raises(KVEventError, match="1 frames"):
        parse_message([payload])
    with pytest.raises(KVEventError, match="4 frames"):
        parse_message([b"x", b"kv", seq, payload])


# -- applying events


def test_applier_stores_removes_clears_and_skips_other_groups():
    sink = ReportedBlocks()
    applier = EventApplier(sink)
    batch = EventBatch(TS, (
        BlockStored((1, 2, 3), None, tuple(range(48)), 16, medium="GPU", group_idx=0, kv_cache_spec_kind="full_attention"),
        BlockStored((1, 2, 3), None, tuple(range(48)), 16, medium="GPU", group_idx=1, kv_cache_spec_kind="sliding_window"),
        BlockStored((b"\x00" * 24 + (4).to_bytes(8, "big"),), 3, tuple(range(16)), 16),  # raw-bytes hash, no medium
        BlockStored((9,), None, tuple(range(16)), 16, medium="CPU"),
    ))
    applied = applier.apply("a", batch)
    assert (applied.stored, applied.skipped) == (5, 1)
    assert sink.match([1, 2, 3, 4, 5]) == {"a": 4}
    assert sink.holds("a", 9, "CPU") and not sink.holds("a", 9)
    # the sliding-window group evicts block 1: the full-attention group still holds it
    applier.apply("a", EventBatch(TS, (BlockRemoved((1,), "GPU", 1),)))
    assert sink.match([1, 2]) == {"a": 2}
    applier.apply("a", EventBatch(TS, (BlockRemoved((2,), "GPU", 0),)))
    assert sink.match([1, 2]) == {"a": 1}
    applier.apply("b", EventBatch(TS, (BlockStored((1,), None, (), 16),)))
    assert sink.match([1]) == {"a": 1, "b": 1}
    assert applier.apply("a", EventBatch(TS, (AllBlocksCleared(),))).cleared == 1
    assert sink.match([1]) == {"b": 1} and sink.blocks("a", "CPU") == 0
    applier.reset("b", "test")
    assert sink.match([1]) == {}


def test_applier_media_filter_and_bounded_sink():
    sink = ReportedBlocks(max_blocks_per_endpoint=2)
    applier = EventApplier(sink, media={"GPU"})
    applier.apply("a", EventBatch(TS, (BlockStored((1, 2, 3), None, (), 16, medium="GPU"),
                                       BlockStored((7,), None, (), 16, medium="CPU"))))
    assert sink.blocks("a") == 2 and sink.match([2, 3]) == {"a": 2} and sink.blocks("a", "CPU") == 0


# -- live: the subscriber against the stand-in publisher


def wait_for(predicate: Callable[[], object], timeout_s: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


class Recorder:
    """on_batch / on_reset that record what they were given (thread-safe)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.log: list[tuple[str, object]] = []
        self.fail_batches = 0

    def on_batch(self, endpoint_id: str, batch: EventBatch) -> None:
        with self.lock:
            if self.fail_batches:
                self.fail_batches -= 1
                raise RuntimeError("index unavailable")
            self.log.append(("batch", batch))

    def on_reset(self, endpoint_id: str, reason: str) -> None:
        with self.lock:
            self.log.append(("reset", reason))

    def tss(self) -> list[object]:
        """The delivered batches' ts (the tests publish ts = seq) and resets as "R"."""
        with self.lock:
            return [b.ts if kind == "batch" else "R" for kind, b in self.log]


@pytest.fixture
def publisher() -> Iterator:
    pubs = []

    def make(version: str = "0.24.0", **kw):
        pub = se.KVEventPublisher(se.vllm_layout(version), **kw).start()
        pubs.append(pub)
        return pub

    yield make
    for p in pubs:
        p.stop()


@pytest.fixture
def subscribe() -> Iterator:
    subs = []

    def make(pub, recorder: Recorder, *, replay: bool = True, **kw) -> KVEventSubscriber:
        sub = KVEventSubscriber("ep-1", pub.url, on_batch=recorder.on_batch, on_reset=recorder.on_reset,
                                replay_url=pub.replay_url if replay else None, replay_timeout_s=5.0, **kw).start()
        subs.append(sub)
        assert pub.wait_subscribed(10), "the subscription never reached the publisher"
        return sub

    yield make
    for s in subs:
        s.stop()
        assert not s.status().running


def publish(pub, n: int = 1, *, send: bool = True) -> list[int]:
    """Publish n one-event batches whose ts is their seq."""
    return [pub.publish([se.Removed([pub.next_seq])], ts=float(pub.next_seq), send=send) for _ in range(n)]


def test_live_batches_arrive_in_order_with_status(publisher, subscribe):
    pub, rec = publisher(), Recorder()
    sub = subscribe(pub, rec)
    publish(pub, 5)
    wait_for(lambda: len(rec.log) == 5, what="5 batches")
    assert rec.tss() == [0.0, 1.0, 2.0, 3.0, 4.0]
    wait_for(lambda: sub.status().connected, what="connected")
    st = sub.status()
    assert (st.last_seq, st.batches, st.events, st.gaps, st.resets, st.errors) == (4, 5, 5, 0, 0, 0)
    assert st.running and st.replay and st.last_batch_at is not None and st.last_batch_at <= time.monotonic()


@pytest.mark.parametrize("version", ["0.24.0", "0.26.0"])  # replay replies of 2 and of 3 frames
def test_live_gap_closed_by_replay(publisher, subscribe, version):
    pub, rec = publisher(version), Recorder()
    sub = subscribe(pub, rec)
    publish(pub, 2)
    publish(pub, 3, send=False)  # buffered, never sent: the subscriber sees seq 1 then 5
    publish(pub, 1)
    wait_for(lambda: len(rec.log) == 6, what="6 batches")
    assert rec.tss() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    st = sub.status()
    assert (st.gaps, st.resyncs, st.resets, st.last_seq) == (1, 1, 0, 5)
    assert pub.replay_requests == [2]


def test_live_gap_the_replay_cannot_cover_resets(publisher, subscribe):
    pub, rec = publisher(), Recorder()
    sub = subscribe(pub, rec)
    publish(pub, 1)
    lost = publish(pub, 3, send=False)
    pub.forget(lost[:2])  # the buffer still holds seq 3 only
    publish(pub, 1)
    wait_for(lambda: len(rec.log) == 4, what="reset + 2 batches")
    assert rec.tss() == [0.0, "R", 3.0, 4.0]
    st = sub.status()
    assert (st.gaps, st.resyncs, st.resets) == (1, 0, 1)
    assert "batches 1..3 lost" in st.last_reset and "returned from 3" in st.last_reset


def test_live_gap_without_replay_resets(publisher, subscribe):
    pub, rec = publisher(replay=False), Recorder()
    sub = subscribe(pub, rec, replay=False)
    publish(pub, 1)
    publish(pub, 1, send=False)
    publish(pub, 1)
    wait_for(lambda: len(rec.log) == 3, what="batch, reset, batch")
    assert rec.tss() == [0.0, "R", 2.0]
    assert "batch 1 lost" in sub.status().last_reset and "no replay endpoint" in sub.status().last_reset


def test_live_publisher_restart_resets_and_follows_the_new_stream(publisher, subscribe):
    pub, rec = publisher(), Recorder()
    sub = subscribe(pub, rec)
    publish(pub, 3)
    wait_for(lambda: len(rec.log) == 3, what="3 batches")
    pub.restart()  # same ports, seq back to 0
    assert pub.wait_subscribed(10)
    publish(pub, 2)
    wait_for(lambda: len(rec.log) == 6, what="reset + 2 batches")
    assert rec.tss() == [0.0, 1.0, 2.0, "R", 0.0, 1.0]
    st = sub.status()
    assert st.resets == 1 and "went back from 2 to 0" in st.last_reset and st.last_seq == 1


def test_live_catch_up_replays_what_was_published_before_the_first_message(publisher, subscribe):
    pub, rec = publisher(), Recorder()
    publish(pub, 3)  # nobody listening yet: only the replay buffer has them
    sub = subscribe(pub, rec)
    publish(pub, 1)
    wait_for(lambda: len(rec.log) == 4, what="3 replayed + 1")
    assert rec.tss() == [0.0, 1.0, 2.0, 3.0]
    assert sub.status().resets == 0 and sub.status().gaps == 0


def test_live_undecodable_batch_and_failing_callback_do_not_stop_the_stream(publisher, subscribe):
    pub, rec = publisher(), Recorder()
    sub = subscribe(pub, rec)
    publish(pub, 1)
    pub.publish_payload(b"\xc1 not msgpack")
    publish(pub, 1)
    wait_for(lambda: len(rec.log) == 3, what="batch, reset, batch")
    assert rec.tss() == [0.0, "R", 2.0]
    assert sub.status().errors == 1 and "not one msgpack value" in sub.status().last_error
    rec.fail_batches = 1
    publish(pub, 2)  # the first raises in on_batch: counted, reset, the next one arrives
    wait_for(lambda: len(rec.log) == 5, what="reset + batch")
    assert rec.tss()[3:] == ["R", 4.0]
    st = sub.status()
    assert st.running and st.errors == 2 and "on_batch raised on batch 3" in st.last_error and st.last_seq == 4


def test_live_engine_hashes_match_what_the_standin_engine_reports(subscribe):
    engine = se.StandinEngine("vllm", version="0.29.0").start()
    try:
        sink = ReportedBlocks()
        applier = EventApplier(sink)
        rec = Recorder()

        def on_batch(endpoint_id, batch):
            applier.apply(endpoint_id, batch)
            rec.on_batch(endpoint_id, batch)

        sub = KVEventSubscriber("ep-1", engine.kv_events_url, on_batch=on_batch, on_reset=applier.reset,
                                replay_url=engine.replay_url).start()
        try:
            assert engine.events.wait_subscribed(10)
            prompt = list(range(100, 150))  # 3 full blocks + 2 tokens
            keys = EngineHasher().keys(prompt)
            assert len(keys) == 3
            engine.prefill(prompt)
            wait_for(lambda: sink.match(keys) == {"ep-1": 3}, what="the prompt's blocks in the index")
            engine.evict([keys[1]])
            wait_for(lambda: sink.match(keys) == {"ep-1": 1}, what="block 2 evicted")
        finally:
            sub.stop()
    finally:
        engine.stop()


def test_stop_closes_everything_and_bad_addresses_fail_at_start():
    names = {t.name for t in threading.enumerate()}
    rec = Recorder()
    sub = KVEventSubscriber("ep-x", "tcp://127.0.0.1:1", on_batch=rec.on_batch, on_reset=rec.on_reset).start()
    assert sub.status().running and not sub.status().connected
    sub.stop()
    assert not sub.status().running
    assert {t.name for t in threading.enumerate()} - names == set()
    with pytest.raises(KVEventError, match="cannot connect"):
        KVEventSubscriber("ep-x", "tcp://no-such-host-:x", on_batch=rec.on_batch, on_reset=rec.on_reset).start()
    with pytest.raises(KVEventError, match="ZMQ address"):
        KVEventSubscriber("ep-x", "localhost:5557", on_batch=rec.on_batch, on_reset=rec.on_reset)


# -- the stand-in engine's /metrics page (what the scraper reads)


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_standin_metrics_page_changes_at_run_time_and_dies(kind):
    import httpx

    from pointsman.policy.signals.scrape import parse_metrics

    server = se.MetricsServer(se.EngineMetrics(kind)).start()
    try:
        server.metrics.set(running=3, waiting=40, kv_usage=0.5)
        server.metrics.observe_ttft(0.2, n=4)
        page = httpx.get(server.metrics_url, timeout=5).text
        m = parse_metrics(page)
        assert (m.engine, m.num_requests_running, m.num_requests_waiting, m.kv_cache_usage) == (kind, 3, 40, 0.5)
        assert m.ttft is not None and m.ttft.count == 4
        assert m.kv_cache_capacity_tokens == (16 * 8192 if kind == "vllm" else 500_000)
        server.metrics.set(waiting=2)
        assert parse_metrics(httpx.get(server.metrics_url, timeout=5).text).num_requests_waiting == 2
        recorded = (Path(__file__).parent / "fixtures" / ("vllm_1.prom" if kind == "vllm" else "sglang_1.prom")).read_text()
        server.serve_text(recorded)
        assert httpx.get(server.metrics_url, timeout=5).text == recorded
        server.fail_with(503)
        assert httpx.get(server.metrics_url, timeout=5).status_code == 503
        server.fail_with(None)
        port = server.port
        server.stop()  # the engine died
        with pytest.raises(httpx.ConnectError):
            httpx.get(server.metrics_url, timeout=2)
        server.start()  # and came back on the same port
        assert server.port == port and httpx.get(server.metrics_url, timeout=5).status_code == 200
    finally:
        server.stop()


def test_standin_engine_restart_empties_its_cache_and_restarts_its_sequence(subscribe):
    engine = se.StandinEngine("vllm", version="0.26.0").start()
    try:
        rec = Recorder()
        sub = subscribe(engine.events, rec)
        seq, ev = engine.prefill(list(range(32)))
        assert seq == 0 and len(ev.block_hashes) == 2
        wait_for(lambda: len(rec.log) == 1, what="the first batch")
        engine.restart()
        assert engine.events.wait_subscribed(10)
        seq, ev = engine.prefill(list(range(32)))  # cached again from scratch: the same hashes, seq 0
        assert seq == 0 and len(ev.block_hashes) == 2 and ev.parent_block_hash is None
        wait_for(lambda: len(rec.log) == 3, what="reset + batch")
        assert rec.tss()[1] == "R" and sub.status().resets == 1
    finally:
        engine.stop()
