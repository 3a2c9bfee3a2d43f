"""The decision log writer: every decision goes into the outcome log without slowing ``/v1/route``.

``/v1/route`` hands each decision to ``DecisionLogWriter.submit`` (an append to an
in-memory queue, a few microseconds); one background thread builds the records
(``outcome_log.records.decision_record``: prompt hash, request features, head-input
vector; the prompt text only when the operator opted in) and commits them in batches
with ``OutcomeLog.append_decisions`` (one SQLite transaction per batch).

Guarantees (what ``docs``/README state):

- A decision is committed at most ``flush_interval_s`` (default 50 ms) plus one batch
  commit after it was answered. Committed decisions survive a killed process (WAL,
  ``synchronous=NORMAL``); a power loss may roll back the last ones, as documented in
  ``outcome_log/store.py``.
- Before an outcome is stored, ``flush(decision_ids=...)`` commits its decision if it is still
  in memory here (with the decisions queued before it; nothing when it was committed already),
  so an outcome never finds its decision in memory here, and the outcome's ``fsync`` covers its
  decision's row. (Another worker process's decision may still be in that worker's queue: the
  outcome is stored as an orphan and joins it when it arrives, ``OutcomeLog.append_outcomes``.)
- A decision is never dropped silently. If the queue is full (``max_queue`` decisions:
  the disk stalled), new decisions are answered but not logged, and each one is counted
  (``dropped``, metric ``pointsman_decision_log_total{result="dropped"}``) and logged as an
  error once per second. A batch whose commit fails is retried 3 times, 1 s apart, then
  counted as ``failed`` and logged. At shutdown (``close``) the queue is drained.
- A SIGKILL loses the decisions still in memory: at most the last ``flush_interval_s``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, TypeAlias

from pointsman.errors import PointsmanError
from pointsman.outcome_log.records import DecisionRecord, decision_record
from pointsman.outcome_log.store import OutcomeLog

if TYPE_CHECKING:  # pragma: no cover
    from pointsman.estimator.estimate import Estimator
    from pointsman.policy.decision import Decision
    from pointsman.request import RouteRequest

log = logging.getLogger("pointsman.service.decision_log")

#: Records committed in one transaction at most.
MAX_BATCH = 2048
#: Commit attempts per batch, and the pause between them (seconds).
ATTEMPTS = 3
RETRY_PAUSE_S = 1.0

#: One queued decision: its sequence number, the decision, its request, the estimator that
#: scored it and when it was answered (Unix s).
_Pending: TypeAlias = "tuple[int, Decision, RouteRequest, Estimator, float]"


class DecisionLogWriter:
    """Queues decisions and commits them in the background (see the module).

    ``DecisionLogWriter(log, flush_interval_s=0.05, max_queue=100_000, on_result=None)``;
    ``on_result(result, n)`` is called with ``written``, ``dropped`` or ``failed`` and a count
    (the metrics hook). ``start()`` starts the thread; ``close()`` drains and stops it.
    Thread-safe."""

    def __init__(self, outcome_log: OutcomeLog, *, flush_interval_s: float = 0.05, max_queue: int = 100_000,
                 on_result: Callable[[str, int], None] | None = None) -> None:
        self.log = outcome_log
        self.flush_interval_s = float(flush_interval_s)
        self.max_queue = int(max_queue)
        self._on_result = on_result
        self._queue: deque[_Pending] = deque()
        self._cond = threading.Condition()
        self._submitted = 0      # sequence number of the last submitted decision
        self._done = 0           # every decision up to this number is committed (or failed)
        self._flush_wanted = 0   # a caller waits for this number
        self._seq_of: dict[str, int] = {}  # decision id -> sequence number, while queued or being committed
        self._closing = False
        self._thread: threading.Thread | None = None
        self.written = self.dropped = self.failed = 0
        self._last_drop_log = 0.0

    # -- producer side --------------------------------------------------------------

    def start(self) -> DecisionLogWriter:
        """Start the writer thread; returns self."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="pointsman-decision-log", daemon=True)
            self._thread.start()
        return self

    @property
    def alive(self) -> bool:
        """True while the writer thread runs."""
        return self._thread is not None and self._thread.is_alive()

    @property
    def pending(self) -> int:
        """Decisions waiting in memory."""
        return len(self._queue)

    def submit(self, decision: Decision, request: RouteRequest, estimator: Estimator, time_s: float | None = None) -> bool:
        """Queue one decision (never blocks). Returns False, counts and logs it when the queue is
        full or the writer is closed."""
        now = time.time() if time_s is None else time_s
        with self._cond:
            if self._closing or len(self._queue) >= self.max_queue:
                self.dropped += 1
                self._report_drop()
                return False
            self._submitted += 1
            self._queue.append((self._submitted, decision, request, estimator, now))
            self._seq_of[decision.decision_id] = self._submitted
            if len(self._queue) == 1:
                self._cond.notify_all()
        return True

    def flush(self, timeout_s: float = 10.0, decision_ids: Iterable[str] | None = None) -> bool:
        """Commit every decision submitted before this call (``decision_ids``: only up to the last of
        these still in memory, at once; True at once when none is); returns False if that took longer
        than ``timeout_s`` (or the writer is not running)."""
        with self._cond:
            if decision_ids is None:
                target = self._submitted
            else:
                seq_of = self._seq_of
                target = max((seq_of.get(d, 0) for d in decision_ids), default=0)
            if self._done >= target:
                return True
            if not self.alive:
                return False
            self._flush_wanted = max(self._flush_wanted, target)
            self._cond.notify_all()
            return self._cond.wait_for(lambda: self._done >= target, timeout=timeout_s)

    def close(self, timeout_s: float = 10.0) -> None:
        """Commit what is queued and stop the thread (idempotent)."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                log.error("decision log writer did not drain within %.0f s; %d decision(s) not logged", timeout_s,
                          self.pending)

    # -- writer thread ----------------------------------------------------------------

    def _count(self, result: str, n: int) -> None:
        """Tell the metrics hook (``on_result``) about ``n`` decisions with ``result``."""
        if self._on_result is not None:
            self._on_result(result, n)

    def _report_drop(self) -> None:
        self._count("dropped", 1)
        now = time.monotonic()
        if now - self._last_drop_log >= 1.0:
            self._last_drop_log = now
            log.error("decision log queue full or closed (%d waiting); decisions are answered but not logged "
                      "(%d dropped so far)", len(self._queue), self.dropped)

    def _take(self) -> list[_Pending]:
        """Wait for work, let a batch gather for up to ``flush_interval_s``, return it (lock held by caller)."""
        cond = self._cond
        cond.wait_for(lambda: self._queue or self._closing)
        if self._queue and not self._closing and self.flush_interval_s > 0:
            deadline = time.monotonic() + self.flush_interval_s
            while not self._closing and len(self._queue) < MAX_BATCH and self._flush_wanted <= self._done:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                cond.wait(left)
        n = min(len(self._queue), MAX_BATCH)
        return [self._queue.popleft() for _ in range(n)]

    def _run(self) -> None:
        while True:
            with self._cond:
                batch = self._take()
                if not batch and self._closing:
                    return
            self._commit(batch)
            with self._cond:
                self._done = batch[-1][0]
                for seq, decision, *_ in batch:
                    if self._seq_of.get(decision.decision_id) == seq:
                        del self._seq_of[decision.decision_id]
                self._cond.notify_all()

    def _commit(self, batch: list[_Pending]) -> None:
        records: list[DecisionRecord] = []
        for _, decision, request, estimator, time_s in batch:
            try:
                records.append(decision_record(decision, request, estimator, time_s=time_s))
            except Exception:  # noqa: BLE001 - one bad record must not lose the batch
                self.failed += 1
                log.exception("decision %s could not be turned into a log record", decision.decision_id)
                self._count("failed", 1)
        for attempt in range(1, ATTEMPTS + 1):
            try:
                self.log.append_decisions(records)
            except PointsmanError as exc:
                if attempt == ATTEMPTS:
                    self.failed += len(records)
                    log.error("decision log write failed %d times (%s); %d decision(s) not logged", ATTEMPTS, exc,
                              len(records))
                    self._count("failed", len(records))
                    return
                log.warning("decision log write failed (%s); retrying in %.0f s", exc, RETRY_PAUSE_S)
                time.sleep(RETRY_PAUSE_S)
            else:
                self.written += len(records)
                self._count("written", len(records))
                return
