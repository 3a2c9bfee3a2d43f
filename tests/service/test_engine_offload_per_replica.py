"""Blocks an engine reports on its own offload tier count on that replica only: a real ``pointsman serve`` and two
stand-in vLLM engines publishing ``BlockStored`` over ZMQ/msgpack with ``medium: CPU`` (vLLM's built-in CPU offload,
``OffloadingConnector``: the engine's own host memory; the events name the medium, not whether it is shared).

The fleet declares ``shared_kv`` but no ``kv_events.shared_media``. Before, any non-GPU block filled the fleet-wide
tier: agg-0's engine offloading a ~9,800-token prompt made it restorable on agg-1 too (0.13 s predicted there, where
agg-1 would recompute all of it, 0.80 s), and the blocks stayed after agg-0's engine restarted with an empty cache.
Now agg-0 reads them as held after its GPU blocks (vLLM looks its offloaded tier up after its GPU prefix hit), agg-1
reads nothing, and agg-0's restart drops them."""

from __future__ import annotations

import httpx
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
    kv_events: {{tokenizer: tokenizer.json, chat_template: template.jinja}}
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


def test_blocks_an_engine_offloads_to_its_own_cpu_count_on_that_replica_only(tmp_path, serve, standin):
    engines = [standin.StandinEngine("vllm").start() for _ in range(2)]
    try:
        endpoints = "\n".join(endpoint_yaml(f"agg-{i}", e) for i, e in enumerate(engines))
        base, tok = serve_fleet(tmp_path, serve, FLEET.format(endpoints=endpoints), POLICY)
        ids = tok.prompt_token_ids(PROMPT)

        def candidates() -> tuple[dict[str, dict], int]:
            d = route(base, {"messages": PROMPT, "max_tokens": 64, "routing": {"explain": True}})
            return {c["endpoint"]: c for c in d["trace"]["endpoints"][0]["candidates"]}, d["prompt_tokens"]

        def offloaded(name: str) -> int:
            eps = httpx.get(f"{base}/v1/fleet", timeout=10).json()["targets"]["onprem-70b"]["endpoints"]
            return next(e for e in eps if e["name"] == name)["offloaded_blocks"]

        cold, prompt = candidates()
        engines[0].cache.medium = "CPU"
        _, stored = engines[0].prefill(ids)
        assert stored is not None
        wait(lambda: any(c["local_hit_tokens"] or c["shared_hit_tokens"] for c in candidates()[0].values()),
             "the offloaded blocks never counted")
        warm, _ = candidates()
        held = int(len(stored.block_hashes) * 16 * prompt / len(ids))
        assert warm["agg-0"]["local_hit_tokens"] == held and warm["agg-0"]["shared_hit_tokens"] == 0, warm["agg-0"]
        assert warm["agg-1"]["local_hit_tokens"] == 0 and warm["agg-1"]["shared_hit_tokens"] == 0, warm["agg-1"]
        assert warm["agg-1"]["prefill-work"] == pytest.approx(cold["agg-1"]["prefill-work"]), warm["agg-1"]
        assert warm["agg-0"]["rank"] == 0 and offloaded("agg-0") == len(stored.block_hashes)
        engines[0].restart()  # empty cache, its event sequence from 0 again
        engines[0].cache.medium = "GPU"
        assert engines[0].events.wait_subscribed()  # the service's subscriber is back (a publish before it is lost)
        engines[0].prefill([7] * 64)  # any event after the restart shows the sequence went back
        wait(lambda: offloaded("agg-0") == 0, "the restart never dropped the offloaded blocks")
        after, _ = candidates()
        assert after["agg-0"]["local_hit_tokens"] == 0, after["agg-0"]
    finally:
        for e in engines:
            e.stop()
