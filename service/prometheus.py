"""Prometheus metrics of the decision service (``prometheus_client``), served at ``GET /metrics``.

Counted as things happen (``ServiceMetrics``):

==============================================  ===========================================================
``pointsman_decisions_total{target,rule}``       decisions answered, by target and deciding rule
``pointsman_decision_errors_total{code}``        ``/v1/route`` answers that were errors, by error code
``pointsman_decision_latency_seconds``           histogram: body read to answer (``/v1/route`` and ext_proc)
``pointsman_estimator_latency_seconds``          histogram: the estimator's share of each decision
``pointsman_outcome_latency_seconds``            histogram: ``POST /v1/outcomes``, request to acknowledgement
                                                 (stored durably and settled)
``pointsman_estimator_unavailable_total{reason}``  decisions without a difficulty estimate (``timeout``, ``error``)
``pointsman_p_hard``                             histogram of ``p_hard`` (decisions with an estimate)
``pointsman_budget_reserved_usd_total{target}``  estimated cost of decisions, USD (held on their budgets where one applies)
``pointsman_budget_spend_usd_total{target}``     actual cost settled by outcomes, USD
``pointsman_shadow_spend_usd_total{target}``     cost of shadow outcomes' usage (evaluation answers), USD: stored
                                                 here, priced on their ``served_target``, in no budget
``pointsman_outcomes_total{status}``             outcomes by acknowledgement (stored, duplicate, conflict,
                                                 unknown_decision, invalid)
``pointsman_verifications_total{action}``        drafts verified by ``POST /v1/verify``: ``accept``, ``escalate``
``pointsman_telemetry_snapshots_total``          load snapshots accepted by ``/v1/telemetry``
``pointsman_decision_log_total{result}``         decisions written to / dropped from / failed in the decision log
``pointsman_policy_reloads_total{result,source}``  policy reloads: ``ok``, ``unchanged``, ``rejected``
``pointsman_model_swaps_total{result}``          estimator swaps: ``ok``, ``error``
``pointsman_fleet_reloads_total{result,source}``   fleet reloads: ``ok``, ``unchanged``, ``rejected``
``pointsman_unpriced_usage_total{path}``         upstream usage Pointsman could not price (``ext_proc``: the
                                                 outcome books the decision's estimate instead)
``pointsman_outcome_usage_over_cap_total{target}`` outcomes stored with more completion tokens than the
                                                 request's output cap (``max_tokens`` x ``n``): booked as reported
``pointsman_budgets_reloads_total{result,source}`` budgets file reloads: ``ok``, ``unchanged``, ``rejected``
``pointsman_forwarded_outcomes_resent_total``    outcomes to forward sent again (their send failed or timed out,
                                                 or Redis since lost its data: a new epoch or run_id)
``pointsman_forwarded_outcomes_dropped_total``   outcomes to forward dropped: no owner's log stored them within
                                                 ``runtime.FORWARD_KEEP_S`` (that log's data folder gone for good)
``pointsman_ext_proc_requests_total{result}``    ext_proc streams (``service/ext_proc.py``): ``routed``,
                                                 ``passthrough``, ``bad_request``, ``too_large``, ``shed``,
                                                 ``unavailable``, ``unsupported``, ``unauthenticated``,
                                                 ``protocol_error``
==============================================  ===========================================================

Read from the live state at scrape time (``StateCollector``):

==============================================================  ===========================================
``pointsman_serving_info{policy,policy_revision,estimator_version}``  1 for what serves now
``pointsman_model_registry_reachable``                            1 when the model follower's last poll read the registry
``pointsman_model_follow_problem``                                1 when it keeps the model against its alias (why: /healthz)
``pointsman_effective_price_usd_per_token{target}``               today's spend ÷ completion tokens (UTC day)
``pointsman_pool_prefill_utilization{target,pool}``               mean prefill utilization as priced (0–1; healthy, fresh)
``pointsman_pool_decode_utilization{target,pool}``                mean decode utilization as priced (0–1; healthy, fresh)
``pointsman_load_signal_age_seconds{target,endpoint}``            age of each endpoint's pushed/scraped load
``pointsman_inflight_requests{target,endpoint}``                  requests dispatched and not yet settled (0 too)
``pointsman_decision_log_pending``                                decisions waiting for the background writer
``pointsman_endpoint_healthy{target,endpoint}``                   1 healthy, 0 marked unhealthy (any source)
``pointsman_scrape_age_seconds{target,endpoint}``                 age of the last good scrape of the endpoint
``pointsman_scrape_consecutive_failures{target,endpoint}``        failed scrapes in a row (0 when it answers)
``pointsman_kv_events_connected{target,endpoint}``                1 when its KV-event subscriber is connected
``pointsman_kv_events_age_seconds{target,endpoint}``              seconds since its last KV-event batch
``pointsman_kv_events{target,endpoint,kind}``                     batches, events, gaps, resyncs, resets, errors,
                                                                  root_blocks, hash_mismatches (a feed hashed otherwise
                                                                  than its target's kv_events says matches nothing)
``pointsman_state_sync_connected``                                1 when the shared-state reader is connected
``pointsman_state_sync_changes_applied``                          other processes' changes applied (monotone)
``pointsman_forwarded_outcomes_pending``                          outcomes acknowledged ``forwarded`` whose owner's log
                                                                  has not confirmed storing them (this log's outbox)
``pointsman_forwarded_outcomes_oldest_age_seconds``               age of the outbox's oldest row, s (0 when empty)
``pointsman_state_sync_write_errors``                             shared-state writes that failed (monotone)
``pointsman_state_sync_lag_seconds``                              age of the last change applied when applied
``pointsman_state_sync_outcomes_forwarded_in``                   outcomes other replicas forwarded here, stored (monotone)
``pointsman_estimator_available``                                 1 when the difficulty estimator loaded, 0 when not
``pointsman_budget_limit_usd{scope,window}``                      each configured budget's limit (USD)
``pointsman_budget_spent_usd{scope,window}``                      settled + reserved in the current window (USD)
``pointsman_budget_used_ratio{scope,window}``                     spent ÷ limit (1 = exhausted; 0-limit budgets: 1)
``pointsman_budget_held_usd{scope,window}``                       live reservations (part of spent) (USD)
``pointsman_budget_remaining_usd{scope,window}``                  max(0, limit − spent): what admission allows (USD)
==============================================================  ===========================================

Counters whose label values are known in advance (``estimator_unavailable`` reasons, outcome
statuses, ext_proc results, model swap results) start at 0 for each, so dashboards and alerts find
their series before the first event (Prometheus: "avoid missing metrics").

Utilization is per pool (aggregated, prefill, decode) and per phase, only where telemetry
reports it: one averaged GPU-utilization number would hide the two phases. Each app has
its own ``CollectorRegistry``. With several worker processes (``serve --workers N``) a scrape reaches
one worker, so ``serve`` gives the workers a ``PROMETHEUS_MULTIPROC_DIR``: the counters and histograms
are kept in its files and every worker exports the sum over all of them (``prometheus_client``
multiprocess mode; no ``_created`` series there); the scrape-time gauges are the answering worker's
view of the shared state.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, TypeGuard

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

if TYPE_CHECKING:  # pragma: no cover
    from pointsman.policy.decision import Decision
    from pointsman.policy.engine import RoutingEngine
    from pointsman.policy.signals.fleet_state import Settled
    from pointsman.service.feeds import SignalFeeds
    from pointsman.service.live_engine import LiveEngine

log = logging.getLogger("pointsman.service.prometheus")

#: Decision latency buckets, seconds (0.25 ms to 1 s).
LATENCY_BUCKETS = (0.00025, 0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.05,
                   0.075, 0.1, 0.25, 0.5, 1.0)
P_HARD_BUCKETS = tuple(round(0.05 * i, 2) for i in range(1, 21))
#: Results of ``pointsman_ext_proc_requests_total`` (``service/ext_proc.py``).
EXT_PROC_RESULTS = ("routed", "passthrough", "bad_request", "too_large", "shed", "unavailable", "unsupported",
                    "unauthenticated", "protocol_error")


class WorkersCollector(MultiProcessCollector):
    """Every worker's counters and histograms (``PROMETHEUS_MULTIPROC_DIR``), without the files a starting
    worker has created and not sized yet (prometheus_client's ``MmapedDict`` opens a file, then truncates it to
    its size: a read in between got 0 bytes, and ``struct.error`` failed the scrape with a 500 and a worker's
    start, which reads every file when it registers the collector)."""

    def collect(self) -> Iterable[Metric]:
        files = []
        for path in Path(self._path).glob("*.db"):
            try:
                if path.stat().st_size >= 8:
                    files.append(str(path))
            except FileNotFoundError:  # a worker's file removed since the listing
                continue
        return self.merge(files, accumulate=True)


class ServiceMetrics:
    """The counters and histograms of one service (see the module); ``registry`` holds them.
    ``exposed`` is what ``render`` writes: ``registry``, or with ``PROMETHEUS_MULTIPROC_DIR`` set the
    sum over every worker's files; the ``StateCollector`` added with ``watch_state`` joins it."""

    def __init__(self) -> None:
        r = self.registry = self.exposed = CollectorRegistry(auto_describe=True)
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            self.exposed = CollectorRegistry(auto_describe=True)
            WorkersCollector(self.exposed)
        self.decisions = Counter("pointsman_decisions", "Decisions answered, by target and deciding rule.",
                                 ["target", "rule"], registry=r)
        self.decision_errors = Counter("pointsman_decision_errors", "/v1/route error answers, by error code.",
                                       ["code"], registry=r)
        self.decision_latency = Histogram("pointsman_decision_latency_seconds",
                                          "Decision latency in the service, body read to answer (/v1/route and ext_proc).",
                                          buckets=LATENCY_BUCKETS, registry=r)
        self.estimator_latency = Histogram("pointsman_estimator_latency_seconds",
                                           "Difficulty estimator time per decision.", buckets=LATENCY_BUCKETS,
                                           registry=r)
        self.outcome_latency = Histogram("pointsman_outcome_latency_seconds",
                                         "POST /v1/outcomes latency in the service, request to acknowledgement.",
                                         buckets=LATENCY_BUCKETS, registry=r)
        self.estimator_unavailable = Counter("pointsman_estimator_unavailable",
                                             "Decisions made without a difficulty estimate, by reason.", ["reason"],
                                             registry=r)
        self.p_hard = Histogram("pointsman_p_hard", "p_hard of decisions with a difficulty estimate.",
                                buckets=P_HARD_BUCKETS, registry=r)
        self.reserved_usd = Counter("pointsman_budget_reserved_usd",
                                    "Estimated cost of decisions, USD (held on their budgets where one applies).",
                                    ["target"], registry=r)
        self.spend_restored = Counter("pointsman_spend_restored", "Settlements the Redis budget ledger had lost "
                                      "(a restart on an unsynced file, a flushed or new store) booked again from this "
                                      "replica's spend journal (one by one, or in its sums per scope set, target and "
                                      "day).", registry=r)
        self.forwards_resent = Counter("pointsman_forwarded_outcomes_resent", "Outcomes to forward sent again: their "
                                       "send failed or timed out, or Redis lost its data since.", registry=r)
        self.forwards_dropped = Counter("pointsman_forwarded_outcomes_dropped", "Outcomes to forward dropped: no "
                                        "owner's log stored them within FORWARD_KEEP_S.", registry=r)
        self.spend_usd = Counter("pointsman_budget_spend_usd", "Actual cost settled by outcomes, USD.", ["target"],
                                 registry=r)
        self.shadow_spend_usd = Counter("pointsman_shadow_spend_usd", "Cost of shadow outcomes' usage stored here "
                                        "(evaluation answers, in no budget), USD.", ["target"], registry=r)
        self.outcomes = Counter("pointsman_outcomes", "Outcomes by acknowledgement status.", ["status"], registry=r)
        self.verifications = Counter("pointsman_verifications", "Drafts verified (POST /v1/verify), by action.",
                                     ["action"], registry=r)
        self.telemetry = Counter("pointsman_telemetry_snapshots", "Load snapshots accepted.", registry=r)
        self.decision_log = Counter("pointsman_decision_log", "Decision log writes by result.", ["result"], registry=r)
        self.policy_reloads = Counter("pointsman_policy_reloads", "Policy reloads by result and source.",
                                      ["result", "source"], registry=r)
        self.model_swaps = Counter("pointsman_model_swaps", "Estimator swaps by result.", ["result"], registry=r)
        self.fleet_reloads = Counter("pointsman_fleet_reloads", "Fleet reloads by result and source.",
                                     ["result", "source"], registry=r)
        self.budgets_reloads = Counter("pointsman_budgets_reloads", "Budgets file reloads by result and source.",
                                       ["result", "source"], registry=r)
        self.ext_proc_requests = Counter("pointsman_ext_proc_requests", "ext_proc endpoint picker requests by result.",
                                         ["result"], registry=r)
        self.unpriced_usage = Counter("pointsman_unpriced_usage", "Upstream usage that could not be priced "
                                      "(the estimate was booked instead), by path.", ["path"], registry=r)
        self.unpriced_usage.labels("ext_proc")
        self.usage_over_cap = Counter("pointsman_outcome_usage_over_cap", "Outcomes stored whose completion tokens "
                                      "exceed the request's output cap (max_tokens x n), by target: booked as "
                                      "reported.", ["target"], registry=r)
        for reason in ("timeout", "error"):
            self.estimator_unavailable.labels(reason)
        for status in ("stored", "duplicate", "conflict", "unknown_decision", "invalid"):
            self.outcomes.labels(status)
        for result in EXT_PROC_RESULTS:
            self.ext_proc_requests.labels(result)
        for result in ("ok", "error"):
            self.model_swaps.labels(result)
        # labelled children per label values: ``labels()`` builds and checks its key on every call
        self._decision_children: dict[tuple[str, str], Counter] = {}
        self._reserved_children: dict[str, Counter] = {}

    def observe_decision(self, decision: Decision, elapsed_s: float) -> None:
        """Count one answered decision (``policy.decision.Decision``) that took ``elapsed_s``."""
        key = (decision.target, decision.rule)
        child = self._decision_children.get(key)
        if child is None:
            child = self._decision_children[key] = self.decisions.labels(*key)
        child.inc()
        self.decision_latency.observe(elapsed_s)
        self.estimator_latency.observe(decision.timings_ms["estimator"] / 1000.0)
        if decision.p_hard is not None:
            self.p_hard.observe(decision.p_hard)
        self.observe_hold(decision.target, decision.estimated_cost_usd)

    def observe_hold(self, target: str, usd: float) -> None:
        """Count ``usd`` reserved for a call to ``target`` (a decision's, or a cascade escalation's)."""
        if usd > 0:
            reserved = self._reserved_children.get(target)
            if reserved is None:
                reserved = self._reserved_children[target] = self.reserved_usd.labels(target)
            reserved.inc(usd)

    def observe_settlement(self, settled: Settled) -> None:
        """Count a settlement's cost (an outcome's, or a draft's at ``POST /v1/verify``), once: a
        replayed one is not counted again."""
        if not settled.replayed and settled.actual_cost_usd > 0:
            self.spend_usd.labels(settled.target or "unknown").inc(settled.actual_cost_usd)

    def shadow_spent(self) -> dict[str, float]:
        """USD per target on ``pointsman_shadow_spend_usd_total`` (every worker's, as ``/metrics`` exports it;
        targets with none left out)."""
        metrics = WorkersCollector(None).collect() if self.exposed is not self.registry \
            else self.shadow_spend_usd.collect()
        return {s.labels["target"]: s.value for m in metrics if m.name == "pointsman_shadow_spend_usd"
                for s in m.samples if s.name == "pointsman_shadow_spend_usd_total"}

    def observe_unavailable(self, error: str | None) -> None:
        """Count a decision without a difficulty estimate (``error`` from the estimate)."""
        self.estimator_unavailable.labels("timeout" if (error or "").startswith("timeout") else "error").inc()

    def watch_state(self, collector: Collector) -> None:
        """Add the scrape-time collector."""
        self.exposed.register(collector)

    def render(self) -> bytes:
        """The text exposition of every metric."""
        return generate_latest(self.exposed)


def _finite(v: object) -> TypeGuard[float]:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


class StateCollector(Collector):
    """Gauges read from the live engine and state at scrape time (see the module).
    ``live()`` returns the ``LiveEngine``; ``pending()`` the decision log's queue length; ``forwards()`` the outbox:
    the outcomes to forward whose owner has not confirmed them and the oldest one's age, s (``OutcomeLog.outbox``)."""

    def __init__(self, live: Callable[[], LiveEngine | None], pending: Callable[[], int],
                 feeds: Callable[[], SignalFeeds | None] = lambda: None,
                 forwards: Callable[[], tuple[int, float]] = lambda: (0, 0.0)) -> None:
        self._live, self._pending, self._feeds, self._forwards = live, pending, feeds, forwards

    def describe(self) -> list[Metric]:
        """Nothing at registration (the families depend on the live fleet; read at scrape time)."""
        return []

    def collect(self) -> Iterator[GaugeMetricFamily]:
        """The gauges of the live engine and state now (prometheus_client calls this per scrape)."""
        live = self._live()
        if live is None:
            return
        engine = live.engine
        info = GaugeMetricFamily("pointsman_serving_info", "What serves now (value 1).",
                                 labels=["policy", "policy_revision", "estimator_version"])
        info.add_metric([engine.policy.name, engine.policy.revision, str(engine.estimator.version)], 1)
        yield info
        pending = GaugeMetricFamily("pointsman_decision_log_pending", "Decisions waiting for the background writer.")
        pending.add_metric([], self._pending())
        yield pending
        state = engine.state
        price = GaugeMetricFamily("pointsman_effective_price_usd_per_token",
                                  "Effective price per output token today (UTC day), USD.", labels=["target"])
        try:
            for name, p in state.effective_prices("day").items():
                if _finite(p.usd_per_token):
                    price.add_metric([name], p.usd_per_token)
        except Exception as exc:  # noqa: BLE001 - a ledger outage must not break the scrape
            log.warning("effective prices unavailable for /metrics: %s", exc)
        yield price
        follow = live.follow
        if follow is not None and follow.registry_reachable is not None:
            reachable = GaugeMetricFamily("pointsman_model_registry_reachable",
                                          "1 when the model follower's last poll read the registry, else 0.")
            reachable.add_metric([], 1.0 if follow.registry_reachable else 0.0)
            yield reachable
            kept = GaugeMetricFamily("pointsman_model_follow_problem", "1 when the model follower keeps the serving "
                                     "model against its alias (registry unreachable, alias vanished, load failed).")
            kept.add_metric([], 0.0 if follow.problem is None else 1.0)
            yield kept
        available = GaugeMetricFamily("pointsman_estimator_available",
                                      "1 when the difficulty estimator loaded, 0 when decisions run without it.")
        available.add_metric([], 0.0 if live.estimator_error else 1.0)
        yield available
        yield from self._load(engine)
        yield from self._health(engine)
        yield from self._sync(engine)
        yield from self._budgets(engine)

    def _budgets(self, engine: RoutingEngine) -> Iterator[GaugeMetricFamily]:
        if engine.state.journal is not None:
            journal = GaugeMetricFamily("pointsman_spend_journal_pending", "Settlements acknowledged while the budget "
                                        "ledger was unavailable, waiting in the spend journal to be booked.")
            journal.add_metric([], len(engine.state.journal))
            yield journal
        ledger = engine.state.ledger
        budgets = () if ledger is None else ledger.config.budgets
        if ledger is None or not budgets:
            return
        try:
            snap = ledger.snapshot(sorted({b.scope for b in budgets}))
        except Exception as exc:  # noqa: BLE001 - a ledger outage must not break the scrape
            log.warning("budgets unavailable for /metrics: %s", exc)
            return
        labels = ["scope", "window"]
        limit = GaugeMetricFamily("pointsman_budget_limit_usd", "Configured budget limit, USD.", labels=labels)
        spent = GaugeMetricFamily("pointsman_budget_spent_usd", "Settled plus reserved in the current window, USD.",
                                  labels=labels)
        ratio = GaugeMetricFamily("pointsman_budget_used_ratio", "Spent over limit in the current window (1 = exhausted).",
                                  labels=labels)
        held = GaugeMetricFamily("pointsman_budget_held_usd", "Live reservations in the current window, USD.",
                                 labels=labels)
        remaining = GaugeMetricFamily("pointsman_budget_remaining_usd",
                                      "Limit minus settled and reserved in the current window (>= 0), USD.", labels=labels)
        for st in snap.statuses:
            if st.limit_usd is None:
                continue
            key = [st.scope, st.window]
            limit.add_metric(key, st.limit_usd)
            spent.add_metric(key, st.spent_usd)
            ratio.add_metric(key, st.spent_usd / st.limit_usd if st.limit_usd > 0 else 1.0)
            held.add_metric(key, st.reserved_usd)
            remaining.add_metric(key, st.remaining_usd)
        yield from (limit, spent, ratio, held, remaining)

    def _health(self, engine: RoutingEngine) -> Iterator[GaugeMetricFamily]:
        fleet, state = engine.fleet, engine.state
        healthy = GaugeMetricFamily("pointsman_endpoint_healthy", "1 when the endpoint may be chosen, 0 when marked "
                                    "unhealthy.", labels=["target", "endpoint"])
        for eid, e in fleet.endpoints.items():
            healthy.add_metric([e.target, e.name or eid], 1.0 if state.is_healthy(eid) else 0.0)
        yield healthy
        feeds = self._feeds()
        age = GaugeMetricFamily("pointsman_scrape_age_seconds", "Seconds since the endpoint's last good scrape.",
                                labels=["target", "endpoint"])
        failures = GaugeMetricFamily("pointsman_scrape_consecutive_failures", "Failed scrapes in a row.",
                                     labels=["target", "endpoint"])
        for eid, feed in (feeds.status() if feeds is not None else {}).items():
            info = fleet.endpoints.get(eid)
            if info is None:
                continue
            labels = [info.target, info.name or eid]
            if feed.age_s is not None:
                age.add_metric(labels, feed.age_s)
            failures.add_metric(labels, feed.status.consecutive_failures)
        yield from (age, failures)
        connected = GaugeMetricFamily("pointsman_kv_events_connected", "1 when the endpoint's KV-event subscriber "
                                      "is connected.", labels=["target", "endpoint"])
        event_age = GaugeMetricFamily("pointsman_kv_events_age_seconds", "Seconds since the endpoint's last KV-event "
                                      "batch.", labels=["target", "endpoint"])
        counts = GaugeMetricFamily("pointsman_kv_events", "KV-event subscriber counts (monotone): batches, events, "
                                   "gaps, resyncs, resets, errors; root_blocks (chain-starting blocks checked against "
                                   "the target's hash settings) and hash_mismatches (those hashed otherwise: the "
                                   "feed matches no request).", labels=["target", "endpoint", "kind"])
        now = time.monotonic()
        for eid, sub in (feeds.events_status() if feeds is not None else {}).items():
            info = fleet.endpoints.get(eid)
            if info is None:
                continue
            labels = [info.target, info.name or eid]
            connected.add_metric(labels, 1.0 if sub.connected else 0.0)
            if sub.last_batch_at is not None:
                event_age.add_metric(labels, max(0.0, now - sub.last_batch_at))
            for kind in ("batches", "events", "gaps", "resyncs", "resets", "errors"):
                counts.add_metric([*labels, kind], float(getattr(sub, kind)))
            cache = engine.state.engine_cache(info.target)
            checked, mismatched = (0, 0) if cache is None else cache.root_checks().get(eid, (0, 0))
            counts.add_metric([*labels, "root_blocks"], float(checked))
            counts.add_metric([*labels, "hash_mismatches"], float(mismatched))
        yield from (connected, event_age, counts)

    def _sync(self, engine: RoutingEngine) -> Iterator[GaugeMetricFamily]:
        status = engine.state.sync.status()
        if not status.shared:
            return
        outbox_rows, outbox_age_s = self._forwards()
        for name, doc, value in (
                ("pointsman_state_sync_connected", "1 when the shared-state reader is connected.", float(status.connected)),
                ("pointsman_state_sync_changes_applied", "Other processes' changes applied.", float(status.applied)),
                ("pointsman_state_sync_write_errors", "Shared-state writes that failed.", float(status.write_errors)),
                ("pointsman_state_sync_lag_seconds", "Age of the last change applied when it was applied.",
                 status.lag_s),
                ("pointsman_state_sync_outcomes_forwarded_in",
                 "Outcomes other replicas forwarded to this one's outcome log, stored.", float(status.forwarded_in)),
                ("pointsman_forwarded_outcomes_pending", "Outcomes acknowledged forwarded whose owner's log has not "
                 "confirmed storing them.", float(outbox_rows)),
                ("pointsman_forwarded_outcomes_oldest_age_seconds", "Age of the oldest outcome acknowledged forwarded "
                 "whose owner's log has not confirmed storing it (0 when none).", outbox_age_s)):
            g = GaugeMetricFamily(name, doc)
            g.add_metric([], value)
            yield g

    def _load(self, engine: RoutingEngine) -> Iterator[GaugeMetricFamily]:
        fleet, state = engine.fleet, engine.state
        now = state.monotonic()
        readings = state.board.get_many(list(fleet.endpoints), now, None)
        prefill = GaugeMetricFamily("pointsman_pool_prefill_utilization",
                                    "Mean reported prefill utilization of a pool (0-1).", labels=["target", "pool"])
        decode = GaugeMetricFamily("pointsman_pool_decode_utilization",
                                   "Mean reported decode utilization of a pool (0-1).", labels=["target", "pool"])
        age = GaugeMetricFamily("pointsman_load_signal_age_seconds",
                                "Age of the endpoint's pushed or scraped load reading.", labels=["target", "endpoint"])
        inflight = GaugeMetricFamily("pointsman_inflight_requests", "Requests dispatched and not yet settled.",
                                     labels=["target", "endpoint"])
        for eid, e in fleet.endpoints.items():
            r = readings.get(eid)
            label = e.name or eid
            # 0 when nothing is in flight (or no reading at all): an absent series reads "no data"
            inflight.add_metric([e.target, label], r.inflight_requests if r is not None else 0)
            if r is not None and r.source != "inflight":
                age.add_metric([e.target, label], r.age_s(now))
        # a pool's utilization as decisions price it (``LiveSignals``): the mean over its healthy endpoints'
        # readings with the policy's staleness applied (a stale reading, or a stale push's field beside a fresh
        # scrape, is not read; its age stays exported: that is what to alert on)
        for target, role in fleet.pools:
            for gauge, value in zip((prefill, decode), state.pool_means(target, role, engine.policy.staleness)):
                if _finite(value):
                    gauge.add_metric([target, role], value)
        yield from (prefill, decode, age, inflight)
