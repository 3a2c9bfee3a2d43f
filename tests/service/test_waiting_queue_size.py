"""A waiting queue Pointsman did not fill is sized by the engine's own mean prompt, not by the request asking: a
real ``pointsman serve`` scraping two stand-in vLLM engines' ``/metrics`` (Prometheus text written by
prometheus_client with vLLM's names).

Each 70B replica (12,192 prefill tokens/s) reports 4 requests waiting, none running, 20 finished requests of
500 prompt tokens (``vllm:request_prompt_tokens``) and half its queried prompt tokens found in its prefix cache. The
queue ahead of any new request is then 4 x 500 x 0.5 tokens: 0.082 s. Before, each waiting request counted the
asking request's own prompt: 2.625 s ahead of an 8,000-token prompt (predicted TTFT 3.28 s, over the 2 s objective:
sent to the frontier tier by ``overflow``) and 0.033 s ahead of a 100-token one, for the same queue.

Saturated replicas (120 running, 40 waiting, 50 finished 800-token prompts) with one short request of Pointsman's in
flight: before, that request's 20 tokens sized all 40 waiting ones (0.07 s of queue) and the next request stayed
on-prem; now the queue reads 2.6 s and it overflows to the frontier tier."""

from __future__ import annotations

import httpx
import pytest

from tests.service.conftest import route, serve_fleet, wait

FLEET = """apiVersion: pointsman/v1
kind: Fleet
defaults: {{output_tokens: 64, scrape_metrics: true}}
targets:
  onprem-70b:
    kind: onprem
    model: meta-llama/Llama-3.3-70B-Instruct
    context_window_tokens: 131072
    usd_per_gpu_hour: 2.5
    pools:
      aggregated:
        gpus_per_replica: 2
        prefill_tokens_per_s: 12192
        decode_tokens_per_s: 6651
        decode_step_s: 0.021
        endpoints:
{endpoints}
  frontier-small:
    kind: frontier
    provider: openai
    model: gpt-4o-mini
    base_url: https://api.openai.com/v1
    context_window_tokens: 128000
    prices: {{usd_per_1m_input_tokens: 0.15, usd_per_1m_cached_input_tokens: 0.075, usd_per_1m_output_tokens: 0.6}}
"""
POLICY = """apiVersion: pointsman/v1
kind: RoutingPolicy
rules:
  - name: in-slo
    when: predict["onprem-70b"].meets_slo
    route: {target: onprem-70b}
  - name: overflow
    route: {target: frontier-small}
"""


def waiting(base: str) -> list[int | None]:
    """Each endpoint's ``num_requests_waiting`` as the service last read it (None before a scrape)."""
    return [e["load"].get("num_requests_waiting") for e in httpx.get(f"{base}/v1/fleet", timeout=10).json()["targets"][
        "onprem-70b"]["endpoints"]]


def test_the_queue_ahead_is_the_same_whatever_the_prompt_asking(tmp_path, serve, standin):
    engines = [standin.StandinEngine("vllm").start() for _ in range(2)]
    try:
        for e in engines:
            e.metrics.set(running=0, waiting=4)
            e.metrics.observe_prompt(500, n=20)
            e.metrics.add_prefix(5000, 10000)
        endpoints = "\n".join(f'          - {{name: agg-{i}, url: "{e.base_url}/v1", metrics_url: "{e.metrics_url}"}}'
                              for i, e in enumerate(engines))
        base, _ = serve_fleet(tmp_path, serve, FLEET.format(endpoints=endpoints), POLICY, scrape_interval_s=0.3)

        def decide(prompt_tokens: int) -> dict:
            return route(base, {"messages": [{"role": "user", "content": "Summarise the attached report."}], "max_tokens": 64,
                                "routing": {"prompt_tokens": prompt_tokens, "explain": True}})

        wait(lambda: waiting(base) == [4, 4], "the scrapes never arrived")
        long, short = decide(8000), decide(100)
        queue = [d["trace"]["prediction"]["onprem-70b/aggregated"]["queue_s"] for d in (long, short)]
        assert queue == pytest.approx([4 * 500 * 0.5 / 12192] * 2, rel=1e-6), queue
        assert long["target"] == "onprem-70b", long["trace"]["prediction"]["onprem-70b/aggregated"]
    finally:
        for e in engines:
            e.stop()


def test_saturated_replicas_overflow_whatever_pointsman_has_in_flight(tmp_path, serve, standin):
    engines = [standin.StandinEngine("vllm").start() for _ in range(2)]
    try:
        endpoints = "\n".join(f'          - {{name: agg-{i}, url: "{e.base_url}/v1", metrics_url: "{e.metrics_url}"}}'
                               for i, e in enumerate(engines))
        base, _ = serve_fleet(tmp_path, serve, FLEET.format(endpoints=endpoints), POLICY, scrape_interval_s=0.3)
        short = {"messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 64,
                 "routing": {"explain": True}}
        first = httpx.post(f"{base}/v1/route", json=short, timeout=10).json()  # idle: on-prem, left in flight
        assert first["target"] == "onprem-70b", first
        for e in engines:
            e.metrics.set(running=120, waiting=40, kv_usage=0.97)
            e.metrics.observe_prompt(800, n=50)
        wait(lambda: waiting(base) == [40, 40], "the scrapes never arrived")
        d = httpx.post(f"{base}/v1/route", json=short, timeout=10).json()
        predicted = d["trace"]["prediction"]["onprem-70b/aggregated"]
        assert predicted["queue_s"] > 39 * 800 / 12192, predicted
        assert d["target"] == "frontier-small", predicted
    finally:
        for e in engines:
            e.stop()
