"""Compile a policy file once: validate it against the schema and the fleet, compile
every CEL condition, and report every problem at once.

``compile_policy(text, fleet, file) -> CompiledPolicy`` and ``load_policy(path, fleet)``
raise ``PolicyError`` whose ``problems`` are ``file:line:col: code: message``, in file
order. Codes: ``yaml-syntax``, ``duplicate-key``, ``unknown-key``, ``missing-key``,
``invalid-value`` (schema); ``cel-syntax`` (located inside the YAML scalar),
``unknown-signal``, ``unknown-variable``, ``unknown-function``, ``type-error``,
``not-boolean`` (expressions); ``unknown-target``, ``unsupported-mode``,
``duplicate-fallback``, ``duplicate-rule``, ``missing-default``, ``unreachable-rule``
(routing).

The type check is a probe: each condition runs once against a typical snapshot
(``signals.example_signals``); an operator applied to mismatched types (CEL never
converts, so ``difficulty.p_hard >= "0.6"`` has no overload) or a non-boolean
result is reported. Branches the probe does not reach are not checked.

The compiled policy keeps, per signal namespace, the fields its conditions read
(``context_plan``); the evaluator hands CEL only those, which keeps the per-decision
CEL context small (its cost grows with every map entry converted).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cel
from pydantic import ValidationError

from pointsman.errors import PolicyError, Problem
from pointsman.policy.cel_refs import scan
from pointsman.policy.fleet import Fleet
from pointsman.policy.located import LocatedDocument, did_you_mean, parse_yaml, read_text, validation_problems
from pointsman.policy.schema import PolicySpec, RuleSpec
from pointsman.policy.signals import CEL_BUILTINS, CEL_TYPE_NAMES, FUNCTIONS, SIGNALS, example_signals

#: Packaged example policies (each with a sibling ``*.cases.yaml``).
DEFAULT_POLICY_DIR = Path(__file__).parent / "defaults" / "policies"
DEFAULT_POLICY_PATH = DEFAULT_POLICY_DIR / "default.yaml"

#: Namespaces the policy issue adds; named in the error so authors know why.
PLANNED_NAMESPACES = frozenset({"load", "endpoint", "cache", "budget"})

_CEL_ERROR = re.compile(r"<input>:(\d+):(\d+): (.*)")


@dataclass(frozen=True)
class CompiledRule:
    """One compiled rule. ``program`` is None for an unconditional rule; ``signals`` lists
    the signal paths its condition reads (``difficulty.p_hard``); ``line`` is its line in the file;
    ``candidates``: (target, mode) for the target then each fallback, in order (a fallback
    keeps the rule's mode when it supports it, else takes its own default mode)."""

    name: str
    index: int
    when: str | None
    program: Any
    target: str
    mode: str
    fallbacks: tuple[str, ...]
    labels: dict[str, str]
    signals: tuple[str, ...]
    uses_cost: bool
    line: int
    candidates: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class CompiledPolicy:
    """A policy ready to evaluate. ``revision``: sha256 of the file text (16 hex);
    ``fleet_revision``: the fleet it was checked against; ``context_plan``: per namespace,
    the fields conditions read (None = the whole namespace)."""

    name: str
    file: str
    revision: str
    fleet_revision: str
    rules: tuple[CompiledRule, ...]
    variables: dict[str, Any]
    labels: dict[str, str]
    context_plan: dict[str, frozenset[str] | None] = field(default_factory=dict)
    uses_cost: bool = False


class _Checker:
    """Collects located problems while compiling one policy document."""

    def __init__(self, doc: LocatedDocument, fleet: Fleet) -> None:
        self.doc = doc
        self.fleet = fleet
        self.problems: list[Problem] = []

    def add(self, path: tuple[Any, ...], code: str, message: str, *, key: bool = False) -> None:
        """Record a problem at the node (or key) at ``path``."""
        line, col = self.doc.mark(path, key=key)
        self.problems.append(Problem(self.doc.file, line, col, code, message))

    def add_at(self, path: tuple[Any, ...], offset: int, code: str, message: str) -> None:
        """Record a problem at character ``offset`` inside the scalar at ``path``."""
        line, col = self.doc.scalar_position(path, offset)
        self.problems.append(Problem(self.doc.file, line, col, code, message))

    def target(self, path: tuple[Any, ...], name: str) -> bool:
        """True if ``name`` is a fleet target, else record ``unknown-target`` with did-you-mean."""
        if name in self.fleet.targets:
            return True
        self.add(path, "unknown-target", f"unknown target '{name}'{did_you_mean(name, self.fleet.targets)}"
                 f" (the fleet has {', '.join(self.fleet.targets)})")
        return False


def _cel_syntax_position(message: str, source: str) -> tuple[int, str]:
    """(character offset in ``source``, short message) of the first error in a CEL parse error."""
    m = _CEL_ERROR.search(message)
    if not m:
        return 0, message.strip().splitlines()[0] if message.strip() else "syntax error"
    line, col, text = int(m.group(1)), int(m.group(2)), m.group(3).strip()
    lines = source.split("\n")
    offset = sum(len(l) + 1 for l in lines[: line - 1]) + col - 1
    text = text.removeprefix("Syntax error: ")
    if text.startswith("mismatched input '<EOF>'"):
        text = "the expression ends too early (an operand or ')' is missing)"
    elif " expecting {" in text and len(text) > 80:
        text = text.split(" expecting {")[0]
    if "reserved identifier: var" in text:
        text += " (policy variables are read as variables.<name>)"
    return min(offset, len(source)), text


def _is_unconditional(when: str | bool | None) -> bool:
    return when is None or when is True or (isinstance(when, str) and when.strip() == "true")


def _check_condition(ck: _Checker, i: int, source: str, variables: dict[str, Any]) -> tuple[Any, tuple[str, ...], bool, dict]:
    """Compile and check one ``when``; returns (program or None, signal paths, uses_cost, plan)."""
    path = ("rules", i, "when")
    if not source.strip():
        ck.add(path, "cel-syntax", "empty condition: omit 'when' for an unconditional rule")
        return None, (), False, {}
    try:
        program = cel.compile(source)
    except ValueError as exc:
        offset, text = _cel_syntax_position(str(exc), source)
        ck.add_at(path, offset, "cel-syntax", text)
        return None, (), False, {}
    found = scan(source)
    ok = True
    paths: list[str] = []
    plan: dict[str, set[str] | None] = {}
    for ref in found.refs:
        if ref.root in found.bound or ref.root in CEL_TYPE_NAMES:
            continue
        ns = SIGNALS.get(ref.root)
        if ns is None:
            ok = False
            if ref.root in PLANNED_NAMESPACES:
                msg = f"signal namespace '{ref.root}' is not provided by this version of Pointsman"
            elif ref.root in variables:
                msg = f"unknown name '{ref.root}'; did you mean 'variables.{ref.root}'?"
            else:
                msg = f"unknown name '{ref.root}'{did_you_mean(ref.root, SIGNALS)}"
            ck.add_at(path, ref.offset, "unknown-signal", msg)
            continue
        fields = set(variables) if ns.fields is None else set(ns.fields)
        if ref.field is None or ref.root in found.dynamic_roots:
            plan[ref.root] = None
            paths.append(ref.root)
            continue
        if ref.field not in fields:
            ok = False
            code = "unknown-variable" if ref.root == "variables" else "unknown-signal"
            what = "variable" if ref.root == "variables" else "signal"
            hint = did_you_mean(ref.field, fields)
            hint = hint.replace("'", f"'{ref.root}.", 1) if hint else ""
            ck.add_at(path, ref.field_offset or ref.offset, code,
                      f"unknown {what} '{ref.root}.{ref.field}'{hint}")
            continue
        if plan.get(ref.root, set()) is not None:
            plan.setdefault(ref.root, set()).add(ref.field)
        paths.append(ref.path)
    uses_cost = False
    known_functions = set(FUNCTIONS) | CEL_BUILTINS
    for call in [*found.calls, *found.methods]:
        if call.name in FUNCTIONS:
            uses_cost = uses_cost or call.name == "cost"
            if call.name == "cost" and call.arg is not None and call.arg not in ck.fleet.targets:
                ok = False
                ck.add_at(path, call.arg_offset or call.offset, "unknown-target",
                          f"unknown target '{call.arg}' in cost(){did_you_mean(call.arg, ck.fleet.targets)}")
        elif call.name not in known_functions:
            ok = False
            ck.add_at(path, call.offset, "unknown-function",
                      f"unknown function '{call.name}'{did_you_mean(call.name, known_functions)}")
    if ok:
        _probe(ck, path, program, variables)
    return program, tuple(dict.fromkeys(paths)), uses_cost, plan


def _probe(ck: _Checker, path: tuple[Any, ...], program: Any, variables: dict[str, Any]) -> None:
    """Run the condition once on a typical snapshot to catch type errors and non-boolean results."""
    ctx = cel.Context(example_signals(variables), {"cost": lambda target: 0.001})
    try:
        result = program.execute(ctx)
    except TypeError as exc:
        if "No such overload" in str(exc):
            ck.add(path, "type-error", "an operator or function is applied to mismatched types "
                   "(CEL never converts between int, double and string; use double(x), int(x) or string(x))")
        return
    except Exception:  # data-dependent errors (missing keys, division by zero) surface at run time
        return
    if not isinstance(result, bool):
        ck.add(path, "not-boolean", f"condition must be true or false, but gives {type(result).__name__} "
               f"{result!r} on a typical request")


def compile_policy(text: str, fleet: Fleet, file: str = "<policy>") -> CompiledPolicy:
    """Compile policy YAML text against ``fleet``; raises ``PolicyError`` listing every problem."""
    doc = parse_yaml(text, file, PolicyError)
    ck = _Checker(doc, fleet)
    data = doc.data
    if not isinstance(data, dict):
        got = "an empty file" if data is None else type(data).__name__
        raise PolicyError([Problem(file, 1, 1, "invalid-value", f"expected a mapping at the top level, got {got}")])
    spec: PolicySpec | None = None
    try:
        spec = PolicySpec.model_validate(data)
    except ValidationError as exc:
        ck.problems.extend(validation_problems(exc, doc, PolicySpec))
    # Keep checking what is individually valid, so every problem shows at once.
    if spec is not None:
        variables = dict(spec.variables)
        rules = list(enumerate(spec.rules))
    else:
        raw_vars = data.get("variables")
        variables = dict(raw_vars) if isinstance(raw_vars, dict) else {}
        raw_rules = data.get("rules") if isinstance(data.get("rules"), list) else []
        rules = []
        for i, raw in enumerate(raw_rules):
            # Already reported by the whole-file validation; check the rest of the rule
            # without its unknown keys, so its other problems show in the same run.
            known = {k: v for k, v in raw.items() if k in RuleSpec.model_fields} if isinstance(raw, dict) else raw
            try:
                rules.append((i, RuleSpec.model_validate(known)))
            except ValidationError:
                pass

    compiled: list[CompiledRule] = []
    seen: dict[str, int] = {}
    default_index: int | None = None
    plan: dict[str, set[str] | None] = {}
    for i, rule in rules:
        if rule.name in seen:
            ck.add(("rules", i, "name"), "duplicate-rule",
                   f"rule name '{rule.name}' is already used at line {doc.mark(('rules', seen[rule.name], 'name'))[0]}")
        else:
            seen[rule.name] = i
        if default_index is not None:
            ck.add(("rules", i, "name"), "unreachable-rule",
                   f"rule '{rule.name}' comes after the unconditional rule '{rules_by_index(rules, default_index).name}' "
                   f"(line {doc.mark(('rules', default_index, 'name'))[0]}) and can never match")
        program, paths, uses_cost, source = None, (), False, None
        if _is_unconditional(rule.when):
            if default_index is None:
                default_index = i
        else:
            source = "false" if rule.when is False else str(rule.when)
            program, paths, uses_cost, rule_plan = _check_condition(ck, i, source, variables)
            for root, fields in rule_plan.items():
                if fields is None or plan.get(root, set()) is None:
                    plan[root] = None
                else:
                    plan.setdefault(root, set()).update(fields)
        route = rule.route
        target_ok = ck.target(("rules", i, "route", "target"), route.target)
        mode = route.mode
        if target_ok:
            modes = fleet.targets[route.target].modes
            if mode is None:
                mode = modes[0]
            elif mode not in modes:
                ck.add(("rules", i, "route", "mode"), "unsupported-mode",
                       f"target '{route.target}' does not support mode '{mode}' (it supports {', '.join(modes)})")
        seen_fb = {route.target}
        for j, fb in enumerate(route.fallbacks):
            if ck.target(("rules", i, "route", "fallbacks", j), fb) and fb in seen_fb:
                ck.add(("rules", i, "route", "fallbacks", j), "duplicate-fallback",
                       f"'{fb}' is already the rule's target or an earlier fallback")
            seen_fb.add(fb)
        compiled.append(CompiledRule(
            name=rule.name, index=i, when=source,
            program=program, target=route.target, mode=mode or "aggregated", fallbacks=tuple(route.fallbacks),
            labels=dict(rule.labels), signals=paths, uses_cost=uses_cost, line=doc.mark(("rules", i))[0],
            candidates=_candidates(fleet, route.target, mode, route.fallbacks)))
    if default_index is None and (spec is not None or rules):
        ck.add(("rules",), "missing-default",
               "no unconditional rule: end the rules with one that has no 'when' (e.g. name: default)", key=True)
    if ck.problems:
        raise PolicyError(sorted(ck.problems, key=lambda p: (p.line, p.col, p.code)))
    assert spec is not None
    return CompiledPolicy(
        name=spec.metadata.name or Path(file).stem, file=file,
        revision=hashlib.sha256(text.encode("utf-8")).hexdigest()[:16], fleet_revision=fleet.revision,
        rules=tuple(compiled), variables=variables, labels=dict(spec.metadata.labels),
        context_plan={k: (None if v is None else frozenset(v)) for k, v in plan.items()},
        uses_cost=any(r.uses_cost for r in compiled))


def _candidates(fleet: Fleet, target: str, mode: str | None, fallbacks: list[str]) -> tuple[tuple[str, str], ...]:
    out = []
    for name in [target, *fallbacks]:
        if name not in fleet.targets:
            continue
        modes = fleet.targets[name].modes
        out.append((name, mode if mode in modes else modes[0]))
    return tuple(out)


def rules_by_index(rules: list[tuple[int, RuleSpec]], index: int) -> RuleSpec:
    """The rule at file position ``index``."""
    return next(r for i, r in rules if i == index)


def load_policy(path: str | Path, fleet: Fleet) -> CompiledPolicy:
    """Read and compile a policy file; raises ``PolicyError`` (every problem, located)."""
    return compile_policy(read_text(path, PolicyError), fleet, str(path))
