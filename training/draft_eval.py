"""Draft-aware evaluation (``pointsman evaluate --drafts``): how well a cascade's verifier,
reading the weak model's actual answer, picks the requests to escalate.

``evaluate_drafts(estimator, table, weak, strong, drafts, folds=5) -> DraftReport``: each
row's draft is the weak model's answer (``datasets.drafts``); its features
(``estimator.draft.draft_features``, with the estimator's ``p_hard``) are scored by

- the shipped verifier (``estimator.verifier.HeuristicVerifier``, no training):
  ``draft_heuristic_apgr`` / ``_auc``;
- a verifier head trained in ``folds``-fold cross-validation on the table itself
  (``training.verifier.fit_verifier``: each row scored by a head that never saw it):
  ``draft_apgr`` / ``draft_auc`` with the per-fold APGRs ``draft_apgr_folds`` and their mean
  and standard deviation. This is an evaluation: nothing trained here is kept;

and ``draft_cpt80`` is the share of requests that pay both a draft and a frontier call when
the cascade escalates enough of them (highest ``p_bad`` first) to recover 80% of the gap
(RouteLLM's CPT(80%), applied to escalations). ``prompt_apgr`` is the estimator alone on
the same rows, the baseline measured in the same run.
"""

from __future__ import annotations

from pathlib import Path
from typing import TypedDict

import numpy as np

from pointsman.datasets.drafts import read_drafts
from pointsman.datasets.outcome_tables import read_outcome_table
from pointsman.errors import DataError, RequestError
from pointsman.estimator.draft import Draft, draft_features
from pointsman.estimator.verifier import HeuristicVerifier
from pointsman.training.evaluate import TableScorer
from pointsman.training.examples import features_for_messages
from pointsman.training.metrics import apgr, cpt, roc_auc, weak_worse
from pointsman.training.verifier import fit_verifier


class DraftReport(TypedDict):
    """``evaluate_drafts``' metrics (see the module)."""

    draft_apgr: float
    draft_auc: float
    draft_apgr_folds: list[float]
    draft_apgr_mean: float
    draft_apgr_std: float
    draft_cpt80: float
    draft_heuristic_apgr: float
    draft_heuristic_auc: float
    draft_heuristic_cpt80: float
    prompt_apgr: float
    draft_n: int
    drafts: str


def draft_matrix(estimator: TableScorer, table: str | Path, weak: str, strong: str, drafts: str | Path
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(X, weak scores, strong scores, p_hard)`` over the rows with a prompt, both scores and a
    draft: ``X`` float32 (n, len(FEATURE_NAMES)) of draft features. Raises ``DataError``."""
    t = read_outcome_table(table)
    answers = read_drafts(drafts, weak)
    w_all, s_all = t.scores(weak), t.scores(strong)
    rows, feats, texts = [], [], []
    for i, (pid, messages) in enumerate(zip(t.prompt_ids, t.messages)):
        if pid not in answers or np.isnan(w_all[i]) or np.isnan(s_all[i]):
            continue
        try:
            feats.append(features_for_messages(messages, estimator.tokenizer))
        except RequestError:
            continue
        rows.append(i)
        texts.append(answers[pid])
    if len(rows) < 10:
        raise DataError(f"{drafts}: only {len(rows)} rows of {table} have a draft of '{weak}' and both scores")
    p_hard = np.asarray(estimator.estimate_batch(feats), dtype=np.float64)
    x = np.stack([draft_features(Draft(text=text), f.prompt_tokens, float(p)).vector()
                  for text, f, p in zip(texts, feats, p_hard)])
    idx = np.asarray(rows)
    return x, w_all[idx], s_all[idx], p_hard


def evaluate_drafts(estimator: TableScorer, table: str | Path, weak: str, strong: str, drafts: str | Path,
                    folds: int = 5, seed: int = 0) -> DraftReport:
    """The draft-aware metrics of the module. Raises ``DataError`` (unreadable files, too few rows)."""
    x, w, s, p_hard = draft_matrix(estimator, table, weak, strong, drafts)
    y = weak_worse(w, s)
    heuristic = HeuristicVerifier()
    h = np.array([heuristic.p_bad_vector(row) for row in x])
    order = np.random.default_rng(seed).permutation(len(y))
    cv = np.empty(len(y))
    per_fold = []
    for k in range(folds):
        test = order[k::folds]
        train = np.setdiff1d(order, test)
        head = fit_verifier(x[train], y[train])
        cv[test] = head.predict_proba(x[test])[:, 1]
        per_fold.append(apgr(w[test], s[test], cv[test]))
    return DraftReport(
        draft_apgr=apgr(w, s, cv), draft_auc=roc_auc(y, cv), draft_apgr_folds=[float(a) for a in per_fold],
        draft_apgr_mean=float(np.mean(per_fold)), draft_apgr_std=float(np.std(per_fold)),
        draft_cpt80=cpt(w, s, cv, 0.8), draft_heuristic_apgr=apgr(w, s, h), draft_heuristic_auc=roc_auc(y, h),
        draft_heuristic_cpt80=cpt(w, s, h, 0.8), prompt_apgr=apgr(w, s, p_hard), draft_n=int(len(y)),
        drafts=str(drafts))
