"""How ``pointsman serve`` talks to Redis (the budget ledger, the shared state, the verify relay): one client policy,
so a Redis that *hangs* (the process stopped, a partition that drops packets: connections stay open, nothing
answers) costs a caller at most one socket timeout per call, and the calls after one timed out none.

- ``redis_client(url, timeout_s)``: a ``redis.Redis`` with ``socket_timeout`` and ``socket_connect_timeout``
  ``timeout_s`` (default ``TIMEOUT_S``, 2 s) and redis-py's ``Retry`` set to none. Stated, not left to redis-py:
  its 10 retries with backoff, timeouts included (about 22 s against a hung Redis), are the default of
  ``redis.Redis(host=...)``; ``from_url`` (redis-py 8) gives none (measured: 2.0 s per call to a SIGSTOPped
  Redis). None is right here: the pool replaces a connection a restarted Redis closed when it hands it out
  (``ConnectionPool.get_connection`` checks it), a call that failed or timed out may still have been applied (a
  reserve sent again finds its own hold: ``dup``; a release sent again finds no record), and every caller keeps
  what it sent until Redis confirms it (the outcome log's outbox, the spend journal, the unsent releases), so a
  retry inside the call would buy nothing but the wait.
- ``HangGate``: after a call timed out, calls through the gate fail at once (``Hung``) for ``HUNG_PAUSE_S``; then
  one call tries again while the others keep failing at once until its timeout has passed. So a hung Redis costs
  the callers of one client one socket timeout per ``TIMEOUT_S + HUNG_PAUSE_S``, not one per call (a call that
  tries again waits at most ``timeout_s``; the others do not wait).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import redis
from redis.backoff import NoBackoff
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

if TYPE_CHECKING:  # pragma: no cover
    from redis import Redis

T = TypeVar("T")

#: Seconds a Redis call waits for an answer (socket read and connect), at most, per try.
TIMEOUT_S = 2.0
#: Seconds calls through a ``HangGate`` fail at once after one timed out (then one tries again).
HUNG_PAUSE_S = 1.0


def retry_policy() -> Retry:
    """No retry (module docstring)."""
    return Retry(NoBackoff(), 0)


def redis_client(url: str, timeout_s: float = TIMEOUT_S, **kwargs: Any) -> Redis:
    """A ``redis.Redis`` for ``url`` (``redis://``, ``rediss://``, ``unix://``; query parameters go to redis-py) with
    ``decode_responses=True`` and the module's timeouts and retry policy; ``kwargs`` go to ``from_url`` too.
    Connects lazily; raises ``ValueError`` for a malformed URL."""
    return redis.Redis.from_url(url, decode_responses=True, socket_timeout=timeout_s,
                                socket_connect_timeout=timeout_s, retry=retry_policy(), **kwargs)


class Hung(RedisTimeoutError):
    """Refused without waiting: a call to this Redis timed out less than ``HUNG_PAUSE_S`` ago (``HangGate``)."""


class HangGate:
    """``gate.call(fn)`` runs ``fn`` (a call to one Redis client) unless that Redis hangs (module docstring); raises
    ``Hung`` at once then, else what ``fn`` raises. ``timeout_s``: the client's socket timeout (s). Thread-safe."""

    def __init__(self, timeout_s: float = TIMEOUT_S) -> None:
        self.timeout_s = float(timeout_s)
        self._until: float | None = None  # monotonic s: calls fail at once until then
        self._lock = threading.Lock()

    @classmethod
    def of(cls, client: Redis) -> HangGate:
        """A gate for ``client`` (its socket timeout)."""
        return cls(float(client.connection_pool.connection_kwargs.get("socket_timeout") or TIMEOUT_S))

    @property
    def hung(self) -> bool:
        """Whether calls fail at once now."""
        until = self._until
        return until is not None and time.monotonic() < until

    def call(self, fn: Callable[[], T]) -> T:
        self._enter()
        try:
            out = fn()
        except RedisTimeoutError:
            self._until = time.monotonic() + HUNG_PAUSE_S
            raise
        self._until = None
        return out

    async def acall(self, fn: Callable[[], Awaitable[T]]) -> T:
        """``call`` for a call awaited on an event loop (``fn`` raises ``redis.exceptions.TimeoutError`` when it
        timed out)."""
        self._enter()
        try:
            out = await fn()
        except RedisTimeoutError:
            self._until = time.monotonic() + HUNG_PAUSE_S
            raise
        self._until = None
        return out

    def _enter(self) -> None:
        """Raise ``Hung`` while calls fail at once; else let this call try."""
        with self._lock:
            until = self._until
            if until is not None:
                now = time.monotonic()
                if now < until:
                    raise Hung("redis: not answering (a call timed out); refused without waiting")
                self._until = now + self.timeout_s + HUNG_PAUSE_S  # this call tries; the others fail at once meanwhile


__all__ = ["HUNG_PAUSE_S", "TIMEOUT_S", "HangGate", "Hung", "redis_client", "retry_policy"]
