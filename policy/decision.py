"""The ``Decision``: where one request runs, why, and at what estimated cost.

A decision is plain data; ``to_dict()`` gives the JSON the service returns and the
decision log stores. ``decision_id`` is the join key to the request's outcome: 32
hex characters, the first 12 a millisecond Unix timestamp (so ids sort by time,
like a ULID) and the rest random; a dispatched decision's id is followed by its signed claims
(``<32 hex>.<claims>.<mac>``, ``policy/signals/signed_ids.py``), so any replica can settle it.

**Where the gateway sends the request (the P/D forwarding contract).** Always to
``base_url`` (the first ``aggregated``, ``decode`` or ``api`` endpoint of ``endpoints``), with
``model`` set to the decision's ``model`` and the headers of ``forward_headers``:

- every decision: ``x-pointsman-decision-id: <decision_id>``;
- a ``disaggregated`` decision also names its prefill endpoint (``prefill_url``, the first
  ``prefill`` endpoint of ``endpoints``) as ``x-prefiller-host-port: <host>:<port>`` — the
  header llm-d's routing sidecar on the decode endpoint reads: it sends the prefill request
  (``kv_transfer_params`` with ``do_remote_decode: true``, ``max_tokens: 1``, ``stream: false``)
  to that host, then runs the decode locally with the prefill answer's ``kv_transfer_params``
  (llm-d-inference-scheduler ``pkg/sidecar/proxy``; vLLM's disaggregated proxy
  ``tests/v1/kv_connector/nixl_integration/toy_proxy_server.py`` does the same two calls
  itself). A gateway that is its own P/D proxy calls ``prefill_url`` first and ``base_url``
  second; one that fronts the sidecar only forwards to ``base_url`` with the header.

``endpoints[0]`` is therefore *not* where to send a disaggregated request: it is the prefill
endpoint (``endpoints`` lists prefill endpoints before decode ones).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, TypeAlias
from urllib.parse import urlsplit

import numpy as np
from numpy.typing import NDArray

if TYPE_CHECKING:  # pragma: no cover
    from pointsman.estimator.features import RequestFeatures
    from pointsman.request import RequestView

#: A decision's trace: JSON-ready (finite floats, str keys), sections as ``Decision`` lists them.
Trace: TypeAlias = dict[str, object]


#: Forwarding headers of the P/D contract (see the module docstring).
DECISION_HEADER = "x-pointsman-decision-id"
PREFILLER_HEADER = "x-prefiller-host-port"
_DEFAULT_PORTS = {"http": 80, "https": 443}


def host_port(url: str) -> str:
    """``host:port`` of an endpoint URL (``http://10.0.0.7:8000/v1`` -> ``10.0.0.7:8000``; the
    scheme's port when the URL names none: 80 for http, 443 for https; IPv6 hosts bracketed).
    Raises ``ValueError`` for a URL without a host."""
    parts = urlsplit(url)
    host = parts.hostname
    if not host:
        raise ValueError(f"endpoint URL '{url}' has no host")
    port = parts.port or _DEFAULT_PORTS.get(parts.scheme.lower(), 80)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def new_decision_id() -> str:
    """A time-ordered 128-bit id as 32 hex chars: 48-bit ms timestamp + 80 random bits."""
    return f"{time.time_ns() // 1_000_000:012x}{os.urandom(10).hex()}"  # secrets.token_hex(10) without its two calls


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
    model name: the request's LoRA adapter where the target serves it, ``Fleet.served_model``; the URL to call:
    the first aggregated/decode endpoint or the API base URL;
    ``aggregated`` or ``disaggregated``). ``endpoints``: every endpoint of the chosen pool(s)
    in preference order (prefill and decode both listed when disaggregated, prefill first).
    ``prefill``/``forward_headers`` (properties; ``prefill_url`` and ``forward_headers`` in
    ``to_dict``): the P/D forwarding contract of the module docstring.
    ``fallbacks``: eligible targets to try next, in order. ``estimated_cost_usd``: cost of
    the request on the chosen target and mode (``policy/cost.py``). ``rule``: the deciding
    rule; ``labels``: its labels. ``p_hard``: the estimator's probability (None when
    ``difficulty_available`` is False). ``prompt_tokens``: the prompt's tokens on the chosen target
    (``cost.target_prompt_tokens``: its images, audio and files by the target's rules), as the cost counted them.
    ``policy_revision``/``fleet_revision``: content hashes; ``estimator_version``: the
    model's version. ``timings_ms``: ``features``, ``estimator``, ``policy``, ``total``
    in milliseconds. ``trace``: every rule evaluated with its result or error, the
    signals and function calls (``cost("frontier-large")``) read with their values and ages,
    every candidate with its cost and eligibility,
    the P/D mode with its reason, the endpoint candidates with their scores and the budget
    reservation. ``verify_prefix_tokens``: the policy's ``verify.prefix_tokens`` (verify the draft's
    first N tokens while it streams, ``POST /v1/verify``), None when it verifies whole drafts or has no
    verify section. It is built by ``trace_builder`` on first access (the engine builds it at
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
    verify_prefix_tokens: int | None = None
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

    @property
    def prefill(self) -> EndpointChoice | None:
        """The prefill endpoint of a ``disaggregated`` decision (the first ``prefill`` endpoint),
        else None."""
        if self.mode != "disaggregated":
            return None
        return next((e for e in self.endpoints if e.role == "prefill"), None)

    @property
    def forward_headers(self) -> dict[str, str]:
        """Headers the gateway adds when it forwards to ``base_url`` (the module's contract):
        the decision id, and the prefill endpoint's ``host:port`` when disaggregated."""
        headers = {DECISION_HEADER: self.decision_id}
        prefill = self.prefill
        if prefill is not None:
            headers[PREFILLER_HEADER] = host_port(prefill.url)
        return headers

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
            "prefill_url": None if (prefill := self.prefill) is None else prefill.url,
            "forward_headers": self.forward_headers,
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
            "verify_prefix_tokens": self.verify_prefix_tokens,
        }
        if explain:
            d["trace"] = self.trace
        return d
