"""HTTP response schemas of the decision service (pydantic; they document the API in
OpenAPI). The request schema is ``pointsman.request.RouteRequest``.

``RouteResponse`` mirrors ``Decision.to_dict()``; a test checks that every decision
validates against it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from pointsman.json_types import JSONBool
from pointsman.policy.signals.load_board import PushedSnapshot
from pointsman.service.live_engine import FollowStatus, SwapResult


class EndpointOut(BaseModel):
    """One endpoint of the chosen pool: ``url``, ``role`` (aggregated, prefill, decode, api), ``name``."""

    url: str
    role: Literal["aggregated", "prefill", "decode", "api"]
    name: str | None = None


class FallbackOut(BaseModel):
    """A target to try next: fleet ``target``, upstream ``model`` (the request's LoRA adapter where the target serves
    it, ``Fleet.served_model``), ``base_url``, ``mode``."""

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
    prefill_url: str | None = Field(default=None, description=(
        "The prefill endpoint of a disaggregated decision (null otherwise). Send the request to base_url, "
        "never to endpoints[0] (a prefill endpoint when disaggregated)."))
    forward_headers: dict[str, str] = Field(default_factory=dict, description=(
        "Headers to add when forwarding to base_url: x-pointsman-decision-id, and for a disaggregated "
        "decision x-prefiller-host-port (host:port of prefill_url, read by llm-d's routing sidecar)."))
    fallbacks: list[FallbackOut]
    estimated_cost_usd: float
    rule: str
    labels: dict[str, str]
    p_hard: float | None
    difficulty_available: bool
    prompt_tokens: int = Field(description=(
        "The prompt's tokens on the chosen target: its text and its images, audio and files by that target's rules "
        "(what estimated_cost_usd prices and the dispatch holds as prefill; request.prompt_tokens counts the text "
        "and 765 an image)."))
    policy_revision: str
    fleet_revision: str
    estimator_version: str
    timings_ms: Timings
    verify_prefix_tokens: int | None = Field(default=None, description=(
        "With a cascade (the policy's verify section): verify the draft's first N tokens while it streams "
        "(POST /v1/verify with partial: true) and cancel it on escalate; null: verify the whole draft."))
    trace: dict[str, object] | None = None  # JSON (documented in Decision), not validated here


class ErrorBody(BaseModel):
    """What went wrong: ``message`` (complete sentence), ``type`` (``invalid_request_error``,
    ``request_too_large``, ``request_timeout``, ``no_eligible_target``, ``internal_error``), ``param`` (the offending
    field, e.g. ``messages[0].content``, or null), ``code`` (a short machine-readable code)."""

    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """Error envelope, shaped like OpenAI's so gateways can pass it through."""

    error: ErrorBody


class EstimatorHealth(BaseModel):
    """The estimator's version, whether it is loaded, why not, and where it came from
    (``bundled``, a directory, ``models:/NAME/V (@alias)``)."""

    version: str
    available: bool
    error: str | None = None
    source: str | None = None


class HealthResponse(BaseModel):
    """``GET /healthz``: the service answers; which policy, fleet and estimator it runs."""

    status: Literal["ok"]
    policy: str
    policy_revision: str
    fleet_revision: str
    estimator: EstimatorHealth
    auth: bool = False
    last_swap: SwapResult | None = None
    model_follow: FollowStatus | None = None


class EndpointReadiness(BaseModel):
    """One fleet endpoint in ``/readyz``: its ``name`` and ``target``, whether it is ``healthy`` and
    why not (``reason``: every source's, e.g. ``scrape failed 3x: ...``), and its ``scrape`` state:
    ``ok: ...``, ``failing: <error> (<n> in a row)``, ``pending: ...`` or ``off: <why>``."""

    name: str | None
    target: str
    healthy: bool
    reason: str | None = None
    scrape: str


class ReadyResponse(BaseModel):
    """``GET /readyz``: ``ready`` when the engine serves, the decision log writer runs and the
    outcome log takes writes;
    ``checks`` names each part's state (``ok``, ``degraded: ...`` or what is wrong);
    ``endpoints`` each fleet endpoint's health and scrape state, by id (they do not decide readiness:
    an engine down makes its requests go elsewhere, not this service unready)."""

    status: Literal["ready", "not_ready"]
    checks: dict[str, str]
    endpoints: dict[str, EndpointReadiness] = {}


class SettlementOut(BaseModel):
    """What an outcome did to the budget ledger and the load board (``FleetState.settle``):
    ``actual_cost_usd`` booked, ``replayed`` (settled before; nothing changed),
    ``released_load`` (in-flight entries released), the reservation it replaced and by how
    much the actual cost overran it (USD), and the hold's state in the ledger (``held``, ``expired``,
    ``released``, ``unreserved``: admitted without a reservation, booked from the signed id's
    scopes; ``journaled``: the ledger was unavailable, kept in the spend journal and booked when it
    returns)."""

    decision_id: str
    target: str | None
    mode: str | None
    actual_cost_usd: float
    replayed: bool
    released_load: int
    reserved_usd: float | None = None
    overrun_usd: float | None = None
    hold_state: str | None = None


class OutcomeAckOut(BaseModel):
    """One outcome's acknowledgement. ``status``: ``stored`` (new; durable on disk),
    ``duplicate`` (stored before with the same content; durable), ``forwarded`` (another
    replica logged the decision: sent to its outcome log through the shared state, which
    stores it or finds it a duplicate or conflict there; settled here), ``conflict`` (stored before
    with different content; unchanged), ``unknown_decision`` (no such decision; not stored) or
    ``invalid`` (an item of a batch that fails validation, or whose usage is impossible on the
    target that served it; not stored; ``message`` names every bad field, ``[1].status: ...``); a stored one's
    ``message`` says when its ``served_endpoint`` was not recognised (stored as sent, counted on no endpoint).
    ``outcome_id``/``decision_id`` are None only for an invalid item without a valid id.
    ``settlement``: the budget settlement (None for shadow outcomes, rejected ones, or when
    ``settle_error`` says why it could not be settled); ``released``: the request never ran
    (no usage reported with an error/timeout/cancelled status), so its hold was dropped."""

    outcome_id: str | None
    decision_id: str | None
    status: Literal["stored", "duplicate", "forwarded", "conflict", "unknown_decision", "invalid"]
    message: str | None = None
    settlement: SettlementOut | None = None
    released: bool = False
    settle_error: str | None = None


class OutcomesResponse(BaseModel):
    """``POST /v1/outcomes``: one acknowledgement per outcome, in order, and the count per status."""

    acks: list[OutcomeAckOut]
    counts: dict[str, int]


class TelemetryIn(BaseModel):
    """One load report for ``endpoint`` (its fleet name, URL or id): ``load`` (vLLM-standard
    fields, see ``policy/signals/load_board.py`` ``PushedSnapshot``) and/or ``healthy`` with a ``reason``."""

    model_config = {"extra": "forbid"}

    endpoint: str
    load: PushedSnapshot | None = None
    healthy: JSONBool | None = None
    reason: str | None = Field(default=None, max_length=500)


class TelemetryAck(BaseModel):
    """The merged reading of one reported endpoint after the report."""

    endpoint: str
    target: str
    healthy: bool
    load: dict[str, object] | None


class TelemetryResponse(BaseModel):
    """``POST /v1/telemetry``: how many reports were applied, and each endpoint's reading now."""

    accepted: int
    endpoints: list[TelemetryAck]


class ProblemOut(BaseModel):
    """One located problem in a policy file (1-based ``line``/``col``; 0 = unknown) and its ``text``."""

    file: str
    line: int
    col: int
    code: str
    message: str
    text: str


class ReloadOut(BaseModel):
    """A policy reload: ``ok``; ``changed`` (a new revision serves now); the ``revision`` serving
    after it and the ``previous_revision``; ``problems`` when rejected; ``source``; ``at`` (Unix s)."""

    ok: bool
    changed: bool
    revision: str
    previous_revision: str
    source: str
    at: float
    problems: list[ProblemOut]


class BudgetStatusOut(BaseModel):
    """One budget now (``budgets_reload.budget_statuses``): USD amounts in the current UTC window
    ``window_id``; ``spent_usd`` = ``settled_usd`` + ``held_usd``; ``remaining_usd`` =
    max(0, limit - spent); ``resets_at`` ISO 8601 UTC, ``resets_in_s`` seconds from now."""

    scope: str
    window: Literal["day", "month"]
    window_id: str
    limit_usd: float
    settled_usd: float
    held_usd: float
    spent_usd: float
    remaining_usd: float
    used_ratio: float
    resets_at: str
    resets_in_s: float


class BudgetsResponse(BaseModel):
    """``GET /v1/budgets``: every configured budget, the budgets file and its revision, whether a
    watcher follows it, and the last reload attempt."""

    budgets: list[BudgetStatusOut]
    file: str | None
    revision: str | None
    reservation_ttl_s: float | None
    watching: bool
    last_reload: ReloadOut | None


class RuleOut(BaseModel):
    """One rule of the serving policy: name, condition (CEL, None = always), route, labels, line."""

    name: str
    when: str | None
    target: str
    mode: str
    fallbacks: list[str]
    labels: dict[str, str]
    line: int


class PolicyResponse(BaseModel):
    """``GET /v1/policy``: the serving policy (name, file, revision, fleet revision, rules,
    variables, source text) and the last reload attempt."""

    name: str
    file: str
    revision: str
    fleet_revision: str
    rules: list[RuleOut]
    variables: dict[str, object]
    source: str | None
    watching: bool
    last_reload: ReloadOut | None = None


class PolicyValidateIn(BaseModel):
    """``POST /v1/policy/validate``: ``policy``, the policy file's text (YAML + CEL), and
    optionally the ``file`` name problems are located in."""

    model_config = {"extra": "forbid"}

    policy: str
    file: str | None = Field(default=None, max_length=500)


class PolicyValidateResponse(BaseModel):
    """Whether the text compiles against the serving fleet: ``valid``; its ``name``,
    ``revision`` and rule names when it does; every located problem when not."""

    valid: bool
    name: str | None = None
    revision: str | None = None
    rules: list[str] = []
    problems: list[ProblemOut] = []


class FleetResponse(BaseModel):
    """``GET /v1/fleet``: every target with its endpoints' current signals and their ages
    (``FleetState.fleet_status``; per endpoint also ``scrape``: its metrics URL, the age of the
    last good scrape, the last error and failures in a row), and its effective price per token
    today (``effective_price``: ``cost.TargetPrice`` fields, None without a budget ledger), what an on-prem target's
    usage is priced at (``utilization``: ``FleetState.utilization_basis``, None for a frontier one) and its shadow
    outcomes' cost in USD since this replica started (``shadow_spent_usd``, as ``pointsman_shadow_spend_usd_total``)."""

    fleet_revision: str
    policy_revision: str
    targets: dict[str, dict[str, object]]
    #: the shared-state sync (``POINTSMAN_STATE_URL``): whether state is shared and how it follows
    shared_state: dict[str, object] | None = None
    #: whether any engine's ``/metrics`` is scraped: the scraper runs (``POINTSMAN_SCRAPE_INTERVAL_S`` > 0) and the
    #: fleet names at least one endpoint to scrape (``defaults.scrape_metrics``, ``metrics_url``); each endpoint's
    #: ``scrape`` says how it went, ``/readyz`` why one is not scraped
    scraping: bool = False
    watching_fleet: bool = False
    last_fleet_reload: dict[str, object] | None = None
