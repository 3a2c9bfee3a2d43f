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

Signals not given take ``signals.example_signals`` values; the policy's variables are
filled in. Each case runs the same policy step the engine runs (``engine.decide``:
eligibility, candidate costs, rules). ``expect`` may name ``target``, ``mode``,
``rule``, ``fallbacks``, ``skipped`` (rules whose condition errored) or
``error: no-eligible-target``.

``run_cases(path) -> list[CaseResult]``; raises ``PolicyError`` if the cases file,
its policy or its fleet is invalid (unknown signal names in a case included).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pointsman.errors import PolicyError, Problem
from pointsman.policy.compiler import load_policy
from pointsman.policy.engine import decide
from pointsman.policy.filters import NoEligibleTarget
from pointsman.policy.fleet import DEFAULT_FLEET_PATH, Mode, load_fleet
from pointsman.policy.located import StrictModel, did_you_mean, load_config
from pointsman.policy.signals import SIGNALS, example_signals


class CaseExpect(StrictModel):
    """What a case expects; unset fields are not checked."""

    target: str | None = None
    mode: Mode | None = None
    rule: str | None = None
    fallbacks: list[str] | None = None
    skipped: list[str] | None = None
    error: Literal["no-eligible-target"] | None = None


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


def _check_signal_names(spec: CasesSpec, doc: Any) -> list[Problem]:
    problems = []
    for i, case in enumerate(spec.cases):
        for root, fields in case.signals.items():
            ns = SIGNALS.get(root)
            if ns is None or ns.fields is None:
                line, col = doc.mark(("cases", i, "signals", root), key=True)
                allowed = [n for n, s in SIGNALS.items() if s.fields is not None]
                problems.append(Problem(doc.file, line, col, "unknown-signal",
                                        f"unknown signal namespace '{root}'{did_you_mean(root, allowed)}"))
                continue
            for name in fields:
                if name not in ns.fields:
                    line, col = doc.mark(("cases", i, "signals", root, name), key=True)
                    problems.append(Problem(doc.file, line, col, "unknown-signal",
                                            f"unknown signal '{root}.{name}'{did_you_mean(name, ns.fields)}"))
    return problems


def run_cases(path: str | Path) -> list[CaseResult]:
    """Run every case in a cases file against its policy (see module doc)."""
    spec, doc = load_config(path, CasesSpec, PolicyError)
    assert isinstance(spec, CasesSpec)
    problems = _check_signal_names(spec, doc)
    if problems:
        raise PolicyError(problems)
    base = Path(path).parent
    fleet = load_fleet(base / spec.fleet if spec.fleet else DEFAULT_FLEET_PATH)
    policy = load_policy(base / spec.policy, fleet)
    results = []
    for i, case in enumerate(spec.cases):
        signals = example_signals(policy.variables)
        for root, fields in case.signals.items():
            signals[root].update(fields)
        exp = case.expect
        line = doc.mark(("cases", i))[0]
        try:
            verdict = decide(fleet, policy, signals).verdict
        except NoEligibleTarget as exc:
            ok = exp.error == "no-eligible-target"
            results.append(CaseResult(case.name, ok, "" if ok else f"unexpected error: {exc}", line))
            continue
        got: dict[str, Any] = {"target": verdict.target, "mode": verdict.mode, "rule": verdict.rule.name,
                               "fallbacks": [t for t, _ in verdict.fallbacks], "skipped": verdict.skipped}
        wrong = []
        if exp.error is not None:
            wrong.append(f"expected error {exp.error}, got target {verdict.target}")
        for key in ("target", "mode", "rule", "fallbacks", "skipped"):
            want = getattr(exp, key)
            if want is not None and want != got[key]:
                wrong.append(f"{key}: expected {want!r}, got {got[key]!r}")
        results.append(CaseResult(case.name, not wrong, "; ".join(wrong), line))
    return results
