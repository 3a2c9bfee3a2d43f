"""The decision service: a FastAPI app that answers ``POST /v1/route`` with a decision.

``create_app(settings=None, engine=None) -> FastAPI``. The engine (fleet, compiled
policy, estimator) and its live ``FleetState`` (load board, prefix indexes, budget
ledger) are built once in the app's lifespan from ``settings``, unless an engine is
passed in (tests inject one with ``FixedDifficulty``); routes get the engine through
the ``get_engine`` dependency and the state as ``app.state.fleet_state`` (the
outcome, telemetry and fleet endpoints call ``FleetState.settle``, ``push_load``,
``fleet_status``; see ``policy/state.py``). Each ``/v1/route`` decision is dispatched:
its estimated cost is reserved in the budget ledger and it counts as in flight until
its outcome settles it. The ledger is closed at shutdown when the app built it.

Input handling: the body is read as bytes up to ``settings.max_body_bytes`` (413
beyond, naming the limit and the setting), decoded as strict UTF-8, parsed as JSON
and validated as ``RouteRequest``; every failure is a 4xx whose JSON error names the
field (``param``). Unknown top-level OpenAI fields are ignored; unknown keys inside
``routing`` are rejected.
"""

from __future__ import annotations

import json
import logging
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse

from pointsman import __version__
from pointsman.errors import RequestError
from pointsman.policy.budget import LedgerUnavailable
from pointsman.policy.engine import RoutingEngine
from pointsman.policy.filters import NoEligibleTarget
from pointsman.request import RouteRequest, parse_route_request
from pointsman.service.loading import build_engine
from pointsman.service.schemas import ErrorResponse, HealthResponse, RouteResponse
from pointsman.service.settings import Settings

log = logging.getLogger("pointsman.service")

_ERRORS = {400: {"model": ErrorResponse}, 413: {"model": ErrorResponse}, 422: {"model": ErrorResponse},
           503: {"model": ErrorResponse}}


class HTTPError(Exception):
    """An error answer: HTTP ``status`` and the OpenAI-style error body fields."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def response(self) -> JSONResponse:
        """The JSON response for this error."""
        body = {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}
        return JSONResponse(body, status_code=self.status)


async def read_body(request: Request, limit: int) -> bytes:
    """The raw body, at most ``limit`` bytes; raises ``HTTPError`` 413 beyond it, 400 for a bad Content-Length."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise HTTPError(400, f"Content-Length {declared!r} is not a number", code="bad_content_length") from None
        if size > limit:
            raise _too_large(size, limit)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(size, limit, at_least=True)
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large(size: int, limit: int, at_least: bool = False) -> HTTPError:
    return HTTPError(413, f"request body is {'over ' if at_least else ''}{size:,} bytes; the limit is {limit:,} bytes "
                          f"(setting POINTSMAN_MAX_BODY_BYTES)", type="request_too_large", code="body_too_large")


def decode_json(raw: bytes) -> Any:
    """Strict UTF-8 and JSON decoding of a body; raises ``HTTPError`` 400 naming the problem."""
    if not raw.strip():
        raise HTTPError(400, "request body is empty; expected a JSON chat request", code="empty_body")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise HTTPError(400, f"request body is not valid UTF-8 (byte 0x{raw[exc.start]:02x} at offset {exc.start})",
                        code="invalid_utf8") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise HTTPError(400, f"malformed JSON: {exc.msg} at line {exc.lineno} column {exc.colno}",
                        code="malformed_json") from None
    except RecursionError:
        raise HTTPError(400, "malformed JSON: nested too deeply", code="malformed_json") from None


def get_engine(request: Request) -> RoutingEngine:
    """The app's current engine (dependency); 503 while it is not loaded."""
    engine = getattr(request.app.state, "engine", None)
    if engine is None:
        raise HTTPError(503, "the routing engine is not loaded yet", type="unavailable", code="not_ready")
    return engine


def _openapi(app: FastAPI) -> dict[str, Any]:
    """OpenAPI with ``RouteRequest`` (read from the raw body, not a FastAPI parameter) in components."""
    if app.openapi_schema:
        return app.openapi_schema
    schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
    request_schema = RouteRequest.model_json_schema(ref_template="#/components/schemas/{model}")
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    components.update(request_schema.pop("$defs", {}))
    components["RouteRequest"] = request_schema
    app.openapi_schema = schema
    return schema


def create_app(settings: Settings | None = None, engine: RoutingEngine | None = None, *,
               owns_engine: bool = False) -> FastAPI:
    """The FastAPI app. ``settings`` default to the environment; ``engine``, when given, is used
    as is (nothing is loaded; its state is closed at shutdown only with ``owns_engine``),
    else it is built from ``settings`` at startup (``build_engine``) and closed at shutdown."""
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        """Build the engine and its state once at startup unless one was injected; close the
        ledger at shutdown when the app owns it."""
        owned = owns_engine
        if getattr(app.state, "engine", None) is None:
            loaded = build_engine(settings)
            app.state.engine, app.state.estimator_error = loaded.engine, loaded.estimator_error
            owned = True
            if loaded.estimator_error:
                log.warning("difficulty estimator unavailable (%s); deciding with difficulty.available == false",
                            loaded.estimator_error)
        app.state.fleet_state = app.state.engine.state
        try:
            yield
        finally:
            if owned:
                app.state.engine.state.close()

    app = FastAPI(title="Pointsman", version=__version__, lifespan=lifespan,
                  description="Routing decisions for LLM inference: model tier, pool, replica and P/D mode.")
    app.state.settings = settings
    app.state.engine = engine
    app.state.estimator_error = None
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]

    @app.exception_handler(HTTPError)
    async def _http_error(request: Request, exc: HTTPError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        err = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        param = ".".join(str(p) for p in err["loc"][1:]) or None
        return HTTPError(422, err["msg"], param=param, code="invalid_value").response()

    @app.exception_handler(Exception)
    async def _internal_error(request: Request, exc: Exception) -> JSONResponse:
        log.exception("internal error on %s %s", request.method, request.url.path)
        return HTTPError(500, "internal error; the service log has the details", type="internal_error",
                         code="internal_error").response()

    @app.post("/v1/route", response_model=RouteResponse, responses=_ERRORS, summary="Decide where a chat request runs",
              openapi_extra={"requestBody": {"required": True, "content": {
                  "application/json": {"schema": {"$ref": "#/components/schemas/RouteRequest"}}}}})
    async def route(request: Request, engine: RoutingEngine = Depends(get_engine)) -> JSONResponse:
        """Body: an OpenAI chat request plus ``routing`` context. Answer: the decision, with the
        trace when ``routing.explain`` is true; headers ``x-pointsman-decision-id`` and
        ``x-pointsman-target``."""
        body = decode_json(await read_body(request, settings.max_body_bytes))
        try:
            route_request = parse_route_request(body)
            decision = engine.route(route_request)
        except NoEligibleTarget as exc:
            raise HTTPError(422, str(exc), type="no_eligible_target", code="no_eligible_target") from None
        except LedgerUnavailable as exc:
            raise HTTPError(503, f"budget ledger unavailable: {exc}", type="unavailable",
                            code="budget_ledger_unavailable") from None
        except RequestError as exc:
            raise HTTPError(422, exc.message, param=exc.field, code="invalid_value") from None
        return JSONResponse(decision.to_dict(explain=route_request.routing.explain), headers={
            "x-pointsman-decision-id": decision.decision_id,
            "x-pointsman-target": decision.target,
        })

    @app.get("/healthz", response_model=HealthResponse, summary="Liveness and what the service runs")
    async def healthz(engine: RoutingEngine = Depends(get_engine)) -> dict[str, Any]:
        """The service is up; the policy, fleet and estimator it decides with."""
        error = getattr(app.state, "estimator_error", None)
        return {"status": "ok", "policy": engine.policy.name, "policy_revision": engine.policy.revision,
                "fleet_revision": engine.fleet.revision,
                "estimator": {"version": str(getattr(engine.estimator, "version", "unknown")),
                              "available": error is None, "error": error}}

    return app
