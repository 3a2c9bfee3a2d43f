"""The Python closures of simple CEL conditions (``policy/rules/closures.py``) give CEL's answer or defer to it.

Property: over generated expressions of the subset (and some outside it) and generated signal
values (ints, doubles with NaN and infinities, booleans, strings, nulls, missing fields and
namespaces, a failing ``cost()``), whenever a closure returns True or False, CEL returns that
same value on the same variables; the closure defers (``DEFER``) for everything else, so the
evaluator's results and error texts stay CEL's. And the packaged policies evaluate to the same
verdicts with and without their closures.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping

import pytest
from cel import cel
from hypothesis import given, settings
from hypothesis import strategies as st

from pointsman.policy.cases import case_signals
from pointsman.policy.fleet import load_fleet
from pointsman.policy.rules.closures import DEFER, closure
from pointsman.policy.rules.compiler import DEFAULT_POLICY_DIR, CompiledPolicy, load_policy
from pointsman.policy.rules.evaluator import context_variables, evaluate

FIELDS = ("a", "b", "c")
TARGETS = ("t1", "t2", "gone")

numbers = st.one_of(
    st.integers(min_value=-5, max_value=5),
    st.floats(min_value=-4, max_value=4, allow_nan=False),
    st.sampled_from([0.0, -0.0, 0.5, 1.0, 2.0, math.inf, -math.inf]),
)
values = st.one_of(
    numbers, numbers, numbers, st.booleans(), st.booleans(),
    st.sampled_from(["", "x", "y", None, math.nan, 1 << 63, -(1 << 53) - 1, 1 << 64]),
)
namespace = st.fixed_dictionaries({}, optional=dict.fromkeys(FIELDS, values))
contexts = st.fixed_dictionaries({}, optional={
    "ns": namespace, "other": namespace,
    "keyed": st.fixed_dictionaries({}, optional={"t1": namespace, "t2": namespace}),
    "flat": values,
})
costs = st.fixed_dictionaries({}, optional={"t1": st.floats(allow_nan=True), "t2": st.sampled_from([0.0, 1.5])})

literals = st.one_of(
    st.integers(min_value=-3, max_value=3).map(str),
    st.sampled_from(["0.5", "1.0", "2.5", "1e3", ".5", "0.0", "true", "false", '"x"', "'y'",
                     "9223372036854775807", "9007199254740993"]),
)
refs = st.one_of(
    st.sampled_from(FIELDS).map(lambda f: f"ns.{f}"),
    st.sampled_from(FIELDS).map(lambda f: f"other.{f}"),
    st.tuples(st.sampled_from(("t1", "t2", "t3")), st.sampled_from(FIELDS)).map(lambda k: f'keyed["{k[0]}"].{k[1]}'),
    st.sampled_from(FIELDS).map(lambda f: f'ns["{f}"]'),
    st.sampled_from(TARGETS).map(lambda t: f'cost("{t}")'),
    st.just("flat"), st.just("missing.a"),
)
atoms = st.one_of(literals, refs, refs)
#: The subset's binary operators (shapes outside it: ``test_outside_the_subset_is_left_to_cel``).
OPERATORS = ["&&", "||", "<", "<=", ">", ">=", "==", "!=", "+", "-", "*", "/"]


def _extend(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.one_of(st.tuples(inner, st.sampled_from(OPERATORS), inner).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
                     inner.map(lambda e: f"!{e}"), inner.map(lambda e: f"-({e})"))


expressions = st.recursive(atoms, _extend, max_leaves=6)


#: Typed expressions (numbers compared, joined by && || !): most evaluate to a boolean on ``full`` variables.
terms = st.recursive(
    st.one_of(st.integers(min_value=-3, max_value=3).map(str), st.sampled_from(["0.5", "2.5", "1e3", "0.0"]), refs),
    lambda inner: st.one_of(st.tuples(inner, st.sampled_from(["+", "-", "*", "/"]), inner)
                            .map(lambda t: f"({t[0]} {t[1]} {t[2]})"), inner.map(lambda e: f"-{e}")),
    max_leaves=3)
comparisons = st.one_of(st.tuples(terms, st.sampled_from(["<", "<=", ">", ">=", "==", "!="]), terms)
                        .map(lambda t: f"{t[0]} {t[1]} {t[2]}"),
                        st.sampled_from(["ns.a", "other.b", "true", "false", 'ns.c == "x"', "ns.b == true"]))
conditions = st.recursive(comparisons, lambda inner: st.one_of(
    st.tuples(inner, st.sampled_from(["&&", "||"]), inner).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
    inner.map(lambda e: f"!({e})")), max_leaves=4)
full_namespace = st.fixed_dictionaries(dict.fromkeys(FIELDS, values))
full = st.fixed_dictionaries({"ns": full_namespace, "other": full_namespace, "flat": values,
                              "keyed": st.fixed_dictionaries({"t1": full_namespace, "t2": full_namespace})})


def _cel(source: str, variables: Mapping[str, object], cost: object) -> object:
    try:
        return cel.compile(source).execute(cel.Context(dict(variables), {"cost": cost}))
    except Exception as exc:  # noqa: BLE001 - any failure is an error for the comparison
        return exc


@settings(max_examples=300, deadline=None)
@given(source=st.one_of(expressions, conditions), variables=st.one_of(contexts, full), prices=costs)
def test_closure_agrees_with_cel(source: str, variables: dict[str, object], prices: dict[str, float]) -> None:
    try:
        cel.compile(source)
    except Exception:  # noqa: BLE001 - not a CEL expression: never compiled by a policy
        return
    fast = closure(source)
    if fast is None:
        return

    def cost(target: str) -> float:
        return float(prices[target])

    got = fast(variables, cost)
    if got is DEFER:
        return
    expected = _cel(source, variables, cost)
    assert type(got) is bool
    assert type(expected) is bool and expected == got, (source, variables, prices, got, expected)


@pytest.mark.parametrize("source", [
    "difficulty.p_hard > 0.67 && request.prompt_tokens < 512",
    'predict["onprem-70b"].ttft_s <= variables.slo_margin * predict["onprem-70b"].slo_ttft_s',
    '!difficulty.available || cost("frontier-large") <= 2.0',
    "-request.prompt_tokens < 0 && (difficulty.p_hard / 2.0 >= 0.1) == true",
])
def test_the_common_shapes_compile(source: str) -> None:
    assert closure(source) is not None


@pytest.mark.parametrize("source", ["a in [1, 2]", "has(a.b)", "a.size() > 1", "a ? true : false", "a % 2 == 1",
                                    "a == null", "a > 0x10", "a > 1u", r'a == "\n"', "b'x' == a", "[1][0] == 1"])
def test_outside_the_subset_is_left_to_cel(source: str) -> None:
    assert closure(source) is None


@functools.cache
def _policies() -> list[tuple[str, CompiledPolicy, CompiledPolicy]]:
    """(file name, packaged policy, the same without closures) for every packaged policy."""
    fleet = load_fleet()
    out = []
    for path in sorted(DEFAULT_POLICY_DIR.glob("*.yaml")):
        if not path.name.endswith(".cases.yaml"):
            policy = load_policy(path, fleet)
            out.append((path.name, policy, dataclasses.replace(
                policy, rules=tuple(dataclasses.replace(r, fast=None) for r in policy.rules))))
    return out


@settings(max_examples=40, deadline=None)
@given(p_hard=st.one_of(st.none(), st.floats(0, 1)), prompt_tokens=st.integers(0, 200_000),
       waiting=st.integers(0, 400), hit=st.floats(0, 1), ttft_s=st.floats(0, 10), meets=st.booleans(),
       pace_gap=st.floats(-1, 1))
def test_packaged_policies_decide_as_on_cel(p_hard: float | None, prompt_tokens: int, waiting: int,
                                            hit: float, ttft_s: float, meets: bool, pace_gap: float) -> None:
    fleet = load_fleet()
    prices = {t: 0.001 * (i + 1) for i, t in enumerate(fleet.targets)}
    overrides: dict[str, dict[str, object]] = {
        "difficulty": {"p_hard": p_hard, "available": p_hard is not None},
        "request": {"prompt_tokens": prompt_tokens},
        "load": {t: {"num_requests_waiting": waiting} for t in fleet.targets},
        "cache": {"prefix_hit_ratio": hit},
        "predict": {t: {"ttft_s": ttft_s * (i + 1), "meets_slo": meets != (i % 2 == 0)}
                    for i, t in enumerate(fleet.targets)},
        "budget": {"limited": True, "remaining_usd": 5.0, "spent_fraction": 0.5, "pace_gap": pace_gap},
    }
    for name, policy, on_cel in _policies():
        assert any(r.fast is not None for r in policy.rules)
        snapshot = case_signals(fleet, policy, overrides)
        fast_calls: dict[str, float | None] = {}
        slow_calls: dict[str, float | None] = {}
        fast = evaluate(policy, snapshot, prices, calls=fast_calls)
        slow = evaluate(on_cel, snapshot, prices, calls=slow_calls)
        assert (fast.rule.name, fast.target, fast.mode, fast.fallbacks, fast.codes, fast.details) == \
            (slow.rule.name, slow.target, slow.mode, slow.fallbacks, slow.codes, slow.details), name
        # the cost() calls made are recorded alike on both paths (the trace's values, routing.explain)
        assert fast_calls == slow_calls, name
        assert all(value == prices[key[len('cost("'):-2]] for key, value in fast_calls.items()), name


def test_text_cel_cannot_convert_fails_the_evaluation_as_before() -> None:
    """A lone surrogate in a string of the CEL variables (a routing field from a JSON escape) cannot be
    converted into a ``cel.Context``: the evaluation raises, with closures as without them."""
    fleet = load_fleet()
    _, policy, on_cel = _policies()[0]
    snapshot = case_signals(fleet, policy, {})
    variables = context_variables(policy, snapshot)
    variables["request"] = {**variables.get("request", {}), "tenant": "a\ud800"}
    for p in (policy, on_cel):
        with pytest.raises(ValueError, match="onvert"):
            evaluate(p, variables, {t: 0.001 for t in fleet.targets}, pruned=True)
