"""Predicted latency of one request per candidate: time to first token (TTFT) and time per
output token (TPOT) on a target, in a mode, at the endpoint the picker would choose, from
live signals. Policies read it as ``predict["<target>"]`` and ``endpoint.predicted_ttft_s``
(``namespaces.SIGNALS``); ``auto`` routes may choose their P/D mode by it
(``disaggregation.by_prediction``).

**TTFT** (seconds)::

    aggregated:     queue_s + prefill_s
    disaggregated:  queue_s + prefill_s + transfer_s        (on the chosen prefill endpoint)
    frontier:       the tier's reported median TTFT, else its declared one
    prefill_s     = max(decode_step_s, work_s)               (of the pool that prefills)

``queue_s``: prefill work already queued on the endpoint (``pickers.QueueScorer``: vLLM
schedules the waiting queue first come, first served, so all of it runs before this
request's prefill); ``work_s``: this request's own uncached prefill, or the shared KV
tier's restore when that is faster (``pickers.PrefillWorkScorer``); ``decode_step_s``: the
first token needs at least one forward pass, which reads every weight once as a lone decode
step does (a 6-token prompt on the packaged 70B replicas: 21 ms, not its 0.5 ms of work; the
replay simulator's prefill step: 22.6 ms, ``replay/hardware.py``); absent: no floor; in the
trace as ``prefill_floor_s``. ``transfer_s``: the KV of the
prompt's tokens the chosen decode endpoint does not hold over the prefill replica's link,
``latency + (prompt - decode_cached) × kv_bytes_per_token / link`` (``transfer_s``; vLLM's P/D
connectors read only the blocks missing from the decode side's prefix cache; Mooncake's transfer
engine measured 1.8 ms + bytes / 168 GB/s over 4 NICs).

**TPOT** (seconds, the mean over the answer, as replay and DistServe measure it)::

    step_s  = max(decode_step_s, (b + 1) / decode_tokens_per_s)
    tpot_s  = (step_s + interference_s) × (2 if the KV cache is short else 1)

``b``: requests outstanding on the decode-side endpoint (each shares the batch's decode
throughput, ``pickers.DecodeLoadScorer``); ``decode_step_s``: the pool's lone-request step
(its floor). ``interference_s`` (aggregated only; a decode pool runs no prefill): a step that
carries a prefill chunk lasts ``chunk_s = max_num_batched_tokens / prefill_tokens_per_s``
longer. With the endpoint's recent prefill busy fraction ``u`` (``prefill_utilization``), a
step carries a chunk with probability ``q = u × step_s / ((1 − u) × chunk_s)`` (so that the
time share of prefill is ``u``); over the first ``m = min(output − 1, 32)`` steps the count
of chunked steps is Binomial(m, q), and ``interference_s`` is its 90th percentile × chunk_s /
m: the request meets the TPOT objective with about 90% probability (DistServe's goodput
counts requests, not means). The KV cache is *short* when the endpoint's free KV
(``(1 − kv_cache_usage) × capacity``) cannot hold the prompt and the answer: vLLM then
preempts and recomputes, which at least doubles the decode time.

**The batch's TPOT** (aggregated only): this request's uncached prefill runs in the steps of
the requests already decoding on the endpoint, after the prefill queued there (vLLM's chunked
prefill puts running decodes and prefill chunks in one step, running requests first), so each
of them waits ``queue_s + work_s`` longer over its answer (not the floor: their steps read the
weights anyway), but no step outlasts one chunk::

    batch_tpot_s = step_s + min((queue_s + work_s) / STALL_STEPS, max(0, chunk_s − step_s))
                   (0 when nothing runs there)

``STALL_STEPS``: a short answer's decode steps, over which the stall is spread; ``chunk_s =
max_num_batched_tokens / prefill_tokens_per_s``: a step carrying a full chunk of the pool's step
budget (vLLM's ``--max-num-batched-tokens``). Such a step computes the chunk and the decodes in one
forward pass, whose linear layers read the weights once: it lasts about ``max(step_s, chunk_s)``
(the roofline the replay simulator steps by, ``replay/hardware.py``), so the decodes' TPOT is at most
that whatever the prompt: a 512-token budget on the packaged aggregated 70B replica caps it at 42 ms
(the simulator: about 40 ms), the default 8,192 at 0.67 s. A placement
meets the SLO only when this too is within the TPOT objective: a 6,000-token prompt on an
aggregated 70B replica (0.49 s of prefill) breaks the 0.1 s TPOT of the short answers decoding
there ((6 x 21 ms + 0.49 s) / 6 = 0.10 s per token), while in a prefill pool it delays no
decode. ``score`` and ``meets`` count it, so ``best_mode`` (and ``disaggregation.by_prediction``)
move long prompts off replicas that decode.

**Frontier tiers**: the medians their telemetry reports (``ttft_p50_ms``, ``tpot_p50_ms``),
else the fleet's declared ``ttft_median_s`` / ``tpot_median_s``, else ``FRONTIER_TTFT_S`` /
``FRONTIER_TPOT_S``.

**The SLO** of a request is its ``routing.slo_class`` in the fleet (``Fleet.slo``; unknown or
empty: the fleet's default class). ``score`` = max(TTFT / SLO TTFT, TPOT / SLO TPOT): at most
1 meets it; lower is better (with ``batch_tpot_s / SLO TPOT`` too). ``best_mode`` compares modes by it.

Estimates err on the safe side: a full prefill chunk per chunked step, the throughput at full
batch shared by the batch, the KV of the whole prompt transferred.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from pointsman.policy.fleet import Fleet, FrontierTarget, OnPremTarget, Pool, SLOClass
from pointsman.policy.selection.pickers import PoolPick

#: Median TTFT / TPOT (seconds) of a frontier tier that reports and declares none: the order
#: of what public API trackers report for GPT-4o-class tiers (about 80 output tokens/s); the
#: replay simulator's default tier draws around the same medians (``replay/hardware.py``).
FRONTIER_TTFT_S = 0.6
FRONTIER_TPOT_S = 0.012
#: KV transfer bandwidth per GPU of a prefill replica (one 400 Gb/s NIC at 84% of line) and the
#: set-up time of one transfer: the fit to SGLang's P/D transfer times over Mooncake's transfer
#: engine (``kvcache-ai/Mooncake`` docs, sglang-benchmark-results-v1) that replay uses too.
NIC_BYTES_PER_S = 42e9
LINK_LATENCY_S = 0.0018
#: Decode steps over which prefill interference is counted (the answer's start: a short
#: answer's mean TPOT is decided there), and the percentile of that count.
INTERFERENCE_STEPS = 32
INTERFERENCE_QUANTILE = 0.9
#: Highest prefill busy fraction read (1.0 would make every step a chunked one forever).
MAX_PREFILL_SHARE = 0.95
#: Decode steps over which the prefill queued on an aggregated endpoint stalls the requests
#: decoding there (``batch_tpot_s``): a short answer. 6 = the 10th-percentile answer of the Azure
#: LLM code trace (7 tokens, 6 steps after the first; ``../shared/datasets/azure_llm_2023``): the
#: SLO goal is 90% of requests, so the stall is spread over the answers at that percentile; a
#: longer answer spreads the same stall thinner. Replayed against 12 (the trace's median answer)
#: with the default policy on the trace's first 2,000 requests at their own rate, frontier
#: disabled: 12 left 5.5% of them over the TPOT objective, 6 left 1.7%.
STALL_STEPS = 6


@dataclass(frozen=True)
class Prediction:
    """Predicted latency of one request on ``target`` in ``mode`` (``aggregated`` or
    ``disaggregated``; a frontier tier is ``aggregated``) at ``endpoint`` (id of the decode-side
    or aggregated endpoint; the tier's name for a frontier one): ``ttft_s`` = ``queue_s`` +
    ``prefill_s`` + ``transfer_s``, ``tpot_s``, all in seconds; ``inputs``: the signals used
    (for the trace); ``batch_tpot_s``: the TPOT of the requests already decoding on an aggregated
    endpoint once this request's prefill runs among their steps (module docstring; 0 elsewhere)."""

    target: str
    mode: str
    ttft_s: float
    tpot_s: float
    queue_s: float = 0.0
    prefill_s: float = 0.0
    transfer_s: float = 0.0
    endpoint: str = ""
    inputs: dict[str, float | int | str | None] = field(default_factory=dict)
    batch_tpot_s: float = 0.0

    def score(self, slo: SLOClass) -> float:
        """max(TTFT / SLO TTFT, TPOT / SLO TPOT, batch TPOT / SLO TPOT): ≤ 1 meets ``slo``; lower
        is better."""
        return max(self.ttft_s / slo.ttft_s, max(self.tpot_s, self.batch_tpot_s) / slo.tpot_s)

    def meets(self, slo: SLOClass) -> bool:
        """TTFT, TPOT and the batch's TPOT all within ``slo``."""
        return self.ttft_s <= slo.ttft_s and max(self.tpot_s, self.batch_tpot_s) <= slo.tpot_s

    def to_dict(self) -> dict[str, object]:
        """JSON-ready: every field."""
        return {"target": self.target, "mode": self.mode, "ttft_s": self.ttft_s, "tpot_s": self.tpot_s,
                "batch_tpot_s": self.batch_tpot_s, "queue_s": self.queue_s, "prefill_s": self.prefill_s,
                "transfer_s": self.transfer_s, "endpoint": self.endpoint, "inputs": dict(self.inputs)}


def slo_of(fleet: Fleet, slo_class: str) -> SLOClass:
    """The request's SLO class in ``fleet``: ``slo_class`` when the fleet declares it, else the
    fleet's default class (an empty or unknown name is not an error here: ``RoutingEngine.route``
    refuses an unknown ``routing.slo_class`` before any signal is read, ``engine.check_slo_class``)."""
    classes = fleet.slo_classes
    return classes[slo_class] if slo_class in classes else fleet.slo()


def transfer_s(tokens: int, kv_bytes_per_token: int | None, link_bytes_per_s: float,
               latency_s: float = LINK_LATENCY_S) -> float:
    """Seconds to send ``tokens`` tokens' KV from a prefill to a decode replica:
    ``latency_s + tokens × kv_bytes_per_token / link_bytes_per_s`` (0 without a KV size or tokens)."""
    if not kv_bytes_per_token or tokens <= 0:
        return 0.0
    return latency_s + tokens * kv_bytes_per_token / link_bytes_per_s


def kv_link_bytes_per_s(target: OnPremTarget, prefill: Pool | None) -> float:
    """Bytes per second a prefill replica of ``prefill`` sends KV at: ``target.kv_link_bytes_per_s``,
    else one ``NIC_BYTES_PER_S`` NIC per GPU of the replica."""
    return target.kv_link_bytes_per_s or NIC_BYTES_PER_S * (prefill.gpus_per_replica if prefill is not None else 1)


def binomial_quantile(m: int, q: float, quantile: float) -> int:
    """The smallest k with P(Binomial(m, q) ≤ k) ≥ ``quantile`` (exact, by the pmf)."""
    if m <= 0 or q <= 0.0:
        return 0
    if q >= 1.0:
        return m
    total = 0.0
    for k in range(m + 1):
        total += math.comb(m, k) * q ** k * (1.0 - q) ** (m - k)
        if total >= quantile - 1e-12:
            return k
    return m


def interference_s(step_s: float, chunk_s: float, prefill_share: float | None, output_tokens: int) -> float:
    """Seconds a prefill chunk adds to this request's mean TPOT at the 90th percentile (module
    docstring): ``prefill_share`` is the endpoint's recent prefill busy fraction (None: 0)."""
    u = min(MAX_PREFILL_SHARE, max(0.0, prefill_share or 0.0))
    m = min(max(0, output_tokens - 1), INTERFERENCE_STEPS)
    if u <= 0.0 or m == 0 or chunk_s <= 0.0:
        return 0.0
    q = min(1.0, u * step_s / ((1.0 - u) * chunk_s))
    return binomial_quantile(m, q, INTERFERENCE_QUANTILE) * chunk_s / m


def tpot_s(pool: Pool, batch: int, output_tokens: int, *, prefill_share: float | None = None,
           kv_short: bool = False) -> float:
    """Predicted mean TPOT in seconds on one endpoint of ``pool`` that holds ``batch`` other
    requests (module docstring); ``prefill_share`` None on a decode endpoint (no prefill
    there); ``kv_short``: its free KV cannot hold this request (doubles the result)."""
    step = max(pool.decode_step_s or 0.0, (batch + 1) / pool.decode_tokens_per_s)
    extra = 0.0
    if prefill_share is not None:
        extra = interference_s(step, pool.max_num_batched_tokens / pool.prefill_tokens_per_s, prefill_share,
                               output_tokens)
    return (step + extra) * (2.0 if kv_short else 1.0)


def batch_tpot_s(pool: Pool, batch: int, running: int | None, prefill_s: float) -> float:
    """Predicted TPOT of the ``running`` requests decoding on an aggregated endpoint of ``pool``
    (``batch`` outstanding there) when ``prefill_s`` seconds of prefill (the queue there and this
    request's own) run in their steps: ``step + min(prefill_s / STALL_STEPS, max(0, chunk_s - step))``
    with ``step = max(decode_step_s, batch / decode_tokens_per_s)`` and ``chunk_s =
    max_num_batched_tokens / prefill_tokens_per_s`` (no step outlasts one chunk of the pool's step
    budget; module docstring); 0 when none runs."""
    if not running:
        return 0.0
    step = max(pool.decode_step_s or 0.0, batch / pool.decode_tokens_per_s)
    chunk_s = pool.max_num_batched_tokens / pool.prefill_tokens_per_s
    return step + min(prefill_s / STALL_STEPS, max(0.0, chunk_s - step))


def kv_short(pool: Pool, pick: PoolPick, i: int, need_tokens: int) -> bool:
    """Whether endpoint ``i`` of ``pick`` lacks free KV for ``need_tokens`` (its reading's usage
    and capacity, else the pool's capacity; unknown usage: not short)."""
    x = pick.view.loads[i]
    if x is None or x.kv_cache_usage is None:
        return False
    capacity = x.kv_cache_capacity_tokens or pool.kv_cache_capacity_tokens
    return capacity is not None and (1.0 - x.kv_cache_usage) * capacity < need_tokens


def _part(pick: PoolPick, name: str, i: int) -> float:
    col = pick.parts.get(name)
    return 0.0 if col is None else col[i]


def onprem(target_name: str, target: OnPremTarget, mode: str, picks: tuple[PoolPick, ...], *, prompt_tokens: int,
           output_tokens: int) -> Prediction | None:
    """The prediction on ``target`` in ``mode`` from the picker's picks there (aggregated: one
    pick; disaggregated: the prefill then the decode pick), at each pick's chosen endpoint;
    None when a pool has no healthy endpoint. The picks' scorer parts give ``queue_s`` and the
    prefill's work (a picker without scores, ``in-order``, predicts no queue: its parts are absent);
    ``prefill_s`` is at least the prefilling pool's ``decode_step_s``."""
    first, main = picks[0], picks[-1]
    i, j = first.chosen, main.chosen
    if i is None or j is None:
        return None
    queue, work = _part(first, "queue", i), _part(first, "prefill-work", i)
    pool_p = first.view.pool_of(i)
    if "prefill-work" not in first.parts:
        work = prompt_tokens / pool_p.prefill_tokens_per_s if pool_p is not None else 0.0
    floor = (pool_p.decode_step_s or 0.0) if pool_p is not None else 0.0
    prefill = max(floor, work)
    pool = main.view.pool_of(j)
    if pool is None:
        return None
    batch = main.view.outstanding()[j]
    short = kv_short(pool, main, j, prompt_tokens + output_tokens)
    reading = main.view.loads[j]
    moved = stall = 0.0
    inputs: dict[str, float | int | str | None] = {"batch": batch, "kv_short": int(short), "prefill_floor_s": floor}
    if mode == "aggregated":
        share = reading.prefill_utilization if reading is not None else None
        running = reading.num_requests_running if reading is not None else None
        inputs["prefill_utilization"], inputs["running"] = share, running
        tpot = tpot_s(pool, batch, output_tokens, prefill_share=share or 0.0, kv_short=short)
        stall = batch_tpot_s(pool, batch, running, queue + work)
    else:
        link = kv_link_bytes_per_s(target, pool_p)
        held = main.view.hit(j)[0]  # the decode side reads only the blocks it lacks
        moved = transfer_s(prompt_tokens - held, target.kv_bytes_per_token, link)
        inputs["link_bytes_per_s"], inputs["decode_cached_tokens"] = link, held
        tpot = tpot_s(pool, batch, output_tokens, kv_short=short)
    return Prediction(target_name, mode, queue + prefill + moved, tpot, queue, prefill, moved,
                      main.view.endpoints[j].id, inputs, stall)


def frontier(target_name: str, target: FrontierTarget, pick: PoolPick) -> Prediction:
    """The prediction on a frontier tier: its reported medians, else its declared ones, else the defaults."""
    reading = pick.view.loads[0] if pick.view.loads else None
    ttft = reading.ttft_p50_ms / 1e3 if reading is not None and reading.ttft_p50_ms else None
    tpot = reading.tpot_p50_ms / 1e3 if reading is not None and reading.tpot_p50_ms else None
    source = "reported" if ttft is not None or tpot is not None else "declared"
    return Prediction(target_name, "aggregated", ttft or target.ttft_median_s or FRONTIER_TTFT_S,
                      tpot or target.tpot_median_s or FRONTIER_TPOT_S, endpoint=target_name,
                      inputs={"source": source})


def best_mode(aggregated: Prediction | None, disaggregated: Prediction | None, slo: SLOClass) -> Prediction | None:
    """The better of two predictions by ``Prediction.score`` (aggregated on ties: no transfer,
    no second pool); either may be None (mode absent or no healthy endpoint)."""
    if aggregated is None or disaggregated is None:
        return aggregated or disaggregated
    return disaggregated if disaggregated.score(slo) < aggregated.score(slo) else aggregated
