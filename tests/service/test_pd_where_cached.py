"""The P/D rules of thumb read the prefix cached where an aggregated request would run, not the longest prefix
anywhere: a real ``pointsman serve``, a stand-in vLLM decode engine publishing ``BlockStored`` over ZMQ/msgpack.

The fleet: 2 aggregated, 2 prefill and 4 decode replicas of 2 GPUs (12 GPUs in the P/D pools), the policy
``route: {target: onprem-70b, mode: auto}`` with the default rules of thumb (512 uncached tokens, 0.8 hit ratio).

Before, the mode was decided on the longest prefix held on any aggregated or decode endpoint, then the picker
chose the aggregated endpoint on its own: a follow-up of 1,108 engine tokens whose first 672 (61%) decode-1
holds read "stay aggregated: 433 uncached prompt tokens <= 512" and ran on agg-0, which holds none of it (a
1,100-token prefill on the aggregated pool; decode endpoints join the aggregated choice only from 80% held); a
prompt 99.9% held on a decode replica busy with 40 running answers (the aggregated replicas 10 each) read
"6 uncached prompt tokens" and ran on agg-1 (cheaper by the picker's 0.72 s against 1.23 s), recomputing all
4,720 tokens there."""

from __future__ import annotations

import httpx

from tests.service.conftest import endpoint_yaml, serve_fleet, wait

POOL = """        gpus_per_replica: 2
        prefill_tokens_per_s: 12192
        decode_tokens_per_s: 6651
        kv_cache_capacity_tokens: 220000
        decode_step_s: 0.021
        endpoints:
"""
POLICY = """apiVersion: pointsman/v1
kind: RoutingPolicy
rules:
  - name: default
    route: {target: onprem-70b, mode: auto}
"""


def fleet_yaml(engine) -> str:
    def pool(short: str, n: int) -> str:
        return "\n".join(endpoint_yaml(f"{short}-{i}", engine if f"{short}-{i}" == "decode-1" else None) for i in range(n))
    return f"""apiVersion: pointsman/v1
kind: Fleet
defaults: {{output_tokens: 256, scrape_metrics: false}}
targets:
  onprem-70b:
    kind: onprem
    model: meta-llama/Llama-3.3-70B-Instruct
    context_window_tokens: 131072
    usd_per_gpu_hour: 2.5
    kv_bytes_per_token: 327680
    kv_events: {{tokenizer: tokenizer.json, chat_template: template.jinja}}
    pools:
      aggregated:
{POOL}{pool("agg", 2)}
      prefill:
{POOL}{pool("prefill", 2)}
      decode:
{POOL}{pool("decode", 4)}
"""


def words(n: int) -> str:
    return " ".join(f"w{i}" for i in range(n))


def start(tmp_path, serve, standin):
    engine = standin.StandinEngine("vllm").start()
    base, tok = serve_fleet(tmp_path, serve, fleet_yaml(engine), POLICY)
    return engine, base, tok


def hold(base: str, engine, token_ids: list[int]) -> None:
    """decode-1's engine prefills ``token_ids`` and publishes its blocks; returns once the service holds them."""
    _, stored = engine.prefill(token_ids)
    assert stored is not None
    wait(lambda: next(e for e in httpx.get(f"{base}/v1/fleet", timeout=10).json()["targets"]["onprem-70b"]["endpoints"]
                      if e["name"] == "decode-1")["cached_blocks"] >= len(stored.block_hashes),
         "the engine's events never arrived")


def decide(base: str, messages: list[dict]) -> dict:
    r = httpx.post(f"{base}/v1/route", timeout=10,
                   json={"messages": messages, "max_tokens": 200, "routing": {"explain": True}})
    assert r.status_code == 200, r.text
    return r.json()


def check_ran_where_counted(d: dict) -> None:
    """The uncached prompt tokens the mode was decided on are the ones where the request runs aggregated."""
    inputs = d["trace"]["mode"]["inputs"]
    if d["mode"] == "aggregated":
        chosen = next(c for c in d["trace"]["endpoints"][0]["candidates"] if c["endpoint"] == d["endpoints"][0]["name"])
        assert abs(inputs["prompt_tokens"] - chosen["local_hit_tokens"] - inputs["uncached_prompt_tokens"]) <= 1, \
            (d["endpoints"][0]["name"], chosen, inputs, d["trace"]["mode"]["reason"])


def test_a_follow_up_partly_held_on_a_decode_replica_is_not_counted_cached_on_the_aggregated_pool(
        tmp_path, serve, standin):
    engine, base, tok = start(tmp_path, serve, standin)
    try:
        first = [{"role": "user", "content": words(250)}]
        hold(base, engine, tok.prompt_token_ids(first, add_generation_prompt=False))
        follow = [*first, {"role": "assistant", "content": words(120)}, {"role": "user", "content": "and " + words(60)}]
        d = decide(base, follow)
        check_ran_where_counted(d)
        assert d["mode"] == "disaggregated", (d["endpoints"][0], d["trace"]["mode"])
        assert d["trace"]["mode"]["inputs"]["uncached_prompt_tokens"] == d["trace"]["mode"]["inputs"]["prompt_tokens"]
    finally:
        engine.stop()


def test_a_prompt_held_on_a_busy_decode_replica_is_not_counted_cached_where_it_runs(tmp_path, serve, standin):
    engine, base, tok = start(tmp_path, serve, standin)
    try:
        prompt = [{"role": "user", "content": words(1500)}]
        hold(base, engine, tok.prompt_token_ids(prompt))
        idle = decide(base, prompt)  # idle: the holder prefills its few uncached tokens itself
        assert (idle["mode"], idle["endpoints"][0]["name"]) == ("aggregated", "decode-1"), idle["trace"]["mode"]
        check_ran_where_counted(idle)
        httpx.post(f"{base}/v1/outcomes", timeout=10,
                   json={"decision_id": idle["decision_id"], "status": "cancelled"}).raise_for_status()
        load = [{"endpoint": f"agg-{i}", "load": {"num_requests_running": 10, "num_requests_waiting": 0}} for i in range(2)]
        load += [{"endpoint": f"decode-{i}", "load": {"num_requests_running": 40, "num_requests_waiting": 0}}
                 for i in range(4)]
        httpx.post(f"{base}/v1/telemetry", json=load, timeout=10).raise_for_status()
        d = decide(base, prompt)
        check_ran_where_counted(d)
        assert d["mode"] == "disaggregated", (d["endpoints"][0], d["trace"]["mode"])
    finally:
        engine.stop()
