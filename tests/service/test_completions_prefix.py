"""A Completions request (``prompt``) is hashed as a vLLM completions endpoint tokenises it: the raw prompt with the
tokenizer's special tokens, no chat template; a prompt of token ids as those ids. A real ``pointsman serve`` and
two stand-in vLLM engines publishing ``BlockStored`` over ZMQ/msgpack.

Before, the prompt was rendered through the target's chat template as a user message, so its hashes matched no
block a completions endpoint ever caches: agg-1, holding the whole 1,000-token prompt, read 0 cached tokens and the
request went wherever the tie rotation sent it."""

from __future__ import annotations

import httpx
import pytest

from tests.service.conftest import TO_8B, endpoint_yaml, event_fed_fleet, route, serve_fleet, wait

TEXT = "Summarise this report. " + " ".join(f"step {i}: the cache warmed and the queue drained." for i in range(90))


@pytest.mark.parametrize("as_ids", [False, True], ids=["text", "token-ids"])
def test_a_completions_prompt_matches_the_blocks_its_engine_cached(tmp_path, serve, standin, as_ids):
    engines = [standin.StandinEngine("vllm").start() for _ in range(2)]
    try:
        endpoints = "\n".join(endpoint_yaml(f"agg-{i}", e) for i, e in enumerate(engines))
        base, tok = serve_fleet(tmp_path, serve, event_fed_fleet(endpoints), TO_8B)
        ids = tok.token_ids(TEXT, add_special_tokens=True)  # vLLM's CompletionRequest.add_special_tokens: True
        _, stored = engines[1].prefill(ids)
        assert stored is not None
        wait(lambda: httpx.get(f"{base}/v1/fleet", timeout=10).json()["targets"]["onprem-8b"]["endpoints"][1][
            "cached_blocks"] >= len(stored.block_hashes), "the engine's events never arrived")
        for _ in range(2):  # whatever the tie rotation's turn
            d = route(base, {"model": "auto", "prompt": ids if as_ids else TEXT, "max_tokens": 64, "routing": {"explain": True}})
            hits = {c["endpoint"]: c["local_hit_tokens"] for c in d["trace"]["endpoints"][0]["candidates"]}
            assert d["endpoints"][0]["name"] == "agg-1" and hits["agg-0"] == 0, hits
            assert hits["agg-1"] >= 0.95 * d["prompt_tokens"], (hits, d["prompt_tokens"])
    finally:
        for e in engines:
            e.stop()
