"""Early vs whole-draft verification in replay: the latency an escalation adds, p50 and p99.

    .venv/bin/python scripts/bench_early_verify.py TRACE [--policy P] [--prefix-tokens 32,64,128] [--limit N]

Replays TRACE (as ``pointsman replay``: packaged fleet, interactive SLO, AlpacaEval prompts and
drafts, the bundled estimator, seed 0) through one policy (default ``default.yaml``) with its
verify section as written but ``verify.prefix_tokens`` set to each value, ``whole`` meaning the
whole draft (no prefix). Per setting: escalated requests, the latency the cascade added to them
(``escalation_delay_s``: arrival to the escalated call's start, p50 / p99), their TTFT p99, SLO
attainment, quality, $/Mtok. The escalation rate is printed next to it: the comparison holds
only where the rates match (the rules decide on the prefix; a rule that reads refusals in the
first 600 characters sees them in 150 tokens).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import click

from pointsman.cli.replay import _drafts, _estimator, _load_trace
from pointsman.policy.fleet import DEFAULT_FLEET_PATH, load_fleet
from pointsman.policy.rules.compiler import DEFAULT_POLICY_PATH, load_policy
from pointsman.replay.fleet_map import sim_fleet
from pointsman.replay.outcome_draw import OutcomeDraw, quality_columns
from pointsman.replay.runs import replay_all
from pointsman.replay.summary import SLO


@click.command()
@click.argument("trace", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--policy", "policy_path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              default=DEFAULT_POLICY_PATH, show_default=True)
@click.option("--prefix-tokens", "prefixes", default="whole,64,128", show_default=True,
              help="Settings of verify.prefix_tokens, comma-separated; 'whole' = verify the whole draft.")
@click.option("--limit", type=int, default=None, help="Only the first N requests.")
@click.option("--seed", default=0, show_default=True)
def main(trace: Path, policy_path: Path, prefixes: str, limit: int | None, seed: int) -> None:
    fleet = load_fleet(DEFAULT_FLEET_PATH)
    sim = sim_fleet(fleet)
    policy = load_policy(policy_path, fleet)
    if policy.verify is None:
        raise click.UsageError(f"{policy_path} has no verify section")
    requests, _, _ = _load_trace(trace, limit, None, None)
    draw = OutcomeDraw.load(["alpacaeval_ae1"], seed, target_columns=quality_columns(fleet), where=fleet.file)
    rows = [draw.rows[i] for i in draw.assign(len(requests))]
    texts = [list(r.messages) for r in rows]
    book, _ = _drafts(True, None, True)
    estimator = _estimator("default")
    objectives = fleet.slo(None)
    slo = SLO(objectives.ttft_s, objectives.tpot_s)
    settings = {p.strip(): None if p.strip() == "whole" else int(p) for p in prefixes.split(",") if p.strip()}
    policies = {f"{policy_path.stem} {name}": dataclasses.replace(
        policy, verify=dataclasses.replace(policy.verify, prefix_tokens=n)) for name, n in settings.items()}
    runs = replay_all(requests, fleet, sim, policies, estimator, texts=texts, rows=rows, seed=seed, baselines=False,
                      slo=slo, cascade=book)
    click.echo(f"{trace.name}: {len(requests)} requests, {policy_path.name}, seed {seed}, SLO TTFT <= {slo.ttft_s} s, "
               f"TPOT <= {slo.tpot_s} s")
    click.echo(f"{'verify':<24} {'escalated':>9} {'added p50':>9} {'added p99':>9} {'TTFT p99':>8} {'SLO':>6} "
               f"{'quality':>7} {'$/Mtok':>7}")
    for run in runs:
        s = run.summary
        esc = [r for r in run.result.requests if r.escalated]
        ttft99 = sorted(r.ttft_s or 0.0 for r in esc)[max(0, math.ceil(0.99 * len(esc)) - 1)] if esc else math.nan
        click.echo(f"{run.name:<24} {s.escalated:>9} {s.escalation_delay_p50_s:>8.2f}s {s.escalation_delay_p99_s:>8.2f}s "
                   f"{ttft99:>7.2f}s {s.slo_attainment:>6.1%} {s.quality:>7.3f} {s.effective_usd_per_mtok:>7.2f}")


if __name__ == "__main__":
    main()
