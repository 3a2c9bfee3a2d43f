#!/usr/bin/env python
"""KV-event ingestion on one core: decoding vLLM event batches and applying them to an index.

Builds batches the way a busy vLLM engine publishes them (per scheduler step: ``BlockStored``
events of 1–8 newly cached 16-token blocks each, ``BlockRemoved`` evictions of one block, now
and then an ``AllBlocksCleared``-free steady state), in the tagged-map layout of vLLM ≥ 0.24
and the positional layout of vLLM 0.22/0.23, then times, on the calling thread only:

- ``decode_batch`` alone;
- ``decode_batch`` + ``EventApplier(ReportedBlocks()).apply`` (the subscriber's whole per-batch
  work apart from the socket), in events/s and blocks/s. Target: >= 50,000 events/s.

and the memory of ``ReportedBlocks`` per million blocks held (tracemalloc).

    python scripts/bench_kv_events.py [--events N] [--batch K] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
import tracemalloc

import msgpack

from pointsman.policy.signals.kv_events import EventApplier, ReportedBlocks, decode_batch

BLOCK = 16


def _stored(hashes: list[int], parent: int | None, tokens: list[int], positional: bool) -> object:
    if positional:  # vLLM 0.22/0.23: every field, trailing defaults included
        return ["BlockStored", hashes, parent, tokens, BLOCK, None, "GPU", None, [None] * len(hashes), 0,
                "full_attention", None]
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent, "token_ids": tokens,
            "block_size": BLOCK, "lora_id": None, "medium": "GPU", "lora_name": None,
            "extra_keys": [None] * len(hashes), "group_idx": 0, "kv_cache_spec_kind": "full_attention"}


def _removed(h: int, positional: bool) -> object:
    if positional:
        return ["BlockRemoved", [h], "GPU", 0]
    return {"type": "BlockRemoved", "block_hashes": [h], "medium": "GPU", "group_idx": 0}


def make_payloads(n_events: int, per_batch: int, positional: bool, seed: int = 7) -> tuple[list[bytes], int]:
    """msgpack payloads holding ``n_events`` events in batches of ``per_batch``; also the blocks they name."""
    rng = random.Random(seed)
    live: list[int] = []
    payloads, blocks, made = [], 0, 0
    while made < n_events:
        events: list[object] = []
        for _ in range(min(per_batch, n_events - made)):
            if live and rng.random() < 0.4:
                h = live.pop(rng.randrange(len(live)))
                events.append(_removed(h, positional))
                blocks += 1
            else:
                k = rng.randint(1, 8)
                hashes = [rng.getrandbits(64) for _ in range(k)]
                tokens = [rng.randrange(128_000) for _ in range(k * BLOCK)]
                events.append(_stored(hashes, rng.getrandbits(64) if rng.random() < 0.5 else None, tokens, positional))
                live.extend(hashes)
                blocks += k
            made += 1
        payloads.append(msgpack.packb([time.time(), events, 0]))
    return payloads, blocks


def run(payloads: list[bytes], apply: bool, repeat: int) -> float:
    """Best seconds over ``repeat`` passes."""
    best = float("inf")
    for _ in range(repeat):
        applier = EventApplier(ReportedBlocks(max_blocks_per_endpoint=10_000_000))
        t0 = time.perf_counter()
        if apply:
            for p in payloads:
                applier.apply("ep", decode_batch(p))
        else:
            for p in payloads:
                decode_batch(p)
        best = min(best, time.perf_counter() - t0)
    return best


def memory_per_million_blocks(n: int = 1_000_000) -> float:
    """MiB that ``ReportedBlocks`` takes to hold ``n`` random u64 blocks of one endpoint, scaled to 1M."""
    rng = random.Random(1)
    keys = [rng.getrandbits(64) for _ in range(n)]
    tracemalloc.start()
    sink = ReportedBlocks(max_blocks_per_endpoint=n)
    for i in range(0, n, 1000):
        sink.store_blocks("ep", keys[i:i + 1000], "GPU")
    size, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return size / 2**20 * 1_000_000 / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--batch", type=int, default=64, help="events per batch (one scheduler step)")
    ap.add_argument("--repeat", type=int, default=5, help="passes; the best is reported (the machine is shared)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # one core
    out: dict[str, object] = {"events": args.events, "events_per_batch": args.batch}
    for layout, positional in (("map (vLLM >= 0.24)", False), ("positional (vLLM 0.22)", True)):
        payloads, blocks = make_payloads(args.events, args.batch, positional)
        decode_s = run(payloads, apply=False, repeat=args.repeat)
        total_s = run(payloads, apply=True, repeat=args.repeat)
        out[layout] = {"payload_mb": round(sum(map(len, payloads)) / 2**20, 1),
                       "decode_events_per_s": round(args.events / decode_s),
                       "decode_apply_events_per_s": round(args.events / total_s),
                       "decode_apply_blocks_per_s": round(blocks / total_s)}
    out["reported_blocks_mib_per_million"] = round(memory_per_million_blocks(), 1)
    if args.json:
        json.dump(out, sys.stdout, indent=2)
        print()
        return
    print(f"{args.events:,} events in batches of {args.batch}, one core")
    for layout in ("map (vLLM >= 0.24)", "positional (vLLM 0.22)"):
        r = out[layout]
        assert isinstance(r, dict)
        print(f"  {layout:24s} decode {r['decode_events_per_s']:>9,} ev/s   "
              f"decode+apply {r['decode_apply_events_per_s']:>9,} ev/s"
              f"  ({r['decode_apply_blocks_per_s']:,} blocks/s, {r['payload_mb']} MB of payload)")
    print(f"  ReportedBlocks memory: {out['reported_blocks_mib_per_million']} MiB per million blocks")


if __name__ == "__main__":
    main()
