"""The decision and outcome log's store (``OutcomeLog``): what Pointsman decided, and what came of it.

Embedded store: one SQLite file (stdlib ``sqlite3``, WAL mode), by default
``<data_dir>/outcomes.db`` (``$POINTSMAN_DATA_DIR``, else ``./data``). The service
appends a decision when it decides (``append_decision``) and the outcomes the gateway
reports (``append_outcomes``); training reads them back joined by decision id
(``joined``). Serving-safe: imports only the standard library, numpy and pydantic.

Durability. Outcomes are committed with ``PRAGMA synchronous=FULL``: when
``append_outcomes`` returns, every outcome it reports as ``stored`` or ``duplicate`` is
on disk (fsynced WAL), and so is every decision appended before it (the WAL is one
sequential file). Concurrent ``append_outcomes`` calls are group-committed
(``pointsman.group_commit``): the calls that arrive while one commit's ``fsync`` runs share
the next transaction and ``fsync``, and each returns only after that ``fsync``. So an
acknowledgement waits for at least one ``fsync``: its latency's tail is the disk's ``fsync``
tail. Opened with ``fsync_interval_s > 0`` the log trades that for a bounded window instead:
outcomes commit with ``synchronous=NORMAL`` (written to the WAL, in the OS page cache, when
``append_outcomes`` returns: they survive the death of the process, SIGKILL included), and a
background thread (``_WalKeeper``) ``fsync``s the WAL at most ``fsync_interval_s`` after each
commit; an OS crash or power loss may lose the outcomes acknowledged in that last interval
plus one ``fsync``.
Decisions commit with ``synchronous=NORMAL``: they survive a killed process; on power loss
the last decisions not followed by an outcome commit may roll back.

Privacy. A decision keeps the request features (``RequestFeatures`` minus its text), the
estimator's head input vector (embedding ⊕ request features, float32) so a new head can
be trained without the prompt, a sha256 of the conversation and a leakage-safe
conversation key (``datasets.splits.group_key``, a sha1 prefix). The prompt text (the
bounded query window the encoder reads, at most ``QUERY_WINDOW_CHARS``) is stored only
when the log is opened with ``store_prompts=True``.

Idempotency. A decision id is stored once (a repeated append is a no-op). An outcome is
keyed by ``outcome_id`` (default: its decision id): the same key with the same content is
acknowledged again as ``duplicate``; with different content it is a ``conflict`` and
nothing changes. An outcome whose decision is not in the log is ``unknown_decision``, unless
the caller vouches for the decision (``known``: the service verified its signed id): then it is
stored as an *orphan* until its decision arrives (another worker's decision still in that
worker's memory, a decision whose log write failed). ``joined`` pairs an outcome with its decision whenever both are here;
the ``REFERENCES`` clauses are not enforced for that reason.

Tables::

    decisions(decision_id PK, time_s, tenant, target, model, mode, rule, p_hard,
              difficulty_available, estimated_cost_usd, estimator_version, policy_revision,
              fleet_revision, request_features JSON, feature_space, head_input BLOB float32,
              prompt_sha256, conversation_key, prompt_text, prompt_tokens, api_key_id)
    outcomes(outcome_id PK, decision_id, received_s, time_s, served_target, served_model,
             shadow, status, error, prompt_tokens, cached_tokens, completion_tokens,
             ttft_ms, tpot_ms, e2e_latency_ms, judge_score, judge_reference_score, judge,
             user_rating, regenerated, escalated, payload_sha256, served_endpoint, upstream_status)
    verifications(decision_id PK, time_s, action, rule, p_bad, verifier, escalation_id,
                  escalation_target, estimated_cost_usd, features JSON, draft_text)
    unsettled(outcome_id PK, outcome JSON)
    forwards(outcome_id PK, inbox, outcome JSON, received_s, sent, sent_s)
    fleet_revisions(revision PK, kinds JSON {target: kind})

``unsettled`` holds the outcomes stored (or forwarded: kept in ``forwards``) but not yet settled that no
gateway resends (ext_proc records them itself): written in the transaction that stores the outcome, deleted
once it is settled, and settled at the next start when the process died in between
(``append_outcomes(unsettled=True)``).

``forwards`` is the outbox of outcomes whose decision another replica's log holds (its ``inbox``,
``policy.signals.shared_state``): written in the transaction of ``append_outcomes(forwards=...)``, so as durable as
a stored outcome when the service acknowledges it ``forwarded``; ``sent`` the Redis incarnation (``"<epoch>
<run_id>"``) that took it (NULL: not yet, or its send failed), ``sent_s`` when (Unix s); deleted once the owner's log stored it
(``forwards_confirmed``), or after ``FORWARD_KEEP_S`` (``drop_forwards``). ``forwards_due`` names the rows to send
again. Retraining reads none of them: they are not this log's outcomes.

``verifications`` holds one row per verified draft (``POST /v1/verify``, a cascade): the
verifier's answer and the draft's features (``estimator.draft.DraftFeatures``), so a verifier
head can be trained from logged outcomes; the draft's text only when the operator opted in
(``POINTSMAN_STORE_DRAFTS``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias

import numpy as np
from numpy.typing import NDArray

from pointsman.data_dir import data_dir
from pointsman.errors import DataError
from pointsman.estimator.features import QUERY_WINDOW_CHARS, RequestFeatures
from pointsman.group_commit import GroupCommit
from pointsman.outcome import OutcomeIn, QualitySignals, Usage, parse_outcomes
from pointsman.outcome_log.records import (
    DecisionRecord,
    LoggedDecision,
    LoggedOutcome,
    OutcomeAck,
    decision_record,
)
from pointsman.sqlite_tx import Phase, transaction

if TYPE_CHECKING:  # pragma: no cover
    from pointsman.estimator.estimate import Estimator
    from pointsman.policy.decision import Decision
    from pointsman.request import RouteRequest

log = logging.getLogger("pointsman.outcome_log")

#: A value SQLite stores or returns (``sqlite3``'s adapted types).
SQLValue: TypeAlias = str | int | float | bytes | None

SCHEMA_VERSION = 1
#: Default file name inside the data folder.
DEFAULT_FILE = "outcomes.db"
#: WAL size from which the background keeper checkpoints (SQLite's automatic checkpoint: 1,000 pages).
CHECKPOINT_BYTES = 4 * 1024 * 1024

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS decisions (
    decision_id TEXT PRIMARY KEY,
    time_s REAL NOT NULL,
    tenant TEXT,
    target TEXT NOT NULL,
    model TEXT NOT NULL,
    mode TEXT NOT NULL,
    rule TEXT NOT NULL,
    p_hard REAL,
    difficulty_available INTEGER NOT NULL,
    estimated_cost_usd REAL,
    estimator_version TEXT,
    policy_revision TEXT,
    fleet_revision TEXT,
    request_features TEXT NOT NULL,
    feature_space TEXT,
    head_input BLOB,
    prompt_sha256 TEXT NOT NULL,
    conversation_key TEXT NOT NULL,
    prompt_text TEXT
);
CREATE INDEX IF NOT EXISTS decisions_time ON decisions(time_s);
CREATE TABLE IF NOT EXISTS outcomes (
    outcome_id TEXT PRIMARY KEY,
    decision_id TEXT NOT NULL REFERENCES decisions(decision_id),
    received_s REAL NOT NULL,
    time_s REAL,
    served_target TEXT,
    served_model TEXT,
    shadow INTEGER NOT NULL,
    status TEXT NOT NULL,
    error TEXT,
    prompt_tokens INTEGER,
    cached_tokens INTEGER,
    completion_tokens INTEGER,
    ttft_ms REAL,
    tpot_ms REAL,
    e2e_latency_ms REAL,
    judge_score REAL,
    judge_reference_score REAL,
    judge TEXT,
    user_rating REAL,
    regenerated INTEGER,
    escalated INTEGER,
    payload_sha256 TEXT NOT NULL,
    served_endpoint TEXT,
    upstream_status INTEGER
);
CREATE INDEX IF NOT EXISTS outcomes_decision ON outcomes(decision_id);
CREATE TABLE IF NOT EXISTS unsettled (outcome_id TEXT PRIMARY KEY, outcome TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS forwards (outcome_id TEXT PRIMARY KEY, inbox TEXT NOT NULL, outcome TEXT NOT NULL,
                                     received_s REAL NOT NULL, sent TEXT);
CREATE TABLE IF NOT EXISTS verifications (
    decision_id TEXT PRIMARY KEY REFERENCES decisions(decision_id),
    time_s REAL NOT NULL,
    action TEXT NOT NULL,
    rule TEXT NOT NULL,
    p_bad REAL NOT NULL,
    verifier TEXT NOT NULL,
    escalation_id TEXT,
    escalation_target TEXT,
    estimated_cost_usd REAL,
    features TEXT NOT NULL,
    draft_text TEXT
);
CREATE TABLE IF NOT EXISTS fleet_revisions (revision TEXT PRIMARY KEY, kinds TEXT NOT NULL);
"""

_DECISION_COLUMNS = (
    "decision_id", "time_s", "tenant", "target", "model", "mode", "rule", "p_hard", "difficulty_available",
    "estimated_cost_usd", "estimator_version", "policy_revision", "fleet_revision", "request_features",
    "feature_space", "head_input", "prompt_sha256", "conversation_key", "prompt_text", "prompt_tokens", "api_key_id",
)
_OUTCOME_COLUMNS = (
    "outcome_id", "decision_id", "received_s", "time_s", "served_target", "served_model", "shadow", "status",
    "error", "prompt_tokens", "cached_tokens", "completion_tokens", "ttft_ms", "tpot_ms", "e2e_latency_ms",
    "judge_score", "judge_reference_score", "judge", "user_rating", "regenerated", "escalated", "payload_sha256",
    "served_endpoint", "upstream_status",
)
#: Columns added after a table's first release, as (table, column, SQL type): nullable (rows stored before read
#: NULL), added to a file that lacks them when it is opened (``_add_columns``). The schema version stays: an
#: earlier Pointsman names the columns it reads and writes, so it still reads and writes such a file.
_ADDED_COLUMNS = (("outcomes", "served_endpoint", "TEXT"), ("outcomes", "upstream_status", "INTEGER"),
                  ("decisions", "prompt_tokens", "INTEGER"), ("forwards", "sent_s", "REAL"),
                  ("decisions", "api_key_id", "TEXT"))


def default_log_path() -> Path:
    """``<data_dir>/outcomes.db``: ``$POINTSMAN_DATA_DIR`` (else ``./data``), absolute."""
    return data_dir() / DEFAULT_FILE


#: Outcome fields added after outcomes were first stored: hashed only when set, so an outcome stored before them
#: and sent again is still ``duplicate``, not ``conflict``.
_HASHED_WHEN_SET = ("served_endpoint", "upstream_status")


def _payload_hash(o: OutcomeIn) -> str:
    data = o.model_dump(mode="json")
    for k in _HASHED_WHEN_SET:
        if data[k] is None:
            del data[k]
    data["outcome_id"] = o.key
    return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _bool(v: SQLValue) -> bool | None:
    return None if v is None else bool(v)


@dataclass(frozen=True)
class _OutcomeCall:
    """One ``append_outcomes`` call waiting for the group commit: its validated items, the
    decisions its caller vouches for (id -> target) and when they were received (Unix s)."""

    items: list[OutcomeIn]
    known: dict[str, str]
    received_s: float
    unsettled: bool = False
    forwards: tuple[tuple[str, OutcomeIn], ...] = ()


class _WalKeeper:
    """Keeps the log's WAL off the request path, in a daemon thread started by the first
    ``dirty()``: at most every ``interval_s`` after a commit, ``fsync``s the WAL when outcomes
    wait for it (``fsync_interval_s > 0``: the module's Durability; ``fsync`` True) and
    checkpoints it (``PRAGMA wal_checkpoint(PASSIVE)`` on its own connection) when it holds
    ``CHECKPOINT_BYTES`` or more. The log's connection never checkpoints (``wal_autocheckpoint=0``):
    SQLite's automatic checkpoint runs inside whichever commit crosses 1,000 pages and costs it two
    more ``fsync``s and the copy, which all the outcomes of that group commit would wait for.
    ``error``: why the last ``fsync`` failed (None after one that succeeded). ``close()`` does
    what is due and stops."""

    def __init__(self, db_path: Path, fsync_interval_s: float, checkpoint_interval_s: float = 1.0) -> None:
        self.db_path, self.wal_path = db_path, db_path.with_name(db_path.name + "-wal")
        self.fsync = fsync_interval_s > 0
        self.interval_s = float(fsync_interval_s) if self.fsync else float(checkpoint_interval_s)
        self._cond = threading.Condition()
        self._dirty = self._unsynced = self._closing = False
        self._thread: threading.Thread | None = None
        self.error: str | None = None
        #: fsyncs and checkpoints done (an fsync covers every commit before it).
        self.syncs = self.checkpoints = 0

    def dirty(self, unsynced: bool) -> None:
        """A commit is in the WAL; ``unsynced``: acknowledged outcomes wait for its ``fsync``."""
        with self._cond:
            waiting = not self._dirty  # else the thread finds it set when its round ends: no wake-up per commit
            self._dirty = True
            self._unsynced = self._unsynced or (unsynced and self.fsync)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="pointsman-outcome-log-wal", daemon=True)
                self._thread.start()
            if waiting:
                self._cond.notify_all()

    def close(self, timeout_s: float = 10.0) -> None:
        """Do what is due and stop the thread (idempotent)."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout_s)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._dirty or self._closing)
                if not self._dirty:
                    return
                unsynced, self._dirty, self._unsynced = self._unsynced, False, False
            if unsynced:
                self._sync()
            self._checkpoint()
            with self._cond:  # the next round no sooner than interval_s after this one (unless closing)
                self._cond.wait_for(lambda: self._closing, timeout=self.interval_s)

    def _sync(self) -> None:
        try:
            fd = os.open(self.wal_path, os.O_RDONLY)
        except FileNotFoundError:  # no WAL (checkpointed and removed at close): nothing to sync
            return
        except OSError as exc:
            self._failed(exc)
            return
        try:
            os.fsync(fd)  # flushes the file's dirty pages, whoever wrote them
        except OSError as exc:
            self._failed(exc)
        else:
            self.error = None
            self.syncs += 1
        finally:
            os.close(fd)

    def _failed(self, exc: OSError) -> None:
        self.error = f"{self.wal_path}: fsync failed ({exc})"
        log.error("outcome log: %s; acknowledged outcomes may not be on disk yet", self.error)
        with self._cond:
            self._dirty = self._unsynced = True  # try again after the interval

    def _checkpoint(self) -> None:
        try:
            if os.path.getsize(self.wal_path) < CHECKPOINT_BYTES:
                return
            with closing(sqlite3.connect(self.db_path, timeout=1.0, isolation_level=None)) as conn:
                conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
            self.checkpoints += 1
        except (OSError, sqlite3.Error) as exc:  # the WAL grows until the next one succeeds
            log.warning("outcome log: checkpoint of %s failed (%s); retrying after the next commit", self.db_path, exc)


#: Tables of Pointsman's own SQLite files that may share a file with the outcome log (the budget ledger's).
_OWN_TABLE_PREFIXES = ("budget_", "journal")
#: The outcome log's own tables (``_SCHEMA``).
_OWN_TABLES = frozenset({"meta", "decisions", "outcomes", "verifications", "unsettled", "forwards", "fleet_revisions"})


def foreign_tables(path: Path) -> list[str]:
    """The tables of the existing SQLite file at ``path`` when it is another program's database
    (it has tables, no ``decisions`` table and some not Pointsman's): opening it as an outcome log
    would add the log's tables to it and switch it to WAL. Empty for a new or empty file, an outcome
    log, or a file SQLite cannot read (the caller's open reports that). Read-only, changes nothing."""
    try:
        if not path.is_file() or path.stat().st_size == 0:
            return []
        with closing(sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)) as conn:
            names = sorted(str(r[0]) for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'"))
    except (OSError, sqlite3.Error):
        return []
    if "decisions" in names:
        return []
    return [n for n in names if not n.startswith(("sqlite_", *_OWN_TABLE_PREFIXES)) and n not in _OWN_TABLES]


class OutcomeLog:
    """The decision and outcome log in one SQLite file (see the module docstring).

    ``OutcomeLog(path=None, *, store_prompts=False, timeout_s=10.0, fsync_interval_s=0.0)``:
    ``path`` defaults to ``default_log_path()`` (parent folders are created). ``store_prompts``:
    keep the prompt text of decisions (operator opt-in). ``timeout_s``: how long a writer waits
    for another process's write lock before ``DataError``. ``fsync_interval_s``: 0 (default)
    acknowledges outcomes after their ``fsync``; > 0, once in the WAL, ``fsync``ed in the
    background at most that many seconds later (the module's Durability).
    ``log_id``: this log file's id (hex, made when the file is created): the *inbox* other
    replicas forward its decisions' outcomes to (``policy.signals.shared_state``).

    Thread-safe: one connection per log object, writes serialized by a lock (outcome writes of
    concurrent callers share one transaction: ``append_outcomes``); readers use
    their own short-lived connection. Never share an ``OutcomeLog`` across ``fork``; open one
    per process. Use as a context manager or call ``close()``.
    """

    def __init__(self, path: str | Path | None = None, *, store_prompts: bool = False, timeout_s: float = 10.0,
                 fsync_interval_s: float = 0.0) -> None:
        self.path = Path(path) if path is not None else default_log_path()
        self.store_prompts = bool(store_prompts)
        self.timeout_s = float(timeout_s)
        if not fsync_interval_s >= 0:
            raise ValueError(f"fsync_interval_s must be >= 0, got {fsync_interval_s!r}")
        self._keeper = _WalKeeper(self.path, fsync_interval_s)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise DataError(f"{self.path}: cannot open the outcome log ({exc})") from None
        self._lock = threading.Lock()
        self._group: GroupCommit[_OutcomeCall, list[OutcomeAck]] = GroupCommit(self._store_outcomes)
        self._conn: sqlite3.Connection | None = None  # None once closed
        self._synchronous = "NORMAL"  # the connection's PRAGMA synchronous (``_connect``)
        #: Each thread's read-only connection (``_reader``) and every one opened (closed by ``close``).
        self._local = threading.local()
        self._readers: list[sqlite3.Connection] = []
        #: Why the last write failed (None after a write that succeeded): ``/readyz`` reports it.
        self.write_error: str | None = None
        other = foreign_tables(self.path)
        if other:
            raise DataError(f"{self.path}: not an outcome log (it holds tables {', '.join(other[:8])}"
                            f"{', ...' if len(other) > 8 else ''}); left untouched")
        try:
            self._conn = conn = self._connect()
            with self._lock:
                conn.executescript(_SCHEMA)
                _add_columns(conn)
                row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
                if row is None:
                    conn.execute("INSERT INTO meta(key, value) VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
                elif int(row[0]) != SCHEMA_VERSION:
                    raise DataError(f"{self.path}: outcome log schema version {row[0]}, this Pointsman reads {SCHEMA_VERSION}")
                conn.execute("INSERT OR IGNORE INTO meta(key, value) VALUES ('log_id', ?)", (uuid.uuid4().hex,))
                self.log_id: str = str(conn.execute("SELECT value FROM meta WHERE key = 'log_id'").fetchone()[0])
        except sqlite3.DatabaseError as exc:
            raise DataError(f"{self.path}: cannot open the outcome log ({exc})") from None

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=self.timeout_s, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA wal_autocheckpoint=0")  # checkpoints run in the background (_WalKeeper)
        conn.execute("PRAGMA foreign_keys=OFF")  # outcomes may arrive before their decision (orphans)
        return conn

    def __enter__(self) -> OutcomeLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Sync what the background ``fsync`` has not yet, close the connection (idempotent)."""
        self._keeper.close()
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
            readers, self._readers, self._local = self._readers, [], threading.local()
        for reader in readers:
            reader.close()

    def __repr__(self) -> str:
        return f"OutcomeLog({str(self.path)!r}, store_prompts={self.store_prompts})"

    # ------------------------------------------------------------------ writes

    def _decision_row(self, r: DecisionRecord) -> tuple[SQLValue, ...]:
        text = r.prompt_text if self.store_prompts else None
        if text is not None and len(text) > QUERY_WINDOW_CHARS + 1:
            text = text[:QUERY_WINDOW_CHARS]
        blob = None if r.head_input is None else np.asarray(r.head_input, dtype="<f4").reshape(-1).tobytes()
        return (
            r.decision_id, float(r.time_s), r.tenant, r.target, r.model, r.mode, r.rule,
            None if r.p_hard is None else float(r.p_hard), int(bool(r.difficulty_available)),
            None if r.estimated_cost_usd is None else float(r.estimated_cost_usd), r.estimator_version,
            r.policy_revision, r.fleet_revision, json.dumps(r.request_features, sort_keys=True),
            r.feature_space if blob is not None else None, blob, r.prompt_sha256, r.conversation_key, text,
            None if r.prompt_tokens is None else int(r.prompt_tokens), r.api_key_id,
        )

    def append_decision(self, record: DecisionRecord) -> bool:
        """Store one decision; returns False if its id was already stored (nothing changes).
        Raises ``DataError`` when the store is unavailable (locked past ``timeout_s``, disk full)."""
        return self.append_decisions([record]) == 1

    def append_decisions(self, records: Sequence[DecisionRecord]) -> int:
        """Store many decisions in one transaction; returns how many were new."""
        rows = [self._decision_row(r) for r in records]
        sql = (f"INSERT OR IGNORE INTO decisions({', '.join(_DECISION_COLUMNS)}) "
               f"VALUES ({', '.join('?' * len(_DECISION_COLUMNS))})")
        with self._write(durable=False) as conn:
            before = conn.total_changes
            conn.executemany(sql, rows)
            return conn.total_changes - before

    def append_outcomes(self, outcomes: Sequence[OutcomeIn | Mapping[str, object]], *,
                        received_s: float | None = None, known: Mapping[str, str] | None = None,
                        unsettled: bool = False, forwards: Sequence[tuple[str, OutcomeIn]] = ()) -> list[OutcomeAck]:
        """Store outcomes (validated ``OutcomeIn`` or dicts, which are validated with
        ``parse_outcomes`` rules) durably; returns one ``OutcomeAck`` per item, in order. Items with
        status ``stored``/``duplicate`` are on disk (fsynced) when this returns.

        Group commit: calls from several threads at once share one transaction and one ``fsync``
        (``_GroupCommit``): a call waits for the commit in progress, if any, and then commits
        everything queued meanwhile, its own items included.

        ``served_target`` defaults to the decision's target. ``known``: decision id -> target of
        decisions the caller vouches for; their outcomes are stored even when the decision is not
        (yet) in the log. ``unsettled``: also keep each non-shadow outcome in the log (stored or duplicate) and
        each forward as not yet settled, in the same transaction, until ``settled`` names it (``unsettled_outcomes``
        reads them). ``forwards``: ``(inbox, outcome)`` pairs kept in the outbox (module docstring), in the same
        transaction, unsent (a key already there is kept as it is). Raises ``RequestError`` for an invalid dict
        (nothing stored) and ``DataError`` when the store is unavailable (nothing of the shared transaction
        acknowledged).
        """
        items = [o for o in outcomes if isinstance(o, OutcomeIn)]
        if len(items) < len(outcomes):
            items = parse_outcomes([o.model_dump() if isinstance(o, OutcomeIn) else o for o in outcomes])
        now = time.time() if received_s is None else float(received_s)
        return self._group.run(_OutcomeCall(items, dict(known or {}), now, unsettled, tuple(forwards)))

    def _store_outcomes(self, calls: Sequence[_OutcomeCall]) -> list[list[OutcomeAck]]:
        """``append_outcomes`` for several calls in one durable transaction (the group commit's
        committer): each call's acks, in order. Raises ``DataError`` (nothing committed)."""
        results: list[list[OutcomeAck]] = []
        with self._write(durable=not self._keeper.fsync) as conn:
            seen: dict[str, str] = {}
            for call in calls:
                acks = [self._insert_outcome(conn, o, call.known, call.received_s, seen) for o in call.items]
                conn.executemany("INSERT OR IGNORE INTO forwards(outcome_id, inbox, outcome, received_s) VALUES (?, ?, ?, ?)",
                                 [(o.key, inbox, o.model_dump_json(exclude_unset=True), call.received_s)
                                  for inbox, o in call.forwards])
                if call.unsettled:  # stored here or forwarded: each is settled here
                    kept = [o for o, ack in zip(call.items, acks) if ack.ok] + [o for _, o in call.forwards]
                    conn.executemany("INSERT OR IGNORE INTO unsettled(outcome_id, outcome) VALUES (?, ?)",
                                     [(o.key, o.model_dump_json(exclude_unset=True)) for o in kept if not o.shadow])
                results.append(acks)
        self._keeper.dirty(unsynced=True)
        return results

    @staticmethod
    def _insert_outcome(conn: sqlite3.Connection, o: OutcomeIn, known: Mapping[str, str], now: float,
                        seen: dict[str, str]) -> OutcomeAck:
        """Insert one outcome inside the open transaction; ``seen``: key -> payload hash of the
        outcomes inserted in it so far."""
        key, digest = o.key, _payload_hash(o)
        prior = seen.get(key)
        if prior is None:
            row = conn.execute("SELECT payload_sha256 FROM outcomes WHERE outcome_id = ?", (key,)).fetchone()
            prior = row[0] if row else None
        if prior is not None:
            if prior == digest:
                return OutcomeAck(key, o.decision_id, "duplicate")
            return OutcomeAck(key, o.decision_id, "conflict", f"outcome {key} is already stored with different content")
        dec = conn.execute("SELECT target FROM decisions WHERE decision_id = ?", (o.decision_id,)).fetchone()
        if dec is None and o.decision_id in known:
            dec = (known[o.decision_id],)
        if dec is None:
            return OutcomeAck(key, o.decision_id, "unknown_decision", f"no decision {o.decision_id} in the outcome log")
        u = o.usage or Usage()
        q = o.quality or QualitySignals()
        conn.execute(
            f"INSERT INTO outcomes({', '.join(_OUTCOME_COLUMNS)}) VALUES ({', '.join('?' * len(_OUTCOME_COLUMNS))})",
            (key, o.decision_id, now, o.time_s, o.served_target or dec[0], o.served_model, int(o.shadow),
             o.status, o.error, u.prompt_tokens, u.cached_tokens, u.completion_tokens, o.ttft_ms, o.tpot_ms,
             o.e2e_latency_ms, q.judge_score, q.judge_reference_score, q.judge, q.user_rating,
             None if q.regenerated is None else int(q.regenerated),
             None if q.escalated is None else int(q.escalated), digest, o.served_endpoint, o.upstream_status),
        )
        seen[key] = digest
        return OutcomeAck(key, o.decision_id, "stored")

    def settled(self, outcome_ids: Sequence[str]) -> None:
        """Forget that these outcomes wait to be settled (``append_outcomes(unsettled=True)``); not ``fsync``ed:
        a settlement is idempotent, so one named again after a crash is settled again harmlessly. Raises
        ``DataError``."""
        if outcome_ids:
            with self._write(durable=False) as conn:
                conn.executemany("DELETE FROM unsettled WHERE outcome_id = ?", [(k,) for k in outcome_ids])

    def unsettled_outcomes(self, limit: int = 1000) -> list[OutcomeIn]:
        """Up to ``limit`` outcomes stored with ``unsettled`` and not yet named by ``settled`` (as reported).
        Raises ``DataError``."""
        try:
            rows = self._reader().execute("SELECT outcome FROM unsettled LIMIT ?", (limit,)).fetchall()
        except sqlite3.Error as exc:
            raise DataError(f"{self.path}: outcome log unavailable ({exc})") from None
        return parse_outcomes([json.loads(r[0]) for r in rows]) if rows else []

    def forwards_due(self, incarnation: str, now: float, unsent_s: float, unconfirmed_s: float,
                     limit: int = 1000) -> list[tuple[str, str, str]]:
        """Up to ``limit`` outbox rows to send (again) at ``now`` (Unix s), as ``(inbox, key, outcome JSON)``: those
        never sent (or whose send failed) received more than ``unsent_s`` seconds ago (a younger one may be on its
        way), those sent to another incarnation than ``incarnation`` (it may have lost them), and those sent to it but
        not confirmed for ``max(unconfirmed_s, how long they had waited when last sent)`` seconds (their owner's
        acknowledgement may have been trimmed from the ``acks`` stream before this log's reader read it, or the owner
        acknowledges nothing yet: sent again with a doubling backoff). Raises ``DataError``."""
        try:
            rows = self._reader().execute(
                "SELECT inbox, outcome_id, outcome FROM forwards WHERE (sent IS NULL AND received_s < ?) OR sent != ? "
                "OR coalesce(sent_s, received_s) < ? - max(?, coalesce(sent_s, received_s) - received_s) "
                "ORDER BY received_s LIMIT ?", (now - unsent_s, incarnation, now, unconfirmed_s, limit)).fetchall()
        except sqlite3.Error as exc:
            raise DataError(f"{self.path}: outcome log unavailable ({exc})") from None
        return [(str(i), str(k), str(o)) for i, k, o in rows]

    def forwards_sent(self, keys: Sequence[str], incarnation: str, now: float) -> None:
        """Mark these outbox rows sent to ``incarnation`` at ``now`` (Unix s; not ``fsync``ed: a row unmarked after a
        crash is sent again, harmlessly). Raises ``DataError``."""
        if keys:
            with self._write(durable=False) as conn:
                conn.executemany("UPDATE forwards SET sent = ?, sent_s = ? WHERE outcome_id = ?",
                                 [(incarnation, now, k) for k in keys])

    def forwards_confirmed(self, keys: Sequence[str]) -> None:
        """Forget these outbox rows: their owner's log stored them (not ``fsync``ed: one back after a crash is sent
        again and stored as a duplicate). Raises ``DataError``."""
        if keys:
            with self._write(durable=False) as conn:
                conn.executemany("DELETE FROM forwards WHERE outcome_id = ?", [(k,) for k in keys])

    def drop_forwards(self, received_before_s: float) -> list[tuple[str, str]]:
        """Forget the outbox rows received before ``received_before_s`` (Unix s) that no owner confirmed: returns
        their ``(inbox, key)``. Raises ``DataError``."""
        try:
            rows = self._reader().execute("SELECT inbox, outcome_id FROM forwards WHERE received_s < ?",
                                          (received_before_s,)).fetchall()
        except sqlite3.Error as exc:
            raise DataError(f"{self.path}: outcome log unavailable ({exc})") from None
        self.forwards_confirmed([str(k) for _, k in rows])
        return [(str(i), str(k)) for i, k in rows]

    def forwards_pending(self) -> int:
        """Outbox rows no owner confirmed yet (0 when the file cannot be read)."""
        return self.outbox(time.time())[0]

    def outbox(self, now_s: float) -> tuple[int, float]:
        """``(rows, oldest_age_s)`` of the outbox at ``now_s`` (Unix s): the rows no owner confirmed yet and the age, s,
        of the oldest (0.0 when empty); ``(0, 0.0)`` when the file cannot be read."""
        try:
            n, oldest = self._reader().execute("SELECT COUNT(*), MIN(received_s) FROM forwards").fetchone()
        except sqlite3.Error:
            return 0, 0.0
        return int(n), (max(0.0, now_s - float(oldest)) if oldest is not None else 0.0)

    def record_fleet(self, revision: str, kinds: Mapping[str, str]) -> None:
        """Keep the target kinds (``{target: "onprem" | "frontier"}``) of fleet ``revision``, once (a revision
        already kept is left as is): what the labels read a decision's strong tier from. Raises ``DataError``."""
        with self._write(durable=False) as conn:
            conn.execute("INSERT OR IGNORE INTO fleet_revisions(revision, kinds) VALUES (?, ?)",
                         (revision, json.dumps(dict(kinds), sort_keys=True)))

    def fleet_kinds(self) -> dict[str, dict[str, str]]:
        """The kept fleet revisions: ``{revision: {target: kind}}``."""
        with self._reader() as conn:
            return {str(r[0]): json.loads(r[1]) for r in conn.execute("SELECT revision, kinds FROM fleet_revisions")}

    def append_verification(self, decision_id: str, *, time_s: float, action: str, rule: str, p_bad: float,
                            verifier: str, features: Mapping[str, object], escalation_id: str | None = None,
                            escalation_target: str | None = None, estimated_cost_usd: float | None = None,
                            draft_text: str | None = None) -> bool:
        """Store one verified draft durably (see the module); False when the decision already has
        one (nothing changes). Raises ``DataError`` when the store is unavailable or the decision
        is not in the log."""
        with self._write(durable=True) as conn:
            if conn.execute("SELECT 1 FROM decisions WHERE decision_id = ?", (decision_id,)).fetchone() is None:
                raise DataError(f"no decision {decision_id} in the outcome log")
            before = conn.total_changes
            conn.execute(
                "INSERT OR IGNORE INTO verifications(decision_id, time_s, action, rule, p_bad, verifier, "
                "escalation_id, escalation_target, estimated_cost_usd, features, draft_text) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (decision_id, float(time_s), action, rule, float(p_bad), verifier, escalation_id,
                 escalation_target, estimated_cost_usd, json.dumps(dict(features), sort_keys=True), draft_text))
            return conn.total_changes > before

    def verification(self, decision_id: str) -> dict[str, object] | None:
        """The stored verification of a decision (columns by name, ``features`` parsed), or None."""
        with self._reader() as conn:
            row = conn.execute("SELECT * FROM verifications WHERE decision_id = ?", (decision_id,)).fetchone()
        if row is None:
            return None
        out = {k: row[k] for k in row.keys()}
        out["features"] = json.loads(str(out["features"]))
        return out

    def verifications(self) -> list[dict[str, object]]:
        """Every stored verification (as ``verification``), in time order."""
        with self._reader() as conn:
            rows = conn.execute("SELECT * FROM verifications ORDER BY time_s").fetchall()
        out = []
        for row in rows:
            item = {k: row[k] for k in row.keys()}
            item["features"] = json.loads(str(item["features"]))
            out.append(item)
        return out

    @contextmanager
    def _write(self, durable: bool) -> Iterator[sqlite3.Connection]:
        """One ``BEGIN IMMEDIATE`` transaction under the log's lock; ``durable`` commits with
        ``synchronous=FULL`` (fsync), else ``NORMAL``. SQLite errors become ``DataError`` and
        roll the transaction back."""
        with self._lock:
            conn = self._conn
            if conn is None:
                raise DataError(f"{self.path}: the outcome log is closed")
            synchronous = "FULL" if durable else "NORMAL"
            if synchronous != self._synchronous:  # set only when it changes: one statement less per commit
                try:
                    conn.execute(f"PRAGMA synchronous={synchronous}")
                except sqlite3.Error as exc:
                    raise DataError(f"{self.path}: outcome log unavailable ({exc})") from None
                self._synchronous = synchronous

            def fail(exc: sqlite3.Error, phase: Phase) -> DataError:
                what = "unavailable" if phase == "begin" else "write failed"
                return DataError(f"{self.path}: outcome log {what} ({exc})")

            try:
                with transaction(conn, "BEGIN IMMEDIATE", fail) as tx:
                    yield tx
            except DataError as exc:
                self.write_error = str(exc)
                raise
            self.write_error = None
        self._keeper.dirty(unsynced=False)  # the WAL grew: checkpointed in the background

    def writable(self, probe_bytes: int = 65536) -> str | None:
        """None when the log takes writes; else why not. While the last write failed, a probe
        (``probe_bytes`` written and deleted in one durable transaction: roughly a batch of
        decisions) decides, so a disk that has room again is noticed without traffic. With a
        background ``fsync`` (``fsync_interval_s``), its last failure also makes the log not writable."""
        if self._keeper.error is not None:
            return self._keeper.error
        if self.write_error is None:
            return None
        try:
            with self._write(durable=True) as conn:
                conn.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('probe', ?)", ("x" * probe_bytes,))
                conn.execute("DELETE FROM meta WHERE key = 'probe'")
        except DataError as exc:
            return str(exc)
        return None

    # ------------------------------------------------------------------- reads

    def _reader(self) -> sqlite3.Connection:
        """This thread's read-only connection, opened on its first read and kept until ``close``: opening
        one and reading the schema cost ~0.2 ms of CPU, ten times a point read, and the outcome path reads
        (``verification``) once per outcome. Idle between reads (autocommit: no read transaction stays
        open), so it holds back no checkpoint."""
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=self.timeout_s,
                                   check_same_thread=False)  # used by its thread only; ``close`` closes it
            conn.row_factory = sqlite3.Row
            with self._lock:
                self._readers.append(conn)
                self._local.conn = conn
        return conn

    def counts(self) -> dict[str, int]:
        """``{"decisions": n, "outcomes": m}``."""
        with self._reader() as conn:
            return {"decisions": conn.execute("SELECT COUNT(*) FROM decisions").fetchone()[0],
                    "outcomes": conn.execute("SELECT COUNT(*) FROM outcomes").fetchone()[0]}

    def outcome(self, outcome_id: str) -> LoggedOutcome | None:
        """The stored outcome with this id, or None."""
        with self._reader() as conn:
            row = conn.execute("SELECT * FROM outcomes WHERE outcome_id = ?", (outcome_id,)).fetchone()
        return None if row is None else _outcome(row)

    def decision(self, decision_id: str) -> LoggedDecision | None:
        """The stored decision with its outcomes, or None."""
        got = list(self.joined(decision_ids=[decision_id]))
        return got[0] if got else None

    def joined(self, *, since_s: float | None = None, until_s: float | None = None,
               decision_ids: Sequence[str] | None = None, with_outcomes_only: bool = False,
               batch: int = 2000) -> Iterator[LoggedDecision]:
        """Decisions in time order (``since_s <= time_s < until_s``; or the given ids), each with
        its outcomes joined by decision id. ``with_outcomes_only``: skip decisions without any.
        Streams in batches of ``batch`` decisions."""
        where, args = _window(since_s, until_s)
        if decision_ids is not None:
            ids = list(decision_ids)
            if not ids:
                return
            where.append(f"decision_id IN ({', '.join('?' * len(ids))})")
            args.extend(ids)
        if with_outcomes_only:
            where.append("EXISTS (SELECT 1 FROM outcomes o WHERE o.decision_id = decisions.decision_id)")
        sql = "SELECT * FROM decisions" + (f" WHERE {' AND '.join(where)}" if where else "") + " ORDER BY time_s, decision_id"
        with self._reader() as conn:
            cur = conn.execute(sql, args)
            while True:
                rows = cur.fetchmany(batch)
                if not rows:
                    break
                ids = [r["decision_id"] for r in rows]
                by_id: dict[str, list[LoggedOutcome]] = {i: [] for i in ids}
                ocur = conn.execute(
                    f"SELECT * FROM outcomes WHERE decision_id IN ({', '.join('?' * len(ids))}) ORDER BY received_s, outcome_id",
                    ids)
                for orow in ocur:
                    by_id[orow["decision_id"]].append(_outcome(orow))
                for r in rows:
                    yield _decision(r, tuple(by_id[r["decision_id"]]))

    def p_hard_window(self, *, since_s: float | None = None, until_s: float | None = None) -> NDArray[np.float64]:
        """Logged ``p_hard`` of decisions in the window whose estimate was available: float64 (n,)."""
        where, args = _window(since_s, until_s)
        where[:0] = ["difficulty_available = 1", "p_hard IS NOT NULL"]
        with self._reader() as conn:
            rows = conn.execute(f"SELECT p_hard FROM decisions WHERE {' AND '.join(where)}", args).fetchall()
        return np.asarray([r[0] for r in rows], dtype=np.float64)


def _window(since_s: float | None, until_s: float | None) -> tuple[list[str], list[SQLValue]]:
    """SQL conditions and their arguments for decisions with ``since_s <= time_s < until_s``
    (either bound None: open)."""
    where: list[str] = []
    args: list[SQLValue] = []
    if since_s is not None:
        where.append("time_s >= ?")
        args.append(float(since_s))
    if until_s is not None:
        where.append("time_s < ?")
        args.append(float(until_s))
    return where, args


def _missing_columns(conn: sqlite3.Connection) -> list[tuple[str, str, str]]:
    have = {(table, r[1]) for table in {t for t, _, _ in _ADDED_COLUMNS}
            for r in conn.execute(f"PRAGMA table_info({table})")}
    return [c for c in _ADDED_COLUMNS if (c[0], c[1]) not in have]


def _add_columns(conn: sqlite3.Connection) -> None:
    """Add the ``_ADDED_COLUMNS`` a file an earlier Pointsman made lacks, in one write transaction (two processes
    opening it at once add them once). Raises ``sqlite3.Error``."""
    if not _missing_columns(conn):
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        for table, column, kind in _missing_columns(conn):
            conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def _outcome(row: sqlite3.Row) -> LoggedOutcome:
    return LoggedOutcome(
        outcome_id=row["outcome_id"], decision_id=row["decision_id"], received_s=row["received_s"],
        time_s=row["time_s"], served_target=row["served_target"], served_model=row["served_model"],
        shadow=bool(row["shadow"]), status=row["status"], error=row["error"],
        usage=Usage(prompt_tokens=row["prompt_tokens"], cached_tokens=row["cached_tokens"],
                    completion_tokens=row["completion_tokens"]),
        ttft_ms=row["ttft_ms"], tpot_ms=row["tpot_ms"], e2e_latency_ms=row["e2e_latency_ms"],
        quality=QualitySignals(judge_score=row["judge_score"], judge_reference_score=row["judge_reference_score"],
                               judge=row["judge"], user_rating=row["user_rating"],
                               regenerated=_bool(row["regenerated"]), escalated=_bool(row["escalated"])),
        served_endpoint=row["served_endpoint"], upstream_status=row["upstream_status"],
    )


def _decision(row: sqlite3.Row, outcomes: tuple[LoggedOutcome, ...]) -> LoggedDecision:
    blob = row["head_input"]
    return LoggedDecision(
        decision_id=row["decision_id"], time_s=row["time_s"], tenant=row["tenant"], target=row["target"],
        model=row["model"], mode=row["mode"], rule=row["rule"], p_hard=row["p_hard"],
        difficulty_available=bool(row["difficulty_available"]), estimated_cost_usd=row["estimated_cost_usd"],
        estimator_version=row["estimator_version"], policy_revision=row["policy_revision"],
        fleet_revision=row["fleet_revision"], request_features=json.loads(row["request_features"]),
        feature_space=row["feature_space"],
        head_input=None if blob is None else np.frombuffer(blob, dtype="<f4").astype(np.float32),
        prompt_sha256=row["prompt_sha256"], conversation_key=row["conversation_key"], prompt_text=row["prompt_text"],
        prompt_tokens=row["prompt_tokens"], api_key_id=row["api_key_id"], outcomes=outcomes,
    )


def record_decision(
    log: OutcomeLog,
    decision: Decision,
    request: RouteRequest,
    estimator: Estimator,
    *,
    features: RequestFeatures | None = None,
    head_input: NDArray[np.floating] | None = None,
    time_s: float | None = None,
) -> DecisionRecord:
    """Build (``decision_record``, see there for the arguments) and append the record of one
    decision; returns it."""
    record = decision_record(decision, request, estimator, features=features, head_input=head_input, time_s=time_s)
    log.append_decision(record)
    return record
