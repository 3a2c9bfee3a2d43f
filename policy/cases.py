"""Policy cases: a sibling file of input signals and the decision each must give.

::

    apiVersion: pointsman/v1
    kind: PolicyCases
    policy: default.yaml            # relative to this file
    fleet: ../fleet.yaml            # optional; default: the packaged fleet
    cases:
      - name: hard prompt goes to the frontier
        signals: {request: {prompt_tokens: 200}, difficulty: {p_hard: 0.8}}
        expect: {target: frontier-large, mode: aggregated, rule: hard-prompt}
      - name: a busy 70B pool overflows
        signals:
          load: {onprem-70b: {num_requests_waiting: 40}}     # by target
          cache: {prefix_hit_ratio: 0.9}                      # every target (or {<target>: {...}})
          budget: {limited: true, remaining_usd: 0.5, limit_usd: 10, spent_fraction: 0.95}
        expect: {target: frontier-small, rule: overflow}

Signals not given take ``signals.example_signals`` values (a short easy request, an
idle fleet with fresh telemetry, a cold cache, no budget); the policy's variables
are filled in. ``load`` is keyed by target; ``cache`` and ``endpoint`` (relative to
each rule's target) take either fields for every target or ``{<target>: {fields}}``.
Each case runs the same policy step the engine runs (``engine.decide``: eligibility,
rules, P/D mode) on a ``live.StaticSignals``; costs come from the fleet's prices with
``cache.prefix_hit_tokens`` cached. ``expect`` may name ``target``, ``mode``, ``rule``,
``fallbacks``, ``skipped`` (rules whose condition errored) or
``error: no-eligible-target`` (with ``excluded_by``: target -> filter, optional).

``run_cases(path) -> list[CaseResult]``; raises ``PolicyError`` if the cases file,
its policy or its fleet is invalid (unknown signal names in a case included).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pointsman.errors import PolicyError, Problem
from pointsman.located import StrictModel, did_you_mean, load_config
from pointsman.policy.engine import decide
from pointsman.policy.fleet import DEFAULT_FLEET_PATH, Mode, load_fleet
from pointsman.policy.live import StaticSignals
from pointsman.policy.rules.compiler import load_policy
from pointsman.policy.selection.filters import NoEligibleTarget
from pointsman.policy.signals.namespaces import (
    RELATIVE_ROOTS,
    SIGNALS,
    example_endpoint,
    example_signals,
    relative_key,
)


class CaseExpect(StrictModel):
    """What a case expects; unset fields are not checked."""

    target: str | None = None
    mode: Mode | None = None
    rule: str | None = None
    fallbacks: list[str] | None = None
    skipped: list[str] | None = None
    error: Literal["no-eligible-target"] | None = None
    excluded_by: dict[str, str] | None = None


class Case(StrictModel):
    """One case: ``name``, partial ``signals`` by namespace, ``expect``."""

    name: str
    signals: dict[str, dict[str, Any]] = {}
    expect: CaseExpect


class CasesSpec(StrictModel):
    """The validated content of a cases file."""

    apiVersion: Literal["pointsman/v1"]
    kind: Literal["PolicyCases"]
    policy: str
    fleet: str | None = None
    cases: list[Case]


@dataclass(frozen=True)
class CaseResult:
    """One case's outcome: ``passed``, and ``message`` listing every mismatch (empty when passed)."""

    name: str
    passed: bool
    message: str
    line: int


#: Namespaces a case may set, and their shape (``by_target``: {target: {field: value}}).
CASE_NAMESPACES = ("request", "difficulty", "load", "cache", "endpoint", "budget")


def _check_signal_names(spec: CasesSpec, doc: Any, fleet: Any) -> list[Problem]:
    problems: list[Problem] = []

    def bad(path: tuple[Any, ...], code: str, message: str) -> None:
        line, col = doc.mark(path, key=True)
        problems.append(Problem(doc.file, line, col, code, message))

    def check_fields(path: tuple[Any, ...], ns: Any, fields: Any, where: str) -> None:
        if not isinstance(fields, dict):
            bad(path, "invalid-value", f"{where} must be a mapping of signal names to values")
            return
        for name in fields:
            if name not in ns.fields:
                bad((*path, name), "unknown-signal", f"unknown signal '{where}.{name}'{did_you_mean(name, ns.fields)}")

    for i, case in enumerate(spec.cases):
        for root, fields in case.signals.items():
            path = ("cases", i, "signals", root)
            ns = SIGNALS.get(root)
            if ns is None or root not in CASE_NAMESPACES:
                bad(path, "unknown-signal",
                    f"unknown signal namespace '{root}'{did_you_mean(root, CASE_NAMESPACES)}")
                continue
            if ns.shape == "by_target" or (ns.shape == "relative" and any(k in fleet.targets for k in fields)):
                for target, values in fields.items():
                    if target not in fleet.targets:
                        bad((*path, target), "unknown-target",
                            f"unknown target '{target}' in {root}{did_you_mean(target, fleet.targets)}")
                        continue
                    check_fields((*path, target), ns, values, f'{root}["{target}"]')
            else:
                check_fields(path, ns, fields, root)
    return problems


def case_signals(fleet: Any, policy: Any, overrides: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The full snapshot of a case: ``example_signals`` for the fleet, with ``overrides`` applied
    (``load`` by target; ``cache``/``endpoint`` for every target or by target)."""
    signals = example_signals(policy.variables, fleet.targets)
    signals["_endpoint"] = {}
    for t in fleet.targets:
        for rule in policy.rules:
            if rule.target == t:
                signals["_endpoint"].setdefault(relative_key("endpoint", t, rule.role), example_endpoint())
    for root, fields in overrides.items():
        if root in ("request", "difficulty", "budget"):
            signals[root].update(fields)
        elif root == "load":
            for target, values in fields.items():
                signals["load"][target].update(values)
        else:
            internal = RELATIVE_ROOTS[root]
            by_target = any(k in fleet.targets for k in fields)
            for key, value in signals[internal].items():
                target = key.partition("/")[0]
                if by_target:
                    value.update(fields.get(target, {}))
                else:
                    value.update(fields)
    return signals


def load_cases(path: str | Path) -> tuple[CasesSpec, Any, Any, Any]:
    """Validate a cases file without running it: ``(spec, located doc, fleet, compiled policy)``.

    Checks the file's schema, every signal name its cases set, and compiles the policy it
    names against its fleet. Raises ``PolicyError``/``FleetError`` with file:line:col.
    """
    spec, doc = load_config(path, CasesSpec, PolicyError)
    assert isinstance(spec, CasesSpec)
    base = Path(path).parent
    fleet = load_fleet(base / spec.fleet if spec.fleet else DEFAULT_FLEET_PATH)
    problems = _check_signal_names(spec, doc, fleet)
    if problems:
        raise PolicyError(problems)
    policy = load_policy(base / spec.policy, fleet)
    return spec, doc, fleet, policy


def run_cases(path: str | Path) -> list[CaseResult]:
    """Run every case in a cases file against its policy (see module doc)."""
    spec, doc, fleet, policy = load_cases(path)
    results = []
    for i, case in enumerate(spec.cases):
        signals = case_signals(fleet, policy, case.signals)
        exp = case.expect
        line = doc.mark(("cases", i))[0]
        try:
            outcome = decide(fleet, policy, signals, StaticSignals(fleet, policy, signals))
        except NoEligibleTarget as exc:
            wrong = [] if exp.error == "no-eligible-target" else [f"unexpected error: {exc}"]
            for target, filt in (exp.excluded_by or {}).items():
                got = exc.exclusions.get(target)
                if got is None or got.filter != filt:
                    wrong.append(f"excluded_by[{target}]: expected {filt!r}, got {got.filter if got else None!r}")
            results.append(CaseResult(case.name, not wrong, "; ".join(wrong), line))
            continue
        verdict = outcome.verdict
        got: dict[str, Any] = {"target": verdict.target, "mode": outcome.mode.mode, "rule": verdict.rule.name,
                               "fallbacks": [t for t, _ in outcome.fallbacks], "skipped": verdict.skipped}
        wrong = []
        if exp.error is not None:
            wrong.append(f"expected error {exp.error}, got target {verdict.target}")
        for key in ("target", "mode", "rule", "fallbacks", "skipped"):
            want = getattr(exp, key)
            if want is not None and want != got[key]:
                wrong.append(f"{key}: expected {want!r}, got {got[key]!r}")
        results.append(CaseResult(case.name, not wrong, "; ".join(wrong), line))
    return results
