"""The endpoint picker: Pointsman answering Envoy's ext_proc stream (Gateway API Inference Extension).

``pointsman serve --ext-proc-port N`` (or ``POINTSMAN_EXT_PROC_PORT``) starts, in the service's
process and event loop, a gRPC server (``grpc.aio``) with ``envoy.service.ext_proc.v3.
ExternalProcessor`` and the gRPC health service (``grpc.health.v1.Health``: services ``""``,
``liveness``, ``readiness`` and ``envoy.service.ext_proc.v3.ExternalProcessor``, SERVING while
the service runs, NOT_SERVING once it stops). It decides with the same engine and live state as
``POST /v1/route`` (``rt.live.engine``, read once per request) and records each outcome the way
``POST /v1/outcomes`` does (``routes_reports.store_outcomes``: the outcome log, budget settlement,
load release), so the gateway posts nothing. Protocol: GIE's endpoint picker protocol
(``docs/proposals/004-endpoint-picker-protocol``) and the reference picker's message flow
(GAIE ``pkg/epp/handlers``); the wire is ``ext_proc_wire.py``, the bodies ``ext_proc_body.py``.

One HTTP request = one gRPC stream. Body modes come from the filter's ``protocol_config`` (first
message); without one, FULL_DUPLEX_STREAMED (GIE's configuration) is assumed.

Request phase:

1. ``request_headers``: kept (routing context from ``x-pointsman-tenant``, ``-team``,
   ``-session-id``, ``-slo-class``; GIE's ``x-gateway-inference-objective`` is the SLO class and
   ``x-gateway-inference-fairness-id`` the tenant when those are absent; an objective that is no
   SLO class of the fleet is ignored with a warning logged once, an unknown ``x-pointsman-slo-class``
   is a **400**: ``routing_context``). A request without a
   body (``end_of_stream``: ``GET /v1/models``) passes through undecided. In BUFFERED mode the
   headers are answered at once (Envoy waits for it); in FULL_DUPLEX_STREAMED nothing is sent yet.
2. ``request_body`` chunks, collected up to ``POINTSMAN_MAX_BODY_BYTES`` (8 MiB by default, the
   ``/v1/route`` limit): past it the client gets **413**. At the end of the body: JSON (**400**
   when malformed, as ``/v1/route``'s 400s; a Completions body's ``prompt`` counts as one user
   message, a prompt of token ids as exactly its ids), ``RoutingEngine.route`` restricted to the
   proxy's subset hint (its ``ip:port`` / ``ip`` entries matched to fleet endpoint URLs; endpoints
   it does not name are unavailable, none left is a **503**), then the answer: request headers ``x-gateway-destination-endpoint``
   = the ordered ``host:port`` list (the picked endpoint, then its fallback endpoints, at most
   ``POINTSMAN_EXT_PROC_DESTINATIONS``; never a prefill endpoint) and the same value in
   ``dynamic_metadata["envoy.lb"]["x-gateway-destination-endpoint"]``, ``x-pointsman-decision-id``,
   ``x-pointsman-target`` and the P/D contract's ``x-prefiller-host-port`` for a disaggregated
   decision (a client-sent one is removed otherwise; ``policy/decision.py``), with
   ``clear_route_cache``. When the decision's upstream model differs from the body's ``model``
   (or the body carries Pointsman's ``routing`` object) the body is rewritten
   (``ext_proc_body.rewrite_request``), ``x-gateway-model-name`` set to the new model and
   ``content-length`` to the new length. FULL_DUPLEX_STREAMED: the headers response, then the
   body in chunks of at most 62,000 bytes; BUFFERED: one body response carrying it all.
   Refusals are immediate responses with an OpenAI-shaped JSON error: **503** nothing eligible
   (or the budget ledger down, or the service stopping), **429** when every candidate was refused
   by its budget (the request is shed), **400** a bad request, **413** too large. A refusal sent
   before the request body ended (413) is followed by reading and dropping the rest of the body
   (up to ``bodies.DISCARD_LIMIT_BYTES``, within ``POINTSMAN_BODY_READ_TIMEOUT_S``) before the stream
   ends, so a sender still writing its chunks reads the 413 instead of a failed write (``INTERNAL``);
   nothing past the limit is kept.

Message order: a request body or trailers before the request headers, or a second set of request
headers, is not Envoy's protocol: the stream ends ``INVALID_ARGUMENT`` naming the order, and
nothing is decided (the proxy applies its ``failure_mode_allow``).

Response phase: ``response_headers`` (``:status``; ``content-type: text/event-stream`` means an SSE
stream) get ``x-pointsman-decision-id`` added; each ``response_body`` chunk is passed back as it
came (FULL_DUPLEX_STREAMED: echoed as a streamed response; other modes: continued unchanged) and
read for usage (``ext_proc_body.UsageReader``); the served endpoint is read from
``metadata_context["envoy.lb"]["x-gateway-destination-endpoint-served"]``. At the end of the
response body the outcome is recorded in the background: status ``ok`` (2xx) or ``error``
(``upstream HTTP <status>``), usage, the serving target (the served endpoint's), the model that
answered, ``ttft_ms`` (request headers to first response byte; not for an ``error``, whose body
is no answer), ``e2e_latency_ms`` and ``tpot_ms``; outcomes the service answers 503 (the outcome log cannot
be written, the ledger takes no settlement) are tried again every ``STORE_RETRY_S``, since no gateway retries them,
and the outcome log keeps each one stored as unsettled until it is settled (``store_outcomes(unsettled=True)``), so
one stored by a process killed before settling it is settled when the service starts again.
A stream that ends before the response body did
(the client went away) is recorded as ``cancelled``: its budget hold is
released, or its estimate booked when its answer had started (``ttft_ms``); so is one that ends while its
decision was being made (the decision, dispatched meanwhile, is logged and released once made).

How a stream ends says nothing of the response (Envoy's ``ext_proc.cc``): Envoy closes it when the HTTP
request ends, completed or reset by its client alike (``onDestroy``), and, when the filter processes no part
of the response, once our last request-phase answer arrives (Envoy 1.37+) or at the response headers; by
default with a half-close at once followed by a reset (read here as a cancellation), with
``envoy.reloadable_features.ext_proc_graceful_grpc_close`` (Envoy 1.34+) with a half-close alone. What tells
are the response messages and ``protocol_config.response_body_mode`` (the filter's ``response_header_mode``
is not sent): with ``response_body_mode`` NONE the response headers are the response, recorded (no usage:
the estimate booked) when the stream ends; a stream ending with none (``response_header_mode: SKIP``, or the
client gone before the upstream answered) records nothing (``_Stream.end``): the gateway reports its outcome
(``POST /v1/outcomes``), else its hold and in-flight load lapse after the budgets' ``reservation_ttl_s``
(600 s by default). A stream that carried no
usage (OpenAI streams none without ``stream_options.include_usage``) books its estimate, or, when it
streamed more text deltas than the estimate's output tokens, that count (a lower bound:
``UsageReader.streamed_tokens``) with the prompt the decision counted; usage counting fewer output tokens
than the deltas streamed in a stream that never completed (read before its end) books the deltas' count.

Not supported: STREAMED and BUFFERED_PARTIAL request body modes (each chunk must be answered before
the next arrives, so the headers could not carry the decision): such a stream is answered **500**
naming the setting. Requests with a body to an API that is no generation (``:path`` ``/v1/embeddings``,
``/v1/audio/...``, ``/v1/images/...``, ``rerank``, ``tokenize``, ...: ``not_generation``) are answered **400**
``not_a_generation_request`` rather than read as a chat request and sent to a chat model; route them around
the filter.

Authentication: with API keys configured (``POINTSMAN_GATEWAY_API_KEYS``, ``..._ADMIN_API_KEYS`` or their
files), a stream must carry a gateway or admin key in its gRPC metadata, ``authorization: Bearer <key>``
or ``x-api-key: <key>`` (Envoy: the ext_proc filter's ``grpc_service.initial_metadata``); without one,
or with an unknown one, it ends UNAUTHENTICATED before any message is read, and the proxy applies its
``failure_mode_allow``. ``POINTSMAN_EXT_PROC_REQUIRE_KEY=false`` turns this off for the picker port alone
(a Gateway API ``InferencePool`` cannot send metadata; the network must then keep others out). The
key's name is the decision's ``api_key_id`` (its ``key:<name>`` budget scope), as over HTTP; a bearer
token wins over ``x-api-key``, as over HTTP. The port binds ``POINTSMAN_EXT_PROC_HOST`` (default the HTTP host).

Counted in ``pointsman_ext_proc_requests_total{result}`` (``routed``, ``passthrough``,
``bad_request``, ``too_large``, ``shed``, ``unavailable``, ``unsupported``, ``unauthenticated``,
``protocol_error``); decisions and their
latency (body complete to answer) in the same metrics as ``/v1/route``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Collection, Iterable
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio  # type: ignore[attr-defined]  # stubs predate the asyncio servicer
from pydantic import ValidationError

from pointsman.errors import DataError, RequestError
from pointsman.json_types import JSONObject, JSONValue
from pointsman.outcome import OutcomeIn
from pointsman.policy.budget.ledger import LedgerUnavailable
from pointsman.policy.decision import DECISION_HEADER, PREFILLER_HEADER, Decision, host_port
from pointsman.policy.engine import RoutingEngine
from pointsman.policy.fleet import Fleet
from pointsman.policy.selection.filters import NoEligibleTarget
from pointsman.request import RouteRequest, parse_route_request
from pointsman.service import ext_proc_wire as wire
from pointsman.service.auth import Principal
from pointsman.service.bodies import DISCARD_LIMIT_BYTES, decode_json
from pointsman.service.endpoint_index import endpoint_index
from pointsman.service.ext_proc_body import BodyBuffer, UsageReader, chat_request, rewrite_request, with_completions_routing
from pointsman.service.http_errors import HTTPError, invalid, unavailable
from pointsman.service.keys import KeySource
from pointsman.service.routes_decisions import commit_decision, route_async
from pointsman.service.routes_reports import store_outcomes, usage_problem
from pointsman.service.runtime import Runtime
from pointsman.service.settings import Settings

log = logging.getLogger("pointsman.service.ext_proc")

SERVICE_NAME = "envoy.service.ext_proc.v3.ExternalProcessor"
HEALTH_SERVICES = ("", "liveness", "readiness", SERVICE_NAME)
TARGET_HEADER = "x-pointsman-target"
MODEL_NAME_HEADER = "x-gateway-model-name"
#: Routing context from request headers (header -> ``routing`` field); the GIE ones fill what is absent.
ROUTING_HEADERS = {"x-pointsman-tenant": "tenant", "x-pointsman-team": "team",
                   "x-pointsman-session-id": "session_id", "x-pointsman-slo-class": "slo_class"}
#: GIE's objective header (an InferenceObjective name), read as the SLO class when it names one.
OBJECTIVE_HEADER = "x-gateway-inference-objective"
GIE_ROUTING_HEADERS = {"x-gateway-inference-fairness-id": "tenant", OBJECTIVE_HEADER: "slo_class"}
_GIE_DEFAULT_FLOW = "default-flow"
_MAX_WARNED = 64
_warned_objectives: set[str] = set()
_DEFAULT_MODE: wire.BodyMode = "FULL_DUPLEX_STREAMED"
#: Last path segments of APIs whose requests are no generation (OpenAI's and vLLM's), and the segments before
#: such a last one (``/v1/audio/speech``, ``/v1/images/generations``): their bodies read as a chat request
#: (an embeddings body's ``input`` as a Responses one) and ``model`` would be rewritten to a chat model's.
NOT_GENERATION_ENDPOINTS = frozenset({"embeddings", "moderations", "rerank", "score", "tokenize", "detokenize",
                                      "pooling", "classify"})
NOT_GENERATION_PARENTS = frozenset({"audio", "images"})
#: Seconds between tries of outcomes the service answered 503 (outcome log or ledger unavailable).
STORE_RETRY_S = 1.0
#: Room in one gRPC message beside its body (headers, metadata, framing), bytes.
MESSAGE_OVERHEAD_BYTES = 1 << 20


def destinations(decision: Decision, limit: int | None) -> list[str]:
    """The ordered ``host:port`` list of a decision (picked endpoint first, its fallback endpoints
    after; prefill endpoints left out: the decode side calls them), at most ``limit`` entries."""
    out: list[str] = []
    for e in decision.endpoints:
        if e.role == "prefill":
            continue
        hp = host_port(e.url)
        if hp not in out:
            out.append(hp)
    return out if limit is None else out[:limit]


def max_message_bytes(settings: Settings) -> int:
    """The largest gRPC message the picker takes (bytes): Envoy's BUFFERED mode sends a whole body in one
    message, so one up to ``POINTSMAN_MAX_BODY_BYTES`` must be decided and one up to the 413's discard limit
    (``bodies.DISCARD_LIMIT_BYTES``, as over HTTP) answered 413, not refused by grpc's 4 MiB default;
    ``MESSAGE_OVERHEAD_BYTES`` more for the message's headers and metadata."""
    return max(settings.max_body_bytes, DISCARD_LIMIT_BYTES) + MESSAGE_OVERHEAD_BYTES


def not_generation(path: str) -> bool:
    """Whether the request path ``path`` (``:path``, a query string allowed) names an API that is no generation
    request (``NOT_GENERATION_ENDPOINTS``, ``NOT_GENERATION_PARENTS``): the picker refuses those (400)."""
    parts = [p for p in path.split("?", 1)[0].split("/") if p]
    return bool(parts) and (parts[-1] in NOT_GENERATION_ENDPOINTS
                            or (len(parts) >= 2 and parts[-2] in NOT_GENERATION_PARENTS))


def _is_text(value: str) -> bool:
    """Whether ``value`` is valid Unicode text (no lone surrogate, which JSON's ``\\ud800`` escape decodes to)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _error_body(exc: HTTPError) -> bytes:
    return json.dumps(exc.body()).encode()


def _warn_unknown_objective(objective: str, slo_classes: Collection[str]) -> None:
    """Log once per name (at most ``_MAX_WARNED`` names per process) that a GIE objective is no SLO class."""
    if objective in _warned_objectives or len(_warned_objectives) >= _MAX_WARNED:
        return
    _warned_objectives.add(objective)
    log.warning("%s '%s' is not an SLO class of the fleet (%s): such requests get the fleet's default class",
                OBJECTIVE_HEADER, objective, ", ".join(slo_classes))


def routing_context(body: JSONObject, headers: dict[str, str], slo_classes: Collection[str] = ()) -> JSONObject:
    """The body with its ``routing`` context taken from the request headers only (``ROUTING_HEADERS``,
    then ``GIE_ROUTING_HEADERS`` for what is still absent). GIE's objective header names an
    InferenceObjective of the cluster, not necessarily one of the fleet's ``slo_classes``: one that is
    not is left out (the request gets the fleet's default class, as GIE gives an unknown objective the
    default priority) and logged once per name; ``x-pointsman-slo-class`` is ours and is checked by the
    engine (an unknown class is a 400). Behind a proxy the body is the end client's:
    a ``routing`` object in it (a tenant, a team, a token count of the client's choosing) is dropped, so a
    client cannot pick the budget it spends or shrink the token count the context-window filter reads."""
    routing: JSONObject = {}
    for table in (ROUTING_HEADERS, GIE_ROUTING_HEADERS):
        for header, key in table.items():
            value = headers.get(header)
            if not value or key in routing or (header == "x-gateway-inference-fairness-id" and value == _GIE_DEFAULT_FLOW):
                continue
            if header == OBJECTIVE_HEADER and value not in slo_classes:
                _warn_unknown_objective(value, slo_classes)
                continue
            routing[key] = value
    rest = {k: v for k, v in body.items() if k != "routing"}
    return {**rest, "routing": routing} if routing else rest


class ProtocolError(Exception):
    """Messages out of Envoy's order (a request body before the request headers): the stream ends
    ``INVALID_ARGUMENT`` with this message."""


@dataclass(frozen=True)
class Answer:
    """What the request phase sends: ``responses`` (protobuf messages, in order) and whether the
    stream is ``final`` (an immediate response ends it)."""

    responses: list[object]
    final: bool = False


class _Stream:
    """One HTTP request's ext_proc exchange (see the module)."""

    def __init__(self, server: ExtProcServer, api_key_id: str | None = None) -> None:
        self.server = server
        self.rt = server.rt
        self.api_key_id = api_key_id
        self.t0 = time.perf_counter()
        self.headers: dict[str, str] = {}
        self.request_mode: wire.BodyMode = _DEFAULT_MODE
        self.response_mode: wire.BodyMode = _DEFAULT_MODE
        self.modes_read = False
        self.subset: tuple[str, ...] | None = None
        self.body = BodyBuffer(self.rt.settings.max_body_bytes)
        self.decided = False
        self.headers_seen = False
        self.request_ended = False  # the request's body (or headers without one) or trailers arrived
        self.decision: Decision | None = None
        self.served: str | None = None
        self.status: int | None = None
        self.reader: UsageReader | None = None
        self.t_first: float | None = None
        self.recorded = False

    # -- request phase -------------------------------------------------------------------------------

    def _refuse(self, exc: HTTPError, result: str) -> Answer:
        self.decided = True
        self.server.count(result)
        if exc.code:
            self.rt.metrics.decision_errors.labels(exc.code).inc()
        return Answer([wire.immediate_response(exc.status, _error_body(exc), {"content-type": "application/json"},
                                               details=f"pointsman_{exc.code or exc.status}")], final=True)

    async def handle(self, msg: wire.Message) -> Answer:
        """The responses to one message (see the module for each kind)."""
        if msg.subset is not None and self.subset is None:
            self.subset = msg.subset
        if msg.served:
            self.served = msg.served
        if not self.modes_read and msg.request_body_mode is not None:
            self.request_mode, self.response_mode = msg.request_body_mode, msg.response_body_mode or _DEFAULT_MODE
        self.modes_read = True
        kind = msg.kind
        if kind in ("request_headers", "request_body", "request_trailers"):
            if self.headers_seen == (kind == "request_headers"):
                raise ProtocolError(f"{kind} {'again after' if self.headers_seen else 'before'} request_headers: "
                                    "not Envoy's ext_proc message order")
            self.request_ended = self.request_ended or msg.end_of_stream or kind == "request_trailers"
        if kind == "request_headers":
            self.headers_seen = True
            return self._request_headers(msg)
        if kind == "request_body":
            if self.decided:
                return Answer([])
            if not self.body.add(msg.body):
                limit = self.body.limit_bytes
                return self._refuse(HTTPError(413, f"request body is larger than {limit} bytes (POINTSMAN_MAX_BODY_BYTES)",
                                              type="request_too_large", param="max_body_bytes", code="body_too_large"),
                                    "too_large")
            return await self._decide(body_ends=True) if msg.end_of_stream else Answer([])
        if kind == "request_trailers":
            out = [] if self.decided else (await self._decide(body_ends=False)).responses
            return Answer([*out, wire.trailers_response("request")])
        if kind == "response_headers":
            return Answer([self._response_headers(msg)])
        if kind == "response_body":
            return Answer(self._response_body(msg))
        if kind == "response_trailers":
            self.finish()
            return Answer([wire.trailers_response("response")])
        return Answer([])

    def _request_headers(self, msg: wire.Message) -> Answer:
        self.headers = msg.headers
        if self.request_mode not in ("FULL_DUPLEX_STREAMED", "BUFFERED", "NONE"):
            return self._refuse(HTTPError(500, f"the ext_proc filter's request_body_mode is {self.request_mode}; "
                                          "Pointsman needs FULL_DUPLEX_STREAMED or BUFFERED", type="internal_error",
                                          code="unsupported_body_mode"), "unsupported")
        if msg.end_of_stream or self.request_mode == "NONE":  # nothing to decide on: pass through
            self.decided = True
            self.server.count("passthrough")
            return Answer([wire.headers_response("request")])
        if not_generation(path := msg.headers.get(":path", "")):
            return self._refuse(HTTPError(400, f"{path[:200]} is no generation request (chat completions, completions, "
                                          "messages, responses), the only requests the picker decides: route it "
                                          "around the ext_proc filter", param=":path", code="not_a_generation_request"),
                                "bad_request")
        if self.request_mode == "BUFFERED":
            return Answer([wire.headers_response("request")])
        return Answer([])

    def _parse(self, raw: bytes, fleet: Fleet) -> tuple[JSONObject, RouteRequest]:
        """Raises ``HTTPError`` 400 (the body is not a chat request)."""
        body = decode_json(raw)
        if not isinstance(body, dict):
            raise HTTPError(400, "request body is not a JSON object", code="invalid_body")
        try:
            chat = routing_context(chat_request(body), self.headers, fleet.slo_classes)
            return body, parse_route_request(with_completions_routing(chat, body))
        except RequestError as exc:
            err = invalid(exc)
            raise HTTPError(400, err.message, param=err.param, code=err.code) from None

    async def _decide(self, body_ends: bool) -> Answer:
        self.decided = True
        started = time.perf_counter()
        rt = self.rt
        if rt.closing:
            return self._refuse(unavailable("the service is stopping; retry shortly", "not_ready"), "unavailable")
        raw = self.body.value()
        engine = rt.live.engine  # read once: this decision runs on this engine to the end
        try:
            body, request = self._parse(raw, engine.fleet)
        except HTTPError as exc:
            return self._refuse(exc, "bad_request")
        subset = None if self.subset is None else endpoint_index(engine.fleet).subset(self.subset)
        routing = asyncio.ensure_future(route_async(engine, request, in_thread=rt.settings.route_in_threadpool,
                                                    api_key_id=self.api_key_id, endpoint_subset=subset))
        try:
            decision = await asyncio.shield(routing)
        except asyncio.CancelledError:  # the stream went away while deciding: the decision may be dispatched
            routing.add_done_callback(lambda done: self._abandoned(done, request, engine, started))
            raise
        except NoEligibleTarget as exc:
            shed = exc.by_budget
            code = "budget_exhausted" if shed else "no_eligible_target"
            return self._refuse(HTTPError(429 if shed else 503, str(exc), type=code, code=code),
                                "shed" if shed else "unavailable")
        except LedgerUnavailable as exc:
            return self._refuse(unavailable(f"budget ledger unavailable: {exc}", "budget_ledger_unavailable"), "unavailable")
        except RequestError as exc:
            err = invalid(exc)
            return self._refuse(HTTPError(400, err.message, param=err.param, code=err.code), "bad_request")
        self.decision = commit_decision(rt, decision, request, engine.estimator, started)  # held for the stream
        self.server.count("routed")
        return Answer(self._routed(decision, raw, body, body_ends))

    def _abandoned(self, routing: asyncio.Future[Decision], request: RouteRequest, engine: RoutingEngine,
                   started: float) -> None:
        """A decision whose stream ended while it was being made (its hold and in-flight load taken): logged,
        counted and recorded ``cancelled`` (no response byte came: its hold and load released), as a stream
        that ends after its decision; a refusal leaves nothing to release."""
        if routing.cancelled() or routing.exception() is not None:
            return
        self.decision = commit_decision(self.rt, routing.result(), request, engine.estimator, started)
        self.server.count("routed")
        self.finish(cancelled=True)

    def _routed(self, decision: Decision, raw: bytes, body: JSONObject, body_ends: bool) -> list[object]:
        dest = ",".join(destinations(decision, self.rt.settings.ext_proc_destinations))
        set_headers = {wire.DESTINATION_KEY: dest, TARGET_HEADER: decision.target, **decision.forward_headers}
        remove = [] if PREFILLER_HEADER in set_headers else [PREFILLER_HEADER]
        new = rewrite_request(raw, body, decision.model)
        if new is not None:
            if body.get("model") != decision.model:
                set_headers[MODEL_NAME_HEADER] = decision.model
            set_headers["content-length"] = str(len(new))
        metadata = {wire.LB_NAMESPACE: {wire.DESTINATION_KEY: dest}}
        if self.request_mode == "BUFFERED":
            return [wire.body_response("request", new, set_headers, remove, clear_route_cache=True, metadata=metadata)]
        return [wire.headers_response("request", set_headers, remove, clear_route_cache=True, metadata=metadata),
                *wire.streamed_body("request", raw if new is None else new, body_ends)]

    # -- response phase ------------------------------------------------------------------------------

    def _response_headers(self, msg: wire.Message) -> object:
        status = msg.headers.get(":status") or msg.headers.get("status") or ""
        self.status = int(status) if status.isdigit() else None
        sse = msg.headers.get("content-type", "").lower().startswith("text/event-stream")
        self.reader = UsageReader(sse, self.rt.settings.max_body_bytes, msg.headers.get("content-encoding", ""))
        if msg.end_of_stream:
            self.finish()
        return wire.headers_response("response", {DECISION_HEADER: self.decision.decision_id} if self.decision else None)

    def _response_body(self, msg: wire.Message) -> list[object]:
        if self.t_first is None and msg.body:
            self.t_first = time.perf_counter()
        if self.reader is None:
            self.reader = UsageReader(False, self.rt.settings.max_body_bytes)
        self.reader.feed(msg.body)
        if msg.end_of_stream:
            self.finish()
        if self.response_mode == "FULL_DUPLEX_STREAMED":
            return wire.streamed_body("response", msg.body, msg.end_of_stream)
        return [wire.body_response("response")]

    def end(self) -> None:
        """The gRPC stream ended, half-closed or reset (which says nothing of the response: see the module).
        With a response body to come (``response_mode`` not NONE) an outcome not recorded yet is ``cancelled``.
        Without one the response headers are the response: recorded at the stream's end when they came;
        when none came nothing is recorded (the gateway reports the outcome, else the hold lapses)."""
        if self.response_mode != "NONE":
            self.finish(cancelled=True)
        elif self.status is not None:
            self.finish()

    def finish(self, cancelled: bool = False) -> None:
        """Record the outcome once (in the background); ``cancelled``: the stream ended before the response did."""
        if self.recorded or self.decision is None:
            return
        self.recorded = True
        item = self._outcome(cancelled)
        if item is not None:
            self.server.record(item)

    def _outcome(self, cancelled: bool) -> OutcomeIn | None:
        d = self.decision
        assert d is not None
        now = time.perf_counter()
        fields: dict[str, JSONValue] = {"decision_id": d.decision_id, "time_s": time.time(),
                                        "e2e_latency_ms": (now - self.t0) * 1e3}
        if self.served:
            fleet = self.rt.live.engine.fleet
            index = endpoint_index(fleet)
            served_target = index.target(self.served)
            if served_target:
                fields["served_target"] = served_target
            # the breaker counts it where Envoy served it (the picked endpoint or a fallback), when one endpoint is there
            ids = index.named(served_target or d.target, self.served)
            if len(ids) == 1:
                fields["served_endpoint"] = ids[0]
        if self.status is not None and 100 <= self.status <= 599:  # (one out of range would fail the whole outcome)
            fields["upstream_status"] = self.status
        summary = self.reader.summary() if self.reader is not None else None
        if summary is not None and summary.model and _is_text(model := summary.model[:256]):
            fields["served_model"] = model  # (an invalid name would fail the whole outcome: left out)
        if cancelled:
            fields["status"] = "cancelled"
            fields["error"] = "the stream ended before the response did (client cancelled or proxy reset)"
        elif self.status is not None and not 200 <= self.status < 300:
            fields["status"], fields["error"] = "error", f"upstream HTTP {self.status}"
        else:
            fields["status"] = "ok"
        if self.t_first is not None and fields["status"] != "error":  # an error body's first byte is no token:
            fields["ttft_ms"] = (self.t_first - self.t0) * 1e3          # without ttft_ms the hold is released
        if summary is not None and summary.usage:
            fields["usage"] = dict(summary.usage)
        elif summary is not None and fields["status"] != "error" \
                and summary.streamed_tokens > self._estimated_output(fields.get("served_target")):
            # a stream without usage (no stream_options.include_usage) longer than the estimate: book at least
            # what it streamed (each text delta is a token or more) with the prompt the decision counted
            streamed = summary.streamed_tokens
            log.info("decision %s: the stream carried no usage and streamed at least %d output tokens, above "
                     "the estimate; booking those", d.decision_id, streamed)
            fields["usage"] = {"prompt_tokens": d.prompt_tokens, "completion_tokens": streamed,
                               "total_tokens": d.prompt_tokens + streamed}
        elif self.reader is not None and self.reader.undecodable and fields["status"] == "ok":
            self.rt.metrics.unpriced_usage.labels("ext_proc").inc()
            log.warning("decision %s: the response's content-encoding cannot be decoded, so its usage is not read; "
                        "booking the estimate instead (gzip and deflate are read)", d.decision_id)
        out: OutcomeIn | None
        problem: object
        try:
            out = OutcomeIn.model_validate(fields)
            problem = usage_problem(self.rt, out)
        except ValidationError as exc:
            out, problem = None, str(exc.errors(include_url=False)[0].get("ctx", {}).get("error") or exc)
        except DataError as exc:
            out, problem = None, str(exc)
        if out is not None and problem is None and out.usage is not None and summary is not None \
                and not summary.complete and summary.streamed_tokens > (out.usage.completion_tokens or 0):
            # usage read before the stream's end (Anthropic's message_start, before an error event or a reset)
            # counts fewer output tokens than the text deltas that came: book at least those (not for a complete
            # stream, whose usage is final and whose closing events repeat the text: Responses' *.done)
            log.info("decision %s: the usage read counts %s output tokens, below the %d the stream carried; "
                     "booking those", d.decision_id, out.usage.completion_tokens, summary.streamed_tokens)
            out = out.model_copy(update={"usage": out.usage.model_copy(
                update={"completion_tokens": summary.streamed_tokens})})
            problem = usage_problem(self.rt, out)
        if out is not None and problem is None and cancelled and summary is not None and not summary.complete \
                and self._below_estimate(out):
            # the client went away mid-answer: the usage read so far is partial (Anthropic's message_start
            # carries a placeholder output count of 1), while the upstream generated, and bills, more
            log.info("decision %s: the cancelled stream's partial usage (%s output tokens) is below the "
                     "estimate; booking the estimate", d.decision_id, out.usage.completion_tokens if out.usage else None)
            fields.pop("usage", None)
            out = OutcomeIn.model_validate(fields)
        if out is not None and problem is None:
            n = out.usage.completion_tokens if out.usage is not None else None
            if self.t_first is not None and n is not None and n > 1:
                return out.model_copy(update={"tpot_ms": (now - self.t_first) * 1e3 / (n - 1)})
            return out
        # usage Pointsman cannot price (or impossible on the target): keep the outcome without it, so
        # an ok answer books the decision's estimate, and say so
        self.rt.metrics.unpriced_usage.labels("ext_proc").inc()
        log.warning("decision %s: upstream usage %s cannot be priced (%s); booking the estimate instead",
                    d.decision_id, json.dumps(fields.get("usage"))[:500], problem)
        fields.pop("usage", None)
        try:
            return OutcomeIn.model_validate(fields)
        except ValidationError:
            log.exception("could not build the outcome of decision %s", d.decision_id)
            return None


    def _below_estimate(self, out: OutcomeIn) -> bool:
        """Whether ``out``'s usage counts fewer output tokens than its decision's estimate."""
        return out.usage is not None and (out.usage.completion_tokens or 0) < self._estimated_output(out.served_target)

    def _estimated_output(self, served_target: JSONValue) -> int:
        """Output tokens the decision's estimate counts on the target that served (else the decision's):
        the client's cap (times OpenAI's ``n``), else the target's output estimate; 0 for an unknown target."""
        d = self.decision
        assert d is not None
        fleet = self.rt.live.engine.fleet
        target = served_target if isinstance(served_target, str) and served_target else d.target
        if target not in fleet.targets:
            return 0
        record = self.rt.live.engine.state.known(d.decision_id)
        cap = record.output_cap_tokens if record is not None else 0
        return fleet.output_tokens(target, cap or None)


class _Picker:
    """The ``ExternalProcessor`` servicer: ``Process`` runs one ``_Stream`` per gRPC stream."""

    def __init__(self, server: ExtProcServer) -> None:
        self.server = server

    async def Process(self, requests: AsyncIterator[object], context: grpc.aio.ServicerContext[object, object]
                      ) -> AsyncIterator[object]:
        """The bidirectional ext_proc stream (see the module); UNAUTHENTICATED without a valid key
        when keys are configured."""
        principal = self.server.authenticate(context.invocation_metadata() or ())
        if principal is None:
            self.server.count("unauthenticated")
            await context.abort(grpc.StatusCode.UNAUTHENTICATED,
                                "this ext_proc port needs an API key in the stream's metadata: "
                                "'authorization: Bearer <key>' or 'x-api-key' (Envoy: grpc_service.initial_metadata)")
        stream = _Stream(self.server, principal.key_id if principal else None)
        try:
            async for request in requests:
                try:
                    answer = await stream.handle(wire.read(request))
                except ProtocolError as exc:
                    self.server.count("protocol_error")
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
                for response in answer.responses:
                    yield response
                if answer.final:
                    break
            if not stream.request_ended:  # refused mid-body: the sender may still be writing it
                await _drop_rest(requests, stream.rt.settings.body_read_timeout_s)
        finally:
            stream.end()


async def _drop_rest(requests: AsyncIterator[object], timeout_s: float) -> None:
    """Read and drop the rest of a request body (after an immediate response sent before it ended), up
    to ``DISCARD_LIMIT_BYTES`` and ``timeout_s`` seconds; stops at its end or at any other message."""
    dropped = 0
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout_s):
            async for request in requests:
                msg = wire.read(request)
                dropped += len(msg.body)
                if msg.kind != "request_body" or msg.end_of_stream or dropped > DISCARD_LIMIT_BYTES:
                    return


class ExtProcServer:
    """The gRPC server of the endpoint picker (see the module). ``ExtProcServer(rt)``;
    ``await start(host, port)`` returns the bound port; ``await stop()`` drains the streams and the
    outcomes being recorded."""

    def __init__(self, rt: Runtime, keys: KeySource | None = None) -> None:
        self.rt = rt
        self.keys = keys
        self._server: grpc.aio.Server | None = None
        self._health = health_aio.HealthServicer()
        self._outbox: list[OutcomeIn] = []  # outcomes to record, stored in batches (``record``)
        self._recorder: asyncio.Task[None] | None = None
        self._children: dict[str, Callable[[], None]] = {}
        self._stopping = False  # stop() began: outcomes the service answers 503 are not retried again

    def authenticate(self, metadata: Iterable[tuple[str, str | bytes]]) -> Principal | None:
        """The caller of a stream from its gRPC ``metadata``: an anonymous admin when no key is configured,
        the key's principal when ``authorization: Bearer <key>`` or ``x-api-key`` names a configured gateway or
        admin key, else None (refuse)."""
        ring = self.keys.ring() if self.keys is not None else None
        if ring is None or not ring.enabled or not self.rt.settings.ext_proc_require_key:
            return Principal(None, "admin")
        bearer = header = None  # the first of each; the bearer token wins, as over HTTP (auth.presented_key)
        for name, value in metadata:
            text = value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else value
            if name == "authorization" and bearer is None and text[:7].lower() == "bearer ":
                bearer = text[7:].strip()
            elif name == "x-api-key" and header is None:
                header = text.strip()
        key = bearer or header
        principal = ring.identify(key) if key else None
        return principal if principal is None or principal.role in ("gateway", "admin") else None  # routes: no telemetry key

    def count(self, result: str) -> None:
        """Count one request's result in ``pointsman_ext_proc_requests_total``."""
        inc = self._children.get(result)
        if inc is None:
            inc = self._children[result] = self.rt.metrics.ext_proc_requests.labels(result).inc
        inc()

    def record(self, item: OutcomeIn) -> None:
        """Store and settle one outcome in a worker thread (``store_outcomes``, as ``POST /v1/outcomes``),
        with the others recorded meanwhile: the outcomes that end while one batch is being stored are
        stored together by the next (one decision log flush and one outcome log commit per batch, not
        per stream; nobody waits for the acknowledgement, so nothing is held back)."""
        self._outbox.append(item)
        if self._recorder is None or self._recorder.done():
            self._recorder = asyncio.get_running_loop().create_task(self._store_all())

    async def _store_all(self) -> None:
        while self._outbox:
            items, self._outbox = self._outbox, []
            if not await self._store(items):  # nobody else retries these: try again, as a gateway would a 503
                self._outbox[:0] = items
                if self._stopping:
                    return
                await asyncio.sleep(STORE_RETRY_S)

    async def _store(self, items: list[OutcomeIn]) -> bool:
        """Store and settle ``items``; False when the service answered them 503 (the outcome log cannot be
        written, or the ledger took no settlement): a retry stores them (duplicates of what was stored) and
        settles them once."""
        try:
            acks = await asyncio.to_thread(store_outcomes, self.rt, list(items), unsettled=True)
        except HTTPError as exc:
            for item in items:
                log.warning("outcome of decision %s not recorded yet (retried every %g s): %s", item.decision_id,
                            STORE_RETRY_S, exc.message)
            return False
        except Exception:  # noqa: BLE001 - a background task: log it, never lose the loop
            log.exception("outcomes of decisions %s not recorded", ", ".join(i.decision_id for i in items))
            return True
        for item, ack in zip(items, acks, strict=False):
            if ack["status"] not in ("stored", "duplicate", "forwarded"):
                log.warning("outcome of decision %s: %s %s", item.decision_id, ack["status"], ack.get("message") or "")
        return True

    async def drain(self) -> None:
        """Wait for the outcomes being recorded."""
        while self._recorder is not None and not self._recorder.done():
            await asyncio.gather(self._recorder, return_exceptions=True)

    async def start(self, host: str, port: int) -> int:
        """Bind ``host:port`` (0: a free port), start serving and mark every health service SERVING;
        returns the port. ``SO_REUSEPORT`` only with several workers (they share the port)."""
        reuse = 1 if self.rt.settings.workers > 1 else 0
        server = grpc.aio.server(options=[("grpc.so_reuseport", reuse),
                                          ("grpc.max_receive_message_length", max_message_bytes(self.rt.settings))])
        wire.add_servicer(_Picker(self), server)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        address = f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"  # IPv6
        try:
            bound = server.add_insecure_port(address)
        except RuntimeError as exc:  # grpcio raises this, not OSError, for a busy port or a bad address
            raise OSError(f"cannot bind the ext_proc port {address}: {exc}") from None
        if bound == 0:
            raise OSError(f"cannot bind the ext_proc port {address}")
        await server.start()
        self._server = server
        for name in HEALTH_SERVICES:
            await self._health.set(name, health_pb2.HealthCheckResponse.SERVING)
        log.info("ext_proc endpoint picker listening on %s:%d", host, bound)
        return bound

    async def stop(self, grace_s: float = 5.0) -> None:
        """NOT_SERVING, stop accepting streams, let open ones finish for ``grace_s``, then wait for
        the outcomes being recorded (those waiting for a retry get one more try)."""
        await self._health.enter_graceful_shutdown()
        if self._server is not None:
            await self._server.stop(grace_s)
        self._stopping = True
        await self.drain()  # the outcomes waiting for a retry get one more try
        for item in self._outbox:
            log.error("outcome of decision %s not recorded: the service stopped while its outcome log or budget "
                      "ledger could not take it", item.decision_id)
