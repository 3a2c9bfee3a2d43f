"""The policy's ``verify`` section: compiled with the route rules' checks (located problems,
an unconditional last rule), evaluated on draft signals by ``policy/escalation.py``."""

from __future__ import annotations

import pytest

from pointsman.errors import PolicyError
from pointsman.policy.escalation import judge, rule_name
from pointsman.policy.fleet import DEFAULT_FLEET_PATH, load_fleet
from pointsman.policy.live import StaticSignals
from pointsman.policy.rules.compiler import compile_policy
from pointsman.policy.signals.namespaces import example_draft, example_signals

FLEET = load_fleet(DEFAULT_FLEET_PATH)
HEAD = """apiVersion: pointsman/v1
kind: RoutingPolicy
rules:
  - name: default
    route: {target: onprem-8b}
"""


def _compile(verify: str) -> object:
    return compile_policy(HEAD + verify, FLEET, "p.yaml")


def _problems(verify: str) -> list[str]:
    with pytest.raises(PolicyError) as info:
        _compile(verify)
    return [f"{p.line}:{p.col}: {p.code}" for p in info.value.problems]


def test_every_problem_is_located_at_once() -> None:
    got = _problems("""verify:
  rules:
    - name: a
      when: draft.p_badd > 0.5 || load["onprem-8x"].age_s > 1.0
      action: escalate
      escalate: {target: frontier-smal, fallbacks: [frontier-large, frontier-large]}
    - name: b
      action: escalate
    - name: c
      action: accept
      escalate: {target: frontier-small}
""")
    assert got == ["9:19: unknown-signal", "9:40: unknown-target", "11:26: unknown-target", "11:69: duplicate-fallback",
                   "13:15: missing-key", "14:13: unreachable-rule", "16:17: invalid-value"]


def test_a_default_is_required_and_draft_is_verify_only() -> None:
    assert _problems("""verify:
  rules:
    - name: a
      when: draft.refusal
      action: accept
""") == ["7:3: missing-default"]
    with pytest.raises(PolicyError, match=r"p.yaml:5:11: unknown-signal: 'draft' is readable in the verify "):
        compile_policy(HEAD.replace("    route: {target: onprem-8b}", "    when: draft.refusal\n"
                                    "    route: {target: onprem-8b}\n  - name: d\n    route: {target: onprem-8b}"),
                       FLEET, "p.yaml")


def test_type_errors_and_relative_names_in_accept_rules() -> None:
    assert _problems("""verify:
  rules:
    - name: a
      when: draft.tokens > "100"
      action: accept
    - name: b
      when: cache.prefix_hit_ratio > 0.5
      action: accept
    - name: z
      action: accept
""") == ["9:13: type-error", "12:13: unknown-signal"]


def test_verdicts_follow_rule_order_and_eligibility() -> None:
    policy = compile_policy(HEAD + """verify:
  rules:
    - name: broken
      when: draft.refusal || draft.logprob_mean < -2.0
      action: escalate
      escalate: {target: frontier-small, fallbacks: [frontier-large]}
    - name: accept
      action: accept
""", FLEET, "p.yaml")
    signals = example_signals(policy.variables, FLEET.targets)
    base = {"request": signals["request"], "difficulty": signals["difficulty"]}
    source = StaticSignals(FLEET, policy, signals)
    ok = judge(FLEET, policy, base, source, example_draft())
    assert (ok.action, rule_name(ok)) == ("accept", "accept")
    bad = judge(FLEET, policy, base, source, {**example_draft(), "refusal": True})
    assert (bad.action, bad.target, [t for t, _ in bad.fallbacks]) == ("escalate", "frontier-small", ["frontier-large"])
    # a null log-probability mean errors at run time: the rule is skipped and named
    null = judge(FLEET, policy, base, source, {**example_draft(), "logprob_mean": None})
    assert null.action == "accept" and null.results[0].result == "error" and "logprob_mean" in str(null.results[0].error)
    # the frontier tiers are ineligible (a prompt larger than their context windows): no escalation
    huge = {**signals, "request": {**signals["request"], "prompt_tokens": 10_000_000}}
    none = judge(FLEET, policy, {"request": huge["request"], "difficulty": signals["difficulty"]},
                 StaticSignals(FLEET, policy, huge), {**example_draft(), "refusal": True})
    assert (none.action, none.results[0].result, rule_name(none)) == ("accept", "no-eligible-target", "accept")
    no_section = compile_policy(HEAD, FLEET, "p.yaml")
    assert rule_name(judge(FLEET, no_section, base, source, example_draft())) == "no-verify-section"
