"""An HTTP client of the decision service for gateways written in Python.

``PointsmanClient(base_url, api_key=None, route_timeout_s=0.25, ...)``:

- ``aroute(body)`` / ``route(body)``: ``POST /v1/route`` with an OpenAI chat request plus
  ``routing`` context; returns the decision (the ``RouteResponse`` JSON as a dict) or ``None``
  when Pointsman cannot decide in time — connection refused, timeout, 5xx, or a 4xx for a
  request Pointsman rejects. A gateway must not fail its user's request because the router
  is down: ``None`` means "route the way you would without Pointsman" (fail open); the reason
  is logged (warning; 4xx as an error, since it is a client bug) and counted in ``stats``.
  A budget refusal is not such a failure: every target that could take it is over its budget (429
  ``budget_exhausted``), so routing without Pointsman would spend past it, unbooked; ``route``
  raises ``BudgetExhausted`` instead (counted as ``budget_refused``), and the gateway refuses the
  request (the LiteLLM integrations let it reach the caller). So is a request with a budget the service
  refused because its budget ledger is down (503 ``budget_ledger_unavailable``: the service is
  fail-closed, ``POINTSMAN_BUDGET_FAIL_OPEN=false``, the default): routed without Pointsman it would spend
  with nothing reserved or booked, so ``route`` raises ``BudgetUnavailable`` (a ``BudgetExhausted``).
- ``averify(decision_id, draft, usage=None, served_target=None)`` / ``verify(...)``: ``POST /v1/verify`` (the
  cascade) with the draft the decision's target answered (``{"text", "finish_reason",
  "logprobs", "partial"}``; with the decision's ``verify_prefix_tokens`` N, its first N tokens while
  it streams, ``partial: true``); returns the answer (``action`` ``accept`` or ``escalate`` with the
  escalation target) or ``None`` on any failure, which means "keep the draft" (fail open, as
  ``route``; counted as ``verify_failed``). ``verify_timeout_s`` bounds the call.
- ``report(outcome)``: queue one outcome (a dict shaped like ``OutcomeIn``,
  ``pointsman/outcome.py``) for ``POST /v1/outcomes``. Inside a running event loop it
  never blocks: outcomes are batched for ``flush_interval_s`` (at most ``MAX_BATCH`` per call)
  and posted by a background task; transport errors and retryable answers (408 and 5xx: the
  service's 503 ``outcome_log_unavailable`` or ``budget_ledger_unavailable`` acknowledged nothing,
  or settles on the retry) are retried ``outcome_attempts`` times, then the batch is dropped and
  counted (the reservation it would have settled expires in the ledger); another 4xx is dropped at
  once. Without a running loop (a sync caller's logging thread) it posts at once.
  ``aflush()`` waits until everything queued so far has been posted.
- Acknowledgements (``OutcomeAckOut`` dicts) of the last 10,000 outcomes are kept in
  ``acks`` (a deque), so callers and tests can see what the service stored. An item the
  service rejects (``invalid``: a bad field, or usage beyond its target's context window) is
  acknowledged, not stored, and logged with the fields named; the rest of its batch is stored. One whose
  ``served_endpoint`` the fleet does not have is stored as sent (the ack's ``message`` says so, and it is logged).

Auth: with ``api_key`` every call sends ``Authorization: Bearer <key>`` (a gateway-role key,
``service/auth.py``). Timeouts are in seconds; ``route_timeout_s`` bounds the whole
``/v1/route`` call (connect, write, read). One ``httpx.AsyncClient`` is kept per event loop
(keep-alive connections); ``aclose()`` / ``close()`` release them.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
from collections.abc import Mapping, Sequence
from typing import NotRequired, TypedDict

import httpx

from pointsman.json_types import JSONObject
from pointsman.outcome import MAX_BATCH

log = logging.getLogger("pointsman.integrations")

#: Response and forwarding headers of a decision (the P/D contract: ``policy/decision.py``).
DECISION_HEADER = "x-pointsman-decision-id"
TARGET_HEADER = "x-pointsman-target"
PREFILLER_HEADER = "x-prefiller-host-port"


class BudgetExhausted(Exception):
    """``/v1/route`` refused the request because every target is over its budget (HTTP 429
    ``budget_exhausted``); ``str()`` is the service's message naming each target's budget. Not a
    failure to fail open on: routing the request elsewhere would spend past the budget."""


class BudgetUnavailable(BudgetExhausted):
    """``/v1/route`` refused a request with a budget because the budget ledger is unavailable and the
    service is fail-closed (HTTP 503 ``budget_ledger_unavailable``; ``POINTSMAN_BUDGET_FAIL_OPEN=true``
    routes such requests instead, booking their spend when the ledger returns). Not a failure to fail
    open on: routed without Pointsman the request would spend with nothing reserved or ever booked."""


class RoutedEndpoint(TypedDict):
    """An endpoint of a decision (``endpoints[i]`` of ``/v1/route``'s answer)."""

    url: str
    role: str
    name: str | None


class RoutedFallback(TypedDict):
    """A fallback of a decision (``fallbacks[i]``)."""

    target: str
    model: str
    base_url: str
    mode: str


class RouteDecision(TypedDict):
    """The fields of ``/v1/route``'s answer (the service's ``RouteResponse``) a gateway routes by;
    the dict ``route``/``aroute`` return carries every field of the answer.

    The forwarding contract (``policy/decision.py``): send to ``base_url`` — never to
    ``endpoints[0]``, which is the prefill endpoint of a ``disaggregated`` decision — with
    ``model`` and the ``forward_headers`` (``x-pointsman-decision-id``; ``x-prefiller-host-port``
    naming ``prefill_url`` when disaggregated). ``forward_target(decision)`` reads them."""

    decision_id: str
    target: str
    model: str
    base_url: str
    mode: str
    endpoints: list[RoutedEndpoint]
    fallbacks: list[RoutedFallback]
    prefill_url: NotRequired[str | None]
    forward_headers: NotRequired[dict[str, str]]
    verify_prefix_tokens: NotRequired[int | None]


def forward_target(decision: RouteDecision) -> tuple[str, dict[str, str]]:
    """``(url, headers)`` a gateway forwards ``decision``'s request to: ``base_url`` and the
    ``forward_headers`` (the decision id alone from a service that predates them)."""
    headers = dict(decision.get("forward_headers") or {})
    headers.setdefault(DECISION_HEADER, decision["decision_id"])
    return decision["base_url"], headers


class VerifyAnswer(TypedDict):
    """The fields of ``/v1/verify``'s answer (``service/cascade.py`` ``VerifyOut``) a gateway acts on;
    the dict ``verify``/``averify`` return carries every field. With ``action == "escalate"``
    send the request to ``base_url`` with ``model`` (``fallbacks`` next) and report the one
    outcome under ``escalation_id`` (any replica settles it; under ``decision_id`` only the replica
    that verified) with ``served_target`` = ``target``."""

    decision_id: str
    action: str
    p_bad: float
    rule: str
    escalation_id: str | None
    target: str | None
    model: str | None
    base_url: str | None
    fallbacks: list[RoutedFallback]
    replayed: bool


class PointsmanClient:
    """Calls ``/v1/route`` and reports to ``/v1/outcomes``; see the module docstring.

    ``base_url``: the service root, e.g. ``http://127.0.0.1:8000``. ``route_timeout_s``: budget
    of one routing call in seconds (default 0.25). ``outcome_timeout_s``: budget of one
    outcome post. ``verify_timeout_s``: budget of one verify call. ``flush_interval_s``: how long
    outcomes wait to be batched. ``transport``: an httpx transport for tests. Counters in
    ``stats``: ``routed``, ``route_failed``, ``verified``, ``verify_failed``,
    ``outcomes_acked``, ``outcomes_dropped``.
    """

    def __init__(self, base_url: str, *, api_key: str | None = None, route_timeout_s: float = 0.25,
                 verify_timeout_s: float = 0.5, outcome_timeout_s: float = 5.0, flush_interval_s: float = 0.05,
                 outcome_attempts: int = 3,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.route_timeout_s = route_timeout_s
        self.verify_timeout_s = verify_timeout_s
        self.outcome_timeout_s = outcome_timeout_s
        self.flush_interval_s = flush_interval_s
        self.outcome_attempts = max(1, outcome_attempts)
        self._headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self._transport = transport
        self._aclients: dict[asyncio.AbstractEventLoop, httpx.AsyncClient] = {}
        self._sync: httpx.Client | None = None
        self._lock = threading.Lock()
        self._pending: list[dict[str, object]] = []
        self._flusher: asyncio.Task[None] | None = None
        self._inflight: set[asyncio.Task[None]] = set()
        self.acks: collections.deque[JSONObject] = collections.deque(maxlen=10_000)
        self.stats: collections.Counter[str] = collections.Counter()

    # -- clients ------------------------------------------------------------------------------
    def _aclient(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        client = self._aclients.get(loop)
        if client is None:
            client = httpx.AsyncClient(base_url=self.base_url, headers=self._headers, transport=self._transport)
            self._aclients = {lp: c for lp, c in self._aclients.items() if not lp.is_closed()}
            self._aclients[loop] = client
        return client

    def _client(self) -> httpx.Client:
        with self._lock:
            if self._sync is None:
                self._sync = httpx.Client(base_url=self.base_url, headers=self._headers)
            return self._sync

    # -- routing ------------------------------------------------------------------------------
    async def aroute(self, body: Mapping[str, object]) -> RouteDecision | None:
        """``POST /v1/route``; the decision dict, or ``None`` (fail open) — see the module docstring.
        Raises ``BudgetExhausted`` when every target is over the request's budget, ``BudgetUnavailable``
        when its budget cannot be checked (the ledger is down and the service fail-closed)."""
        try:
            resp = await self._aclient().post("/v1/route", json=body, timeout=self.route_timeout_s)
        except httpx.HTTPError as exc:
            self._route_failed(f"{type(exc).__name__}: {exc}")
            return None
        return self._decision(resp)

    def route(self, body: Mapping[str, object]) -> RouteDecision | None:
        """Blocking ``aroute``, for sync gateways (``httpx.Client``)."""
        try:
            resp = self._client().post("/v1/route", json=body, timeout=self.route_timeout_s)
        except httpx.HTTPError as exc:
            self._route_failed(f"{type(exc).__name__}: {exc}")
            return None
        return self._decision(resp)

    def _decision(self, resp: httpx.Response) -> RouteDecision | None:
        if resp.status_code == 200:
            self.stats["routed"] += 1
            decision: RouteDecision = resp.json()  # the service's RouteResponse
            return decision
        detail = _error_text(resp)
        if resp.status_code == 429 and _error_code(resp) == "budget_exhausted":
            self.stats["budget_refused"] += 1
            raise BudgetExhausted(detail)
        if resp.status_code == 503 and _error_code(resp) == "budget_ledger_unavailable":
            self.stats["budget_refused"] += 1
            raise BudgetUnavailable(detail)
        if 400 <= resp.status_code < 500:
            self.stats["route_failed"] += 1
            log.error("pointsman rejected the routing request (HTTP %d: %s); routing without it",
                      resp.status_code, detail)
            return None
        self._route_failed(f"HTTP {resp.status_code}: {detail}")
        return None

    def _route_failed(self, reason: str) -> None:
        self.stats["route_failed"] += 1
        log.warning("pointsman at %s did not decide (%s); routing without it", self.base_url, reason)

    # -- the cascade --------------------------------------------------------------------------
    @staticmethod
    def _verify_body(decision_id: str, draft: Mapping[str, object], usage: Mapping[str, object] | None,
                     served_target: str | None) -> dict[str, object]:
        body: dict[str, object] = {"decision_id": decision_id, "draft": dict(draft)}
        if usage is not None:
            body["usage"] = dict(usage)
        if served_target is not None:
            body["served_target"] = served_target
        return body

    async def averify(self, decision_id: str, draft: Mapping[str, object],
                      usage: Mapping[str, object] | None = None,
                      served_target: str | None = None) -> VerifyAnswer | None:
        """``POST /v1/verify``; the answer, or ``None`` (keep the draft) — see the module docstring.
        ``served_target``: the target that wrote the draft (a fallback's; None or the decision's target: the
        decision's)."""
        try:
            resp = await self._aclient().post("/v1/verify",
                                              json=self._verify_body(decision_id, draft, usage, served_target),
                                              timeout=self.verify_timeout_s)
        except httpx.HTTPError as exc:
            self._verify_failed(f"{type(exc).__name__}: {exc}")
            return None
        return self._verified(resp)

    def verify(self, decision_id: str, draft: Mapping[str, object],
               usage: Mapping[str, object] | None = None, served_target: str | None = None) -> VerifyAnswer | None:
        """Blocking ``averify``, for sync gateways."""
        try:
            resp = self._client().post("/v1/verify", json=self._verify_body(decision_id, draft, usage, served_target),
                                       timeout=self.verify_timeout_s)
        except httpx.HTTPError as exc:
            self._verify_failed(f"{type(exc).__name__}: {exc}")
            return None
        return self._verified(resp)

    def _verified(self, resp: httpx.Response) -> VerifyAnswer | None:
        if resp.status_code == 200:
            self.stats["verified"] += 1
            answer: VerifyAnswer = resp.json()  # the service's VerifyOut
            return answer
        self._verify_failed(f"HTTP {resp.status_code}: {_error_text(resp)}")
        return None

    def _verify_failed(self, reason: str) -> None:
        self.stats["verify_failed"] += 1
        log.warning("pointsman at %s did not verify the draft (%s); keeping it", self.base_url, reason)

    # -- outcomes -----------------------------------------------------------------------------
    def report(self, outcome: Mapping[str, object]) -> None:
        """Queue one outcome; never raises and never blocks a running event loop."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            self.post_outcomes([dict(outcome)])
            return
        self._pending.append(dict(outcome))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush_later())

    async def _flush_later(self) -> None:
        await asyncio.sleep(self.flush_interval_s)
        while self._pending:
            batch, self._pending = self._pending[:MAX_BATCH], self._pending[MAX_BATCH:]
            task = asyncio.create_task(self._apost(batch))
            self._inflight.add(task)
            task.add_done_callback(self._inflight.discard)

    async def aflush(self) -> None:
        """Wait until every outcome queued so far has been posted (or dropped)."""
        while (self._flusher is not None and not self._flusher.done()) or self._inflight:
            if self._flusher is not None and not self._flusher.done():
                await self._flusher
            if self._inflight:
                await asyncio.gather(*list(self._inflight), return_exceptions=True)

    async def _apost(self, batch: list[dict[str, object]]) -> None:
        reason = ""
        for attempt in range(self.outcome_attempts):
            try:
                resp = await self._aclient().post("/v1/outcomes", json=batch, timeout=self.outcome_timeout_s)
            except httpx.HTTPError as exc:
                reason = f"{type(exc).__name__}: {exc}"
            else:
                if not _retryable(resp):
                    self._acked(batch, resp)
                    return
                reason = f"HTTP {resp.status_code}: {_error_text(resp)}"
            if attempt + 1 < self.outcome_attempts:
                await asyncio.sleep(0.1 * 2 ** attempt)
        self._dropped(batch, reason)

    def post_outcomes(self, batch: Sequence[Mapping[str, object]]) -> None:
        """Post outcomes now (blocking, for sync callers); failures are logged and counted, never raised."""
        reason = ""
        for _ in range(self.outcome_attempts):
            try:
                resp = self._client().post("/v1/outcomes", json=list(batch), timeout=self.outcome_timeout_s)
            except httpx.HTTPError as exc:
                reason = f"{type(exc).__name__}: {exc}"
                continue
            if not _retryable(resp):
                self._acked(batch, resp)
                return
            reason = f"HTTP {resp.status_code}: {_error_text(resp)}"
        self._dropped(batch, reason)

    def _acked(self, batch: Sequence[Mapping[str, object]], resp: httpx.Response) -> None:
        """Count and log the service's answer to ``batch``: every ack kept, those not stored (or stored with a
        note: a ``served_endpoint`` the fleet does not know) logged."""
        if resp.status_code != 200:  # 4xx: the batch itself is wrong (a bug; retrying cannot help)
            self._dropped(batch, f"HTTP {resp.status_code}: {_error_text(resp)}")
            return
        for ack in resp.json().get("acks", []):  # OutcomeAckOut dicts
            self._ack(ack)
            if ack.get("status") not in ("stored", "duplicate"):
                log.warning("pointsman did not store outcome %s: %s %s", ack.get("outcome_id"), ack.get("status"),
                            ack.get("message"))
            elif ack.get("message"):
                log.warning("pointsman stored outcome %s: %s", ack.get("outcome_id"), ack.get("message"))

    def _ack(self, ack: JSONObject) -> None:
        self.acks.append(ack)
        self.stats["outcomes_acked"] += 1

    def _dropped(self, batch: Sequence[Mapping[str, object]], reason: str) -> None:
        self.stats["outcomes_dropped"] += len(batch)
        log.warning("dropped %d outcome(s) for pointsman at %s (%s)", len(batch), self.base_url, reason)

    # -- lifecycle ----------------------------------------------------------------------------
    async def aclose(self) -> None:
        """Flush queued outcomes, then close this loop's async client and the sync client."""
        await self.aflush()
        loop = asyncio.get_running_loop()
        client = self._aclients.pop(loop, None)
        if client is not None:
            await client.aclose()
        self.close()

    def close(self) -> None:
        """Close the sync client (async clients are closed by ``aclose`` in their loop)."""
        with self._lock:
            if self._sync is not None:
                self._sync.close()
                self._sync = None


def _retryable(resp: httpx.Response) -> bool:
    """Whether an outcomes answer asks for the same batch again: 408 (the body arrived too slowly) or a
    5xx (the service stored nothing, or stored it and settles on the retry, which it acknowledges as
    ``duplicate``)."""
    return resp.status_code == 408 or resp.status_code >= 500


def _error_code(resp: httpx.Response) -> str | None:
    """The service's error code (``{"error": {"code": ...}}``), None without one."""
    try:
        err = resp.json().get("error")
    except (ValueError, AttributeError):
        return None
    return str(err.get("code")) if isinstance(err, dict) else None


def _error_text(resp: httpx.Response) -> str:
    """The service's error message (``{"error": {"message": ...}}``), else the raw body, shortened."""
    try:
        err = resp.json().get("error", {})
        text = f"{err.get('message')} (param {err.get('param')})" if isinstance(err, dict) else str(err)
    except (ValueError, AttributeError):
        text = resp.text
    return text[:300]
