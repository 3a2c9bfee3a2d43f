"""The spend journal: settlements acknowledged while the budget ledger was unavailable, kept on
local disk until the ledger takes them; and, for a ledger that can lose what it acknowledged (Redis),
the settlements this replica booked, kept to book them again (``FleetState.restore_spend``).

When ``FleetState.settle`` cannot reach the ledger (Redis down, SQLite locked past its timeout)
for an outcome whose decision it knows (a signed id's claims, or its own record), it appends the
settlement here (one SQLite row, ``synchronous=FULL``: on disk when ``add`` returns) and the
outcome is acknowledged. ``FleetState.replay_journal`` (every second, from the service) settles
each entry in the ledger and marks it booked (or deletes it, for a ledger that keeps what it
acknowledged). Replay is idempotent: the ledger settles a decision id once (a repeat is
``replayed``), so an entry applied but not yet marked when a process dies is applied again
harmlessly, and workers sharing the file may replay the same entry.

Booked rows (``booked_s`` set: when this replica last wrote it to the ledger, Unix s) are written
with ``synchronous=NORMAL`` (they survive the process, SIGKILL included; not the machine: the
ledger's copy is the first one) and kept while their window is the current UTC month or they were
booked within ``KEEP_RECENT_S`` (``prune``). ``expires_s``: a lower bound of when the ledger's
record of the decision (``r:<id>``, which makes a settle idempotent) expires; NULL when the
settlement names no scopes (such a settle can only complete a record that still exists, so
re-applying it never books anything twice). ``window_s``: the time whose windows it is booked in.
``meta`` keeps which ledger incarnation this file last saw (``seen``/``see``).

One row per decision id (the first settlement wins, as in the ledger). Connections are opened
per call, so it is thread- and fork-safe. The settlements of concurrent ``add`` (and ``book``)
calls are group-committed (``pointsman.group_commit``): one transaction and one ``fsync`` for
those that arrive while the previous one is written, so an outage under load costs each outcome
about two ``fsync``s, not a queue of them.

    journal(decision_id TEXT PRIMARY KEY, args TEXT,  -- args: JSON keyword arguments of
            booked_s REAL, expires_s REAL,            -- BudgetLedger.settle; booked_s NULL:
            window_s REAL)                            -- waiting for the ledger
    meta(key TEXT PRIMARY KEY, value TEXT)
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import closing
from pathlib import Path
from typing import NamedTuple, TypedDict, cast

from pointsman.group_commit import GroupCommit
from pointsman.policy.budget.ledger import LedgerUnavailable
from pointsman.policy.budget.units import window_of

#: Default file name under the data folder.
DEFAULT_JOURNAL_NAME = "spend-journal.db"
#: Seconds a booked row is kept after its last booking even when its window is not the current month.
KEEP_RECENT_S = 3600.0

_COLUMNS = {"booked_s": "REAL", "expires_s": "REAL", "window_s": "REAL"}


class SettleArgs(TypedDict):
    """``BudgetLedger.settle``'s keyword arguments besides the decision id: what a journal entry
    keeps (USD, Unix seconds, token counts, the decision's scopes and time)."""

    actual_cost_usd: float
    now: float
    target: str | None
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    scopes: list[str] | None
    issued_s: float | None


class Booked(NamedTuple):
    """A settlement booked in the ledger: ``booked_s`` (Unix s, when written), ``expires_s`` (a lower
    bound of when the ledger forgets the decision's record; None: its settle names no scopes)."""

    decision_id: str
    args: SettleArgs
    booked_s: float
    expires_s: float | None


class Seen(NamedTuple):
    """The ledger incarnation this file last saw: ``epoch`` and ``run_id`` (``RedisLedger.incarnation``),
    ``ok_s`` (Unix s, when it was last seen so; refreshed at most every minute, so never later than the truth)."""

    epoch: str
    run_id: str
    ok_s: float


class SpendJournal:
    """Settlements waiting for the ledger, and those booked, in the SQLite file ``path`` (parents created)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._group: GroupCommit[tuple[str, str], bool] = GroupCommit(self._add_many)
        self._booked: GroupCommit[Booked, None] = GroupCommit(self._book_many)
        self._book_conn: tuple[int, sqlite3.Connection] | None = None  # (pid, connection) of ``book``
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with closing(self._connect()) as conn:
                conn.execute("CREATE TABLE IF NOT EXISTS journal (decision_id TEXT PRIMARY KEY, args TEXT NOT NULL, "
                             "booked_s REAL, expires_s REAL, window_s REAL)")
                conn.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
                have = {row[1] for row in conn.execute("PRAGMA table_info(journal)")}
                for name, kind in _COLUMNS.items():  # a file of an earlier version
                    if name not in have:
                        conn.execute(f"ALTER TABLE journal ADD COLUMN {name} {kind}")
                conn.execute("CREATE INDEX IF NOT EXISTS journal_booked ON journal(booked_s)")
        except (OSError, sqlite3.Error) as exc:
            raise LedgerUnavailable(f"spend journal {self.path}: {exc}") from None

    def _connect(self, synchronous: str = "FULL") -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=10.0, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={synchronous}")
        return conn

    def _error(self, exc: sqlite3.Error) -> LedgerUnavailable:
        return LedgerUnavailable(f"spend journal {self.path}: {exc}")

    def add(self, decision_id: str, args: SettleArgs) -> bool:
        """Keep one settlement (``BudgetLedger.settle`` keyword arguments besides the id) durably
        (``fsync``ed when this returns); False when the decision already has one (kept as it was).
        Raises ``LedgerUnavailable`` when the file cannot be written (then nothing is acknowledged)."""
        return self._group.run((decision_id, json.dumps(dict(args))))

    def _add_many(self, entries: Sequence[tuple[str, str]]) -> list[bool]:
        """``add`` for several settlements (id, JSON arguments) in one transaction: whether each was new."""
        try:
            with closing(self._connect()) as conn:
                conn.execute("BEGIN IMMEDIATE")
                new = [conn.execute("INSERT OR IGNORE INTO journal(decision_id, args) VALUES (?, ?)",
                                    entry).rowcount == 1 for entry in entries]
                conn.execute("COMMIT")
                return new
        except sqlite3.Error as exc:
            raise self._error(exc) from None

    def book(self, booked: Booked) -> None:
        """Keep a settlement the ledger booked (a waiting one becomes booked; one booked before takes the new
        times). Not ``fsync``ed (see the module). Raises ``LedgerUnavailable``."""
        self._booked.run(booked)

    def _book_many(self, rows: Sequence[Booked]) -> list[None]:
        """``book`` for several rows in one transaction, on a connection kept open (per process; the group
        commit runs one batch at a time): closing a file's last connection checkpoints its WAL with an ``fsync``."""
        try:
            if self._book_conn is None or self._book_conn[0] != os.getpid():
                self._book_conn = (os.getpid(), sqlite3.connect(self.path, timeout=10.0, isolation_level=None,
                                                                check_same_thread=False))
                self._book_conn[1].execute("PRAGMA synchronous=NORMAL")
            conn = self._book_conn[1]
            try:
                conn.execute("BEGIN IMMEDIATE")
                conn.executemany(
                    "INSERT INTO journal(decision_id, args, booked_s, expires_s, window_s) VALUES (?, ?, ?, ?, ?) "
                    "ON CONFLICT(decision_id) DO UPDATE SET args = excluded.args, booked_s = excluded.booked_s, "
                    "expires_s = excluded.expires_s, window_s = excluded.window_s",
                    [(b.decision_id, json.dumps(dict(b.args)), b.booked_s, b.expires_s,
                      b.args["issued_s"] if b.args["issued_s"] is not None else b.args["now"]) for b in rows])
                conn.execute("COMMIT")
            except sqlite3.Error:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        except sqlite3.Error as exc:
            raise self._error(exc) from None
        return [None] * len(rows)

    def pending(self, limit: int = 1000) -> list[tuple[str, SettleArgs]]:
        """Up to ``limit`` ``(decision_id, settle arguments)`` waiting; raises ``LedgerUnavailable``."""
        try:
            with closing(self._connect()) as conn:
                rows = conn.execute("SELECT decision_id, args FROM journal WHERE booked_s IS NULL LIMIT ?",
                                    (limit,)).fetchall()
        except sqlite3.Error as exc:
            raise self._error(exc) from None
        return [(str(d), cast(SettleArgs, json.loads(a))) for d, a in rows]

    def booked(self, since_s: float = float("-inf"), alive_after_s: float = float("-inf"),
               page: int = 1000) -> Iterator[Booked]:
        """The booked rows kept, booked at or after ``since_s`` whose ledger record outlives ``alive_after_s``
        (``expires_s`` NULL or later), in insertion order, read ``page`` rows at a time (rows booked again while
        this runs keep their place). Raises ``LedgerUnavailable``."""
        after = 0
        while True:
            try:
                with closing(self._connect()) as conn:
                    rows = conn.execute(
                        "SELECT rowid, decision_id, args, booked_s, expires_s FROM journal WHERE rowid > ? "
                        "AND booked_s >= ? AND (expires_s IS NULL OR expires_s > ?) ORDER BY rowid LIMIT ?",
                        (after, since_s, alive_after_s, page)).fetchall()
            except sqlite3.Error as exc:
                raise self._error(exc) from None
            for rowid, d, a, b, e in rows:
                after = rowid
                yield Booked(str(d), cast(SettleArgs, json.loads(a)), float(b), None if e is None else float(e))
            if len(rows) < page:
                return

    def done(self, decision_ids: list[str]) -> None:
        """Forget these entries; raises ``LedgerUnavailable``."""
        try:
            with closing(self._connect()) as conn:
                conn.executemany("DELETE FROM journal WHERE decision_id = ?", [(d,) for d in decision_ids])
        except sqlite3.Error as exc:
            raise self._error(exc) from None

    def prune(self, now: float) -> int:
        """Forget booked rows booked before ``now - KEEP_RECENT_S`` whose window is before the current UTC month
        (``now``); returns how many. Raises ``LedgerUnavailable``."""
        try:
            with closing(self._connect("NORMAL")) as conn:
                return int(conn.execute("DELETE FROM journal WHERE booked_s < ? AND window_s < ?",
                                        (now - KEEP_RECENT_S, window_of("month", now).start_s)).rowcount)
        except sqlite3.Error as exc:
            raise self._error(exc) from None

    def seen(self) -> Seen | None:
        """The ledger incarnation last seen (``see``), or None; raises ``LedgerUnavailable``."""
        try:
            with closing(self._connect()) as conn:
                row = conn.execute("SELECT value FROM meta WHERE key = 'seen'").fetchone()
        except sqlite3.Error as exc:
            raise self._error(exc) from None
        return None if row is None else Seen(*json.loads(row[0]))

    def see(self, seen: Seen) -> None:
        """Keep ``seen`` as the ledger incarnation last seen; raises ``LedgerUnavailable``."""
        try:
            with closing(self._connect()) as conn:
                conn.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('seen', ?)", (json.dumps(list(seen)),))
        except sqlite3.Error as exc:
            raise self._error(exc) from None

    def __len__(self) -> int:
        """Entries waiting (0 when the file cannot be read)."""
        try:
            with closing(self._connect()) as conn:
                return int(conn.execute("SELECT COUNT(*) FROM journal WHERE booked_s IS NULL").fetchone()[0])
        except sqlite3.Error:
            return 0


__all__ = ["DEFAULT_JOURNAL_NAME", "KEEP_RECENT_S", "Booked", "Seen", "SettleArgs", "SpendJournal"]
