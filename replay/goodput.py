"""Goodput as DistServe defines it: the highest request rate at which at least 90% of the
requests meet both their TTFT and their TPOT objective, and per GPU that rate divided by the
GPUs provisioned (Zhong et al., "DistServe", OSDI'24, arXiv 2401.09670, §1-2).

``search(trace, make_router, sim, slo)`` -> ``GoodputResult``. The trace's arrival times are
scaled (``scaled``: request i arrives at ``t0 + (t_i - t0) / x``, so its rate is x times the
trace's mean rate N / (last - first arrival)) and the scale is searched. A scale passes when the
attainment reaches the goal and no on-prem pool is overloaded (``replay.summary.pool_loads`` above
1, the test ``pointsman plan`` applies): an overloaded pool's queues grow without bound, and a short
sample meets the SLO only because it ends (the first 300 Azure conv requests met 100% at 64x, 228
req/s, with every 70B pool at 160-204% of its GPU time; the fleet file's own throughputs give at
most about 143 req/s of those requests):

1. bracket: from x = 1, double while the attainment is at least the goal, or halve until it
   is (``min_scale`` ends the search with goodput 0);
2. bisect in log space until the bracket is within ``rel_tol`` (5%);
3. ``max_goodput_rps`` = the highest passing scale x the trace's mean rate; when every scale up
   to ``max_scale`` passes (a sample too small or too light to load the fleet), that ceiling,
   flagged ``capped``: a lower bound.

Assumes attainment falls as the rate rises (DistServe's too); a non-monotone curve gives one
of its crossings. Each point is one full replay of the (capped) trace with a fresh router
from ``make_router``; a point stops as soon as more than (1 - goal) of the requests have
failed (it cannot pass), which makes overloaded points cheap. A request fails when it is
rejected or misses either objective (a one-token answer has no TPOT and passes that part).

"Frontier targets disabled" (what the on-prem fleet sustains) is the caller's routing:
``runs.goodput_routers`` gives policies an engine whose frontier endpoints are marked
unhealthy and baselines that never leave on-prem, on a fleet without a spill target;
``frontier_guard`` rejects any assignment that still names a frontier tier.
``MemoEstimator`` keeps each prompt's difficulty across the points (the same text at every rate).

``slo_floor(trace, sim, slo)`` says why a goodput is 0 at any rate: the requests that miss the SLO
on an idle fleet by the hardware model alone (too long for every context window, a cold prefill
longer than the TTFT objective on every target, a one-sequence decode step over the TPOT one).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pointsman.datasets.traces import TraceRequest
from pointsman.estimator.estimate import DifficultyEstimate, Estimator, TokenIdsEstimator
from pointsman.estimator.features import RequestFeatures
from pointsman.replay.hardware import ReplicaSpec
from pointsman.replay.results import RequestResult
from pointsman.replay.router import Assignment, FleetView, Router
from pointsman.replay.sim_fleet import SimFleet
from pointsman.replay.simulator import simulate
from pointsman.replay.summary import SLO, pool_loads

if TYPE_CHECKING:  # pragma: no cover
    from tokenizers import Tokenizer

#: DistServe's SLO attainment goal: 90% of requests meet both objectives.
ATTAINMENT_GOAL = 0.9


@dataclass(frozen=True)
class GoodputPoint:
    """One replay of the search: ``scale`` of the arrival rate, the resulting ``rate_rps``,
    ``attainment`` (share of requests meeting both objectives; a lower bound ``complete=False``
    when the replay stopped early because it could no longer pass), ``load``: the most loaded
    on-prem pool's work over its GPU time in the arrival span (``replay.summary.pool_loads``; NaN
    when the replay stopped early); the point passes when ``attainment`` reaches the goal and
    ``load`` is at most 1 (``passed``)."""

    scale: float
    rate_rps: float
    attainment: float
    complete: bool
    load: float = math.nan
    passed: bool = False


@dataclass(frozen=True)
class GoodputResult:
    """``max_goodput_rps``: highest rate (requests/s) whose attainment reached the goal (0 when
    even ``min_scale`` did not); ``max_goodput_rps_per_gpu``: that / ``gpus`` (on-prem GPUs
    provisioned); ``base_rate_rps``: the trace's mean rate; ``points`` in evaluation order;
    ``requests``: simulated requests per point; ``goal``: the attainment goal; ``wall_s``: time
    the search took; ``capped``: every scale up to ``max_scale`` passed, so ``max_goodput_rps`` is
    the search's ceiling, a lower bound of the goodput, not a measured maximum."""

    max_goodput_rps: float
    max_goodput_rps_per_gpu: float
    gpus: int
    base_rate_rps: float
    requests: int
    points: tuple[GoodputPoint, ...]
    wall_s: float
    goal: float = ATTAINMENT_GOAL
    capped: bool = False

    def to_dict(self) -> dict[str, object]:
        """Plain JSON-ready dict."""
        return dataclasses.asdict(self)


def scaled(trace: Sequence[TraceRequest], scale: float) -> list[TraceRequest]:
    """``trace`` with its inter-arrival times divided by ``scale`` (the first arrival stays)."""
    if not trace:
        return []
    t0 = min(r.arrival_s for r in trace)
    return [dataclasses.replace(r, arrival_s=t0 + (r.arrival_s - t0) / scale) for r in trace]


def mean_rate(trace: Sequence[TraceRequest]) -> float:
    """Requests per second of ``trace``: N / (last - first arrival); inf for one instant."""
    if len(trace) < 2:
        return math.inf
    times = [r.arrival_s for r in trace]
    span = max(times) - min(times)
    return len(trace) / span if span > 0 else math.inf


def meets(r: RequestResult, slo: SLO) -> bool:
    """Whether a request meets both objectives (rejected ones do not)."""
    return (r.rejected is None and r.ttft_s is not None and r.ttft_s <= slo.ttft_s
            and (r.tpot_s is None or r.tpot_s <= slo.tpot_s))


class _CannotPass(Exception):
    """Raised inside a replay once more requests failed than the goal allows."""


#: A fresh router for one replay, with its completion and first-token observers (either may be None).
RouterFactory = Callable[[], tuple[Router, Callable[[RequestResult], None] | None,
                                   Callable[[int, float], None] | None]]


def attainment(trace: Sequence[TraceRequest], sim: SimFleet, make_router: RouterFactory, slo: SLO, *,
               goal: float = ATTAINMENT_GOAL, seed: int = 0) -> tuple[float, bool, float]:
    """(attainment, complete, load) of one replay; stops early (complete False, attainment an upper
    bound below ``goal``, load NaN) once more than (1 - goal) x N requests failed. ``load``: the most
    loaded on-prem pool's (``replay.summary.pool_loads``; 0 without on-prem replicas)."""
    n = len(trace)
    allowed = math.floor((1 - goal) * n + 1e-9)
    failed = 0
    router, on_complete, on_first_token = make_router()

    def observe(r: RequestResult) -> None:
        nonlocal failed
        if on_complete is not None:
            on_complete(r)
        if not meets(r, slo):
            failed += 1
            if failed > allowed:
                raise _CannotPass

    try:
        result = simulate(trace, sim, router, seed=seed, on_complete=observe, on_first_token=on_first_token)
    except _CannotPass:
        return (n - failed) / n, False, math.nan
    return (n - failed) / n, True, max(pool_loads(result).values(), default=0.0)


def search(trace: Sequence[TraceRequest], make_router: RouterFactory, sim: SimFleet, slo: SLO, *,
           goal: float = ATTAINMENT_GOAL, rel_tol: float = 0.05, min_scale: float = 1 / 64,
           max_scale: float = 64.0, seed: int = 0) -> GoodputResult:
    """The goodput search of the module docstring over ``trace`` on ``sim``."""
    t0 = time.perf_counter()
    base = mean_rate(trace)
    points: list[GoodputPoint] = []

    def passes(x: float) -> bool:
        att, complete, load = attainment(scaled(trace, x), sim, make_router, slo, goal=goal, seed=seed)
        ok = att >= goal and load <= 1.0
        points.append(GoodputPoint(x, x * base, att, complete, load, ok))
        return ok

    lo: float | None = None
    hi: float | None = None
    if passes(1.0):
        lo, x = 1.0, 2.0
        while x <= max_scale and passes(x):
            lo, x = x, x * 2
        hi = x if x <= max_scale else None
    else:
        hi, x = 1.0, 0.5
        while x >= min_scale and not passes(x):
            hi, x = x, x / 2
        lo = x if x >= min_scale else None
    if lo is not None and hi is not None:
        while hi / lo > 1 + rel_tol:
            mid = math.sqrt(lo * hi)
            if passes(mid):
                lo = mid
            else:
                hi = mid
    best = lo * base if lo is not None else 0.0
    gpus = sum(t.gpus for t in sim.on_prem)
    return GoodputResult(best, best / gpus if gpus else math.nan, gpus, base, len(trace), tuple(points),
                         time.perf_counter() - t0, goal, capped=hi is None)


@dataclass(frozen=True)
class SloFloor:
    """What no rate can fix: of ``requests`` requests, those that miss the SLO on an idle on-prem
    fleet by the hardware model alone (``slo_floor``). ``too_long``: longer than every on-prem
    target's context window; ``prefill_over_ttft``: the rest whose cold prefill alone (no prefix
    cache hit, chunked at the replica's token budget, no other request) exceeds the TTFT objective
    on every target; ``decode_over_tpot``: the rest whose one-sequence decode step exceeds the TPOT
    objective on every target. ``best_attainment``: the share left, the most that can meet the SLO
    at any rate. ``over_ttft_by_target``: per on-prem target, the share of requests it cannot
    serve within the TTFT objective even idle (too long, or its prefill alone over it): what a
    router that sends requests there regardless of length pays."""

    requests: int
    too_long: int
    prefill_over_ttft: int
    decode_over_tpot: int
    best_attainment: float
    over_ttft_by_target: dict[str, float]
    ttft_s: float
    tpot_s: float

    def sentence(self, goal: float = ATTAINMENT_GOAL) -> str:
        """The floor as one line of the report."""
        n = max(self.requests, 1)
        by = ", ".join(f"{name} {share:.1%}" for name, share in self.over_ttft_by_target.items())
        parts = [f"of the first {self.requests} prompts, the share whose prefill alone on an idle replica exceeds "
                 f"the TTFT objective ({self.ttft_s:g} s; hardware model, no prefix cache hit): {by}; on every "
                 f"target {self.prefill_over_ttft} ({self.prefill_over_ttft / n:.1%})"]
        if self.too_long:
            parts.append(f"{self.too_long} ({self.too_long / n:.1%}) exceed every on-prem context window")
        if self.decode_over_tpot:
            parts.append(f"{self.decode_over_tpot} ({self.decode_over_tpot / n:.1%}) decode one token slower than the "
                         f"TPOT objective ({self.tpot_s:g} s) alone")
        verdict = (f"so at most {self.best_attainment:.1%} can meet the SLO at any rate, below the {goal:.0%} goal"
                   if self.best_attainment < goal else
                   f"so {self.best_attainment:.1%} could meet it with each prompt on a target fast enough for it: a run "
                   f"at 0 is limited by where it sends long prompts (a target over {1 - goal:.0%} above) or by "
                   "queueing behind them")
        return "; ".join(parts) + "; " + verdict


def idle_prefill_s(replica: ReplicaSpec, prompt_tokens: int) -> float:
    """Seconds to prefill ``prompt_tokens`` cold on an idle ``replica``: chunks of its
    ``max_num_batched_tokens``, each a step of its own after the chunks before it."""
    done, total = 0, 0.0
    while done < prompt_tokens:
        chunk = min(replica.max_num_batched_tokens, prompt_tokens - done)
        total += replica.prefill_s(chunk, done)
        done += chunk
    return total


def slo_floor(trace: Sequence[TraceRequest], sim: SimFleet, slo: SLO) -> SloFloor:
    """The requests of ``trace`` that miss ``slo`` on ``sim``'s on-prem fleet whatever the rate
    (``SloFloor``). Raises ``ValueError`` for a fleet without on-prem targets or an empty trace."""
    if not sim.on_prem or not trace:
        raise ValueError("slo_floor needs on-prem targets and requests")
    # a target's fastest replica spec for the first token (its P/D prefill pool may have its own)
    specs = {t.name: [s for s in (t.replica, t.prefill_replica) if s is not None] for t in sim.on_prem}
    too_long = prefill = decode = 0
    over = dict.fromkeys(specs, 0)
    for r in trace:
        ttft: dict[str, float] = {}
        tpot: dict[str, float] = {}
        for name, options in specs.items():
            fits = [s for s in options if r.prompt_tokens + 1 <= s.max_model_len]
            if fits:
                ttft[name] = min(idle_prefill_s(s, r.prompt_tokens) for s in fits)
                tpot[name] = min(s.decode_step_s(1, r.prompt_tokens + 1) for s in fits)
            if ttft.get(name, math.inf) > slo.ttft_s:
                over[name] += 1
        if not ttft:
            too_long += 1
        elif min(ttft.values()) > slo.ttft_s:
            prefill += 1
        elif min(tpot[name] for name in ttft if ttft[name] <= slo.ttft_s) > slo.tpot_s:
            decode += 1
    n = len(trace)
    return SloFloor(n, too_long, prefill, decode, (n - too_long - prefill - decode) / n,
                    {name: c / n for name, c in over.items()}, slo.ttft_s, slo.tpot_s)


def frontier_guard(router: Router, sim: SimFleet) -> Router:
    """``router`` with frontier targets disabled: an assignment naming one (or falling back to
    one) is rejected (``frontier_disabled``) or loses those fallbacks."""
    frontier = frozenset(f.name for f in sim.frontier)

    def guarded(request: TraceRequest, view: FleetView, /) -> Assignment:
        a = router(request, view)
        fallbacks = tuple(f for f in a.fallbacks if f.target not in frontier)
        if a.target in frontier:
            return fallbacks[0] if fallbacks else Assignment.reject("frontier_disabled")
        return dataclasses.replace(a, fallbacks=fallbacks) if len(fallbacks) != len(a.fallbacks) else a

    return guarded


def on_prem_only(sim: SimFleet) -> SimFleet:
    """``sim`` with no spill target: requests refused on-prem are rejected, not sent to a frontier tier."""
    return dataclasses.replace(sim, spill_target=None)


class MemoEstimator:
    """An ``Estimator`` that answers each distinct request features once (replays of one trace
    at several rates send the same prompts): the wrapped estimator's estimates, cached by
    ``RequestFeatures`` (a frozen dataclass). Passes query token ids through when the wrapped
    one takes them."""

    def __init__(self, inner: Estimator) -> None:
        self.inner = inner
        self._ids = inner if isinstance(inner, TokenIdsEstimator) and inner.takes_query_token_ids else None
        self._cache: dict[RequestFeatures, DifficultyEstimate] = {}

    @property
    def version(self) -> str:
        """The wrapped estimator's version."""
        return self.inner.version

    @property
    def tokenizer(self) -> Tokenizer | None:
        """The wrapped estimator's tokenizer."""
        return self.inner.tokenizer

    @property
    def takes_query_token_ids(self) -> bool:
        """Whether the wrapped estimator takes query token ids."""
        return self._ids is not None

    def estimate(self, features: RequestFeatures, query_token_ids: list[int] | None = None) -> DifficultyEstimate:
        """The wrapped estimate for ``features``, computed on first use."""
        hit = self._cache.get(features)
        if hit is None:
            if self._ids is not None:
                hit = self._ids.estimate(features, query_token_ids)
            else:
                hit = self.inner.estimate(features)
            self._cache[features] = hit
        return hit


__all__ = ["ATTAINMENT_GOAL", "GoodputPoint", "GoodputResult", "MemoEstimator", "RouterFactory", "SloFloor",
           "attainment", "frontier_guard", "idle_prefill_s", "mean_rate", "meets", "on_prem_only", "scaled", "search",
           "slo_floor"]
