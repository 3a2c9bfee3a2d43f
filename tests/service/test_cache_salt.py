"""A request's vLLM ``cache_salt`` is hashed as the engine hashes it: a real ``pointsman serve`` and two stand-in
vLLM engines publishing ``BlockStored`` over ZMQ/msgpack, their hashes computed by the fixture (the salt in the
first block's extra keys, as vLLM's ``generate_block_hash_extra_keys``).

agg-0 holds the prompt unsalted, agg-1 holds it salted ``tenant-a``. Before, Pointsman hashed every request
unsalted: the ``tenant-a`` request read agg-0 as holding its 1,006-token prompt and was sent there, where vLLM
reuses none of it (another salt), and read agg-1, which holds it, as cold."""

from __future__ import annotations

import shutil
import time

import httpx

from pointsman.estimator.model_source import bundled_model_dir
from pointsman.policy.signals.engine_hashes import TargetTokenizer

TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
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
        prefill_tokens_per_s: 20000
        decode_tokens_per_s: 20000
        endpoints:
{endpoints}
"""
POLICY = """apiVersion: pointsman/v1
kind: RoutingPolicy
rules:
  - name: default
    route: {target: onprem-8b}
"""
PROMPT = [{"role": "user", "content": "Summarise this report. " + " ".join(
    f"step {i}: the cache warmed and the queue drained." for i in range(90))}]


def test_a_salted_request_matches_only_blocks_of_its_own_salt(tmp_path, serve, standin):
    engines = [standin.StandinEngine("vllm").start() for _ in range(2)]
    try:
        shutil.copyfile(bundled_model_dir() / "tokenizer.json", tmp_path / "tokenizer.json")
        (tmp_path / "template.jinja").write_text(TEMPLATE)
        endpoints = "\n".join(f'          - {{name: agg-{i}, url: "{e.base_url}/v1", kv_events: {{url: "{e.kv_events_url}", '
                              f'replay_url: "{e.replay_url}"}}}}' for i, e in enumerate(engines))
        (tmp_path / "fleet.yaml").write_text(FLEET.format(endpoints=endpoints))
        (tmp_path / "policy.yaml").write_text(POLICY)
        _, base = serve(tmp_path / "data", fleet_path=tmp_path / "fleet.yaml", policy_path=tmp_path / "policy.yaml",
                        watch_policy="false", watch_fleet="false", scrape_interval_s=0)
        ids = TargetTokenizer.from_files(tmp_path / "tokenizer.json",
                                         chat_template_file=tmp_path / "template.jinja").prompt_token_ids(PROMPT)
        held = [engines[0].prefill(ids)[1], engines[1].prefill(ids, cache_salt="tenant-a")[1]]
        assert held[0] is not None and held[1] is not None and held[0].block_hashes[0] != held[1].block_hashes[0]
        deadline = time.monotonic() + 15
        while [e["cached_blocks"] for e in httpx.get(f"{base}/v1/fleet", timeout=10).json()["targets"]["onprem-8b"][
                "endpoints"]] != [len(h.block_hashes) for h in held]:
            assert time.monotonic() < deadline, "the engines' events never arrived"
            time.sleep(0.05)

        def hits(**salt: str) -> tuple[str, dict[str, int]]:
            r = httpx.post(f"{base}/v1/route", timeout=10,
                           json={"messages": PROMPT, "max_tokens": 64, "routing": {"explain": True}, **salt})
            assert r.status_code == 200, r.text
            d = r.json()
            httpx.post(f"{base}/v1/outcomes", timeout=10,
                       json={"decision_id": d["decision_id"], "status": "cancelled"}).raise_for_status()
            return d["endpoints"][0]["name"], {c["endpoint"]: c["local_hit_tokens"] for c in d["trace"]["endpoints"][0]["candidates"]}

        chosen, salted = hits(cache_salt="tenant-a")
        assert chosen == "agg-1" and salted["agg-0"] == 0 and salted["agg-1"] > 0, salted
        chosen, plain = hits()
        assert chosen == "agg-0" and plain["agg-1"] == 0 and plain["agg-0"] == salted["agg-1"], plain
        assert hits(cache_salt="tenant-b")[1] == {"agg-0": 0, "agg-1": 0}
    finally:
        for e in engines:
            e.stop()
