"""Spend journal size and a new-epoch restore's time: ``n`` settlements a replica booked across ``scopes`` scopes
(one each, 3 targets), spread evenly over the current UTC month so far (at most ``--days``), kept in its spend journal.

    .venv/bin/python scripts/bench_spend_journal.py                 # 200,000 settlements, 50 scopes
    .venv/bin/python scripts/bench_spend_journal.py --n 20000 --scopes 5

Steps: the rows are written as ``FleetState`` keeps them (``SpendJournal.book``); the journal then sees the ledger
unchanged for a minute, so ``FleetState.restore_spend`` does the journal's upkeep, twice, the second time with
the replica's clock ``RESTORE_LOOKBACK_S`` + 61 s ahead (what it does at the first sighting, then later; timed);
the file's size is read (write-ahead log checkpointed; and after ``VACUUM``: what the pages in use take); then
the private ``redis-server`` (no persistence, started from PATH on a free port) is flushed and ``restore_spend``
runs until it has booked the journal again (timed), and each scope's settled spend in the month window is checked
against what was booked. Prints JSON. Runs on the code of an earlier version too (``journal_sums_after_upkeep`` 0).
"""

from __future__ import annotations

import json
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from contextlib import closing
from pathlib import Path

import click


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@click.command()
@click.option("--n", default=200_000, show_default=True, help="settlements booked")
@click.option("--scopes", default=50, show_default=True, help="scopes they are spread over")
@click.option("--days", default=30.0, show_default=True, help="at most this many days back (within the current month)")
def main(n: int, scopes: int, days: float) -> None:
    import redis

    from pointsman.policy.budget.config import BudgetConfig
    from pointsman.policy.budget.journal import Booked, Seen, SpendJournal
    from pointsman.policy.budget.redis_ledger import RedisLedger
    from pointsman.policy.budget.units import to_nusd, window_of
    from pointsman.policy.fleet import load_fleet
    from pointsman.policy.signals.fleet_state import RESTORE_LOOKBACK_S, FleetState

    if shutil.which("redis-server") is None:
        sys.exit("redis-server not on PATH")
    port = _port()
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
                             "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    tmp = Path(tempfile.mkdtemp())
    try:
        client = redis.Redis(port=port)
        for _ in range(200):
            try:
                client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        ledger = RedisLedger.from_url(f"redis://127.0.0.1:{port}/0", BudgetConfig(), timeout_s=30.0)
        journal = SpendJournal(tmp / "spend-journal.db")
        ahead = [0.0]
        state = FleetState(load_fleet(), ledger, journal=journal, clock=lambda: time.time() + ahead[0])
        now = time.time()
        month = window_of("month", now)
        start = max(month.start_s + 1.0, now - days * 86400.0)
        expected: dict[str, int] = {}
        batch: list[Booked] = []
        t0 = time.perf_counter()
        for i in range(n):
            at = start + (now - 5.0 - start) * i / max(1, n - 1)
            scope, cost = f"tenant:t{i % scopes}", 0.0001 + (i % 97) * 1e-6
            expected[scope] = expected.get(scope, 0) + to_nusd(cost)
            batch.append(Booked(f"d{i:08d}", {"actual_cost_usd": cost, "now": at, "target": f"model-{i % 3}",
                                             "prompt_tokens": 300 + i % 50, "cached_tokens": 0,
                                             "completion_tokens": 40 + i % 30, "scopes": [scope], "issued_s": at},
                                at, at + ledger.config.record_retention_s))
            if len(batch) == 10_000 or i == n - 1:
                journal._book_many(batch)
                batch = []
        write_s = time.perf_counter() - t0
        db = journal.path

        def size() -> int:
            """The file's bytes, its write-ahead log checkpointed (what stays on disk)."""
            with closing(sqlite3.connect(db)) as conn:
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            return sum(p.stat().st_size for p in db.parent.glob(db.name + "*"))

        written = size()
        epoch, run_id = ledger.incarnation()
        journal.see(Seen(epoch, run_id, time.time() - 61.0))
        t0 = time.perf_counter()
        state.restore_spend()  # the minute's upkeep
        ahead[0] = RESTORE_LOOKBACK_S + 61.0
        state.restore_spend()  # and the next one, past the lookback
        upkeep_s = time.perf_counter() - t0
        kept = size()
        with closing(sqlite3.connect(db)) as conn:
            rows = conn.execute("SELECT COUNT(*) FROM journal").fetchone()[0]
            sums = len(journal.sums()) if hasattr(journal, "sums") else 0
            conn.execute("VACUUM")
        vacuumed = size()
        client.flushall()
        t0 = time.perf_counter()
        restored = 0
        while journal.seen() is None or journal.seen().epoch == epoch:  # type: ignore[union-attr]
            restored += state.restore_spend()
        restore_s = time.perf_counter() - t0
        got = {s.scope: to_nusd(s.settled_usd) for s in ledger.snapshot(sorted(expected)).statuses
               if s.window == "month"}
        ledger.close()
        print(json.dumps({
            "settlements": n, "scopes": scopes, "span_days": round((now - start) / 86400.0, 2), "write_s": round(write_s, 2),
            "journal_bytes_written": written, "upkeep_s": round(upkeep_s, 3), "journal_bytes_after_upkeep": kept,
            "journal_rows_after_upkeep": rows, "journal_sums_after_upkeep": sums, "journal_bytes_after_vacuum": vacuumed,
            "new_epoch_restore_s": round(restore_s, 3), "restored_settlements": restored,
            "month_spend_restored_exactly": got == expected}, indent=1))
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
