"""A pushed field older than the policy's ``signals.load.max_age_s`` is stale even when a fresh scrape of
the same endpoint lacks that field: a real ``pointsman serve`` scraping a stand-in vLLM ``/metrics``.

A scrape never reports ``prefill_utilization`` (vLLM exports no such gauge); a gateway sidecar pushes it.
Before, the merged reading took the field from the last push however old it was and gave it the scrape's
age, so a sidecar that stopped pushing left its last value steering decisions forever: 3 s after a push of
0.9 (``max_age_s: 1``), every decision still matched ``load[...].prefill_utilization > 0.5`` and went to
the frontier tier, and ``GET /v1/fleet`` and the pool's utilization gauge showed 0.9 at an age of a scrape
interval. Alone, the same push
is stale after 1 s (its fields null)."""

from __future__ import annotations

import time

import httpx

FLEET = """apiVersion: pointsman/v1
kind: Fleet
defaults: {{output_tokens: 64, scrape_metrics: true}}
targets:
  onprem-8b:
    kind: onprem
    model: meta-llama/Llama-3.1-8B-Instruct
    context_window_tokens: 131072
    usd_per_gpu_hour: 2.5
    pools:
      aggregated:
        gpus_per_replica: 1
        prefill_tokens_per_s: 20000
        decode_tokens_per_s: 20000
        endpoints:
          - {{name: e0, url: "{url}/v1", metrics_url: "{metrics}"}}
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
signals: {load: {max_age_s: 1.0}}
rules:
  - name: hot
    when: load["onprem-8b"].prefill_utilization > 0.5
    route: {target: frontier-small}
  - name: default
    route: {target: onprem-8b}
"""


def _e0(base: str) -> dict:
    return httpx.get(f"{base}/v1/fleet", timeout=10).json()["targets"]["onprem-8b"]["endpoints"][0]


def test_a_stale_pushed_field_is_not_revived_by_a_fresh_scrape(tmp_path, serve, standin):
    engine = standin.MetricsServer().start()
    try:
        (tmp_path / "fleet.yaml").write_text(FLEET.format(url=engine.base_url, metrics=engine.metrics_url))
        (tmp_path / "policy.yaml").write_text(POLICY)
        _, base = serve(tmp_path / "data", fleet_path=tmp_path / "fleet.yaml", policy_path=tmp_path / "policy.yaml",
                        watch_policy="false", watch_fleet="false", scrape_interval_s=0.2, scrape_timeout_s=0.5)
        deadline = time.monotonic() + 15
        while (_e0(base)["load"] or {}).get("source") != "scrape":
            assert time.monotonic() < deadline, "the stand-in engine was never scraped"
            time.sleep(0.05)
        r = httpx.post(f"{base}/v1/telemetry", json={"endpoint": "e0", "load": {"prefill_utilization": 0.9}}, timeout=10)
        assert r.status_code == 200, r.text
        route = {"messages": [{"role": "user", "content": "Hello there."}]}
        assert httpx.post(f"{base}/v1/route", json=route, timeout=10).json()["rule"] == "hot"  # fresh: read
        time.sleep(3.0)  # the push is 3 s old; the scrapes every 0.2 s are fresh
        load = _e0(base)["load"]
        assert load["source"] == "scrape" and load["age_s"] < 1.0
        assert load["prefill_utilization"] is None
        metrics = httpx.get(f"{base}/metrics", timeout=10).text
        assert "pointsman_pool_prefill_utilization{" not in metrics and "pointsman_load_signal_age_seconds{" in metrics
        assert httpx.post(f"{base}/v1/route", json=route, timeout=10).json()["rule"] == "default"
    finally:
        engine.stop()
