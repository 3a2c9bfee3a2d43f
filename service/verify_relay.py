"""``POST /v1/verify`` on any process: a verify that reaches a process not holding its decision is
relayed, through the shared state's Redis, to the one that does.

A decision's context (its request view) lives in the memory of the process that routed it
(``cascade.PendingDrafts``), but with ``POINTSMAN_STATE_URL`` the gateway's verify may reach another
worker of the same ``pointsman serve`` or another replica. That process publishes the verify on the
Redis channel ``<prefix>verify`` (one ``PUBLISH``) and waits up to ``timeout_s`` on a reply list
(``BLPOP``). Every process subscribes; the one holding the decision runs the same steps as a local
verify (``routes_verify.verify``, on a small thread pool) and pushes the answer, its HTTP status and
body, to the reply list (kept 60 s). When no holder answers in time (its process is gone, Redis is
down) the verify is answered as before: 410 ``decision_expired``. The verify was authenticated and
validated where it arrived; the holder trusts what comes through Redis as it trusts the shared state.
Cost: a round trip through Redis and a thread hand-off on each side (about a millisecond), paid only
by relayed verifies. A Redis that hangs holds a relayed verify for one socket timeout at most, and the
ones after it not at all: the ``PUBLISH`` goes through the shared state's ``HangGate``
(``pointsman.redis_client``), refused at once (410) while its calls time out. Only the ``PUBLISH``: once
a verify is sent, its ``BLPOP`` and claim go to Redis whatever the gate says (a holder may be verifying).

A 410 must mean that nothing was verified: the gateway then keeps its draft and reports it as the
decision's outcome, which the holder refuses once it escalated the decision (it settled the draft,
and its escalation's hold would wait for the reservation TTL). So a late holder (paused, swapping,
its CPU taken for longer than ``timeout_s``) must not verify a relay its asker gave up on: each side
takes the reply's claim key (``SET NX``) first. The holder verifies only after taking it; an asker
that times out answers 410 only when it took the claim, else the holder is verifying and its answer
is awaited (up to ``ANSWER_WAIT_S`` more; past that a retryable 503, whose retry is answered with the
verify's answer, ``replayed``). A message whose asker's ``deadline`` has passed (delivered late, by a
Redis that hung) is dropped without taking the claim.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import math
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from pointsman.redis_client import HangGate

log = logging.getLogger("pointsman.verify_relay")

#: How long a reply (and its claim key) waits for the asking process to take it (s).
REPLY_TTL_S = 60

#: How long an asker whose holder took the claim waits for its answer after ``timeout_s`` (s): the
#: holder's verify commits the decision log and the verification (each up to 10 s when the disk stalls).
ANSWER_WAIT_S = 25.0

#: ``answer(body)``: the holder's (HTTP status, JSON body) for a relayed verify body.
Answer = Callable[[dict[str, Any]], tuple[int, dict[str, Any]]]


class VerifyRelay:
    """Relays verifies between processes sharing one Redis (see the module).

    ``VerifyRelay(client, prefix, holds, answer, timeout_s=2.0, gate=None)``: ``client`` a ``redis.Redis``
    (``decode_responses=True``) whose socket timeout exceeds ``timeout_s``; ``holds(decision_id)``:
    whether this process holds the decision; ``answer``: see ``Answer``; ``gate``: the ``HangGate`` of
    that Redis (default: the client's own). ``start`` subscribes (a daemon thread), ``close`` stops it.
    Thread-safe."""

    def __init__(self, client: Any, prefix: str, holds: Callable[[str], bool], answer: Answer, *,
                 timeout_s: float = 2.0, gate: HangGate | None = None) -> None:
        import redis

        self.client, self.channel, self.prefix = client, f"{prefix}verify", prefix
        self._gate = gate if gate is not None else HangGate.of(client)
        self.holds, self.answer, self.timeout_s = holds, answer, float(timeout_s)
        self._errors: tuple[type[BaseException], ...] = (redis.exceptions.RedisError, OSError)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="pointsman-verify-relay")

    @classmethod
    def for_sync(cls, sync: Any, holds: Callable[[str], bool], answer: Answer, *,
                 timeout_s: float = 2.0) -> VerifyRelay:
        """A relay on the Redis of a ``shared_state.RedisSync`` (its server, database, prefix and hang
        gate), with its own connection pool whose socket timeout outlasts the ``BLPOP``."""
        import redis

        pool = sync.client.connection_pool
        kwargs = {**pool.connection_kwargs, "socket_timeout": timeout_s + 2.0}
        client = redis.Redis(connection_pool=redis.ConnectionPool(connection_class=pool.connection_class, **kwargs))
        return cls(client, sync.prefix, holds, answer, timeout_s=timeout_s, gate=sync.gate)

    def start(self) -> VerifyRelay:
        """Subscribe to the channel on a daemon thread (reconnects after Redis errors)."""
        self._thread = threading.Thread(target=self._listen, name="pointsman-verify-relay", daemon=True)
        self._thread.start()
        return self

    def ask(self, decision_id: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]] | None:
        """The holder's (status, body) for the verify ``body`` of ``decision_id``; None when no
        process took it within ``timeout_s`` (then none will: see the module) or Redis failed (logged).
        Blocks up to ``timeout_s``, or up to ``ANSWER_WAIT_S`` more once a holder took it; a holder
        that took it and did not answer by then is a 503 ``verify_in_progress`` (retry)."""
        reply = f"{self.prefix}verify-reply:{uuid.uuid4().hex}"
        message = json.dumps({"decision_id": decision_id, "body": body, "reply": reply,
                              "deadline": time.time() + self.timeout_s}, separators=(",", ":"))
        try:
            if not self._gate.call(lambda: self.client.publish(self.channel, message)):
                return None
            got = self.client.blpop([reply], timeout=self.timeout_s)
            if got is None:
                if self.client.set(f"{reply}:claim", "asker", nx=True, ex=REPLY_TTL_S):
                    return None  # no holder took it, and none will now
                got = self._await(reply, ANSWER_WAIT_S)  # a holder took it late: its answer is on the way
        except self._errors as exc:
            log.warning("verify of %s not relayed: %s", decision_id, exc)
            return None
        if got is None:
            return 503, {"error": {"message": f"the process holding decision {decision_id} took its verify and "
                                              "has not answered yet; retry (a retry returns its answer)",
                                   "type": "unavailable", "param": None, "code": "verify_in_progress"}}
        data = json.loads(got[1])
        return int(data["status"]), dict(data["body"])

    def _await(self, reply: str, wait_s: float) -> Any:
        """``BLPOP`` on ``reply`` for up to ``wait_s`` in steps of ``timeout_s`` (the socket timeout
        outlasts one step); None when nothing came."""
        end = time.monotonic() + wait_s
        while (left := end - time.monotonic()) > 0:
            got = self.client.blpop([reply], timeout=min(self.timeout_s, max(left, 0.01)))
            if got is not None:
                return got
        return None

    def _listen(self) -> None:
        while not self._stop.is_set():
            try:
                pubsub = self.client.pubsub(ignore_subscribe_messages=True)
                pubsub.subscribe(self.channel)
                try:
                    while not self._stop.is_set():
                        message = pubsub.get_message(timeout=0.5)
                        if message is not None:
                            self._take(message.get("data"))
                finally:
                    pubsub.close()
            except self._errors as exc:
                log.warning("verify relay disconnected (%s); resubscribing", exc)
                self._stop.wait(1.0)

    def _take(self, raw: object) -> None:
        try:
            data = json.loads(str(raw))
            decision_id, body, reply = str(data["decision_id"]), dict(data["body"]), str(data["reply"])
            deadline = float(data.get("deadline", math.inf))
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("dropping an unreadable relayed verify: %s", exc)
            return
        if self.holds(decision_id):
            if time.time() > deadline:  # its asker has given up (answered 410): delivered late
                log.warning("dropping the relayed verify of %s: it arrived after its asker's deadline", decision_id)
                return
            self._pool.submit(self._reply, body, reply)

    def _reply(self, body: dict[str, Any], reply: str) -> None:
        try:  # the asker answers 410 once it has the claim: never verify behind its back
            if not self.client.set(f"{reply}:claim", "holder", nx=True, ex=REPLY_TTL_S):
                log.warning("not verifying a relayed verify: its asker gave up waiting (answered 410)")
                return
        except self._errors as exc:
            log.warning("relayed verify not taken: %s", exc)
            return
        try:
            status, answer = self.answer(body)
        except Exception:  # noqa: BLE001 - the asking process must get an answer, not a timeout
            log.exception("relayed verify failed")
            status, answer = 500, {"error": {"message": "the relayed verify failed on the process holding the "
                                                        "decision", "type": "server_error", "param": None,
                                             "code": "internal_error"}}
        try:
            with self.client.pipeline(transaction=False) as pipe:
                pipe.rpush(reply, json.dumps({"status": status, "body": answer}, separators=(",", ":")))
                pipe.expire(reply, REPLY_TTL_S)
                pipe.execute()
        except self._errors as exc:
            log.warning("relayed verify answered but not sent back: %s", exc)

    def close(self) -> None:
        """Stop listening (waits up to about a second) and for answers being sent."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
        self._pool.shutdown(wait=True)
        self.client.close()


__all__ = ["ANSWER_WAIT_S", "Answer", "REPLY_TTL_S", "VerifyRelay"]
