"""Pointsman as the routing strategy of a ``litellm.Router``, with outcomes reported back.

LiteLLM documents two extension points used here (docs.litellm.ai, "Router" → custom
routing strategy; "Custom callbacks"): a ``CustomRoutingStrategyBase`` whose
``async_get_available_deployment`` returns one element of the router's model list, set with
``router.set_custom_routing_strategy`` (LiteLLM ≥ 1.100 names it ``register_plugin``; both
are supported), and a ``CustomLogger`` whose success/failure hooks run after each call.

Usage::

    router = litellm.Router(model_list=[
        {"model_name": "chat", "litellm_params": {"model": "hosted_vllm/meta-llama/Llama-3.1-8B-Instruct",
                                                  "api_base": "http://llama-8b-0:8000/v1"},
         "model_info": {"pointsman_target": "onprem-8b", "pointsman_default": True}},
        {"model_name": "chat", "litellm_params": {"model": "openai/gpt-4o-2024-08-06"},
         "model_info": {"pointsman_target": "frontier-large"}},
    ])
    attach(router, PointsmanClient("http://127.0.0.1:8000", api_key=GATEWAY_KEY))
    await router.acompletion(model="chat", messages=[...],
                             metadata={"pointsman": {"tenant": "acme", "session_id": "s-1"}})

Per call (``PointsmanRoutingStrategy``):

1. ``POST /v1/route`` with the call's ``messages``, ``tools``, ``max_tokens``/
   ``max_completion_tokens``, ``n`` and ``user``, and ``metadata["pointsman"]`` as the ``routing``
   context (tenant, team, session_id, slo_class, prefix_block_hashes, prompt_tokens).
2. The deployment is chosen among the model group's deployments by ``pick_deployment``:
   the decision's ``target`` first, then its ``fallbacks`` in order; a deployment serves a
   target when its ``model_info.pointsman_target`` names it, or (without that key) when its
   ``litellm_params.model`` is the target's upstream model (``model`` of the decision, with
   or without a LiteLLM provider prefix such as ``openai/``). Among several deployments of a
   target, the one whose ``api_base`` is the decision's ``base_url`` wins, then one at another
   non-prefill endpoint of the decision (one LiteLLM deployment per replica gives Pointsman
   the replica pick too); otherwise the decision id spreads calls over them.
3. The decision's ``forward_headers`` go upstream (``extra_headers``): ``x-pointsman-decision-id``
   and, for a disaggregated decision, ``x-prefiller-host-port`` naming the prefill endpoint (the
   deployment is the decode endpoint, ``base_url``; its llm-d routing sidecar runs the prefill
   there: the P/D contract of ``policy/decision.py``). The decision is kept in the call's
   ``metadata["pointsman_decision"]`` for step 4.
4. ``PointsmanOutcomeLogger`` (one per process, ``OUTCOME_LOGGER``) posts the outcome after the call, in the background
   (``PointsmanClient.report``): usage (prompt, cached, completion tokens), end-to-end latency,
   TTFT and TPOT for streamed calls (LiteLLM's ``completion_start_time`` is the first chunk),
   the served target and endpoint (the deployment's ``api_base``), and status ``ok``, ``timeout`` or ``error``
   with the upstream's HTTP status (an upstream 400 then does not count against the endpoint's health in
   Pointsman's outcome breaker). Reporting never fails or
   delays the user's call.

Fall-back: when Pointsman does not answer within ``route_timeout_s`` (connection refused,
timeout, 5xx) or rejects the request as invalid (4xx), or no deployment serves the decided target or
its fallbacks, the call goes to the group's deployment marked ``model_info.pointsman_default:
true``, else the group's first deployment; a call without a decision reports no outcome. A budget
refusal (every target over the call's budget, HTTP 429) is not routed around: the call raises
``client.BudgetExhausted``.

Limits: LiteLLM asks the strategy again for each retry, and each attempt gets its own
decision (its failure is reported as an ``error`` outcome of the previous decision only if
LiteLLM logs that failure before asking again).
"""

from __future__ import annotations

import json
import logging
import time
import weakref
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol, Required, SupportsInt, TypedDict, runtime_checkable

import litellm
from litellm.integrations.custom_logger import CustomLogger
from litellm.types.router import CustomRoutingStrategyBase, DeploymentTypedDict

from pointsman.integrations.client import PointsmanClient, RouteDecision, forward_target
from pointsman.json_types import JSONObject, JSONValue
from pointsman.outcome import MAX_ENDPOINT_CHARS
from pointsman.request import RouteRequest

log = logging.getLogger("pointsman.integrations")

#: Keys of the call metadata: the routing context in, the decision out.
ROUTING_KEY = "pointsman"
DECISION_KEY = "pointsman_decision"
#: Keys of a deployment's ``model_info``.
TARGET_INFO = "pointsman_target"
DEFAULT_INFO = "pointsman_default"


# -- what Pointsman uses of LiteLLM's objects -------------------------------------------------

class LiteLLMRouter(Protocol):
    """What Pointsman uses of a ``litellm.Router`` on every supported version: a model group's
    deployments and the custom-strategy hook (LiteLLM ≥ 1.100 also has ``registry()`` and
    ``register_plugin``, used when present)."""

    def get_model_list(self, model_name: str | None = None) -> list[DeploymentTypedDict] | None: ...

    def set_custom_routing_strategy(self, strategy: CustomRoutingStrategyBase, /) -> None: ...


class _Deployments(Protocol):
    def deployments(self, model_name: str | None = None) -> list[DeploymentTypedDict] | None: ...


@runtime_checkable
class _HasRegistry(Protocol):
    """LiteLLM ≥ 1.100: ``router.registry().deployments(model)``."""

    def registry(self) -> _Deployments: ...


@runtime_checkable
class _HasRegisterPlugin(Protocol):
    """LiteLLM ≥ 1.100: ``router.register_plugin(strategy)``."""

    def register_plugin(self, plugin: CustomRoutingStrategyBase, /) -> None: ...


class UsageReport(TypedDict, total=False):
    """``usage`` of an outcome in Pointsman's keys (``pointsman/outcome.py`` ``Usage``): the cache
    writes LiteLLM reports for Anthropic calls (``cache_creation_input_tokens``, 1-hour part in
    ``prompt_tokens_details.cache_creation_token_details``) are priced at the fleet's write prices."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    cache_write_tokens: int
    cache_write_1h_tokens: int


class OutcomeReport(TypedDict, total=False):
    """The ``/v1/outcomes`` payload of one LiteLLM call (the fields of ``OutcomeIn`` it sets)."""

    decision_id: Required[str]
    time_s: float
    served_target: str
    served_model: str
    served_endpoint: str
    upstream_status: int
    e2e_latency_ms: float
    status: str
    error: str
    usage: UsageReport
    ttft_ms: float
    tpot_ms: float


@dataclass(frozen=True)
class RoutedCall:
    """The decision a LiteLLM call carries in ``metadata["pointsman_decision"]``: its ``id``, the
    ``served_target`` of the chosen deployment (None when unknown) and the routing client's ``id()``."""

    id: str
    served_target: str | None
    client: int


def _params(deployment: Mapping[str, object]) -> Mapping[str, object]:
    """A deployment's ``litellm_params`` (empty when absent)."""
    params = deployment.get("litellm_params")
    return params if isinstance(params, Mapping) else {}


def _info(deployment: Mapping[str, object]) -> Mapping[str, object]:
    """A deployment's ``model_info`` (empty when absent)."""
    info = deployment.get("model_info")
    return info if isinstance(info, Mapping) else {}


# -- choosing the deployment ------------------------------------------------------------------

def deployments_of(router: LiteLLMRouter, model: str) -> list[DeploymentTypedDict]:
    """The deployments (model-list dicts) of the model group ``model``; ``[]`` when unknown."""
    found = router.registry().deployments(model) if isinstance(router, _HasRegistry) else router.get_model_list(model_name=model)
    return list(found or [])


def all_deployments(router: LiteLLMRouter) -> list[DeploymentTypedDict]:
    """Every deployment of every model group of ``router``."""
    found = router.registry().deployments(None) if isinstance(router, _HasRegistry) else router.get_model_list()
    return list(found or [])


def target_of(deployment: Mapping[str, object]) -> str | None:
    """The Pointsman target a deployment serves: ``model_info.pointsman_target``, else None."""
    target = _info(deployment).get(TARGET_INFO)
    return None if target is None else str(target)


def _serves_model(deployment: Mapping[str, object], model: str) -> bool:
    name = str(_params(deployment).get("model", ""))
    return name == model or name.endswith("/" + model)


def pick_deployment(deployments: Sequence[DeploymentTypedDict], decision: RouteDecision) -> DeploymentTypedDict | None:
    """The deployment that serves ``decision`` (a ``RouteResponse`` dict); None if none does.

    Tries the decided target, then each fallback in order (see the module docstring for the
    mapping). Returns an element of ``deployments`` itself (LiteLLM requires that).
    """
    # where the request is sent first (base_url), then the other endpoints that serve it; never a
    # prefill endpoint (a disaggregated decision lists those first; the decode side calls them)
    served = [decision["base_url"], *(e["url"] for e in decision.get("endpoints", []) if e["role"] != "prefill")]
    choices = [(decision["target"], decision["model"], served)]
    choices += [(f["target"], f["model"], [f["base_url"]]) for f in decision.get("fallbacks", [])]
    for target, model, urls in choices:
        found = [d for d in deployments if target_of(d) == target]
        if not found:
            found = [d for d in deployments if target_of(d) is None and _serves_model(d, model)]
        if not found:
            continue
        for url in urls:
            for d in found:
                if str(_params(d).get("api_base", "")).rstrip("/") == url.rstrip("/"):
                    return d
        return found[zlib.crc32(str(decision["decision_id"]).encode()) % len(found)]
    return None


def default_deployment(deployments: Sequence[DeploymentTypedDict]) -> DeploymentTypedDict | None:
    """The fall-back deployment: the one marked ``model_info.pointsman_default``, else the first."""
    for d in deployments:
        if _info(d).get(DEFAULT_INFO):
            return d
    return deployments[0] if deployments else None


#: The call's fields ``POST /v1/route`` reads besides the messages: every field of ``RouteRequest`` (the
#: tools, the output caps, ``n``, ``user``, an audio answer's ``modalities`` and ``audio``), a Completions
#: body's ``prompt`` and ``best_of``, a Responses body's ``input``, ``instructions`` and ``max_output_tokens``,
#: an Anthropic Messages body's ``system``.
ROUTED_FIELDS = tuple(f for f in RouteRequest.model_fields if f not in ("model", "messages", "routing")) + (
    "prompt", "best_of", "input", "instructions", "max_output_tokens", "system")
#: Fields of another API's body that stand for the messages (a Completions ``prompt``, a Responses ``input``).
_PROMPT_FIELDS = ("prompt", "input")


def route_body(model: str, messages: Sequence[object] | None, request_kwargs: Mapping[str, object]) -> JSONObject:
    """The ``/v1/route`` body for one LiteLLM call: its messages (None: a text completion's ``prompt``,
    a string, a batch or token ids, or a Responses call's ``input``, read by the service as that API's
    body), the fields of
    ``ROUTED_FIELDS`` it sets, plus ``metadata["pointsman"]`` as ``routing``. Messages that are
    pydantic objects (LiteLLM ``Message``) are dumped to dicts."""
    body: JSONObject = {"model": model}
    if messages is not None or all(request_kwargs.get(k) is None for k in _PROMPT_FIELDS):
        body["messages"] = [_plain(m) for m in (messages or [])]
    for key in ROUTED_FIELDS:
        if request_kwargs.get(key) is not None and not (key in _PROMPT_FIELDS and "messages" in body):
            body[key] = _plain(request_kwargs[key])
    metadata = request_kwargs.get("metadata")
    routing = metadata.get(ROUTING_KEY) if isinstance(metadata, Mapping) else None
    if routing:
        body["routing"] = _plain(routing)
    return body


def _plain(value: object) -> JSONValue:
    """JSON-ready copy: pydantic models dumped, other unknown objects as strings."""
    if hasattr(value, "model_dump"):
        value = value.model_dump(exclude_none=True)
    plain: JSONValue = json.loads(json.dumps(value, default=str))
    return plain


class PointsmanRoutingStrategy(CustomRoutingStrategyBase):
    """LiteLLM custom routing strategy: each call's deployment is the one Pointsman decides.

    ``router``: the ``litellm.Router`` it is set on (to read the model group's deployments);
    ``client``: a ``PointsmanClient``. Returns an element of the router's model list; see the
    module docstring for the mapping and the fall-back. Never raises for Pointsman's failures; raises
    ``BudgetExhausted`` when Pointsman refuses the call for its budget.
    """

    def __init__(self, router: LiteLLMRouter, client: PointsmanClient) -> None:
        self.router = router
        self.client = client

    # LiteLLM annotates both hooks "-> None" but documents and uses their value: an element of the model list.
    async def async_get_available_deployment(  # type: ignore[override]  # LiteLLM says -> None, uses the deployment
            self, model: str, messages: list[dict[str, str]] | None = None, input: str | list[object] | None = None,
            specific_deployment: bool | None = False,
            request_kwargs: dict[str, object] | None = None) -> DeploymentTypedDict | None:
        """Ask Pointsman (async) and return the chosen deployment dict."""
        deployments, kwargs, body = self._call(model, messages, request_kwargs)
        if body is None:
            return default_deployment(deployments)
        return self._apply(await self.client.aroute(body), deployments, kwargs)

    def get_available_deployment(  # type: ignore[override]  # LiteLLM says -> None, uses the deployment
            self, model: str, messages: list[dict[str, str]] | None = None, input: str | list[object] | None = None,
            specific_deployment: bool | None = False,
            request_kwargs: dict[str, object] | None = None) -> DeploymentTypedDict | None:
        """Ask Pointsman (blocking, for ``router.completion``) and return the chosen deployment dict."""
        deployments, kwargs, body = self._call(model, messages, request_kwargs)
        if body is None:
            return default_deployment(deployments)
        return self._apply(self.client.route(body), deployments, kwargs)

    def _call(self, model: str, messages: list[dict[str, str]] | None, request_kwargs: dict[str, object] | None
              ) -> tuple[list[DeploymentTypedDict], dict[str, object], JSONObject | None]:
        """The model group's deployments, the call's kwargs (``{}`` when LiteLLM passed none) and the
        ``/v1/route`` body to ask Pointsman with (None: nothing to decide, no deployment or no messages)."""
        kwargs = request_kwargs if request_kwargs is not None else {}
        deployments = deployments_of(self.router, model)
        body = route_body(model, messages, kwargs) if deployments and messages is not None else None
        return deployments, kwargs, body

    def _apply(self, decision: RouteDecision | None, deployments: list[DeploymentTypedDict],
               kwargs: dict[str, object]) -> DeploymentTypedDict | None:
        if decision is None:
            metadata = kwargs.get("metadata")
            if isinstance(metadata, dict):
                metadata.pop(DECISION_KEY, None)  # a retry must not report against an earlier attempt's decision
            return default_deployment(deployments)
        chosen = pick_deployment(deployments, decision)
        if chosen is None:
            log.warning("no LiteLLM deployment serves pointsman target %r or its fallbacks; using the default",
                        decision["target"])
            chosen = default_deployment(deployments)
        served = target_of(chosen) if chosen else None
        if served is None and chosen is not None and _serves_model(chosen, decision["model"]):
            served = decision["target"]
        metadata = kwargs.setdefault("metadata", {})
        if isinstance(metadata, dict):
            metadata[DECISION_KEY] = {"id": decision["decision_id"], "target": decision["target"],
                                      "served_target": served, "client": id(self.client)}
        given = kwargs.get("extra_headers")
        headers: dict[str, object] = dict(given) if isinstance(given, Mapping) else {}
        headers.update(forward_target(decision)[1])  # decision id; x-prefiller-host-port when disaggregated
        kwargs["extra_headers"] = headers
        return chosen


class PointsmanOutcomeLogger(CustomLogger):
    """LiteLLM callback that reports each routed call's outcome to ``/v1/outcomes``.

    LiteLLM registers one instance per logger class and process, so one logger
    (``OUTCOME_LOGGER``) serves every attached client: a call carrying a decision
    (``metadata["pointsman_decision"]``) is reported through the client that routed it
    (looked up by id among live clients); the outcome is queued there and posted in the
    background. Latencies in ms: ``e2e_latency_ms`` = end − start; for streamed calls
    ``ttft_ms`` = first chunk − start and ``tpot_ms`` = (end − first chunk) / (completion tokens − 1).
    """

    def __init__(self) -> None:
        super().__init__()
        self.clients: weakref.WeakValueDictionary[int, PointsmanClient] = weakref.WeakValueDictionary()

    async def async_log_success_event(self, kwargs: Mapping[str, object], response_obj: object, start_time: object,
                                      end_time: object) -> None:
        """Queue an ``ok`` outcome with usage and latencies."""
        self._report(kwargs, response_obj, start_time, end_time, failed=False)

    async def async_log_failure_event(self, kwargs: Mapping[str, object], response_obj: object, start_time: object,
                                      end_time: object) -> None:
        """Queue an ``error``/``timeout`` outcome (no usage: the call's budget hold is released)."""
        self._report(kwargs, response_obj, start_time, end_time, failed=True)

    def log_success_event(self, kwargs: Mapping[str, object], response_obj: object, start_time: object,
                          end_time: object) -> None:
        """Sync calls (``router.completion``): post the outcome from LiteLLM's logging thread."""
        self._report(kwargs, response_obj, start_time, end_time, failed=False)

    def log_failure_event(self, kwargs: Mapping[str, object], response_obj: object, start_time: object,
                          end_time: object) -> None:
        """Sync calls: post the failure outcome from LiteLLM's logging thread."""
        self._report(kwargs, response_obj, start_time, end_time, failed=True)

    def _report(self, kwargs: Mapping[str, object], response_obj: object, start_time: object, end_time: object, *,
                failed: bool) -> None:
        try:
            decision = routed_call(kwargs)
            client = self.clients.get(decision.client) if decision else None
            if client is None:
                return
            outcome = outcome_from_call(kwargs, response_obj, start_time, end_time, failed=failed)
            if outcome is not None:
                client.report(outcome)
        except Exception:  # noqa: BLE001 - a reporting bug must never reach the user's call
            log.exception("could not build the pointsman outcome of a LiteLLM call")


#: The process's one outcome logger (see ``PointsmanOutcomeLogger``).
OUTCOME_LOGGER = PointsmanOutcomeLogger()


def _get(mapping: object, key: str) -> object:
    """``mapping[key]`` when ``mapping`` is a mapping holding it, else None."""
    return mapping.get(key) if isinstance(mapping, Mapping) else None


def routed_call(kwargs: Mapping[str, object]) -> RoutedCall | None:
    """The decision a LiteLLM call carries (``metadata["pointsman_decision"]``, from LiteLLM's logging
    ``kwargs``: ``litellm_params.metadata`` or ``metadata``, or ``litellm_params.litellm_metadata`` for an
    Anthropic Messages call, whose ``metadata`` is Anthropic's), or None."""
    params = kwargs.get("litellm_params")
    decision = next((d for m in (_get(params, "metadata"), kwargs.get("metadata"), _get(params, "litellm_metadata"))
                     if (d := _get(m, DECISION_KEY))), None)
    if not decision:
        return None
    decision_id, served, client = _get(decision, "id"), _get(decision, "served_target"), _get(decision, "client")
    if not isinstance(decision_id, str):
        return None
    return RoutedCall(decision_id, str(served) if served else None, client if isinstance(client, int) else 0)


def outcome_from_call(kwargs: Mapping[str, object], response_obj: object, start_time: object, end_time: object, *,
                      failed: bool) -> OutcomeReport | None:
    """The ``/v1/outcomes`` payload (an ``OutcomeIn`` dict) of one LiteLLM call, from LiteLLM's
    logging ``kwargs``; None when the call carries no Pointsman decision. ``served_target`` is the
    ``pointsman_target`` of the deployment LiteLLM logged as serving the call, else the chosen one's;
    ``served_endpoint`` its ``api_base`` (Pointsman matches it to the target's fleet endpoint by host:port;
    one the fleet does not have is stored as sent, and counts on no endpoint), ``upstream_status`` a failed
    call's exception's HTTP ``status_code``, and a stream's ``ttft_ms`` when it failed after its first token."""
    decision = routed_call(kwargs)
    if not decision:
        return None
    outcome: OutcomeReport = {"decision_id": decision.id, "time_s": _seconds(end_time) or time.time()}
    # the deployment that served the call (LiteLLM logs its model_info), which is not the one chosen when
    # LiteLLM went elsewhere (the proxy's chosen deployment cooling down): priced on what served it
    used = _get(_get(kwargs.get("litellm_params"), "model_info"), TARGET_INFO)
    served = str(used) if used else decision.served_target
    if served:
        outcome["served_target"] = served
    model = _get(kwargs.get("litellm_params"), "model") or kwargs.get("model")
    if model:
        outcome["served_model"] = str(model)[:256]
    api_base = _get(kwargs.get("litellm_params"), "api_base")
    if isinstance(api_base, str) and 0 < len(api_base) <= MAX_ENDPOINT_CHARS:
        outcome["served_endpoint"] = api_base
    e2e_s = _elapsed(start_time, end_time)
    if e2e_s is not None:
        outcome["e2e_latency_ms"] = e2e_s * 1000.0
    if failed:
        exc = kwargs.get("exception") or response_obj
        outcome["status"] = "timeout" if _is_timeout(exc) else "error"
        outcome["error"] = (f"{type(exc).__name__}: {exc}" if exc is not None else "call failed")[:1000]
        status = getattr(exc, "status_code", None)  # LiteLLM's exceptions carry the upstream's (400, 429, 503, ...)
        if isinstance(status, int) and not isinstance(status, bool) and 100 <= status <= 599:
            outcome["upstream_status"] = status
        # a stream that failed after its first token ran, and the upstream bills it: with its ttft_ms the
        # service books the estimate instead of releasing the hold
        first = kwargs.get("completion_start_time")
        ttft_s = _elapsed(start_time, first) if kwargs.get("stream") and first is not None else None
        if ttft_s is not None:
            outcome["ttft_ms"] = ttft_s * 1000.0
        return outcome
    outcome["status"] = "ok"
    usage = _usage(response_obj)
    if usage:
        outcome["usage"] = usage
    first = kwargs.get("completion_start_time")
    if kwargs.get("stream") and first is not None:
        ttft_s = _elapsed(start_time, first)
        if ttft_s is not None:
            outcome["ttft_ms"] = ttft_s * 1000.0
        decode_s = _elapsed(first, end_time)
        n_out = (usage or {}).get("completion_tokens") or 0
        if decode_s is not None and n_out > 1:
            outcome["tpot_ms"] = decode_s * 1000.0 / (n_out - 1)
    return outcome


def _usage(response_obj: object) -> UsageReport | None:
    usage = getattr(response_obj, "usage", None)
    if usage is None and isinstance(response_obj, Mapping):
        usage = response_obj.get("usage")
    if usage is None:
        return None
    get: Callable[[str], object] = usage.get if isinstance(usage, Mapping) else lambda k: getattr(usage, k, None)
    if get("prompt_tokens") is None and get("input_tokens") is not None:  # a Responses or Anthropic Messages answer
        return _input_output_usage(get)
    out: UsageReport = {}
    for key in ("prompt_tokens", "completion_tokens"):
        count = _count(get(key))
        if count is not None:
            out[key] = count
    details = get("prompt_tokens_details")
    cached = _count(details.get("cached_tokens") if isinstance(details, Mapping)
                    else getattr(details, "cached_tokens", None)) if details is not None else None
    if cached is not None:
        out["cached_tokens"] = cached
    writes = _count(get("cache_creation_input_tokens"))
    if writes:
        split = _field(details, "cache_creation_token_details")
        hour = _count(_field(split, "ephemeral_1h_input_tokens")) or 0
        out["cache_write_tokens"], out["cache_write_1h_tokens"] = max(0, writes - hour), min(hour, writes)
    return out or None


def _input_output_usage(get: Callable[[str], object]) -> UsageReport | None:
    """Pointsman's keys of a Responses usage (``input_tokens`` with its cached part in
    ``input_tokens_details``) or an Anthropic Messages one (``input_tokens`` uncached, beside
    ``cache_read_input_tokens`` and ``cache_creation_input_tokens``, 1-hour part in ``cache_creation``)."""
    prompt, completion = _count(get("input_tokens")), _count(get("output_tokens"))
    if prompt is None or completion is None:
        return None
    out: UsageReport = {"completion_tokens": completion}
    reads, writes = _count(get("cache_read_input_tokens")) or 0, _count(get("cache_creation_input_tokens")) or 0
    if reads or writes or get("cache_read_input_tokens") is not None:  # Anthropic: input_tokens is the uncached part
        hour = min(writes, _count(_field(get("cache_creation"), "ephemeral_1h_input_tokens")) or 0)
        out["prompt_tokens"], out["cached_tokens"] = prompt + reads + writes, reads
        out["cache_write_tokens"], out["cache_write_1h_tokens"] = writes - hour, hour
    else:
        out["prompt_tokens"] = prompt
        cached = _count(_field(get("input_tokens_details"), "cached_tokens"))
        if cached:
            out["cached_tokens"] = cached
    return out


def _field(obj: object, key: str) -> object:
    """``obj[key]`` of a mapping, ``obj.key`` of an object, None when absent."""
    if obj is None:
        return None
    return obj.get(key) if isinstance(obj, Mapping) else getattr(obj, key, None)


def _count(value: object) -> int | None:
    """A token count LiteLLM reported (an int, or anything ``int()`` reads), else None."""
    return int(value) if isinstance(value, (str, SupportsInt)) else None


def _is_timeout(exc: object) -> bool:
    return isinstance(exc, (litellm.Timeout, TimeoutError)) or "timeout" in type(exc).__name__.lower()


def _seconds(t: object) -> float | None:
    if isinstance(t, datetime):
        return t.timestamp()
    if isinstance(t, (int, float)):
        return float(t)
    return None


def _elapsed(start: object, end: object) -> float | None:
    a, b = _seconds(start), _seconds(end)
    return max(0.0, b - a) if a is not None and b is not None else None


def attach(router: LiteLLMRouter, client: PointsmanClient) -> PointsmanRoutingStrategy:
    """Make Pointsman route ``router`` and report its outcomes: sets a ``PointsmanRoutingStrategy``
    on the router, registers ``client`` with ``OUTCOME_LOGGER`` and adds that logger to
    ``litellm.callbacks`` once (LiteLLM's callbacks are process-wide; the logger reports only
    calls an attached client routed). Returns the strategy."""
    strategy = PointsmanRoutingStrategy(router, client)
    if isinstance(router, _HasRegisterPlugin):
        router.register_plugin(strategy)
    else:
        router.set_custom_routing_strategy(strategy)
    OUTCOME_LOGGER.clients[id(client)] = client
    if not any(cb is OUTCOME_LOGGER for cb in (litellm.callbacks or [])):
        litellm.callbacks = [*(litellm.callbacks or []), OUTCOME_LOGGER]
    return strategy
