"""Probes and metrics: ``GET /healthz``, ``GET /readyz``, ``GET /metrics``. Open (no key), for
orchestrators and Prometheus.

- ``/healthz`` (liveness): 200 while the process serves; names the policy, its revision,
  the fleet revision, the estimator (version, whether it is available, why not, its
  source), ``auth`` (false: no API keys are configured and every caller is admin) and the
  last model swap attempt (``last_swap``; its ``error`` when a new version failed to load).
- ``/readyz`` (readiness): 200 ``ready`` when the engine serves, the decision log writer
  runs and the outcome log takes writes (``OutcomeLog.writable``: its last write succeeded, or a
  probe write does now); 503 ``not_ready`` otherwise (starting, stopping, writer dead, disk full:
  outcomes are then a retryable 503 too). An unavailable
  estimator is ``degraded: ...`` but ready: decisions still come back through the policy's
  ``difficulty.available == false`` rule. ``endpoints``: each fleet endpoint's health, why it is
  unhealthy, and its ``/metrics`` scrape state (``endpoint_readiness``); ``checks["endpoints"]``
  counts the unhealthy ones.
- ``/metrics``: Prometheus text exposition (``prometheus.py`` lists every name).
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
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
    log_error = await run_in_threadpool(rt.outcome_log.writable)
    checks["outcome_log"] = "ok" if log_error is None else f"not writable: {log_error}"
    ready = rt.writer.alive and log_error is None
    endpoints = endpoint_readiness(rt)
    sick = sum(not e["healthy"] for e in endpoints.values())
    checks["endpoints"] = f"{sick} of {len(endpoints)} unhealthy (see endpoints)" if sick else "ok"
    return JSONResponse({"status": "ready" if ready else "not_ready", "checks": checks, "endpoints": endpoints},
                        status_code=200 if ready else 503)


def endpoint_readiness(rt: Runtime) -> dict[str, JSONObject]:
    """Per fleet endpoint id, ``schemas.EndpointReadiness`` fields: health, reason and scrape state."""
    state = rt.live.engine.state
    scraping = rt.feeds is not None and rt.feeds.scraping
    scraped = state.scrape_targets()
    feeds = rt.feeds.status() if rt.feeds is not None else {}
    setting = state.fleet.spec.defaults.scrape_metrics
    unhealthy = state.unhealthy()
    out: dict[str, JSONObject] = {}
    for eid, info in state.fleet.endpoints.items():
        feed = feeds.get(eid)
        if info.role == "api":
            scrape = "off: an API endpoint"
        elif not scraping:
            scrape = "off: POINTSMAN_SCRAPE_INTERVAL_S is 0"
        elif eid not in scraped:
            scrape = ("off: the fleet sets defaults.scrape_metrics: false" if setting is False else
                      "off: the fleet sets no metrics_url for it and defaults.scrape_metrics is not true")
        elif feed is None or (feed.age_s is None and feed.status.consecutive_failures == 0):
            scrape = "pending: not scraped yet"
        elif feed.status.consecutive_failures:
            scrape = (f"failing: {feed.status.last_error} ({feed.status.consecutive_failures} in a row, "
                      f"at {feed.status.metrics_url})")
        else:
            scrape = f"ok: last scraped {feed.age_s or 0.0:.1f} s ago"
        out[eid] = {"name": info.name, "target": info.target, "healthy": eid not in unhealthy,
                    "reason": unhealthy.get(eid), "scrape": scrape}
    return out


@router.get("/metrics", summary="Prometheus metrics", response_class=Response,
            responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}},
                       503: ERROR_RESPONSES[503]})
async def metrics(request: Request) -> Response:
    """Text exposition format 0.0.4 of every ``pointsman_*`` metric."""
    rt = runtime_of(request)
    return Response(rt.metrics.render(), media_type=CONTENT_TYPE_LATEST)
