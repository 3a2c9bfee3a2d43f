"""The replay report: a terminal table, JSON, PNG plots and a self-contained HTML page.

``write_report(runs, out_dir, meta)`` writes ``report.json``, ``report.txt`` (the table),
four PNGs and ``report.html`` (the table and the PNGs embedded as base64) and returns
the paths. Series, per run, over the trace clock in bins of ``ReplayResult.timeline_bin_s``:

- **cost per token over time** (``cost_usd_per_mtok``): cost incurred in the bin ÷ output
  tokens of requests finishing in it, per 1M tokens: on-prem = provisioned GPU-hours of
  the bin's seconds within the window (the last bin is partial) + energy of its busy time
  (``metrics`` prices), frontier = bills of requests finishing in the bin; split into its on-prem and frontier parts
  (``cost_onprem_usd_per_mtok`` + ``cost_frontier_usd_per_mtok`` = the total). The plot draws,
  per run in its own panel, the rolling median over ``ROLLING_BINS`` bins of each part
  (stacked) and of the total (a line);
- **target mix over time** (``target_share``): share of the bin's arrivals that ran on
  each target (``rejected`` for refused ones);
- **TTFT distribution**: the empirical CDF of completed requests' TTFT;
- **prefill vs decode utilization over time**: busy GPU-seconds in each phase ÷
  provisioned GPU-seconds of the whole on-prem fleet in the bin (its seconds within the window).

matplotlib (the ``replay`` extra) is imported only to draw.
"""

from __future__ import annotations

import base64
import html
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NotRequired, TypedDict

import numpy as np

from pointsman.replay.breakdown import format_rows
from pointsman.replay.budgets import BudgetSpend
from pointsman.replay.results import ReplayResult
from pointsman.replay.runs import Run
from pointsman.replay.summary import format_table

#: Bins in the rolling median of the cost-per-token plot (a minute at the default 10 s bins).
ROLLING_BINS = 6

PLOTS = (
    ("cost_per_token", "Effective price per 1M output tokens over time"),
    ("target_mix", "Target mix over time (share of arrivals)"),
    ("ttft_cdf", "TTFT distribution (CDF)"),
    ("utilization", "On-prem GPU utilization: prefill vs decode"),
)


class ReplayMeta(TypedDict):
    """What ``pointsman replay`` ran: the header of ``report.json`` and of the HTML page."""

    trace: str
    requests: int
    fleet: str
    policies: str
    seed: int
    limit: int | None
    estimator: str
    outcomes: str
    slo: str
    window_s: float
    budgets: str
    wall_s: float
    logged_judge_score: NotRequired[str]
    slo_class: NotRequired[str]
    prefix_block_ids: NotRequired[str]
    goodput: NotRequired[str]
    cascade: NotRequired[str]
    skipped: NotRequired[dict[str, str]]
    goodput_limit: NotRequired[str]
    goodput_ceiling: NotRequired[str]
    goodput_floor: NotRequired[dict[str, object]]
    scale: NotRequired[float]


class Series(TypedDict):
    """One run's time series in ``report.json`` (one value per bin; see the module docstring)."""

    t_s: list[float]
    cost_usd_per_mtok: list[float]
    cost_onprem_usd_per_mtok: list[float]
    cost_frontier_usd_per_mtok: list[float]
    target_share: dict[str, list[float]]
    prefill_utilization: list[float]
    decode_utilization: list[float]


class PlotSeries(Series):
    """``Series`` plus the sorted TTFTs the CDF plot draws (not in ``report.json``)."""

    ttft_s: list[float]


class RunReport(TypedDict):
    """One run in ``report.json``."""

    kind: str
    summary: dict[str, object]
    rules: dict[str, int]
    budget: list[BudgetSpend]
    series: Series
    goodput: NotRequired[dict[str, object]]
    by_rule: NotRequired[list[dict[str, object]]]


class ReplayReport(TypedDict):
    """``report.json``: ``meta`` and every run by name."""

    meta: ReplayMeta
    runs: dict[str, RunReport]


def series(result: ReplayResult) -> PlotSeries:
    """Time series of one replay (see the module docstring): ``t_s`` (bin starts, s from the
    first arrival), ``cost_usd_per_mtok``, ``target_share`` {target: [...]},
    ``prefill_utilization``, ``decode_utilization`` (lists, one value per bin; NaN where
    nothing finished), and ``ttft_s`` (sorted TTFTs)."""
    bin_s = result.timeline_bin_s
    n = max((len(v["prefill_busy_gpu_s"]) for v in result.timeline.values()), default=0)
    n = max(n, int(result.window_s // bin_s) + 1)
    start = result.start_s

    def idx(t: float) -> int:
        return min(n - 1, max(0, int((t - start) // bin_s)))

    # seconds of the window in each bin: the last is partial (a window of 3.8 s in 10-s bins billed 10 s of GPUs)
    width = np.clip(result.window_s - np.arange(n) * bin_s, 0.0, bin_s)
    cost = np.zeros(n)
    frontier_cost = np.zeros(n)
    tokens = np.zeros(n)
    prefill_gpu_s = np.zeros(n)
    decode_gpu_s = np.zeros(n)
    fleet_gpus = 0
    for t in result.fleet.on_prem:
        fleet_gpus += t.gpus
        tl = result.timeline.get(t.name)
        spec = t.replica
        cost += t.gpus * width / 3600 * (t.gpu_hour_usd + spec.gpu_idle_kw * t.electricity_usd_per_kwh)
        if tl is not None:
            p = np.asarray(tl["prefill_busy_gpu_s"][:n] + [0.0] * (n - len(tl["prefill_busy_gpu_s"])))
            d = np.asarray(tl["decode_busy_gpu_s"][:n] + [0.0] * (n - len(tl["decode_busy_gpu_s"])))
            prefill_gpu_s += p
            decode_gpu_s += d
            cost += (p + d) / 3600 * (spec.gpu_tdp_kw - spec.gpu_idle_kw) * t.electricity_usd_per_kwh
    mix: dict[str, np.ndarray] = {}
    arrivals = np.zeros(n)
    for r in result.requests:
        i = idx(r.arrival_s)
        arrivals[i] += 1
        if r.rejected is not None or r.target is None or r.finish_s is None:  # refused (a completed one has both)
            mix.setdefault("rejected", np.zeros(n))[i] += 1
        else:
            mix.setdefault(r.target, np.zeros(n))[i] += 1
            j = idx(r.finish_s)
            tokens[j] += r.output_tokens
            frontier_cost[j] += r.cost_usd
    with np.errstate(invalid="ignore", divide="ignore"):
        onprem_cpt = np.where(tokens > 0, cost / tokens * 1e6, np.nan)
        frontier_cpt = np.where(tokens > 0, frontier_cost / tokens * 1e6, np.nan)
        cpt = onprem_cpt + frontier_cpt
        share = {k: np.where(arrivals > 0, v / arrivals, np.nan).tolist() for k, v in sorted(mix.items())}
        denom = fleet_gpus * width
        pu = np.where(denom > 0, prefill_gpu_s / denom, 0.0).tolist()
        du = np.where(denom > 0, decode_gpu_s / denom, 0.0).tolist()
    return PlotSeries(t_s=[i * bin_s for i in range(n)], cost_usd_per_mtok=cpt.tolist(),
                      cost_onprem_usd_per_mtok=onprem_cpt.tolist(), cost_frontier_usd_per_mtok=frontier_cpt.tolist(),
                      target_share=share,
                      prefill_utilization=pu, decode_utilization=du,
                      ttft_s=sorted(r.ttft_s for r in result.requests if r.rejected is None and r.ttft_s is not None))


def report_dict(runs: Sequence[Run], meta: ReplayMeta) -> ReplayReport:
    """The JSON report: ``meta`` (trace, fleet, seed, ...), and per run its ``kind``,
    ``summary`` (``summary.Summary`` fields), ``rules``, ``budget`` (each budget that applied
    with its ledger spend at the end, ``replay.budgets.budget_status``; empty without budgets),
    ``series`` (TTFTs left out), for a policy with outcome rows ``by_rule`` (``replay.breakdown``) and,
    when searched, ``goodput`` (``replay.goodput.GoodputResult``:
    the answer and every replay point)."""
    out = ReplayReport(meta=ReplayMeta(**meta), runs={})
    for run in runs:
        s = series(run.result)
        timeline = Series(t_s=s["t_s"], cost_usd_per_mtok=s["cost_usd_per_mtok"],
                          cost_onprem_usd_per_mtok=s["cost_onprem_usd_per_mtok"],
                          cost_frontier_usd_per_mtok=s["cost_frontier_usd_per_mtok"], target_share=s["target_share"],
                          prefill_utilization=s["prefill_utilization"], decode_utilization=s["decode_utilization"])
        report = RunReport(kind=run.kind, summary=run.summary.to_dict(), rules=run.rules, budget=run.budget,
                           series=timeline)
        if run.goodput is not None:
            report["goodput"] = run.goodput.to_dict()
        if run.by_rule:
            report["by_rule"] = [x.to_dict() for x in run.by_rule]
        out["runs"][run.name] = report
    return out


def rolling_median(values: Sequence[float], window: int = ROLLING_BINS) -> list[float]:
    """Median of the finite values among each value and the ``window - 1`` before it (NaN
    where there are none)."""
    out = []
    for i in range(len(values)):
        w = [v for v in values[max(0, i - window + 1):i + 1] if math.isfinite(v)]
        out.append(float(np.median(w)) if w else math.nan)
    return out


def _plot(kind: str, title: str, runs: Sequence[Run], data: Mapping[str, PlotSeries], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if kind == "target_mix":
        fig, axes = plt.subplots(len(runs), 1, figsize=(10, 1.6 * len(runs) + 1), sharex=True, squeeze=False)
        keys = sorted({k for run in runs for k in data[run.name]["target_share"]})
        colors = [plt.get_cmap("tab10")(i % 10) for i in range(len(keys))]
        for ax, run in zip(axes[:, 0], runs):
            s = data[run.name]
            zero = [0.0] * len(s["t_s"])
            ax.stackplot(s["t_s"], [np.nan_to_num(s["target_share"].get(k, zero)) for k in keys], labels=keys,
                         colors=colors)
            ax.set_ylabel(run.name, rotation=0, ha="right", fontsize=8)
            ax.set_ylim(0, 1)
        axes[0, 0].legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
        axes[-1, 0].set_xlabel("trace time (s)")
    elif kind == "utilization":
        # One panel per run (20 overlaid lines hide the two phases this plot is for).
        fig, axes = plt.subplots(len(runs), 1, figsize=(10, 1.4 * len(runs) + 1), sharex=True, sharey=True,
                                 squeeze=False)
        for ax, run in zip(axes[:, 0], runs):
            s = data[run.name]
            ax.plot(s["t_s"], s["prefill_utilization"], "-", color="tab:blue", label="prefill")
            ax.plot(s["t_s"], s["decode_utilization"], "-", color="tab:orange", label="decode")
            ax.set_ylabel(run.name, rotation=0, ha="right", fontsize=8)
        axes[0, 0].legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
        axes[-1, 0].set_xlabel("trace time (s); busy GPU-s / provisioned GPU-s per phase")
    elif kind == "cost_per_token":
        # One panel per run, each on its own scale: the rolling medians of the on-prem and the
        # frontier part stacked (they add up to the total), the total's rolling median on top.
        fig, axes = plt.subplots(len(runs), 1, figsize=(10, 1.5 * len(runs) + 1), sharex=True, squeeze=False)
        for ax, run in zip(axes[:, 0], runs):
            s = data[run.name]
            onprem = np.nan_to_num(rolling_median(s["cost_onprem_usd_per_mtok"]))
            frontier = np.nan_to_num(rolling_median(s["cost_frontier_usd_per_mtok"]))
            ax.stackplot(s["t_s"], [onprem, frontier], colors=["tab:blue", "tab:red"], alpha=0.6,
                         labels=["on-prem part", "frontier part"])
            ax.plot(s["t_s"], rolling_median(s["cost_usd_per_mtok"]), "-", color="black", lw=1, label="total")
            ax.set_ylim(bottom=0)
            ax.set_ylabel(f"{run.name}\n{run.summary.effective_usd_per_mtok:.2f} $/Mtok", rotation=0, ha="right",
                          fontsize=8)
        axes[0, 0].legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
        axes[-1, 0].set_xlabel(f"trace time (s); USD per 1M output tokens, rolling median of {ROLLING_BINS} bins")
    else:
        fig, ax = plt.subplots(figsize=(10, 4.5))
        for run in runs:
            s = data[run.name]
            style = "-" if run.kind == "policy" else "--"
            if kind == "ttft_cdf":
                x = s["ttft_s"]
                if x:
                    ax.plot(x, np.arange(1, len(x) + 1) / len(x), style, label=run.name)
                ax.set_xscale("log")
                ax.set_xlabel("TTFT (s)")
                ax.set_ylabel("share of requests")
        ax.legend(fontsize=7, ncol=2, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _html(table: str, meta: Mapping[str, object], pngs: Sequence[tuple[str, Path]]) -> str:
    imgs = "\n".join(
        f"<h2>{html.escape(title)}</h2>\n<img alt=\"{html.escape(title)}\" "
        f"src=\"data:image/png;base64,{base64.b64encode(path.read_bytes()).decode('ascii')}\">"
        for title, path in pngs)
    meta_rows = "\n".join(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>"
                          for k, v in meta.items())
    return (f"<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>Pointsman replay</title>"
            f"<style>body{{font-family:sans-serif;margin:2em}}pre{{font-size:12px}}img{{max-width:100%}}"
            f"th{{text-align:left;padding-right:1em}}</style></head><body>\n<h1>Pointsman replay</h1>\n"
            f"<table>{meta_rows}</table>\n<pre>{html.escape(table)}</pre>\n{imgs}\n</body></html>\n")


def write_report(runs: Sequence[Run], out_dir: str | Path, meta: ReplayMeta) -> dict[str, Path]:
    """Write ``report.txt``, ``report.json``, the PNGs of ``PLOTS`` and ``report.html`` into
    ``out_dir`` (created if missing); returns {name: path}. JSON writes NaN as null."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    table = report_text(runs, meta)
    paths = {"table": out / "report.txt", "json": out / "report.json", "html": out / "report.html"}
    paths["table"].write_text(table + "\n", encoding="utf-8")
    doc = report_dict(runs, meta)
    paths["json"].write_text(json.dumps(_finite(doc), indent=1) + "\n", encoding="utf-8")
    data = {r.name: series(r.result) for r in runs}
    pngs = []
    for kind, title in PLOTS:
        path = out / f"{kind}.png"
        _plot(kind, title, runs, data, path)
        paths[kind] = path
        pngs.append((title, path))
    paths["html"].write_text(_html(table, meta, pngs), encoding="utf-8")
    return paths


def report_text(runs: Sequence[Run], meta: Mapping[str, object]) -> str:
    """The comparison table, the notes of ``meta`` (block ids, goodput, skipped policies), each policy's
    requests by deciding rule (``replay.breakdown``) and, when searched, each run's goodput points."""
    lines = [format_table({r.name: r.summary for r in runs})]
    for key in ("prefix_block_ids", "goodput", "goodput_limit", "goodput_ceiling"):
        if key in meta:
            lines.append(f"\n{key.replace('_', ' ')}: {meta[key]}")
    skipped = meta.get("skipped")
    if isinstance(skipped, Mapping) and skipped:
        lines.append("\nskipped policies (not replayed):")
        lines += [f"  {name}: {why}" for name, why in skipped.items()]
    for r in runs:
        if r.result.unmodelled_escalations:
            where = ", ".join(f"{n} to {t}" for t, n in sorted(r.result.unmodelled_escalations.items()))
            lines.append(f"\n{r.name}: the verify rules escalated {where} (on-prem): not simulated, those drafts "
                         "stand as the answers (cost, latency and quality leave the escalated calls out)")
        if r.result.refused_escalations:
            lines.append(f"\n{r.name}: {r.result.refused_escalations} escalations refused (over the budget, "
                         "or no healthy endpoint): those drafts stand, as the service answers them")
    for r in runs:
        if r.by_rule:
            lines.append(f"\n{r.name} by deciding rule (missed: SLO missed or rejected; ref: all-frontier's quality "
                         "on the same requests; gap: the rule's share of the run's quality gap to it):")
            lines.append(format_rows(r.by_rule))
    searched = [r for r in runs if r.goodput is not None]
    if searched:
        lines.append("\ngoodput search (scale of the arrival rate -> SLO attainment; '<' = stopped once it could not "
                     "pass; overloaded: an on-prem pool's work exceeds its GPU time over the arrival span, which "
                     "fails the point):")
        for r in searched:
            g = r.goodput
            if g is None:
                continue
            pts = ", ".join(f"{p.scale:.3g}x <{g.goal:.0%}" if not p.complete else
                            f"{p.scale:.3g}x {p.attainment:.1%} overloaded {p.load:.0%}" if p.load > 1.0 else
                            f"{p.scale:.3g}x {p.attainment:.1%}" for p in g.points)
            lines.append(f"  {r.name}: {g.max_goodput_rps:.3f} req/s ({g.max_goodput_rps_per_gpu:.4f}/GPU of {g.gpus}); "
                         f"{pts}")
    return "\n".join(lines)


def _finite(x: object) -> object:
    """``x`` with NaN/inf floats replaced by None (strict JSON)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


__all__ = ["PLOTS", "ROLLING_BINS", "PlotSeries", "ReplayMeta", "ReplayReport", "RunReport", "Series", "report_dict",
           "report_text", "rolling_median", "series", "write_report"]
