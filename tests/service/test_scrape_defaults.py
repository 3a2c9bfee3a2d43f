"""Scraping engines' ``/metrics`` is opt-in, and says how it goes (issue 22), through real ``pointsman
serve`` processes: a fleet written by a user without ``defaults.scrape_metrics`` scraped every on-prem
endpoint, and with engines whose ``/metrics`` Pointsman cannot reach (another port, a network policy)
three failed scrapes marked each unhealthy, every request was refused ``no healthy endpoint``, and
nothing at start said why."""

from __future__ import annotations

import re
import time

import httpx

from tests.service.conftest import free_port, stop

INTERVAL_S = "0.1"


def fleet(scrape: str | None) -> str:
    """Two on-prem targets whose engines are unreachable: ``small`` with no ``metrics_url``, ``big``
    with one; ``scrape``: the ``defaults.scrape_metrics`` value to write (None: leave it out)."""
    dead = f"http://127.0.0.1:{free_port()}"
    defaults = "{output_tokens: 64}" if scrape is None else f"{{output_tokens: 64, scrape_metrics: {scrape}}}"
    pool = """    pools:
      aggregated:
        gpus_per_replica: 1
        prefill_tokens_per_s: 20000
        decode_tokens_per_s: 20000
        endpoints:
"""
    return f"""apiVersion: pointsman/v1
kind: Fleet
defaults: {defaults}
targets:
  small:
    kind: onprem
    model: meta-llama/Llama-3.1-8B-Instruct
    context_window_tokens: 131072
    usd_per_gpu_hour: 2.5
{pool}          - {{name: s0, url: "{dead}/small/v1"}}
  big:
    kind: onprem
    model: meta-llama/Llama-3.3-70B-Instruct
    context_window_tokens: 131072
    usd_per_gpu_hour: 2.5
{pool}          - {{name: b0, url: "{dead}/big/v1", metrics_url: "{dead}/big/metrics"}}
"""


POLICY = """apiVersion: pointsman/v1
kind: RoutingPolicy
rules:
  - name: default
    route: {target: small}
"""


def start(tmp_path, serve, scrape: str | None):
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "fleet.yaml").write_text(fleet(scrape))
    (tmp_path / "policy.yaml").write_text(POLICY)
    return serve(tmp_path / "data", fleet_path=tmp_path / "fleet.yaml", policy_path=tmp_path / "policy.yaml",
                 scrape_interval_s=INTERVAL_S, scrape_timeout_s="0.2", scrape_failures_to_unhealthy="3",
                 watch_fleet="false", watch_policy="false")


def endpoints_when(base: str, done, timeout_s: float = 30.0) -> dict:
    """``/readyz``'s ``endpoints`` (by name) once ``done(endpoints)`` holds (or at ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while True:
        ready = httpx.get(f"{base}/readyz").json()
        eps = {e["name"]: e for e in ready.get("endpoints", {}).values()}
        if (eps and done(eps)) or time.monotonic() > deadline:
            return eps
        time.sleep(0.05)


def test_a_fleet_without_scrape_metrics_scrapes_only_endpoints_that_name_a_metrics_url(tmp_path, serve):
    proc, base = start(tmp_path, serve, scrape=None)
    eps = endpoints_when(base, lambda eps: not eps["b0"]["healthy"])
    # b0 names a metrics_url: scraped, and three failures made it unhealthy, /readyz says why
    assert eps["b0"]["healthy"] is False, eps
    failed = re.match(r"scrape failed (\d+)x", eps["b0"]["reason"] or "")
    assert failed is not None and int(failed.group(1)) >= 3, eps  # a loaded machine may poll after the 4th
    assert eps["b0"]["scrape"].startswith("failing"), eps
    # s0 does not, and the fleet does not set scrape_metrics: never scraped, never unhealthy
    assert eps["s0"]["healthy"] is True and eps["s0"]["reason"] is None, eps
    assert eps["s0"]["scrape"] == "off: the fleet sets no metrics_url for it and defaults.scrape_metrics is not true"
    assert httpx.get(f"{base}/readyz").status_code == 200
    r = httpx.post(f"{base}/v1/route", json={"messages": [{"role": "user", "content": "Hi."}]})
    assert r.status_code == 200 and r.json()["target"] == "small", r.text
    stop(proc)
    log = proc.stderr.read().decode()
    warnings = [line for line in log.splitlines() if "cannot scrape" in line]
    assert len(warnings) == 1 and "b0" in warnings[0] and "/big/metrics" in warnings[0], log  # once, many rounds


def test_scrape_metrics_true_scrapes_every_on_prem_endpoint_and_false_none(tmp_path, serve):
    _, base = start(tmp_path / "on", serve, scrape="true")
    eps = endpoints_when(base, lambda eps: not eps["b0"]["healthy"] and not eps["s0"]["healthy"])
    assert not eps["s0"]["healthy"] and not eps["b0"]["healthy"], eps
    assert all(e["reason"].startswith("scrape failed") for e in eps.values()), eps
    refused = httpx.post(f"{base}/v1/route", json={"messages": [{"role": "user", "content": "Hi."}]})
    assert refused.status_code == 422 and "no healthy endpoint" in refused.text

    _, base = start(tmp_path / "off", serve, scrape="false")
    eps = endpoints_when(base, lambda eps: True)
    assert all(e["healthy"] and e["scrape"] == "off: the fleet sets defaults.scrape_metrics: false"
               for e in eps.values()), eps


def test_a_non_finite_kv_capacity_gauge_or_a_bucket_bound_that_is_no_number_is_not_a_failed_scrape(
        tmp_path, serve, standin):
    """An SGLang page whose ``sglang:max_total_num_tokens`` reads NaN or +Inf (every other gauge fine) is
    read with the capacity unknown, as every other non-finite gauge: the endpoint stays healthy and its
    queue is read. Before: ``int(nan)`` raised in the page reader, each scrape failed ('ValueError: cannot
    convert float NaN to integer') and three in a row marked a serving engine unhealthy."""
    engines = []
    for value in ("NaN", "+Inf"):
        engine = standin.MetricsServer(standin.EngineMetrics("sglang")).start()
        engine.serve_text("# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs{model_name=\"m\"} 3\n"
                          "# TYPE sglang:max_total_num_tokens gauge\n"
                          f"sglang:max_total_num_tokens{{model_name=\"m\"}} {value}\n")
        engines.append(engine)
    # a vLLM page whose TTFT histogram has a bucket bound that is no number (and one below 0): the bucket is
    # skipped, the page read (before: float('abc') failed the scrape)
    engine = standin.MetricsServer().start()
    ttft = "vllm:time_to_first_token_seconds"
    engine.serve_text("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"m\"} 3\n"
                      f"# TYPE {ttft} histogram\n{ttft}_bucket{{model_name=\"m\",le=\"abc\"}} 1\n"
                      f"{ttft}_bucket{{model_name=\"m\",le=\"-1\"}} 1\n{ttft}_bucket{{model_name=\"m\",le=\"+Inf\"}} 2\n"
                      f"{ttft}_count{{model_name=\"m\"}} 2\n{ttft}_sum{{model_name=\"m\"}} 2\n")
    engines.append(engine)
    pool = fleet("true").split("targets:")[0]
    eps = "\n".join(f'          - {{name: e{i}, url: "{e.base_url}/v1"}}' for i, e in enumerate(engines))
    (tmp_path / "fleet.yaml").write_text(f"""{pool}targets:
  small:
    kind: onprem
    model: m
    context_window_tokens: 131072
    usd_per_gpu_hour: 2.5
    pools:
      aggregated:
        gpus_per_replica: 1
        prefill_tokens_per_s: 20000
        decode_tokens_per_s: 20000
        endpoints:
{eps}
""")
    (tmp_path / "policy.yaml").write_text(POLICY)
    try:
        _, base = serve(tmp_path / "data", fleet_path=tmp_path / "fleet.yaml", policy_path=tmp_path / "policy.yaml",
                        scrape_interval_s=INTERVAL_S, scrape_timeout_s="0.2", scrape_failures_to_unhealthy="3",
                        watch_fleet="false", watch_policy="false")
        # each engine answered 4 scrapes (3 failures in a row would have marked it unhealthy)
        ready = endpoints_when(base, lambda eps: all(e.requests >= 5 for e in engines))
        assert all(e["healthy"] and e["scrape"].startswith("ok") for e in ready.values()), ready
        fleet_now = httpx.get(f"{base}/v1/fleet").json()["targets"]["small"]["endpoints"]
        assert [ep["load"]["num_requests_running"] for ep in fleet_now] == [3, 3, 3], fleet_now
        assert fleet_now[2]["load"].get("ttft_p50_ms") is None or fleet_now[2]["load"]["ttft_p50_ms"] >= 0, fleet_now
    finally:
        for e in engines:
            e.stop()
