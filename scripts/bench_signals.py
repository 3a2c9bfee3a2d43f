#!/usr/bin/env python
"""Cost of the load and KV-cache-locality signal stores, on one core.

Prints p50/p99 (µs) of:

- block hashing of a 100,000-token conversation: as text (~400 KB, 128-token
  blocks of 512 bytes) and as token ids; and of a 200-block gateway id list
  (Mooncake hash_ids). Target: well under 2 ms.
- ``PrefixIndex.match`` / ``hit_tokens`` for a 200-block prompt over 256 endpoints,
  each holding a random-length prefix of it plus other cached chains, with and
  without a shared tier. Target: well under 0.2 ms.
- ``PrefixIndex.record`` of a 200-block prompt (dispatch-time update).
- a frontier target's one-endpoint index, ``lookup`` and ``record`` of a 200-block prompt,
  without and with a prompt-cache lifetime (``block_ttl_s``, checked lazily per query).
- ``LoadBoard.get_many`` of 256 endpoints with staleness applied, ``get`` of one,
  and a ``dispatch`` + ``release`` pair.
- parsing a recorded vLLM and SGLang ``/metrics`` page (background scraper cost).

    python scripts/bench_signals.py [--iterations N] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "policy" / "fixtures"

WORDS = ("the of and to in is that for it as with was on be by this are from at or an which have not but "
         "model request cache token latency prefill decode throughput server policy budget cost router GPU "
         "function return value error string number list python code write explain why how what when where").split()


def measure(fn: Callable[[], Any], iterations: int, warmup: int = 20) -> dict[str, float]:
    """p50/p99/mean of ``fn`` in microseconds over ``iterations`` calls."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(iterations):
        t = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t) * 1e6)
    samples.sort()
    return {"p50_us": samples[len(samples) // 2], "p99_us": samples[min(len(samples) - 1, int(len(samples) * 0.99))],
            "mean_us": statistics.fmean(samples)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=500)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})

    from pointsman.policy.signals.load_board import LoadBoard, StalenessPolicy
    from pointsman.policy.signals.prefix_index import (
        PrefixIndex,
        SharedKVTier,
        block_hashes_from_ids,
        block_hashes_from_text,
        block_hashes_from_tokens,
    )
    from pointsman.policy.signals.scrape import parse_metrics

    rng = random.Random(7)
    n = args.iterations
    results: dict[str, dict[str, float]] = {}

    # ---- hashing a 100k-token conversation
    text = " ".join(rng.choice(WORDS) for _ in range(80_000))[:400_000]  # ~100k tokens at ~4 chars/token
    token_ids = [rng.randrange(128_000) for _ in range(100_000)]
    results["hash_text_100k_tokens"] = measure(lambda: block_hashes_from_text(text), max(50, n // 5))
    results["hash_token_ids_100k"] = measure(lambda: block_hashes_from_tokens(token_ids), max(50, n // 5))
    ids = list(range(200))
    results["hash_gateway_ids_200_blocks"] = measure(lambda: block_hashes_from_ids(ids), n)

    # ---- prefix index: 256 endpoints, 200-block prompt
    prompt = block_hashes_from_tokens([rng.randrange(128_000) for _ in range(200 * 128)])
    endpoints = [f"http://10.0.{i // 250}.{i % 250}:8000" for i in range(256)]

    def build(shared: bool) -> PrefixIndex:
        tier = SharedKVTier(capacity_tokens=50_000_000, bytes_per_token=327_680, bandwidth_bytes_per_s=25e9) \
            if shared else None
        idx = PrefixIndex(shared=tier)
        for ep in endpoints:
            for _ in range(20):  # other conversations' chains
                idx.record(ep, [rng.getrandbits(64) for _ in range(20)])
            idx.record(ep, prompt[:rng.randrange(0, 201)])
        return idx

    idx = build(shared=False)
    results["prefix_match_256_endpoints_200_blocks"] = measure(lambda: idx.match(prompt), n)
    results["prefix_hit_tokens_256_endpoints"] = measure(lambda: idx.hit_tokens(prompt, endpoints), n)
    shared_idx = build(shared=True)
    results["prefix_hit_tokens_256_endpoints_shared_tier"] = measure(
        lambda: shared_idx.hit_tokens(prompt, endpoints), n)
    results["prefix_record_200_blocks"] = measure(lambda: idx.record(endpoints[3], prompt), n)
    cold = [rng.getrandbits(64) for _ in range(200)]
    results["prefix_match_cold_prompt"] = measure(lambda: idx.match(cold), n)
    # a frontier target's index (one endpoint) with and without the prompt-cache lifetime (expiry check)
    for name, ttl in (("frontier", None), ("frontier_ttl", 300.0)):
        api = PrefixIndex(block_ttl_s=ttl)
        for _ in range(1000):
            api.record("api", [rng.getrandbits(64) for _ in range(20)])
        api.record("api", prompt)
        results[f"prefix_lookup_{name}_200_blocks"] = measure(lambda api=api: api.lookup(prompt), n)
        results[f"prefix_record_{name}_200_blocks"] = measure(lambda api=api: api.record("api", prompt), n)

    # ---- load board
    board = LoadBoard()
    now = time.monotonic()
    for i, ep in enumerate(endpoints):
        board.push(ep, {"num_requests_running": 8, "num_requests_waiting": i % 5, "kv_cache_usage": 0.5,
                        "ttft_p50_ms": 120.0, "tpot_p50_ms": 20.0}, now=now - (i % 20))
        for k in range(10):
            board.dispatch(ep, f"{ep}-{k}", 500, now=now)
    policy = StalenessPolicy(max_age_s=10.0, on_stale="unknown")
    results["load_get_many_256_with_staleness"] = measure(lambda: board.get_many(endpoints, staleness=policy), n)
    results["load_get_one"] = measure(lambda: board.get(endpoints[0], staleness=policy), n)
    counter = iter(range(10**9))

    def dispatch_release() -> None:
        d = f"d{next(counter)}"
        board.dispatch(endpoints[1], d, 800)
        board.release(d)

    results["load_dispatch_plus_release"] = measure(dispatch_release, n)
    results["load_push_validated"] = measure(
        lambda: board.push(endpoints[2], {"num_requests_running": 3, "num_requests_waiting": 1,
                                          "kv_cache_usage": 0.4}), n)

    # ---- metrics pages (background scraper)
    vllm_page = (FIXTURES / "vllm_1.prom").read_text()
    sglang_page = (FIXTURES / "sglang_1.prom").read_text()
    results["parse_vllm_page"] = measure(lambda: parse_metrics(vllm_page), max(50, n // 5))
    results["parse_sglang_page"] = measure(lambda: parse_metrics(sglang_page), max(50, n // 5))

    if args.json:
        json.dump(results, sys.stdout, indent=2)
        print()
    else:
        print(f"{'measure':48s} {'p50 µs':>10s} {'p99 µs':>10s}")
        for name, r in results.items():
            print(f"{name:48s} {r['p50_us']:10.1f} {r['p99_us']:10.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
