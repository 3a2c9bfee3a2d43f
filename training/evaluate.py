"""Evaluating a difficulty model on a wide outcome table (``pointsman evaluate``).

``evaluate_table(estimator, path, weak, strong) -> dict``: scores every prompt of
the table with the estimator and returns RouteLLM's router metrics for the
weak/strong model pair (``training.metrics.router_report``) next to the random
router and the oracle on the same rows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from pointsman.datasets.outcome_tables import read_outcome_table
from pointsman.errors import DataError, RequestError
from pointsman.training.examples import features_for_messages
from pointsman.training.metrics import router_report


def evaluate_table(estimator: Any, path: str | Path, weak: str, strong: str) -> dict[str, Any]:
    """Score ``path`` (gzip or plain CSV wide table) and compare ``weak`` vs ``strong`` columns.

    Returns ``apgr, cpt50, cpt80, auc, random_apgr, oracle_apgr, n`` (rows with both
    scores and a valid prompt), plus ``n_rows``, ``n_skipped`` (empty/invalid prompts or
    missing scores), ``weak``, ``strong``, ``table``, ``model_version``, ``model_source``.
    Raises ``DataError`` for an unreadable table, unknown columns (with did-you-mean),
    or when no row is usable.
    """
    table = read_outcome_table(path)
    w = table.scores(weak)
    s = table.scores(strong)
    feats, rows = [], []
    for i, messages in enumerate(table.messages):
        try:
            feats.append(features_for_messages(messages, estimator.tokenizer))
            rows.append(i)
        except RequestError:
            continue
    scores = np.full(len(table), np.nan)
    if feats:
        scores[np.asarray(rows)] = estimator.estimate_batch(feats)
    usable = ~(np.isnan(w) | np.isnan(s) | np.isnan(scores))
    if not usable.any():
        raise DataError(f"{path}: no row has a prompt and scores for both {weak!r} and {strong!r}")
    try:
        report: dict[str, Any] = router_report(w, s, scores)
    except ValueError as exc:
        raise DataError(f"{path}: {exc}") from None
    report.update(
        n_rows=len(table),
        n_skipped=int(len(table) - usable.sum()),
        weak=weak,
        strong=strong,
        table=str(path),
        model_version=getattr(estimator, "version", None),
        model_source=getattr(estimator, "source", None),
    )
    return report
