"""K-fold cross-validation of a model's recipe on one outcome table (``pointsman evaluate --folds K``).

``crossval_table(estimator, path, weak, strong, folds) -> CrossValReport``: the head of the
model's recipe (``manifest.training.recipe``, the defaults of ``TrainConfig`` otherwise) is
refitted K times on the model's own feature space (its encoder and request features), each time
on the prompts outside one fold (folds by conversation, ``datasets.splits.group_key``), and scores
the prompts of that fold. The table's rows that are requests of the sanity suites
(``training.sanity.suite_requests``) are neither refitted on nor scored, as ``train`` leaves them out
(counted: ``sanity_excluded``). The out-of-fold scores are ranked for the ``weak``/``strong`` pair like
``evaluate_table``'s: pooled router metrics, the APGR of each fold (mean, standard deviation,
range), and the baselines on the same rows (random, prompt length, oracle).

Labels: when the model was trained on this same table (``pointsman train --table``), the
training columns it used (possibly several weak and strong models, and its label panel); else
``weak`` vs ``strong`` with the table's other columns as the panel. A recipe with a label panel
(``panel_weight``) mixes the panel's outcomes into the labels of the training folds' rows only;
a recipe with a warm start (``warm_start``) trains every refit on those licensed sources' rows
too (never on this table's rows outside the fold), weighed as in training (``rank_weights``); a recipe
with the easy anchors and a gate (``easy_anchors``, ``gate_weight`` > 0) trains every refit's gate on
the anchors as ``train`` does (``anchored_rank_targets``, ``calibration_weights``), so the scores are
those of the head ``train`` writes.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from pointsman.datasets.outcome_tables import read_outcome_table
from pointsman.datasets.splits import assign_folds
from pointsman.errors import DataError
from pointsman.training.examples import build_examples
from pointsman.training.metrics import RouterReport, apgr, router_report
from pointsman.training.out_of_fold import OutOfFold
from pointsman.training.recipe import TrainConfig
from pointsman.training.sanity import suite_requests
from pointsman.training.table_source import table_source

if TYPE_CHECKING:  # pragma: no cover
    from pointsman.estimator.difficulty import DifficultyEstimator

#: Recipe keys a refitted head takes from the model's manifest.
_HEAD_KEYS = ("label", "label_offsets", "label_clip", "head", "hidden", "alpha", "n_members", "max_iter", "seed", "scale",
              "panel_weight", "warm_start_share", "easy_anchors", "gate_weight", "gate_shift", "gate_alpha")


class CrossValReport(RouterReport):
    """``crossval_table``'s answer: pooled out-of-fold router metrics, then per-fold APGR and baselines."""

    folds: int
    fold_apgr: list[float]
    folds_undefined: int
    sanity_excluded: int
    apgr_mean: float
    apgr_sd: float
    length_apgr: float
    train_weak: list[str]
    train_strong: list[str]
    table: str
    weak: str
    strong: str
    model_version: str


def recipe_of(est: DifficultyEstimator) -> TrainConfig:
    """The head recipe a model was trained with (``TrainConfig``; defaults for keys it lacks, except
    ``easy_anchors``: a recipe that does not name them was trained without them)."""
    recipe = est.manifest.training.get("recipe")
    cfg = TrainConfig()
    if isinstance(recipe, dict):
        cfg.easy_anchors = False
        for key in _HEAD_KEYS:
            value = recipe.get(key)
            if value is not None and isinstance(value, type(getattr(cfg, key))):
                setattr(cfg, key, value)
            elif isinstance(value, int) and isinstance(getattr(cfg, key), float):
                setattr(cfg, key, float(value))
        warm = recipe.get("warm_start")
        if isinstance(warm, str):
            cfg.warm_start = tuple(n for n in warm.split(",") if n)
    return cfg


def training_columns(est: DifficultyEstimator, path: Path, weak: str, strong: str
                     ) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...] | None]:
    """The weak, strong and panel columns the model trained on when it trained on ``path``, else
    ``(weak,), (strong,), None`` (None: the table's columns other than ``strong``)."""
    sources = est.manifest.training.get("sources")
    if isinstance(sources, list):
        for s in sources:
            if isinstance(s, dict) and Path(str(s.get("table", ""))).resolve() == path.resolve():
                w, st, panel = s.get("weak_models"), s.get("strong_models"), s.get("panel_models")
                if isinstance(w, list) and isinstance(st, list) and w and st:
                    return (tuple(map(str, w)), tuple(map(str, st)),
                            tuple(map(str, panel)) if isinstance(panel, list) else None)
    return (weak,), (strong,), None


def trained_on_table(est: DifficultyEstimator, path: str | Path) -> bool:
    """Whether ``est`` trained on the table at ``path``: a source of its manifest names that file (a
    relative name, as the shipped recipe's, inside the shared datasets folder). Its APGR there is in sample."""
    from pointsman.datasets.sources import shared_datasets_dir

    target = Path(path).resolve()
    sources = est.manifest.training.get("sources")
    for s in sources if isinstance(sources, list) else []:
        named = Path(str(s.get("table", ""))) if isinstance(s, dict) and s.get("table") else None
        if named is None:
            continue
        if not named.is_absolute():
            try:
                named = shared_datasets_dir() / named
            except DataError:
                continue
        if named.resolve() == target:
            return True
    return False


def crossval_scores(est: DifficultyEstimator, path: str | Path, weak: str, strong: str, folds: int = 5,
                    calibrated: bool = False) -> OutOfFold:
    """The out-of-fold scores of K-fold cross-validation of ``est``'s recipe on the table at ``path``
    (see the module). ``calibrated``: also each refit's Platt-calibrated ``p_hard`` (its own
    cross-fitting on the training folds, ``cfg.n_folds`` inner folds; what the served model's
    ``p_hard`` would be), at about ``cfg.n_folds + 1`` times the cost.

    Raises ``DataError`` for an unreadable table, unknown columns, ``folds < 2``, or a fold whose
    training part has a single class."""
    from pointsman.datasets.sources import default_training_sources
    from pointsman.estimator.head import DifficultyHead
    from pointsman.training.examples import anchor_examples
    from pointsman.training.train import anchored_rank_targets, calibration_weights

    if folds < 2:
        raise DataError(f"--folds must be at least 2, got {folds}")
    path = Path(path)
    table = read_outcome_table(path)
    w_all, s_all = table.scores(weak), table.scores(strong)
    train_weak, train_strong, panel = training_columns(est, path, weak, strong)
    source = table_source(path, train_weak, train_strong, panel=panel)
    cfg = recipe_of(est)
    warm = [n for n in cfg.warm_start if n != source.name]
    ex_all = build_examples([source, *(default_training_sources(warm) if warm else [])], tokenizer=est.tokenizer,
                            seed=0)
    suite = suite_requests(ex_all.group)  # as train leaves them out: neither refitted on nor scored
    sanity_excluded = int((suite & (ex_all.source == source.name)).sum())
    ex_all = ex_all.subset(~suite)
    own = ex_all.source == source.name
    ex = ex_all.subset(own)
    if len(ex) < folds:
        raise DataError(f"{path}: {len(ex)} labeled prompts, fewer than --folds {folds}")
    row_of = {pid: i for i, pid in enumerate(table.prompt_ids)}
    rows = np.asarray([row_of[str(p)] for p in ex.prompt_id])
    X_all = est.feature_matrix(ex_all.features)
    X = X_all[own]
    fold = assign_folds([str(g) for g in ex.group], folds, seed=cfg.seed)
    fold_all = np.full(len(ex_all), -1)
    fold_all[own] = fold
    scores = np.full(len(ex), np.nan)
    p_hard = np.full(len(ex), np.nan)
    inner = cfg.n_folds if calibrated and cfg.n_folds >= 2 else 0
    anchors = anchor_examples(est.tokenizer) if cfg.easy_anchors and cfg.gate_weight > 0 else None
    X_anchors = est.feature_matrix(anchors.features) if anchors is not None else None
    for f in range(folds):
        test = fold == f
        if not test.any():
            continue
        # this table's other folds and every warm-start row, but none of a conversation in the test fold
        train_rows = (fold_all != f) & ~np.isin(ex_all.group, ex.group[test])
        head = DifficultyHead(n_embedding=est.manifest.encoder.dim, kind=cfg.head, hidden=cfg.hidden, alpha=cfg.alpha,
                              n_members=cfg.n_members, max_iter=cfg.max_iter, n_folds=inner, random_state=cfg.seed,
                              scale=cfg.scale, gate_weight=cfg.gate_weight, gate_shift=cfg.gate_shift,
                              gate_alpha=cfg.gate_alpha)
        fit_ex = ex_all.subset(train_rows)  # labels (and their per-source centering) from the training rows only
        X_fit = X_all[train_rows]
        if anchors is not None and X_anchors is not None:
            keep = ~np.isin(anchors.group, ex.group[test])
            fit_ex, X_fit = fit_ex.concat(anchors.subset(keep)), np.vstack([X_fit, X_anchors[keep]])
        y_rank, w_rank, anchor = anchored_rank_targets(fit_ex, cfg)
        try:
            head.fit(X_fit, y_rank, w_rank, groups=fit_ex.group, calibration_y=fit_ex.y,
                     calibration_weight=calibration_weights(fit_ex, cfg, [source]), easy_anchor=anchor)
        except ValueError as exc:
            raise DataError(f"{path}: fold {f}: {exc}") from None
        scores[test] = head.ranker_score(X[test])
        if inner:
            p_hard[test] = head.predict_proba(X[test])[:, 1]
    return OutOfFold(folds=folds, prompt_id=np.asarray(ex.prompt_id, dtype=object), fold=fold, score=scores, p_hard=p_hard,
                     prompt_tokens=np.asarray([float(feat.prompt_tokens) for feat in ex.features]),
                     weak=w_all[rows], strong=s_all[rows], train_weak=train_weak, train_strong=train_strong,
                     sanity_excluded=sanity_excluded)


def crossval_report(est: DifficultyEstimator, path: str | Path, weak: str, strong: str, oof: OutOfFold
                    ) -> CrossValReport:
    """The router metrics of out-of-fold scores ``oof`` (``crossval_scores``): pooled, per fold, and
    the baselines on the same rows (random, prompt length, oracle)."""
    w, s, scores, fold, folds = oof.weak, oof.strong, oof.score, oof.fold, oof.folds
    report = router_report(w, s, scores)
    per_fold: list[float] = []
    undefined = 0  # folds where the strong model is not better on the fold's rows: APGR undefined, said
    for f in range(folds):
        m = (fold == f) & ~np.isnan(w) & ~np.isnan(s)
        try:
            per_fold.append(apgr(w[m], s[m], scores[m]))
        except ValueError:
            undefined += 1
    return CrossValReport(
        **report,
        folds=folds,
        fold_apgr=[round(a, 6) for a in per_fold],
        folds_undefined=undefined,
        sanity_excluded=oof.sanity_excluded,
        apgr_mean=float(np.mean(per_fold)) if per_fold else float("nan"),
        apgr_sd=float(np.std(per_fold, ddof=1)) if len(per_fold) > 1 else float("nan"),
        length_apgr=apgr(w, s, oof.prompt_tokens),
        train_weak=list(oof.train_weak),
        train_strong=list(oof.train_strong),
        table=str(path),
        weak=weak,
        strong=strong,
        model_version=est.version,
    )


def crossval_table(est: DifficultyEstimator, path: str | Path, weak: str, strong: str, folds: int = 5) -> CrossValReport:
    """K-fold cross-validation of ``est``'s recipe on the table at ``path`` (see the module):
    ``crossval_report`` of ``crossval_scores``. Raises ``DataError`` like ``crossval_scores``."""
    return crossval_report(est, path, weak, strong, crossval_scores(est, path, weak, strong, folds))


__all__ = ["CrossValReport", "OutOfFold", "crossval_report", "crossval_scores", "crossval_table", "recipe_of",
           "trained_on_table", "training_columns"]
