"""Rule evaluation: first match wins, run-time errors skip the rule and are named."""

import pytest

from pointsman.policy.fleet import load_fleet
from pointsman.policy.rules.compiler import compile_policy
from pointsman.policy.rules.evaluator import evaluate
from pointsman.policy.selection.filters import Exclusion, NoEligibleTarget
from pointsman.policy.signals.namespaces import example_signals

HEAD = "apiVersion: pointsman/v1\nkind: RoutingPolicy\n"


@pytest.fixture(scope="module")
def fleet():
    return load_fleet()


def snapshot(p_hard=0.5, available=True, **request):
    s = example_signals()
    s["difficulty"] = {"p_hard": p_hard, "available": available}
    s["request"].update(request)
    return s


POLICY = HEAD + """\
variables: {hard: 0.6}
rules:
  - name: hard
    when: difficulty.p_hard >= variables.hard
    route: {target: frontier-large, fallbacks: [onprem-70b, frontier-small]}
  - name: long
    when: request.prompt_tokens > 1000
    route: {target: onprem-70b, mode: disaggregated, fallbacks: [frontier-small]}
  - name: default
    route: {target: onprem-8b}
"""


def test_first_match_wins(fleet):
    policy = compile_policy(POLICY, fleet)
    v = evaluate(policy, snapshot(p_hard=0.9, prompt_tokens=5000))
    assert (v.target, v.mode, v.rule.name) == ("frontier-large", "aggregated", "hard")
    assert [r.to_dict() for r in v.results] == [{"rule": "hard", "result": "matched"}]
    v = evaluate(policy, snapshot(p_hard=0.1, prompt_tokens=5000))
    assert (v.target, v.mode, v.rule.name) == ("onprem-70b", "disaggregated", "long")
    assert v.fallbacks == (("frontier-small", "aggregated"),)
    v = evaluate(policy, snapshot(p_hard=0.1, prompt_tokens=10))
    assert (v.target, v.rule.name) == ("onprem-8b", "default")
    assert [r.result for r in v.results] == ["no-match", "no-match", "matched"]


def test_runtime_error_skips_the_rule_and_names_it(fleet):
    policy = compile_policy(POLICY, fleet)
    v = evaluate(policy, snapshot(p_hard=None, available=False, prompt_tokens=10))
    assert v.rule.name == "default"
    assert v.skipped == ["hard"]
    assert v.results[0].to_dict() == {"rule": "hard", "result": "error",
                                      "error": "no such overload: difficulty.p_hard is null"}


def test_non_boolean_result_at_run_time_is_an_error(fleet):
    text = HEAD + 'rules:\n  - name: odd\n    when: \'request.tenant == "globex" ? 1 : false\'\n    route: {target: frontier-large}\n  - name: default\n    route: {target: onprem-8b}\n'
    policy = compile_policy(text, fleet)  # the probes (tenants "" and "acme") give false: compiles
    v = evaluate(policy, snapshot(tenant="globex"))
    assert v.rule.name == "default"
    assert v.results[0].to_dict() == {"rule": "odd", "result": "error", "error": "condition gave int, not a boolean"}


def test_cost_function(fleet):
    text = HEAD + 'rules:\n  - name: cheap-enough\n    when: cost("frontier-large") < 0.01\n    route: {target: frontier-large}\n  - name: default\n    route: {target: onprem-8b}\n'
    policy = compile_policy(text, fleet)
    assert policy.uses_cost
    assert evaluate(policy, snapshot(), {"frontier-large": 0.005}).target == "frontier-large"
    assert evaluate(policy, snapshot(), {"frontier-large": 0.02}).target == "onprem-8b"
    v = evaluate(policy, snapshot(), {})
    assert v.results[0].result == "error" and v.results[0].error == "cost(): unknown target 'frontier-large'"


def test_ineligible_target_takes_the_first_eligible_fallback(fleet):
    policy = compile_policy(POLICY, fleet)
    excl = {"frontier-large": Exclusion("context-window", "too long"), "onprem-70b": Exclusion("capabilities", "no images")}
    v = evaluate(policy, snapshot(p_hard=0.9), None, excl)
    assert (v.target, v.rule.name, v.fallbacks) == ("frontier-small", "hard", ())
    assert v.results[0].note == "frontier-large ineligible (context-window: too long); took fallback frontier-small"


def test_rule_with_no_eligible_target_is_passed_over(fleet):
    policy = compile_policy(POLICY, fleet)
    excl = {t: Exclusion("capabilities", "no") for t in ("frontier-large", "onprem-70b", "frontier-small")}
    v = evaluate(policy, snapshot(p_hard=0.9), None, excl)
    assert v.target == "onprem-8b"
    assert v.results[0].result == "no-eligible-target"


def test_nothing_eligible_raises_and_names_filters(fleet):
    policy = compile_policy(POLICY, fleet)
    excl = {t: Exclusion("context-window", "needs more") for t in fleet.targets}
    with pytest.raises(NoEligibleTarget, match=r"no eligible target: frontier-large \(context-window: needs more\)"):
        evaluate(policy, snapshot(p_hard=0.9), None, excl)
