"""Admin endpoints: the fleet's live signals and the serving policy (read, validate, reload).

- ``GET /v1/fleet``: every target's endpoints with their current signals and ages
  (``FleetState.fleet_status`` under the serving policy's staleness rules), health marks,
  and each target's effective price per token today (UTC day; None without a ledger or
  while it is unreachable).
- ``GET /v1/policy``: the serving policy: name, file, revision, rules, variables, the file's
  text, whether a file watcher follows it, and the last reload attempt.
- ``POST /v1/policy/validate``: compile policy text against the serving fleet without
  serving it; 200 with ``valid`` and every located problem (``file:line:col``).
- ``POST /v1/policy/reload``: re-read the policy file now (``policy_reload.reload_policy``).
  200 when it serves (``changed`` false when the bytes compiled to the serving revision);
  422 with every located problem when rejected, and the running policy keeps serving.
- ``POST /v1/fleet/reload``: re-read the fleet file now and recompile the policy against it
  (``fleet_reload.reload_fleet``); 200 / 422 as the policy reload.
- ``GET /v1/budgets``: every configured budget in its current UTC window: limit, settled, held,
  spent, remaining, when it resets (``budgets_reload.budget_statuses``); 503 while the ledger is
  unreachable.
- ``POST /v1/budgets/reload``: re-read the budgets file now (``budgets_reload.reload_budgets``);
  200 / 422 as the policy reload (422 also when no budgets file is configured).

All need an admin key (``auth.py``).
"""

from __future__ import annotations

import time

from fastapi import APIRouter, Depends, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from pointsman.errors import PolicyError
from pointsman.json_types import JSONObject, JSONValue
from pointsman.policy.budget.ledger import LedgerUnavailable
from pointsman.service.auth import Principal, require
from pointsman.service.bodies import json_body, read_parsed, validate_model
from pointsman.service.budgets_reload import budget_statuses, budgets_revision, reload_budgets
from pointsman.service.http_errors import ERROR_RESPONSES, unavailable
from pointsman.service.live_engine import ReloadResult, problem_dict
from pointsman.service.policy_reload import validate_policy_text
from pointsman.service.runtime import Runtime, get_runtime
from pointsman.service.schemas import (
    BudgetsResponse,
    FleetResponse,
    PolicyResponse,
    PolicyValidateIn,
    PolicyValidateResponse,
    ReloadOut,
)

router = APIRouter(tags=["admin"])

@router.get("/v1/fleet", response_model=FleetResponse, responses=ERROR_RESPONSES,
            summary="Current signals per target and endpoint, with their ages")
async def fleet(principal: Principal = Depends(require("admin")),
                rt: Runtime = Depends(get_runtime)) -> dict[str, object]:
    """Load, health and cache signals per endpoint (ages in seconds), today's effective price per token
    per target, what its usage is priced at (``utilization``) and its shadow outcomes' cost (``shadow_spent_usd``)."""
    engine = rt.live.engine
    state = engine.state
    targets = state.fleet_status(staleness=engine.policy.staleness)
    try:
        prices = await run_in_threadpool(state.effective_prices, "day")
    except LedgerUnavailable:
        prices = {}
    feeds = rt.feeds.status() if rt.feeds is not None else {}
    events = rt.feeds.events_status() if rt.feeds is not None else {}
    now = time.monotonic()
    for entry in targets.values():
        for ep in entry["endpoints"]:
            feed = feeds.get(str(ep["id"]))
            ep["scrape"] = None if feed is None else {
                "metrics_url": feed.status.metrics_url, "age_s": feed.age_s, "last_error": feed.status.last_error,
                "consecutive_failures": feed.status.consecutive_failures,
                "last_duration_ms": feed.status.last_duration_ms}
            sub = events.get(str(ep["id"]))
            ep["kv_events"] = None if sub is None else {
                "url": sub.url, "connected": sub.connected, "last_seq": sub.last_seq,
                "age_s": None if sub.last_batch_at is None else max(0.0, now - sub.last_batch_at),
                "batches": sub.batches, "events": sub.events, "gaps": sub.gaps, "resyncs": sub.resyncs,
                "resets": sub.resets, "errors": sub.errors, "last_error": sub.last_error, "last_reset": sub.last_reset,
                "replay": sub.replay}
    shadow = await run_in_threadpool(rt.metrics.shadow_spent)
    priced = {name: {**entry, "effective_price": None if (price := prices.get(name)) is None else price.to_dict(),
                     "utilization": state.utilization_basis(name), "shadow_spent_usd": shadow.get(name, 0.0)}
              for name, entry in targets.items()}
    sync = state.sync.status()
    last = rt.live.last_fleet_reload
    return {"fleet_revision": engine.fleet.revision, "policy_revision": engine.policy.revision, "targets": priced,
            "shared_state": {"shared": sync.shared, "connected": sync.connected, "applied": sync.applied,
                             "reloads": sync.reloads, "write_errors": sync.write_errors, "last_error": sync.last_error,
                             "lag_s": sync.lag_s, "outcomes_forwarded_in": sync.forwarded_in},
            "scraping": rt.feeds is not None and rt.feeds.scraping and bool(state.scrape_targets()),
            "watching_fleet": rt.watching_fleet,
            "last_fleet_reload": None if last is None else last.to_dict()}


@router.get("/v1/policy", response_model=PolicyResponse, responses=ERROR_RESPONSES, summary="The serving policy")
async def policy(principal: Principal = Depends(require("admin")), rt: Runtime = Depends(get_runtime)) -> JSONObject:
    """Name, file, revision, rules and variables of the serving policy, the text it was compiled
    from (not the file's text now: a rejected or pending edit is not serving), and the last reload
    attempt (with its problems when it was rejected)."""
    engine = rt.live.engine
    p = engine.policy
    last = rt.live.last_reload
    return {"name": p.name, "file": p.file, "revision": p.revision, "fleet_revision": p.fleet_revision,
            "rules": [{"name": r.name, "when": r.when, "target": r.target, "mode": r.mode,
                       "fallbacks": list(r.fallbacks), "labels": dict(r.labels), "line": r.line} for r in p.rules],
            "variables": p.variables, "source": p.source or None, "watching": rt.watching,
            "last_reload": None if last is None else last.to_dict()}


@router.post("/v1/policy/validate", response_model=PolicyValidateResponse, responses=ERROR_RESPONSES,
             summary="Check policy text against the serving fleet without serving it",
             openapi_extra=json_body({"$ref": "#/components/schemas/PolicyValidateIn"}))
async def validate(request: Request, principal: Principal = Depends(require("admin")),
                   rt: Runtime = Depends(get_runtime)) -> JSONObject:
    """Body ``{"policy": "<YAML text>", "file": "name.yaml"}``. Answers ``valid`` and, when not,
    every problem located as ``file:line:col``."""
    _, item = await read_parsed(request, rt.settings, '{"policy": "<policy YAML text>"}',
                                lambda body: validate_model(PolicyValidateIn, body))
    fleet = rt.live.engine.fleet
    try:
        compiled = await run_in_threadpool(validate_policy_text, item.policy, fleet, item.file or "<request>")
    except PolicyError as exc:
        return {"valid": False, "problems": [problem_dict(p) for p in exc.problems]}
    return {"valid": True, "name": compiled.name, "revision": compiled.revision,
            "rules": [r.name for r in compiled.rules], "problems": []}


@router.post("/v1/policy/reload", response_model=ReloadOut,
             responses={**ERROR_RESPONSES, 422: {"model": ReloadOut, "description": "The file was rejected; the "
                                                 "running policy keeps serving."}},
             summary="Re-read the policy file and serve it if it is valid")
async def reload(principal: Principal = Depends(require("admin")), rt: Runtime = Depends(get_runtime)) -> JSONResponse:
    """Compile the serving policy's file again and swap it in; decisions in flight finish on the
    policy they started with. A bad file is rejected with every located problem (422)."""
    return await _reload_everywhere(rt, "policy")


@router.post("/v1/fleet/reload", response_model=ReloadOut,
             responses={**ERROR_RESPONSES, 422: {"model": ReloadOut, "description": "The fleet file (or the policy "
                                                 "against it) was rejected; the running pair keeps serving."}},
             summary="Re-read the fleet file, recompile the policy against it and serve both")
async def reload_fleet_now(principal: Principal = Depends(require("admin")),
                           rt: Runtime = Depends(get_runtime)) -> JSONResponse:
    """Load the fleet file again, recompile the serving policy against it, rebuild the live
    state (unchanged endpoints keep theirs) and swap the pair in. A bad fleet file, or one the
    policy no longer compiles against, is rejected with every located problem (422)."""
    return await _reload_everywhere(rt, "fleet")


@router.get("/v1/budgets", response_model=BudgetsResponse, responses=ERROR_RESPONSES,
            summary="Every budget now: limit, settled, held, remaining, reset time")
async def budgets(principal: Principal = Depends(require("admin")), rt: Runtime = Depends(get_runtime)) -> JSONObject:
    """Per configured scope and window (``day``/``month``, UTC): the limit, what outcomes settled,
    what live reservations hold, what remains for new decisions, and when the window resets
    (``resets_at``, ISO 8601 UTC). 503 when the ledger is unreachable."""
    ledger = rt.live.engine.state.ledger
    if ledger is None:
        statuses: list[JSONValue] = []
    else:
        try:
            statuses = await run_in_threadpool(budget_statuses, ledger)
        except LedgerUnavailable as exc:
            raise unavailable(f"budget ledger unavailable: {exc}", "budget_ledger_unavailable") from None
    last = rt.live.last_budgets_reload
    return {"budgets": statuses, "file": None if rt.settings.budgets_path is None else str(rt.settings.budgets_path),
            "revision": None if ledger is None else budgets_revision(ledger.config),
            "reservation_ttl_s": None if ledger is None else ledger.config.reservation_ttl_s,
            "watching": rt.watching_budgets, "last_reload": None if last is None else last.to_dict()}


@router.post("/v1/budgets/reload", response_model=ReloadOut,
             responses={**ERROR_RESPONSES, 422: {"model": ReloadOut, "description": "The budgets file was rejected "
                                                 "(or none is configured); the running budgets keep applying."}},
             summary="Re-read the budgets file and apply it if it is valid")
async def reload_budgets_now(principal: Principal = Depends(require("admin")),
                             rt: Runtime = Depends(get_runtime)) -> JSONResponse:
    """Read the budgets file again and apply its limits from the next decision on (holds and
    spend stay). A bad file is rejected with every located problem (422)."""
    return await _reload_everywhere(rt, "budgets")


async def _reload_everywhere(rt: Runtime, what: str) -> JSONResponse:
    """Reload ``what`` here (``Runtime.reload_file``) and, when that applied, announce it to every other
    worker and replica sharing the state (``StateSync.announce_reload``), which re-read their own copy:
    without it only the worker that took the call applied the file (``--workers 2``: half the requests
    kept the old budgets). 200 with the result, 422 when rejected."""
    def run() -> ReloadResult:
        result = rt.reload_file(what)
        if result is None:  # budgets: none configured
            result = reload_budgets(rt.live, rt.settings.budgets_path, "endpoint", rt.record_budgets_reload)
        if result.ok:
            rt.live.engine.state.sync.announce_reload(what)
        return result

    result = await run_in_threadpool(run)
    return JSONResponse(result.to_dict(), status_code=200 if result.ok else 422)
