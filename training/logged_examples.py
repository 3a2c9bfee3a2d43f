"""Training and evaluation sets from the outcome log: one row per labeled decision,
and its head input in a given model's feature space.

``logged_examples(log, rules, fleet)`` joins decisions and outcomes
(``outcome_log.store.OutcomeLog.joined``) and labels each decision
(``training.outcome_labels``). ``head_matrix(examples, estimator)`` gives the rows'
head inputs for a ``DifficultyEstimator``: the vector logged at decision time when it
was computed in the same feature space (``estimator.feature_space.feature_space_of``; no
prompt text needed), else re-embedded from the stored prompt text when the operator
opted into storing it; rows with neither are left out and counted.

Held-out traffic: ``holdout_mask`` assigns every conversation to a fold by a hash of
its conversation key (``datasets.splits.assign_folds``), so a conversation is on one
side only, and the split of a row never depends on which other rows exist.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from pointsman.datasets.splits import assign_folds
from pointsman.errors import DataError
from pointsman.estimator.feature_space import feature_space_of
from pointsman.estimator.features import RequestFeatures
from pointsman.outcome_log.store import OutcomeLog
from pointsman.training.outcome_labels import LabelRules, label_decision

if TYPE_CHECKING:  # pragma: no cover
    from pointsman.estimator.difficulty import DifficultyEstimator
    from pointsman.policy.fleet import Fleet


@dataclass
class LoggedExamples:
    """Labeled logged decisions, aligned arrays of length n.

    ``decision_id``, ``time_s`` (Unix s), ``group`` (conversation key), ``y`` (label in [0, 1]),
    ``weak_score``/``strong_score`` (what APGR weighs), ``signal`` (the deciding label signal),
    ``p_hard_logged`` (p_hard at decision time, NaN when unavailable), ``estimator_version``,
    ``feature_space`` (of ``head_input``, None without one), ``head_input`` (float32 (d,) or None),
    ``features`` (``RequestFeatures`` with ``query_text`` = stored prompt text or ''),
    ``has_text``; ``skipped``: decisions left out, by reason; ``by_today_fleet``: decisions whose fleet revision
    the log did not keep (written before it kept them), labelled with today's fleet's frontier targets.
    """

    decision_id: np.ndarray
    time_s: np.ndarray
    group: np.ndarray
    y: np.ndarray
    weak_score: np.ndarray
    strong_score: np.ndarray
    signal: np.ndarray
    p_hard_logged: np.ndarray
    estimator_version: np.ndarray
    feature_space: np.ndarray
    head_input: list[np.ndarray | None]
    features: list[RequestFeatures]
    has_text: np.ndarray
    skipped: dict[str, int] = field(default_factory=dict)
    by_today_fleet: int = 0

    def __len__(self) -> int:
        return len(self.y)

    def subset(self, mask: np.ndarray) -> LoggedExamples:
        """Rows where boolean ``mask`` (n,) is True (or the given int indices)."""
        idx = np.flatnonzero(mask) if np.asarray(mask).dtype == bool else np.asarray(mask, dtype=np.int64)
        arrays = {k: getattr(self, k)[idx] for k in ("decision_id", "time_s", "group", "y", "weak_score",
                                                    "strong_score", "signal", "p_hard_logged", "estimator_version",
                                                    "feature_space", "has_text")}
        return LoggedExamples(**arrays, head_input=[self.head_input[i] for i in idx],
                              features=[self.features[i] for i in idx], skipped=dict(self.skipped),
                              by_today_fleet=self.by_today_fleet)

    def signal_counts(self) -> dict[str, int]:
        """Rows per deciding label signal."""
        names, counts = np.unique(self.signal.astype(str), return_counts=True)
        return {str(k): int(v) for k, v in zip(names, counts)}


def logged_examples(
    log: OutcomeLog,
    rules: LabelRules,
    fleet: Fleet | None = None,
    *,
    since_s: float | None = None,
    until_s: float | None = None,
) -> LoggedExamples:
    """Every decision in ``[since_s, until_s)`` with at least one outcome, labeled by ``rules``
    (the frontier tier: ``rules.strong_targets``, else the kinds of the fleet it was decided on, kept in the log,
    else ``fleet``'s). Decisions
    without a label are counted in ``skipped["no_label"]``. Raises ``DataError`` when the log has
    no labeled decision in the window."""
    tier = rules.strong_tier(fleet, log.fleet_kinds())
    ids: list[str] = []
    times: list[float] = []
    groups: list[str] = []
    ys: list[float] = []
    weak: list[float] = []
    strong_scores: list[float] = []
    signals: list[str] = []
    p_logged: list[float] = []
    versions: list[str | None] = []
    spaces: list[str | None] = []
    has_text: list[bool] = []
    vectors: list[np.ndarray | None] = []
    feats: list[RequestFeatures] = []
    skipped = {"no_label": 0, "bad_features": 0}
    for d in log.joined(since_s=since_s, until_s=until_s, with_outcomes_only=True):
        label = label_decision(d, rules, tier.of(d))
        if label is None:
            skipped["no_label"] += 1
            continue
        try:
            f = d.features()
        except DataError:
            skipped["bad_features"] += 1
            continue
        ids.append(d.decision_id)
        times.append(d.time_s)
        groups.append(d.conversation_key)
        ys.append(label.y)
        weak.append(label.weak_score)
        strong_scores.append(label.strong_score)
        signals.append(label.signal)
        p_logged.append(np.nan if d.p_hard is None else d.p_hard)
        versions.append(d.estimator_version)
        spaces.append(d.feature_space)
        has_text.append(bool(d.prompt_text))
        vectors.append(d.head_input)
        feats.append(f)
    if not ys:
        raise DataError(f"{log.path}: no logged decision with a usable quality signal"
                        + (" in the window" if since_s is not None or until_s is not None else "")
                        + f" ({skipped['no_label']} decisions with outcomes but no label; label signals: "
                        + ", ".join(rules.signals) + ")")
    return LoggedExamples(
        decision_id=np.asarray(ids, dtype=object), time_s=np.asarray(times, dtype=np.float64),
        group=np.asarray(groups, dtype=object), y=np.asarray(ys, dtype=np.float64),
        weak_score=np.asarray(weak, dtype=np.float64), strong_score=np.asarray(strong_scores, dtype=np.float64),
        signal=np.asarray(signals, dtype=object), p_hard_logged=np.asarray(p_logged, dtype=np.float64),
        estimator_version=np.asarray(versions, dtype=object), feature_space=np.asarray(spaces, dtype=object),
        head_input=vectors, features=feats, has_text=np.asarray(has_text, dtype=bool), skipped=skipped,
        by_today_fleet=len(tier.fell_back))


def holdout_mask(groups: np.ndarray, n_folds: int = 5, fold: int = 0, seed: int = 0) -> np.ndarray:
    """Boolean (n,): True for rows whose conversation hashes into ``fold`` of ``n_folds``
    (``datasets.splits.assign_folds``); about ``1 / n_folds`` of the conversations."""
    if not 0 <= fold < n_folds:
        raise ValueError(f"fold must be in [0, {n_folds}), got {fold}")
    return assign_folds([str(g) for g in groups], n_folds, seed=seed) == fold


@dataclass
class HeadMatrix:
    """Head inputs of the usable rows: ``X`` float32 (m, d), ``rows`` int64 (m,) indices into the
    examples, ``from_log``/``reembedded`` counts and ``unusable`` (rows in another feature space
    without prompt text)."""

    X: np.ndarray
    rows: np.ndarray
    from_log: int
    reembedded: int
    unusable: int


def head_matrix(examples: LoggedExamples, estimator: DifficultyEstimator) -> HeadMatrix:
    """Head inputs for ``estimator``: logged vectors in its feature space as they are, other rows
    re-embedded from stored prompt text (``feature_matrix``), the rest left out."""
    space = feature_space_of(estimator)
    same: list[int] = []
    logged: list[np.ndarray] = []
    for i, (s, v) in enumerate(zip(examples.feature_space, examples.head_input)):
        if space is not None and s == space and v is not None:
            same.append(i)
            logged.append(v)
    same_set = set(same)
    redo = [i for i in range(len(examples)) if i not in same_set and examples.has_text[i]]
    dim = len(estimator.manifest.head.feature_names)
    X = np.zeros((len(same) + len(redo), dim), dtype=np.float32)
    if same:
        X[: len(same)] = np.stack(logged)
    if redo:
        X[len(same):] = estimator.feature_matrix([examples.features[i] for i in redo])
    rows = np.asarray(same + redo, dtype=np.int64)
    order = np.argsort(rows, kind="stable")
    return HeadMatrix(X=X[order], rows=rows[order], from_log=len(same), reembedded=len(redo),
                      unusable=len(examples) - len(same) - len(redo))
