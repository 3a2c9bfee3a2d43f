"""The search over fleet shapes: local moves from the base fleet and the smallest shapes, pruned,
in parallel, under a time budget; then the cheapest candidates replayed on the whole trace.

``search(space, inputs, workers, goal=...)`` -> ``SearchResult``: every shape evaluated on the
workers' ``search`` inputs (the whole trace, or its busiest window: ``busiest_window``). Steps:

1. **starts**: the base fleet's shape, the base with its prefill replicas twice as wide (long
   prompts that miss the TTFT objective on any number of template replicas), then the smallest
   shapes (one replica per pool: each
   target aggregated, and with one prefill + one decode replica where it can be disaggregated,
   the prefill replica also twice as wide; the base's tier and GPU), and one aggregated replica per
   target at the smallest step budget (``STEP_TOKENS``: short answers beside long prompts);
2. **expand** one evaluated shape at a time: replay up to ``batch_size`` of its neighbours
   (``ShapeSpace.neighbors``: one replica more or fewer, one moved between pools, aggregated <->
   disaggregated, prefill replicas twice or half as wide, another step budget, a target dropped,
   the next KV tier size, another GPU type, one policy knob to its next value) in parallel.
   Which shape: while none qualifies (meets the SLO
   goal, ``ShapeResult.meets``: no overloaded pool, and the quality floor), the one closest to
   qualifying (``_shortfall``: attainment under the goal plus load over 1 plus quality under the
   floor; an ascent), its neighbours ordered by where its misses and overloaded pools
   are (``_priority``: prefill GPUs for TTFT misses, decode replicas for TPOT misses, per dollar;
   policy knobs, then wider prefill replicas first when only quality is short); then, in turn,
   the cheapest not fully expanded shape that qualifies (a descent, largest saving first) and the
   cheapest that falls short by at most ``NEAR_MISS`` (a cheaper way up; near misses alone would
   crowd out the descent: every policy setting of a cheap near miss is another near miss);
   Taking turns with the expansions (so a smaller fleet among a tuned one's neighbours is
   tuned next), the cheapest fleet (replica counts, widths, budgets, tier, GPU; lowest
   cost floor first, so smaller shapes first) that meets the SLO goal and has not been **tuned**
   yet is: with a quality floor, the policy's frontier threshold and price cap
   (``TuningSpace.threshold_axes``) are set by bisection against the floor (``staircase``:
   quality rises as the threshold falls and as the cap rises, so for each cap, from the policy's
   own down, the highest threshold that still qualifies is found in a few replays, ``PROBES``
   per round (whatever the number of workers: the probes, and so the plan, are the same on any);
   a lower cap's threshold is at most the one above's, a
   cap at which even the lowest threshold misses ends it, as do two caps in a row that saved
   nothing). Each cap's answer is the cheapest setting of that cap on that fleet (a higher
   threshold routes no more to the frontier); fleets whose floor is at least the best qualifying
   cost are not tuned;
3. **prune** before replaying: a neighbour whose cost floor (GPU rent, idle power, KV DRAM:
   ``ShapeSpace.floor_usd_per_month``) is at least the best qualifying shape's monthly cost can
   neither be recommended nor beat it, and from a shape that meets the goal only neighbours
   with no higher floor are tried (moves and shrinks: added GPUs would have to save more in
   frontier bills than they cost) (``pruned_cost``); with ``assume_monotone``, a neighbour
   with no more replicas in any pool and no larger tier than a shape that missed the goal is
   taken to miss it too (``pruned_miss``: more capacity is assumed never to hurt, which a
   policy's routing does not guarantee); a shape whose fleet or policy does not compile is
   skipped (``invalid``);
4. stop when no shape is left to expand (``converged``), at the deadline (``time budget``) or
   after ``max_replays`` replays (``replay limit``): the best shape so far stands, and
   ``SearchResult.untuned`` and ``unexpanded`` say what was left; the starts are always replayed.

When the search ran on a window, ``validation_candidates`` (the cheapest shapes meeting the goal
there, or nearly) are replayed on the whole trace with the base fleet (``run_jobs``), and the
recommendation comes from those replays only.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from pointsman.datasets.traces import TraceRequest
from pointsman.errors import FleetError, PolicyError
from pointsman.plan.evaluate import Job, PlanInputs, ShapeResult, Workers, compile_shape
from pointsman.plan.front import recommend
from pointsman.plan.shapes import STEP_TOKENS, Pools, Shape, ShapeSpace
from pointsman.plan.tuning import TuningSpace

#: Shapes missing the goal by at most this much SLO attainment are expanded once one meets it.
NEAR_MISS = 0.15
#: Threshold probes per bisection round (``staircase``): a constant, not the number of workers, so a plan
#: replays the same shapes on any number of them.
PROBES = 2


@dataclass
class SearchResult:
    """``results`` by shape (scale 1, evaluation order), ``invalid`` shapes with why, the counts of
    pruned neighbours, ``stopped`` (``converged``, ``time budget`` or ``replay limit``) and ``wall_s``;
    when stopped early, what was left: ``untuned`` (one shape per fleet that meets the SLO goal, could
    still undercut the best and whose thresholds were not set, lowest cost floor first) and
    ``unexpanded`` (shapes whose neighbours were still to be tried, the next first)."""

    results: dict[Shape, ShapeResult] = field(default_factory=dict)
    invalid: dict[Shape, str] = field(default_factory=dict)
    pruned_cost: int = 0
    pruned_miss: int = 0
    stopped: str = "converged"
    wall_s: float = 0.0
    untuned: list[Shape] = field(default_factory=list)
    unexpanded: list[Shape] = field(default_factory=list)


def smallest_shapes(space: ShapeSpace) -> list[Shape]:
    """The base with its prefill replicas twice as wide, then one replica per pool, then one
    aggregated replica per target at the smallest step budget (module docstring, step 1); each with
    the base's tier, none without ``space.kv_tiers``."""
    base = space.base
    wide = base
    for t in space.targets:
        p = base.of(t.name)
        wide = wide.with_pools(t.name, replace(p, prefill_tp=2 if p.prefill else p.prefill_tp,
                                               kv_level=p.kv_level if space.kv_tiers else 0))
    out = [base]
    for t in space.targets:
        kv = base.of(t.name).kv_level if space.kv_tiers else 0
        variants = [Pools(1, 0, 0, kv)]
        if t.disaggregable:
            variants += [Pools(1, 1, 1, kv), Pools(0, 1, 1, kv), Pools(0, 1, 1, kv, prefill_tp=2)]
        out = [s.with_pools(t.name, v) for s in out for v in variants]
    first = out[0]  # one aggregated replica per target, also at the smallest step budget (module docstring)
    chunked = first
    for t in space.targets:
        chunked = chunked.with_pools(t.name, replace(first.of(t.name), max_num_batched_tokens=min(STEP_TOKENS)))
    return ([wide] if wide != base else []) + out + [chunked]


def _shortfall(r: ShapeResult, goal: float, min_quality: float) -> float:
    """How far ``r`` is from qualifying: SLO attainment under ``goal``, plus its most loaded pool's
    load over 1 (``ShapeResult.overloaded``), plus quality under ``min_quality`` (NaN quality: 0),
    all shares; 0 exactly when ``r.meets(goal)`` and its quality reaches the floor."""
    q = 0.0 if math.isnan(r.quality) else r.quality
    return max(0.0, goal - r.slo_attainment) + max(0.0, r.peak_load[1] - 1.0) + max(0.0, min_quality - q)


def _priority(space: ShapeSpace, current: ShapeResult, shape: Shape, ascending: bool,
              quality_short: bool = False) -> tuple[float, float]:
    """Sort key of a neighbour (lower first). Ascending: replicas added where ``current``'s
    misses are (prefill replicas for TTFT misses, decode for TPOT, aggregated for both, all
    three for rejections; an overloaded pool as its load over 1 times the requests missing
    there), per dollar of floor added; when ``current`` meets the SLO goal but
    not the quality floor (``quality_short``), a policy setting changed first (it costs no GPU; a
    move toward quality first, ``TuningSpace.toward_quality``), then wider prefill replicas (long
    prompts that overflow to a frontier tier because their prefill alone would miss the TTFT
    objective stay on-prem).
    Descending: the largest saving first."""
    delta = space.floor_usd_per_month(shape) - space.floor_usd_per_month(current.shape)
    if not ascending:
        return (delta, 0.0)
    if quality_short and shape.tuning != current.shape.tuning:
        return (-math.inf, 0.0 if space.policy.toward_quality(current.shape.tuning, shape.tuning) else 1.0)
    if quality_short and any(shape.of(t.name).prefill_tp > current.shape.of(t.name).prefill_tp for t in space.targets):
        return (-1e9, delta)  # wider prefill replicas keep long prompts on-prem instead of overflowing
    gain = 0.0
    for t in space.targets:
        m = current.misses.get(t.name, {})
        ttft, tpot, rej = m.get("ttft", 0), m.get("tpot", 0), m.get("rejected", 0)
        # an overloaded pool counts as that share of the requests missing there
        over = {role: max(0.0, current.load.get(f"{t.name}/{role}", 0.0) - 1.0) * current.requests
                for role in ("aggregated", "prefill", "decode")}
        a, b = current.shape.of(t.name), shape.of(t.name)
        gain += (b.prefill * b.prefill_tp - a.prefill * a.prefill_tp) * (ttft + rej + over["prefill"]) \
            + (b.decode - a.decode) * (tpot + rej + over["decode"]) \
            + (b.aggregated - a.aggregated) * (ttft + tpot + rej + over["aggregated"]) + (b.kv_level - a.kv_level) * ttft * 0.5
    return (-gain / max(delta, 1.0) if gain > 0 else 1.0, delta)


def _between(lo: int, hi: int, k: int) -> list[int]:
    """Up to ``k`` indices strictly between ``lo`` and ``hi``, evenly spaced (a k-ary search's probes;
    the midpoint when ``k`` is 1)."""
    n = min(k, hi - lo - 1)
    return sorted({lo + round((i + 1) * (hi - lo) / (n + 1)) for i in range(n)} - {lo, hi}) if n > 0 else []


def _edge(shape_at: Callable[[int], Shape], top: int, probe: Callable[[list[Shape]], bool],
          ok: Callable[[Shape], bool], k: int) -> int | None:
    """The highest ``j`` in 0..``top`` whose ``shape_at(j)`` qualifies, where 0..edge qualify and the
    rest do not (-1: none does), by k-ary search (``k`` probes per round); None at the deadline."""
    good, bad = -1, top + 1
    while bad - good > 1:
        js = _between(good, bad, k)
        if not probe([shape_at(j) for j in js]):
            return None
        bad = min([bad, *(j for j in js if not ok(shape_at(j)))])
        good = max([good, *(j for j in js if j < bad and ok(shape_at(j)))])
    return good


def staircase(shape: Shape, policy: TuningSpace, probe: Callable[[list[Shape]], bool],
              ok: Callable[[Shape], bool], usd: Callable[[Shape], float], k: int = 1) -> bool:
    """Set ``shape``'s frontier threshold and price cap (``policy.threshold_axes()``) by bisection
    against the quality floor (module docstring, step 2): ``probe(shapes)`` replays them (False at
    the deadline), ``ok(shape)`` says whether a replayed one qualifies (SLO goal and floor),
    ``usd(shape)`` its monthly cost; ``k`` probes per round. With a cap and no threshold knob, the
    lowest cap that qualifies. Returns False when the deadline passed; the replays are the
    caller's (``probe``)."""
    t, c = policy.threshold_axes()

    def at(cap: int | None, j: int | None) -> Shape:
        tuning = list(shape.tuning)
        for i, v in ((t, j), (c, cap)):
            if i is not None and v is not None:
                tuning[i] = v
        return replace(shape, tuning=tuple(tuning))

    if t is None:
        if c is not None:  # quality rises with the cap: the edge of the caps counted from the top
            n = len(policy.knobs[c].values) - 1
            return _edge(lambda j: at(n - j, None), n, probe, ok, k) is not None
        return True
    caps: list[int | None] = list(range(len(policy.knobs[c].values) - 1, -1, -1)) if c is not None else [None]
    top, best, stale = len(policy.knobs[t].values) - 1, math.inf, 0
    for cap in caps:
        good = _edge(functools.partial(at, cap), top, probe, ok, k)
        if good is None:
            return False
        if good < 0:  # even the lowest threshold misses: a lower cap sends still less to the frontier
            break
        cost = usd(at(cap, good))
        best, stale = (cost, 0) if cost < best else (best, stale + 1)
        if stale >= 2:
            break
        top = good  # a lower cap needs a threshold at most this one to reach the same floor
    return True


def search(space: ShapeSpace, inputs: PlanInputs, workers: Workers, *, goal: float,
           budget_usd_per_month: float = math.inf, deadline: float | Callable[[], float] = math.inf,
           assume_monotone: bool = True, log: Callable[[ShapeResult, int], None] | None = None,
           batch_size: int = 4, min_quality: float = 0.0, max_replays: float = math.inf) -> SearchResult:
    """The search of the module docstring on ``workers``' ``search`` inputs (``inputs``, for the
    compile check); ``min_quality``: the quality floor a recommendation meets too (``front.recommend``;
    the ascent still follows SLO attainment); ``deadline`` on ``time.monotonic()`` (or a callable giving it, re-read after
    each replay); ``log(result, n)`` hears each evaluated shape (n: shapes evaluated so far);
    ``batch_size``: neighbours replayed per expansion (the best first, ``_priority``; a shape is
    expanded again until none is left); ``max_replays``: stop after this many replays (the starts
    always complete; a batch is cut to what is left): unlike ``deadline``, it does not depend on the
    machine's speed."""
    t0 = time.monotonic()
    out = SearchResult()
    expanded: set[Shape] = set()
    turn = replayed = 0

    def late() -> bool:
        if replayed >= max_replays:
            out.stopped = "replay limit"
        elif time.monotonic() > (deadline() if callable(deadline) else deadline):
            out.stopped = "time budget"
        return out.stopped != "converged"

    def compiles(shape: Shape) -> bool:
        if shape in out.invalid:
            return False
        try:
            compile_shape(inputs, shape)
        except (FleetError, PolicyError) as exc:
            out.invalid[shape] = str(exc).splitlines()[0]
            return False
        return True

    def run(shapes: list[Shape], always: bool = False) -> bool:
        """Evaluate ``shapes`` (all of them when ``always``, else at most the replays left); False past
        the deadline or the replay limit."""
        nonlocal replayed
        if not always:
            shapes = shapes[:max(0, int(min(len(shapes), max_replays - replayed)))]
        replayed += len(shapes)
        for r in workers.map(("search", s, 1.0) for s in shapes):
            if r.ok:
                out.results[r.shape] = r
            else:
                out.invalid[r.shape] = r.error or "invalid"
            if log is not None:
                log(r, len(out.results))
            if not always and late():
                return False
        return not late()

    def admissible(shape: Shape, ceiling: float = math.inf) -> bool:
        if shape in out.results or shape in out.invalid or not space.valid(shape):
            return False
        if space.floor_usd_per_month(shape) > ceiling:
            out.pruned_cost += 1
            return False
        best = recommend(list(out.results.values()), goal, budget_usd_per_month, min_quality)
        if best is not None and space.floor_usd_per_month(shape) >= best.usd_per_month:
            out.pruned_cost += 1
            return False
        floor = space.floor_usd_per_month(shape)
        if floor > budget_usd_per_month:
            out.pruned_cost += 1
            return False
        if assume_monotone and any(not r.meets(goal) and space.covered_by(shape, r.shape)
                                   for r in out.results.values()):
            out.pruned_miss += 1
            return False
        return compiles(shape)

    tuned: set[tuple[tuple[tuple[str, Pools], ...], str]] = set()
    tune_next = True

    def qualifies(r: ShapeResult | None) -> bool:
        return r is not None and _shortfall(r, goal, min_quality) == 0

    def probe(shapes: list[Shape]) -> bool:
        """Replay those of ``shapes`` not evaluated yet; False at the deadline."""
        todo = [s for s in dict.fromkeys(shapes) if s not in out.results and s not in out.invalid and compiles(s)]
        return run(todo) if todo else not late()

    def tune(r: ShapeResult) -> bool:
        return staircase(r.shape, space.policy, probe, lambda s: qualifies(out.results.get(s)),
                         lambda s: out.results[s].usd_per_month, PROBES)

    def untuned(best: ShapeResult | None) -> list[ShapeResult]:
        """One result per fleet meeting the SLO goal that is not tuned yet and whose floor is under
        ``best``'s cost, lowest floor first (module docstring)."""
        if space.policy.threshold_axes() == (None, None) or min_quality <= 0:
            return []
        fleets: dict[tuple[tuple[tuple[str, Pools], ...], str], ShapeResult] = {}
        for r in sorted(out.results.values(), key=lambda r: (space.floor_usd_per_month(r.shape), r.usd_per_month)):
            if r.meets(goal) and (r.shape.pools, r.shape.gpu) not in tuned \
                    and (best is None or space.floor_usd_per_month(r.shape) < best.usd_per_month):
                fleets.setdefault((r.shape.pools, r.shape.gpu), r)
        return list(fleets.values())

    def pending(best: ShapeResult | None) -> list[ShapeResult]:
        """The results still to expand, the next first (module docstring: ascent, then descent)."""
        todo = [r for r in out.results.values() if r.shape not in expanded]
        if best is None:
            return sorted(todo, key=lambda r: (_shortfall(r, goal, min_quality), r.usd_per_month))
        return sorted((r for r in todo if _shortfall(r, goal, min_quality) <= NEAR_MISS
                       and space.floor_usd_per_month(r.shape) < best.usd_per_month), key=lambda r: r.usd_per_month)

    run([space.base], always=True)
    starts = [s for s in smallest_shapes(space) if admissible(s)]
    run(starts, always=True)
    while not late():
        best = recommend(list(out.results.values()), goal, budget_usd_per_month, min_quality)
        todo = pending(best)
        fleets = untuned(best)
        if fleets and (tune_next or not todo):  # tunings and expansions take turns
            tune_next = False
            key = (fleets[0].shape.pools, fleets[0].shape.gpu)
            tuned.add(key)
            if not tune(fleets[0]):
                tuned.discard(key)  # cut short: still untuned
            continue
        tune_next = True  # after an expansion: a smaller fleet among its neighbours is tuned next
        if not todo:
            break
        current = todo[0]
        if best is not None:  # alternate: the cheapest qualifying shape, then the cheapest near miss
            kind = [r for r in todo if (_shortfall(r, goal, min_quality) == 0) == (turn % 2 == 0)]
            current = kind[0] if kind else current
            turn += 1
        meets_goal = _shortfall(current, goal, min_quality) == 0
        floor = space.floor_usd_per_month(current.shape)
        batch = [s for s in space.neighbors(current.shape)
                 if admissible(s, floor if meets_goal else math.inf)]
        short = current.meets(goal) and not meets_goal
        batch.sort(key=lambda s: _priority(space, current, s, not meets_goal, short))
        if len(batch) <= batch_size:
            expanded.add(current.shape)
        run(batch[:batch_size])
    if out.stopped != "converged":
        best = recommend(list(out.results.values()), goal, budget_usd_per_month, min_quality)
        out.untuned = [r.shape for r in untuned(best)]
        out.unexpanded = [r.shape for r in pending(best)]
    out.wall_s = time.monotonic() - t0
    return out


def busiest_window(trace: Sequence[TraceRequest], n: int) -> tuple[int, int]:
    """(start, end) indices of the ``n`` consecutive requests arriving in the shortest time: the
    trace's peak, where a shape is most likely to miss the SLO (so a search on it errs on the
    safe side); the whole trace when it has at most ``n`` requests."""
    if n >= len(trace):
        return 0, len(trace)
    spans = [trace[i + n - 1].arrival_s - trace[i].arrival_s for i in range(len(trace) - n + 1)]
    start = min(range(len(spans)), key=spans.__getitem__)
    return start, start + n


def validation_candidates(results: Sequence[ShapeResult], goal: float, k: int,
                          budget_usd_per_month: float = math.inf, min_quality: float = 0.0) -> list[ShapeResult]:
    """Up to ``k`` search results within the budget that meet ``goal`` (``ShapeResult.meets``) and
    ``min_quality``, cheapest first, then (the whole trace may be easier than its peak window) those
    missing either, or overloaded, by at most a third of ``NEAR_MISS`` (NaN quality passes only a
    floor of 0), cheapest first; results
    with the same cost, attainment and quality as one already taken (policy settings that changed
    no decision) are left out."""
    near = [r for r in results if r.ok and r.slo_attainment >= goal - NEAR_MISS / 3
            and r.peak_load[1] <= 1 + NEAR_MISS / 3 and r.usd_per_month <= budget_usd_per_month
            and (min_quality <= 0 or (not math.isnan(r.quality) and r.quality >= min_quality - NEAR_MISS / 3))]
    near.sort(key=lambda r: (_shortfall(r, goal, min_quality) > 0, r.usd_per_month, -r.slo_attainment))
    out: list[ShapeResult] = []
    seen: set[tuple[float, float, float]] = set()
    for r in near:
        key = (r.usd_per_month, r.slo_attainment, r.quality)
        if key not in seen and len(out) < k:
            seen.add(key)
            out.append(r)
    return out


def run_jobs(jobs: list[Job], workers: Workers, log: Callable[[ShapeResult, int], None] | None = None,
             deadline: float = math.inf) -> list[ShapeResult]:
    """``jobs`` on ``workers``; stops taking results at ``deadline``."""
    done: list[ShapeResult] = []
    for r in workers.map(jobs):
        done.append(r)
        if log is not None:
            log(r, len(done))
        if time.monotonic() > deadline:
            break
    return done


def meets_up_to(shape: Shape, scale_results: list[ShapeResult], scales: list[float], goal: float) -> float:
    """The highest of ``scales`` up to which ``shape`` meets ``goal`` (``ShapeResult.meets``) at every
    scale (0 when it misses at the first)."""
    by_scale = {r.scale: r for r in scale_results if r.shape == shape and r.ok}
    ok = 0.0
    for x in sorted(scales):
        r = by_scale.get(x)
        if r is None or not r.meets(goal):
            break
        ok = x
    return ok


__all__ = ["NEAR_MISS", "PROBES", "SearchResult", "busiest_window", "meets_up_to", "run_jobs", "search", "smallest_shapes",
           "staircase", "validation_candidates"]
