"""One plan, start to end: search (on the trace's busiest window when it is long), replay the
cheapest candidates and the base fleet on the whole trace, recommend, and replay the
recommended and the base shape at the other traffic scales.

``plan(space, inputs, make_estimator, settings, log)`` -> ``PlanOutcome``. The time budget
covers all of it but the validation and growth replays, which always complete (at most
``candidates`` + 1 whole-trace replays, then two per other scale): the search stops early enough to
leave them their share,
estimated from the search's own replay times (seconds per request replayed, times the whole
trace's requests, per round of ``workers`` replays: the rounds of the base and ``candidates``, one per
other scale).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from pointsman.estimator.estimate import Estimator
from pointsman.plan.evaluate import Job, PlanInputs, ShapeResult, Workers
from pointsman.plan.front import pareto_front, recommend
from pointsman.plan.search import SearchResult, busiest_window, run_jobs, search, validation_candidates
from pointsman.plan.shapes import Shape, ShapeSpace
from pointsman.replay.outcome_draw import OutcomeRow, quality_of


@dataclass(frozen=True)
class PlanSettings:
    """``goal`` (SLO attainment to reach), ``budget_usd_per_month``, ``growth`` (traffic scales,
    relative to the planned one, to replay the recommended and base shapes at), ``workers``,
    ``time_budget_s``, ``max_replays`` (of the search, ``plan.search``), ``assume_monotone``, ``search_requests`` (the search
    runs on the busiest window of this many requests; the whole trace when shorter) and
    ``candidates`` (search results replayed on the whole trace, cheapest first, ``workers`` at a
    time with the base fleet in the first round, until one meets the goal; the replays after it in
    its round are dropped, so the plan is the same on any number of workers); ``min_quality``: the
    quality floor a recommended shape must reach too (``front.recommend``; 0 = none), set on
    the whole trace; ``frontier``: the target all-frontier runs on (its quality on the outcome rows
    is what the floor is a share of), which scales the floor to the search window's prompts."""

    goal: float = 0.9
    budget_usd_per_month: float = math.inf
    growth: tuple[float, ...] = ()
    workers: int = 2
    time_budget_s: float = 720.0
    max_replays: float = math.inf
    assume_monotone: bool = True
    search_requests: int = 1000
    candidates: int = 3
    min_quality: float = 0.0
    frontier: str | None = None


def window_floor(min_quality: float, whole: Sequence[OutcomeRow | None] | None,
                 part: Sequence[OutcomeRow | None] | None, frontier: str | None) -> float:
    """The quality floor on a window of the trace: ``min_quality`` (set against all-frontier's
    quality on the ``whole`` trace's outcome rows) times the ratio of all-frontier's quality on
    the window's rows (``part``) to that on the whole trace's: a window of harder prompts gets a
    lower floor, as all-frontier's own quality is lower there. ``min_quality`` itself without rows
    or a frontier target."""
    if min_quality <= 0 or frontier is None or not whole or not part:
        return min_quality

    def mean(rows: Sequence[OutcomeRow | None]) -> float:
        scores = [q for q in (quality_of(r, True, frontier) for r in rows) if q is not None]
        return sum(scores) / len(scores) if scores else math.nan

    a, b = mean(whole), mean(part)
    return min_quality * b / a if a > 0 and not math.isnan(b) else min_quality


@dataclass
class PlanOutcome:
    """``found``: the search; ``window``: (start, end) request indices it ran on; ``windowed``:
    whether that is less than the whole trace; ``front``: Pareto front of the search results;
    ``full``: results on the whole trace at the planned scale (the base first); ``base`` and
    ``recommended`` among them; ``growth``: label -> scale -> result (scale 1 included);
    ``wall_s``; ``search_floor``: the quality floor the search used on its window
    (``window_floor``)."""

    found: SearchResult
    window: tuple[int, int]
    windowed: bool
    front: list[ShapeResult]
    full: list[ShapeResult]
    base: ShapeResult
    recommended: ShapeResult | None
    growth: dict[str, dict[float, ShapeResult]] = field(default_factory=dict)
    wall_s: float = 0.0
    search_floor: float = 0.0


def _beats_base(full: Sequence[ShapeResult], base: Shape, settings: PlanSettings) -> bool:
    """Whether the recommendation among ``full`` (whole-trace replays, in validation order) is not ``base``."""
    best = recommend(full, settings.goal, settings.budget_usd_per_month, settings.min_quality)
    return best is not None and best.shape != base


def plan(space: ShapeSpace, inputs: PlanInputs, make_estimator: Callable[[], Estimator], settings: PlanSettings,
         log: Callable[[ShapeResult, int], None] | None = None) -> PlanOutcome:
    """The plan of the module docstring; ``inputs`` hold the whole (possibly scaled) trace."""
    t0 = time.monotonic()
    start, end = busiest_window(inputs.trace, settings.search_requests)
    windowed = end - start < len(inputs.trace)
    window = replace(inputs, trace=inputs.trace[start:end],
                     texts=inputs.texts[start:end] if inputs.texts is not None else None,
                     rows=inputs.rows[start:end] if inputs.rows is not None else None) if windowed else inputs
    per_request_s: list[float] = []

    def logged(r: ShapeResult, n: int) -> None:
        if r.ok and r.requests:
            per_request_s.append(r.wall_s / r.requests)
        if log is not None:
            log(r, n)

    def rounds(jobs: int) -> int:
        return math.ceil(jobs / settings.workers)

    def full_replay_s() -> float:
        if not per_request_s:
            return 0.0
        return sum(per_request_s) / len(per_request_s) * len(inputs.trace)

    def search_deadline() -> float:
        later = (rounds(1 + settings.candidates) if windowed else 0) + \
            rounds(2 * sum(1 for x in settings.growth if x != 1.0))
        return t0 + settings.time_budget_s - 1.5 * later * full_replay_s()

    with Workers({"search": window, "full": inputs}, make_estimator, settings.workers) as pool:
        floor = window_floor(settings.min_quality, inputs.rows, window.rows, settings.frontier) if windowed \
            else settings.min_quality
        found = search(space, window, pool, goal=settings.goal, budget_usd_per_month=settings.budget_usd_per_month,
                       deadline=search_deadline, assume_monotone=settings.assume_monotone, log=logged,
                       min_quality=floor, max_replays=settings.max_replays)
        results = list(found.results.values())
        if windowed:
            picked = [r.shape for r in validation_candidates(results, settings.goal, settings.candidates,
                                                             settings.budget_usd_per_month, floor)]
            queue: list[Shape] = [space.base, *[p for p in picked if p != space.base]]
            full = []
            while queue:  # a round at a time, until a candidate meets the goal (always: at most candidates + 1)
                chunk, queue = queue[:settings.workers], queue[settings.workers:]
                full += run_jobs([("full", s, 1.0) for s in chunk], pool, logged)
                done = next((k for k in range(1, len(full) + 1) if _beats_base(full[:k], space.base, settings)), 0)
                if done:  # the replays after that candidate's are dropped: the same ones on any number of workers
                    full = full[:done]
                    break
        else:
            full = results
        full = [r for r in full if r.ok]
        base = next((r for r in full if r.shape == space.base), None)
        if base is None:  # the budget ran out before the base fleet's replay: do it now
            base = next(iter(pool.map([("full", space.base, 1.0)])))
            full.append(base)
        full.sort(key=lambda r: r.shape != space.base)
        rec = recommend(full, settings.goal, settings.budget_usd_per_month, settings.min_quality)
        grown: list[Shape] = [space.base] + ([rec.shape] if rec is not None and rec.shape != space.base else [])
        growth: dict[str, dict[float, ShapeResult]] = {}
        for r in full:
            if r.shape in grown:
                growth[r.label] = {1.0: r}
        scale_jobs: list[Job] = [("full", s, x) for s in grown for x in settings.growth if x != 1.0]
        if scale_jobs:  # always completed: the growth of the recommended shape is part of the answer
            for g in run_jobs(scale_jobs, pool, logged):
                growth.setdefault(g.label, {})[g.scale] = g
    return PlanOutcome(found, (start, end), windowed, pareto_front(results), full, base, rec,
                       growth if scale_jobs else {}, time.monotonic() - t0, floor)


__all__ = ["PlanOutcome", "PlanSettings", "plan"]
