"""The policy file's schema (pydantic; unknown keys are errors).

::

    apiVersion: pointsman/v1
    kind: RoutingPolicy
    metadata: {name: default, description: ..., labels: {team: infra}}
    variables:                    # named constants, read as variables.<name>
      p_hard_frontier: 0.62
    rules:                        # ordered; the first whose `when` is true decides
      - name: hard-prompt
        when: difficulty.p_hard >= variables.p_hard_frontier    # CEL; omitted = always
        route: {target: frontier-large, mode: aggregated, fallbacks: [onprem-70b]}
        labels: {reason: quality}
      - name: default             # an unconditional rule is required, and must be last
        route: {target: onprem-8b}

Semantics (targets exist, modes are supported, a default exists, CEL parses and
names known signals) are checked by ``policy/compiler.py``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, StringConstraints

from pointsman.policy.fleet import Metadata, Mode
from pointsman.policy.located import StrictModel

RuleName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")]
Identifier = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")]
JsonScalar = str | int | float | bool | None
VariableValue = JsonScalar | list[Any] | dict[str, Any]


class RouteSpec(StrictModel):
    """Where a matching rule sends the request: ``target``, optional ``mode`` (the target's
    default when omitted) and ordered ``fallbacks`` (other targets)."""

    target: str = Field(min_length=1)
    mode: Mode | None = None
    fallbacks: list[str] = []


class RuleSpec(StrictModel):
    """One rule: ``name``, optional CEL condition ``when`` (absent or ``true`` = always),
    ``route``, ``labels``."""

    name: RuleName
    description: str = ""
    when: str | bool | None = None
    route: RouteSpec
    labels: dict[str, str] = {}


class PolicySpec(StrictModel):
    """The validated content of a policy file."""

    apiVersion: Literal["pointsman/v1"]
    kind: Literal["RoutingPolicy"]
    metadata: Metadata = Metadata()
    variables: dict[Identifier, VariableValue] = {}
    rules: list[RuleSpec] = Field(min_length=1)
