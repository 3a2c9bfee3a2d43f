"""Signal sources for one decision: what the fleet looks like, computed only as far as
the policy and the picker read it.

A *signal source* answers, for one decision (``decide`` and the engine call these):

- ``load(target)``, ``cache(target)``, ``endpoint(key)``, ``budget()``, ``predict(target)``: namespace values
  (dicts as ``policy/signals/namespaces.py`` declares them; ``endpoint`` keyed ``target/role``);
- ``cost(target, mode=None)``: a ``CostEstimate`` (default mode: the target's);
- ``healthy_endpoints(target)``, ``budget_limited()``, ``budget_fits(usd)``,
  ``budget_binding()``: what the filters ask;
- ``age(path)``: the age in seconds of a signal path, for the trace.

Two sources: ``LiveSignals`` reads a ``FleetState`` (load board, prefix indexes,
health, sessions, budget ledger) lazily and memoizes each answer for the decision;
``StaticSignals`` serves a fixed snapshot (policy cases, tests, replay of recorded
signals). ``build_context(policy, base, source)`` assembles the CEL variables the
policy's ``context_plan`` names, nothing more.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import TypeAlias, TypedDict

from pointsman.policy.budget.ledger import BudgetSnapshot, LedgerUnavailable
from pointsman.policy.cost import CostEstimate, estimate_cost, pool_utilization, target_prompt_tokens
from pointsman.policy.fleet import EndpointInfo, Fleet, FrontierTarget, OnPremTarget, Pool, SLOClass, phase_roles
from pointsman.policy.rules.compiler import CompiledPolicy, Plan
from pointsman.policy.selection import latency
from pointsman.policy.selection.latency import Prediction
from pointsman.policy.selection.pd_mode import ModeDecision, decide_mode, pd_pool_gpus
from pointsman.policy.selection.pickers import Picker, PickInput, PoolPick, PoolView, QueueScorer
from pointsman.policy.signals.engine_hashes import TargetTokenizerError
from pointsman.policy.signals.fleet_state import FleetState
from pointsman.policy.signals.load_board import EndpointLoad, mean_reading, queue_sum
from pointsman.policy.signals.namespaces import (
    SIGNALS,
    BudgetSignals,
    CacheSignals,
    DifficultySignals,
    EndpointSignals,
    PredictSignals,
    RequestSignals,
    Snapshot,
    budget_signals,
    cache_signals,
    endpoint_signals,
    example_endpoint,
    example_predict,
)
from pointsman.policy.signals.prefix_index import PrefixLookup, namespaced
from pointsman.policy.signals.source import SignalMap, SignalSource, number
from pointsman.request import RequestView

_SUMS = ("num_requests_running", "num_requests_waiting")
_MEANS = ("kv_cache_usage", "ttft_p50_ms", "tpot_p50_ms", "prefill_utilization", "decode_utilization")
_LOAD_FIELDS = tuple(SIGNALS["load"].fields or ())
#: Why an endpoint outside a proxy's subset hint is not used (``LiveSignals.subset``; in the trace).
SUBSET_REASON = "not in the gateway's endpoint subset"


class TargetLoad(Mapping[str, object]):
    """``load[target]`` computed field by field on first read: a 256-endpoint pool costs one
    pass per field the policy reads, not one per declared field. Same values as
    ``signals.load_signals(load.aggregate_loads(...))``: the queue counts by ``load_board.queue_sum``,
    ``outstanding_requests`` the sum of each endpoint's own, fractions and latencies averaged over
    the endpoints reporting them, ``age_s``
    of the oldest external reading, ``stale``/``saturated`` if any is."""

    def __init__(self, readings: list[EndpointLoad], now: float, endpoints: int, healthy_endpoints: int,
                 prefill: Callable[[], tuple[float | None, bool]]) -> None:
        self._r, self._now, self._prefill = readings, now, prefill
        self._values: dict[str, object] = {"endpoints": endpoints, "healthy_endpoints": healthy_endpoints}

    def __getitem__(self, key: str) -> object:
        values = self._values
        if key in values:
            return values[key]
        r = self._r
        value: object
        if key in _SUMS:
            value = queue_sum(r, key)
        elif key in _MEANS:
            means: list[float] = [v for v in (getattr(x, key) for x in r) if v is not None]
            value = sum(means) / len(means) if means else None
        elif key == "inflight_requests":
            value = sum(x.inflight_requests for x in r)
        elif key == "outstanding_requests":
            value = sum(x.outstanding_requests for x in r)
        elif key == "age_s":
            external = [x.updated_at for x in r if x.measured]
            value = max(0.0, self._now - min(external)) if external else 0.0
        elif key in ("stale", "saturated"):
            value = any(getattr(x, key) for x in r)
        elif key in ("prefill_queue_s", "prefill_saturated"):
            values["prefill_queue_s"], values["prefill_saturated"] = self._prefill()
            return values[key]
        else:
            raise KeyError(key)
        values[key] = value
        return value

    def __iter__(self) -> Iterator[str]:
        return iter(_LOAD_FIELDS)

    def __len__(self) -> int:
        return len(_LOAD_FIELDS)

#: The ``request`` and ``difficulty`` namespaces of one decision (``decide``'s ``base``).
class BaseSignals(TypedDict):
    """The namespaces computed before any fleet signal: ``request`` and ``difficulty``."""

    request: RequestSignals
    difficulty: DifficultySignals


#: The CEL variables of one decision: namespace -> its fields (flat) or key -> fields (keyed).
CelContext: TypeAlias = dict[str, object]


def _pick(ns: Mapping[str, object], fields: AbstractSet[str] | None, known_only: bool = False) -> Mapping[str, object]:
    if fields is None:
        return ns
    return {f: ns[f] for f in fields if not known_only or f in ns}


def build_context(policy: CompiledPolicy, base: BaseSignals, source: SignalSource,
                  context_plan: Plan | None = None) -> CelContext:
    """The CEL variables for ``policy``: its ``context_plan`` (or the one given, e.g. one of its
    ``rule_plans``) filled from ``base`` (``request``, ``difficulty``; ``variables`` come from the
    policy) and ``source`` (``load``, ``budget``, ``_cache``, ``_endpoint``). Keyed entries are pruned to
    the fields the plan names."""
    out: CelContext = {}
    for root, plan in (policy.context_plan if context_plan is None else context_plan).items():
        if isinstance(plan, dict):  # keyed: load, _cache, _endpoint
            out[root] = _keyed(root, plan, source)
        elif root == "variables":
            out[root] = _pick(policy.variables, plan, known_only=True)
        elif root == "request":
            out[root] = _pick(base["request"], plan, known_only=True)
        elif root == "difficulty":
            out[root] = _pick(base["difficulty"], plan, known_only=True)
        elif root == "budget":
            out[root] = _pick(source.budget(), plan)
        else:  # a keyed root read whole
            out[root] = _keyed(root, {k: None for k in _all_keys(root, source.fleet)}, source)
    return out


def _keyed(root: str, keys: Mapping[str, AbstractSet[str] | None], source: SignalSource) -> dict[str, Mapping[str, object]]:
    get: Callable[[str], SignalMap] = {"load": source.load, "_cache": source.cache, "_endpoint": source.endpoint,
                                       "predict": source.predict}[root]
    ns_out: dict[str, Mapping[str, object]] = {}
    for key, fields in keys.items():
        value = get(key)
        ns_out[key] = dict(value) if fields is None else {f: value[f] for f in fields}
    return ns_out


def _all_keys(root: str, fleet: Fleet) -> list[str]:
    if root == "_endpoint":
        keys: list[str] = []
        for name, t in fleet.targets.items():
            roles = ("api",) if isinstance(t, FrontierTarget) else tuple(r for r in t.pools_by_role() if r != "prefill")
            keys.extend(f"{name}/{r}" for r in roles)
        return keys
    return list(fleet.targets)


def _scores(source: SignalSource, target: str) -> tuple[float | None, float | None]:
    """(aggregated, disaggregated) SLO scores of ``predict[target]``: max(TTFT / SLO TTFT,
    TPOT / SLO TPOT, batch TPOT / SLO TPOT) per mode (``latency.Prediction.score``; the batch's
    TPOT is aggregated only), None where the mode has no prediction."""
    p = source.predict(target)
    slo_ttft, slo_tpot = float(number(p, "slo_ttft_s", 1.0)), float(number(p, "slo_tpot_s", 1.0))

    def score(mode: str) -> float | None:
        ttft, tpot = p.get(f"{mode}_ttft_s"), p.get(f"{mode}_tpot_s")
        if not isinstance(ttft, (int, float)) or not isinstance(tpot, (int, float)):
            return None
        stall = p.get(f"{mode}_batch_tpot_s")
        if isinstance(stall, (int, float)):
            tpot = max(tpot, stall)
        return max(ttft / slo_ttft, tpot / slo_tpot)
    return score("aggregated"), score("disaggregated")


def resolve_mode(policy: CompiledPolicy, fleet: Fleet, source: SignalSource, target: str, route_mode: str,
                 predicted: Callable[[], tuple[float | None, float | None]] | None = None) -> ModeDecision:
    """The mode ``target`` runs a route of ``route_mode`` in (``pd_mode.decide_mode``),
    reading ``source.local_hit_ratio(target)`` and ``load[target].prefill_saturated`` from
    ``source`` only when the target could disaggregate, and ``predict[target]`` for an ``auto``
    route under ``disaggregation.by_prediction``; ``predicted``: the (aggregated, disaggregated)
    SLO scores to compare instead, whatever ``by_prediction`` says (``predict[target]``'s own mode). A
    disaggregated decision's ``inputs.uncached_prompt_tokens`` is the prompt less what its prefill replica holds;
    the rules' count (where it would run aggregated) is ``inputs.aggregated_uncached_prompt_tokens``."""
    t = fleet.targets[target]
    if "disaggregated" not in t.modes or route_mode == "aggregated":
        return ModeDecision(route_mode if route_mode in t.modes else t.modes[0],
                            "the route says aggregated" if route_mode == "aggregated"
                            else "the target has no prefill/decode pools", {"route_mode": route_mode})
    prompt = source.target_prompt_tokens(target)
    out = decide_mode(policy.disaggregation, t, route_mode, prompt_tokens=prompt,
                      output_tokens=source.output_tokens(target),
                      prefix_hit_ratio=source.local_hit_ratio(target),
                      prefill_saturated=bool(source.load(target)["prefill_saturated"]),
                      gpus=source.pd_pool_gpus(target),
                      predicted=predicted or ((lambda: _scores(source, target)) if policy.disaggregation.by_prediction
                                              else None))
    if out.mode == "disaggregated":  # the trace shows what the prefill replica computes; the rules read the aggregated
        inputs = {**out.inputs, "aggregated_uncached_prompt_tokens": out.inputs["uncached_prompt_tokens"],
                  "uncached_prompt_tokens": round(prompt * (1.0 - source.local_hit_ratio(target, "prefill")))}
        out = ModeDecision(out.mode, out.reason, inputs)
    return out


def _endpoint_predicts(policy: CompiledPolicy) -> bool:
    """Whether ``policy`` reads an ``endpoint`` signal's predicted latency (else ``LiveSignals.endpoint`` predicts
    none)."""
    plan = policy.context_plan.get("_endpoint")
    return isinstance(plan, dict) and any(
        f is None or "predicted_ttft_s" in f or "predicted_tpot_s" in f for f in plan.values())


_PoolPlan: TypeAlias = tuple[Pool | None, tuple[EndpointInfo, ...], tuple[str, ...], dict[str, int] | None,
                             tuple[float, float] | None]
#: Per fleet (the last few, by identity), the static part of each pool view: ``_pool_plan``.
_PLANS: list[tuple[Fleet, dict[tuple[str, str], _PoolPlan]]] = []


def _pool_plans(fleet: Fleet) -> dict[tuple[str, str], _PoolPlan]:
    """``fleet``'s pool plans by (target, role), filled as pools are read (shared by every decision on it)."""
    for f, plans in _PLANS:
        if f is fleet:
            return plans
    plans = {}
    _PLANS.insert(0, (fleet, plans))
    del _PLANS[4:]
    return plans


def _pool_plan(fleet: Fleet, target: str, role: str) -> _PoolPlan:
    """What a pool view of ``target``'s pool ``role`` takes from the fleet alone: (the pool, None for a frontier API;
    its endpoints; their ids; their positions; the KV link of a decode pool, ``PoolView.kv_link``). Raises KeyError
    for an unknown target."""
    eps = fleet.pool_endpoints(target, role)
    t = fleet.targets[target]
    pool = None if isinstance(t, FrontierTarget) else t.pools_by_role().get(role)
    link = None
    if role == "decode" and isinstance(t, OnPremTarget) and t.kv_bytes_per_token:
        link = (t.kv_bytes_per_token / latency.kv_link_bytes_per_s(t, t.pools.prefill), latency.LINK_LATENCY_S)
    return pool, eps, tuple(e.id for e in eps), fleet.positions.get((target, role)), link


class LiveSignals:
    """Signals of one decision from a ``FleetState`` (see the module docstring); every answer
    is computed on first use and memoized.

    ``LiveSignals(state, policy, picker, *, request, block_hashes, gateway_ids, scopes,
    session_id, now, now_mono, subset)``: ``request`` is the ``request`` namespace dict;
    ``block_hashes`` the prompt's chained block hashes (``gateway_ids``: from the gateway's
    ``prefix_block_hashes``, 512-token blocks; else from the rendered text, 128-token
    blocks); ``scopes`` its budget scopes; ``now`` Unix seconds (ledger), ``now_mono``
    monotonic seconds (load, sessions). ``subset``: endpoint ids the request may use (a proxy's
    subset hint, ``service/ext_proc.py``); every other endpoint counts as unavailable for this
    decision exactly as an unhealthy one does (no pick, no signal, a target without a usable
    endpoint is ineligible), reason ``SUBSET_REASON``; None: every endpoint."""

    def __init__(self, state: FleetState, policy: CompiledPolicy, picker: Picker, *, request: RequestSignals,
                 block_hashes: Sequence[int], gateway_ids: bool, scopes: Sequence[str], session_id: str = "",
                 now: float | None = None, now_mono: float | None = None, view: RequestView | None = None,
                 subset: AbstractSet[str] | None = None) -> None:
        self.state = state
        self.subset = None if subset is None else frozenset(subset)
        self._fleet: Fleet = state.fleet
        self.policy = policy
        self.picker = picker
        self._request = request
        self.block_hashes = block_hashes
        self._adapter_hashes: dict[str, list[int]] = {}
        self._model = request.get("model") or None
        self.gateway_ids = gateway_ids
        self.scopes = tuple(scopes)
        self.session_id = session_id
        self.now = state.clock() if now is None else now
        self.now_mono = state.monotonic() if now_mono is None else now_mono
        self.prompt_tokens = int(request["prompt_tokens"])
        # counted per target: images, audio and files by the target's rules, a schema on frontier targets
        self._per_target = bool(request.get("images") or request.get("has_audio") or request.get("has_files")
                                or (view is not None and isinstance(view.request.response_format, dict)))
        self._target_tokens: dict[str, int] = {}
        self._cache_control = bool(request.get("has_cache_control"))
        self._cache_1h = bool(request.get("has_cache_control_1h"))
        self.ledger_error: str | None = None
        self._views: dict[tuple[str, str], PoolView] = {}
        self._plans = _pool_plans(self._fleet)
        self._picks: dict[tuple[str, str], PoolPick] = {}
        self._lookups: dict[str, PrefixLookup | None] = {}
        self._load: dict[str, TargetLoad] = {}
        self._cache: dict[str, CacheSignals] = {}
        self._endpoint: dict[str, EndpointSignals] = {}
        self._predictions: dict[tuple[str, str], Prediction | None] = {}
        self._predict: dict[str, PredictSignals] = {}
        self._pd_gpus: dict[str, int] = {}
        self._costs: dict[tuple[str, str], CostEstimate] = {}
        self._outputs: dict[str, int] = {}
        self._means: dict[tuple[str, str, str], float | None] = {}
        self._budget: BudgetSignals | None = None
        self._snapshot: BudgetSnapshot | None = None
        self._snapshot_read = False
        self._snapshot_fresh = False
        self._session: tuple[str, str] | None = None
        self._session_read = False
        self.dropped: dict[str, str] = {}
        self.cache_sources: dict[str, str] = {}
        self.view = view

    @property
    def fleet(self) -> Fleet:
        """The fleet of the state."""
        return self._fleet

    @property
    def request(self) -> RequestSignals:
        """The ``request`` namespace."""
        return self._request

    # -- pools, picks, prefix ---------------------------------------------------------

    def output_tokens(self, target: str) -> int:
        """Output tokens expected on ``target``: the request's cap, else the fleet's defaults, for each
        of its ``n`` answers (OpenAI's ``n``: every answer is decoded and billed)."""
        out = self._outputs.get(target)
        if out is None:  # read ~5 times a decision (picks, cost, P/D mode, predictions): memoized
            r = self.request
            answers = (self.view.request.n or 1) if self.view is not None else 1
            out = self._outputs[target] = answers * self.fleet.output_tokens(
                target, r["max_output_tokens"] if r["max_output_tokens_set"] else None)
        return out

    def target_prompt_tokens(self, target: str) -> int:
        """The request's prompt tokens on ``target``, its images, audio and files counted by the target's rules
        (``cost.target_prompt_tokens``, memoized): what its cost, predicted prefill, P/D thresholds, pick and
        dispatch record count, with a structured output schema on a frontier target. A text-only request without
        a schema: its ``prompt_tokens``."""
        if not self._per_target:
            return self.prompt_tokens
        out = self._target_tokens.get(target)
        if out is None:
            out = self._target_tokens[target] = target_prompt_tokens(self.fleet.targets[target], self._request, self.view)
        return out

    def lookup(self, target: str) -> PrefixLookup | None:
        """The prompt's ``PrefixLookup`` in ``target``'s index (None without hashes): what its
        engines report holding when the target has KV events (the request hashed as they hash, whether
        or not the gateway sent block ids: an event-fed target's estimate index is never recorded into),
        else Pointsman's estimate; ``cache_sources`` says which, per target."""
        if target in self._lookups:
            return self._lookups[target]
        cache = self.state.engine_cache(target)
        found: PrefixLookup | None = None
        if cache is not None and self.view is not None:
            try:
                keys, engine_tokens = cache.request_keys(self.view, self.fleet.lora_adapter(target, self._model))
            except TargetTokenizerError as exc:
                self.cache_sources[target] = f"estimate (the chat template failed: {exc})"
            else:
                self.cache_sources[target] = "engine events" + (" (no chat template: approximate)"
                                                                if cache.approximate else "")
                found = cache.lookup(keys, prompt_tokens=self.prompt_tokens,
                                     hashed_tokens=engine_tokens) if keys else None
                self._lookups[target] = found
                return found
        if target not in self.cache_sources:
            self.cache_sources[target] = "estimate"
        if self.block_hashes:
            found = self.state.prefix_index(target, self.gateway_ids).lookup(
                self.target_hashes(target), prompt_tokens=self.prompt_tokens, text_bytes=self._text_bytes(),
                now=self.now_mono)
        self._lookups[target] = found
        return found

    def target_hashes(self, target: str) -> Sequence[int]:
        """The prompt's block hashes in ``target``'s estimate index (what it is looked up and dispatched with):
        ``block_hashes``, re-keyed into the LoRA adapter's namespace when the request's ``model`` names one the target
        serves (``Fleet.lora_adapter``, ``prefix_index.namespaced``; memoized per adapter), as vLLM keys an adapter's
        blocks by its name: only that adapter's requests reuse them."""
        adapter = self.fleet.lora_adapter(target, self._model)
        if adapter is None:
            return self.block_hashes
        out = self._adapter_hashes.get(adapter)
        if out is None:
            out = self._adapter_hashes[adapter] = namespaced(self.block_hashes, adapter)
        return out

    def _text_bytes(self) -> int | None:
        """UTF-8 bytes of the conversation the text block hashes cover (None: gateway ids, or no view)."""
        if self.gateway_ids or self.view is None:
            return None
        return self.view.conversation_bytes

    def pool_view(self, target: str, role: str) -> PoolView:
        """``target``'s pool ``role`` (``api`` for a frontier target) with loads, health and hits."""
        key = (target, role)
        view = self._views.get(key)
        if view is None:
            plan = self._plans.get(key)
            if plan is None:
                plan = self._plans[key] = _pool_plan(self.fleet, target, role)
            pool, eps, ids, positions, link = plan
            got = self.state.board.get_many(ids, self.now_mono, self.policy.staleness)
            flags = self.state.healthy_flags(ids)
            if self.subset is not None:
                flags = [ok and i in self.subset for ok, i in zip(flags, ids)]
                for i in ids:
                    if i not in self.subset:
                        self.dropped.setdefault(i, SUBSET_REASON)
            view = PoolView(target, role, pool, eps, list(map(got.get, ids)), flags,
                            self.lookup(target), self.state.shared_tier(target), positions=positions, kv_link=link)
            self._views[key] = view
        return view

    def aggregated_view(self, target: str) -> PoolView:
        """Where an aggregated request can run on ``target``: its aggregated pool, plus the decode
        endpoints that can prefill locally — those holding at least
        ``disaggregation.max_local_hit_ratio`` of the prompt's prefix, or every decode
        endpoint when the target has no aggregated pool or, with
        ``disaggregation.short_prompts_on_decode``, when the prompt has at most
        ``min_uncached_prompt_tokens`` tokens."""
        key = (target, "aggregated+local")
        view = self._views.get(key)
        if view is not None:
            return view
        t = self.fleet.targets[target]
        agg = self.pool_view(target, "aggregated")
        if isinstance(t, FrontierTarget) or t.pools.decode is None:
            view = agg
        else:
            if t.pools.aggregated is None:
                view = self.pool_view(target, "decode")
                view = PoolView(target, "aggregated", t.pools.decode, view.endpoints, view.loads, view.healthy,
                                view.prefix, view.shared, positions=view.positions)
            else:  # only decode endpoints holding the prefix (few): read their loads alone
                prompt = self.target_prompt_tokens(target)
                lk, need = self.lookup(target), self.policy.disaggregation.max_local_hit_ratio * prompt
                where = self.fleet.positions[(target, "decode")]
                decode = self.fleet.pool_endpoints(target, "decode")
                spec = self.policy.disaggregation
                if spec.short_prompts_on_decode and prompt <= spec.min_uncached_prompt_tokens:
                    picked = list(decode)  # a short prompt may prefill on any decode endpoint
                else:
                    picked = [] if lk is None else [decode[where[e]] for e, m in lk.matched.items()
                                                    if e in where and m * lk.block_tokens >= max(1.0, need)]
                view = agg
                if picked:
                    ids = [e.id for e in picked]
                    got = self.state.board.get_many(ids, self.now_mono, self.policy.staleness)
                    n = len(agg.endpoints)
                    view = PoolView(target, "aggregated", t.pools.aggregated, [*agg.endpoints, *picked],
                                    [*agg.loads, *(got.get(i) for i in ids)],
                                    [*agg.healthy, *(self.usable(i) for i in ids)], agg.prefix, agg.shared,
                                    {n + k: t.pools.decode for k in range(len(picked))})
        self._views[key] = view
        return view

    def session_entry(self) -> tuple[str, str] | None:
        """``(target, endpoint id)`` of this session's previous request, or None."""
        if not self._session_read:
            self._session = self.state.session(self.session_id, self.now_mono)
            self._session_read = True
            if self._session is not None and not self.usable(self._session[1]):
                eid = self._session[1]
                self.dropped.setdefault(eid, self.state.unhealthy().get(eid, "unhealthy") if not self.state.is_healthy(eid)
                                        else SUBSET_REASON)
                self._session = None  # affinity to an endpoint nobody can use is no affinity
        return self._session

    def pick(self, target: str, role: str) -> PoolPick:
        """The picker's ordering of ``target``'s pool ``role`` for this request (memoized)."""
        key = (target, role)
        pick = self._picks.get(key)
        if pick is None:
            s = self.session_entry()
            inp = PickInput(self.target_prompt_tokens(target), self.output_tokens(target), s[1] if s and s[0] == target else None,
                            self.state.turn(target, role))
            view = self.aggregated_view(target) if role == "aggregated" else self.pool_view(target, role)
            pick = self.picker.pick(inp, view)
            self._picks[key] = pick
        return pick

    def roles(self, target: str) -> tuple[str, ...]:
        """Pool roles of ``target`` (``api`` for a frontier target)."""
        t = self.fleet.targets[target]
        return ("api",) if isinstance(t, FrontierTarget) else tuple(t.pools_by_role())

    # -- namespaces ------------------------------------------------------------------------

    def load(self, target: str) -> TargetLoad:
        """``load[target]`` (a ``TargetLoad``: fields computed as read): the target's endpoints
        merged, health counts, and the prefill pool's queue and saturation."""
        out = self._load.get(target)
        if out is not None:
            return out
        readings: list[EndpointLoad] = []
        for role in self.roles(target):
            view = self.pool_view(target, role)
            if all(view.healthy):
                readings.extend(x for x in view.loads if x is not None)
            else:  # an unhealthy endpoint's load says nothing about where a request can run
                self.healthy_ids(target, role)
                readings.extend(x for x, ok in zip(view.loads, view.healthy) if x is not None and ok)
        # the prefill pool's view (built above), not ``self``: a TargetLoad holding this LiveSignals would
        # make a reference cycle, so every decision's signals would wait for the cyclic garbage collector
        out = TargetLoad(readings, self.now_mono, self.state.endpoint_count(target), self.healthy_endpoints(target),
                         functools.partial(_prefill_state, self._views.get((target, "prefill")),
                                           self.target_prompt_tokens(target),
                                           self.policy.disaggregation.max_prefill_queue_s))
        self._load[target] = out
        return out

    def local_ids(self, target: str) -> set[str]:
        """Healthy endpoint ids of ``target`` that serve a request locally (aggregated, decode, api)."""
        ids: set[str] = set()
        for role in self.roles(target):
            if role != "prefill":
                ids.update(self.healthy_ids(target, role))
        return ids

    def healthy_ids(self, target: str, role: str) -> list[str]:
        """Ids of ``target``'s ``role`` pool not marked unhealthy; the others are noted in
        ``dropped`` (endpoint id -> reason), so the trace says which endpoints fed no signal."""
        ids = list(self.fleet.positions.get((target, role), ()))
        if self.subset is not None:
            for i in ids:
                if i not in self.subset:
                    self.dropped.setdefault(i, SUBSET_REASON)
            ids = [i for i in ids if i in self.subset]
        if self.state.healthy_endpoints(target) == self.state.endpoint_count(target):
            return ids
        bad = self.state.unhealthy()
        for i in ids:
            if i in bad:
                self.dropped.setdefault(i, bad[i])
        return [i for i in ids if i not in bad]

    def usable(self, endpoint_id: str) -> bool:
        """Whether this decision may use the endpoint: not marked unhealthy, and in ``subset``
        when one is given."""
        return self.state.is_healthy(endpoint_id) and (self.subset is None or endpoint_id in self.subset)

    def cache(self, target: str) -> CacheSignals:
        """``cache`` for ``target``: the longest cached prefix on one of its local endpoints,
        the shared tier's share after it, and this session's previous endpoint."""
        out = self._cache.get(target)
        if out is not None:
            return out
        p = max(1, self.target_prompt_tokens(target))
        lk = self.lookup(target)
        best, tokens, shared = None, 0, 0
        if lk is not None:
            best, tokens = lk.best(self.local_ids(target))
            shared = lk.hit(best)[1] if best is not None else lk.hit("")[1]
        s = self.session_entry()
        session_ep = ""
        if s is not None and s[0] == target:
            session_ep = self._label(s[1])
        out = cache_signals(min(1.0, tokens / p), tokens, min(1.0, shared / p),
                            self._label(best) if best else "", session_ep, s[0] if s else "")
        self._cache[target] = out
        return out

    def local_hit_ratio(self, target: str, role: str = "aggregated") -> float:
        """Share 0-1 of the prompt (its tokens on ``target``) cached on the endpoint an aggregated request would
        run on there: the aggregated picker's first choice (``aggregated_view``), 0 when it has none. What the P/D
        rules of thumb read: ``cache(target)``'s longest prefix may sit where the request would not run (a decode
        endpoint holding under ``max_local_hit_ratio``, or one the picker ranks after a cold one). ``role``
        ``prefill``: the prefill picker's first choice (where a disaggregated request prefills)."""
        pick = self.pick(target, role)
        if pick.chosen is None:
            return 0.0
        return min(1.0, pick.view.hit(pick.chosen)[0] / max(1, self.target_prompt_tokens(target)))

    def _label(self, endpoint_id: str) -> str:
        info = self.fleet.endpoints.get(endpoint_id)
        return endpoint_id if info is None else (info.name or info.url)

    def endpoint(self, key: str) -> EndpointSignals:
        """``endpoint`` for key ``target/role``: the picker's first choice there."""
        out = self._endpoint.get(key)
        if out is not None:
            return out
        target, _, role = key.partition("/")
        if role == "auto":  # an ``auto`` route's: the endpoint of the mode it runs in
            mode = resolve_mode(self.policy, self.fleet, self, target, "auto").mode
            out = self._endpoint[key] = self.endpoint(f"{target}/{'decode' if mode == 'disaggregated' else 'aggregated'}")
            return out
        pick = self.pick(target, role)
        i = pick.chosen
        if i is None:  # no healthy endpoint: the first one, flagged unhealthy, nothing known about it
            info = pick.view.endpoints[0]
            out = endpoint_signals(None, self.now_mono, name=info.name or "", url=info.url, healthy=False,
                                   prefix_hit_ratio=0.0, cost_s=0.0)
        else:
            info, reading = pick.view.endpoints[i], pick.view.loads[i]
            local, _ = pick.view.hit(i)
            ttft = tpot = math.inf
            if _endpoint_predicts(self.policy):
                p = self.prediction(target, "disaggregated" if role == "decode" else "aggregated")
                if p is not None:
                    ttft, tpot = p.ttft_s, p.tpot_s
            out = endpoint_signals(reading, self.now_mono, name=info.name or "", url=info.url, healthy=True,
                                   prefix_hit_ratio=min(1.0, local / max(1, self.target_prompt_tokens(target))),
                                   cost_s=pick.costs[i], predicted_ttft_s=ttft, predicted_tpot_s=tpot)
        self._endpoint[key] = out
        return out

    # -- predicted latency (policy/selection/latency.py) ------------------------------------

    def slo(self) -> SLOClass:
        """The request's SLO class (``routing.slo_class``, else the fleet's default)."""
        return latency.slo_of(self.fleet, str(self.request["slo_class"]))

    def prediction(self, target: str, mode: str) -> Prediction | None:
        """The request's predicted latency on ``target`` in ``mode`` at the picker's endpoints
        (memoized); None without that mode or a healthy endpoint for it. ``aggregated`` on a target
        without an aggregated pool: a decode endpoint prefilling locally."""
        key = (target, mode)
        if key in self._predictions:
            return self._predictions[key]
        t = self.fleet.targets[target]
        out: Prediction | None
        if isinstance(t, FrontierTarget):
            out = latency.frontier(target, t, self.pick(target, "api")) if mode == "aggregated" else None
        elif mode == "disaggregated" and "disaggregated" not in t.modes:
            out = None
        else:
            picks = (self.pick(target, "aggregated"),) if mode == "aggregated" else \
                (self.pick(target, "prefill"), self.pick(target, "decode"))
            out = latency.onprem(target, t, mode, picks, prompt_tokens=self.target_prompt_tokens(target),
                                 output_tokens=self.output_tokens(target))
        self._predictions[key] = out
        return out

    def predict(self, target: str) -> PredictSignals:
        """``predict[target]``: both modes' predictions and the mode an ``auto`` route with
        ``by_prediction`` would run in (the P/D guards of the policy's ``disaggregation``)."""
        out = self._predict.get(target)
        if out is not None:
            return out
        t, slo = self.fleet.targets[target], self.slo()
        agg = self.prediction(target, "aggregated")
        dis = None if isinstance(t, FrontierTarget) else self.prediction(target, "disaggregated")
        chosen = agg
        if not isinstance(t, FrontierTarget):
            mode = resolve_mode(self.policy, self.fleet, self, target, "auto", predicted=lambda: (
                None if agg is None else agg.score(slo), None if dis is None else dis.score(slo)))
            chosen = dis if mode.mode == "disaggregated" else agg
        chosen = chosen or agg or dis
        out = predict_signals(chosen, agg, dis, slo)
        self._predict[target] = out
        return out

    def predictions_trace(self) -> dict[str, object]:
        """The predictions this decision computed, ``target/mode`` -> ``Prediction.to_dict()`` (the trace)."""
        return {f"{t}/{m}": None if p is None else p.to_dict() for (t, m), p in self._predictions.items()}

    def budget_snapshot(self) -> BudgetSnapshot | None:
        """The ledger's ``BudgetSnapshot`` of this request's scopes (None: no budgets apply, no
        ledger, or the ledger failed and ``budget_fail_open``)."""
        if not self._snapshot_read:
            self._snapshot_read = True
            try:
                self._snapshot = self.state.budget_snapshot(self.scopes, self.now)
            except LedgerUnavailable as exc:
                self.ledger_error = str(exc)
                if not self.state.budget_fail_open:
                    raise
        return self._snapshot

    def budget(self) -> BudgetSignals:
        """The ``budget`` namespace."""
        if self._budget is None:
            self._budget = budget_signals(self.budget_snapshot(), self.now)
        return self._budget

    def budget_limited(self) -> bool:
        """True when some budget applies (and the ledger answered)."""
        snap = self.budget_snapshot()
        return snap is not None and snap.binding is not None

    def budget_fits(self, usd: float) -> bool:
        """Would a reservation of ``usd`` pass every budget now (``BudgetSnapshot.fits``)? A "no"
        from a kept snapshot is confirmed by a fresh ledger read (once per decision; the fresh
        snapshot then serves the rest of the decision), so a refusal never rests on a read
        older than this decision."""
        snap = self.budget_snapshot()
        if snap is None or snap.fits(usd):
            return True
        if not self._snapshot_fresh:
            self._snapshot_fresh = True
            try:
                fresh = self.state.budget_snapshot(self.scopes, self.now, fresh=True)
            except LedgerUnavailable as exc:
                self.ledger_error = str(exc)
                if not self.state.budget_fail_open:
                    raise
                return True
            if fresh is not snap:
                self._snapshot, self._budget = fresh, None
            snap = fresh
        return True if snap is None else snap.fits(usd)

    def budget_binding(self) -> BudgetSignals | None:
        """The binding budget's signals (for messages), or None when unlimited."""
        b = self.budget()
        return b if b["limited"] else None

    def healthy_endpoints(self, target: str) -> int:
        """Endpoints of ``target`` not marked unhealthy (and in ``subset`` when one is given)."""
        if self.subset is None:
            return self.state.healthy_endpoints(target)
        return sum(1 for role in self.roles(target) for e in self.fleet.pool_endpoints(target, role) if self.usable(e.id))

    def pd_pool_gpus(self, target: str) -> int:
        """GPUs of ``target``'s prefill and decode endpoints this decision may use (healthy, in ``subset``; memoized:
        read by the P/D mode of ``predict[target]`` and of the route)."""
        out = self._pd_gpus.get(target)
        if out is None:
            out = self._pd_gpus[target] = pd_pool_gpus(self.fleet.targets[target], self.usable)
        return out

    # -- cost ------------------------------------------------------------------------------

    def _utilizations(self, target: str, mode: str, pools: tuple[Pool, Pool] | None = None) -> tuple[float, float]:
        """(prefill, decode) utilization to price ``target`` at: of ``pools`` (prefill pool, decode pool)
        when given (an aggregated request prefilled on a decode endpoint runs on the decode pool), else
        of ``mode``'s pools."""
        t = self.fleet.targets[target]
        if isinstance(t, FrontierTarget):
            return 1.0, 1.0
        prefill_role, decode_role = phase_roles(mode)
        if pools is not None:
            roles = {id(p): r for r, p in t.pools_by_role().items()}
            prefill_role, decode_role = roles.get(id(pools[0]), prefill_role), roles.get(id(pools[1]), decode_role)

        return (pool_utilization(self._mean(target, prefill_role, "prefill_utilization"), self.fleet),
                pool_utilization(self._mean(target, decode_role, "decode_utilization"), self.fleet))

    def _mean(self, target: str, role: str, attr: str) -> float | None:
        """Mean of ``attr`` over a pool's readings that report it (memoized)."""
        key = (target, role, attr)
        if key not in self._means:
            view = self.pool_view(target, role)
            self._means[key] = mean_reading(view.loads, view.healthy, attr)
        return self._means[key]

    def cost(self, target: str, mode: str | None = None, cached_tokens: int | None = None,
             pools: tuple[Pool, Pool] | None = None) -> CostEstimate:
        """Estimated cost in USD on ``target`` in ``mode`` (default: the target's default mode),
        with the expected cached prefix (default: the best local hit where prefill runs; a
        frontier target's provider cache) and the pools' current utilization; ``pools``
        overrides the mode's (prefill pool, decode pool) (``cost.estimate_cost``)."""
        t = self.fleet.targets[target]
        mode = mode or t.modes[0]
        key = (target, mode)
        memo = cached_tokens is None and pools is None  # the default estimate, kept per (target, mode)
        if memo and key in self._costs:
            return self._costs[key]
        if cached_tokens is None:
            lk = None if pools is not None else self.lookup(target)
            if lk is None:
                cached_tokens = 0
            elif isinstance(t, FrontierTarget):
                cached_tokens = lk.hit(target)[0]
            else:
                role = "aggregated" if mode == "aggregated" else "prefill"
                cached_tokens = lk.best(self.healthy_ids(target, role))[1]
        u_p, u_d = self._utilizations(target, mode, pools)
        est = estimate_cost(target, t, mode, self.target_prompt_tokens(target), self.output_tokens(target),
                            cached_tokens,
                            prefill_utilization=u_p, decode_utilization=u_d, pools=pools,
                            cache_control=self._cache_control, cache_write_1h=self._cache_1h)
        if memo:
            self._costs[key] = est
        return est

    def min_cost(self, target: str) -> CostEstimate:
        """The least ``cost`` on ``target`` over where ``engine.place`` may put the request: each of its modes other
        than aggregated, and aggregated on each pool ``aggregated_view`` holds (its aggregated pool, decode endpoints
        that may prefill locally), all at the longest prefix (local hit plus shared-tier run) any endpoint holds."""
        t = self.fleet.targets[target]
        if isinstance(t, FrontierTarget):
            return self.cost(target)
        lk = self.lookup(target)
        cached = 0 if lk is None else max(sum(lk.hit(e)) for e in ("", *lk.matched))
        costs = [self.cost(target, m, cached) for m in t.modes if m != "aggregated"]
        view = self.aggregated_view(target)
        pools = {id(p): p for p in (view.pool, *view.extra_pools.values()) if p is not None}
        costs += [self.cost(target, "aggregated", cached, (p, p)) for p in pools.values()]
        return min(costs, key=lambda c: c.usd)

    # -- trace -----------------------------------------------------------------------------

    def age(self, path: str) -> float:
        """Age in seconds of a signal path as written in the policy (``load["t"].x``,
        ``endpoint.x`` is resolved by the engine through its key)."""
        if path.startswith("load[\""):
            target = path[6:path.index("\"]")]
            return number(self.load(target), "age_s")
        if path.startswith("budget."):
            snap = self.budget_snapshot()
            return 0.0 if snap is None else max(0.0, self.now - snap.now)
        return 0.0


class StaticSignals:
    """A fixed snapshot as a signal source (policy cases, tests): ``signals`` holds the
    namespaces as ``namespaces.example_signals`` lays them out (``load`` and ``_cache`` by
    target, ``_endpoint`` by ``target/role``, ``budget``). Costs use the fleet's prices with
    ``cache[target].prefix_hit_tokens`` as the cached prefix and ``load[target]``'s
    utilizations (else the fleet's assumed one); budget checks use ``budget.remaining_usd``."""

    #: No request view: a case's images count at the most their targets bill, its audio and files nothing.
    view: RequestView | None = None

    def __init__(self, fleet: Fleet, policy: CompiledPolicy, signals: Snapshot) -> None:
        self._fleet = fleet
        self.policy = policy
        self.signals = signals

    @property
    def fleet(self) -> Fleet:
        """The fleet of the snapshot."""
        return self._fleet

    @property
    def request(self) -> RequestSignals:
        """``signals["request"]``."""
        return self.signals["request"]

    def load(self, target: str) -> SignalMap:
        """``signals["load"][target]``."""
        return self.signals["load"][target]

    def cache(self, target: str) -> CacheSignals:
        """``signals["_cache"][target]``."""
        return self.signals["_cache"][target]

    def local_hit_ratio(self, target: str, role: str = "aggregated") -> float:
        """``cache[target].prefix_hit_ratio``: a snapshot names no endpoint, so its hit is where the request runs."""
        return float(self.cache(target)["prefix_hit_ratio"])

    def endpoint(self, key: str) -> EndpointSignals:
        """``signals["_endpoint"][key]``, else an idle, healthy endpoint."""
        return self.signals["_endpoint"].get(key) or example_endpoint()

    def budget(self) -> BudgetSignals:
        """``signals["budget"]``."""
        return self.signals["budget"]

    def predict(self, target: str) -> PredictSignals:
        """``signals["predict"][target]``, else an idle target's prediction."""
        return self.signals["predict"].get(target) or example_predict()

    def output_tokens(self, target: str) -> int:
        """Output tokens expected on ``target``."""
        r = self.request
        return self.fleet.output_tokens(target, r["max_output_tokens"] if r["max_output_tokens_set"] else None)

    def min_cost(self, target: str) -> CostEstimate:
        """The least ``cost`` over ``target``'s modes: a case places a request by mode (``cases._dispatch``)."""
        return min((self.cost(target, m) for m in self.fleet.targets[target].modes), key=lambda c: c.usd)

    def cost(self, target: str, mode: str | None = None, cached_tokens: int | None = None) -> CostEstimate:
        """Estimated cost in USD (see the class docstring)."""
        t = self.fleet.targets[target]
        mode = mode or t.modes[0]
        if cached_tokens is None:
            cached_tokens = int(self.cache(target)["prefix_hit_tokens"])
        load = self.load(target)
        u_p, u_d = load.get("prefill_utilization"), load.get("decode_utilization")
        return estimate_cost(target, t, mode, self.target_prompt_tokens(target), self.output_tokens(target),
                             cached_tokens,
                             prefill_utilization=pool_utilization(None if u_p is None else number(load, "prefill_utilization"),
                                                                  self.fleet),
                             decode_utilization=pool_utilization(None if u_d is None else number(load, "decode_utilization"),
                                                                 self.fleet),
                             cache_control=bool(self.request.get("has_cache_control")),
                             cache_write_1h=bool(self.request.get("has_cache_control_1h")))

    def target_prompt_tokens(self, target: str) -> int:
        """The request's prompt tokens on ``target`` (``cost.target_prompt_tokens``, without a view)."""
        return target_prompt_tokens(self.fleet.targets[target], self.request)

    def healthy_endpoints(self, target: str) -> int:
        """``load[target].healthy_endpoints``."""
        return int(number(self.load(target), "healthy_endpoints", 1))

    def pd_pool_gpus(self, target: str) -> int:
        """GPUs of ``target``'s prefill and decode pools (a snapshot marks no endpoint unhealthy)."""
        return pd_pool_gpus(self.fleet.targets[target])

    def budget_limited(self) -> bool:
        """``budget.limited``."""
        return bool(self.budget().get("limited"))

    def budget_fits(self, usd: float) -> bool:
        """The ledger's rule on ``budget.remaining_usd``: not exhausted and the cost fits."""
        b = self.budget()
        if not b.get("limited"):
            return True
        remaining = b["remaining_usd"]
        return remaining > 0 and usd <= remaining + 1e-12

    def budget_binding(self) -> BudgetSignals | None:
        """The budget signals when limited, else None."""
        b = self.budget()
        return b if b.get("limited") else None

    def age(self, path: str) -> float:
        """``load[...]`` paths: the case's ``age_s``; others 0."""
        if path.startswith("load[\""):
            return number(self.load(path[6:path.index("\"]")]), "age_s")
        return 0.0


def _prefill_state(view: PoolView | None, prompt_tokens: int, limit_s: float) -> tuple[float | None, bool]:
    """(least predicted prefill queue seconds over the healthy endpoints of a target's prefill pool
    ``view``, saturated?): a queue of ``limit_s`` or more, or a saturated reading, on every one (or none
    healthy); (None, False) without a prefill pool."""
    if view is None:
        return None, False
    queues = QueueScorer().score(PickInput(prompt_tokens, 0), view)
    ok = [(q, x) for q, x, h in zip(queues, view.loads, view.healthy) if h]
    queue_s = min((q for q, _ in ok), default=None)
    return queue_s, not ok or all(q >= limit_s or (x is not None and x.saturated) for q, x in ok)


def predict_signals(chosen: Prediction | None, aggregated: Prediction | None, disaggregated: Prediction | None,
                    slo: SLOClass) -> PredictSignals:
    """The ``predict[target]`` value from the chosen mode's prediction and each mode's (None: no
    healthy endpoint, every time infinite and ``meets_slo`` false)."""
    inf = math.inf
    return {"ttft_s": chosen.ttft_s if chosen else inf, "tpot_s": chosen.tpot_s if chosen else inf,
            "batch_tpot_s": chosen.batch_tpot_s if chosen else 0.0,
            "slo_score": chosen.score(slo) if chosen else inf,
            "meets_slo": chosen is not None and chosen.meets(slo), "mode": chosen.mode if chosen else "",
            "queue_s": chosen.queue_s if chosen else inf, "prefill_s": chosen.prefill_s if chosen else inf,
            "transfer_s": chosen.transfer_s if chosen else 0.0,
            "aggregated_ttft_s": aggregated.ttft_s if aggregated else None,
            "aggregated_tpot_s": aggregated.tpot_s if aggregated else None,
            "aggregated_batch_tpot_s": aggregated.batch_tpot_s if aggregated else None,
            "disaggregated_ttft_s": disaggregated.ttft_s if disaggregated else None,
            "disaggregated_tpot_s": disaggregated.tpot_s if disaggregated else None,
            "slo_ttft_s": slo.ttft_s, "slo_tpot_s": slo.tpot_s}


def finite_or_none(value: object) -> object:
    """``value`` with infinite or NaN floats replaced by None (JSON has no infinity)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite_or_none(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite_or_none(v) for v in value]
    return value
