"""Contract checks over every registered filter, scorer and picker (as scikit-learn's
``parametrize_with_checks`` does for estimators).

Each check below is a small function whose docstring states one contract; the tests run every
check over every entry of ``FILTERS``, ``SCORERS`` and ``PICKERS``, so a newly registered filter,
scorer or picker is checked without writing a test for it. A check takes the registry name and
the registered object, runs it over a fixed set of cases built from the real types (the packaged
fleet, ``StaticSignals`` over ``example_signals``, ``PoolView`` with ``EndpointLoad`` readings and
``PrefixLookup``s from a real ``PrefixIndex``), and raises ``AssertionError`` naming the case.

``test_checks_catch_breakage`` proves each check can fail: every check has at least one
deliberately broken implementation (defined here, never registered) that it must reject.
"""

from __future__ import annotations

import copy
import itertools
import json
import math
import numbers
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import pytest

from pointsman.policy.fleet import DEFAULT_FLEET_PATH, Fleet, FrontierTarget, OnPremTarget, load_fleet
from pointsman.policy.live import StaticSignals
from pointsman.policy.rules.compiler import compile_policy
from pointsman.policy.selection.filters import FILTERS, FilterContext, FilterFn, FiltersSpec
from pointsman.policy.selection.pickers import (
    PICKERS,
    ROLE_SCORERS,
    SCORERS,
    EndpointSelectionSpec,
    InOrderPicker,
    MinCostPicker,
    Picker,
    PickInput,
    PoolPick,
    PoolView,
    QueueScorer,
    Scorer,
)
from pointsman.policy.signals.load_board import SATURATED_WAITING, EndpointLoad
from pointsman.policy.signals.namespaces import Snapshot, example_signals
from pointsman.policy.signals.prefix_index import PrefixIndex, PrefixLookup, SharedKVTier

POLICY_TEXT = "apiVersion: pointsman/v1\nkind: RoutingPolicy\nrules:\n  - name: default\n    route: {target: onprem-8b}\n"


def _fleet() -> Fleet:
    """A fresh copy of the packaged fleet per check run (a broken implementation that mutates it
    cannot leak into other tests)."""
    return load_fleet(DEFAULT_FLEET_PATH)


def _call(what: str, fn: Callable[..., object], *args: object) -> object:
    """``fn(*args)``, an exception turned into an ``AssertionError`` naming the case (raising on
    a case breaks every contract)."""
    try:
        return fn(*args)
    except AssertionError:
        raise
    except Exception as e:
        raise AssertionError(f"{what}: raised {type(e).__name__}: {e}") from e


# ================================================================================================
# Filters: (name, target, FilterContext) -> reason | None
# ================================================================================================


@dataclass(frozen=True)
class FilterCase:
    """One request as the filters see it: ``request`` overrides of ``example_signals``' request,
    ``settings`` (``FiltersSpec`` fields) and ``edit`` (changes the rest of the snapshot)."""

    label: str
    request: dict[str, object]
    settings: dict[str, object]
    edit: Callable[[Snapshot], None] | None = None


def _each_load(field: str, value: object) -> Callable[[Snapshot], None]:
    def edit(s: Snapshot) -> None:
        for load in s["load"].values():
            load[field] = value
    return edit


def _budget(**values: object) -> Callable[[Snapshot], None]:
    def edit(s: Snapshot) -> None:
        s["budget"].update(values)
    return edit


def _huge_cache_hit(s: Snapshot) -> None:
    for cache in s["_cache"].values():
        cache.update(prefix_hit_tokens=10**12, prefix_hit_ratio=1.0)


ALLOW = {"onprem-70b": ["acme"], "frontier-large": ["acme", "beta"], "onprem-8b": []}

FILTER_CASES = [
    FilterCase("typical", {}, {}),
    FilterCase("empty prompt", {"prompt_tokens": 0, "messages": 0, "turns": 0}, {}),
    FilterCase("huge prompt", {"prompt_tokens": 10**9, "max_output_tokens": 10**6, "max_output_tokens_set": True}, {}),
    FilterCase("prompt at the window", {"prompt_tokens": 127_999, "max_output_tokens": 1}, {}),
    FilterCase("images", {"has_images": True, "images": 4}, {}),
    FilterCase("tools", {"has_tools": True}, {}),
    FilterCase("images and tools", {"has_images": True, "images": 1, "has_tools": True}, {}),
    FilterCase("tenant on the allow-lists", {"tenant": "acme"}, {"tenants": ALLOW}),
    FilterCase("tenant on no allow-list", {"tenant": "zeta", "team": "t"}, {"tenants": ALLOW}),
    FilterCase("no tenant, allow-lists", {"tenant": ""}, {"tenants": ALLOW}),
    FilterCase("every filter switched off", {"has_images": True}, {"context_window": False, "capabilities": False,
                                                                  "health": False, "budget": False}),
    FilterCase("no healthy endpoint", {}, {}, _each_load("healthy_endpoints", 0)),
    FilterCase("measured utilizations", {"prompt_tokens": 5000}, {},
               lambda s: (_each_load("prefill_utilization", 0.0)(s), _each_load("decode_utilization", 1.0)(s))[0]),
    FilterCase("cache hit beyond the prompt", {"prompt_tokens": 2048}, {}, _huge_cache_hit),
    FilterCase("zero budget", {"tenant": "acme"}, {}, _budget(limited=True, remaining_usd=0.0, spent_usd=0.0, limit_usd=0.0,
                                                           spent_fraction=1.0, window="day", scope="tenant:acme")),
    FilterCase("exhausted budget", {}, {}, _budget(limited=True, remaining_usd=0.0, spent_usd=10.0, limit_usd=10.0,
                                                   spent_fraction=1.0, window="day", scope="team:t")),
    FilterCase("overspent budget", {}, {}, _budget(limited=True, remaining_usd=-3.5, spent_usd=13.5, limit_usd=10.0,
                                                   spent_fraction=1.35, window="month", scope="global")),
    FilterCase("tight budget, huge prompt", {"prompt_tokens": 10**6, "max_output_tokens": 4096, "max_output_tokens_set": True},
               {}, _budget(limited=True, remaining_usd=1e-4, spent_usd=9.9999, limit_usd=10.0, spent_fraction=0.99999,
                           window="day", scope="tenant:acme")),
    FilterCase("budget without a window", {}, {}, _budget(limited=True, remaining_usd=0.0, limit_usd=1.0)),
]


def _filter_inputs(fleet: Fleet, case: FilterCase) -> tuple[FilterContext, StaticSignals]:
    policy = compile_policy(POLICY_TEXT, fleet)
    signals = example_signals({}, fleet.targets)
    signals["request"].update(case.request)
    if case.edit is not None:
        case.edit(signals)
    source = StaticSignals(fleet, policy, signals)
    return FilterContext(signals["request"], FiltersSpec(**copy.deepcopy(case.settings)), source), source


def _filter_runs(fleet: Fleet) -> Iterator[tuple[str, str, OnPremTarget | FrontierTarget, FilterContext, StaticSignals]]:
    """``(label, target name, target, ctx, source)`` for every case and every target of the fleet."""
    for case in FILTER_CASES:
        for name, target in fleet.targets.items():
            ctx, source = _filter_inputs(fleet, case)
            yield f"{case.label} / {name}", name, target, ctx, source


def check_filter_returns_none_or_a_reason(name: str, fn: FilterFn) -> None:
    """A filter returns None (eligible) or a non-empty, non-blank ``str`` (the reason), for every
    target of the packaged fleet on typical and edge requests, and never raises."""
    for label, tname, target, ctx, _ in _filter_runs(_fleet()):
        got = _call(f"{name} on {label}", fn, tname, target, ctx)
        assert got is None or (isinstance(got, str) and got.strip()), f"{name} on {label}: returned {got!r}"


def check_filter_reason_is_one_line(name: str, fn: FilterFn) -> None:
    """A reason is one line: ``NoEligibleTarget`` and the decision trace print it inline
    (``onprem-8b (budget: ...); frontier-small (health: ...)``)."""
    for label, tname, target, ctx, _ in _filter_runs(_fleet()):
        got = _call(f"{name} on {label}", fn, tname, target, ctx)
        if isinstance(got, str):
            assert "\n" not in got and "\r" not in got, f"{name} on {label}: reason spans lines: {got!r}"


def check_filter_does_not_mutate_inputs(name: str, fn: FilterFn) -> None:
    """A filter changes none of its inputs: the request, the settings, the signal snapshot
    behind the source, the target."""
    for label, tname, target, ctx, source in _filter_runs(_fleet()):
        before = (copy.deepcopy(ctx.request), ctx.settings.model_dump(), copy.deepcopy(source.signals),
                  target.model_dump(), tname)
        _call(f"{name} on {label}", fn, tname, target, ctx)
        after = (ctx.request, ctx.settings.model_dump(), source.signals, target.model_dump(), tname)
        for part, b, a in zip(("request", "settings", "signals", "target", "name"), before, after):
            assert a == b, f"{name} on {label}: mutated the {part}"


def check_filter_is_deterministic(name: str, fn: FilterFn) -> None:
    """A filter is a function of its inputs: the same answer on a second call and on freshly
    built equal inputs."""
    fleet = _fleet()
    for case in FILTER_CASES:
        for tname, target in fleet.targets.items():
            what = f"{name} on {case.label} / {tname}"
            ctx, _ = _filter_inputs(fleet, case)
            first = _call(what, fn, tname, target, ctx)
            again = _call(what, fn, tname, target, ctx)
            ctx2, _ = _filter_inputs(fleet, case)
            fresh = _call(what, fn, tname, target, ctx2)
            assert first == again == fresh, f"{what}: {first!r}, then {again!r}, then {fresh!r}"


FILTER_CHECKS = [check_filter_returns_none_or_a_reason, check_filter_reason_is_one_line,
                 check_filter_does_not_mutate_inputs, check_filter_is_deterministic]


# ================================================================================================
# Pool views: the cases scorers and pickers run on
# ================================================================================================

BLOCK = 16
HASHES = list(range(1, 65))  # 64 blocks = 1,024 tokens


@dataclass(frozen=True)
class ViewCase:
    """One pick: the pool (``target``/``role``; ``borrow``: an aggregated pick that also lists the
    decode endpoints, as ``LiveSignals.aggregated_view`` does), the load readings, the health
    pattern, the prefix lookup kind and the request."""

    target: str
    role: str
    borrow: bool
    loads: str
    health: str
    prefix: str
    inp: PickInput

    @property
    def label(self) -> str:
        pool = f"{self.target}/{self.role}" + ("+decode" if self.borrow else "")
        return (f"{pool}, loads={self.loads}, health={self.health}, prefix={self.prefix}, "
                f"request=({self.inp.prompt_tokens}, {self.inp.output_tokens}, {self.inp.session_endpoint})")


def _reading(endpoint: str, kind: str, i: int) -> EndpointLoad | None:
    if kind == "missing" or (kind == "mixed" and i % 3 == 0):
        return None
    if kind == "idle":
        return EndpointLoad(endpoint, "push", 0.0, num_requests_running=0, num_requests_waiting=0, kv_cache_usage=0.0)
    if kind == "mixed" and i % 3 == 1:  # in-flight accounting only: engine fields unknown
        return EndpointLoad(endpoint, "inflight", 0.0, inflight_requests=2, inflight_prompt_tokens=3000,
                            pending_requests=2, pending_prompt_tokens=3000)
    if kind == "mixed":  # waiting beyond our pending, nothing of ours in flight: mean prompt = this one's
        return EndpointLoad(endpoint, "scrape", 5.0, num_requests_running=5, num_requests_waiting=3,
                            pending_requests=1, pending_prompt_tokens=800, inflight_requests=0)
    if kind == "busy":
        return EndpointLoad(endpoint, "push", 1.0, num_requests_running=30 + i, num_requests_waiting=10 * i,
                            kv_cache_usage=0.9, inflight_requests=i + 1, inflight_prompt_tokens=1000 * (i + 1),
                            pending_requests=i // 2, pending_prompt_tokens=500 * (i // 2))
    if kind == "saturated":  # stale under on_stale: saturated
        return EndpointLoad(endpoint, "push", 0.0, num_requests_running=0, num_requests_waiting=SATURATED_WAITING,
                            kv_cache_usage=1.0, stale=True, saturated=True)
    raise ValueError(kind)


LOAD_KINDS = ("missing", "idle", "mixed", "busy", "saturated")
HEALTH_KINDS = ("all", "first down", "only last up", "none")
PREFIX_KINDS = ("none", "empty", "matched")


def _healthy(kind: str, n: int) -> list[bool]:
    return {"all": [True] * n, "first down": [i > 0 for i in range(n)],
            "only last up": [i == n - 1 for i in range(n)], "none": [False] * n}[kind]


def _shared_tier(fleet: Fleet, target: str) -> SharedKVTier | None:
    t = fleet.targets[target]
    if isinstance(t, OnPremTarget) and t.shared_kv is not None and t.kv_bytes_per_token is not None:
        kv = t.shared_kv
        return SharedKVTier(kv.capacity_tokens, t.kv_bytes_per_token, kv.bandwidth_bytes_per_s, kv.latency_s)
    return None


def _lookup(kind: str, ids: list[str], prompt_tokens: int, shared: SharedKVTier | None) -> PrefixLookup | None:
    """None, a lookup nobody matched, or one where endpoints hold prefixes of different lengths
    (and the shared tier, when the target has one, holds the first half)."""
    if kind == "none":
        return None
    index = PrefixIndex(block_tokens=BLOCK, shared=replace(shared, write_through=False) if shared else None)
    if kind == "matched":
        for k, e in enumerate(ids[1:], start=1):  # endpoint k holds 64 // 2**(k-1) blocks; the first holds none
            index.record(e, HASHES[: max(1, len(HASHES) >> (k - 1))])
        if shared is not None:
            index.offload(HASHES[:32])
    return index.lookup(HASHES if kind == "matched" else [HASHES[-1] + 1], prompt_tokens=prompt_tokens)


def view_cases(fleet: Fleet) -> list[ViewCase]:
    """Every pool of the packaged fleet (plus an aggregated pick with borrowed decode endpoints)
    × load kinds × health patterns × prefix kinds × requests (typical, empty, huge, with the
    session's endpoint, with an unknown session endpoint)."""
    pools = [(t, r, False) for (t, r) in fleet.pools] + [("onprem-70b", "aggregated", True)]
    out = []
    for (target, role, borrow), loads, health, prefix in itertools.product(pools, LOAD_KINDS, HEALTH_KINDS, PREFIX_KINDS):
        last = fleet.pool_endpoints(target, "decode" if borrow else role)[-1].id
        for inp in (PickInput(1024, 256), PickInput(0, 0), PickInput(10**7, 10**5), PickInput(1024, 64, last),
                    PickInput(512, 128, "http://elsewhere.invalid:8000/v1")):
            out.append(ViewCase(target, role, borrow, loads, health, prefix, inp))
    return out


def build_view(fleet: Fleet, case: ViewCase, *, loads: str | None = None, prefix: str | None = None) -> PoolView:
    """A fresh ``PoolView`` for ``case`` (``loads`` / ``prefix`` override its kinds)."""
    eps = list(fleet.pool_endpoints(case.target, case.role))
    t = fleet.targets[case.target]
    pool = None if isinstance(t, FrontierTarget) else t.pools_by_role()[case.role]
    extra = {}
    if case.borrow:
        assert isinstance(t, OnPremTarget) and t.pools.decode is not None
        decode = fleet.pool_endpoints(case.target, "decode")
        extra = {len(eps) + k: t.pools.decode for k in range(len(decode))}
        eps += decode
    ids = [e.id for e in eps]
    shared = _shared_tier(fleet, case.target)
    return PoolView(case.target, case.role, pool, eps, [_reading(e, loads or case.loads, i) for i, e in enumerate(ids)],
                    _healthy(case.health, len(eps)), _lookup(prefix or case.prefix, ids, case.inp.prompt_tokens, shared),
                    shared, extra)


def _view_state(view: PoolView) -> tuple[object, ...]:
    """Everything a pick may read from ``view`` (its memo fields aside), as a comparable value."""
    p = view.prefix
    return (view.target, view.role, None if view.pool is None else view.pool.model_dump(), list(view.endpoints),
            list(view.loads), list(view.healthy),
            None if p is None else (dict(p.matched), None if p.shared_runs is None else list(p.shared_runs),
                                    p.block_tokens, p.total_tokens),
            view.shared, {i: pool.model_dump() for i, pool in view.extra_pools.items()})


# ================================================================================================
# Scorers: Scorer.score(PickInput, PoolView) -> list[float], seconds per endpoint
# ================================================================================================


def _is_number(x: object) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _valid_column(got: object, n: int) -> str | None:
    """Why ``got`` is not one finite real >= 0 per endpoint (None when it is)."""
    if not isinstance(got, list):
        return f"returned {type(got).__name__}, not a list"
    if len(got) != n:
        return f"returned {len(got)} values for {n} endpoints"
    bad = [(i, x) for i, x in enumerate(got) if not (_is_number(x) and math.isfinite(x) and x >= 0)]
    return f"values that are not finite numbers >= 0: {bad[:3]}" if bad else None


def check_scorer_name_is_its_registry_key(name: str, factory: Callable[[], Scorer]) -> None:
    """``scorer.name`` is the name it is registered under (``ROLE_SCORERS`` and the trace's
    ``parts`` refer to scorers by it)."""
    scorer = _call(f"{name}()", factory)
    assert getattr(scorer, "name", None) == name, f"{name}: registered as {name!r}, named {getattr(scorer, 'name', None)!r}"


def check_scorer_returns_seconds_per_endpoint(name: str, factory: Callable[[], Scorer]) -> None:
    """``score`` returns a list with one finite float >= 0 (seconds) per endpoint of the view, on
    every pool of the packaged fleet and every load, health, prefix and request case."""
    fleet, scorer = _fleet(), factory()
    for case in view_cases(fleet):
        view = build_view(fleet, case)
        got = _call(f"{name} on {case.label}", scorer.score, case.inp, view)
        why = _valid_column(got, len(view.endpoints))
        assert why is None, f"{name} on {case.label}: {why}"


def check_scorer_is_deterministic(name: str, factory: Callable[[], Scorer]) -> None:
    """``score`` is a function of its inputs: the same values on a second call with the same view
    (whose memoized hits and outstanding counts are then filled), on a freshly built equal view,
    and from a fresh scorer."""
    fleet, scorer = _fleet(), factory()
    for case in view_cases(fleet):
        view = build_view(fleet, case)
        what = f"{name} on {case.label}"
        first = _call(what, scorer.score, case.inp, view)
        again = _call(what, scorer.score, case.inp, view)
        fresh = _call(what, factory().score, case.inp, build_view(fleet, case))
        assert first == again == fresh, f"{what}: {first}, then {again}, then {fresh}"


def check_scorer_does_not_mutate_the_view(name: str, factory: Callable[[], Scorer]) -> None:
    """``score`` changes nothing in the view (its columns, lookup, pools, shared tier) or the request."""
    fleet, scorer = _fleet(), factory()
    for case in view_cases(fleet):
        view = build_view(fleet, case)
        before, inp = _view_state(view), copy.deepcopy(case.inp)
        _call(f"{name} on {case.label}", scorer.score, case.inp, view)
        assert _view_state(view) == before, f"{name} on {case.label}: mutated the view"
        assert case.inp == inp, f"{name} on {case.label}: mutated the request"


def check_scorer_handles_missing_loads(name: str, factory: Callable[[], Scorer]) -> None:
    """A missing reading (None: nothing known) is valid input, scored as an endpoint whose only
    reading is in-flight accounting with nothing in flight (``source='inflight'``, engine fields
    null, counts 0): the two say the same thing."""
    fleet, scorer = _fleet(), factory()
    for case in view_cases(fleet):
        if case.loads not in ("missing", "mixed"):
            continue
        view = build_view(fleet, case)
        what = f"{name} on {case.label}"
        got = _call(what, scorer.score, case.inp, view)
        why = _valid_column(got, len(view.endpoints))
        assert why is None, f"{what}: {why}"
        known = build_view(fleet, case)
        known.loads = [EndpointLoad(e.id, "inflight", 0.0) if x is None else x for e, x in zip(known.endpoints, known.loads)]
        want = _call(what, scorer.score, case.inp, known)
        assert got == want, f"{what}: None readings scored {got}, empty in-flight readings {want}"


def check_scorer_handles_empty_prefix_lookups(name: str, factory: Callable[[], Scorer]) -> None:
    """A lookup that matched nothing (no endpoint holds the prompt's first block, the shared tier
    nothing) is valid input and scores exactly as no lookup at all: both mean no cached prefix."""
    fleet, scorer = _fleet(), factory()
    for case in view_cases(fleet):
        if case.prefix != "empty":
            continue
        what = f"{name} on {case.label}"
        empty = build_view(fleet, case)
        assert empty.prefix is not None and not empty.prefix.matched
        got = _call(what, scorer.score, case.inp, empty)
        why = _valid_column(got, len(empty.endpoints))
        assert why is None, f"{what}: {why}"
        bare = PoolView(empty.target, empty.role, empty.pool, empty.endpoints, empty.loads, empty.healthy,
                        PrefixLookup({}, None, BLOCK, case.inp.prompt_tokens), empty.shared, empty.extra_pools)
        none = build_view(fleet, case, prefix="none")
        want = _call(what, scorer.score, case.inp, none)
        also = _call(what, scorer.score, case.inp, bare)
        assert got == want == also, f"{what}: empty lookups scored {got} and {also}, no lookup {want}"


SCORER_CHECKS = [check_scorer_name_is_its_registry_key, check_scorer_returns_seconds_per_endpoint,
                 check_scorer_is_deterministic, check_scorer_does_not_mutate_the_view,
                 check_scorer_handles_missing_loads, check_scorer_handles_empty_prefix_lookups]


# ================================================================================================
# Pickers: Picker.pick(PickInput, PoolView) -> PoolPick
# ================================================================================================

SELECTIONS = [
    EndpointSelectionSpec(),
    EndpointSelectionSpec(fallback_endpoints=0),
    EndpointSelectionSpec(fallback_endpoints=64, bounded_load_epsilon=None),
    EndpointSelectionSpec(fallback_endpoints=1, bounded_load_epsilon=0.0, bounded_load_floor=1),
]


def _picker_cases(fleet: Fleet) -> Iterator[tuple[EndpointSelectionSpec, ViewCase]]:
    """Every view case with one of ``SELECTIONS`` in turn: each selection meets every pool and
    load kind, and a quarter of the health × prefix × request combinations."""
    for k, case in enumerate(view_cases(fleet)):
        yield SELECTIONS[k % len(SELECTIONS)], case


def _picks(name: str, factory: Callable[[EndpointSelectionSpec], Picker]) -> Iterator[tuple[str, EndpointSelectionSpec, ViewCase, PoolView, PoolPick]]:
    """``(label, selection, case, view, pick)`` for every picker case (one picker per selection)."""
    fleet = _fleet()
    pickers = {id(sel): _call(f"{name}({sel!r})", factory, sel) for sel in SELECTIONS}
    for selection, case in _picker_cases(fleet):
        view = build_view(fleet, case)
        label = f"{name} ({selection!r}) on {case.label}"
        pick = _call(label, pickers[id(selection)].pick, case.inp, view)
        yield label, selection, case, view, pick


def check_picker_returns_a_pool_pick_of_the_view(name: str, factory: Callable[[EndpointSelectionSpec], Picker]) -> None:
    """``pick`` returns a ``PoolPick`` of the view it was given."""
    for label, _, _, view, pick in _picks(name, factory):
        assert isinstance(pick, PoolPick), f"{label}: returned {type(pick).__name__}"
        assert pick.view is view, f"{label}: the pick is of another view"


def check_picker_never_chooses_an_unhealthy_endpoint(name: str, factory: Callable[[EndpointSelectionSpec], Picker]) -> None:
    """No endpoint marked unhealthy is in the order: not as the chosen one, not as a fallback."""
    for label, _, _, view, pick in _picks(name, factory):
        bad = [i for i in pick.order if 0 <= i < len(view.healthy) and not view.healthy[i]]
        assert not bad, f"{label}: unhealthy endpoints {bad} in the order {pick.order}"


def check_picker_order_is_unique_indexes_in_range(name: str, factory: Callable[[EndpointSelectionSpec], Picker]) -> None:
    """The order is a tuple of distinct ``int`` indexes into ``view.endpoints``."""
    for label, _, _, view, pick in _picks(name, factory):
        order = pick.order
        assert isinstance(order, tuple), f"{label}: order is a {type(order).__name__}"
        assert all(isinstance(i, int) and not isinstance(i, bool) for i in order), f"{label}: order {order!r}"
        assert all(0 <= i < len(view.endpoints) for i in order), f"{label}: order {order} out of range"
        assert len(set(order)) == len(order), f"{label}: order {order} repeats an endpoint"


def check_picker_chooses_none_exactly_without_healthy_endpoints(name: str, factory: Callable[[EndpointSelectionSpec], Picker]) -> None:
    """``chosen`` is None exactly when no endpoint of the view is healthy."""
    for label, _, _, view, pick in _picks(name, factory):
        if any(view.healthy):
            assert pick.chosen is not None, f"{label}: chose nothing with healthy endpoints"
        else:
            assert pick.chosen is None, f"{label}: chose {pick.chosen} with no healthy endpoint"


def check_picker_lists_at_most_the_fallbacks(name: str, factory: Callable[[EndpointSelectionSpec], Picker]) -> None:
    """The order lists at most ``1 + fallback_endpoints`` endpoints (the chosen one, then fallbacks)."""
    for label, selection, _, _, pick in _picks(name, factory):
        assert len(pick.order) <= 1 + selection.fallback_endpoints, f"{label}: {len(pick.order)} endpoints listed"


def check_picker_costs_one_per_endpoint(name: str, factory: Callable[[EndpointSelectionSpec], Picker]) -> None:
    """``costs`` holds one number (not NaN) per endpoint of the view, and so does every column of
    ``parts`` (the trace indexes both by endpoint)."""
    for label, _, _, view, pick in _picks(name, factory):
        n = len(view.endpoints)
        assert isinstance(pick.costs, list) and len(pick.costs) == n, f"{label}: costs {pick.costs!r} for {n} endpoints"
        assert all(_is_number(c) and not math.isnan(c) for c in pick.costs), f"{label}: costs {pick.costs!r}"
        for part, column in pick.parts.items():
            assert len(column) == n, f"{label}: part {part!r} has {len(column)} values for {n} endpoints"


def check_picker_breaks_ties_deterministically(name: str, factory: Callable[[EndpointSelectionSpec], Picker]) -> None:
    """The same request on the same view gets the same pick — including on pools whose endpoints
    tie (idle, cold): on repeated calls, from a fresh picker and on a freshly built equal view."""
    fleet = _fleet()
    pickers = {id(sel): factory(sel) for sel in SELECTIONS}
    for selection, case in _picker_cases(fleet):
        picker = pickers[id(selection)]
        label = f"{name} ({selection!r}) on {case.label}"
        view = build_view(fleet, case)
        picks = [_call(label, picker.pick, case.inp, view) for _ in range(3)]
        picks.append(_call(label, factory(selection).pick, case.inp, build_view(fleet, case)))
        got = [(p.order, p.costs, p.cap, p.excluded) for p in picks]
        assert all(g == got[0] for g in got), f"{label}: picks differ: {[g[0] for g in got]}"


def check_picker_does_not_mutate_the_view(name: str, factory: Callable[[EndpointSelectionSpec], Picker]) -> None:
    """``pick`` changes nothing in the view (its columns, lookup, pools, shared tier) or the request."""
    fleet = _fleet()
    pickers = {id(sel): factory(sel) for sel in SELECTIONS}
    for selection, case in _picker_cases(fleet):
        view = build_view(fleet, case)
        before, inp = _view_state(view), copy.deepcopy(case.inp)
        label = f"{name} ({selection!r}) on {case.label}"
        _call(label, pickers[id(selection)].pick, case.inp, view)
        assert _view_state(view) == before, f"{label}: mutated the view"
        assert case.inp == inp, f"{label}: mutated the request"


def check_picker_reports_exclusions(name: str, factory: Callable[[EndpointSelectionSpec], Picker]) -> None:
    """``excluded`` maps endpoint indexes in range to a non-empty reason; every unhealthy endpoint
    is there as ``unhealthy``, and the chosen endpoint is not excluded."""
    for label, _, _, view, pick in _picks(name, factory):
        assert all(isinstance(i, int) and 0 <= i < len(view.endpoints) for i in pick.excluded), f"{label}: {pick.excluded}"
        assert all(isinstance(r, str) and r for r in pick.excluded.values()), f"{label}: {pick.excluded}"
        missing = [i for i, ok in enumerate(view.healthy) if not ok and pick.excluded.get(i) != "unhealthy"]
        assert not missing, f"{label}: unhealthy endpoints {missing} not excluded as 'unhealthy': {pick.excluded}"
        assert pick.chosen not in pick.excluded, f"{label}: chose {pick.chosen}, excluded as {pick.excluded[pick.chosen]!r}"


def _strict_json(value: object) -> str:
    return json.dumps(value, allow_nan=False)


def check_picker_trace_is_json(name: str, factory: Callable[[EndpointSelectionSpec], Picker]) -> None:
    """The pick's ``trace()`` is strict JSON (no NaN or infinity) with at most ``limit``
    candidates, and ``choices()`` lists the ordered endpoints' URLs in the view's role."""
    for label, _, _, view, pick in _picks(name, factory):
        trace = _call(f"{label}: trace()", pick.trace, 4)
        _call(f"{label}: json.dumps(trace)", _strict_json, trace)
        assert isinstance(trace, dict) and len(trace["candidates"]) <= 4, f"{label}: trace {trace!r}"
        choices = _call(f"{label}: choices()", pick.choices)
        assert [c.url for c in choices] == [view.endpoints[i].url for i in pick.order], f"{label}: choices {choices}"
        assert all(c.role == view.role for c in choices), f"{label}: choices {choices}"


PICKER_CHECKS = [check_picker_returns_a_pool_pick_of_the_view, check_picker_never_chooses_an_unhealthy_endpoint,
                 check_picker_order_is_unique_indexes_in_range, check_picker_chooses_none_exactly_without_healthy_endpoints,
                 check_picker_lists_at_most_the_fallbacks, check_picker_costs_one_per_endpoint,
                 check_picker_breaks_ties_deterministically, check_picker_does_not_mutate_the_view,
                 check_picker_reports_exclusions, check_picker_trace_is_json]


# ================================================================================================
# The registries under the checks
# ================================================================================================


def _ids(pairs: list[tuple[Callable[..., None], str]]) -> list[str]:
    return [f"{entry}-{check.__name__}" for check, entry in pairs]


FILTER_RUNS = [(c, n) for n in FILTERS for c in FILTER_CHECKS]
SCORER_RUNS = [(c, n) for n in SCORERS for c in SCORER_CHECKS]
PICKER_RUNS = [(c, n) for n in PICKERS for c in PICKER_CHECKS]


@pytest.mark.parametrize(("check", "name"), FILTER_RUNS, ids=_ids(FILTER_RUNS))
def test_registered_filter(check, name):
    check(name, FILTERS[name])


@pytest.mark.parametrize(("check", "name"), SCORER_RUNS, ids=_ids(SCORER_RUNS))
def test_registered_scorer(check, name):
    check(name, SCORERS[name])


@pytest.mark.parametrize(("check", "name"), PICKER_RUNS, ids=_ids(PICKER_RUNS))
def test_registered_picker(check, name):
    check(name, PICKERS[name])


def test_the_cases_cover_the_edges():
    """The cases reach what the checks are about: every role, ties, no healthy endpoint,
    endpoints under and over the bounded-load cap, local and shared prefix hits."""
    fleet = _fleet()
    cases = view_cases(fleet)
    assert {c.role for c in cases} == set(ROLE_SCORERS)
    views = [build_view(fleet, c) for c in cases if c.loads == "busy" and c.prefix == "matched" and c.health == "all"]
    assert any(any(v.hits()[0]) and any(v.hits()[1]) for v in views)
    picks = [MinCostPicker(EndpointSelectionSpec(bounded_load_epsilon=0.0, bounded_load_floor=1)).pick(c.inp, build_view(fleet, c)) for c in cases
             if c.loads == "busy"]
    assert any("over-cap" in p.excluded.values() for p in picks)
    tied = [MinCostPicker(EndpointSelectionSpec()).pick(c.inp, build_view(fleet, c)) for c in cases
            if c.loads in ("idle", "missing") and c.prefix != "matched" and c.health == "all" and c.role != "api"]
    assert tied and all(len(set(p.costs)) == 1 for p in tied)
    assert {c.label for c in FILTER_CASES} and all(t in fleet.targets for t in ALLOW)


# ================================================================================================
# The checks catch breakage: a deliberately broken implementation per check (never registered)
# ================================================================================================


def _broken_empty_reason(name, target, ctx):
    return "" if isinstance(target, FrontierTarget) else None


def _broken_exclusion_object(name, target, ctx):
    return FILTERS["health"](name, target, ctx) or (0 if ctx.request["has_images"] else None)


def _broken_multiline_reason(name, target, ctx):
    reason = FILTERS["budget"](name, target, ctx)
    return None if reason is None else reason.replace(": ", ":\n  ")


def _broken_mutates_request(name, target, ctx):
    ctx.request["prompt_tokens"] = max(ctx.request["prompt_tokens"], 1)  # "normalises" the request in place
    return None


def _broken_mutates_settings(name, target, ctx):
    ctx.settings.tenants.setdefault(name, [])
    return None


class _Flaky:
    """A filter that remembers: eligible on the first call for a target, not afterwards."""

    def __init__(self) -> None:
        self.seen: set[tuple[str, int]] = set()

    def __call__(self, name, target, ctx):
        key = (name, ctx.request["prompt_tokens"])
        if key in self.seen:
            return "seen before"
        self.seen.add(key)
        return None


class _BrokenScorer:
    name = "broken"

    def __init__(self) -> None:
        self.inner = QueueScorer()
        self.calls = 0

    def score(self, inp, view):
        return self.inner.score(inp, view)


class _MisnamedScorer(_BrokenScorer):
    name = "queue "


class _DropsLastEndpoint(_BrokenScorer):
    name = "broken"

    def score(self, inp, view):
        return super().score(inp, view)[:-1]


class _NegativeWhenIdle(_BrokenScorer):
    def score(self, inp, view):
        return [x - 0.5 for x in super().score(inp, view)]


class _InfiniteWithoutPool(_BrokenScorer):
    def score(self, inp, view):
        return [math.inf if view.pool is None else 0.0 for _ in view.endpoints]


class _DriftingScorer(_BrokenScorer):
    def score(self, inp, view):
        self.calls += 1
        return [x + 1e-3 * self.calls for x in super().score(inp, view)]


class _ReversesHealth(_BrokenScorer):
    def score(self, inp, view):
        view.healthy = view.healthy[::-1]
        return super().score(inp, view)


class _DropsTheLookup(_BrokenScorer):
    def score(self, inp, view):
        view.prefix = None
        return super().score(inp, view)


class _CrashesOnNone(_BrokenScorer):
    def score(self, inp, view):
        return [float(x.inflight_requests) for x in view.loads]


class _PenalisesUnknown(_BrokenScorer):
    def score(self, inp, view):
        return [60.0 if x is None else s for x, s in zip(view.loads, super().score(inp, view))]


class _EmptyLookupIsAFullHit(_BrokenScorer):
    def score(self, inp, view):
        if view.prefix is not None:
            return [0.0] * len(view.endpoints)
        return [inp.prompt_tokens / 10_000] * len(view.endpoints)


class _BrokenPicker:
    def __init__(self, selection):
        self.selection = selection
        self.inner = MinCostPicker(selection)
        self.calls = 0

    def pick(self, inp, view):
        return self.inner.pick(inp, view)


class _ReturnsOrder(_BrokenPicker):
    def pick(self, inp, view):
        return super().pick(inp, view).order


class _PicksAnotherView(_BrokenPicker):
    def pick(self, inp, view):
        return replace(super().pick(inp, view), view=replace(view))


class _IgnoresHealth(_BrokenPicker):
    def pick(self, inp, view):
        order = tuple(range(len(view.endpoints)))[: 1 + self.selection.fallback_endpoints]
        return PoolPick(view, order, [0.0] * len(view.endpoints), {}, None, {})


class _UnhealthyFallback(_BrokenPicker):
    def pick(self, inp, view):
        p = super().pick(inp, view)
        down = [i for i, ok in enumerate(view.healthy) if not ok]
        return replace(p, order=p.order[:1] + tuple(down[:1])) if p.order and down else p


class _RepeatsTheChoice(_BrokenPicker):
    def pick(self, inp, view):
        p = super().pick(inp, view)
        return replace(p, order=p.order[:1] * 2)


class _OneBased(_BrokenPicker):
    def pick(self, inp, view):
        p = super().pick(inp, view)
        return replace(p, order=tuple(i + 1 for i in p.order))


class _OrderAsList(_BrokenPicker):
    def pick(self, inp, view):
        p = super().pick(inp, view)
        return replace(p, order=list(p.order))


class _GivesUpOnPartialHealth(_BrokenPicker):
    def pick(self, inp, view):
        p = super().pick(inp, view)
        return replace(p, order=()) if not all(view.healthy) else p


class _ChoosesWithoutHealthy(_BrokenPicker):
    def pick(self, inp, view):
        p = super().pick(inp, view)
        return replace(p, order=(0,)) if not p.order else p


class _ListsEverything(_BrokenPicker):
    def pick(self, inp, view):
        p = super().pick(inp, view)
        healthy = [i for i, ok in enumerate(view.healthy) if ok]
        return replace(p, order=tuple(sorted(healthy, key=p.costs.__getitem__)))


class _CostsOfHealthyOnly(_BrokenPicker):
    def pick(self, inp, view):
        p = super().pick(inp, view)
        return replace(p, costs=[c for c, ok in zip(p.costs, view.healthy) if ok])


class _NaNCosts(_BrokenPicker):
    def pick(self, inp, view):
        p = super().pick(inp, view)
        return replace(p, costs=[math.nan if c == 0 else c for c in p.costs])


class _RoundRobinTies(_BrokenPicker):
    """Breaks ties by rotating through the tied endpoints, call after call."""

    def pick(self, inp, view):
        p = super().pick(inp, view)
        if not p.order:
            return p
        best = p.costs[p.order[0]]
        tied = [i for i in range(len(view.endpoints)) if view.healthy[i] and p.costs[i] == best]
        self.calls += 1
        first = tied[self.calls % len(tied)]
        return replace(p, order=(first, *(i for i in p.order if i != first))[: len(p.order)])


class _DropsUnhealthyFromTheView(_BrokenPicker):
    def pick(self, inp, view):
        p = super().pick(inp, view)
        view.loads = [x if ok else None for x, ok in zip(view.loads, view.healthy)]
        return p


class _ForgetsTheExclusions(_BrokenPicker):
    def pick(self, inp, view):
        return replace(super().pick(inp, view), excluded={})


class _NumpyCap(_BrokenPicker):
    def pick(self, inp, view):
        import numpy as np

        return replace(super().pick(inp, view), cap=np.int64(3))


class _NumpyCosts(_BrokenPicker):
    def pick(self, inp, view):
        import numpy as np

        p = super().pick(inp, view)
        return replace(p, costs=[np.float32(c) for c in p.costs])


class _ChoicesOfAllEndpoints(_BrokenPicker):
    def pick(self, inp, view):
        p = super().pick(inp, view)

        class _Pick(PoolPick):
            def choices(self):
                return PoolPick(self.view, tuple(range(len(self.view.endpoints))), self.costs, self.parts, self.cap,
                                self.excluded).choices()

        return _Pick(p.view, p.order, p.costs, p.parts, p.cap, p.excluded)


BROKEN_FILTERS: dict[Callable[[str, FilterFn], None], list[FilterFn]] = {
    check_filter_returns_none_or_a_reason: [_broken_empty_reason, _broken_exclusion_object],
    check_filter_reason_is_one_line: [_broken_multiline_reason],
    check_filter_does_not_mutate_inputs: [_broken_mutates_request, _broken_mutates_settings],
    check_filter_is_deterministic: [_Flaky()],
}
BROKEN_SCORERS: dict[Callable[[str, Callable[[], Scorer]], None], list[Callable[[], Scorer]]] = {
    check_scorer_name_is_its_registry_key: [_MisnamedScorer],
    check_scorer_returns_seconds_per_endpoint: [_DropsLastEndpoint, _NegativeWhenIdle, _InfiniteWithoutPool],
    check_scorer_is_deterministic: [_DriftingScorer],
    check_scorer_does_not_mutate_the_view: [_ReversesHealth, _DropsTheLookup],
    check_scorer_handles_missing_loads: [_CrashesOnNone, _PenalisesUnknown],
    check_scorer_handles_empty_prefix_lookups: [_EmptyLookupIsAFullHit],
}
BROKEN_PICKERS: dict[Callable[[str, Callable[[EndpointSelectionSpec], Picker]], None], list[Callable[[EndpointSelectionSpec], Picker]]] = {
    check_picker_returns_a_pool_pick_of_the_view: [_ReturnsOrder, _PicksAnotherView],
    check_picker_never_chooses_an_unhealthy_endpoint: [_IgnoresHealth, _UnhealthyFallback],
    check_picker_order_is_unique_indexes_in_range: [_RepeatsTheChoice, _OneBased, _OrderAsList],
    check_picker_chooses_none_exactly_without_healthy_endpoints: [_GivesUpOnPartialHealth, _ChoosesWithoutHealthy],
    check_picker_lists_at_most_the_fallbacks: [_ListsEverything],
    check_picker_costs_one_per_endpoint: [_CostsOfHealthyOnly, _NaNCosts],
    check_picker_breaks_ties_deterministically: [_RoundRobinTies],
    check_picker_does_not_mutate_the_view: [_DropsUnhealthyFromTheView],
    check_picker_reports_exclusions: [_ForgetsTheExclusions],
    check_picker_trace_is_json: [_NumpyCap, _NumpyCosts, _ChoicesOfAllEndpoints],
}


def test_every_check_has_a_broken_implementation():
    assert list(BROKEN_FILTERS) == FILTER_CHECKS
    assert list(BROKEN_SCORERS) == SCORER_CHECKS
    assert list(BROKEN_PICKERS) == PICKER_CHECKS
    broken = [b for table in (BROKEN_FILTERS, BROKEN_SCORERS, BROKEN_PICKERS) for bs in table.values() for b in bs]
    registered = [*FILTERS.values(), *SCORERS.values(), *PICKERS.values(), InOrderPicker]
    assert not any(b in registered for b in broken), "a broken implementation is registered"


BREAKAGE = [(check, b) for table in (BROKEN_FILTERS, BROKEN_SCORERS, BROKEN_PICKERS)
            for check, bs in table.items() for b in bs]


def _breakage_id(pair: tuple[Callable[..., None], object]) -> str:
    check, b = pair
    return f"{check.__name__}-{getattr(b, '__name__', type(b).__name__)}"


@pytest.mark.parametrize(("check", "broken"), BREAKAGE, ids=[_breakage_id(p) for p in BREAKAGE])
def test_checks_catch_breakage(check, broken):
    with pytest.raises(AssertionError):
        check("broken", broken)
