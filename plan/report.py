"""The plan report: a terminal table of the Pareto front, ``plan.json``, PNG plots and a
self-contained ``plan.html`` (the table and the PNGs as base64), in the ``--out`` folder.

Plots: **front** (monthly cost vs SLO attainment of every shape the search evaluated, its front
joined, the shapes replayed on the whole trace, the overloaded ones crossed, the recommended and
the base shape marked, the goal drawn); **prefill utilization** and **decode
utilization** over time on separate charts (the two phases load GPUs differently), one line per
on-prem target for the recommended and the base shape; **growth** (SLO attainment and the
frontier bill per month of the front shapes at each ``--scale``). matplotlib (the ``replay``
extra) is imported only to draw.
"""

from __future__ import annotations

import base64
import html
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from pointsman.plan.evaluate import ShapeResult


def _fmt(x: float, spec: str) -> str:
    return "n/a" if isinstance(x, float) and math.isnan(x) else format(x, spec)


def table(rows: Sequence[ShapeResult], marks: Mapping[str, str] | None = None,
          growth: Mapping[str, Mapping[float, ShapeResult]] | None = None) -> str:
    """One line per shape: GPUs, monthly cost (total, on-prem, frontier, KV tier), SLO attainment,
    quality, $/Mtok, on-prem utilization (prefill + decode), load (``_load``), TTFT / TPOT p99
    and, with ``growth``, attainment (``overloaded`` when it is) and frontier bill at each other
    scale; ``marks``: a tag per label."""
    scales = sorted({x for g in (growth or {}).values() for x in g})
    head = ["shape", "GPUs", "$/month", "on-prem", "frontier", "KV tier", "SLO", "quality", "$/Mtok",
            "util P+D", "load", "TTFT p99", "TPOT p99"] + [f"x{x:g} SLO / frontier $" for x in scales]
    lines = [head]
    for r in rows:
        tag = (marks or {}).get(r.label, "")
        line = [f"{r.label}{' ' + tag if tag else ''}", str(r.gpus), f"{r.usd_per_month:,.0f}",
                f"{r.onprem_usd_per_month:,.0f}", f"{r.frontier_usd_per_month:,.0f}", f"{r.kv_usd_per_month:,.0f}",
                _fmt(r.slo_attainment, ".1%"), _fmt(r.quality, ".4f"), _fmt(r.usd_per_mtok, ".2f"),
                f"{_fmt(r.utilization, '.1%')} ({_fmt(r.prefill_utilization, '.0%')}+"
                f"{_fmt(r.decode_utilization, '.0%')})", _load(r),
                _fmt(r.ttft_p99_s, ".2f") + "s", _fmt(r.tpot_p99_s * 1000, ".0f") + "ms"]
        for x in scales:
            g = (growth or {}).get(r.label, {}).get(x)
            line.append("-" if g is None else f"{g.slo_attainment:.1%}{' overloaded' if g.overloaded else ''} / "
                        f"{g.frontier_usd_per_month:,.0f}")
        lines.append(line)
    widths = [max(len(row[i]) for row in lines) for i in range(len(head))]
    out = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
           for row in lines]
    out.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(out)


def _load(r: ShapeResult) -> str:
    """The most loaded on-prem pool's load (``ShapeResult.peak_load``), ``overloaded`` above 100%."""
    return _fmt(r.peak_load[1], ".0%") + (" overloaded" if r.overloaded else "")


#: The report's legend of the load column, printed when a shape in it is overloaded.
OVERLOAD_NOTE = ("load: the most loaded on-prem pool's work (the step time that grows with its tokens) over its GPU "
                 "time in the arrival span; overloaded (above 100%): its queues grow without bound while such "
                 "traffic lasts, and its SLO attainment holds only because the trace ends and the backlog drains "
                 "after the last arrival: it does not meet the goal (plan.json: load per pool)")


def result_dict(r: ShapeResult, with_series: bool = False) -> dict[str, object]:
    """One result as JSON-ready data (the series only when asked)."""
    d: dict[str, object] = {
        "label": r.label, "scale": r.scale, "gpus": r.gpus, "gpu": r.shape.gpu,
        "pools": {name: {"aggregated": p.aggregated, "prefill": p.prefill, "decode": p.decode, "kv_level": p.kv_level,
                         "prefill_tp": p.prefill_tp, "max_num_batched_tokens": p.max_num_batched_tokens}
                  for name, p in r.shape.pools},
        "usd_per_month": r.usd_per_month, "onprem_usd_per_month": r.onprem_usd_per_month,
        "frontier_usd_per_month": r.frontier_usd_per_month, "kv_usd_per_month": r.kv_usd_per_month,
        "usd_per_mtok": r.usd_per_mtok, "slo_attainment": r.slo_attainment, "quality": r.quality,
        "frontier_share": r.frontier_share, "ttft_p99_s": r.ttft_p99_s, "tpot_p99_s": r.tpot_p99_s,
        "utilization": r.utilization, "prefill_utilization": r.prefill_utilization,
        "decode_utilization": r.decode_utilization, "per_target_utilization": r.per_target, "misses": r.misses,
        "load": r.load, "overloaded": r.overloaded,
        "requests": r.requests, "wall_s": r.wall_s,
    }
    if with_series:
        d["series"] = r.series
    return d


def _finite(x: object) -> object:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_finite(v) for v in x]
    return x


def _plot_front(results: Sequence[ShapeResult], front: Sequence[ShapeResult], rec: ShapeResult | None,
                base: ShapeResult, goal: float, path: Path, full: Sequence[ShapeResult]) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    ax.scatter([r.usd_per_month for r in results], [r.slo_attainment for r in results], s=14, c="#bbb",
               label="evaluated (search)")
    ax.plot([r.usd_per_month for r in front], [r.slo_attainment for r in front], "o-", c="#1f77b4",
            label="front (search; cost, SLO, quality)")
    ax.scatter([r.usd_per_month for r in full], [r.slo_attainment for r in full], marker="D", s=30, c="#ff7f0e",
               label="whole trace")
    over = [r for r in [*results, *full] if r.overloaded]
    if over:
        ax.scatter([r.usd_per_month for r in over], [r.slo_attainment for r in over], marker="x", s=40, c="#000",
                   label="overloaded (does not meet the goal)")
    ax.scatter([base.usd_per_month], [base.slo_attainment], marker="s", s=80, c="#d62728", label="base fleet")
    if rec is not None:
        ax.scatter([rec.usd_per_month], [rec.slo_attainment], marker="*", s=220, c="#2ca02c", label="recommended")
    ax.axhline(goal, ls="--", c="#888", lw=1)
    ax.set_xlabel("USD per month")
    ax.set_ylabel("SLO attainment")
    ax.legend(loc="lower right")
    ax.set_title("Monthly cost vs SLO attainment")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _plot_phase(phase: str, shown: Sequence[tuple[str, ShapeResult]], path: Path) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4))
    for tag, r in shown:
        for key, values in r.series.items():
            if key.endswith(f"/{phase}"):
                ax.plot(r.series["t_s"][: len(values)], values, lw=1, ls="-" if tag == "recommended" else ":",
                        label=f"{tag}: {key.split('/')[0]}")
    ax.set_xlabel("trace time, s")
    ax.set_ylabel(f"{phase} busy share of GPU time")
    ax.set_ylim(0, 1.05)
    ax.legend(loc="upper right", fontsize=8)
    ax.set_title(f"{phase.capitalize()} utilization per on-prem target")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _plot_growth(growth: Mapping[str, Mapping[float, ShapeResult]], goal: float, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    for label, by_scale in growth.items():
        xs = sorted(by_scale)
        a1.plot(xs, [by_scale[x].slo_attainment for x in xs], "o-", label=label[:60])
        a2.plot(xs, [by_scale[x].frontier_usd_per_month for x in xs], "o-")
    a1.axhline(goal, ls="--", c="#888", lw=1)
    a1.set_xlabel("traffic scale")
    a1.set_ylabel("SLO attainment")
    a2.set_xlabel("traffic scale")
    a2.set_ylabel("frontier bill, USD per month")
    a1.legend(fontsize=7)
    fig.suptitle("Traffic growth: where each shape stops meeting the SLO, and the overflow bill")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def write_report(out_dir: Path, meta: Mapping[str, object], results: Sequence[ShapeResult],
                 front: Sequence[ShapeResult], full: Sequence[ShapeResult], rec: ShapeResult | None,
                 base: ShapeResult, growth: Mapping[str, Mapping[float, ShapeResult]], goal: float,
                 text: str) -> dict[str, Path]:
    """Write ``plan.json`` (``meta``; ``base`` and ``recommended`` with their utilization series;
    the search's ``front`` and every ``evaluated`` shape; ``whole_trace``: the shapes replayed on
    the whole trace; ``growth``: label -> scale -> result), ``plan.txt`` (``text``), the PNGs and
    ``plan.html``; returns the paths by name."""
    import matplotlib

    matplotlib.use("Agg")
    paths = {"json": out_dir / "plan.json", "txt": out_dir / "plan.txt", "html": out_dir / "plan.html"}
    shown = [("recommended", rec)] if rec is not None else []
    shown.append(("base", base))
    data = {
        "meta": dict(meta), "base": result_dict(base, True),
        "recommended": result_dict(rec, True) if rec is not None else None,
        "front": [result_dict(r) for r in front],
        "whole_trace": [result_dict(r) for r in full],
        "evaluated": [result_dict(r) for r in results],
        "growth": {label: {f"{x:g}": result_dict(r) for x, r in by.items()} for label, by in growth.items()},
    }
    paths["json"].write_text(json.dumps(_finite(data), indent=1), encoding="utf-8")
    paths["txt"].write_text(text + "\n", encoding="utf-8")
    pngs = [("front", out_dir / "front.png"), ("prefill", out_dir / "prefill_utilization.png"),
            ("decode", out_dir / "decode_utilization.png")]
    _plot_front(results, front, rec, base, goal, pngs[0][1], full)
    _plot_phase("prefill", [(t, r) for t, r in shown if r is not None], pngs[1][1])
    _plot_phase("decode", [(t, r) for t, r in shown if r is not None], pngs[2][1])
    if growth:
        pngs.append(("growth", out_dir / "growth.png"))
        _plot_growth(growth, goal, pngs[-1][1])
    for name, p in pngs:
        paths[name] = p
    head = "".join(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>" for k, v in meta.items())
    imgs = "".join(f'<h2>{html.escape(n)}</h2><img alt="{html.escape(n)}" src="data:image/png;base64,'
                   f'{base64.b64encode(p.read_bytes()).decode()}">' for n, p in pngs)
    paths["html"].write_text(
        "<!doctype html><html><head><meta charset='utf-8'><title>pointsman plan</title>"
        "<style>body{font-family:sans-serif;margin:2em}pre{font-size:12px}th{text-align:left;padding-right:1em}"
        "</style></head><body><h1>pointsman plan</h1>"
        f"<table>{head}</table><pre>{html.escape(text)}</pre>{imgs}</body></html>", encoding="utf-8")
    return paths


__all__ = ["OVERLOAD_NOTE", "result_dict", "table", "write_report"]
