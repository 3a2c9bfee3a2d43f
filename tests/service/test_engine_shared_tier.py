"""An event-fed target's shared KV tier holds the blocks its engines report on other media than the GPU: a real
``pointsman serve`` and two stand-in vLLM engines publishing ``BlockStored``/``BlockRemoved`` over ZMQ/msgpack
with ``medium: CPU`` (an offloading connector's events).

The fleet declares ``shared_kv`` (reachable from every endpoint, 25 GB/s, 1 ms; 320 KiB of KV per token) and that
the engines' ``CPU`` medium is that tier (``kv_events.shared_media``; undeclared, a medium is the replica's own:
``test_engine_offload_per_replica.py``). agg-0's
engine reports the whole ~9,800-token prompt offloaded. Before, an event-fed target's index had no shared tier and
blocks on other media were only counted: both replicas read 0 restorable tokens and the predicted prefill was the
full recompute, 0.80 s, where restoring takes 0.13 s (Pointsman's own estimate, on the same fleet without events,
credits the tier: 0.15 s). A ``BlockRemoved`` on that medium takes the blocks out again."""

from __future__ import annotations

import pytest

from tests.service.conftest import endpoint_yaml, route, serve_fleet, wait

FLEET = """apiVersion: pointsman/v1
kind: Fleet
defaults: {{output_tokens: 64, scrape_metrics: false}}
targets:
  onprem-70b:
    kind: onprem
    model: meta-llama/Llama-3.3-70B-Instruct
    context_window_tokens: 131072
    usd_per_gpu_hour: 2.5
    kv_bytes_per_token: 327680
    shared_kv: {{capacity_tokens: 1500000, bandwidth_bytes_per_s: 25.0e+9, latency_s: 0.001}}
    kv_events: {{tokenizer: tokenizer.json, chat_template: template.jinja, shared_media: [CPU]}}
    pools:
      aggregated:
        gpus_per_replica: 2
        prefill_tokens_per_s: 12192
        decode_tokens_per_s: 6651
        endpoints:
{endpoints}
"""
POLICY = "apiVersion: pointsman/v1\nkind: RoutingPolicy\nrules:\n  - name: d\n    route: {target: onprem-70b}\n"
PROMPT = [{"role": "user", "content": " ".join(f"w{i}" for i in range(3000))}]


def test_blocks_an_engine_reports_offloaded_are_restorable_from_the_shared_tier(tmp_path, serve, standin):
    engines = [standin.StandinEngine("vllm").start() for _ in range(2)]
    try:
        endpoints = "\n".join(endpoint_yaml(f"agg-{i}", e) for i, e in enumerate(engines))
        base, tok = serve_fleet(tmp_path, serve, FLEET.format(endpoints=endpoints), POLICY)
        ids = tok.prompt_token_ids(PROMPT)

        def candidates() -> dict[str, dict]:
            d = route(base, {"messages": PROMPT, "max_tokens": 64, "routing": {"explain": True}})
            return {c["endpoint"]: c for c in d["trace"]["endpoints"][0]["candidates"]}, d["prompt_tokens"]

        cold, prompt = candidates()
        full = cold["agg-0"]["prefill-work"]
        assert full == pytest.approx(prompt / 12192)
        engines[0].cache.medium = "CPU"
        _, stored = engines[0].prefill(ids)
        assert stored is not None and len(stored.block_hashes) == len(ids) // 16

        def restorable() -> list[int]:
            got, _ = candidates()
            return [got[e]["shared_hit_tokens"] for e in ("agg-0", "agg-1")]

        wait(lambda: restorable() != [0, 0], "the offloaded blocks never counted")
        warm, _ = candidates()
        held = int(len(stored.block_hashes) * 16 * prompt / len(ids))
        restore = 0.001 + held * 327680 / 25e9
        for name in ("agg-0", "agg-1"):  # reachable from every endpoint
            assert warm[name]["local_hit_tokens"] == 0 and warm[name]["shared_hit_tokens"] == held, warm[name]
            assert warm[name]["prefill-work"] == pytest.approx((prompt - held) / 12192 + restore, rel=1e-6), warm[name]
        assert warm["agg-0"]["prefill-work"] < full / 4
        engines[0].evict(stored.block_hashes)  # BlockRemoved, medium CPU
        wait(lambda: restorable() == [0, 0], "the removal never counted")
    finally:
        for e in engines:
            e.stop()
