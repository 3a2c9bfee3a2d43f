"""Probes and metrics: ``GET /healthz``, ``GET /readyz``, ``GET /metrics``. Open (no key), for
orchestrators and Prometheus.

- ``/healthz`` (liveness): 200 while the process serves; names the policy, its revision,
  the fleet revision, the estimator (version, whether it is available, why not, its
  source), ``auth`` (false: no API keys are configured and every caller is admin) and the
  last model swap attempt (``last_swap``; its ``error`` when a new version failed to load).
- ``/readyz`` (readiness): 200 ``ready`` when the engine serves and the decision log writer
  runs; 503 ``not_ready`` otherwise (starting, stopping, writer dead). An unavailable
  estimator is ``degraded: ...`` but ready: decisions still come back through the policy's
  ``difficulty.available == false`` rule.
- ``/metrics``: Prometheus text exposition (``prometheus.py`` lists every name).
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from pointsman.json_types import JSONObject
from pointsman.service.http_errors import ERROR_RESPONSES
from pointsman.service.runtime import Runtime, runtime_of, serving_runtime
from pointsman.service.schemas import HealthResponse, ReadyResponse

router = APIRouter(tags=["operations"])


def estimator_health(rt: Runtime) -> JSONObject:
    """The serving estimator's ``{version, available, error, source}``."""
    estimator = rt.live.engine.estimator
    error = rt.live.estimator_error
    source = getattr(estimator, "source", None)
    return {"version": str(getattr(estimator, "version", "unknown")), "available": error is None, "error": error,
            "source": None if source is None else str(source)}


@router.get("/healthz", response_model=HealthResponse, responses={503: ERROR_RESPONSES[503]},
            summary="Liveness and what the service runs")
async def healthz(request: Request) -> JSONObject:
    """The service is up; the policy, fleet and estimator it decides with; whether auth is on."""
    rt = runtime_of(request)
    engine = rt.live.engine
    return {"status": "ok", "policy": engine.policy.name, "policy_revision": engine.policy.revision,
            "fleet_revision": engine.fleet.revision, "estimator": estimator_health(rt),
            "auth": request.app.state.keys.ring().enabled,
            "last_swap": None if rt.live.last_swap is None else rt.live.last_swap.to_dict(),
            "model_follow": None if rt.live.follow is None else rt.live.follow.to_dict()}


@router.get("/readyz", response_model=ReadyResponse, responses={503: {"model": ReadyResponse}},
            summary="Readiness: engine loaded and decision log writer running")
async def readyz(request: Request) -> JSONResponse:
    """200 ``ready`` or 503 ``not_ready`` with each check's state."""
    rt = serving_runtime(request)
    if rt is None:
        return JSONResponse({"status": "not_ready", "checks": {"engine": "not loaded (starting or stopping)"}},
                            status_code=503)
    error = rt.live.estimator_error
    checks = {"engine": "ok",
              "estimator": "ok" if error is None else f"degraded: {error}",
              "decision_log": "ok" if rt.writer.alive else "writer thread stopped"}
    ready = rt.writer.alive
    return JSONResponse({"status": "ready" if ready else "not_ready", "checks": checks},
                        status_code=200 if ready else 503)


@router.get("/metrics", summary="Prometheus metrics", response_class=Response,
            responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}},
                       503: ERROR_RESPONSES[503]})
async def metrics(request: Request) -> Response:
    """Text exposition format 0.0.4 of every ``pointsman_*`` metric."""
    rt = runtime_of(request)
    return Response(rt.metrics.render(), media_type=CONTENT_TYPE_LATEST)
