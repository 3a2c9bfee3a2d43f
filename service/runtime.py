"""What one running service holds: ``Runtime``, built once in the app's lifespan.

``build_runtime(settings, engine=None, ...)`` loads the engine (unless one is injected),
wraps the estimator in its hard time budget, opens the decision and outcome log, starts the
decision log writer, the shared-state sync (``POINTSMAN_STATE_URL``) and, on Redis, the verify
relay (``verify_relay.py``: a verify reaching a process that does not hold its decision);
``Runtime.start_watchers`` starts, as asyncio tasks, the engines' signal feeds (``feeds.py``:
``/metrics`` scraping), the policy, fleet and budgets file watchers, the model follower and the
spend's replay (``replay_spend``: what a Redis ledger lost, the spend journal, outcomes stored but not settled
before a restart, and forwarded outcomes the shared state may have lost: ``resend_forwards``);
``Runtime.close`` stops everything in order (tasks, then the spend journal is booked
(``drain_journal``), the writer drains, then the logs, the shared-state sync and the ledger close).

Routes reach it as ``request.app.state.runtime`` through the dependency ``get_runtime`` (or
``runtime_of(request)``; 503 while the service is starting or stopping).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import Request

from pointsman.errors import DataError
from pointsman.estimator.estimate import Estimator
from pointsman.estimator.verifier import HeuristicVerifier, Verifier, load_verifier
from pointsman.outcome_log.store import OutcomeLog
from pointsman.policy.budget.journal import DEFAULT_JOURNAL_NAME, SpendJournal
from pointsman.policy.engine import RoutingEngine
from pointsman.policy.fleet import Fleet
from pointsman.policy.signals.shared_state import RedisSync, StateSync
from pointsman.service.bootstrap import build_engine, load_estimator
from pointsman.service.budgets_reload import reload_budgets, watch_budgets
from pointsman.service.cascade import PendingDrafts
from pointsman.service.deadline import DeadlineEstimator, estimator_pool
from pointsman.service.decision_key import decision_signer
from pointsman.service.decision_log import DecisionLogWriter
from pointsman.service.feeds import SignalFeeds
from pointsman.service.fleet_reload import reload_fleet, watch_fleet
from pointsman.service.http_errors import unavailable
from pointsman.service.keys import key_names
from pointsman.service.live_engine import LiveEngine, ReloadResult, SwapResult
from pointsman.service.model_follower import ModelFollower, followed
from pointsman.service.policy_reload import reload_policy, watch_policy
from pointsman.service.prometheus import ServiceMetrics, StateCollector
from pointsman.service.settings import Settings
from pointsman.service.verify_relay import VerifyRelay

log = logging.getLogger("pointsman.service")

#: Seconds a stopping service keeps trying to book its spend journal while the ledger is unavailable.
JOURNAL_DRAIN_S = 10.0
#: Seconds after its arrival from which an outcome to forward whose send failed (or never finished) is sent again;
#: a younger one may still be on its way (the shared state's socket timeout is 2 s).
FORWARD_RETRY_S = 5.0
#: Seconds an outcome forwarded to the current Redis waits for its owner's acknowledgement before it is sent again (the
#: ``acks`` stream, capped, may have been trimmed before this replica read it; an owner of an earlier version
#: acknowledges nothing); each later wait is as long as the row had waited when last sent (doubling: about 11 sends in
#: ``FORWARD_KEEP_S``). The owner stores a key once and acknowledges a duplicate too.
FORWARD_CONFIRM_S = 300.0
#: Seconds an outcome to forward waits for its owner's log (module ``shared_state``) before it is dropped: that log
#: has not read its inbox since (its data folder gone for good, and its decisions with it).
FORWARD_KEEP_S = 7 * 86400.0
#: Seconds between purges of the budget ledger's records older than its ``record_retention_s`` (``replay_spend``;
#: every ``record_retention_s`` when that is shorter).
LEDGER_PURGE_S = 3600.0


@dataclass
class Runtime:
    """The running service's parts (see the module). ``owns_engine``: close the engine's state
    (budget ledger) at shutdown."""

    settings: Settings
    live: LiveEngine
    metrics: ServiceMetrics
    outcome_log: OutcomeLog
    writer: DecisionLogWriter
    owns_engine: bool = False
    cascade: PendingDrafts = field(default_factory=PendingDrafts)
    verifier: Verifier = field(default_factory=HeuristicVerifier)
    pool: concurrent.futures.Executor | None = None
    follower: ModelFollower | None = None
    relay: VerifyRelay | None = None
    feeds: SignalFeeds | None = None
    watching: bool = False
    watching_fleet: bool = False
    watching_budgets: bool = False
    closing: bool = False
    #: ``routes_reports.settle_unsettled``: settles the outcomes the outcome log keeps as not yet settled and
    #: returns how many are left (None: nothing does).
    settle_unsettled: Callable[[Runtime], int] | None = None
    _stop: asyncio.Event | None = None
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def wrap(self, estimator: Estimator) -> Estimator:
        """``estimator`` with the service's hard time budget (``DeadlineEstimator``) when
        ``POINTSMAN_ESTIMATOR_TIMEOUT_MS`` is set; as is otherwise."""
        timeout = self.settings.estimator_timeout_ms
        if timeout is None or isinstance(estimator, DeadlineEstimator):
            return estimator
        if self.pool is None:
            self.pool = estimator_pool()
        return DeadlineEstimator(estimator, timeout, self.pool)

    def record_reload(self, result: ReloadResult) -> None:
        """After each policy reload: its metric, and, when the last fleet reload was rejected and this policy file
        is new (served, or rejected against the serving fleet), that fleet file again with it: a fleet without a
        target the old policy routed to, or renaming one, serves once the policy that takes it is on disk, and
        nothing else would read it (a fleet reload recompiles the policy file, not the reverse)."""
        label = "rejected" if not result.ok else ("ok" if result.changed else "unchanged")
        self.metrics.policy_reloads.labels(label, result.source).inc()
        fleet = self.live.last_fleet_reload
        if fleet is not None and not fleet.ok and (result.changed or not result.ok):
            reload_fleet(self.live, self.settings.fleet_path, None, result.source, self.record_fleet_reload)

    def record_swap(self, result: SwapResult) -> None:
        """Metrics hook of model swaps."""
        self.metrics.model_swaps.labels("ok" if result.ok else "error").inc()

    def record_fleet_reload(self, result: ReloadResult) -> None:
        """Metrics hook of fleet reloads; the fleet a reload swapped in is kept in the outcome log (``keep_fleet``):
        the one of ``result.revision``, which the state remembers (``FleetState.fleets``), not the one serving when
        the hook runs (after the reload lock: another reload may have swapped in since)."""
        label = "rejected" if not result.ok else ("ok" if result.changed else "unchanged")
        self.metrics.fleet_reloads.labels(label, result.source).inc()
        if result.changed:
            fleet = self.live.engine.state.fleets.get(result.revision)
            if fleet is None:  # FLEETS_REMEMBERED reloads since: its decisions are labelled by the fleet of training time
                log.warning("fleet revision %s not kept in the outcome log: reloaded over since", result.revision)
            else:
                keep_fleet(self.outcome_log, fleet)

    def record_budgets_reload(self, result: ReloadResult) -> None:
        """Metrics hook of budgets file reloads."""
        label = "rejected" if not result.ok else ("ok" if result.changed else "unchanged")
        self.metrics.budgets_reloads.labels(label, result.source).inc()

    def reload_file(self, what: str) -> ReloadResult | None:
        """Re-read the ``policy``, ``fleet`` or ``budgets`` file now (source ``endpoint``): what the admin
        endpoints do, and what every other worker and replica does when one of them announces such a
        reload (``StateSync.announce_reload``); None for anything else or without a budgets file."""
        s = self.settings
        if what == "policy":  # the last reload: a rejected file may serve with the fleet file retried beside it
            result = reload_policy(self.live, self.live.engine.policy.file, "endpoint", self.record_reload)
            return self.live.last_reload or result
        if what == "fleet":
            return reload_fleet(self.live, s.fleet_path, None, "endpoint", self.record_fleet_reload)
        if what == "budgets" and s.budgets_path:
            return reload_budgets(self.live, s.budgets_path, "endpoint", self.record_budgets_reload,
                                  lambda: key_names(s))
        return None

    def start_watchers(self) -> None:
        """Start the signal feeds, the policy and fleet file watchers and the model follower
        (each only when configured)."""
        s = self.settings
        self._stop = asyncio.Event()
        self.feeds = SignalFeeds(self.live, s)  # scraping (unless its interval is 0) and KV-event subscribers
        self._tasks.append(asyncio.create_task(self.feeds.run(self._stop), name="pointsman-signal-feeds"))
        if s.watch_fleet:
            self._tasks.append(asyncio.create_task(
                watch_fleet(self.live, s.fleet_path, self._stop, self.record_fleet_reload), name="pointsman-fleet-watch"))
            self.watching_fleet = True
        if s.watch_budgets and s.budgets_path and self.live.engine.state.ledger is not None:
            self._tasks.append(asyncio.create_task(
                watch_budgets(self.live, s.budgets_path, self._stop, self.record_budgets_reload,
                              key_names=lambda: key_names(s)),
                name="pointsman-budgets-watch"))
            self.watching_budgets = True
        state = self.live.engine.state
        if state.ledger is not None or state.journal is not None or self.settle_unsettled is not None or state.sync.shared:
            self._tasks.append(asyncio.create_task(self.replay_spend(), name="pointsman-spend-replay"))
        if s.watch_policy:
            path = self.live.engine.policy.file
            self._tasks.append(asyncio.create_task(watch_policy(self.live, path, self._stop, self.record_reload),
                                                   name="pointsman-policy-watch"))
            self.watching = True
        if followed(s.model) and s.model_poll_interval_s > 0:
            def load(spec: str) -> tuple[Estimator, str | None]:
                return load_estimator(spec, s.estimator_timeout_ms, s.estimator_threads)

            self.follower = ModelFollower(self.live, s.model or "champion", load=load, wrap=self.wrap,
                                          on_result=self.record_swap)
            self._tasks.append(asyncio.create_task(self.follower.run(s.model_poll_interval_s, self._stop),
                                                   name="pointsman-model-follower"))

    async def replay_spend(self, interval_s: float = 1.0) -> None:
        """Every ``interval_s`` until the service stops: book again what a Redis ledger lost of this replica's
        settlements (``FleetState.restore_spend``, counted in ``pointsman_spend_restored_total``), book the
        settlements the spend journal kept while the ledger was unavailable (``FleetState.replay_journal``),
        until none is left, settle the outcomes the outcome log keeps as unsettled (``settle_unsettled``:
        stored by a process that died before settling them), send again the forwarded outcomes the shared state
        may have lost (``resend_forwards``), and every ``LEDGER_PURGE_S`` (at most ``record_retention_s``) delete
        the budget ledger's records older than ``record_retention_s`` (``BudgetLedger.purge``)."""
        assert self._stop is not None
        unsettled = self.settle_unsettled is not None
        purge_at = time.monotonic()
        while not self._stop.is_set():
            try:
                restored = await asyncio.to_thread(self.live.engine.state.restore_spend)
                self.metrics.spend_restored.inc(restored)
            except Exception:  # noqa: BLE001 - keep trying; the journal keeps the rows
                log.exception("restoring spend the budget ledger lost failed")
            try:
                booked = await asyncio.to_thread(self.live.engine.state.replay_journal)
                if booked:
                    log.info("spend journal: %d settlement(s) booked in the ledger", booked)
            except Exception:  # noqa: BLE001 - keep replaying; the entries stay
                log.exception("spend journal replay failed")
            try:
                if unsettled and self.settle_unsettled is not None:
                    unsettled = await asyncio.to_thread(self.settle_unsettled, self) > 0
            except Exception as exc:  # noqa: BLE001 - keep trying; the outcomes stay unsettled in the log
                log.warning("outcomes stored before a restart not settled yet: %s", exc)
            try:
                await asyncio.to_thread(resend_forwards, self.outcome_log, self.live.engine.state.sync, self.metrics)
            except Exception as exc:  # noqa: BLE001 - keep trying; the outbox keeps them
                log.warning("forwarded outcomes not sent again yet: %s", exc)
            ledger = self.live.engine.state.ledger
            if ledger is not None and time.monotonic() >= purge_at:
                purge_at = time.monotonic() + min(LEDGER_PURGE_S, float(ledger.config.record_retention_s))
                try:
                    purged = await asyncio.to_thread(ledger.purge, self.live.engine.state.clock())
                    if purged:
                        log.info("budget ledger: %d record(s) older than record_retention_s deleted", purged)
                except Exception as exc:  # noqa: BLE001 - the next purge deletes them
                    log.warning("budget ledger records not purged yet: %s", exc)
            try:
                await asyncio.wait_for(self._stop.wait(), timeout=interval_s)
            except TimeoutError:
                pass

    def drain_journal(self, wait_s: float = JOURNAL_DRAIN_S, interval_s: float = 1.0) -> int:
        """At shutdown: book what the spend journal holds (``FleetState.replay_journal``), every ``interval_s``
        while the ledger is unavailable, for at most ``wait_s`` seconds (the data folder, and the journal with it,
        may not outlive the process). Returns the settlements left in the journal (logged: booked when a service
        starts again on this data folder)."""
        state = self.live.engine.state
        if state.journal is None:
            return 0
        deadline = time.monotonic() + wait_s
        while True:
            try:
                state.replay_journal()
            except Exception:  # noqa: BLE001 - shutting down anyway; the entries stay
                log.exception("spend journal replay failed")
            left = len(state.journal)
            if not left or time.monotonic() + interval_s > deadline:
                break
            time.sleep(interval_s)
        if left:
            log.error("spend journal: %d settlement(s) not booked at shutdown (the budget ledger is unavailable); "
                      "kept in %s, booked when a service starts on this data folder", left, state.journal.path)
        return left

    async def close(self) -> None:
        """Stop the watchers, book the spend journal (``drain_journal``), drain the decision log, close the
        logs, the pool and (when owned) the ledger."""
        self.closing = True
        if self._stop is not None:
            self._stop.set()
        for task in self._tasks:
            try:
                await asyncio.wait_for(task, timeout=5.0)
            except (TimeoutError, asyncio.CancelledError):
                task.cancel()
            except Exception:  # noqa: BLE001 - shutting down anyway
                log.exception("background task %s failed", task.get_name())
        await asyncio.to_thread(self.drain_journal)
        await asyncio.to_thread(self.writer.close)
        self.outcome_log.close()
        if self.relay is not None:
            await asyncio.to_thread(self.relay.close)
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)
        if self.owns_engine:
            self.live.engine.state.close()


def build_runtime(settings: Settings, engine: RoutingEngine | None = None, *, owns_engine: bool = False,
                  estimator_error: str | None = None,
                  deliver: Callable[[Runtime, list[str]], bool] | None = None,
                  answer_verify: Callable[[Runtime, dict[str, Any]], tuple[int, dict[str, Any]]] | None = None,
                  settle_unsettled: Callable[[Runtime], int] | None = None) -> Runtime:
    """Load what the service needs (see the module). ``deliver(rt, payloads)`` stores outcomes
    other replicas forward to this one's outcome log (``routes_reports.deliver_forwarded``;
    without it this process receives none, and its decisions' records name no inbox);
    ``answer_verify(rt, body)`` answers verifies other processes relay here
    (``routes_verify.answer_relayed``; with Redis shared state only); ``settle_unsettled`` (``Runtime``'s
    field; ``routes_reports.settle_unsettled``). Raises ``FleetError``/``PolicyError``/
    ``BudgetConfigError`` for bad config files and ``DataError`` for an unusable outcome log."""
    if engine is None:
        loaded = build_engine(settings, shared=True)
        engine, estimator_error, owns_engine = loaded.engine, loaded.estimator_error, True
        if estimator_error:
            log.warning("difficulty estimator unavailable (%s); deciding with difficulty.available == false",
                        estimator_error)
    metrics = ServiceMetrics()
    outcome_log = OutcomeLog(settings.outcome_log_path(), store_prompts=settings.store_prompts,
                             fsync_interval_s=settings.outcome_fsync_ms / 1000.0)
    state = engine.state
    if state.signer is None:  # an injected engine: the service always answers signed ids
        state.signer = decision_signer(settings, state.sync)
    if state.journal is None and state.ledger is not None:
        state.journal = SpendJournal(Path(settings.data_dir) / DEFAULT_JOURNAL_NAME)

    def on_log(result: str, n: int) -> None:
        metrics.decision_log.labels(result).inc(n)

    keep_fleet(outcome_log, engine.fleet)
    writer = DecisionLogWriter(outcome_log, flush_interval_s=settings.decision_log_flush_ms / 1000.0,
                               max_queue=settings.decision_log_queue, on_result=on_log).start()
    rt = Runtime(settings, LiveEngine(engine, estimator_error), metrics, outcome_log, writer, owns_engine,
                 cascade=PendingDrafts(settings.verify_ttl_s, settings.verify_max_pending,
                                               settings.verify_max_pending_bytes),
                 verifier=load_verifier(settings.verifier), settle_unsettled=settle_unsettled)
    if estimator_error is None:
        rt.live = LiveEngine(engine.with_estimator(rt.wrap(engine.estimator)), None)
    metrics.watch_state(StateCollector(lambda: rt.live, lambda: rt.writer.pending, lambda: rt.feeds,
                                       lambda: outcome_log.outbox(time.time())))
    if deliver is not None:
        rt.live.engine.state.sync.set_inbox(outcome_log.log_id, lambda payloads: deliver(rt, payloads),
                                            lambda keys: _confirmed(outcome_log, keys))
    sync = rt.live.engine.state.sync
    sync.on_reload(rt.reload_file)  # another worker's or replica's admin reload: re-read the same file here
    rt.live.engine.state.start_sync()  # after the hook: reloads announced while this process started are re-read
    if answer_verify is not None and isinstance(sync, RedisSync):
        rt.relay = VerifyRelay.for_sync(sync, lambda decision_id: rt.cascade.get(decision_id) is not None,
                                        lambda body: answer_verify(rt, body)).start()
    return rt


def keep_fleet(outcome_log: OutcomeLog, fleet: Fleet) -> None:
    """Keep ``fleet``'s target kinds under its revision in the outcome log (``OutcomeLog.record_fleet``), where the
    labels read which targets were frontier when a decision was made; a failed write is logged, not raised (those
    decisions are labelled by the fleet of training time, as before)."""
    try:
        outcome_log.record_fleet(fleet.revision, {name: t.kind for name, t in fleet.targets.items()})
    except DataError as exc:
        log.warning("fleet revision %s not kept in the outcome log (%s)", fleet.revision, exc)


def send_forwards(outcome_log: OutcomeLog, sync: StateSync, outcomes: list[tuple[str, str, str]],
                  now: float | None = None) -> bool:
    """Send outbox rows (``(inbox, key, outcome JSON)``, kept by ``OutcomeLog.append_outcomes(forwards=...)``) to
    their owners' inboxes and mark them sent to the incarnation that took them at ``now`` (Unix s, default the
    clock); False when the shared state did not
    take them (logged; they stay unsent, and ``resend_forwards`` sends them again: Redis may still apply a send that
    timed out, which the owner then stores once)."""
    try:
        incarnation = sync.forward(outcomes)
    except DataError as exc:
        log.warning("%d outcome(s) to forward kept in the outbox: %s", len(outcomes), exc)
        return False
    try:
        outcome_log.forwards_sent([key for _, key, _ in outcomes], incarnation, time.time() if now is None else now)
    except DataError as exc:  # sent again later: the owner stores a key once
        log.warning("forwarded outcomes not marked sent: %s", exc)
    return True


def resend_forwards(outcome_log: OutcomeLog, sync: StateSync, metrics: ServiceMetrics, limit: int = 1000,
                    now: float | None = None) -> int:
    """Send again at ``now`` (Unix s, default the clock) the outbox rows the shared state may have lost
    (``OutcomeLog.forwards_due``: never sent or failed, sent to another incarnation: Redis flushed, on a new volume,
    restarted on a cut file, or left unconfirmed past ``FORWARD_CONFIRM_S``, backing off); drop those no owner
    confirmed within ``FORWARD_KEEP_S`` (logged, ``pointsman_forwarded_outcomes_dropped_total``). Returns how many
    were sent again (``pointsman_forwarded_outcomes_resent_total``); 0 while Redis is away or nothing is shared.
    Raises ``DataError`` (outcome log)."""
    if not sync.shared:
        return 0
    now = time.time() if now is None else now
    dropped = outcome_log.drop_forwards(now - FORWARD_KEEP_S)
    if dropped:
        metrics.forwards_dropped.inc(len(dropped))
        log.error("%d forwarded outcome(s) dropped: their owner's log did not store them within %.0f s (inboxes %s)",
                  len(dropped), FORWARD_KEEP_S, ", ".join(sorted({inbox for inbox, _ in dropped})))
    try:
        incarnation = sync.incarnation()
    except DataError:
        return 0
    due = outcome_log.forwards_due(incarnation, now, FORWARD_RETRY_S, FORWARD_CONFIRM_S, limit)
    if not due or not send_forwards(outcome_log, sync, due, now):
        return 0
    metrics.forwards_resent.inc(len(due))
    log.info("%d forwarded outcome(s) sent again (not sent, sent to a Redis that may have lost them, or not confirmed)", len(due))
    return len(due)


def _confirmed(outcome_log: OutcomeLog, keys: list[str]) -> bool:
    """Forget the outbox rows their owners' logs stored (``StateSync.set_inbox``'s ``confirm``); False while the
    log is unavailable (the acknowledgements are read again)."""
    try:
        outcome_log.forwards_confirmed(keys)
    except DataError as exc:
        log.warning("confirmed forwarded outcomes not forgotten yet: %s", exc)
        return False
    return True


def serving_runtime(request: Request) -> Runtime | None:
    """The app's runtime, or None while the service starts or stops."""
    rt: Runtime | None = getattr(request.app.state, "runtime", None)
    return None if rt is None or rt.closing else rt


def runtime_of(request: Request) -> Runtime:
    """The app's runtime; raises ``HTTPError`` 503 while the service starts or stops."""
    rt = serving_runtime(request)
    if rt is None:
        raise unavailable("the service is starting or stopping; retry shortly", "not_ready")
    return rt


async def get_runtime(request: Request) -> Runtime:
    """``runtime_of`` as a FastAPI dependency (``async``, so FastAPI calls it on the event loop
    instead of handing a plain function to its threadpool on every request)."""
    return runtime_of(request)
