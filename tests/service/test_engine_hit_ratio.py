"""The share of a prompt an engine reports holding is measured in the engine's own tokens: a real
``pointsman serve``, a stand-in vLLM decode engine publishing ``BlockStored`` over ZMQ/msgpack, the target
hashed with a real BPE tokenizer (DeepSeek-V3's, which litellm ships).

A follow-up turn whose first turn and answer the decode engine holds: 2,048 of its 2,426 engine tokens, 84%.
The documented rule keeps such a request on the decode worker holding its KV (``max_local_hit_ratio`` 0.8).
Before, the matched engine tokens were divided by the estimator's own count of the prompt (3,232 WordPiece
tokens): ``prefix_hit_ratio`` read 0.63 and the request was disaggregated, its prefill recomputed on the
prefill pool; on code, where the engine counts more tokens than the estimator, the same 84% read 1.0
("0 uncached prompt tokens")."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import httpx
import pytest

from pointsman.policy.signals.engine_hashes import TargetTokenizer

TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
PARA = "\n".join(f"def handler_{i}(request):\n    payload = json.loads(request.body)\n    return {{'status': 'ok', "
                 f"'id': payload.get('id', {i}), 'items': [x * 2 for x in range({i})]}}" for i in range(120))
TURN1 = [{"role": "user", "content": "Review this module:\n" + PARA},
         {"role": "assistant", "content": "Here is the module with comments:\n" + PARA[:len(PARA) // 2]}]
TURN2 = [*TURN1, {"role": "user", "content": "Now the rest:\n" + PARA[len(PARA) // 2:len(PARA) // 2 + len(PARA) // 4]}]

FLEET = """apiVersion: pointsman/v1
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
        gpus_per_replica: 8
        prefill_tokens_per_s: 12192
        decode_tokens_per_s: 6651
        endpoints: [{{name: agg-0, url: "http://agg-0.internal:8000/v1"}}]
      prefill:
        gpus_per_replica: 8
        prefill_tokens_per_s: 12192
        decode_tokens_per_s: 6651
        endpoints: [{{name: prefill-0, url: "http://prefill-0.internal:8000/v1"}}]
      decode:
        gpus_per_replica: 8
        prefill_tokens_per_s: 12192
        decode_tokens_per_s: 6651
        endpoints:
          - {{name: decode-0, url: "{url}/v1", kv_events: {{url: "{events}", replay_url: "{replay}"}}}}
"""

POLICY = """apiVersion: pointsman/v1
kind: RoutingPolicy
rules:
  - name: default
    route: {target: onprem-70b, mode: auto}
"""


def test_a_follow_up_mostly_held_on_a_decode_worker_stays_there(tmp_path, serve, standin):
    litellm = pytest.importorskip("litellm")
    tokenizer = Path(litellm.__file__).parent / "litellm_core_utils" / "tokenizers" / "deepseek_tokenizer.json"
    if not tokenizer.exists():
        pytest.skip("litellm ships no DeepSeek tokenizer here")
    shutil.copyfile(tokenizer, tmp_path / "tokenizer.json")
    (tmp_path / "template.jinja").write_text(TEMPLATE)
    engine = standin.StandinEngine("vllm").start()
    try:
        (tmp_path / "fleet.yaml").write_text(FLEET.format(url=engine.base_url, events=engine.kv_events_url,
                                                          replay=engine.replay_url))
        (tmp_path / "policy.yaml").write_text(POLICY)
        _, base = serve(tmp_path / "data", fleet_path=tmp_path / "fleet.yaml", policy_path=tmp_path / "policy.yaml",
                        watch_policy="false", watch_fleet="false", scrape_interval_s=0)
        tok = TargetTokenizer.from_files(tmp_path / "tokenizer.json", chat_template_file=tmp_path / "template.jinja")
        _, stored = engine.prefill(tok.prompt_token_ids(TURN1, add_generation_prompt=False))
        assert stored is not None
        ids = tok.prompt_token_ids(TURN2)
        held = len(stored.block_hashes) * 16
        assert 0.82 < held / len(ids) < 0.86  # what the engine holds of the follow-up, in its own tokens

        def decide() -> dict:
            r = httpx.post(f"{base}/v1/route", timeout=10, json={"messages": TURN2, "max_tokens": 400,
                                                                 "routing": {"explain": True}})
            assert r.status_code == 200, r.text
            return r.json()

        deadline = time.monotonic() + 15
        while next(e for e in httpx.get(f"{base}/v1/fleet", timeout=10).json()["targets"]["onprem-70b"]["endpoints"]
                   if e["name"] == "decode-0")["cached_blocks"] < len(stored.block_hashes):
            assert time.monotonic() < deadline, "the engine's events never arrived"
            time.sleep(0.05)
        d = decide()
        ratio = d["trace"]["mode"]["inputs"]["prefix_hit_ratio"]
        assert ratio == pytest.approx(held / len(ids), abs=0.01)
        assert (d["mode"], d["endpoints"][0]["name"]) == ("aggregated", "decode-0")
        assert d["trace"]["mode"]["reason"].startswith("stay local")
    finally:
        engine.stop()
