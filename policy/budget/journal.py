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
ledger's copy is the first one) and kept one by one for ``KEEP_RECENT_S``: a Redis restart on a cut
file re-applies only what was booked within minutes of the ledger's last sighting (``FleetState.restore_spend``).
``compact`` then folds them into ``sums``: one row per (decision scopes, target, UTC day) with the settled
nano-USD, tokens and number of settlements, which an emptied ledger books in one call
(``RedisLedger.add_sums``, once per store: keyed by this file's ``uid``); a sum is forgotten once its month
window's keys have expired in the ledger. So the file holds the last hour's rows and a sum per scope set,
target and day: its size follows one hour's traffic, not a month's (a file left more than half free,
after a burst or from an earlier version, is vacuumed). A row whose settlement names no scopes is dropped,
not folded (an emptied ledger has nothing to book it on). ``expires_s``: a lower bound of when the
ledger's record of the decision (``r:<id>``, which makes a settle idempotent) expires; NULL when the
settlement names no scopes (such a settle can only complete a record that still exists, so re-applying it
never books anything twice). ``window_s``: the time whose windows it is booked in. ``meta`` keeps this
file's ``uid`` and where it lives (``home``: a copy found elsewhere takes a fresh ``uid``, ``_claim``),
which ledger incarnation it last saw (``seen``/``see``) and which one was last made to count
its sums, and when (``applied``/``apply``), and the time a restore books rows again at (``restoring``): while it is
kept ``compact`` folds nothing, so a restore that read a row books it into a store whose sums cannot hold it. With that
time, how far the pass got (``Restoring``, ``restored_to``): a pass cut short resumes there, not at the first row.

One row per decision id (the first settlement wins, as in the ledger). Connections are opened
per call, so it is thread- and fork-safe. The settlements of concurrent ``add`` (and ``book``)
calls are group-committed (``pointsman.group_commit``): one transaction and one ``fsync`` for
those that arrive while the previous one is written, so an outage under load costs each outcome
about two ``fsync``s, not a queue of them.

    journal(decision_id TEXT PRIMARY KEY, args TEXT,  -- args: JSON keyword arguments of
            booked_s REAL, expires_s REAL,            -- BudgetLedger.settle; booked_s NULL:
            window_s REAL)                            -- waiting for the ledger
    sums(scopes TEXT, target TEXT, day TEXT,          -- scopes a JSON list; target '' for none; day id
         at_s REAL, until_s REAL,                     -- a time in the day (its windows); its month's end
         nusd INTEGER, prompt INTEGER, cached INTEGER, completion INTEGER, n INTEGER,
         PRIMARY KEY (scopes, target, day))
    meta(key TEXT PRIMARY KEY, value TEXT)
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import closing
from pathlib import Path
from typing import NamedTuple, TypedDict, cast

from pointsman.group_commit import GroupCommit
from pointsman.policy.budget.ledger import LedgerUnavailable
from pointsman.policy.budget.units import to_nusd, window_of

log = logging.getLogger(__name__)

#: Default file name under the data folder.
DEFAULT_JOURNAL_NAME = "spend-journal.db"
#: Seconds a booked row is kept one by one after its last booking (then ``compact`` folds it into a sum).
KEEP_RECENT_S = 3600.0
#: The WAL is cut back to this many bytes after a checkpoint (SQLite's ``journal_size_limit``; it never shrinks
#: otherwise): a burst of writes (a restore booking an hour of rows again) leaves no lasting file behind.
WAL_LIMIT_BYTES = 4 << 20

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
    bound of when the ledger forgets the decision's record; None: its settle names no scopes). ``again``: booked
    again from its row (a restore): only a row still kept takes the new times (one folded or forgotten meanwhile
    stays so: its settlement is kept once, in the sums or nowhere)."""

    decision_id: str
    args: SettleArgs
    booked_s: float
    expires_s: float | None
    again: bool = False
    rowid: int = 0  # its row's (``SpendJournal.booked``); 0: not read from the file


class Seen(NamedTuple):
    """The ledger incarnation this file last saw: ``epoch`` and ``run_id`` (``RedisLedger.incarnation``),
    ``ok_s`` (Unix s, when it was last seen so; refreshed at most every minute, so never later than the truth)."""

    epoch: str
    run_id: str
    ok_s: float


class Applied(NamedTuple):
    """The ledger ``epoch`` that was last made to count this file's sums (``RedisLedger.add_sums``: booked, or noted
    as counted), and when (Unix s, after the call returned)."""

    epoch: str
    s: float


class Restoring(NamedTuple):
    """The restore pass under way (``SpendJournal.restoring``): ``at_s`` (Unix s) the time it books rows again at, and the
    rows it books (``SpendJournal.booked``'s ``after`` and ``last``, rowids): those after ``after`` (0: from the first),
    up to ``last`` (the last row kept when the pass of its kind began)."""

    at_s: float
    after: int
    last: int


class Sum(NamedTuple):
    """Settlements folded together (``SpendJournal.compact``): their ``scopes`` and ``target`` (None: none), a time
    ``at_s`` (Unix s) in their UTC day (the windows they are booked in), settled ``cost_nusd`` (nano-USD), tokens,
    and how many ``settlements``."""

    scopes: tuple[str, ...]
    target: str | None
    at_s: float
    cost_nusd: int
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    settlements: int


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
                conn.execute("CREATE TABLE IF NOT EXISTS sums (scopes TEXT NOT NULL, target TEXT NOT NULL, "
                             "day TEXT NOT NULL, at_s REAL NOT NULL, until_s REAL NOT NULL, nusd INTEGER NOT NULL, "
                             "prompt INTEGER NOT NULL, cached INTEGER NOT NULL, completion INTEGER NOT NULL, "
                             "n INTEGER NOT NULL, PRIMARY KEY (scopes, target, day))")
                conn.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
                conn.execute("INSERT OR IGNORE INTO meta(key, value) VALUES ('uid', ?)", (secrets.token_hex(8),))
                have = {row[1] for row in conn.execute("PRAGMA table_info(journal)")}
                for name, kind in _COLUMNS.items():  # a file of an earlier version
                    if name not in have:
                        conn.execute(f"ALTER TABLE journal ADD COLUMN {name} {kind}")
                conn.execute("CREATE INDEX IF NOT EXISTS journal_booked ON journal(booked_s)")
                self._claim(conn)
        except (OSError, sqlite3.Error) as exc:
            raise LedgerUnavailable(f"spend journal {self.path}: {exc}") from None

    def _claim(self, conn: sqlite3.Connection) -> None:
        """Keep where this file lives (``meta`` ``home``: host name and inode); a file found elsewhere is
        a copy (a cloned volume, a copied file) of another replica's journal, sharing its ``uid``: after the
        ledger lost its store only one of the two would book its sums (``RedisLedger.add_sums`` books a ``uid``
        once). The copy takes a fresh ``uid`` and drops the booked rows and sums it inherited (the original still
        holds and restores them), keeping the settlements still waiting (settled once whoever books them first).
        A file moved to another host (or a pod renamed) counts as a copy too: run replicas with a stable host
        name (a StatefulSet) to keep their sums across restarts."""
        home = [socket.gethostname(), os.stat(self.path).st_ino]  # not st_dev: a remount (overlayfs) renumbers it
        conn.execute("BEGIN IMMEDIATE")
        row = conn.execute("SELECT value FROM meta WHERE key = 'home'").fetchone()
        if row is not None and json.loads(row[0]) != home:
            dropped = conn.execute("DELETE FROM journal WHERE booked_s IS NOT NULL").rowcount
            dropped += conn.execute("DELETE FROM sums").rowcount
            conn.execute("DELETE FROM meta WHERE key IN ('seen', 'applied', 'restoring')")
            conn.execute("UPDATE meta SET value = ? WHERE key = 'uid'", (secrets.token_hex(8),))
            log.warning("spend journal %s was made at %s, is now at %s (host, inode): a copy of another "
                        "replica's journal; it takes a fresh uid and drops the %d booked row(s) and sum(s) it "
                        "inherited (the original books them again)", self.path, json.loads(row[0]), home, dropped)
        conn.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('home', ?)", (json.dumps(home),))
        conn.execute("COMMIT")

    def _connect(self, synchronous: str = "FULL") -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=10.0, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={synchronous}")
        conn.execute(f"PRAGMA journal_size_limit={WAL_LIMIT_BYTES}")
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
                self._book_conn[1].execute(f"PRAGMA journal_size_limit={WAL_LIMIT_BYTES}")
            conn = self._book_conn[1]
            try:
                conn.execute("BEGIN IMMEDIATE")
                for again in (False, True):
                    conn.executemany(
                        "UPDATE journal SET args = ?2, booked_s = ?3, expires_s = ?4, window_s = ?5 WHERE decision_id = ?1"
                        if again else
                        "INSERT INTO journal(decision_id, args, booked_s, expires_s, window_s) VALUES (?, ?, ?, ?, ?) "
                        "ON CONFLICT(decision_id) DO UPDATE SET args = excluded.args, booked_s = excluded.booked_s, "
                        "expires_s = excluded.expires_s, window_s = excluded.window_s",
                        [(b.decision_id, json.dumps(dict(b.args)), b.booked_s, b.expires_s,
                          b.args["issued_s"] if b.args["issued_s"] is not None else b.args["now"])
                         for b in rows if b.again == again])
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

    def booked(self, since_s: float, alive_after_s: float, page: int = 1000, after: int = 0,
               last: int | None = None) -> Iterator[Booked]:
        """The booked rows kept, booked at or after ``since_s`` whose ledger record outlives ``alive_after_s``
        (``expires_s`` NULL or later), in insertion order (``Booked.rowid``), read ``page`` rows at a time (rows booked
        again while this runs keep their place); those after rowid ``after``, up to rowid ``last``, default the rows kept
        when the first page is read: those added later were booked in the store a restore books into (and a restore
        reading them would not end while settlements come as fast as it books them, holding ``compact`` off). Raises
        ``LedgerUnavailable``."""
        while True:
            try:
                with closing(self._connect()) as conn:
                    if last is None:
                        last = conn.execute("SELECT coalesce(max(rowid), 0) FROM journal").fetchone()[0]
                    rows = conn.execute(
                        "SELECT rowid, decision_id, args, booked_s, expires_s FROM journal WHERE rowid > ? "
                        "AND rowid <= ? AND booked_s >= ? AND (expires_s IS NULL OR expires_s > ?) ORDER BY rowid "
                        "LIMIT ?", (after, last, since_s, alive_after_s, page)).fetchall()
            except sqlite3.Error as exc:
                raise self._error(exc) from None
            for rowid, d, a, b, e in rows:
                after = rowid
                yield Booked(str(d), cast(SettleArgs, json.loads(a)), float(b), None if e is None else float(e),
                             rowid=int(rowid))
            if len(rows) < page:
                return

    def done(self, decision_ids: list[str]) -> None:
        """Forget these entries; raises ``LedgerUnavailable``."""
        try:
            with closing(self._connect()) as conn:
                conn.executemany("DELETE FROM journal WHERE decision_id = ?", [(d,) for d in decision_ids])
        except sqlite3.Error as exc:
            raise self._error(exc) from None

    def compact(self, before_s: float, forget_before_s: float, page: int = 5000) -> int:
        """Fold the rows last booked before ``before_s`` (Unix s) into ``sums`` (a row naming no scopes is dropped)
        and forget the sums whose month window ended before ``forget_before_s``; ``page`` rows a transaction, none
        while a restore is under way (``restoring`` kept: checked in each transaction). A file then more than half
        free is vacuumed (what stays is small: copying it is quick). Returns how many rows were folded or dropped.
        Raises ``LedgerUnavailable``."""
        done = 0
        try:
            with closing(self._connect("NORMAL")) as conn:
                while True:
                    conn.execute("BEGIN IMMEDIATE")
                    if conn.execute("SELECT 1 FROM meta WHERE key = 'restoring'").fetchone() is not None:
                        conn.execute("ROLLBACK")
                        return done
                    if not done:
                        conn.execute("DELETE FROM sums WHERE until_s < ?", (forget_before_s,))
                    rows = conn.execute(
                        "SELECT rowid, json_extract(args, '$.scopes'), coalesce(json_extract(args, '$.target'), ''), "
                        "window_s, json_extract(args, '$.actual_cost_usd'), json_extract(args, '$.prompt_tokens'), "
                        "json_extract(args, '$.cached_tokens'), json_extract(args, '$.completion_tokens') "
                        "FROM journal WHERE booked_s < ? LIMIT ?", (before_s, page)).fetchall()
                    sums: dict[tuple[str, str, float], list[float]] = {}
                    for _, scopes, target, at, cost, prompt, cached, completion in rows:
                        if scopes is None:
                            continue
                        s = sums.get((scopes, target, at // 86400.0))
                        if s is None:
                            s = sums[scopes, target, at // 86400.0] = [at, window_of("month", at).end_s, 0, 0, 0, 0, 0]
                        s[2] += to_nusd(cost)
                        s[3] += prompt
                        s[4] += cached
                        s[5] += completion
                        s[6] += 1
                    conn.executemany(
                        "INSERT INTO sums VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(scopes, target, day) DO "
                        "UPDATE SET nusd = nusd + excluded.nusd, prompt = prompt + excluded.prompt, "
                        "cached = cached + excluded.cached, completion = completion + excluded.completion, "
                        "n = n + excluded.n", [(scopes, target, window_of("day", v[0]).id, *v)
                                                  for (scopes, target, _), v in sums.items()])
                    conn.executemany("DELETE FROM journal WHERE rowid = ?", [(r[0],) for r in rows])
                    conn.execute("COMMIT")
                    done += len(rows)
                    if len(rows) < page:
                        break
                free, pages = (conn.execute(f"PRAGMA {name}").fetchone()[0] for name in ("freelist_count", "page_count"))
                if 2 * free > pages:  # mostly free pages (a burst, a file of an earlier version): give them back
                    conn.execute("VACUUM")
                return done
        except sqlite3.Error as exc:
            raise self._error(exc) from None

    def sums(self) -> list[Sum]:
        """Every sum kept (``compact``); raises ``LedgerUnavailable``."""
        try:
            with closing(self._connect()) as conn:
                return self._sums(conn)
        except sqlite3.Error as exc:
            raise self._error(exc) from None

    @staticmethod
    def _sums(conn: sqlite3.Connection) -> list[Sum]:
        rows = conn.execute("SELECT scopes, target, at_s, nusd, prompt, cached, completion, n FROM sums "
                            "ORDER BY scopes, target, day").fetchall()
        return [Sum(tuple(json.loads(s)), t or None, float(at), *(int(v) for v in rest)) for s, t, at, *rest in rows]

    def _meta(self, key: str) -> list[object] | None:
        try:
            with closing(self._connect()) as conn:
                row = conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        except sqlite3.Error as exc:
            raise self._error(exc) from None
        return None if row is None else cast(list[object], json.loads(row[0]))

    def _set_meta(self, key: str, value: Sequence[object]) -> None:
        try:
            with closing(self._connect()) as conn:
                conn.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)", (key, json.dumps(list(value))))
        except sqlite3.Error as exc:
            raise self._error(exc) from None

    @property
    def uid(self) -> str:
        """This file's id (16 hex digits, made with it): what keys its sums in the ledger. Raises ``LedgerUnavailable``."""
        try:
            with closing(self._connect()) as conn:
                return str(conn.execute("SELECT value FROM meta WHERE key = 'uid'").fetchone()[0])
        except sqlite3.Error as exc:
            raise self._error(exc) from None

    def seen(self) -> Seen | None:
        """The ledger incarnation last seen (``see``), or None; raises ``LedgerUnavailable``."""
        row = self._meta("seen")
        return None if row is None else Seen(*row)  # type: ignore[arg-type]

    def see(self, seen: Seen, restored: bool = False) -> None:
        """Keep ``seen`` as the ledger incarnation last seen; ``restored``: and forget the time ``restoring`` kept
        (a restore finished), in the same transaction (a process dying between the two would leave ``compact``
        held off). Raises ``LedgerUnavailable``."""
        try:
            with closing(self._connect()) as conn:
                conn.execute("BEGIN IMMEDIATE")
                conn.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('seen', ?)", (json.dumps(list(seen)),))
                if restored:
                    conn.execute("DELETE FROM meta WHERE key = 'restoring'")
                conn.execute("COMMIT")
        except sqlite3.Error as exc:
            raise self._error(exc) from None

    def applied(self) -> Applied | None:
        """The ledger epoch last made to count the sums, and when (``apply``), or None; raises ``LedgerUnavailable``."""
        row = self._meta("applied")
        return None if row is None else Applied(*row)  # type: ignore[arg-type]

    def apply(self, applied: Applied) -> None:
        """Keep ``applied``; raises ``LedgerUnavailable``."""
        self._set_meta("applied", applied)

    def restoring(self, now: float, of: Sequence[object] | None = None) -> Restoring:
        """The restore pass to run (``FleetState.restore_spend``): the time it books rows again at, the one kept by a
        pass that did not finish (``see`` with ``restored`` not called since; its lost calls booked at that time), else
        ``now``, kept; and the rows it books: after those a pass cut short booked again (``restored_to``) when that pass
        was ``of`` too (JSON-able: the ledger's incarnation and how the pass chooses its rows), else all, up to the last
        row kept now. ``of`` None: never resumed. Call it before reading the rows and sums to restore: while the time is
        kept, ``compact`` folds nothing (a row it folded after that read would be booked as a row into a store that may
        count it in the sums, and kept in both). Raises ``LedgerUnavailable``."""
        try:
            with closing(self._connect()) as conn:
                conn.execute("BEGIN IMMEDIATE")
                row = conn.execute("SELECT value FROM meta WHERE key = 'restoring'").fetchone()
                kept = [now] if row is None else json.loads(row[0])
                if of is not None and len(kept) == 4 and kept[1] == json.loads(json.dumps(list(of))):
                    conn.execute("COMMIT")
                    return Restoring(float(kept[0]), int(kept[3]), int(kept[2]))
                last = int(conn.execute("SELECT coalesce(max(rowid), 0) FROM journal").fetchone()[0])
                if row is None:
                    conn.execute("INSERT INTO meta(key, value) VALUES ('restoring', ?)", (json.dumps(
                        [now] if of is None else [now, list(of), last, 0]),))
                conn.execute("COMMIT")
                return Restoring(float(kept[0]), 0, last)
        except sqlite3.Error as exc:
            raise self._error(exc) from None

    def restored_to(self, at_s: float, of: Sequence[object], last: int, after: int) -> None:
        """Keep that the pass ``of`` (``restoring``) booking rows again at ``at_s`` booked every row it chose up to rowid
        ``after`` of those up to ``last``: a pass of the same ``of`` resumes after it. Only while its time is kept (a
        pass finished since forgot it: nothing is kept then). Raises ``LedgerUnavailable``."""
        try:
            with closing(self._connect()) as conn:
                conn.execute("BEGIN IMMEDIATE")
                row = conn.execute("SELECT value FROM meta WHERE key = 'restoring'").fetchone()
                if row is not None and float(json.loads(row[0])[0]) == at_s:
                    conn.execute("UPDATE meta SET value = ? WHERE key = 'restoring'",
                                 (json.dumps([at_s, list(of), last, after]),))
                conn.execute("COMMIT")
        except sqlite3.Error as exc:
            raise self._error(exc) from None

    def restore_unfinished(self) -> bool:
        """Whether a restore's time is kept (``restoring``): a pass began and none finished since (``see`` with
        ``restored``). ``FleetState.restore_spend`` then runs a pass even when the incarnation was seen (a worker that
        read the last one before another noted the new one, cut short since): else no pass would forget the time and
        ``compact`` would fold nothing until the ledger's next restart. Raises ``LedgerUnavailable``."""
        return self._meta("restoring") is not None

    def __len__(self) -> int:
        """Entries waiting (0 when the file cannot be read)."""
        try:
            with closing(self._connect()) as conn:
                return int(conn.execute("SELECT COUNT(*) FROM journal WHERE booked_s IS NULL").fetchone()[0])
        except sqlite3.Error:
            return 0


__all__ = ["DEFAULT_JOURNAL_NAME", "KEEP_RECENT_S", "Applied", "Booked", "Restoring", "Seen", "SettleArgs", "SpendJournal",
           "Sum"]
