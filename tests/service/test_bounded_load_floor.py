"""The bounded-load cap leaves a prefix holder choosable until it runs a full batch: a real ``pointsman serve``,
three aggregated replicas, agg-2's stand-in vLLM engine publishing ``BlockStored`` over ZMQ/msgpack.

agg-2 holds the whole ~1,130-token prompt and reports 2 requests running, the others 0. Before, the cap's floor of 2
requests (``bounded_load_floor``) made agg-2 over-cap (max(2, ceil(1.25 x 3 / 3)) = 2): it ranked last and the
request recomputed the prompt cold on agg-0 (0.066 s predicted against 0.032 s on agg-2). The floor is now the pool's
``max_num_seqs`` (what a replica batches: 256 unless the fleet says); a pool declaring ``max_num_seqs: 4`` makes the
holder over-cap at 4 running."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.service.conftest import endpoint_yaml, route, serve_fleet

FLEET = """apiVersion: pointsman/v1
kind: Fleet
defaults: {{output_tokens: 64, scrape_metrics: false}}
targets:
  onprem-8b:
    kind: onprem
    model: meta-llama/Llama-3.1-8B-Instruct
    context_window_tokens: 131072
    usd_per_gpu_hour: 2.5
    kv_events: {{tokenizer: tokenizer.json, chat_template: template.jinja}}
    pools:
      aggregated:
        gpus_per_replica: 1
        prefill_tokens_per_s: 17000
        decode_tokens_per_s: 12000
{seqs}        endpoints:
{endpoints}
"""
POLICY = "apiVersion: pointsman/v1\nkind: RoutingPolicy\nrules:\n  - name: d\n    route: {target: onprem-8b}\n"
PROMPT = [{"role": "user", "content": " ".join(f"w{i}" for i in range(350))}]


@pytest.mark.parametrize("max_num_seqs", [None, 4])
def test_a_prefix_holder_under_a_full_batch_is_not_over_cap(tmp_path, serve, standin, max_num_seqs):
    engine = standin.StandinEngine("vllm").start()
    try:
        seqs = "" if max_num_seqs is None else f"        max_num_seqs: {max_num_seqs}\n"
        endpoints = "\n".join(endpoint_yaml(f"agg-{i}", engine if i == 2 else None) for i in range(3))
        base, tok = serve_fleet(tmp_path, serve, FLEET.format(endpoints=endpoints, seqs=seqs), POLICY)
        _, stored = engine.prefill(tok.prompt_token_ids(PROMPT))
        assert stored is not None

        def decide(running: int) -> dict:
            load = [{"endpoint": f"agg-{i}", "load": {"num_requests_running": running if i == 2 else 0,
                                                      "num_requests_waiting": 0}} for i in range(3)]
            httpx.post(f"{base}/v1/telemetry", json=load, timeout=10).raise_for_status()
            return route(base, {"messages": PROMPT, "max_tokens": 64, "routing": {"explain": True}})

        deadline = time.monotonic() + 15
        while not (held := {c["endpoint"]: c for c in decide(0)["trace"]["endpoints"][0]["candidates"]})["agg-2"][
                "local_hit_tokens"]:
            assert time.monotonic() < deadline, "the engine's events never arrived"
            time.sleep(0.05)
        assert held["agg-2"]["local_hit_tokens"] >= 900, held["agg-2"]
        d = decide(2)
        pick = d["trace"]["endpoints"][0]
        assert d["endpoints"][0]["name"] == "agg-2", pick
        assert pick["bounded_load_cap"] == (256 if max_num_seqs is None else 4), pick
        if max_num_seqs is not None:  # a full batch on the holder: over the cap, the request goes elsewhere
            d = decide(max_num_seqs)
            pick = d["trace"]["endpoints"][0]
            assert d["endpoints"][0]["name"] != "agg-2", pick
            assert {c["endpoint"]: c for c in pick["candidates"]}["agg-2"]["excluded"] == "over-cap", pick
    finally:
        engine.stop()
