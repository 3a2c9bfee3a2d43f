"""``POST /v1/route``: one chat request in, one routing decision out.

The body is an OpenAI chat request plus Pointsman's ``routing`` context
(``pointsman.request.RouteRequest``), read with the size limit and strict JSON of
``bodies.py``. The answer is the decision (``schemas.RouteResponse``; the trace when
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
``scripts/load_service.py`` found faster than a threadpool hop on two cores. ``POINTSMAN_ROUTE_IN_THREADPOOL=true`` moves
it to the threadpool instead. A hung estimator cannot hold the loop past
``POINTSMAN_ESTIMATOR_TIMEOUT_MS`` (default 50 ms, ``deadline.py``).
"""

from __future__ import annotations

import time

from fastapi import APIRouter, Depends, Request
from fastapi.concurrency import run_in_threadpool

from pointsman.errors import RequestError
from pointsman.estimator.estimate import Estimator
from pointsman.policy.budget.ledger import LedgerUnavailable
from pointsman.policy.decision import Decision
from pointsman.policy.selection.filters import NoEligibleTarget
from pointsman.request import RouteRequest, parse_route_request
from pointsman.service.auth import Principal, authenticate, header_key, require
from pointsman.service.bodies import JSONAnswer, decode_json, json_body, read_body
from pointsman.service.http_errors import ROUTE_ERRORS, HTTPError, invalid, unavailable
from pointsman.service.runtime import Runtime, get_runtime, runtime_of
from pointsman.service.schemas import RouteResponse

router = APIRouter()


def decide(rt: Runtime, raw: bytes, key_id: str | None, started: float) -> JSONAnswer:
    """Parse ``raw``, decide, log and count the decision; returns the response. Raises
    ``HTTPError`` (counted in ``pointsman_decision_errors_total``)."""
    try:
        body = decode_json(raw)
        engine = rt.live.engine  # read once: this decision runs on this engine to the end
        try:
            request = parse_route_request(body)
            decision = engine.route(request, api_key_id=key_id)
        except NoEligibleTarget as exc:
            if exc.by_budget:  # as the ext_proc picker: a refusal the gateway must not route around
                raise HTTPError(429, str(exc), type="budget_exhausted", code="budget_exhausted") from None
            raise HTTPError(422, str(exc), type="no_eligible_target", code="no_eligible_target") from None
        except LedgerUnavailable as exc:
            raise unavailable(f"budget ledger unavailable: {exc}", "budget_ledger_unavailable") from None
        except RequestError as exc:
            raise invalid(exc) from None
    except HTTPError as exc:
        rt.metrics.decision_errors.labels(exc.code or str(exc.status)).inc()
        raise
    response = JSONAnswer(decision.to_dict(explain=request.routing.explain), headers={
        "x-pointsman-decision-id": decision.decision_id,
        "x-pointsman-target": decision.target,
    })
    commit_decision(rt, decision, request, engine.estimator, started)
    return response


def commit_decision(rt: Runtime, decision: Decision, request: RouteRequest, estimator: Estimator, started: float) -> None:
    """Hand an answered decision to the decision log writer and count it (``started``: ``perf_counter``
    when its body was complete). ``/v1/route`` and the ext_proc endpoint picker both call this."""
    rt.writer.submit(decision, request, estimator)
    if rt.live.engine.policy.verify is not None:  # the gateway may verify its draft (POST /v1/verify)
        rt.cascade.add(decision)
    metrics = rt.metrics
    metrics.observe_decision(decision, time.perf_counter() - started)
    if not decision.difficulty_available:
        metrics.observe_unavailable(decision.difficulty_error)


@router.post("/v1/route", response_model=RouteResponse, responses=ROUTE_ERRORS,
             summary="Decide where a chat request runs", tags=["gateway"],
             openapi_extra=json_body({"$ref": "#/components/schemas/RouteRequest"}))
async def route(request: Request, principal: Principal = Depends(require("gateway")),
                rt: Runtime = Depends(get_runtime)) -> JSONAnswer:
    """Body: an OpenAI chat request (other OpenAI fields such as temperature, stream or
    response_format are accepted and ignored) plus ``routing`` context. Answer: the decision,
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
    if rt.settings.route_in_threadpool:
        return await run_in_threadpool(decide, rt, raw, principal.key_id, started)
    return decide(rt, raw, principal.key_id, started)
