"""Evaluate a policy's ``verify`` rules on one draft: first matching rule wins.

``evaluate_verify(verify, context, costs, exclusions, drafted) -> VerifyVerdict``. ``context`` holds the
CEL variables the rules read (``CompiledVerify.context_plan``: route namespaces plus
``draft``). For each rule in order (as ``evaluator.evaluate`` does for routes):

- its condition runs (an unconditional rule matches); a condition that errors at run time
  is skipped and recorded with its error;
- an ``accept`` rule that matches decides ``accept``;
- an ``escalate`` rule that matches takes the first eligible of its target and fallbacks
  (``exclusions``: the route step's eligibility filters, evaluated again at verify time), never
  the draft's own target (``drafted``) unless the rule names it as its target: a call there is the
  draft again, and its outcome reads as the cancelled draft's report, which the service refuses
  (the verify booked the draft); when none is eligible it is recorded as ``no-eligible-target`` and
  evaluation continues.

When no rule decides (every escalation target ineligible), the draft is accepted and the
verdict's ``rule`` is None: the gateway keeps what it has.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from cel import cel  # the Rust extension itself (see evaluator.py)

from pointsman.policy.rules.compiler import CompiledVerify, CompiledVerifyRule
from pointsman.policy.rules.evaluator import RuleResult, _cost_function, _error_text
from pointsman.policy.selection.filters import Exclusion


@dataclass(frozen=True)
class VerifyVerdict:
    """The verify rules' answer: ``action`` (``accept`` or ``escalate``), the deciding ``rule``
    (None when no rule decided), the escalation ``target`` and its eligible ``fallbacks``
    ((target, mode); empty for accept), every rule evaluated (``results``) and the CEL variables they read
    (``context``, for the trace)."""

    action: str
    rule: CompiledVerifyRule | None
    target: str | None
    mode: str | None
    fallbacks: tuple[tuple[str, str], ...]
    results: tuple[RuleResult, ...]
    context: Mapping[str, object] = field(default_factory=dict)


def evaluate_verify(verify: CompiledVerify, context: Mapping[str, object], costs: Mapping[str, float] | None = None,
                    exclusions: Mapping[str, Exclusion | None] | None = None,
                    drafted: str | None = None) -> VerifyVerdict:
    """Run the verify rules in order (see the module) on the CEL variables ``context``;
    ``costs``: USD per target for ``cost(target)``; ``exclusions``: target -> ``Exclusion``
    or None (missing = eligible); ``drafted``: the target that wrote the draft. Never raises for a
    compiled section."""
    excluded = exclusions or {}

    def why(rule: CompiledVerifyRule, target: str) -> object:
        if target == drafted and target != rule.target:
            return excluded.get(target) or "the draft's own target"
        return excluded.get(target)

    functions = {"cost": _cost_function(costs or {})} if verify.uses_cost else None
    ctx = cel.Context(dict(context), functions)
    results: list[RuleResult] = []
    for rule in verify.rules:
        if rule.program is not None:
            try:
                value = rule.program.execute(ctx)
            except Exception as exc:  # noqa: BLE001 - any evaluation failure skips the rule
                results.append(RuleResult(rule.name, "error", _error_text(exc, rule, context)))
                continue
            if value is not True:
                results.append(RuleResult(rule.name, "no-match" if value is False else "error",
                                          None if value is False else f"condition gave {type(value).__name__}"))
                continue
        if rule.action == "accept":
            results.append(RuleResult(rule.name, "matched"))
            return VerifyVerdict("accept", rule, None, None, (), tuple(results), context)
        eligible = [(t, m) for t, m in rule.candidates if why(rule, t) is None]
        if not eligible:
            results.append(RuleResult(rule.name, "no-eligible-target",
                                      "; ".join(f"{t} ({why(rule, t)})" for t, _ in rule.candidates)))
            continue
        (target, mode), *rest = eligible
        note = None if target == rule.target else f"{rule.target} ineligible ({why(rule, rule.target)}); took {target}"
        results.append(RuleResult(rule.name, "matched", None, note))
        return VerifyVerdict("escalate", rule, target, mode, tuple(rest), tuple(results), context)
    return VerifyVerdict("accept", None, None, None, (), tuple(results), context)

