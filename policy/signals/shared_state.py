"""Live state shared by several workers and replicas: in-flight dispatches, pushed telemetry,
health marks and session affinity, through Redis.

Every process keeps its own ``FleetState`` and decides from it without a network round trip.
What one process changes, it also *publishes*; every other process *applies* it to its own
state. Redis holds the authoritative copy (so a process that starts, or reconnects after a
gap, loads it whole) and a stream of changes (so running processes follow in order):

    {P}rec:<decision_id>      string  a dispatched decision's record (JSON), until its outcome
                                      arrives or it expires (TTL = the in-flight TTL)
    {P}tel:<endpoint id>      string  the latest pushed telemetry of an endpoint (JSON, wall clock)
    {P}health                 hash    endpoint id -> reason, for endpoints marked unhealthy
    {P}sess:<session_id>      string  the session's last (target, endpoint) (TTL = session TTL; for
                                      operators: processes learn sessions from the stream)
    {P}reloads                hash    file (policy, fleet, budgets) -> how many times an admin reloaded it
                                      through an endpoint; a process back from a gap re-reads those whose
                                      count changed (the announce in the stream may fall in the gap)
    {P}changes                stream  one entry per change: dispatch, release, telemetry, health, and
                                      an admin's reload of a file (each process re-reads its own copy)
                                      (capped at ``stream_max_len`` entries, approximately)
    {P}inbox:<inbox id>       stream  outcomes another replica received for decisions logged in
                                      this inbox's outcome log (fields ``o`` the outcome's JSON, ``k``
                                      its key, ``f`` the forwarder's inbox), until that log stores them
    {P}acks:<inbox id>        stream  keys of outcomes this inbox forwarded that their owner's log
                                      stored (field ``k``: a JSON list), until this inbox reads them
                                      (capped at ``ACKS_MAX_LEN`` entries, approximately)
    {P}epoch                  string  the store's incarnation (``pointsman.redis_epoch``): created by
                                      the forward script before its entries

An *inbox* is an outcome log: every process that writes to the same log file (the workers of
one ``pointsman serve``) has the same inbox id (``OutcomeLog.log_id``), and each decision's
signed id names the inbox of the process that dispatched it (``signed_ids``). An outcome posted
to a replica with another inbox is *forwarded* (``forward``): the replica keeps it in its own
log's outbox (``OutcomeLog`` ``forwards``, ``fsync``ed before it answers) and appends it to that
inbox's stream; the owner's reader stores it in its log (idempotent: a redelivered outcome is a
duplicate there), then, in one round trip, acknowledges its key on the forwarder's ``acks`` stream
and deletes the entry; the forwarder's reader reads the acknowledgement and forgets the outbox row
(``confirm``). A row the stream may have lost is sent again (the service's ``resend_forwards``): one
whose send failed or timed out (a hung Redis may still apply it), and every row sent to another
incarnation than the current one (``incarnation``: a new epoch after ``FLUSHALL`` or a new volume, a
new ``run_id`` after a restart on a file cut short), and every row left unconfirmed (its acknowledgement
trimmed from the capped ``acks`` stream before the forwarder read it, or an owner that acknowledges none: an
earlier version), after ``runtime.FORWARD_CONFIRM_S`` and then a doubling wait. Sending again is harmless
(the owner stores a key once and acknowledges it again), so the outcome ends up in the owner's log only,
whatever Redis lost. Budget and load are settled by the replica that received the outcome, from the signed id.

``P`` is the key prefix, default ``{pointsman-state}:`` (one hash slot in a cluster).

Round trips: a dispatch is one (a Lua script writes the record, the session and the stream
entry; the service's decisions on its event loop queue it, the loop sends what is queued in one
script call on its own connection, and each awaits its write before answering: ``deferred_writes``); an outcome or
release is one (a Lua script takes the record, whichever process wrote it, and appends the release);
a forwarded outcome is one more; a telemetry push or a health mark is one. Decisions read only the
local state: none. A reader thread per process blocks on the stream (``XREAD``) and applies the
others' changes, within ``READ_INTERVAL_S`` (20 ms) and a round trip of their write: while changes
keep coming it reads at most every 20 ms, taking what arrived meanwhile. Each stream entry names its
process (field ``o``), so a reader skips its own without parsing them.

What can go wrong, and what happens then:

- **Redis unreachable**: decisions go on from the local state (this process's own dispatches
  and its last view of the others'); writes are counted as failed
  (``SyncStatus.write_errors``) and not retried, except releases: an outcome's release is kept
  in memory and published once Redis answers again (so the dispatching process stops counting
  it); the reader reconnects every second and then reloads the whole state, so counts converge
  again.
- **Redis hangs** (stopped, or a partition that drops packets: connections open, no answer): as
  unreachable, once a call timed out. Every call of a decision or an outcome (dispatch write, release,
  forward, the incarnation read) goes through one ``HangGate`` (``pointsman.redis_client``): the first
  call waits one socket timeout (``timeout_s``, 2 s; the client retries nothing), then calls fail at
  once for a second, then one tries again while the others fail at
  once. So a decision or an outcome answer waits at most one socket timeout for Redis; what was not
  sent stays where it was kept (the release in memory, the forwarded outcome in the outbox).
- **The reader falls behind** the stream's cap (more than ``stream_max_len`` changes while it
  was away): it notices the gap and reloads the whole state. It looks for a gap only after a full
  read (``READ_COUNT`` entries, or ``stream_max_len``): a shorter one holds every entry after its last,
  so none was trimmed (one round trip per read fewer).
- **A process dies** with requests in flight: their records expire after the in-flight TTL
  (the budget reservation TTL) and their counts with them, on every process (each expires
  dispatches by age). Outcomes
  forwarded to its inbox wait in the inbox stream (and the forwarders' outboxes) until a process
  with that log starts again.
- **Redis loses its data** (restarted without persistence, flushed, a new volume): in-flight
  records and health marks are gone; counts converge as the processes reload (run Redis with AOF,
  ``appendfsync everysec``, to bound this at 1 s). Forwarded outcomes not yet stored are sent again
  from the forwarders' outboxes (a new epoch or ``run_id``).

Times cross processes as wall-clock Unix seconds; each process converts them to its own
monotonic clock when applying.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import ssl
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import asdict, dataclass, field, is_dataclass, replace
from typing import TYPE_CHECKING, Literal, Protocol

import hiredis
import orjson

from pointsman.errors import DataError
from pointsman.redis_client import HangGate, redis_client
from pointsman.redis_epoch import EPOCH_LUA, INCARNATION_LUA, INCARNATION_RETURN_LUA, incarnation_of

if TYPE_CHECKING:  # pragma: no cover
    from redis import Redis
    from redis.commands.core import Script
    from redis.connection import ConnectionInterface

log = logging.getLogger("pointsman.state")

DEFAULT_PREFIX = "{pointsman-state}:"
#: Approximate cap of the change stream (entries); a reader further behind reloads the state.
DEFAULT_STREAM_MAX_LEN = 200_000

ChangeKind = Literal["dispatch", "release", "telemetry", "health", "reload"]
#: Seconds between the reader's checks of ``{P}reloads`` (``RedisSync._check_reloads``).
RELOAD_CHECK_S = 5.0
#: Stream entries the reader takes per ``XREAD``.
READ_COUNT = 1000
#: Seconds from one ``XREAD`` that brought changes to the next, at least: while changes keep coming,
#: each read takes what arrived meanwhile. A read costs a wake-up of the thread for its reply, as much
#: CPU as applying a change, and one read per change was the rule at moderate rates; with the pause,
#: two wake-ups per interval (the pause, the reply) take every change of that interval
#: (``bench_state.py --sync-cpu``: at 300 dispatches/s the readers' CPU per dispatch fell by half with
#: 20 ms, little with 5 ms). Another process's change is applied within this much (plus the round trip)
#: of its write: in-flight counts, sessions and telemetry from the other workers are that much older.
READ_INTERVAL_S = 0.02
#: Releases kept while Redis is unreachable, at most (the oldest are dropped: their records expire).
MAX_UNSENT_RELEASES = 100_000
#: Dispatch writes sent in one script call at most (``deferred_writes``).
MAX_PIPELINE = 512
#: Acknowledgement entries an ``acks`` stream keeps at most (approximately): a live forwarder reads its own
#: within a read interval; the cap bounds those of a forwarder gone for good (one away long enough to miss some sends
#: its unconfirmed rows again: ``runtime.FORWARD_CONFIRM_S``).
ACKS_MAX_LEN = 10_000
#: ``deliver(payloads)``: store outcomes forwarded to this inbox (JSON texts of ``OutcomeIn``);
#: True once they are durable in the log (their entries are deleted), False to keep them.
Deliver = Callable[[list[str]], bool]
#: ``confirm(keys)``: forget the outbox rows of outcomes this inbox forwarded that their owner's log stored
#: (outcome keys); True once done (the acknowledgements are deleted), False to keep them.
Confirm = Callable[[list[str]], bool]
#: One outcome to forward: (the owner's inbox, the outcome's key, its JSON).
Forward = tuple[str, str, str]


def _dumps(value: object) -> str:
    """Compact JSON of ``value`` (dicts, lists, tuples, dataclasses such as ``SharedRecord``): orjson,
    a tenth of ``json.dumps``' CPU on the decision path; the standard library for what orjson refuses
    (an integer past 64 bits, a non-finite float, which ``json`` writes as Python reads it back)."""
    try:
        if not _nonfinite(value):
            return orjson.dumps(value).decode()
    except (orjson.JSONEncodeError, TypeError):
        pass
    plain = asdict(value) if is_dataclass(value) and not isinstance(value, type) else value
    if isinstance(plain, dict) and isinstance(plain.get("record"), SharedRecord):
        plain = {**plain, "record": asdict(plain["record"])}
    return json.dumps(plain, separators=(",", ":"))


def _nonfinite(value: object) -> bool:
    """Whether a telemetry snapshot in ``value`` holds a NaN or infinite float (orjson would write null)."""
    snapshot = value.get("snapshot") if isinstance(value, dict) else None
    return isinstance(snapshot, Mapping) and any(isinstance(v, float) and not math.isfinite(v)
                                                 for v in snapshot.values())


@dataclass(frozen=True)
class SharedRecord:
    """What a dispatched decision holds, as it travels between processes: the fields of
    ``fleet_state.DispatchRecord`` with the dispatch time as wall-clock ``wall_s`` (Unix s), and
    the ``inbox`` (outcome log id) of the process that dispatched it ("" when it has none)."""

    decision_id: str
    target: str
    mode: str
    endpoint: str
    prefill_endpoint: str | None
    scopes: tuple[str, ...]
    estimated_cost_usd: float
    reserved: bool
    prompt_tokens: int
    prefill_utilization: float
    decode_utilization: float
    wall_s: float
    inbox: str = ""
    output_cap_tokens: int = 0
    cached_tokens: int = 0

    def to_json(self) -> str:
        """Compact JSON."""
        return _dumps(self)

    @classmethod
    def from_json(cls, text: str | bytes) -> SharedRecord:
        """The record from ``to_json``'s text; raises ``ValueError`` for anything else."""
        data = orjson.loads(text)
        if not isinstance(data, dict):
            raise ValueError("a shared record must be a JSON object")
        data["scopes"] = tuple(data.get("scopes") or ())
        return cls(**data)


@dataclass(frozen=True)
class Change:
    """One change another process made: ``kind``, the publishing ``origin``, ``wall_s``, and
    per kind: a dispatch's ``record``, ``block_hashes`` (+ ``gateway_ids``) and ``session_id``;
    a release's ``decision_id``; a telemetry push's ``endpoint`` and ``snapshot``; a health
    mark's ``endpoint``, ``healthy`` and ``reason``; a reload's file (``policy``, ``fleet``, ``budgets``)
    in ``reason``."""

    kind: ChangeKind
    origin: str
    wall_s: float
    record: SharedRecord | None = None
    block_hashes: tuple[int, ...] = ()
    gateway_ids: bool = False
    session_id: str = ""
    decision_id: str = ""
    endpoint: str = ""
    snapshot: Mapping[str, float | int] | None = None
    healthy: bool = True
    reason: str = ""

    def to_json(self) -> str:
        """Compact JSON (the stream entry's ``c`` field)."""
        data: dict[str, object] = {"kind": self.kind, "origin": self.origin, "wall_s": self.wall_s}
        if self.record is not None:
            data["record"] = self.record
        for name in ("block_hashes", "gateway_ids", "session_id", "decision_id", "endpoint", "snapshot",
                     "healthy", "reason"):
            value = getattr(self, name)
            if value not in ((), False, "", None) or (name == "healthy" and self.kind == "health"):
                data[name] = value
        return _dumps(data)

    @classmethod
    def from_json(cls, text: str | bytes) -> Change:
        """The change from ``to_json``'s text; raises ``ValueError``/``TypeError`` for anything else."""
        data = orjson.loads(text)
        if not isinstance(data, dict) or data.get("kind") not in ("dispatch", "release", "telemetry", "health",
                                                               "reload"):
            raise ValueError(f"not a state change: {str(text)[:80]!r}")
        record = data.pop("record", None)
        if record is not None:
            record["scopes"] = tuple(record.get("scopes") or ())
            data["record"] = SharedRecord(**record)
        if "block_hashes" in data:
            data["block_hashes"] = tuple(int(h) for h in data["block_hashes"])
        return cls(**data)


@dataclass(frozen=True)
class SharedView:
    """The whole shared state as read at start-up or after a gap: live ``records``, latest
    ``telemetry`` per endpoint (``(snapshot, wall_s)``), ``unhealthy`` endpoints with reasons."""

    records: tuple[SharedRecord, ...] = ()
    telemetry: Mapping[str, tuple[Mapping[str, float | int], float]] = field(default_factory=dict)
    unhealthy: Mapping[str, str] = field(default_factory=dict)


@dataclass
class SyncStatus:
    """Counters of a ``StateSync`` (``/v1/fleet``, ``/metrics``): whether it ``shared`` state at
    all, ``connected`` (the reader's last Redis call succeeded), changes ``applied`` from other
    processes, ``reloads`` of the whole state, ``write_errors``, ``last_error``, ``lag_s`` (how
    old the last applied change was when applied), ``forwarded_in`` (outcomes other replicas
    forwarded to this inbox, stored)."""

    shared: bool
    connected: bool = False
    applied: int = 0
    reloads: int = 0
    write_errors: int = 0
    last_error: str | None = None
    lag_s: float = 0.0
    forwarded_in: int = 0


class PendingWrites:
    """The shared-state writes made inside one ``deferred_writes()`` block, still on their way to
    Redis; ``await written()`` before anything that depends on them leaves the process."""

    def __init__(self) -> None:
        self._queued: list[asyncio.Future[None]] = []

    def add(self, queued: asyncio.Future[None]) -> None:
        """One more write to wait for (done once Redis answered it, or it failed: counted)."""
        self._queued.append(queued)

    async def written(self) -> None:
        """Return once every write of the block is in Redis (or failed: counted, as any failed
        write). Does not block the event loop while it waits."""
        for queued in self._queued:
            if not queued.done():
                await queued


#: The ``PendingWrites`` of the ``deferred_writes()`` block the current context is in (None: none).
_DEFERRED: ContextVar[PendingWrites | None] = ContextVar("pointsman_deferred_writes", default=None)


@contextmanager
def deferred_writes() -> Iterator[PendingWrites]:
    """Inside the block, a dispatch's shared-state write (``StateSync.dispatch``) is queued on the
    running event loop, which sends what is queued in one script call (``_LoopWriter``), instead of a
    round trip on the caller's thread; the caller awaits ``PendingWrites.written()`` before the decision's id leaves
    the process (its answer), so an outcome can never reach another replica before its dispatch is
    in Redis. The service decides on its event loop this way: the loop serves other requests during
    the round trip. Outside the block, outside an event loop (or with ``LocalSync``) a dispatch writes as it
    returns."""
    pending = PendingWrites()
    token = _DEFERRED.set(pending)
    try:
        yield pending
    finally:
        _DEFERRED.reset(token)


class StateSync(Protocol):
    """How a ``FleetState`` shares its changes (see the module docstring). ``LocalSync`` (one
    process) shares nothing; ``RedisSync`` shares through Redis."""

    origin: str
    #: This process's inbox (outcome log id; '' for none): signed decision ids name it.
    inbox: str

    @property
    def shared(self) -> bool:
        """True when other processes see this one's changes."""
        ...

    def start(self, apply: Callable[[Change], None], reload: Callable[[SharedView], None]) -> None:
        """Begin following the others' changes: ``reload`` with the whole state first, then
        ``apply`` for each change, in order, from a background thread. Called again (a fleet
        reload built a new state), it loads the whole state into the new callbacks and follows
        on with them."""
        ...

    def dispatch(self, record: SharedRecord, block_hashes: Sequence[int], gateway_ids: bool,
                 session_id: str, session_ttl_s: float, record_ttl_s: float) -> None:
        """Publish a dispatch (one round trip; inside ``deferred_writes()`` queued and pipelined,
        awaited by the caller); never raises (a failure is counted)."""
        ...

    def take(self, decision_id: str) -> SharedRecord | None:
        """Remove a decision's record, whoever dispatched it, and publish its release (one
        round trip; kept and published later when Redis fails); the record, or None when no
        process holds it (or Redis failed)."""
        ...

    def set_inbox(self, inbox: str, deliver: Deliver, confirm: Confirm | None = None) -> None:
        """This process logs its decisions in the outcome log ``inbox``: records it dispatches
        name it, outcomes other replicas forward to it are handed to ``deliver`` by the
        reader (from ``start`` on), and the keys of outcomes it forwarded that their owner stored
        to ``confirm``."""
        ...

    def forward(self, outcomes: Sequence[Forward]) -> str:
        """Send outcomes to other logs' inboxes (one round trip); the incarnation (``incarnation``)
        that took them. Raises ``DataError`` when Redis fails or nothing is shared (when it timed out,
        Redis may still apply them)."""
        ...

    def incarnation(self) -> str:
        """The store's ``"<epoch> <run_id>"`` (``pointsman.redis_epoch``; one round trip). Raises
        ``DataError`` when Redis fails or nothing is shared."""
        ...

    def telemetry(self, endpoint: str, snapshot: Mapping[str, float | int], wall_s: float) -> None:
        """Publish a pushed telemetry snapshot (one round trip); never raises."""
        ...

    def health(self, endpoint: str, healthy: bool, reason: str) -> None:
        """Publish a health mark (one round trip); never raises."""
        ...

    def announce_reload(self, what: str) -> None:
        """Tell every other process that an admin reloaded its ``what`` file (``policy``, ``fleet``,
        ``budgets``) through an endpoint, so they re-read theirs too (one round trip); never raises."""
        ...

    def on_reload(self, hook: Callable[[str], object]) -> None:
        """Call ``hook(what)`` (from the reader thread) for every other process's ``announce_reload``."""
        ...

    def status(self) -> SyncStatus:
        """Counters (a copy)."""
        ...

    def close(self) -> None:
        """Stop following and release connections."""
        ...


class LocalSync:
    """The embedded default: one process, nothing shared."""

    def __init__(self) -> None:
        self.origin = f"local-{os.getpid()}"
        self.inbox = ""

    @property
    def shared(self) -> bool:
        """Always False."""
        return False

    def start(self, apply: Callable[[Change], None], reload: Callable[[SharedView], None]) -> None:
        """Nothing to follow."""

    def dispatch(self, record: SharedRecord, block_hashes: Sequence[int], gateway_ids: bool,
                 session_id: str, session_ttl_s: float, record_ttl_s: float) -> None:
        """Nothing to publish."""

    def take(self, decision_id: str) -> SharedRecord | None:
        """No other process: None."""
        return None

    def set_inbox(self, inbox: str, deliver: Deliver, confirm: Confirm | None = None) -> None:
        """No other process forwards anything."""

    def forward(self, outcomes: Sequence[Forward]) -> str:
        """No other log: raises ``DataError``."""
        raise DataError("no shared state to forward outcomes to")

    def incarnation(self) -> str:
        """No store: raises ``DataError``."""
        raise DataError("no shared state")

    def telemetry(self, endpoint: str, snapshot: Mapping[str, float | int], wall_s: float) -> None:
        """Nothing to publish."""

    def health(self, endpoint: str, healthy: bool, reason: str) -> None:
        """Nothing to publish."""

    def announce_reload(self, what: str) -> None:
        """No other process to tell."""

    def on_reload(self, hook: Callable[[str], object]) -> None:
        """No other process announces anything."""

    def status(self) -> SyncStatus:
        """``shared=False``."""
        return SyncStatus(shared=False, connected=True)

    def close(self) -> None:
        """Nothing to close."""


# Lua scripts: each one atomic step (Redis runs a script without interleaving other commands).
#: Dispatches, in order: ARGV = prefix, stream cap, origin, then 7 per dispatch (``RedisSync.dispatch``).
_DISPATCH = """
local p, cap, origin = ARGV[1], ARGV[2], ARGV[3]
for i = 4, #ARGV, 7 do
  redis.call('SET', p .. 'rec:' .. ARGV[i], ARGV[i + 1], 'PX', ARGV[i + 2])
  if ARGV[i + 3] ~= '' then redis.call('SET', p .. 'sess:' .. ARGV[i + 3], ARGV[i + 4], 'PX', ARGV[i + 5]) end
  redis.call('XADD', p .. 'changes', 'MAXLEN', '~', cap, '*', 'o', origin, 'c', ARGV[i + 6])
end
return 1
"""
_TAKE = """
local p = ARGV[1]
local key = p .. 'rec:' .. ARGV[2]
local rec = redis.call('GET', key)
if rec then redis.call('DEL', key) end
redis.call('XADD', p .. 'changes', 'MAXLEN', '~', ARGV[4], '*', 'o', ARGV[5], 'c', ARGV[3])
return rec
"""
_TELEMETRY = """
local p = ARGV[1]
redis.call('SET', p .. 'tel:' .. ARGV[2], ARGV[3])
redis.call('XADD', p .. 'changes', 'MAXLEN', '~', ARGV[5], '*', 'o', ARGV[6], 'c', ARGV[4])
return 1
"""
_HEALTH = """
local p = ARGV[1]
if ARGV[3] == '1' then redis.call('HDEL', p .. 'health', ARGV[2])
else redis.call('HSET', p .. 'health', ARGV[2], ARGV[4]) end
redis.call('XADD', p .. 'changes', 'MAXLEN', '~', ARGV[6], '*', 'o', ARGV[7], 'c', ARGV[5])
return 1
"""
#: Forwarded outcomes: ARGV = prefix, the forwarder's inbox, then (inbox, key, JSON) per outcome; the epoch first,
#: the incarnation that took them returned (``pointsman.redis_epoch``).
_FORWARD = EPOCH_LUA + """
for i = 3, #ARGV, 3 do
  redis.call('XADD', P .. 'inbox:' .. ARGV[i], '*', 'o', ARGV[i + 2], 'k', ARGV[i + 1], 'f', ARGV[2])
end
""" + INCARNATION_RETURN_LUA


class _Replies(asyncio.Protocol):
    """The replies on the dispatch writer's connection (``_LoopWriter``), parsed by hiredis and handed in order to
    the futures of the calls sent."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.waiting: deque[asyncio.Future[object]] = deque()
        self._reader = hiredis.Reader()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a stream socket's: an asyncio.Transport

    def data_received(self, data: bytes) -> None:
        self._reader.feed(data)
        while (reply := self._reader.gets()) is not False:
            if self.waiting and not (future := self.waiting.popleft()).done():
                future.set_result(reply)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        from redis.exceptions import ConnectionError as RedisConnectionError

        while self.waiting:
            if not (future := self.waiting.popleft()).done():
                future.set_exception(RedisConnectionError(f"connection to Redis lost: {exc or 'closed'}"))


class _LoopWriter:
    """Sends deferred dispatch writes (``deferred_writes``) from the event loop that made them, without a thread:
    what is queued when the loop next turns goes to Redis as one call of the dispatch script (``EVALSHA``, in queue
    order; one call in flight, so each process's writes land in the order it made them) on the writer's own
    connection, its replies read by the loop (``_Replies``). A writer thread cost more CPU than the round trip:
    waking it, the GIL handed back and forth, the loop woken again for the answer (``bench_state.py --sync-cpu``).
    The connection is made (handshake, AUTH, TLS: redis-py's) in a worker thread, never on the loop; a TLS socket
    cannot back a loop transport, so there each call is sent and read in a worker thread. A call waits at most the
    socket timeout (then the connection is dropped: a late reply must not answer the next call); the hang gate is
    the client's (``pointsman.redis_client``). A failed write is counted (``on_error``) and done, as a failed direct
    write: never raised; a call that lost its connection (a restarted Redis closed it) is sent once more on a new
    one, and with the script when Redis has lost it (``NOSCRIPT``). A new event loop gets a new connection."""

    def __init__(self, client: Redis, script: Script, head: Callable[[], list[str]],
                 errors: tuple[type[BaseException], ...], on_error: Callable[[BaseException], None],
                 gate: HangGate) -> None:
        from redis.exceptions import ConnectionError as RedisConnectionError
        from redis.exceptions import NoScriptError, ResponseError
        from redis.exceptions import TimeoutError as RedisTimeoutError

        self._client, self._script, self._head, self._errors, self._on_error = client, script, head, errors, on_error
        self._no_script, self._lost, self._refused, self._timeout = (NoScriptError, RedisConnectionError,
                                                                     ResponseError, RedisTimeoutError)
        self._gate = gate
        self._conn: ConnectionInterface | None = None  # redis-py's connection: its socket is the transport's
        self._replies: _Replies | None = None  # None with a connection: a TLS one, called from a worker thread
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: list[tuple[list[str], asyncio.Future[None]]] = []
        self._flushing = False

    def put(self, args: list[str]) -> asyncio.Future[None]:
        """Queue one dispatch write on the running event loop; the future is done once it is written (or failed,
        counted). Raises ``RuntimeError`` outside an event loop."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # the connection and the queue belonged to another (closed) loop
            self._drop()
            self._loop, self._queue, self._flushing = loop, [], False
        future: asyncio.Future[None] = loop.create_future()
        self._queue.append((args, future))
        if not self._flushing:
            self._flushing = True
            loop.create_task(self._flush())
        return future

    async def _flush(self) -> None:
        try:
            while self._queue:
                batch, self._queue = self._queue[:MAX_PIPELINE], self._queue[MAX_PIPELINE:]
                args = [*self._head(), *[arg for queued, _ in batch for arg in queued]]
                try:
                    await self._gate.acall(lambda args=args: self._eval_again(args))  # type: ignore[misc]
                except self._errors as exc:
                    for _ in batch:  # each write failed, as each would have on its own
                        self._on_error(exc)
                except Exception as exc:  # noqa: BLE001 - a writer that dies would hold every waiting answer
                    log.exception("shared state writer failed")
                    for _ in batch:
                        self._on_error(exc)
                for _, future in batch:
                    if not future.done():
                        future.set_result(None)
        finally:
            self._flushing = False

    async def _eval_again(self, args: list[str]) -> None:
        try:
            await self._eval(args)
        except self._lost:  # a connection Redis closed (it restarted): once more on a new one
            await self._eval(args)

    async def _eval(self, args: list[str]) -> None:
        """One call of the script on the writer's connection (made when there is none); raises what Redis
        raises (the connection is dropped then)."""
        try:
            if self._conn is None:
                await self._connect()
            try:
                await self._call("EVALSHA", self._script.sha, 0, *args)
            except self._no_script:  # a Redis that restarted has no scripts: load it with the call
                await self._call("EVAL", self._script.script, 0, *args)
        except BaseException:
            self._drop()
            raise

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        conn = self._client.connection_pool.make_connection()
        self._conn = conn
        await asyncio.to_thread(conn.connect)
        sock = conn._sock  # type: ignore[attr-defined]  # redis-py's connected socket
        if not isinstance(sock, ssl.SSLSocket):
            _, self._replies = await loop.create_connection(_Replies, sock=sock)

    async def _call(self, *command: object) -> None:
        """Send one command and wait for its reply (at most the socket timeout); raises what Redis raises."""
        conn = self._conn
        assert conn is not None
        replies = self._replies
        if replies is None:  # TLS: redis-py's blocking call, in a worker thread
            def blocking() -> None:
                conn.send_command(*command)  # type: ignore[no-untyped-call]  # redis-py leaves it unannotated
                conn.read_response()
            await asyncio.to_thread(blocking)
            return
        if replies.transport is None:
            raise self._lost("connection to Redis lost")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[object] = loop.create_future()
        replies.waiting.append(future)
        replies.transport.write(b"".join(conn.pack_command(*command)))  # type: ignore[no-untyped-call]
        timer = loop.call_later(self._gate.timeout_s, _time_out, future, self._timeout)
        try:
            reply = await future
        finally:
            timer.cancel()
        if isinstance(reply, hiredis.ReplyError):
            message = str(reply)
            raise (self._no_script if message.startswith("NOSCRIPT") else self._refused)(message)

    def _drop(self) -> None:
        """Close the connection (the next call makes a new one)."""
        conn, replies, self._conn, self._replies = self._conn, self._replies, None, None
        if replies is not None and replies.transport is not None and self._loop is not None \
                and not self._loop.is_closed():
            replies.transport.abort()
        if conn is not None:
            conn.disconnect()  # type: ignore[no-untyped-call]  # redis-py leaves it unannotated

    def close(self) -> None:
        """Close the connection (writes still queued on a running loop go out on a new one)."""
        loop = self._loop
        if loop is not None and not loop.is_closed() and loop.is_running():
            try:
                loop.call_soon_threadsafe(self._drop)
                return
            except RuntimeError:  # closed meanwhile
                pass
        self._drop()


def _time_out(future: asyncio.Future[object], timeout: type[BaseException]) -> None:
    if not future.done():
        future.set_exception(timeout("Timeout reading from socket"))


class RedisSync:
    """Shared state in Redis (see the module docstring).

    ``RedisSync(client, prefix=DEFAULT_PREFIX, stream_max_len=DEFAULT_STREAM_MAX_LEN,
    block_ms=1000)``: ``client`` a ``redis.Redis`` with ``decode_responses=True``
    (``from_url`` builds one). Thread-safe: writes come from request threads, the reader is
    its own thread."""

    def __init__(self, client: Redis, *, prefix: str = DEFAULT_PREFIX,
                 stream_max_len: int = DEFAULT_STREAM_MAX_LEN, block_ms: int = 1000) -> None:
        import redis

        self.client = client
        self.prefix = prefix
        self.stream_max_len = int(stream_max_len)
        self.block_ms = int(block_ms)
        self.origin = f"{os.uname().nodename}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._errors: tuple[type[BaseException], ...] = (redis.exceptions.RedisError, OSError)
        self._dispatch = client.register_script(_DISPATCH)
        self._take = client.register_script(_TAKE)
        self.inbox = ""
        self._unsent: deque[str] = deque(maxlen=MAX_UNSENT_RELEASES)  # releases Redis did not take
        self._unsent_reloads: dict[str, None] = {}  # reload announcements Redis did not take, in order
        self._reload_counts: dict[str, str] = {}  # {P}reloads as of the last load
        self._deliver: Deliver | None = None
        self._confirm: Confirm | None = None
        self._forward = client.register_script(_FORWARD)
        self._forward_errors: tuple[type[BaseException], ...] = (*self._errors, ValueError)  # ValueError: a bad reply
        self._incarnation = client.register_script(INCARNATION_LUA)
        self._telemetry = client.register_script(_TELEMETRY)
        self._health = client.register_script(_HEALTH)
        self._status = SyncStatus(shared=True)
        self._lock = threading.Lock()
        self._reader_conn: ConnectionInterface | None = None  # the reader thread's own (``_xread``)
        self._gate = HangGate.of(client)  # the writes of decisions and outcomes (module docstring: Redis hangs)
        self._writer = _LoopWriter(client, self._dispatch, self._dispatch_head, self._errors,
                                   self._write_failed("dispatch"), self._gate)
        self._closed = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._apply: Callable[[Change], None] = _ignore
        self._reload: Callable[[SharedView], None] = _ignore
        self._reload_hook: Callable[[str], object] = _ignore

    @classmethod
    def from_url(cls, url: str, *, timeout_s: float = 2.0, block_ms: int = 1000) -> RedisSync:
        """``redis://[:password@]host:port/db`` (``rediss://``, ``unix://`` too); query ``prefix``
        sets the key prefix. ``block_ms``: how long the reader waits per ``XREAD`` (and so at most
        how long ``close`` waits for it); ``timeout_s``: the socket timeout (``pointsman.redis_client``).
        Connects lazily; raises ``ValueError`` for a malformed URL."""
        from urllib.parse import parse_qs, urlencode, urlsplit, urlunsplit

        parts = urlsplit(url)
        if parts.scheme not in ("redis", "rediss", "unix"):
            raise ValueError(f"state URL '{url}': scheme '{parts.scheme}' is not redis, rediss or unix")
        query = parse_qs(parts.query)
        prefix = query.pop("prefix", [DEFAULT_PREFIX])[-1]
        clean = urlunsplit(parts._replace(query=urlencode(query, doseq=True)))
        client = redis_client(clean, timeout_s, health_check_interval=30)
        return cls(client, prefix=prefix, block_ms=block_ms)

    @property
    def shared(self) -> bool:
        """Always True."""
        return True

    @property
    def gate(self) -> HangGate:
        """The ``HangGate`` every call of a decision or an outcome to this Redis goes through (the verify relay's too)."""
        return self._gate

    # -- writes

    def _write(self, what: str, call: Callable[[], object]) -> object:
        try:
            return self._gate.call(call)
        except self._errors as exc:
            self._write_failed(what)(exc)
            return None

    def _write_failed(self, what: str) -> Callable[[BaseException], None]:
        """Count and log a failed write of ``what``."""
        def failed(exc: BaseException) -> None:
            with self._lock:
                self._status.write_errors += 1
                self._status.last_error = f"{what}: {type(exc).__name__}: {exc}"
            log.warning("shared state %s failed: %s", what, exc)
        return failed

    def dispatch(self, record: SharedRecord, block_hashes: Sequence[int], gateway_ids: bool,
                 session_id: str, session_ttl_s: float, record_ttl_s: float) -> None:
        """Write the record (TTL ``record_ttl_s``), the session (TTL ``session_ttl_s``) and the change."""
        if self.inbox and not record.inbox:
            record = replace(record, inbox=self.inbox)
        change = Change("dispatch", self.origin, record.wall_s, record=record, block_hashes=tuple(block_hashes),
                        gateway_ids=gateway_ids, session_id=session_id)
        args = [record.decision_id, record.to_json(), str(max(1, int(record_ttl_s * 1000))), session_id,
                _dumps([record.target, record.endpoint]), str(max(1, int(session_ttl_s * 1000))), change.to_json()]
        pending = _DEFERRED.get()
        if pending is not None and not self._closed:
            try:
                pending.add(self._writer.put(args))
                return
            except RuntimeError:  # no event loop running: written at once
                pass
        self._write("dispatch", lambda: self._dispatch(keys=[], args=[*self._dispatch_head(), *args]))

    def _dispatch_head(self) -> list[str]:
        """The dispatch script's first arguments (``_DISPATCH``)."""
        return [self.prefix, str(self.stream_max_len), self.origin]

    def take(self, decision_id: str) -> SharedRecord | None:
        """Take the record and publish its release (kept for later when Redis fails)."""
        change = Change("release", self.origin, time.time(), decision_id=decision_id)
        try:
            got = self._gate.call(lambda: self._take(keys=[], args=[self.prefix, decision_id, change.to_json(),
                                                                    str(self.stream_max_len), self.origin]))
        except self._errors as exc:
            with self._lock:
                self._status.write_errors += 1
                self._status.last_error = f"release: {type(exc).__name__}: {exc}"
                self._unsent.append(decision_id)
            return None
        if not isinstance(got, str):
            return None
        try:
            return SharedRecord.from_json(got)
        except (ValueError, TypeError) as exc:
            log.warning("shared record of %s is unreadable: %s", decision_id, exc)
            return None

    def set_inbox(self, inbox: str, deliver: Deliver, confirm: Confirm | None = None) -> None:
        """Name this process's outcome log; the reader hands outcomes forwarded to it to ``deliver``, and the
        keys of those it forwarded that their owner stored to ``confirm``."""
        with self._lock:
            self.inbox, self._deliver, self._confirm = inbox, deliver, confirm

    def forward(self, outcomes: Sequence[Forward]) -> str:
        """See ``StateSync.forward``. Raises ``DataError`` when Redis fails."""
        try:
            epoch, run_id = incarnation_of(self._gate.call(lambda: self._forward(
                keys=[], args=[self.prefix, self.inbox, *(x for o in outcomes for x in o)])))
        except self._forward_errors as exc:
            self._write_failed("forward")(exc)
            raise DataError(f"cannot forward {len(outcomes)} outcome(s): shared state unavailable "
                            f"({type(exc).__name__}: {exc})") from None
        return f"{epoch} {run_id}"

    def incarnation(self) -> str:
        """See ``StateSync.incarnation``. Raises ``DataError`` when Redis fails."""
        try:
            epoch, run_id = incarnation_of(self._gate.call(lambda: self._incarnation(keys=[], args=[self.prefix])))
        except self._forward_errors as exc:
            raise DataError(f"shared state unavailable ({type(exc).__name__}: {exc})") from None
        return f"{epoch} {run_id}"

    def shared_key(self, candidate: str) -> str:
        """The decision signing key every replica shares (hex): ``candidate`` stored the first
        time (``SET NX``), else the one stored before. Raises ``DataError`` when Redis fails."""
        key = f"{self.prefix}decision-key"
        try:
            self.client.set(key, candidate, nx=True)
            got = self.client.get(key)
        except self._errors as exc:
            raise DataError(f"cannot read the decision signing key from the shared state "
                            f"({type(exc).__name__}: {exc})") from None
        if not isinstance(got, str) or not got:
            raise DataError("the shared state holds no decision signing key")
        return got

    def _send_releases(self) -> None:
        """Publish the releases Redis did not take while it was away (after a reload). Raises
        what Redis raises (the rest stay kept)."""
        while True:
            with self._lock:
                if not self._unsent:
                    return
                decision_id = self._unsent[0]
            change = Change("release", self.origin, time.time(), decision_id=decision_id)
            self._take(keys=[], args=[self.prefix, decision_id, change.to_json(), str(self.stream_max_len),
                                      self.origin])
            with self._lock:
                if self._unsent and self._unsent[0] == decision_id:
                    self._unsent.popleft()

    def telemetry(self, endpoint: str, snapshot: Mapping[str, float | int], wall_s: float) -> None:
        """Write the endpoint's latest snapshot and the change."""
        change = Change("telemetry", self.origin, wall_s, endpoint=endpoint, snapshot=dict(snapshot))
        value = json.dumps({"snapshot": dict(snapshot), "wall_s": wall_s}, separators=(",", ":"))
        self._write("telemetry", lambda: self._telemetry(keys=[], args=[
            self.prefix, endpoint, value, change.to_json(), str(self.stream_max_len), self.origin]))

    def health(self, endpoint: str, healthy: bool, reason: str) -> None:
        """Write (or clear) the endpoint's health mark and the change."""
        change = Change("health", self.origin, time.time(), endpoint=endpoint, healthy=healthy, reason=reason)
        self._write("health", lambda: self._health(keys=[], args=[
            self.prefix, endpoint, "1" if healthy else "0", reason or "marked unhealthy", change.to_json(),
            str(self.stream_max_len), self.origin]))

    def announce_reload(self, what: str) -> None:
        """Count the reload of ``what`` in ``{P}reloads`` and append a ``reload`` change naming it to the
        change stream. When Redis fails it is kept and announced once the reader is back (``_send_reloads``),
        and every process compares the counts at each reconnect and every few seconds (``_check_reloads``):
        before, an announce while Redis was down was dropped, the endpoint answered ok, and the other workers
        kept the old file."""
        try:
            self._gate.call(lambda: self._announce(what))
        except self._errors as exc:
            self._write_failed("reload")(exc)
            with self._lock:
                self._unsent_reloads[what] = None

    def _announce(self, what: str) -> None:
        change = Change("reload", self.origin, time.time(), reason=what)
        pipe = self.client.pipeline(transaction=True)
        pipe.hincrby(f"{self.prefix}reloads", what, 1)
        pipe.xadd(f"{self.prefix}changes", {"o": self.origin, "c": change.to_json()}, maxlen=self.stream_max_len,
                  approximate=True)
        pipe.execute()

    def _send_reloads(self) -> None:
        """Announce the reloads Redis did not take while it was away. Raises what Redis raises (kept)."""
        with self._lock:
            pending = list(self._unsent_reloads)
        for what in pending:
            self._announce(what)
            with self._lock:
                self._unsent_reloads.pop(what, None)

    def _check_reloads(self, first: bool) -> None:
        """Re-read the files another process reloaded that this one has not: those whose ``{P}reloads``
        count changed since this process last took it; at the ``first`` check every file counted at all,
        since this process read its files before it could follow (an admin's reload announced while it
        started would be in the count and never re-read: a worker kept the old budgets; a file unchanged
        reads as unchanged). Called at each reconnect and every ``RELOAD_CHECK_S`` while following, so an
        announce the stream did not bring (it fell in a gap, or Redis lost it) still arrives; a hook that
        raises leaves its count untaken and is tried again at the next check. Raises what Redis raises."""
        counts = {str(k): str(v) for k, v in dict(self.client.hgetall(f"{self.prefix}reloads")).items()}
        if first:
            self._reload_counts = {}
        with self._lock:
            hook = self._reload_hook
        for what, n in counts.items():
            if self._reload_counts.get(what) == n:
                continue
            try:
                hook(what)
            except Exception:  # noqa: BLE001 - one bad file must not stop the follower; tried again later
                log.exception("reloading %s announced by another process failed", what)
                continue
            self._reload_counts[what] = n

    def on_reload(self, hook: Callable[[str], object]) -> None:
        """Hand the others' ``reload`` changes to ``hook`` (``StateSync.on_reload``)."""
        with self._lock:
            self._reload_hook = hook

    # -- following the others

    def start(self, apply: Callable[[Change], None], reload: Callable[[SharedView], None]) -> None:
        """Load the whole state (``reload``), then follow the stream from where that read ended
        (``apply``), in a daemon thread; returns after the first load (or its failure). Again:
        the new callbacks get the whole state and the following changes."""
        with self._lock:
            self._apply, self._reload = apply, reload
        last = self._load(reload)
        # the process's first start only: a later one is a fleet reload's new state, maybe from inside the reload
        # hook, where the check reloaded the fleet again, recursively (a RecursionError left that worker on the
        # old fleet); the reader's checks take the counts
        if last is not None and self._thread is None:
            try:
                self._check_reloads(first=True)
            except self._errors as exc:
                log.warning("cannot read the shared reload counts: %s", exc)
        if self._thread is None:
            self._thread = threading.Thread(target=self._follow, args=(last, last is None),
                                            name="pointsman-state-sync", daemon=True)
            self._thread.start()

    def _load(self, reload: Callable[[SharedView], None]) -> str | None:
        """Read the stream's last id, then every record, telemetry and health mark; ``reload``
        with them. Returns the id to follow from (None when Redis failed)."""
        try:
            newest = self.client.xrevrange(f"{self.prefix}changes", count=1)
            last = newest[0][0] if newest else "0-0"
            records = []
            keys = list(self.client.scan_iter(match=f"{self.prefix}rec:*", count=1000))
            for value in (self.client.mget(keys) if keys else []):
                if value is not None:
                    try:
                        records.append(SharedRecord.from_json(value))
                    except (ValueError, TypeError):
                        continue
            telemetry: dict[str, tuple[Mapping[str, float | int], float]] = {}
            tel_keys = list(self.client.scan_iter(match=f"{self.prefix}tel:*", count=1000))
            for key, value in zip(tel_keys, self.client.mget(tel_keys) if tel_keys else []):
                if value is not None:
                    data = json.loads(value)
                    telemetry[key[len(self.prefix) + 4:]] = (data["snapshot"], float(data["wall_s"]))
            unhealthy = {str(k): str(v) for k, v in dict(self.client.hgetall(f"{self.prefix}health")).items()}
        except self._errors as exc:
            with self._lock:
                self._status.connected = False
                self._status.last_error = f"load: {type(exc).__name__}: {exc}"
            log.warning("cannot load the shared state: %s", exc)
            return None
        reload(SharedView(tuple(records), telemetry, unhealthy))
        with self._lock:
            self._status.connected = True
            self._status.reloads += 1
        return str(last)

    def _follow(self, last: str | None, first: bool) -> None:
        """Follow the stream from ``last`` (None: load the whole state first; ``first``: that load is the
        process's first, so no reload was missed before it)."""
        stream = f"{self.prefix}changes"
        inbox_last = acks_last = "0-0"  # delivered entries and read acknowledgements are deleted: what is left is new
        next_check = time.monotonic() + RELOAD_CHECK_S
        next_read = 0.0  # READ_INTERVAL_S after the last read that brought changes
        while not self._stop.is_set():
            with self._lock:
                apply, reload, inbox, deliver, confirm = self._apply, self._reload, self.inbox, self._deliver, self._confirm
            if last is None:
                if self._stop.wait(1.0):
                    return
                last = self._load(reload)
                inbox_last = acks_last = "0-0"
                if last is not None:
                    try:
                        self._send_releases()
                        self._send_reloads()
                        self._check_reloads(first)
                    except self._errors as exc:
                        log.warning("releases or reloads not published yet: %s", exc)
                        last = None
                        continue
                    first = False
                    next_check = time.monotonic() + RELOAD_CHECK_S
                continue
            if time.monotonic() >= next_check:
                next_check = time.monotonic() + RELOAD_CHECK_S
                try:
                    self._send_reloads()  # an announce Redis refused while this reader saw no gap
                    self._check_reloads(first=False)
                except self._errors as exc:
                    log.warning("cannot read the shared reload counts: %s", exc)
            inbox_stream = f"{self.prefix}inbox:{inbox}" if inbox and deliver is not None else None
            acks_stream = f"{self.prefix}acks:{inbox}" if inbox and confirm is not None else None
            if (wait_s := next_read - time.monotonic()) > 0 and self._stop.wait(wait_s):
                return
            next_read = time.monotonic() + READ_INTERVAL_S
            try:
                streams: dict[str | bytes | memoryview, str | bytes | memoryview | int] = {stream: last}
                if inbox_stream:
                    streams[inbox_stream] = inbox_last
                if acks_stream:
                    streams[acks_stream] = acks_last
                replies = _streams(self._xread(streams))
                if inbox_stream and (forwarded := replies.get(inbox_stream)):
                    assert deliver is not None
                    inbox_last = self._deliver_forwarded(inbox_stream, forwarded, deliver, inbox_last)
                if acks_stream and (acks := replies.get(acks_stream)):
                    assert confirm is not None
                    acks_last = self._confirm_forwarded(acks_stream, acks, confirm, acks_last)
                entries = replies.get(stream, [])
                if not entries:
                    next_read = 0.0  # the read waited for the next change: take it at once
                    continue
                # Trimming keeps the newest stream_max_len entries: had it taken our last entry, every
                # entry left would be newer and XREAD would have returned a full batch. Only then look.
                if len(entries) >= min(READ_COUNT, self.stream_max_len):
                    next_read = 0.0  # behind: read on at once
                    if last != "0-0" and not self.client.xrange(stream, min=last, max=last):
                        last = self._load(reload)  # our last entry was trimmed: later ones may be too
                        continue
            except self._errors as exc:
                with self._lock:
                    self._status.connected = False
                    self._status.last_error = f"follow: {type(exc).__name__}: {exc}"
                last = None
                continue
            with self._lock:
                self._status.connected = True
            for entry_id, fields in entries:
                last = entry_id
                if fields.get("o") == self.origin:  # this process's own change: nothing to parse or apply
                    continue
                try:
                    change = Change.from_json(fields["c"])
                except (ValueError, TypeError, KeyError) as exc:
                    log.warning("skipping an unreadable state change %s: %s", entry_id, exc)
                    continue
                if change.origin == self.origin:
                    continue
                try:
                    if change.kind == "reload":
                        with self._lock:
                            hook = self._reload_hook
                        hook(change.reason)
                    else:
                        apply(change)
                except Exception:  # noqa: BLE001 - one bad change must not stop the follower
                    log.exception("applying state change %s failed", entry_id)
                    continue
                with self._lock:
                    self._status.applied += 1
                    self._status.lag_s = max(0.0, time.time() - change.wall_s)

    def _xread(self, streams: Mapping[str | bytes | memoryview, str | bytes | memoryview | int]) -> object:
        """One blocking ``XREAD`` of ``streams`` (name -> last id read) on the reader's own connection:
        the pool's checkout, retry and reply-conversion layers cost about as much CPU per read as
        applying its change (one read per change at moderate rates). The raw reply (``_streams``
        reads it); raises what Redis raises (the connection is dropped, and made again next read)."""
        conn = self._reader_conn
        if conn is None:
            conn = self._reader_conn = self.client.connection_pool.make_connection()
        try:
            conn.send_command("XREAD", "COUNT", READ_COUNT, "BLOCK", self.block_ms, "STREAMS",  # type: ignore[no-untyped-call]
                              *streams.keys(), *streams.values())
            return conn.read_response()
        except BaseException:
            conn.disconnect()  # type: ignore[no-untyped-call]  # redis-py leaves it unannotated
            raise

    def _deliver_forwarded(self, inbox_stream: str, entries: list[tuple[str, dict[str, str]]],
                           deliver: Deliver, inbox_last: str) -> str:
        """Hand forwarded outcomes to ``deliver``; once stored, acknowledge their keys to their forwarders
        and delete their entries (one round trip). Returns the inbox id to read from next (unchanged when
        delivery failed: they are read again after a second). Raises what Redis raises."""
        payloads = [fields["o"] for _, fields in entries if "o" in fields]
        try:
            stored = deliver(payloads) if payloads else True
        except Exception:  # noqa: BLE001 - a failing log must not stop the follower; the entries stay
            log.exception("storing %d forwarded outcomes failed", len(payloads))
            stored = False
        if not stored:
            self._stop.wait(1.0)
            return inbox_last
        acks: dict[str, list[str]] = {}
        for _, fields in entries:
            if fields.get("f") and "k" in fields:
                acks.setdefault(fields["f"], []).append(fields["k"])
        pipe = self.client.pipeline(transaction=False)
        for forwarder, keys in acks.items():
            pipe.xadd(f"{self.prefix}acks:{forwarder}", {"k": _dumps(keys)}, maxlen=ACKS_MAX_LEN, approximate=True)
        pipe.xdel(inbox_stream, *[entry_id for entry_id, _ in entries])
        pipe.execute()
        with self._lock:
            self._status.forwarded_in += len(payloads)
        return entries[-1][0]

    def _confirm_forwarded(self, acks_stream: str, entries: list[tuple[str, dict[str, str]]],
                           confirm: Confirm, acks_last: str) -> str:
        """Hand the keys the owners' logs stored to ``confirm``; delete the acknowledgements once done. Returns
        the id to read from next (unchanged when ``confirm`` failed: read again after a second). Raises what
        Redis raises."""
        keys: list[str] = []
        for entry_id, fields in entries:
            try:
                keys.extend(str(k) for k in json.loads(fields["k"]))
            except (ValueError, TypeError, KeyError) as exc:
                log.warning("skipping an unreadable acknowledgement %s: %s", entry_id, exc)
        try:
            done = confirm(keys) if keys else True
        except Exception:  # noqa: BLE001 - a failing log must not stop the follower; the acknowledgements stay
            log.exception("forgetting %d forwarded outcomes failed", len(keys))
            done = False
        if not done:
            self._stop.wait(1.0)
            return acks_last
        self.client.xdel(acks_stream, *[entry_id for entry_id, _ in entries])
        return entries[-1][0]

    def status(self) -> SyncStatus:
        """Counters (a copy)."""
        with self._lock:
            return SyncStatus(**asdict(self._status))

    def close(self) -> None:
        """Send the queued writes, stop the reader and close the connection pool."""
        self._closed = True
        self._writer.close()
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.block_ms / 1000.0 + 2.0)
        if self._reader_conn is not None:
            self._reader_conn.disconnect()  # type: ignore[no-untyped-call]  # redis-py leaves it unannotated
        self.client.close()


def _ignore(_: object) -> None:
    """The callback before ``start``."""


def _streams(reply: object) -> dict[str, list[tuple[str, dict[str, str]]]]:
    """Stream name -> its ``(id, fields)`` entries, from an ``XREAD`` reply (RESP2 list or RESP3 map)."""
    if isinstance(reply, dict):
        reply = list(reply.items())
    if not isinstance(reply, list):
        return {}
    out: dict[str, list[tuple[str, dict[str, str]]]] = {}
    for stream in reply:
        if not isinstance(stream, (list, tuple)) or len(stream) < 2 or not isinstance(stream[1], list):
            continue
        out[str(stream[0])] = [(str(entry_id), _fields(fields)) for entry_id, fields in stream[1]]
    return out


def _fields(fields: object) -> dict[str, str]:
    """A stream entry's fields: a flat ``[k1, v1, k2, v2, ...]`` (a raw RESP2 reply) or a mapping
    (what ``redis-py`` makes of one)."""
    if isinstance(fields, list):
        return {str(k): str(v) for k, v in zip(fields[::2], fields[1::2], strict=False)}
    return {str(k): str(v) for k, v in dict(fields).items()}  # type: ignore[call-overload]  # a mapping


def open_sync(url: str | None) -> StateSync:
    """The sync a state URL names: None or ``""`` → ``LocalSync``; ``redis://``, ``rediss://``,
    ``unix://`` → ``RedisSync``. Raises ``ValueError`` for another scheme."""
    if not url:
        return LocalSync()
    return RedisSync.from_url(url)


__all__ = ["ACKS_MAX_LEN", "Change", "Confirm", "Deliver", "Forward", "LocalSync", "RedisSync", "SharedRecord",
           "SharedView", "StateSync", "SyncStatus", "open_sync"]
