"""``FleetState``: the live state behind load, cache and budget signals, and the paths
the service calls to change it.

One ``FleetState`` per process (per fleet) holds:

- ``board`` (``load_board.LoadBoard``): load per endpoint id — pushed snapshots, scraped
  ``/metrics``, and Pointsman's own in-flight accounting;
- per target, two ``prefix_index.PrefixIndex``es (128-token blocks for hashes of the
  rendered conversation, 512-token blocks for the gateway's ``prefix_block_hashes``),
  each endpoint bounded by its pool's ``kv_cache_capacity_tokens``, with the target's
  shared KV tier when the fleet declares one; a frontier target's index tracks the
  provider's prompt cache;
- sessions: ``session_id -> (target, endpoint id)`` of its last request (TTL);
- health: endpoint ids marked unhealthy, with a reason;
- ``ledger`` (``budget.ledger.BudgetLedger`` or None: no budgets, nothing recorded);
- dispatch records: what each in-flight decision holds (target, mode, endpoints,
  estimate), so an outcome can be settled by decision id alone.

The engine reads it per decision through a ``live.LiveSignals`` and
writes at dispatch (``dispatch``: reserve the estimate in the ledger, count the
request in flight, record its prefix and session). The service calls:

==========================================  ===============================================
``settle(decision_id, prompt_tokens=...,``  an outcome arrived: actual cost into the ledger
``completion_tokens=..., cached_tokens=...)``  (idempotent), in-flight load released
``release(decision_id)``                    the request never ran: hold dropped, load released
``push_load(endpoint, snapshot)``           ``POST /v1/telemetry`` (validated; ``RequestError``)
``put_scraped(endpoint, load)`` / ``scrape_targets()`` / ``apply_scrape_status(status)``
                                            the ``/metrics`` scraper's feed and health
``set_health(endpoint, healthy, reason)``   mark an endpoint (un)healthy
``effective_prices(window)``                effective price per token per target (ledger)
``fleet_status()``                          every endpoint's signals with ages (``GET /v1/fleet``)
``close()``                                 close the ledger
==========================================  ===============================================

Every method is thread-safe. Times: ``now`` for the ledger is Unix seconds, for load
and sessions monotonic seconds; both default to the clocks given at construction.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, replace
from pathlib import Path

from pointsman.errors import BudgetError, RequestError
from pointsman.policy.budget.config import RESTORE_MARGIN_S
from pointsman.policy.budget.journal import KEEP_RECENT_S, Applied, Booked, Restoring, Seen, SettleArgs, SpendJournal
from pointsman.policy.budget.ledger import (
    BudgetLedger,
    BudgetSnapshot,
    LedgerUnavailable,
    Settlement,
    UnknownReservation,
)
from pointsman.policy.budget.redis_ledger import KEEP_AFTER_WINDOW_S
from pointsman.policy.budget.snapshot_cache import PendingChange, SnapshotCache
from pointsman.policy.budget.units import NUSD_PER_USD, check_tokens, day_start_s, window_of
from pointsman.policy.cost import TargetPrice, pool_utilization, usage_cost
from pointsman.policy.cost import effective_prices as _effective_prices
from pointsman.policy.fleet import EndpointEvents, Fleet, FrontierTarget, OnPremTarget, phase_roles
from pointsman.policy.signals.engine_cache import EngineCache
from pointsman.policy.signals.load_board import EndpointLoad, LoadBoard, StalenessPolicy, mean_reading
from pointsman.policy.signals.prefix_index import BLOCK_TOKENS, MOONCAKE_BLOCK_TOKENS, PrefixIndex, SharedKVTier
from pointsman.policy.signals.scrape import ScrapeStatus, metrics_url
from pointsman.policy.signals.shared_state import Change, LocalSync, SharedRecord, SharedView, StateSync
from pointsman.policy.signals.signed_ids import ESCALATION_SUFFIX, Claims, DecisionSigner

log = logging.getLogger("pointsman.state")

#: KV capacity assumed for a frontier provider's prompt cache, tokens (large: it is theirs).
FRONTIER_CACHE_TOKENS = 50_000_000
#: Sessions remembered at most, and how long after their last request.
MAX_SESSIONS = 200_000
SESSION_TTL_S = 900.0
#: Outcomes remembered after settling, for idempotent repeats on this replica.
SETTLED_MEMORY = 100_000
#: Fleets (by revision) a state remembers to price outcomes of decisions made on them after a reload.
FLEETS_REMEMBERED = 16
#: Suffix of the in-flight id of a disaggregated decision's prefill leg.
PREFILL_SUFFIX = "/prefill"
#: Seconds before the last time a Redis ledger was seen alive from which ``restore_spend`` books this replica's
#: settlements again after Redis restarted (``appendfsync everysec`` loses at most ~2 s; ``no``, ~30 s).
RESTORE_LOOKBACK_S = 300.0
#: A restore pass keeps how far it got every this many rows (``SpendJournal.restored_to``; and when Redis goes away): a
#: process killed mid-pass resumes there. One small SQLite write per page (about a second of a pass).
RESTORE_NOTE_ROWS = 1000
#: Consecutive error outcomes (``error``/``timeout``) on one endpoint that mark it unhealthy.
ERROR_OUTCOMES_TO_UNHEALTHY = 5
#: Seconds an endpoint marked unhealthy by error outcomes waits before it is tried again.
UNHEALTHY_COOLDOWN_S = 30.0


@dataclass(frozen=True)
class DispatchRecord:
    """What a dispatched decision holds until its outcome: ``target``, ``mode``, endpoint
    ids (``endpoint``: aggregated/decode/api; ``prefill_endpoint`` when disaggregated),
    ``scopes``, ``estimated_cost_usd``, ``reserved`` (held in the ledger), ``prompt_tokens``,
    the utilizations the estimate used, ``at`` (monotonic s) and ``output_cap_tokens``, the
    client's output cap the estimate assumed, for all of its ``n`` answers (0: none, or not known here);
    ``cached_tokens``: of the prompt, the tokens its prefill endpoint held cached when it was placed (its
    prefill queued there is the rest: ``prefill_tokens``); ``fleet_revision``, the revision of the fleet whose
    prices it was made at ('' when not known here)."""

    decision_id: str
    target: str
    mode: str
    endpoint: str
    prefill_endpoint: str | None
    scopes: tuple[str, ...]
    estimated_cost_usd: float
    reserved: bool
    prompt_tokens: int
    prefill_utilization: float
    decode_utilization: float
    at: float
    output_cap_tokens: int = 0
    cached_tokens: int = 0
    fleet_revision: str = ""

    @property
    def prefill_tokens(self) -> int:
        """The prompt tokens its prefill endpoint computes: those it did not hold cached."""
        return max(0, self.prompt_tokens - self.cached_tokens)

    @property
    def decided_tokens(self) -> int:
        """The tokens the decision estimated: its prompt tokens and output cap (every prompt and answer of a
        batch or of ``n`` answers), what its usage may reach (``outcome.check_usage_fits``)."""
        return self.prompt_tokens + self.output_cap_tokens


def _booked_elsewhere(args: SettleArgs, settlement: Settlement) -> bool:
    """Whether the ledger holds this decision as another booking than the one ``args`` (a journal row's) made: a
    replay whose settled time is not the row's ``now`` (the ledger keeps the ``now`` of the settle that booked)."""
    return settlement.replayed and settlement.settled_s != args["now"]


def _with(record: DispatchRecord, **changes: object) -> DispatchRecord:
    """``dataclasses.replace(record, **changes)`` for ``dispatch``'s path at a fraction of its cost (~1 against
    ~7 us on 13 fields): a new record holding the same field values but ``changes`` (which must name fields;
    ``DispatchRecord`` has no ``__post_init__`` to run)."""
    new = object.__new__(DispatchRecord)
    fields = new.__dict__
    fields.update(record.__dict__)
    fields.update(changes)
    return new


@dataclass(frozen=True)
class Dispatch:
    """What ``FleetState.dispatch`` commits for one decision: the ``record`` it keeps until the
    outcome, and what it records once without keeping: the prompt's ``block_hashes`` (from the
    gateway's ids when ``gateway_ids``) on the chosen endpoint(s), and the ``session_id``'s
    endpoint ('' for none)."""

    record: DispatchRecord
    block_hashes: Sequence[int]
    gateway_ids: bool
    session_id: str = ""


@dataclass(frozen=True)
class Settled:
    """The result of ``FleetState.settle``: ``actual_cost_usd`` booked (computed from usage by
    the cost model unless the caller gave it), ``target``/``mode``, ``settlement`` (the
    ledger's, None without a ledger or reservation), ``released_load`` (in-flight entries
    released now), ``replayed`` (this outcome was settled before; nothing changed), ``journaled``
    (the ledger was unavailable: kept in the spend journal, booked when it returns)."""

    decision_id: str
    target: str | None
    mode: str | None
    actual_cost_usd: float
    settlement: Settlement | None
    released_load: int
    replayed: bool
    journaled: bool = False

    def to_dict(self) -> dict[str, object]:
        """JSON-ready summary."""
        s = self.settlement
        return {"decision_id": self.decision_id, "target": self.target, "mode": self.mode,
                "actual_cost_usd": self.actual_cost_usd, "replayed": self.replayed,
                "released_load": self.released_load,
                "reserved_usd": None if s is None else s.reserved_usd,
                "overrun_usd": None if s is None else s.overrun_usd,
                "hold_state": "journaled" if self.journaled else None if s is None else s.hold_state}


class FleetState:
    """Live state of one fleet (see the module docstring).

    ``FleetState(fleet, ledger=None, *, board=None, budget_fail_open=False, clock=time.time,
    monotonic=time.monotonic, session_ttl_s=900)``. ``ledger``: a budget ledger
    (``budget.factory.open_ledger``); None means no budgets and no spend records.
    ``budget_fail_open``: when the ledger is unavailable, route requests that have budgets
    anyway (default: refuse them with ``LedgerUnavailable``; requests without budgets are
    routed either way). ``budget_snapshot_ttl_s``: how long a budget snapshot read from the
    ledger serves the ``budget`` signals and filter of later decisions with the same scopes
    (default 0.05 s; 0 reads every time; ``budget.snapshot_cache``): this replica's own
    reservations, settlements and releases show at once, other replicas' within the TTL. The
    reservation at dispatch always goes to the ledger, so a stale snapshot can never
    overspend (at worst a target passes the filter and is refused at dispatch, and the next
    fallback is tried), and a refusal by the filter is confirmed by a fresh ledger read
    (``live.LiveSignals.budget_fits``), so a stale snapshot never refuses wrongly.
    ``signer``: signs the ids of dispatched decisions with their claims (``signed_ids``), so any
    process holding the same key settles their outcomes (None: ids stay unsigned, and only a
    process that knows the record settles). ``journal``: where settlements go while the ledger
    is unavailable (``budget.journal``; None: ``settle`` raises ``LedgerUnavailable`` then).
    The load board's in-flight TTL is ``record_ttl_s``.
    """

    def __init__(self, fleet: Fleet, ledger: BudgetLedger | None = None, *, board: LoadBoard | None = None,
                 budget_fail_open: bool = False, clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic, session_ttl_s: float = SESSION_TTL_S,
                 budget_snapshot_ttl_s: float = 0.05, sync: StateSync | None = None,
                 signer: DecisionSigner | None = None, journal: SpendJournal | None = None) -> None:
        self.fleet = fleet
        self.sync: StateSync = sync or LocalSync()
        self.ledger = ledger
        self.signer = signer
        self.journal = journal
        self.budget_fail_open = budget_fail_open
        self.clock = clock
        self.monotonic = monotonic
        self.session_ttl_s = float(session_ttl_s)
        known = list(fleet.endpoints) + list(fleet.aliases)
        self.board = board or LoadBoard(known_endpoints=known, inflight_ttl_s=self.record_ttl_s)
        self._lock = threading.Lock()
        self._indexes: dict[tuple[str, bool], PrefixIndex] = {}
        self._shared: dict[str, SharedKVTier | None] = {}
        for name, target in fleet.targets.items():
            self._shared[name] = None
            if not isinstance(target, FrontierTarget) and target.shared_kv is not None:
                kv = target.shared_kv
                assert target.kv_bytes_per_token is not None, "the fleet file requires kv_bytes_per_token with shared_kv"
                self._shared[name] = SharedKVTier(kv.capacity_tokens, target.kv_bytes_per_token,
                                                  kv.bandwidth_bytes_per_s, kv.latency_s)
            for ids in (False, True):
                self._indexes[(name, ids)] = self._new_index(name, ids)
        self._engine_caches: dict[str, EngineCache] = {}
        for name, target in fleet.targets.items():
            if isinstance(target, OnPremTarget) and target.kv_events is not None:
                capacity = min((p.kv_cache_capacity_tokens for p in target.pools_by_role().values()
                                if p.kv_cache_capacity_tokens), default=None)
                self._engine_caches[name] = EngineCache(target.kv_events, Path(fleet.file).parent, capacity,
                                                        self._shared[name])
        self._sessions: OrderedDict[str, tuple[str, str, float]] = OrderedDict()
        self._unhealthy: dict[str, str] = {}
        self._marks: dict[str, dict[str, str]] = {}  # endpoint id -> source -> reason
        self._healthy_count: dict[str, int] = {}
        self._total_count: dict[str, int] = {}
        for e in fleet.endpoints.values():
            self._total_count[e.target] = self._total_count.get(e.target, 0) + 1
        self._healthy_count = dict(self._total_count)
        self._records: OrderedDict[str, DispatchRecord] = OrderedDict()
        #: targets a fleet reload removed (``rebuild``), kept to price the outcomes of decisions made on them
        self.retired_targets: dict[str, OnPremTarget | FrontierTarget] = {}
        #: the fleets this process decided on, by revision (the last ``FLEETS_REMEMBERED``): an outcome is priced
        #: on its decision's fleet, at the prices the decision was made and held at
        self.fleets: OrderedDict[str, Fleet] = OrderedDict({fleet.revision: fleet})
        self._budget_cache = None if ledger is None else SnapshotCache(ledger, budget_snapshot_ttl_s, self._lock)
        self._budget_snapshot_ttl_s = float(budget_snapshot_ttl_s)
        self._settled: OrderedDict[str, Settled] = OrderedDict()
        # ids taken from the shared state here before their dispatch change was applied here: that change,
        # when it comes, must not count them in flight (this process's own release is not applied again)
        self._released_early: OrderedDict[str, float] = OrderedDict()
        self._breaker: dict[str, tuple[int, float]] = {}  # endpoint id -> (consecutive errors, tripped at)
        self._turns: dict[tuple[str, str], int] = {}  # (target, pick role) -> this process's dispatches there
        self.error_outcomes_to_unhealthy = ERROR_OUTCOMES_TO_UNHEALTHY
        self.unhealthy_cooldown_s = UNHEALTHY_COOLDOWN_S

    @property
    def record_ttl_s(self) -> float:
        """Seconds an in-flight record lives without an outcome: the ledger's ``reservation_ttl_s`` as it
        is now (a budgets reload that changes it applies to the next dispatch), else 600."""
        return 600.0 if self.ledger is None else float(self.ledger.config.reservation_ttl_s)

    def rebuild(self, fleet: Fleet) -> FleetState:
        """The state for a reloaded ``fleet`` (no restart): endpoints and targets still in it keep
        their load, prefix index entries, sessions, health marks and in-flight records (the same
        objects, so decisions in flight on the old engine still land; a scrape mark only while the
        endpoint is still scraped); removed endpoints leave every index and signal; new ones start
        empty. The ledger and the shared-state sync carry over (the sync then applies other
        processes' changes to the new state). Removed targets stay in ``retired_targets``, and the fleets
        decided on before in ``fleets``, to price the outcomes of their decisions still in flight."""
        new = FleetState(fleet, self.ledger, board=self.board, budget_fail_open=self.budget_fail_open,
                         clock=self.clock, monotonic=self.monotonic, session_ttl_s=self.session_ttl_s,
                         budget_snapshot_ttl_s=self._budget_snapshot_ttl_s, sync=self.sync, signer=self.signer,
                         journal=self.journal)
        new.retired_targets = {n: t for n, t in {**self.retired_targets, **self.fleet.targets}.items()
                               if n not in fleet.targets}
        new.fleets = OrderedDict(self.fleets)
        new.fleets.pop(fleet.revision, None)
        new.fleets[fleet.revision] = fleet
        while len(new.fleets) > FLEETS_REMEMBERED:
            new.fleets.popitem(last=False)
        kept = set(fleet.endpoints)
        self.board.set_endpoints(list(fleet.endpoints) + list(fleet.aliases))
        for endpoint in self.board.endpoints():
            if endpoint not in kept:
                self.board.forget(endpoint)
        for key, old in self._indexes.items():
            target = key[0]
            if target in fleet.targets and self._shared.get(target) == new._shared.get(target):
                new._indexes[key] = old
                for endpoint in list(old.endpoint_names()):
                    if endpoint not in kept and endpoint != target:
                        old.remove_endpoint(endpoint)
                fresh = new._new_index(target, key[1])  # the capacities and cache lifetime of the new fleet file
                old.block_ttl_s = fresh.block_ttl_s
                for endpoint, capacity in fresh.capacities().items():
                    old.set_capacity(endpoint, capacity)
        for target, cache in self._engine_caches.items():
            fresh_cache = new._engine_caches.get(target)
            if fresh_cache is not None and fresh_cache.settings == cache.settings:  # same hashing: keep what was reported
                new._engine_caches[target] = cache
                if cache.index.shared != fresh_cache.index.shared:
                    cache.index.set_shared(fresh_cache.index.shared)
                for endpoint in cache.index.endpoint_names():
                    if endpoint not in kept:
                        cache.remove_endpoint(endpoint)
        with self._lock:
            new._lock = self._lock
            new._sessions = self._sessions
            new._records = self._records
            new._settled = self._settled
            new._budget_cache = self._budget_cache
            new._breaker = self._breaker
            new._turns = self._turns
            for sid in [s for s, (tgt, ep, _) in self._sessions.items() if ep not in kept or tgt not in fleet.targets]:
                del self._sessions[sid]
            marks = {e: dict(m) for e, m in self._marks.items() if e in kept}
        scraped = new.scrape_targets()
        for endpoint, by_source in marks.items():
            for source, reason in by_source.items():
                if source != "scrape" or endpoint in scraped:  # no longer scraped: nothing would clear it
                    new._set_health(endpoint, False, reason, source)
        if self.sync.shared:
            new.start_sync()
        return new

    def _new_index(self, target: str, ids: bool) -> PrefixIndex:
        t = self.fleet.targets[target]
        block = MOONCAKE_BLOCK_TOKENS if ids else BLOCK_TOKENS
        if isinstance(t, FrontierTarget):
            return PrefixIndex(block_tokens=block, default_capacity_tokens=FRONTIER_CACHE_TOKENS,
                               block_ttl_s=t.prompt_cache_ttl_s)
        index = PrefixIndex(block_tokens=block, shared=self._shared[target])
        for pool in t.pools_by_role().values():
            if pool.kv_cache_capacity_tokens:
                for e in pool.endpoints:
                    index.set_capacity(e.url, max(block, pool.kv_cache_capacity_tokens))
        return index

    # -- reads used by the engine -------------------------------------------------

    def prefix_index(self, target: str, gateway_ids: bool) -> PrefixIndex:
        """The target's prefix index for gateway block ids (512-token blocks) or text hashes (128)."""
        return self._indexes[(target, gateway_ids)]

    def engine_cache(self, target: str) -> EngineCache | None:
        """The target's engine-reported KV cache (KV events), or None when it has no event
        stream (then its cache signals are Pointsman's estimate)."""
        return self._engine_caches.get(target)

    def kv_event_endpoints(self) -> dict[str, EndpointEvents]:
        """Endpoint id -> where it publishes KV events, for the endpoints of event-fed targets."""
        return {e.id: e.kv_events for e in self.fleet.endpoints.values()
                if e.kv_events is not None and e.target in self._engine_caches}

    def store_blocks(self, endpoint_id: str, keys: Sequence[int], medium: str) -> None:
        """``kv_events.KVBlockSink``: the endpoint's engine reports holding these blocks."""
        cache = self._cache_of(endpoint_id)
        if cache is not None:
            cache.store_blocks(endpoint_id, keys, medium)

    def remove_blocks(self, endpoint_id: str, keys: Sequence[int], medium: str) -> None:
        """``kv_events.KVBlockSink``: the endpoint's engine evicted these blocks."""
        cache = self._cache_of(endpoint_id)
        if cache is not None:
            cache.remove_blocks(endpoint_id, keys, medium)

    def clear_endpoint(self, endpoint_id: str) -> None:
        """``kv_events.KVBlockSink``: drop what the endpoint's engine reported (cleared, restarted,
        or a gap its replay could not fill)."""
        cache = self._cache_of(endpoint_id)
        if cache is not None:
            cache.clear_endpoint(endpoint_id)

    def _cache_of(self, endpoint_id: str) -> EngineCache | None:
        info = self.fleet.endpoints.get(endpoint_id)
        return None if info is None else self._engine_caches.get(info.target)

    def shared_tier(self, target: str) -> SharedKVTier | None:
        """The target's shared KV tier, if the fleet declares one."""
        return self._shared[target]

    def is_healthy(self, endpoint_id: str) -> bool:
        """False when the endpoint is marked unhealthy."""
        return endpoint_id not in self._unhealthy

    def healthy_flags(self, endpoint_ids: Sequence[str]) -> list[bool]:
        """``is_healthy`` for each id (one pass; all True without any unhealthy endpoint)."""
        bad = self._unhealthy
        if not bad:
            return [True] * len(endpoint_ids)
        return [i not in bad for i in endpoint_ids]

    def unhealthy(self) -> dict[str, str]:
        """Endpoint id -> reason, for the endpoints marked unhealthy (a copy)."""
        with self._lock:
            return dict(self._unhealthy)

    def healthy_endpoints(self, target: str) -> int:
        """Endpoints of ``target`` not marked unhealthy (O(1))."""
        return self._healthy_count.get(target, 0)

    def turn(self, target: str, role: str) -> int:
        """This process's dispatches so far to ``target``'s pick of ``role`` (``aggregated``, ``prefill``,
        ``decode``, ``api``): endpoints tied in that pick take turns by it (``pickers.PickInput.turn``)."""
        return self._turns.get((target, role), 0)

    def endpoint_count(self, target: str) -> int:
        """Endpoints of ``target`` (all its pools; 1 for a frontier API)."""
        return self._total_count.get(target, 0)

    def session(self, session_id: str, now: float | None = None) -> tuple[str, str] | None:
        """``(target, endpoint id)`` of the session's last request, or None (unknown or expired)."""
        if not session_id:
            return None
        now = self.monotonic() if now is None else now
        with self._lock:
            entry = self._sessions.get(session_id)
            if entry is None or entry[2] <= now:
                return None
            return entry[0], entry[1]

    @property
    def budget_snapshot_ttl_s(self) -> float:
        """Seconds a budget snapshot read from the ledger serves later decisions (0: none)."""
        return self._budget_snapshot_ttl_s

    def budget_snapshot(self, scopes: Sequence[str], now: float | None = None, *,
                        fresh: bool = False) -> BudgetSnapshot | None:
        """The budget snapshot of ``scopes`` at Unix time ``now``: None when no budget applies (or
        no ledger); else ``budget.snapshot_cache.SnapshotCache.read`` (a kept read less than
        ``budget_snapshot_ttl_s`` old plus this replica's reservations since, or the ledger;
        ``fresh``: the ledger). Raises ``LedgerUnavailable`` when the backend fails."""
        if self.ledger is None or self._budget_cache is None or not self.ledger.config.budgets_for(scopes):
            return None
        now = self.clock() if now is None else now
        return self._budget_cache.read(scopes, now, fresh=fresh)

    def budgets_changed(self) -> None:
        """The budgets file was reloaded: drop every kept budget snapshot; in-flight entries now
        expire at its reservation TTL."""
        if self._budget_cache is not None:
            self._budget_cache.clear()
        self.board.inflight_ttl_s = self.record_ttl_s

    # -- dispatch (engine) ---------------------------------------------------------

    def dispatch(self, dispatch: Dispatch, now: float | None = None) -> DispatchRecord:
        """Commit a decision: reserve ``record.estimated_cost_usd`` on ``record.scopes`` in the
        ledger when a budget applies to one of them (raises ``BudgetExceeded`` with nothing changed when it does not fit;
        ``LedgerUnavailable`` when the backend fails and the request has budgets, unless
        ``budget_fail_open``), then count the request in flight on its endpoint(s) (at the
        record's monotonic ``at``), record its prefix there and its session. ``now``: Unix
        seconds for the ledger. Returns the ``DispatchRecord`` that ``settle`` will use, with
        ``reserved`` saying whether the ledger holds the estimate, and its id signed with its
        claims when the state has a ``signer`` (an escalation's, ``<signed id>/escalation``, with its
        own claims: ``signed_ids``; another id holding a ``.`` stays as it is): the caller answers
        that id."""
        now = self.clock() if now is None else now
        record = dispatch.record
        if self.signer is not None and "." not in record.decision_id:
            record = _with(record, decision_id=self.signer.sign(
                record.decision_id, target=record.target, mode=record.mode, scopes=record.scopes,
                estimated_cost_usd=record.estimated_cost_usd, prefill_utilization=record.prefill_utilization,
                decode_utilization=record.decode_utilization, inbox=self.sync.inbox,
                prompt_tokens=record.prompt_tokens, output_cap_tokens=record.output_cap_tokens,
                fleet_revision=record.fleet_revision))
        elif self.signer is not None and record.decision_id.endswith(ESCALATION_SUFFIX) \
                and self.signer.verify(record.decision_id.removesuffix(ESCALATION_SUFFIX)) is not None:
            record = replace(record, decision_id=self.signer.sign_escalation(
                record.decision_id.removesuffix(ESCALATION_SUFFIX), target=record.target, mode=record.mode,
                estimated_cost_usd=record.estimated_cost_usd, prefill_utilization=record.prefill_utilization,
                decode_utilization=record.decode_utilization, issued_s=now, fleet_revision=record.fleet_revision))
        decision_id, scopes, at = record.decision_id, record.scopes, record.at
        reserved = False
        # a request no budget applies to holds nothing: its spend is booked at settlement (on the scopes
        # its record or signed id carries, ``settle``), so no ledger write is on its decision's path
        if self.ledger is not None and self.ledger.config.budgets_for(scopes):
            try:
                with self._budget_change(scopes) as change:
                    self.ledger.reserve(decision_id, scopes, record.estimated_cost_usd, now)
                    change.reserved_usd = record.estimated_cost_usd
                reserved = True
            except LedgerUnavailable:
                if not self.budget_fail_open:
                    raise
        if record.reserved != reserved:
            record = _with(record, reserved=reserved)
        self._apply_dispatch(record, dispatch.block_hashes, dispatch.gateway_ids, dispatch.session_id)
        t = self.fleet.targets.get(record.target)
        with self._lock:
            for role in ("api",) if isinstance(t, FrontierTarget) else \
                    ("prefill", "decode") if record.prefill_endpoint is not None else ("aggregated",):
                self._turns[(record.target, role)] = self._turns.get((record.target, role), 0) + 1
        if self.sync.shared:
            self.sync.dispatch(_shared(record, self._wall_of(at)), dispatch.block_hashes, dispatch.gateway_ids,
                               dispatch.session_id, self.session_ttl_s, self.board.inflight_ttl_s)
        return record

    def _apply_dispatch(self, record: DispatchRecord, block_hashes: Sequence[int], gateway_ids: bool,
                        session_id: str) -> None:
        """Count ``record`` in flight on its endpoint(s), record its prefix there and its session
        (this process's dispatch, or another's from the shared state)."""
        decision_id, at = record.decision_id, record.at
        endpoint, prefill_endpoint = record.endpoint, record.prefill_endpoint
        # a disaggregated request's prompt is prefill work on its prefill endpoint only: its decode endpoint
        # takes its KV (``pickers.QueueScorer`` would read it as prefill queued there); the prefix that
        # endpoint holds cached is no work
        self.board.dispatch(endpoint, decision_id, record.prefill_tokens if prefill_endpoint is None else 0, at)
        if prefill_endpoint is not None:
            self.board.dispatch(prefill_endpoint, decision_id + PREFILL_SUFFIX, record.prefill_tokens, at)
        if block_hashes and record.target in self.fleet.targets and record.target not in self._engine_caches:
            index = self._indexes[(record.target, gateway_ids)]
            index.record(endpoint, block_hashes, now=at)
            if prefill_endpoint is not None:
                index.record(prefill_endpoint, block_hashes, now=at)
        with self._lock:
            if session_id:
                self._sessions[session_id] = (record.target, endpoint, at + self.session_ttl_s)
                self._sessions.move_to_end(session_id)
                while len(self._sessions) > MAX_SESSIONS:
                    self._sessions.popitem(last=False)
            self._records[decision_id] = record
            horizon = at - self.record_ttl_s
            while self._records:
                first = next(iter(self._records.values()))
                if first.at > horizon:
                    break
                self._records.popitem(last=False)

    def _apply_release(self, decision_id: str) -> int:
        """Stop counting ``decision_id`` in flight here (this process's outcome or another's);
        returns the in-flight entries released (0-2)."""
        with self._lock:
            self._records.pop(decision_id, None)
        return int(self.board.release(decision_id)) + int(self.board.release(decision_id + PREFILL_SUFFIX))

    # -- the shared state (several workers or replicas) ------------------------------

    def _wall_of(self, mono: float) -> float:
        return self.clock() - (self.monotonic() - mono)

    def _mono_of(self, wall: float) -> float:
        return self.monotonic() - (self.clock() - wall)

    def start_sync(self) -> None:
        """Follow the other processes' changes (``sync.start``): load the shared state, then
        apply each change as it comes. A no-op for the embedded ``LocalSync``."""
        if self.sync.shared:
            self.sync.start(self._apply_change, self._reload_shared)

    def _record_of(self, shared: SharedRecord) -> DispatchRecord:
        return DispatchRecord(shared.decision_id, shared.target, shared.mode, shared.endpoint,
                              shared.prefill_endpoint, tuple(shared.scopes), shared.estimated_cost_usd,
                              shared.reserved, shared.prompt_tokens, shared.prefill_utilization,
                              shared.decode_utilization, self._mono_of(shared.wall_s), shared.output_cap_tokens,
                              shared.cached_tokens)

    def _known_endpoints(self, record: DispatchRecord) -> bool:
        eps = self.fleet.endpoints
        return record.endpoint in eps and (record.prefill_endpoint is None or record.prefill_endpoint in eps)

    def _apply_change(self, change: Change) -> None:
        """Apply another process's change (see ``shared_state``); changes about endpoints this
        fleet does not have (another fleet revision) are ignored."""
        if change.kind == "dispatch" and change.record is not None:
            record = self._record_of(change.record)
            with self._lock:
                early = self._released_early.pop(record.decision_id, None) is not None
            if not early and self._known_endpoints(record):
                self._apply_dispatch(record, change.block_hashes, change.gateway_ids, change.session_id)
        elif change.kind == "release":
            self._apply_release(change.decision_id)
        elif change.kind == "telemetry" and change.snapshot is not None and change.endpoint in self.fleet.endpoints:
            try:
                self.board.push(change.endpoint, change.snapshot, self._mono_of(change.wall_s))
            except RequestError as exc:
                log.warning("ignoring shared telemetry of %s: %s", change.endpoint, exc)
        elif change.kind == "health" and change.endpoint in self.fleet.endpoints:
            self._set_health(change.endpoint, change.healthy, change.reason)

    def _reload_shared(self, view: SharedView) -> None:
        """Take the whole shared state: every live record counts in flight, every endpoint's
        latest telemetry, every health mark."""
        for shared in view.records:
            record = self._record_of(shared)
            if record.decision_id not in self._records and self._known_endpoints(record):
                self._apply_dispatch(record, (), False, "")
        for endpoint, (snapshot, wall) in view.telemetry.items():
            if endpoint in self.fleet.endpoints:
                try:
                    self.board.push(endpoint, snapshot, self._mono_of(wall))
                except RequestError as exc:
                    log.warning("ignoring shared telemetry of %s: %s", endpoint, exc)
        for endpoint, reason in view.unhealthy.items():
            if endpoint in self.fleet.endpoints:
                self._set_health(endpoint, False, reason)

    # -- outcomes (service) ---------------------------------------------------------

    def record(self, decision_id: str) -> DispatchRecord | None:
        """The in-flight record of ``decision_id`` on this replica, or None."""
        with self._lock:
            return self._records.get(decision_id)

    def claims(self, decision_id: str) -> Claims | None:
        """What a signed id says about its decision (``signed_ids``); None for an unsigned,
        forged or altered id, or without a signer."""
        return None if self.signer is None else self.signer.verify(decision_id)

    def known(self, decision_id: str) -> DispatchRecord | None:
        """What settling ``decision_id`` needs: this replica's in-flight record, else its signed
        id's claims as a record (no endpoint; dispatched at the id's time); None when neither."""
        record = self.record(decision_id)
        if record is not None:
            return record
        c = self.claims(decision_id)
        if c is None:
            return None
        return DispatchRecord(decision_id, c.target, c.mode, "", None, c.scopes, c.estimated_cost_usd, False,
                              c.prompt_tokens, c.prefill_utilization, c.decode_utilization, self._mono_of(c.issued_s),
                              c.output_cap_tokens, fleet_revision=c.fleet_revision)

    def settle(self, decision_id: str, *, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0,
               actual_cost_usd: float | None = None, target: str | None = None, mode: str | None = None,
               now: float | None = None, cache_write_tokens: int = 0, cache_write_1h_tokens: int = 0,
               served_endpoint: str | None = None) -> Settled:
        """An outcome arrived: book its actual cost and release its in-flight load.

        The actual cost is ``actual_cost_usd`` when given (an API bill), else the cost
        model on the usage (``cost.usage_cost`` with ``prompt_tokens``, its parts ``cached_tokens``,
        ``cache_write_tokens`` and ``cache_write_1h_tokens``, and ``completion_tokens`` on the
        decision's target and mode, at the utilization its estimate used; ``served_endpoint``, the fleet id of the
        endpoint that answered when the gateway retried on another endpoint of the target: on that endpoint's pool,
        at its utilization now, where it is another pool than the decision's). The decision is known
        from this replica's record, else its signed id (``known``), else the shared state's
        record; ``target``/``mode`` are needed only when none knows it and no ``actual_cost_usd``
        is given. The ledger books it on the decision's scopes in its dispatch time's windows,
        reserved or not (a decision admitted while the ledger was down has no reservation); while
        the ledger is unavailable the settlement goes to the spend journal (``journaled``) and is
        booked when the ledger returns (``replay_journal``).
        Idempotent: settling again returns the first result with ``replayed=True`` (the ledger
        books a decision id once, whichever replica settles it; a replay the ledger reports carries
        the target and cost it booked then, not this call's).
        Raises ``BudgetError`` for bad numbers (token counts outside [0, ``MAX_SETTLE_TOKENS``]), an
        unknown target or cache parts beyond the prompt, ``UnknownReservation``
        when the ledger has no reservation for an id nothing here knows either,
        ``LedgerUnavailable`` when the backend fails and there is no journal or nothing known to
        journal (nothing changed; retry)."""
        check_tokens(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, cached_tokens=cached_tokens,
                     cache_write_tokens=cache_write_tokens, cache_write_1h_tokens=cache_write_1h_tokens)
        with self._lock:
            previous = self._settled.get(decision_id)
        if previous is not None:
            return replace(previous, released_load=0, replayed=True)
        record = self.known(decision_id)
        tokens = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "cached_tokens": cached_tokens, "cache_write_tokens": cache_write_tokens,
                  "cache_write_1h_tokens": cache_write_1h_tokens}
        if actual_cost_usd is not None:
            if isinstance(actual_cost_usd, bool) or not isinstance(actual_cost_usd, (int, float)) \
                    or not math.isfinite(actual_cost_usd) or actual_cost_usd < 0:
                raise BudgetError(f"actual_cost_usd must be a finite number >= 0, got {actual_cost_usd!r}")
        elif record is None and target is not None:
            # priced once before the shared record is taken: a bad target or unpriceable usage must
            # leave it in place for the corrected report (the price with its utilizations follows)
            self._price(decision_id, target, mode, None, tokens)
        taken = self._take_shared(decision_id)
        if taken is not None and (record is None or not record.endpoint):
            # the shared record names the endpoints (the pools it ran on); a signed id does not, but its fleet
            record = taken if record is None else _with(taken, fleet_revision=record.fleet_revision)
        target = target or (record.target if record else None)
        mode = mode or (record.mode if record else None)
        if actual_cost_usd is None:
            actual_cost_usd, mode = self._price(decision_id, target, mode, record, tokens, served_endpoint)
        settlement = None
        replayed = journaled = False
        if self.ledger is not None:
            args: SettleArgs = {
                "actual_cost_usd": float(actual_cost_usd), "now": self.clock() if now is None else now,
                "target": target, "prompt_tokens": prompt_tokens, "cached_tokens": cached_tokens,
                "completion_tokens": completion_tokens,
                "scopes": None if record is None else list(record.scopes),
                "issued_s": None if record is None else self._wall_of(record.at)}
            try:
                with self._budget_change(record.scopes if record else None):
                    settlement = self.ledger.settle(decision_id, **args)
                replayed = settlement.replayed
                if not replayed:
                    self._keep_booked(decision_id, args, settlement)
            except LedgerUnavailable:
                if record is None or self.journal is None:
                    raise
                self.journal.add(decision_id, args)
                journaled = True
        if settlement is not None and settlement.replayed and (
                settlement.target not in (None, target)
                or abs(settlement.actual_cost_usd - float(actual_cost_usd)) > 1.0 / NUSD_PER_USD):
            # booked then on another target or at another price: say what the ledger holds, not this report's
            # price (within the ledger's nano-USD rounding the two are the same booking)
            target, actual_cost_usd = settlement.target or target, settlement.actual_cost_usd
        released = self._apply_release(decision_id)
        if released == 0 and taken is not None:  # dispatched elsewhere, its change not applied here yet
            released = 1 + (taken.prefill_endpoint is not None)
            self._release_early(decision_id)
        result = Settled(decision_id, target, mode, float(actual_cost_usd), settlement, released, replayed, journaled)
        with self._lock:
            self._settled[decision_id] = result
            while len(self._settled) > SETTLED_MEMORY:
                self._settled.popitem(last=False)
        return result

    def hold_known_cost(self, decision_id: str, *, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0,
                        cache_write_tokens: int = 0, cache_write_1h_tokens: int = 0,
                        target: str | None = None) -> float | None:
        """A live decision whose cost is known before its settlement (a cascade's complete draft, which the same verify then
        books with these counts): its hold becomes that cost (USD, priced as ``settle`` prices the same usage), so what is
        judged meanwhile (the draft's escalation) counts the draft at its cost, not at its estimate; at the state's clock.
        Returns the USD now held, or None when nothing changed (no ledger or no live hold, the decision not dispatched here,
        usage its prices cannot price, the ledger unavailable: the estimate stays held)."""
        record = self.record(decision_id)
        if self.ledger is None or record is None or not record.reserved:
            return None
        tokens = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "cached_tokens": cached_tokens, "cache_write_tokens": cache_write_tokens,
                  "cache_write_1h_tokens": cache_write_1h_tokens}
        try:
            check_tokens(**tokens)
            cost, _ = self._price(decision_id, target or record.target, record.mode, record, tokens)
            with self._budget_change(record.scopes):
                held = self.ledger.set_hold(decision_id, cost, now=self.clock())
        except (BudgetError, LedgerUnavailable):
            return None
        return cost if held else None

    @property
    def _restorable(self) -> bool:
        """Whether this replica keeps what it books: a journal, and a ledger that can lose acknowledged
        writes (one with ``incarnation``: Redis)."""
        return self.journal is not None and callable(getattr(self.ledger, "incarnation", None))

    def _keep_booked(self, decision_id: str, args: SettleArgs, settlement: Settlement, row_only: bool = False) -> None:
        """Keep a settlement this replica booked in the journal, for ``restore_spend``, with a lower bound of its
        ledger record's expiry: a record the first settle created (``unreserved``) lives ``record_retention_s`` from
        that settle (``settled_s``, which a replay reports too); one created at the reservation, from the decision's
        time (``issued_s``: the reservation follows it). Booked now (the state's clock): a journaled settlement is
        written long after its outcome's ``now``, and a restart's lookback counts from the ledger's last sighting.
        ``row_only``: booked again from its row (``restore_spend``), kept only while that row is (``Booked.again``)."""
        if not self._restorable or self.ledger is None or self.journal is None:
            return
        retention = float(self.ledger.config.record_retention_s)
        at = args["now"] if args["issued_s"] is None else args["issued_s"]
        if settlement.day_id and window_of("day", at).id != settlement.day_id:  # held on another day than its record's
            args = args.copy()  # booked again there (and in its month)
            args["issued_s"] = day_start_s(settlement.day_id)
        born = settlement.settled_s if settlement.hold_state == "unreserved" else args["issued_s"]
        expires = None if args["scopes"] is None or born is None else born + retention
        try:
            self.journal.book(Booked(decision_id, args, self.clock(), expires, row_only))
        except LedgerUnavailable as exc:  # booked in the ledger all the same; only its spare copy is missing
            log.warning("booked settlement of %s not kept in the spend journal: %s", decision_id, exc)

    def replay_journal(self, limit: int = 1000) -> int:
        """Book settlements the spend journal kept while the ledger was down (idempotent: the
        ledger settles an id once; entries are then kept as booked for ``restore_spend``, or deleted
        when the ledger keeps what it acknowledged). Returns how many were booked now; 0 without a
        journal or while the ledger is still unavailable."""
        if self.journal is None or self.ledger is None:
            return 0
        try:
            entries = self.journal.pending(limit)
        except LedgerUnavailable as exc:
            log.warning("cannot read the spend journal: %s", exc)
            return 0
        done, booked = [], 0
        for decision_id, args in entries:
            try:
                with self._budget_change(args["scopes"]):
                    settlement = self.ledger.settle(decision_id, **args)
                booked += not settlement.replayed
            except LedgerUnavailable:
                break
            except BudgetError as exc:  # the ledger refuses it for good (e.g. purged): say so, drop it
                log.error("journaled settlement of %s refused by the ledger: %s", decision_id, exc)
            else:
                if self._restorable and not _booked_elsewhere(args, settlement):
                    self._keep_booked(decision_id, args, settlement)
                    continue
            done.append(decision_id)
        if done:
            self.journal.done(done)
        return booked

    def restore_spend(self) -> int:
        """Book again what a Redis ledger lost of this replica's settlements; returns how many were booked
        (0 without a journal, with a ledger that keeps what it acknowledged, or while it is unavailable). The
        service calls it every second (``Runtime.replay_spend``); a slow timer, not a per-decision cost.

        It reads the ledger's ``incarnation`` (``epoch``, ``run_id``) and compares it with the one the
        journal last saw (``SpendJournal.seen``):

        - a new ``epoch``: the store lost everything written since the old epoch was created (FLUSHALL, a
          new volume, a Redis without persistence restarted); the journal's sums (``RedisLedger.add_sums``: the
          settlements folded by ``SpendJournal.compact``, windows still kept) are booked in one call, and every
          booked row it keeps one by one (the last ``KEEP_RECENT_S``; those kept when the pass began) is settled
          again (read a page at a time: a worker sharing the file folds nothing meanwhile, below);
        - a new ``run_id`` (Redis restarted on its files, which may end before what it acknowledged), nothing
          seen yet, or a pass begun and not finished (``SpendJournal.restore_unfinished``: a worker sharing the file
          that read the last incarnation before another noted the new one, cut short since; without this pass its
          kept time would hold ``compact`` off until Redis restarted again): the rows booked since
          ``RESTORE_LOOKBACK_S`` before it was last seen alive whose ledger record outlives ``now + RESTORE_MARGIN_S``,
          and the sums when this epoch was made to count them since then (``SpendJournal.applied``);
        - the same incarnation, last seen a minute ago or more: it is seen now, the store is told it counts the
          sums (``add_sums`` with none: ``a:<uid>`` set, its TTL renewed), and, once this epoch was first made to
          count them more than ``RESTORE_LOOKBACK_S`` ago, the rows last booked ``KEEP_RECENT_S`` ago are folded
          into the sums (``compact``).

        Why nothing is counted twice. A settle adds its cost to the counters and marks the decision's record
        ``r:<id>`` settled in one script, which Redis applies, persists and loses as a whole (a restart keeps
        a prefix of its writes); a repeat finds ``r:<id>`` settled and changes nothing. So re-applying a
        settlement is harmless exactly while its ``r:<id>`` would still exist had Redis not lost it. The sums
        are booked the same way, with ``a:<uid>`` (this journal's) as their record:

        - after a restart, only rows whose ``expires_s`` (a lower bound of the record's expiry, from when
          the record was created, minus the margin for clocks) is ahead are re-applied: if the cost is
          still counted, so is its record, and the settle is a replay; if the record is gone, so is the cost.
          The sums are re-applied only when this epoch was made to count them after the lookback's start (its
          ``a:<uid>`` still alive): the same argument. Rows booked before the lookback's start are never
          re-applied after a restart, so they can be folded, and the sums change only once that is older than
          the lookback too (a re-application books exactly what the lost call did);
        - after an epoch change, every script creates the epoch before it writes, so everything counted now
          was written after the new epoch was created, and every record it wrote was created then too. A row
          counted now therefore has its record; a row not counted is booked. A store counting the sums has
          ``a:<uid>``: set by the call that booked them, or before the first row counted there is folded (and a
          lookback earlier, so no restart loses it), so a store cut back to before its FLUSHALL that counts them
          still has it. The new epoch must be younger than ``record_retention_s - RESTORE_MARGIN_S``, else (this
          replica saw the change too late to be sure) nothing is re-booked and an error is logged. A row
          re-booked as ``unreserved`` gets a record again, so its ``expires_s`` and ``booked_s`` move to now,
          and so does ``applied``: a crash right after is covered too.

        The incarnation is marked seen only once the sums and every chosen row were applied; until then (Redis
        away again, this process killed) the next call runs the pass again: after the rows this one booked again (kept
        every ``RESTORE_NOTE_ROWS`` rows and when Redis goes away, with the pass's time: ``SpendJournal.restored_to``)
        when the incarnation is still the one it read (the same ``epoch`` and ``run_id``: the store lost nothing since,
        so it still counts what the pass booked) and the pass chooses its rows the same way (a new epoch's, or a
        restart's from the same sighting), else from the first row, which is harmless for the same reasons. A Redis that
        refuses ``INFO`` (``run_id`` '': a restart unnoticed) always starts over. So a pass ends under failures more
        frequent than it lasts, and compaction with it. A row whose decision the
        ledger holds as another booking (a repeated outcome settled elsewhere) is forgotten, so two journals never
        fold the same settlement; a pass books at one time, kept until a pass finishes (``SpendJournal.restoring``),
        so a replay at that time (a call whose reply was lost) is this replica's booking, kept. That time is kept
        before the pass reads the rows and sums, and ``compact`` folds nothing while it is kept, so no row a pass read
        is folded before that pass books it again (a worker sharing the file, judging by the store it saw before,
        would fold it: booked as a row into a store whose ``a:<uid>`` may count it in the sums another pass read
        after the fold, and kept both as a row and in the sums, counted twice by the next emptied store); a row booked
        again is kept only while it is there (``Booked.again``: one folded or forgotten meanwhile stays so). A pass
        that outlives another worker's finished pass (which forgets the time) has left only rows that one booked
        again, which fold an hour later at the earliest; so has one begun after it (what was lost, that one booked),
        whose time a pass forgets in turn. ``add_sums`` writes
        only in the epoch read at the start (a store emptied since is left for the next call). Sums are forgotten once
        their month window's keys expire in the ledger; a repeat of a folded settlement's outcome after the store was
        emptied is booked again (its record is gone)."""
        add_sums = getattr(self.ledger, "add_sums", None)  # only a Redis ledger has it (and incarnation)
        if self.ledger is None or self.journal is None or not self._restorable or not callable(add_sums):
            return 0
        try:
            epoch, run_id = self.ledger.incarnation()  # type: ignore[attr-defined]
            seen, applied = self.journal.seen(), self.journal.applied()
            unfinished = self.journal.restore_unfinished()
        except LedgerUnavailable:
            return 0
        now = self.clock()
        retention = float(self.ledger.config.record_retention_s)
        rows: Iterator[Booked] | None = None
        sums = False
        at = now  # the time rows are booked again at
        of: list[object] | None = None  # the pass: resumed after what one cut short booked in this incarnation
        kept = Restoring(now, 0, 0)
        if seen is not None and seen.epoch != epoch:
            age = now - float(epoch.split(".")[0])
            sums = age < retention - RESTORE_MARGIN_S
            if sums:
                of = [epoch, run_id, "epoch"] if run_id else None  # run_id '': a restart would go unnoticed
                try:  # compaction held off from before the read until the pass is done (``SpendJournal.restoring``)
                    kept = self.journal.restoring(now, of)
                    at = kept.at_s
                    rows = self.journal.booked(float("-inf"), float("-inf"), after=kept.after, last=kept.last)
                except LedgerUnavailable:
                    return 0
                log.warning("budget ledger lost its store (epoch %s, now %s): booking this replica's settlements of "
                            "the current windows again", seen.epoch, epoch)
            else:
                rows = iter(())
                log.error("budget ledger epoch changed %.0f s ago (%s, now %s), not within record_retention_s (%g s) "
                          "less %g s for clocks: not booking this replica's settlements again", age, seen.epoch, epoch,
                          retention, RESTORE_MARGIN_S)
        elif seen is None or seen.run_id != run_id or unfinished:
            since = float("-inf") if seen is None else seen.ok_s - RESTORE_LOOKBACK_S
            of = [epoch, run_id, "restart", None if seen is None else since] if run_id else None
            try:
                kept = self.journal.restoring(now, of)
                at = kept.at_s
            except LedgerUnavailable:
                return 0
            rows = self.journal.booked(since, now + RESTORE_MARGIN_S, after=kept.after, last=kept.last)
            sums = applied is not None and applied.epoch == epoch \
                and max(since, now - retention + RESTORE_MARGIN_S) <= applied.s  # its a:<uid> alive had it not been lost
        elif now - seen.ok_s < 60.0:
            return 0
        booked = 0
        if sums:
            try:
                with self._budget_change(None):
                    booked = add_sums(self.journal.uid, self.journal.sums(), epoch, now)
                self.journal.apply(Applied(epoch, self.clock()))
            except LedgerUnavailable:
                return 0  # not seen yet: the next call runs the pass again
        after = noted = kept.after  # every row chosen up to rowid ``after`` is booked again; ``noted``: kept so

        def note() -> None:  # a pass of the same ``of`` (Redis away, this process killed) resumes after ``after``
            nonlocal noted
            if of is not None and after > noted and self.journal is not None:
                try:
                    self.journal.restored_to(at, of, kept.last, after)
                    noted = after
                except LedgerUnavailable as exc:
                    log.warning("spend journal: the restore's progress is not kept: %s", exc)

        for n, row in enumerate(rows or (), 1):  # a pass cut short booked at its time: a replay at it is this replica's
            if n % RESTORE_NOTE_ROWS == 0:
                note()
            again = row.args.copy()  # at ``at``: a record created again lives from then (its windows stay the decision's)
            again["now"], again["issued_s"] = at, row.args["now"] if row.args["issued_s"] is None else row.args["issued_s"]
            try:
                with self._budget_change(row.args["scopes"]):
                    settlement = self.ledger.settle(row.decision_id, **again)
            except LedgerUnavailable:
                note()
                return booked  # not seen yet: the next call resumes after the last row booked again
            except BudgetError as exc:  # e.g. no record and no scopes: nothing to book it on
                log.error("settlement of %s not booked again: %s", row.decision_id, exc)
            else:
                if not settlement.replayed:
                    booked += 1
                    self._keep_booked(row.decision_id, again, settlement, row_only=True)
                elif settlement.settled_s == at != row.args["now"]:  # booked by a pass cut short: kept at its time
                    self._keep_booked(row.decision_id, again, settlement, row_only=True)
                elif _booked_elsewhere(row.args, settlement):
                    self.journal.done([row.decision_id])
            after = row.rowid
        if booked:
            log.warning("budget ledger: %d settlement(s) it had lost booked again from the spend journal", booked)
        try:
            self.journal.see(Seen(epoch, run_id, now), restored=rows is not None)
        except LedgerUnavailable as exc:  # not seen (a full disk): the next call starts over; these stay counted
            log.warning("spend journal: the restore's pass is not noted yet: %s", exc)
            return booked
        if rows is None:  # the store counts the sums (noted before any row is folded into them), then fold
            try:
                add_sums(self.journal.uid, [], epoch, now)
            except LedgerUnavailable:
                return booked
            if applied is None or applied.epoch != epoch:
                self.journal.apply(Applied(epoch, self.clock()))
            elif applied.s < now - RESTORE_LOOKBACK_S:
                self.journal.compact(now - KEEP_RECENT_S, now - retention - KEEP_AFTER_WINDOW_S)
        return booked

    def target_spec(self, name: str, fleet_revision: str = "") -> OnPremTarget | FrontierTarget | None:
        """Target ``name`` of the fleet ``fleet_revision`` when this process decided on it (``fleets``), else of
        the fleet, else the one a fleet reload removed (its decisions' outcomes still arrive and are priced as it
        was), else None."""
        fleet = self.fleets.get(fleet_revision) if fleet_revision else None
        if fleet is not None and name in fleet.targets:
            return fleet.targets[name]
        return self.fleet.targets.get(name) or self.retired_targets.get(name)

    def pool_utilizations(self, target: str, mode: str) -> tuple[float, float]:
        """(prefill, decode) utilization to price on-prem ``target``'s ``mode`` pools at now (aggregated: its
        aggregated pool for both): each the mean of the pool's healthy endpoints' readings within the default
        ``StalenessPolicy``, through ``cost.pool_utilization`` (floored at the fleet's ``min_utilization``; the
        fleet's ``assumed_utilization`` when no endpoint reports one, or for a target a reload removed). (1.0, 1.0)
        for a frontier target."""
        if isinstance(self.target_spec(target), FrontierTarget):
            return 1.0, 1.0
        if target not in self.fleet.targets:
            return pool_utilization(None, self.fleet), pool_utilization(None, self.fleet)
        prefill_role, decode_role = phase_roles(mode)
        means = {role: self.pool_means(target, role) for role in (prefill_role, decode_role)}
        return (pool_utilization(means[prefill_role][0], self.fleet),
                pool_utilization(means[decode_role][1], self.fleet))

    def utilization_basis(self, target: str) -> dict[str, object] | None:
        """What on-prem ``target``'s reported usage is priced at now (its first mode's pools, as ``pool_utilizations``),
        for ``GET /v1/fleet``: ``{"mode", "prefill_utilization", "decode_utilization" (0-1, as priced),
        "measured" (every phase from telemetry), "assumed_utilization" (the fleet's, used where none reports one),
        "lower_bound" (some phase assumed at 1.0: busy GPU time only, idle GPUs unpriced)}``; None for a frontier
        target or one the fleet does not have."""
        spec = self.fleet.targets.get(target)
        if not isinstance(spec, OnPremTarget):
            return None
        mode = spec.modes[0]
        prefill_role, decode_role = phase_roles(mode)
        measured = (self.pool_means(target, prefill_role)[0], self.pool_means(target, decode_role)[1])
        assumed = self.fleet.spec.defaults.assumed_utilization
        return {"mode": mode, "prefill_utilization": pool_utilization(measured[0], self.fleet),
                "decode_utilization": pool_utilization(measured[1], self.fleet),
                "measured": None not in measured, "assumed_utilization": assumed,
                "lower_bound": None in measured and assumed >= 1.0}

    def pool_means(self, target: str, role: str, staleness: StalenessPolicy | None = None) -> tuple[float | None, float | None]:
        """(prefill, decode) utilization (0-1) of ``target``'s ``role`` pool now: each the mean of its healthy
        endpoints' readings fresh under ``staleness`` (default ``StalenessPolicy()``; ``load_board.mean_reading``),
        None where none reports one. What a decision prices a pool at, and ``/metrics`` exports."""
        ids = [e.id for e in self.fleet.pool_endpoints(target, role)]
        got = self.board.get_many(ids, self.monotonic(), StalenessPolicy() if staleness is None else staleness)
        loads, flags = [got.get(i) for i in ids], self.healthy_flags(ids)
        return mean_reading(loads, flags, "prefill_utilization"), mean_reading(loads, flags, "decode_utilization")

    def price_usage(self, key: str, target: str, tokens: dict[str, int]) -> float:
        """USD of ``tokens`` (``settle``'s counts) run on ``target`` outside any decision of its own (a shadow
        outcome ``key``): ``_price`` without a record, its first mode at its pools' utilizations now. Raises
        ``BudgetError`` for an unknown target or usage its prices cannot price."""
        return self._price(key, target, None, None, tokens)[0]

    def _price(self, decision_id: str, target: str | None, mode: str | None, record: DispatchRecord | None,
               tokens: dict[str, int], served_endpoint: str | None = None) -> tuple[float, str]:
        """(USD of ``tokens`` (``settle``'s counts) on ``target``, the mode priced: ``mode``, or the
        target's first mode when it has no such mode), at the prices of the fleet ``record`` was made on (when
        it names ``target`` and this process remembers that fleet, ``target_spec``; else the fleet's now) and at
        the utilizations ``record`` was estimated with when it names ``target``, else (another target served it,
        or no record) at ``target``'s pools' utilizations now (``pool_utilizations``: the fleet's assumed
        utilization where none reports one), and on the pools of its endpoints (an aggregated request prefilled
        on a decode endpoint runs both phases on the decode pool; without the endpoints, the mode's pools). A
        ``served_endpoint`` of ``target`` in another pool than the decision's endpoint (the gateway retried there)
        is the pool the request ran on: its phases there are priced on that pool at its utilization now (a
        disaggregated decision served by another decode replica keeps its prefill on the prefill pool). Raises
        ``BudgetError`` for an unknown target or usage its prices cannot price."""
        same = record is not None and record.target == target
        revision = record.fleet_revision if record is not None and same else ""
        t = None if target is None else self.target_spec(target, revision)
        if target is None or t is None:
            raise BudgetError(f"cannot price decision '{decision_id}': unknown here, so pass its target "
                              f"(and mode) or actual_cost_usd")
        mode = mode if mode in t.modes else t.modes[0]
        pools = None
        # the utilizations the estimate used are its target's pools': another target (a fallback that served
        # it), or a decision nothing here knows (only the outcome log, after a key rotation), is priced at its
        # own pools' utilizations now
        if record is not None and record.target == target:
            u_p, u_d = record.prefill_utilization, record.decode_utilization
        else:
            u_p, u_d = self.pool_utilizations(target, mode)
        if record is not None and same and record.mode == mode:
            eps = self.fleets.get(revision, self.fleet).endpoints
            decode = eps.get(record.endpoint)
            prefill = eps.get(record.prefill_endpoint) if record.prefill_endpoint else decode
            served = eps.get(served_endpoint) if served_endpoint else None
            if served is not None and served.target == target and served.pool is not None and decode is not None \
                    and served.role != decode.role:
                # retried on another pool's endpoint: it ran there, so its phases are that pool's (at its utilization
                # now), not the pool the decision estimated on
                means = self.pool_means(target, served.role)
                u_d = pool_utilization(means[1], self.fleet)
                if served.role != "decode" or record.prefill_endpoint is None:  # both phases on the served endpoint
                    prefill, u_p = served, pool_utilization(means[0], self.fleet)
                decode = served
            if decode is not None and prefill is not None and decode.pool is not None and prefill.pool is not None:
                pools = (prefill.pool, decode.pool)
        try:
            return usage_cost(target, t, mode, **tokens, prefill_utilization=u_p, decode_utilization=u_d,
                              pools=pools).usd, mode
        except ValueError as exc:  # parts beyond the prompt
            raise BudgetError(f"cannot price decision '{decision_id}': {exc}") from None

    def release(self, decision_id: str, now: float | None = None) -> bool:
        """The request never ran (the gateway gave up before sending it): drop its budget hold
        and release its in-flight load. Idempotent; returns True if anything was held. With the
        ledger unavailable the hold stays until its reservation TTL (logged)."""
        with self._lock:
            record = self._records.get(decision_id)
        taken = self._take_shared(decision_id)  # always: the other processes must stop counting it too
        record = record or taken
        held = False
        if self.ledger is not None and (record is None or record.reserved):
            try:
                with self._budget_change(record.scopes if record else None):
                    held = self.ledger.release(decision_id, now)
            except UnknownReservation:
                held = False
            except LedgerUnavailable as exc:
                log.warning("hold of %s not released (it expires at its reservation TTL): %s", decision_id, exc)
        released = self._apply_release(decision_id) > 0
        if not released and taken is not None:
            self._release_early(decision_id)
        return held or released

    def _release_early(self, decision_id: str) -> None:
        """Remember that ``decision_id`` was released here before its dispatch change arrived (the
        outcome reached this process first), for ``record_ttl_s``: the change is then not applied."""
        now = self.monotonic()
        with self._lock:
            self._released_early[decision_id] = now + self.record_ttl_s
            while self._released_early and (len(self._released_early) > SETTLED_MEMORY
                                            or next(iter(self._released_early.values())) < now):
                self._released_early.popitem(last=False)

    def _take_shared(self, decision_id: str) -> DispatchRecord | None:
        """The decision's record from the shared state (removed there, its release published to
        every process); None without one or with the embedded ``LocalSync``."""
        if not self.sync.shared:
            return None
        shared = self.sync.take(decision_id)
        return None if shared is None else self._record_of(shared)

    def _budget_change(self, scopes: Sequence[str] | None) -> AbstractContextManager[PendingChange]:
        """Around a ledger call that changes holds on ``scopes`` (None: unknown here): keeps the
        budget snapshot cache in step (``SnapshotCache.changing``)."""
        if self._budget_cache is None:
            return nullcontext(PendingChange())
        return self._budget_cache.changing(scopes)

    # -- telemetry and health (service) ---------------------------------------------

    def push_load(self, endpoint: str, snapshot: Mapping[str, object], now: float | None = None) -> EndpointLoad:
        """A pushed load snapshot for ``endpoint`` (id, URL or fleet name; vLLM field names,
        ``load_board.PUSH_FIELDS``). Raises ``RequestError`` naming the bad field or endpoint (with
        did-you-mean); the board is unchanged then."""
        endpoint_id = self.fleet.endpoint_id(endpoint) or endpoint
        now = self.monotonic() if now is None else now
        load = self.board.push(endpoint_id, snapshot, now)
        if self.sync.shared:
            values = {k: v for k, v in snapshot.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
            self.sync.telemetry(endpoint_id, values, self._wall_of(now))
        return load

    def put_scraped(self, endpoint: str, load: EndpointLoad) -> None:
        """A scraped reading (``scrape.Scraper`` feeds ``board`` directly; this is the same)."""
        self.board.put_scraped(self.fleet.endpoint_id(endpoint) or endpoint, load)

    def scrape_targets(self) -> dict[str, str]:
        """On-prem endpoint id -> its ``/metrics`` URL, for ``scrape.Scraper(targets)``, as the fleet's
        ``defaults.scrape_metrics`` says: ``true`` every on-prem endpoint (its ``metrics_url``, else the
        base URL's ``/metrics``); absent (None) only the endpoints that name a ``metrics_url``; ``false``
        none. An endpoint not listed is never scraped, so never marked unhealthy by scraping."""
        scrape = self.fleet.spec.defaults.scrape_metrics
        if scrape is False:
            return {}
        return {e.id: e.metrics_url or metrics_url(e.url) for e in self.fleet.endpoints.values()
                if e.role != "api" and (scrape or e.metrics_url)}

    def set_health(self, endpoint: str, healthy: bool, reason: str = "", *, source: str = "operator") -> None:
        """Mark ``endpoint`` (id, URL or name) healthy or not on behalf of ``source``
        (``operator``: telemetry or an admin; ``scrape``; ``outcomes``). An endpoint is unhealthy
        while any source marks it (a scrape that answers does not clear an operator's mark);
        unhealthy endpoints are never chosen, feed no signal, and a target without a healthy
        endpoint is ineligible (``health`` filter). Operator marks are shared with the other
        processes. Raises ``RequestError`` for an endpoint the fleet does not have."""
        endpoint_id = self.fleet.endpoint_id(endpoint)
        if endpoint_id is None:
            raise RequestError(f"unknown endpoint '{endpoint}'", field="endpoint")
        reason = reason or "marked unhealthy"
        self._set_health(endpoint_id, healthy, reason, source)
        if source == "operator" and self.sync.shared:
            self.sync.health(endpoint_id, healthy, reason)

    def _set_health(self, endpoint_id: str, healthy: bool, reason: str, source: str = "operator") -> None:
        target = self.fleet.endpoints[endpoint_id].target
        with self._lock:
            marks = self._marks.setdefault(endpoint_id, {})
            if healthy:
                marks.pop(source, None)
            else:
                marks[source] = reason
            was = endpoint_id not in self._unhealthy
            if marks:
                self._unhealthy[endpoint_id] = "; ".join(marks.values())
                if was:
                    self._healthy_count[target] -= 1
            else:
                self._marks.pop(endpoint_id, None)
                if not was:
                    del self._unhealthy[endpoint_id]
                    self._healthy_count[target] += 1

    def observe_outcome(self, decision_id: str, ok: bool, endpoint: str | None = None,
                        served_target: str | None = None) -> None:
        """A circuit breaker fed by outcomes: ``error``/``timeout`` outcomes in a row on one endpoint
        (``error_outcomes_to_unhealthy``) mark it unhealthy (source ``outcomes``; each process counts
        the outcomes it receives); after ``unhealthy_cooldown_s`` it is healthy again (half-open:
        one more error re-trips it),
        and any ``ok`` outcome there clears the count. ``endpoint``: where the request ran
        (default: the decision's recorded endpoint, unless ``served_target``, the target that answered,
        is another than the decision's: a fallback's outcome says nothing of it); unknown decisions and
        endpoints are ignored. Call before ``settle``/``release`` (they forget the record)."""
        if endpoint is None:
            record = self.record(decision_id)
            endpoint = None if record is None or served_target not in (None, record.target) else record.endpoint
        endpoint = None if endpoint is None else self.fleet.endpoint_id(endpoint)
        if endpoint is None or self.fleet.endpoints[endpoint].role == "api":
            return
        now = self.monotonic()
        with self._lock:
            errors, tripped = self._breaker.get(endpoint, (0, 0.0))
            if ok:
                self._breaker.pop(endpoint, None)
                trip = False
            else:
                errors += 1
                trip = errors >= self.error_outcomes_to_unhealthy
                self._breaker[endpoint] = (errors, now if trip else tripped)
        if ok:
            self._set_health(endpoint, True, "", "outcomes")
        elif trip:
            self._set_health(endpoint, False, f"{errors} error outcomes in a row", "outcomes")

    def recover(self, now: float | None = None) -> list[str]:
        """Clear the ``outcomes`` mark of endpoints tripped at least ``unhealthy_cooldown_s`` ago
        (the service calls this periodically); returns the endpoint ids cleared."""
        now = self.monotonic() if now is None else now
        with self._lock:
            due = [e for e, (n, at) in self._breaker.items()
                   if n >= self.error_outcomes_to_unhealthy and now - at >= self.unhealthy_cooldown_s]
            for e in due:
                self._breaker[e] = (self.error_outcomes_to_unhealthy - 1, 0.0)  # half-open: one more error trips
        for e in due:
            self._set_health(e, True, "", "outcomes")
        return due

    def apply_scrape_status(self, status: Mapping[str, ScrapeStatus], max_failures: int = 3) -> list[str]:
        """Health from a scraper's ``status()``: an endpoint whose last ``max_failures`` scrapes
        failed is unhealthy (reason: the last error), one that answered is healthy again.
        Returns the endpoint ids now unhealthy."""
        for endpoint, st in status.items():
            if self.fleet.endpoint_id(endpoint) is None:
                continue
            if st.consecutive_failures >= max_failures:
                self.set_health(endpoint, False, f"scrape failed {st.consecutive_failures}x: {st.last_error}",
                                source="scrape")
            elif st.last_ok_at is not None:
                self.set_health(endpoint, True, source="scrape")
        return sorted(self.unhealthy())

    # -- reporting (service) ---------------------------------------------------------

    def effective_prices(self, window: str = "day", now: float | None = None) -> dict[str, TargetPrice]:
        """Per target, the effective price per token over the UTC ``day``/``month`` window from
        settled outcomes (``cost.TargetPrice``); empty without a ledger."""
        if self.ledger is None:
            return {}
        return _effective_prices(self.ledger, self.fleet, window, self.clock() if now is None else now)

    def fleet_status(self, staleness: StalenessPolicy | None = None,
                     now: float | None = None) -> dict[str, dict[str, list[dict[str, object]]]]:
        """Every endpoint's current signals with their ages, per target (for ``GET /v1/fleet``):
        ``{target: {"endpoints": [{"id", "url", "name", "role", "healthy", "unhealthy_reason",
        "load": {...load signals with age_s...} | None, "cached_blocks", "offloaded_blocks"}]}}`` (``offloaded_blocks``:
        blocks its engine reports in its own tiers other than the GPU, 0 without KV events); ``staleness``:
        the policy's ``StalenessPolicy`` (None: raw readings)."""
        now = self.monotonic() if now is None else now
        loads = self.board.get_many(self.fleet.endpoints, now, staleness)
        unhealthy = self.unhealthy()
        out: dict[str, dict[str, list[dict[str, object]]]] = {name: {"endpoints": []} for name in self.fleet.targets}
        for e in self.fleet.endpoints.values():
            reading = loads.get(e.id)
            out[e.target]["endpoints"].append({
                "id": e.id, "url": e.url, "name": e.name, "role": e.role, "healthy": e.id not in unhealthy,
                "unhealthy_reason": unhealthy.get(e.id),
                "load": None if reading is None else reading.signals(now),
                "cached_blocks": self._cached_blocks(e.id, e.target),
                "offloaded_blocks": cache.offloaded_blocks(e.id) if (cache := self._engine_caches.get(e.target)) else 0,
                "cache_source": "engine events" if e.target in self._engine_caches else "estimate"})
        return out

    def _cached_blocks(self, endpoint_id: str, target: str) -> int:
        """Blocks the endpoint holds: as its engine reports (KV events), else Pointsman's estimate."""
        cache = self._engine_caches.get(target)
        if cache is not None:
            return cache.blocks(endpoint_id)
        return self._indexes[(target, False)].cached_blocks(endpoint_id) + \
            self._indexes[(target, True)].cached_blocks(endpoint_id)

    def close(self) -> None:
        """Stop following the shared state and close the ledger (if any)."""
        self.sync.close()
        if self.ledger is not None:
            self.ledger.close()


def _shared(record: DispatchRecord, wall_s: float) -> SharedRecord:
    """``record`` as it travels to the other processes (dispatch time as Unix seconds)."""
    return SharedRecord(record.decision_id, record.target, record.mode, record.endpoint, record.prefill_endpoint,
                        record.scopes, record.estimated_cost_usd, record.reserved, record.prompt_tokens,
                        record.prefill_utilization, record.decode_utilization, wall_s,
                        output_cap_tokens=record.output_cap_tokens, cached_tokens=record.cached_tokens)


__all__ = ["Dispatch", "DispatchRecord", "FleetState", "Settled"]
