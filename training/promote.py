"""Promotion and rollback of the serving model through MLflow registry aliases.

The serving model is the version of ``pointsman-difficulty`` with alias ``champion``
(no alias: the bundled model); a candidate has alias ``challenger``
(``pointsman train --from-outcomes``). ``promote`` compares them on the same held-out
logged traffic (``training.compare``) and moves ``champion`` only when the challenger
passes the ``Gate``:

- APGR: ``challenger − champion > min_apgr_gain`` (default 0: strictly better);
- APGR beyond noise: the lower end of the 90% paired-bootstrap interval of that gain, on the
  same held-out rows (``compare.bootstrap_delta``, 1000 resamples), must be
  ``> min_apgr_gain_ci_low`` (default 0: a gain the resampling cannot tell from none is refused;
  on ~600 rows that interval is about ±0.08 wide);
- calibration: ``challenger ECE <= champion ECE + ece_tolerance`` (default 0.02, about the
  bin-noise of ECE on a few hundred rows);
- enough evidence: at least ``min_rows`` held-out decisions scored by both (default 50);
- sanity: the challenger's concordance on the shipped sanity suite (``training.sanity``: pairs of an
  obviously easy and an obviously hard request, never trained on) must be
  ``>= champion's - max_sanity_drop`` (default 0.02: about 5 of the shipped suite's 266 pairs). Both models score
  the same pairs, so the noise of the difference is far below the ±0.06 of either 95% interval; a
  challenger that learned from its own logged outcomes that easy requests are hard (a broken judge,
  a skewed label rule) can gain APGR on that traffic and is still refused here.

Every promotion attempt, passed or refused, is logged as a run of the MLflow experiment
``pointsman-promotion`` (both models' metrics, the gate, the verdict and its reasons,
PGR and reliability plots of both). On promotion the previous champion keeps the alias
``previous_champion`` (and the registered model's tag ``pointsman.previous_champion``,
which also records ``bundled``), the challenger alias is removed, and ``rollback``
moves ``champion`` back in one step (twice = undo the rollback).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from pointsman.errors import ModelNotFoundError, PointsmanError
from pointsman.estimator.model_source import load_estimator
from pointsman.estimator.registry import CHAMPION_ALIAS, REGISTERED_NAME
from pointsman.training.challenger import CHALLENGER_ALIAS
from pointsman.training.sanity import SHIPPED, SanityReport, concordance, read_pairs

if TYPE_CHECKING:  # pragma: no cover
    from mlflow import MlflowClient

    from pointsman.estimator.difficulty import DifficultyEstimator
    from pointsman.outcome_log.store import OutcomeLog
    from pointsman.policy.fleet import Fleet
    from pointsman.training.compare import Comparison
    from pointsman.training.outcome_labels import LabelRules

PREVIOUS_ALIAS = "previous_champion"
PREVIOUS_TAG = "pointsman.previous_champion"
BUNDLED = "bundled"
PROMOTION_EXPERIMENT = "pointsman-promotion"


class PromotionRefused(PointsmanError):
    """The challenger did not pass the gate (or there is nothing to promote); ``str()`` gives
    the reasons with both models' numbers."""


@dataclass(frozen=True)
class Gate:
    """Promotion thresholds (see the module docstring)."""

    min_apgr_gain: float = 0.0
    min_apgr_gain_ci_low: float = 0.0
    ece_tolerance: float = 0.02
    min_rows: int = 50
    max_sanity_drop: float = 0.02


@dataclass
class PromotionResult:
    """``promoted`` or not, the ``reasons`` (refusals) or the passed checks, the ``comparison``,
    the new and previous champion versions (``None``/"bundled" for the bundled model), the
    MLflow run id of the promotion record, the (champion, challenger) sanity reports."""

    promoted: bool
    reasons: list[str]
    comparison: Comparison
    champion_version: str | None
    previous_version: str | None
    run_id: str | None = None
    checks: list[str] = field(default_factory=list)
    sanity: tuple[SanityReport, SanityReport] | None = None


def evaluate_gate(cmp: Comparison, gate: Gate,
                  sanity: tuple[SanityReport, SanityReport] | None = None) -> tuple[list[str], list[str]]:
    """(refusal reasons, passed checks) of ``cmp`` against ``gate`` and of the (champion,
    challenger) ``sanity`` reports on the same pairs (None: not checked); promoted iff no reason.
    Every message carries both models' numbers."""
    a, b = cmp.champion.metrics, cmp.challenger.metrics
    reasons: list[str] = []
    checks: list[str] = []
    if cmp.n < gate.min_rows:
        reasons.append(f"only {cmp.n} held-out decisions scored by both models; the gate needs at least {gate.min_rows}")
    gain = b["apgr"] - a["apgr"]
    apgr_msg = (f"APGR challenger {b['apgr']:.4f} vs champion {a['apgr']:.4f} (gain {gain:+.4f}, "
                f"required > {gate.min_apgr_gain:+.4f})")
    if not gain > gate.min_apgr_gain:  # NaN refuses too
        reasons.append(apgr_msg)
    else:
        checks.append(apgr_msg)
    lo, hi = cmp.apgr_delta_ci90
    ci_msg = (f"APGR gain 90% paired bootstrap interval {lo:+.4f} .. {hi:+.4f} over {cmp.n} held-out decisions "
              f"(lower end required > {gate.min_apgr_gain_ci_low:+.4f})")
    if not lo > gate.min_apgr_gain_ci_low:  # NaN (no defined resample) refuses too
        reasons.append(ci_msg + ": the gain is within resampling noise")
    else:
        checks.append(ci_msg)
    ece_msg = (f"ECE challenger {b['ece']:.4f} vs champion {a['ece']:.4f} "
               f"(allowed up to {a['ece'] + gate.ece_tolerance:.4f} = champion + {gate.ece_tolerance:g})")
    if not b["ece"] <= a["ece"] + gate.ece_tolerance:
        reasons.append(ece_msg)
    else:
        checks.append(ece_msg)
    if sanity is not None:
        old, new = sanity
        lo, hi = new.ci95
        floor = old.concordance - gate.max_sanity_drop
        allowed = "not checked: --max-sanity-drop 1" if gate.max_sanity_drop >= 1 else \
            f"allowed down to {floor:.4f} = champion - {gate.max_sanity_drop:g}"
        sanity_msg = (f"sanity concordance challenger {new.concordance:.4f} (95% CI {lo:.4f}-{hi:.4f}) vs champion "
                      f"{old.concordance:.4f} on {new.n} easy/hard pairs ({allowed})")
        if not new.concordance >= floor:
            reasons.append(sanity_msg + ": the challenger ranks obviously easy requests above obviously hard ones more often")
        else:
            checks.append(sanity_msg)
    return reasons, checks


def _client() -> MlflowClient:
    from pointsman.estimator.registry import client

    return client()


def alias_version(c: MlflowClient, alias: str, name: str = REGISTERED_NAME) -> str | None:
    """The version number an alias points at, or None (no such model or alias)."""
    try:
        return str(c.get_model_version_by_alias(name, alias).version)
    except Exception:  # noqa: BLE001 - MlflowException RESOURCE_DOES_NOT_EXIST
        return None


def load_version(version: str | None, *, intra_op_threads: int = 1) -> DifficultyEstimator:
    """The estimator of a registry version (None: the bundled model)."""
    spec = BUNDLED if version is None else f"models:/{REGISTERED_NAME}/{version}"
    return load_estimator(spec, intra_op_threads=intra_op_threads)


def _log_record(kind: str, params: Mapping[str, object], metrics: Mapping[str, float], tags: dict[str, str],
                cmp: Comparison | None = None) -> str:
    """One run in ``PROMOTION_EXPERIMENT`` with the comparison's plots and JSON; returns its id."""
    from pointsman.training.registry import ensure_experiment, log_batch

    c = _client()
    run = c.create_run(ensure_experiment(c, PROMOTION_EXPERIMENT), tags={"pointsman.kind": kind, **tags},
                       run_name=kind)
    log_batch(c, run.info.run_id, params, metrics)
    if cmp is not None:
        with tempfile.TemporaryDirectory(prefix="pointsman-promotion-") as tmp:
            write_comparison_reports(Path(tmp), cmp)
            c.log_artifacts(run.info.run_id, tmp, artifact_path="comparison")
    c.set_terminated(run.info.run_id)
    return run.info.run_id


def write_comparison_reports(out_dir: Path, cmp: Comparison, frontier_share: float = 0.2) -> dict[str, float]:
    """Into ``out_dir``: ``comparison.json``, both models' PGR curves and reliability in one
    plot each, and each model's confusion and drift (``training.reports.model_report``).
    Returns the report metrics prefixed by role."""
    from pointsman.training.reports import model_report, plot_pgr, plot_reliability

    ex = cmp.examples
    (out_dir / "comparison.json").write_text(json.dumps(cmp.to_dict(), indent=2, default=str), encoding="utf-8")
    curves = {m.role: (ex.weak_score, ex.strong_score, m.p_hard) for m in (cmp.champion, cmp.challenger)}
    plot_pgr(out_dir / "pgr.png", curves, f"held-out logged traffic (n={cmp.n})")
    plot_reliability(out_dir / "reliability.png", {m.role: (ex.y, m.p_hard) for m in (cmp.champion, cmp.challenger)},
                     f"held-out logged traffic (n={cmp.n})")
    out: dict[str, float] = {}
    if cmp.n >= 2:
        for m in (cmp.champion, cmp.challenger):
            got = model_report(out_dir, m.role, ex.y, ex.weak_score, ex.strong_score, m.p_hard, frontier_share,
                               m.reference_deciles)
            out.update({f"{m.role}/{k}": float(v) for k, v in got.items()})
    return out


def promote(log: OutcomeLog, rules: LabelRules, fleet: Fleet | None, gate: Gate = Gate(), *,
            since_s: float | None = None, until_s: float | None = None, dry_run: bool = False) -> PromotionResult:
    """Compare ``@challenger`` with ``@champion`` (bundled if none) on held-out logged traffic and on
    the shipped sanity suite, log the comparison to MLflow, and move the aliases when the gate passes
    (not with ``dry_run``).

    Raises ``PromotionRefused`` when there is no challenger or it already is the champion;
    ``DataError`` when there is no held-out traffic. A refused gate is a result with
    ``promoted=False`` (the caller exits non-zero)."""
    from pointsman.training.compare import compare_models

    c = _client()
    challenger_v = alias_version(c, CHALLENGER_ALIAS)
    if challenger_v is None:
        raise PromotionRefused(f"no @{CHALLENGER_ALIAS} version of {REGISTERED_NAME}: train one with "
                               "`pointsman train --from-outcomes`")
    champion_v = alias_version(c, CHAMPION_ALIAS)
    if champion_v == challenger_v:
        raise PromotionRefused(f"version {challenger_v} is already @{CHAMPION_ALIAS}")
    champion, challenger = load_version(champion_v, intra_op_threads=2), load_version(challenger_v, intra_op_threads=2)
    cmp = compare_models(log, rules, fleet, champion, challenger, since_s=since_s, until_s=until_s)
    pairs = read_pairs(SHIPPED)
    sanity = concordance(champion, pairs), concordance(challenger, pairs)
    reasons, checks = evaluate_gate(cmp, gate, sanity)
    promoted = not reasons and not dry_run
    params = {"champion_version": champion_v or BUNDLED, "challenger_version": challenger_v,
              "champion_model": champion.version, "challenger_model": challenger.version,
              **{f"gate.{k}": v for k, v in asdict(gate).items()}, "dry_run": dry_run}
    metrics = {**{f"champion/{k}": v for k, v in cmp.champion.metrics.items()},
               **{f"challenger/{k}": v for k, v in cmp.challenger.metrics.items()},
               "apgr_delta": cmp.apgr_delta, "apgr_delta_ci90_low": cmp.apgr_delta_ci90[0],
               "apgr_delta_ci90_high": cmp.apgr_delta_ci90[1], "n": float(cmp.n),
               **{f"{role}/sanity_{k}": v for role, r in zip(("champion", "challenger"), sanity)
                  for k, v in (("concordance", r.concordance), ("ci95_low", r.ci95[0]), ("ci95_high", r.ci95[1]),
                               ("approvals_ok", float(r.approvals_ok)))}}
    verdict = "promoted" if promoted else ("passed (dry run)" if not reasons else "refused")
    run_id = _log_record("promotion", params, metrics,
                         {"pointsman.verdict": verdict, "pointsman.reasons": "; ".join(reasons or checks)[:5000]}, cmp)
    if promoted:
        _move_champion(c, challenger_v, champion_v, run_id)
    return PromotionResult(promoted, reasons, cmp, challenger_v if promoted else champion_v,
                           champion_v if promoted else None, run_id, checks, sanity)


def _move_champion(c: MlflowClient, new: str, old: str | None, run_id: str) -> None:
    """champion → ``new``; previous_champion → ``old`` (tag ``bundled`` when None); drop @challenger."""
    _move_previous(c, old)
    c.set_registered_model_alias(REGISTERED_NAME, CHAMPION_ALIAS, new)
    if alias_version(c, CHALLENGER_ALIAS) == new:
        c.delete_registered_model_alias(REGISTERED_NAME, CHALLENGER_ALIAS)
    c.set_model_version_tag(REGISTERED_NAME, new, "pointsman.promoted_by_run", run_id)


@dataclass
class RollbackResult:
    """The champion after the rollback (None = bundled) and the one it replaced."""

    champion_version: str | None
    replaced_version: str | None
    run_id: str


def rollback() -> RollbackResult:
    """Move ``champion`` back to the previous champion (the bundled model when that was the
    previous one); the replaced version becomes the new previous champion. Logged to MLflow.
    Raises ``PromotionRefused`` when no previous champion is recorded."""
    c = _client()
    try:
        tags = c.get_registered_model(REGISTERED_NAME).tags
    except Exception:  # noqa: BLE001
        raise ModelNotFoundError(f"no registered model {REGISTERED_NAME}: nothing to roll back") from None
    previous = tags.get(PREVIOUS_TAG)
    if not previous:
        raise PromotionRefused(f"no previous champion recorded for {REGISTERED_NAME}: nothing to roll back to")
    current = alias_version(c, CHAMPION_ALIAS)
    if previous == BUNDLED:
        if current is not None:
            c.delete_registered_model_alias(REGISTERED_NAME, CHAMPION_ALIAS)
    else:
        c.set_registered_model_alias(REGISTERED_NAME, CHAMPION_ALIAS, previous)
    _move_previous(c, current)
    run_id = _log_record("rollback", {"from_version": current or BUNDLED, "to_version": previous}, {},
                         {"pointsman.verdict": "rolled back"})
    return RollbackResult(None if previous == BUNDLED else previous, current, run_id)


def _move_previous(c: MlflowClient, version: str | None) -> None:
    """previous_champion → ``version`` (alias and tag; tag ``bundled`` and no alias when None)."""
    c.set_registered_model_tag(REGISTERED_NAME, PREVIOUS_TAG, version or BUNDLED)
    if version is None:
        try:
            c.delete_registered_model_alias(REGISTERED_NAME, PREVIOUS_ALIAS)
        except Exception:  # noqa: BLE001 - absent
            pass
    else:
        c.set_registered_model_alias(REGISTERED_NAME, PREVIOUS_ALIAS, version)
