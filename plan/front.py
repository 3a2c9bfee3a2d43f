"""The Pareto front of evaluated shapes and the recommended one.

A shape **dominates** another when it costs no more per month, attains no less of the SLO and
scores no lower quality, and is strictly better in one of the three (quality NaN counts as 0:
without outcome rows every shape ties on it), and is not ``overloaded`` where the other is not (an
overloaded shape's attainment lasts only as long as the trace). The **front** is the shapes no
other dominates. The **recommendation** is the cheapest shape that meets ``goal``
(``ShapeResult.meets``: SLO attainment at least ``goal``, not overloaded), whose quality
reaches ``min_quality`` (the quality floor, ``pointsman plan --min-quality-share``; NaN quality
counts as 0) and whose cost is within ``budget_usd_per_month``, ties broken by higher attainment,
then quality: such a shape is on the front (whatever dominated it would be a cheaper, or equally
cheap and better, shape meeting both). When none meets them, nothing is recommended.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from pointsman.plan.evaluate import ShapeResult


def _q(r: ShapeResult) -> float:
    return 0.0 if math.isnan(r.quality) else r.quality


def dominates(a: ShapeResult, b: ShapeResult) -> bool:
    """Whether ``a`` dominates ``b`` (module docstring)."""
    no_worse = a.usd_per_month <= b.usd_per_month and a.slo_attainment >= b.slo_attainment and _q(a) >= _q(b) \
        and a.overloaded <= b.overloaded
    better = a.usd_per_month < b.usd_per_month or a.slo_attainment > b.slo_attainment or _q(a) > _q(b)
    return no_worse and better


def pareto_front(results: Sequence[ShapeResult]) -> list[ShapeResult]:
    """The valid results no other dominates, cheapest first (equal points: the first one kept)."""
    valid = [r for r in results if r.ok]
    front: list[ShapeResult] = []
    for r in valid:
        if any(dominates(o, r) for o in valid):
            continue
        if any(o.usd_per_month == r.usd_per_month and o.slo_attainment == r.slo_attainment and _q(o) == _q(r)
               and o.overloaded == r.overloaded for o in front):
            continue
        front.append(r)
    return sorted(front, key=lambda r: (r.usd_per_month, -r.slo_attainment))


def recommend(results: Sequence[ShapeResult], goal: float,
              budget_usd_per_month: float = math.inf, min_quality: float = 0.0) -> ShapeResult | None:
    """The recommended shape (module docstring), or None when no valid shape meets ``goal`` and
    ``min_quality`` within the budget."""
    ok = [r for r in results if r.meets(goal) and r.usd_per_month <= budget_usd_per_month and _q(r) >= min_quality]
    if not ok:
        return None
    return min(ok, key=lambda r: (r.usd_per_month, -r.slo_attainment, -_q(r)))


__all__ = ["dominates", "pareto_front", "recommend"]
