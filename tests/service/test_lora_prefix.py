"""A request for a LoRA adapter matches only blocks computed for that adapter: a real ``pointsman serve``, two
stand-in vLLM engines publishing ``BlockStored`` over ZMQ/msgpack (their hashes computed by the fixture: the
adapter's name in every block's extra keys, as vLLM's ``generate_block_hash_extra_keys``), and a target without
events whose estimate records what Pointsman dispatched.

vLLM's OpenAI server selects an adapter by the request's ``model`` (the name of ``--lora-modules name=path``); the
fleet lists the names a target's engines serve (``lora_adapters``). agg-0 holds the prompt for the base model,
agg-1 for ``sql-lora``. Before, Pointsman hashed every request as the base model's: a ``sql-lora`` request read
agg-0 as holding its prompt and was sent there, where vLLM reuses none of it, read agg-1, which holds it, as cold,
and was answered with the base model's name, so the gateway forwarded it without its adapter."""

from __future__ import annotations

import httpx

from tests.service.conftest import endpoint_yaml, event_fed_fleet, route, serve_fleet, wait

#: A second target on the text-hash estimate (no engine events), serving sql-lora too.
ESTIMATED = """  onprem-est:
    kind: onprem
    model: meta-llama/Llama-3.1-8B-Instruct
    lora_adapters: [sql-lora]
    context_window_tokens: 131072
    usd_per_gpu_hour: 2.5
    pools:
      aggregated:
        gpus_per_replica: 1
        prefill_tokens_per_s: 20000
        decode_tokens_per_s: 20000
        endpoints:
"""
POLICY = """apiVersion: pointsman/v1
kind: RoutingPolicy
rules:
  - name: estimate
    when: request.tenant == "est"
    route: {target: onprem-est}
  - name: default
    route: {target: onprem-8b}
"""
PROMPT = [{"role": "user", "content": "Write the SQL for this report. " + " ".join(
    f"table {i}: orders joined to customers on id." for i in range(90))}]


def test_a_lora_request_matches_only_its_adapters_blocks(tmp_path, serve, standin):
    engines = [standin.StandinEngine("vllm").start() for _ in range(2)]
    try:
        endpoints = "\n".join(endpoint_yaml(f"agg-{i}", e) for i, e in enumerate(engines))
        estimated = "\n".join(endpoint_yaml(f"est-{i}") for i in range(2))
        base, tok = serve_fleet(tmp_path, serve, event_fed_fleet(endpoints, "    lora_adapters: [sql-lora, chat-lora]\n",
                                                       ESTIMATED + estimated), POLICY)
        ids = tok.prompt_token_ids(PROMPT)
        held = [engines[0].prefill(ids)[1], engines[1].prefill(ids, lora_name="sql-lora")[1]]
        assert held[0] is not None and held[1] is not None and held[0].block_hashes[-1] != held[1].block_hashes[-1]
        wait(lambda: [e["cached_blocks"] for e in httpx.get(f"{base}/v1/fleet", timeout=10).json()["targets"][
            "onprem-8b"]["endpoints"]] == [len(h.block_hashes) for h in held], "the engines' events never arrived")

        def hits(model: str | None, **more: object) -> tuple[str, str, dict[str, int]]:
            body = {"messages": PROMPT, "max_tokens": 64, "routing": {"explain": True, **more.pop("routing", {})},
                    **({"model": model} if model else {}), **more}
            d = route(base, body)
            return d["model"], d["endpoints"][0]["name"], {
                c["endpoint"]: c["local_hit_tokens"] for c in d["trace"]["endpoints"][0]["candidates"]}

        model, chosen, lora = hits("sql-lora")
        assert (model, chosen) == ("sql-lora", "agg-1") and lora["agg-0"] == 0 and lora["agg-1"] > 0, lora
        model, chosen, plain = hits(None)
        assert model == "meta-llama/Llama-3.1-8B-Instruct" and chosen == "agg-0", (model, chosen)
        assert plain["agg-1"] == 0 and plain["agg-0"] == lora["agg-1"], plain
        assert hits("chat-lora")[::2] == ("chat-lora", {"agg-0": 0, "agg-1": 0})
        assert hits("sql-lora", cache_salt="tenant-a")[2] == {"agg-0": 0, "agg-1": 0}

        # the estimate: what a sql-lora request was dispatched with is that adapter's, on its endpoint only
        est = {"routing": {"tenant": "est"}}
        _, first, _ = hits("sql-lora", **est)
        model, _, again = hits("sql-lora", **est)
        assert model == "sql-lora" and again[first] > 0, again
        assert hits(None, **est)[2][first] == 0
    finally:
        for e in engines:
            e.stop()
