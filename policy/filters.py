"""Eligibility filters: which targets can serve a request at all, and why not.

A filter is a plain function ``(target_name, target, request_signals) -> reason | None``
registered by name in ``FILTERS``; ``None`` means eligible. Built in:

- ``context-window``: prompt tokens plus the client's output cap (1 token when uncapped)
  must fit the target's ``context_window_tokens``.
- ``capabilities``: image inputs need ``capabilities.images``; tools need ``capabilities.tools``.

The policy issue adds health, tenant allow-lists and budget filters, and lets a
policy choose its filters; this module keeps the same function shape.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from pointsman.errors import RequestError
from pointsman.policy.fleet import Fleet, FrontierTarget, OnPremTarget

FilterFn = Callable[[str, "OnPremTarget | FrontierTarget", dict[str, Any]], "str | None"]


def context_window(name: str, target: OnPremTarget | FrontierTarget, request: dict[str, Any]) -> str | None:
    """Ineligible when prompt_tokens + output cap (1 if uncapped) > context_window_tokens."""
    need = request["prompt_tokens"] + (request["max_output_tokens"] if request["max_output_tokens_set"] else 1)
    if need > target.context_window_tokens:
        return f"needs {need:,} tokens > window {target.context_window_tokens:,}"
    return None


def capabilities(name: str, target: OnPremTarget | FrontierTarget, request: dict[str, Any]) -> str | None:
    """Ineligible when the request has images (tools) and the target does not take them."""
    if request["has_images"] and not target.capabilities.images:
        return "does not accept image inputs"
    if request["has_tools"] and not target.capabilities.tools:
        return "does not support tools"
    return None


FILTERS: dict[str, FilterFn] = {"context-window": context_window, "capabilities": capabilities}


@dataclass(frozen=True)
class Exclusion:
    """Why a target is ineligible: the ``filter`` that removed it and its ``reason``."""

    filter: str
    reason: str

    def __str__(self) -> str:
        return f"{self.filter}: {self.reason}"


def eligibility(fleet: Fleet, request: dict[str, Any], filters: dict[str, FilterFn] = FILTERS) -> dict[str, Exclusion | None]:
    """For every target in file order: ``None`` if eligible, else the first ``Exclusion``."""
    out: dict[str, Exclusion | None] = {}
    for name, target in fleet.targets.items():
        out[name] = None
        for fname, fn in filters.items():
            reason = fn(name, target, request)
            if reason is not None:
                out[name] = Exclusion(fname, reason)
                break
    return out


class NoEligibleTarget(RequestError):
    """No rule produced an eligible target; ``exclusions`` says which filter removed which target."""

    def __init__(self, exclusions: dict[str, Exclusion | None], considered: list[str]) -> None:
        self.exclusions = exclusions
        parts = [f"{t} ({exclusions[t]})" if exclusions.get(t) else t for t in considered]
        super().__init__("no eligible target: " + "; ".join(parts))
