"""The spend journal: settlements acknowledged while the budget ledger was unavailable, kept on
local disk until the ledger takes them.

When ``FleetState.settle`` cannot reach the ledger (Redis down, SQLite locked past its timeout)
for an outcome whose decision it knows (a signed id's claims, or its own record), it appends the
settlement here (one SQLite row, ``synchronous=FULL``: on disk when ``add`` returns) and the
outcome is acknowledged. ``FleetState.replay_journal`` (every second, from the service) settles
each entry in the ledger and deletes it. Replay is idempotent: the ledger settles a decision id
once (a repeat is ``replayed``), so an entry applied but not yet deleted when a process dies is
applied again harmlessly, and workers sharing the file may replay the same entry.

One row per decision id (the first settlement wins, as in the ledger). Connections are opened
per call (the journal is written only during outages), so it is thread- and fork-safe. The
settlements of concurrent ``add`` calls are group-committed (``pointsman.group_commit``): one
transaction and one ``fsync`` for those that arrive while the previous one is written, so an
outage under load costs each outcome about two ``fsync``s, not a queue of them.

    journal(decision_id TEXT PRIMARY KEY, args TEXT)  -- args: JSON keyword arguments of
                                                       -- BudgetLedger.settle
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from contextlib import closing
from pathlib import Path
from typing import TypedDict, cast

from pointsman.group_commit import GroupCommit
from pointsman.policy.budget.ledger import LedgerUnavailable

#: Default file name under the data folder.
DEFAULT_JOURNAL_NAME = "spend-journal.db"


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


class SpendJournal:
    """Settlements waiting for the ledger, in the SQLite file ``path`` (parents created)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._group: GroupCommit[tuple[str, str], bool] = GroupCommit(self._add_many)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with closing(self._connect()) as conn:
                conn.execute("CREATE TABLE IF NOT EXISTS journal (decision_id TEXT PRIMARY KEY, args TEXT NOT NULL)")
        except (OSError, sqlite3.Error) as exc:
            raise LedgerUnavailable(f"spend journal {self.path}: {exc}") from None

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=10.0, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        return conn

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
            raise LedgerUnavailable(f"spend journal {self.path}: {exc}") from None

    def pending(self, limit: int = 1000) -> list[tuple[str, SettleArgs]]:
        """Up to ``limit`` ``(decision_id, settle arguments)`` waiting; raises ``LedgerUnavailable``."""
        try:
            with closing(self._connect()) as conn:
                rows = conn.execute("SELECT decision_id, args FROM journal LIMIT ?", (limit,)).fetchall()
        except sqlite3.Error as exc:
            raise LedgerUnavailable(f"spend journal {self.path}: {exc}") from None
        return [(str(d), cast(SettleArgs, json.loads(a))) for d, a in rows]

    def done(self, decision_ids: list[str]) -> None:
        """Forget entries the ledger has taken; raises ``LedgerUnavailable``."""
        try:
            with closing(self._connect()) as conn:
                conn.executemany("DELETE FROM journal WHERE decision_id = ?", [(d,) for d in decision_ids])
        except sqlite3.Error as exc:
            raise LedgerUnavailable(f"spend journal {self.path}: {exc}") from None

    def __len__(self) -> int:
        """Entries waiting (0 when the file cannot be read)."""
        try:
            with closing(self._connect()) as conn:
                return int(conn.execute("SELECT COUNT(*) FROM journal").fetchone()[0])
        except sqlite3.Error:
            return 0


__all__ = ["DEFAULT_JOURNAL_NAME", "SettleArgs", "SpendJournal"]
