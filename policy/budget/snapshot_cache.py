"""``SnapshotCache``: budget snapshots read from the ledger, kept briefly for the decisions
that follow, and never counting a hold the ledger no longer has (or missing one it has).

Reading the ledger on every decision costs a round trip (SQLite transaction, Redis call), so a
read of a set of scopes serves later decisions with the same scopes for ``ttl_s`` seconds.
A kept snapshot must agree with the ledger plus this replica's own changes since the read.
Every change of this replica goes through ``with cache.changing(scopes) as change:`` around
its ledger call:

- a **reservation** (``change.reserved_usd = usd`` once the ledger holds it) is added to the
  kept snapshots of its scopes when the block ends;
- any other change (a **settlement**, a **release**, a reservation that failed) drops the kept
  snapshots of its scopes; one whose scopes this replica does not know (another replica made
  the decision: ``changing(None)``) drops every kept snapshot;
- a **read that overlaps** a change (the change was under way when the read started, or
  began or ended while it ran) is used by its own decision but not kept: it may or may not
  contain the change, so adding the change again could count a hold twice, and keeping it
  could keep a released hold. Each scope has a change generation, bumped when a change
  begins and ends, and a count of changes under way; changes of unknown scopes move one
  epoch. A read is kept only when nothing was under way at its start and neither its
  scopes' generations nor the epoch moved while it ran.

Other replicas' changes show within ``ttl_s``. That is safe for overspend (the reservation at
dispatch is the ledger's own atomic check) and, for false refusals, the caller confirms any
refusal with ``read(scopes, now, fresh=True)`` (``live.LiveSignals.budget_fits`` does).

Thread-safe; the ledger is read outside the lock.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace

from pointsman.policy.budget.ledger import BudgetLedger, BudgetSnapshot

#: Most kept snapshots (distinct scope sets); the least recently read go first.
MAX_SNAPSHOTS = 10_000


class SnapshotCache:
    """Budget snapshots of ``ledger`` kept ``ttl_s`` seconds (0: every read goes to the ledger);
    see the module. ``lock``: share a lock with the owner (``FleetState``), default a new one."""

    def __init__(self, ledger: BudgetLedger, ttl_s: float = 0.05, lock: threading.Lock | None = None) -> None:
        self.ledger = ledger
        self.ttl_s = float(ttl_s)
        self._lock = lock or threading.Lock()
        self._kept: OrderedDict[tuple[str, ...], BudgetSnapshot] = OrderedDict()
        self._generation: dict[str, int] = {}
        self._epoch = 0
        self._pending: dict[str, int] = {}
        self._pending_all = 0
        #: Reads that went to the ledger (for tests and diagnostics).
        self.ledger_reads = 0

    def _stamp(self, scopes: Sequence[str]) -> tuple[int, tuple[int, ...]] | None:
        """The generations a read must still see at its end to be kept; None: a change of these
        scopes is under way, so the read is not kept whatever happens."""
        if self._pending_all or any(self._pending.get(s, 0) for s in scopes):
            return None
        return self._epoch, tuple(self._generation.get(s, 0) for s in scopes)

    def read(self, scopes: Sequence[str], now: float, *, fresh: bool = False) -> BudgetSnapshot:
        """The snapshot of ``scopes`` at Unix time ``now`` (seconds): a kept one less than
        ``ttl_s`` old read in the same UTC day (with this replica's reservations since), else a ledger read, kept when no
        change of its scopes overlapped it. ``fresh``: always read the ledger. Raises
        ``LedgerUnavailable`` (nothing kept)."""
        key = tuple(scopes)
        with self._lock:
            hit = None if fresh else self._kept.get(key)
            # a snapshot serves the UTC day it was read in only: past midnight its windows are yesterday's
            if hit is not None and 0.0 <= now - hit.now <= self.ttl_s and now // 86400 == hit.now // 86400:
                return hit
            stamp = self._stamp(key)
        snap = self.ledger.snapshot(key, now)
        with self._lock:
            self.ledger_reads += 1
            if self.ttl_s > 0 and stamp is not None and self._stamp(key) == stamp:
                self._kept[key] = snap
                self._kept.move_to_end(key)
                while len(self._kept) > MAX_SNAPSHOTS:
                    self._kept.popitem(last=False)
        return snap

    def _move(self, scopes: Sequence[str] | None, pending: int) -> None:
        if scopes is None:
            self._epoch += 1
            self._pending_all += pending
            return
        for s in scopes:
            self._generation[s] = self._generation.get(s, 0) + 1
            self._pending[s] = self._pending.get(s, 0) + pending
            if not self._pending[s]:
                del self._pending[s]

    @contextmanager
    def changing(self, scopes: Sequence[str] | None) -> Iterator[PendingChange]:
        """Wrap one ledger call that changes holds on ``scopes`` (None: scopes unknown here); set
        ``reserved_usd`` on the yielded ``PendingChange`` when a reservation of that many USD
        committed. When the block ends (normally or not) the kept snapshots are updated: the
        reservation added, or, for anything else, the snapshots sharing a scope dropped."""
        scopes = None if scopes is None else tuple(scopes)
        change = PendingChange()
        with self._lock:
            self._move(scopes, +1)
        try:
            yield change
        finally:
            with self._lock:
                self._move(scopes, -1)
                self._apply(scopes, change.reserved_usd)

    def _apply(self, scopes: tuple[str, ...] | None, reserved_usd: float | None) -> None:
        """Update the kept snapshots for a finished change (lock held)."""
        if scopes is None:
            self._kept.clear()
            return
        mine = set(scopes)
        for key, snap in list(self._kept.items()):
            if not mine.intersection(key):
                continue
            if reserved_usd is None:
                del self._kept[key]
            else:
                statuses = tuple(replace(st, reserved_usd=st.reserved_usd + reserved_usd) if st.scope in mine else st
                                 for st in snap.statuses)
                self._kept[key] = BudgetSnapshot(snap.now, statuses)

    def clear(self) -> None:
        """Drop every kept snapshot, and keep no read under way (budgets reloaded)."""
        with self._lock:
            self._move(None, 0)
            self._kept.clear()


@dataclass
class PendingChange:
    """What one change of holds did (``SnapshotCache.changing``): ``reserved_usd`` is the USD a
    reservation committed, None for anything else (settled, released, failed)."""

    reserved_usd: float | None = None
