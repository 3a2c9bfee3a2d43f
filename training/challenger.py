"""Training a challenger from logged outcomes (``pointsman train --from-outcomes``).

``train_challenger(log, rules, fleet, cfg, base) -> ChallengerResult``:

1. join the log's decisions and outcomes and label them (``training.logged_examples``,
   ``training.outcome_labels``);
2. take every row's head input in the feature space of ``base`` (by default the serving
   champion): the vector logged at decision time — no prompt text needed — or, for rows
   logged under another encoder, a re-embedding of the stored prompt text;
3. hold out ``1 / holdout_folds`` of the conversations (hash of the conversation key),
   never trained on, for ``compare``/``promote``; leave out the requests of the sanity suites
   (``training.sanity.suite_requests``), on which ``promote`` checks the challenger, from both
   training and the held-out metrics;
4. fit a new ``DifficultyHead`` on the rest (soft labels, Platt calibration on
   out-of-fold scores of the logged rows), warm-started (``cfg.warm_start``, the default) with the
   licensed chat rows the shipped recipe trains on, each weighing ``half / (n + half)`` of a
   logged row for n logged training rows (``training.warm_start``), but those of a held-out
   conversation (traffic that holds the prior's own prompts); export it to ONNX next to ``base``'s encoder (so the new model
   reads the same vectors), check scikit-learn/onnxruntime parity;
5. write a model directory whose manifest records the log, window, label rules and the
   holdout, the conversation keys it trained on (``TRAINED_CONVERSATIONS_FILE``), plus the reports
   (``training.reports``); log it to MLflow, register it and point the alias ``challenger`` at it
   (never ``champion``: ``promote`` does that).
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from pointsman.errors import DataError
from pointsman.estimator.feature_space import feature_space_of
from pointsman.outcome_log.store import OutcomeLog
from pointsman.training.compare import trained_on
from pointsman.training.encoder_build import encoder_in
from pointsman.training.logged_examples import head_matrix, holdout_mask, logged_examples
from pointsman.training.metrics import label_metrics
from pointsman.training.model_dir import (
    PROVENANCE_FILE,
    TRAINED_CONVERSATIONS_FILE,
    BaseModelRecord,
    HoldoutRecord,
    OutcomeLogTraining,
    WarmStartRecord,
    rounded,
    write_model_dir,
)
from pointsman.training.outcome_labels import LabelRules, StrongTier, rules_as_params
from pointsman.training.recipe import TrainConfig
from pointsman.training.sanity import suite_requests
from pointsman.training.warm_start import PRIOR_HALF_N, PriorRows, prior_rows, prior_weight

if TYPE_CHECKING:  # pragma: no cover
    from pointsman.estimator.difficulty import DifficultyEstimator
    from pointsman.estimator.head import DifficultyHead
    from pointsman.estimator.manifest import Manifest
    from pointsman.policy.fleet import Fleet
    from pointsman.training.registry import RunRecord

CHALLENGER_ALIAS = "challenger"


@dataclass
class ChallengerConfig:
    """Settings of one challenger training.

    Head: ``head`` (``logistic`` or ``mlp``), ``alpha`` (L2 penalty; logistic C = 1/alpha; the
    shipped recipe's: on the shared AlpacaEval table it beat 300 by 0.03 APGR cold from 400 logged
    rows and by 0.02-0.035 warm at every n, ``scripts/learning_curve.py --alpha``), ``scale`` (input scaling,
    ``DifficultyHead``'s),
    ``hidden``/``n_members``/``max_iter`` (MLP ensemble), ``calibration_folds`` (cross-fitting
    folds of the Platt calibration; 0 = none), ``label_clip`` (soft labels clipped to
    [clip, 1 - clip]). Data: ``since_s``/``until_s`` (decision time window, Unix s).
    Holdout: conversations in fold ``holdout_fold`` of ``holdout_folds`` (hash, ``seed``) are
    never trained on. ``min_examples``: fewer training rows is an error. ``frontier_share``:
    operating point of the reports (None: the logged share of decisions sent to the frontier).
    Warm start: ``warm_start`` adds the shipped recipe's licensed chat rows, each weighing
    ``prior_half_n / (n + prior_half_n)`` of a logged row (``training.warm_start``).
    """

    head: str = "logistic"
    alpha: float = TrainConfig.alpha
    scale: str = "blocks"
    hidden: int = 16
    n_members: int = 3
    max_iter: int = 300
    calibration_folds: int = 5
    label_clip: float = 0.02
    since_s: float | None = None
    until_s: float | None = None
    holdout_folds: int = 5
    holdout_fold: int = 0
    seed: int = 0
    min_examples: int = 30
    frontier_share: float | None = None
    warm_start: bool = True
    prior_half_n: float = PRIOR_HALF_N

    def __post_init__(self) -> None:
        if self.head not in ("logistic", "mlp"):
            raise ValueError(f"head must be 'logistic' or 'mlp', got {self.head!r}")
        if self.prior_half_n <= 0:
            raise ValueError(f"prior_half_n must be > 0, got {self.prior_half_n}")
        if self.holdout_folds < 2 or not 0 <= self.holdout_fold < self.holdout_folds:
            raise ValueError(f"holdout fold {self.holdout_fold} of {self.holdout_folds} folds is not valid")

    def params(self) -> dict[str, object]:
        """Flat parameters for MLflow."""
        return {f"challenger.{k}": v for k, v in asdict(self).items()}


@dataclass
class ChallengerResult:
    """What a run produced: the model directory (empty path when kept only in MLflow), its
    manifest, metrics, the MLflow ``RunRecord`` (or None) and the reports folder."""

    model_dir: Path
    manifest: Manifest
    metrics: dict[str, float]
    run: RunRecord | None
    reports: dict[str, float] = field(default_factory=dict)


def fit_head(X: np.ndarray, y: np.ndarray, groups: np.ndarray, n_embedding: int,
             cfg: ChallengerConfig, prior: PriorRows | None = None) -> DifficultyHead:
    """A fitted ``DifficultyHead`` on head inputs ``X`` float32 (n, d) and soft labels ``y`` (n,)
    (clipped to [label_clip, 1 - label_clip] for the ranker; the calibration fits ``y``).

    With ``prior`` (m rows, same feature space), the ranker also trains on ``prior.X`` against
    ``prior.y_rank``, each prior row weighing ``prior_weight(n, cfg.prior_half_n)`` (a logged row
    weighs 1); the calibration sees the logged rows only. Prior rows of the easy anchors
    (``training.examples.EASY_ANCHORS``) train the shipped recipe's gate, not the ranker. The logged rows come first, so
    ``head.oof_proba_[:n]`` are theirs. The one training step of ``train --from-outcomes`` and
    ``scripts/learning_curve.py``."""
    from pointsman.estimator.head import DifficultyHead
    from pointsman.training.examples import EASY_ANCHORS
    from pointsman.training.recipe import TrainConfig

    anchor = np.zeros(0, dtype=bool) if prior is None else np.asarray(prior.source == EASY_ANCHORS, dtype=bool)
    recipe = TrainConfig()  # the shipped recipe's gate, when the prior carries its easy anchors
    head = DifficultyHead(n_embedding=n_embedding, kind=cfg.head, hidden=cfg.hidden, alpha=cfg.alpha,
                          n_members=cfg.n_members, max_iter=cfg.max_iter, n_folds=cfg.calibration_folds,
                          random_state=cfg.seed, scale=cfg.scale,
                          gate_weight=recipe.gate_weight if anchor.any() else 0.0, gate_shift=recipe.gate_shift,
                          gate_alpha=recipe.gate_alpha)
    clipped = np.clip(y, cfg.label_clip, 1.0 - cfg.label_clip)
    if prior is None or len(prior) == 0:
        return head.fit(X, clipped, groups=groups, calibration_y=y)
    n, m = len(y), len(prior)
    weight = np.concatenate([np.ones(n), np.full(m, prior_weight(n, cfg.prior_half_n))])
    return head.fit(np.vstack([X, prior.X]), np.concatenate([clipped, prior.y_rank]), weight,
                    groups=np.concatenate([np.asarray(groups, dtype=object), prior.group]),
                    calibration_y=np.concatenate([y, prior.y]),
                    calibration_weight=np.concatenate([np.ones(n), np.zeros(m)]),
                    easy_anchor=np.concatenate([np.zeros(n, dtype=bool), anchor]))


def warm_start_record(cfg: ChallengerConfig, n_logged: int, prior: PriorRows | None,
                      skipped: str | None = None) -> WarmStartRecord:
    """What the manifest, the metrics and the log line say about the warm start of a head fitted
    on ``n_logged`` logged rows and ``prior`` (None: none)."""
    m = 0 if prior is None else len(prior)
    per_row = prior_weight(n_logged, cfg.prior_half_n) if m else 0.0
    return WarmStartRecord(enabled=cfg.warm_start, prior_rows=m, prior_sources={} if prior is None else prior.counts(),
                           prior_licenses={} if prior is None else dict(prior.licenses),
                           prior_weight_per_row=per_row, prior_weight_total=per_row * m, logged_rows=n_logged,
                           logged_weight_total=float(n_logged), half_n=cfg.prior_half_n, skipped=skipped)


def load_prior(cfg: ChallengerConfig, base: DifficultyEstimator,
               log_fn: Callable[[str], None] = print) -> tuple[PriorRows | None, str | None]:
    """``(prior rows in base's feature space, None)`` when ``cfg.warm_start``; ``(None, None)`` when
    off; ``(None, reason)`` when the licensed tables cannot be read (e.g. no shared datasets
    folder where the model is retrained): the challenger then trains on the logged rows alone,
    and a ``Warning:`` line says so."""
    if not cfg.warm_start:
        return None, None
    try:
        return prior_rows(base), None
    except DataError as exc:
        log_fn(f"Warning: warm start skipped, training on logged rows only ({exc}); "
               "pass --no-warm-start to train on logged rows on purpose")
        return None, str(exc)


def logged_frontier_share(log: OutcomeLog, strong: StrongTier, since_s: float | None = None,
                          until_s: float | None = None) -> float:
    """Share (0-1) of logged decisions in the window whose target is a strong-tier target (``strong.of`` the
    decision; 0.2 when the window is empty)."""
    hits = [d.target in strong.of(d) for d in log.joined(since_s=since_s, until_s=until_s)]
    return float(np.mean(hits)) if hits else 0.2


def train_challenger(
    log: OutcomeLog,
    rules: LabelRules,
    fleet: Fleet | None,
    cfg: ChallengerConfig,
    base: DifficultyEstimator,
    *,
    output: str | Path | None = None,
    use_mlflow: bool = True,
    register: bool = True,
    command: str = "pointsman train --from-outcomes",
    log_fn: Callable[[str], None] = print,
) -> ChallengerResult:
    """Train, export and (``use_mlflow``) log and register a challenger (see the module docstring).

    ``base``: the model whose encoder and feature space the challenger reuses (the serving
    champion). ``output``: model directory to write (None: a temporary one, kept only in
    MLflow). ``register``: create a registry version with alias ``challenger``.
    Raises ``DataError`` when the log has too few usable labeled decisions and
    ``EstimatorError`` when the exported head disagrees with scikit-learn.
    """
    from pointsman.training.provenance import challenger_provenance_markdown
    from pointsman.training.reports import deciles, model_report

    t0 = time.perf_counter()
    ex = logged_examples(log, rules, fleet, since_s=cfg.since_s, until_s=cfg.until_s)
    hm = head_matrix(ex, base)
    log_fn(f"outcome log {log.path}: {len(ex)} labeled decisions ({ex.signal_counts()}); "
           f"{hm.from_log} logged head inputs, {hm.reembedded} re-embedded from stored prompts, "
           f"{hm.unusable} unusable (no head input in this model's feature space: another encoder, or "
           f"the estimate failed or timed out; and no stored prompt text); skipped {ex.skipped}")
    if ex.by_today_fleet:
        log_fn(f"{ex.by_today_fleet} labeled decisions by today's fleet's frontier targets: their fleet revision is "
               "not kept in the log (written before it kept them)")
    rows = ex.subset(hm.rows)
    hold = holdout_mask(rows.group, cfg.holdout_folds, cfg.holdout_fold, cfg.seed)
    suite = suite_requests(rows.group)  # promote's own check: never learned, nor scored as held-out traffic
    train_m, hold = ~hold & ~suite, hold & ~suite
    if suite.any():
        log_fn(f"{int(suite.sum())} logged decisions are requests of the sanity suites: neither trained on nor scored")
    if train_m.sum() < cfg.min_examples:
        raise DataError(f"{log.path}: {int(train_m.sum())} usable labeled decisions to train on, fewer than "
                        f"min_examples={cfg.min_examples} (labeled {len(ex)}, unusable {hm.unusable})")
    X, y = hm.X, rows.y
    n_emb = base.manifest.encoder.dim
    prior, skipped = load_prior(cfg, base, log_fn)
    if prior is not None:  # the prior's own prompts logged here (MT-bench run through the service): as evaluate --folds
        scored = np.isin(prior.group, rows.group[hold])
        if scored.any():
            log_fn(f"{int(scored.sum())} prior rows are conversations held out of this log: left out of the warm start")
            prior = prior.subset(~scored)
    n_train = int(train_m.sum())
    warm = warm_start_record(cfg, n_train, prior, skipped)
    if prior is not None:
        log_fn(f"warm start: {warm['prior_rows']} prior rows of the shipped recipe ({warm['prior_sources']}), "
               f"{warm['prior_weight_per_row']:.4f} each (total {warm['prior_weight_total']:.1f}) beside "
               f"{n_train} logged rows at 1 each (prior weight {cfg.prior_half_n:g} / ({n_train} + "
               f"{cfg.prior_half_n:g})); calibration on the logged rows")
    elif not cfg.warm_start:
        log_fn(f"warm start off (--no-warm-start): {n_train} logged rows only")
    head = fit_head(X[train_m], y[train_m], rows.group[train_m], n_emb, cfg, prior)
    p_train = head.predict_proba(X[train_m])[:, 1]
    p_hold = head.predict_proba(X[hold])[:, 1] if hold.any() else np.zeros(0)

    metrics: dict[str, float] = {"data/n_labeled": float(len(ex)), "data/n_train": float(train_m.sum()),
                                 "data/n_holdout": float(hold.sum()), "data/from_log": float(hm.from_log),
                                 "data/reembedded": float(hm.reembedded), "data/unusable": float(hm.unusable),
                                 "data/sanity_excluded": float(suite.sum()),
                                 "data/prior_rows": float(warm["prior_rows"]),
                                 "data/prior_weight_per_row": warm["prior_weight_per_row"],
                                 "data/prior_weight_total": warm["prior_weight_total"],
                                 "data/logged_weight_total": warm["logged_weight_total"],
                                 "train/calibration_slope": head.calibration_slope_,
                                 "train/calibration_intercept": head.calibration_intercept_}
    if cfg.calibration_folds and cfg.calibration_folds >= 2:
        oof = head.calibrate(head.oof_proba_[:n_train])
        for k, v in label_metrics(y[train_m], rows.weak_score[train_m], rows.strong_score[train_m], oof).items():
            metrics[f"cv/{k}"] = v
    if hold.any():
        for k, v in label_metrics(y[hold], rows.weak_score[hold], rows.strong_score[hold], p_hold).items():
            metrics[f"heldout/{k}"] = v
    # the base may be a champion trained on this log with another holdout: score it only where it did not
    base_held = hold & ~trained_on(base, rows, log)
    if base_held.any():
        p_base = base.predict_matrix(X[base_held]).astype(np.float64)
        for k, v in label_metrics(y[base_held], rows.weak_score[base_held], rows.strong_score[base_held],
                                  p_base).items():
            metrics[f"heldout_base/{k}"] = v

    trained_keys = sorted(set(rows.group[train_m].astype(str)))
    trained_text = "".join(f"{k}\n" for k in trained_keys)
    share = cfg.frontier_share if cfg.frontier_share is not None else logged_frontier_share(
        log, rules.strong_tier(fleet, log.fleet_kinds()), cfg.since_s, cfg.until_s)
    window = f"[{_iso(cfg.since_s)}, {_iso(cfg.until_s)})"
    training = OutcomeLogTraining(
        source="outcome-log",
        outcome_log=str(log.path),
        window=window,
        since_s=cfg.since_s,
        until_s=cfg.until_s,
        data_until_s=float(rows.time_s[train_m].max()),
        n_labeled=len(ex),
        n_train=int(train_m.sum()),
        n_holdout=int(hold.sum()),
        label_signals=rows.subset(train_m).signal_counts(),
        label_rules=rules.model_dump(),
        holdout=HoldoutRecord(n_folds=cfg.holdout_folds, fold=cfg.holdout_fold, seed=cfg.seed, key="conversation_key"),
        config=asdict(cfg),
        feature_space=feature_space_of(base),
        base_model=BaseModelRecord(version=base.version, source=base.source),
        p_hard_deciles=deciles(p_train),
        frontier_share=share,
        command=command,
        warm_start=warm,
        trained_conversations={"file": TRAINED_CONVERSATIONS_FILE, "n": len(trained_keys),
                               "sha256": hashlib.sha256(trained_text.encode()).hexdigest()},
    )

    work = Path(tempfile.mkdtemp(prefix="pointsman-challenger-"))
    model_dir = work / "model" if output is None else Path(output)
    rng = np.random.default_rng(cfg.seed)
    sample = np.sort(rng.choice(len(X), size=min(256, len(X)), replace=False))
    manifest = write_model_dir(model_dir, encoder_in(base.model_dir, base.manifest.encoder), head, X[sample],
                               training, metrics, base.blocks, base.manifest.head.pooling)
    (model_dir / TRAINED_CONVERSATIONS_FILE).write_text(trained_text, encoding="utf-8")
    (model_dir / PROVENANCE_FILE).write_text(challenger_provenance_markdown(manifest, training), encoding="utf-8")

    reports_dir = work / "reports"
    reports: dict[str, float] = {}
    if hold.sum() >= 2:
        reports = model_report(reports_dir, "challenger", y[hold], rows.weak_score[hold], rows.strong_score[hold],
                               p_hold.astype(np.float64), share, training["p_hard_deciles"])
        metrics.update({f"heldout/{k}": float(v) for k, v in reports.items()})
    metrics["train/seconds"] = time.perf_counter() - t0
    manifest.metrics = rounded(metrics)
    manifest.write(model_dir)

    run = None
    if use_mlflow:
        from pointsman.estimator.registry import client
        from pointsman.training.registry import log_training_run

        params = {**cfg.params(), **rules_as_params(rules), "outcome_log": str(log.path),
                  "base_model": base.version, "feature_space": training["feature_space"]}
        run = log_training_run(model_dir, params, metrics, register=register,
                               alias=CHALLENGER_ALIAS if register else None,
                               tags={"pointsman.version": manifest.version, "pointsman.source": "outcome-log",
                                     "pointsman.base_model": base.version})
        if reports_dir.is_dir():
            client().log_artifacts(run.run_id, str(reports_dir), artifact_path="reports")
        log_fn(f"mlflow: {run.describe()}")
    if output is not None and reports_dir.is_dir():
        shutil.copytree(reports_dir, model_dir / "reports", dirs_exist_ok=True)
    if output is None and not use_mlflow:
        log_fn(f"model directory (temporary, not logged anywhere): {model_dir}")
    else:
        shutil.rmtree(work, ignore_errors=True)
        if output is None:
            model_dir = Path("")
    base_text = f"base {metrics.get('heldout_base/apgr', float('nan')):.4f}"
    if base_held.sum() < hold.sum():  # the same rows for both, else the numbers do not compare
        both = label_metrics(y[base_held], rows.weak_score[base_held], rows.strong_score[base_held],
                             p_hold[base_held[hold]])["apgr"] if base_held.any() else float("nan")
        base_text += (f" against {both:.4f} on the {int(base_held.sum())} of them the base did not train on")
    log_fn(f"challenger {manifest.version}: held-out APGR {metrics.get('heldout/apgr', float('nan')):.4f} "
           f"({base_text}), ECE {metrics.get('heldout/ece', float('nan')):.4f}"
           f" on {int(hold.sum())} held-out decisions; {metrics['train/seconds']:.1f} s")
    return ChallengerResult(model_dir=model_dir, manifest=manifest, metrics=metrics, run=run, reports=reports)


def _iso(t: float | None) -> str:
    return "..." if t is None else datetime.fromtimestamp(t, UTC).isoformat(timespec="seconds")


__all__ = ["CHALLENGER_ALIAS", "ChallengerConfig", "ChallengerResult", "fit_head", "load_prior",
           "logged_frontier_share", "train_challenger", "warm_start_record"]
