"""The cascade through LiteLLM: draft on the deployment Pointsman decides, ask ``POST /v1/verify``,
and escalate when it says so.

``await acascade(router, client, model=..., messages=..., **kwargs)`` (``router``: a
``litellm.Router`` whose model group holds the deployments, as for ``litellm_router.attach``):

1. ``POST /v1/route`` (``PointsmanClient.aroute``); the deployment is chosen as the routing
   strategy chooses it (``pick_deployment``) and called with ``litellm.acompletion`` and the
   decision's forwarding headers: this answer is the *draft*;
2. ``POST /v1/verify`` with the draft's text, finish reason, token log-probabilities (when the
   call asked for ``logprobs``) and usage; when the decision carries ``verify_prefix_tokens`` N
   (the policy's early verification), the draft is streamed and its first N tokens (streamed
   chunks) are verified while it streams (``partial: true``, ``completion_tokens`` N): on escalate
   the draft's stream is closed (cancelled: the verify booked its N tokens, and no outcome is
   reported for it), on accept it runs to its end, which the outcome reports; a draft shorter than
   N is verified whole;
3. ``accept`` (or Pointsman unreachable: fail open, the draft stands): the draft is returned and
   its outcome reported; ``escalate``: the deployment serving the escalation target (its
   fallbacks next) is called and its answer returned; the one outcome of the decision is the
   escalated call's (``served_target``, usage, the end-to-end latency of both calls). An
   escalated call that fails returns the draft, reporting the failure. An escalation no deployment
   serves is reported ``cancelled`` under its ``escalation_id`` (releasing its hold), and the draft is
   returned, or, when it was cancelled at its prefix, the call goes through ``router.acompletion``.

Pointsman unreachable at step 1: the call goes through ``router.acompletion`` unchanged (the
attached routing strategy then fails open as usual). The caller's own ``stream`` is not cascaded
(the answer returned is whole).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence

import litellm
from litellm.types.router import DeploymentTypedDict

from pointsman.integrations.client import PointsmanClient, RouteDecision, VerifyAnswer, forward_target
from pointsman.integrations.litellm_router import (
    LiteLLMRouter,
    OutcomeReport,
    _params,
    _serves_model,
    _usage,
    deployments_of,
    pick_deployment,
    route_body,
    target_of,
)

log = logging.getLogger("pointsman.integrations")


def draft_of(response: object) -> dict[str, object]:
    """The ``draft`` of ``/v1/verify`` from a LiteLLM chat response: the first choice's text,
    finish reason and token log-probabilities (each <= 0; when the response carries them)."""
    choices = getattr(response, "choices", None) or []
    if not choices:
        return {"text": ""}
    choice = choices[0]
    message = getattr(choice, "message", None)
    text = getattr(message, "content", None) or ""
    draft: dict[str, object] = {"text": str(text)}
    finish = getattr(choice, "finish_reason", None)
    if isinstance(finish, str) and finish:
        draft["finish_reason"] = finish[:64]
    content = getattr(getattr(choice, "logprobs", None), "content", None)
    if isinstance(content, Sequence):
        values = [float(lp) for t in content if isinstance(lp := getattr(t, "logprob", None), (int, float))]
        draft["logprobs"] = [min(0.0, max(-1e4, v)) for v in values]
    return draft


async def _early(client: PointsmanClient, decision_id: str, params: dict[str, object], prefix_tokens: int,
                 drafted: str | None) -> tuple[object | None, VerifyAnswer | None]:
    """Stream the draft and verify its first ``prefix_tokens`` chunks (one token each from vLLM and
    SGLang) while it streams: ``(None, answer)`` when the answer escalates (the stream is closed), else
    ``(the whole draft as one response, answer)``; a draft that ends first is verified whole."""
    stream = await litellm.acompletion(**params, stream=True)
    chunks: list[object] = []
    text: list[str] = []
    answer: VerifyAnswer | None = None
    asked = False
    async for chunk in stream:
        chunks.append(chunk)
        choices = getattr(chunk, "choices", None) or []
        delta = getattr(getattr(choices[0], "delta", None), "content", None) if choices else None
        if delta:
            text.append(str(delta))
        if not asked and len(text) >= prefix_tokens and not (choices and getattr(choices[0], "finish_reason", None)):
            asked = True
            answer = await client.averify(decision_id, {"text": "".join(text), "partial": True},
                                          {"completion_tokens": len(text)}, drafted)
            if answer is not None and answer["action"] == "escalate":
                await stream.aclose()
                return None, answer
    draft = litellm.stream_chunk_builder(chunks, messages=params.get("messages"))  # type: ignore[arg-type]
    if not asked:
        answer = await client.averify(decision_id, draft_of(draft), _usage(draft), drafted)
    return draft, answer


def _served(deployment: DeploymentTypedDict, decision: RouteDecision) -> str | None:
    served = target_of(deployment)
    if served is None and _serves_model(deployment, decision["model"]):
        served = decision["target"]
    return served


def ok_outcome(decision_id: str, served: str | None, response: object, started_s: float) -> OutcomeReport:
    """A decision's one ``ok`` outcome: the ``served`` target, ``response``'s usage (LiteLLM's), and the
    time since ``started_s`` (``time.time()``, seconds) as its end-to-end latency in milliseconds. Used by
    the cascade here and by the proxy callback (``litellm_proxy``)."""
    out: OutcomeReport = {"decision_id": decision_id, "status": "ok", "time_s": time.time(),
                          "e2e_latency_ms": max(0.0, time.time() - started_s) * 1000.0}
    if served:
        out["served_target"] = served
    usage = _usage(response)
    if usage:
        out["usage"] = usage
    return out


def escalation_decision(answer: VerifyAnswer) -> RouteDecision:
    """The escalation as a ``RouteDecision`` (what ``pick_deployment`` reads)."""
    return {"decision_id": answer["decision_id"], "target": answer["target"] or "", "model": answer["model"] or "",
            "base_url": answer["base_url"] or "", "mode": "aggregated", "endpoints": [],
            "fallbacks": list(answer.get("fallbacks") or [])}


def unused_escalation(answer: VerifyAnswer) -> OutcomeReport:
    """The outcome of an escalation the gateway did not make (no deployment serves its target; the
    draft, settled at the verify, is the answer): ``cancelled`` under its ``escalation_id``, which
    releases the escalation's budget hold and in-flight load on any replica. The draft's own outcome
    is not reported: the verify booked it, and the replica that verified refuses it as the decision's."""
    return {"decision_id": escalation_report_id(answer), "status": "cancelled", "time_s": time.time()}


def escalation_report_id(answer: VerifyAnswer) -> str:
    """The id to report an escalated call's outcome under: the verify's signed ``escalation_id``
    (any replica settles the escalation from it; under the decision id only the replica that
    verified knows the draft was escalated, and another books nothing for the frontier call), else
    the decision id (a service without signed ids)."""
    return answer.get("escalation_id") or answer["decision_id"]


async def acascade(router: LiteLLMRouter, client: PointsmanClient, *, model: str,
                   messages: list[dict[str, object]], **kwargs: object) -> object:
    """Answer one chat call through the cascade (see the module); returns LiteLLM's response
    (the draft's or the escalated call's). Never raises for Pointsman's failures; an upstream
    failure of the draft call raises as ``litellm.acompletion`` does, and a budget refusal raises
    ``client.BudgetExhausted``."""
    deployments = deployments_of(router, model)
    decision = await client.aroute(route_body(model, messages, kwargs)) if deployments else None
    chosen = pick_deployment(deployments, decision) if decision is not None else None
    if decision is None or chosen is None:
        return await router.acompletion(model=model, messages=messages, **kwargs)  # type: ignore[attr-defined]
    call = {k: v for k, v in kwargs.items() if k not in ("metadata", "extra_headers", "stream")}
    given = kwargs.get("extra_headers")
    headers = {**(dict(given) if isinstance(given, Mapping) else {}), **forward_target(decision)[1]}
    started = time.time()
    decision_id = decision["decision_id"]
    params = {**_params(chosen), **call, "messages": messages, "extra_headers": headers}
    prefix = decision.get("verify_prefix_tokens")
    served = _served(chosen, decision)
    if prefix:
        draft, answer = await _early(client, decision_id, params, int(prefix), served)
    else:
        draft = await litellm.acompletion(**params)
        answer = await client.averify(decision_id, draft_of(draft), _usage(draft), served)
    if answer is None or answer["action"] != "escalate":
        client.report(ok_outcome(decision_id, served, draft, started))
        return draft
    escalation = escalation_decision(answer)
    frontier = pick_deployment(deployments, escalation)
    if frontier is None and draft is None:  # the draft was cancelled: nothing to keep
        log.warning("no LiteLLM deployment serves escalation target %r; the draft was cancelled",
                    escalation["target"])
        client.report(unused_escalation(answer))  # releases its hold (the router's call is a decision of its own)
        return await router.acompletion(model=model, messages=messages, **kwargs)  # type: ignore[attr-defined]
    if frontier is None:
        log.warning("no LiteLLM deployment serves escalation target %r; keeping the draft", escalation["target"])
        client.report(unused_escalation(answer))
        return draft
    served = _served(frontier, escalation) or escalation["target"]
    reported_id = escalation_report_id(answer)
    try:
        final = await litellm.acompletion(**{**_params(frontier), **call, "messages": messages,
                                             "extra_headers": {**headers, **forward_target(escalation)[1]}})
    except Exception as exc:  # noqa: BLE001 - the draft is still an answer
        failed: OutcomeReport = {"decision_id": reported_id, "status": "error", "served_target": served,
                                 "error": f"{type(exc).__name__}: {exc}"[:1000], "time_s": time.time()}
        client.report(failed)
        if draft is None:  # cancelled at its prefix: no answer to keep, the failure is the caller's
            raise
        log.warning("escalated call to %s failed (%s); keeping the draft", served, exc)
        return draft
    client.report(ok_outcome(reported_id, served, final, started))
    return final


__all__ = ["acascade", "draft_of", "escalation_decision", "escalation_report_id", "unused_escalation"]
