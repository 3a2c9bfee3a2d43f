"""Aggregate a ``ReplayResult`` into the numbers a policy is judged by.

Definitions:

- **cost**: on-prem = for every replica, GPUs x window hours x ``gpu_hour_usd``
  (GPUs are paid while provisioned, busy or not) + energy = GPUs x (idle kW x window
  hours + (TDP - idle) kW x busy hours) x ``electricity_usd_per_kwh``; frontier = the
  API bills. The window is first arrival to the last finish or last arrival, whichever is
  later (refused requests at the end of a trace do not shorten it).
- **effective price per token** = total cost / output tokens produced by completed
  requests, reported per million tokens (``effective_usd_per_mtok``).
- **frontier share**: completed requests served by a frontier tier (spilled ones included).
- **TTFT / TPOT percentiles** over completed requests (TPOT over those with >= 2 output tokens).
- **SLO attainment**: share of *all* requests (rejected ones fail) with TTFT <= ``slo.ttft_s``
  and TPOT <= ``slo.tpot_s`` (a one-token answer has no TPOT and passes that part);
  **goodput** = such requests / window seconds; **cost per SLO-meeting request** = total
  cost / such requests (``usd_per_slo_request``).
- **max goodput** (``replay.goodput``, when searched): DistServe's goodput, the highest
  arrival rate at which at least 90% of requests meet both objectives and no on-prem pool is
  overloaded (``pool_loads`` above 1), with frontier targets disabled (``max_goodput_rps``), and
  per on-prem GPU (``max_goodput_rps_per_gpu``).
- **prefix hit ratio**: prompt tokens found in the replica's prefix cache / prompt
  tokens of completed on-prem requests; **restored ratio**: the same for tokens
  restored from a shared KV tier.
- **GPU utilization** split into prefill and decode: busy GPU-seconds / provisioned
  GPU-seconds, per target and fleet-wide.
- **budget** (policy runs with budgets, ``replay.runs``): USD the budget ledger holds as
  spent (settled + still reserved) at the end, against the limit, for the budget with the
  highest spent fraction; the ledger books per-request costs (frontier bills, on-prem by the
  cost model), not the provisioned GPU-hours of ``cost``.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from pointsman.replay.results import ReplayResult, ReplicaStats, RequestResult
from pointsman.replay.sim_fleet import OnPremTarget


@dataclass(frozen=True)
class SLO:
    """Latency objectives in seconds. Defaults: the fleet's ``interactive`` class
    (``policy.fleet.DEFAULT_SLO_CLASSES``: MLPerf Inference's Llama 3.1 8B server constraints,
    TTFT 2 s, TPOT 100 ms); replay takes them from the fleet's ``slo_classes``."""

    ttft_s: float = 2.0
    tpot_s: float = 0.100


@dataclass(frozen=True)
class Summary:
    """One policy's replay outcome. Costs in USD; times in seconds; fractions 0-1.

    ``target_requests``: completed requests per target. ``utilization``: per on-prem
    target, ``{"prefill": f, "decode": f}`` busy fractions of provisioned GPU time.
    Percentiles are NaN when there is nothing to measure. ``quality``: mean quality (0-1)
    of the requests whose outcome is known (``replay.outcomes``), a rejected one scoring 0 (it
    got no answer: a router cannot raise its quality by refusing hard prompts), else NaN.
    ``budget_spent_usd`` / ``budget_limit_usd``: the binding budget's ledger spend and limit
    at the end of a run with budgets (module docstring), else NaN. ``usd_per_slo_request``:
    total cost / SLO-meeting requests (inf when none met it). ``max_goodput_rps`` /
    ``max_goodput_rps_per_gpu``: the goodput search's answer with frontier targets disabled
    (``replay.goodput``), NaN when not searched. ``escalated``: completed requests the cascade
    escalated after their on-prem draft (``replay.cascade``; they count as frontier requests);
    ``escalation_delay_p50_s`` / ``_p99_s``: percentiles of their ``escalation_delay_s`` (the latency
    the cascade added: arrival to the escalated call's start), NaN without escalations.
    ``unmodelled_escalations``: drafts the verify rules escalated to an on-prem target, kept as the
    drafts (not simulated: their second call's cost, latency and quality are not in these numbers).
    ``refused_escalations``: drafts an escalating verify rule matched but no target took (the
    ``budget`` filter excluded its targets or their holds did not fit): not escalated, as the service answers them.
    ``onprem_busy_energy_usd``: the part of ``onprem_cost_usd`` that grows with the work served (the
    energy above idle power while busy); the rest (GPU rent, idle power) grows with the window.
    """

    requests: int
    completed: int
    rejected: int
    spilled: int
    frontier_share: float
    prompt_tokens: int
    output_tokens: int
    onprem_cost_usd: float
    frontier_cost_usd: float
    total_cost_usd: float
    effective_usd_per_mtok: float
    ttft_p50_s: float
    ttft_p99_s: float
    tpot_p50_s: float
    tpot_p99_s: float
    slo_attainment: float
    goodput_rps: float
    prefix_hit_ratio: float
    restored_ratio: float
    prefill_utilization: float
    decode_utilization: float
    window_s: float
    target_requests: dict[str, int]
    utilization: dict[str, dict[str, float]]
    quality: float = math.nan
    budget_spent_usd: float = math.nan
    budget_limit_usd: float = math.nan
    usd_per_slo_request: float = math.nan
    max_goodput_rps: float = math.nan
    max_goodput_rps_per_gpu: float = math.nan
    escalated: int = 0
    escalation_delay_p50_s: float = math.nan
    escalation_delay_p99_s: float = math.nan
    onprem_busy_energy_usd: float = 0.0
    unmodelled_escalations: int = 0
    refused_escalations: int = 0

    def to_dict(self) -> dict[str, object]:
        """Plain JSON-ready dict (NaN stays NaN; ``json.dumps`` writes it as NaN)."""
        return asdict(self)


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else math.nan


def meets_slo(r: RequestResult, slo: SLO) -> bool:
    """Whether ``r`` completed with TTFT and TPOT within ``slo`` (a one-token answer has no TPOT)."""
    return r.rejected is None and r.ttft_s is not None and r.ttft_s <= slo.ttft_s and \
        (r.tpot_s is None or r.tpot_s <= slo.tpot_s)


def busy_energy_usd_of(rs: ReplicaStats, target: OnPremTarget) -> float:
    """USD of the energy above idle power that replica ``rs`` of ``target`` drew while busy: GPUs x
    (TDP - idle) kW x busy hours x ``electricity_usd_per_kwh``."""
    spec = target.spec_for(rs.role)
    busy_h = (rs.prefill_busy_s + rs.decode_busy_s) / 3600
    return rs.gpus * (spec.gpu_tdp_kw - spec.gpu_idle_kw) * busy_h * target.electricity_usd_per_kwh


def arrival_span_s(result: ReplayResult) -> float:
    """Seconds from the first arrival to the last of ``result``'s requests; the replay window when
    every request arrives at one instant (or there is none)."""
    times = [r.arrival_s for r in result.requests]
    span = max(times) - min(times) if times else 0.0
    return span if span > 0 else result.window_s


def pool_loads(result: ReplayResult) -> dict[str, float]:
    """Per on-prem pool (``"target/role"``, role ``aggregated``, ``prefill`` or ``decode``) the work its
    replicas' steps needed (``ReplicaStats.work_s`` x GPUs, GPU-seconds) over their GPU-seconds in the
    arrival span (``arrival_span_s``): a fraction, above 1 when the pool cannot keep up with the
    traffic (its queues grow without bound in steady state; its attainment on a replay lasts only
    as long as the trace). Pools of a 0 s span are left out."""
    span = arrival_span_s(result)
    pools: dict[str, list[float]] = {}
    for rs in result.replicas:
        acc = pools.setdefault(f"{rs.target}/{rs.role}", [0.0, 0.0])
        acc[0] += rs.work_s * rs.gpus
        acc[1] += span * rs.gpus
    return {pool: work / gpu_s for pool, (work, gpu_s) in pools.items() if gpu_s > 0}


def summarize(result: ReplayResult, slo: SLO | None = None,
              quality: Callable[[RequestResult], float | None] | None = None) -> Summary:
    """Summarize a replay (see the module docstring for every definition). ``quality(r)``:
    the quality 0-1 of a request had it completed where it ran, or None when unknown
    (``Summary.quality`` averages the known values, 0 for a rejected request; e.g.
    ``replay.outcome_draw.quality_of``)."""
    slo = slo or SLO()
    reqs = result.requests
    done = [r for r in reqs if r.rejected is None]
    window_s = result.window_s
    window_h = window_s / 3600

    onprem_cost = busy_energy_usd = 0.0
    gpu_s = 0.0
    busy_prefill_gpu_s = busy_decode_gpu_s = 0.0
    utilization: dict[str, dict[str, float]] = {}
    targets = {t.name: t for t in result.fleet.on_prem}
    per_target: dict[str, list[float]] = {name: [0.0, 0.0, 0.0] for name in targets}
    for rs in result.replicas:
        t = targets[rs.target]
        busy_h = (rs.prefill_busy_s + rs.decode_busy_s) / 3600
        spec = t.spec_for(rs.role)
        energy_kwh = rs.gpus * (spec.gpu_idle_kw * window_h + (spec.gpu_tdp_kw - spec.gpu_idle_kw) * busy_h)
        onprem_cost += rs.gpus * window_h * t.gpu_hour_usd + energy_kwh * t.electricity_usd_per_kwh
        busy_energy_usd += busy_energy_usd_of(rs, t)
        acc = per_target[rs.target]
        acc[0] += rs.prefill_busy_s * rs.gpus
        acc[1] += rs.decode_busy_s * rs.gpus
        acc[2] += window_s * rs.gpus
    for name, (pf, dc, prov) in per_target.items():
        utilization[name] = {"prefill": pf / prov if prov else 0.0, "decode": dc / prov if prov else 0.0}
        busy_prefill_gpu_s += pf
        busy_decode_gpu_s += dc
        gpu_s += prov

    frontier_cost = sum(r.cost_usd for r in done)
    output_tokens = sum(r.output_tokens for r in done)
    total = onprem_cost + frontier_cost
    ttfts = [r.ttft_s for r in done if r.ttft_s is not None]  # every completed request has one
    tpots = [r.tpot_s for r in done if r.tpot_s is not None]
    good = sum(1 for r in done if meets_slo(r, slo))
    onprem_done = [r for r in done if not r.frontier]
    delays = [r.escalation_delay_s for r in done if r.escalation_delay_s is not None]
    onprem_prompt = sum(r.prompt_tokens for r in onprem_done)
    return Summary(
        requests=len(reqs),
        completed=len(done),
        rejected=len(reqs) - len(done),
        spilled=sum(r.spilled for r in reqs),
        frontier_share=sum(r.frontier for r in done) / len(done) if done else 0.0,
        prompt_tokens=sum(r.prompt_tokens for r in done),
        output_tokens=output_tokens,
        onprem_cost_usd=onprem_cost,
        frontier_cost_usd=frontier_cost,
        total_cost_usd=total,
        effective_usd_per_mtok=total / output_tokens * 1e6 if output_tokens else math.nan,
        ttft_p50_s=_pct(ttfts, 50),
        ttft_p99_s=_pct(ttfts, 99),
        tpot_p50_s=_pct(tpots, 50),
        tpot_p99_s=_pct(tpots, 99),
        slo_attainment=good / len(reqs) if reqs else 0.0,
        goodput_rps=good / window_s if window_s > 0 else 0.0,
        prefix_hit_ratio=sum(r.prefix_hit_tokens for r in onprem_done) / onprem_prompt if onprem_prompt else 0.0,
        restored_ratio=sum(r.restored_tokens for r in onprem_done) / onprem_prompt if onprem_prompt else 0.0,
        prefill_utilization=busy_prefill_gpu_s / gpu_s if gpu_s else 0.0,
        decode_utilization=busy_decode_gpu_s / gpu_s if gpu_s else 0.0,
        window_s=window_s,
        target_requests=dict(Counter(r.target for r in done if r.target is not None)),
        utilization=utilization,
        quality=_mean_quality(reqs, quality),
        usd_per_slo_request=total / good if good else math.inf,
        escalated=sum(r.escalated for r in done),
        unmodelled_escalations=sum(result.unmodelled_escalations.values()),
        refused_escalations=result.refused_escalations,
        escalation_delay_p50_s=_pct(delays, 50),
        escalation_delay_p99_s=_pct(delays, 99),
        onprem_busy_energy_usd=busy_energy_usd,
    )


def _mean_quality(reqs: Sequence[RequestResult], quality: Callable[[RequestResult], float | None] | None) -> float:
    if quality is None:
        return math.nan
    known = [0.0 if r.rejected is not None else q for r, q in ((r, quality(r)) for r in reqs) if q is not None]
    return sum(known) / len(known) if known else math.nan


_COLUMNS = (
    ("$/Mtok", "effective_usd_per_mtok", "{:.2f}"),
    ("cost $", "total_cost_usd", "{:.2f}"),
    ("frontier", "frontier_share", "{:.1%}"),
    ("quality", "quality", "{:.3f}"),
    ("TTFT p50", "ttft_p50_s", "{:.2f}s"),
    ("TTFT p99", "ttft_p99_s", "{:.2f}s"),
    ("TPOT p50", "tpot_p50_s", "{:.0f}ms", 1000),
    ("TPOT p99", "tpot_p99_s", "{:.0f}ms", 1000),
    ("SLO", "slo_attainment", "{:.1%}"),
    ("goodput", "goodput_rps", "{:.2f}/s"),
    ("$/SLO req", "usd_per_slo_request", "{:.4f}"),
    ("spill", "spilled", "{}"),
    ("escalated", "escalated", "{}"),
    ("reject", "rejected", "{}"),
    ("hit", "prefix_hit_ratio", "{:.1%}"),
    ("util P", "prefill_utilization", "{:.1%}"),
    ("util D", "decode_utilization", "{:.1%}"),
)


#: Columns added when the goodput search ran.
_GOODPUT_COLUMNS = (
    ("max goodput", "max_goodput_rps", "{:.2f}/s"),
    ("/GPU", "max_goodput_rps_per_gpu", "{:.3f}/s"),
)


def format_table(summaries: dict[str, Summary]) -> str:
    """Plain-text comparison table, one row per named summary, columns as in ``_COLUMNS``
    (and ``_GOODPUT_COLUMNS`` when any summary has a searched goodput), plus ``budget $``
    (ledger spend / limit, ``-`` for runs without a budget) when any has one."""
    budgets = any(not math.isnan(s.budget_limit_usd) for s in summaries.values())
    columns = _COLUMNS + (_GOODPUT_COLUMNS if any(not math.isnan(s.max_goodput_rps) for s in summaries.values())
                          else ())
    header = ["policy"] + [c[0] for c in columns] + (["budget $"] if budgets else [])
    rows = [header]
    for name, s in summaries.items():
        row = [name]
        for col in columns:
            value = getattr(s, col[1])
            scale = col[3] if len(col) > 3 else 1
            row.append("n/a" if isinstance(value, float) and math.isnan(value) else col[2].format(value * scale))
        if budgets:
            row.append("-" if math.isnan(s.budget_limit_usd)
                       else f"{s.budget_spent_usd:.2f}/{s.budget_limit_usd:g}")
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(cell.rjust(w) if i else cell.ljust(w) for i, (cell, w) in enumerate(zip(r, widths))) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
