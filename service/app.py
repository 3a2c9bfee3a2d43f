"""The decision service: a thin FastAPI assembly of the routes, auth, errors and runtime.

``create_app(settings=None, engine=None, *, owns_engine=False, estimator_error=None) -> FastAPI``.
At startup the lifespan builds the ``Runtime`` (``runtime.py``: the live engine, the
estimator's time budget, the decision and outcome log with its background writer, the
metrics) unless it exists, starts the policy file watcher and the model follower, and
closes everything at shutdown. An injected ``engine`` is used as is (tests inject one with
``FixedDifficulty``); its state (budget ledger) is closed at shutdown only with ``owns_engine``.

Routes (each module one concern): ``routes_decisions`` (``POST /v1/route``),
``routes_reports`` (``POST /v1/outcomes``, ``POST /v1/telemetry``), ``routes_admin``
(``GET /v1/fleet``, ``GET /v1/policy``, ``POST /v1/policy/validate``, ``/reload``),
``routes_ops`` (``/healthz``, ``/readyz``, ``/metrics``). Auth: ``auth.py``; errors:
``http_errors.py``; bodies: ``bodies.py``. OpenAPI at ``/openapi.json``, docs at ``/docs`` and
``/redoc`` with their assets served locally (``docs_ui.py``: no CDN). The access log shows no
query-string value (``access_log.py``: a key put in a URL is not logged). The app is a
``PointsmanApp``: the gateway's per-request calls (``POST /v1/route``, ``POST /v1/outcomes``) skip
FastAPI's middleware stack, routing and dependency injection (``HOT_PATHS``), with the same answers.

With ``POINTSMAN_EXT_PROC_PORT`` the lifespan also starts the ext_proc endpoint picker
(``ext_proc.py``) on that port, after the runtime, and stops it (draining its streams and the
outcomes they record) before the runtime closes.

``app.state``: ``settings``, ``keys`` (the ``KeySource``), ``runtime`` (while serving), ``fleet_state``
(the engine's ``FleetState``) and ``ext_proc_port`` (the bound gRPC port, when started).
"""

from __future__ import annotations

import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fastapi import FastAPI, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel
from starlette.types import Receive, Scope, Send

from pointsman import __version__
from pointsman.policy.engine import RoutingEngine
from pointsman.request import RouteRequest
from pointsman.service import access_log, routes_admin, routes_decisions, routes_ops, routes_reports, routes_verify
from pointsman.service.cascade import VerifyIn
from pointsman.service.docs_ui import install_docs
from pointsman.service.http_errors import HTTPError, install_error_handlers, internal_error
from pointsman.service.keys import KeySource, exposure_problem
from pointsman.service.routes_reports import OUTCOMES_SCHEMA, deliver_forwarded, outcomes_hot, settle_unsettled
from pointsman.service.runtime import Runtime, build_runtime
from pointsman.service.schemas import PolicyValidateIn, TelemetryIn
from pointsman.service.settings import Settings

if TYPE_CHECKING:  # pragma: no cover
    from pointsman.service.ext_proc import ExtProcServer

log = logging.getLogger("pointsman.service")

#: Request bodies read from raw bytes (size limit, strict JSON), so not FastAPI parameters:
#: their schemas are added to the OpenAPI components here.
_BODY_MODELS: tuple[type[BaseModel], ...] = (RouteRequest, TelemetryIn, PolicyValidateIn, VerifyIn)


def _openapi(app: FastAPI) -> dict[str, object]:
    """OpenAPI with the raw-body request models in ``components.schemas``."""
    if app.openapi_schema:
        return app.openapi_schema
    schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for model in _BODY_MODELS:
        model_schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        components.update(model_schema.pop("$defs", {}))
        components[model.__name__] = model_schema
    components.update(OUTCOMES_SCHEMA.get("$defs", {}))
    app.openapi_schema = schema
    return schema


#: The calls a gateway makes per request, served by ``PointsmanApp`` without FastAPI's layers.
HOT_PATHS = {"/v1/route": routes_decisions.route_hot, "/v1/outcomes": outcomes_hot}


class PointsmanApp(FastAPI):
    """FastAPI, with the gateway's per-request calls (``POST`` to a ``HOT_PATHS`` path) answered
    directly: no middleware stack, route matching or dependency solving, about 200 us of CPU less per
    call (``scripts/bench_decision.py``). Their handlers check the key, read the runtime and answer as
    the FastAPI routes do (which stay for OpenAPI, other methods' 405 and a ``root_path``); an
    ``HTTPError`` is its error answer, anything else the logged 500 (re-raised, as Starlette does)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        hot = HOT_PATHS.get(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" \
            and not scope.get("root_path") and not self.root_path else None
        if hot is None:
            await super().__call__(scope, receive, send)
            return
        scope["app"] = self
        request = Request(scope, receive)
        try:
            response: Response = await hot(request)
        except HTTPError as exc:
            response = exc.response()
        except Exception:
            await internal_error(request)(scope, receive, send)
            raise
        await response(scope, receive, send)


def keys_of(settings: Settings) -> KeySource:
    """The API keys ``settings`` configure (settings and key files, ``keys.py``); raises ``ValueError``
    naming the setting (or file and line) when malformed, or when serving on ``settings.host`` with no
    key at all is not allowed (``keys.exposure_problem``)."""
    keys = KeySource.from_settings(settings)
    hosts = [settings.host] + ([ext_proc_host(settings)] if settings.ext_proc_port is not None else [])
    for host in hosts:
        problem = exposure_problem(host, keys.ring(), settings.allow_unauthenticated)
        if problem is not None:
            raise ValueError(problem)
    return keys


def ext_proc_host(settings: Settings) -> str:
    """The address the ext_proc port binds: ``POINTSMAN_EXT_PROC_HOST``, else the HTTP host."""
    return settings.ext_proc_host or settings.host


def freeze_heap() -> None:
    """Collect, then move every object alive now out of the cyclic garbage collector's reach
    (``gc.freeze``). Called once a serving process has loaded everything: the ~100,000 objects
    of the model, fleet, policy and libraries are no longer scanned by each full collection,
    which otherwise paused every decision in flight for 60-90 ms about once per thousand
    decisions (measured with ``gc.callbacks`` under ``scripts/profile_route.py``). Frozen
    objects are still freed by reference counting; only garbage cycles among them stay."""
    gc.collect()
    gc.freeze()


@dataclass(frozen=True)
class RunningExtProc:
    """The endpoint picker the lifespan started: its ``server`` (``ext_proc.ExtProcServer``) and bound ``port``."""

    server: ExtProcServer
    port: int


async def start_ext_proc(rt: Runtime, host: str, port: int, keys: KeySource | None = None) -> RunningExtProc:
    """Start the ext_proc endpoint picker on ``host:port`` (``service/ext_proc.py``; imported only
    here, so serving without the ``ext-proc`` extra works); with ``keys`` that hold any key, each stream
    must present one. Raises ``RuntimeError`` naming the extra when grpcio or xds-protos is missing,
    ``OSError`` when the port cannot be bound."""
    try:
        from pointsman.service.ext_proc import ExtProcServer
    except ImportError as exc:
        raise RuntimeError(f"POINTSMAN_EXT_PROC_PORT needs the ext-proc extra (pip install 'pointsman[ext-proc]'): "
                           f"{exc}") from None
    server = ExtProcServer(rt, keys)
    return RunningExtProc(server, await server.start(host, port))


def create_app(settings: Settings | None = None, engine: RoutingEngine | None = None, *,
               owns_engine: bool = False, estimator_error: str | None = None, freeze: bool = False) -> FastAPI:
    """The FastAPI app (see the module). ``settings`` default to the environment. ``freeze``:
    ``freeze_heap()`` once started (``pointsman serve`` does; one app per process). Raises
    ``ValueError`` naming the setting for malformed API key settings or files, or for no key on a
    non-loopback host without ``allow_unauthenticated`` (before anything starts)."""
    settings = settings or Settings()
    keys = keys_of(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        """Build the runtime and start its watchers; close it at shutdown."""
        access_log.install()  # after uvicorn configured its loggers: no query-string value is logged
        rt = await run_in_threadpool(build_runtime, settings, engine, owns_engine=owns_engine,
                                     estimator_error=estimator_error, deliver=deliver_forwarded,
                                     answer_verify=routes_verify.answer_relayed,
                                     settle_unsettled=settle_unsettled)
        app.state.runtime, app.state.fleet_state = rt, rt.live.engine.state
        if not keys.ring().enabled:
            log.warning("no API keys configured (POINTSMAN_GATEWAY_API_KEYS, POINTSMAN_ADMIN_API_KEYS, "
                        "POINTSMAN_TELEMETRY_API_KEYS): "
                        "authentication is off and every caller may change the policy")
        rt.start_watchers()
        ext_proc = None
        if settings.ext_proc_port is not None:
            ext_proc = await start_ext_proc(rt, ext_proc_host(settings), settings.ext_proc_port, keys)
            app.state.ext_proc_port = ext_proc.port
        if freeze:
            freeze_heap()
        try:
            yield
        finally:
            if ext_proc is not None:
                await ext_proc.server.stop()
            await rt.close()
            app.state.runtime = None

    app = PointsmanApp(title="Pointsman", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None,
                  description="Routing decisions for LLM inference: model tier, pool, replica and P/D mode. "
                              "Gateways call POST /v1/route per request and report POST /v1/outcomes.")
    app.state.settings, app.state.keys, app.state.runtime = settings, keys, None
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]  # FastAPI documents replacing app.openapi
    install_error_handlers(app)
    install_docs(app)
    for module in (routes_decisions, routes_reports, routes_verify, routes_admin, routes_ops):
        app.include_router(module.router)
    return app


def create_app_from_env() -> FastAPI:
    """``create_app(freeze=True)`` with settings from the environment: the factory uvicorn imports
    in each worker process when ``pointsman serve --workers N`` runs more than one."""
    return create_app(freeze=True)
