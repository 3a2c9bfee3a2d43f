"""Policy compilation: every problem at once, located inside the YAML, with did-you-mean."""

import json
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from pointsman.errors import PolicyError
from pointsman.policy.fleet import load_fleet
from pointsman.policy.rules.compiler import STATIC_POLICY_PATH, compile_policy, load_policy

HEAD = "apiVersion: pointsman/v1\nkind: RoutingPolicy\n"
DEFAULT_RULE = "  - name: default\n    route: {target: onprem-8b}\n"


@pytest.fixture(scope="module")
def fleet():
    return load_fleet()


def problems(text: str, fleet, file: str = "p.yaml") -> list[str]:
    with pytest.raises(PolicyError) as info:
        compile_policy(text, fleet, file)
    return [str(p) for p in info.value.problems]


def test_default_policy_compiles(fleet):
    policy = load_policy(STATIC_POLICY_PATH, fleet)
    assert [r.name for r in policy.rules] == [
        "estimator-unavailable", "hard-prompt", "long-cold-prompt", "long-warm-prompt", "medium-prompt", "default"]
    assert policy.rules[-1].program is None
    assert policy.rules[2].mode == "disaggregated" and policy.rules[2].role == "decode"
    assert policy.rules[1].signals == ("difficulty.p_hard", "variables.p_hard_frontier")
    assert policy.rules[2].signals == ("request.prompt_tokens", "variables.long_prompt_tokens",
                                       "cache.prefix_hit_ratio", "variables.local_hit_ratio")
    # rule:long-cold-prompt expands to its target (already there, dropped) and its fallbacks
    assert policy.rules[3].candidates == (("onprem-70b", "aggregated"), ("frontier-small", "aggregated"))
    assert policy.context_plan == {
        "difficulty": {"available", "p_hard"}, "request": {"prompt_tokens"},
        "variables": {"p_hard_frontier", "p_hard_onprem_large", "long_prompt_tokens", "local_hit_ratio"},
        "_cache": {"onprem-70b": {"prefix_hit_ratio"}}}
    assert policy.fleet_revision == fleet.revision


def test_every_problem_at_once(fleet, tmp_path: Path):
    text = HEAD + """\
variables:
  thr: 0.6
rules:
  - name: hard
    when: difficulty.p_hard >= variables.thrr
    route: {target: frontier-larg}
  - name: syntax
    when: request.prompt_tokens >= 512 &&
    route: {target: onprem-8b, mode: disaggregated}
  - name: sig
    when: |
      request.has_tool ||
        request.prompt_tokens > 10 && cost("frontier-smal") < 1.0
    route: {target: onprem-70b, fallbacks: [onprem-70b, frontier-small]}
    lables: {a: b}
  - name: typed
    when: difficulty.p_hard >= "0.5"
    route: {target: onprem-8b}
  - name: notbool
    when: request.prompt_tokens
    route: {target: onprem-8b}
  - name: fn
    when: max(1, 2) > 1 && thr > 1
    route: {target: onprem-8b}
  - name: default
    route: {target: onprem-8b}
  - name: after
    when: "true"
    route: {target: onprem-8b}
"""
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(PolicyError) as info:
        load_policy(path, fleet)
    f = str(path)
    assert [str(p) for p in info.value.problems] == [
        f"{f}:7:42: unknown-variable: unknown variable 'variables.thrr'; did you mean 'variables.thr'?",
        f"{f}:8:21: unknown-target: unknown target 'frontier-larg'; did you mean 'frontier-large'? "
        "(the fleet has onprem-8b, onprem-70b, frontier-small, frontier-large)",
        f"{f}:10:42: cel-syntax: the expression ends too early (an operand or ')' is missing)",
        f"{f}:11:38: unsupported-mode: target 'onprem-8b' does not support mode 'disaggregated' (it supports aggregated)",
        f"{f}:14:15: unknown-signal: unknown signal 'request.has_tool'; did you mean 'request.has_tools'?",
        f"{f}:15:45: unknown-target: unknown target 'frontier-smal' in cost(); did you mean 'frontier-small'?",
        f"{f}:16:45: duplicate-fallback: 'onprem-70b' is already the rule's target or an earlier fallback",
        f"{f}:17:5: unknown-key: unknown key 'lables' in rules[2]; did you mean 'labels'?",
        f"{f}:19:11: type-error: an operator or function is applied to mismatched types "
        "(CEL never converts between int, double and string; use double(x), int(x) or string(x))",
        f"{f}:22:11: not-boolean: condition must be true or false, but gives int 100 on a typical request",
        f"{f}:25:11: unknown-function: unknown function 'max'; did you mean 'map'?",
        f"{f}:25:28: unknown-signal: unknown name 'thr'; did you mean 'variables.thr'?",
        f"{f}:29:11: unreachable-rule: rule 'after' comes after the unconditional rule 'default' (line 27) "
        "and can never match",
    ]


def test_cel_syntax_error_inside_a_multiline_block_scalar(fleet):
    text = HEAD + "rules:\n  - name: r\n    when: >-\n      request.prompt_tokens > 10 &&\n      (difficulty.p_hard < 0.5\n    route: {target: onprem-8b}\n" + DEFAULT_RULE
    # folded: the CEL source is one line; the error (missing ')' at the end) maps back to line 7
    assert problems(text, fleet) == ["p.yaml:7:31: cel-syntax: missing ')' at '<EOF>'"]


def test_cel_syntax_error_inside_a_quoted_scalar(fleet):
    text = HEAD + 'rules:\n  - name: r\n    when: "request.tenant == \\"a\\" && @"\n    route: {target: onprem-8b}\n' + DEFAULT_RULE
    got = problems(text, fleet)
    assert len(got) == 1 and got[0] == "p.yaml:5:39: cel-syntax: token recognition error at: '@'"


def test_missing_default(fleet):
    text = HEAD + "rules:\n  - name: r\n    when: difficulty.p_hard > 0.5\n    route: {target: onprem-8b}\n"
    assert problems(text, fleet) == [
        "p.yaml:3:1: missing-default: no unconditional rule: end the rules with one that has no 'when' "
        "(e.g. name: default)"]


def test_reserved_var_gets_a_hint(fleet):
    text = HEAD + "rules:\n  - name: r\n    when: difficulty.p_hard > var.x\n    route: {target: onprem-8b}\n" + DEFAULT_RULE
    assert problems(text, fleet) == [
        "p.yaml:5:31: cel-syntax: reserved identifier: var (policy variables are read as variables.<name>)"]


def test_keyed_and_relative_signals_are_checked_with_did_you_mean(fleet):
    text = HEAD + """\
rules:
  - name: r
    when: load["onprem-70B"].num_requests_waiting > 32 || load["onprem-70b"].num_request_waiting > 1
    route: {target: onprem-8b}
  - name: s
    when: load.onprem_70b.age_s > 1.0 || cache.prefix_hit_ration > 0.5 || endpoint.kv_cache_usag > 0.9
    route: {target: onprem-8b}
  - name: t
    when: budget.remaining < 1.0
    route: {target: onprem-8b}
""" + DEFAULT_RULE
    assert problems(text, fleet) == [
        "p.yaml:5:16: unknown-target: unknown target 'onprem-70B' in load[]; did you mean 'onprem-70b'?",
        "p.yaml:5:78: unknown-signal: unknown signal 'load[\"onprem-70b\"].num_request_waiting'; "
        "did you mean 'num_requests_waiting'?",
        "p.yaml:8:16: unknown-signal: 'load' is keyed by target: write load[\"<target>\"].<field>",
        "p.yaml:8:48: unknown-signal: unknown signal 'cache.prefix_hit_ration'; did you mean 'cache.prefix_hit_ratio'?",
        "p.yaml:8:84: unknown-signal: unknown signal 'endpoint.kv_cache_usag'; did you mean 'endpoint.kv_cache_usage'?",
        "p.yaml:11:18: unknown-signal: unknown signal 'budget.remaining'; did you mean 'budget.remaining_usd'?",
    ]


def test_relative_signals_compile_per_rule_target(fleet):
    text = HEAD + """\
rules:
  - name: warm-70b
    when: cache.prefix_hit_ratio >= 0.8 && endpoint.num_requests_waiting < 4
    route: {target: onprem-70b, mode: disaggregated}
  - name: warm-8b
    when: cache.prefix_hit_ratio >= 0.8 && load["onprem-8b"].kv_cache_usage < 0.9
    route: {target: onprem-8b}
""" + DEFAULT_RULE
    policy = compile_policy(text, fleet)
    assert policy.context_plan == {
        "_cache": {"onprem-70b": {"prefix_hit_ratio"}, "onprem-8b": {"prefix_hit_ratio"}},
        "_endpoint": {"onprem-70b/decode": {"num_requests_waiting"}},
        "load": {"onprem-8b": {"kv_cache_usage"}}}
    assert policy.rules[0].signals == ("cache.prefix_hit_ratio", "endpoint.num_requests_waiting")
    assert policy.rules[1].signals == ("cache.prefix_hit_ratio", 'load["onprem-8b"].kv_cache_usage')


def test_fallback_rule_references_expand_and_cycles_are_errors(fleet):
    text = HEAD + """\
rules:
  - name: a
    when: difficulty.p_hard > 0.9
    route: {target: frontier-large, fallbacks: ["rule:b", frontier-small]}
  - name: b
    when: difficulty.p_hard > 0.5
    route: {target: onprem-70b, mode: auto, fallbacks: [{target: onprem-8b}, "rule:c"]}
  - name: c
    route: {target: frontier-small, fallbacks: [onprem-8b]}
"""
    policy = compile_policy(text, fleet)
    assert policy.rules[0].candidates == (("frontier-large", "aggregated"), ("onprem-70b", "auto"),
                                          ("onprem-8b", "aggregated"), ("frontier-small", "aggregated"))
    assert policy.rules[0].fallbacks == ("onprem-70b", "onprem-8b", "frontier-small")
    cyclic = text.replace("fallbacks: [onprem-8b]", 'fallbacks: ["rule:a"]').replace('"rule:c"]', '"rule:c", "rule:nope"]')
    assert problems(cyclic, fleet) == [
        "p.yaml:9:88: unknown-rule: unknown rule 'nope' in fallbacks",
        "p.yaml:11:49: fallback-cycle: fallbacks refer back to a rule being expanded: "
        "rule 'a' -> rule 'b' -> rule 'c' -> rule 'a'",
    ]


def test_settings_sections_are_validated(fleet):
    text = HEAD + """\
signals: {load: {max_age_s: 5, on_stale: saturatd}}
filters: {tenants: {frontier-larg: [acme]}, budgets: true}
endpoint_selection: {picker: min-cots}
disaggregation: {max_local_hit_ratio: 1.5}
rules:
""" + DEFAULT_RULE
    got = problems(text, fleet)
    assert got[0].startswith("p.yaml:3:42: invalid-value: signals.load.on_stale: Input should be 'unknown', 'saturated' or 'ignore'")
    assert got[1] == "p.yaml:4:45: unknown-key: unknown key 'budgets' in filters; did you mean 'budget'?"
    assert got[2] == "p.yaml:6:39: invalid-value: disaggregation.max_local_hit_ratio: Input should be less than or equal to 1"
    good = text.replace("saturatd", "saturated").replace(", budgets: true", "").replace("1.5", "0.7")
    got = problems(good, fleet)
    assert got == [
        "p.yaml:4:21: unknown-target: unknown target 'frontier-larg'; did you mean 'frontier-large'? "
        "(the fleet has onprem-8b, onprem-70b, frontier-small, frontier-large)",
        "p.yaml:5:30: unknown-picker: unknown picker 'min-cots'; did you mean 'min-cost'? (registered: min-cost, in-order)"]
    policy = compile_policy(good.replace("min-cots", "in-order").replace("frontier-larg", "frontier-large"), fleet)
    assert policy.staleness.on_stale == "saturated" and policy.staleness.max_age_s == 5
    assert policy.filters.tenants == {"frontier-large": ["acme"]}
    assert policy.disaggregation.max_local_hit_ratio == 0.7


def test_duplicate_rule_names_and_schema_errors_together(fleet):
    text = HEAD + "metadata: {nme: x}\nrules:\n  - name: a\n    when: true\n    route: {target: onprem-8b}\n  - name: a\n    route: {target: onprem-8b}\n"
    assert problems(text, fleet) == [
        "p.yaml:3:12: unknown-key: unknown key 'nme' in metadata; did you mean 'name'?",
        "p.yaml:8:11: duplicate-rule: rule name 'a' is already used at line 5",
        "p.yaml:8:11: unreachable-rule: rule 'a' comes after the unconditional rule 'a' (line 5) and can never match",
    ]


def test_wrong_kind_and_version(fleet):
    text = "apiVersion: pointsman/v2\nkind: Fleet\nrules:\n" + DEFAULT_RULE
    got = problems(text, fleet)
    assert got[0].startswith("p.yaml:1:13: invalid-value: apiVersion: Input should be 'pointsman/v1'")
    assert got[1].startswith("p.yaml:2:7: invalid-value: kind: Input should be 'RoutingPolicy'")


def test_macros_and_comments_are_understood(fleet):
    text = HEAD + """\
variables:
  vip_tenants: [acme, globex]
rules:
  - name: vip
    when: |
      // tenants that always get the best model
      variables.vip_tenants.exists(t, t == request.tenant) && size(request.tenant) > 0
    route: {target: frontier-large}
""" + DEFAULT_RULE
    policy = compile_policy(text, fleet)
    assert policy.rules[0].signals == ("variables.vip_tenants", "request.tenant")
    assert policy.context_plan == {"variables": {"vip_tenants"}, "request": {"tenant"}}


def test_when_true_is_unconditional_and_false_never_matches(fleet):
    text = HEAD + "rules:\n  - name: disabled\n    when: false\n    route: {target: frontier-large}\n  - name: all\n    when: true\n    route: {target: onprem-8b}\n"
    policy = compile_policy(text, fleet)
    assert policy.rules[0].when == "false" and policy.rules[0].program is not None
    assert policy.rules[1].program is None


def test_a_rule_with_its_own_errors_is_still_a_known_fallback_name(fleet):
    text = STATIC_POLICY_PATH.read_text(encoding="utf-8")
    typo = text.replace("mode: disaggregated, fallbacks: [frontier-small]", "mode: disagregated, fallbacks: [frontier-small]")
    assert typo != text
    found = problems(typo, fleet, "static.yaml")
    assert len(found) == 1 and found[0].startswith("static.yaml:51:39: "), found
    # an invalid unconditional rule still counts as the default: no spurious missing-default
    bad_default = HEAD + ("rules:\n  - name: a\n    when: request.turns > 1\n"
                          "    route: {target: onprem-8b, fallbacks: ['rule:default']}\n"
                          "  - name: default\n    route: {target: onprem-8b, mode: agregated}\n")
    found = problems(bad_default, fleet)
    assert len(found) == 1 and found[0].startswith("p.yaml:8:38: invalid-value: rules[1].route.mode"), found


@pytest.mark.parametrize("written, value", [("1e-3", 0.001), ("2.5E-1", 0.25), ("6.5e-1", 0.65), ("1.0e-3", 0.001)])
def test_an_exponent_threshold_is_a_number(fleet, written, value):
    """``1e-3`` is a float, as YAML 1.2 reads it (and ``pointsman calibrate`` may write a small
    threshold so); YAML 1.1 read it as a string, and the policy failed with a CEL type error at the
    rule that compared it."""
    text = STATIC_POLICY_PATH.read_text()
    line = next(x for x in text.splitlines() if x.strip().startswith("p_hard_frontier:"))
    policy = compile_policy(text.replace(line, f"  p_hard_frontier: {written}"), fleet, "policy.yaml")
    assert policy.variables["p_hard_frontier"] == value


def test_a_condition_that_reads_nothing_and_is_true_is_unconditional(fleet):
    """``when: "1 == 1"`` matches every request as a rule without ``when`` does: the rules after it can never
    match (before, ``policy check`` passed such a policy and its later rules were silently dead). A constant
    false one (a rule switched off) and conditions on variables (feature flags) are left as they are."""
    rules = ("rules:\n  - name: first\n    when: {when}\n    route: {{target: onprem-70b}}\n"
             "  - name: default\n    route: {{target: onprem-8b}}\n")
    assert problems(HEAD + rules.format(when='"1 == 1 && size(\\"ab\\") == 2"'), fleet) == [
        "p.yaml:7:11: unreachable-rule: rule 'default' comes after the unconditional rule 'first' (line 4) "
        "and can never match"]
    for when in ('"1 == 2"', "false", '"variables.flag == 1"', '"cost(\\"onprem-70b\\") >= 0.0"'):
        policy = compile_policy(HEAD + "variables: {flag: 1}\n" + rules.format(when=when), fleet, "p.yaml")
        assert [r.name for r in policy.rules] == ["first", "default"], when


def test_each_duplicate_fallback_is_flagged_once(tmp_path: Path):
    """``["rule:b", "rule:b"]`` passed ``policy check``: the check looked the bare name 'b' up among
    the ``rule:NAME`` strings it had seen; and ``"rule:frontier-large"`` (a rule named like a target)
    after the target ``frontier-large`` was a duplicate. Each duplicate once, at its own item, with a
    ``{target, mode}`` fallback and rule references mixed in."""
    from click.testing import CliRunner

    from pointsman.cli.main import main

    path = tmp_path / "p.yaml"
    path.write_text(HEAD + """\
rules:
  - name: a
    when: difficulty.p_hard > 0.9
    route:
      target: onprem-8b
      fallbacks: [{target: frontier-large, mode: aggregated}, "rule:b", "rule:frontier-large", frontier-large, "rule:b"]
  - name: b
    when: difficulty.p_hard > 0.5
    route: {target: onprem-70b}
  - name: frontier-large
    route: {target: frontier-large}
""")
    res = CliRunner().invoke(main, ["policy", "check", str(path)])
    assert res.exit_code == 1, res.output
    assert res.output.splitlines() == [
        f"{path}:8:96: duplicate-fallback: 'frontier-large' is already the rule's target or an earlier fallback",
        f"{path}:8:112: duplicate-fallback: 'rule:b' is already an earlier fallback",
    ]


MISSPELT_MODE = HEAD + """\
variables: {p_hard_frontier: 0.6}
rules:
  - name: hard-and-fast
    when: >-
      difficulty.p_hardd >= variables.p_hard_frontier &&
      predict["onprem-7b"].meets_slo
    route: {target: onprem-70b, mode: disagregated, fallbacks: [frontier-smal, {target: 5}]}
""" + DEFAULT_RULE


def test_a_rule_with_an_invalid_route_still_has_its_condition_and_fallbacks_checked(fleet):
    """An invalid ``route`` value (``mode: disagregated``) was the only problem reported for its rule: the
    condition's unknown signal and unknown target and the unknown fallback showed one rerun at a time."""
    assert problems(MISSPELT_MODE, fleet) == [
        "p.yaml:7:18: unknown-signal: unknown signal 'difficulty.p_hardd'; did you mean 'difficulty.p_hard'?",
        "p.yaml:8:15: unknown-target: unknown target 'onprem-7b' in predict[]; did you mean 'onprem-70b'?",
        "p.yaml:9:39: invalid-value: rules[0].route.mode: Input should be 'aggregated', 'disaggregated' or 'auto'",
        "p.yaml:9:65: unknown-target: unknown target 'frontier-smal'; did you mean 'frontier-small'? "
        "(the fleet has onprem-8b, onprem-70b, frontier-small, frontier-large)",
        "p.yaml:9:80: invalid-value: rules[0].route.fallbacks[1]: Input should be a valid string",
        "p.yaml:9:89: invalid-value: rules[0].route.fallbacks[1].target: Input should be a valid string",
    ]
    # a rule that cannot be read as one (no route): its condition is checked all the same
    no_route = HEAD + "rules:\n  - name: a\n    when: difficulty.p_hardd > 0.5\n" + DEFAULT_RULE
    assert problems(no_route, fleet) == [
        "p.yaml:4:5: missing-key: missing required key 'route' in rules[0]",
        "p.yaml:5:22: unknown-signal: unknown signal 'difficulty.p_hardd'; did you mean 'difficulty.p_hard'?",
    ]


_TERMS = ["difficulty.p_hard > 0.5", "difficulty.p_hardd > 0.5", 'predict["onprem-7b"].meets_slo',
          'predict["onprem-70b"].meets_slo', 'cost("frontier-larg") < 1.0', "request.prompt_tokens > 10",
          "cache.prefix_hit_ratioo > 0.5", "variables.thrr > 1", "difficulty.p_hard >= \"0.5\"", "1 / 0 > 1"]
_FALLBACKS = ["frontier-small", "frontier-smal", "rule:default", "rule:defualt", "onprem-70b", "{target: 5}"]


@settings(max_examples=40, deadline=None)
@given(terms=st.lists(st.sampled_from(_TERMS), min_size=1, max_size=3),
       fallbacks=st.lists(st.sampled_from(_FALLBACKS), max_size=3),
       broken=st.sampled_from(["mode: agregated", "mode: 5", "mode: [auto]", "colour: red"]))
def test_an_invalid_route_value_hides_none_of_the_rules_other_problems(terms, fallbacks, broken):
    """Property: a rule whose route has one more invalid value (at its end: nothing else moves) is reported
    with every problem it had without it (its condition's, its target's and fallbacks'), plus that value's."""
    fleet = load_fleet()

    def found(extra: str) -> set[str]:
        text = HEAD + f"""\
variables: {{thr: 1}}
rules:
  - name: r
    when: '{" && ".join(terms)}'
    route: {{target: onprem-70b, fallbacks: [{", ".join(fallbacks)}]{extra}}}
""" + DEFAULT_RULE
        try:
            compile_policy(text, fleet, "p.yaml")
        except PolicyError as exc:
            return {str(p) for p in exc.problems}
        return set()

    valid, invalid = found(""), found(f", {broken}")
    assert valid < invalid, (valid, invalid)
    assert all(p.startswith("p.yaml:7:") and ("route.mode" in p or "colour" in p) for p in invalid - valid)


def test_a_verify_rule_with_an_invalid_action_hides_no_problem_of_the_section(fleet):
    """One verify rule's invalid ``action`` used to leave the whole verify section unchecked: its own
    condition and escalation target, and the other verify rules' problems, showed one rerun at a time."""
    text = HEAD + "rules:\n" + DEFAULT_RULE + """\
verify:
  rules:
    - name: broken
      when: draft.refusall
      action: escalat
      escalate: {target: frontier-smal}
    - name: other
      when: draft.emptyy
      action: escalate
      escalate: {target: frontier-small}
    - name: accept
      action: accept
"""
    assert problems(text, fleet) == [
        "p.yaml:9:19: unknown-signal: unknown signal 'draft.refusall'; did you mean 'draft.refusal'?",
        "p.yaml:10:15: invalid-value: verify.rules[0].action: Input should be 'accept' or 'escalate'",
        "p.yaml:11:26: unknown-target: unknown target 'frontier-smal'; did you mean 'frontier-small'? "
        "(the fleet has onprem-8b, onprem-70b, frontier-small, frontier-large)",
        "p.yaml:13:19: unknown-signal: unknown signal 'draft.emptyy'; did you mean 'draft.empty'?",
    ]
    # an unconditional verify rule that cannot be read (no action) still counts as the default
    no_action = text.replace("      action: accept\n", "")
    assert [p.split(": ")[1] for p in problems(no_action, fleet)] == [
        "unknown-signal", "invalid-value", "unknown-target", "unknown-signal", "missing-key"]


_scalars = st.one_of(st.none(), st.booleans(), st.integers(-2, 2), st.sampled_from(
    ["onprem-70b", "frontier-smal", "rule:default", "rule:x", "disagregated", "auto", "difficulty.p_hardd > 1",
     "request.prompt_tokens > 1", "a b", ""]))
_values = st.recursive(_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(["target", "mode", "fallbacks", "x"]), inner, max_size=3)),
    max_leaves=6)


@settings(max_examples=150, deadline=None)
@given(rule=st.dictionaries(st.sampled_from(["name", "when", "route", "labels", "if_fleet_has", "action", "escalate",
                                             "colour"]), _values, max_size=6), in_verify=st.booleans())
def test_any_rule_is_reported_never_crashes_the_compile(rule, in_verify):
    """Property: whatever a rule holds (invalid values at any depth), compiling reports problems
    (``PolicyError``) or compiles; checking what is valid in an invalid rule raises nothing else."""
    doc = {"apiVersion": "pointsman/v1", "kind": "RoutingPolicy",
           "rules": [{"name": "default", "route": {"target": "onprem-8b"}}]}
    if in_verify:
        doc["verify"] = {"rules": [rule, {"name": "accept", "action": "accept"}]}
    else:
        doc["rules"].insert(0, rule)
    try:
        compile_policy(yaml.safe_dump(doc), load_fleet(), "p.yaml")
    except PolicyError:
        pass


#: Nullable signals (null when nothing reports them) as a condition writes them, and the literals compared.
NULLABLE = ['load["onprem-70b"].num_requests_waiting', 'load["onprem-8b"].ttft_p50_ms', "endpoint.kv_cache_usage",
            "difficulty.p_hard", 'predict["onprem-70b"].aggregated_ttft_s']


@settings(max_examples=25, deadline=None)
@given(signal=st.sampled_from(NULLABLE), literal=st.sampled_from(["0", "0.5", "3", "1e3"]),
       flipped=st.booleans())
def test_inequality_with_a_nullable_signal_is_named(fleet, signal: str, literal: str, flipped: bool) -> None:
    """``x != 0`` is true in CEL when ``x`` is null (nothing reports it), not an error: the rule would fire
    on an idle fleet without telemetry (a busy-pool overflow sending every request to the paid tier),
    where the docs promise a null compared skips the rule. ``policy check`` names it, located at the
    signal; a guard against null (``x != null && ...``) or an ordering comparison is fine."""
    cond = f"{literal} != {signal}" if flipped else f"{signal} != {literal}"
    text = HEAD + f"rules:\n  - name: r\n    when: '{cond}'\n    route: {{target: onprem-70b}}\n" + DEFAULT_RULE
    got = problems(text, fleet)
    col = 11 + (len(literal) + 4 if flipped else 0) + 1
    assert any(p.startswith(f"p.yaml:5:{col}: null-inequality: '{signal}' is null when unknown") for p in got), got
    for fine in (f"{signal} != null && {signal} != {literal}", f"{signal} == {literal}", f"{signal} > 0"):
        text = HEAD + f"rules:\n  - name: r\n    when: '{fine}'\n    route: {{target: onprem-70b}}\n" + DEFAULT_RULE
        try:
            compile_policy(text, fleet)
        except PolicyError as exc:
            assert not any(p.code == "null-inequality" for p in exc.problems), exc


def test_a_null_inequality_would_have_routed_an_idle_fleet_to_the_frontier(fleet) -> None:
    """What the check prevents, on the engine itself: no telemetry, so the 70B pool's waiting count is null and
    ``!= 0`` is true; without the check the overflow rule fired on an idle fleet."""
    from pointsman.estimator.estimate import FixedDifficulty
    from pointsman.policy.engine import RoutingEngine
    from pointsman.request import parse_route_request

    text = HEAD + ('rules:\n  - name: overflow\n    when: load["onprem-70b"].num_requests_waiting != 0\n'
                   "    route: {target: frontier-small}\n  - name: default\n    route: {target: onprem-70b}\n")
    with pytest.raises(PolicyError) as info:
        compile_policy(text, fleet)
    assert [p.code for p in info.value.problems] == ["null-inequality"]
    guarded = text.replace("num_requests_waiting != 0", 'num_requests_waiting != null && load["onprem-70b"]'
                           ".num_requests_waiting != 0")
    engine = RoutingEngine(fleet, compile_policy(guarded, fleet), FixedDifficulty(0.3))
    d = engine.route(parse_route_request({"messages": [{"role": "user", "content": "hi"}]}), dispatch=False)
    assert (d.rule, d.target) == ("default", "onprem-70b")


@pytest.mark.parametrize("field", ["disaggregated_ttft_s", "disaggregated_tpot_s"])
def test_a_null_on_the_typical_probe_is_not_a_type_error(fleet, field: str) -> None:
    """``predict["onprem-70b"].disaggregated_ttft_s`` is null on the typical probe (an idle target's prediction
    is aggregated) and a double on the busy one and on the engine (0.0026 s on an idle fleet). ``policy check``
    rejected ``< 5.0`` on it as a type-error advising conversions; a null makes an error of that probe only.
    On onprem-8b (no prefill/decode pools) it is null on every request: an always-error, not a type-error."""
    from pointsman.estimator.estimate import FixedDifficulty
    from pointsman.policy.engine import RoutingEngine
    from pointsman.request import parse_route_request

    rule = f'  - name: pd\n    when: predict["{{t}}"].{field} < 5.0\n    route: {{{{target: onprem-70b, mode: disaggregated}}}}\n'
    policy = compile_policy(HEAD + "rules:\n" + rule.format(t="onprem-70b") + DEFAULT_RULE, fleet)
    engine = RoutingEngine(fleet, policy, FixedDifficulty(0.3))
    d = engine.route(parse_route_request({"messages": [{"role": "user", "content": "hi"}]}), dispatch=False)
    assert (d.rule, d.target) == ("pd", "onprem-70b")
    got = problems(HEAD + "rules:\n" + rule.format(t="onprem-8b") + DEFAULT_RULE, fleet)
    assert [p.split(": ")[1] for p in got] == ["always-error"], got


#: A condition's nullable signal (by target and flat) and a second signal compared with it; what the engine reads.
_SIGNALS = {'load["onprem-70b"].num_requests_waiting': ("load", "onprem-70b", "num_requests_waiting"),
            "difficulty.p_hard": ("difficulty", None, "p_hard")}
_OTHER = 'load["onprem-8b"].ttft_p50_ms'


def _atoms(signal: str) -> st.SearchStrategy[str]:
    """Comparisons of ``signal`` (either side, a literal or another nullable signal), two non-null booleans, the
    signal in a macro (``exists``, ``all``, ``exists_one``, over a list holding it or compared inside) or ``has()``."""
    lit = st.sampled_from(["0", "1", "0.5"])
    op = st.sampled_from(["==", "!="])
    return st.one_of(
        st.sampled_from(["request.has_tools", "request.has_images", f"has({signal})"]),
        st.builds(lambda op, x, flip: f"{x} {op} {signal}" if flip else f"{signal} {op} {x}",
                  op, st.one_of(lit, st.just(_OTHER)), st.booleans()),
        st.builds(lambda xs, neg: f"{'!' if neg else ''}({signal} in [{xs}])", lit, st.booleans()),
        st.builds(lambda neg, macro, op, x, inside: f"{'!' if neg else ''}"
                  + (f"[{signal}].{macro}(v, v {op} {x})" if inside else f"[{x}].{macro}(v, v {op} {signal})"),
                  st.booleans(), st.sampled_from(["exists", "all", "exists_one"]), op, lit, st.booleans()))


def _formulas(signal: str) -> st.SearchStrategy[str]:
    """``&&``, ``||``, ``!``, a ternary and an equality with a boolean literal over ``_atoms``, at any depth."""
    return st.recursive(_atoms(signal), lambda inner: st.one_of(
        st.builds(lambda a, b, op: f"({a} {op} {b})", inner, inner, st.sampled_from(["&&", "||"])),
        st.builds(lambda a, n: f"{'!' * n}({a})", inner, st.integers(1, 2)),
        st.builds(lambda a, b, c: f"(({a}) ? ({b}) : ({c}))", inner, inner, inner),
        st.builds(lambda a, op, b, flip: f"({b} {op} ({a}))" if flip else f"(({a}) {op} {b})",
                  inner, st.sampled_from(["==", "!="]), st.sampled_from(["true", "false"]), st.booleans())),
        max_leaves=5)


#: Values of the other nullable signal the properties try: the numbers the check tries for a condition whose
#: literals are 0, 1 and 0.5 (each, its negation, +-1), and null.
_OTHER_VALUES = (None, -2.0, -1.5, -1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0)


def _runs(cond: str, signal: str):
    """run(value of ``signal``, has_tools, has_images, value of ``_OTHER``) -> what CEL makes of ``cond`` (None on
    an error)."""
    from cel import cel

    program = cel.compile(cond)
    root, key, field = _SIGNALS[signal]

    def run(value: object, tools: bool, images: bool, other: object = 1.0) -> object:
        ns: dict[str, object] = {field: value}
        load = {"onprem-8b": {"ttft_p50_ms": other}}
        ctx = {"request": {"has_tools": tools, "has_images": images}, "load": load}
        if key is None:
            ctx[root] = ns
        else:
            load[key] = ns
        try:
            return program.execute(cel.Context(ctx))
        except Exception:  # noqa: BLE001 - an error: the rule is skipped
            return None

    return run


def _fires_on_null(cond: str, signal: str) -> bool:
    """Whether some request (its booleans) and some value of ``signal`` make ``cond`` true with the signal null
    and false with the value: the rule fires because nothing reports it."""
    run = _runs(cond, signal)
    return any(run(None, t, i) is True and run(v, t, i) is False
               for t in (False, True) for i in (False, True) for v in (0, 1, 0.5, 7))


def _true_on_null(cond: str, signal: str) -> bool:
    """Whether ``cond`` is true with ``signal`` null for some request and value of ``_OTHER`` (``_OTHER_VALUES``)."""
    run = _runs(cond, signal)
    return any(run(None, t, i, o) is True for t in (False, True) for i in (False, True) for o in _OTHER_VALUES)


@settings(max_examples=300, deadline=None)
@given(data=st.data(), signal=st.sampled_from(sorted(_SIGNALS)))
def test_every_condition_that_fires_on_a_null_signal_is_named(fleet, data, signal: str) -> None:
    """Property: a condition over a nullable signal (``==``, ``!=``, ``in``, ``exists``/``all``/``exists_one``,
    ``has()``, with literals or another nullable signal, joined by ``&&``, ``||``, ``!``, ternaries and ``==``/``!=``
    with ``true``/``false`` at any depth) that CEL makes true with the signal null where a reported value makes it
    false is a ``null-inequality`` naming that signal; and one named is true with the signal null for some request
    (no false alarm on a condition false at null: ``x != 0 ? false : true``, ``x != 0 && !(x != 0)`` were named).
    The check read ``!=`` and a negated ``==``/``in`` only: ``(x == 0) == false``, ``x == 0 ? false : true``,
    ``[x].exists(v, v != 0)``, ``![0].exists(v, v == x)`` passed ``policy check``. A comparison with ``null`` is
    not generated: it handles the null as its author means (``x == null ? true : x > 3`` is not named)."""
    cond = data.draw(_formulas(signal))
    try:
        compile_policy(HEAD + f"rules:\n  - name: r\n    when: '{cond}'\n    route: {{target: onprem-70b}}\n"
                       + DEFAULT_RULE, fleet)
        named = False
    except PolicyError as exc:
        named = any(p.code == "null-inequality" and p.message.startswith(f"'{signal}'") for p in exc.problems)
    if _fires_on_null(cond, signal):
        assert named, cond
    if named:
        assert _true_on_null(cond, signal), cond


def test_policy_check_names_a_negated_equality_and_two_signals_compared(tmp_path: Path) -> None:
    """Through ``pointsman policy check``: the forms the check missed (a negated equality, two signals compared, an
    equality with ``false``, a ternary, a macro), each located at its nullable signal; a condition false at null
    (``x != 0 ? false : true``, named before) or handling the null itself is not named."""
    from click.testing import CliRunner

    from pointsman.cli.main import main

    waiting = 'load["onprem-70b"].num_requests_waiting'
    for when, cols in ((f"!({waiting} == 0)", [14]), (f"{waiting} != {_OTHER}", [12, 55]),
                       (f"!(request.turns > 1 && {waiting} == 0)", [35]), (f"!({waiting} != 0)", []),
                       (f"({waiting} == 0) == false", [13]), (f"{waiting} == 0 ? false : true", [12]),
                       (f"[{waiting}].exists(v, v != 0)", [13]), (f"![0].exists(v, v == {waiting})", [32]),
                       (f"{waiting} != 0 ? false : true", []), (f"{waiting} == null ? true : {waiting} > 3", [])):
        path = tmp_path / "p.yaml"
        path.write_text(HEAD + f"rules:\n  - name: r\n    when: '{when}'\n    route: {{target: frontier-small}}\n"
                        + DEFAULT_RULE)
        res = CliRunner().invoke(main, ["policy", "check", str(path)])
        assert res.exit_code == (1 if cols else 0), (when, res.output)
        got = [line.split(": ")[0] for line in res.output.splitlines() if "null-inequality" in line]
        assert got == [f"{path}:5:{c}" for c in cols], (when, res.output)


@pytest.mark.parametrize("where", ["rules", "verify"])
@pytest.mark.parametrize("when", ["1", "0", "2.5", "[true]"])
def test_a_when_that_is_not_a_condition_is_refused(fleet, where: str, when: str) -> None:
    """``when: 1`` read as ``true`` (pydantic's lax bool): an author's typo became a catch-all rule. Anything but
    a CEL string, ``true``, ``false`` or nothing is an ``invalid-value`` now."""
    if where == "rules":
        text = HEAD + f"rules:\n  - name: r\n    when: {when}\n    route: {{target: frontier-small}}\n" + DEFAULT_RULE
    else:
        text = HEAD + DEFAULT_RULE.join(["rules:\n", ""]) + (
            f"verify:\n  rules:\n    - name: r\n      when: {when}\n      action: accept\n"
            "    - name: accept\n      action: accept\n")
    found = [p for p in problems(text, fleet) if "invalid-value" in p]
    assert len(found) == 1 and "when: must be a CEL condition (a string), true or false" in found[0], found


@pytest.mark.parametrize("when", ['"true"', "true", "' true '"])
def test_an_invalid_rule_written_when_true_is_still_the_default(tmp_path: Path, when: str) -> None:
    """A last rule that fails validation alone (no ``route``) and is written ``when: "true"`` is the default as one
    without ``when`` is: ``policy check`` listed a spurious ``missing-default`` beside the real problem."""
    from click.testing import CliRunner

    from pointsman.cli.main import main

    path = tmp_path / "p.yaml"
    path.write_text(HEAD + "rules:\n  - name: r\n    when: request.turns > 1\n    route: {target: frontier-small}\n"
                    f"  - name: default\n    when: {when}\n"
                    "verify:\n  rules:\n    - name: v\n      when: draft.empty\n      action: accept\n"
                    f"    - name: accept\n      when: {when}\n")
    res = CliRunner().invoke(main, ["policy", "check", str(path)])
    assert res.exit_code == 1
    assert [line.split(": ")[1] for line in res.output.splitlines()] == ["missing-key", "missing-key"], res.output


@pytest.mark.parametrize("word", ["yes", "Yes", "YES", "on", "On", "ON", "no", "No", "NO", "off", "Off", "OFF"])
@pytest.mark.parametrize("where", ["rules", "verify"])
def test_policy_check_refuses_a_when_written_as_a_yaml_11_boolean(tmp_path: Path, word: str, where: str) -> None:
    """``when: yes`` (or ``on``) was read as true, a rule that always fires, and ``when: no`` (or ``off``) as false,
    one that never does: PyYAML reads YAML 1.1's booleans. ``pointsman policy check`` refuses them, located at the
    value; before, ``no``/``off`` passed and ``yes``/``on`` made the next rule unreachable."""
    from click.testing import CliRunner

    from pointsman.cli.main import main

    path = tmp_path / "p.yaml"
    if where == "rules":
        path.write_text(HEAD + f"rules:\n  - name: r\n    when: {word}\n    route: {{target: frontier-small}}\n"
                        + DEFAULT_RULE)
        line, col, key = 5, 11, "rules[0].when"
    else:
        path.write_text(HEAD + "rules:\n" + DEFAULT_RULE + f"verify:\n  rules:\n    - name: v\n      when: {word}\n"
                        "      action: accept\n    - name: accept\n      action: accept\n")
        line, col, key = 9, 13, "verify.rules[0].when"
    res = CliRunner().invoke(main, ["policy", "check", str(path)])
    assert res.exit_code == 1, res.output
    assert res.output.splitlines() == [f"{path}:{line}:{col}: invalid-value: {key}: '{word}' is a YAML 1.1 boolean ("
                                       f"{'always' if word.lower() in ('yes', 'on') else 'never'} fires); write true "
                                       "or false, or quote a CEL condition"], res.output


@pytest.mark.parametrize("word", ["true", "True", "TRUE", "false", "False", "FALSE", "'yes'"])
def test_policy_check_keeps_a_when_written_true_or_false(tmp_path: Path, word: str) -> None:
    """``true`` and ``false`` (YAML 1.2's booleans too) stay a ``when``: the last rule's and verify rule's (true: the
    defaults; false: neither has one); a quoted ``'yes'`` is a CEL condition (an unknown name)."""
    from click.testing import CliRunner

    from pointsman.cli.main import main

    path = tmp_path / "p.yaml"
    path.write_text(HEAD + f"rules:\n  - name: default\n    when: {word}\n    route: {{target: onprem-8b}}\n"
                    f"verify:\n  rules:\n    - name: accept\n      when: {word}\n      action: accept\n")
    res = CliRunner().invoke(main, ["policy", "check", str(path)])
    if word.lower() == "true":
        assert res.exit_code == 0, res.output
    else:
        assert res.exit_code == 1 and "YAML 1.1" not in res.output, res.output


_FLEET = load_fleet()


@settings(max_examples=200, deadline=None)
@given(op=st.sampled_from(["<", "<=", ">", ">="]), number=st.sampled_from([-2, -1, -0.5, 0, 0.25, 1, 1.5, 45])
       | st.floats(-3, 3, allow_nan=False).map(lambda x: round(x, 3)), flipped=st.booleans())
def test_out_of_range_names_exactly_the_comparisons_no_fraction_decides(op, number, flipped):
    """A comparison of ``difficulty.p_hard`` (in [0, 1]) with a number is ``out-of-range`` exactly when every
    value in [0, 1] (both ends and a grid between them) gives it the same result, but for the guards at the ends
    (``>= 0``, ``<= 1``: always true, written on purpose)."""
    sides = (str(number), "difficulty.p_hard") if flipped else ("difficulty.p_hard", str(number))
    when = f"{sides[0]} {op} {sides[1]}"
    text = HEAD + f"rules:\n  - name: r\n    when: {when}\n    route: {{target: frontier-large}}\n" + DEFAULT_RULE
    try:
        compile_policy(text, _FLEET, "p.yaml")
        found: list[str] = []
    except PolicyError as exc:
        found = [str(p) for p in exc.problems]
    assert all(": out-of-range: " in p for p in found), found
    compare = {"<": float.__lt__, "<=": float.__le__, ">": float.__gt__, ">=": float.__ge__}[op]
    results = {compare(*((float(number), x / 1000) if flipped else (x / 1000, float(number)))) for x in range(1001)}
    normal = {"<": ">", "<=": ">=", ">": "<", ">=": "<="}[op] if flipped else op
    guard = (normal, float(number)) in ((">=", 0.0), ("<=", 1.0))
    assert bool(found) == (len(results) == 1 and not guard), (when, found)


def test_a_tenant_literal_not_in_nfc_is_refused_not_a_rule_that_never_fires(tmp_path: Path) -> None:
    """``request.tenant == "café"`` typed with a combining accent (or a zero-width space) was accepted by
    ``policy check``, and the rule fired for no request: the service reads ``routing.tenant`` in its NFC form
    without invisible characters, however the caller spells it. ``route --tenant`` with either spelling went to
    the next rule. Now ``policy check`` refuses it, located at the literal, naming the form to write, which fires."""
    from click.testing import CliRunner

    from pointsman.cli.main import main

    def route(policy: Path, tenant: str) -> str:
        res = CliRunner().invoke(main, ["route", "--policy", str(policy), "--tenant", tenant, "--json", "hi"])
        assert res.exit_code == 0, res.output
        return json.loads(res.output)["rule"]

    for literal, col in (("cafe\u0301", 29), ("ac\u200bme", 29)):
        policy = tmp_path / "p.yaml"
        policy.write_text(HEAD + f'rules:\n  - name: vip\n    when: request.tenant == "{literal}" && request.turns >= 1\n'
                          "    route: {target: frontier-small}\n" + DEFAULT_RULE, encoding="utf-8")
        res = CliRunner().invoke(main, ["policy", "check", str(policy)])
        assert res.exit_code == 1, res.output
        assert f"{policy}:5:{col}: non-canonical-string: {json.dumps(literal)}, not in the form request.tenant" in res.output
        fixed = json.loads(res.output.rsplit("write ", 1)[1])
        policy.write_text(policy.read_text(encoding="utf-8").replace(literal, fixed), encoding="utf-8")
        assert CliRunner().invoke(main, ["policy", "check", str(policy)]).exit_code == 0
        assert route(policy, literal) == route(policy, fixed) == "vip"


@settings(max_examples=60, deadline=None)
@given(name=st.lists(st.sampled_from(["a", "e", "A", "\u0301", "\u030a", "\u00e9", "\u00c5", "\u200b", "\ufeff", "\u00ad",
                                     "\u212b", "\u0065\u0301"]), min_size=1, max_size=5).map("".join),
       field=st.sampled_from(["tenant", "team", "session_id", "slo_class"]), held=st.sampled_from(["", "one", "list"]))
def test_a_routing_name_literal_that_compiles_matches_its_request(fleet, name: str, field: str, held: str) -> None:
    """Whatever string a condition compares a routing name with (a literal, or a variable holding it or a list
    with it): either ``policy check`` refuses it (``non-canonical-string``) or the request naming it (read as the
    service reads it, ``canonical``) matches."""
    from pointsman.policy.rules.evaluator import evaluate
    from pointsman.policy.signals.namespaces import example_signals
    from pointsman.request import canonical

    value = {"": json.dumps(name), "one": "variables.v", "list": "variables.v"}[held]
    op = "in" if held == "list" else "=="
    text = HEAD + f"variables: {{v: {json.dumps([name] if held == 'list' else name)}}}\n" \
        f"rules:\n  - name: r\n    when: 'request.{field} {op} {value}'\n    route: {{target: onprem-70b}}\n" + DEFAULT_RULE
    try:
        policy = compile_policy(text, fleet, "p.yaml")
    except PolicyError as exc:
        assert [p.code for p in exc.problems] == ["non-canonical-string"], exc
        return
    signals = example_signals()
    signals["request"][field] = canonical(name)
    assert evaluate(policy, signals).rule.name == "r"


def test_a_truncating_int_division_is_refused_not_a_rule_that_never_fires(tmp_path: Path) -> None:
    """``request.prompt_tokens / 1000 >= 0.5`` ("half a k tokens") passed ``policy check`` and fired for no prompt
    under 1,000 tokens: CEL divides two ints as ints (900 / 1000 is 0). Its cases file said so only for the case
    that tried it. Now ``policy check`` refuses it at the ``/``; the double division it suggests fires at 900."""
    from click.testing import CliRunner

    from pointsman.cli.main import main

    policy = tmp_path / "p.yaml"
    policy.write_text(HEAD + "rules:\n  - name: long\n    when: request.prompt_tokens / 1000 >= 0.5\n"
                      "    route: {target: frontier-small}\n" + DEFAULT_RULE)
    res = CliRunner().invoke(main, ["policy", "check", str(policy)])
    assert res.exit_code == 1, res.output
    assert f"{policy}:5:33: integer-division: 'request.prompt_tokens / 1000' divides two ints" in res.output, res.output
    (tmp_path / "p.cases.yaml").write_text("apiVersion: pointsman/v1\nkind: PolicyCases\npolicy: p.yaml\ncases:\n"
                                           "  - name: 900 tokens\n    signals: {request: {prompt_tokens: 900}}\n"
                                           "    expect: {rule: long}\n")
    policy.write_text(policy.read_text().replace("request.prompt_tokens / 1000", "double(request.prompt_tokens) / 1000.0"))
    assert CliRunner().invoke(main, ["policy", "check", str(policy)]).exit_code == 0
    res = CliRunner().invoke(main, ["policy", "test", str(tmp_path / "p.cases.yaml")])
    assert res.exit_code == 0 and "1 passed" in res.output, res.output


@settings(max_examples=80, deadline=None)
@given(tokens=st.integers(0, 10**6), divisor=st.integers(1, 5000), offset=st.sampled_from([0, 1, -1, 0.5, 0.25, 0.75, -0.5]),
       op=st.sampled_from(["<", "<=", ">", ">=", "==", "!="]), flipped=st.booleans(), held=st.booleans())
def test_a_quotient_that_compiles_compares_as_the_quotient(fleet, tokens: int, divisor: int, offset: float, op: str,
                                                          flipped: bool, held: bool) -> None:
    """A condition comparing an int quotient with a number (near the quotient: the truncated one plus ``offset``)
    either is refused (``integer-division``) or fires exactly when the quotient, as a real number, compares so
    (a divisor held in a variable alike)."""
    from fractions import Fraction

    from pointsman.policy.rules.evaluator import evaluate
    from pointsman.policy.signals.namespaces import example_signals

    threshold = tokens // divisor + offset
    quotient = f"request.prompt_tokens / {'variables.d' if held else divisor}"
    flip = {"<": ">", "<=": ">=", ">": "<", ">=": "<="}
    cond = f"{threshold!r} {flip.get(op, op)} {quotient}" if flipped else f"{quotient} {op} {threshold!r}"
    text = HEAD + f"variables: {{d: {divisor}}}\nrules:\n  - name: r\n    when: '{cond}'\n    route: {{target: onprem-70b}}\n" \
        + DEFAULT_RULE
    try:
        policy = compile_policy(text, fleet, "p.yaml")
    except PolicyError as exc:
        assert {p.code for p in exc.problems} == {"integer-division"}, exc
        return
    signals = example_signals()
    signals["request"]["prompt_tokens"] = tokens
    real = {"<": lambda a, b: a < b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b, ">=": lambda a, b: a >= b,
            "==": lambda a, b: a == b, "!=": lambda a, b: a != b}[op](Fraction(tokens, divisor), Fraction(threshold))
    assert (evaluate(policy, signals).rule.name == "r") == real, cond


def test_a_variable_naming_no_target_is_refused_where_it_keys_a_signal(tmp_path: Path) -> None:
    """``load[variables.tier]`` or ``cost(variables.tier)`` with ``tier: onprem-7b`` (a typo) passed ``policy check``
    whenever another side of an ``||`` let the probes match: that side fired, this one failed on every request,
    skipped without a word. Now ``unknown-target`` at the variable's name, with a did-you-mean."""
    from click.testing import CliRunner

    from pointsman.cli.main import main

    policy = tmp_path / "p.yaml"
    policy.write_text(HEAD + 'variables: {tier: onprem-7b, paid: frontier-smal}\nrules:\n  - name: busy\n'
                      "    when: load[variables.tier].outstanding_requests > 5 || cost(variables.paid) < 0.001 || request.turns > 3\n"
                      "    route: {target: frontier-small}\n" + DEFAULT_RULE)
    res = CliRunner().invoke(main, ["policy", "check", str(policy)])
    assert res.exit_code == 1, res.output
    assert f"{policy}:6:26: unknown-target: variables.tier holds \"onprem-7b\", not a target of the fleet, so " \
           "load[variables.tier] fails on every request; did you mean 'onprem-70b'?" in res.output, res.output
    assert f"{policy}:6:75: unknown-target: variables.paid holds \"frontier-smal\"" in res.output, res.output
    policy.write_text(policy.read_text().replace("onprem-7b,", "onprem-70b,").replace("frontier-smal}", "frontier-small}"))
    assert CliRunner().invoke(main, ["policy", "check", str(policy)]).exit_code == 0


@settings(max_examples=40, deadline=None)
@given(value=st.sampled_from(["onprem-70b", "onprem-7b", "onprem-8b", "frontier-small", "frontier-smal", "Frontier-large",
                              "frontier-large", "", 3]),
       read=st.sampled_from(["load[variables.t].outstanding_requests >= 0", "cost(variables.t) >= 0.0",
                             "predict[variables.t].tpot_s >= 0.0"]))
def test_a_target_variable_that_compiles_keys_a_signal(fleet, value: object, read: str) -> None:
    """A variable keying ``load[]``, ``predict[]`` or ``cost()`` either is refused (``unknown-target``) or reads a
    value: the rule fires on a typical request (where it would have been skipped, an error, on every one)."""
    from pointsman.estimator.estimate import FixedDifficulty
    from pointsman.policy.engine import RoutingEngine
    from pointsman.request import parse_route_request

    text = HEAD + f"variables: {{t: {json.dumps(value)}}}\nrules:\n  - name: r\n    when: '{read} || request.turns > 3'\n" \
        "    route: {target: onprem-70b}\n" + DEFAULT_RULE
    try:
        policy = compile_policy(text, fleet, "p.yaml")
    except PolicyError as exc:
        assert {p.code for p in exc.problems} == {"unknown-target"}, exc
        return
    engine = RoutingEngine(fleet, policy, FixedDifficulty(0.3))
    decision = engine.route(parse_route_request({"messages": [{"role": "user", "content": "hi"}]}), dispatch=False)
    assert decision.rule == "r", decision
