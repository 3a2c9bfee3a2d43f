"""``POST /v1/route``: one chat request in, one routing decision out.

The body is an OpenAI chat request plus Pointsman's ``routing`` context
(``pointsman.request.RouteRequest``), read with the size limit and strict JSON of
``bodies.py``; a body of another API (Anthropic Messages: a top-level ``system`` or its content blocks;
no ``messages``: Responses, Completions) is read as the ext_proc picker reads it (``ext_proc_body.chat_request``).
The answer is the decision (``schemas.RouteResponse``; the trace when
``routing.explain`` is true) with headers ``x-pointsman-decision-id`` and
``x-pointsman-target`` a gateway can forward. The decision is dispatched (its estimated
cost reserved on its budget scopes: ``routing.tenant``, ``routing.team`` and the caller's
key name) and handed to the decision log writer, which commits it in the background.

Errors: 400 (empty, malformed JSON, invalid UTF-8), 413 (over the size limit), 422
(a field is wrong: ``param`` names it; or no target can take the request:
``no_eligible_target``), 429 ``budget_exhausted`` (a target that could take the request was
excluded by its budget: a refusal, as the ext_proc picker's), 503 (budget ledger down, service starting).

The decision runs on the event loop by default (its cost per stage: ``docs/architecture.md``,
the budget ``scripts/bench_decision.py`` checks), which the measurements in
``scripts/load_service.py`` found faster than a threadpool hop on two cores; the loop never waits
on it: the estimate is awaited on the estimator's pool and the dispatch's shared-state write is
sent by the loop and its reply awaited (``route_async``). ``POINTSMAN_ROUTE_IN_THREADPOOL=true`` moves the decision
to the threadpool instead (blocking waits there). A hung estimator cannot hold a decision past
``POINTSMAN_ESTIMATOR_TIMEOUT_MS`` (default 50 ms, ``deadline.py``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Set as AbstractSet

from fastapi import APIRouter, Depends, Request

from pointsman.errors import RequestError
from pointsman.estimator.estimate import Estimator
from pointsman.policy.budget.ledger import LedgerUnavailable
from pointsman.policy.decision import Decision
from pointsman.policy.engine import RoutingEngine
from pointsman.policy.selection.filters import NoEligibleTarget
from pointsman.policy.signals.shared_state import deferred_writes
from pointsman.request import RouteRequest, parse_route_request
from pointsman.service.auth import Principal, authenticate, header_key, require
from pointsman.service.bodies import JSONAnswer, decode_json, json_answer, json_body, read_body
from pointsman.service.deadline import DeadlineEstimator
from pointsman.service.ext_proc_body import decided_body
from pointsman.service.http_errors import ROUTE_ERRORS, HTTPError, invalid, unavailable
from pointsman.service.runtime import Runtime, get_runtime, runtime_of
from pointsman.service.schemas import RouteResponse

router = APIRouter()


async def route_async(engine: RoutingEngine, request: RouteRequest, *, in_thread: bool = False,
                      api_key_id: str | None = None, endpoint_subset: AbstractSet[str] | None = None) -> Decision:
    """``engine.route(request, ...)`` for a caller on the event loop, without blocking it: the estimate
    is awaited on the estimator's pool (``DeadlineEstimator.estimate_async``) and the dispatch's
    shared-state write is sent by the loop and awaited (``shared_state.deferred_writes``)
    before the decision is returned, so its id is in Redis before anyone sees it; between the two the
    loop serves other requests. ``in_thread`` (``POINTSMAN_ROUTE_IN_THREADPOOL``): the whole route runs
    in a worker thread instead (blocking waits there). The same decision and errors as ``engine.route``."""
    if in_thread:
        return await asyncio.to_thread(engine.route, request, api_key_id=api_key_id, endpoint_subset=endpoint_subset)
    prepared = engine.prepare(request, api_key_id)
    estimator = engine.estimator
    estimate = await estimator.estimate_async(prepared.features, prepared.query_token_ids) \
        if isinstance(estimator, DeadlineEstimator) else None
    with deferred_writes() as pending:
        decision = engine.route(prepared, endpoint_subset=endpoint_subset, estimate=estimate)
    await pending.written()
    return decision


async def decide(rt: Runtime, raw: bytes, key_id: str | None, started: float) -> JSONAnswer:
    """Parse ``raw``, decide (``route_async``: on the event loop, or in a worker thread with
    ``route_in_threadpool``), log and count the decision; returns the response. Raises ``HTTPError``
    (counted in ``pointsman_decision_errors_total``)."""
    engine, request = _parsed(rt, raw)
    try:
        decision = await route_async(engine, request, in_thread=rt.settings.route_in_threadpool, api_key_id=key_id)
    except (NoEligibleTarget, LedgerUnavailable, RequestError) as exc:
        raise refusal(rt, exc) from None
    return answered(rt, engine, request, decision, started)


def _parsed(rt: Runtime, raw: bytes) -> tuple[RoutingEngine, RouteRequest]:
    """The engine to decide on (read once: the decision runs on it to the end) and the request.
    Raises ``HTTPError`` 400/422 (counted)."""
    try:
        body = decode_json(raw)
        engine = rt.live.engine
        try:
            if isinstance(body, dict):
                # another API's request (Anthropic Messages, with its system prompt or its tool_use, tool_result
                # and document blocks; Responses; Completions): read as the endpoint picker reads it, so its
                # system prompt, instructions or token ids are counted, not dropped
                body = decided_body(body)
            return engine, parse_route_request(body)
        except RequestError as exc:
            raise invalid(exc) from None
    except HTTPError as exc:
        rt.metrics.decision_errors.labels(exc.code or str(exc.status)).inc()
        raise


def refusal(rt: Runtime, exc: NoEligibleTarget | LedgerUnavailable | RequestError) -> HTTPError:
    """The answer to a decision the engine refused, counted in ``pointsman_decision_errors_total``:
    429 ``budget_exhausted`` when a budget excluded a target that could take it (as the ext_proc
    picker: a refusal the gateway must not route around), 422 ``no_eligible_target``, 503 when the
    budget ledger is unavailable, 422 naming a bad field."""
    if isinstance(exc, NoEligibleTarget):
        error = HTTPError(429, str(exc), type="budget_exhausted", code="budget_exhausted") if exc.by_budget \
            else HTTPError(422, str(exc), type="no_eligible_target", code="no_eligible_target")
    elif isinstance(exc, LedgerUnavailable):
        error = unavailable(f"budget ledger unavailable: {exc}", "budget_ledger_unavailable")
    else:
        error = invalid(exc)
    rt.metrics.decision_errors.labels(error.code or str(error.status)).inc()
    return error


def answered(rt: Runtime, engine: RoutingEngine, request: RouteRequest, decision: Decision,
             started: float) -> JSONAnswer:
    """The answer to a decision, handed to the decision log and counted (``commit_decision``)."""
    response = json_answer(decision.to_dict(explain=request.routing.explain), [
        (b"x-pointsman-decision-id", decision.decision_id.encode("latin-1")),
        (b"x-pointsman-target", decision.target.encode("latin-1")),
    ])
    commit_decision(rt, decision, request, engine.estimator, started)
    return response


def commit_decision(rt: Runtime, decision: Decision, request: RouteRequest, estimator: Estimator,
                    started: float) -> Decision:
    """Hand an answered decision to the decision log writer and count it (``started``: ``perf_counter``
    when its body was complete). ``/v1/route`` and the ext_proc endpoint picker both call this. Returns
    what the writer (and the cascade) hold: the decision without its trace builder (the answer is written;
    the builder keeps every signal, pool view and pick of the decision alive while they hold it)."""
    kept = without_trace_builder(decision)
    rt.writer.submit(kept, request, estimator)
    if rt.live.engine.policy.verify is not None:  # the gateway may verify its draft (POST /v1/verify)
        rt.cascade.add(kept)
    metrics = rt.metrics
    metrics.observe_decision(decision, time.perf_counter() - started)
    if not decision.difficulty_available:
        metrics.observe_unavailable(decision.difficulty_error)
    return kept


#: ``Decision``'s constructor arguments (every field is one): what ``without_trace_builder`` copies.
_DECISION_FIELDS = frozenset(f.name for f in dataclasses.fields(Decision))


def without_trace_builder(decision: Decision) -> Decision:
    """``dataclasses.replace(decision, trace_builder=None)`` at a fifth of its cost (~2 us against ~10 on
    a decision's 23 fields): a new ``Decision`` holding the same field values (shallow, as ``replace``),
    no trace builder and no trace built yet (so its ``trace`` is ``{}``, as the replaced one's)."""
    kept = object.__new__(type(decision))
    fields = decision.__dict__
    kept.__dict__.update({k: fields[k] for k in _DECISION_FIELDS})
    kept.__dict__["trace_builder"] = None
    return kept


@router.post("/v1/route", response_model=RouteResponse, responses=ROUTE_ERRORS,
             summary="Decide where a chat request runs", tags=["gateway"],
             openapi_extra=json_body({"$ref": "#/components/schemas/RouteRequest"}))
async def route(request: Request, principal: Principal = Depends(require("gateway")),
                rt: Runtime = Depends(get_runtime)) -> JSONAnswer:
    """Body: an OpenAI chat request (other OpenAI fields such as temperature or stream are accepted and ignored;
    a ``response_format`` schema counts in frontier targets' prompts) plus ``routing`` context. Answer: the decision,
    with the trace when ``routing.explain`` is true; headers ``x-pointsman-decision-id`` and
    ``x-pointsman-target``."""
    return await answer(request, rt, principal)


async def route_hot(request: Request) -> JSONAnswer:
    """``route`` without FastAPI's dependency injection (``app.PointsmanApp`` serves ``POST /v1/route``
    with it): the same key check, runtime and answer. Raises ``HTTPError``."""
    principal = authenticate(request, "gateway", header_key(request))
    return await answer(request, runtime_of(request), principal)


async def answer(request: Request, rt: Runtime, principal: Principal) -> JSONAnswer:
    """Read the body and decide (on the loop, or the threadpool with ``route_in_threadpool``)."""
    started = time.perf_counter()
    raw = await read_body(request, rt.settings)
    return await decide(rt, raw, principal.key_id, started)
