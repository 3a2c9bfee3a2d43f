"""``pointsman plan``: search fleet shapes for a trace's traffic with the real engine and policy in
the loop, report the Pareto front of monthly cost vs SLO attainment and quality, and write the
cheapest shape meeting the goal as a fleet file (``docs/plan.md``).

    pointsman plan ../shared/datasets/mooncake/synthetic_trace.jsonl.gz --slo-class long-context --scale 1,2

Bad input (an invalid fleet, policy or trace, a bad ``--scale``/``--gpus``/``--gpu-price``, an unwritable ``--out``)
prints one ``Error:`` line and exits with status 2. When no shape meets the goal, the report is written
without a fleet file (an earlier plan's ``fleet.yaml``/``policy.yaml`` in ``--out`` removed) and the exit
status is 1.
"""

from __future__ import annotations

import functools
import math
import shlex
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click

from pointsman.cli.errors import SEED, CheckFailed, FiniteFloat, InputError
from pointsman.errors import DataError, FleetError, PolicyError

if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Sequence

    from pointsman.datasets.traces import TraceRequest
    from pointsman.estimator.estimate import Estimator
    from pointsman.plan.evaluate import ShapeResult
    from pointsman.plan.search import SearchResult
    from pointsman.plan.shapes import Shape, ShapeSpace
    from pointsman.plan.tuning import TuningSpace
    from pointsman.policy.fleet import Fleet
    from pointsman.replay.engine_router import TraceMessages
    from pointsman.replay.outcome_draw import OutcomeRow
    from pointsman.replay.sim_fleet import SimFleet


def _quality(q: float) -> str:
    """A mean quality 0-1 for the report: 3 decimals, ``n/a`` when NaN (no outcome rows)."""
    return "n/a" if math.isnan(q) else f"{q:.3f}"


def _apart(x: float, y: float) -> tuple[str, int]:
    """(``x`` with 3 to 8 decimals, the decimals): the fewest at which ``x`` and ``y`` print apart
    (a quality 0.91667 under a floor of 0.91675 both read 0.917 at 3)."""
    for digits in range(3, 9):
        if f"{x:.{digits}f}" != f"{y:.{digits}f}":
            return f"{x:.{digits}f}", digits
    return f"{x:.8f}", 8


def _floats(text: str, option: str) -> list[float]:
    try:
        values = sorted({float(v) for v in text.split(",") if v.strip()})
    except ValueError:
        values = []
    if not values or any(not math.isfinite(v) or v <= 0 for v in values):
        raise InputError(f"{option} {text!r}: expected positive numbers separated by commas, e.g. 1,2")
    return values


def _changes(space: ShapeSpace, base: Shape, rec: Shape) -> str:
    """What ``rec`` changes against ``base``: replica counts per pool, tier sizes, GPU type."""
    from pointsman.plan.shapes import ROLES

    parts = []
    for t in space.targets:
        a, b = base.of(t.name), rec.of(t.name)
        diffs = [f"{role} {a.count(role)}->{b.count(role)}" for role in ROLES if a.count(role) != b.count(role)]
        ka, kb = space.kv_tier_tokens(base, t.name), space.kv_tier_tokens(rec, t.name)
        if ka != kb:
            diffs.append(f"KV tier {ka:,}->{kb:,} tokens")
        if a.prefill_tp != b.prefill_tp:
            diffs.append(f"prefill replicas x{a.prefill_tp}->x{b.prefill_tp} the template's GPUs")
        if a.max_num_batched_tokens != b.max_num_batched_tokens:
            diffs.append(f"step budget (max_num_batched_tokens) {a.max_num_batched_tokens or 'template'}->"
                         f"{b.max_num_batched_tokens or 'template'} tokens")
        if diffs:
            parts.append(f"{t.name}: {', '.join(diffs)}")
    if base.gpu != rec.gpu:
        parts.append(f"GPU {base.gpu}->{rec.gpu}")
    knobs = space.policy.label(rec.tuning)
    if base.tuning != rec.tuning and knobs:
        parts.append(f"policy {knobs}")
    return "; ".join(parts) or "nothing"


@click.command("plan")
@click.argument("trace", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--fleet", "fleet_path", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="Base fleet file whose pools are the templates (default: the packaged one).")
@click.option("--policy", "policy_path", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="Policy file deciding every request (default: the packaged default policy).")
@click.option("--slo-class", default=None, help="Service class of every request (default: the fleet's default).")
@click.option("--slo-ttft-s", type=click.FloatRange(min=0, min_open=True), default=None, help="Override the TTFT objective, s.")
@click.option("--slo-tpot-s", type=click.FloatRange(min=0, min_open=True), default=None, help="Override the TPOT objective, s.")
@click.option("--goal", type=click.FloatRange(min=0, max=1), default=0.9, show_default=True,
              help="SLO attainment the recommended shape must reach.")
@click.option("--scale", "scale_text", default="1", show_default=True,
              help="Traffic scales, comma-separated (e.g. 1,2): the search runs at the smallest, the front is "
                   "replayed at every one.")
@click.option("--min-quality-share", type=click.FloatRange(min=0, max=1), default=0.95, show_default=True,
              help="Quality floor of the recommended shape, as a share of all-frontier's quality on the trace's "
                   "outcome rows (everything on the frontier target with the highest output price); 0 = none.")
@click.option("--budget-usd-per-month", type=click.FloatRange(min=0), default=None,
              help="Recommend only shapes costing at most this per month.")
@click.option("--gpus", "gpus_text", default="", help="GPU types to consider besides the fleet's, comma-separated "
              "(H100-SXM, H200-SXM, A100-SXM-80GB).")
@click.option("--gpu-price", "gpu_price_specs", multiple=True, metavar="GPU=USD",
              help="Your price of a --gpus type in USD per GPU-hour, e.g. H200-SXM=2.10 (repeatable); the others are "
                   "priced at list (the fleet's own GPU by the fleet file).")
@click.option("--max-replicas", type=click.IntRange(min=1), default=8, show_default=True,
              help="Largest replica count per pool searched (at least the base fleet's).")
@click.option("--workers", type=click.IntRange(min=1), default=2, show_default=True, help="Worker processes.")
@click.option("--time-budget-s", type=click.FloatRange(min=1), default=720, show_default=True,
              help="Wall-clock budget of the search and validation (growth replays always complete); the best "
                   "shape found by then is reported.")
@click.option("--max-replays", type=click.IntRange(min=1), default=None,
              help="Stop the search after this many replays (its starts always complete), whatever the machine's "
                   "speed; with --time-budget-s, whichever comes first.")
@click.option("--search-requests", type=click.IntRange(min=0), default=1000, show_default=True,
              help="Search on the busiest window of this many requests, then replay the cheapest candidates on the "
                   "whole trace; 0 = search on the whole trace.")
@click.option("--candidates", type=click.IntRange(min=1), default=3, show_default=True,
              help="Search results replayed on the whole trace (with the base fleet) when the search ran on a window.")
@click.option("--assume-monotone/--no-assume-monotone", default=True, show_default=True,
              help="Skip shapes with no more capacity than one that missed the goal.")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Plan on the first N requests.")
@click.option("--start-s", type=FiniteFloat(), default=None, help="Trace window start, seconds from its first record.")
@click.option("--end-s", type=FiniteFloat(), default=None, help="Trace window end, seconds from its first record.")
@click.option("--seed", type=SEED, default=0, show_default=True, help="Seed of the simulator and the prompt draw.")
@click.option("--estimator", "estimator_spec", default="default", show_default=True,
              help="'default' (the shipped model), 'fixed:P', or a model spec as for `pointsman serve`.")
@click.option("--outcomes", default="alpacaeval_ae1", show_default=True,
              help="Outcome sources to draw prompts and quality from (comma-separated), or 'none'.")
@click.option("--bin-s", type=click.FloatRange(min=0.001), default=10.0, show_default=True,
              help="Width of the utilization plots' time bins, seconds.")
@click.option("--tune", "tune_specs", multiple=True, metavar="NAME=V1,V2",
              help="A policy setting searched with the fleet shape: a numeric policy variable or "
                   "verify.prefix_tokens, and its values (qP: the P-quantile of the trace's p_hard); repeat for "
                   "several. Default: every p_hard* variable over the trace's p_hard quantiles 0.5-0.98, every "
                   "p_bad* variable over 0.3-0.6, verify.prefix_tokens over 16-128; 'none': the policy as written.")
@click.option("--cascade/--no-cascade", default=True, show_default=True,
              help="Replay a policy's verify section as a cascade (as `pointsman replay`, whose default it is).")
@click.option("--drafts", "drafts_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="The cascade's drafts, as for `pointsman replay` (default the shared AlpacaEval answers).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=Path("plan-out"),
              show_default=True, help="Folder for plan.txt/json/html, the PNGs and the recommended fleet.yaml.")
def plan_command(trace: Path, fleet_path: Path | None, policy_path: Path | None, slo_class: str | None,
                 slo_ttft_s: float | None, slo_tpot_s: float | None, goal: float, min_quality_share: float,
                 scale_text: str,
                 budget_usd_per_month: float | None, gpus_text: str, gpu_price_specs: tuple[str, ...],
                 max_replicas: int, workers: int,
                 time_budget_s: float, max_replays: int | None, search_requests: int, candidates: int, assume_monotone: bool,
                 limit: int | None, start_s: float | None,
                 end_s: float | None, seed: int, estimator_spec: str, outcomes: str, bin_s: float,
                 tune_specs: tuple[str, ...], cascade: bool, drafts_path: Path | None, out_dir: Path) -> None:
    """Search fleet shapes for TRACE's traffic; print the Pareto front of monthly cost vs SLO
    attainment and quality, and write the cheapest shape meeting --goal as --out/fleet.yaml."""
    import yaml

    from pointsman.cli.replay import _drafts, _estimator, _load_trace, with_objectives
    from pointsman.plan.evaluate import PlanInputs
    from pointsman.plan.planner import PlanSettings, plan
    from pointsman.plan.report import OVERLOAD_NOTE, table, write_report
    from pointsman.plan.shapes import ShapeSpace
    from pointsman.policy.fleet import DEFAULT_FLEET_PATH, load_fleet
    from pointsman.policy.rules.compiler import DEFAULT_POLICY_DIR, load_policy
    from pointsman.replay.fleet_map import sim_fleet
    from pointsman.replay.goodput import scaled
    from pointsman.replay.outcome_draw import OutcomeDraw, quality_columns
    from pointsman.replay.summary import SLO

    t0 = time.monotonic()
    scales = _floats(scale_text, "--scale")
    gpus = tuple(g.strip() for g in gpus_text.split(",") if g.strip())
    base_path = fleet_path or DEFAULT_FLEET_PATH
    policy_file = policy_path or DEFAULT_POLICY_DIR / "default.yaml"
    try:
        fleet = load_fleet(base_path)
        doc = yaml.safe_load(base_path.read_text(encoding="utf-8"))
        try:
            objectives = fleet.slo(slo_class)
        except KeyError:
            raise InputError(f"--slo-class {slo_class!r} is not a service class of the fleet (its slo_classes: "
                             f"{', '.join(fleet.slo_classes)})") from None
        slo_name = slo_class or fleet.spec.defaults.slo_class
        slo = SLO(slo_ttft_s or objectives.ttft_s, slo_tpot_s or objectives.tpot_s)
        if (planned := with_objectives(fleet, slo_name, slo)) is not fleet:  # every shape and the fleet file route by them
            fleet = planned
            doc["slo_classes"] = {name: c.model_dump() for name, c in fleet.slo_classes.items()}
        load_policy(policy_file, fleet)
        sim = sim_fleet(fleet)
        kv_bytes = {t.name: t.replica.kv_bytes_per_token for t in sim.on_prem}
        if not kv_bytes:
            raise InputError(f"{base_path}: no on-prem target to plan")
        try:
            space = ShapeSpace.of(doc, fleet, kv_bytes, gpus=gpus, max_replicas=max_replicas)
        except ValueError as exc:
            raise InputError(f"--gpus: {exc}") from None
        try:
            space = space.with_prices(_gpu_prices(gpu_price_specs))
        except ValueError as exc:
            raise InputError(f"--gpu-price: {exc}") from None
        requests, texts, _ = _load_trace(trace, limit, start_s, end_s)
        if not requests:
            raise InputError(f"{trace}: no requests in the chosen window")
        if requests[-1].arrival_s <= requests[0].arrival_s:  # a month is priced by the rate of the arrivals
            which = "its one request arrives" if len(requests) == 1 else f"its {len(requests)} requests arrive"
            raise InputError(f"{trace}: {which} at one instant: no arrival rate to plan a month of traffic by (give a "
                             "window with requests spread over time)")
        if not any(r.block_hashes for r in requests):  # no prefix to restore: a tier is rent for nothing
            space = space.without_kv_tiers()
        rows = None
        names = [n.strip() for n in outcomes.split(",") if n.strip() and n.strip() != "none"]
        if names and (texts is None or not any(texts)):
            draw = OutcomeDraw.load(names, seed, target_columns=quality_columns(fleet), where=fleet.file)
            rows = [draw.rows[i] for i in draw.assign(len(requests))]
            texts = [list(r.messages) for r in rows]
        estimator = _estimator(estimator_spec)
        book, _ = _drafts(cascade, drafts_path, rows is not None)
        tuning = _tuning(policy_file, tune_specs, texts, estimator, _frontier_prices(fleet, requests))
        space = space.with_policy(tuning)
    except (FleetError, PolicyError, DataError) as exc:
        raise InputError(str(exc).splitlines()[0]) from None
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"--out {out_dir}: {exc.strerror or exc}") from None

    frontier = max(sim.frontier, key=lambda f: f.output_usd_per_mtok) if sim.frontier else None
    reference = _all_frontier(requests, rows, sim, seed)
    min_quality = min_quality_share * reference[0] if reference is not None else 0.0
    quality_floor = ("none (--min-quality-share 0)" if min_quality_share == 0 else
                     "none: no outcome rows or no frontier target to compare with" if reference is None else
                     f"{min_quality:.4f} = {min_quality_share:g} x all-frontier's {reference[0]:.4f} ({frontier.name} "
                     f"on every request, replayed: its frontier bill ${reference[1]:.2f}/M output tokens)"
                     if frontier is not None else "none")
    trace_scaled = requests if scales[0] == 1.0 else scaled(requests, scales[0])
    inputs = PlanInputs(trace_scaled, texts, rows, policy_file, slo, slo_name, space, seed, bin_s, book)
    budget = budget_usd_per_month if budget_usd_per_month is not None else math.inf
    settings = PlanSettings(goal=goal, budget_usd_per_month=budget, growth=tuple(x / scales[0] for x in scales),
                            workers=workers, time_budget_s=time_budget_s, assume_monotone=assume_monotone,
                            max_replays=max_replays or math.inf,
                            search_requests=search_requests or len(requests), candidates=candidates,
                            min_quality=min_quality, frontier=frontier.name if frontier is not None else None)

    def log(r: ShapeResult, n: int) -> None:
        elapsed = time.monotonic() - t0
        where = "whole trace" if r.inputs == "full" and len(trace_scaled) > settings.search_requests else "search"
        scale = f" x{r.scale * scales[0]:g}" if r.scale != 1.0 else ""
        if not r.ok:
            click.echo(f"[{elapsed:5.0f}s] {where} {r.label}: invalid ({r.error})", err=True)
            return
        click.echo(f"[{elapsed:5.0f}s] {where} #{n:<3d} {r.label}{scale}: ${r.usd_per_month:,.0f}/month, SLO "
                   f"{r.slo_attainment:.1%}, quality {_quality(r.quality)}, {r.gpus} GPUs, "
                   f"{r.wall_s:.1f}s{'  meets' if r.meets(goal) else ''}{'  ' + _overload(r) if r.overloaded else ''}",
                   err=True)

    click.echo(f"planning on {len(requests)} requests of {trace.name} (SLO class {slo_name}: TTFT <= {slo.ttft_s} s, "
               f"TPOT <= {slo.tpot_s} s, goal {goal:.0%}) with {policy_file.name}, {workers} workers, time budget "
               f"{time_budget_s:.0f} s", err=True)
    # a SIGTERM unwinds like Ctrl-C, so the worker processes are terminated with the plan
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    outcome = plan(space, inputs, functools.partial(_estimator, estimator_spec), settings, log)
    base, rec, found = outcome.base, outcome.recommended, outcome.found
    if not base.ok:  # the packaged (base) fleet could not even be replayed: nothing to compare shapes with
        raise InputError(f"{trace}: {base.error}")
    wall = time.monotonic() - t0

    marks = {base.label: "(base)"}
    if rec is not None:
        marks[rec.label] = "(recommended)" + (" (base)" if rec.label == base.label else "")
    start, end = outcome.window
    where = (f"the busiest {end - start} requests (trace seconds {trace_scaled[start].arrival_s - trace_scaled[0].arrival_s:.0f}-"
             f"{trace_scaled[end - 1].arrival_s - trace_scaled[0].arrival_s:.0f})" if outcome.windowed else "the whole trace")
    lines = [f"Pareto front on {where}: {len(outcome.front)} of {len(found.results)} shapes evaluated "
             f"({len(found.invalid)} invalid, {found.pruned_cost} pruned by cost, {found.pruned_miss} by a miss; "
             f"search {found.stopped})", "", table(outcome.front, marks), ""]
    if found.stopped != "converged":
        lines += [_left(space, found, rec), ""]
    lines += [f"On the whole trace ({len(requests)} requests{f', x{scales[0]:g}' if scales[0] != 1 else ''}"
              f"{'; growth at ' + ', '.join(f'x{x:g}' for x in scales) if len(scales) > 1 else ''}):", "",
              table(outcome.full, marks, {label: {x * scales[0]: r for x, r in by.items()}
                                          for label, by in outcome.growth.items()}), ""]
    reproduce = ""
    if any(r.overloaded for r in [*outcome.front, *outcome.full, *(g for by in outcome.growth.values()
                                                                    for g in by.values())]):
        lines.append(OVERLOAD_NOTE)
    lines.append(f"quality floor: {quality_floor}")
    gpu_prices = _gpu_prices_used(space)
    if space.prices:
        lines.append("GPU prices: " + ", ".join(f"{g} {_usd(p['usd_per_gpu_hour'])} ({p['source']})"
                                                 for g, p in gpu_prices.items()))
    for stale in (out_dir / "fleet.yaml", out_dir / "policy.yaml"):  # an earlier plan's recommendation
        stale.unlink(missing_ok=True)
    if rec is None:
        # the shape closest to the floor among those meeting the goal, at digits that tell the two apart
        near = max((r for r in outcome.full if r.meets(goal) and r.usd_per_month <= budget and r.quality < min_quality),
                   key=lambda r: r.quality, default=None)
        lines.append(f"no shape replayed on the whole trace meets {goal:.0%} SLO attainment without overload"
                     + (f" and quality {_apart(min_quality, near.quality if near else min_quality)[0]}"
                        if min_quality > 0 else "")
                     + (f" within ${budget:,.0f}/month" if math.isfinite(budget) else "")
                     + ": no fleet file written"
                     + (f" (the closest, {near.label}, meets the SLO goal at quality "
                        f"{_apart(near.quality, min_quality)[0]}, under the floor {_apart(min_quality, near.quality)[0]})"
                        if near is not None and min_quality > 0 else ""))
    else:
        tuned = not space.policy_as_written(rec.shape)
        rec_policy = out_dir / "policy.yaml" if tuned else policy_file
        cmd = ["pointsman", "replay", str(trace), "--fleet", str(out_dir / "fleet.yaml"), "--policy", str(rec_policy),
               "--no-baselines", "--seed", str(seed), "--slo-class", slo_name, "--estimator", estimator_spec,
               "--outcomes", outcomes]
        for flag, value in (("--limit", limit), ("--start-s", start_s), ("--end-s", end_s),
                            ("--slo-ttft-s", slo_ttft_s), ("--slo-tpot-s", slo_tpot_s), ("--drafts", drafts_path)):
            if value is not None:
                cmd += [flag, str(value)]
        if not cascade:
            cmd.append("--no-cascade")
        if scales[0] != 1:
            cmd += ["--scale", str(scales[0])]
        reproduce = shlex.join(cmd)
        header = (f"Planned by `pointsman plan` for {trace.name} ({len(requests)} requests"
                  f"{f' at x{scales[0]:g} their rate' if scales[0] != 1 else ''}, SLO class {slo_name}, "
                  f"goal {goal:.0%}) with {policy_file.name}:\n{rec.label}: ${rec.usd_per_month:,.0f}/month, "
                  f"SLO {rec.slo_attainment:.1%}, quality {_quality(rec.quality)}.\nEndpoint URLs of added replicas are "
                  f"placeholders. Reproduce the numbers with:\n{reproduce}")
        fleet_file = out_dir / "fleet.yaml"
        fleet_file.write_text(space.fleet_text(rec.shape, header, {"reproduce": reproduce}), encoding="utf-8")
        if tuned:
            guard = space.pd_guard(rec.shape)
            chosen = " ".join(x for x in (space.policy.label(rec.shape.tuning),
                                          f"disaggregation.min_pool_gpus={guard} (the planned P/D pool's GPUs)"
                                          if guard is not None else "") if x)
            rec_policy.write_text(space.policy_text(rec.shape, (
                f"{policy_file} with the settings `pointsman plan` chose for {trace.name} on {fleet_file}: "
                f"{chosen}\n(comments of the original are not kept). Reproduce the "
                f"numbers with:\n{reproduce}")), encoding="utf-8")
        try:
            load_policy(rec_policy, load_fleet(fleet_file))
            checked = f"passes `pointsman policy check --fleet {fleet_file} {rec_policy}`"
        except (FleetError, PolicyError) as exc:
            checked = f"FAILS policy check: {str(exc).splitlines()[0]}"
        lines.append(f"recommended: {rec.label}: ${rec.usd_per_month:,.0f}/month (on-prem "
                     f"${rec.onprem_usd_per_month:,.0f}, frontier ${rec.frontier_usd_per_month:,.0f}, KV tier "
                     f"${rec.kv_usd_per_month:,.0f}), {rec.gpus} GPUs, SLO {rec.slo_attainment:.1%}, quality "
                     f"{_quality(rec.quality)}, ${rec.usd_per_mtok:.2f}/M output tokens"
                     + (f" ({1 - rec.usd_per_mtok / reference[1]:.1%} below all-frontier's ${reference[1]:.2f})"
                        if reference is not None and reference[1] > 0 else "") + ", on-prem utilization "
                     f"{rec.utilization:.1%} (prefill {rec.prefill_utilization:.1%}, decode {rec.decode_utilization:.1%})")
        verdict = "meets" if base.meets(goal) else "misses"
        lines.append(f"against the base fleet ({base.label}: ${base.usd_per_month:,.0f}/month, SLO "
                     f"{base.slo_attainment:.1%}{f' ({_overload(base)})' if base.overloaded else ''}, {verdict} the "
                     f"{goal:.0%} goal): changes "
                     f"{_changes(space, base.shape, rec.shape)}; "
                     f"{'saves' if base.usd_per_month >= rec.usd_per_month else 'costs'} "
                     f"${abs(base.usd_per_month - rec.usd_per_month):,.0f}/month")
        if len(scales) > 1:
            for shape_result, name in ((rec, "recommended"), (base, "base")):
                by = outcome.growth.get(shape_result.label, {})
                ok = [f"x{x * scales[0]:g}" for x in sorted(by) if by[x].meets(goal)]
                at = "; ".join(f"x{x * scales[0]:g}: SLO {by[x].slo_attainment:.1%}"
                               f"{f' ({_overload(by[x])})' if by[x].overloaded else ''}, frontier "
                               f"${by[x].frontier_usd_per_month:,.0f}/month, total ${by[x].usd_per_month:,.0f}/month"
                               for x in sorted(by))
                lines.append(f"growth ({name}): meets the goal at {', '.join(ok) if ok else 'no scale'}; {at}")
                if name == "recommended" and shape_result.label == base.label:
                    break
        lines.append(f"fleet file: {fleet_file} ({checked})")
        if tuned:
            lines.append(f"policy file: {rec_policy} ({policy_file.name} with {chosen})")
        lines.append(f"reproduce: {reproduce}")
    report_text = "\n".join(lines)
    meta = {"trace": str(trace), "requests": len(requests), "fleet": str(base_path), "policy": str(policy_file),
            "slo_class": slo_name, "slo": f"TTFT <= {slo.ttft_s} s, TPOT <= {slo.tpot_s} s", "goal": goal,
            "min_quality_share": min_quality_share, "min_quality": min_quality, "quality_floor": quality_floor,
            "all_frontier_quality": reference[0] if reference is not None else None,
            "all_frontier_usd_per_mtok": reference[1] if reference is not None else None,
            "scales": ", ".join(f"{x:g}" for x in scales), "seed": seed, "estimator": str(estimator.version),
            "gpus": ", ".join(space.gpus), "gpu_prices": gpu_prices, "workers": workers, "time_budget_s": time_budget_s,
            "wall_s": round(wall, 1),
            "search_window": where, "search_min_quality": outcome.search_floor,
            "evaluated": len(found.results), "invalid": len(found.invalid),
            "pruned_by_cost": found.pruned_cost, "pruned_by_miss": found.pruned_miss, "stopped": found.stopped,
            "max_replays": max_replays, "untuned": [space.label(s) for s in found.untuned],
            "unexpanded": [space.label(s) for s in found.unexpanded],
            "reproduce": reproduce}
    written = write_report(out_dir, meta, list(found.results.values()), outcome.front, outcome.full, rec, base,
                           {label: {x * scales[0]: r for x, r in by.items()} for label, by in outcome.growth.items()},
                           goal, report_text)
    click.echo(report_text)
    click.echo(f"report: {written['html']} ({', '.join(p.name for p in written.values())}); {wall:.0f} s")
    if rec is None:  # the search ran and found nothing to recommend: exit status 1, as a failed check
        raise CheckFailed()


def _left(space: ShapeSpace, found: SearchResult, rec: ShapeResult | None) -> str:
    """What a search stopped early left: the fleets meeting the SLO goal whose thresholds were not
    set and the shapes not expanded (``SearchResult.untuned``, ``unexpanded``), a few of each named."""

    def few(shapes: list[Shape]) -> str:
        named = "; ".join(space.label(s) for s in shapes[:3])
        return f" ({named}{f'; {len(shapes) - 3} more' if len(shapes) > 3 else ''})" if shapes else ""

    if not found.untuned and not found.unexpanded:
        return f"the search stopped at its {found.stopped} with nothing left to try"
    return (f"WARNING: the search stopped at its {found.stopped} before it was done: "
            f"{_count(found.untuned, 'fleet')} meeting the SLO goal with thresholds not yet set{few(found.untuned)}, "
            f"{_count(found.unexpanded, 'shape')} not expanded{few(found.unexpanded)}; "
            + ("a longer search may find a cheaper shape than the one recommended" if rec is not None
               else "a longer search may find a shape that meets the goal")
            + " (raise --time-budget-s or --max-replays)")


def _count(items: Sequence[object], noun: str) -> str:
    return f"{len(items)} {noun}{'' if len(items) == 1 else 's'}"


def _gpu_prices(specs: Sequence[str]) -> dict[str, float]:
    """``--gpu-price GPU=USD`` specs as {GPU preset: USD per GPU-hour}. Raises ``ValueError`` for a
    spec that is not NAME=NUMBER or a GPU named twice (the names and prices are checked by
    ``ShapeSpace.with_prices``)."""
    out: dict[str, float] = {}
    for spec in specs:
        name, _, value = spec.partition("=")
        try:
            usd = float(value)
        except ValueError:
            raise ValueError(f"{spec!r}: expected GPU=USD per GPU-hour, e.g. H200-SXM=2.10") from None
        if name.strip() in out:
            raise ValueError(f"{name.strip()} is priced twice")
        out[name.strip()] = usd
    return out


def _usd(usd_per_gpu_hour: object) -> str:
    return "per target" if usd_per_gpu_hour is None else f"${usd_per_gpu_hour:.2f}/GPU-hour"


def _gpu_prices_used(space: ShapeSpace) -> dict[str, dict[str, object]]:
    """The USD per GPU-hour of each GPU type the plan considered and whose price it is: the base
    fleet's from the fleet file (None when its targets differ), the others ``yours`` (``--gpu-price``)
    or ``list`` (``plan/prices.py``)."""
    rates = {t.usd_per_gpu_hour for t in space.targets}
    out: dict[str, dict[str, object]] = {space.gpus[0]: {"usd_per_gpu_hour": rates.pop() if len(rates) == 1 else None,
                                                         "source": "fleet file"}}
    for g, p in space.prices.items():
        out[g] = {"usd_per_gpu_hour": p.usd_per_gpu_hour, "source": "yours" if p.source == "your quote" else "list"}
    return out


def _overload(r: ShapeResult) -> str:
    """Why an overloaded result does not meet the goal: its most loaded pool and that pool's load."""
    pool, x = r.peak_load
    return f"overloaded: {pool} at {x:.0%} of its GPU time over the arrival span"


def _frontier_prices(fleet: Fleet, requests: Sequence[TraceRequest]) -> list[float]:
    """Each request's estimated USD on the fleet's frontier target with the highest output price
    (``cost(target)`` without a cached prefix: the fleet's default output length, as the engine
    assumes for a request without max_tokens); [] without a frontier target (``plan.tuning``)."""
    from pointsman.policy.cost import estimate_cost
    from pointsman.policy.fleet import FrontierTarget

    tiers = [(n, t) for n, t in fleet.targets.items() if isinstance(t, FrontierTarget)]
    if not tiers:
        return []
    name, tier = max(tiers, key=lambda nt: nt[1].prices.usd_per_1m_output_tokens)
    out = fleet.spec.defaults.output_tokens
    return [estimate_cost(name, tier, "aggregated", r.prompt_tokens, out).usd for r in requests]


def _tuning(policy_file: Path, specs: tuple[str, ...], texts: Sequence[TraceMessages | None] | None,
            estimator: Estimator, prices_usd: Sequence[float] = ()) -> TuningSpace:
    """The policy settings to search (``plan.tuning``): ``--tune`` specs, or the default knobs;
    quantiles from the estimator's p_hard over the trace's prompts and of ``prices_usd`` (each
    request's frontier price, ``_frontier_prices``). Without prompt text (``--outcomes none`` on a
    trace without it) the default p_hard knobs are left out: the policy's thresholds stay as
    written. Raises ``InputError`` (a ``--tune`` spec it cannot resolve)."""
    import yaml

    from pointsman.plan.tuning import TuningSpace, default_knobs, parse_tune, resolve

    doc = yaml.safe_load(policy_file.read_text(encoding="utf-8"))
    if specs == ("none",):
        return TuningSpace(doc)
    try:
        parsed = [parse_tune(s) for s in specs] if specs else default_knobs(doc)
        needs_scores = any(v.startswith("q") for _, values in parsed for v in values)
        scores = _trace_p_hard(texts, estimator) if needs_scores else []
        if not specs and not scores:  # no prompt text to score: the default p_hard knobs keep the policy's values
            parsed = [(name, values) for name, values in parsed if not any(v.startswith("q") for v in values)]
        return TuningSpace(doc, resolve(doc, parsed, scores, prices_usd))
    except ValueError as exc:
        raise InputError(f"--tune {exc}") from None


def _trace_p_hard(texts: Sequence[TraceMessages | None] | None, estimator: Estimator) -> list[float]:
    """The estimator's p_hard of each request with a prompt (as the engine computes it), in trace
    order; unavailable estimates are left out."""
    from pointsman.estimator.estimate import TokenIdsEstimator
    from pointsman.estimator.features import tokenized_features
    from pointsman.request import RequestView, RouteRequest

    seen: dict[str, float | None] = {}
    out: list[float] = []
    for messages in texts or []:
        if not messages:
            continue
        key = repr(messages)
        if key not in seen:
            view = RequestView.of(RouteRequest.model_validate({"messages": list(messages)}), None)
            if isinstance(estimator, TokenIdsEstimator) and estimator.takes_query_token_ids:
                features, token_ids = tokenized_features(view, estimator.tokenizer, True)
                est = estimator.estimate(features, token_ids)
            else:
                est = estimator.estimate(tokenized_features(view, estimator.tokenizer, False)[0])
            seen[key] = est.p_hard if est.available else None
        p = seen[key]
        if p is not None:
            out.append(p)
    return out


def _all_frontier(requests: list[TraceRequest], rows: list[OutcomeRow] | None, sim: SimFleet, seed: int
                  ) -> tuple[float, float] | None:
    """(quality, $/M output tokens) of sending every request to the frontier target with the
    highest output price: ``pointsman replay``'s ``all-frontier`` baseline, replayed here on the
    whole trace (same seed, its prompt cache at the cached price), counting its frontier bill only
    (an all-frontier deployment rents no GPUs; the replay's row also bills the fleet's idle
    GPUs). None without outcome rows or a frontier target."""
    from pointsman.replay.outcome_draw import quality_of
    from pointsman.replay.runs import baseline_routers
    from pointsman.replay.simulator import simulate
    from pointsman.replay.summary import summarize

    if rows is None or not sim.frontier or not requests:
        return None
    result = simulate(requests, sim, baseline_routers(sim, seed)["all-frontier"], seed=seed)
    s = summarize(result, None, lambda r: quality_of(rows[r.index], r.frontier, r.target))
    if math.isnan(s.quality) or not s.output_tokens:
        return None
    return s.quality, s.frontier_cost_usd / s.output_tokens * 1e6


def register(group: click.Group) -> None:
    """Attach ``plan`` to the ``pointsman`` group."""
    group.add_command(plan_command)
