"""Labels for the difficulty head from outcome tables.

``p_hard`` is the probability that the cheaper model's answer is worse than the
frontier model's (RouteLLM's "strong win", Ong et al. 2024). One weak/strong
pair on one prompt gives a noisy 0/1 label; averaging over several weak and
strong models of the same tiers gives a soft label in [0, 1] that says how
reliably the cheaper tier falls short on that prompt.
"""

from __future__ import annotations

import numpy as np


def pairwise_worse_share(weak: np.ndarray, strong: np.ndarray, margin: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Share of (weak, strong) model pairs in which the weak model scored worse.

    ``weak``: float array (n, k_weak) of scores, NaN where missing; ``strong``:
    (n, k_strong). A pair counts as "weak worse" when ``strong - weak > margin``
    (same score units: 0/1 correctness, 1–10 judge rating, 0–1 win score).
    Returns ``(y, n_pairs)``: float64 (n,) soft labels in [0, 1] (NaN where a row
    has no pair with both scores) and int64 (n,) pair counts.
    """
    diff, valid = _pair_diffs(weak, strong)
    return _pair_mean((diff > margin) & valid, valid)


def _pair_diffs(weak: np.ndarray, strong: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``strong - weak`` for every (weak, strong) model pair per row: float64
    (n, k_weak, k_strong) with 0 where either score is missing, and the bool mask of
    pairs with both scores. Raises ``ValueError`` when the row counts differ."""
    weak = np.asarray(weak, dtype=np.float64)
    strong = np.asarray(strong, dtype=np.float64)
    if weak.ndim == 1:
        weak = weak[:, None]
    if strong.ndim == 1:
        strong = strong[:, None]
    if weak.shape[0] != strong.shape[0]:
        raise ValueError(f"weak has {weak.shape[0]} rows, strong has {strong.shape[0]}")
    diff = strong[:, None, :] - weak[:, :, None]
    valid = ~np.isnan(diff)
    return np.where(valid, diff, 0.0), valid


def _pair_mean(values: np.ndarray, valid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the mean of ``values`` over valid pairs (NaN without any) and the pair count."""
    n_pairs = valid.sum(axis=(1, 2))
    with np.errstate(invalid="ignore", divide="ignore"):
        y = values.sum(axis=(1, 2)) / n_pairs
    return np.where(n_pairs > 0, y, np.nan), n_pairs.astype(np.int64)


def pairwise_gap_share(weak: np.ndarray, strong: np.ndarray, scale: float) -> tuple[np.ndarray, np.ndarray]:
    """Mean positive score gap ``clip((strong - weak) / scale, 0, 1)`` over (weak, strong) pairs.

    A graded alternative to ``pairwise_worse_share`` for judge ratings: a 1→9 loss
    counts more than a 8→9 one, which is what APGR weighs (each prompt contributes
    its gap). ``scale``: the score range (9 for 1–10 ratings, 1 for 0/1 or 0–1 scores;
    with 0/1 scores both functions agree). Returns ``(y, n_pairs)`` like
    ``pairwise_worse_share``.
    """
    diff, valid = _pair_diffs(weak, strong)
    return _pair_mean(np.clip(diff / scale, 0.0, 1.0), valid)
