"""Evaluating a difficulty model on a wide outcome table (``pointsman evaluate``).

``evaluate_table(estimator, path, weak, strong) -> TableReport``: scores every prompt of
the table with the estimator and returns RouteLLM's router metrics for the
weak/strong model pair (``training.metrics.router_report``) next to the random
router and the oracle on the same rows.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

from pointsman.datasets.outcome_tables import read_outcome_table
from pointsman.datasets.splits import group_key
from pointsman.errors import DataError, RequestError
from pointsman.estimator.features import RequestFeatures
from pointsman.training.examples import features_for_messages
from pointsman.training.metrics import RouterReport, router_report
from pointsman.training.sanity import suite_conversation_keys

if TYPE_CHECKING:  # pragma: no cover
    from tokenizers import Tokenizer


class TableScorer(Protocol):
    """What ``evaluate_table`` needs of a model (``estimator.difficulty.DifficultyEstimator``):
    its name and origin, the tokenizer prompt tokens are counted with, and batch scoring."""

    @property
    def version(self) -> str:
        """The model's content version."""
        ...

    @property
    def source(self) -> str:
        """Where the model was loaded from."""
        ...

    @property
    def tokenizer(self) -> Tokenizer | None:
        """The tokenizer of the model's encoder."""
        ...

    def estimate_batch(self, features: list[RequestFeatures]) -> np.ndarray:
        """``p_hard`` for many requests: (n,)."""
        ...


class TableReport(RouterReport):
    """``evaluate_table``'s answer: the router metrics, then the table, the pair and the model."""

    n_rows: int
    n_skipped: int
    sanity_excluded: int
    length_apgr: float
    weak: str
    strong: str
    table: str
    model_version: str
    model_source: str


def evaluate_table(estimator: TableScorer, path: str | Path, weak: str, strong: str) -> TableReport:
    """Score ``path`` (gzip or plain CSV wide table) and compare ``weak`` vs ``strong`` columns.

    Returns ``apgr, cpt50, cpt80, auc, random_apgr, oracle_apgr, n`` (rows with both
    scores and a valid prompt), plus ``n_rows``, ``n_skipped`` (empty/invalid prompts or
    missing scores), ``sanity_excluded`` (rows that are requests of the sanity suites, never scored
    as table rows: ``training.sanity.suite_requests``), ``length_apgr`` (the prompt-length router on the same rows), ``weak``,
    ``strong``, ``table``, ``model_version``, ``model_source``.
    Raises ``DataError`` for an unreadable table, unknown columns (with did-you-mean),
    or when no row is usable.
    """
    table = read_outcome_table(path)
    w = table.scores(weak)
    s = table.scores(strong)
    feats: list[RequestFeatures] = []
    rows: list[int] = []
    suite = suite_conversation_keys()
    sanity_excluded = 0
    for i, messages in enumerate(table.messages):
        if group_key(messages) in suite:
            sanity_excluded += 1
            continue
        try:
            feats.append(features_for_messages(messages, estimator.tokenizer))
            rows.append(i)
        except RequestError:
            continue
    scores = np.full(len(table), np.nan)
    lengths = np.full(len(table), np.nan)
    if feats:
        scores[np.asarray(rows)] = estimator.estimate_batch(feats)
        lengths[np.asarray(rows)] = [float(f.prompt_tokens) for f in feats]
    usable = ~(np.isnan(w) | np.isnan(s) | np.isnan(scores))
    if not usable.any():
        raise DataError(f"{path}: no row has a prompt and scores for both {weak!r} and {strong!r}")
    try:
        metrics = router_report(w, s, scores)
        length = router_report(w, s, np.where(np.isnan(scores), np.nan, lengths))["apgr"]
    except ValueError as exc:
        raise DataError(f"{path}: {exc}") from None
    return TableReport(
        **metrics,
        n_rows=len(table),
        n_skipped=int(len(table) - usable.sum()) - sanity_excluded,
        sanity_excluded=sanity_excluded,
        length_apgr=length,
        weak=weak,
        strong=strong,
        table=str(path),
        model_version=estimator.version,
        model_source=estimator.source,
    )
