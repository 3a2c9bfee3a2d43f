"""The check that an engine hashes its blocks as the fleet says reads vLLM's ``extra_keys``: a real ``pointsman serve``
fed by stand-in vLLM engines over ZMQ/msgpack (``tests/fixtures/standin_engine.py``: their hashes and extra keys
computed apart from the product's, as vLLM's ``generate_block_hash_extra_keys`` builds them: the adapter's name in
every block's, the salt in the first block's).

Every chain-starting ``BlockStored`` is checked (``pointsman_kv_events{kind="root_blocks"}``) and one hashed otherwise
is counted (``kind="hash_mismatches"``). Before, the check hashed every first block as a plain one: a salted prompt's
counted as a mismatch (a false alarm, and a feed starting with one was logged as hashed otherwise than its fleet entry
says), a LoRA adapter's was not checked at all. vLLM ≥ 0.17 sends each block's extra keys, so each is hashed with
its own: salted and LoRA first blocks are checked exactly, for the map layout (0.24) and the positional one (0.17),
and a feed hashed otherwise (another seed) still mismatches on every one."""

from __future__ import annotations

import httpx

from tests.service.conftest import TO_8B, endpoint_yaml, event_fed_fleet, serve_fleet, wait

PROMPT = [{"role": "user", "content": "Summarise the incident. " + " ".join(
    f"at {i} minutes past, replica {i % 4} shed load." for i in range(40))}]
# (cache_salt, lora_name) of each prefill: one chain each, its first block hashed with its own extra keys
NAMESPACES = [(None, None), ("tenant-a", None), (None, "sql-lora"), ("tenant-a", "sql-lora")]


def kv_counts(base: str) -> dict[str, dict[str, float]]:
    """``pointsman_kv_events`` root_blocks and hash_mismatches by endpoint name."""
    out: dict[str, dict[str, float]] = {}
    for line in httpx.get(f"{base}/metrics", timeout=10).text.splitlines():
        if line.startswith("pointsman_kv_events{"):
            endpoint = line.split('endpoint="', 1)[1].split('"', 1)[0]
            kind = line.split('kind="', 1)[1].split('"', 1)[0]
            if kind in ("root_blocks", "hash_mismatches"):
                out.setdefault(endpoint, {})[kind] = float(line.rsplit(" ", 1)[1])
    return out


def test_salted_and_lora_first_blocks_are_checked_with_their_extra_keys(tmp_path, serve, standin):
    engines = {"map-0.24": standin.StandinEngine("vllm", version="0.24.0"),
               "positional-0.17": standin.StandinEngine("vllm", version="0.17.0"),
               "other-seed": standin.StandinEngine("vllm", version="0.24.0", seed="7")}
    try:
        for e in engines.values():
            e.start()
        endpoints = "\n".join(endpoint_yaml(name, e) for name, e in engines.items())
        base, tok = serve_fleet(tmp_path, serve, event_fed_fleet(endpoints, "    lora_adapters: [sql-lora]\n"), TO_8B)
        ids = tok.prompt_token_ids(PROMPT)
        blocks = {}
        for name, e in engines.items():
            stored = [e.prefill(ids, cache_salt=salt, lora_name=lora)[1] for salt, lora in NAMESPACES]
            assert all(s is not None and s.parent_block_hash is None for s in stored)
            assert len({s.block_hashes[0] for s in stored}) == len(NAMESPACES)
            blocks[name] = sum(len(s.block_hashes) for s in stored)
        wait(lambda: {e["name"]: e["cached_blocks"] for e in httpx.get(f"{base}/v1/fleet", timeout=10).json()[
            "targets"]["onprem-8b"]["endpoints"]} == blocks, "the engines' events never arrived")
        n = len(NAMESPACES)
        assert kv_counts(base) == {"map-0.24": {"root_blocks": n, "hash_mismatches": 0},
                                   "positional-0.17": {"root_blocks": n, "hash_mismatches": 0},
                                   "other-seed": {"root_blocks": n, "hash_mismatches": n}}
    finally:
        for e in engines.values():
            e.stop()
