"""The ``Decision``: where one request runs, why, and at what estimated cost.

A decision is plain data; ``to_dict()`` gives the JSON the service returns and the
decision log stores. ``decision_id`` is the join key to the request's outcome: 32
hex characters, the first 12 a millisecond Unix timestamp (so ids sort by time,
like a ULID) and the rest random.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, TypeAlias

import numpy as np
from numpy.typing import NDArray

if TYPE_CHECKING:  # pragma: no cover
    from pointsman.estimator.features import RequestFeatures
    from pointsman.request import RequestView

#: A decision's trace: JSON-ready (finite floats, str keys), sections as ``Decision`` lists them.
Trace: TypeAlias = dict[str, object]


def new_decision_id() -> str:
    """A time-ordered 128-bit id as 32 hex chars: 48-bit ms timestamp + 80 random bits."""
    return f"{time.time_ns() // 1_000_000:012x}{secrets.token_hex(10)}"


@dataclass(frozen=True)
class EndpointChoice:
    """One endpoint to send to: ``url``, ``role`` (``aggregated``, ``prefill``, ``decode`` or
    ``api`` for a frontier tier) and the fleet's ``name`` for it (may be None)."""

    url: str
    role: str
    name: str | None = None

    def to_dict(self) -> dict[str, str | None]:
        """``{"url", "role", "name"}``."""
        return {"url": self.url, "role": self.role, "name": self.name}


@dataclass(frozen=True)
class Fallback:
    """A target to try if the chosen one fails: ``target``, upstream ``model``, ``base_url``, ``mode``."""

    target: str
    model: str
    base_url: str
    mode: str

    def to_dict(self) -> dict[str, str]:
        """``{"target", "model", "base_url", "mode"}``."""
        return {"target": self.target, "model": self.model, "base_url": self.base_url, "mode": self.mode}


@dataclass(frozen=True)
class Decision:
    """A routing decision.

    ``target``/``model``/``base_url``/``mode``: where to send (fleet target name, upstream
    model name, the URL to call: the first aggregated/decode endpoint or the API base URL;
    ``aggregated`` or ``disaggregated``). ``endpoints``: every endpoint of the chosen pool(s)
    in preference order (prefill and decode both listed when disaggregated).
    ``fallbacks``: eligible targets to try next, in order. ``estimated_cost_usd``: cost of
    the request on the chosen target and mode (``policy/cost.py``). ``rule``: the deciding
    rule; ``labels``: its labels. ``p_hard``: the estimator's probability (None when
    ``difficulty_available`` is False). ``prompt_tokens``: the prompt length used.
    ``policy_revision``/``fleet_revision``: content hashes; ``estimator_version``: the
    model's version. ``timings_ms``: ``features``, ``estimator``, ``policy``, ``total``
    in milliseconds. ``trace``: every rule evaluated with its result or error, the
    signals read with their values and ages, every candidate with its cost and eligibility,
    the P/D mode with its reason, the endpoint candidates with their scores and the budget
    reservation. It is built by ``trace_builder`` on first access (the engine builds it at
    once when the request asks to explain; otherwise a decision nobody inspects costs none).
    """

    decision_id: str
    target: str
    model: str
    base_url: str
    mode: str
    endpoints: tuple[EndpointChoice, ...]
    fallbacks: tuple[Fallback, ...]
    estimated_cost_usd: float
    rule: str
    p_hard: float | None
    difficulty_available: bool
    prompt_tokens: int
    policy_revision: str
    fleet_revision: str
    estimator_version: str
    timings_ms: dict[str, float]
    labels: dict[str, str] = field(default_factory=dict)
    trace_builder: Callable[[], Trace] | None = field(default=None, repr=False, compare=False)
    #: The ``RequestFeatures``, the ``RequestView`` and the estimator's head input
    #: (``DifficultyEstimate.features``, float32 (d,) or None) the decision used, for the
    #: decision log (not in ``to_dict``).
    request_features: RequestFeatures | None = field(default=None, repr=False, compare=False)
    request_view: RequestView | None = field(default=None, repr=False, compare=False)
    head_input: NDArray[np.float32] | None = field(default=None, repr=False, compare=False)
    #: Why there is no difficulty estimate (``DifficultyEstimate.error``, e.g. ``timeout: ...``;
    #: None when there is one); in the trace's ``estimator`` section, not in ``to_dict``.
    difficulty_error: str | None = field(default=None, repr=False, compare=False)

    @cached_property
    def trace(self) -> Trace:
        """The decision's trace (see the class docstring); ``{}`` without a builder."""
        return self.trace_builder() if self.trace_builder is not None else {}

    def to_dict(self, explain: bool = True) -> dict[str, object]:
        """JSON-ready dict of every field; ``trace`` only when ``explain``."""
        d: dict[str, object] = {
            "decision_id": self.decision_id,
            "target": self.target,
            "model": self.model,
            "base_url": self.base_url,
            "mode": self.mode,
            "endpoints": [e.to_dict() for e in self.endpoints],
            "fallbacks": [f.to_dict() for f in self.fallbacks],
            "estimated_cost_usd": self.estimated_cost_usd,
            "rule": self.rule,
            "labels": dict(self.labels),
            "p_hard": self.p_hard,
            "difficulty_available": self.difficulty_available,
            "prompt_tokens": self.prompt_tokens,
            "policy_revision": self.policy_revision,
            "fleet_revision": self.fleet_revision,
            "estimator_version": self.estimator_version,
            "timings_ms": dict(self.timings_ms),
        }
        if explain:
            d["trace"] = self.trace
        return d
