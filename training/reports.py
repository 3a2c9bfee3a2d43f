"""Reports logged with every loop run (train from outcomes, compare, promote): the PGR
curve against frontier share, a reliability diagram, the confusion at the operating
threshold, and the drift of the ``p_hard`` distribution against the training data.

- PGR curve (RouteLLM, Ong et al. 2024; ``training.metrics.pgr_curve``): share of the
  weak→strong quality gap recovered vs the share of traffic sent to the frontier tier.
- Reliability diagram (Guo et al. 2017): mean label vs mean ``p_hard`` in 10 equal-width bins.
- Confusion at the operating threshold: "weak worse" (label ``y > 0.5``) vs "routed to the
  frontier" (``p_hard >= threshold``); the threshold is the model's ``p_hard`` quantile that
  sends the operating frontier share of traffic to the frontier.
- Drift against the training data, from the training ``p_hard`` deciles kept in the manifest:
  PSI ``sum_b (a_b - e_b) * ln(a_b / e_b)`` over the 10 decile bins (e_b = 0.1; shares floored
  at 1e-4; by the usual rule of thumb < 0.1 is stable, > 0.25 a major shift) and the KS
  distance ``max_k |F_new(q_k) - k/10|`` at the deciles (a lower bound of the two-sample KS
  statistic).

Training-only: matplotlib (Agg backend) is imported inside the plotting functions.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from pointsman.training.metrics import pgr_curve

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure

#: The deciles kept in a manifest to measure drift against.
DECILES = tuple(round(0.1 * k, 1) for k in range(1, 10))
_FLOOR = 1e-4


def deciles(p: np.ndarray) -> list[float]:
    """The 10%..90% quantiles of ``p`` (n,): 9 floats."""
    p = np.asarray(p, dtype=np.float64)
    p = p[~np.isnan(p)]
    if len(p) == 0:
        raise ValueError("no p_hard values to summarize")
    return [float(v) for v in np.quantile(p, DECILES)]


def drift(reference_deciles: list[float], p_new: np.ndarray) -> dict[str, float]:
    """``{"psi", "ks", "n"}`` of ``p_new`` (n,) against a distribution given by its deciles
    (see the module docstring for the formulas). Raises ``ValueError`` for empty input."""
    q = np.asarray(reference_deciles, dtype=np.float64)
    if q.shape != (len(DECILES),):
        raise ValueError(f"expected {len(DECILES)} reference deciles, got {q.shape}")
    p = np.asarray(p_new, dtype=np.float64)
    p = p[~np.isnan(p)]
    if len(p) == 0:
        raise ValueError("no p_hard values to compare")
    bins = np.searchsorted(q, p, side="right")  # 0..9
    actual = np.bincount(bins, minlength=10) / len(p)
    expected = np.full(10, 0.1)
    a = np.maximum(actual, _FLOOR)
    psi = float(np.sum((a - expected) * np.log(a / expected)))
    cdf_new = np.searchsorted(np.sort(p), q, side="right") / len(p)
    ks = float(np.max(np.abs(cdf_new - np.asarray(DECILES))))
    return {"psi": psi, "ks": ks, "n": float(len(p))}


def operating_threshold(p: np.ndarray, frontier_share: float) -> float:
    """The ``p_hard`` threshold that sends ``frontier_share`` (0-1) of ``p`` to the frontier:
    the (1 - share) quantile (``p >= threshold`` routes there); 1.0 for a share of 0."""
    if not 0.0 <= frontier_share <= 1.0:
        raise ValueError(f"frontier_share must be in [0, 1], got {frontier_share}")
    if frontier_share == 0.0:
        return 1.0
    return float(np.quantile(np.asarray(p, dtype=np.float64), 1.0 - frontier_share, method="higher"))


def confusion(y: np.ndarray, p: np.ndarray, threshold: float) -> dict[str, float]:
    """Counts at ``threshold``: ``tp`` (weak worse, routed to frontier), ``fp``, ``fn``, ``tn``,
    plus ``frontier_share`` and ``threshold``. "Weak worse" is ``y > 0.5``."""
    worse = np.asarray(y, dtype=np.float64) > 0.5
    routed = np.asarray(p, dtype=np.float64) >= threshold
    return {"tp": float(np.sum(worse & routed)), "fp": float(np.sum(~worse & routed)),
            "fn": float(np.sum(worse & ~routed)), "tn": float(np.sum(~worse & ~routed)),
            "frontier_share": float(routed.mean()) if len(routed) else 0.0, "threshold": float(threshold)}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Figure, path: Path) -> Path:
    """Lay out ``fig``, write it to ``path`` (PNG) and close it; returns ``path``."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_pgr(path: Path, curves: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]], title: str) -> Path:
    """PNG of PGR vs frontier share for each ``name -> (weak, strong, p_hard)``, with the random
    router (diagonal) and the oracle of the first entry."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 4.2), dpi=100)
    first = next(iter(curves.values()))
    oracle = pgr_curve(first[0], first[1], np.asarray(first[1]) - np.asarray(first[0]))
    ax.plot(oracle.call_share, oracle.pgr, color="0.6", ls=":", label="oracle")
    ax.plot([0, 1], [0, 1], color="0.6", ls="--", label="random")
    for name, (w, s, p) in curves.items():
        c = pgr_curve(w, s, p)
        area = float(np.sum(np.diff(c.call_share) * (c.pgr[1:] + c.pgr[:-1]) / 2.0))
        ax.plot(c.call_share, c.pgr, label=f"{name} (APGR {area:.3f})")
    ax.set_xlabel("share of traffic sent to the frontier tier")
    ax.set_ylabel("performance gap recovered")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(alpha=0.3)
    return _save(fig, path)


def plot_reliability(path: Path, series: dict[str, tuple[np.ndarray, np.ndarray]], title: str, n_bins: int = 10) -> Path:
    """PNG reliability diagram for each ``name -> (y, p_hard)``: mean label vs mean p_hard per bin."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(4.6, 4.2), dpi=100)
    ax.plot([0, 1], [0, 1], color="0.6", ls="--", label="perfectly calibrated")
    for name, (y, p) in series.items():
        y, p = np.asarray(y, dtype=np.float64), np.asarray(p, dtype=np.float64)
        bins = np.clip((p * n_bins).astype(int), 0, n_bins - 1)
        xs, ys, ns = [], [], []
        for b in range(n_bins):
            m = bins == b
            if m.any():
                xs.append(p[m].mean())
                ys.append(y[m].mean())
                ns.append(int(m.sum()))
        ax.plot(xs, ys, marker="o", label=name)
    ax.set_xlabel("predicted p_hard (bin mean)")
    ax.set_ylabel("observed share where the weak tier fell short")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(alpha=0.3)
    return _save(fig, path)


def plot_confusion(path: Path, counts: dict[str, float], title: str) -> Path:
    """PNG of the 2x2 confusion at the operating threshold (``confusion`` counts)."""
    plt = _pyplot()
    m = np.array([[counts["tp"], counts["fn"]], [counts["fp"], counts["tn"]]])
    fig, ax = plt.subplots(figsize=(4.2, 3.6), dpi=100)
    ax.imshow(m, cmap="Blues")
    for i in range(2):
        for j in range(2):
            ax.text(j, i, f"{int(m[i, j])}", ha="center", va="center", fontsize=12)
    ax.set_xticks([0, 1], ["frontier", "cheaper tier"])
    ax.set_yticks([0, 1], ["weak worse", "weak good enough"])
    ax.set_xlabel(f"routed at p_hard >= {counts['threshold']:.3f}")
    ax.set_title(title, fontsize=10)
    return _save(fig, path)


def plot_drift(path: Path, reference_deciles: list[float], p_new: np.ndarray, title: str) -> Path:
    """PNG histogram of ``p_new`` over the reference's decile bins (10% each when unchanged)."""
    plt = _pyplot()
    q = np.asarray(reference_deciles, dtype=np.float64)
    p = np.asarray(p_new, dtype=np.float64)
    share = np.bincount(np.searchsorted(q, p, side="right"), minlength=10) / max(len(p), 1)
    fig, ax = plt.subplots(figsize=(5.2, 3.6), dpi=100)
    ax.bar(np.arange(10), share, color="tab:blue", label="recent traffic")
    ax.axhline(0.1, color="0.4", ls="--", label="training data (10% per decile bin)")
    ax.set_xticks(np.arange(10), [f"D{k + 1}" for k in range(10)])
    ax.set_xlabel("training p_hard decile bin")
    ax.set_ylabel("share of requests")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    return _save(fig, path)


def model_report(out_dir: Path, name: str, y: np.ndarray, weak: np.ndarray, strong: np.ndarray, p: np.ndarray,
                 frontier_share: float, reference_deciles: list[float] | None,
                 recent_p: np.ndarray | None = None) -> dict[str, float]:
    """Write one model's reports into ``out_dir`` (``<name>_pgr.png``, ``_reliability.png``,
    ``_confusion.png``, ``_drift.png``) and return their numbers as flat metrics
    (``confusion/*``, ``drift/psi``, ``drift/ks``). ``recent_p``: p_hard on recent traffic for the
    drift (default ``p``)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    plot_pgr(out_dir / f"{name}_pgr.png", {name: (weak, strong, p)}, f"{name}: PGR vs frontier share (n={len(p)})")
    plot_reliability(out_dir / f"{name}_reliability.png", {name: (y, p)}, f"{name}: reliability (n={len(p)})")
    counts = confusion(y, p, operating_threshold(p, frontier_share))
    plot_confusion(out_dir / f"{name}_confusion.png", counts, f"{name}: at {100 * frontier_share:.0f}% frontier share")
    out: dict[str, float] = {f"confusion/{k}": v for k, v in counts.items()}
    if reference_deciles:
        recent = p if recent_p is None else recent_p
        d = drift(reference_deciles, recent)
        plot_drift(out_dir / f"{name}_drift.png", reference_deciles, recent, f"{name}: p_hard drift "
                   f"(PSI {d['psi']:.3f}, KS {d['ks']:.3f})")
        out.update({f"drift/{k}": v for k, v in d.items()})
    return out
