"""One SQLite transaction as a context manager, for the stores that keep their state in SQLite
(the budget ledger, the decision and outcome log).

``transaction(conn, begin, fail)`` runs ``begin`` (``BEGIN IMMEDIATE`` for writes: the
database's write lock taken before the first read), yields the connection, commits, and on any
error rolls back. A ``sqlite3.Error`` becomes ``fail(exc, phase)`` (phase ``"begin"`` when the
transaction could not start, ``"write"`` when it failed inside), so each store raises its own
error type with its own message; other exceptions propagate unchanged after the rollback.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Literal

Phase = Literal["begin", "write"]


@contextmanager
def transaction(conn: sqlite3.Connection, begin: str,
                fail: Callable[[sqlite3.Error, Phase], Exception]) -> Iterator[sqlite3.Connection]:
    """See the module docstring. The caller holds whatever lock serializes its writers."""
    try:
        conn.execute(begin)
    except sqlite3.Error as exc:
        raise fail(exc, "begin") from exc
    try:
        yield conn
        conn.execute("COMMIT")
    except BaseException as exc:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        if isinstance(exc, sqlite3.Error):
            raise fail(exc, "write") from exc
        raise
