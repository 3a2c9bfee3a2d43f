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
- or, given ``head`` (the model directory's own verifier head, ``estimator.verifier.model_verifier``;
  ``pointsman train --table --drafts`` writes one), that head: ``draft_apgr`` / ``draft_auc`` of its
  scores, ``draft_apgr_folds`` its APGR on the same row subsets. ``verifier`` says which scored
  (``head`` or ``cv-head``), ``verifier_version`` names it, and ``verifier_in_sample`` is true when
  the head was trained on this table (its ``verifier.json`` names it): then its numbers are in
  sample, and ``--folds K`` (which refits the head's recipe per fold) is the honest measure;

and ``draft_cpt80`` is the share of requests that pay both a draft and a frontier call when
the cascade escalates enough of them (highest ``p_bad`` first) to recover 80% of the gap
(RouteLLM's CPT(80%), applied to escalations). ``prompt_apgr`` is the estimator alone on
the same rows, the baseline measured in the same run.

For a model trained on the table itself, its ``p_hard`` has seen every row's label; pass the
out-of-fold scores of its recipe's cross-validation (``oof``, ``training.crossval.crossval_scores``
with ``calibrated=True``; ``pointsman evaluate --folds K --drafts``): each row's ``p_hard`` then
comes from a refit that never saw it, and the verifier head's folds are the same folds (by
conversation), so neither stage sees a row it scores (``draft_prompt_scores: "out-of-fold"``).

``prefix_tokens`` N (``pointsman evaluate --draft-prefix-tokens N``; ``draft_prefix_tokens`` in the
report, None for whole drafts): every draft is cut to its first N tokens as early verification sees it
(``estimator.draft.draft_prefix``), and the heads in cross-validation are trained on the cut drafts.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TypedDict

import numpy as np

from pointsman.datasets.drafts import read_drafts
from pointsman.datasets.outcome_tables import read_outcome_table
from pointsman.datasets.splits import group_key
from pointsman.errors import DataError, RequestError
from pointsman.estimator.draft import Draft, draft_features, draft_prefix, prompt_of
from pointsman.estimator.features import extract_features
from pointsman.estimator.verifier import HeuristicVerifier, OnnxVerifier
from pointsman.request import RequestView, parse_route_request
from pointsman.training.evaluate import TableScorer
from pointsman.training.metrics import apgr, cpt, roc_auc, weak_worse
from pointsman.training.out_of_fold import OutOfFold
from pointsman.training.sanity import suite_conversation_keys
from pointsman.training.verifier import fit_verifier


class DraftReport(TypedDict):
    """``evaluate_drafts``' metrics (see the module)."""

    draft_apgr: float
    draft_auc: float
    draft_apgr_folds: list[float]
    draft_folds_undefined: int
    draft_apgr_mean: float
    draft_apgr_std: float
    draft_cpt80: float
    draft_heuristic_apgr: float
    draft_heuristic_auc: float
    draft_heuristic_cpt80: float
    prompt_apgr: float
    draft_n: int
    drafts: str
    draft_prompt_scores: str
    verifier: str
    verifier_version: str
    verifier_in_sample: bool
    draft_prefix_tokens: int | None


#: ``DraftReport.verifier_version`` of heads trained in cross-validation on the table.
CV_HEAD = "training.verifier.fit_verifier, refitted per fold"


def trained_on(head: OnnxVerifier, table: str | Path) -> bool:
    """Whether ``head``'s ``verifier.json`` provenance names ``table`` as its training table."""
    provenance = head.metadata.get("provenance")
    named = provenance.get("table") if isinstance(provenance, dict) else None
    return isinstance(named, str) and Path(named).resolve() == Path(table).resolve()


def draft_matrix(estimator: TableScorer, table: str | Path, weak: str, strong: str, drafts: str | Path,
                 p_hard_of: Mapping[str, float] | None = None, prefix_tokens: int | None = None
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, list[str]]:
    """``(X, weak scores, strong scores, p_hard, prompt ids)`` over the rows with a prompt, both
    scores and a draft that are not requests of the sanity suites (``training.sanity.suite_requests``):
    ``X`` float32 (n, len(FEATURE_NAMES)) of draft features (with the row's
    prompt, its last user message, as ``POST /v1/verify`` reads the decision's). ``p_hard_of``:
    each prompt id's ``p_hard`` (rows without one are left out), instead of the estimator's.
    ``prefix_tokens`` N: each draft cut to its first N tokens as early verification sees it
    (``estimator.draft.draft_prefix``); None: the whole draft. Raises ``DataError``."""
    t = read_outcome_table(table)
    answers = read_drafts(drafts, weak)
    w_all, s_all = t.scores(weak), t.scores(strong)
    rows, feats, texts, prompts = [], [], [], []
    suite = suite_conversation_keys()
    for i, (pid, messages) in enumerate(zip(t.prompt_ids, t.messages)):
        if pid not in answers or np.isnan(w_all[i]) or np.isnan(s_all[i]) or (p_hard_of is not None
                                                                             and pid not in p_hard_of):
            continue
        if group_key(messages) in suite:  # requests of the sanity suites: never trained on or scored
            continue
        try:  # validated once (as ``features_for_messages``), for the features and the prompt
            view = RequestView.of(parse_route_request({"messages": messages}))
            feats.append(extract_features(view, estimator.tokenizer))
        except RequestError:
            continue
        prompts.append(prompt_of(view))
        rows.append(i)
        texts.append(answers[pid])
    if len(rows) < 10:
        raise DataError(f"{drafts}: only {len(rows)} rows of {table} have a draft of '{weak}' and both scores")
    ids = [t.prompt_ids[i] for i in rows]
    if p_hard_of is None:
        p_hard = np.asarray(estimator.estimate_batch(feats), dtype=np.float64)
    else:
        p_hard = np.asarray([p_hard_of[pid] for pid in ids], dtype=np.float64)
    x = np.stack([draft_features(draft_prefix(text, prefix_tokens) if prefix_tokens else Draft(text=text),
                                 f.prompt_tokens, float(p), prompt).vector()
                  for text, f, p, prompt in zip(texts, feats, p_hard, prompts)])
    idx = np.asarray(rows)
    return x, w_all[idx], s_all[idx], p_hard, ids


def evaluate_drafts(estimator: TableScorer, table: str | Path, weak: str, strong: str, drafts: str | Path,
                    folds: int = 5, seed: int = 0, oof: OutOfFold | None = None,
                    head: OnnxVerifier | None = None, prefix_tokens: int | None = None) -> DraftReport:
    """The draft-aware metrics of the module; with ``oof``, out-of-fold ``p_hard`` and its folds
    (``folds`` is then ``oof.folds``); with ``head``, that head scores instead of heads trained
    in cross-validation; with ``prefix_tokens`` N, each draft's first N tokens as early verification sees
    them (``draft_matrix``), else the whole draft. Raises ``DataError`` (unreadable files, too few rows, or rows on which the
    strong model is not better on average: APGR undefined); a fold where it is undefined is left out
    of ``draft_apgr_folds`` and counted in ``draft_folds_undefined``."""
    p_hard_of = None if oof is None else {str(pid): float(p) for pid, p in zip(oof.prompt_id, oof.p_hard)
                                          if np.isfinite(p)}
    x, w, s, p_hard, ids = draft_matrix(estimator, table, weak, strong, drafts, p_hard_of, prefix_tokens)
    y = weak_worse(w, s)
    if oof is not None:
        fold_of = {str(pid): int(f) for pid, f in zip(oof.prompt_id, oof.fold)}
        row_fold = np.asarray([fold_of[pid] for pid in ids])
        folds = oof.folds
        test_rows = [np.flatnonzero(row_fold == k) for k in range(folds)]
    else:
        order = np.random.default_rng(seed).permutation(len(y))
        test_rows = [order[k::folds] for k in range(folds)]
    heuristic = HeuristicVerifier()
    h = np.array([heuristic.p_bad_vector(row) for row in x])
    scored = np.empty(len(y))  # p_bad of each row: the model's own head, else a head that never saw it
    per_fold = []
    if head is not None:
        scored[:] = head.p_bad_batch(x)
    undefined = 0  # folds whose rows have the strong model no better on average: APGR undefined there
    for test in test_rows:
        if not len(test):
            continue
        if head is None:
            train = np.setdiff1d(np.arange(len(y)), test)
            try:
                scored[test] = fit_verifier(x[train], y[train]).predict_proba(x[test])[:, 1]
            except ValueError as exc:  # a fold's training rows hold no lost draft (or only lost ones)
                raise DataError(f"{drafts}: cross-validating the verifier on {len(y)} rows: {exc}") from None
        try:
            per_fold.append(apgr(w[test], s[test], scored[test]))
        except ValueError:
            undefined += 1
    try:
        pooled = apgr(w, s, scored)
    except ValueError as exc:
        raise DataError(f"{drafts}: on the {len(y)} rows with a draft, {exc}") from None
    return DraftReport(
        draft_apgr=pooled, draft_folds_undefined=undefined, draft_auc=roc_auc(y, scored),
        draft_apgr_folds=[float(a) for a in per_fold],
        draft_apgr_mean=float(np.mean(per_fold)) if per_fold else float("nan"),
        draft_apgr_std=float(np.std(per_fold)) if per_fold else float("nan"),
        draft_cpt80=cpt(w, s, scored, 0.8), draft_heuristic_apgr=apgr(w, s, h), draft_heuristic_auc=roc_auc(y, h),
        draft_heuristic_cpt80=cpt(w, s, h, 0.8), prompt_apgr=apgr(w, s, p_hard), draft_n=int(len(y)),
        drafts=str(drafts), draft_prompt_scores="model" if oof is None else "out-of-fold",
        verifier="cv-head" if head is None else "head", verifier_version=CV_HEAD if head is None else head.version,
        verifier_in_sample=head is not None and trained_on(head, table), draft_prefix_tokens=prefix_tokens)
