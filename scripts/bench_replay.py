"""Replay speed: simulated requests per second on the shared Mooncake and Azure traces.

    .venv/bin/python scripts/bench_replay.py                 # cache-aware router, best of 3
    .venv/bin/python scripts/bench_replay.py --router round-robin --repeat 5
    .venv/bin/python scripts/bench_replay.py --table         # also the baseline comparison on Mooncake

Traces come from ``$POINTSMAN_SHARED_DATASETS`` or ``<repo>/../shared/datasets``.
These traces carry no prompt text, so this measures the simulator and a baseline
router only (no tokenizer, no difficulty estimator). Timing is wall clock of
``simulate`` alone (trace loading is reported separately), single process.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import click

from pointsman.datasets.traces import load_trace
from pointsman.replay.baselines import BASELINES, RoundRobin
from pointsman.replay.fleet import default_fleet
from pointsman.replay.metrics import format_table, summarize
from pointsman.replay.simulator import simulate

TRACES = (
    ("mooncake", "mooncake/synthetic_trace.jsonl.gz"),
    ("azure-conv", "azure_llm_2023/AzureLLMInferenceTrace_conv.csv"),
    ("azure-code", "azure_llm_2023/AzureLLMInferenceTrace_code.csv"),
)


def shared_datasets() -> Path:
    env = os.environ.get("POINTSMAN_SHARED_DATASETS")
    path = Path(env) if env else Path(__file__).resolve().parents[1] / ".." / "shared" / "datasets"
    if not path.is_dir():
        sys.exit(f"shared datasets not found at {path} (set POINTSMAN_SHARED_DATASETS)")
    return path


@click.command()
@click.option("--router", "router_name", type=click.Choice(sorted(BASELINES)), default="cache-aware", show_default=True)
@click.option("--repeat", default=3, show_default=True, help="Runs per trace; the best is reported.")
@click.option("--table/--no-table", default=False, help="Also print the baseline comparison on Mooncake.")
@click.option("--seed", default=0, show_default=True)
def main(router_name: str, repeat: int, table: bool, seed: int) -> None:
    root = shared_datasets()
    fleet = default_fleet()
    cls = BASELINES[router_name]
    click.echo(f"fleet: onprem-70b {fleet.on_prem[0].aggregated_replicas} x {fleet.on_prem[0].replica.name}; router {router_name}")
    click.echo(f"{'trace':<12} {'requests':>8} {'load s':>7} {'replay s':>9} {'sim req/s':>10} {'sim/real time':>13}")
    for name, rel in TRACES:
        t = time.perf_counter()
        trace = load_trace(root / rel)
        load_s = time.perf_counter() - t
        best = float("inf")
        for _ in range(repeat):
            t = time.perf_counter()
            result = simulate(trace, fleet, cls("onprem-70b"), seed=seed)
            best = min(best, time.perf_counter() - t)
        click.echo(
            f"{name:<12} {len(trace):>8} {load_s:>7.3f} {best:>9.3f} {len(trace) / best:>10.0f} "
            f"{result.window_s / best:>12.0f}x"
        )
    if table:
        trace = load_trace(root / TRACES[0][1])
        summaries = {}
        for bname, bcls in BASELINES.items():
            router = bcls("onprem-70b", seed=seed) if bname == "random" else bcls("onprem-70b")
            summaries[f"{bname} (on-prem)"] = summarize(simulate(trace, fleet, router, seed=seed))
        summaries["all-frontier"] = summarize(simulate(trace, fleet, RoundRobin("frontier-large"), seed=seed))
        click.echo("\nMooncake synthetic trace, default fleet (spill to frontier-large when a queue holds 16):")
        click.echo(format_table(summaries))


if __name__ == "__main__":
    main()
