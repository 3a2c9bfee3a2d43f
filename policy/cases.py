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
idle fleet with fresh telemetry, a cold cache, no budget; the budget fields a case does not
give follow from those it gives: ``case_budget``); the policy's variables are filled in.
``load`` is keyed by target; ``cache`` and ``endpoint`` (relative to
each rule's target) take either fields for every target or ``{<target>: {fields}}``.
Each case runs the same policy step the engine runs (``engine.decide``: eligibility,
rules, P/D mode) on a ``live.StaticSignals``; costs come from the fleet's prices with
``cache.prefix_hit_tokens`` cached. As at dispatch (``engine.decide_and_take``), a candidate with
``load[t].healthy_endpoints`` 0 (the ``health`` filter off) or whose estimate its budget refuses gives way to the
next, and past the deciding rule's last, to the rules after it.
``expect`` may name ``target``, ``mode``, ``rule``,
``fallbacks``, ``skipped`` (rules whose condition errored) or
``error: no-eligible-target`` (with ``excluded_by``: target -> filter, optional).

Verify cases (the policy's ``verify`` section, ``policy/escalation.py``): a case that sets
``draft`` signals (``example_draft`` values otherwise) or expects ``action``
(``accept``/``escalate``), ``escalate_to`` (the escalation target) or ``verify_rule`` also runs
the verify step on the same signals::

      - name: a refusal escalates
        signals: {draft: {refusal: true}}
        expect: {action: escalate, escalate_to: frontier-small, verify_rule: broken-draft}

``run_cases(path) -> list[CaseResult]``; raises ``PolicyError`` if the cases file,
its policy or its fleet is invalid (unknown signal names in a case included).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeVar

from pydantic import Field, TypeAdapter, ValidationError, model_validator

from pointsman.errors import PolicyError, Problem
from pointsman.json_types import JSONValue
from pointsman.located import LocatedDocument, StrictModel, did_you_mean, load_config
from pointsman.policy.cost import target_prompt_tokens
from pointsman.policy.engine import decide_and_take
from pointsman.policy.escalation import judge, rule_name
from pointsman.policy.fleet import DEFAULT_FLEET_PATH, Fleet, Mode, SLOClass, load_fleet
from pointsman.policy.live import StaticSignals
from pointsman.policy.rules.compiler import CompiledPolicy, load_policy
from pointsman.policy.selection.filters import Exclusion, NoEligibleTarget, budget_refusal
from pointsman.policy.signals.load_board import outstanding
from pointsman.policy.signals.namespaces import (
    VERIFY_SIGNALS,
    BudgetSignals,
    CacheSignals,
    DifficultySignals,
    DraftSignals,
    EndpointSignals,
    LoadSignals,
    Namespace,
    PredictSignals,
    RequestSignals,
    Snapshot,
    example_draft,
    example_endpoint,
    example_signals,
    relative_key,
)
from pointsman.request import canonical


class CaseExpect(StrictModel):
    """What a case expects; unset fields are not checked."""

    target: str | None = None
    mode: Mode | None = None
    rule: str | None = None
    fallbacks: list[str] | None = None
    skipped: list[str] | None = None
    error: Literal["no-eligible-target"] | None = None
    excluded_by: dict[str, str] | None = None
    action: Literal["accept", "escalate"] | None = None
    escalate_to: str | None = None
    verify_rule: str | None = None

    @model_validator(mode="after")
    def _expects_something(self) -> CaseExpect:
        if all(getattr(self, name) is None for name in type(self).model_fields):
            raise ValueError("a case must expect something (target, mode, rule, fallbacks, skipped, error, "
                             "excluded_by, action, escalate_to or verify_rule): an empty expect passes whatever "
                             "the policy decides")
        routed = [name for name in ("target", "mode", "rule", "fallbacks", "skipped") if getattr(self, name) is not None]
        if self.error is not None and routed:
            raise ValueError(f"a case expecting error {self.error} has no decision to check {', '.join(routed)} "
                             "against: expect one or the other")
        return self


class Case(StrictModel):
    """One case: ``name``, partial ``signals`` by namespace, ``expect``."""

    name: str
    signals: dict[str, dict[str, JSONValue]] = {}
    expect: CaseExpect


class CasesSpec(StrictModel):
    """The validated content of a cases file."""

    apiVersion: Literal["pointsman/v1"]
    kind: Literal["PolicyCases"]
    policy: str
    fleet: str | None = None
    cases: list[Case] = Field(min_length=1)


@dataclass(frozen=True)
class CaseResult:
    """One case's outcome: ``passed``, and ``message`` listing every mismatch (empty when passed)."""

    name: str
    passed: bool
    message: str
    line: int


#: Request fields the service compares as identities (``request.canonical``: NFC, no zero-width
#: characters); a case's value is read in that form too.
IDENTITY_FIELDS = ("tenant", "team", "session_id", "slo_class")
#: Namespaces a case may set, and their shape (``by_target``: {target: {field: value}}).
CASE_NAMESPACES = ("request", "difficulty", "load", "cache", "endpoint", "budget", "draft", "predict")
_T = TypeVar("_T")


def _check_signal_names(spec: CasesSpec, doc: LocatedDocument, fleet: Fleet) -> list[Problem]:
    problems: list[Problem] = []

    def bad(path: tuple[str | int, ...], code: str, message: str) -> None:
        line, col = doc.mark(path, key=True)
        problems.append(Problem(doc.file, line, col, code, message))

    def check_fields(path: tuple[str | int, ...], ns: Namespace, fields: object, where: str) -> None:
        if not isinstance(fields, dict):
            bad(path, "invalid-value", f"{where} must be a mapping of signal names to values")
            return
        for name in fields:
            if name not in (ns.fields or {}):
                bad((*path, name), "unknown-signal", f"unknown signal '{where}.{name}'{did_you_mean(name, ns.fields or {})}")

    for i, case in enumerate(spec.cases):
        for root, fields in case.signals.items():
            path: tuple[str | int, ...] = ("cases", i, "signals", root)
            ns = VERIFY_SIGNALS.get(root)
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


#: Validators of each namespace's values, strict as the service's values are typed: ``"0.9"`` or
#: ``true`` for a number, ``1`` for a bool, ``200.0`` for an int and a share outside [0, 1]
#: (``namespaces.Fraction``) are errors naming the field; an int reads as a float.
_REQUEST = TypeAdapter(RequestSignals)
_DIFFICULTY = TypeAdapter(DifficultySignals)
_BUDGET = TypeAdapter(BudgetSignals)
_LOAD = TypeAdapter(LoadSignals)
_CACHE = TypeAdapter(CacheSignals)
_ENDPOINT = TypeAdapter(EndpointSignals)
_DRAFT = TypeAdapter(DraftSignals)
_PREDICT = TypeAdapter(PredictSignals)


def _merged(adapter: TypeAdapter[_T], base: Mapping[str, object], fields: Mapping[str, object], where: str) -> _T:
    try:
        return adapter.validate_python({**base, **fields}, strict=True)
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        loc = ".".join(str(x) for x in err["loc"])
        raise ValueError(f"{where}.{loc}: {err['msg']}") from None


#: Budget fields that say how much of a budget is spent: a case giving one has a budget.
_BUDGET_AMOUNTS = ("remaining_usd", "spent_usd", "limit_usd", "spent_fraction")


def case_budget(base: Mapping[str, object], given: Mapping[str, object]) -> BudgetSignals:
    """A case's ``budget``: the fields it gives, the others derived from them as a ledger snapshot
    has them (``budget_signals``): ``limited`` when an amount is given; any two of ``limit_usd``,
    ``spent_usd``, ``remaining_usd`` (= max(0, limit - spent)) give the third, a limit alone has
    nothing spent, ``spent_fraction`` with a limit gives the spent amount; ``spent_fraction`` =
    spent / limit (1 for a zero limit); ``pace_gap`` = spent_fraction - window_elapsed_fraction.
    ``base``: the example values of the rest. Raises ``ValueError`` naming a bad value."""
    b = _merged(_BUDGET, base, given, "budget")
    if "limited" not in given and any(k in given for k in _BUDGET_AMOUNTS):
        b["limited"] = True
    if not b["limited"]:
        return b
    limit, spent, left = b["limit_usd"], b["spent_usd"], b["remaining_usd"]
    if "limit_usd" not in given and "spent_usd" in given and "remaining_usd" in given:
        limit = spent + left
    if "spent_usd" not in given and math.isfinite(limit):
        if "remaining_usd" in given:
            spent = max(0.0, limit - left)
        elif "spent_fraction" in given:
            spent = b["spent_fraction"] * limit
    if "remaining_usd" not in given and math.isfinite(limit):
        left = max(0.0, limit - spent)
    b["limit_usd"], b["spent_usd"], b["remaining_usd"] = limit, spent, left
    if "spent_fraction" not in given and math.isfinite(limit):
        b["spent_fraction"] = spent / limit if limit > 0 else 1.0
    if "pace_gap" not in given:
        b["pace_gap"] = b["spent_fraction"] - b["window_elapsed_fraction"]
    return b


def case_difficulty(base: Mapping[str, object], given: Mapping[str, object]) -> DifficultySignals:
    """A case's ``difficulty`` as the service reads it: without the estimator ``p_hard`` is null, and a
    null ``p_hard`` means the estimator is unavailable, so each follows from the other when only one is
    given. Raises ``ValueError`` for a pair the service never reads (a p_hard without the estimator)."""
    d = _merged(_DIFFICULTY, base, given, "difficulty")
    if "available" not in given and "p_hard" in given:
        d["available"] = given["p_hard"] is not None
    if not d["available"]:
        if given.get("p_hard") is not None:
            raise ValueError("difficulty.p_hard: null when difficulty.available is false (the service reads no "
                             "p_hard without the estimator)")
        d["p_hard"] = None
    elif d["p_hard"] is None:
        raise ValueError("difficulty.available: false when difficulty.p_hard is null")
    return d


_L = TypeVar("_L", LoadSignals, EndpointSignals)


def _outstanding(load: _L, given: Mapping[str, object]) -> _L:
    """``load`` with ``outstanding_requests``, unless given, as the service reads it (``load_board.outstanding``)."""
    if "outstanding_requests" not in given:
        load["outstanding_requests"] = outstanding(load["num_requests_running"], load["num_requests_waiting"],
                                                   load["inflight_requests"])
    return load


def _cache_hit(cache: CacheSignals, given: Mapping[str, object], prompt_tokens: int) -> CacheSignals:
    """``cache`` with ``prefix_hit_tokens`` or ``prefix_hit_ratio``, when only the other is given, following
    from it as the service reads them (the share of the target's ``prompt_tokens``): the P/D rules of thumb
    read the ratio, ``cost()`` the tokens."""
    if "prefix_hit_ratio" in given and "prefix_hit_tokens" not in given:
        cache["prefix_hit_tokens"] = round(cache["prefix_hit_ratio"] * prompt_tokens)
    elif "prefix_hit_tokens" in given and "prefix_hit_ratio" not in given and prompt_tokens > 0:
        cache["prefix_hit_ratio"] = min(1.0, cache["prefix_hit_tokens"] / prompt_tokens)
    return cache


def _predicted(p: PredictSignals, given: Mapping[str, object], slo: SLOClass) -> PredictSignals:
    """``p`` as the service predicts it, in what the case does not give: the objectives of the request's SLO
    class, the chosen mode's figures beside the ones given, ``slo_score`` from the figures and
    ``meets_slo`` from them (or from a ``slo_score`` given)."""
    if "slo_ttft_s" not in given:
        p["slo_ttft_s"] = slo.ttft_s
    if "slo_tpot_s" not in given:
        p["slo_tpot_s"] = slo.tpot_s
    for f in ("ttft_s", "tpot_s", "batch_tpot_s"):
        key = f"{p['mode']}_{f}"
        if f in given and key in p and key not in given:
            p[key] = p[f]  # type: ignore[literal-required]
    tpot = max(p["tpot_s"], p["batch_tpot_s"])
    if "slo_score" not in given:
        p["slo_score"] = max(p["ttft_s"] / p["slo_ttft_s"], tpot / p["slo_tpot_s"])
    if "meets_slo" not in given:
        p["meets_slo"] = p["slo_score"] <= 1.0 if "slo_score" in given else \
            p["ttft_s"] <= p["slo_ttft_s"] and tpot <= p["slo_tpot_s"]
    return p


def case_signals(fleet: Fleet, policy: CompiledPolicy, overrides: Mapping[str, Mapping[str, object]]) -> Snapshot:
    """The full snapshot of a case: ``example_signals`` for the fleet, with ``overrides`` applied
    (``load`` by target; ``cache``/``endpoint`` for every target or by target), each namespace
    validated against its declared types, the request's routing names canonical as the service reads
    them. Raises ``ValueError`` naming the first bad value (``request.prompt_tokens: Input should be a
    valid integer``)."""
    base = example_signals(policy.variables, fleet.targets)
    endpoints: dict[str, EndpointSignals] = {}
    for t in fleet.targets:
        for rule in policy.rules:
            if rule.target == t:
                endpoints.setdefault(relative_key("endpoint", t, rule.role), example_endpoint())

    def by_target(root: str, key: str) -> Mapping[str, object]:
        fields = overrides.get(root, {})
        if root not in ("load", "predict") and not any(k in fleet.targets for k in fields):
            return fields  # the same fields for every target
        value = fields.get(key.partition("/")[0], {})
        return value if isinstance(value, Mapping) else {}

    request = _merged(_REQUEST, base["request"], overrides.get("request", {}), "request")
    difficulty = case_difficulty(base["difficulty"], overrides.get("difficulty", {}))
    try:
        slo = fleet.slo(request["slo_class"] or None)
    except KeyError:
        raise ValueError(f"request.slo_class: '{request['slo_class']}' is not a class of the fleet's slo_classes "
                         f"({', '.join(fleet.slo_classes)})") from None
    for name in IDENTITY_FIELDS:  # as the service reads routing names: one form per string
        request[name] = canonical(request[name])  # type: ignore[literal-required]
    return {
        "request": request,
        "difficulty": difficulty,
        "variables": base["variables"],
        "load": {t: _outstanding(_merged(_LOAD, v, g := by_target("load", t), f'load["{t}"]'), g)
                 for t, v in base["load"].items()},
        "budget": case_budget(base["budget"], overrides.get("budget", {})),
        "_cache": {t: _cache_hit(_merged(_CACHE, v, g := by_target("cache", t), f'cache["{t}"]'), g,
                                 target_prompt_tokens(fleet.targets[t], request))
                   for t, v in base["_cache"].items()},
        "_endpoint": {k: _outstanding(_merged(_ENDPOINT, v, g := by_target("endpoint", k), f'endpoint["{k}"]'), g)
                      for k, v in endpoints.items()},
        "predict": {t: _predicted(_merged(_PREDICT, v, g := by_target("predict", t), f'predict["{t}"]'), g, slo)
                    for t, v in base["predict"].items()},
    }


def case_draft(overrides: Mapping[str, Mapping[str, object]], fleet: Fleet | None = None,
               target: str | None = None) -> DraftSignals:
    """The ``draft`` namespace of a case: ``example_draft`` with the case's ``draft`` fields,
    validated; ``target`` (the case's decided target, as the service's ``draft.target``) sets
    ``draft.target`` and ``draft.on_prem`` unless the case does. Raises ``ValueError`` naming the
    first bad value."""
    base = example_draft()
    if fleet is not None and target is not None:
        base = {**base, "target": target, "on_prem": fleet.targets[target].kind == "onprem"}
    return _merged(_DRAFT, base, overrides.get("draft", {}), "draft")


def _check_verify(fleet: Fleet, policy: CompiledPolicy, case: Case, signals: Snapshot,
                  drafted: str | None = None) -> list[str]:
    """Mismatches of a case's verify expectations (empty when they hold or none are set);
    ``drafted``: the target the case routed to, which wrote the draft."""
    exp = case.expect
    if "draft" not in case.signals and exp.action is None and exp.escalate_to is None and exp.verify_rule is None:
        return []
    verdict = judge(fleet, policy, {"request": signals["request"], "difficulty": signals["difficulty"]},
                    StaticSignals(fleet, policy, signals), case_draft(case.signals, fleet, drafted))
    seen = {"action": verdict.action, "escalate_to": verdict.target, "verify_rule": rule_name(verdict)}
    return [f"{key}: expected {getattr(exp, key)!r}, got {seen[key]!r}"
            for key in ("action", "escalate_to", "verify_rule") if getattr(exp, key) is not None
            and getattr(exp, key) != seen[key]]


def _check_excluded(exp: CaseExpect, exclusions: Mapping[str, Exclusion | None]) -> list[str]:
    """Mismatches of a case's ``excluded_by`` (target -> filter) with the decision's exclusions,
    whether the decision routed or found no eligible target."""
    wrong = []
    for target, filt in (exp.excluded_by or {}).items():
        excluded = exclusions.get(target)
        if excluded is None or excluded.filter != filt:
            wrong.append(f"excluded_by[{target}]: expected {filt!r}, got {excluded.filter if excluded else None!r}")
    return wrong


def _check_expect_names(spec: CasesSpec, doc: LocatedDocument, fleet: Fleet, policy: CompiledPolicy) -> list[Problem]:
    """Names a case expects that no decision can give: a ``target``, ``fallbacks`` item, ``escalate_to`` or
    ``excluded_by`` key the fleet does not have, a ``rule`` or ``skipped`` item the policy does not have (on this
    fleet: ``if_fleet_has`` may leave it out), a ``verify_rule`` its verify section does not have. Located at the value
    (an ``excluded_by`` key at the key)."""
    problems: list[Problem] = []
    rules = [r.name for r in policy.rules]
    verify_rules = [r.name for r in policy.verify.rules] if policy.verify is not None else []

    def check(path: tuple[str | int, ...], name: str, known: list[str], what: str, *, key: bool = False) -> None:
        if name not in known:
            line, col = doc.mark(path, key=key)
            code = "unknown-target" if what == "target" else "unknown-rule"
            where = "the fleet" if what == "target" else f"policy {policy.name} on this fleet"
            problems.append(Problem(doc.file, line, col, code, f"unknown {what} '{name}': {where} has no such "
                                    f"{what}, so no decision gives it{did_you_mean(name, known)}"))

    targets = list(fleet.targets)
    for i, case in enumerate(spec.cases):
        exp, at = case.expect, ("cases", i, "expect")
        for field in ("target", "escalate_to"):
            if (name := getattr(exp, field)) is not None:
                check((*at, field), name, targets, "target")
        for j, name in enumerate(exp.fallbacks or []):
            check((*at, "fallbacks", j), name, targets, "target")
        for name in exp.excluded_by or {}:
            check((*at, "excluded_by", name), name, targets, "target", key=True)
        if exp.rule is not None:
            check((*at, "rule"), exp.rule, rules, "rule")
        for j, name in enumerate(exp.skipped or []):
            check((*at, "skipped", j), name, rules, "rule")
        if exp.verify_rule is not None:
            check((*at, "verify_rule"), exp.verify_rule, verify_rules, "verify rule")
    return sorted(problems, key=lambda p: (p.line, p.col))


def load_cases(path: str | Path, fleet_path: str | Path | None = None
               ) -> tuple[CasesSpec, LocatedDocument, Fleet, CompiledPolicy]:
    """Validate a cases file without running it: ``(spec, located doc, fleet, compiled policy)``.

    Checks the file's schema, every signal name its cases set and the type of every value, the targets and rules
    they expect (``_check_expect_names``), and compiles the policy it names against its fleet: the file's
    ``fleet:`` (relative to it), else ``fleet_path``, else the packaged fleet. Raises ``PolicyError``/``FleetError``
    with file:line:col.
    """
    spec, doc = load_config(path, CasesSpec, PolicyError)
    assert isinstance(spec, CasesSpec)
    base = Path(path).parent
    missing = [(key, name) for key, name in (("fleet", spec.fleet), ("policy", spec.policy))
               if name and not (base / name).exists()]
    if missing:  # named here: located at the key that names it, not at 0:0 of a file the user never passed
        raise PolicyError([Problem(doc.file, *doc.mark((key,)), "file-not-found",
                                   f"{key}: no such file {str(base / name)!r} ({name!r} is relative to this file)")
                           for key, name in missing])
    fleet = load_fleet(base / spec.fleet if spec.fleet else fleet_path or DEFAULT_FLEET_PATH)
    problems = _check_signal_names(spec, doc, fleet)
    if problems:
        raise PolicyError(problems)
    policy = load_policy(base / spec.policy, fleet)
    problems = _check_expect_names(spec, doc, fleet, policy)
    for i, case in enumerate(spec.cases):
        try:
            case_signals(fleet, policy, case.signals)
            case_draft(case.signals)
        except ValueError as exc:
            line, col = doc.mark(("cases", i, "signals"), key=True)
            problems.append(Problem(doc.file, line, col, "invalid-value", str(exc)))
    if problems:
        raise PolicyError(problems)
    return spec, doc, fleet, policy


def _dispatch(source: StaticSignals, target: str, mode: str) -> Exclusion | None:
    """A case's dispatch of one candidate (``engine.decide_and_take``'s ``take``): refused without a healthy endpoint
    (``engine.place``; the ``health`` filter may be off) or when its budget refuses the estimate, else None."""
    if source.healthy_endpoints(target) == 0:
        return Exclusion("health", f"no healthy endpoint for {mode}")
    why = budget_refusal(source, source.cost(target, mode).usd) if source.budget_limited() else None
    return None if why is None else Exclusion("budget", why)


def run_cases(path: str | Path, fleet_path: str | Path | None = None) -> list[CaseResult]:
    """Run every case in a cases file against its policy on its fleet (``load_cases``; see module doc)."""
    spec, doc, fleet, policy = load_cases(path, fleet_path)
    results = []
    for i, case in enumerate(spec.cases):
        signals = case_signals(fleet, policy, case.signals)
        exp = case.expect
        line = doc.mark(("cases", i))[0]
        source = StaticSignals(fleet, policy, signals)
        try:
            outcome, candidates, refusals = decide_and_take(
                fleet, policy, {"request": signals["request"], "difficulty": signals["difficulty"]}, source,
                functools.partial(_dispatch, source))
        except NoEligibleTarget as exc:
            wrong = [] if exp.error == "no-eligible-target" else [f"unexpected error: {exc}"]
            wrong += _check_excluded(exp, exc.exclusions)
            wrong += _check_verify(fleet, policy, case, signals)
            results.append(CaseResult(case.name, not wrong, "; ".join(wrong), line))
            continue
        verdict = outcome.verdict
        seen: dict[str, object] = {"target": candidates[0][0], "mode": candidates[0][1], "rule": verdict.rule.name,
                                   "fallbacks": [t for t, _ in candidates[1:]], "skipped": verdict.skipped}
        wrong = []
        if exp.error is not None:
            wrong.append(f"expected error {exp.error}, got target {verdict.target}")
        for key in ("target", "mode", "rule", "fallbacks", "skipped"):
            want = getattr(exp, key)
            if want is not None and want != seen[key]:
                wrong.append(f"{key}: expected {want!r}, got {seen[key]!r}")
        wrong += _check_excluded(exp, {**outcome.exclusions, **refusals})
        wrong += _check_verify(fleet, policy, case, signals, candidates[0][0])
        results.append(CaseResult(case.name, not wrong, "; ".join(wrong), line))
    return results
