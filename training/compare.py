"""Champion vs challenger on the same held-out logged traffic (``pointsman compare``).

``compare_models(log, rules, fleet, champion, challenger) -> Comparison``: every labeled
logged decision that *neither* model trained on — for a model trained from the log
(``manifest.training.source == "outcome-log"``), the decisions in conversations it did not
train on (its holdout fold, or first logged after its training data ended); models trained
elsewhere (public tables, the bundled model) exclude nothing — is scored by both models through their own head
inputs (``training.logged_examples.head_matrix``); rows one of them cannot score are
left out for both, and so are the requests of the sanity suites (``training.sanity.suite_requests``:
``promote``'s own check, never scored as traffic). The metrics: APGR and CPT(50%) of the logged weak/strong scores
(RouteLLM), AUC against "the weak tier fell short" (``y > 0.5``), ECE against the soft
label, and a paired bootstrap interval of the APGR difference.
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

import numpy as np

from pointsman.errors import DataError
from pointsman.training.json_data import as_number, json_number, json_object_at
from pointsman.training.logged_examples import LoggedExamples, head_matrix, holdout_mask, logged_examples
from pointsman.training.metrics import apgr, cpt, label_metrics
from pointsman.training.outcome_labels import LabelRules
from pointsman.training.sanity import suite_requests

if TYPE_CHECKING:  # pragma: no cover
    from pointsman.estimator.difficulty import DifficultyEstimator
    from pointsman.outcome_log.store import OutcomeLog
    from pointsman.policy.fleet import Fleet

_VERSION = re.compile(r"^models:/[^/@]+/(\d+)")


@dataclass
class ModelScore:
    """One model's scores on the comparison rows: ``role`` (champion/challenger), ``version``
    (manifest content version), ``source`` (where it was loaded from), ``registry_version``
    (MLflow version number or None), ``metrics`` (``apgr``, ``cpt50``, ``auc``, ``ece``, ``n``),
    ``p_hard`` float64 (n,), and its training ``p_hard`` deciles when the manifest has them."""

    role: str
    version: str
    source: str
    registry_version: str | None
    metrics: dict[str, float]
    p_hard: np.ndarray
    reference_deciles: list[float] | None = None


class SideSummary(TypedDict):
    """One model in ``ComparisonSummary``: where it came from and its ``score_metrics``."""

    version: str
    source: str
    registry_version: str | None
    apgr: float
    cpt50: float
    auc: float
    ece: float
    n: float


class ComparisonSummary(TypedDict):
    """``Comparison.to_dict()``: what ``pointsman compare --json`` prints (and ``promote`` logs)."""

    n: int
    champion: SideSummary
    challenger: SideSummary
    apgr_delta: float
    apgr_delta_ci90: list[float]
    excluded: dict[str, int]
    label_signals: dict[str, int]


@dataclass
class Comparison:
    """Both models on the same held-out rows: ``examples`` (the rows), ``champion``,
    ``challenger``, ``apgr_delta`` (challenger − champion), ``apgr_delta_ci90`` (paired
    bootstrap, 1000 resamples), ``excluded`` (rows left out, by reason)."""

    examples: LoggedExamples
    champion: ModelScore
    challenger: ModelScore
    apgr_delta: float
    apgr_delta_ci90: tuple[float, float]
    excluded: dict[str, int] = field(default_factory=dict)

    @property
    def n(self) -> int:
        """Rows scored by both models."""
        return len(self.examples)

    def to_dict(self) -> ComparisonSummary:
        """JSON-ready summary (no per-row arrays)."""
        def side(m: ModelScore) -> SideSummary:
            x = m.metrics
            return SideSummary(version=m.version, source=m.source, registry_version=m.registry_version,
                               apgr=x["apgr"], cpt50=x["cpt50"], auc=x["auc"], ece=x["ece"], n=x["n"])

        return ComparisonSummary(n=self.n, champion=side(self.champion), challenger=side(self.challenger),
                                 apgr_delta=self.apgr_delta, apgr_delta_ci90=list(self.apgr_delta_ci90),
                                 excluded=dict(self.excluded), label_signals=self.examples.signal_counts())


def registry_version(source: str) -> str | None:
    """The MLflow version number in an estimator's ``source`` (``models:/NAME/3 (@champion)`` → "3")."""
    m = _VERSION.match(source or "")
    return m.group(1) if m else None


def trained_on(est: DifficultyEstimator, ex: LoggedExamples, log: OutcomeLog) -> np.ndarray:
    """Boolean (n,): rows of ``ex`` in a conversation the model ``est`` may have trained on: the
    conversation key of a decision with outcomes in ``log`` between its training window's start
    (``since_s``) and the end of its training data (``data_until_s``), outside its holdout fold,
    whenever the row was logged (a repeated prompt or a later turn logged after training, inside or
    outside the compared window, is that conversation too); all False for a model not trained from an
    outcome log. A model that keeps the keys it trained on (``trained_conversations``, any log it was
    trained from) is read from them. Raises ``ValueError`` when its manifest's holdout record is
    malformed or its keys file does not match the manifest's sha256."""
    training = est.manifest.training
    if training.get("source") != "outcome-log":
        return np.zeros(len(ex), dtype=bool)
    if "trained_conversations" in training:
        record = json_object_at(training, "trained_conversations")
        text = (Path(est.model_dir) / str(record.get("file"))).read_text(encoding="utf-8")
        if hashlib.sha256(text.encode()).hexdigest() != record.get("sha256"):
            raise ValueError(f"{est.model_dir}: {record.get('file')} does not match its sha256 in the manifest")
        learned = frozenset(text.split())
        return np.fromiter((g in learned for g in ex.group), dtype=bool, count=len(ex))
    h = json_object_at(training, "holdout")
    since_s = None if training.get("since_s") is None else json_number(training, "since_s")
    until_s = (None if training.get("data_until_s") is None
               else math.nextafter(json_number(training, "data_until_s"), math.inf))  # data_until_s is a row's time
    keys = np.asarray([d.conversation_key for d in log.joined(since_s=since_s, until_s=until_s,
                                                              with_outcomes_only=True)], dtype=object)
    held = holdout_mask(keys, int(json_number(h, "n_folds", 5)), int(json_number(h, "fold", 0)),
                        int(json_number(h, "seed", 0)))
    groups = set(keys[~held])
    return np.fromiter((g in groups for g in ex.group), dtype=bool, count=len(ex))


def score_metrics(ex: LoggedExamples, p: np.ndarray) -> dict[str, float]:
    """``apgr``, ``cpt50``, ``auc``, ``ece``, ``n`` of ``p_hard`` (n,) on ``ex``; APGR/CPT are NaN
    when the strong tier is not better on these rows."""
    m = label_metrics(ex.y, ex.weak_score, ex.strong_score, p)
    try:
        c = cpt(ex.weak_score, ex.strong_score, p, 0.5)
    except ValueError:  # exactly when APGR is undefined
        c = float("nan")
    return {"apgr": m["apgr"], "cpt50": c, "auc": m["auc"], "ece": m["ece"], "n": m["n"]}


def _deciles_of(est: DifficultyEstimator) -> list[float] | None:
    """The model's training ``p_hard`` deciles (a challenger's manifest), else the deciles of its
    reference quantiles, else None."""
    manifest = est.manifest
    got = manifest.training.get("p_hard_deciles")
    if isinstance(got, list) and got:
        return [as_number(v, "p_hard_deciles") for v in got]
    quantiles = json_object_at(manifest.reference_p_hard, "quantiles")
    keys = [f"{0.1 * k:.1f}" for k in range(1, 10)]
    if all(k in quantiles for k in keys):
        return [json_number(quantiles, k) for k in keys]
    return None


def bootstrap_delta(ex: LoggedExamples, p_a: np.ndarray, p_b: np.ndarray, n_resamples: int = 1000,
                    seed: int = 0) -> tuple[float, float]:
    """90% paired bootstrap interval of ``APGR(p_b) - APGR(p_a)`` over rows (resampled with
    replacement; resamples where APGR is undefined are skipped). (NaN, NaN) if none is defined."""
    rng = np.random.default_rng(seed)
    n = len(ex)
    deltas = []
    for _ in range(n_resamples):
        idx = rng.integers(0, n, n)
        w, s = ex.weak_score[idx], ex.strong_score[idx]
        try:
            deltas.append(apgr(w, s, p_b[idx]) - apgr(w, s, p_a[idx]))
        except ValueError:
            continue
    if not deltas:
        return float("nan"), float("nan")
    lo, hi = np.quantile(deltas, [0.05, 0.95])
    return float(lo), float(hi)


def compare_models(log: OutcomeLog, rules: LabelRules, fleet: Fleet | None, champion: DifficultyEstimator,
                   challenger: DifficultyEstimator, *, since_s: float | None = None,
                   until_s: float | None = None) -> Comparison:
    """Score ``champion`` and ``challenger`` (``DifficultyEstimator``s) on the held-out logged
    traffic in ``[since_s, until_s)``. Raises ``DataError`` when no row is left to compare on."""
    ex = logged_examples(log, rules, fleet, since_s=since_s, until_s=until_s)
    excluded: dict[str, int] = {}
    seen = trained_on(champion, ex, log) | trained_on(challenger, ex, log)
    excluded["trained_on"] = int(seen.sum())
    suite = suite_requests(ex.group) & ~seen  # the sanity check's own pairs, never traffic to score
    excluded["sanity_suite"] = int(suite.sum())
    ex = ex.subset(~seen & ~suite)
    if len(ex) == 0:
        raise DataError(f"{log.path}: no labeled logged decision is held out from both models "
                        f"({excluded['trained_on']} were trained on, {excluded['sanity_suite']} are requests of "
                        "the sanity suites)")
    hm_a, hm_b = head_matrix(ex, champion), head_matrix(ex, challenger)
    both = np.intersect1d(hm_a.rows, hm_b.rows)
    excluded["unscorable"] = len(ex) - len(both)
    if len(both) == 0:
        raise DataError(f"{log.path}: the held-out decisions cannot be scored by both models (logged in another "
                        "feature space and without stored prompt text)")
    p_a = champion.predict_matrix(hm_a.X[np.searchsorted(hm_a.rows, both)]).astype(np.float64)
    p_b = challenger.predict_matrix(hm_b.X[np.searchsorted(hm_b.rows, both)]).astype(np.float64)
    ex = ex.subset(both)
    a = ModelScore("champion", champion.version, champion.source, registry_version(champion.source),
                   score_metrics(ex, p_a), p_a, _deciles_of(champion))
    b = ModelScore("challenger", challenger.version, challenger.source, registry_version(challenger.source),
                   score_metrics(ex, p_b), p_b, _deciles_of(challenger))
    return Comparison(ex, a, b, b.metrics["apgr"] - a.metrics["apgr"], bootstrap_delta(ex, p_a, p_b), excluded)
