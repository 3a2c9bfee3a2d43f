"""A disaggregated request's decode side counts the prefix it holds: a real ``pointsman serve``, stand-in vLLM
engines on decode-2 and prefill-1 publishing ``BlockStored`` over ZMQ/msgpack.

The fleet: 2 aggregated, 2 prefill and 4 decode replicas of 2 GPUs (the P/D pools 12 GPUs), 320 KiB of KV per
token over a 1 GB/s link (so the transfer is visible: 0.33 s per 1,000 tokens). vLLM's P/D connectors read only the
blocks missing from the decode side's prefix cache. Before, the decode replica was picked by load alone: decode-2
holding a multi-turn conversation's previous turn (~870 of ~1,140 tokens) was passed over for decode-0 (file order
among the idle), and ``transfer_s`` counted the whole prompt; the mode trace of a disaggregated request whose prefill
replica held the prompt showed the whole prompt as ``uncached_prompt_tokens``."""

from __future__ import annotations

import httpx
import pytest

from pointsman.policy.selection.latency import LINK_LATENCY_S
from tests.service.conftest import endpoint_yaml, serve_fleet, wait

POOL = """        gpus_per_replica: 2
        prefill_tokens_per_s: 12192
        decode_tokens_per_s: 6651
        endpoints:
"""
KV_BYTES, LINK = 327680, 1.0e9
# the first rule never matches; reading predict[] puts the predictions in the trace
POLICY = """apiVersion: pointsman/v1
kind: RoutingPolicy
rules:
  - name: never
    when: 'predict["onprem-70b"].transfer_s < 0.0'
    route: {target: onprem-70b}
  - name: d
    route: {target: onprem-70b, mode: auto}
"""


def fleet_yaml(engines: dict) -> str:
    pools = "".join(f"      {role}:\n{POOL}" + "\n".join(endpoint_yaml(f"{short}-{i}", engines.get(f"{short}-{i}"))
                                                        for i in range(n)) + "\n"
                    for role, short, n in (("aggregated", "agg", 2), ("prefill", "prefill", 2), ("decode", "decode", 4)))
    return f"""apiVersion: pointsman/v1
kind: Fleet
defaults: {{output_tokens: 256, scrape_metrics: false}}
targets:
  onprem-70b:
    kind: onprem
    model: meta-llama/Llama-3.3-70B-Instruct
    context_window_tokens: 131072
    usd_per_gpu_hour: 2.5
    kv_bytes_per_token: {KV_BYTES}
    kv_link_bytes_per_s: {LINK}
    kv_events: {{tokenizer: tokenizer.json, chat_template: template.jinja}}
    pools:
{pools}"""


def words(n: int) -> str:
    return " ".join(f"w{i}" for i in range(n))


@pytest.fixture
def service(tmp_path, serve, standin):
    engines = {name: standin.StandinEngine("vllm").start() for name in ("decode-2", "prefill-1")}
    try:
        base, tok = serve_fleet(tmp_path, serve, fleet_yaml(engines), POLICY)
        yield base, engines, tok
    finally:
        for e in engines.values():
            e.stop()


def hold(base: str, engine, name: str, token_ids: list[int]) -> int:
    """``name``'s engine prefills ``token_ids`` and publishes its blocks; returns their count once the service holds
    them."""
    _, stored = engine.prefill(token_ids)
    assert stored is not None
    wait(lambda: next(e for e in httpx.get(f"{base}/v1/fleet", timeout=10).json()["targets"]["onprem-70b"]["endpoints"]
                      if e["name"] == name)["cached_blocks"] >= len(stored.block_hashes), "the engine's events never arrived")
    return len(stored.block_hashes)


def decide(base: str, messages: list[dict]) -> dict:
    r = httpx.post(f"{base}/v1/route", timeout=10, json={"messages": messages, "max_tokens": 200,
                                                         "routing": {"explain": True}})
    assert r.status_code == 200, r.text
    return r.json()


def test_the_decode_replica_holding_the_previous_turn_is_chosen_and_receives_only_the_rest(service):
    base, engines, tok = service
    first = [{"role": "user", "content": words(250)}]
    hold(base, engines["decode-2"], "decode-2", tok.prompt_token_ids(first, add_generation_prompt=False))
    follow = [*first, {"role": "assistant", "content": words(60)}, {"role": "user", "content": "and " + words(40)}]
    d = decide(base, follow)
    assert d["mode"] == "disaggregated", d["trace"]["mode"]
    decode = next(p for p in d["trace"]["endpoints"] if p["role"] == "decode")
    chosen = {c["endpoint"]: c for c in decode["candidates"]}
    assert [e["name"] for e in d["endpoints"] if e["role"] == "decode"][0] == "decode-2", decode
    held, prompt = chosen["decode-2"]["local_hit_tokens"], d["prompt_tokens"]
    assert 0.6 * prompt < held < prompt, (held, prompt)
    assert chosen["decode-2"]["transfer"] == pytest.approx(LINK_LATENCY_S + (prompt - held) * KV_BYTES / LINK)
    assert chosen["decode-0"]["transfer"] == pytest.approx(LINK_LATENCY_S + prompt * KV_BYTES / LINK)
    predicted = d["trace"]["prediction"]["onprem-70b/disaggregated"]
    assert predicted["transfer_s"] == pytest.approx(chosen["decode-2"]["transfer"]), predicted
    assert predicted["inputs"]["decode_cached_tokens"] == held, predicted


def test_a_disaggregated_trace_counts_what_the_prefill_replica_holds_as_cached(service):
    base, engines, tok = service
    prompt = [{"role": "user", "content": words(1500)}]
    blocks = hold(base, engines["prefill-1"], "prefill-1", tok.prompt_token_ids(prompt))
    d = decide(base, prompt)
    assert d["mode"] == "disaggregated" and d["endpoints"][0]["name"] == "prefill-1", d["trace"]["mode"]
    inputs = d["trace"]["mode"]["inputs"]
    prefill = {c["endpoint"]: c for c in d["trace"]["endpoints"][0]["candidates"]}["prefill-1"]
    assert prefill["local_hit_tokens"] >= 0.9 * inputs["prompt_tokens"] and blocks > 0, prefill
    assert inputs["uncached_prompt_tokens"] == inputs["prompt_tokens"] - prefill["local_hit_tokens"], inputs
    assert inputs["aggregated_uncached_prompt_tokens"] == inputs["prompt_tokens"], inputs  # what the rules read
