"""Evaluate a compiled policy on one signal snapshot: first matching rule wins.

``evaluate(policy, signals, costs, exclusions) -> Verdict``. For each rule in order:

- its CEL condition runs on the snapshot (unconditional rules match);
- a condition that errors at run time (``difficulty.p_hard`` is null and is compared,
  a missing key, a non-boolean result) is skipped and recorded with its error;
- a matching rule takes the first eligible of its target and fallbacks (``exclusions``
  from ``policy/selection/filters.py``); when none is eligible it is recorded as
  ``no-eligible-target`` and evaluation continues (targets refused at dispatch come in as exclusions too:
  ``engine.decide_and_take``).

When no rule yields an eligible target, ``NoEligibleTarget`` is raised naming the
filter that removed each target.

Conditions in the subset of ``closures.py`` (comparisons joined by ``&&``/``||``: every packaged
policy's but one) run as Python closures on the CEL variables themselves, with CEL's results; a
closure that cannot be sure of CEL's answer (a null, a missing key, mixed types) defers to CEL, and
so does every other condition. Converting the variables into a ``cel.Context`` costs more than
evaluating the conditions (``scripts/bench_decision.py --cel``), so the context is built only when a
condition defers.

CEL context: one ``cel.Context`` per evaluation (built on first need), holding only the namespaces and
fields the policy reads (``CompiledPolicy.context_plan``) and, when used, the
``cost(target)`` function. Measured with common-expression-language 0.10 on this
machine (``python scripts/bench_decision.py --cel``): a condition on a reused context
costs ≈0.25 µs, but converting the variables into CEL values costs ≈0.7 µs per nested
map entry, so passing the full snapshot as a dict to each ``execute`` costs ≈15 µs
per rule (≈62 µs for the default policy's 4 conditions). One context per decision
converts once: ≈16 µs with the full snapshot, ≈9 µs pruned to what the policy reads,
then ≈0.25 µs per rule. Per-decision contexts are also thread-safe (a shared
``cel.Context`` is not, and its signals change every decision anyway).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

from cel import cel  # the Rust extension itself: xds-protos (ext_proc) also ships a cel/ package whose empty __init__ may win

from pointsman.policy.rules.closures import DEFER
from pointsman.policy.rules.compiler import CompiledPolicy, CompiledRule, CompiledVerifyRule
from pointsman.policy.selection.filters import Exclusion, NoEligibleTarget
from pointsman.policy.signals.namespaces import RELATIVE_ROOTS, relative_key


class RuleResult(NamedTuple):
    """How one rule fared: ``result`` is ``matched``, ``no-match``, ``error`` (skipped; ``error``
    says why) or ``no-eligible-target`` (matched, but its target and fallbacks were filtered).
    A named tuple: one is made per rule per decision, and tuples are cheap."""

    rule: str
    result: str
    error: str | None = None
    note: str | None = None

    def to_dict(self) -> dict[str, object]:
        """``{"rule", "result"}`` plus ``"error"`` / ``"note"`` when set."""
        d: dict[str, object] = {"rule": self.rule, "result": self.result}
        if self.error is not None:
            d["error"] = self.error
        if self.note is not None:
            d["note"] = self.note
        return d


@dataclass(frozen=True)
class Verdict:
    """The policy's answer: deciding ``rule``, chosen ``target`` and ``mode``, the eligible
    ``fallbacks`` (target, mode) after it, and every rule evaluated (``results``, built on
    demand from ``codes``, one result string per evaluated rule in order, and ``details``,
    rule index -> (error, note), so a decision over 100 rules allocates no per-rule objects)."""

    rule: CompiledRule
    target: str
    mode: str
    fallbacks: tuple[tuple[str, str], ...]
    rules: tuple[CompiledRule, ...]
    codes: list[str]
    details: dict[int, tuple[str | None, str | None]]

    @property
    def results(self) -> tuple[RuleResult, ...]:
        """Every rule evaluated, in order, with its result."""
        details = self.details
        return tuple(RuleResult(r.name, code, *details.get(i, (None, None)))
                     for i, (r, code) in enumerate(zip(self.rules, self.codes)))

    @property
    def skipped(self) -> list[str]:
        """Names of rules skipped because their condition errored."""
        return [r.name for r, code in zip(self.rules, self.codes) if code == "error"]


def context_variables(policy: CompiledPolicy, signals: Mapping[str, object]) -> dict[str, object]:
    """The part of a full snapshot ``signals`` the policy's conditions read (see
    ``CompiledPolicy.context_plan``; keyed roots ``load``, ``predict``, ``_cache``, ``_endpoint`` are pruned
    per key); ``variables`` always come from the policy itself."""
    out: dict[str, object] = {}
    for root, plan in policy.context_plan.items():
        ns = policy.variables if root == "variables" else signals.get(root)
        if not isinstance(ns, Mapping):
            continue
        if plan is None:
            out[root] = ns
        elif isinstance(plan, dict):
            keyed: dict[str, object] = {}
            for k, fields in plan.items():
                if k in ns:
                    value = ns[k]
                    keyed[k] = value if fields is None or not isinstance(value, Mapping) else \
                        {f: value[f] for f in fields if f in value}
            out[root] = keyed
        else:
            out[root] = {f: ns[f] for f in plan if f in ns}
    return out


def _error_text(exc: Exception, rule: CompiledRule | CompiledVerifyRule, signals: Mapping[str, object]) -> str:
    """A one-line reason for a failed condition, naming null signals when they caused it."""
    if isinstance(exc, TypeError) and "No such overload" in str(exc):
        nulls = [p for p in rule.signals
                 if not p.startswith("variables.") and "." in p and lookup_signal(signals, p, rule) is None]
        return "no such overload" + (f": {', '.join(nulls)} is null" if nulls else " (operand types do not match)")
    if isinstance(exc, KeyError):
        return f"no such key: {exc.args[0] if exc.args else ''}"
    if isinstance(exc, ZeroDivisionError):
        return "division by zero"
    m = _PY_FUNCTION_ERROR.search(str(exc))
    if m:
        return f"{m.group(1)}(): {m.group(2)}"
    text = str(exc).strip().split(". ")[0]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


_PY_FUNCTION_ERROR = re.compile(
    r"Function '(\w+)' error: Python function call failed: \w+: (.*?)(?:\. Check function arguments.*)?\)?$", re.S)


def call_key(name: str, arg: object) -> str:
    """How the trace names a function call a condition made: ``cost("frontier-large")``."""
    return f"{name}({json.dumps(arg, ensure_ascii=False, default=str)})"


def _cost_function(costs: Mapping[str, float], calls: dict[str, float | None] | None = None) -> Callable[[str], float]:
    """``cost(target)`` for the conditions: USD for ``target``; ValueError (a skipped rule) for an unknown
    target. With ``calls``, each call is also recorded there (``call_key`` -> USD, None when it failed)."""
    def cost(target: str) -> float:
        try:
            return float(costs[target])
        except KeyError:
            raise ValueError(f"unknown target '{target}'") from None
    if calls is None:
        return cost

    def recorded(target: str) -> float:
        key = call_key("cost", target)
        try:
            value = cost(target)
        except Exception:
            calls[key] = None
            raise
        calls[key] = value
        return value
    return recorded


def _get(ns: object, key: str) -> object:
    return ns.get(key) if isinstance(ns, Mapping) else None


def lookup_signal(signals: Mapping[str, object], path: str, rule: CompiledRule | CompiledVerifyRule | None = None) -> object:
    """The value at a signal path as written (``request.x``, ``load["t"].x``, ``cache.x``) in a
    snapshot or CEL context; None when absent."""
    keyed = path.partition('["')[0]
    if keyed in ("load", "predict") and path.startswith(f'{keyed}["'):
        target, _, member = path[len(keyed) + 2:].partition('"]')
        ns = _get(signals.get(keyed), target)
        member = member.lstrip(".")
        return _get(ns, member) if isinstance(ns, dict) and member else ns
    root, _, rest = path.partition(".")
    if root in RELATIVE_ROOTS and rule is not None:
        ns = _get(signals.get(RELATIVE_ROOTS[root]), relative_key(root, rule.target, rule.role))
    else:
        ns = signals.get(root)
    return _get(ns, rest) if isinstance(ns, dict) and rest else ns


_SCALARS = (bool, int, float, type(None))


def _bad_text(v: str) -> bool:
    """Whether ``v`` cannot be encoded as UTF-8 (a lone surrogate)."""
    if v.isascii():
        return False
    try:
        v.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _has_bad_text(variables: Mapping[str, object]) -> bool:
    """Whether a string of the CEL variables (namespace -> fields, or key -> fields) cannot be encoded
    as UTF-8 (a lone surrogate): the one value ``cel.Context`` fails to convert. (Numbers and dicts are told
    apart by their exact type before the ``Mapping`` check, an ABC's, which costs more than the rest.)"""
    for ns in variables.values():
        for value in ns.values() if type(ns) is dict or isinstance(ns, Mapping) else (ns,):
            if type(value) in _SCALARS:
                continue
            if isinstance(value, str):
                if _bad_text(value):
                    return True
            elif type(value) is dict or isinstance(value, Mapping):
                for v in value.values():
                    if isinstance(v, str) and _bad_text(v):
                        return True
    return False


def evaluate(policy: CompiledPolicy, signals: Mapping[str, object], costs: Mapping[str, float] | None = None,
             exclusions: Mapping[str, Exclusion | None] | None = None, *, pruned: bool = False,
             context_for: Callable[[int], Mapping[str, object] | None] | None = None,
             calls: dict[str, float | None] | None = None) -> Verdict:
    """Run the rules in order on ``signals`` (see module doc): a full snapshot, or with
    ``pruned`` the CEL variables already reduced to the policy's plan
    (``live.build_context``). ``costs``: USD per target for ``cost(target)`` (any mapping; a
    missing target raises KeyError, which skips the rule); ``exclusions``: target ->
    ``Exclusion`` or None (missing = eligible). ``context_for(i)``: with ``pruned``, called before
    each condition (rule index ``i``): the CEL variables to use from that rule on when it reads more
    than the current ones (``policy.rule_plans``), else None; the context is built then, so signals
    only later rules read are not computed for a decision an earlier rule makes. ``calls``: when given (an
    explained decision), every function call the conditions make, on the closures and on CEL alike, is
    recorded there as ``call_key`` -> its value (None when it failed); None records nothing. Raises
    ``NoEligibleTarget`` when no matching rule has an eligible target."""
    exclusions = exclusions or {}
    cost = _cost_function(costs or {}, calls)
    functions = {"cost": cost} if policy.uses_cost else None
    variables = signals if pruned else context_variables(policy, signals)
    # built when a rule needs CEL itself (``closures``: most do not), or at once when CEL cannot
    # convert the variables: it raises then, for the whole evaluation, as it always did
    ctx: cel.Context | None = cel.Context(dict(variables), functions) if _has_bad_text(variables) else None
    codes: list[str] = []
    details: dict[int, tuple[str | None, str | None]] = {}
    considered: list[str] = []
    append = codes.append
    for i, rule in enumerate(policy.rules):
        if rule.program is not None:
            if context_for is not None:
                grown = context_for(i)
                if grown is not None:
                    signals = variables = grown
                    ctx = cel.Context(dict(grown), functions) if _has_bad_text(grown) else None
            try:
                value = DEFER if rule.fast is None else rule.fast(variables, cost)
                if value is DEFER:
                    if ctx is None:
                        ctx = cel.Context(dict(variables), functions)
                    value = rule.program.execute(ctx)
            except Exception as exc:  # noqa: BLE001 - any evaluation failure skips the rule
                append("error")
                details[i] = (_error_text(exc, rule, signals), None)
                continue
            if value is not True:
                append("no-match" if value is False else "error")
                if value is not False:
                    details[i] = (f"condition gave {type(value).__name__}, not a boolean", None)
                continue
        eligible = [(t, m) for t, m in rule.candidates if exclusions.get(t) is None]
        if not eligible:
            considered.extend(t for t, _ in rule.candidates if t not in considered)
            append("no-eligible-target")
            details[i] = ("; ".join(f"{t} ({exclusions[t]})" for t, _ in rule.candidates), None)
            continue
        (target, mode), *rest = eligible
        append("matched")
        if target != rule.target:
            details[i] = (None, f"{rule.target} ineligible ({exclusions[rule.target]}); took fallback {target}")
        return Verdict(rule, target, mode, tuple(rest), policy.rules, codes, details)
    raise NoEligibleTarget(dict(exclusions), considered or list(exclusions))
