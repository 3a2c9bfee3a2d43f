"""``pointsman replay``: run policies (the real engine) and baselines over a trace against a
simulated fleet and report cost, latency and quality side by side (``docs/replay.md``).

    pointsman replay ../shared/datasets/mooncake/synthetic_trace.jsonl.gz --limit 1000 --out replay-out

TRACE: a Mooncake JSONL (``*.jsonl[.gz]``), an Azure LLM CSV (``*.csv[.gz]``) or a Pointsman
outcome log (``*.db``/``*.sqlite``). Traces without prompt text get prompts and per-model
outcomes drawn from ``--outcomes`` (seeded), so the estimator runs and quality is scored.
``--goodput`` also searches each run's goodput (``replay.goodput``: the highest arrival rate at
which 90% of requests meet the SLO, frontier targets disabled).

Bad input (an invalid fleet, policy, budgets file or trace, an unknown outcome source, a bad
``--estimator``, an unwritable ``--out``) prints one ``Error:`` line and exits with status 2.
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click
from click.core import ParameterSource

from pointsman.cli.errors import SEED, FiniteFloat, InputError
from pointsman.errors import BudgetError, DataError, FleetError, PolicyError, RequestError

if TYPE_CHECKING:  # pragma: no cover
    from pointsman.datasets.traces import TraceRequest
    from pointsman.estimator.estimate import Estimator
    from pointsman.policy.fleet import Fleet
    from pointsman.policy.rules.compiler import CompiledPolicy
    from pointsman.replay.cascade import DraftBook
    from pointsman.replay.report import ReplayMeta
    from pointsman.replay.runs import Run
    from pointsman.replay.sim_fleet import SimFleet
    from pointsman.replay.summary import SLO


def _estimator(spec: str) -> Estimator:
    """``default`` -> the shipped estimator; ``fixed:P`` -> ``FixedDifficulty(P)``; else a model spec."""
    if spec.startswith("fixed:"):
        from pointsman.estimator.estimate import FixedDifficulty

        try:
            p_hard = float(spec.removeprefix("fixed:"))
        except ValueError:
            p_hard = math.nan
        if not 0.0 <= p_hard <= 1.0:  # also rejects nan
            raise click.BadParameter(f"expected fixed:P with P in [0, 1], got {spec!r}", param_hint="--estimator")
        return FixedDifficulty(p_hard)
    from pointsman.service.bootstrap import load_estimator

    est, error = load_estimator(None if spec == "default" else spec)
    if error:
        raise InputError(f"estimator {spec!r} did not load: {error}")
    return est


def _load_trace(path: Path, limit: int | None, start_s: float | None, end_s: float | None
                ) -> tuple[list[TraceRequest], list[list[dict[str, str]] | None] | None, list[float | None] | None]:
    """(requests, texts or None, logged quality or None)."""
    if path.suffix in (".db", ".sqlite", ".sqlite3"):
        from pointsman.replay.log_trace import load_log_trace

        log = load_log_trace(path, limit=limit, start_s=start_s, end_s=end_s)
        if log.skipped:
            click.echo(f"Warning: {log.skipped} of the {log.skipped + len(log.requests)} logged decisions in the "
                       "window have no outcome with a completion token count (never reported, or reported "
                       "without usage): left out, so the traffic replayed is smaller than the traffic logged",
                       err=True)
        if log.no_output:
            click.echo(f"Warning: {log.no_output} of the {log.no_output + log.skipped + len(log.requests)} logged "
                       "decisions in the window produced 0 completion tokens (errors or cancelled requests): left out",
                       err=True)
        return log.requests, log.texts, log.quality
    from pointsman.datasets.traces import load_trace

    return load_trace(path, limit=limit, start_s=start_s, end_s=end_s), None, None


@click.command("replay")
@click.argument("trace", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--fleet", "fleet_path", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="Fleet file (default: the packaged one).")
@click.option("--policy", "policy_paths", multiple=True, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Policy file; repeat for several (default: every example policy).")
@click.option("--seed", type=SEED, default=0, show_default=True, help="Seed of the simulator, the random baseline and the draw.")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Replay the first N requests.")
@click.option("--start-s", type=FiniteFloat(), default=None, help="Trace window start, seconds from its first record.")
@click.option("--end-s", type=FiniteFloat(), default=None, help="Trace window end, seconds from its first record.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=Path("replay-out"),
              show_default=True, help="Folder for report.txt/json/html and the PNGs.")
@click.option("--estimator", "estimator_spec", default="default", show_default=True,
              help="'default' (the shipped model), 'fixed:P', or a model spec as for `pointsman serve`.")
@click.option("--outcomes", default="alpacaeval_ae1", show_default=True,
              help="Outcome sources to draw prompts and quality from (comma-separated), or 'none'.")
@click.option("--baselines/--no-baselines", default=True, show_default=True)
@click.option("--slo-class", default=None,
              help="Service class every request carries (routing.slo_class) and whose objectives SLO attainment "
                   "and goodput use: a key of the fleet's slo_classes (default: its defaults.slo_class).")
@click.option("--slo-ttft-s", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Override the class's TTFT objective, seconds.")
@click.option("--slo-tpot-s", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Override the class's TPOT objective, seconds.")
@click.option("--goodput/--no-goodput", default=False, show_default=True,
              help="Also search each run's max goodput (frontier targets disabled) and report it per GPU.")
@click.option("--goodput-requests", type=click.IntRange(min=0), default=2000, show_default=True,
              help="Requests of the trace (its first ones) each goodput replay simulates; 0 = all.")
@click.option("--bin-s", type=click.FloatRange(min=0.001), default=10.0, show_default=True,
              help="Width of the time bins of the plots, seconds.")
@click.option("--budgets", "budgets_path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              default=None, help="Budgets file (kind: Budgets) the policies run under, each with its own ledger "
                                 "(default: no budgets).")
@click.option("--cascade/--no-cascade", default=True, show_default=True,
              help="Run policies that have a verify section as a cascade: the draft is the answer of the model "
                   "standing for the target (--drafts), escalations pay both calls (docs/cascade.md).")
@click.option("--drafts", "drafts_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Answers per model and prompt (prompt_id, model, output); default the shared AlpacaEval answers.")
@click.option("--tenant", default="replay", show_default=True,
              help="Tenant of every replayed request: its budget scope is tenant:<tenant>.")
@click.option("--scale", type=FiniteFloat(), default=1.0, show_default=True,
              help="Traffic scale: the (sliced) trace's arrival times after its first divided by it, e.g. 2 = twice "
                   "the rate (as `pointsman plan --scale`).")
def replay_command(trace: Path, fleet_path: Path | None, policy_paths: tuple[Path, ...], seed: int,
                   limit: int | None, start_s: float | None, end_s: float | None, out_dir: Path,
                   estimator_spec: str, outcomes: str, baselines: bool, slo_class: str | None,
                   slo_ttft_s: float | None, slo_tpot_s: float | None, goodput: bool, goodput_requests: int,
                   bin_s: float, budgets_path: Path | None, cascade: bool, drafts_path: Path | None,
                   tenant: str, scale: float) -> None:
    """Replay TRACE through policies and baselines on a simulated fleet; print the comparison
    and write report.txt, report.json, report.html and PNG plots to --out."""
    from pointsman.policy.budget.config import BudgetConfig
    from pointsman.policy.fleet import DEFAULT_FLEET_PATH, load_fleet
    from pointsman.policy.rules.compiler import DEFAULT_POLICY_DIR
    from pointsman.replay.budgets import check_applies
    from pointsman.replay.fleet_map import sim_fleet
    from pointsman.replay.outcome_draw import OutcomeDraw, quality_columns
    from pointsman.replay.report import report_text, write_report
    from pointsman.replay.runs import GoodputSettings, baseline_routers, replay_all
    from pointsman.replay.summary import SLO
    from pointsman.request import request_scopes

    if scale <= 0:
        raise click.BadParameter(f"expected a positive number, got {scale:g}", param_hint="--scale")
    if not goodput and click.get_current_context().get_parameter_source("goodput_requests") is not ParameterSource.DEFAULT:
        raise click.BadParameter("it applies to --goodput (the goodput search), which is off", param_hint="--goodput-requests")
    try:
        budgets = None
        try:
            if not request_scopes(tenant, None):  # '' names no scope: the service refuses it too
                raise RequestError("tenant must be 1-200 characters without spaces (it names a budget scope)")
        except RequestError as exc:
            raise click.BadParameter(str(exc), param_hint="--tenant") from None
        if budgets_path is not None:
            budgets = BudgetConfig.load(budgets_path)
            check_applies(budgets, tenant, str(budgets_path))
        fleet = load_fleet(fleet_path or DEFAULT_FLEET_PATH)
        try:
            objectives = fleet.slo(slo_class)
        except KeyError:
            raise click.BadParameter(f"{slo_class!r} is not a service class of the fleet (its slo_classes: "
                                     f"{', '.join(fleet.slo_classes)})", param_hint="--slo-class") from None
        slo_name = slo_class or fleet.spec.defaults.slo_class
        slo = SLO(slo_ttft_s or objectives.ttft_s, slo_tpot_s or objectives.tpot_s)
        fleet = with_objectives(fleet, slo_name, slo)
        sim = sim_fleet(fleet)
        paths = policy_paths or tuple(p for p in sorted(DEFAULT_POLICY_DIR.glob("*.yaml"))
                                      if not p.name.endswith(".cases.yaml"))
        policies, skipped = _load_policies(paths, fleet)
        requests, texts, logged = _load_trace(trace, limit, start_s, end_s)
        if not requests:
            raise InputError(f"{trace}: no requests in the chosen window")
        if scale != 1.0:
            from pointsman.replay.goodput import scaled

            requests = scaled(requests, scale)
        rows = None
        names = [n.strip() for n in outcomes.split(",") if n.strip() and n.strip() != "none"]
        if names and (texts is None or not any(texts)):  # no prompt text: draw it
            draw = OutcomeDraw.load(names, seed, target_columns=quality_columns(fleet), where=fleet.file)
            rows = [draw.rows[i] for i in draw.assign(len(requests))]
            texts = [list(r.messages) for r in rows]
        estimator = _estimator(estimator_spec)
        book, cascade_note = _drafts(cascade, drafts_path, rows is not None)
    except (FleetError, PolicyError, DataError, BudgetError) as exc:
        raise InputError(str(exc)) from None
    try:
        out_dir.mkdir(parents=True, exist_ok=True)  # before the replay, not after minutes of it
    except OSError as exc:
        raise InputError(f"--out {out_dir}: {exc.strerror or exc}") from None
    total = len(requests) * (len(policies) + (len(baseline_routers(sim, seed)) if baselines else 0))
    if total == 0:
        raise InputError("nothing to replay: " + "; ".join(f"{n}: {why}" for n, why in skipped.items())
                         + ("" if baselines else " (and --no-baselines)"))
    click.echo(f"replaying {len(requests)} requests of {trace.name} through {len(policies)} policies"
               f"{' + baselines' if baselines else ''} (seed {seed})", err=True)
    t0 = time.perf_counter()
    settings = None
    if goodput:
        settings = GoodputSettings(requests=goodput_requests or None, log=lambda line: click.echo(line, err=True))
    with click.progressbar(length=total, label="simulated requests", file=sys.stderr) as bar:
        runs = replay_all(requests, fleet, sim, policies, estimator, texts=texts, rows=rows, seed=seed,
                          baselines=baselines, slo=slo, timeline_bin_s=bin_s, progress=bar.update,
                          budgets=budgets, tenant=tenant, slo_class=slo_name, goodput=settings, cascade=book)
    wall = time.perf_counter() - t0
    meta: ReplayMeta = {
        "trace": str(trace), "requests": len(requests), "fleet": str(fleet_path or DEFAULT_FLEET_PATH),
        "policies": ", ".join(str(p) for p in paths), "seed": seed, "limit": limit,
        "estimator": str(estimator.version),
        "outcomes": ", ".join(names) if rows is not None else "none",
        "slo": f"TTFT <= {slo.ttft_s} s, TPOT <= {slo.tpot_s} s", "window_s": round(runs[0].result.window_s, 1),
        "budgets": f"{budgets_path} (tenant:{tenant})" if budgets_path else "none",
        "wall_s": round(wall, 2), "slo_class": slo_name, "cascade": cascade_note}
    if scale != 1.0:
        meta["scale"] = scale
    if skipped:
        meta["skipped"] = skipped
    if not any(r.block_hashes for r in requests):
        meta["prefix_block_ids"] = ("none in this trace: no prefix cache is shared between requests, so cache-aware "
                                    "equals least-loaded, llm-d's prefix scorer is 0, dynamo-kv and "
                                    "sglang-cache-aware balance load only")
    searched = [r.goodput for r in runs if r.goodput is not None]
    if searched:
        meta["goodput"] = (f"max rate with >= 90% of requests meeting the SLO, frontier targets disabled, on the "
                           f"first {searched[0].requests} requests (mean rate {searched[0].base_rate_rps:.3f} req/s), "
                           f"arrival times scaled; {searched[0].gpus} on-prem GPUs; search "
                           f"{sum(g.wall_s for g in searched):.0f} s")
    if searched:
        _goodput_limit(runs, requests, sim, slo, meta)
    judged = [q for q in (logged or ()) if q is not None]
    if logged is not None:
        meta["logged_judge_score"] = (f"mean {sum(judged) / len(judged):.3f} over {len(judged)} of {len(logged)} "
                                      f"outcomes (judge's own scale; what ran when logged)" if judged
                                      else f"none of {len(logged)} outcomes has a judge_score")
    written = write_report(runs, out_dir, meta)
    click.echo(report_text(runs, meta))
    if "logged_judge_score" in meta:
        click.echo(f"\nlogged judge_score: {meta['logged_judge_score']}")
    replay_wall = wall - sum(g.wall_s for g in searched)
    click.echo(f"\n{sum(len(r.result.requests) for r in runs) / replay_wall:.0f} simulated requests/s; "
               f"report: {written['html']} ({', '.join(p.name for p in written.values())})")


def with_objectives(fleet: Fleet, slo_class: str, slo: SLO) -> Fleet:
    """``fleet`` with service class ``slo_class`` set to ``slo``'s objectives (``--slo-ttft-s``,
    ``--slo-tpot-s``), so the engine routes by the objectives the run is scored on (a policy reads
    them as ``predict[...].slo_ttft_s``); ``fleet`` itself when they are the class's already."""
    import dataclasses

    from pointsman.policy.fleet import SLOClass

    old = fleet.slo(slo_class)
    if (old.ttft_s, old.tpot_s) == (slo.ttft_s, slo.tpot_s):
        return fleet
    classes = {**fleet.slo_classes, slo_class: SLOClass(ttft_s=slo.ttft_s, tpot_s=slo.tpot_s,
                                                        description=f"{old.description} (objectives overridden)")}
    return dataclasses.replace(fleet, spec=fleet.spec.model_copy(update={"slo_classes": classes}))


def _goodput_limit(runs: list[Run], requests: list[TraceRequest], sim: SimFleet, slo: SLO, meta: ReplayMeta) -> None:
    """Where a run reaches the goal at no rate (goodput 0), say what limits it in ``meta``
    (``goodput_limit``, ``goodput_floor``: ``replay.goodput.slo_floor`` on the goodput sample)
    instead of leaving a ratio to zero; where it reaches it at every rate searched, that its goodput
    is the search's ceiling, a lower bound (``goodput_ceiling``)."""
    import dataclasses

    from pointsman.replay.goodput import slo_floor

    capped = [r for r in runs if r.goodput is not None and r.goodput.capped]
    if capped and capped[0].goodput is not None:
        top = capped[0].goodput
        meta["goodput_ceiling"] = (
            f"{', '.join(r.name for r in capped)} meet {top.goal:.0%} SLO attainment at every rate searched, up to "
            f"{top.max_goodput_rps / top.base_rate_rps:g}x the trace's ({top.max_goodput_rps:.2f}/s): their max "
            f"goodput is at least that, not measured (the first {top.requests} requests do not load the fleet "
            "enough; raise --goodput-requests)")
    zero = [r for r in runs if r.goodput is not None and r.goodput.max_goodput_rps <= 0]
    if not zero or zero[0].goodput is None:
        return
    first = zero[0].goodput
    floor = slo_floor(requests[: first.requests], sim, slo)
    meta["goodput_limit"] = (f"{', '.join(r.name for r in zero)} reach {first.goal:.0%} SLO attainment at no rate "
                             f"(down to 1/64 of the trace's): {floor.sentence(first.goal)}")
    meta["goodput_floor"] = dataclasses.asdict(floor)


def _load_policies(paths: tuple[Path, ...], fleet: Fleet) -> tuple[dict[str, CompiledPolicy], dict[str, str]]:
    """``({name: policy}, {name: why skipped})``: each policy compiled for ``fleet``, named by its file's
    stem, or ``folder/stem`` when another file or a baseline has that name; one that does
    not fit it (it compiles for the packaged fleet, not for this one: e.g. a P/D mode pinned on a
    target the fleet runs aggregated only) is skipped with the compiler's first line as the reason.
    Raises ``PolicyError`` for a policy that compiles for neither (a broken file)."""
    from pointsman.policy.fleet import DEFAULT_FLEET_PATH, load_fleet
    from pointsman.policy.rules.compiler import load_policy
    from pointsman.replay.baselines import ANCHORS, BASELINES

    policies: dict[str, CompiledPolicy] = {}
    skipped: dict[str, str] = {}
    packaged: Fleet | None = None
    # a run per file: a name another file or a baseline has takes its folder (v1/default, v2/default)
    taken = {*BASELINES, *ANCHORS, "all-on-prem", "all-frontier"}
    stems = [p.stem for p in paths]
    for path in paths:
        name = path.stem
        if name in taken or stems.count(name) > 1:
            name = f"{path.parent.name}/{path.stem}"
        name = next(n for n in (name, str(path), *(f"{path} #{k}" for k in range(2, len(paths) + 2)))
                    if n not in taken)
        taken.add(name)
        try:
            policies[name] = load_policy(path, fleet)
        except PolicyError as exc:
            packaged = packaged or load_fleet(DEFAULT_FLEET_PATH)
            if Path(packaged.file).resolve() == Path(fleet.file).resolve():
                raise
            load_policy(path, packaged)  # raises for a broken policy: that is an input error, not a misfit
            skipped[name] = f"does not fit {fleet.file}: {str(exc).splitlines()[0]}"
    return policies, skipped


def _drafts(cascade: bool, path: Path | None, drawn: bool) -> tuple[DraftBook | None, str]:
    """The drafts the cascade reads and a line for the report. Raises ``DataError`` for a
    ``--drafts`` file that does not exist."""
    from pointsman.datasets.sources import shared_datasets_dir
    from pointsman.replay.cascade import DraftBook

    if not cascade:
        return None, "off (--no-cascade)"
    if not drawn:
        return None, "off (no outcome rows to draw drafts for)"
    if path is not None and not path.is_file():
        raise DataError(f"--drafts {path}: no such file")
    if path is None:
        try:
            path = shared_datasets_dir() / "alpacaeval" / "model_outputs_long.csv.gz"
        except DataError:
            return None, "off (no shared datasets folder for the default drafts)"
        if not path.is_file():
            return None, f"off ({path} not found)"
    return DraftBook(path), (f"on for policies with a verify section: drafts from {path}, the shipped heuristic "
                             "verifier; escalations pay draft + frontier, latencies add")


def register(group: click.Group) -> None:
    """Attach ``replay`` to the ``pointsman`` group."""
    group.add_command(replay_command)
