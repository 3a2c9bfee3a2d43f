"""The ``RoutingEngine``: one request in, one ``Decision`` out. Plain data in and out;
never imports FastAPI. The same engine runs in the service, the CLI and replay.

Steps of ``route(request)`` (DESIGN.md, "The flow of one decision"):

1. features: ``extract_features(request, estimator.tokenizer)`` (bounded cost);
   for an estimator that ``takes_query_token_ids``, ``tokenized_features`` also cuts the
   query window's token ids out of the counting pass (the prompt is tokenized once);
2. difficulty: ``estimator.estimate(features)`` (with those ids when it takes them); an
   estimator that raises or returns an invalid ``p_hard`` counts as unavailable
   (``difficulty.available == false``);
3. signals: the ``request`` and ``difficulty`` namespaces, the prompt's prefix block
   hashes, and a ``live.LiveSignals`` over the ``FleetState`` that computes load,
   cache, endpoint and budget signals only as the policy reads them;
4. policy: eligibility filters, ordered rules, then the P/D mode of the chosen
   target (``decide``, a plain function shared with policy cases);
5. endpoints inside the chosen pool(s) (``policy/selection/pickers.py``): the chosen endpoint
   first, then fallback endpoints; prefill and decode endpoints when disaggregated;
6. estimated cost in USD on the chosen target, mode and endpoint (``policy/cost.py``);
7. dispatch (unless ``dispatch=False``): the estimate is reserved in the budget
   ledger (a refusal moves on to the next fallback target, and past the last to the rules after the
   deciding one: ``decide_and_take``; so concurrent decisions cannot overspend), the request is counted
   in flight on its endpoint(s), and its prefix and session are recorded (``FleetState.dispatch``). The service settles it
   when the outcome arrives (``FleetState.settle``).

``verify(decision, draft)`` is the cascade's second decision (``POST /v1/verify``): the
policy's ``verify`` rules on the decision's request and the draft, then steps 5-7 for an
escalation, held under ``<decision_id>/escalation`` (``policy/escalation.py``; signed with its claims
when the state signs ids: ``signals/signed_ids.py``).

The engine is immutable: to change policy or estimator, build a new engine
(``with_policy``, ``with_estimator``; they share the ``FleetState``) and swap the
reference; decisions in flight finish on the engine they started with.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from pointsman.errors import RequestError
from pointsman.estimator.estimate import DifficultyEstimate, Estimator, TokenIdsEstimator
from pointsman.estimator.features import RequestFeatures, tokenized_features
from pointsman.located import did_you_mean
from pointsman.policy.budget.ledger import BudgetExceeded
from pointsman.policy.cost import CostEstimate
from pointsman.policy.decision import Decision, EndpointChoice, Fallback, Trace, new_decision_id
from pointsman.policy.escalation import Escalation, TargetCosts, escalation_id, judge, rule_name
from pointsman.policy.fleet import Fleet, FrontierTarget, OnPremTarget
from pointsman.policy.live import BaseSignals, CelContext, LiveSignals, build_context, finite_or_none, resolve_mode
from pointsman.policy.rules.compiler import CompiledPolicy, CompiledRule, CompiledVerifyRule, Plan
from pointsman.policy.rules.evaluator import Verdict, call_key, evaluate, lookup_signal
from pointsman.policy.selection.filters import (
    FILTERS,
    Exclusion,
    FilterContext,
    FilterFn,
    budget_refusal,
    eligibility,
    enabled,
)
from pointsman.policy.selection.pd_mode import ModeDecision
from pointsman.policy.selection.pickers import PICKERS, PoolPick, PoolView, base_url
from pointsman.policy.signals.fleet_state import Dispatch, DispatchRecord, FleetState
from pointsman.policy.signals.namespaces import (
    RELATIVE_ROOTS,
    RequestSignals,
    difficulty_signals,
    relative_key,
    request_signals,
)
from pointsman.policy.signals.prefix_index import TEXT_BLOCK_BYTES, block_hashes_from_ids, block_hashes_from_text
from pointsman.policy.signals.source import SignalSource
from pointsman.request import RequestView, RouteRequest


@dataclass(frozen=True)
class Outcome:
    """What the policy step decided: the ``verdict`` (rule, target, route mode), the final
    ``mode`` of the target (``ModeDecision``), the eligible ``fallbacks`` with their final
    modes, ``exclusions`` (target -> ``Exclusion`` or None), the CEL ``context`` used and the function
    ``calls`` the conditions made (``cost("frontier-large")`` -> USD or None; recorded with ``decide(record=True)``,
    else empty)."""

    verdict: Verdict
    mode: ModeDecision
    fallbacks: tuple[tuple[str, str], ...]
    exclusions: dict[str, Exclusion | None]
    context: CelContext
    calls: Mapping[str, float | None]


class _GrowingContext:
    """``decide(lazy=True)``'s CEL variables: ``self(i)`` builds them for ``policy.rule_plans[i]`` when
    rule ``i`` reads more than the rules before it (else None, the current ones hold)."""

    def __init__(self, policy: CompiledPolicy, base: BaseSignals, source: SignalSource) -> None:
        self.policy, self.base, self.source = policy, base, source
        self.plan: Plan | None = None
        self.context: CelContext = {}

    def __call__(self, i: int) -> CelContext | None:
        plan = self.policy.rule_plans[i]
        if plan is self.plan:
            return None
        self.plan, self.context = plan, build_context(self.policy, self.base, self.source, plan)
        return self.context


_NO_CALLS: Mapping[str, float | None] = MappingProxyType({})


def decide(fleet: Fleet, policy: CompiledPolicy, base: BaseSignals, source: SignalSource,
           filters: dict[str, FilterFn] = FILTERS, *, lazy: bool = False,
           enabled_filters: list[tuple[str, FilterFn]] | None = None, record: bool = False,
           refused: Mapping[str, Exclusion] | None = None) -> Outcome:
    """The policy step: eligibility filters, the ordered rules on the CEL context the policy
    reads, then the P/D mode of the chosen target and of each fallback. ``base`` holds the
    ``request`` and ``difficulty`` namespaces; ``source`` is a signal source
    (``live.LiveSignals`` or ``live.StaticSignals``). ``lazy``: the context grows rule by rule
    (``policy.rule_plans``), so signals only the rules after the deciding one read are not computed
    (the same verdict: a condition reads only what its plan names); ``Outcome.context`` then holds
    what the evaluated rules read. ``enabled_filters``: ``enabled(policy.filters, filters)`` when the caller
    has it (the engine, once per policy). ``record``: keep the function calls the conditions make
    (``Outcome.calls``, for the trace; off, nothing is recorded and nothing costs). ``refused``: targets refused at
    dispatch (``decide_and_take``), excluded as a filter excludes. Raises
    ``NoEligibleTarget`` when no matching rule has an eligible target."""
    exclusions = eligibility(fleet, FilterContext(base["request"], policy.filters, source),
                             enabled(policy.filters, filters) if enabled_filters is None else enabled_filters)
    if refused:
        exclusions.update(refused)
    costs = TargetCosts(fleet, source)
    calls: dict[str, float | None] | None = {} if record else None
    if lazy and policy.rule_plans:
        growing = _GrowingContext(policy, base, source)
        verdict = evaluate(policy, {}, costs, exclusions, pruned=True, context_for=growing, calls=calls)
        context = growing.context
    else:
        context = build_context(policy, base, source)
        verdict = evaluate(policy, context, costs, exclusions, pruned=True, calls=calls)
    mode = resolve_mode(policy, fleet, source, verdict.target, verdict.mode)
    fallbacks = tuple((t, resolve_mode(policy, fleet, source, t, m).mode) for t, m in verdict.fallbacks)
    return Outcome(verdict, mode, fallbacks, exclusions, context, _NO_CALLS if calls is None else calls)


def decide_and_take(fleet: Fleet, policy: CompiledPolicy, base: BaseSignals, source: SignalSource,
                    take: Callable[[str, str], Exclusion | None], **kwargs: Any,
                    ) -> tuple[Outcome, list[tuple[str, str]], dict[str, Exclusion]]:
    """``decide`` (``kwargs`` are its own), then the dispatch: the deciding rule's target and fallbacks, (target,
    mode) in order, offered to ``take``, which answers None (taken) or the ``Exclusion`` refusing it (no healthy
    endpoint in the mode's pools, the budget's reservation). When it refuses every one, the rules after it are
    tried with the refused targets excluded, as a filter excludes (``decide(refused=)``; the trace shows that rule
    ``no-eligible-target``), so a refusal at dispatch passes a rule over as a filter does. Returns (the deciding
    rule's outcome, its candidates from the one taken on, every refusal: target -> ``Exclusion``). Raises
    ``NoEligibleTarget`` (filters and refusals) when no rule's candidate is taken."""
    refusals: dict[str, Exclusion] = {}
    while True:  # each round refuses at least one target not refused before: at most one round per target
        outcome = decide(fleet, policy, base, source, refused=refusals, **kwargs)
        candidates = [(outcome.verdict.target, outcome.mode.mode), *outcome.fallbacks]
        for index, (target, mode) in enumerate(candidates):
            why = take(target, mode)
            if why is None:
                return outcome, candidates[index:], refusals
            refusals[target] = why


def _signals_read(rules: Sequence[CompiledRule | CompiledVerifyRule], context: Mapping[str, object], live: LiveSignals,
                  calls: Mapping[str, float | None] = _NO_CALLS, costs: TargetCosts | None = None) -> dict[str, object]:
    """The trace's ``signals``: every signal the evaluated ``rules`` read, ``{path: {"value", "age_s"}}`` (its value
    in the CEL ``context``, infinities as null; a relative one named with its rule's target, ``cache.x [t]``), and
    with ``costs`` every function call (``cost("t")``, computed at decision time: as the conditions made them,
    ``calls``, recorded when explaining; else, a call the evaluation skipped or a trace built later, from ``costs``)."""
    used: dict[str, object] = {}
    for rule in rules:
        for path in rule.signals:
            value = lookup_signal(context, path, rule)
            root = path.partition(".")[0]
            age = 0.0
            if path.startswith('load["') or root == "budget":
                age = live.age(path)
            elif root == "endpoint":
                age = live.endpoint(relative_key("endpoint", rule.target, rule.role))["age_s"]
            if root in RELATIVE_ROOTS:  # relative to the rule's target: name it
                path = f"{path} [{rule.target}]"
            used[path] = {"value": finite_or_none(value), "age_s": age}
        if costs is not None and isinstance(rule, CompiledRule):
            for name, arg in rule.calls:
                key = call_key(name, arg)
                value = calls[key] if key in calls else costs.get(arg)
                used[key] = {"value": finite_or_none(value), "age_s": 0.0}
    for key, value in calls.items():  # calls with a computed argument (cost(variables.tier))
        used.setdefault(key, {"value": finite_or_none(value), "age_s": 0.0})
    return used


def _checked(estimate: object, started: float) -> DifficultyEstimate:
    """Treat a malformed estimate (not a DifficultyEstimate, p_hard outside [0, 1] or NaN) as unavailable."""
    if not isinstance(estimate, DifficultyEstimate):
        return DifficultyEstimate(None, False, (time.perf_counter() - started) * 1e3,
                                  f"estimator returned {type(estimate).__name__}")
    if estimate.available:
        p = estimate.p_hard
        if not isinstance(p, (int, float)) or math.isnan(p) or not 0.0 <= p <= 1.0:
            return DifficultyEstimate(None, False, estimate.latency_ms, f"invalid p_hard {p!r}")
    return estimate


def check_slo_class(fleet: Fleet, slo_class: str | None) -> None:
    """Raises ``RequestError`` naming ``routing.slo_class`` (and the fleet's classes) when
    ``slo_class`` is not one of ``fleet.slo_classes``; None (no class named) passes."""
    classes = fleet.slo_classes
    if slo_class is not None and slo_class not in classes:
        raise RequestError(f"unknown SLO class '{slo_class}' (the fleet's classes: {', '.join(classes)})"
                           f"{did_you_mean(slo_class, list(classes))}", field="routing.slo_class")


def block_hashes(view: RequestView) -> tuple[list[int], bool]:
    """(chained prefix block hashes, from gateway ids?): the gateway's ``prefix_block_hashes``
    when given (512-token blocks), else hashes of the view's ``conversation`` (128-token blocks; a long
    one's reuse those of its session's last text as far as they agree, ``session_texts``). Either is salted by the
    request's ``cache_salt``: an engine shares no cached block between salts, so neither do these.
    Raises ``RequestError`` naming ``routing.prefix_block_hashes`` for an id that is not an int
    or a string."""
    ids = view.routing.prefix_block_hashes
    salt = (view.request.cache_salt or "").encode("utf-8")
    if ids:
        try:
            return block_hashes_from_ids(ids, salt=salt), True
        except TypeError as exc:
            raise RequestError(str(exc), field="routing.prefix_block_hashes") from None
    return block_hashes_from_text(view.conversation_utf8, salt=salt, reuse=True, key=view.session_key), False


def cached_hashes(fleet: Fleet, target: str, hashes: Sequence[int], request: RequestSignals,
                  view: RequestView | None = None, gateway_ids: bool = False) -> Sequence[int]:
    """The block hashes a dispatch to ``target`` leaves in its cache: on a frontier target with explicit
    prompt caching (``prompt_cache: explicit``), none for a request that marks no ``cache_control`` (the
    provider caches nothing) and, for a marked one, those of the text up to its last breakpoint
    (``RequestView.cache_breakpoint_bytes``; all of gateway-given ids, whose text is unknown); else ``hashes``."""
    t = fleet.targets.get(target)
    if not (isinstance(t, FrontierTarget) and t.prompt_cache == "explicit"):
        return hashes
    if not request.get("has_cache_control"):
        return []
    if view is None or gateway_ids:
        return hashes
    return hashes[:view.cache_breakpoint_bytes // TEXT_BLOCK_BYTES]


@dataclass(frozen=True)
class Placement:
    """Where a (target, mode) runs: ``mode`` (may differ from the asked one when a pool has no
    healthy endpoint), ordered ``endpoints``, the pool ``picks`` (prefill first), the main
    endpoint id and the prefill one (disaggregated), ``cost``, and a ``note``."""

    target: str
    mode: str
    endpoints: tuple[EndpointChoice, ...]
    picks: tuple[PoolPick, ...]
    endpoint: str
    prefill_endpoint: str | None
    cost: CostEstimate
    note: str | None = None

    def record(self, decision_id: str, view: RequestView, at: float, fleet_revision: str) -> DispatchRecord:
        """What dispatching here holds until the outcome (``reserved`` is set by the dispatch); its prompt tokens
        are the cost's (``cost.target_prompt_tokens``: images, audio and files by the target's rules);
        ``at``: monotonic seconds; ``fleet_revision``: the fleet it was priced on. The output cap is the output
        the estimate counted (``max_tokens``, else the fleet's default, for each of OpenAI's ``n`` answers) when
        the request set either, else 0. The cached tokens are the prefix the prefill-side endpoint holds (its local
        hit)."""
        c, r = self.cost, view.request
        cap = c.output_tokens if r.max_output_tokens or (r.n or 1) > 1 else 0
        first = self.picks[0]
        cached = 0 if first.chosen is None or first.view.role == "api" else first.view.hit(first.chosen)[0]
        return DispatchRecord(decision_id, self.target, self.mode, self.endpoint, self.prefill_endpoint,
                              view.scopes, c.usd, False, c.prompt_tokens, c.prefill_utilization,
                              c.decode_utilization, at, cap, cached, fleet_revision)


def _local_prefill_note(t: OnPremTarget, view: PoolView, local_hit_tokens: int) -> str:
    """The trace note for an aggregated request prefilled on a decode endpoint: it holds the prefix,
    or it holds none of it and why it ran there (no aggregated pool, none healthy, or a short prompt)."""
    if local_hit_tokens > 0:
        return "prefilled locally on a decode endpoint holding the prefix"
    agg = t.pools.aggregated
    if agg is None:
        why = "the target has no aggregated pool"
    elif not any(ok for i, ok in enumerate(view.healthy) if view.pool_of(i) is agg):
        why = "no healthy aggregated endpoint"
    else:
        why = "a short prompt may prefill on any decode endpoint"
    return f"prefilled locally on a decode endpoint holding none of the prefix ({why})"


def place(live: LiveSignals, target: str, mode: str) -> Placement | None:
    """Pick endpoints for ``target`` in ``mode`` and price the request there (cached prefix:
    the chosen prefill-side endpoint's local hit plus what its shared tier restores faster
    than recompute). A mode whose pools have no healthy endpoint falls back to the target's
    other mode; None when no mode has one."""
    fleet = live.fleet
    t = fleet.targets[target]
    if isinstance(t, FrontierTarget):
        pick = live.pick(target, "api")
        if pick.chosen is None:
            return None
        cached = pick.view.hit(0)[0]
        return Placement(target, "aggregated", pick.choices(), (pick,), target, None,
                         live.cost(target, "aggregated", cached))
    note = None
    for m in (mode, *[x for x in t.modes if x != mode]):
        picks: tuple[PoolPick, ...]
        if m == "aggregated":
            picks = (live.pick(target, "aggregated"),)
        else:
            picks = (live.pick(target, "prefill"), live.pick(target, "decode"))
        first, main = picks[0], picks[-1]
        first_i, main_i = first.chosen, main.chosen
        if first_i is None or main_i is None:
            continue
        if m != mode:
            note = f"no healthy endpoint for {mode}; ran {m}"
        local, shared = first.view.hit(first_i)
        cached = local + (shared if first.view.shared is not None else 0)
        pools = None
        if m == "aggregated":
            pool = first.view.pool_of(first_i)
            pools = None if pool is None else (pool, pool)
            if pool is not t.pools.aggregated:
                note = (note + "; " if note else "") + _local_prefill_note(t, first.view, local)
        return Placement(target, m, tuple(c for p in picks for c in p.choices()), picks,
                         main.view.endpoints[main_i].id,
                         first.view.endpoints[first_i].id if m == "disaggregated" else None,
                         live.cost(target, m, cached, pools), note)
    return None


@dataclass(frozen=True)
class Prepared:
    """Steps 0-1 of one decision (``RoutingEngine.prepare``): the request's ``view``, its ``features``,
    the query window's token ids for an estimator that takes them (else None), and when the steps
    started and ended (``time.perf_counter`` seconds: the decision's timings count from ``started``)."""

    view: RequestView
    features: RequestFeatures
    query_token_ids: list[int] | None
    started: float
    features_done: float


class RoutingEngine:
    """Decides where requests run.

    ``RoutingEngine(fleet, policy, estimator, *, state=None, filters=FILTERS)``: ``policy``
    must be compiled against ``fleet`` (``ValueError`` otherwise); ``estimator`` is any
    ``Estimator`` (``.version``, ``.tokenizer``, ``.estimate(features)``); ``state`` is the
    live ``FleetState`` (default: a fresh in-memory one without a budget ledger). The
    endpoint picker is the policy's ``endpoint_selection.picker``.
    """

    def __init__(self, fleet: Fleet, policy: CompiledPolicy, estimator: Estimator, *,
                 state: FleetState | None = None, filters: dict[str, FilterFn] = FILTERS) -> None:
        if policy.fleet_revision != fleet.revision:
            raise ValueError(f"policy {policy.file} was compiled against fleet revision "
                             f"{policy.fleet_revision}, not {fleet.revision}")
        if state is not None and state.fleet.revision != fleet.revision:
            raise ValueError("the FleetState was built for another fleet revision")
        self.fleet = fleet
        self.policy = policy
        self.estimator = estimator
        self.state = state or FleetState(fleet)
        self.filters = filters
        self._enabled_filters = enabled(policy.filters, filters)  # what ``decide`` runs, read once per policy
        self.picker = PICKERS[policy.selection.picker](policy.selection)
        self._tokenizer = estimator.tokenizer
        self._ids_estimator = estimator if isinstance(estimator, TokenIdsEstimator) and \
            estimator.takes_query_token_ids else None

    def with_policy(self, policy: CompiledPolicy) -> RoutingEngine:
        """A new engine with ``policy`` and everything else (state included) shared."""
        return RoutingEngine(self.fleet, policy, self.estimator, state=self.state, filters=self.filters)

    def with_estimator(self, estimator: Estimator) -> RoutingEngine:
        """A new engine with ``estimator`` and everything else shared."""
        return RoutingEngine(self.fleet, self.policy, estimator, state=self.state, filters=self.filters)

    def _estimate(self, features: RequestFeatures, query_token_ids: list[int] | None) -> DifficultyEstimate:
        started = time.perf_counter()
        try:
            if query_token_ids is None or self._ids_estimator is None:
                return _checked(self.estimator.estimate(features), started)
            return _checked(self._ids_estimator.estimate(features, query_token_ids), started)
        except Exception as exc:  # noqa: BLE001 - the estimator must never take a decision down
            return DifficultyEstimate(None, False, (time.perf_counter() - started) * 1e3,
                                      f"{type(exc).__name__}: {exc}")

    def prepare(self, request: RouteRequest | RequestView, api_key_id: str | None = None) -> Prepared:
        """Steps 0-1 of ``route`` alone: the request's view (``api_key_id`` as in ``route``) and its
        features, so a caller may obtain the estimate (step 2) its own way, e.g. awaiting the
        estimator's pool without blocking an event loop, and pass both to ``route``. Raises
        ``RequestError`` for a ``routing.slo_class`` the fleet does not declare."""
        started = time.perf_counter()
        view = request if isinstance(request, RequestView) else RequestView.of(request, api_key_id)
        check_slo_class(self.fleet, view.routing.slo_class)
        features, query_token_ids = tokenized_features(view, self._tokenizer, self._ids_estimator is not None)
        return Prepared(view, features, query_token_ids, started, time.perf_counter())

    def route(self, request: RouteRequest | RequestView | Prepared, *, dispatch: bool = True,
              api_key_id: str | None = None, endpoint_subset: AbstractSet[str] | None = None,
              estimate: DifficultyEstimate | None = None) -> Decision:
        """Decide where ``request`` runs and, with ``dispatch`` (default), commit it: reserve
        its estimated cost on its budget scopes (``routing.tenant``, ``routing.team``,
        ``api_key_id``), count it in flight, record its prefix. ``dispatch=False`` decides
        without changing any state (what-if: CLI, explain tools), a candidate whose estimate the
        budgets would refuse moving to the next as a refused reservation would. The trace is built at once
        when ``routing.explain`` is set, else on first access of ``Decision.trace`` (from the
        decision's memoized signals; values it had not read come from the state then).
        ``request`` may be a ``RequestView`` already built (then ``api_key_id`` is its own).
        ``endpoint_subset``: endpoint ids the request may use (a proxy's subset hint); the others
        count as unavailable for this decision (``live.LiveSignals``), so a target with none of
        them is ineligible (filter ``health``).
        ``request`` may also be ``prepare``'s answer, with the ``estimate`` of its features (step 2:
        the estimator is not called then; a malformed estimate counts as unavailable, as one the
        estimator returns).

        Raises ``NoEligibleTarget`` (a ``RequestError``) naming the filter that removed each
        candidate, or the budget that refused each reservation; ``RequestError`` for routing
        fields budgets cannot use or a ``routing.slo_class`` the fleet does not declare;
        ``LedgerUnavailable`` when the budget ledger fails for a request with budgets (unless the
        state fails open)."""
        prepared = request if isinstance(request, Prepared) else self.prepare(request, api_key_id)
        view, features, t0, t1 = prepared.view, prepared.features, prepared.started, prepared.features_done
        if estimate is None:
            estimate = self._estimate(features, prepared.query_token_ids)
        else:
            estimate = _checked(estimate, t1)
        t2 = time.perf_counter()
        routing = view.routing
        base: BaseSignals = {"request": request_signals(features, view, self.fleet.spec.defaults.output_tokens),
                             "difficulty": difficulty_signals(estimate)}
        scopes = view.scopes
        hashes, gateway_ids = block_hashes(view)
        live = LiveSignals(self.state, self.policy, self.picker, request=base["request"], block_hashes=hashes,
                           gateway_ids=gateway_ids, scopes=scopes, session_id=routing.session_id or "", view=view,
                           subset=endpoint_subset)
        decision_id = base_id = new_decision_id()
        chosen: Placement | None = None
        reserved = False  # whether the ledger holds the chosen candidate's estimate

        def take(target: str, mode: str) -> Exclusion | None:
            nonlocal chosen, decision_id, reserved
            placed = place(live, target, mode)
            if placed is None:
                return Exclusion("health", f"no healthy endpoint for {mode}")
            if dispatch:
                try:
                    dispatched = self.state.dispatch(  # its id as dispatched: signed with its claims
                        Dispatch(placed.record(base_id, view, live.now_mono,
                                               self.fleet.revision),
                                 cached_hashes(self.fleet, target, live.target_hashes(target), base["request"], view,
                                               gateway_ids),
                                 gateway_ids, routing.session_id or ""), now=live.now)
                except BudgetExceeded as exc:
                    return Exclusion("budget", str(exc).removeprefix("budget exceeded: "))
                decision_id, reserved = dispatched.decision_id, dispatched.reserved
            elif (refused := budget_refusal(live, placed.cost.usd)) is not None:  # the reservation's check
                return Exclusion("budget", f"{refused} (what-if: nothing reserved)")
            chosen = placed
            return None

        # lazily unless explaining: the trace lists every prediction the full context computes
        outcome, candidates, refusals = decide_and_take(
            self.fleet, self.policy, base, live, take, filters=self.filters, lazy=not routing.explain,
            enabled_filters=self._enabled_filters, record=routing.explain)
        verdict = outcome.verdict
        assert chosen is not None  # taken
        fallbacks = []
        for t, m in candidates[1:]:
            fb = place(live, t, m)
            if fb is not None:
                fallbacks.append(Fallback(t, self.fleet.served_model(t, view.request.model), base_url(fb.endpoints),
                                          fb.mode))
        t3 = time.perf_counter()
        placement = chosen
        decision = Decision(
            decision_id=decision_id,
            target=placement.target,
            model=self.fleet.served_model(placement.target, view.request.model),
            base_url=base_url(placement.endpoints),
            mode=placement.mode,
            endpoints=placement.endpoints,
            fallbacks=tuple(fallbacks),
            estimated_cost_usd=placement.cost.usd,
            rule=verdict.rule.name,
            labels=verdict.rule.labels,
            verify_prefix_tokens=self.policy.verify.prefix_tokens if self.policy.verify is not None else None,
            p_hard=base["difficulty"]["p_hard"],
            difficulty_available=base["difficulty"]["available"],
            prompt_tokens=placement.cost.prompt_tokens,
            policy_revision=self.policy.revision,
            fleet_revision=self.fleet.revision,
            estimator_version=str(self.estimator.version),
            timings_ms={
                "features": (t1 - t0) * 1e3,
                "estimator": (t2 - t1) * 1e3,
                "policy": (t3 - t2) * 1e3,
                "total": (t3 - t0) * 1e3,
            },
            trace_builder=lambda: self._trace(live, outcome, placement, refusals, estimate, reserved, scopes,
                                              [] if features.prompt_tokens_exact else view.request.uncounted_input()),
            request_features=features,
            request_view=view,
            head_input=estimate.features,
            difficulty_error=estimate.error,
        )
        if routing.explain:
            decision.trace  # noqa: B018 - built now, while the signals are the decision's
            decision.timings_ms["total"] = (time.perf_counter() - t0) * 1e3
        return decision

    def _trace(self, live: LiveSignals, outcome: Outcome, chosen: Placement, refusals: dict[str, Exclusion],
               estimate: DifficultyEstimate, reserved: bool, scopes: tuple[str, ...], uncounted: list[str]) -> Trace:
        verdict = outcome.verdict
        used = _signals_read(self.policy.rules[: len(verdict.codes)], outcome.context, live, outcome.calls,
                             TargetCosts(self.fleet, live))
        candidates = []
        for name in self.fleet.targets:
            c = chosen.cost if name == chosen.target else live.cost(name)
            excl = outcome.exclusions.get(name) or refusals.get(name)
            candidates.append({"target": name, "mode": c.mode, "estimated_cost_usd": c.usd,
                               "eligible": excl is None, "excluded_by": str(excl) if excl else None})
        mode = outcome.mode.to_dict()
        if chosen.target != verdict.target:
            mode = {"mode": chosen.mode, "reason": f"{verdict.target} refused ({refusals[verdict.target]}); "
                                                  f"took fallback {chosen.target}", "inputs": {}}
        if chosen.note:
            mode["note"] = chosen.note
        return {
            "rules": [r.to_dict() for r in verdict.results],
            "deciding_rule": {"name": verdict.rule.name, "when": verdict.rule.when, "line": verdict.rule.line},
            "signals": used,
            "candidates": candidates,
            "mode": finite_or_none(mode),
            "endpoints": [p.trace() for p in chosen.picks],
            # unhealthy endpoints fed no signal (load, cache, session, cost): which, and why
            "dropped_endpoints": dict(live.dropped),
            # per target looked up: where its cache signals came from (engine KV events or an estimate)
            "cache_sources": dict(live.cache_sources),
            "budget": {"scopes": list(scopes), "limited": live.budget_limited() if scopes else False,
                       "reserved_usd": chosen.cost.usd if reserved else None,  # None: nothing held
                       "refusals": {t: str(e) for t, e in refusals.items()}},
            "cost": chosen.cost.to_dict(),
            # billed input the prompt's count leaves out (RouteRequest.uncounted_input; none when the gateway sent
            # the count): its prompt_tokens, prompt_tokens_upper and costs are lower bounds then
            "uncounted_input": uncounted,
            # predicted latency per target/mode the decision computed (policy/selection/latency.py)
            "prediction": finite_or_none(live.predictions_trace()),
            "estimator": {"version": str(getattr(self.estimator, "version", "unknown")),
                          "available": estimate.available, "latency_ms": estimate.latency_ms,
                          "error": estimate.error, "reading": estimate.reading},
            "policy": {"name": self.policy.name, "file": self.policy.file},
        }

    def verify(self, decision: Decision, draft: Mapping[str, object], *, dispatch: bool = True) -> Escalation:
        """The cascade's second decision (``policy/escalation.py``) for ``decision``'s draft:
        ``draft`` is the ``draft`` namespace (``escalation.draft_signals``). The policy's verify
        rules run on the decision's request and difficulty and on signals read now (load,
        budget, cache, eligibility); an escalation is placed like a route (endpoints, cost) and,
        with ``dispatch``, committed under ``escalation_id(decision_id)``: its estimated cost
        reserved on the decision's budget scopes, counted in flight. A target that refuses the
        hold or has no healthy endpoint moves on to the next; when none is left the draft is
        accepted (rule ``no-eligible-escalation``). Raises ``LedgerUnavailable`` as ``route``."""
        view, features = decision.request_view, decision.request_features
        if view is None or features is None:
            raise ValueError("a decision without its request view cannot be verified")
        base: BaseSignals = {"request": request_signals(features, view, self.fleet.spec.defaults.output_tokens),
                             "difficulty": {"p_hard": decision.p_hard, "available": decision.difficulty_available}}
        hashes, gateway_ids = block_hashes(view)
        live = LiveSignals(self.state, self.policy, self.picker, request=base["request"], block_hashes=hashes,
                           gateway_ids=gateway_ids, scopes=view.scopes, session_id=view.routing.session_id or "",
                           view=view)
        verdict = judge(self.fleet, self.policy, base, live, draft, self.filters)
        labels = dict(verdict.rule.labels) if verdict.rule is not None else {}
        evaluated = self.policy.verify.rules[: len(verdict.results)] if self.policy.verify is not None else ()
        signals = _signals_read(evaluated, verdict.context, live)
        if verdict.action == "accept" or verdict.target is None or verdict.mode is None:
            return Escalation(decision.decision_id, "accept", rule_name(verdict), labels, verdict.results,
                              signals=signals)
        eid = escalation_id(decision.decision_id)
        candidates = [(verdict.target, verdict.mode), *verdict.fallbacks]
        refusals: dict[str, str] = {}
        for index, (target, mode) in enumerate(candidates):
            placed = place(live, target, mode)
            if placed is None:
                refusals[target] = f"no healthy endpoint for {mode}"
                continue
            held = eid
            if dispatch:
                try:
                    held = self.state.dispatch(Dispatch(placed.record(eid, view, live.now_mono,
                                                                      self.fleet.revision),
                                                        cached_hashes(self.fleet, target, live.target_hashes(target),
                                                                      base["request"], view, gateway_ids),
                                                        gateway_ids, view.routing.session_id or ""),
                                               now=live.now).decision_id  # signed (the state's signer)
                except BudgetExceeded as exc:
                    refusals[target] = str(exc)
                    continue
            fallbacks = []
            for t, m in candidates[index + 1:]:
                fb = place(live, t, m)
                if fb is not None:
                    fallbacks.append(Fallback(t, self.fleet.served_model(t, view.request.model), base_url(fb.endpoints),
                                              fb.mode))
            return Escalation(decision.decision_id, "escalate", rule_name(verdict), labels, verdict.results,
                              escalation_id=held, target=target, model=self.fleet.served_model(target, view.request.model),
                              base_url=base_url(placed.endpoints), mode=placed.mode, endpoints=placed.endpoints,
                              fallbacks=tuple(fallbacks), estimated_cost_usd=placed.cost.usd, refusals=refusals,
                              signals=signals)
        return Escalation(decision.decision_id, "accept", "no-eligible-escalation", {}, verdict.results,
                          refusals=refusals, signals=signals)
