"""Compile a policy file once: validate it against the schema and the fleet, compile
every CEL condition, and report every problem at once.

``compile_policy(text, fleet, file) -> CompiledPolicy`` and ``load_policy(path, fleet)``
raise ``PolicyError`` whose ``problems`` are ``file:line:col: code: message``, in file
order. Codes: ``yaml-syntax``, ``duplicate-key``, ``unknown-key``, ``missing-key``,
``invalid-value`` (schema); ``cel-syntax`` (located inside the YAML scalar),
``unknown-signal``, ``unknown-variable``, ``unknown-function``, ``type-error``,
``not-boolean``, ``always-error``, ``null-inequality``, ``out-of-range``, ``integer-division``, ``non-canonical-string`` (a string
literal or variable beside ``request.tenant``, ``team``, ``session_id`` or ``slo_class`` that is not in ``request.canonical``
form: those signals are, so it never equals them) (expressions); ``unknown-target``, ``unsupported-mode``,
``duplicate-fallback``, ``unknown-rule``, ``fallback-cycle``, ``duplicate-rule``,
``missing-default``, ``unreachable-rule`` (routing: a ``when`` that reads no signal, variable or ``cost()`` and
is true, ``"1 == 1"``, is as unconditional as none); ``unknown-picker`` (endpoint selection);
``too-large`` (over a size limit of ``limits.py``: bytes, YAML nodes with aliases expanded,
rules, tenant names; checked before anything costly, alone). A rule with an invalid value is checked
without it (``_checkable``), so the problems of its condition and route show in the same run.

The optional ``verify`` section (``schema.VerifySpec``) compiles the same way into
``CompiledPolicy.verify`` (``CompiledVerify``): its conditions also read ``draft.*``
(``namespaces.VERIFY_SIGNALS``), an ``escalate`` rule's targets are checked like a route's,
and an unconditional last rule is required (``missing-default``, ``unreachable-rule``).

Signal names are checked against ``namespaces.SIGNALS``: flat (``request.prompt_tokens``),
keyed by target (``load["onprem-70b"].num_requests_waiting``, the key must be a
target) and relative to the rule's own route (``cache.prefix_hit_ratio``,
``endpoint.num_requests_running``). A relative name is rewritten to the internal
keyed root before CEL compiles it (``cache`` -> ``_cache["<target>"]``, ``endpoint`` ->
``_endpoint["<target>/<role>"]``), so problems are located in the original text and
one CEL context per decision serves every rule.

The type check is a probe: each condition runs on two typical snapshots (an idle
fleet with a short easy request, and a busy one with a long hard request,
``example_signals``); an operator applied to mismatched types (CEL never converts,
so ``difficulty.p_hard >= "0.6"`` has no overload) or a non-boolean result is
reported. Branches neither probe reaches are not checked.

The compiled policy keeps, per namespace, what its conditions read (``context_plan``:
flat namespaces map to field sets, keyed ones to ``{key: fields}``; None = whole);
the engine computes and hands CEL only those, which keeps the per-decision work and
CEL context small (its cost grows with every map entry converted).
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import math
import re
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeAlias, TypeVar

import yaml
from cel import cel  # the Rust extension itself: xds-protos (ext_proc) also ships a cel/ package whose empty __init__ may win
from pydantic import ValidationError

from pointsman.errors import PolicyError, Problem
from pointsman.json_types import JSONValue
from pointsman.located import LocatedDocument, did_you_mean, parse_yaml, read_text, validation_problems
from pointsman.policy.fleet import Fleet, FrontierTarget
from pointsman.policy.rules.cel_refs import Ref, Token, _string_value, scan, tokenize
from pointsman.policy.rules.closures import Condition, closure
from pointsman.policy.rules.limits import MAX_POLICY_BYTES, MAX_YAML_NODES, check_counts
from pointsman.policy.rules.schema import (
    RULE_REF,
    FallbackSpec,
    PolicySpec,
    RuleSpec,
    VerifyRuleSpec,
    YAML11Boolean,
)
from pointsman.policy.selection.filters import FiltersSpec
from pointsman.policy.selection.pd_mode import DisaggregationSpec
from pointsman.policy.selection.pickers import EndpointSelectionSpec
from pointsman.policy.signals.load_board import StalenessPolicy
from pointsman.policy.signals.namespaces import (
    CEL_BUILTINS,
    CEL_TYPE_NAMES,
    FUNCTIONS,
    RELATIVE_ROOTS,
    SIGNALS,
    VERIFY_SIGNALS,
    EndpointSignals,
    LoadSignals,
    Namespace,
    Signal,
    Snapshot,
    example_draft,
    example_endpoint,
    example_load,
    example_predict,
    example_signals,
    relative_key,
)
from pointsman.request import canonical

#: Packaged example policies (each with a sibling ``*.cases.yaml``).
DEFAULT_POLICY_DIR = Path(__file__).parent.parent / "defaults" / "policies"
DEFAULT_POLICY_PATH = DEFAULT_POLICY_DIR / "default.yaml"
#: The static policy (the default before the SLO-aware one): difficulty, prompt length and cache locality alone.
STATIC_POLICY_PATH = DEFAULT_POLICY_DIR / "static.yaml"

_CEL_ERROR = re.compile(r"<input>:(\d+):(\d+): (.*)")

#: Fields of a namespace a policy reads; None: every field.
Fields: TypeAlias = AbstractSet[str] | None
#: A context plan: namespace -> None (whole) | fields | {key: None | fields}.
Plan: TypeAlias = dict[str, Fields | dict[str, Fields]]
#: A location in a policy document: keys and list indexes from the root.
Path_: TypeAlias = tuple[str | int, ...]


@dataclass(frozen=True)
class CompiledRule:
    """One compiled rule. ``program`` is None for an unconditional rule; ``when`` is the source
    as written; ``signals`` lists the signal paths its condition reads, as written
    (``difficulty.p_hard``, ``load["onprem-70b"].age_s``, ``cache.prefix_hit_ratio``); ``line``
    is its line in the file. ``mode`` is the route's mode (``aggregated``,
    ``disaggregated`` or ``auto``); ``role``: the pool role of the route's endpoint
    (``aggregated``, ``decode``, ``api``, or ``auto``: the role of the mode an ``auto`` route runs in, decided
    when read; what ``endpoint.*`` reads). ``candidates``:
    (target, mode) for the target then each fallback, expanded and de-duplicated. ``fast``: the
    condition as a Python closure with CEL's results (``closures.closure``; None: CEL only). ``calls``: the
    policy functions it calls with a literal argument, as (name, argument) (``("cost", "frontier-large")``)."""

    name: str
    index: int
    when: str | None
    program: cel.Program | None
    target: str
    mode: str
    fallbacks: tuple[str, ...]
    labels: dict[str, str]
    signals: tuple[str, ...]
    uses_cost: bool
    line: int
    candidates: tuple[tuple[str, str], ...] = ()
    role: str = "aggregated"
    fast: Condition | None = field(default=None, compare=False, repr=False)
    calls: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class CompiledVerifyRule:
    """One compiled verify rule: ``action`` (``accept`` or ``escalate``); ``candidates``: the
    escalation target then its fallbacks, each with the target's default mode (empty for
    ``accept``); ``target``: the escalation target ('' for accept; what ``cache``/``endpoint``
    read); the rest as ``CompiledRule``."""

    name: str
    index: int
    when: str | None
    program: cel.Program | None
    action: str
    candidates: tuple[tuple[str, str], ...]
    labels: dict[str, str]
    signals: tuple[str, ...]
    uses_cost: bool
    line: int
    target: str = ""
    role: str = "aggregated"


@dataclass(frozen=True)
class CompiledVerify:
    """The compiled ``verify`` section: ordered ``rules``, the ``context_plan`` their
    conditions read (``draft`` among the roots when they read it) and ``prefix_tokens``: the
    draft tokens a gateway verifies while the draft streams (None: the whole draft)."""

    rules: tuple[CompiledVerifyRule, ...]
    context_plan: Plan = field(default_factory=dict)
    uses_cost: bool = False
    prefix_tokens: int | None = None


@dataclass(frozen=True)
class CompiledPolicy:
    """A policy ready to evaluate. ``revision``: sha256 of the file text (16 hex);
    ``fleet_revision``: the fleet it was checked against; ``context_plan``: what conditions
    read (see the module docstring); ``staleness``, ``filters``, ``selection``,
    ``disaggregation``: the policy's settings sections (defaults when absent)."""

    name: str
    file: str
    revision: str
    fleet_revision: str
    rules: tuple[CompiledRule, ...]
    variables: dict[str, JSONValue]
    labels: dict[str, str]
    context_plan: Plan = field(default_factory=dict)
    uses_cost: bool = False
    staleness: StalenessPolicy = StalenessPolicy()
    filters: FiltersSpec = FiltersSpec()
    selection: EndpointSelectionSpec = EndpointSelectionSpec()
    disaggregation: DisaggregationSpec = DisaggregationSpec()
    verify: CompiledVerify | None = None
    #: Rules left out because the fleet lacks a target of their ``if_fleet_has``: (name, reason).
    omitted: tuple[tuple[str, str], ...] = ()
    #: Per rule, what the conditions up to and including it read (the plans of rules 0..i merged; a
    #: rule that reads nothing new shares the previous rule's object): the engine builds the CEL
    #: context rule by rule, so a decision made by an early rule computes no signal only later ones
    #: read (``policy.engine.decide``). Empty: build ``context_plan`` at once.
    rule_plans: tuple[Plan, ...] = ()
    #: The YAML text compiled (what serves, whatever the file holds now).
    source: str = field(default="", repr=False, compare=False)


class _Checker:
    """Collects located problems while compiling one policy document."""

    def __init__(self, doc: LocatedDocument, fleet: Fleet) -> None:
        self.doc = doc
        self.fleet = fleet
        self.problems: list[Problem] = []
        self._probes: tuple[Mapping[str, JSONValue], list[Snapshot]] | None = None

    def probes(self, variables: Mapping[str, JSONValue]) -> list[Snapshot]:
        """The type probe's snapshots (built once per compile)."""
        if self._probes is None or self._probes[0] is not variables:
            self._probes = (variables, _probe_snapshots(self.fleet, variables))
        return self._probes[1]

    def add(self, path: Path_, code: str, message: str, *, key: bool = False) -> None:
        """Record a problem at the node (or key) at ``path``."""
        line, col = self.doc.mark(path, key=key)
        self.problems.append(Problem(self.doc.file, line, col, code, message))

    def add_at(self, path: Path_, offset: int, code: str, message: str) -> None:
        """Record a problem at character ``offset`` inside the scalar at ``path``."""
        line, col = self.doc.scalar_position(path, offset)
        self.problems.append(Problem(self.doc.file, line, col, code, message))

    def target(self, path: Path_, name: str, *, key: bool = False) -> bool:
        """True if ``name`` is a fleet target, else record ``unknown-target`` with did-you-mean."""
        if name in self.fleet.targets:
            return True
        self.add(path, "unknown-target", f"unknown target '{name}'{did_you_mean(name, self.fleet.targets)}"
                 f" (the fleet has {', '.join(self.fleet.targets)})", key=key)
        return False


def _cel_syntax_position(message: str, source: str) -> tuple[int, str]:
    """(character offset in ``source``, short message) of the first error in a CEL parse error."""
    m = _CEL_ERROR.search(message)
    if not m:
        return 0, message.strip().splitlines()[0] if message.strip() else "syntax error"
    line, col, text = int(m.group(1)), int(m.group(2)), m.group(3).strip()
    lines = source.split("\n")
    offset = sum(len(text_line) + 1 for text_line in lines[: line - 1]) + col - 1
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


def _always_true(cond: _Condition) -> bool:
    """Whether a compiled condition reads nothing (no signal, variable or ``cost()``) and is true: as
    unconditional as a rule without ``when``."""
    if cond.program is None or cond.paths or cond.uses_cost:
        return False
    try:
        return cond.program.execute(cel.Context()) is True
    except Exception:  # noqa: BLE001 - an error at run time (any kind cel raises): the rule never matches
        return False


def _add_plan(plan: Plan, root: str, key: str | None, fields: set[str] | None) -> None:
    """Merge one read into ``plan`` (``key`` for keyed roots; ``fields`` None = whole)."""
    if root in plan and plan[root] is None:
        return
    if key is None:
        current = plan.get(root)
        plan[root] = None if fields is None else (set(current) if isinstance(current, AbstractSet) else set()) | fields
        return
    keyed = plan.get(root)
    if not isinstance(keyed, dict):
        keyed = {}
        plan[root] = keyed
    if fields is None:
        keyed[key] = None
    else:
        have = keyed.get(key, set())
        if have is not None:
            keyed[key] = set(have) | fields


def merge_plans(into: Plan, other: Plan) -> None:
    """Merge context plan ``other`` into ``into`` (in place)."""
    for root, value in other.items():
        if value is None:
            into[root] = None
        elif isinstance(value, dict):
            for key, fields in value.items():
                _add_plan(into, root, key, None if fields is None else set(fields))
        else:
            _add_plan(into, root, None, set(value))


@dataclass
class _Condition:
    program: cel.Program | None = None
    paths: tuple[str, ...] = ()
    uses_cost: bool = False
    plan: Plan = field(default_factory=dict)
    source: str = ""
    calls: tuple[tuple[str, str], ...] = ()


def _check_condition(ck: _Checker, i: int, source: str, variables: Mapping[str, JSONValue], target: str | None,
                     role: str, *, where: Path_ = ("rules",), signals: Mapping[str, Namespace] = SIGNALS,
                     probe_extra: Mapping[str, object] | None = None) -> _Condition:
    """Check one ``when`` and compile it (rewritten for relative namespaces); see the module doc.
    ``where``: the rules list's path (``("verify", "rules")`` for verify rules); ``signals``: the
    namespaces it may read; ``probe_extra``: namespaces added to the type probe's snapshots."""
    path = (*where, i, "when")
    out = _Condition(source=source)
    if not source.strip():
        ck.add(path, "cel-syntax", "empty condition: omit 'when' for an unconditional rule")
        return out
    try:
        cel.compile(source)
    except ValueError as exc:
        offset, text = _cel_syntax_position(str(exc), source)
        ck.add_at(path, offset, "cel-syntax", text)
        return out
    found = scan(source)
    ok = True
    paths: list[str] = []
    rewrites: list[tuple[int, int, str]] = []
    targets = ck.fleet.targets
    for ref in found.refs:
        if ref.root in found.bound or ref.root in CEL_TYPE_NAMES:
            continue
        ns = signals.get(ref.root)
        if ns is None:
            ok = False
            if ref.root in variables:
                msg = f"unknown name '{ref.root}'; did you mean 'variables.{ref.root}'?"
            elif ref.root in VERIFY_SIGNALS:
                msg = f"'{ref.root}' is readable in the verify section's rules only"
            else:
                msg = f"unknown name '{ref.root}'{did_you_mean(ref.root, signals)}"
            ck.add_at(path, ref.offset, "unknown-signal", msg)
            continue
        fields = set(variables) if ns.fields is None else set(ns.fields)
        dynamic = ref.root in found.dynamic_roots
        if ns.shape == "by_target":
            if not ref.keyed or dynamic:
                if ref.field is not None and not ref.keyed:  # load.onprem_70b: a member, not a key
                    ok = False
                    ck.add_at(path, ref.field_offset or ref.offset, "unknown-signal",
                              f"'{ref.root}' is keyed by target: write {ref.root}[\"<target>\"].<field>")
                    continue
                _add_plan(out.plan, ref.root, None, None)
                paths.append(ref.root)
                continue
            if ref.field not in targets:
                ok = False
                ck.add_at(path, ref.field_offset or ref.offset, "unknown-target",
                          f"unknown target '{ref.field}' in {ref.root}[]{did_you_mean(ref.field or '', targets)}")
                continue
            if ref.member is None:
                _add_plan(out.plan, ref.root, ref.field, None)
                paths.append(ref.path)
                continue
            if ref.member not in fields:
                ok = False
                hint = did_you_mean(ref.member, fields)
                ck.add_at(path, ref.member_offset or ref.offset, "unknown-signal",
                          f"unknown signal '{ref.root}[\"{ref.field}\"].{ref.member}'{hint}")
                continue
            _add_plan(out.plan, ref.root, ref.field, {ref.member})
            paths.append(ref.path)
            continue
        internal, key = ref.root, None
        if ns.shape == "relative":
            if target is None:  # the rule's target is unknown (already reported): check names only
                target = ""
            internal, key = RELATIVE_ROOTS[ref.root], relative_key(ref.root, target, role)
            rewrites.append((ref.offset, len(ref.root), f'{internal}["{key}"]'))
        if ref.field is None or dynamic:
            _add_plan(out.plan, internal, key, None)
            paths.append(ref.root)
            continue
        if ref.field not in fields:
            ok = False
            code = "unknown-variable" if ref.root == "variables" else "unknown-signal"
            what = "variable" if ref.root == "variables" else "signal"
            hint = did_you_mean(ref.field, fields)
            hint = hint.replace("'", f"'{ref.root}.", 1) if hint else ""
            ck.add_at(path, ref.field_offset or ref.offset, code, f"unknown {what} '{ref.root}.{ref.field}'{hint}")
            continue
        _add_plan(out.plan, internal, key, {ref.field})
        paths.append(f"{ref.root}.{ref.field}")
    known_functions = set(FUNCTIONS) | CEL_BUILTINS
    calls: list[tuple[str, str]] = []
    for call in [*found.calls, *found.methods]:
        if call.name in FUNCTIONS:
            out.uses_cost = out.uses_cost or call.name == "cost"
            if call.arg is not None:
                calls.append((call.name, call.arg))
            if call.name == "cost" and call.arg is not None and call.arg not in targets:
                ok = False
                ck.add_at(path, call.arg_offset or call.offset, "unknown-target",
                          f"unknown target '{call.arg}' in cost(){did_you_mean(call.arg, targets)}")
        elif call.name not in known_functions:
            ok = False
            ck.add_at(path, call.offset, "unknown-function",
                      f"unknown function '{call.name}'{did_you_mean(call.name, known_functions)}")
    toks = tokenize(source)
    for j, tok in enumerate(toks[:-5]):  # load[variables.X], predict[variables.X], cost(variables.X): X a target
        close = {"load": "]", "predict": "]", "cost": ")"}.get(tok.text)
        name = toks[j + 4].text
        if close is None or [t.text for t in toks[j + 1:j + 6]] != ["[" if close == "]" else "(", "variables", ".", name, close] \
                or name not in variables:
            continue
        value = variables[name]
        if not isinstance(value, str) or value not in targets:
            ok = False
            shown = f"{tok.text}[variables.{name}]" if close == "]" else f"cost(variables.{name})"
            ck.add_at(path, toks[j + 4].offset, "unknown-target", f"variables.{name} holds {json.dumps(value)}, not a "
                      f"target of the fleet, so {shown} fails on every request{did_you_mean(str(value), targets)}")
    out.paths = tuple(dict.fromkeys(paths))
    out.calls = tuple(dict.fromkeys(calls))
    if not ok:
        return out
    rewritten = source
    for offset, length, text in sorted(rewrites, reverse=True):
        rewritten = rewritten[:offset] + text + rewritten[offset + length:]
    out.program = cel.compile(rewritten)
    # a relative name without a route to read it for is reported by the caller (verify accept rules)
    targetless = not target and any(p.split(".")[0] in RELATIVE_ROOTS for p in out.paths)
    _probe(ck, path, out.program, variables, probe_extra, always_error=not targetless, plan=out.plan)
    for problem in _mixed_equalities(rewritten, ck.probes(variables)):
        ck.add(path, "type-error", problem)
    snapshots = [{**probe, **(probe_extra or {})} for probe in ck.probes(variables)]
    for offset, problem in _null_inequalities(source, out.program, out.plan, signals, snapshots):
        ck.add_at(path, offset, "null-inequality", problem)
    for offset, problem in _out_of_range(source, signals, variables):
        ck.add_at(path, offset, "out-of-range", problem)
    for offset, problem in _integer_divisions(source, signals, variables):
        ck.add_at(path, offset, "integer-division", problem)
    names = [p for p in out.paths if p in _CANONICAL_SIGNALS]
    strings: list[tuple[int, str, str | None]] = [
        (t.offset, v, None) for t in (tokenize(source) if names else ()) if t.kind == "str"
        for v in (_string_value(t.text),) if v is not None]
    strings += [(ref.offset, v, f"variables.{ref.field}") for ref in (found.refs if names else ()) if ref.root == "variables"
                for value in (variables.get(ref.field or ""),)
                for v in (value if isinstance(value, list) else [value]) if isinstance(v, str)]
    for offset, value, held in strings:
        if canonical(value) != value:
            ck.add_at(path, offset, "non-canonical-string",
                      f"{f'{held} holds ' if held else ''}{json.dumps(value)}, not in the form {', '.join(names)} is read "
                      f"in (NFC, without zero-width or other invisible characters), so the two are never equal: write "
                      f"{json.dumps(canonical(value))}")
    return out


#: Signals read in ``request.canonical`` form: a string literal compared with one must be in it too.
_CANONICAL_SIGNALS = frozenset({"request.tenant", "request.team", "request.session_id", "request.slo_class"})


_FLIPPED = {"<": ">", "<=": ">=", ">": "<", ">=": "<="}


def _out_of_range(source: str, signals: Mapping[str, Namespace], variables: Mapping[str, JSONValue]) -> list[tuple[int, str]]:
    """Comparisons (``<``, ``<=``, ``>``, ``>=``) of a signal in [0, 1] (``Signal.fraction``) with a number, or a
    numeric variable, that no value in [0, 1] decides: ``difficulty.p_hard >= 45`` is never true, ``<= 45``
    always (a threshold in percent). Each operand must stand apart (``_APART``); arithmetic is not followed.
    Returns (character offset of the number, message), in source order."""
    tokens = tokenize(source)
    out: list[tuple[int, str]] = []
    for i, tok in enumerate(tokens):
        if tok.text not in _FLIPPED:
            continue
        left, right = _operand(tokens, i, -1), _operand(tokens, i, 1)
        for side, other, op in ((left, right, tok.text), (right, left, _FLIPPED[tok.text])):
            keys = _chain_keys(side)
            ns = signals.get(keys[0]) if keys else None
            if keys is None or ns is None or not ns.fields:
                continue
            name = keys[2] if ns.shape == "by_target" and len(keys) == 3 else keys[1] if len(keys) == 2 else None
            signal = ns.fields.get(name) if name is not None else None
            if signal is None or not signal.fraction:
                continue
            number, what = _number(other, variables)
            if number is None:
                continue
            never = {">": number >= 1, ">=": number > 1, "<": number <= 0, "<=": number < 0}[op]
            always = {">": number < 0, ">=": number < 0, "<": number > 1, "<=": number > 1}[op]
            if never or always:
                shown = f'{keys[0]}["{keys[1]}"].{keys[2]}' if ns.shape == "by_target" else ".".join(keys)
                out.append((other[0].offset, f"'{shown}' is in [0, 1]: '{op} {what} is {'never' if never else 'always'} "
                            "true (a threshold in percent? write it as a fraction)"))
    return sorted(out)


def _integer_divisions(source: str, signals: Mapping[str, Namespace],
                       variables: Mapping[str, JSONValue]) -> list[tuple[int, str]]:
    """Quotients of two ints (``request.prompt_tokens / 1000``: an int signal, literal or variable on each side)
    compared with a number where CEL's truncating int division answers otherwise than the quotient would:
    ``900 / 1000 >= 0.5`` is false (0 >= 0.5), ``1500 / 1000 > 1`` false, ``1500 / 1000 == 1`` true. Only ``>=``
    and ``<`` with a whole number agree for every value (``x / 1000 >= 2`` is ``x >= 2000``). Each side of
    the comparison must stand apart (``_APART``). Returns (character offset of the ``/``, message), in source order."""
    def is_int(part: list[Token]) -> bool:
        if len(part) == 1 and part[0].kind == "num":
            return not any(c in part[0].text.lower() for c in ".eu") or part[0].text.lower().startswith("0x")
        keys = _chain_keys(part)
        if keys is None or len(keys) < 2:
            return False
        if keys[0] == "variables":
            value = variables.get(keys[1])
            return isinstance(value, int) and not isinstance(value, bool)
        ns = signals.get(keys[0])
        name = keys[2] if ns is not None and ns.shape == "by_target" and len(keys) == 3 else keys[1]
        signal = ns.fields.get(name) if ns is not None and ns.fields else None
        return signal is not None and signal.type == "int"

    tokens = tokenize(source)
    out: list[tuple[int, str]] = []
    for i, tok in enumerate(tokens):
        if tok.text not in _FLIPPED and tok.text not in ("==", "!="):
            continue
        left, right = _operand(tokens, i, -1), _operand(tokens, i, 1)
        for side, other, op in ((left, right, tok.text), (right, left, _FLIPPED.get(tok.text, tok.text))):
            slashes = [k for k, t in enumerate(side) if t.text == "/"]
            number, what = _number(other, variables)
            if len(slashes) != 1 or number is None or (number.is_integer() and op in (">=", "<")):
                continue
            k = slashes[0]
            if is_int(side[:k]) and is_int(side[k + 1:]):
                text = source[side[0].offset:side[-1].offset + len(side[-1].text)]
                out.append((side[k].offset, f"'{text}' divides two ints, which truncates (1500 / 1000 is 1), so "
                            f"'{op} {what} is not what it says of the quotient: write double(...) / ... (or compare "
                            "the product: x >= 500 for x / 1000 >= 0.5)"))
    return sorted(out)


def _number(part: list[Token], variables: Mapping[str, JSONValue]) -> tuple[float | None, str]:
    """The number an operand stands for: a literal (``45``, ``-0.5``) or ``variables.NAME`` holding a number
    (its value shown beside it); ``(None, "")`` otherwise. The text shown ends the quote the message opens."""
    texts = [t.text for t in part]
    sign = -1.0 if texts[:1] == ["-"] else 1.0
    rest = part[1:] if sign < 0 else part
    if len(rest) == 1 and rest[0].kind == "num" and not rest[0].text.lower().startswith("0x"):
        try:
            return sign * float(rest[0].text.rstrip("uU")), "".join(texts) + "'"
        except ValueError:
            return None, ""
    keys = _chain_keys(part)
    if keys is not None and len(keys) == 2 and keys[0] == "variables":
        value = variables.get(keys[1])
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            return float(value), f"variables.{keys[1]}' ({value})"
    return None, ""


def _endpoint_keys(fleet: Fleet) -> list[str]:
    return [relative_key("endpoint", t, role) for t in fleet.targets for role in ("aggregated", "decode", "api", "auto")]


def _probe_snapshots(fleet: Fleet, variables: Mapping[str, JSONValue]) -> list[Snapshot]:
    """Two snapshots for the type probe: typical (idle, short, easy) and busy (long, hard, tools)."""
    typical = example_signals(variables, fleet.targets)
    # nulls would fail any comparison: the probe reads utilizations as known
    typical_load: LoadSignals = {**example_load(), "prefill_utilization": 0.5, "decode_utilization": 0.5}
    typical_endpoint: EndpointSignals = {**example_endpoint(), "prefill_utilization": 0.5, "decode_utilization": 0.5}
    typical["load"] = {t: typical_load for t in fleet.targets}
    typical["_endpoint"] = {k: typical_endpoint for k in _endpoint_keys(fleet)}
    busy = example_signals(variables, fleet.targets)
    busy["request"] = {"prompt_tokens": 20000, "prompt_tokens_exact": True, "prompt_tokens_upper": 20000,
                       "longest_prompt_tokens_upper": 5000,
                       "max_output_tokens": 2048, "max_output_tokens_set": True, "turns": 6,
                       "messages": 12, "has_tools": True, "has_images": True, "images": 1, "images_low_detail": 1,
                       "has_audio": True, "has_files": True,
                       "has_cache_control": True, "has_cache_control_1h": True, "stored_state": "previous_response_id",
                       "tenant": "acme",
                       "team": "search", "session_id": "s-1", "slo_class": "interactive", "model": "gpt-4o"}
    busy["difficulty"] = {"p_hard": 0.9, "available": True}
    load: LoadSignals = {
        "num_requests_running": 64, "num_requests_waiting": 40, "kv_cache_usage": 0.95, "ttft_p50_ms": 2500.0,
        "tpot_p50_ms": 80.0, "prefill_utilization": 0.9, "decode_utilization": 0.9, "inflight_requests": 100,
        "outstanding_requests": 104, "age_s": 3.0, "stale": False, "saturated": False, "endpoints": 4,
        "healthy_endpoints": 3, "prefill_queue_s": 3.0, "prefill_saturated": True}
    busy["load"] = {t: load for t in fleet.targets}
    busy["_cache"] = {t: {"prefix_hit_ratio": 0.9, "prefix_hit_tokens": 18000, "shared_hit_ratio": 0.05,
                          "endpoint": "e-0", "session_endpoint": "e-0", "session_target": t} for t in fleet.targets}
    ep: EndpointSignals = {
        "num_requests_running": 64, "num_requests_waiting": 40, "kv_cache_usage": 0.95, "ttft_p50_ms": 2500.0,
        "tpot_p50_ms": 80.0, "prefill_utilization": 0.9, "decode_utilization": 0.9, "inflight_requests": 100,
        "outstanding_requests": 104, "age_s": 3.0, "stale": False, "saturated": False, "name": "e-0",
        "url": "http://e-0/v1", "healthy": True, "prefix_hit_ratio": 0.9, "cost_s": 1.5, "predicted_ttft_s": 3.5,
        "predicted_tpot_s": 0.15}
    busy["_endpoint"] = {k: ep for k in _endpoint_keys(fleet)}
    busy["predict"] = {t: {**example_predict(3.5, 0.15), "mode": "disaggregated", "queue_s": 2.0, "prefill_s": 1.2,
                           "transfer_s": 0.3, "disaggregated_ttft_s": 3.5, "disaggregated_tpot_s": 0.15}
                       if "disaggregated" in fleet.targets[t].modes else example_predict(3.5, 0.15)
                       for t in fleet.targets}
    busy["budget"] = {"limited": True, "remaining_usd": 1.5, "spent_usd": 98.5, "limit_usd": 100.0,
                      "spent_fraction": 0.985, "window": "day", "window_elapsed_fraction": 0.6, "pace_gap": 0.385,
                      "scope": "tenant:acme"}
    return [typical, busy]


def _reads_null(plan: Plan, snapshot: Mapping[str, object]) -> bool:
    """Whether a field the condition's ``plan`` names is null in ``snapshot`` (roots read whole: not looked at)."""
    for root, fields in plan.items():
        ns = snapshot.get(root)
        keyed = fields.items() if isinstance(fields, dict) else ((None, fields),)
        for key, names in keyed:
            value = ns.get(key) if key is not None and isinstance(ns, Mapping) else ns
            if isinstance(value, Mapping) and names is not None and any(value.get(f, 0) is None for f in names):
                return True
    return False


def _probe(ck: _Checker, path: Path_, program: cel.Program, variables: Mapping[str, JSONValue],
           extra: Mapping[str, object] | None = None, *, always_error: bool = True, plan: Plan | None = None) -> None:
    """Run the condition on the probe snapshots (plus ``extra`` namespaces) to catch type errors
    and non-boolean results, and conditions that fail on every probe (``x / 0``: the rule never fires).
    A missing overload is a type error only on a snapshot where no field the condition reads (``plan``) is
    null: a null there (``predict[t].disaggregated_ttft_s`` of an idle target) fails that probe alone."""
    errors: list[str] = []
    for probe in ck.probes(variables):
        snapshot: dict[str, object] = {**probe, **(extra or {})}
        ctx = cel.Context(snapshot, {"cost": lambda target: 0.001})
        try:
            result = program.execute(ctx)
        except TypeError as exc:
            if "No such overload" in str(exc) and not _reads_null(plan or {}, snapshot):
                ck.add(path, "type-error", "an operator or function is applied to mismatched types "
                       "(CEL never converts between int, double and string; use double(x), int(x) or string(x))")
                return
            errors.append(str(exc))
            continue
        except Exception as exc:  # data-dependent errors (missing keys, division by zero) surface at run time
            errors.append(str(exc))
            continue
        if not isinstance(result, bool):
            ck.add(path, "not-boolean", f"condition must be true or false, but gives {type(result).__name__} "
                   f"{result!r} on a typical request")
            return
    if always_error and len(errors) == len(ck.probes(variables)):
        ck.add(path, "always-error", f"condition fails on a typical and a busy request ({errors[0]}), so the rule "
               "would be skipped on every request and never fire")


#: Tokens that may stand right before or after an operand of ``==``/``!=`` read alone (not a sum's part).
_APART = frozenset({"(", ")", "&&", "||", "!", "?", ":", ","})


def _kind(value: object) -> str | None:
    """CEL's type family of a probe value or literal: bool, number or string; None for anything else."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    return "string" if isinstance(value, str) else None


def _mixed_equalities(source: str, snapshots: list[Snapshot]) -> list[str]:
    """Equalities that can never hold: a signal compared by ``==``/``!=`` with a literal of another type
    family (``difficulty.available == "false"``, ``request.prompt_tokens == "0"``). CEL answers them false
    (true for ``!=``) without an error, so the probe cannot see them; the signal's type is its value in
    ``snapshots`` (the probes; a null says nothing). Only a chain (``root.field``, ``root["key"].field``)
    against one literal token, each operand standing apart (``_APART`` or the expression's end beyond it).
    Returns the messages, each once (empty when none)."""
    tokens = tokenize(source)
    out: dict[str, None] = {}
    for i, tok in enumerate(tokens):
        if tok.text not in ("==", "!="):
            continue
        left, right = _operand(tokens, i, -1), _operand(tokens, i, 1)
        for lits, chain in ((right, left), (left, right)):
            if len(lits) != 1:
                continue
            lit = lits[0]
            literal: object = None
            if lit.kind == "str":
                literal = _string_value(lit.text)
            elif lit.text in ("true", "false"):
                literal = lit.text == "true"
            elif lit.kind == "num" and not lit.text.lower().startswith("0x") and lit.text[-1] not in "uU":
                literal = float(lit.text)
            path = _chain_keys(chain)
            if _kind(literal) is None or path is None:
                continue
            for snapshot in snapshots:
                value: object = snapshot
                for key in path:
                    value = value.get(key) if isinstance(value, Mapping) else None
                if _kind(value) is not None and _kind(value) != _kind(literal):
                    never = "false" if tok.text == "==" else "true"
                    name = "".join(t.text for t in chain)
                    out[f"'{name}' is a {_kind(value)} and {lit.text} a {_kind(literal)}: '{tok.text}' between "
                        f"them is always {never} in CEL, which never converts (compare with a {_kind(value)})"] = None
    return list(out)


#: Most contexts ``_null_inequalities`` runs a condition on with its signal null, per signal, and most runs of the
#: condition it makes per signal (~25 us each; a policy check of latency-first.yaml: +30 ms).
MAX_NULL_CONTEXTS = 256
MAX_NULL_RUNS = 400


def _null_inequalities(source: str, program: cel.Program, plan: Plan, signals: Mapping[str, Namespace],
                       snapshots: Sequence[Mapping[str, object]]) -> list[tuple[int, str]]:
    """Nullable signals (``Signal.nullable``: null when nothing reports them) a condition is true at while null
    and false at some value of, the other signals it reads the same: CEL's ``null != 0`` is true and
    ``null == 0`` false, neither an error, so ``x != 0``, ``!(x == 0)``, ``(x == 0) == false``,
    ``x == 0 ? false : true``, ``[x].exists(v, v != 0)`` or ``![0].exists(v, v == x)`` fire when the signal is
    unknown (an idle fleet without telemetry), where a null compared otherwise skips the rule. Found by running
    ``program`` (``source`` compiled, relative names rewritten; ``plan`` its reads) on CEL: each signal null and
    at values (the condition's numbers and strings, the numbers of the variables it reads, each number +-1, 0, 1, -1, 0.5, an int
    signal's integers around them; ``false``/``true``; the value making it false may be a double for an int signal:
    ``x != 0.5`` is named), the others at those values and null when nullable (every combination up to
    ``MAX_NULL_CONTEXTS``, else one at a time) on each probe snapshot (``snapshots``), ``MAX_NULL_RUNS`` runs at
    most: a signal named is true at null in one of them (no false alarm), one true at null only at values not
    tried is missed. A condition that compares the signal with ``null`` handles a null as its author means and is
    not named. Returns
    (character offset of the signal's first read in ``source``, message), in source order."""
    found = scan(source)
    tokens = tokenize(source)
    guarded: set[tuple[str | None, ...]] = set()
    for i, tok in enumerate(tokens):
        if tok.text in ("==", "!="):
            left, right = _operand(tokens, i, -1), _operand(tokens, i, 1)
            for other, chain in ((right, left), (left, right)):
                chain_keys = _chain_keys(chain)
                if chain_keys is not None and len(other) == 1 and other[0].text == "null":
                    guarded.add(tuple(chain_keys))
    numbers: set[float] = {0.0, 1.0, -1.0, 0.5}
    strings: set[str] = {""}
    for tok in tokens:
        if tok.kind == "num" and not tok.text.lower().startswith("0x") and tok.text[-1] not in "uU":
            numbers |= {float(tok.text), -float(tok.text)}
        elif tok.kind == "str" and (text := _string_value(tok.text)) is not None:
            strings.add(text)
    variables = snapshots[0].get("variables") if snapshots else None
    read = plan.get("variables")
    for name in read if isinstance(read, AbstractSet) else ():
        value = variables.get(name) if isinstance(variables, Mapping) else None
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            numbers |= {float(value), -float(value)}
    numbers |= {n + d for n in list(numbers) for d in (1.0, -1.0)}

    def domain(signal: Signal) -> list[object]:
        values: list[object] = []
        if signal.type == "bool":
            values += [False, True]
        elif signal.type == "double":
            values += sorted(numbers)
        elif signal.type == "int":
            values += sorted({math.floor(n) for n in numbers} | {math.ceil(n) for n in numbers})
        elif signal.type == "string":
            values += sorted(strings)
        return values

    def values_of(signal: Signal) -> list[object]:  # a value that makes it false: an int's at the doubles too
        return [*domain(signal), *(sorted(numbers) if signal.type == "int" else [])]

    # the typed signals read: (internal root, key or None, field) -> (its Signal, its first read, its keys)
    leaves: dict[tuple[str, str | None, str], tuple[Signal, Ref, tuple[str | None, ...]]] = {}
    for ref in found.refs:
        ns = signals.get(ref.root)
        if ns is None or ref.root in found.bound or ref.root == "variables":
            continue
        root, key, field = ref.root, ref.field, ref.member
        keys: tuple[str | None, ...] = (ref.root, ref.field, ref.member)
        if ns.shape != "by_target":
            root, key, field, keys = RELATIVE_ROOTS.get(ref.root, ref.root), None, ref.field, (ref.root, ref.field)
            keyed = plan.get(root)
            if ns.shape == "relative" and isinstance(keyed, dict) and keyed:  # the rewritten read's key
                key = next(iter(keyed))
        signal = (ns.fields or {}).get(field) if field is not None else None
        if field is not None and signal is not None and (root, key, field) not in leaves and domain(signal):
            leaves[(root, key, field)] = (signal, ref, keys)

    # each probe snapshot's namespaces as the plan reads them, once (``run`` copies the ones it sets)
    bases: list[dict[str, object]] = [{root: _planned(snap[root], plan[root]) for root in plan if root in snap}
                                      for snap in snapshots]

    def run(base: Mapping[str, object], values: Mapping[tuple[str, str | None, str], object]) -> object:
        ctx = dict(base)
        for (root, key, field), value in values.items():
            ns = dict(ctx.get(root) or {})  # type: ignore[call-overload]  # a namespace: a mapping
            if key is None:
                ns[field] = value
            else:
                ns[key] = {**(ns.get(key) or {}), field: value}
            ctx[root] = ns
        try:
            return program.execute(cel.Context(ctx, {"cost": lambda target: 0.001}))
        except Exception:  # noqa: BLE001 - any error CEL raises: the rule is skipped, it does not fire
            return None

    out: list[tuple[int, str]] = []
    for leaf, (signal, ref, keys) in leaves.items():
        if not signal.nullable or keys in guarded:
            continue
        others = [(o, [*domain(s), *([None] if s.nullable else [])]) for o, (s, _, _) in leaves.items() if o != leaf]
        if math.prod(len(d) for _, d in others) * len(snapshots) <= MAX_NULL_CONTEXTS:
            assignments: list[dict[tuple[str, str | None, str], object]] = [
                dict(zip([o for o, _ in others], combo)) for combo in itertools.product(*(d for _, d in others))]
        else:
            assignments = [{}, *({o: v} for o, d in others for v in d)][:MAX_NULL_CONTEXTS // max(1, len(snapshots))]
        runs = itertools.count()  # each run of the program, against MAX_NULL_RUNS
        witness = next(((base, values) for base in bases for values in assignments
                        if next(runs) < MAX_NULL_RUNS and run(base, {**values, leaf: None}) is True
                        and any(next(runs) < MAX_NULL_RUNS and run(base, {**values, leaf: v}) is False
                                for v in values_of(signal))), None)
        if witness is not None:
            out.append((ref.offset, f"'{ref.path}' is null when unknown, and in CEL the condition is then true, not "
                        f"an error (null != 0 is true, null == 0 false): the rule would fire whenever nothing reports "
                        f"it (guard it: {ref.path} != null && ..., or compare with < or >)"))
    return sorted(out)


def _planned(namespace: object, fields: Fields | dict[str, Fields]) -> object:
    """The part of a snapshot's ``namespace`` a plan entry reads (a CEL context converts every value it holds)."""
    if not isinstance(namespace, Mapping) or fields is None:
        return namespace
    if isinstance(fields, dict):
        return {key: _planned(namespace[key], names) for key, names in fields.items() if key in namespace}
    return {name: namespace[name] for name in fields if name in namespace}


def _operand(tokens: list[Token], op: int, direction: int) -> list[Token]:
    """The tokens from the operator at ``op`` to the nearest ``_APART`` token (or the end) in ``direction``
    (-1 before it, 1 after it), in source order."""
    j = op + direction
    while 0 <= j < len(tokens) and tokens[j].text not in _APART:
        j += direction
    return tokens[j + 1:op] if direction < 0 else tokens[op + 1:j]


def _chain_keys(part: list[Token]) -> list[str] | None:
    """The keys of a selection chain (``a.b``, ``a["k"].m``): ``["a", "b"]``; None when ``part`` is not one."""
    if not part or part[0].kind != "ident":
        return None
    path, k = [part[0].text], 1
    while k < len(part):
        if part[k].text == "." and k + 1 < len(part) and part[k + 1].kind == "ident":
            path.append(part[k + 1].text)
            k += 2
        elif part[k].text == "[" and k + 2 < len(part) and part[k + 1].kind == "str" and part[k + 2].text == "]":
            key = _string_value(part[k + 1].text)
            if key is None:
                return None
            path.append(key)
            k += 3
        else:
            return None
    return path


def _role(fleet: Fleet, target: str | None, mode: str) -> str:
    """The pool role of a route's endpoint (what ``endpoint.*`` reads): ``auto`` for an ``auto`` route on a
    target with an aggregated pool and prefill/decode pools (the role of the mode it runs in, decided when
    read: ``live.LiveSignals.endpoint``)."""
    if target is None or target not in fleet.targets:
        return "aggregated"
    t = fleet.targets[target]
    if isinstance(t, FrontierTarget):
        return "api"
    if mode == "auto" and t.pools.aggregated is not None and t.pools.decode is not None:
        return "auto"
    if mode == "disaggregated" or (mode == "auto" and t.pools.aggregated is None):
        return "decode"
    return "aggregated"


def _resolve_mode(fleet: Fleet, target: str, mode: str | None) -> str:
    """The route mode for ``target``: ``mode`` if it supports it (``auto`` on a one-mode target
    becomes that mode), else the target's default."""
    modes = fleet.targets[target].modes
    if mode == "auto":
        return "auto" if len(modes) > 1 else modes[0]
    return mode if mode in modes else modes[0]


def _expand_fallbacks(ck: _Checker, fleet: Fleet, rules: list[tuple[int, RuleSpec]],
                      modes: dict[int, str | None],
                      invalid_names: frozenset[str] = frozenset()) -> dict[int, tuple[tuple[str, str], ...]]:
    """Every rule's candidates: its target, then its fallbacks expanded (``rule:NAME`` = that
    rule's candidates, recursively); reports unknown rules and cycles at the reference.
    ``invalid_names``: rules that exist but failed validation (their problems are already
    reported): a reference to one is skipped, not reported as unknown."""
    by_name = {r.name: i for i, r in rules}
    specs = dict(rules)
    done: dict[int, tuple[tuple[str, str], ...]] = {}
    reported: set[tuple[int, int]] = set()

    def expand(i: int, stack: list[int]) -> tuple[tuple[str, str], ...]:
        if i in done:
            return done[i]
        rule = specs[i]
        route, mode = rule.route, modes.get(i)
        out: list[tuple[str, str]] = []
        if route.target in fleet.targets and mode is not None:
            out.append((route.target, mode))
        for j, item in enumerate(route.fallbacks):
            if isinstance(item, str) and item.startswith(RULE_REF):
                name = item[len(RULE_REF):]
                k = by_name.get(name)
                if k is None and (name in invalid_names or name.startswith(_DROPPED)):
                    continue
                if k is None or k in stack:
                    if (i, j) not in reported:
                        reported.add((i, j))
                        if k is None:
                            ck.add(("rules", i, "route", "fallbacks", j), "unknown-rule",
                                   f"unknown rule '{name}' in fallbacks{did_you_mean(name, by_name)}")
                        else:
                            chain = [specs[s].name for s in stack[stack.index(k):]] + [name]
                            ck.add(("rules", i, "route", "fallbacks", j), "fallback-cycle",
                                   "fallbacks refer back to a rule being expanded: "
                                   + " -> ".join(f"rule '{n}'" for n in chain))
                    continue
                out.extend(expand(k, [*stack, k]))
                continue
            fb_target, fb_mode = (item.target, item.mode) if isinstance(item, FallbackSpec) else (item, None)
            if fb_target not in fleet.targets:
                continue
            if fb_mode is not None and fb_mode != "auto" and fb_mode not in fleet.targets[fb_target].modes:
                continue
            out.append((fb_target, _resolve_mode(fleet, fb_target, fb_mode or mode)))
        seen: set[str] = set()
        kept = []
        for c in out:
            if c[0] not in seen:
                seen.add(c[0])
                kept.append(c)
        unique = tuple(kept)
        done[i] = unique
        return unique

    for i, _ in rules:
        expand(i, [i])
    return done


def _check_route(ck: _Checker, fleet: Fleet, i: int, rule: RuleSpec) -> str | None:
    """Check a rule's target, mode and fallbacks; returns its resolved mode (None if the target is unknown)."""
    route = rule.route
    mode: str | None = None
    if ck.target(("rules", i, "route", "target"), route.target):
        modes = fleet.targets[route.target].modes
        if route.mode is None:
            mode = modes[0]
        elif route.mode == "auto" or route.mode in modes:
            mode = _resolve_mode(fleet, route.target, route.mode)
        else:
            ck.add(("rules", i, "route", "mode"), "unsupported-mode",
                   f"target '{route.target}' does not support mode '{route.mode}' (it supports {', '.join(modes)})")
    seen_fb: set[str] = {route.target}
    for j, item in enumerate(route.fallbacks):
        where = ("rules", i, "route", "fallbacks", j)
        if isinstance(item, str) and item.startswith(RULE_REF):
            if item in seen_fb:
                ck.add(where, "duplicate-fallback", f"'{item}' is already an earlier fallback")
            seen_fb.add(item)
            continue
        fb, fb_mode = (item.target, item.mode) if isinstance(item, FallbackSpec) else (item, None)
        target_path = (*where, "target") if isinstance(item, FallbackSpec) else where
        if ck.target(target_path, fb):
            if fb in seen_fb:
                ck.add(target_path, "duplicate-fallback", f"'{fb}' is already the rule's target or an earlier fallback")
            modes = fleet.targets[fb].modes
            if fb_mode is not None and fb_mode != "auto" and fb_mode not in modes:
                ck.add((*where, "mode"), "unsupported-mode",
                       f"target '{fb}' does not support mode '{fb_mode}' (it supports {', '.join(modes)})")
        seen_fb.add(fb)
    return mode


def _check_settings(ck: _Checker, spec: PolicySpec) -> None:
    """Targets named by the filters' tenant allow-lists exist; the picker is registered."""
    from pointsman.policy.selection.pickers import PICKERS

    for target in spec.filters.tenants:
        ck.target(("filters", "tenants", target), target, key=True)
    picker = spec.endpoint_selection.picker
    if picker not in PICKERS:
        ck.add(("endpoint_selection", "picker"), "unknown-picker",
               f"unknown picker '{picker}'{did_you_mean(picker, PICKERS)} (registered: {', '.join(PICKERS)})")


def _check_verify(ck: _Checker, fleet: Fleet, specs: list[tuple[int, VerifyRuleSpec]], prefix_tokens: int | None,
                  variables: Mapping[str, JSONValue], invalid_default: bool = False) -> CompiledVerify:
    """Check and compile the ``verify`` section's rules (position, rule) (see the module doc); problems go to
    ``ck``. ``invalid_default``: a rule left out (invalid) has no condition: no ``missing-default``."""
    where: Path_ = ("verify", "rules")
    # the probe reads a typical draft and a broken one (null log-probabilities, a refusal)
    probe = {"draft": {**example_draft(), "logprob_mean": -1.0, "logprob_min": -9.0, "low_logprob_share": 0.4}}
    rules: list[CompiledVerifyRule] = []
    plan: Plan = {}
    seen: dict[str, int] = {}
    default: int | None = None
    names = {i: rule.name for i, rule in specs}
    for i, rule in specs:
        at: Path_ = (*where, i)
        if rule.name in seen:
            ck.add((*at, "name"), "duplicate-rule", f"verify rule name '{rule.name}' is already used at line "
                   f"{ck.doc.mark((*where, seen[rule.name], 'name'))[0]}")
        seen.setdefault(rule.name, i)
        if default is not None:
            ck.add((*at, "name"), "unreachable-rule", f"verify rule '{rule.name}' comes after the unconditional "
                   f"rule '{names[default]}' and can never match")
        candidates: list[tuple[str, str]] = []
        if rule.action == "escalate":
            if rule.escalate is None:
                ck.add((*at, "action"), "missing-key", "an escalate rule needs 'escalate: {target, fallbacks}'")
            else:
                for j, name in enumerate([rule.escalate.target, *rule.escalate.fallbacks]):
                    loc: Path_ = (*at, "escalate", "target") if j == 0 else (*at, "escalate", "fallbacks", j - 1)
                    if ck.target(loc, name):
                        if any(t == name for t, _ in candidates):
                            ck.add(loc, "duplicate-fallback", f"'{name}' is already the target or an earlier fallback")
                        else:
                            candidates.append((name, fleet.targets[name].modes[0]))
        elif rule.escalate is not None:
            ck.add((*at, "escalate"), "invalid-value", "an accept rule takes no 'escalate' (or write action: escalate)")
        target = candidates[0][0] if candidates else ""
        role = _role(fleet, target or None, candidates[0][1] if candidates else "aggregated")
        cond = _Condition()
        if _is_unconditional(rule.when):
            default = i if default is None else default
        else:
            source = "false" if rule.when is False else str(rule.when)
            cond = _check_condition(ck, i, source, variables, target or None, role, where=where,
                                    signals=VERIFY_SIGNALS, probe_extra=probe)
            if not target and any(p.split(".")[0] in RELATIVE_ROOTS for p in cond.paths):
                ck.add((*at, "when"), "unknown-signal", "cache.* and endpoint.* read an escalate rule's target: "
                       "an accept rule has none")
            merge_plans(plan, cond.plan)
        rules.append(CompiledVerifyRule(
            name=rule.name, index=i, when=cond.source or None, program=cond.program, action=rule.action,
            candidates=tuple(candidates), labels=dict(rule.labels), signals=cond.paths, uses_cost=cond.uses_cost,
            line=ck.doc.mark(at)[0], target=target, role=role))
    if default is None and not invalid_default:
        ck.add(("verify", "rules"), "missing-default",
               "no unconditional verify rule: end them with one that has no 'when' (e.g. name: accept)", key=True)
    return CompiledVerify(tuple(rules), _freeze(plan), any(r.uses_cost for r in rules), prefix_tokens)


def compile_policy(text: str, fleet: Fleet, file: str = "<policy>") -> CompiledPolicy:
    """Compile policy YAML text against ``fleet``; raises ``PolicyError`` listing every problem
    (or only ``too-large`` when the text is over a limit of ``limits.py``)."""
    doc = parse_yaml(text, file, PolicyError, max_bytes=MAX_POLICY_BYTES, max_nodes=MAX_YAML_NODES)
    check_counts(doc)
    ck = _Checker(doc, fleet)
    data = doc.data
    if not isinstance(data, dict):
        got = "an empty file" if data is None else type(data).__name__
        raise PolicyError([Problem(file, 1, 1, "invalid-value", f"expected a mapping at the top level, got {got}")])
    _yaml11_whens(doc, data)
    spec: PolicySpec | None = None
    try:
        spec = PolicySpec.model_validate(data)
    except ValidationError as exc:
        ck.problems.extend(validation_problems(exc, doc, PolicySpec))
    # Keep checking what is individually valid, so every problem shows at once.
    invalid: set[str] = set()  # names of rules that failed validation
    invalid_default = False  # one of them has no condition: the policy has a default rule
    if spec is not None:
        variables = dict(spec.variables)
        rules = list(enumerate(spec.rules))
        _check_settings(ck, spec)
    else:
        raw_vars = data.get("variables")
        variables = dict(raw_vars) if isinstance(raw_vars, dict) else {}
        listed = data.get("rules")
        raw_rules = listed if isinstance(listed, list) else []
        rules = []
        for i, raw in enumerate(raw_rules):
            # Its invalid values are already reported by the whole-file validation; check the rest of
            # the rule, so its other problems (its condition's, its route's) show in the same run.
            checkable = _checkable(raw, i, RuleSpec)
            if checkable is not None:
                rules.append((i, checkable))
                continue
            if isinstance(raw, dict) and isinstance(raw.get("name"), str):
                invalid.add(raw["name"])  # it exists: fallbacks may name it
            if isinstance(raw, dict) and _is_unconditional(raw.get("when")):
                invalid_default = True
            if isinstance(raw, dict) and isinstance(raw.get("when"), str) and "if_fleet_has" not in raw:
                route = raw.get("route")
                target = route.get("target") if isinstance(route, dict) else None
                target = target if isinstance(target, str) and target in fleet.targets else None
                _check_condition(ck, i, raw["when"], variables, target, _role(fleet, target, "aggregated"))

    rules, omitted = _omit_rules(ck, fleet, rules)
    invalid |= {name for name, _ in omitted}
    seen: dict[str, int] = {}
    default_index: int | None = None
    modes: dict[int, str | None] = {}
    conditions: dict[int, _Condition] = {}
    plan: Plan = {}
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
        mode = _check_route(ck, fleet, i, rule)
        modes[i] = mode
        target = rule.route.target if rule.route.target in fleet.targets else None
        if _is_unconditional(rule.when):
            if default_index is None:
                default_index = i
            conditions[i] = _Condition()
        else:
            source = "false" if rule.when is False else str(rule.when)
            cond = _check_condition(ck, i, source, variables, target, _role(fleet, target, mode or "aggregated"))
            conditions[i] = cond
            merge_plans(plan, cond.plan)
            if default_index is None and _always_true(cond):  # "1 == 1": the rules after it are dead as well
                default_index = i
    candidates = _expand_fallbacks(ck, fleet, rules, modes, frozenset(invalid) - seen.keys())
    verify: CompiledVerify | None = None
    if spec is not None and spec.verify is not None:
        verify = _check_verify(ck, fleet, list(enumerate(spec.verify.rules)), spec.verify.prefix_tokens, variables)
    elif spec is None and isinstance(raw_verify := data.get("verify"), dict):
        verify_rules, invalid_verify_default = [], False
        listed_verify = raw_verify.get("rules")
        for i, raw in enumerate(listed_verify if isinstance(listed_verify, list) else []):
            checkable_verify = _checkable(raw, i, VerifyRuleSpec)
            if checkable_verify is not None:
                verify_rules.append((i, checkable_verify))
            elif isinstance(raw, dict) and _is_unconditional(raw.get("when")):
                invalid_verify_default = True
        if verify_rules:
            verify = _check_verify(ck, fleet, verify_rules, None, variables, invalid_verify_default)
    if default_index is None and not invalid_default and (spec is not None or rules):
        ck.add(("rules",), "missing-default",
               "no unconditional rule: end the rules with one that has no 'when' (e.g. name: default)", key=True)
    if ck.problems:
        raise PolicyError(sorted(ck.problems, key=lambda p: (p.line, p.col, p.code)))
    assert spec is not None
    compiled = []
    for i, rule in rules:
        cond, mode = conditions[i], modes[i] or "aggregated"
        compiled.append(CompiledRule(
            name=rule.name, index=i, when=cond.source or None, program=cond.program, target=rule.route.target,
            mode=mode, fallbacks=tuple(t for t, _ in candidates[i][1:]), labels=dict(rule.labels),
            signals=cond.paths, uses_cost=cond.uses_cost, line=doc.mark(("rules", i))[0],
            candidates=candidates[i], role=_role(fleet, rule.route.target, mode),
            fast=None if cond.program is None else closure(cond.program.source), calls=cond.calls))
    load_spec = spec.signals.load
    so_far: Plan = {}
    rule_plans: list[Plan] = []
    for i, _ in rules:
        merge_plans(so_far, conditions[i].plan)
        frozen = _freeze(so_far)
        rule_plans.append(rule_plans[-1] if rule_plans and rule_plans[-1] == frozen else frozen)
    return CompiledPolicy(
        name=spec.metadata.name or Path(file).stem, file=file,
        revision=hashlib.sha256(text.encode("utf-8")).hexdigest()[:16], fleet_revision=fleet.revision,
        rules=tuple(compiled), variables=variables, labels=dict(spec.metadata.labels),
        context_plan=_freeze(plan), uses_cost=any(r.uses_cost for r in compiled),
        staleness=StalenessPolicy(load_spec.max_age_s, load_spec.on_stale), filters=spec.filters,
        selection=spec.endpoint_selection, disaggregation=spec.disaggregation, verify=verify,
        rule_plans=tuple(rule_plans), omitted=tuple(omitted), source=text)


def _yaml11_whens(doc: LocatedDocument, data: dict[str, object]) -> None:
    """Put a ``YAML11Boolean`` in place of each rule's and verify rule's ``when`` written ``yes``, ``no``, ``on`` or
    ``off`` (read as a boolean: its validation refuses it); ``true`` and ``false`` (any case) stay."""
    verify = data.get("verify")
    for at, rules in ((("rules",), data.get("rules")),
                      (("verify", "rules"), verify.get("rules") if isinstance(verify, dict) else None)):
        for i, rule in enumerate(rules if isinstance(rules, list) else []):
            if isinstance(rule, dict) and isinstance(rule.get("when"), bool):
                node = doc.node((*at, i, "when"))
                if isinstance(node, yaml.ScalarNode) and node.value.lower() not in ("true", "false"):
                    rule["when"] = YAML11Boolean(node.value)


def _names_target(rule: RuleSpec, name: str) -> bool:
    """Whether ``rule`` routes to ``name`` (target or fallback) or reads a ``["name"]`` key."""
    fallbacks = {f.target if isinstance(f, FallbackSpec) else f for f in rule.route.fallbacks}
    when = rule.when if isinstance(rule.when, str) else ""
    return name == rule.route.target or name in fallbacks or f'["{name}"]' in when or f"['{name}']" in when


def _omit_rules(ck: _Checker, fleet: Fleet, rules: list[tuple[int, RuleSpec]]
                ) -> tuple[list[tuple[int, RuleSpec]], list[tuple[str, str]]]:
    """The rules kept on ``fleet`` and the (name, reason) of those left out by ``if_fleet_has``
    (schema module docstring); a listed target the rule does not name is an ``invalid-value``."""
    kept: list[tuple[int, RuleSpec]] = []
    omitted: list[tuple[str, str]] = []
    for i, rule in rules:
        unnamed = [t for t in rule.if_fleet_has if not _names_target(rule, t)]
        for t in unnamed:
            ck.add(("rules", i, "if_fleet_has", rule.if_fleet_has.index(t)), "invalid-value",
                   f"if_fleet_has lists '{t}', which rule '{rule.name}' neither routes to nor reads")
        missing = [t for t in rule.if_fleet_has if t not in fleet.targets]
        if missing and not unnamed:
            omitted.append((rule.name, f"the fleet has no {', '.join(repr(t) for t in missing)}"))
            continue
        kept.append((i, rule))
    return kept, omitted


#: A ``rule:`` fallback reference standing for an invalid fallback (``_checkable``): no rule name has it.
_DROPPED = "\0invalid-"
_Rule = TypeVar("_Rule", RuleSpec, VerifyRuleSpec)


def _checkable(raw: object, index: int, model: type[_Rule]) -> _Rule | None:
    """Rule ``index`` (a ``RuleSpec`` or a ``VerifyRuleSpec``) of a file that failed validation, as far as it
    can be checked: as written when it validates alone, else without the values its validation rejected
    (already reported): an invalid ``when`` reads as ``false`` (no rule turns unconditional by mistake), an
    invalid ``action`` as ``escalate`` when the rule names a valid ``escalate``, else ``accept``, an invalid
    ``name`` stays as written (or ``rules[<index>]`` when not a string), an invalid fallback stands in its place as a
    ``rule:`` reference that is skipped (``_DROPPED``: the positions of the others stay the file's), any
    other invalid value or unknown key is dropped. None when that does not
    validate either (a required key missing or not a mapping) or its ``if_fleet_has`` is invalid (the
    rule may be meant to be left out: its targets cannot be checked)."""
    if not isinstance(raw, dict):
        return None
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        errors = exc.errors()
    data = copy.deepcopy(raw)
    action = data.get("action")
    for error in errors:
        loc = error["loc"]
        if not loc or loc[0] not in data:
            continue
        if loc[0] == "if_fleet_has":
            return None
        if loc[0] == "when":
            data["when"] = False
        elif loc[0] == "name":
            data["name"] = "rule"
        elif loc[0] == "action":
            action = None
        elif (loc[:2] == ("route", "fallbacks") and len(loc) > 2 and isinstance(loc[2], int)
              and isinstance(data["route"], dict) and isinstance(items := data["route"].get("fallbacks"), list)
              and 0 <= loc[2] < len(items)):
            items[loc[2]] = f"{RULE_REF}{_DROPPED}{loc[2]}"  # skipped when expanded
        else:
            parent, key, node = data, loc[0], data[loc[0]]
            for step in loc[1:]:
                if not isinstance(node, dict) or step not in node:
                    break
                parent, key, node = node, step, node[step]
            parent.pop(key, None)
    if "action" in data and action is None:
        data["action"] = "escalate" if data.get("escalate") is not None else "accept"
    try:
        rule = model.model_validate(data)
    except ValidationError:
        return None
    name = raw.get("name")
    if data.get("name") != name:
        rule = rule.model_copy(update={"name": name if isinstance(name, str) else f"rules[{index}]"})
    return rule


def _freeze(plan: Plan) -> Plan:
    out: Plan = {}
    for root, value in plan.items():
        if isinstance(value, dict):
            out[root] = {k: (None if v is None else frozenset(v)) for k, v in value.items()}
        else:
            out[root] = None if value is None else frozenset(value)
    return out


def rules_by_index(rules: list[tuple[int, RuleSpec]], index: int) -> RuleSpec:
    """The rule at file position ``index``."""
    return next(r for i, r in rules if i == index)


def load_policy(path: str | Path, fleet: Fleet) -> CompiledPolicy:
    """Read and compile a policy file; raises ``PolicyError`` (every problem, located; a file over
    ``MAX_POLICY_BYTES`` is rejected without reading the rest)."""
    return compile_policy(read_text(path, PolicyError, max_bytes=MAX_POLICY_BYTES), fleet, str(path))
