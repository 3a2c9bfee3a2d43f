"""Where a policy run's quality gap and bills come from: one row per deciding rule.

``by_rule(result, decisions, slo, quality, reference)`` -> ``list[RuleRow]``: the requests each
rule decided (``replay.engine_router.EngineRouter.decisions``: request index -> (rule, target,
mode, p_hard)), where they ran, how many the cascade escalated, how many missed the SLO (rejected
ones included), their mean quality next to the reference's (all-frontier's: what the same
requests score on the reference target), the rule's share of the run's quality gap to the
reference, and their frontier bill. A rule's ``gap`` is the sum over its requests of (reference
quality - quality) divided by every request with a known quality, so the rows' gaps add up to
reference quality - run quality (a rejected request scores 0: it delivered no answer).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass

from pointsman.replay.results import ReplayResult, RequestResult
from pointsman.replay.summary import SLO, meets_slo


@dataclass(frozen=True)
class RuleRow:
    """One deciding rule's requests: ``requests``; ``ran_on`` (completed requests per target that
    answered; an escalated one counts where its answer came from); ``escalated``; ``slo_missed``
    (rejected or over an objective); ``quality`` and ``reference_quality`` (means over its requests
    with a known quality; NaN without); ``gap`` (share of the run's gap to the reference, module
    docstring); ``frontier_usd`` (API bills, escalated drafts' frontier calls included) and
    ``mean_p_hard`` (NaN when no estimate)."""

    rule: str
    requests: int
    ran_on: dict[str, int]
    escalated: int
    slo_missed: int
    quality: float
    reference_quality: float
    gap: float
    frontier_usd: float
    mean_p_hard: float

    def to_dict(self) -> dict[str, object]:
        """The row as JSON-ready data."""
        return asdict(self)


def by_rule(result: ReplayResult, decisions: Mapping[int, tuple[str, str, str, float | None]], slo: SLO,
            quality: Callable[[RequestResult], float | None],
            reference: Callable[[RequestResult], float | None]) -> list[RuleRow]:
    """The rows of the module docstring, most requests first; ``quality(r)`` scores a completed
    request where it ran, ``reference(r)`` what it would score on the reference target (None:
    unknown). Requests the router never saw count under ``(not routed)``."""
    groups: dict[str, list[RequestResult]] = {}
    for r in result.requests:
        rule = decisions[r.index][0] if r.index in decisions else "(not routed)"
        groups.setdefault(rule, []).append(r)
    scored = sum(1 for r in result.requests if reference(r) is not None)
    rows = []
    for rule, reqs in groups.items():
        pairs = []
        for r in reqs:
            ref = reference(r)
            if ref is None:
                continue
            q = quality(r) if r.rejected is None else 0.0
            pairs.append((0.0 if q is None else q, ref))
        hard = [p for p in (decisions.get(r.index, ("", "", "", None))[3] for r in reqs) if p is not None]
        rows.append(RuleRow(
            rule=rule, requests=len(reqs),
            ran_on=dict(Counter(r.target for r in reqs if r.rejected is None and r.target is not None)),
            escalated=sum(r.escalated for r in reqs),
            slo_missed=sum(not meets_slo(r, slo) for r in reqs),
            quality=sum(q for q, _ in pairs) / len(pairs) if pairs else math.nan,
            reference_quality=sum(a for _, a in pairs) / len(pairs) if pairs else math.nan,
            gap=sum(a - q for q, a in pairs) / scored if scored else math.nan,
            frontier_usd=sum(r.cost_usd for r in reqs if r.rejected is None),
            mean_p_hard=sum(hard) / len(hard) if hard else math.nan))
    rows.sort(key=lambda x: -x.requests)
    return rows


def format_rows(rows: Sequence[RuleRow]) -> str:
    """``rows`` as a text table (one line per rule)."""
    head = f"  {'rule':26s} {'requests':>8s} {'missed':>6s} {'esc':>4s} {'quality':>7s} {'ref':>6s} {'gap':>7s} " \
           f"{'frontier $':>10s} {'p_hard':>6s}  ran on"
    lines = [head]
    for x in rows:
        ran = ", ".join(f"{t} {n}" for t, n in sorted(x.ran_on.items(), key=lambda kv: -kv[1]))
        lines.append(f"  {x.rule[:26]:26s} {x.requests:8d} {x.slo_missed:6d} {x.escalated:4d} {x.quality:7.3f} "
                     f"{x.reference_quality:6.3f} {x.gap:+7.4f} {x.frontier_usd:10.2f} {x.mean_p_hard:6.2f}  {ran}")
    return "\n".join(lines)


__all__ = ["RuleRow", "by_rule", "format_rows"]
