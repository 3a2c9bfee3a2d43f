"""Pointsman in the LiteLLM Proxy: a callback module an operator enables in the proxy's ``config.yaml``.

``deploy/litellm/config.yaml`` is a complete example (the tests run the real proxy with it)::

    model_list:
      - model_name: chat
        litellm_params: {model: hosted_vllm/meta-llama/Llama-3.1-8B-Instruct, api_base: http://llama-8b-0:8000/v1}
        model_info: {id: llama-8b-0, pointsman_target: onprem-8b, pointsman_default: true}
      - model_name: chat
        litellm_params: {model: openai/gpt-4o-2024-08-06}
        model_info: {id: gpt-4o, pointsman_target: frontier-large}
    litellm_settings:
      callbacks: pointsman.integrations.litellm_proxy.handler

The proxy loads ``handler`` (a ``CustomLogger`` instance) by its dotted path (LiteLLM resolves a
module path beside the config file first, then an installed module: ``litellm/proxy/types_utils/
utils.py`` ``get_instance_fn``). Pointsman is reached at ``POINTSMAN_URL`` (default
``http://127.0.0.1:8000``) with ``POINTSMAN_API_KEY`` (a gateway key, optional) and a routing
budget of ``POINTSMAN_ROUTE_TIMEOUT_S`` seconds (default 0.25), read when the first request comes.

Per request (LiteLLM 1.110's hooks; ``litellm.integrations.custom_logger.CustomLogger``):

1. ``async_pre_call_hook`` (chat and text completions, ``/v1/responses``, ``/v1/messages``): ``POST /v1/route`` through
   ``PointsmanClient`` with the request's messages (a text completion's prompt, a batch or token ids
   too), tools, token caps, ``n``, audio output and ``metadata.pointsman`` as the routing context
   (``litellm_router.route_body``; on ``/v1/messages`` and ``/v1/responses`` that ``metadata`` is the upstream
   API's own field, of which LiteLLM 1.110 forwards only Anthropic's ``user_id`` and the Responses API's string
   values, so the context does not reach the upstream). That ``metadata`` is the client's, so the budget scopes
   come from the proxy's authentication (``budget_scopes``): the key's ``org_id`` is the ``tenant`` and its
   ``team_id`` the ``team``, whatever the client wrote; only a proxy admin (the master key) names its own. The deployment is
   the one serving the decision (``litellm_router.pick_deployment``: ``model_info.pointsman_target``
   or the upstream model, then the decision's ``base_url`` among several; the decision's fallbacks
   in order), looked for in the requested model group first and then in every group, so one group
   per tier works too. ``data["model"]`` becomes that deployment's group, the decision goes into
   ``data["metadata"]["pointsman_decision"]`` (with the deployment's ``model_info.id``; one the client wrote there
   or in ``litellm_metadata`` is dropped first, for every call: steps 2 and 3 act on it) and the
   decision's ``forward_headers`` into ``extra_headers`` (``x-pointsman-decision-id``, and
   ``x-prefiller-host-port`` for a disaggregated decision: the P/D contract of ``policy/decision.py``).
2. ``async_filter_deployments``: inside the group, only that deployment remains (when it is healthy;
   otherwise LiteLLM's own choice stands).
3. ``async_log_success_event`` / ``async_log_failure_event``: the outcome (usage, latencies, status
   ``ok``/``error``/``timeout``, the served target; ``litellm_router.outcome_from_call``) is queued
   on the client and posted to ``/v1/outcomes`` in the background. The request is decided once and
   LiteLLM's retries (``num_retries``) reuse its decision, so a failed attempt LiteLLM may retry
   (``attempted_retries`` < ``max_retries`` in its metadata, no token streamed) is held: a later
   attempt's outcome replaces it, and ``async_post_call_failure_hook`` (the request failed for good)
   reports it. Reported at once, it was the decision's one outcome and the answering retry's usage a
   409 conflict, never booked.

**The cascade** (``POINTSMAN_CASCADE=true``; the serving policy needs a ``verify`` section): for a
routed, non-streamed request the draft's success is not reported at step 3; instead
``async_post_call_success_hook`` sends the answer to ``POST /v1/verify``
(``PointsmanClient.averify``, budget ``POINTSMAN_VERIFY_TIMEOUT_S``, default 0.5 s). ``accept`` (or
no answer: fail open) keeps the answer and reports its outcome; ``escalate`` asks the deployment
serving the escalation target (``choose``; through the proxy's router, so its secrets and
``async_filter_deployments`` apply) with the request's own parameters (``max_tokens``, ``tools``,
``response_format``, ...: ``asked_params``) and returns that answer instead, reporting the decision's one
outcome as the escalated call's (``served_target``, usage, both calls' latency). A failed
escalation keeps the draft and reports the failure.

Fail-open: when Pointsman does not answer within the budget (down, slow, 5xx, or it rejects the
request as invalid) or no deployment serves its decision, the request goes to the requested group's deployment
marked ``model_info.pointsman_default: true`` (as ``litellm_router`` does), else wherever LiteLLM's
own strategy sends it, and no outcome is reported. A hook error is logged, never raised into the
user's request. A budget refusal (every target over the request's budget: ``BudgetExhausted``) is not
routed around: the proxy answers it 429.
"""

from __future__ import annotations

import logging
import os
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import TypeVar

from litellm.constants import OPENAI_CHAT_COMPLETION_PARAMS
from litellm.integrations.custom_logger import CustomLogger
from litellm.types.router import DeploymentTypedDict

from pointsman.integrations.client import (
    BudgetExhausted,
    BudgetUnavailable,
    PointsmanClient,
    RouteDecision,
    forward_target,
)
from pointsman.integrations.litellm_cascade import (
    draft_of,
    escalation_decision,
    escalation_report_id,
    ok_outcome,
    unused_escalation,
)
from pointsman.integrations.litellm_router import (
    DECISION_KEY,
    DEFAULT_INFO,
    LiteLLMRouter,
    OutcomeReport,
    _usage,
    all_deployments,
    default_deployment,
    deployments_of,
    outcome_from_call,
    pick_deployment,
    route_body,
    routed_call,
    target_of,
)
from pointsman.json_types import JSONObject

log = logging.getLogger("pointsman.integrations")

#: Call types the pre-call hook routes (LiteLLM's ``CallTypes`` values for chat and text completions, and the
#: proxy's ``/v1/responses`` and ``/v1/messages``, Anthropic's API: routed, budgeted and reported as the others).
ROUTED_CALLS = frozenset({"completion", "acompletion", "text_completion", "atext_completion", "responses",
                          "aresponses", "anthropic_messages", "aanthropic_messages"})
#: Routed call types the cascade verifies (its draft reading and escalation speak Chat Completions).
CASCADED_CALLS = frozenset({"completion", "acompletion", "text_completion", "atext_completion"})
#: Call types whose ``metadata`` is the upstream API's own field (Anthropic's, the Responses API's): LiteLLM keeps
#: the proxy's in ``litellm_metadata`` (``litellm_pre_call_utils.LITELLM_METADATA_ROUTES``).
_OWN_METADATA_CALLS = frozenset({"anthropic_messages", "aanthropic_messages", "responses", "aresponses"})


def _router() -> LiteLLMRouter | None:
    """The running proxy's ``litellm.Router`` (None outside the proxy or before it has one)."""
    try:
        from litellm.proxy import proxy_server
    except ImportError:  # the proxy's own dependencies are not installed
        return None
    router: LiteLLMRouter | None = getattr(proxy_server, "llm_router", None)
    return router


def _deployment_id(deployment: Mapping[str, object]) -> str | None:
    info = deployment.get("model_info")
    value = info.get("id") if isinstance(info, Mapping) else None
    return None if value is None else str(value)


def served_by(response: object, router: LiteLLMRouter | None) -> str | None:
    """The ``pointsman_target`` of the deployment that answered ``response`` (LiteLLM's
    ``_hidden_params["model_id"]``, looked up in ``router.model_list``); None when unknown."""
    hidden = getattr(response, "_hidden_params", None)
    model_id = hidden.get("model_id") if isinstance(hidden, Mapping) else None
    if not model_id or router is None:
        return None
    for deployment in getattr(router, "model_list", None) or ():
        if isinstance(deployment, Mapping) and _deployment_id(deployment) == str(model_id):
            return target_of(deployment)
    return None


def budget_scopes(body: JSONObject, user_api_key_dict: object) -> JSONObject:
    """``body`` (a ``/v1/route`` body) with ``routing.tenant`` and ``routing.team`` the authenticated key's
    ``org_id`` and ``team_id`` (LiteLLM's ``UserAPIKeyAuth``; left out when the key has none), not what the
    client's ``metadata.pointsman`` says: a client would otherwise name a tenant with budget left, or none.
    A proxy admin's (``user_role`` ``proxy_admin``: the master key) are kept as it wrote them."""
    role = getattr(user_api_key_dict, "user_role", None)
    if getattr(role, "value", role) == "proxy_admin":
        return body
    given = body.get("routing")
    routing: JSONObject = {k: v for k, v in given.items() if k not in ("tenant", "team")} if isinstance(given, dict) else {}
    for key, field in (("tenant", "org_id"), ("team", "team_id")):
        value = getattr(user_api_key_dict, field, None)
        if isinstance(value, str) and value:
            routing[key] = value
    out = {k: v for k, v in body.items() if k != "routing"}
    if routing:
        out["routing"] = routing
    return out


def _info_flag(deployment: Mapping[str, object]) -> bool:
    """Whether the deployment is marked ``model_info.pointsman_default``."""
    info = deployment.get("model_info")
    return bool(info.get(DEFAULT_INFO)) if isinstance(info, Mapping) else False


class PointsmanProxyHandler(CustomLogger):
    """The proxy callback (see the module). ``PointsmanProxyHandler(client=None)``: ``client`` is
    built from the ``POINTSMAN_*`` environment on first use when not given."""

    def __init__(self, client: PointsmanClient | None = None, cascade: bool | None = None) -> None:
        super().__init__()
        self._client = client
        self._cascade = cascade
        #: failed attempts LiteLLM may retry, by decision id (step 3), and decisions whose request failed for good
        #: (True: its outcome was reported); each at most ``MAX_HELD``, the oldest out first
        self._held: OrderedDict[str, OutcomeReport] = OrderedDict()
        self._given_up: OrderedDict[str, bool] = OrderedDict()

    @property
    def cascade(self) -> bool:
        """Whether the cascade runs (``POINTSMAN_CASCADE``, read on first use, unless given)."""
        if self._cascade is None:
            self._cascade = os.environ.get("POINTSMAN_CASCADE", "").strip().lower() in ("1", "true", "yes", "on")
        return self._cascade

    @property
    def client(self) -> PointsmanClient:
        """The ``PointsmanClient`` (built from the environment on first use)."""
        if self._client is None:
            self._client = PointsmanClient(os.environ.get("POINTSMAN_URL", "http://127.0.0.1:8000"),
                                           api_key=os.environ.get("POINTSMAN_API_KEY") or None,
                                           route_timeout_s=float(os.environ.get("POINTSMAN_ROUTE_TIMEOUT_S", "0.25")),
                                           verify_timeout_s=float(os.environ.get("POINTSMAN_VERIFY_TIMEOUT_S", "0.5")))
        return self._client

    def choose(self, decision: RouteDecision, group: str, router: LiteLLMRouter) -> DeploymentTypedDict | None:
        """The deployment serving ``decision``: in the requested ``group`` first, then in every group."""
        chosen = pick_deployment(deployments_of(router, group), decision)
        return chosen if chosen is not None else pick_deployment(all_deployments(router), decision)

    async def async_pre_call_hook(self, user_api_key_dict: object, cache: object, data: dict[str, object],
                                  call_type: str) -> dict[str, object]:
        """Decide and rewrite ``data`` (step 1 of the module); returns ``data``. A ``pointsman_decision`` the
        client wrote in its ``metadata`` or ``litellm_metadata`` is dropped first, whatever the call: the later steps
        act on that key (the deployment kept, the decision id reported and verified under), and only this hook
        writes it."""
        for key in ("metadata", "litellm_metadata"):
            given = data.get(key)
            if isinstance(given, dict):
                given.pop(DECISION_KEY, None)  # in place: LiteLLM's logging holds the same dict
        try:
            await self._route(data, call_type, user_api_key_dict)
        except BudgetExhausted as exc:  # a refusal, not a failure: served elsewhere it would spend past the budget
            from fastapi import HTTPException

            if isinstance(exc, BudgetUnavailable):  # the budget cannot be checked now: retry later
                raise HTTPException(status_code=503, detail=str(exc)) from None
            raise HTTPException(status_code=429, detail=f"budget exhausted: {exc}") from None
        except Exception:  # noqa: BLE001 - a routing bug must never fail the user's request
            log.exception("pointsman pre-call hook failed; the request goes on without it")
        return data

    async def _route(self, data: dict[str, object], call_type: str, user_api_key_dict: object) -> None:
        group = data.get("model")
        router = _router()
        if call_type not in ROUTED_CALLS or not isinstance(group, str) or router is None:
            return
        messages = data.get("messages")  # None for a text completion or a Responses call: route_body sends its prompt
        if not isinstance(messages, list) and (messages is not None or data.get("prompt", data.get("input")) is None):
            return
        decision = await self.client.aroute(budget_scopes(route_body(group, messages, data), user_api_key_dict))
        chosen = None if decision is None else self.choose(decision, group, router)
        if decision is not None and chosen is None:
            log.warning("no LiteLLM deployment serves pointsman target %r or its fallbacks; routing without it",
                        decision["target"])
        key = "litellm_metadata" if call_type in _OWN_METADATA_CALLS else "metadata"
        metadata = data.get(key)
        if not isinstance(metadata, dict):
            metadata = data[key] = {}
        if decision is None or chosen is None:  # fail open: the group's pointsman_default, else LiteLLM's own pick
            metadata.pop(DECISION_KEY, None)
            fallback = default_deployment(deployments_of(router, group))
            if fallback is not None and _info_flag(fallback):
                metadata[DECISION_KEY] = {"deployment": _deployment_id(fallback)}
            return
        data["model"] = chosen["model_name"]
        served = target_of(chosen) or decision["target"]
        metadata[DECISION_KEY] = {"id": decision["decision_id"], "target": decision["target"],
                                  "served_target": served, "client": id(self.client),
                                  "deployment": _deployment_id(chosen),
                                  "cascade": self.cascade and not data.get("stream") and call_type in CASCADED_CALLS,
                                  "group": group,
                                  "started_s": time.time()}
        given = data.get("extra_headers")
        headers: dict[str, object] = dict(given) if isinstance(given, Mapping) else {}
        headers.update(forward_target(decision)[1])
        data["extra_headers"] = headers

    async def async_filter_deployments(self, model: str, healthy_deployments: list[dict[str, object]],
                                       messages: Sequence[object] | None, request_kwargs: dict[str, object] | None = None,
                                       parent_otel_span: object | None = None) -> list[dict[str, object]]:
        """Keep only the deployment Pointsman chose (step 2); the list unchanged without one."""
        kwargs = request_kwargs or {}
        decision = next((m[DECISION_KEY] for m in (kwargs.get("metadata"), kwargs.get("litellm_metadata"))
                         if isinstance(m, Mapping) and DECISION_KEY in m), None)
        wanted = decision.get("deployment") if isinstance(decision, Mapping) else None
        if not wanted:
            return healthy_deployments
        kept = [d for d in healthy_deployments if _deployment_id(d) == wanted]
        return kept or healthy_deployments

    async def async_log_success_event(self, kwargs: Mapping[str, object], response_obj: object, start_time: object,
                                      end_time: object) -> None:
        """Report an ``ok`` outcome with usage and latencies (step 3)."""
        self._report(kwargs, response_obj, start_time, end_time, failed=False)

    async def async_log_failure_event(self, kwargs: Mapping[str, object], response_obj: object, start_time: object,
                                      end_time: object) -> None:
        """Report an ``error``/``timeout`` outcome (step 3; no usage: the budget hold is released)."""
        self._report(kwargs, response_obj, start_time, end_time, failed=True)

    async def async_post_call_failure_hook(self, request_data: dict[str, object], original_exception: Exception,
                                           user_api_key_dict: object, traceback_str: str | None = None) -> None:
        """The request failed for good (LiteLLM retried what it would): report its held failure (step 3)."""
        try:
            call = routed_call({"metadata": request_data.get("metadata"),
                                "litellm_params": {"litellm_metadata": request_data.get("litellm_metadata")}})
            if call is None or call.client != id(self.client):
                return
            held = self._held.pop(call.id, None)
            if held is not None:
                self.client.report(held)
            _remember(self._given_up, call.id, held is not None)
        except Exception:  # noqa: BLE001 - reporting must never reach the user's request
            log.exception("could not report the pointsman outcome of a failed LiteLLM proxy request")

    async def async_post_call_success_hook(self, data: dict[str, object], user_api_key_dict: object,
                                           response: object) -> object | None:
        """The cascade (see the module): the answer to return instead of ``response``, or None to keep it."""
        metadata = data.get("metadata")
        decision = metadata.get(DECISION_KEY) if isinstance(metadata, Mapping) else None
        if not isinstance(decision, Mapping) or not decision.get("cascade") or not isinstance(decision.get("id"), str):
            return None
        begun = decision.get("started_s")
        started = float(begun) if isinstance(begun, (int, float)) else time.time()
        try:
            return await self._cascade_step(decision, data, response, started)
        except Exception:  # noqa: BLE001 - the draft stands; a cascade bug must never fail the request
            log.exception("pointsman cascade failed; the draft stands")
            self.client.report(ok_outcome(str(decision["id"]), str(decision.get("served_target") or ""), response, started))
            return None

    async def _cascade_step(self, decision: Mapping[str, object], data: dict[str, object], response: object,
                            started: float) -> object | None:
        draft_served = str(decision.get("served_target") or "")
        router = _router()
        served = served_by(response, router)
        if served is not None and served != draft_served:
            # LiteLLM's own pick answered (the chosen deployment cooling down): no draft of the decision's
            # target to verify, and its outcome is priced where it ran
            self.client.report(ok_outcome(str(decision["id"]), served, response, started))
            return None
        answer = await self.client.averify(str(decision["id"]), draft_of(response), _usage(response), draft_served or None)
        if answer is None or answer["action"] != "escalate":
            self.client.report(ok_outcome(str(decision["id"]), draft_served, response, started))
            return None
        escalation = escalation_decision(answer)
        frontier = self.choose(escalation, str(decision.get("group") or data.get("model") or ""), router) \
            if router is not None else None
        if frontier is None or router is None:
            log.warning("no LiteLLM deployment serves escalation target %r; the draft stands", escalation["target"])
            self.client.report(unused_escalation(answer))
            return None
        served = target_of(frontier) or escalation["target"]
        reported_id = escalation_report_id(answer)
        headers = forward_target(escalation)[1]
        try:
            final = await router.acompletion(  # type: ignore[attr-defined]  # litellm.Router's call
                model=frontier["model_name"], messages=data.get("messages"), extra_headers=headers,
                metadata={DECISION_KEY: {"deployment": _deployment_id(frontier)}}, **asked_params(data))
        except Exception as exc:  # noqa: BLE001 - the draft is still an answer
            log.warning("escalated call to %s failed (%s); the draft stands", served, exc)
            self.client.report({"decision_id": reported_id, "status": "error", "served_target": served,
                                "error": f"{type(exc).__name__}: {exc}"[:1000], "time_s": time.time()})
            return None
        self.client.report(ok_outcome(reported_id, served, final, started))
        return final

    def _report(self, kwargs: Mapping[str, object], response_obj: object, start_time: object, end_time: object, *,
                failed: bool) -> None:
        try:
            call = routed_call(kwargs)
            if call is None or call.client != id(self.client):
                return
            if not failed and _cascaded(kwargs):
                return  # the cascade's post-call hook reports this decision's one outcome
            outcome = outcome_from_call(kwargs, response_obj, start_time, end_time, failed=failed)
            if outcome is None or self._given_up.get(call.id):
                return
            self._held.pop(call.id, None)
            if failed and call.id not in self._given_up and "ttft_ms" not in outcome and _retry_may_follow(kwargs):
                if (oldest := _remember(self._held, call.id, outcome)) is not None:
                    self.client.report(oldest)
                return
            self.client.report(outcome)
        except Exception:  # noqa: BLE001 - reporting must never reach the user's request
            log.exception("could not report the pointsman outcome of a LiteLLM proxy call")


_V = TypeVar("_V")
#: Most decisions ``PointsmanProxyHandler`` keeps held failures (and failed requests) of.
MAX_HELD = 10_000


def _remember(kept: OrderedDict[str, _V], key: str, value: _V) -> _V | None:
    """Put ``key`` in ``kept`` (at most ``MAX_HELD``); returns the value of the oldest entry it pushed out."""
    kept[key] = value
    return kept.popitem(last=False)[1] if len(kept) > MAX_HELD else None


def _retry_may_follow(kwargs: Mapping[str, object]) -> bool:
    """Whether LiteLLM may retry the failed attempt ``kwargs`` logs: its metadata's ``attempted_retries`` is below
    ``max_retries`` (the router's ``num_retries``)."""
    params = kwargs.get("litellm_params")
    for key in ("metadata", "litellm_metadata"):
        metadata = params.get(key) if isinstance(params, Mapping) else None
        if isinstance(metadata, Mapping) and DECISION_KEY in metadata:
            attempted, most = metadata.get("attempted_retries"), metadata.get("max_retries")
            return isinstance(attempted, int) and isinstance(most, int) and attempted < most
    return False


#: Request parameters that say where and how a call is sent, not what it asks for: the escalated call
#: takes its own from its deployment.
_TRANSPORT_PARAMS = frozenset({"stream", "stream_options", "extra_headers", "api_base", "api_version", "api_key",
                               "deployment_id", "organization", "base_url", "default_headers", "request_timeout",
                               "timeout", "max_retries"})


def asked_params(data: Mapping[str, object]) -> dict[str, object]:
    """The OpenAI chat parameters of the caller's request (``max_tokens``, ``temperature``, ``tools``,
    ``response_format``, ...: LiteLLM's ``OPENAI_CHAT_COMPLETION_PARAMS``, less transport settings) that an
    escalated call must keep: the frontier answers the same request the draft did, within the same output
    cap the decision's estimate assumed."""
    return {k: data[k] for k in OPENAI_CHAT_COMPLETION_PARAMS if k in data and k not in _TRANSPORT_PARAMS}


def _cascaded(kwargs: Mapping[str, object]) -> bool:
    """Whether a logged call is a cascade draft (its decision says ``cascade``)."""
    params = kwargs.get("litellm_params")
    metadata = (params.get("metadata") if isinstance(params, Mapping) else None) or kwargs.get("metadata")
    decision = metadata.get(DECISION_KEY) if isinstance(metadata, Mapping) else None
    return isinstance(decision, Mapping) and bool(decision.get("cascade"))


#: The instance ``litellm_settings.callbacks`` names: ``pointsman.integrations.litellm_proxy.handler``.
handler = PointsmanProxyHandler()
