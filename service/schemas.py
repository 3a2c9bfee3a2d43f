"""HTTP response schemas of the decision service (pydantic; they document the API in
OpenAPI). The request schema is ``pointsman.request.RouteRequest``.

``RouteResponse`` mirrors ``Decision.to_dict()``; a test checks that every decision
validates against it.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel


class EndpointOut(BaseModel):
    """One endpoint of the chosen pool: ``url``, ``role`` (aggregated, prefill, decode, api), ``name``."""

    url: str
    role: Literal["aggregated", "prefill", "decode", "api"]
    name: str | None = None


class FallbackOut(BaseModel):
    """A target to try next: fleet ``target``, upstream ``model``, ``base_url``, ``mode``."""

    target: str
    model: str
    base_url: str
    mode: Literal["aggregated", "disaggregated"]


class Timings(BaseModel):
    """Milliseconds spent on request features, the estimator, the policy step, and in total."""

    features: float
    estimator: float
    policy: float
    total: float


class RouteResponse(BaseModel):
    """A routing decision (see ``pointsman.policy.decision.Decision``). ``trace`` is present
    only when the request set ``routing.explain``."""

    decision_id: str
    target: str
    model: str
    base_url: str
    mode: Literal["aggregated", "disaggregated"]
    endpoints: list[EndpointOut]
    fallbacks: list[FallbackOut]
    estimated_cost_usd: float
    rule: str
    labels: dict[str, str]
    p_hard: float | None
    difficulty_available: bool
    prompt_tokens: int
    policy_revision: str
    fleet_revision: str
    estimator_version: str
    timings_ms: Timings
    trace: dict[str, Any] | None = None


class ErrorBody(BaseModel):
    """What went wrong: ``message`` (complete sentence), ``type`` (``invalid_request_error``,
    ``request_too_large``, ``no_eligible_target``, ``internal_error``), ``param`` (the offending
    field, e.g. ``messages[0].content``, or null), ``code`` (a short machine-readable code)."""

    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """Error envelope, shaped like OpenAI's so gateways can pass it through."""

    error: ErrorBody


class EstimatorHealth(BaseModel):
    """The estimator's version, whether it is loaded, and why not."""

    version: str
    available: bool
    error: str | None = None


class HealthResponse(BaseModel):
    """``GET /healthz``: the service answers; which policy, fleet and estimator it runs."""

    status: Literal["ok"]
    policy: str
    policy_revision: str
    fleet_revision: str
    estimator: EstimatorHealth
