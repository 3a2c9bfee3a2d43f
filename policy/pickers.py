"""Endpoint pickers: which endpoints of the chosen target's pool(s), in what order.

A picker has ``pick(target_name, mode, signals) -> tuple[EndpointChoice, ...]`` and
is registered by name in ``PICKERS``. Built in: ``in-order`` (the pool's endpoints as
the fleet file lists them; prefill endpoints then decode endpoints when
disaggregated; the frontier tier's base URL). The policy issue adds cache- and
load-aware pickers with the same shape; ``signals`` is the decision's snapshot.
"""

from __future__ import annotations

from typing import Any, Protocol

from pointsman.policy.decision import EndpointChoice
from pointsman.policy.fleet import Fleet, FrontierTarget


class Picker(Protocol):
    """Orders the endpoints of one target in one mode for one request."""

    def pick(self, target: str, mode: str, signals: dict[str, Any]) -> tuple[EndpointChoice, ...]:
        """Endpoints of ``target`` in ``mode``, best first; ``signals`` is the decision's snapshot."""
        ...


class InOrderPicker:
    """The fleet file's order, precomputed per (target, mode); ignores signals."""

    def __init__(self, fleet: Fleet) -> None:
        self._table: dict[tuple[str, str], tuple[EndpointChoice, ...]] = {}
        for name, target in fleet.targets.items():
            if isinstance(target, FrontierTarget):
                self._table[(name, "aggregated")] = (EndpointChoice(target.base_url, "api", name),)
                continue
            pools = target.pools
            if pools.aggregated is not None:
                self._table[(name, "aggregated")] = tuple(
                    EndpointChoice(e.url, "aggregated", e.name) for e in pools.aggregated.endpoints)
            if pools.prefill is not None and pools.decode is not None:
                self._table[(name, "disaggregated")] = (
                    *(EndpointChoice(e.url, "prefill", e.name) for e in pools.prefill.endpoints),
                    *(EndpointChoice(e.url, "decode", e.name) for e in pools.decode.endpoints))

    def pick(self, target: str, mode: str, signals: dict[str, Any]) -> tuple[EndpointChoice, ...]:
        """Endpoints of ``target`` in ``mode``; raises KeyError for a mode the target lacks."""
        return self._table[(target, mode)]


PICKERS: dict[str, type] = {"in-order": InOrderPicker}


def base_url(endpoints: tuple[EndpointChoice, ...]) -> str:
    """The URL a gateway calls: the first ``aggregated``, ``decode`` or ``api`` endpoint."""
    return next(e.url for e in endpoints if e.role != "prefill")
