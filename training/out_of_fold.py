"""Out-of-fold scores of one table (``OutOfFold``): what ``training.crossval.crossval_scores``
returns and ``training.draft_eval.evaluate_drafts`` reads (a record of its own, so the two import
it without importing each other).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class OutOfFold:
    """Out-of-fold scores of one table's labeled prompts, aligned arrays (n,): ``prompt_id``,
    ``fold`` (int64, 0..K-1, by conversation), ``score`` (the refitted ranker's logit, float64),
    ``p_hard`` (its Platt-calibrated probability, float64; NaN unless asked for), ``prompt_tokens``
    (float64), ``weak``/``strong`` (the scores of the evaluated pair, float64, NaN where empty);
    ``folds``: K; ``train_weak``/``train_strong``: the columns whose labels the refits learned;
    ``sanity_excluded``: the table's rows left out as requests of the sanity suites."""

    folds: int
    prompt_id: np.ndarray
    fold: np.ndarray
    score: np.ndarray
    p_hard: np.ndarray
    prompt_tokens: np.ndarray
    weak: np.ndarray
    strong: np.ndarray
    train_weak: tuple[str, ...]
    train_strong: tuple[str, ...]
    sanity_excluded: int


__all__ = ["OutOfFold"]
