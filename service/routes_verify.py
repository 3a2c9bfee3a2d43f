"""``POST /v1/verify``: the cascade's second decision. A gateway sends the decision id and the
draft the decision's target answered (or its first tokens) and gets back ``accept`` or
``escalate`` (``cascade.VerifyOut``).

In order (in a worker thread; same auth as ``/v1/route``):

1. the body is validated (422 naming the field; usage beyond the draft's target's context window
   x ``CONTEXT_TOLERANCE`` too, as ``POST /v1/outcomes`` refuses it, and a ``served_target`` the fleet does
   not have); the decision must be held here
   (``cascade.PendingDrafts``): 404 ``unknown_decision`` when nothing knows it, 410
   ``no_verify_section`` when the serving policy has none (nothing is held), 410
   ``decision_expired`` when it is older than ``POINTSMAN_VERIFY_TTL_S`` or its context is not
   on this replica (its signed id or the outcome log knows it, memory does not) and, with shared
   state, no other process holding it answered the relayed verify (``verify_relay``);
2. a repeated verify returns the first answer with ``replayed: true``; a decision already
   settled by its outcome (or released) is 409 ``decision_settled``;
3. the draft's features (``estimator/draft.py``, with the decision's prompt: its request view's last
   user message) and the verifier's ``p_bad``
   (``POINTSMAN_VERIFIER``); a complete draft's hold made its cost (``FleetState.hold_known_cost``: step 5
   books it whatever the action, so its escalation is judged beside what the draft costs, not its estimate;
   a partial draft's call may go on, so its estimate stays held), then ``RoutingEngine.verify``: the
   policy's verify rules, and for an escalation its placement, budget hold and in-flight count under
   ``<decision_id>/escalation``;
4. the verification is stored durably in the outcome log (the draft's features; its text with
   ``POINTSMAN_STORE_DRAFTS``); when that fails the escalation's hold is released and the
   answer is 503 (nothing accepted: retry);
5. the draft is settled (its usage booked on the target that wrote it: ``served_target``, else the
   decision's; its on-prem load released), unless it is an
   accepted partial draft (the on-prem call goes on: its outcome settles it).

The gateway then reports one outcome under the decision id: for an escalated decision it
settles the escalation (``routes_reports``); it is stored once, like any outcome.
"""

from __future__ import annotations

import difflib
import math
import time
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from pointsman.errors import BudgetError, DataError, RequestError
from pointsman.estimator.draft import draft_features, prompt_of
from pointsman.estimator.verifier import Verifier
from pointsman.json_types import JSONValue
from pointsman.outcome import check_usage_fits
from pointsman.policy.budget.ledger import LedgerUnavailable
from pointsman.policy.escalation import draft_signals
from pointsman.policy.fleet import FrontierTarget
from pointsman.service.auth import Principal, may_report, require
from pointsman.service.bodies import json_body, read_parsed, validate_model
from pointsman.service.cascade import Pending, VerifyIn, VerifyOut
from pointsman.service.http_errors import ERROR_RESPONSES, HTTPError, invalid, unavailable
from pointsman.service.runtime import Runtime, get_runtime

router = APIRouter()


def _missing(rt: Runtime, decision_id: str) -> HTTPError:
    """404 or 410 for a decision not held here (see the module, step 1)."""
    claims = rt.live.engine.state.claims(decision_id)
    logged = claims is not None
    if not logged:
        rt.writer.flush(timeout_s=10.0)
        try:
            logged = rt.outcome_log.decision(decision_id) is not None
        except DataError:
            logged = False
    policy = rt.live.engine.policy
    if logged and policy.verify is None:  # nothing is held under such a policy, however fresh the decision
        return HTTPError(410, f"decision {decision_id} was not held for verification: the serving policy "
                              f"'{policy.name}' has no verify section, so its drafts stand (report the outcome)",
                         type="not_found_error", code="no_verify_section", param="decision_id")
    if logged:  # a decision this service made (its signed id, or the log), not held here
        return HTTPError(410, f"decision {decision_id} can no longer be verified: verify within "
                              f"{rt.cascade.ttl_s:g} s (POINTSMAN_VERIFY_TTL_S), on the replica that made it",
                         type="not_found_error", code="decision_expired", param="decision_id")
    return HTTPError(404, f"no decision {decision_id} here (verify a decision_id from POST /v1/route)",
                     type="not_found_error", code="unknown_decision", param="decision_id")


def verify(rt: Runtime, body: VerifyIn, verifier: Verifier) -> dict[str, object]:
    """Steps 1-5 of the module for one validated body; the answer as a dict. A decision another
    process of the shared state holds is verified there (``verify_relay``). Raises ``HTTPError``."""
    if rt.relay is not None and rt.cascade.get(body.decision_id) is None:
        claims = rt.live.engine.state.claims(body.decision_id)
        if claims is not None and not claims.escalates and time.time() - claims.issued_s <= rt.cascade.ttl_s:
            relayed = rt.relay.ask(body.decision_id, body.model_dump(mode="json", exclude_unset=True))
            if relayed is not None:
                status, answer = relayed
                if status == 200:
                    return answer
                found = answer.get("error")
                error: dict[str, Any] = found if isinstance(found, dict) else {}
                raise HTTPError(status, str(error.get("message") or "the relayed verify failed"),
                                type=str(error.get("type") or "server_error"), param=error.get("param"),
                                code=error.get("code"))
    return verify_here(rt, body, verifier)


def answer_relayed(rt: Runtime, raw: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """The (HTTP status, body) of a verify another process relayed here (``verify_relay``): this
    process's own steps 1-5, never relayed again."""
    try:
        return 200, verify_here(rt, parse_verify(raw), rt.verifier)
    except HTTPError as exc:
        return exc.status, exc.body()
    except RequestError as exc:
        return 422, invalid(exc).body()


def verify_here(rt: Runtime, body: VerifyIn, verifier: Verifier) -> dict[str, object]:
    """``verify`` on this process only (404/410 when the decision is not held here)."""
    pending = rt.cascade.get(body.decision_id)
    if pending is None:
        raise _missing(rt, body.decision_id)
    with pending.lock:
        if pending.answer is not None:
            return {**pending.answer, "replayed": True}
        return _first_verify(rt, body, verifier, pending)


def _first_verify(rt: Runtime, body: VerifyIn, verifier: Verifier, pending: Pending) -> dict[str, object]:
    decision = pending.decision
    engine = rt.live.engine
    state = engine.state
    record = state.record(decision.decision_id)
    if record is None:
        raise HTTPError(409, f"decision {decision.decision_id} is already settled (its outcome arrived or it was "
                             "released): verify before reporting the outcome", type="conflict_error",
                        code="decision_settled", param="decision_id")
    drafted = body.served_target or decision.target  # a fallback's draft is that target's: priced and judged so
    target = state.target_spec(drafted)
    if target is None:
        close = difflib.get_close_matches(drafted, list(engine.fleet.targets), n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else f"; the fleet's targets: {', '.join(engine.fleet.targets)}"
        raise HTTPError(422, f"unknown target '{drafted}'{hint}", param="served_target", code="invalid_value")
    impossible = check_usage_fits(body.usage, target.context_window_tokens, drafted, "", record.decided_tokens)
    if impossible is not None:  # as POST /v1/outcomes: such usage would book dollars against the budget
        raise HTTPError(422, impossible.message, param=impossible.field, code="invalid_value")
    usage = body.usage
    if usage is not None and usage.prompt_tokens is None:  # with a prompt count, parsing checked the parts
        # (usage_shapes): without one the draft is settled at the decision's count, which they must fit in,
        # refused now, not a settlement error later
        prompt = decision.prompt_tokens
        parts = (usage.cached_tokens or 0) + (usage.cache_write_tokens or 0) + (usage.cache_write_1h_tokens or 0)
        if parts > prompt:
            raise HTTPError(422, f"cached and cache-write tokens ({parts:,}) exceed the prompt's {prompt:,} tokens "
                                 "(the decision's count: send usage.prompt_tokens)", param="usage.cached_tokens",
                            code="invalid_value")
    rf = decision.request_features  # the verifier's length ratio reads the text's count, as it was trained
    features = draft_features(body.as_draft(), rf.priced_prompt_tokens if rf is not None else decision.prompt_tokens,
                              decision.p_hard, prompt_of(decision.request_view))
    try:
        p_bad = float(verifier.p_bad(features))
    except Exception:  # noqa: BLE001 - a broken verifier head must not take the verify down
        p_bad = math.nan
    if not 0.0 <= p_bad <= 1.0:
        p_bad = 0.5
    draft = draft_signals(features, p_bad, verifier.version, drafted, not isinstance(target, FrontierTarget))
    usage = body.usage
    prompt = usage.prompt_tokens if usage and usage.prompt_tokens is not None else decision.prompt_tokens
    cached, write, write_1h = (usage.cached_tokens or 0, usage.cache_write_tokens or 0,
                               usage.cache_write_1h_tokens or 0) if usage else (0, 0, 0)
    if not features.partial:  # booked below whatever the action: its escalation is judged beside its cost
        state.hold_known_cost(decision.decision_id, prompt_tokens=prompt, completion_tokens=features.tokens,
                              cached_tokens=cached, cache_write_tokens=write, cache_write_1h_tokens=write_1h,
                              target=drafted)
    try:
        escalation = engine.verify(decision, draft)
    except LedgerUnavailable as exc:
        raise unavailable(f"budget ledger unavailable: {exc}", "budget_ledger_unavailable") from None
    try:
        rt.writer.flush(timeout_s=10.0)
        rt.outcome_log.append_verification(
            decision.decision_id, time_s=time.time(), action=escalation.action, rule=escalation.rule, p_bad=p_bad,
            verifier=verifier.version, features=features.to_dict(), escalation_id=escalation.escalation_id,
            escalation_target=escalation.target, estimated_cost_usd=escalation.estimated_cost_usd,
            draft_text=body.draft.text if rt.settings.store_drafts else None)
    except DataError as exc:
        if escalation.escalation_id is not None:
            state.release(escalation.escalation_id)
        raise unavailable(f"outcome log unavailable, nothing accepted: {exc}", "outcome_log_unavailable") from None
    settlement: dict[str, object] | None = None
    if not (escalation.action == "accept" and features.partial):
        try:
            settled = state.settle(decision.decision_id, prompt_tokens=prompt, completion_tokens=features.tokens,
                                   cached_tokens=cached, cache_write_tokens=write, cache_write_1h_tokens=write_1h,
                                   target=drafted)
            settlement = settled.to_dict()
            rt.metrics.observe_settlement(settled)
        except LedgerUnavailable as exc:
            settlement = {"error": f"budget ledger unavailable ({exc}); the draft's outcome settles it"}
        except BudgetError as exc:
            settlement = {"error": str(exc)}
    if escalation.escalation_id is not None and escalation.target is not None:
        pending.escalation = (escalation.escalation_id, escalation.target)
    rt.metrics.verifications.labels(escalation.action).inc()
    if escalation.escalation_id is not None and escalation.target is not None:
        rt.metrics.observe_hold(escalation.target, escalation.estimated_cost_usd or 0.0)
    out = escalation.to_dict()
    answer = {**out, "p_bad": p_bad, "verifier": verifier.version, "draft": features.to_dict(),
              "draft_settlement": settlement, "replayed": False}
    pending.answer, pending.drafted = answer, drafted
    return answer


def parse_verify(body: JSONValue) -> VerifyIn:
    """Validate a verify body; raises ``RequestError`` naming the field."""
    return validate_model(VerifyIn, body)


@router.post("/v1/verify", response_model=VerifyOut, tags=["gateway"],
             responses={**ERROR_RESPONSES, 404: ERROR_RESPONSES[422], 409: ERROR_RESPONSES[422],
                        410: ERROR_RESPONSES[422]},
             summary="Accept a draft or escalate the request (a cascade)",
             openapi_extra=json_body({"$ref": "#/components/schemas/VerifyIn"}))
async def verify_route(request: Request, principal: Principal = Depends(require("gateway")),
                       rt: Runtime = Depends(get_runtime)) -> JSONResponse:
    """Body: ``decision_id``, ``draft`` (text, finish_reason, logprobs, partial) and ``usage``.
    Answer: accept or escalate with the target, ``p_bad``, the deciding rule and a trace."""
    _, body = await read_parsed(request, rt.settings, "a verify object", parse_verify)
    record = rt.live.engine.state.known(body.decision_id)
    if record is not None and not may_report(principal, record.scopes):
        raise HTTPError(422, f"decision {body.decision_id} was routed with another gateway key; only that key or "
                             "an admin key may verify its draft", param="decision_id", code="invalid_value")
    answer = await run_in_threadpool(verify, rt, body, rt.verifier)
    return JSONResponse(answer)
