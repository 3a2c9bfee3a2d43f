"""Load from the Prometheus ``/metrics`` page of vLLM and SGLang servers.

``parse_metrics(text) -> EngineMetrics`` reads one page with prometheus_client's
text parser; ``to_endpoint_load(endpoint, current, previous, now)`` turns it into an
``EndpointLoad`` (p50s over the window between two scrapes); ``Scraper`` polls a
list of endpoints with an async httpx client and feeds a ``LoadBoard``, recording
each endpoint's errors instead of raising them (the service runs ``Scraper.run`` in
its lifespan).

Metric names read (the servers' documented names; for each field the first one
present wins; vLLM labels ``model_name``, ``engine``; SGLang ``model_name``,
``engine_type`` and ranks):

- ``num_requests_running``: ``vllm:num_requests_running`` | ``sglang:num_running_reqs``
- ``num_requests_waiting``: ``vllm:num_requests_waiting`` | ``sglang:num_queue_reqs``
- ``kv_cache_usage``: ``vllm:kv_cache_usage_perc``, then the older
  ``vllm:gpu_cache_usage_perc`` | ``sglang:token_usage``
- ``ttft_p50_ms``: histogram ``vllm:time_to_first_token_seconds`` |
  ``sglang:time_to_first_token_seconds``
- ``tpot_p50_ms``: ``vllm:request_time_per_output_token_seconds`` (per request), then
  ``vllm:time_per_output_token_seconds``, ``vllm:inter_token_latency_seconds`` (per
  token) | ``sglang:time_per_output_token_seconds``, ``sglang:inter_token_latency_seconds``
- ``prefix_cache_hit_rate``: counters ``vllm:prefix_cache_hits`` /
  ``vllm:prefix_cache_queries`` (tokens; older ``vllm:gpu_prefix_cache_*``) |
  gauge ``sglang:cache_hit_rate``
- ``kv_cache_capacity_tokens``: ``vllm:cache_config_info`` labels ``block_size`` ×
  ``num_gpu_blocks`` | ``sglang:max_total_num_tokens``
- ``mean_prompt_tokens``: histogram ``vllm:request_prompt_tokens`` (its ``_sum`` / ``_count``, the
  prompts of the requests finished since the previous scrape, else of all) | none from SGLang

Several series of one metric (vLLM data-parallel ``engine`` ranks, SGLang DP
groups) are combined: counts, capacities and histogram buckets are summed,
fractions averaged. Series that differ only in SGLang's ``tp_rank``/``pp_rank``/
``moe_ep_rank`` describe one scheduler and are counted once. Names written with
``_`` instead of ``:`` after the prefix (``vllm_num_requests_running``), as some
relabelling exporters do, are read too.

p50 from a histogram uses Prometheus's ``histogram_quantile`` rule (linear
interpolation inside the bucket holding the rank; the highest finite bound if the
rank falls in ``+Inf``) over the *bucket deltas since the previous scrape* — the
requests of the last interval — and over the cumulative buckets when there is no
previous scrape, no new observation, or a counter reset (server restart).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TypeAlias

import httpx
from prometheus_client.parser import text_string_to_metric_families

from pointsman.errors import PointsmanError
from pointsman.policy.signals.load_board import EndpointLoad, LoadBoard

VLLM = "vllm"
SGLANG = "sglang"

#: Metric names per engine and field, in order of preference (see the module docstring).
METRICS: dict[str, dict[str, tuple[str, ...]]] = {
    VLLM: {
        "running": ("vllm:num_requests_running",),
        "waiting": ("vllm:num_requests_waiting",),
        "kv_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        "ttft": ("vllm:time_to_first_token_seconds",),
        "tpot": ("vllm:request_time_per_output_token_seconds", "vllm:time_per_output_token_seconds",
                 "vllm:inter_token_latency_seconds"),
        "prefix_hits": ("vllm:prefix_cache_hits", "vllm:gpu_prefix_cache_hits"),
        "prefix_queries": ("vllm:prefix_cache_queries", "vllm:gpu_prefix_cache_queries"),
        "cache_config": ("vllm:cache_config_info",),
        "prompt_tokens": ("vllm:request_prompt_tokens",),
    },
    SGLANG: {
        "running": ("sglang:num_running_reqs",),
        "waiting": ("sglang:num_queue_reqs",),
        "kv_usage": ("sglang:token_usage",),
        "ttft": ("sglang:time_to_first_token_seconds",),
        "tpot": ("sglang:time_per_output_token_seconds", "sglang:inter_token_latency_seconds"),
        "hit_rate": ("sglang:cache_hit_rate",),
        "capacity": ("sglang:max_total_num_tokens",),
    },
}
_HISTOGRAMS = frozenset({"ttft", "tpot"})
_COUNTERS = frozenset({"prefix_hits", "prefix_queries"})
_SUMS = frozenset({"prompt_tokens"})  # histograms read by their _sum and _count alone


def _suffixes(key: str) -> tuple[str, ...]:
    """The sample-name suffixes field ``key`` is read from."""
    return ("_bucket",) if key in _HISTOGRAMS else ("_total",) if key in _COUNTERS else \
        ("_sum", "_count") if key in _SUMS else ("",)
#: SGLang labels that tell apart ranks of one scheduler (the same numbers, reported once each).
RANK_LABELS = frozenset({"tp_rank", "pp_rank", "moe_ep_rank"})


def _sample_names() -> tuple[dict[str, str], dict[str, tuple[str, str]]]:
    names, fields_of = {}, {}
    for engine, fields in METRICS.items():
        for key, metric_names in fields.items():
            for suffix in _suffixes(key):
                for name in metric_names:
                    names[name + suffix] = name + suffix
                    names[name.replace(":", "_", 1) + suffix] = name + suffix
                    fields_of[name + suffix] = (engine, key)
    return names, fields_of


# sample name as written (':' or '_' form) -> canonical ':' form; canonical -> (engine, field)
_WANTED, _FIELD_OF = _sample_names()


class ScrapeError(PointsmanError):
    """A metrics page could not be fetched or read (timeout, HTTP error, not vLLM/SGLang)."""


@dataclass(frozen=True)
class Buckets:
    """A histogram: ``name``, upper ``bounds`` (seconds, ascending, ``+inf`` last) and
    cumulative ``counts`` per bound (``counts[-1]`` is the number of observations)."""

    name: str
    bounds: tuple[float, ...]
    counts: tuple[float, ...]

    @property
    def count(self) -> float:
        """Number of observations."""
        return self.counts[-1] if self.counts else 0.0


@dataclass(frozen=True)
class EngineMetrics:
    """What one ``/metrics`` page says, combined over its series (see the module docstring).

    ``engine``: ``vllm`` or ``sglang``. Counts and usage as reported (floats);
    ``ttft`` / ``tpot``: cumulative histograms in seconds; ``prefix_cache_hits`` /
    ``prefix_cache_queries``: vLLM's cumulative counters in tokens;
    ``prefix_cache_hit_rate``: SGLang's gauge (0–1); ``kv_cache_capacity_tokens``;
    ``prompt_tokens_sum`` / ``prompt_tokens_count``: vLLM's cumulative prompt tokens and requests of
    ``vllm:request_prompt_tokens``. Fields a page lacks are None.
    """

    engine: str
    num_requests_running: float | None = None
    num_requests_waiting: float | None = None
    kv_cache_usage: float | None = None
    ttft: Buckets | None = None
    tpot: Buckets | None = None
    prefix_cache_hits: float | None = None
    prefix_cache_queries: float | None = None
    prefix_cache_hit_rate: float | None = None
    kv_cache_capacity_tokens: int | None = None
    prompt_tokens_sum: float | None = None
    prompt_tokens_count: float | None = None


#: Labels of one series without the ones that only tell ranks apart, sorted: a group's key.
LabelKey: TypeAlias = tuple[tuple[str, str], ...]
#: Parsed samples: metric name -> (labels, value) per series.
Samples: TypeAlias = dict[str, list[tuple[dict[str, str], float]]]


def _group_key(labels: dict[str, str], drop: frozenset[str]) -> LabelKey:
    return tuple(sorted((k, v) for k, v in labels.items() if k not in drop))


def _series(samples: Samples, name: str) -> list[float]:
    """One value per distinct scheduler of sample ``name`` (rank duplicates counted once)."""
    groups: dict[LabelKey, float] = {}
    for labels, value in samples.get(name, ()):
        key = _group_key(labels, RANK_LABELS)
        groups[key] = max(groups.get(key, value), value)
    return list(groups.values())


def _first(samples: Samples, names: tuple[str, ...], suffix: str = "") -> tuple[str, list[float]] | None:
    for name in names:
        values = _series(samples, name + suffix)
        if values:
            return name, values
    return None


def _histogram(samples: Samples, names: tuple[str, ...]) -> Buckets | None:
    for name in names:
        rows = samples.get(name + "_bucket")
        if not rows:
            continue
        per_group: dict[LabelKey, dict[float, float]] = {}
        for labels, value in rows:
            le = _bound(labels.get("le"))
            if le is None:
                continue
            group = per_group.setdefault(_group_key(labels, RANK_LABELS | {"le"}), {})
            group[le] = max(group.get(le, value), value)
        total: dict[float, float] = {}
        for group in per_group.values():
            for le, value in group.items():
                total[le] = total.get(le, 0.0) + value
        bounds = tuple(sorted(total))
        if bounds:
            return Buckets(name, bounds, tuple(total[b] for b in bounds))
    return None


def _bound(le: str | None) -> float | None:
    """A bucket's upper bound in seconds: None when its ``le`` is no number, NaN, or below 0 (no latency
    is), so such a bucket is skipped rather than the page refused or a quantile read below 0."""
    try:
        bound = float(le) if le is not None else math.nan
    except ValueError:
        return None
    return bound if bound >= 0 else None


def _prefilter(text: str) -> tuple[str, bool, bool]:
    """Keep only the sample lines of the metrics this module reads — for each field, the
    first of its names present — with names in ':' form. prometheus_client's parser
    costs ~10 µs per line, so this cuts a page's parse cost by half or more."""
    rows: list[tuple[str, str]] = []
    present: set[str] = set()
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        brace, space = line.find("{"), line.find(" ")
        end = brace if brace != -1 and (space == -1 or brace < space) else space
        name = line[:end] if end != -1 else line
        canonical = _WANTED.get(name)
        if canonical is None:
            continue
        present.add(canonical)
        rows.append((canonical, canonical + line[len(name):] if canonical != name else line))
    chosen: set[str] = set()
    for fields in METRICS.values():
        for key, metric_names in fields.items():
            for name in metric_names:
                if name + _suffixes(key)[0] in present:
                    chosen.update(name + suffix for suffix in _suffixes(key))
                    break
    vllm = any(_FIELD_OF[c][0] == VLLM for c in chosen)
    sglang = any(_FIELD_OF[c][0] == SGLANG for c in chosen)
    return "\n".join(line for canonical, line in rows if canonical in chosen) + "\n", vllm, sglang


def parse_metrics(text: str) -> EngineMetrics:
    """Read a vLLM or SGLang ``/metrics`` page (Prometheus text format).

    Raises ``ScrapeError`` if the page is not valid exposition text or carries
    neither engine's metrics. Cost is dominated by prometheus_client's parser on the
    kept lines (see ``scripts/bench_signals.py``)."""
    kept, has_vllm, has_sglang = _prefilter(text)
    if not (has_vllm or has_sglang):
        raise ScrapeError("no vLLM or SGLang metrics on the page (is this a vLLM/SGLang /metrics URL?)")
    samples: Samples = {}
    try:
        for family in text_string_to_metric_families(kept):
            for s in family.samples:
                samples.setdefault(s.name, []).append((s.labels, float(s.value)))
    except (ValueError, TypeError, IndexError) as exc:
        raise ScrapeError(f"unreadable metrics page: {exc}") from None
    engine = VLLM if has_vllm and (not has_sglang or "vllm:num_requests_running" in samples) else SGLANG
    names = METRICS[engine]

    def total(key: str) -> float | None:
        found = _first(samples, names[key])
        return None if found is None else sum(found[1])

    def mean(key: str) -> float | None:
        found = _first(samples, names[key])
        return None if found is None else sum(found[1]) / len(found[1])

    def counter(key: str) -> float | None:
        return suffixed(key, "_total")

    def suffixed(key: str, suffix: str) -> float | None:
        found = _first(samples, names[key], suffix)
        return None if found is None else sum(found[1])

    if engine == VLLM:
        capacity = None
        rows = samples.get("vllm:cache_config_info")
        if rows:
            try:
                capacity = sum(int(labels["block_size"]) * int(labels["num_gpu_blocks"]) for labels, _ in rows)
            except (KeyError, ValueError):
                capacity = None
        return EngineMetrics(
            engine=VLLM, num_requests_running=total("running"), num_requests_waiting=total("waiting"),
            kv_cache_usage=mean("kv_usage"), ttft=_histogram(samples, names["ttft"]),
            tpot=_histogram(samples, names["tpot"]), prefix_cache_hits=counter("prefix_hits"),
            prefix_cache_queries=counter("prefix_queries"), kv_cache_capacity_tokens=_capacity(capacity),
            prompt_tokens_sum=suffixed("prompt_tokens", "_sum"), prompt_tokens_count=suffixed("prompt_tokens", "_count"))
    capacity_total = total("capacity")
    return EngineMetrics(
        engine=SGLANG, num_requests_running=total("running"), num_requests_waiting=total("waiting"),
        kv_cache_usage=mean("kv_usage"), ttft=_histogram(samples, names["ttft"]),
        tpot=_histogram(samples, names["tpot"]), prefix_cache_hit_rate=mean("hit_rate"),
        kv_cache_capacity_tokens=_capacity(capacity_total))


def histogram_quantile(q: float, buckets: Buckets | None) -> float | None:
    """The ``q``-quantile (0–1) of a cumulative histogram, in the histogram's unit, by
    Prometheus's ``histogram_quantile`` rule: find the first bucket whose cumulative
    count reaches ``q × total`` and interpolate linearly between its lower bound (the
    previous bound, 0 for the first bucket) and its upper bound; if that bucket is
    ``+Inf``, return the highest finite bound. None when there are no observations, or a count is
    no finite number (a page counting ``+Inf`` or NaN observations: the quantile would read NaN)."""
    if buckets is None or not 0.0 <= q <= 1.0:
        return None
    bounds, counts = buckets.bounds, buckets.counts
    total = counts[-1] if counts else 0.0
    if not total > 0 or not all(map(math.isfinite, counts)):
        return None
    rank = q * total
    prev_bound, prev_count = 0.0, 0.0
    for bound, count in zip(bounds, counts):
        if count >= rank:
            if math.isinf(bound):
                return prev_bound if len(bounds) > 1 else None
            if bound <= 0 or count == prev_count:
                return bound
            return min(bound, prev_bound + (bound - prev_bound) * (rank - prev_count) / (count - prev_count))
        prev_bound, prev_count = bound, count
    return None


def window(current: Buckets | None, previous: Buckets | None) -> Buckets | None:
    """Bucket deltas ``current − previous`` (the observations between two scrapes), or
    ``current`` itself when there is no comparable previous histogram (different metric
    or bounds), a count went down (counter reset: the server restarted, its cumulative
    counts are the window), or nothing was observed in between."""
    if current is None or previous is None or previous.name != current.name or previous.bounds != current.bounds:
        return current
    delta = tuple(c - p for c, p in zip(current.counts, previous.counts))
    if any(d < 0 for d in delta) or delta[-1] <= 0:
        return current
    return Buckets(current.name, current.bounds, delta)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


def _count(value: float | None) -> int | None:
    return None if value is None or not math.isfinite(value) else max(0, int(round(value)))


def _capacity(value: float | None) -> int | None:
    """A KV capacity in tokens: None unless a finite count above 0 (a NaN, infinite or negative gauge is
    unknown, as every other gauge that is no number, never a failed scrape)."""
    count = _count(value)
    return count if count else None


def _fraction(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else min(1.0, max(0.0, value))


def to_endpoint_load(endpoint: str, current: EngineMetrics, previous: EngineMetrics | None,
                     now: float) -> EndpointLoad:
    """An ``EndpointLoad`` (source ``scrape``, ``updated_at=now``) from the current page and
    the previous one of the same endpoint (for windowed p50s and hit rate; None on the
    first scrape). Latencies in ms; counts rounded to ints; fractions clamped to 0–1."""
    prev_ttft = previous.ttft if previous is not None else None
    prev_tpot = previous.tpot if previous is not None else None
    hit_rate = current.prefix_cache_hit_rate
    if current.prefix_cache_queries is not None and current.prefix_cache_hits is not None:
        hits, queries = current.prefix_cache_hits, current.prefix_cache_queries
        if previous is not None and previous.prefix_cache_queries is not None \
                and previous.prefix_cache_hits is not None:
            dq = queries - previous.prefix_cache_queries
            dh = hits - previous.prefix_cache_hits
            if dq > 0 and dh >= 0:
                hits, queries = dh, dq
        hit_rate = hits / queries if queries > 0 else None
    return EndpointLoad(
        endpoint=endpoint, source="scrape", updated_at=now,
        num_requests_running=_count(current.num_requests_running),
        num_requests_waiting=_count(current.num_requests_waiting),
        kv_cache_usage=_fraction(current.kv_cache_usage),
        ttft_p50_ms=_ms(histogram_quantile(0.5, window(current.ttft, prev_ttft))),
        tpot_p50_ms=_ms(histogram_quantile(0.5, window(current.tpot, prev_tpot))),
        prefix_cache_hit_rate=_fraction(hit_rate),
        kv_cache_capacity_tokens=current.kv_cache_capacity_tokens,
        mean_prompt_tokens=_mean_prompt(current, previous),
    )


def _mean_prompt(current: EngineMetrics, previous: EngineMetrics | None) -> float | None:
    """Mean prompt tokens of the requests finished between ``previous`` and ``current`` (``vllm:request_prompt_tokens``
    deltas), else of every request since the engine started (no previous page, none finished since, a counter
    reset); None when it reports no finished request or no such histogram."""
    total, count = current.prompt_tokens_sum, current.prompt_tokens_count
    if total is None or count is None or not (math.isfinite(total) and math.isfinite(count)):
        return None
    if previous is not None and previous.prompt_tokens_sum is not None and previous.prompt_tokens_count is not None:
        d_total, d_count = total - previous.prompt_tokens_sum, count - previous.prompt_tokens_count
        if d_count > 0 and d_total >= 0:
            total, count = d_total, d_count
    return total / count if count > 0 and total >= 0 else None


def metrics_url(base_url: str) -> str:
    """The ``/metrics`` URL of a server whose API base URL is ``base_url`` (vLLM and SGLang
    serve it at the root: ``http://h:8000/v1`` -> ``http://h:8000/metrics``)."""
    return str(httpx.URL(base_url).copy_with(path="/metrics", query=None, fragment=None))


@dataclass
class ScrapeStatus:
    """One endpoint's scrape health: ``metrics_url``; monotonic times of the last success
    and last error; ``last_error`` message; ``consecutive_failures``; ``last_duration_ms``."""

    metrics_url: str
    last_ok_at: float | None = None
    last_error: str | None = None
    last_error_at: float | None = None
    consecutive_failures: int = 0
    last_duration_ms: float | None = None


@dataclass
class _State:
    status: ScrapeStatus
    previous: EngineMetrics | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class Scraper:
    """Polls the ``/metrics`` pages of vLLM/SGLang endpoints with one async httpx client.

    ``targets``: endpoint names mapped to their metrics URLs, or an iterable of API
    base URLs (each its own endpoint name, metrics URL by ``metrics_url``).
    ``timeout_s``: per-request timeout. ``max_page_bytes``: larger pages are an error.
    ``transport``: an httpx transport (tests pass ``httpx.MockTransport``).

    Cost: reading a page takes ~0.7–1 ms of CPU here (prometheus_client's parser,
    ``scripts/bench_signals.py``), run on the event loop between other tasks; 256
    endpoints every 2 s is ~13% of one core, so large fleets want a longer interval.
    """

    def __init__(self, targets: Mapping[str, str] | Iterable[str], *, timeout_s: float = 1.0,
                 max_page_bytes: int = 8_000_000, transport: httpx.AsyncBaseTransport | None = None,
                 headers: Mapping[str, str] | None = None) -> None:
        if not timeout_s > 0:
            raise ValueError(f"timeout_s: must be > 0, got {timeout_s!r}")
        items = targets.items() if isinstance(targets, Mapping) else ((u, metrics_url(u)) for u in targets)
        self._states = {ep: _State(ScrapeStatus(url)) for ep, url in items}
        self.timeout_s = float(timeout_s)
        self.max_page_bytes = int(max_page_bytes)
        self._client = httpx.AsyncClient(timeout=httpx.Timeout(timeout_s), transport=transport,
                                         headers=dict(headers or {}), follow_redirects=False)

    @property
    def endpoints(self) -> list[str]:
        """Endpoint names being scraped."""
        return list(self._states)

    def status(self) -> dict[str, ScrapeStatus]:
        """A copy of every endpoint's scrape status (for ``GET /v1/fleet`` and health filters)."""
        return {ep: ScrapeStatus(**vars(st.status)) for ep, st in self._states.items()}

    async def aclose(self) -> None:
        """Close the HTTP client."""
        await self._client.aclose()

    async def __aenter__(self) -> Scraper:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _fetch(self, url: str) -> str:
        try:
            response = await self._client.get(url)
        except httpx.TimeoutException:
            raise ScrapeError(f"timeout after {self.timeout_s:g} s") from None
        except httpx.HTTPError as exc:
            raise ScrapeError(f"{type(exc).__name__}: {exc}") from None
        if response.status_code != 200:
            raise ScrapeError(f"HTTP {response.status_code} from {url}")
        if len(response.content) > self.max_page_bytes:
            raise ScrapeError(f"metrics page of {len(response.content)} bytes exceeds {self.max_page_bytes}")
        return response.text

    async def scrape_once(self, endpoint: str, now: float | None = None) -> EndpointLoad:
        """Fetch and read ``endpoint``'s page once; returns its ``EndpointLoad`` (measured at
        ``now``, default: when the response arrived). An endpoint not in ``targets`` is
        taken as an API base URL. Raises ``ScrapeError``; the status records it either way."""
        state = self._states.get(endpoint)
        if state is None:
            state = self._states[endpoint] = _State(ScrapeStatus(metrics_url(endpoint)))
        status = state.status
        async with state.lock:  # one scrape per endpoint at a time, so windows chain correctly
            start = time.monotonic()
            try:
                text = await self._fetch(status.metrics_url)
                current = parse_metrics(text)
            except ScrapeError as exc:
                status.last_error, status.last_error_at = str(exc), time.monotonic() if now is None else now
                status.consecutive_failures += 1
                status.last_duration_ms = (time.monotonic() - start) * 1000.0
                raise
            at = time.monotonic() if now is None else now
            load = to_endpoint_load(endpoint, current, state.previous, at)
            state.previous = current
            status.last_ok_at, status.consecutive_failures = at, 0
            status.last_duration_ms = (time.monotonic() - start) * 1000.0
            return load

    async def poll_once(self, board: LoadBoard, now: float | None = None) -> dict[str, EndpointLoad | ScrapeError]:
        """Scrape every endpoint concurrently and put each success on ``board``. Never raises
        for an endpoint's failure: returns endpoint -> load or the ``ScrapeError``."""

        async def one(endpoint: str) -> EndpointLoad | ScrapeError:
            try:
                load = await self.scrape_once(endpoint, now)
            except ScrapeError as exc:
                return exc
            except Exception as exc:  # a bug must not stop the loop; record it like a failure
                st = self._states[endpoint].status
                st.last_error, st.consecutive_failures = f"{type(exc).__name__}: {exc}", st.consecutive_failures + 1
                return ScrapeError(st.last_error)
            board.put_scraped(endpoint, load)
            return load

        endpoints = list(self._states)
        results = await asyncio.gather(*(one(ep) for ep in endpoints))
        return dict(zip(endpoints, results))

    async def run(self, board: LoadBoard, interval_s: float = 2.0, stop: asyncio.Event | None = None) -> None:
        """Poll every ``interval_s`` seconds until ``stop`` is set or the task is cancelled
        (run it as a task in the service's lifespan). Never raises for scrape failures."""
        if not interval_s > 0:
            raise ValueError(f"interval_s: must be > 0, got {interval_s!r}")
        stop = stop or asyncio.Event()
        while not stop.is_set():
            started = time.monotonic()
            await self.poll_once(board)
            delay = max(0.0, interval_s - (time.monotonic() - started))
            try:
                await asyncio.wait_for(stop.wait(), timeout=delay)
            except TimeoutError:
                pass
