"""The policy file's schema (pydantic; unknown keys are errors).

::

    apiVersion: pointsman/v1
    kind: RoutingPolicy
    metadata: {name: default, description: ..., labels: {team: infra}}
    variables:                    # named constants, read as variables.<name>
      p_hard_frontier: 0.62
    signals:                      # how signals are read
      load: {max_age_s: 10, on_stale: unknown}     # unknown | saturated | ignore
    filters:                      # eligibility, before any rule (all on by default)
      context_window: true        # prompt + output cap must fit the target's window
      capabilities: true          # images / tools need a target that takes them
      health: true                # a target with no healthy endpoint is ineligible
      budget: true                # a target that fits the budget nowhere (its cheapest placement) is ineligible
      tenants:                    # allow-lists: target -> tenants allowed (others: any tenant)
        frontier-large: [acme, globex]
    endpoint_selection:           # inside the chosen pool (policy/selection/pickers.py)
      picker: min-cost
      bounded_load_epsilon: 0.25  # no endpoint above (1 + eps) x mean outstanding; null: off
      bounded_load_floor: null    # ... but never below this; null: the pool's max_num_seqs (256 unless set)
      fallback_endpoints: 2       # endpoints listed after the chosen one, per role
    disaggregation:               # prefill/decode rules of thumb (policy/selection/pd_mode.py)
      min_uncached_prompt_tokens: 512
      min_output_tokens: 16
      max_local_hit_ratio: 0.8
      min_pool_gpus: 12
      max_prefill_queue_s: 2.0
    rules:                        # ordered; the first whose `when` is true decides
      - name: hard-prompt
        when: difficulty.p_hard >= variables.p_hard_frontier    # CEL; omitted = always
        route: {target: frontier-large, mode: aggregated, fallbacks: [onprem-70b]}
        labels: {reason: quality}
      - name: default             # an unconditional rule is required, and must be last
        route: {target: onprem-8b, mode: auto, fallbacks: ["rule:hard-prompt"]}

**Verify** (optional; ``POST /v1/verify``, a cascade): after the chosen target answered (or
streamed its first tokens), ordered rules over everything ``rules`` read plus ``draft.*``
decide whether the draft is accepted or the request escalates; the first match wins, an
unconditional last rule is required::

    verify:
      rules:
        - name: broken-draft
          when: draft.empty || draft.truncated || draft.refusal
          action: escalate
          escalate: {target: frontier-small, fallbacks: [frontier-large]}
        - name: accept
          action: accept

An ``escalate`` rule names ``escalate: {target, fallbacks}`` (fleet targets; ``cache.*`` and
``endpoint.*`` read that target's values); an ``accept`` rule names none and cannot read
``cache``/``endpoint``.

**Rules for an optional target.** A rule with ``if_fleet_has: [onprem-8b]`` is left out on a
fleet without ``onprem-8b`` instead of failing the compile (``unknown-target``), so one policy
serves fleets with and without that model (``pointsman plan`` may drop a target no request
reaches). The rule must name every target it lists (its route, a fallback or a
``["<target>"]`` key in its condition: ``invalid-value`` otherwise, which catches a misspelled
name); ``pointsman policy check`` and replay reports name the rules left out; a ``rule:NAME``
fallback to one is skipped. A rule without ``if_fleet_has`` is checked as before.

**Route.** ``target`` (a fleet target), ``mode`` and ``fallbacks``. ``mode``:
``aggregated``; ``disaggregated`` (the P/D guards still apply: a pool smaller than
``min_pool_gpus`` or a saturated prefill pool keeps the request aggregated when the
target has an aggregated pool); ``auto`` (the rules of thumb decide per request, see
``policy/selection/pd_mode.py``); omitted: the target's default mode.

**Fallbacks** are tried in order when the target is ineligible (filters) or refuses
the budget reservation; the gateway gets the eligible ones as the decision's
``fallbacks``. An item is a target name (it keeps the rule's mode when it supports
it, else takes its own default), ``{target, mode}``, or ``"rule:NAME"``: the
target and fallbacks of rule NAME, in order, expanded when the policy is compiled
(recursively; a later duplicate of a target is dropped). A chain of ``rule:``
references that returns to a rule is a ``fallback-cycle`` error.

Semantics (targets exist, modes are supported, a default exists, CEL parses and
names known signals) are checked by ``policy/rules/compiler.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, StringConstraints

from pointsman.json_types import JSONValue
from pointsman.located import StrictModel
from pointsman.policy.fleet import Metadata
from pointsman.policy.selection.filters import FiltersSpec
from pointsman.policy.selection.pd_mode import DisaggregationSpec
from pointsman.policy.selection.pickers import EndpointSelectionSpec

RuleName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")]
Identifier = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")]
RouteMode = Literal["aggregated", "disaggregated", "auto"]


@dataclass(frozen=True)
class YAML11Boolean:
    """A ``when`` written ``yes``, ``no``, ``on`` or ``off`` (any case): YAML 1.1's booleans, which PyYAML reads,
    so ``when: yes`` was ``true`` (a catch-all) and ``when: no`` ``false`` (a rule that never fires). The compiler
    puts one in its place (``compiler._yaml11_whens``, ``text``: as written) for ``_condition`` to refuse."""

    text: str


def _condition(value: object) -> object:
    """A ``when`` as written: a CEL string, ``true``/``false`` or absent; anything else (``when: 1``, which
    pydantic's lax bool would read as ``true``: a catch-all; ``YAML11Boolean``) is an error."""
    if value is None or isinstance(value, str | bool):
        return value
    if isinstance(value, YAML11Boolean):
        fires = "always fires" if value.text.lower() in ("yes", "on") else "never fires"
        raise ValueError(f"'{value.text}' is a YAML 1.1 boolean ({fires}); write true or false, or quote a CEL "
                         "condition")
    raise ValueError(f"must be a CEL condition (a string), true or false, not {type(value).__name__} {value!r}")


#: A rule's ``when``: a CEL condition, ``true``/``false``, or None (always).
Condition = Annotated[str | bool | None, BeforeValidator(_condition)]
#: Prefix of a fallback item that names a rule.
RULE_REF = "rule:"


class FallbackSpec(StrictModel):
    """A fallback with its own mode: ``{target, mode}``."""

    target: str = Field(min_length=1)
    mode: RouteMode | None = None


class RouteSpec(StrictModel):
    """Where a matching rule sends the request: ``target``, optional ``mode`` (``aggregated``,
    ``disaggregated``, ``auto``; the target's default when omitted) and ordered ``fallbacks``
    (target names, ``{target, mode}`` or ``"rule:NAME"``; see the module docstring)."""

    target: str = Field(min_length=1)
    mode: RouteMode | None = None
    fallbacks: list[Annotated[str, Field(min_length=1)] | FallbackSpec] = []


class RuleSpec(StrictModel):
    """One rule: ``name``, optional CEL condition ``when`` (absent or ``true`` = always),
    ``route``, ``labels``; ``if_fleet_has``: targets the rule needs (it must name each, in its
    route or condition): on a fleet without one of them the rule is left out, and
    ``CompiledPolicy.omitted`` says so (module docstring)."""

    name: RuleName
    description: str = ""
    when: Condition = None
    route: RouteSpec
    labels: dict[str, str] = {}
    if_fleet_has: list[Annotated[str, Field(min_length=1)]] = []


class LoadSignalsSpec(StrictModel):
    """How load readings are read: older than ``max_age_s`` seconds is stale, and a stale one
    means ``on_stale``: ``unknown`` (default; engine fields null), ``saturated`` (full) or
    ``ignore`` (used as is). See ``policy/signals/load_board.py``."""

    max_age_s: Annotated[float, Field(gt=0, allow_inf_nan=False)] = 10.0
    on_stale: Literal["unknown", "saturated", "ignore"] = "unknown"


class SignalsSpec(StrictModel):
    """Signal settings: ``load`` staleness."""

    load: LoadSignalsSpec = LoadSignalsSpec()


class EscalateSpec(StrictModel):
    """Where an escalated request goes: ``target`` (a fleet target, in its default mode) then
    ``fallbacks`` (target names) when it is ineligible or refuses the budget hold."""

    target: str = Field(min_length=1)
    fallbacks: list[Annotated[str, Field(min_length=1)]] = []


class VerifyRuleSpec(StrictModel):
    """One verify rule: ``name``, optional CEL ``when`` (over route signals and ``draft.*``),
    ``action`` (``accept`` or ``escalate``), ``escalate`` (required for ``escalate``), ``labels``."""

    name: RuleName
    description: str = ""
    when: Condition = None
    action: Literal["accept", "escalate"]
    escalate: EscalateSpec | None = None
    labels: dict[str, str] = {}


class VerifySpec(StrictModel):
    """The ``verify`` section: ordered ``rules`` (the last one unconditional) and ``prefix_tokens``:
    verify the draft's first N tokens while it streams (early verification: an escalation starts
    after N tokens and the draft is cancelled), or the whole draft when omitted."""

    rules: list[VerifyRuleSpec] = Field(min_length=1)
    prefix_tokens: int | None = Field(default=None, ge=1, le=8192)


class PolicySpec(StrictModel):
    """The validated content of a policy file."""

    apiVersion: Literal["pointsman/v1"]
    kind: Literal["RoutingPolicy"]
    metadata: Metadata = Metadata()
    variables: dict[Identifier, JSONValue] = {}
    signals: SignalsSpec = SignalsSpec()
    filters: FiltersSpec = FiltersSpec()
    endpoint_selection: EndpointSelectionSpec = EndpointSelectionSpec()
    disaggregation: DisaggregationSpec = DisaggregationSpec()
    rules: list[RuleSpec] = Field(min_length=1)
    verify: VerifySpec | None = None
