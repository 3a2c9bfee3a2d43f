"""A small fleet (one Llama 3.1 8B target, prefill + decode pools, no frontier) and policy, and
synthetic Mooncake-format traces, for the planner's tests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

FLEET = """\
apiVersion: pointsman/v1
kind: Fleet
metadata: {name: plan-test}
defaults: {scrape_metrics: false, slo_class: interactive}
slo_classes:
  interactive: {ttft_s: 2.0, tpot_s: 0.1}
targets:
  small:
    kind: onprem
    model: meta-llama/Llama-3.1-8B-Instruct
    context_window_tokens: 131072
    usd_per_gpu_hour: 2.5
    power_kw_per_gpu: 1.275
    usd_per_kwh: 0.1
    default_mode: disaggregated
    kv_bytes_per_token: 131072
    pools:
      prefill:
        gpus_per_replica: 1
        prefill_tokens_per_s: 55200
        decode_tokens_per_s: 22714
        endpoints:
          - {name: small-prefill-0, url: "http://small-prefill-0.test:8000/v1"}
      decode:
        gpus_per_replica: 1
        prefill_tokens_per_s: 55200
        decode_tokens_per_s: 22714
        endpoints:
          - {name: small-decode-0, url: "http://small-decode-0.test:8000/v1"}
          - {name: small-decode-1, url: "http://small-decode-1.test:8000/v1"}
    replay: {weight_dtype: fp8, max_waiting: null}
replay: {spill_target: null}
"""

POLICY = """\
apiVersion: pointsman/v1
kind: RoutingPolicy
metadata: {name: all-disaggregated}
disaggregation: {min_pool_gpus: 0, min_uncached_prompt_tokens: 0, min_output_tokens: 0, max_prefill_queue_s: 1000}
rules:
  - name: default
    route: {target: small, mode: disaggregated}
"""


def write_trace(path: Path, n: int, rate_rps: float, prompt_tokens: int, output_tokens: int) -> Path:
    """A Mooncake-format trace: ``n`` requests at ``rate_rps``, distinct prompts (no shared prefix)."""
    blocks = prompt_tokens // 512
    lines = [json.dumps({"timestamp": int(i * 1000 / rate_rps), "input_length": prompt_tokens,
                         "output_length": output_tokens, "hash_ids": list(range(i * blocks, (i + 1) * blocks))})
             for i in range(n)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture
def plan_files(tmp_path: Path) -> tuple[Path, Path]:
    """(fleet, policy) files of the small test fleet."""
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(FLEET, encoding="utf-8")
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY, encoding="utf-8")
    return fleet, policy
