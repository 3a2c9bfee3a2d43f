"""One replay comparison: every policy (the real engine in the loop) and every baseline over
the same trace, fleet and seed.

``replay_all(trace, fleet, policies, estimator, ...) -> list[Run]``. Baselines
(``baseline_routers``), all difficulty-blind:

- ``round-robin``, ``random``, ``least-loaded``, ``cache-aware``: the pickers of
  ``replay.baselines`` over every on-prem replica that takes new requests
  (``OnPremWide``), whatever its model; requests refused by admission control spill as
  the fleet says.
- ``all-on-prem``: everything to the largest on-prem target (most GPUs): the least-loaded
  of its aggregated replicas and prefill replicas (disaggregated), as ``OnPremWide``.
- ``llm-d``, ``dynamo-kv``, ``sglang-cache-aware``: the anchors of ``replay.baselines``
  (llm-d's default scheduling profile, Dynamo's KV router cost, SGLang's cache-aware
  policy) over the same replicas as ``OnPremWide``; they hear first tokens and completions.
- ``all-frontier``: everything to the frontier target with the highest output price.

Each run's routers are fresh; the simulator seed is shared, so runs differ only by routing.

With ``goodput`` (``GoodputSettings``) every run also gets DistServe's goodput
(``replay.goodput.search``) on the first ``requests`` requests of the trace, with frontier
targets disabled: a policy's engine has its frontier endpoints marked unhealthy (and any
frontier assignment left is rejected), baselines route on-prem as always, and nothing spills
(the fleet's spill target is dropped); ``all-frontier`` has no goodput (NaN). Each point
replays with fresh routers; a policy's difficulty estimates are kept across points
(``MemoEstimator``). The summary's ``max_goodput_rps`` / ``max_goodput_rps_per_gpu`` carry
the answer and ``Run.goodput`` the points.

With ``budgets`` every policy run gets its own empty budget ledger (``replay.budgets``) and
its requests the scope ``tenant:<tenant>``; baselines ignore budgets. The run's ``budget``
lists each budget that applies with its spend at the end (``replay.budgets.budget_status``),
and its summary's ``budget_spent_usd`` / ``budget_limit_usd`` are those of the budget with the
highest spent fraction.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from pointsman.datasets.traces import TraceRequest
from pointsman.estimator.estimate import Estimator
from pointsman.policy.budget.config import BudgetConfig
from pointsman.policy.fleet import Fleet
from pointsman.policy.rules.compiler import CompiledPolicy
from pointsman.replay.baselines import ANCHORS, BASELINES, LeastLoaded, OnPremWide, RandomPick, RoundRobin
from pointsman.replay.breakdown import RuleRow, by_rule
from pointsman.replay.budgets import (
    REPLAY_TENANT,
    BudgetSpend,
    budget_status,
    replay_ledger,
    replay_scopes,
)
from pointsman.replay.cascade import CascadeVerify, DraftBook, apply_cascade
from pointsman.replay.engine_router import EPOCH_S, EngineRouter, TraceMessages
from pointsman.replay.goodput import GoodputResult, MemoEstimator, RouterFactory, frontier_guard, on_prem_only, search
from pointsman.replay.outcome_draw import OutcomeRow, quality_columns, quality_of
from pointsman.replay.results import ReplayResult, RequestResult
from pointsman.replay.router import Assignment, FleetView, ObservingRouter, Router
from pointsman.replay.sim_fleet import SimFleet
from pointsman.replay.simulator import simulate
from pointsman.replay.summary import SLO, Summary, summarize


@dataclass
class Run:
    """One router's replay: ``name``, ``kind`` (``policy`` or ``baseline``), the simulator's
    ``result``, its ``summary`` and, for a policy, ``rules``: requests per deciding rule,
    ``budget``: the budgets that applied with their spend at the end (empty without budgets), and
    ``by_rule``: where each rule's requests ran, what they scored against all-frontier and what
    they paid (``replay.breakdown``; empty without outcome rows)."""

    name: str
    kind: str
    result: ReplayResult
    summary: Summary
    rules: dict[str, int] = field(default_factory=dict)
    budget: list[BudgetSpend] = field(default_factory=list)
    goodput: GoodputResult | None = None
    by_rule: list[RuleRow] = field(default_factory=list)


@dataclass(frozen=True)
class GoodputSettings:
    """What the goodput search runs on: the first ``requests`` requests of the trace (all
    when None), against ``slo`` (default: the run's), to ``rel_tol``; ``log(line)`` hears one
    line per searched run."""

    requests: int | None = 2000
    slo: SLO | None = None
    rel_tol: float = 0.05
    log: Callable[[str], None] | None = None


def baseline_routers(sim: SimFleet, seed: int = 0) -> dict[str, Router]:
    """Fresh baseline routers by name (see the module docstring)."""
    routers: dict[str, Router] = {}
    if sim.on_prem:
        for name, cls in BASELINES.items():
            picker = cls("", seed=seed) if cls is RandomPick else cls("")
            routers[name] = OnPremWide(picker)
        big = max(sim.on_prem, key=lambda t: t.gpus)
        routers["all-on-prem"] = OnPremWide(LeastLoaded(big.name), (big.name,))
        for name, anchor in ANCHORS.items():
            routers[name] = anchor(seed=seed)
    if sim.frontier:
        routers["all-frontier"] = RoundRobin(max(sim.frontier, key=lambda f: f.output_usd_per_mtok).name)
    return routers


def _observers(router: Router) -> tuple[Callable[[RequestResult], None] | None, Callable[[int, float], None] | None]:
    if isinstance(router, ObservingRouter):
        return router.on_complete, router.on_first_token
    return None, None


def goodput_factories(trace_texts: Sequence[TraceMessages | None] | None, fleet: Fleet, sim: SimFleet,
                      policies: Mapping[str, CompiledPolicy], estimator: Estimator, *, seed: int = 0,
                      baselines: bool = True, slo_class: str | None = None) -> dict[str, RouterFactory]:
    """Fresh routers with frontier targets disabled for each policy and baseline, by run name
    (``all-frontier`` has none): see the module docstring."""
    goodput_sim = on_prem_only(sim)
    memo = MemoEstimator(estimator)
    out: dict[str, RouterFactory] = {}
    for name, policy in policies.items():
        def make_policy(policy: CompiledPolicy = policy) -> tuple[Router, Callable[[RequestResult], None] | None,
                                                                  Callable[[int, float], None] | None]:
            router = EngineRouter(fleet, policy, memo, texts=trace_texts, slo_class=slo_class)
            router.disable_frontier()
            return frontier_guard(router, goodput_sim), router.on_complete, None
        out[name] = make_policy
    if baselines:
        for name in baseline_routers(sim, seed):
            if name == "all-frontier":
                continue

            def make_baseline(name: str = name) -> tuple[Router, Callable[[RequestResult], None] | None,
                                                         Callable[[int, float], None] | None]:
                router = baseline_routers(sim, seed)[name]
                on_complete, on_first_token = _observers(router)
                return frontier_guard(router, goodput_sim), on_complete, on_first_token
            out[name] = make_baseline
    return out


def _counting(router: Router, tick: Callable[[int], None]) -> Router:
    def counted(request: TraceRequest, view: FleetView, /) -> Assignment:
        tick(1)
        return router(request, view)

    return counted


def replay_all(trace: Sequence[TraceRequest], fleet: Fleet, sim: SimFleet, policies: Mapping[str, CompiledPolicy],
               estimator: Estimator, *, texts: Sequence[TraceMessages | None] | None = None,
               rows: Sequence[OutcomeRow | None] | None = None,
               seed: int = 0, baselines: bool = True, slo: SLO | None = None, timeline_bin_s: float = 10.0,
               progress: Callable[[int], None] | None = None, budgets: BudgetConfig | None = None,
               tenant: str = REPLAY_TENANT, slo_class: str | None = None,
               goodput: GoodputSettings | None = None, cascade: DraftBook | None = None) -> list[Run]:
    """Replay ``trace`` through each policy (an ``EngineRouter`` with ``estimator`` and
    ``texts``; with ``budgets``, a fresh budget ledger and scope ``tenant:<tenant>``, see the
    module docstring) and, with ``baselines``, each baseline router, on ``sim`` (built from
    ``fleet``); every request carries ``routing.slo_class = slo_class``. ``rows[i]``: trace
    request ``i``'s outcome row for quality, or None. ``progress(n)`` is called once per
    routed request. With ``goodput``, each run's goodput is searched too (module docstring). With
    ``cascade`` (the drafts) and ``rows``, a policy with a ``verify`` section runs as a cascade
    (``replay.cascade``: escalated requests pay the draft and the frontier call, latencies add; with
    the policy's ``verify.prefix_tokens`` N, the verdict comes at the draft's N-th token and an
    escalated draft is cut there in the simulation: early verification).
    Returns the runs, policies first."""
    def quality(r: RequestResult) -> float | None:
        return quality_of(rows[r.index], r.frontier, r.target) if rows is not None else None

    priciest = max(sim.frontier, key=lambda f: f.output_usd_per_mtok).name if sim.frontier else None

    def reference(r: RequestResult) -> float | None:  # all-frontier's quality
        return quality_of(rows[r.index], True, priciest) if rows is not None and priciest is not None else None

    def run(router: Router, on_complete: Callable[[RequestResult], None] | None = None) -> ReplayResult:
        on_first_token = None
        if isinstance(router, ObservingRouter):
            on_complete, on_first_token = _observers(router)
        routed = _counting(router, progress) if progress is not None else router
        return simulate(trace, sim, routed, seed=seed, timeline_bin_s=timeline_bin_s, on_complete=on_complete,
                        on_first_token=on_first_token)

    runs: list[Run] = []
    for name, policy in policies.items():
        with tempfile.TemporaryDirectory(prefix="pointsman-replay-budget-") as folder:
            ledger = replay_ledger(budgets, folder) if budgets is not None else None
            try:
                verified = None
                if cascade is not None and rows is not None and policy.verify is not None:
                    verified = CascadeVerify(rows, sim, policy, cascade, quality_columns(fleet))
                router = EngineRouter(fleet, policy, estimator, texts=texts, ledger=ledger,
                                      tenant=tenant if budgets is not None else None, slo_class=slo_class,
                                      cascade=verified)
                result = run(router, router.on_complete)
                router.finish()
                if verified is not None:
                    result = apply_cascade(result, verified)
                spend = [] if ledger is None else budget_status(ledger, replay_scopes(tenant),
                                                                EPOCH_S + result.end_s)
            finally:
                if ledger is not None:
                    ledger.close()
        summary = summarize(result, slo, quality if rows else None)
        if spend:
            top = max(spend, key=lambda b: b["spent_fraction"])
            summary = dataclasses.replace(summary, budget_spent_usd=top["settled_usd"] + top["reserved_usd"],
                                          budget_limit_usd=top["limit_usd"])
        rules = Counter(d[0] for d in router.decisions.values())
        rows_by_rule = by_rule(result, router.decisions, slo or SLO(), quality, reference) \
            if rows is not None and priciest is not None else []
        runs.append(Run(name, "policy", result, summary, dict(rules.most_common()), spend, by_rule=rows_by_rule))
    if baselines:
        for name, baseline in baseline_routers(sim, seed).items():
            result = run(baseline)
            runs.append(Run(name, "baseline", result, summarize(result, slo, quality if rows else None)))
    if goodput is not None:
        sample = list(trace[: goodput.requests]) if goodput.requests else list(trace)
        factories = goodput_factories(texts, fleet, sim, policies, estimator, seed=seed, baselines=baselines,
                                      slo_class=slo_class)
        target_slo = goodput.slo or slo or SLO()
        for r in runs:
            make = factories.get(r.name)
            if make is None:
                continue
            found = search(sample, make, on_prem_only(sim), target_slo, rel_tol=goodput.rel_tol, seed=seed)
            r.goodput = found
            r.summary = dataclasses.replace(r.summary, max_goodput_rps=found.max_goodput_rps,
                                            max_goodput_rps_per_gpu=found.max_goodput_rps_per_gpu)
            if goodput.log is not None:
                goodput.log(f"goodput {r.name}: {found.max_goodput_rps:.3f} req/s ({found.max_goodput_rps_per_gpu:.4f} "
                            f"per GPU) in {len(found.points)} replays of {found.requests} requests, "
                            f"{found.wall_s:.1f} s")
    return runs


__all__ = ["GoodputSettings", "Run", "baseline_routers", "goodput_factories", "replay_all"]
