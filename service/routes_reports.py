"""What gateways and engines report back: ``POST /v1/outcomes`` and ``POST /v1/telemetry``.

``POST /v1/outcomes`` takes one outcome or a list (``pointsman/outcome.py``:
decision id, usage, TTFT/TPOT/end-to-end latency, status, quality signals). In order:

1. the decision log writer commits the outcomes' decisions still in its memory (at once, at most
   ``FLUSH_WAIT_S``; nothing when they are committed already), so an outcome and its decision made here
   join in the log; each outcome's decision is known
   from its signed id (``FleetState.known``: any replica or
   worker with the shared key reads its target, scopes, estimate and inbox; or this process's
   own record). An outcome whose decision another replica logs (the id names its inbox) is
   ``forwarded`` to that replica's log (202 for a single outcome) and settled here: kept in this
   log's outbox in step 2's transaction, then sent (``runtime.send_forwards``); when the shared state
   cannot take it (or times out), it waits in the outbox and is sent again (``runtime.resend_forwards``),
   never stored here: it belongs in the log that holds its decision, once;
2. the others are appended to the outcome log in one durable transaction (``fsync``): the
   answer is sent only after that, so every acknowledged outcome (``stored``, ``duplicate``, or
   ``forwarded``: in the outbox) survives a crash. A known decision that is not (yet) in this log (another worker's, still in
   its memory; one whose log write failed) does not hold its outcome back: it is stored as an
   orphan and joins its decision when that arrives (``OutcomeLog.append_outcomes`` ``known``);
3. each stored, duplicate or forwarded non-shadow outcome settles its decision
   (``FleetState.settle``: actual cost from the reported usage into the budget ledger, or the
   spend journal while the ledger is unavailable; in-flight load released). An outcome with an
   error/timeout/cancelled status, no usage and no ``ttft_ms`` means the request never ran: its hold is
   released instead. An ``ok`` outcome without usage books the decision's estimate, and so does an
   error/timeout/cancelled one with a ``ttft_ms`` (its answer had started, so it ran and is billed).
   Settling is idempotent, so a retried outcome settles at most once. Shadow outcomes (evaluation traffic) never touch budgets;
   a stored one's usage is counted apart as shadow spend (``_count_shadow``).
   An outcome of an escalated decision (``POST /v1/verify`` said escalate; its draft was
   settled then) settles the escalation, ``<decision_id>/escalation``, on the escalation's
   target: the gateway reports one outcome per decision, stored once. Reported under the decision
   id, the escalation is found where the verify ran (this process's memory, else the outcome
   log); reported under the signed ``escalation_id`` the verify answered, any replica settles it
   from the id and stores it as the decision's outcome (``_of_escalation``); a forged or altered
   escalation id is ``unknown_decision`` (404). A report of the draft itself
   (``served_target`` the draft's target, e.g. the stream an early verification cancelled) is
   refused as ``invalid``: the verify booked the draft's tokens already.

Before step 2 each item is checked: it must validate (``parse_outcome_items``), and its usage
must fit the serving target's context window x ``CONTEXT_TOLERANCE`` (``usage_problem``), and its
``served_endpoint`` is made the fleet's id of the serving target's endpoint it names (``served_endpoint_id``); one
that names none (or several) is stored as sent, its ack's ``message`` says it was not recognised, and the outcome
breaker does not count that outcome on any endpoint. A failing item is not stored: in a list it gets an
``invalid`` ack whose message names its fields (``[1].status: ...``) while the other items are stored; a single
one is a 422 naming the field.

Idempotent: the same outcome again is ``duplicate`` (200), different content under the
same id is ``conflict`` (409 for a single outcome). A single outcome for an unknown decision
(an id no key here signed, nor this log or process knows) is 404; a list is always 200 with
one acknowledgement per item. 503 when the outcome log is unavailable (nothing acknowledged;
``/readyz`` says so too), or the budget ledger is and the spend journal cannot take the
settlement (outcomes stored; retry: the retry is a duplicate and settles).

Outcomes other replicas forward to this one (``deliver_forwarded``, from the shared-state
reader) are stored the same way, without settling (the receiving replica settled them), but for a
draft the gateway kept of a decision this replica's verify escalated: only here are the escalation
and the verified prefix known, so it is settled here (``_settle_kept_draft``).

``POST /v1/telemetry`` takes one load report or a list: ``{"endpoint": ..., "load":
{vLLM-named fields}, "healthy": ..., "reason": ...}``. Every report is validated first
(422 naming ``[i].load.<field>`` or ``[i].endpoint``, with did-you-mean), then all are
applied (``FleetState.push_load`` / ``set_health``).
"""

from __future__ import annotations

import difflib
import json
import logging
import sqlite3
import time
from collections.abc import Mapping
from types import EllipsisType
from typing import Required, TypedDict

from fastapi import APIRouter, Depends, Request
from fastapi.concurrency import run_in_threadpool
from pydantic import TypeAdapter

from pointsman.errors import BudgetError, DataError, RequestError
from pointsman.json_types import json_path
from pointsman.outcome import (
    CONTEXT_TOLERANCE,
    OutcomeIn,
    OutcomeItemError,
    Usage,
    batch_items,
    check_usage_fits,
    parse_outcome_items,
)
from pointsman.outcome_log.records import OutcomeAck
from pointsman.policy.budget.ledger import LedgerUnavailable
from pointsman.policy.cost import estimate_cost
from pointsman.policy.signals.fleet_state import DispatchRecord
from pointsman.policy.signals.signed_ids import Claims
from pointsman.service.auth import Principal, authenticate, header_key, may_report, require
from pointsman.service.bodies import JSONAnswer, json_body, read_parsed, validate_model
from pointsman.service.endpoint_index import endpoint_index
from pointsman.service.http_errors import ERROR_RESPONSES, HTTPError, unavailable
from pointsman.service.runtime import Runtime, get_runtime, runtime_of, send_forwards
from pointsman.service.schemas import OutcomeAckOut, OutcomesResponse, TelemetryIn, TelemetryResponse

router = APIRouter()
log = logging.getLogger("pointsman.outcomes")

#: How long an outcome waits for this process's decision log writer (seconds): it commits at once
#: when asked, so normally a millisecond; past this (a stalled disk) the outcome goes on without it.
FLUSH_WAIT_S = 1.0
_STATUS = {"stored": 200, "duplicate": 200, "forwarded": 202, "conflict": 409, "unknown_decision": 404}


class AckEntry(TypedDict, total=False):
    """One outcome's acknowledgement as ``store_outcomes`` builds it: ``OutcomeAckOut``'s fields
    (``settlement``: ``Settled.to_dict()``), and for an invalid item its error (``problem``)."""

    outcome_id: Required[str | None]
    decision_id: Required[str | None]
    status: Required[str]
    message: Required[str | None]
    settlement: Mapping[str, object]
    released: bool
    settle_error: str
    problem: OutcomeItemError


#: What settling knows of a decision: (target, estimated cost in USD, prompt tokens the estimate
#: counted, the client's output cap it assumed; each count 0 when unknown or none).
Known = tuple[str, float | None, int, int]


def _known_decision(rt: Runtime, decision_id: str,
                    record: DispatchRecord | None | EllipsisType = ...) -> Known | None:
    """What settling knows of a decision (``Known``): from its signed id or this process's in-flight
    record (``FleetState.known``; ``record``, its answer when the caller has it), else from the outcome
    log (an id no key here verifies: another process's unsigned one, or one signed with a key since
    replaced; the logged cap is one answer's, ``n`` not being logged); None when none knows it.
    Raises ``DataError`` (outcome log)."""
    if record is ...:
        record = rt.live.engine.state.known(decision_id)
    if record is not None:
        return record.target, record.estimated_cost_usd, record.prompt_tokens, record.output_cap_tokens
    logged = rt.outcome_log.decision(decision_id)
    if logged is None:
        return None
    rf = logged.request_features
    # the count that priced it, media counted (logged since prompt_tokens is kept); before, the text's billed count
    # (logged since billed_prompt_tokens exists), before that the estimator's
    prompt = logged.prompt_tokens if logged.prompt_tokens is not None \
        else int(rf.get("billed_prompt_tokens") or rf.get("prompt_tokens") or 0)
    return logged.target, logged.estimated_cost_usd, prompt, int(rf.get("max_output_tokens") or 0)


def estimate_booking(rt: Runtime, served: str | None, known: Known | None) -> tuple[float, int, int]:
    """What an ``ok`` outcome without usage books: (USD, prompt tokens, completion tokens). The
    decision's estimate when ``served`` is the decision's target; on another target the larger of
    that estimate and the same request priced there (the decision's prompt tokens, and its output
    cap, else the target's output estimate: ``Fleet.output_tokens``), so a fallback to a dearer
    target is not booked at the cheaper one's price; an on-prem one at its pools' utilizations now
    (``FleetState.pool_utilizations``), as usage on a target other than the decision's is priced. The tokens
    are the estimate's (the effective price per token divides by them). ``known``: ``_known_decision``'s answer."""
    if known is None:
        return 0.0, 0, 0
    decision_target, estimate, prompt, cap = known
    fleet = rt.live.engine.fleet
    target = served or decision_target
    spec = rt.live.engine.state.target_spec(target)
    if spec is None:
        return float(estimate or 0.0), prompt, 0
    completion = cap or spec.default_output_tokens or fleet.spec.defaults.output_tokens
    usd = float(estimate or 0.0)
    if target != decision_target:
        u_p, u_d = rt.live.engine.state.pool_utilizations(target, spec.modes[0])
        usd = max(usd, estimate_cost(target, spec, spec.modes[0], prompt, completion,
                                     prefill_utilization=u_p, decode_utilization=u_d).usd)
    return usd, prompt, completion


def _count_shadow(rt: Runtime, item: OutcomeIn) -> None:
    """Count a newly stored shadow outcome's cost on its ``served_target`` (``pointsman_shadow_spend_usd_total``,
    ``GET /v1/fleet``'s ``shadow_spend``): its usage priced as a served outcome's on that target (on-prem at its
    pools' utilizations now); none without usage (nothing says what it generated) or on a target the fleet does
    not have (no price). It touches no budget."""
    usage, target = item.usage, item.served_target
    if target is None or usage is None or usage.prompt_tokens is None or usage.completion_tokens is None:
        return
    tokens = {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
              "cached_tokens": usage.cached_tokens or 0, "cache_write_tokens": usage.cache_write_tokens or 0,
              "cache_write_1h_tokens": usage.cache_write_1h_tokens or 0}
    try:
        usd = rt.live.engine.state.price_usage(item.key, target, tokens)
    except BudgetError as exc:  # a target the fleet does not have, or parts beyond the prompt: stored, not priced
        log.warning("shadow outcome %s not priced: %s", item.key, exc)
        return
    rt.metrics.shadow_spend_usd.labels(target).inc(usd)


def _settle(rt: Runtime, item: OutcomeIn, entry: AckEntry, escalation: tuple[str, str] | None,
            observe: bool = True) -> None:
    """Settle (or release) one acknowledged outcome's decision, adding what it did to ``entry``
    (``settlement``, ``released`` or ``settle_error``); ``escalation``: (escalation id, target) when a
    verify escalated the decision (reported under the signed escalation id, or ``_escalation_of``),
    else None; ``observe``: feed the outcome breaker (not for a ``served_endpoint`` the fleet does not know).
    Raises ``LedgerUnavailable``."""
    if item.shadow:
        return
    state = rt.live.engine.state
    if observe and item.status in ("ok", "error", "timeout"):  # a cancelled request says nothing about the endpoint
        state.observe_outcome(item.decision_id, ok=item.counts_as_answered, endpoint=item.served_endpoint,
                              served_target=item.served_target)
    usage = item.usage
    reported = usage if usage is not None and usage.prompt_tokens is not None \
        and usage.completion_tokens is not None else None  # OutcomeIn requires both with usage
    # an ok answer without usage books the estimate, and so does a cancelled, failed or timed-out one whose
    # answer had started (ttft_ms): it ran, and the upstream bills what it generated; released, a client
    # cancelling every stream just before its usage chunk spent nothing against its budget
    books_estimate = reported is None and (item.status == "ok" or item.ttft_ms is not None)
    target = item.served_target
    known: Known | None = None
    settle_id = item.decision_id
    if escalation is not None and _reports_the_draft(rt, item, escalation):
        # the gateway kept the draft (usage_problem let no cancelled one through): the escalation was never made
        _settle_kept_draft(rt, item, entry, escalation[0], reported, books_estimate)
        return
    if escalation is not None:
        settle_id, target = escalation[0], item.served_target or escalation[1]
        record = state.known(settle_id)  # this replica's hold, else the signed id's claims
        known = (escalation[1], record.estimated_cost_usd, record.prompt_tokens,
                 record.output_cap_tokens) if record is not None else None
    elif not target or books_estimate:
        known = _known_decision(rt, item.decision_id)
        if known is not None:
            target = target or known[0]
    try:
        if reported is None and not books_estimate:
            entry["released"] = bool(state.release(settle_id))
            return
        if reported is not None:
            settled = state.settle(settle_id, prompt_tokens=reported.prompt_tokens or 0,
                                   completion_tokens=reported.completion_tokens or 0,
                                   cached_tokens=reported.cached_tokens or 0, target=target,
                                   cache_write_tokens=reported.cache_write_tokens or 0,
                                   cache_write_1h_tokens=reported.cache_write_1h_tokens or 0,
                                   served_endpoint=item.served_endpoint)
        else:
            usd, prompt, completion = estimate_booking(rt, target, known)
            settled = state.settle(settle_id, prompt_tokens=prompt, completion_tokens=completion,
                                   actual_cost_usd=usd, target=target)
    except LedgerUnavailable:
        raise
    except BudgetError as exc:
        entry["settle_error"] = str(exc)
        return
    rt.metrics.observe_settlement(settled)
    entry["settlement"] = settled.to_dict()
    if escalation is None and settled.replayed and item.served_target and settled.target \
            and settled.target != item.served_target:
        # booked before on another target: the draft a verify on another replica settled (this report is
        # its escalated call's, which nothing here knows of), or an earlier outcome; either way these
        # tokens are not booked, and an acknowledgement that looked settled would hide it
        entry["settle_error"] = (
            f"decision {item.decision_id} was already settled on '{settled.target}', so this report's usage on "
            f"'{item.served_target}' is not booked. If a verify escalated it, report the escalated call under the "
            "escalation_id the verify answered (any replica settles it; under the decision id only the replica "
            "that verified knows of the escalation)")
        log.warning("outcome of %s on %s not booked: %s", item.decision_id, item.served_target, entry["settle_error"])


def _escalation_of(rt: Runtime, decision_id: str) -> tuple[str, str] | None:
    """(escalation id, target) when ``POST /v1/verify`` escalated the decision: held in memory,
    else from the outcome log's ``verifications``; None otherwise. Raises ``DataError``."""
    held = rt.cascade.escalation_of(decision_id)
    if held is not None:
        return held
    try:
        logged = rt.outcome_log.verification(decision_id)
    except (DataError, sqlite3.Error):
        return None
    if logged is None or not logged.get("escalation_id") or not logged.get("escalation_target"):
        return None
    return str(logged["escalation_id"]), str(logged["escalation_target"])


def _verified_draft(rt: Runtime, decision_id: str) -> dict[str, object] | None:
    """The draft features the decision's verify read (``DraftFeatures.to_dict``: ``tokens``, ``partial``,
    ...): held here, else in the outcome log; None when unknown. Raises ``DataError`` (outcome log)."""
    pending = rt.cascade.get(decision_id)
    answer = pending.answer if pending is not None else None
    features: object = answer.get("draft") if answer is not None else None
    if features is None:
        logged = rt.outcome_log.verification(decision_id)
        features = None if logged is None else logged.get("features")
    return features if isinstance(features, dict) else None


def _settle_kept_draft(rt: Runtime, item: OutcomeIn, entry: AckEntry, escalation_id: str,
                       reported: Usage | None, books_estimate: bool) -> None:
    """The gateway kept the draft of a decision its verify escalated (the verify's answer came after the
    gateway's timeout): ``item`` is the decision's outcome and the escalation was never made. After a
    verify of the whole draft the verify booked exactly that draft, so the escalation is released
    (``entry["released"]``). After a verify of its first ``tokens`` tokens the verify booked the prompt and
    those tokens; the rest of the draft (the report's completion tokens beyond them, else the decision's
    output estimate beyond them when the report has no usage but its answer ran: its cap, else the target's
    default output tokens, ``Fleet.output_tokens``) is booked under the escalation
    id on the draft's target, which settles the escalation's hold (``entry["settlement"]``): the draft paid
    once, the hold released once. First the decision id is settled as the verify settles it (the prompt, and the
    verified tokens on the draft's target): a replay that changes nothing, unless the verify's process died after
    storing the verification and before booking the draft (its gateway, without an answer, kept the draft), when it
    books the draft now (``entry["settlement"]``) and releases the decision's hold. When that replay shows more than
    the prefix booked (an outcome of the whole draft settled the decision id on a replica that knew no escalation,
    while this verify was still running), nothing more is booked and the escalation is released. Raises
    ``LedgerUnavailable``."""
    state = rt.live.engine.state
    verified = _verified_draft(rt, item.decision_id) or {}
    prefix = verified.get("tokens")
    booked_whole = False
    if isinstance(prefix, int):
        record = state.known(item.decision_id)
        prompt = reported.prompt_tokens if reported is not None and reported.prompt_tokens is not None \
            else record.prompt_tokens if record is not None else 0
        try:
            draft = state.settle(item.decision_id, prompt_tokens=prompt, completion_tokens=prefix,
                                 cached_tokens=reported.cached_tokens or 0 if reported else 0,
                                 cache_write_tokens=reported.cache_write_tokens or 0 if reported else 0,
                                 cache_write_1h_tokens=reported.cache_write_1h_tokens or 0 if reported else 0,
                                 target=item.served_target)
        except BudgetError as exc:
            entry["settle_error"] = str(exc)
        else:
            if not draft.replayed:
                rt.metrics.observe_settlement(draft)
                entry["settlement"] = draft.to_dict()
            booked_whole = draft.settlement is not None and draft.settlement.completion_tokens > prefix
    if verified.get("partial") is not True or not isinstance(prefix, int) or booked_whole:
        entry["released"] = bool(state.release(escalation_id))
        return
    if reported is not None:
        rest = (reported.completion_tokens or 0) - prefix
    elif books_estimate:
        # the decision's output estimate, as an ok outcome without usage books (``estimate_booking``): its cap,
        # else the target's default; the cap alone is 0 without max_tokens, which booked nothing past the prefix
        record = state.known(item.decision_id)
        fleet = rt.live.engine.fleet
        cap = record.output_cap_tokens if record is not None else 0
        target = item.served_target
        rest = (fleet.output_tokens(target, cap or None) if target in fleet.targets else cap) - prefix
    else:
        entry["released"] = bool(state.release(escalation_id))
        return
    try:
        settled = state.settle(escalation_id, prompt_tokens=0, completion_tokens=max(0, rest),
                               target=item.served_target)
    except BudgetError as exc:
        entry["settle_error"] = str(exc)
        return
    rt.metrics.observe_settlement(settled)
    entry["settlement"] = settled.to_dict()


def _reports_the_draft(rt: Runtime, item: OutcomeIn, escalation: tuple[str, str]) -> bool:
    """Whether ``item``, an outcome of a decision a verify escalated to ``escalation[1]``, was served
    by the draft's target, not the escalation's: the target the verify named (a fallback that drafted it) when
    the verify was made here, else the decision's (its signed id, this replica's record, else the outcome log).
    Raises ``DataError`` (outcome log)."""
    if item.served_target is None or item.served_target == escalation[1]:
        return False
    drafted = rt.cascade.drafted(item.decision_id)
    if drafted is None:
        known = _known_decision(rt, item.decision_id)
        drafted = None if known is None else known[0]
    return item.served_target == drafted


def _of_escalation(item: OutcomeIn, claims: Claims | None) -> tuple[OutcomeIn, tuple[str, str] | None]:
    """An outcome reported under a signed escalation id (``POST /v1/verify``'s ``escalation_id``) is
    its decision's one outcome: the item under the decision's id (its key too, unless it has an
    ``outcome_id``: reported under either id it is stored once) with (escalation id, target) to
    settle; any other item as it is, with None. ``claims``: what the item's id says
    (``FleetState.claims``); any replica with the key reads it from the id."""
    if claims is None or not claims.escalates:
        return item, None
    return item.model_copy(update={"decision_id": claims.escalates}), (item.decision_id, claims.target)


def usage_problem(rt: Runtime, item: OutcomeIn, prefix: str = "",
                  escalation: tuple[str, str] | None | EllipsisType = ...,
                  record: DispatchRecord | None | EllipsisType = ...) -> OutcomeItemError | None:
    """Whether ``item``'s usage is impossible on the target that served it (more tokens than its
    ``context_window_tokens`` and than its decision's own prompt tokens and output cap, x
    ``CONTEXT_TOLERANCE``, ``check_usage_fits``): the error naming the fields
    (under ``prefix``, ``[3]``), else None. Unknown targets are not checked (their outcome is stored and its
    settlement says why it cannot be priced), but a non-shadow outcome's ``served_target`` the fleet does
    not have is an error: such an outcome could never settle, and its decision's budget hold and in-flight
    load would stay taken. So is a ``cancelled`` outcome of an escalated decision served by the draft's
    target (the cancelled draft: the verify booked its tokens, and taking its report as the decision's one
    outcome would settle the escalation with them and leave the escalated call's outcome a conflict); any
    other status is the draft the gateway kept (``_settle_kept_draft``). ``escalation``: (escalation id,
    target) of the decision's verify, or
    None, when the caller has it (reported under a signed escalation id, or looked up once for settling
    too); by default looked up (``_escalation_of``: held here, else in the outcome log, which the
    workers of one service share). The decision's target (without ``served_target``) and its prompt tokens
    and output cap are read once, and only for usage beyond the smallest context window of the fleet
    (``_known_decision``: ``record``, ``FleetState.known``'s answer when the caller has it, else the outcome
    log). Raises ``DataError`` (outcome log)."""
    targets = rt.live.engine.fleet.targets
    spec_of = rt.live.engine.state.target_spec  # a target a fleet reload removed still prices its decisions
    at = f"{prefix}." if prefix else ""
    if item.served_target is not None and not item.shadow:
        if escalation is ...:
            escalation = _escalation_of(rt, item.decision_id)
        if escalation is not None and item.status == "cancelled" and _reports_the_draft(rt, item, escalation):
            return OutcomeItemError(((f"{at}served_target", (
                f"decision {item.decision_id} was escalated to '{escalation[1]}' at its verify, which settled the "
                f"draft on '{item.served_target}' (its tokens are booked): report the escalated call's outcome, not "
                "the cancelled draft's")),))
    if item.served_target is not None and not item.shadow and targets and spec_of(item.served_target) is None:
        close = difflib.get_close_matches(item.served_target, list(targets), n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else f"; the fleet's targets: {', '.join(sorted(targets))}"
        return OutcomeItemError(((f"{at}served_target", f"unknown target '{item.served_target}'{hint}"),))
    usage = item.usage
    if usage is None:
        return None
    total = (usage.prompt_tokens or 0) + (usage.completion_tokens or 0)
    if not targets or total <= min(t.context_window_tokens for t in targets.values()) * CONTEXT_TOLERANCE:
        return None  # fits every target: no lookup
    known = _known_decision(rt, item.decision_id, record)
    target = item.served_target or (known[0] if known is not None else None)
    spec = None if target is None else spec_of(target)
    if target is None or spec is None:
        return None
    decided = known[2] + known[3] if known is not None else 0  # its prompt tokens and output cap
    return check_usage_fits(usage, spec.context_window_tokens, target, prefix, decided)


def over_cap_note(item: OutcomeIn, record: DispatchRecord | None, prefix: str = "") -> str | None:
    """The ack's note when ``item`` reports more completion tokens than its request's output cap
    (``record.output_cap_tokens``: ``max_tokens`` x ``n``, for every prompt of a batch; from the signed id or
    this process's record) x ``CONTEXT_TOLERANCE`` (a gateway's tokenizer may count differently): no upstream
    call generates that, so the report sums several (a gateway adding up its retries) or is another request's.
    The outcome is stored and booked all the same (retries are billed too); None when it fits, for a request
    without a cap, a decision known from no record (an unsigned id: the outcome log keeps one answer's cap,
    not ``n``) and a shadow outcome (another model's call, not this request's)."""
    usage = item.usage
    cap = record.output_cap_tokens if record is not None else 0
    if item.shadow or usage is None or usage.completion_tokens is None or not cap \
            or usage.completion_tokens <= cap * CONTEXT_TOLERANCE:
        return None
    at = f"{prefix}." if prefix else ""
    return (f"{at}usage.completion_tokens {usage.completion_tokens:,} is above the request's output cap of {cap:,} "
            "tokens (max_tokens x n): no single upstream call generates that; booked as reported, counted in "
            "pointsman_outcome_usage_over_cap_total. Report one call's usage, not a sum of retries")


#: At most this many endpoints are listed in an unknown ``served_endpoint``'s error.
_LISTED_ENDPOINTS = 12


def served_endpoint_id(rt: Runtime, item: OutcomeIn, prefix: str = "", escalation: tuple[str, str] | None = None,
                       record: DispatchRecord | None | EllipsisType = ...) -> tuple[OutcomeIn, str | None]:
    """``item`` with its ``served_endpoint`` made the fleet's endpoint id (``EndpointIndex.named``) and None; or,
    when the served target (``served_target``, else the escalation's target when a verify escalated the decision,
    ``escalation``: (id, target), else the decision's: ``record``, else ``_known_decision``) has no such endpoint
    (or several), ``item`` as sent and the ack's message (``<prefix>.served_endpoint: ...``, listing the target's
    endpoints): the outcome is stored all the same (its spend, its quality) and the breaker leaves it out. Not
    checked (kept as sent, counting on no endpoint) when the served target is not in the fleet (a shadow's, one a
    reload removed). Raises ``DataError`` (outcome log)."""
    named = item.served_endpoint
    if named is None:
        return item, None
    fleet = rt.live.engine.fleet
    target = item.served_target or (escalation[1] if escalation is not None else None)
    if target is None:
        known = _known_decision(rt, item.decision_id, record)
        target = known[0] if known is not None else None
    if target is not None and target not in fleet.targets:
        return item, None
    index = endpoint_index(fleet)
    ids = index.named(target, named)
    if len(ids) == 1:
        return (item if ids[0] == named else item.model_copy(update={"served_endpoint": ids[0]})), None
    field = f"{prefix}.served_endpoint" if prefix else "served_endpoint"
    of = f"target '{target}'" if target is not None else "the fleet"
    if ids:
        msg = f"'{named}' names {len(ids)} endpoints of {of} ({', '.join(sorted(ids))}); send the endpoint's id"
    else:
        other = index.named(None, named) if target is not None else []
        valid = [f"{e.name} ({e.id})" if e.name else e.id for e in fleet.endpoints.values()
                 if target is None or e.target == target]
        listed = ", ".join(valid[:_LISTED_ENDPOINTS]) + (f", ... ({len(valid)} in all)" if len(valid) > _LISTED_ENDPOINTS
                                                          else "")
        where = (f"an endpoint of target '{fleet.endpoints[other[0]].target}', not of {of} that served it (set "
                 "served_target when another target answered)") if other else f"no endpoint of {of}"
        msg = f"'{named}' is {where}; send an endpoint's id, name, host:port or base URL: {listed}"
    return item, (f"{field}: not recognised, stored as sent; the outcome breaker does not count this outcome on any "
                  f"endpoint. {msg}")


def _invalid_item(problem: OutcomeItemError) -> HTTPError:
    """The 422 for one invalid outcome: ``param`` its first field, the message its first problem's
    followed by every other problem (``; field: message``)."""
    rest = "".join(f"; {f}: {m}" if f else f"; {m}" for f, m in problem.problems[1:])
    return HTTPError(422, problem.message + rest, param=problem.field, code="invalid_value")


def _invalid_ack(item: OutcomeIn | OutcomeItemError, problem: OutcomeItemError) -> AckEntry:
    ids = (item.key, item.decision_id) if isinstance(item, OutcomeIn) else (problem.outcome_id, problem.decision_id)
    return {"outcome_id": ids[0], "decision_id": ids[1], "status": "invalid", "message": problem.describe(),
            "problem": problem}


def not_the_callers(rt: Runtime, item: OutcomeIn, record: DispatchRecord | None, caller: Principal | None,
                    prefix: str = "") -> OutcomeItemError | None:
    """Whether ``caller`` may not report ``item``: a decision routed under a gateway key (its
    ``key:<name>`` budget scope, in ``record``: ``FleetState.known``, this replica's record or the
    signed id; without either, the outcome log's ``api_key_id``: an id no key here verifies since the
    decision key changed) takes its outcome from that key or an admin key only, so a decision id seen in a
    forwarded header cannot spend another key's budget. The error on ``decision_id`` (under
    ``prefix``), else None (also for a decision nothing here knows, and with authentication off).
    Raises ``DataError`` (outcome log)."""
    if caller is None or caller.key_id is None or caller.role == "admin":
        return None
    if record is not None:
        scopes: tuple[str, ...] = record.scopes
    else:
        logged = rt.outcome_log.decision(item.decision_id)
        scopes = () if logged is None or logged.api_key_id is None else (f"key:{logged.api_key_id}",)
    if may_report(caller, scopes):
        return None
    field = f"{prefix}.decision_id" if prefix else "decision_id"
    return OutcomeItemError(((field, f"decision {item.decision_id} was routed with another gateway key; only "
                                     "that key or an admin key may report its outcome"),),
                            decision_id=item.decision_id, outcome_id=item.key)


def store_outcomes(rt: Runtime, items: list[OutcomeIn | OutcomeItemError], indexed: bool = False,
                   settle: bool = True, caller: Principal | None = None, unsettled: bool = False) -> list[AckEntry]:
    """Steps 1-3 of the module docstring (blocking: run in a worker thread). Returns one ack
    dict per item, in order; an invalid item (an ``OutcomeItemError`` from parsing, usage
    impossible on its target, ``usage_problem``, or a decision of another gateway key than
    ``caller``'s, ``not_the_callers``; fields prefixed ``[i]`` when ``indexed``) is not
    stored and gets status ``invalid``, its ``message`` naming the fields, and its error under
    the ``problem`` key. Without ``settle`` (outcomes forwarded here) nothing is forwarded again and
    nothing is settled but a draft the gateway kept of a decision this replica's verify escalated
    (``_settle_kept_draft``: only here are that escalation and the verified prefix known). ``unsettled``
    (ext_proc's outcomes, which no gateway resends): the outcome log keeps each outcome stored here as not yet
    settled, in the transaction that stores it, until its settlement is made (``OutcomeLog.unsettled_outcomes``:
    a process killed in between settles it when it starts again, ``settle_unsettled``). Raises
    ``HTTPError`` 503 when the outcome log, the shared state (for an outcome to forward) or the ledger
    is unavailable."""
    # their decisions first, when still in this process's memory: each outcome joins its decision in the log, and
    # its fsync covers the decision's row
    rt.writer.flush(FLUSH_WAIT_S, [item.decision_id for item in items if isinstance(item, OutcomeIn)])
    state = rt.live.engine.state
    sync = state.sync
    problems: list[OutcomeItemError | None] = [item if isinstance(item, OutcomeItemError) else None for item in items]
    unrecognised: dict[int, str] = {}  # item -> its ack's message: a served_endpoint the fleet does not know
    over_cap: dict[int, tuple[str, str]] = {}  # item -> (its ack's note, target): usage beyond the request's cap
    acks: list[OutcomeAck | None] = [None] * len(items)
    known: dict[str, str] = {}  # decision id -> target, for decisions vouched for (stored even if not logged here)
    here: list[tuple[int, OutcomeIn]] = []
    away: list[tuple[int, OutcomeIn, str]] = []  # (item, outcome, inbox of the log that holds its decision)
    escalations: dict[int, tuple[str, str]] = {}  # item -> (escalation id, target) of an escalated decision
    items = list(items)
    try:
        for i, item in enumerate(items):
            if not isinstance(item, OutcomeIn) or problems[i] is not None:
                continue
            claims = state.claims(item.decision_id)  # verified once: the id's MAC and claims
            item, escalation = _of_escalation(item, claims)  # reported under a signed escalation id
            if escalation is not None:
                items[i] = item
                claims = state.claims(item.decision_id)
            elif not item.shadow:  # a verify held here or in the outcome log: looked up once, checked and settled
                escalation = _escalation_of(rt, item.decision_id)
            if escalation is not None:
                escalations[i] = escalation
            record = state.known(item.decision_id)
            problems[i] = usage_problem(rt, item, f"[{i}]" if indexed else "", escalation, record) \
                or not_the_callers(rt, item, record, caller, f"[{i}]" if indexed else "")
            if problems[i] is None and settle:  # (a forwarded one was checked, and made an id, where it arrived)
                item, note = served_endpoint_id(rt, item, f"[{i}]" if indexed else "", escalation, record)
                items[i] = item
                if note is not None:
                    unrecognised[i] = note
            if problems[i] is not None:
                continue
            over = over_cap_note(item, record, f"[{i}]" if indexed else "")
            if over is not None and record is not None:
                over_cap[i] = over, item.served_target or record.target
            if record is not None:
                known[item.decision_id] = record.target
            if settle and sync.shared and claims is not None and claims.inbox and claims.inbox != sync.inbox:
                away.append((i, item, claims.inbox))
                continue
            here.append((i, item))
        if here or away:
            for (i, _), stored in zip(here, rt.outcome_log.append_outcomes(
                    [item for _, item in here], known=known, unsettled=unsettled and settle,
                    forwards=[(inbox, item) for _, item, inbox in away])):
                acks[i] = stored
    except DataError as exc:
        raise unavailable(f"outcome log unavailable, nothing acknowledged: {exc}", "outcome_log_unavailable") from None
    if away:
        sent = send_forwards(rt.outcome_log, sync, [(inbox, item.key, item.model_dump_json(exclude_unset=True))
                                                    for _, item, inbox in away])
        for i, item, _ in away:
            acks[i] = OutcomeAck(item.key, item.decision_id, "forwarded",
                                 "another replica logs this decision: the outcome is forwarded to its outcome log "
                                 f"(idempotent there){'' if sent else ', kept here until the shared state takes it'} "
                                 "and settled here")
    out: list[AckEntry] = []
    ledger_down = None
    settled: list[str] = []  # outcomes kept as unsettled whose settlement is made
    for i, (item, ack, problem) in enumerate(zip(items, acks, problems)):
        if problem is not None:
            entry = _invalid_ack(item, problem)
        else:
            assert ack is not None and isinstance(item, OutcomeIn)
            kept = ack.ok or ack.status == "forwarded"  # a conflict: not stored
            note = unrecognised.get(i) if kept else None
            beyond = over_cap.get(i) if kept else None
            entry = {"outcome_id": ack.outcome_id, "decision_id": ack.decision_id, "status": ack.status,
                     "message": "; ".join(filter(None, (ack.message, note, beyond and beyond[0]))) or None}
            if beyond is not None and ack.status == "stored":  # counted once: where it is stored
                rt.metrics.usage_over_cap.labels(beyond[1]).inc()
                log.warning("outcome %s: %s", ack.outcome_id, beyond[0])
            escalation = escalations.get(i)
            if settle and (ack.ok or ack.status == "forwarded") or not settle and ack.ok and escalation is not None \
                    and _reports_the_draft(rt, item, escalation):
                # forwarded here: a kept draft of a decision this replica verified and escalated is settled here,
                # where the verify's escalation and draft features are known; the replica it reached settled the
                # decision id (the draft, already booked: replayed) and could not close the escalation
                try:
                    _settle(rt, item, entry, escalation, observe=note is None)
                except LedgerUnavailable as exc:
                    ledger_down = exc
                else:
                    settled.append(item.key)
        if problem is None and isinstance(item, OutcomeIn) and item.shadow and entry["status"] == "stored":
            _count_shadow(rt, item)  # once: where it is stored (a retry is a duplicate, a forward stored by its owner)
        rt.metrics.outcomes.labels(entry["status"]).inc()
        out.append(entry)
    if unsettled and settled:
        try:
            rt.outcome_log.settled(settled)
        except DataError as exc:  # settled again at the next start: idempotent
            log.warning("settled outcomes not marked settled in the outcome log: %s", exc)
    if ledger_down is not None:
        raise unavailable(f"outcomes stored durably, but the budget ledger is unavailable ({ledger_down}); retry: "
                          "the retry is acknowledged as duplicate and settles", "budget_ledger_unavailable")
    return out


def settle_unsettled(rt: Runtime) -> int:
    """Settle the outcomes the outcome log keeps as not yet settled (``store_outcomes(unsettled=True)``: stored
    by a process that died before settling them), as a gateway's resend would: duplicates, settled once; one
    refused for good (its decision unknown after a key change, usage a reloaded fleet cannot take) is logged and
    dropped (blocking: run in a worker thread). Returns how many are left (0 when all are settled); raises
    ``HTTPError`` 503 while the outcome log, or the ledger with no journal to take them, is unavailable."""
    try:
        items = rt.outcome_log.unsettled_outcomes()
    except DataError as exc:
        raise unavailable(f"outcome log unavailable: {exc}", "outcome_log_unavailable") from None
    for ack in store_outcomes(rt, list(items), indexed=True, unsettled=True) if items else []:
        if ack["status"] not in ("stored", "duplicate", "forwarded"):
            log.warning("unsettled outcome %s of decision %s dropped: %s (%s)", ack["outcome_id"], ack["decision_id"],
                        ack["status"], ack["message"])
    try:
        rt.outcome_log.settled([item.key for item in items])  # settled now, or refused for good: nothing settles it
        return len(rt.outcome_log.unsettled_outcomes(1))
    except DataError as exc:
        raise unavailable(f"outcome log unavailable: {exc}", "outcome_log_unavailable") from None


def deliver_forwarded(rt: Runtime, payloads: list[str]) -> bool:
    """Store outcomes other replicas forwarded to this one's outcome log (``StateSync.set_inbox``'s
    ``deliver``; JSON texts of ``OutcomeIn``), without settling (but a kept draft of a decision this replica
    escalated, ``store_outcomes``). True once stored (durable); False when the log or the budget ledger is
    unavailable (they are delivered again). An unreadable payload or one whose
    decision this log lacks is logged and dropped: its budget and load were settled where it arrived."""
    items = [item for text in payloads for item in _forwarded_items(text)]
    try:
        acks = store_outcomes(rt, items, indexed=True, settle=False) if items else []
    except HTTPError as exc:
        log.warning("forwarded outcomes not stored yet: %s", exc.message)
        return False
    for ack in acks:
        if ack["status"] not in ("stored", "duplicate"):
            log.warning("forwarded outcome %s of decision %s: %s (%s)", ack["outcome_id"], ack["decision_id"],
                        ack["status"], ack["message"])
    return True


def _forwarded_items(text: str) -> list[OutcomeIn | OutcomeItemError]:
    try:
        return parse_outcome_items(json.loads(text))
    except (ValueError, RequestError) as exc:
        log.warning("dropping an unreadable forwarded outcome: %s", exc)
        return []


#: JSON schema of the outcomes body (one ``OutcomeIn`` or a list); the app puts its ``$defs`` in components.
OUTCOMES_SCHEMA = TypeAdapter(OutcomeIn | list[OutcomeIn]).json_schema(ref_template="#/components/schemas/{model}")


@router.post("/v1/outcomes", response_model=OutcomesResponse, tags=["gateway"],
             responses={**ERROR_RESPONSES, 404: {"model": OutcomesResponse}, 409: {"model": OutcomesResponse}},
             summary="Report what came of decisions (one outcome or a list)",
             openapi_extra=json_body({k: v for k, v in OUTCOMES_SCHEMA.items() if k != "$defs"}))
async def outcomes(request: Request, principal: Principal = Depends(require("gateway")),
                   rt: Runtime = Depends(get_runtime)) -> JSONAnswer:
    """Store outcomes durably, then settle budgets and release load (see the module). The answer
    comes only after the outcomes are on disk."""
    return await answer_outcomes(request, rt, principal)


async def outcomes_hot(request: Request) -> JSONAnswer:
    """``outcomes`` without FastAPI's dependency injection (``app.PointsmanApp`` serves ``POST
    /v1/outcomes`` with it): the same key check, runtime and answer. Raises ``HTTPError``."""
    principal = authenticate(request, "gateway", header_key(request))
    return await answer_outcomes(request, runtime_of(request), principal)


async def answer_outcomes(request: Request, rt: Runtime, principal: Principal | None = None) -> JSONAnswer:
    """Read, store and settle the outcomes of ``request``; the answer (see the module)."""
    started = time.perf_counter()
    body, items = await read_parsed(request, rt.settings, "an outcome object or a list of them",
                                    parse_outcome_items)
    batch = isinstance(body, list)
    if not batch and isinstance(items[0], OutcomeItemError):
        raise _invalid_item(items[0])
    raw = await run_in_threadpool(store_outcomes, rt, items, batch, True, principal)
    if not batch and "problem" in raw[0]:
        raise _invalid_item(raw[0]["problem"])
    acks = [OutcomeAckOut.model_validate(a) for a in raw]
    counts: dict[str, int] = {}
    for a in acks:
        counts[a.status] = counts.get(a.status, 0) + 1
    status = 200 if batch else _STATUS[acks[0].status]
    response = JSONAnswer({"acks": [a.model_dump() for a in acks], "counts": counts}, status_code=status)
    rt.metrics.outcome_latency.observe(time.perf_counter() - started)
    return response


def parse_telemetry(body: object, rt: Runtime) -> list[tuple[str, TelemetryIn]]:
    """Validate one report or a list: each report with its endpoint's fleet id. Raises
    ``RequestError`` naming the field (``[i].load.x``)."""
    fleet = rt.live.engine.fleet
    out = []
    for prefix, item in batch_items(body, "report"):
        report = validate_model(TelemetryIn, item, prefix)
        if report.load is None and report.healthy is None:
            raise RequestError("a report needs 'load' and/or 'healthy'", field=prefix or None)
        if report.load is not None and not report.load.model_fields_set:
            raise RequestError("the load snapshot is empty", field=json_path(("load",), prefix))
        eid = fleet.endpoint_id(report.endpoint)
        if eid is None:
            close = difflib.get_close_matches(report.endpoint, [*fleet.aliases, *fleet.endpoints], n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise RequestError(f"unknown endpoint '{report.endpoint}'{hint}", field=json_path(("endpoint",), prefix))
        out.append((eid, report))
    return out


@router.post("/v1/telemetry", response_model=TelemetryResponse, responses=ERROR_RESPONSES, tags=["gateway"],
             summary="Push load snapshots and endpoint health (one report or a list)",
             openapi_extra=json_body({"anyOf": [{"$ref": "#/components/schemas/TelemetryIn"},
                                                {"type": "array", "items": {"$ref": "#/components/schemas/TelemetryIn"}}]}))
async def telemetry(request: Request, principal: Principal = Depends(require("telemetry")),
                    rt: Runtime = Depends(get_runtime)) -> dict[str, object]:
    """Apply load snapshots (vLLM-standard field names) and health marks (a telemetry or admin key: they move every
    tenant's routing); answers each endpoint's merged reading."""
    _, reports = await read_parsed(request, rt.settings, "a telemetry report or a list of them",
                                   lambda body: parse_telemetry(body, rt))
    state = rt.live.engine.state
    fleet = state.fleet
    acks: list[dict[str, object]] = []
    for eid, r in reports:
        if r.healthy is not None:
            state.set_health(eid, r.healthy, r.reason or "")
        reading = None
        if r.load is not None:
            reading = state.push_load(eid, r.load.model_dump(exclude_unset=True))
            rt.metrics.telemetry.inc()
        info = fleet.endpoints[eid]
        acks.append({"endpoint": eid, "target": info.target, "healthy": state.is_healthy(eid),
                     "load": None if reading is None else reading.signals(state.monotonic())})
    return {"accepted": len(reports), "endpoints": acks}


__all__ = ["OUTCOMES_SCHEMA", "deliver_forwarded", "served_endpoint_id", "router", "store_outcomes",
           "usage_problem", "parse_telemetry"]
