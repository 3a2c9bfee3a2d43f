"""A request's vLLM ``cache_salt`` is hashed as the engine hashes it: a real ``pointsman serve`` and two stand-in
vLLM engines publishing ``BlockStored`` over ZMQ/msgpack, their hashes computed by the fixture (the salt in the
first block's extra keys, as vLLM's ``generate_block_hash_extra_keys``).

agg-0 holds the prompt unsalted, agg-1 holds it salted ``tenant-a``. Before, Pointsman hashed every request
unsalted: the ``tenant-a`` request read agg-0 as holding its 1,006-token prompt and was sent there, where vLLM
reuses none of it (another salt), and read agg-1, which holds it, as cold."""

from __future__ import annotations

import httpx

from tests.service.conftest import TO_8B, endpoint_yaml, event_fed_fleet, route, serve_fleet, wait

PROMPT = [{"role": "user", "content": "Summarise this report. " + " ".join(
    f"step {i}: the cache warmed and the queue drained." for i in range(90))}]


def test_a_salted_request_matches_only_blocks_of_its_own_salt(tmp_path, serve, standin):
    engines = [standin.StandinEngine("vllm").start() for _ in range(2)]
    try:
        endpoints = "\n".join(endpoint_yaml(f"agg-{i}", e) for i, e in enumerate(engines))
        base, tok = serve_fleet(tmp_path, serve, event_fed_fleet(endpoints), TO_8B)
        ids = tok.prompt_token_ids(PROMPT)
        held = [engines[0].prefill(ids)[1], engines[1].prefill(ids, cache_salt="tenant-a")[1]]
        assert held[0] is not None and held[1] is not None and held[0].block_hashes[0] != held[1].block_hashes[0]
        wait(lambda: [e["cached_blocks"] for e in httpx.get(f"{base}/v1/fleet", timeout=10).json()["targets"][
            "onprem-8b"]["endpoints"]] == [len(h.block_hashes) for h in held], "the engines' events never arrived")

        def hits(**salt: str) -> tuple[str, dict[str, int]]:
            d = route(base, {"messages": PROMPT, "max_tokens": 64, "routing": {"explain": True}, **salt})
            return d["endpoints"][0]["name"], {c["endpoint"]: c["local_hit_tokens"] for c in d["trace"]["endpoints"][0]["candidates"]}

        chosen, salted = hits(cache_salt="tenant-a")
        assert chosen == "agg-1" and salted["agg-0"] == 0 and salted["agg-1"] > 0, salted
        chosen, plain = hits()
        assert chosen == "agg-0" and plain["agg-1"] == 0 and plain["agg-0"] == salted["agg-1"], plain
        assert hits(cache_salt="tenant-b")[1] == {"agg-0": 0, "agg-1": 0}
    finally:
        for e in engines:
            e.stop()
