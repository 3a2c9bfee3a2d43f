"""Router metrics from the RouteLLM paper (Ong et al. 2024, "RouteLLM: Learning to
Route LLMs with Preference Data", arXiv:2406.18665), plus ROC-AUC and ECE.

Setting: each prompt i has a weak-model score ``w_i`` and a strong-model score
``s_i`` (same units: 0/1 correctness, a 1–10 judge rating, a 0–1 win score) and a
router score ``p_i`` (higher = send to the strong model). A threshold router sends
the prompts with the highest ``p`` to the strong model.

- *Call percentage* ``c``: the share of prompts sent to the strong model (0–1).
- *Performance* ``r(c)``: mean score of the answers the router picks.
- *PGR* (performance gap recovered): ``(r(c) - r_weak) / (r_strong - r_weak)``,
  where ``r_weak``/``r_strong`` are the means when every prompt goes to one model.
  Routing the top-k prompts recovers ``sum_{i in top k}(s_i - w_i) / sum_i(s_i - w_i)``.
- *APGR*: the area under PGR as a function of ``c`` on [0, 1]. The paper
  approximates the integral on a grid of call percentages; here it is computed
  exactly on the piecewise-linear curve through every prompt count.
- *CPT(x)*: the smallest call percentage at which PGR reaches ``x`` (0.5 or 0.8).

Ties: prompts with equal router scores are sent together in random order, so the
curve is the expectation over that order: linear across each tied group. A
router with one constant score is the random router: its PGR is ``c`` and its
APGR exactly 0.5. The *oracle* ranks by the true gap ``s_i - w_i``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

import numpy as np


@dataclass(frozen=True)
class PGRCurve:
    """Expected PGR at the ends of each tied group: float64 arrays ``call_share``
    (m+1,) from 0 to 1 and ``pgr`` (m+1,) from 0 to 1; linear in between."""

    call_share: np.ndarray
    pgr: np.ndarray


def _clean(weak: np.ndarray, strong: np.ndarray, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    weak = np.asarray(weak, dtype=np.float64).ravel()
    strong = np.asarray(strong, dtype=np.float64).ravel()
    scores = np.asarray(scores, dtype=np.float64).ravel()
    if not (len(weak) == len(strong) == len(scores)):
        raise ValueError(f"length mismatch: weak {len(weak)}, strong {len(strong)}, scores {len(scores)}")
    ok = ~(np.isnan(weak) | np.isnan(strong) | np.isnan(scores))
    return (strong - weak)[ok], scores[ok]


def pgr_curve(weak: np.ndarray, strong: np.ndarray, scores: np.ndarray) -> PGRCurve:
    """The PGR curve of the threshold router on ``scores`` (float arrays (n,)).

    Rows with a NaN in any input are ignored. Raises ``ValueError`` when no rows
    remain or when the strong model is not better on average (gap <= 0), where
    PGR is undefined.
    """
    gap, scores = _clean(weak, strong, scores)
    n = len(gap)
    if n == 0:
        raise ValueError("no rows with weak, strong and router scores")
    total = gap.sum()
    if not total > 0:
        raise ValueError(f"strong model is not better than weak on average (total gap {total:.4g}); PGR undefined")
    order = np.argsort(-scores, kind="stable")
    s_sorted, g_sorted = scores[order], gap[order]
    # Group ends: last index of each run of equal scores.
    ends = np.flatnonzero(np.r_[s_sorted[1:] != s_sorted[:-1], True])
    cum_gap = np.cumsum(g_sorted)[ends]
    call = np.r_[0.0, (ends + 1) / n]
    pgr = np.r_[0.0, cum_gap / total]
    return PGRCurve(call_share=call, pgr=pgr)


def apgr(weak: np.ndarray, strong: np.ndarray, scores: np.ndarray) -> float:
    """Area under the PGR curve on call share [0, 1] (RouteLLM's APGR), exact trapezoid
    over tied groups. Random = 0.5; higher is better. Inputs: float arrays (n,)."""
    c = pgr_curve(weak, strong, scores)
    return float(np.sum(np.diff(c.call_share) * (c.pgr[1:] + c.pgr[:-1]) / 2.0))


def cpt(weak: np.ndarray, strong: np.ndarray, scores: np.ndarray, target_pgr: float) -> float:
    """Call-performance threshold CPT(x): the smallest call share (0–1) at which the
    expected PGR reaches ``target_pgr`` (e.g. 0.5 for CPT(50%)), interpolated inside
    tied groups. Lower is better; the random router needs exactly ``target_pgr``."""
    if not 0.0 <= target_pgr <= 1.0:
        raise ValueError(f"target_pgr must be in [0, 1], got {target_pgr}")
    c = pgr_curve(weak, strong, scores)
    hit = int(np.argmax(c.pgr >= target_pgr - 1e-12))
    if hit == 0:
        return 0.0
    p0, p1 = c.pgr[hit - 1], c.pgr[hit]
    c0, c1 = c.call_share[hit - 1], c.call_share[hit]
    return float(c0 + (target_pgr - p0) / (p1 - p0) * (c1 - c0))


def random_apgr(weak: np.ndarray, strong: np.ndarray) -> float:
    """APGR of the random router (all prompts tied): 0.5 by construction, computed
    through the same code path as any router as a check."""
    return apgr(weak, strong, np.zeros(len(np.asarray(weak))))


def oracle_apgr(weak: np.ndarray, strong: np.ndarray) -> float:
    """APGR of the oracle router that ranks prompts by the true gap ``strong - weak``
    (an upper bound for any router on this table; can exceed 1 in the middle of the
    curve because routing only positive-gap prompts beats always-strong)."""
    gap = np.asarray(strong, dtype=np.float64) - np.asarray(weak, dtype=np.float64)
    return apgr(weak, strong, gap)


def weak_worse(weak: np.ndarray, strong: np.ndarray, margin: float = 0.0) -> np.ndarray:
    """Binary label per prompt: 1.0 where ``strong - weak > margin`` (the weak answer is
    worse), 0.0 otherwise, NaN where either score is missing. float64 (n,)."""
    weak = np.asarray(weak, dtype=np.float64)
    strong = np.asarray(strong, dtype=np.float64)
    out = ((strong - weak) > margin).astype(np.float64)
    out[np.isnan(weak) | np.isnan(strong)] = np.nan
    return out


def roc_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """ROC-AUC of ``scores`` for binary ``labels`` (1 = weak worse), via scikit-learn
    (ties count one half). NaN rows are ignored; NaN when only one class is present."""
    from sklearn.metrics import roc_auc_score

    labels = np.asarray(labels, dtype=np.float64)
    scores = np.asarray(scores, dtype=np.float64)
    ok = ~(np.isnan(labels) | np.isnan(scores))
    if len(np.unique(labels[ok])) < 2:
        return float("nan")
    return float(roc_auc_score(labels[ok].astype(int), scores[ok]))


def ece(labels: np.ndarray, probs: np.ndarray, n_bins: int = 10) -> float:
    """Expected calibration error: ``sum_b (n_b/n) * |mean(p in b) - mean(y in b)|`` over
    ``n_bins`` equal-width probability bins on [0, 1] (Naeini et al. 2015; Guo et al.
    2017). ``labels`` may be 0/1 or soft labels in [0, 1]; NaN rows are ignored.
    0 is perfect calibration."""
    labels = np.asarray(labels, dtype=np.float64)
    probs = np.asarray(probs, dtype=np.float64)
    ok = ~(np.isnan(labels) | np.isnan(probs))
    labels, probs = labels[ok], probs[ok]
    if len(labels) == 0:
        return float("nan")
    bins = np.clip((probs * n_bins).astype(int), 0, n_bins - 1)
    total = 0.0
    for b in range(n_bins):
        m = bins == b
        if m.any():
            total += m.sum() / len(labels) * abs(probs[m].mean() - labels[m].mean())
    return float(total)


def label_metrics(y: np.ndarray, weak: np.ndarray, strong: np.ndarray, p: np.ndarray) -> dict[str, float]:
    """A difficulty model's scores ``p`` (n,) against soft labels ``y`` (n,) and the weak/strong
    scores APGR weighs: ``apgr`` (NaN when the strong tier is not better on these rows), ``auc``
    (label: the weak tier fell short, ``y > 0.5``), ``ece`` (against ``y``) and ``n``."""
    try:
        a = apgr(weak, strong, p)
    except ValueError:
        a = float("nan")
    return {"apgr": a, "auc": roc_auc((y > 0.5).astype(np.float64), p), "ece": ece(y, p), "n": float(len(y))}


class RouterReport(TypedDict):
    """``router_report``'s metrics (see there)."""

    apgr: float
    cpt50: float
    cpt80: float
    auc: float
    random_apgr: float
    oracle_apgr: float
    oracle_cpt50: float
    oracle_cpt80: float
    n: int


def router_report(weak: np.ndarray, strong: np.ndarray, scores: np.ndarray) -> RouterReport:
    """All router metrics for one weak/strong pair on one table: ``apgr``, ``cpt50``,
    ``cpt80``, ``auc`` (label: strong > weak), ``random_apgr``, ``oracle_apgr``,
    ``oracle_cpt50``, ``oracle_cpt80``, ``n`` (rows with both scores and a router score)."""
    weak = np.asarray(weak, dtype=np.float64)
    strong = np.asarray(strong, dtype=np.float64)
    scores = np.asarray(scores, dtype=np.float64)
    ok = ~(np.isnan(weak) | np.isnan(strong) | np.isnan(scores))
    w, s, p = weak[ok], strong[ok], scores[ok]
    gap = s - w
    return RouterReport(
        apgr=apgr(w, s, p),
        cpt50=cpt(w, s, p, 0.5),
        cpt80=cpt(w, s, p, 0.8),
        auc=roc_auc(weak_worse(w, s), p),
        random_apgr=random_apgr(w, s),
        oracle_apgr=oracle_apgr(w, s),
        oracle_cpt50=cpt(w, s, gap, 0.5),
        oracle_cpt80=cpt(w, s, gap, 0.8),
        n=int(ok.sum()),
    )
