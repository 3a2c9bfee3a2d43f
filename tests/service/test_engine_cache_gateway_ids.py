"""A request that carries the gateway's ``routing.prefix_block_hashes`` is matched against what the engines
report holding (KV events) on a target that has them: a real ``pointsman serve``, stand-in vLLM engines
publishing ``BlockStored`` over ZMQ/msgpack.

Before, gateway ids sent such a request to Pointsman's own estimate index, which event-fed targets never
record into: every endpoint held 0 tokens of it (``cache_sources`` "estimate"), so a conversation whose
prefix an engine reported holding in full was placed as if cold, on the other endpoint half the time."""

from __future__ import annotations

import httpx

from pointsman.policy.signals.engine_hashes import TargetTokenizer
from tests.service.test_live_state_e2e import INTERVAL_S, LONG, done, eventually, write_files


def test_gateway_ids_do_not_hide_what_the_engines_report(tmp_path, serve, standin):
    engines = [standin.StandinEngine("vllm").start() for _ in range(2)]
    try:
        tokenizer, template = write_files(tmp_path, engines)
        _, base = serve(tmp_path / "data", fleet_path=tmp_path / "fleet.yaml", policy_path=tmp_path / "policy.yaml",
                        watch_policy="false", watch_fleet="false", scrape_interval_s=INTERVAL_S, scrape_timeout_s=0.3)
        ids = TargetTokenizer.from_files(tokenizer, chat_template_file=template).prompt_token_ids(
            [{"role": "user", "content": LONG}])
        _, stored = engines[1].prefill(ids)
        assert stored is not None and len(stored.block_hashes) >= 10
        e1 = f"{engines[1].base_url}/v1"

        def decide(gateway_ids: list[int] | None) -> dict:
            routing: dict = {"explain": True}
            if gateway_ids is not None:
                routing["prefix_block_hashes"] = gateway_ids
            d = httpx.post(f"{base}/v1/route", json={"messages": [{"role": "user", "content": LONG}], "routing": routing},
                           timeout=10).json()
            done(base, d)
            return d

        assert eventually(lambda: decide(None)["endpoints"][0]["url"] == e1)  # the events have arrived
        for _ in range(4):
            d = decide([101, 102, 103])
            assert d["trace"]["cache_sources"]["onprem-8b"] == "engine events"
            assert d["endpoints"][0]["url"] == e1
            assert d["trace"]["endpoints"][0]["candidates"][0]["local_hit_tokens"] > 0
    finally:
        for e in engines:
            e.stop()
