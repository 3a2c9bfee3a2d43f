"""The policy engine as a replay router: the same ``RoutingEngine`` and compiled policy that
serve, deciding every trace request against the simulated fleet's live state.

``EngineRouter(fleet, policy, estimator, *, texts=None)`` is a simulator ``Router``
(``router(request, fleet_view) -> Assignment``) and, as ``on_complete``, the outcome path.
What the engine reads comes from the simulator at the decision's simulated time:

- **load** (``SimBoard``, the ``FleetState``'s load board): per replica
  ``num_requests_running`` / ``num_requests_waiting`` / ``kv_cache_usage`` /
  ``kv_cache_capacity_tokens`` as a push reading of age 0, the prompt tokens not yet
  prefilled as exact pending work (``pending_requests`` = the waiting requests,
  ``pending_prompt_tokens`` = their prompt tokens plus the rest of the chunked prefills in
  progress, which vLLM counts as running: what the queue scorer prices), and
  ``prefill_utilization`` / ``decode_utilization``: busy fractions over the last
  ``UTILIZATION_WINDOW_S`` seconds (what the cost model prices GPU-seconds at).
- **prefix cache** (``SimPrefixIndex``): which replica holds how many leading blocks of the
  prompt, read from the simulated KV caches (not the engine's own dispatch-based guess),
  the shared KV tier's runs, and the frontier tiers' prompt caches.
- **clock**: ``FleetState`` clocks are the simulated time (Unix time = ``EPOCH_S`` + it).
- **difficulty**: the engine's estimator on the request's text (``texts[i]``: OpenAI
  messages; a trace without text gets one from ``replay.outcomes``, else a placeholder
  ``"trace request i"`` that only a ``FixedDifficulty`` estimator should see).

The decision becomes an ``Assignment``: its target and mode, the chosen replica(s), a
decode replica that prefills locally (``replica_pool="decode"``), and its fallback targets
(least-loaded replica) for admission control. ``NoEligibleTarget`` becomes a rejection
(``no_eligible_target``). At completion the decision is settled in the ``FleetState``
(actual cost: the frontier bill, or the cost model on the usage on-prem), as the service
does when an outcome arrives; a request refused after its decision is released.

**budgets**: with ``ledger`` (``replay.budgets.replay_ledger``) the ``FleetState`` has a real
budget ledger and every request carries ``routing.tenant = tenant``: the ``budget`` filter
and signals read it, dispatch reserves the estimate (a refusal moves to the next fallback,
none left is ``no_eligible_target``), completion settles the actual cost, all at simulated
Unix time ``EPOCH_S + t`` (reserve, settle, release, snapshot and hold expiry alike).

**cascade**: with ``cascade`` (``replay.cascade.CascadeVerify``) each on-prem draft is verified with
``RoutingEngine.verify`` (dispatch on), as ``POST /v1/verify`` does: a whole draft when it completes
(its hold first made its cost, ``FleetState.hold_known_cost``), a policy's ``verify.prefix_tokens``
N at routing time (its estimate stays held; an escalated draft is cut at N tokens). An escalation
reserves its estimate on the request's budget scopes; a refused hold moves on to the next target,
none left accepts the draft (``no-eligible-escalation``); a rule whose targets the ``budget`` filter
excluded is skipped, as in the service (the next rule decides, often ``accept``). Both count in
``cascade.refused``. The draft
is settled at completion as any request; the escalated call is settled at its bill when it completes
in simulated time (draft end + the call's seconds), and released when the draft did not run where
it was verified (a fallback) or the request was refused.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import TypeAlias

from pointsman.datasets.traces import TraceRequest
from pointsman.errors import RequestError
from pointsman.estimator.estimate import Estimator
from pointsman.policy.budget.ledger import BudgetLedger
from pointsman.policy.decision import Decision
from pointsman.policy.engine import RoutingEngine
from pointsman.policy.fleet import Fleet
from pointsman.policy.rules.compiler import CompiledPolicy
from pointsman.policy.selection.filters import NoEligibleTarget
from pointsman.policy.signals.fleet_state import FleetState
from pointsman.policy.signals.load_board import EndpointLoad, LoadBoard, StalenessPolicy
from pointsman.policy.signals.prefix_index import MOONCAKE_BLOCK_TOKENS, PrefixIndex, PrefixLookup
from pointsman.replay.cascade import CascadeVerify
from pointsman.replay.fleet_map import EndpointMap
from pointsman.replay.results import RequestResult
from pointsman.replay.router import Assignment, FleetView, ReplicaView
from pointsman.replay.sim_fleet import AGGREGATED, DISAGGREGATED, ROLE_AGGREGATED, ROLE_DECODE, ROLE_PREFILL
from pointsman.request import RouteRequest

#: Unix time of the trace's t = 0 (2026-01-01T00:00:00Z): the ledger clock needs a date.
EPOCH_S = 1_767_225_600.0
#: Seconds of history behind the prefill/decode utilization readings.
UTILIZATION_WINDOW_S = 30.0
#: One trace request's conversation: OpenAI chat messages (``role``, ``content``).
TraceMessages: TypeAlias = Sequence[Mapping[str, str]]


class SimBoard(LoadBoard):
    """A load board whose readings are the simulated replicas' state at the decision time
    (see the module docstring); dispatch and release are no-ops (the simulator counts)."""

    def __init__(self, endpoints: EndpointMap) -> None:
        super().__init__(known_endpoints=list(endpoints.by_id))
        self.map = endpoints
        self.view: FleetView | None = None
        # endpoint -> (t, prefill busy s, decode busy s) samples, oldest first
        self._marks: dict[str, deque[tuple[float, float, float]]] = {}

    def _utilization(self, endpoint: str, replica: ReplicaView, now: float) -> tuple[float | None, float | None]:
        prefill, decode = replica.busy_s(now)
        marks = self._marks.get(endpoint)
        if marks is None:
            marks = self._marks[endpoint] = deque()
        if not marks or marks[-1][0] < now:
            marks.append((now, prefill, decode))
        while len(marks) > 1 and marks[1][0] <= now - UTILIZATION_WINDOW_S:
            marks.popleft()
        t0, p0, d0 = marks[0]
        span = now - t0
        if span <= 0:
            return None, None
        return min(1.0, max(0.0, (prefill - p0) / span)), min(1.0, max(0.0, (decode - d0) / span))

    def get_many(self, endpoints: Iterable[str], now: float | None = None,
                 staleness: StalenessPolicy | None = None) -> dict[str, EndpointLoad]:
        """Readings for the on-prem ``endpoints`` from the simulator (frontier ids: none)."""
        view = self.view
        out: dict[str, EndpointLoad] = {}
        if view is None:
            return out
        now = view.now_s
        for ep in endpoints:
            where = self.map.by_id.get(ep)
            if where is None or where[1] == "api":
                continue
            r = view.replicas(where[0], where[1])[where[2]]
            waiting = r.num_requests_waiting
            pu, du = self._utilization(ep, r, now)
            out[ep] = EndpointLoad(
                ep, "push", now, num_requests_running=r.num_requests_running, num_requests_waiting=waiting,
                kv_cache_usage=r.kv_cache_usage, kv_cache_capacity_tokens=r.kv_capacity_tokens,
                prefill_utilization=pu, decode_utilization=du, inflight_requests=waiting,
                pending_requests=waiting, pending_prompt_tokens=r.waiting_prompt_tokens)
        return out

    def dispatch(self, endpoint: str, decision_id: str, prompt_tokens: int, now: float | None = None) -> None:
        """No-op: the simulator's queues are the load."""

    def release(self, decision_id: str) -> bool:
        """No-op (see ``dispatch``); returns False."""
        return False


class SimPrefixIndex(PrefixIndex):
    """One target's prefix index answered from the simulator (see the module docstring):
    ``lookup`` matches the current trace request's block hashes against every replica's
    KV cache (on-prem) or the tier's prompt cache (frontier); ``record`` is a no-op."""

    def __init__(self, router: EngineRouter, target: str, frontier: bool) -> None:
        super().__init__(block_tokens=MOONCAKE_BLOCK_TOKENS)
        self.router, self.target, self.frontier = router, target, frontier

    def lookup(self, block_hashes: Sequence[int], *, prompt_tokens: int | None = None,
               text_bytes: int | None = None, hashed_tokens: int | None = None,
               now: float | None = None) -> PrefixLookup:
        """The current request's prefix on this target's replicas (``block_hashes`` are the
        engine's re-hashed ids of the same blocks and are not needed; the trace's blocks are
        ``MOONCAKE_BLOCK_TOKENS`` tokens each, so ``text_bytes`` and ``hashed_tokens`` are not needed
        either; ``now`` neither:
        the simulator's caches expire on its clock, a frontier tier's after its ``prompt_cache_ttl_s``)."""
        req, view = self.router.current, self.router.board.view
        hashes = (req.block_hashes or ()) if req is not None else ()
        total = prompt_tokens if prompt_tokens is not None else len(hashes) * MOONCAKE_BLOCK_TOKENS
        matched: dict[str, int] = {}
        runs = None
        if hashes and view is not None:
            if self.frontier:
                m = view.frontier_cached_blocks(self.target, hashes)
                if m:
                    matched[self.target] = m
            else:
                ids = self.router.map.ids
                for role in ("aggregated", "prefill", "decode"):
                    for ep, r in zip(ids.get((self.target, role), ()), view.replicas(self.target, role)):
                        m = r.cached_prefix_blocks(hashes)
                        if m:
                            matched[ep] = m
                tier = view.shared_tier_blocks(self.target)
                if tier is not None:
                    runs = [0] * (len(hashes) + 1)
                    for i in range(len(hashes) - 1, -1, -1):
                        runs[i] = runs[i + 1] + 1 if hashes[i] in tier else 0
        return PrefixLookup(matched, runs, MOONCAKE_BLOCK_TOKENS, total)

    def record(self, endpoint: str, block_hashes: Sequence[int], *, session_id: str | None = None,
               now: float | None = None) -> None:
        """No-op: the simulated caches fill as requests prefill."""


class SimFleetState(FleetState):
    """A ``FleetState`` on the simulated clock whose load board and prefix indexes read the
    simulator (``SimBoard``, ``SimPrefixIndex``)."""

    def __init__(self, fleet: Fleet, router: EngineRouter, ledger: BudgetLedger | None = None) -> None:
        super().__init__(fleet, ledger, board=router.board, clock=lambda: EPOCH_S + router.now_s,
                         monotonic=lambda: router.now_s)
        self._sim_indexes = {name: SimPrefixIndex(router, name, name in router.frontier)
                             for name in fleet.targets}

    def prefix_index(self, target: str, gateway_ids: bool) -> PrefixIndex:
        """The simulator-backed index of ``target`` (for block ids and text hashes alike)."""
        return self._sim_indexes[target]


class EngineRouter:
    """The policy engine in the simulator's loop (see the module docstring).

    ``fleet``: the policy ``Fleet`` the simulated fleet was built from (``fleet_map.sim_fleet``);
    ``policy``: a compiled policy; ``estimator``: any ``Estimator`` (``FixedDifficulty`` or
    the real one); ``texts``: per trace index, the request's messages (or None);
    ``ledger``: a budget ledger (None: no budgets), and ``tenant`` the budget scope
    ``tenant:<tenant>`` every request carries (see the module docstring); ``slo_class``: the
    ``routing.slo_class`` every request carries (None: none); ``cascade``: the policy's cascade
    (see the module docstring; None: no verify step). After a run (and ``finish()``),
    ``decisions[i]`` is ``(rule, target, mode, p_hard)`` for trace request ``i``."""

    def __init__(self, fleet: Fleet, policy: CompiledPolicy, estimator: Estimator, *,
                 texts: Sequence[TraceMessages | None] | None = None,
                 ledger: BudgetLedger | None = None, tenant: str | None = None,
                 slo_class: str | None = None, cascade: CascadeVerify | None = None) -> None:
        self.fleet = fleet
        self.cascade = cascade
        self.map = EndpointMap.of(fleet)
        self.frontier = frozenset(n for n, t in fleet.targets.items() if t.kind == "frontier")
        self.board = SimBoard(self.map)
        self.current: TraceRequest | None = None
        self.now_s = 0.0
        self.tenant = tenant
        self.slo_class = slo_class
        self.state = SimFleetState(fleet, self, ledger)
        self.engine = RoutingEngine(fleet, policy, estimator, state=self.state)
        self.texts = texts
        self.decisions: dict[int, tuple[str, str, str, float | None]] = {}
        self._ids: dict[int, str] = {}
        self._drafts: dict[int, Decision] = {}  # index -> on-prem decision whose draft is verified
        self._escalating: dict[int, tuple[str, str, float, float]] = {}  # index -> (escalation id, target, s, USD)
        self._due: list[tuple[float, str, str, int, int, float]] = []  # (finish s, id, target, prompt, output, USD)

    def request_for(self, index: int, req: TraceRequest) -> RouteRequest:
        """The ``RouteRequest`` the gateway would send for trace request ``index``: its messages
        (``texts``), exact prompt tokens, block ids and session; no output cap."""
        messages = self.texts[index] if self.texts is not None else None
        if not messages:
            messages = [{"role": "user", "content": f"trace request {index}"}]
        routing: dict[str, int | str | list[int]] = {"prompt_tokens": req.prompt_tokens}
        if self.tenant:
            routing["tenant"] = self.tenant
        if self.slo_class:
            routing["slo_class"] = self.slo_class
        if req.block_hashes:
            routing["prefix_block_hashes"] = list(req.block_hashes)
        if req.session_id:
            routing["session_id"] = req.session_id
        return RouteRequest.model_validate({"messages": list(messages), "routing": routing})

    def __call__(self, req: TraceRequest, view: FleetView) -> Assignment:
        """Decide ``req`` with the engine at ``view.now_s``; see the module docstring."""
        self.current, self.now_s, self.board.view = req, view.now_s, view
        self._settle_due(view.now_s)
        index = view.request_index
        try:
            d = self.engine.route(self.request_for(index, req))
        except NoEligibleTarget:
            self.decisions[index] = ("(no eligible target)", "", "", None)
            return Assignment.reject("no_eligible_target")
        except RequestError as exc:
            raise ValueError(f"trace request {index}: the engine refused it: {exc}") from None
        self._ids[index] = d.decision_id
        self.decisions[index] = (d.rule, d.target, d.mode, d.p_hard)
        fallbacks = tuple(self._fallback(f.target, f.mode) for f in d.fallbacks)
        if d.target in self.frontier:
            return Assignment(d.target, fallbacks=fallbacks)
        stop = None
        prefix = self.cascade.prefix_tokens if self.cascade is not None else None
        if self.cascade is not None and prefix is None:
            self._drafts[index] = d  # verified when it completes
        elif prefix is not None and self._verify(index, d, d.target, req.prompt_tokens, prefix, req.output_tokens):
            stop = prefix
        where = {e.role: self.map.by_id[e.url] for e in reversed(d.endpoints) if e.url in self.map.by_id}
        if d.mode == DISAGGREGATED:
            return Assignment(d.target, DISAGGREGATED, where[ROLE_PREFILL][2], where[ROLE_DECODE][2],
                              fallbacks=fallbacks, output_tokens=stop)
        first = self.map.by_id[d.endpoints[0].url]
        pool = ROLE_DECODE if first[1] == ROLE_DECODE else None
        return Assignment(d.target, AGGREGATED, first[2], replica_pool=pool, fallbacks=fallbacks, output_tokens=stop)

    def _fallback(self, target: str, mode: str) -> Assignment:
        """A decision's fallback as an assignment: a frontier tier aggregated; an on-prem target
        without an aggregated pool runs an aggregated fallback on a decode replica that prefills
        locally, as the engine places one (``engine.place``)."""
        if target in self.frontier:
            return Assignment(target, AGGREGATED)
        if mode == AGGREGATED and not any(t == target and role == ROLE_AGGREGATED
                                          for t, role, _ in self.map.by_id.values()):
            return Assignment(target, AGGREGATED, replica_pool=ROLE_DECODE)
        return Assignment(target, mode)

    def disable_frontier(self) -> None:
        """Mark every frontier endpoint unhealthy: the engine then routes on-prem only (the
        ``health`` filter drops those targets; rules fall back or move on), as for goodput."""
        for name in self.frontier:
            self.state.set_health(name, False, "replay goodput: frontier targets disabled")

    def _verify(self, index: int, d: Decision, drafted: str, prompt_tokens: int, draft_tokens: int,
                output_tokens: int) -> bool:
        """``RoutingEngine.verify`` of ``drafted``'s draft of request ``index`` (see the module docstring);
        True when it escalated to a frontier tier (held under ``_escalating[index]``)."""
        assert self.cascade is not None
        draft = self.cascade.draft(index, drafted, prompt_tokens, d.p_hard)
        if draft is None:
            return False
        esc = self.engine.verify(d, draft)
        if esc.escalation_id is None or esc.target is None:
            filtered = {r.rule: r.note or r.result for r in esc.results if r.result == "no-eligible-target"}
            if filtered or esc.refusals:  # an escalating rule whose targets the filters (budget) excluded, or refused
                self.cascade.refused[index] = {**filtered, **esc.refusals}
            return False
        call = self.cascade.escalated(index, drafted, prompt_tokens, draft_tokens, output_tokens, esc.target)
        if call is None:  # on-prem: not modelled
            self.state.release(esc.escalation_id)
            return False
        self._escalating[index] = (esc.escalation_id, esc.target, *call)
        return True

    def _settle_due(self, now_s: float) -> None:
        """Settle every escalated call that completed by simulated second ``now_s``, at its completion."""
        while self._due and self._due[0][0] <= now_s:
            finish_s, eid, target, prompt, output, usd = heapq.heappop(self._due)
            self.state.settle(eid, prompt_tokens=prompt, completion_tokens=output, actual_cost_usd=usd, target=target,
                              now=EPOCH_S + finish_s)

    def finish(self) -> None:
        """After the run: settle the escalated calls still running at the last event."""
        self._settle_due(float("inf"))

    def on_complete(self, result: RequestResult) -> None:
        """Settle the request's decision at its simulated completion (as the service does), or
        release it when the request was refused after its decision; at simulated Unix time. With a
        cascade, a whole draft is verified first and an escalated call scheduled (module docstring)."""
        index = result.index
        decision_id = self._ids.pop(index, None)
        if decision_id is None:
            return
        finish_s = result.finish_s if result.finish_s is not None else result.arrival_s
        self.now_s = max(self.now_s, finish_s)
        self._settle_due(finish_s)
        now = EPOCH_S + finish_s
        d = self._drafts.pop(index, None)
        usage = {"prompt_tokens": result.prompt_tokens, "completion_tokens": result.output_tokens,
                 "cached_tokens": min(result.prefix_hit_tokens, result.prompt_tokens)}
        if d is not None and result.rejected is None and not result.frontier and result.target is not None:
            self.state.hold_known_cost(decision_id, **usage, target=result.target)
            self._verify(index, d, result.target, result.prompt_tokens, result.output_tokens, result.output_tokens)
        if result.rejected is not None:
            self.state.release(decision_id, now=now)
        else:
            self.state.settle(decision_id, prompt_tokens=usage["prompt_tokens"],
                              completion_tokens=usage["completion_tokens"], cached_tokens=usage["cached_tokens"],
                              actual_cost_usd=result.cost_usd if result.frontier else None,
                              target=result.target, mode=result.mode, now=now)
        escalating = self._escalating.pop(index, None)
        if escalating is None or self.cascade is None:
            return
        eid, target, call_s, usd = escalating
        drafted, draft_tokens, output_tokens, _ = self.cascade.escalations[index]
        if result.rejected is None and result.target == drafted and result.output_tokens == min(draft_tokens,
                                                                                               output_tokens):
            heapq.heappush(self._due, (finish_s + call_s, eid, target, result.prompt_tokens, output_tokens, usd))
        else:  # refused, or a fallback ran the draft in full: no escalated call
            del self.cascade.escalations[index]
            self.state.release(eid, now=now)


__all__ = ["EPOCH_S", "EngineRouter", "SimBoard", "SimFleetState", "SimPrefixIndex", "TraceMessages",
           "UTILIZATION_WINDOW_S"]
