"""Endpoint selection inside the chosen pool: small scorers in physical units, a
bounded-load guard, health filtering, and pickers registered by name (llm-d style).

A pick works on one pool for one request (``PoolView``: the pool's endpoints with
their load readings, health and prefix-cache hits, as columns). Scorers return
**predicted seconds** per endpoint; the ``min-cost`` picker adds them and takes the
cheapest endpoint, so cache reuse and load trade off in one physical unit:

- ``prefill-work`` (``PrefillWorkScorer``): this request's own prefill, cached prefix
  excluded; a prefix the shared KV tier holds is restored or recomputed, whichever
  is faster;
- ``queue`` (``QueueScorer``): prefill work already queued on the endpoint;
- ``decode-load`` (``DecodeLoadScorer``): this request's decode time given the
  endpoint's batch;
- ``transfer`` (``TransferScorer``): the P/D transfer of the prompt's KV the decode endpoint
  does not hold (a multi-turn conversation's previous turn stays on its decode replica).

This is the shape of Dynamo's KV router cost (``kv_overlap_score_weight ×
prefill blocks + active decode blocks``, lower is better) with blocks turned into
seconds by the pool's throughputs, and of Mooncake's Conductor, which sends a
request to the instance with the least predicted TTFT (queueing + prefill given the
prefix it can reuse or fetch). Roles: aggregated pools use all three scorers; a
prefill pool ``prefill-work`` + ``queue``; a decode pool ``decode-load`` + ``queue`` + ``transfer``.

**Bounded load** (Mirrokni, Thorup, Zadimoghaddam, "Consistent Hashing with Bounded
Loads", 2018): no endpoint may hold more than ``max(floor, ceil((1 + eps) × (N + 1) / n))``
outstanding requests counting this one (N outstanding over the pool's n healthy
endpoints; an endpoint read as saturated, ``on_stale: saturated``, is left out of N and n: its
count is made up), so one hot prefix cannot pile every request on the replica that caches
it; over-cap endpoints rank after every endpoint under the cap. The ``floor``
(default: the pool's ``max_num_seqs``, what one replica batches, 256 unless the fleet says)
keeps a pool below that load from bouncing a session off its cache: up to a full batch an extra
request waits for no one, and its cost (a share of the decode steps, ``decode-load``) is priced in
seconds against the cache it reuses. Before, a floor of 2 ranked a replica holding 1,113 of a
1,129-token prompt (0.032 s against 0.066 s cold) last once it had 2 requests in flight. **Health**: endpoints
marked unhealthy are never chosen. The chosen endpoint comes first, then up to
``fallback_endpoints`` more in cost order.

Cost: one pass per scorer over the pool (a list comprehension per column) plus an
O(n log k) selection; ``scripts/bench_policy.py`` measures 8 and 256 endpoints.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Protocol

from pydantic import Field

from pointsman.located import StrictModel
from pointsman.policy.decision import EndpointChoice
from pointsman.policy.fleet import EndpointInfo, Pool
from pointsman.policy.signals.load_board import EndpointLoad
from pointsman.policy.signals.prefix_index import PrefixLookup, SharedKVTier


class EndpointSelectionSpec(StrictModel):
    """Endpoint choice inside the chosen pool (``policy/selection/pickers.py``): ``picker`` (a name in
    ``PICKERS``), ``bounded_load_epsilon`` (cap on an endpoint's outstanding requests at
    (1 + eps) × the pool's mean, counting this request; null: no cap),
    ``bounded_load_floor`` (the cap is never below this many requests; null: the pool's
    ``max_num_seqs``, a replica's batch: below it cache reuse matters more than perfect balance),
    ``fallback_endpoints`` (endpoints listed after the chosen one, per role)."""

    picker: str = "min-cost"
    bounded_load_epsilon: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = 0.25
    bounded_load_floor: Annotated[int, Field(ge=1)] | None = None
    fallback_endpoints: Annotated[int, Field(ge=0, le=64)] = 2


@dataclass(frozen=True)
class PickInput:
    """The request as pickers see it: ``prompt_tokens``, ``output_tokens`` (expected),
    ``session_endpoint`` (id of the session's previous endpoint, a tie-breaker; None), ``turn``
    (the dispatches made before this one to the pool picked, ``FleetState.turn``: tied endpoints take turns
    by it, whatever the traffic to other pools does)."""

    prompt_tokens: int
    output_tokens: int
    session_endpoint: str | None = None
    turn: int = 0


@dataclass
class PoolView:
    """The endpoints one pick chooses among, at decision time, as columns aligned with
    ``endpoints``: ``loads`` (``EndpointLoad`` or None when nothing is known), ``healthy``
    (bool), ``prefix`` (the prompt's ``PrefixLookup`` in the target's index, or None),
    ``shared`` (the target's shared KV tier, or None). ``pool``: the pool whose
    throughputs apply (None for a frontier API: one endpoint, no throughputs);
    ``extra_pools``: per endpoint index, another pool for endpoints borrowed from it
    (decode endpoints prefilling locally in an aggregated pick). ``role``: what the
    chosen endpoint does (``aggregated``, ``prefill``, ``decode``, ``api``). ``kv_link``: on a
    decode pool, ``(seconds per token of KV sent from a prefill replica, seconds of link latency)``
    (None: no transfer cost known)."""

    target: str
    role: str
    pool: Pool | None
    endpoints: Sequence[EndpointInfo]
    loads: Sequence[EndpointLoad | None]
    healthy: Sequence[bool]
    prefix: PrefixLookup | None = None
    shared: SharedKVTier | None = None
    extra_pools: dict[int, Pool] = field(default_factory=dict)
    positions: dict[str, int] | None = None
    kv_link: tuple[float, float] | None = None
    _hits: tuple[list[int], list[int]] | None = field(default=None, repr=False)
    _outstanding: list[int] | None = field(default=None, repr=False)
    _rates: dict[str, list[float]] | None = field(default=None, repr=False)

    def rates(self, attr: str) -> list[float] | float:
        """The pool's ``prefill_tokens_per_s`` or ``decode_tokens_per_s`` (inf without a pool): one
        number when every endpoint is of the pool, else one per endpoint (computed once per ``attr``; not to be
        changed)."""
        base = math.inf if self.pool is None else getattr(self.pool, attr)
        if not self.extra_pools:
            return base
        if self._rates is None:
            self._rates = {}
        out = self._rates.get(attr)
        if out is None:
            out = [base] * len(self.endpoints)
            for i, pool in self.extra_pools.items():
                out[i] = getattr(pool, attr)
            self._rates[attr] = out
        return out

    def pool_of(self, i: int) -> Pool | None:
        """The pool endpoint ``i`` belongs to."""
        return self.extra_pools.get(i, self.pool)

    def hits(self) -> tuple[list[int], list[int]]:
        """``(local_hit_tokens, shared_hit_tokens)``: two lists aligned with ``endpoints`` (two
        lists, not a tuple per endpoint: fewer objects for the garbage collector). Computed
        once: the no-hit value for all, then the endpoints the prefix index matched."""
        if self._hits is None:
            n, p = len(self.endpoints), self.prefix
            if p is None:
                self._hits = ([0] * n, [0] * n)
            else:
                base_local, base_shared = p.hit("")
                local_hits, shared_hits = [base_local] * n, [base_shared] * n
                if p.matched:
                    if self.positions is None:
                        self.positions = {e.id: i for i, e in enumerate(self.endpoints)}
                    where, bt, total, runs = self.positions, p.block_tokens, p.total_tokens, p.shared_runs
                    matched = p.matched
                    # walk the smaller side: the endpoints the index matched, or this view's
                    pairs = ((where.get(e), m) for e, m in matched.items()) if len(matched) <= len(where) else \
                        ((i, matched.get(e, 0)) for e, i in where.items())
                    for i, m in pairs:
                        if i is not None and m:
                            local = int(m * bt) if m * bt < total else total
                            local_hits[i] = local
                            shared_hits[i] = 0 if runs is None else min(int(runs[m] * bt), total - local)
                self._hits = (local_hits, shared_hits)
        return self._hits

    def hit(self, i: int) -> tuple[int, int]:
        """``(local_hit_tokens, shared_hit_tokens)`` of endpoint ``i``."""
        local_hits, shared_hits = self.hits()
        return local_hits[i], shared_hits[i]

    def outstanding(self) -> list[int]:
        """Outstanding requests per endpoint (0 when unknown; computed once)."""
        if self._outstanding is None:  # EndpointLoad.outstanding_requests, inlined (hot loop)
            out = []
            for x in self.loads:
                if x is None:
                    out.append(0)
                    continue
                r, w = x.num_requests_running, x.num_requests_waiting
                out.append(r + w if r is not None and w is not None else x.inflight_requests)
            self._outstanding = out
        return self._outstanding


class Scorer(Protocol):
    """Predicted seconds per endpoint of a pool for one request (lower is better)."""

    name: str

    def score(self, inp: PickInput, view: PoolView) -> list[float]:
        """One float per ``view.endpoints``, in seconds."""
        ...


class PrefillWorkScorer:
    """Seconds of this request's own prefill on each endpoint::

        prefill_s = (P - L - S) / R_p + min(restore_s(S), S / R_p)

    P: prompt tokens; L: tokens of its prefix cached on the endpoint; S: tokens after
    them held by the shared KV tier (restorable: ``latency_s + S × kv_bytes_per_token /
    bandwidth``, ``SharedKVTier.restore_s``); R_p: the pool's ``prefill_tokens_per_s``."""

    name = "prefill-work"

    def score(self, inp: PickInput, view: PoolView) -> list[float]:
        """Seconds per endpoint (see the class docstring)."""
        rates = view.rates("prefill_tokens_per_s")
        p, shared, n = inp.prompt_tokens, view.shared, len(view.endpoints)
        if isinstance(rates, float):
            rates = [rates] * n
        if view.prefix is None:
            return [p / r for r in rates]
        out = []
        for local, s, rate in zip(*view.hits(), rates):
            restore = s / rate if shared is None or s == 0 else min(shared.restore_s(s), s / rate)
            out.append((p - local - s) / rate + restore)
        return out


class QueueScorer:
    """Seconds of prefill work waiting ahead of this request on each endpoint::

        queue_s = (pending_prompt_tokens + max(0, waiting - pending_requests) × mean_prompt) / R_p

    ``pending_*``: Pointsman's dispatches the engine has not reported yet, each counting the
    tokens of its prompt the endpoint did not hold cached when it was sent
    (``DispatchRecord.prefill_tokens``); the rest of the waiting queue counts ``mean_prompt`` tokens each: the engine's
    mean uncached prompt of the requests it finished lately (``EndpointLoad.mean_prompt_tokens`` x (1 - its
    ``prefix_cache_hit_rate``)), else the mean uncached prompt of our in-flight requests there, else this request's
    prompt. Before, the asking request's prompt sized every waiting request: 4 waiting on a 70B replica read as 2.6 s
    of queue to an 8,000-token prompt and 0.03 s to a 100-token one; and our in-flight mean came first: one 20-token
    request in flight made 40 waiting 800-token requests read 0.07 s, so saturated replicas took more. A stale
    endpoint read as saturated waits ``SATURATED_WAITING`` requests, so it ranks last."""

    name = "queue"

    def score(self, inp: PickInput, view: PoolView) -> list[float]:
        """Seconds per endpoint (see the class docstring)."""
        p = inp.prompt_tokens
        rates = view.rates("prefill_tokens_per_s")
        out: list[float] = []
        append = out.append
        for i, x in enumerate(view.loads):
            if x is None:
                append(0.0)
                continue
            waiting, inflight = x.num_requests_waiting, x.inflight_requests
            extra = 0 if waiting is None or waiting <= x.pending_requests else waiting - x.pending_requests
            work: float = x.pending_prompt_tokens
            if extra:
                mean = x.mean_prompt_tokens
                if mean is not None:
                    work += extra * mean * (1.0 - (x.prefix_cache_hit_rate or 0.0))
                else:
                    work += extra * (x.inflight_prompt_tokens / inflight if inflight else p)
            append(work / (rates if isinstance(rates, float) else rates[i]))
        return out


class DecodeLoadScorer:
    """Seconds of this request's decode on each endpoint, sharing the decode throughput
    with the endpoint's batch::

        decode_s = output_tokens × (b + 1) / R_d

    b: outstanding requests (running + waiting, else Pointsman's in-flight count); R_d:
    the pool's ``decode_tokens_per_s`` (aggregate over a full batch), so each of b + 1
    requests gets 1/(b + 1) of it (an upper bound at small batches, monotone in b)."""

    name = "decode-load"

    def score(self, inp: PickInput, view: PoolView) -> list[float]:
        """Seconds per endpoint (see the class docstring)."""
        rates = view.rates("decode_tokens_per_s")
        if isinstance(rates, float):
            k = inp.output_tokens / rates
            return [k * (b + 1) for b in view.outstanding()]
        out = inp.output_tokens
        return [out * (b + 1) / rate for b, rate in zip(view.outstanding(), rates)]


class TransferScorer:
    """Seconds to send the KV of the prompt's tokens the decode endpoint does not hold from the
    prefill replica (vLLM's P/D connectors read only the blocks missing from the decode side's
    prefix cache)::

        transfer_s = latency_s + (P - L) × s_per_token     (0 when L >= P)

    P: prompt tokens; L: tokens of its prefix cached on the endpoint; ``(s_per_token, latency_s)``:
    the view's ``kv_link`` (None: 0 for all)."""

    name = "transfer"

    def score(self, inp: PickInput, view: PoolView) -> list[float]:
        """Seconds per endpoint (see the class docstring)."""
        if view.kv_link is None:
            return [0.0] * len(view.endpoints)
        per_token, latency_s = view.kv_link
        p = inp.prompt_tokens
        return [latency_s + (p - local) * per_token if local < p else 0.0 for local in view.hits()[0]]


#: Scorers by name (each constructed with no arguments).
SCORERS: dict[str, Callable[[], Scorer]] = {"prefill-work": PrefillWorkScorer, "queue": QueueScorer,
                                           "decode-load": DecodeLoadScorer, "transfer": TransferScorer}

#: Scorers per pool role (``api``: a frontier endpoint, nothing to choose).
ROLE_SCORERS: dict[str, tuple[str, ...]] = {
    "aggregated": ("prefill-work", "queue", "decode-load"),
    "prefill": ("prefill-work", "queue"),
    "decode": ("decode-load", "queue", "transfer"),
    "api": (),
}


def bounded_load_cap(outstanding: Sequence[int], counted: Sequence[bool], epsilon: float | None,
                     floor: int = 1) -> int | None:
    """``max(floor, ceil((1 + epsilon) × (N + 1) / n))`` over the n ``counted`` endpoints holding N
    outstanding requests (the request being placed counted): an endpoint may take the request
    while its outstanding count is below the cap. ``counted``: per endpoint, whether its count is
    real (the picker counts healthy endpoints not read as saturated: a stale endpoint's
    ``SATURATED_WAITING`` would lift the cap off every other). None when ``epsilon`` is None or
    none is counted."""
    if epsilon is None:
        return None
    if all(counted):
        n, total = len(outstanding), sum(outstanding)
    else:
        n = total = 0
        for b, ok in zip(outstanding, counted):
            if ok:
                n += 1
                total += b
    if n == 0:
        return None
    return max(floor, math.ceil((1.0 + epsilon) * (total + 1) / n - 1e-9))


@dataclass(frozen=True)
class PoolPick:
    """A pick in one pool: ``order`` (endpoint indexes, chosen first, then fallbacks),
    ``costs`` (total predicted seconds per endpoint), ``parts`` (scorer name -> seconds per
    endpoint), ``cap`` (the bounded-load cap or None), ``excluded`` (index -> reason for the
    endpoints that could not be chosen: ``unhealthy``, ``over-cap``)."""

    view: PoolView
    order: tuple[int, ...]
    costs: list[float]
    parts: dict[str, list[float]]
    cap: int | None
    excluded: dict[int, str]

    @property
    def chosen(self) -> int | None:
        """Index of the chosen endpoint (None when the pool has no healthy endpoint)."""
        return self.order[0] if self.order else None

    def choices(self) -> tuple[EndpointChoice, ...]:
        """The ordered endpoints as ``EndpointChoice``s (role: the pool's role)."""
        eps = self.view.endpoints
        return tuple(EndpointChoice(eps[i].url, self.view.role, eps[i].name) for i in self.order)

    def trace(self, limit: int = 8) -> dict[str, object]:
        """JSON-ready: the pool, the cap, counts of exclusions, and the best ``limit`` candidates
        with their scores (seconds), hits, outstanding requests and exclusion."""
        v, (local_hits, shared_hits), outstanding = self.view, self.view.hits(), self.view.outstanding()
        shown = list(self.order)
        if len(shown) < limit:
            rest = sorted((i for i in range(len(v.endpoints)) if i not in set(shown)), key=lambda i: self.costs[i])
            shown += rest[: limit - len(shown)]
        counts: dict[str, int] = {}
        for reason in self.excluded.values():
            counts[reason] = counts.get(reason, 0) + 1
        return {
            "target": v.target, "role": v.role, "endpoints": len(v.endpoints), "bounded_load_cap": self.cap,
            "excluded": counts,
            "candidates": [{
                "endpoint": v.endpoints[i].name or v.endpoints[i].url, "url": v.endpoints[i].url,
                "rank": self.order.index(i) if i in self.order else None,
                "cost_s": _finite(self.costs[i]), **{k: _finite(p[i]) for k, p in self.parts.items()},
                "local_hit_tokens": local_hits[i], "shared_hit_tokens": shared_hits[i],
                "outstanding_requests": outstanding[i], "excluded": self.excluded.get(i)}
                for i in shown[:limit]],
        }


#: Seconds added to an over-cap endpoint's rank: it comes after every endpoint under the cap.
_OVER_CAP_S = 1e12


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


class MinCostPicker:
    """``min-cost``: the healthy endpoint under the bounded-load cap with the least predicted
    seconds (sum of the role's scorers, ``ROLE_SCORERS``); ties go to the session's previous
    endpoint, then take turns: the endpoints tied for the least rank, in file order, are rotated
    by the request's ``turn`` (the pool's dispatch count), so tied endpoints share picks evenly,
    and the same request with the same turn on the same view gets the same pick (a replay too).
    Then up to ``fallback_endpoints`` more in cost order
    (over-cap endpoints after those under it). ``selection``: the policy's
    ``EndpointSelectionSpec``."""

    def __init__(self, selection: EndpointSelectionSpec) -> None:
        self.epsilon = selection.bounded_load_epsilon
        self.floor = selection.bounded_load_floor
        self.fallback_endpoints = selection.fallback_endpoints
        self.scorers = {name: SCORERS[name]() for name in SCORERS}
        # per role, its scorers' (name, bound score method), resolved once (``ROLE_SCORERS``)
        self._role_scorers = {role: tuple((name, self.scorers[name].score) for name in names)
                              for role, names in ROLE_SCORERS.items()}

    def pick(self, inp: PickInput, view: PoolView) -> PoolPick:
        """Order ``view``'s endpoints for ``inp`` (see the class docstring)."""
        n = len(view.endpoints)
        parts = {name: score(inp, view) for name, score in self._role_scorers[view.role]}
        if len(parts) == 3:
            a, b, c = parts.values()
            costs = [x + y + z for x, y, z in zip(a, b, c)]
        elif len(parts) == 2:
            a, b = parts.values()
            costs = [x + y for x, y in zip(a, b)]
        else:
            costs = [sum(t) for t in zip(*parts.values())] if parts else [0.0] * n
        outstanding = view.outstanding()
        healthy, loads = view.healthy, view.loads
        counted = healthy  # a saturated reading's count is made up: it would lift the cap
        for x in loads:
            if x is not None and x.saturated:
                counted = [ok and (y is None or not y.saturated) for ok, y in zip(healthy, loads)]
                break
        floor = self.floor
        if floor is None:  # a replica's batch; the smallest when endpoints are borrowed from another pool
            pool, extra = view.pool, view.extra_pools
            if not extra:
                floor = 1 if pool is None else pool.max_num_seqs
            else:
                floor = min((p.max_num_seqs for p in (pool, *extra.values()) if p is not None), default=1)
        cap = bounded_load_cap(outstanding, counted, self.epsilon, floor)
        excluded: dict[int, str] = {}
        # rank = cost, plus _OVER_CAP_S over the cap (after every endpoint under it); unhealthy: left out
        rank = costs[:]
        if cap is not None:
            for i, held in enumerate(outstanding):
                if held >= cap:
                    excluded[i] = "over-cap"
                    rank[i] += _OVER_CAP_S
        all_healthy = all(healthy)
        if not all_healthy:
            for i, ok in enumerate(healthy):
                if not ok:
                    excluded[i] = "unhealthy"
        session = inp.session_endpoint
        if session is not None:  # ties go to the session's endpoint: 1 ns earlier
            for i, e in enumerate(view.endpoints):
                if e.id == session:
                    rank[i] -= 1e-9
                    break
        k = 1 + self.fallback_endpoints
        if n == 1 and all_healthy:  # one endpoint (a frontier API): nothing to order
            return PoolPick(view, (0,), costs, parts, cap, excluded)
        candidates = range(n) if all_healthy else [i for i in range(n) if healthy[i]]
        ordered = sorted(candidates, key=rank.__getitem__)  # stable: file order on ties
        tied = 1
        while tied < len(ordered) and rank[ordered[tied]] == rank[ordered[0]]:
            tied += 1
        if tied > 1:  # take turns among the endpoints tied for the least rank
            turn = inp.turn % tied
            ordered[:tied] = ordered[turn:tied] + ordered[:turn]
        return PoolPick(view, tuple(ordered[:k]), costs, parts, cap, excluded)


class InOrderPicker:
    """``in-order``: the healthy endpoints in the fleet file's order (no scores); the chosen
    one and up to ``fallback_endpoints`` more."""

    def __init__(self, selection: EndpointSelectionSpec) -> None:
        self.fallback_endpoints = selection.fallback_endpoints

    def pick(self, inp: PickInput, view: PoolView) -> PoolPick:
        """The first healthy endpoints in file order."""
        order = tuple(i for i, ok in enumerate(view.healthy) if ok)[: 1 + self.fallback_endpoints]
        excluded = {i: "unhealthy" for i, ok in enumerate(view.healthy) if not ok}
        return PoolPick(view, order, [0.0] * len(view.endpoints), {}, None, excluded)


class Picker(Protocol):
    """Orders one pool's endpoints for one request: ``pick(inp, view) -> PoolPick`` (the chosen
    endpoint first, then fallbacks; unhealthy endpoints never chosen). Built from the policy's
    ``EndpointSelectionSpec``."""

    def pick(self, inp: PickInput, view: PoolView) -> PoolPick:
        """The ordering of ``view``'s endpoints for ``inp``."""
        ...


#: Pickers by the name a policy's ``endpoint_selection.picker`` uses.
PICKERS: dict[str, Callable[[EndpointSelectionSpec], Picker]] = {"min-cost": MinCostPicker, "in-order": InOrderPicker}


def base_url(endpoints: tuple[EndpointChoice, ...]) -> str:
    """The URL a gateway calls: the first ``aggregated``, ``decode`` or ``api`` endpoint."""
    return next(e.url for e in endpoints if e.role != "prefill")
