"""The embedded budget ledger: one SQLite file (stdlib ``sqlite3``), WAL mode.

Why it cannot overspend: every write (reserve, settle, release) is one ``BEGIN
IMMEDIATE`` transaction. ``BEGIN IMMEDIATE`` takes the database's single write lock
before the first read, so the read of the counters, the admission check and the
hold happen with no other writer in between, whether the other writer is a thread
of this process, another ``SqliteLedger`` on the same file, or another process.
Inside one process, every ``SqliteLedger`` on a file also shares one thread lock
(each has its own connection), so threads wait in a queue rather than in SQLite's
polling busy handler. A writer that finds the file locked by another process waits
up to ``timeout_s`` (SQLite's busy timeout) and then fails with
``LedgerUnavailable``, having changed nothing. Readers (``snapshot``) never
block writers in WAL mode and see one consistent state.

Tables (amounts are integer nano-USD)::

    budget_reservations(decision_id PK, scopes, day_id, month_id, reserved_nusd,
                        created_s, expires_s, state: held|settled|released|expired,
                        hold_state, actual_nusd, settled_s, target, *_tokens)
    budget_spend(scope, window_id, held_nusd, settled_nusd)          -- PK (scope, window_id)
    budget_target_usage(target, window_id, spent_nusd, prompt_tokens, cached_tokens,
                        completion_tokens, outcomes)                   -- PK (target, window_id)

``held_nusd`` counts holds not yet settled, released or swept; each write first
*sweeps* holds past ``expires_s`` (state ``expired``, their amount leaves
``held_nusd``), and ``snapshot`` subtracts holds that expired since the last sweep,
so an expired hold stops counting at its ``expires_s`` exactly.

Durability: ``synchronous=NORMAL`` (default) survives a killed process; on power
loss the last commits may roll back. ``synchronous=FULL`` fsyncs every commit.
A background thread checkpoints the WAL every ``checkpoint_interval_s`` (PASSIVE),
so operations do not pay for checkpoints' fsyncs.
A connection is never used across ``fork``: a child process opens its own.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from pointsman.errors import BudgetError
from pointsman.policy.budget.config import BudgetConfig
from pointsman.policy.budget.ledger import (
    BudgetSnapshot,
    EffectivePrice,
    LedgerUnavailable,
    Reservation,
    Settlement,
    UnknownReservation,
    build_snapshot,
    refusal,
)
from pointsman.policy.budget.units import (
    check_id,
    check_scopes,
    checked_reserve_args,
    checked_settle_args,
    current_time,
    to_nusd,
    to_usd,
    window_of,
    windows_at,
)
from pointsman.sqlite_tx import transaction

SCHEMA_VERSION = 1
SYNCHRONOUS = ("normal", "full", "extra")

#: One thread lock per database file in this process, shared by every ``SqliteLedger``
#: on that file: threads queue on it (fair, no polling) and only other processes meet
#: SQLite's busy handler, which polls and can starve a waiter under saturation.
_FILE_LOCKS: dict[str, threading.Lock] = {}
_FILE_LOCKS_GUARD = threading.Lock()


def _file_lock(path: Path) -> threading.Lock:
    key = str(path.resolve())
    with _FILE_LOCKS_GUARD:
        return _FILE_LOCKS.setdefault(key, threading.Lock())


def _forget_locks_after_fork() -> None:
    """A child must not inherit a lock some parent thread held at fork time."""
    global _FILE_LOCKS_GUARD
    _FILE_LOCKS.clear()
    _FILE_LOCKS_GUARD = threading.Lock()


os.register_at_fork(after_in_child=_forget_locks_after_fork)

#: Pages in the WAL before a writer checkpoints by itself (SQLite's default is 1000);
#: the background checkpointer normally keeps the WAL far below this.
WAL_AUTOCHECKPOINT_PAGES = 10000


def _checkpoint_loop(path: Path, interval_s: float, stop: threading.Event) -> None:
    """Copy the WAL back into the database every ``interval_s`` seconds, ``PASSIVE``
    (never waits for, never blocks, a reader or writer), so that no reserve or settle
    pays for the checkpoint's copy and fsync."""
    try:
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    except sqlite3.Error:
        return
    try:
        while not stop.wait(interval_s):
            try:
                conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
            except sqlite3.Error:
                pass
    finally:
        conn.close()

_SCHEMA = """
CREATE TABLE IF NOT EXISTS budget_reservations (
    decision_id TEXT PRIMARY KEY,
    scopes TEXT NOT NULL,
    day_id TEXT NOT NULL,
    month_id TEXT NOT NULL,
    reserved_nusd INTEGER NOT NULL,
    created_s REAL NOT NULL,
    expires_s REAL NOT NULL,
    state TEXT NOT NULL,
    hold_state TEXT,
    actual_nusd INTEGER,
    settled_s REAL,
    target TEXT,
    prompt_tokens INTEGER,
    cached_tokens INTEGER,
    completion_tokens INTEGER
);
CREATE INDEX IF NOT EXISTS budget_reservations_held ON budget_reservations(expires_s) WHERE state = 'held';
CREATE INDEX IF NOT EXISTS budget_reservations_created ON budget_reservations(created_s);
CREATE TABLE IF NOT EXISTS budget_spend (
    scope TEXT NOT NULL,
    window_id TEXT NOT NULL,
    held_nusd INTEGER NOT NULL DEFAULT 0,
    settled_nusd INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (scope, window_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS budget_target_usage (
    target TEXT NOT NULL,
    window_id TEXT NOT NULL,
    spent_nusd INTEGER NOT NULL DEFAULT 0,
    prompt_tokens INTEGER NOT NULL DEFAULT 0,
    cached_tokens INTEGER NOT NULL DEFAULT 0,
    completion_tokens INTEGER NOT NULL DEFAULT 0,
    outcomes INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (target, window_id)
) WITHOUT ROWID;
"""

_ADD_HELD = ("INSERT INTO budget_spend (scope, window_id, held_nusd) VALUES (?, ?, ?) "
             "ON CONFLICT (scope, window_id) DO UPDATE SET held_nusd = held_nusd + excluded.held_nusd")
_ADD_SETTLED = ("INSERT INTO budget_spend (scope, window_id, settled_nusd) VALUES (?, ?, ?) "
                "ON CONFLICT (scope, window_id) DO UPDATE SET settled_nusd = settled_nusd + excluded.settled_nusd")
_ADD_USAGE = ("INSERT INTO budget_target_usage VALUES (?, ?, ?, ?, ?, ?, 1) "
              "ON CONFLICT (target, window_id) DO UPDATE SET spent_nusd = spent_nusd + excluded.spent_nusd, "
              "prompt_tokens = prompt_tokens + excluded.prompt_tokens, "
              "cached_tokens = cached_tokens + excluded.cached_tokens, "
              "completion_tokens = completion_tokens + excluded.completion_tokens, outcomes = outcomes + 1")
_SELECT_RES = ("SELECT state, scopes, day_id, month_id, reserved_nusd, hold_state, actual_nusd, settled_s, target, "
               "prompt_tokens, cached_tokens, completion_tokens FROM budget_reservations WHERE decision_id = ?")


def _split(scopes: str) -> list[str]:
    """The stored scope list (newline-joined; empty for none)."""
    return scopes.split("\n") if scopes else []


class SqliteLedger:
    """Budget ledger in one SQLite file (see the module docstring for the guarantee).

    ``path``: the database file (parent folders are created). ``synchronous``:
    ``normal`` | ``full`` | ``extra``. ``timeout_s``: how long a write waits for the
    write lock before ``LedgerUnavailable``. ``checkpoint_interval_s``: period of the
    background WAL checkpoint thread (0: let writers checkpoint, SQLite's default).
    Thread-safe; several per process share one lock per file.
    """

    def __init__(self, path: str | Path, config: BudgetConfig | None = None, synchronous: str = "normal",
                 timeout_s: float = 5.0, checkpoint_interval_s: float = 0.25) -> None:
        if synchronous not in SYNCHRONOUS:
            raise BudgetError(f"synchronous must be one of {', '.join(SYNCHRONOUS)}, got {synchronous!r}")
        self.path = Path(path)
        self.config = config or BudgetConfig()
        self.synchronous = synchronous
        self.timeout_s = timeout_s
        self.checkpoint_interval_s = checkpoint_interval_s
        self._stop = threading.Event()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise LedgerUnavailable(f"budget ledger {self.path}: {exc}") from exc
        self._lock, self._lock_pid = _file_lock(self.path), os.getpid()
        self._conn: sqlite3.Connection | None = None
        self._pid = -1
        self._inherited: list[sqlite3.Connection] = []
        with self._guard():
            self._connection()

    @classmethod
    def from_url(cls, url: str, config: BudgetConfig | None = None) -> SqliteLedger:
        """``sqlite:///relative.db`` or ``sqlite:////absolute.db``, query ``synchronous`` and
        ``timeout_s``; raises ``BudgetError`` for a URL without a path or a bad query."""
        parts = urlsplit(url)
        path = parts.path[1:] if parts.path.startswith("/") else parts.path
        if parts.netloc or not path:
            raise BudgetError(f"budget ledger URL '{url}': write sqlite:///relative/path.db or "
                              f"sqlite:////absolute/path.db")
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        unknown = set(query) - {"synchronous", "timeout_s"}
        if unknown:
            raise BudgetError(f"budget ledger URL '{url}': unknown parameter(s) {', '.join(sorted(unknown))}")
        try:
            timeout_s = float(query.get("timeout_s", 5.0))
        except ValueError:
            raise BudgetError(f"budget ledger URL '{url}': timeout_s must be a number of seconds") from None
        return cls(path, config, synchronous=query.get("synchronous", "normal").lower(), timeout_s=timeout_s)

    # -- connection and transactions ------------------------------------------------------

    def _guard(self) -> threading.Lock:
        """This process's lock for the file (re-fetched after a fork)."""
        if self._lock_pid != os.getpid():
            self._lock, self._lock_pid = _file_lock(self.path), os.getpid()
        return self._lock

    def _connection(self) -> sqlite3.Connection:
        """This process's connection (opened on first use and after a fork). Call under the lock."""
        if self._conn is not None and self._pid == os.getpid():
            return self._conn
        if self._conn is not None:  # inherited across fork: never touch it, never let GC close it
            self._inherited.append(self._conn)
        try:
            conn = sqlite3.connect(self.path, timeout=self.timeout_s, isolation_level=None,
                                   check_same_thread=False)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA synchronous={self.synchronous.upper()}")
            if self.checkpoint_interval_s > 0:
                conn.execute(f"PRAGMA wal_autocheckpoint={WAL_AUTOCHECKPOINT_PAGES}")
            conn.execute("BEGIN IMMEDIATE")
            try:
                version = conn.execute("PRAGMA user_version").fetchone()[0]
                if version > SCHEMA_VERSION:
                    raise LedgerUnavailable(f"budget ledger {self.path} has schema {version}; "
                                            f"this Pointsman reads {SCHEMA_VERSION}")
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        conn.execute(statement)
                conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        except sqlite3.Error as exc:
            raise LedgerUnavailable(f"budget ledger {self.path}: {exc}") from exc
        self._conn, self._pid = conn, os.getpid()
        if self.checkpoint_interval_s > 0:
            self._stop = threading.Event()
            weakref.finalize(self, self._stop.set)
            threading.Thread(target=_checkpoint_loop, args=(self.path, self.checkpoint_interval_s, self._stop),
                             name=f"budget-checkpoint:{self.path.name}", daemon=True).start()
        return conn

    @contextmanager
    def _transaction(self, begin: str) -> Iterator[sqlite3.Connection]:
        """One transaction (``BEGIN IMMEDIATE`` for writes, ``BEGIN`` for consistent reads);
        rolls back on any error; SQLite errors become ``LedgerUnavailable``."""
        with self._guard(), transaction(self._connection(), begin,
                                        lambda exc, _: LedgerUnavailable(f"budget ledger {self.path}: {exc}")) as conn:
            yield conn

    @staticmethod
    def _sweep(conn: sqlite3.Connection, now: float) -> None:
        """Expire holds past ``expires_s``: their amount leaves ``held_nusd``."""
        rows = conn.execute("SELECT decision_id, scopes, day_id, month_id, reserved_nusd FROM budget_reservations "
                            "WHERE state = 'held' AND expires_s <= ?", (now,)).fetchall()
        for decision_id, scopes, day_id, month_id, reserved in rows:
            if reserved:
                conn.executemany(_ADD_HELD, [(s, w, -reserved) for s in _split(scopes) for w in (day_id, month_id)])
            conn.execute("UPDATE budget_reservations SET state = 'expired' WHERE decision_id = ?", (decision_id,))

    @staticmethod
    def _counters(conn: sqlite3.Connection, keys: Sequence[tuple[str, str]]) -> dict[tuple[str, str], tuple[int, int]]:
        out = {}
        for key in keys:
            row = conn.execute("SELECT held_nusd, settled_nusd FROM budget_spend WHERE scope = ? AND window_id = ?",
                               key).fetchone()
            if row is not None:
                out[key] = (row[0], row[1])
        return out

    # -- the ledger -----------------------------------------------------------------------

    def reserve(self, decision_id: str, scopes: Sequence[str], estimated_cost_usd: float,
                now: float | None = None) -> Reservation:
        """Hold ``estimated_cost_usd`` (USD) on every scope, atomically (module docstring).

        Raises ``BudgetExceeded`` (nothing held), ``BudgetError`` for bad arguments or a
        ``decision_id`` reserved before, ``LedgerUnavailable`` when the database fails.
        """
        scopes, need, now = checked_reserve_args(decision_id, scopes, estimated_cost_usd, now)
        config = self.config
        windows = windows_at(now)
        expires = now + config.reservation_ttl_s
        budget_keys = [(b.scope, windows[b.window].id) for b in config.budgets_for(scopes)]
        with self._transaction("BEGIN IMMEDIATE") as conn:
            self._sweep(conn, now)
            if conn.execute("SELECT 1 FROM budget_reservations WHERE decision_id = ?", (decision_id,)).fetchone():
                raise BudgetError(f"decision '{decision_id}' already has a reservation")
            refused = refusal(config, scopes, windows, need, self._counters(conn, budget_keys))
            if refused is None:
                conn.execute("INSERT INTO budget_reservations (decision_id, scopes, day_id, month_id, reserved_nusd, "
                             "created_s, expires_s, state) VALUES (?, ?, ?, ?, ?, ?, ?, 'held')",
                             (decision_id, "\n".join(scopes), windows["day"].id, windows["month"].id, need, now,
                              expires))
                if need:
                    conn.executemany(_ADD_HELD, [(s, w.id, need) for s in scopes for w in windows.values()])
        if refused is not None:
            raise refused
        return Reservation(decision_id, scopes, to_usd(need), now, expires,
                           {k: w.id for k, w in windows.items()})

    def settle(self, decision_id: str, actual_cost_usd: float, now: float | None = None,
               target: str | None = None, prompt_tokens: int = 0, cached_tokens: int = 0,
               completion_tokens: int = 0, scopes: Sequence[str] | None = None,
               issued_s: float | None = None) -> Settlement:
        """Replace the hold by ``actual_cost_usd`` (USD), booked in the reservation's windows,
        and add the tokens to ``target``'s usage. Without a reservation, ``scopes`` (and
        ``issued_s``, the decision's Unix time: its windows; default ``now``) book it as an
        ``unreserved`` settlement. A repeat returns the first settlement with ``replayed=True`` and
        changes nothing. Raises ``UnknownReservation`` (no reservation, and no ``scopes`` or a decision
        older than ``record_retention_s``: its record may have been settled and then purged), ``BudgetError``
        for bad arguments, ``LedgerUnavailable``."""
        actual, now = checked_settle_args(decision_id, actual_cost_usd, now, target, prompt_tokens, cached_tokens,
                                          completion_tokens)
        booked = None if scopes is None else check_scopes(scopes)
        with self._transaction("BEGIN IMMEDIATE") as conn:
            self._sweep(conn, now)
            row = conn.execute(_SELECT_RES, (decision_id,)).fetchone()
            if row is None:
                at = now if issued_s is None else float(issued_s)
                if booked is None or at < now - self.config.record_retention_s:  # purged, or as good as: booked once
                    raise UnknownReservation(decision_id)
                windows = windows_at(at)
                row = ("unreserved", "\n".join(booked), windows["day"].id, windows["month"].id, 0)
                conn.execute("INSERT INTO budget_reservations (decision_id, scopes, day_id, month_id, reserved_nusd, "
                             "created_s, expires_s, state) VALUES (?, ?, ?, ?, 0, ?, ?, 'unreserved')",
                             (decision_id, row[1], row[2], row[3], at, at))
            state, scopes_text, day_id, month_id, reserved = row[:5]
            if state == "settled":
                return Settlement(decision_id, to_usd(reserved), to_usd(row[6]), row[7], row[8], row[9], row[10],
                                  row[11], row[5], replayed=True)
            keys = [(s, w) for s in _split(scopes_text) for w in (day_id, month_id)]
            if state == "held" and reserved:
                conn.executemany(_ADD_HELD, [(s, w, -reserved) for s, w in keys])
            conn.executemany(_ADD_SETTLED, [(s, w, actual) for s, w in keys])
            if target is not None:
                conn.executemany(_ADD_USAGE, [(target, w, actual, prompt_tokens, cached_tokens, completion_tokens)
                                              for w in (day_id, month_id)])
            conn.execute("UPDATE budget_reservations SET state = 'settled', hold_state = ?, actual_nusd = ?, "
                         "settled_s = ?, target = ?, prompt_tokens = ?, cached_tokens = ?, completion_tokens = ? "
                         "WHERE decision_id = ?",
                         (state, actual, now, target, prompt_tokens, cached_tokens, completion_tokens, decision_id))
        return Settlement(decision_id, to_usd(reserved), to_usd(actual), now, target, prompt_tokens, cached_tokens,
                          completion_tokens, state)

    def release(self, decision_id: str, now: float | None = None) -> bool:
        """Drop the hold; True if it was live, False if already settled, released or expired.
        Raises ``UnknownReservation``, ``LedgerUnavailable``."""
        check_id(decision_id)
        now = current_time(now)
        with self._transaction("BEGIN IMMEDIATE") as conn:
            self._sweep(conn, now)
            row = conn.execute(_SELECT_RES, (decision_id,)).fetchone()
            if row is None:
                raise UnknownReservation(decision_id)
            state, scopes, day_id, month_id, reserved = row[:5]
            if state != "held":
                return False
            if reserved:
                conn.executemany(_ADD_HELD, [(s, w, -reserved) for s in _split(scopes) for w in (day_id, month_id)])
            conn.execute("UPDATE budget_reservations SET state = 'released' WHERE decision_id = ?", (decision_id,))
        return True

    def set_hold(self, decision_id: str, cost_usd: float, now: float | None = None) -> bool:
        """Make a live hold ``cost_usd`` (USD); False (nothing changed) unless one is live. See
        ``BudgetLedger.set_hold``; raises ``BudgetError``, ``LedgerUnavailable``."""
        check_id(decision_id)
        cost, now = to_nusd(cost_usd), current_time(now)
        with self._transaction("BEGIN IMMEDIATE") as conn:
            self._sweep(conn, now)
            row = conn.execute(_SELECT_RES, (decision_id,)).fetchone()
            if row is None or row[0] != "held":
                return False
            _, scopes, day_id, month_id, reserved = row[:5]
            if cost != reserved:
                conn.executemany(_ADD_HELD, [(s, w, cost - reserved) for s in _split(scopes) for w in (day_id, month_id)])
                conn.execute("UPDATE budget_reservations SET reserved_nusd = ? WHERE decision_id = ?", (cost, decision_id))
        return True

    def snapshot(self, scopes: Sequence[str], now: float | None = None) -> BudgetSnapshot:
        """Every scope in both windows at ``now`` (USD); holds past ``expires_s`` do not count.
        Read-only; raises ``BudgetError`` for a bad scope, ``LedgerUnavailable``."""
        scopes = check_scopes(scopes)
        now = current_time(now)
        windows = windows_at(now)
        keys = [(s, w.id) for s in scopes for w in windows.values()]
        with self._transaction("BEGIN") as conn:
            counters = self._counters(conn, keys)
            stale = conn.execute("SELECT scopes, day_id, month_id, reserved_nusd FROM budget_reservations "
                                 "WHERE state = 'held' AND expires_s <= ?", (now,)).fetchall()
        for res_scopes, day_id, month_id, reserved in stale:
            for s in _split(res_scopes):
                for w in (day_id, month_id):
                    if (s, w) in counters:
                        held, settled = counters[(s, w)]
                        counters[(s, w)] = (held - reserved, settled)
        return build_snapshot(self.config, scopes, now, counters)

    def remaining(self, scopes: Sequence[str], now: float | None = None) -> dict[str, float]:
        """``{scope: remaining USD}``, least over its windows, ``math.inf`` when unlimited."""
        return self.snapshot(scopes, now).remaining_by_scope()

    def effective_price_per_token(self, target: str, window: str = "day", now: float | None = None) -> EffectivePrice:
        """Settled spend and tokens of ``target`` in the window containing ``now``
        (see ``EffectivePrice``); raises ``BudgetError`` for an unknown window."""
        check_id(target, "target")
        w = window_of(window, current_time(now))
        with self._transaction("BEGIN") as conn:
            row = conn.execute("SELECT spent_nusd, outcomes, prompt_tokens, cached_tokens, completion_tokens "
                               "FROM budget_target_usage WHERE target = ? AND window_id = ?", (target, w.id)).fetchone()
        spent, outcomes, prompt, cached, completion = row or (0, 0, 0, 0, 0)
        return EffectivePrice(target, w.kind, w.id, to_usd(spent), outcomes, prompt, cached, completion)

    def set_config(self, config: BudgetConfig) -> None:
        """Use ``config`` from the next operation on (one reference swap; holds stay)."""
        self.config = config

    def purge(self, now: float | None = None) -> int:
        """Sweep expired holds, then delete reservation records created more than
        ``record_retention_s`` before ``now``; returns how many were deleted. Spend and
        usage counters (one row per scope or target per window) are kept."""
        now = current_time(now)
        with self._transaction("BEGIN IMMEDIATE") as conn:
            self._sweep(conn, now)
            cur = conn.execute("DELETE FROM budget_reservations WHERE created_s < ? AND state != 'held'",
                               (now - self.config.record_retention_s,))
            return cur.rowcount

    def close(self) -> None:
        """Close this process's connection (reopened on next use)."""
        with self._guard():
            self._stop.set()
            if self._conn is not None and self._pid == os.getpid():
                self._conn.close()
            self._conn = None

    def __repr__(self) -> str:
        return f"SqliteLedger({str(self.path)!r}, synchronous={self.synchronous!r})"
