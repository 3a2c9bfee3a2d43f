"""Warm start of a challenger: the licensed chat rows the shipped recipe trains on, as prior rows
beside the logged ones, weighing less as logged outcomes accumulate.

With few logged outcomes a head fitted on them alone ranks worse than the shipped model it
replaces: on the shared AlpacaEval table, 50 logged prompts give held-out APGR 0.54 against the
shipped model's 0.65 on the same prompts, warm-started 0.65 (``scripts/learning_curve.py``,
``docs/retraining.md``). ``prior_rows(base)`` builds the
rows of the shipped recipe (``training.recipe.TrainConfig`` defaults: its Apache-2.0 chat
sources through ``datasets.sources.default_training_sources``, which refuses non-commercial
data such as AlpacaEval; its labels through ``training.train.ranking_labels``; its easy anchors,
which train the challenger's gate) in the feature
space of ``base`` (``DifficultyEstimator.feature_matrix``, the serving code path), and
``prior_weight(n, half)`` weighs each of them against a logged row's weight of 1::

    prior_weight(n) = half / (n + half)        # n: logged rows the head trains on

so the prior counts fully with no logged outcome, half at ``n = half`` (default
``PRIOR_HALF_N = 200``), and its total weight ``m * half / (n + half)`` (m prior rows) falls
below the logged rows' ``n`` as the log grows. The shrinkage is the usual one of a prior
worth ``half`` observations; on AlpacaEval, ``half`` of 200 and 800 gave APGR within 0.002 of
each other at every ``n`` from 50 to 482 and 50 gave 0.005-0.009 less (5 seeds), so it is a
constant, not a command-line knob.

The prior rows shape the ranking only: the Platt calibration of the challenger is fitted on
the logged rows alone (``calibration_weight`` 0 for prior rows), so ``p_hard`` keeps the
operator's label's meaning.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from pointsman.estimator.difficulty import DifficultyEstimator
    from pointsman.training.recipe import TrainConfig

#: Logged rows at which a prior row weighs half a logged row (``prior_weight``).
PRIOR_HALF_N = 200.0


def prior_weight(n_logged: int, half: float = PRIOR_HALF_N) -> float:
    """Weight of one prior row next to a logged row's 1: ``half / (n_logged + half)``, in (0, 1].
    Raises ``ValueError`` for ``half <= 0`` or ``n_logged < 0``."""
    if half <= 0 or n_logged < 0:
        raise ValueError(f"prior_weight needs half > 0 and n_logged >= 0, got half={half}, n_logged={n_logged}")
    return float(half / (n_logged + half))


@dataclass
class PriorRows:
    """The shipped recipe's training rows in one model's feature space, aligned arrays of length m.

    ``X`` float32 (m, d): head inputs; ``y_rank`` (m,): the recipe's ranking target
    (``training.train.ranking_labels``: graded gap share, clipped, centered per source);
    ``y`` (m,): the pairwise "weak worse" share; ``group``: leakage-safe keys
    (``datasets.splits.group_key``); ``source``: source name per row; ``licenses``: per source.
    """

    X: np.ndarray
    y_rank: np.ndarray
    y: np.ndarray
    group: np.ndarray
    source: np.ndarray
    licenses: dict[str, str]

    def __len__(self) -> int:
        return len(self.y)

    def subset(self, keep: np.ndarray) -> PriorRows:
        """The rows where ``keep`` (bool, (m,)) is true."""
        return PriorRows(X=self.X[keep], y_rank=self.y_rank[keep], y=self.y[keep], group=self.group[keep],
                         source=self.source[keep], licenses=self.licenses)

    def counts(self) -> dict[str, int]:
        """Rows per source."""
        names, n = np.unique(self.source.astype(str), return_counts=True)
        return {str(k): int(v) for k, v in zip(names, n)}


def prior_rows(base: DifficultyEstimator, recipe: TrainConfig | None = None,
               root: str | Path | None = None) -> PriorRows:
    """The rows ``recipe`` (default: the shipped one, ``TrainConfig()``) trains on, as head inputs
    of ``base``. ``root``: the shared datasets folder (default ``datasets.sources.shared_datasets_dir``).
    Raises ``DataError`` when the tables are missing or a source is not Apache-2.0/MIT."""
    from pointsman.datasets.sources import default_training_sources
    from pointsman.training.examples import anchor_examples, build_examples
    from pointsman.training.recipe import TrainConfig
    from pointsman.training.train import ranking_labels

    cfg = recipe or TrainConfig()
    ex = build_examples(default_training_sources(cfg.sources), root, tokenizer=base.tokenizer,
                        max_rows_per_source=cfg.max_rows_per_source, seed=cfg.seed)
    y_rank = ranking_labels(ex, cfg)
    if cfg.easy_anchors:  # the gate's rows: their ranking target is never read (the ranker skips them)
        anchors = anchor_examples(base.tokenizer, root)
        ex, y_rank = ex.concat(anchors), np.concatenate([y_rank, np.zeros(len(anchors))])
    return PriorRows(X=np.asarray(base.feature_matrix(ex.features), dtype=np.float32),
                     y_rank=y_rank, y=ex.y.astype(np.float64), group=ex.group.astype(object),
                     source=ex.source, licenses=dict(ex.licenses))


__all__ = ["PRIOR_HALF_N", "PriorRows", "prior_rows", "prior_weight"]
