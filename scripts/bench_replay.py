"""Replay speed: simulated requests per second on the shared Mooncake and Azure traces, with
and without prompt text, with the policy engine in the loop and without.

    .venv/bin/python scripts/bench_replay.py                 # every mode, best of 3
    .venv/bin/python scripts/bench_replay.py --limit 2000 --repeat 1
    .venv/bin/python scripts/bench_replay.py --table         # also the baseline comparison on Mooncake

Modes, per trace, on the packaged fleet file mapped by ``replay.fleet_map``:

- ``baseline``: the cache-aware baseline over every on-prem replica (no engine, no text);
- ``engine, no text``: the default policy in the real ``RoutingEngine`` with
  ``FixedDifficulty(0.3)`` on requests that carry only token counts and block ids;
- ``engine, text``: the same with prompt text drawn from the AlpacaEval outcome table
  and the shipped difficulty estimator (tokenizer + static embedding + head, ONNX) run
  on every request;
- ``engine, budget``: ``engine, text`` with a budget ledger (``replay.budgets``: SQLite,
  a $1M day budget for ``tenant:replay`` that never refuses): the cost of the reserve,
  settle and snapshot calls.

Traces come from ``$POINTSMAN_SHARED_DATASETS`` or ``<repo>/../shared/datasets``. Timing is
the wall clock of ``simulate`` alone (trace loading, the outcome-table draw and the
estimator load are reported separately), single process.
"""

from __future__ import annotations

import tempfile
import time

import click

from pointsman.datasets.sources import shared_datasets_dir
from pointsman.datasets.traces import load_trace
from pointsman.estimator.estimate import FixedDifficulty
from pointsman.policy.budget.config import BudgetConfig
from pointsman.policy.fleet import DEFAULT_FLEET_PATH, load_fleet
from pointsman.policy.rules.compiler import DEFAULT_POLICY_PATH, load_policy
from pointsman.replay.baselines import CacheAware, OnPremWide
from pointsman.replay.budgets import REPLAY_TENANT, replay_ledger
from pointsman.replay.engine_router import EngineRouter
from pointsman.replay.fleet_map import sim_fleet
from pointsman.replay.outcome_draw import OutcomeDraw
from pointsman.replay.runs import baseline_routers
from pointsman.replay.simulator import simulate
from pointsman.replay.summary import format_table, summarize

TRACES = (
    ("mooncake", "mooncake/synthetic_trace.jsonl.gz"),
    ("azure-conv", "azure_llm_2023/AzureLLMInferenceTrace_conv.csv"),
    ("azure-code", "azure_llm_2023/AzureLLMInferenceTrace_code.csv"),
)


@click.command()
@click.option("--repeat", default=3, show_default=True, help="Runs per trace and mode; the best is reported.")
@click.option("--limit", type=int, default=None, help="Only the first N requests of each trace.")
@click.option("--table/--no-table", default=False, help="Also print the baseline comparison on Mooncake.")
@click.option("--seed", default=0, show_default=True)
def main(repeat: int, limit: int | None, table: bool, seed: int) -> None:
    root = shared_datasets_dir()
    fleet = load_fleet(DEFAULT_FLEET_PATH)
    sim = sim_fleet(fleet)
    policy = load_policy(DEFAULT_POLICY_PATH, fleet)
    from pointsman.service.bootstrap import load_estimator

    t = time.perf_counter()
    estimator, error = load_estimator(None)
    if error:
        raise click.ClickException(f"estimator did not load: {error}")
    click.echo(f"fleet {DEFAULT_FLEET_PATH.name}: {sum(t.gpus for t in sim.on_prem)} GPUs on-prem; policy "
               f"{DEFAULT_POLICY_PATH.name}; estimator {estimator.version} (loaded in {time.perf_counter() - t:.2f} s)")
    t = time.perf_counter()
    draw = OutcomeDraw.load(seed=seed)
    click.echo(f"outcome table {', '.join(draw.sources)}: {len(draw.rows)} prompts (read in {time.perf_counter() - t:.2f} s)")
    budgets = BudgetConfig.from_dict({"budgets": [{"scope": f"tenant:{REPLAY_TENANT}", "window": "day",
                                                   "limit_usd": 1e6}]})
    ledger_dir = tempfile.TemporaryDirectory(prefix="bench-replay-")
    ledgers = iter(range(10**9))

    def budgeted(texts: list) -> EngineRouter:
        folder = f"{ledger_dir.name}/{next(ledgers)}"
        return EngineRouter(fleet, policy, estimator, texts=texts, ledger=replay_ledger(budgets, folder),
                            tenant=REPLAY_TENANT)

    click.echo(f"{'trace':<11} {'requests':>8} {'load s':>7}  {'mode':<16} {'replay s':>9} {'sim req/s':>10} {'sim/real':>9}")
    for name, rel in TRACES:
        t = time.perf_counter()
        trace = load_trace(root / rel, limit=limit)
        load_s = time.perf_counter() - t
        texts = [list(draw.rows[i].messages) for i in draw.assign(len(trace))]
        modes = (
            ("baseline", lambda: (OnPremWide(CacheAware("")), None)),
            ("engine, no text", lambda: _engine(EngineRouter(fleet, policy, FixedDifficulty(0.3)))),
            ("engine, text", lambda: _engine(EngineRouter(fleet, policy, estimator, texts=texts))),
            ("engine, budget", lambda: _engine(budgeted(texts))),
        )
        for mode, make in modes:
            best = float("inf")
            for _ in range(repeat):
                router, on_complete = make()
                t = time.perf_counter()
                result = simulate(trace, sim, router, seed=seed, on_complete=on_complete)
                best = min(best, time.perf_counter() - t)
            click.echo(f"{name:<11} {len(trace):>8} {load_s:>7.3f}  {mode:<16} {best:>9.3f} {len(trace) / best:>10.0f} "
                       f"{result.window_s / best:>8.0f}x")
    ledger_dir.cleanup()
    if table:
        trace = load_trace(root / TRACES[0][1], limit=limit)
        summaries = {n: summarize(simulate(trace, sim, r, seed=seed)) for n, r in baseline_routers(sim, seed).items()}
        click.echo(f"\nMooncake synthetic trace, {DEFAULT_FLEET_PATH.name}, baselines:")
        click.echo(format_table(summaries))


def _engine(router: EngineRouter) -> tuple[EngineRouter, object]:
    return router, router.on_complete


if __name__ == "__main__":
    main()
