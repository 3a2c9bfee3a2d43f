"""Scraping vLLM and SGLang /metrics: parsing recorded-style pages, p50 from buckets, the async Scraper.

Expected values are computed by hand from the observations listed in
fixtures/make_metric_pages.py (Prometheus histogram_quantile rule).
"""

import asyncio
import math
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from pointsman.policy.signals.load_board import LoadBoard
from pointsman.policy.signals.scrape import (
    Buckets,
    ScrapeError,
    Scraper,
    histogram_quantile,
    metrics_url,
    parse_metrics,
    to_endpoint_load,
    window,
)

FIXTURES = Path(__file__).parent / "fixtures"


def page(name: str) -> str:
    return (FIXTURES / name).read_text()


# ---------------------------------------------------------------- parsing the pages

def test_vllm_page_first_scrape():
    m = parse_metrics(page("vllm_1.prom"))
    assert m.engine == "vllm"
    assert (m.num_requests_running, m.num_requests_waiting, m.kv_cache_usage) == (12.0, 3.0, 0.4375)
    assert (m.prefix_cache_hits, m.prefix_cache_queries) == (5000.0, 20000.0)
    assert m.kv_cache_capacity_tokens == 16 * 8192
    assert m.tpot.name == "vllm:request_time_per_output_token_seconds"
    load = to_endpoint_load("e", m, None, now=5.0)
    assert (load.num_requests_running, load.num_requests_waiting) == (12, 3)
    # TTFT 10 x 30 ms, 20 x 300 ms: rank 15 in (0.25, 0.5] holding 20 -> 0.25 + 0.25 * 5/20
    assert load.ttft_p50_ms == pytest.approx(312.5)
    # TPOT 20 x 20 ms, 10 x 60 ms: rank 15 in (0.01, 0.025] holding 20 -> 0.01 + 0.015 * 15/20
    assert load.tpot_p50_ms == pytest.approx(21.25)
    assert load.prefix_cache_hit_rate == pytest.approx(0.25)
    assert (load.source, load.updated_at) == ("scrape", 5.0)


def test_vllm_second_scrape_uses_bucket_deltas():
    first, second = parse_metrics(page("vllm_1.prom")), parse_metrics(page("vllm_2.prom"))
    load = to_endpoint_load("e", second, first, now=7.0)
    assert (load.num_requests_running, load.num_requests_waiting, load.kv_cache_usage) == (10, 0, 0.375)
    # new TTFTs 10 x 70 ms, 10 x 900 ms: rank 10 in (0.06, 0.08] holding 10 -> 80 ms
    assert load.ttft_p50_ms == pytest.approx(80.0)
    # new TPOTs 10 x 40 ms: rank 5 in (0.025, 0.05] -> 37.5 ms
    assert load.tpot_p50_ms == pytest.approx(37.5)
    # hits +4500 over queries +6000
    assert load.prefix_cache_hit_rate == pytest.approx(0.75)
    # without the previous page: cumulative (50 TTFTs: rank 25 in (0.25, 0.5] holding 20 above 20)
    assert to_endpoint_load("e", second, None, now=7.0).ttft_p50_ms == pytest.approx(312.5)


def test_vllm_data_parallel_engines_are_combined():
    load = to_endpoint_load("e", parse_metrics(page("vllm_dp2.prom")), None, now=1.0)
    assert (load.num_requests_running, load.num_requests_waiting) == (5 + 7, 1 + 2)
    assert load.kv_cache_usage == pytest.approx((0.5 + 0.25) / 2)
    assert load.kv_cache_capacity_tokens == 2 * 16 * 8192
    assert load.ttft_p50_ms == pytest.approx(40.0)  # 4 x 30 ms + 4 x 300 ms: rank 4 closes (0.02, 0.04]
    assert load.prefix_cache_hit_rate == pytest.approx((500 + 500) / (1000 + 3000))


def _prompt_histogram(observed: dict[str, list[int]]) -> str:
    """vLLM's ``vllm:request_prompt_tokens`` histogram as prometheus_client writes it: per ``engine`` label (a DP
    rank), the prompt lengths observed (vLLM's 1-2-5 buckets)."""
    from prometheus_client import CollectorRegistry, Histogram, generate_latest
    registry = CollectorRegistry()
    hist = Histogram("vllm:request_prompt_tokens", "Number of prefill tokens processed.", ["model_name", "engine"],
                     buckets=[1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000], registry=registry)
    for engine, tokens in observed.items():
        child = hist.labels("m", engine)
        for t in tokens:
            child.observe(t)
    return generate_latest(registry).decode()


def test_vllm_mean_prompt_of_the_requests_finished_since_the_last_scrape():
    """The mean prompt of the requests finished between two scrapes, summed over DP ranks (tokens)."""
    first = parse_metrics(page("vllm_1.prom") + _prompt_histogram({"0": [100] * 10, "1": [300] * 10}))
    second = parse_metrics(page("vllm_2.prom") + _prompt_histogram({"0": [100] * 10 + [1000] * 2, "1": [300] * 12}))
    assert (first.prompt_tokens_sum, first.prompt_tokens_count) == (4000, 20)
    assert to_endpoint_load("e", first, None, now=1.0).mean_prompt_tokens == pytest.approx(200.0)
    assert to_endpoint_load("e", second, first, now=2.0).mean_prompt_tokens == pytest.approx((2000 + 600) / 4)
    assert to_endpoint_load("e", second, second, now=3.0).mean_prompt_tokens == pytest.approx(6600 / 24)  # none since
    assert to_endpoint_load("e", parse_metrics(page("vllm_1.prom")), None, now=1.0).mean_prompt_tokens is None


def test_vllm_older_metric_names():
    text = page("vllm_1.prom").replace("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
    text = "\n".join(l for l in text.splitlines() if "request_time_per_output_token" not in l)
    m = parse_metrics(text)
    assert m.kv_cache_usage == 0.4375
    assert m.tpot.name == "vllm:inter_token_latency_seconds"
    # ITL 600 x 18 ms, 200 x 30 ms: rank 400 in (0.01, 0.025] holding 600 -> 0.01 + 0.015 * 400/600
    assert to_endpoint_load("e", m, None, 0.0).tpot_p50_ms == pytest.approx(20.0)


def test_underscore_prefix_is_read():
    m = parse_metrics(page("vllm_1.prom").replace("vllm:", "vllm_"))
    assert (m.engine, m.num_requests_running, m.kv_cache_capacity_tokens) == ("vllm", 12.0, 131072)
    assert m.ttft.count == 30


def test_sglang_pages():
    first, second = parse_metrics(page("sglang_1.prom")), parse_metrics(page("sglang_2.prom"))
    assert first.engine == "sglang"
    load = to_endpoint_load("s", first, None, now=1.0)
    assert (load.num_requests_running, load.num_requests_waiting, load.kv_cache_usage) == (24, 5, 0.61)
    assert load.prefix_cache_hit_rate == 0.42 and load.kv_cache_capacity_tokens == 500000
    # TTFT 20 x 150 ms, 20 x 500 ms, 10 x 1.5 s: rank 25 in (0.4, 0.6] holding 20 above 20
    assert load.ttft_p50_ms == pytest.approx(450.0)
    # ITL 1200 x 12 ms, 800 x 22 ms: rank 1000 in (0.010, 0.015] holding 1200
    assert load.tpot_p50_ms == pytest.approx(10.0 + 5.0 * 1000 / 1200)
    load = to_endpoint_load("s", second, first, now=2.0)
    assert (load.num_requests_running, load.num_requests_waiting) == (20, 2)
    assert load.ttft_p50_ms == pytest.approx(700.0)  # 10 x 700 ms: rank 5 in (0.6, 0.8]
    assert load.tpot_p50_ms == pytest.approx(27.5)  # 500 x 30 ms: rank 250 in (0.025, 0.030]


def test_sglang_rank_duplicates_once_dp_groups_summed():
    text = page("sglang_1.prom")
    line = next(l for l in text.splitlines() if l.startswith("sglang:num_running_reqs{"))
    dup_tp = line.replace('tp_rank="0"', 'tp_rank="1"')
    dp1 = line.replace('tp_rank="0"', 'tp_rank="0",dp_rank="1"').replace(" 24.0", " 6.0")
    m = parse_metrics(text.replace(line, "\n".join([line, dup_tp, dp1])))
    assert m.num_requests_running == 24.0 + 6.0


def test_unreadable_or_foreign_pages_raise_scrape_error():
    with pytest.raises(ScrapeError, match="no vLLM or SGLang"):
        parse_metrics("# HELP up x\n# TYPE up gauge\nup 1\n")
    with pytest.raises(ScrapeError, match="unreadable"):
        parse_metrics('vllm:num_requests_running{model_name="m"} twelve\n')


# ---------------------------------------------------------------- quantiles and windows

def test_histogram_quantile_hand_computed():
    b = Buckets("h", (0.1, 0.5, 1.0, float("inf")), (2.0, 6.0, 8.0, 10.0))
    assert histogram_quantile(0.5, b) == pytest.approx(0.1 + 0.4 * (5 - 2) / (6 - 2))  # 0.4
    assert histogram_quantile(0.1, b) == pytest.approx(0.1 * 1 / 2)  # first bucket: from 0
    assert histogram_quantile(0.95, b) == 1.0  # rank 9.5 in +Inf: highest finite bound
    assert histogram_quantile(0.5, Buckets("h", (0.1, float("inf")), (0.0, 0.0))) is None
    assert histogram_quantile(0.5, None) is None


@settings(max_examples=300, deadline=None)
@example([0.1, 1.0], [1.0, math.inf, math.inf, 0.0, 0.0, 0.0, 0.0], 0.5)  # inf / inf
@given(st.lists(st.floats(min_value=0.0, max_value=1e6), min_size=0, max_size=6, unique=True),
       st.lists(st.floats(allow_nan=True, allow_infinity=True), min_size=7, max_size=7),
       st.floats(min_value=0.0, max_value=1.0))
def test_histogram_quantile_is_none_or_a_latency_within_the_bounds(finite, counts, q):
    """Whatever a page's buckets count (negative, NaN, infinite, not cumulative), the quantile is None or
    a finite number between 0 and the highest finite bound. Before, a bucket counting +Inf observations
    gave ttft_p50_ms NaN (inf / inf) -- found by the fresh-eyes tester."""
    bounds = (*sorted(finite), float("inf"))
    got = histogram_quantile(q, Buckets("h", bounds, tuple(counts[:len(bounds)])))
    assert got is None or (math.isfinite(got) and 0.0 <= got <= max(finite, default=0.0))


def test_a_page_counting_infinite_observations_reads_no_ttft():
    page = ('vllm:time_to_first_token_seconds_bucket{le="0.1"} 1\n'
            'vllm:time_to_first_token_seconds_bucket{le="1.0"} +Inf\n'
            'vllm:time_to_first_token_seconds_bucket{le="+Inf"} +Inf\n')
    load = to_endpoint_load("e", parse_metrics(page), None, 0.0)
    assert load.ttft_p50_ms is None  # before: nan


def test_window_deltas_resets_and_quiet_intervals():
    bounds = (0.1, 1.0, float("inf"))
    prev = Buckets("h", bounds, (1.0, 3.0, 4.0))
    cur = Buckets("h", bounds, (1.0, 5.0, 7.0))
    assert window(cur, prev).counts == (0.0, 2.0, 3.0)
    restarted = Buckets("h", bounds, (0.0, 1.0, 1.0))
    assert window(restarted, prev) is restarted  # counter reset: the new process's counts
    assert window(prev, prev) is prev  # nothing new observed: cumulative
    assert window(cur, Buckets("h", (0.2, 1.0, float("inf")), (1.0, 3.0, 4.0))) is cur  # other bounds
    assert window(cur, Buckets("other", bounds, (1.0, 3.0, 4.0))) is cur
    assert window(cur, None) is cur


def test_metrics_url():
    assert metrics_url("http://10.0.0.1:8000/v1") == "http://10.0.0.1:8000/metrics"
    assert metrics_url("https://h.example:30000") == "https://h.example:30000/metrics"


# ---------------------------------------------------------------- the Scraper

class _Pages(BaseHTTPRequestHandler):
    pages: list[str] = []
    delay_s = 0.0

    def do_GET(self):  # noqa: N802 (http.server API)
        time.sleep(self.delay_s)
        body = (self.pages.pop(0) if len(self.pages) > 1 else self.pages[0]).encode()
        try:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):  # the client timed out and left
            pass

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    started = []

    def start(pages, delay_s=0.0):
        handler = type("Handler", (_Pages,), {"pages": list(pages), "delay_s": delay_s})
        httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        started.append(httpd)
        return f"http://127.0.0.1:{httpd.server_address[1]}"

    yield start
    for httpd in started:
        httpd.shutdown()
        httpd.server_close()


def test_scraper_against_a_local_server_feeds_the_board(server):
    base = server([page("vllm_1.prom"), page("vllm_2.prom")])
    board = LoadBoard()

    async def go():
        async with Scraper([base + "/v1"], timeout_s=2.0) as scraper:
            first = await scraper.poll_once(board, now=10.0)
            second = await scraper.poll_once(board, now=12.0)
            return scraper.status(), first, second

    status, first, second = asyncio.run(go())
    ep = base + "/v1"
    assert first[ep].ttft_p50_ms == pytest.approx(312.5)
    assert second[ep].ttft_p50_ms == pytest.approx(80.0)  # windowed between the two scrapes
    read = board.get(ep, now=12.5)
    assert (read.source, read.num_requests_running, read.age_s(12.5)) == ("scrape", 10, 0.5)
    assert status[ep].metrics_url == base + "/metrics"
    assert status[ep].consecutive_failures == 0 and status[ep].last_ok_at == 12.0


def test_scraper_timeout_is_recorded_not_raised(server):
    slow = server([page("sglang_1.prom")], delay_s=0.6)
    fast = server([page("sglang_1.prom")])
    board = LoadBoard()

    async def go():
        async with Scraper({"slow": slow + "/metrics", "fast": fast + "/metrics"}, timeout_s=0.2) as scraper:
            results = await scraper.poll_once(board, now=1.0)
            return scraper.status(), results

    status, results = asyncio.run(go())
    assert isinstance(results["slow"], ScrapeError) and "timeout after 0.2 s" in str(results["slow"])
    assert status["slow"].consecutive_failures == 1 and "timeout" in status["slow"].last_error
    assert board.get("slow", now=1.0) is None
    assert board.get("fast", now=1.0).num_requests_running == 24


def test_scraper_http_and_connection_errors():
    calls = {"n": 0}

    def handler(request: httpx.Request) -> httpx.Response:
        host = request.url.host
        if host == "down":
            raise httpx.ConnectError("connection refused", request=request)
        if host == "broken":
            return httpx.Response(503, text="overloaded")
        if host == "junk":
            return httpx.Response(200, text="<html>not metrics</html>")
        calls["n"] += 1
        return httpx.Response(200, text=page("vllm_1.prom") if calls["n"] == 1 else page("vllm_2.prom"))

    board = LoadBoard()
    board.push("broken", {"num_requests_running": 1}, now=0.0)

    async def go():
        targets = {h: f"http://{h}/metrics" for h in ("down", "broken", "junk", "ok")}
        async with Scraper(targets, transport=httpx.MockTransport(handler)) as scraper:
            await scraper.poll_once(board, now=1.0)
            results = await scraper.poll_once(board, now=2.0)
            with pytest.raises(ScrapeError, match="HTTP 503"):
                await scraper.scrape_once("broken", now=3.0)
            return scraper.status(), results

    status, results = asyncio.run(go())
    assert "ConnectError" in str(results["down"])
    assert "HTTP 503" in str(results["broken"])
    assert "no vLLM or SGLang" in str(results["junk"])
    assert status["broken"].consecutive_failures == 3
    assert status["ok"].consecutive_failures == 0
    assert results["ok"].ttft_p50_ms == pytest.approx(80.0)
    assert board.get("broken", now=3.0).source == "push"  # the last good reading stays, and ages
    assert board.get("ok", now=3.0).num_requests_running == 10


def test_run_polls_until_stopped():
    seen = []

    def handler(request):
        seen.append(time.monotonic())
        return httpx.Response(200, text=page("sglang_1.prom"))

    board = LoadBoard()

    async def go():
        stop = asyncio.Event()
        async with Scraper({"s": "http://s/metrics"}, transport=httpx.MockTransport(handler)) as scraper:
            task = asyncio.create_task(scraper.run(board, interval_s=0.05, stop=stop))
            while len(seen) < 3:
                await asyncio.sleep(0.01)
            stop.set()
            await asyncio.wait_for(task, timeout=1.0)

    asyncio.run(go())
    assert len(seen) >= 3
    assert board.get("s").num_requests_running == 24
