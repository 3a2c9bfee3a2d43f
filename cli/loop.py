"""The retraining loop on the command line: ``compare``, ``promote`` (and ``--rollback``),
``calibrate``, and the body of ``train --from-outcomes``.

- ``pointsman train --from-outcomes [LOG]``: a challenger from logged outcomes
  (``training.challenger``), registered in MLflow with alias ``challenger``;
- ``pointsman compare``: champion and challenger on the same held-out logged traffic;
- ``pointsman promote``: moves ``champion`` to the challenger only if it passes the gate
  (better APGR, beyond bootstrap noise, ECE not worse beyond a tolerance, sanity-suite concordance not
  lower beyond a tolerance); exit code 1 with both numbers when
  refused; ``--rollback`` moves ``champion`` back to the previous one;
- ``pointsman calibrate --frontier-share S | --budget-usd-per-day X``: writes the policy's
  ``p_hard`` threshold from recent logged traffic, through policy validation, atomically.

Attached to the main group by ``register(group)``; heavy imports happen inside the
commands. Errors are ``cli.errors`` exceptions: bad input prints one line (``Error: ...``) and
exits with code 2; a refused promotion exits with code 1.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import click

from pointsman.cli.errors import CheckFailed, InputError
from pointsman.cli.training_output import echo_metrics, invoked_command, progress_log
from pointsman.errors import PointsmanError

if TYPE_CHECKING:  # pragma: no cover
    from pointsman.outcome_log.store import OutcomeLog
    from pointsman.policy.fleet import Fleet
    from pointsman.training.compare import Comparison
    from pointsman.training.outcome_labels import LabelRules

DEFAULT_WINDOW_DAYS = 7.0


def parse_time(value: str | None, option: str) -> float | None:
    """Unix seconds from ``value``: a number (Unix seconds) or an ISO 8601 date/time (UTC unless it
    names a zone); None for None. Raises ``InputError`` naming ``option`` on anything else."""
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        pass
    try:
        dt = datetime.fromisoformat(value)
    except ValueError:
        raise InputError(f"{option}: expected Unix seconds or an ISO 8601 time like 2025-01-31T12:00, "
                         f"got {value!r}") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()


def _need_training() -> None:
    """Import the train extra's packages before any work: a missing one is ``cli.main``'s one
    ``Error:`` line naming the extra (``EXTRA_OF``), not a traceback after minutes of training."""
    import mlflow  # noqa: F401
    import sklearn  # noqa: F401


def _open_log(path: Path | None, option: str = "--log PATH") -> OutcomeLog:
    from pointsman.outcome_log.store import OutcomeLog, default_log_path

    p = Path(path) if path else default_log_path()
    if not p.is_file():
        raise InputError(f"no outcome log at {p} (the service writes it; pass {option} or set POINTSMAN_DATA_DIR)")
    return OutcomeLog(p)


def _fleet(path: Path | None) -> Fleet:
    from pointsman.policy.fleet import load_fleet
    from pointsman.service.settings import Settings

    return load_fleet(path or Settings().fleet_path)


def _rules(path: Path | None) -> LabelRules:
    from pointsman.training.outcome_labels import load_label_rules

    return load_label_rules(path)


def _echo_json(data: object) -> None:
    click.echo(json.dumps(data, indent=2, default=lambda v: None if v != v else str(v)))


# ------------------------------------------------------------------ train --from-outcomes

def train_from_outcomes(log_path: Path | None, *, base_spec: str | None, label_rules: Path | None, fleet: Path | None,
                        seed: int, calibration_folds: int, output: Path | None, use_mlflow: bool, register: bool,
                        as_json: bool, since: str | None = None, until: str | None = None, head: str | None = None,
                        alpha: float | None = None, log: Callable[[str], None] | None = None,
                        warm_start: bool = True) -> None:
    """The body of ``pointsman train --from-outcomes``: raises ``InputError`` on bad input, prints the metrics.
    ``warm_start``: add the shipped recipe's licensed chat rows (``training.warm_start``)."""
    _need_training()
    from pointsman.estimator.model_source import load_estimator
    from pointsman.training.challenger import ChallengerConfig, train_challenger

    if not use_mlflow and output is None:
        raise InputError("--no-mlflow needs --output DIR (otherwise the challenger would be thrown away)")
    echo = log or progress_log(as_json)
    try:
        outcome_log = _open_log(log_path, "--from-outcomes LOG")
        cfg = ChallengerConfig(seed=seed, calibration_folds=calibration_folds, since_s=parse_time(since, "--since"),
                               until_s=parse_time(until, "--until"), head=head or ChallengerConfig.head,
                               alpha=ChallengerConfig.alpha if alpha is None else alpha, warm_start=warm_start)
        base = load_estimator(base_spec or "champion", intra_op_threads=2)
        echo(f"base model (encoder and feature space): {base.version} ({base.source})")
        result = train_challenger(outcome_log, _rules(label_rules), _fleet(fleet), cfg, base, output=output,
                                  use_mlflow=use_mlflow, register=register, command=invoked_command(), log_fn=echo)
    except (PointsmanError, ValueError) as exc:
        raise InputError(str(exc)) from None
    echo_metrics(result.metrics, as_json=as_json, shown=lambda key: key.startswith(("heldout", "cv/", "data/")),
                 width=40, output=output)


# ----------------------------------------------------------------------------- compare

def _print_comparison(cmp: Comparison) -> None:
    a, b = cmp.champion, cmp.challenger
    click.echo(f"held-out logged decisions scored by both: {cmp.n}  (excluded: {cmp.excluded})")
    click.echo(f"label signals: {cmp.examples.signal_counts()}")
    click.echo("")
    click.echo(f"{'model':11s} {'APGR':>7s} {'CPT(50%)':>9s} {'AUC':>7s} {'ECE':>7s}  version (source)")
    for m in (a, b):
        x = m.metrics
        click.echo(f"{m.role:11s} {x['apgr']:7.4f} {100 * x['cpt50']:8.1f}% {x['auc']:7.4f} {x['ece']:7.4f}  "
                   f"{m.version} ({m.source})")
    lo, hi = cmp.apgr_delta_ci90
    click.echo(f"\nAPGR challenger - champion: {cmp.apgr_delta:+.4f} (90% paired bootstrap {lo:+.4f} .. {hi:+.4f})")


@click.command("compare")
@click.option("--log", "log_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Outcome log (default: <data dir>/outcomes.db).")
@click.option("--champion", "champion_spec", default="champion", show_default=True,
              help="Champion model spec (champion falls back to the bundled model).")
@click.option("--challenger", "challenger_spec", default="models:/pointsman-difficulty@challenger", show_default=True,
              help="Challenger model spec: models:/NAME@ALIAS, models:/NAME/VERSION or a model directory.")
@click.option("--label-rules", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help="YAML label rules (training.outcome_labels); default rules otherwise.")
@click.option("--fleet", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help="Fleet file that tells the frontier tier apart (default: POINTSMAN_FLEET_PATH or the packaged one).")
@click.option("--since", help="Only decisions at or after this time (Unix seconds or ISO 8601).")
@click.option("--until", help="Only decisions before this time.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def compare_cmd(log_path: Path | None, champion_spec: str, challenger_spec: str, label_rules: Path | None,
                fleet: Path | None, since: str | None, until: str | None, as_json: bool) -> None:
    """Score the champion and the challenger on the same held-out logged traffic (decisions neither
    trained on) and print APGR, CPT(50%), AUC and ECE for both."""
    _need_training()
    from pointsman.estimator.model_source import load_estimator
    from pointsman.training.compare import compare_models

    try:
        log = _open_log(log_path)
        champion = load_estimator(champion_spec, intra_op_threads=2)
        challenger = load_estimator(challenger_spec, intra_op_threads=2)
        cmp = compare_models(log, _rules(label_rules), _fleet(fleet), champion, challenger,
                             since_s=parse_time(since, "--since"), until_s=parse_time(until, "--until"))
    except PointsmanError as exc:
        raise InputError(str(exc)) from None
    if as_json:
        _echo_json(cmp.to_dict())
    else:
        _print_comparison(cmp)


# ----------------------------------------------------------------------------- promote

@click.command("promote")
@click.option("--log", "log_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Outcome log (default: <data dir>/outcomes.db).")
@click.option("--label-rules", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help="YAML label rules (training.outcome_labels).")
@click.option("--fleet", type=click.Path(dir_okay=False, exists=True, path_type=Path), help="Fleet file.")
@click.option("--min-apgr-gain", type=float, default=0.0, show_default=True,
              help="The challenger's APGR must beat the champion's by more than this.")
@click.option("--min-apgr-gain-ci-low", type=float, default=0.0, show_default=True,
              help="The lower end of the 90% paired-bootstrap interval of the APGR gain (same held-out rows) "
                   "must exceed this: a gain within resampling noise is refused.")
@click.option("--ece-tolerance", type=float, default=0.02, show_default=True,
              help="The challenger's ECE may exceed the champion's by at most this.")
@click.option("--min-rows", type=int, default=50, show_default=True,
              help="Held-out decisions needed to decide.")
@click.option("--max-sanity-drop", type=float, default=0.02, show_default=True,
              help="The challenger's concordance on the shipped sanity suite (obviously easy vs obviously hard "
                   "requests, `evaluate --pairs sanity`) may fall below the champion's by at most this; 1 turns the "
                   "check off.")
@click.option("--since", help="Only decisions at or after this time (Unix seconds or ISO 8601).")
@click.option("--until", help="Only decisions before this time.")
@click.option("--dry-run", is_flag=True, help="Compare and log, but move no alias.")
@click.option("--rollback", is_flag=True, help="Move @champion back to the previous champion instead.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def promote_cmd(log_path: Path | None, label_rules: Path | None, fleet: Path | None, min_apgr_gain: float,
                min_apgr_gain_ci_low: float, ece_tolerance: float, min_rows: int, max_sanity_drop: float,
                since: str | None, until: str | None, dry_run: bool, rollback: bool, as_json: bool) -> None:
    """Promote @challenger to @champion if it beats the champion on held-out logged traffic (APGR)
    without worse calibration (ECE) and without ranking the sanity suite's pairs worse; log the
    comparison to MLflow. A refused challenger exits with code 1 and the reasons. --rollback moves
    @champion back to the previous champion."""
    _need_training()
    from pointsman.training import promote as P

    if rollback:
        if dry_run:
            raise InputError("--rollback moves @champion back at once; --dry-run applies to a promotion only: "
                             "give one or the other")
        try:
            r = P.rollback()
        except PointsmanError as exc:
            raise InputError(str(exc)) from None
        to = r.champion_version or "the bundled model (no @champion)"
        if as_json:
            _echo_json({"rolled_back": True, "champion_version": r.champion_version,
                        "replaced_version": r.replaced_version, "run_id": r.run_id})
        else:
            click.echo(f"rolled back: @champion is now {to}; replaced version {r.replaced_version or 'bundled'} "
                       f"is @{P.PREVIOUS_ALIAS} (this rollback's MLflow record: run {r.run_id})")
        return
    try:
        gate = P.Gate(min_apgr_gain=min_apgr_gain, min_apgr_gain_ci_low=min_apgr_gain_ci_low,
                      ece_tolerance=ece_tolerance, min_rows=min_rows, max_sanity_drop=max_sanity_drop)
        result = P.promote(_open_log(log_path), _rules(label_rules), _fleet(fleet), gate,
                           since_s=parse_time(since, "--since"), until_s=parse_time(until, "--until"),
                           dry_run=dry_run)
    except PointsmanError as exc:
        raise InputError(str(exc)) from None
    if as_json:
        _echo_json({"promoted": result.promoted, "reasons": result.reasons, "checks": result.checks,
                    "champion_version": result.champion_version, "previous_version": result.previous_version,
                    "run_id": result.run_id, **result.comparison.to_dict(),
                    "sanity": None if result.sanity is None else {
                        role: r.summary() for role, r in zip(("champion", "challenger"), result.sanity)}})
    else:
        _print_comparison(result.comparison)
        click.echo("")
        if result.promoted:
            click.echo(f"promoted: @champion is now version {result.champion_version} "
                       f"(previous: {result.previous_version or 'bundled'}; undo with `pointsman promote --rollback`)")
        elif not result.reasons:
            click.echo("dry run: the challenger passes the gate; no alias moved")
        for line in result.checks:
            click.echo(f"  ok: {line}")
    if result.reasons:
        raise CheckFailed("refused: " + "; ".join(result.reasons))


# --------------------------------------------------------------------------- calibrate

@click.command("calibrate")
@click.option("--policy", "policy_path", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help="Policy file to update (default: POINTSMAN_POLICY_PATH; the packaged policies are never written).")
@click.option("--frontier-share", type=click.FloatRange(0.0, 1.0),
              help="Send this share (0-1) of recent traffic to the frontier.")
@click.option("--budget-usd-per-day", type=click.FloatRange(min=0.0),
              help="Spend at most this on the frontier target per day (projected on recent traffic).")
@click.option("--variable", default="p_hard_frontier", show_default=True, help="The policy variable to set.")
@click.option("--target", help="Frontier target whose cost the budget counts (default: the target of the first "
                               "rule reading the variable).")
@click.option("--window-days", type=click.FloatRange(min=0.0, min_open=True), default=DEFAULT_WINDOW_DAYS,
              show_default=True, help="Recent traffic: decisions of the last N days.")
@click.option("--since", help="Start of the traffic window instead (Unix seconds or ISO 8601).")
@click.option("--until", help="End of the traffic window (default: now).")
@click.option("--model", "model_spec", default="champion", show_default=True,
              help="Re-score decisions logged by other model versions with this model.")
@click.option("--min-threshold", type=click.FloatRange(0.0, 1.0), default=0.0, show_default=True)
@click.option("--max-threshold", type=click.FloatRange(0.0, 1.0), default=1.0, show_default=True)
@click.option("--pace-bound", type=click.FloatRange(0.0, 1.0),
              help="Budget pacing: also set variables.pace_gain so the paced threshold stays <= this.")
@click.option("--log", "log_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Outcome log (default: <data dir>/outcomes.db).")
@click.option("--fleet", type=click.Path(dir_okay=False, exists=True, path_type=Path), help="Fleet file.")
@click.option("--dry-run", is_flag=True, help="Print the new threshold; do not write the policy.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def calibrate_cmd(policy_path: Path | None, frontier_share: float | None, budget_usd_per_day: float | None,
                  variable: str, target: str | None, window_days: float, since: str | None, until: str | None,
                  model_spec: str, min_threshold: float, max_threshold: float, pace_bound: float | None,
                  log_path: Path | None, fleet: Path | None, dry_run: bool, as_json: bool) -> None:
    """Set the policy's p_hard threshold from recent logged traffic: by frontier share or by a daily
    frontier budget. The new policy is compiled before it atomically replaces the file; an invalid
    result is refused and the file is left as it was."""
    from pointsman.estimator.model_source import load_estimator
    from pointsman.policy.rules.compiler import load_policy
    from pointsman.service.settings import Settings
    from pointsman.training import calibrate as C

    if (frontier_share is None) == (budget_usd_per_day is None):
        raise InputError("give exactly one of --frontier-share and --budget-usd-per-day")
    if min_threshold > max_threshold:
        raise InputError(f"--min-threshold {min_threshold} is above --max-threshold {max_threshold}")
    if policy_path is None:
        settings = Settings()
        from pointsman.policy.rules.compiler import DEFAULT_POLICY_DIR

        if Path(settings.policy_path).resolve().parent == DEFAULT_POLICY_DIR.resolve():
            raise InputError("name the policy file to update with --policy (or POINTSMAN_POLICY_PATH); "
                             "the packaged policies are never written")
        policy_path = Path(settings.policy_path)
    try:
        fl = _fleet(fleet)
        policy = load_policy(policy_path, fl)
        frontier = target or C.frontier_target_of(policy, variable)
        until_s = parse_time(until, "--until") or time.time()
        since_s = parse_time(since, "--since")
        if since_s is None:
            since_s = until_s - window_days * C.DAY_S
        model = load_estimator(model_spec, intra_op_threads=2)
        traffic = C.recent_traffic(_open_log(log_path), fl, frontier, model, since_s=since_s, until_s=until_s,
                                   policy=policy, variable=variable)
        cal = C.calibrate(traffic, variable, frontier_share=frontier_share, budget_usd_per_day=budget_usd_per_day,
                          bounds=(min_threshold, max_threshold), pace_bound=pace_bound)
        old = {k: policy.variables.get(k) for k in cal.updates}
        if not dry_run:
            C.write_policy(policy_path, cal.updates, fl, C.calibration_comment(cal, model.version))
    except (PointsmanError, ValueError) as exc:
        raise InputError(str(exc)) from None
    summary = {"policy": str(policy_path), "variable": variable, "threshold": cal.threshold, "method": cal.method,
               "frontier_target": frontier, "frontier_share": cal.frontier_share,
               "projected_spend_usd_per_day": cal.spend_usd_per_day, "decisions": cal.n,
               "rescored": traffic.rescored, "skipped": traffic.skipped, "span_days": traffic.span_days,
               "updates": cal.updates, "previous": old, "written": not dry_run, "note": cal.note,
               "warnings": []}
    warning = C.projection_warning(traffic)
    if warning is not None:
        summary["warnings"] = [warning]
        click.echo(f"Warning: {warning}", err=True)
    if as_json:
        _echo_json(summary)
        return
    for k, v in cal.updates.items():
        click.echo(f"{policy_path}: variables.{k} {old.get(k)} -> {v}" + ("  (dry run: not written)" if dry_run else ""))
    click.echo(f"  {cal.method}: {100 * cal.frontier_share:.1f}% of {cal.n} recent decisions to {frontier}, "
               f"projected ${cal.spend_usd_per_day:,.2f}/day over {C.span_text(traffic.span_days)}"
               + (f"; {cal.note}" if cal.note else ""))


def register(group: click.Group) -> None:
    """Attach ``compare``, ``promote`` and ``calibrate`` to the ``pointsman`` command group."""
    group.add_command(compare_cmd)
    group.add_command(promote_cmd)
    group.add_command(calibrate_cmd)
