"""The cascade's second decision: accept a draft or escalate, from the policy's ``verify`` rules.

``judge(fleet, policy, base, source, draft)`` is the policy step of ``POST /v1/verify``
(``RoutingEngine.verify`` adds placement and dispatch; ``policy/cases.py`` runs it on static
signals): the route's eligibility filters evaluated again now (health, budget, context
window: an escalation target must still fit), the CEL variables the verify rules read
(``verify_context``: route namespaces from ``source`` plus ``draft``), then
``rules/verify.evaluate_verify``.

``draft_signals(features, p_bad, verifier)`` builds the ``draft`` namespace from a draft's
``estimator.draft.DraftFeatures`` and its verifier score.

A policy without a ``verify`` section accepts every draft (rule ``no-verify-section``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from pointsman.estimator.draft import DraftFeatures
from pointsman.policy.decision import EndpointChoice, Fallback
from pointsman.policy.fleet import Fleet
from pointsman.policy.live import BaseSignals, CelContext, build_context
from pointsman.policy.rules.compiler import CompiledPolicy
from pointsman.policy.rules.evaluator import RuleResult
from pointsman.policy.rules.verify import VerifyVerdict, evaluate_verify
from pointsman.policy.selection.filters import FILTERS, FilterContext, FilterFn, eligibility, enabled
from pointsman.policy.signals.namespaces import DraftSignals
from pointsman.policy.signals.source import SignalSource

#: The verdict of a policy without a ``verify`` section.
NO_VERIFY = VerifyVerdict("accept", None, None, None, (), ())


class TargetCosts(Mapping[str, float]):
    """``cost(target)`` for CEL: USD from the signal source, computed on first use."""

    def __init__(self, fleet: Fleet, source: SignalSource) -> None:
        self.fleet, self.source = fleet, source

    def __getitem__(self, target: str) -> float:
        if target not in self.fleet.targets:
            raise KeyError(target)
        return float(self.source.cost(target).usd)

    def __iter__(self) -> Iterator[str]:
        return iter(self.fleet.targets)

    def __len__(self) -> int:
        return len(self.fleet.targets)


def draft_signals(features: DraftFeatures, p_bad: float, verifier: str, target: str, on_prem: bool) -> DraftSignals:
    """The ``draft`` namespace (``SIGNALS['draft']`` gives each field's meaning); ``target``: the
    decision's target, which wrote the draft."""
    return {"p_bad": float(p_bad), "tokens": features.tokens, "length_ratio": features.length_ratio,
            "finish_reason": features.finish_reason, "truncated": features.truncated, "partial": features.partial,
            "empty": features.empty, "refusal": features.refusal, "hedging": features.hedging,
            "repetition": features.repetition, "has_logprobs": features.logprob_mean is not None,
            "logprob_mean": features.logprob_mean, "logprob_min": features.logprob_min,
            "low_logprob_share": features.low_logprob_share, "verifier": verifier, "target": target,
            "on_prem": on_prem}


def verify_context(policy: CompiledPolicy, base: BaseSignals, source: SignalSource,
                   draft: Mapping[str, object]) -> CelContext:
    """The CEL variables of ``policy.verify``'s rules: its plan's route namespaces from ``base``
    and ``source`` (``live.build_context``), and the ``draft`` fields it reads."""
    verify = policy.verify
    if verify is None:
        return {}
    plan = dict(verify.context_plan)
    wanted = plan.pop("draft", None)
    out = build_context(dataclasses.replace(policy, context_plan=plan), base, source)
    if "draft" in verify.context_plan:
        out["draft"] = dict(draft) if not isinstance(wanted, (set, frozenset)) else \
            {f: draft[f] for f in wanted if f in draft}
    return out


def judge(fleet: Fleet, policy: CompiledPolicy, base: BaseSignals, source: SignalSource,
          draft: Mapping[str, object], filters: dict[str, FilterFn] = FILTERS) -> VerifyVerdict:
    """The verify step (see the module): accept, or escalate to an eligible target."""
    if policy.verify is None:
        return NO_VERIFY
    exclusions = eligibility(fleet, FilterContext(base["request"], policy.filters, source),
                             enabled(policy.filters, filters))
    context = verify_context(policy, base, source, draft)
    drafted = draft.get("target")
    return evaluate_verify(policy.verify, context, TargetCosts(fleet, source), exclusions,
                           drafted if isinstance(drafted, str) else None)


def rule_name(verdict: VerifyVerdict) -> str:
    """The deciding rule's name; ``no-verify-section`` or ``no-eligible-escalation`` when none decided."""
    if verdict.rule is not None:
        return verdict.rule.name
    return "no-eligible-escalation" if verdict.results else "no-verify-section"


def results_dicts(results: tuple[RuleResult, ...]) -> list[dict[str, object]]:
    """Every verify rule evaluated, as JSON-ready dicts."""
    return [r.to_dict() for r in results]


@dataclass(frozen=True)
class Escalation:
    """What ``RoutingEngine.verify`` answers for one draft.

    ``action``: ``accept`` or ``escalate``; ``rule``: the deciding verify rule (see
    ``rule_name``); ``escalation_id``: ``<decision_id>/escalation`` (signed:
    ``<decision_id>/escalation.<claims>.<mac>``), the id the frontier call's budget hold and
    in-flight load are held under and its outcome may be reported under (None for accept); ``target``, ``model``,
    ``base_url``, ``mode``, ``endpoints``, ``fallbacks``, ``estimated_cost_usd``: where the
    escalated request goes (as a ``Decision``'s; None/empty for accept); ``results``: every
    verify rule evaluated; ``signals``: every signal they read, ``{path: {"value", "age_s"}}`` as a route's trace
    gives them; ``refusals``: escalation targets that refused the budget hold or had no healthy endpoint
    (target -> reason)."""

    decision_id: str
    action: str
    rule: str
    labels: dict[str, str]
    results: tuple[RuleResult, ...]
    escalation_id: str | None = None
    target: str | None = None
    model: str | None = None
    base_url: str | None = None
    mode: str | None = None
    endpoints: tuple[EndpointChoice, ...] = ()
    fallbacks: tuple[Fallback, ...] = ()
    estimated_cost_usd: float | None = None
    refusals: dict[str, str] = field(default_factory=dict)
    signals: dict[str, object] = field(default_factory=dict)

    def to_dict(self) -> dict[str, object]:
        """JSON-ready: every field, endpoints and fallbacks as dicts, ``trace`` with the rules and signals."""
        return {"decision_id": self.decision_id, "action": self.action, "rule": self.rule, "labels": self.labels,
                "escalation_id": self.escalation_id, "target": self.target, "model": self.model,
                "base_url": self.base_url, "mode": self.mode, "endpoints": [e.to_dict() for e in self.endpoints],
                "fallbacks": [f.to_dict() for f in self.fallbacks], "estimated_cost_usd": self.estimated_cost_usd,
                "trace": {"rules": results_dicts(self.results), "signals": dict(self.signals),
                          "refusals": dict(self.refusals)}}


def escalation_id(decision_id: str) -> str:
    """The id an escalation of ``decision_id`` is accounted under: ``<decision_id>/escalation``
    (``FleetState.dispatch`` appends its signed claims when the decision id is signed:
    ``signals/signed_ids.py``)."""
    return f"{decision_id}/escalation"
