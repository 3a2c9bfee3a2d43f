"""The ``RoutingEngine``: one request in, one ``Decision`` out. Plain data in and out;
never imports FastAPI. The same engine runs in the service, the CLI and replay.

Steps of ``route(request)`` (DESIGN.md, "The flow of one decision"):

1. features: ``extract_features(request, estimator.tokenizer)`` (bounded cost);
2. difficulty: ``estimator.estimate(features)``; an estimator that raises or returns
   an invalid ``p_hard`` counts as unavailable (``difficulty.available == false``);
3. signals: the per-decision snapshot dict (``policy/signals.py``);
4. policy: eligibility filters, candidate costs, ordered rules -> target + mode
   (``decide``, shared with policy cases);
5. endpoints inside the chosen pool (``policy/pickers.py``);
6. estimated cost in USD on the chosen target and mode (``policy/cost.py``).

The engine is immutable: to change policy or estimator, build a new engine
(``with_policy``, ``with_estimator``) and swap the reference; decisions in flight
finish on the engine they started with.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

from pointsman.estimator.estimate import DifficultyEstimate, Estimator
from pointsman.estimator.features import extract_features
from pointsman.policy.compiler import CompiledPolicy
from pointsman.policy.cost import CostEstimate, estimate_cost
from pointsman.policy.decision import Decision, Fallback, new_decision_id
from pointsman.policy.evaluator import Verdict, evaluate
from pointsman.policy.filters import FILTERS, Exclusion, FilterFn, eligibility
from pointsman.policy.fleet import Fleet
from pointsman.policy.pickers import InOrderPicker, Picker, base_url
from pointsman.policy.signals import difficulty_signals, request_signals
from pointsman.request import RouteRequest


@dataclass(frozen=True)
class Outcome:
    """What the policy step decided from a snapshot: the ``verdict``, every target's
    ``costs`` in its default mode, and ``exclusions`` (None = eligible)."""

    verdict: Verdict
    costs: dict[str, CostEstimate]
    exclusions: dict[str, Exclusion | None]


def candidate_costs(fleet: Fleet, request: dict[str, Any]) -> dict[str, CostEstimate]:
    """Cost of the request on every target in its default mode, from the ``request`` namespace."""
    cap = request["max_output_tokens"] if request["max_output_tokens_set"] else None
    prompt = request["prompt_tokens"]
    return {name: estimate_cost(name, t, t.modes[0], prompt, fleet.output_tokens(name, cap))
            for name, t in fleet.targets.items()}


def decide(fleet: Fleet, policy: CompiledPolicy, signals: dict[str, Any],
           filters: dict[str, FilterFn] = FILTERS) -> Outcome:
    """The policy step on a snapshot: eligibility, candidate costs, rules. Raises
    ``NoEligibleTarget`` when no matching rule has an eligible target."""
    exclusions = eligibility(fleet, signals["request"], filters)
    costs = candidate_costs(fleet, signals["request"])
    verdict = evaluate(policy, signals, {k: v.usd for k, v in costs.items()}, exclusions)
    return Outcome(verdict, costs, exclusions)


def _checked(estimate: Any, started: float) -> DifficultyEstimate:
    """Treat a malformed estimate (not a DifficultyEstimate, p_hard outside [0, 1] or NaN) as unavailable."""
    if not isinstance(estimate, DifficultyEstimate):
        return DifficultyEstimate(None, False, (time.perf_counter() - started) * 1e3,
                                  f"estimator returned {type(estimate).__name__}")
    if estimate.available:
        p = estimate.p_hard
        if not isinstance(p, (int, float)) or math.isnan(p) or not 0.0 <= p <= 1.0:
            return DifficultyEstimate(None, False, estimate.latency_ms, f"invalid p_hard {p!r}")
    return estimate


class RoutingEngine:
    """Decides where requests run.

    ``RoutingEngine(fleet, policy, estimator, picker=None, filters=FILTERS)``: ``policy``
    must be compiled against ``fleet`` (``ValueError`` otherwise); ``estimator`` is any
    ``Estimator`` (``.version``, ``.tokenizer``, ``.estimate(features)``); ``picker``
    defaults to ``InOrderPicker(fleet)``.
    """

    def __init__(self, fleet: Fleet, policy: CompiledPolicy, estimator: Estimator, *,
                 picker: Picker | None = None, filters: dict[str, FilterFn] = FILTERS) -> None:
        if policy.fleet_revision != fleet.revision:
            raise ValueError(f"policy {policy.file} was compiled against fleet revision "
                             f"{policy.fleet_revision}, not {fleet.revision}")
        self.fleet = fleet
        self.policy = policy
        self.estimator = estimator
        self.picker: Picker = picker or InOrderPicker(fleet)
        self.filters = filters

    def with_policy(self, policy: CompiledPolicy) -> RoutingEngine:
        """A new engine with ``policy`` and everything else shared."""
        return RoutingEngine(self.fleet, policy, self.estimator, picker=self.picker, filters=self.filters)

    def with_estimator(self, estimator: Estimator) -> RoutingEngine:
        """A new engine with ``estimator`` and everything else shared."""
        return RoutingEngine(self.fleet, self.policy, estimator, picker=self.picker, filters=self.filters)

    def _estimate(self, features: Any) -> DifficultyEstimate:
        started = time.perf_counter()
        try:
            return _checked(self.estimator.estimate(features), started)
        except Exception as exc:  # noqa: BLE001 - the estimator must never take a decision down
            return DifficultyEstimate(None, False, (time.perf_counter() - started) * 1e3,
                                      f"{type(exc).__name__}: {exc}")

    def signals(self, request: RouteRequest, features: Any, estimate: DifficultyEstimate) -> dict[str, Any]:
        """The per-decision snapshot: ``request``, ``difficulty``, ``variables`` namespaces."""
        default_output = self.fleet.spec.defaults.output_tokens
        return {
            "request": request_signals(features, request, default_output),
            "difficulty": difficulty_signals(estimate),
            "variables": self.policy.variables,
        }

    def route(self, request: RouteRequest) -> Decision:
        """Decide where ``request`` runs. Raises ``NoEligibleTarget`` (a ``RequestError``) when
        no target can take it (e.g. a prompt longer than every context window)."""
        t0 = time.perf_counter()
        features = extract_features(request, getattr(self.estimator, "tokenizer", None))
        t1 = time.perf_counter()
        estimate = self._estimate(features)
        t2 = time.perf_counter()
        signals = self.signals(request, features, estimate)
        outcome = decide(self.fleet, self.policy, signals, self.filters)
        verdict = outcome.verdict
        endpoints = self.picker.pick(verdict.target, verdict.mode, signals)
        chosen_cost = outcome.costs[verdict.target]
        if chosen_cost.mode != verdict.mode:
            chosen_cost = estimate_cost(verdict.target, self.fleet.targets[verdict.target], verdict.mode,
                                        chosen_cost.prompt_tokens, chosen_cost.output_tokens)
        fallbacks = tuple(
            Fallback(t, self.fleet.targets[t].model, base_url(self.picker.pick(t, m, signals)), m)
            for t, m in verdict.fallbacks)
        t3 = time.perf_counter()
        trace = self._trace(signals, outcome, chosen_cost, estimate)
        target = self.fleet.targets[verdict.target]
        t4 = time.perf_counter()
        return Decision(
            decision_id=new_decision_id(),
            target=verdict.target,
            model=target.model,
            base_url=base_url(endpoints),
            mode=verdict.mode,
            endpoints=endpoints,
            fallbacks=fallbacks,
            estimated_cost_usd=chosen_cost.usd,
            rule=verdict.rule.name,
            labels=verdict.rule.labels,
            p_hard=signals["difficulty"]["p_hard"],
            difficulty_available=signals["difficulty"]["available"],
            prompt_tokens=features.prompt_tokens,
            policy_revision=self.policy.revision,
            fleet_revision=self.fleet.revision,
            estimator_version=str(getattr(self.estimator, "version", "unknown")),
            timings_ms={
                "features": (t1 - t0) * 1e3,
                "estimator": (t2 - t1) * 1e3,
                "policy": (t3 - t2) * 1e3,
                "total": (t4 - t0) * 1e3,
            },
            trace=trace,
        )

    def _trace(self, signals: dict[str, Any], outcome: Outcome, chosen: CostEstimate,
               estimate: DifficultyEstimate) -> dict[str, Any]:
        verdict = outcome.verdict
        evaluated = self.policy.rules[: len(verdict.results)]
        used: dict[str, Any] = {}
        for rule in evaluated:
            for path in rule.signals:
                root, _, name = path.partition(".")
                ns = signals.get(root, {})
                used[path] = {"value": ns.get(name) if name else ns, "age_s": 0.0}
        candidates = []
        for name, cost in outcome.costs.items():
            c = chosen if name == chosen.target else cost
            excl = outcome.exclusions.get(name)
            candidates.append({"target": name, "mode": c.mode, "estimated_cost_usd": c.usd,
                               "eligible": excl is None, "excluded_by": str(excl) if excl else None})
        return {
            "rules": [r.to_dict() for r in verdict.results],
            "deciding_rule": {"name": verdict.rule.name, "when": verdict.rule.when, "line": verdict.rule.line},
            "signals": used,
            "candidates": candidates,
            "cost": chosen.to_dict(),
            "estimator": {"version": str(getattr(self.estimator, "version", "unknown")),
                          "available": estimate.available, "latency_ms": estimate.latency_ms,
                          "error": estimate.error},
            "policy": {"name": self.policy.name, "file": self.policy.file},
        }
