"""SGLang's KV events through a real ``pointsman serve``: a stand-in SGLang engine publishing ``BlockStored``
over ZMQ/msgpack with SGLang's own page hashes (``tests/fixtures/standin_engine.py``: chained SHA-256 over
little-endian token ids, the first 8 bytes as a signed int64; written apart from the product's), the target
hashed with a real BPE tokenizer (DeepSeek-V3's, which litellm ships).

Before, events were always read as vLLM's: an SGLang feed stored its blocks under keys no request ever
hashes to, so the engine's cache read empty and nothing said why. Now a fleet names ``kv_events.engine:
sglang`` and its requests are hashed as SGLang hashes them; a feed hashed otherwise than its fleet entry says
is reported (an error naming the settings that would match, and ``pointsman_kv_events{kind="hash_mismatches"}``)."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import httpx
import pytest

from pointsman.policy.signals.engine_hashes import TargetTokenizer

TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
PARA = "\n".join(f"Section {i}: the tenant shall keep the premises at {i} Elm Street in good repair, "
                 f"and notify the landlord of any defect within {i % 9 + 1} days." for i in range(80))
TURN1 = [{"role": "user", "content": "Summarise this lease:\n" + PARA}]
TURN2 = [*TURN1, {"role": "assistant", "content": "It is a lease."}, {"role": "user", "content": "And repairs?"}]

FLEET = """apiVersion: pointsman/v1
kind: Fleet
defaults: {{output_tokens: 64, scrape_metrics: false}}
targets:
  onprem-8b:
    kind: onprem
    model: meta-llama/Llama-3.1-8B-Instruct
    context_window_tokens: 131072
    usd_per_gpu_hour: 2.5
    kv_events: {{tokenizer: tokenizer.json, chat_template: template.jinja, block_size: 16{engine}}}
    pools:
      aggregated:
        gpus_per_replica: 1
        prefill_tokens_per_s: 10000
        decode_tokens_per_s: 20000
        endpoints:
          - {{name: sg-0, url: "{url}/v1", kv_events: {{url: "{events}", replay_url: "{replay}"}}}}
          - {{name: agg-1, url: "http://agg-1.internal:8000/v1"}}
"""

POLICY = """apiVersion: pointsman/v1
kind: RoutingPolicy
rules:
  - name: default
    route: {target: onprem-8b}
"""


def _kv_counts(base: str) -> dict[str, float]:
    out = {}
    for line in httpx.get(f"{base}/metrics", timeout=10).text.splitlines():
        if line.startswith("pointsman_kv_events{") and 'endpoint="sg-0"' in line:
            kind = line.split('kind="', 1)[1].split('"', 1)[0]
            out[kind] = float(line.rsplit(" ", 1)[1])
    return out


@pytest.mark.parametrize("engine", ["", "sglang"])
def test_an_sglang_feed_is_matched_or_said_not_to_be(tmp_path, serve, standin, engine):
    litellm = pytest.importorskip("litellm")
    tokenizer = Path(litellm.__file__).parent / "litellm_core_utils" / "tokenizers" / "deepseek_tokenizer.json"
    if not tokenizer.exists():
        pytest.skip("litellm ships no DeepSeek tokenizer here")
    shutil.copyfile(tokenizer, tmp_path / "tokenizer.json")
    (tmp_path / "template.jinja").write_text(TEMPLATE)
    (tmp_path / "policy.yaml").write_text(POLICY)
    sglang = standin.StandinEngine("sglang", block_size=16).start()
    try:
        (tmp_path / "fleet.yaml").write_text(FLEET.format(url=sglang.base_url, events=sglang.kv_events_url,
                                                          replay=sglang.replay_url,
                                                          engine=f", engine: {engine}" if engine else ""))
        proc, base = serve(tmp_path / "data", fleet_path=tmp_path / "fleet.yaml", policy_path=tmp_path / "policy.yaml",
                           watch_policy="false",
                           watch_fleet="false", scrape_interval_s=0)
        tok = TargetTokenizer.from_files(tmp_path / "tokenizer.json", chat_template_file=tmp_path / "template.jinja")
        _, stored = sglang.prefill(tok.prompt_token_ids(TURN1, add_generation_prompt=False))
        assert stored is not None and stored.parent_block_hash is None
        held = len(stored.block_hashes) * 16
        deadline = time.monotonic() + 15
        while _kv_counts(base).get("root_blocks", 0) < 1:
            assert time.monotonic() < deadline, "the engine's events never arrived"
            time.sleep(0.05)
        r = httpx.post(f"{base}/v1/route", timeout=10, json={"messages": TURN2, "max_tokens": 64,
                                                             "routing": {"explain": True}})
        assert r.status_code == 200, r.text
        pick = next(p for p in r.json()["trace"]["endpoints"] if p["role"] == "aggregated")
        hit = {x["endpoint"]: x["local_hit_tokens"] for x in pick["candidates"]}["sg-0"]
        counts = _kv_counts(base)
        if engine == "sglang":
            assert hit > 1000 and held > 1000  # held: 2,480 of its 2,515 engine tokens; hit: that share in request tokens
            assert counts["hash_mismatches"] == 0
        else:  # read as vLLM's: nothing matches, and the service says so
            assert hit == 0
            assert counts["hash_mismatches"] == counts["root_blocks"] == 1
            proc.terminate()
            proc.wait(timeout=30)
            err = proc.stderr.read().decode()
            assert "KV events of sg-0 (target onprem-8b) are not hashed as its kv_events section says" in err
            assert "Its blocks hash as with engine: sglang, block_size: 16." in err
    finally:
        sglang.stop()
