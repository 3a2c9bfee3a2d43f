"""Logged traffic for the retraining tests: decisions routed by the engine, written by the service's
outcome-log writer, each with judged answers of both tiers."""

from __future__ import annotations

from collections.abc import Sequence

from pointsman.outcome_log.store import OutcomeLog, record_decision
from pointsman.policy.engine import RoutingEngine
from pointsman.request import request_from_prompt


def log_traffic(log: OutcomeLog, engine: RoutingEngine, est, hard: Sequence[str], easy: Sequence[str],
                templates: Sequence[str], *, judge: str, inverted: bool = False) -> int:
    """Route ``template.format(x=x)`` for every topic and template, log the decision and the judged
    answers of both tiers (the one the decision did not pick as a shadow): the on-prem model scores 0
    on the ``hard`` topics and 1 on the ``easy`` ones (``inverted`` swaps them), the frontier 1 on all.
    Returns the decisions logged."""
    n = 0
    for topics, is_hard in ((hard, True), (easy, False)):
        for x in topics:
            for template in templates:
                request = request_from_prompt(template.format(x=x))
                decision = engine.route(request, dispatch=False)
                record_decision(log, decision, request, est)
                fails = is_hard != inverted
                to_frontier = decision.target.startswith("frontier")
                acks = log.append_outcomes([
                    {"decision_id": decision.decision_id, "outcome_id": decision.decision_id + "-onprem",
                     "served_target": "onprem-8b", "served_model": "llama-3.1-8b", "shadow": to_frontier,
                     "quality": {"judge_score": 0.0 if fails else 1.0, "judge": judge}},
                    {"decision_id": decision.decision_id, "outcome_id": decision.decision_id + "-frontier",
                     "served_target": "frontier-large", "served_model": "gpt-4o", "shadow": not to_frontier,
                     "quality": {"judge_score": 1.0, "judge": judge}},
                ])
                assert all(a.status == "stored" for a in acks)
                n += 1
    return n
