"""The engines' own signals flowing into the serving ``FleetState``: every on-prem endpoint's
Prometheus ``/metrics`` page, scraped at ``POINTSMAN_SCRAPE_INTERVAL_S``, and the KV-cache
events of the endpoints that publish them (``policy/signals/kv_events.py``: one subscriber
thread per endpoint, ZMQ SUB plus the engine's replay socket; the events feed the target's
``EngineCache``).

``SignalFeeds(live, settings).run(stop)`` is one asyncio task of the service. Each round it
scrapes the on-prem endpoints of the fleet that serves now that the fleet asks to be scraped
(``FleetState.scrape_targets``: every one with ``defaults.scrape_metrics: true``, else those naming a
``metrics_url``), puts each reading on the load board, logs one warning per endpoint whose scrape
fails (again only after it answered in between), marks an endpoint unhealthy after
``POINTSMAN_SCRAPE_FAILURES_TO_UNHEALTHY`` failures in a row
(healthy again at its next answer; source ``scrape``, so an operator's mark stays), and lets
endpoints tripped by error outcomes out of their cool-down (``FleetState.recover``). A fleet
reload is followed at the next round: new endpoints are scraped and subscribed to, removed ones
are not (their subscribers stop).

How pushed telemetry and scraped readings combine (``load_board``'s merge rule): per endpoint
and per field the *freshest* external reading wins, whichever source it came from, plus the
requests Pointsman dispatched after it was measured. Every process scrapes for itself; pushed telemetry
is shared between processes through the state sync.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

from pointsman.policy.fleet import EndpointEvents
from pointsman.policy.signals.kv_events import (
    BlockStored,
    EventApplier,
    EventBatch,
    KVEventError,
    KVEventSubscriber,
    SubscriberStatus,
)
from pointsman.policy.signals.scrape import Scraper, ScrapeStatus
from pointsman.service.live_engine import LiveEngine
from pointsman.service.settings import Settings

log = logging.getLogger("pointsman.service.feeds")

#: Seconds between checks for fleet changes when scraping is off (KV-event subscribers only).
FOLLOW_INTERVAL_S = 2.0


@dataclass(frozen=True)
class FeedStatus:
    """What the scraper knows of one endpoint: its ``ScrapeStatus`` and ``age_s`` of the last
    good scrape (None before one)."""

    status: ScrapeStatus
    age_s: float | None


class _LiveSink:
    """``kv_events.KVBlockSink`` over whatever ``FleetState`` serves now (a fleet reload swaps it;
    engine caches of unchanged targets carry over)."""

    def __init__(self, live: LiveEngine) -> None:
        self.live = live

    def store_blocks(self, endpoint_id: str, keys: Sequence[int], medium: str) -> None:
        """The endpoint's engine holds these blocks."""
        self.live.engine.state.store_blocks(endpoint_id, keys, medium)

    def remove_blocks(self, endpoint_id: str, keys: Sequence[int], medium: str) -> None:
        """The endpoint's engine evicted these blocks."""
        self.live.engine.state.remove_blocks(endpoint_id, keys, medium)

    def clear_endpoint(self, endpoint_id: str) -> None:
        """Drop what the endpoint's engine reported."""
        self.live.engine.state.clear_endpoint(endpoint_id)


class SignalFeeds:
    """Scrapes the serving fleet's engines and follows their KV events (see the module).
    ``rounds``: scrape rounds completed."""

    def __init__(self, live: LiveEngine, settings: Settings) -> None:
        self.live = live
        self.scraping = settings.scrape_interval_s > 0
        self.interval_s = settings.scrape_interval_s if self.scraping else FOLLOW_INTERVAL_S
        self.timeout_s = settings.scrape_timeout_s
        self.failures_to_unhealthy = settings.scrape_failures_to_unhealthy
        self.rounds = 0
        self._scraper: Scraper | None = None
        self._fleet_revision: str | None = None
        self._warned: set[str] = set()  # endpoints whose failing scrape was logged (until one answers)
        self._applier = EventApplier(_LiveSink(live))
        self._subscribers: dict[str, tuple[EndpointEvents, KVEventSubscriber]] = {}
        self._event_fleet: str | None = None

    def follow_events(self) -> None:
        """Subscribe to every event-publishing endpoint of the serving fleet; stop the
        subscribers of endpoints it no longer has (or whose sockets changed). Cheap when the
        fleet did not change; a bad address is logged and that endpoint keeps its estimate."""
        fleet = self.live.engine.fleet
        if self._event_fleet == fleet.revision:
            return
        wanted = self.live.engine.state.kv_event_endpoints()
        for endpoint, (events, subscriber) in list(self._subscribers.items()):
            if wanted.get(endpoint) != events:
                subscriber.stop()
                del self._subscribers[endpoint]
                if endpoint in fleet.endpoints:
                    self.live.engine.state.clear_endpoint(endpoint)
        for endpoint, events in wanted.items():
            if endpoint in self._subscribers:
                continue
            subscriber = KVEventSubscriber(endpoint, events.url, topic=events.topic, replay_url=events.replay_url,
                                           on_batch=self._on_batch, on_reset=self._on_reset)
            try:
                subscriber.start()
            except KVEventError as exc:
                log.error("%s", exc)
                continue
            self._subscribers[endpoint] = (events, subscriber)
        self._event_fleet = fleet.revision

    def _on_batch(self, endpoint: str, batch: EventBatch) -> None:
        self._check_hashes(endpoint, batch)
        self._applier.apply(endpoint, batch)

    def _check_hashes(self, endpoint: str, batch: EventBatch) -> None:
        """Check each chain-starting block against the target's hash settings (``EngineCache.check_root``):
        a feed hashed otherwise (SGLang read as vLLM, another block size, algorithm or seed) would match
        no request, silently. One error per endpoint (and target settings) when the first block checked
        mismatches (each is hashed with the extra keys its event reports, vLLM >= 0.17; from older releases a salted
        prompt's mismatches), naming the settings that would match; every one counted in
        ``pointsman_kv_events{kind="hash_mismatches"}``."""
        state = self.live.engine.state
        info = state.fleet.endpoints.get(endpoint)
        cache = None if info is None else state.engine_cache(info.target)
        if cache is None:
            return
        for ev in batch.events:
            if type(ev) is not BlockStored or cache.check_root(endpoint, ev) is not False:
                continue
            if cache.root_checks()[endpoint] == (1, 1):  # the first block checked (since the settings last changed)
                s = cache.settings
                found = cache.scheme_of(ev)
                log.error("KV events of %s (target %s) are not hashed as its kv_events section says (engine: %s, "
                          "block_size: %d, hash_algo: %s, hash_seed: %s): no request will match its cache, so its "
                          "cache signals read empty. %s", info.name or endpoint if info else endpoint,
                          info.target if info else "?", s.engine, s.block_size, s.hash_algo, s.hash_seed,
                          f"Its blocks hash as with {found}." if found else
                          "No supported setting hashes its blocks (an unseeded vLLM sha256/sha256_cbor or SGLang "
                          "were tried; a vLLM seed is the engines' PYTHONHASHSEED).")

    def _on_reset(self, endpoint: str, reason: str) -> None:
        log.warning("KV events of %s: dropping its reported cache (%s)", endpoint, reason)
        self._applier.reset(endpoint, reason)

    def events_status(self) -> dict[str, SubscriberStatus]:
        """Per subscribed endpoint id, its subscriber's status."""
        return {endpoint: subscriber.status() for endpoint, (_, subscriber) in self._subscribers.items()}

    def stop_events(self) -> None:
        """Stop every subscriber (service shutdown)."""
        for _, subscriber in self._subscribers.values():
            subscriber.stop()
        self._subscribers.clear()

    def _targets_changed(self) -> bool:
        return self._fleet_revision != self.live.engine.fleet.revision

    async def _rebuild(self) -> Scraper:
        state = self.live.engine.state
        if self._scraper is not None:
            await self._scraper.aclose()
        targets = state.scrape_targets()
        self._scraper = Scraper(targets, timeout_s=self.timeout_s)
        self._fleet_revision = state.fleet.revision
        on_prem = sum(e.role != "api" for e in state.fleet.endpoints.values())
        log.info("scraping the /metrics of %d of %d on-prem endpoints every %g s (fleet defaults.scrape_metrics: %s)",
                 len(targets), on_prem, self.interval_s, state.fleet.spec.defaults.scrape_metrics)
        return self._scraper

    def _warn_failing(self, status: dict[str, ScrapeStatus]) -> None:
        """One warning per endpoint whose scrape fails, until a scrape of it answers again."""
        fleet = self.live.engine.fleet
        for endpoint, st in status.items():
            if st.consecutive_failures == 0:
                self._warned.discard(endpoint)
            elif endpoint not in self._warned:
                self._warned.add(endpoint)
                info = fleet.endpoints.get(endpoint)
                log.warning("cannot scrape the /metrics of endpoint %s (%s) at %s: %s; after %d failures in a row "
                            "it is marked unhealthy and gets no requests. If Pointsman cannot reach its engine's "
                            "/metrics, set the endpoint's metrics_url or the fleet's defaults.scrape_metrics: false",
                            info.name if info is not None and info.name else endpoint, endpoint, st.metrics_url,
                            st.last_error, self.failures_to_unhealthy)

    async def poll_once(self) -> None:
        """One round: follow fleet changes for the event subscribers, scrape every endpoint,
        update health, let tripped endpoints recover."""
        await asyncio.to_thread(self.follow_events)
        if not self.scraping:
            return
        scraper = self._scraper if self._scraper is not None and not self._targets_changed() else await self._rebuild()
        state = self.live.engine.state
        await scraper.poll_once(state.board)
        status = scraper.status()
        self._warn_failing(status)
        state.apply_scrape_status(status, self.failures_to_unhealthy)
        state.recover()
        self.rounds += 1

    async def run(self, stop: asyncio.Event) -> None:
        """Poll every ``interval_s`` until ``stop`` is set; never raises (a broken round is logged)."""
        try:
            while not stop.is_set():
                started = time.monotonic()
                try:
                    await self.poll_once()
                except Exception:  # noqa: BLE001 - a bad round must not stop the feeds
                    log.exception("scrape round failed")
                delay = max(0.0, self.interval_s - (time.monotonic() - started))
                try:
                    await asyncio.wait_for(stop.wait(), timeout=delay)
                except TimeoutError:
                    pass
        finally:
            await asyncio.to_thread(self.stop_events)
            if self._scraper is not None:
                await self._scraper.aclose()

    def status(self) -> dict[str, FeedStatus]:
        """Per scraped endpoint id, its scrape status and the age of its last good scrape."""
        if self._scraper is None:
            return {}
        now = time.monotonic()
        return {ep: FeedStatus(st, None if st.last_ok_at is None else max(0.0, now - st.last_ok_at))
                for ep, st in self._scraper.status().items()}
