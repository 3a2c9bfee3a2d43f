"""The engines' own signals flowing into the serving ``FleetState``: every on-prem endpoint's
Prometheus ``/metrics`` page, scraped at ``POINTSMAN_SCRAPE_INTERVAL_S``.

``SignalFeeds(live, settings).run(stop)`` is one asyncio task of the service. Each round it
scrapes every on-prem endpoint of the fleet that serves now (its ``metrics_url`` from the fleet
file, else the endpoint's base URL with ``/metrics``), puts each reading on the load board,
marks an endpoint unhealthy after ``POINTSMAN_SCRAPE_FAILURES_TO_UNHEALTHY`` failures in a row
(healthy again at its next answer; source ``scrape``, so an operator's mark stays), and lets
endpoints tripped by error outcomes out of their cool-down (``FleetState.recover``). A fleet
reload is followed at the next round: new endpoints are scraped, removed ones are not.

How pushed telemetry and scraped readings combine (``load_board``'s merge rule): per endpoint
the *freshest* external reading wins, whichever source it came from, plus the requests
Pointsman dispatched after it was measured. Every process scrapes for itself; pushed telemetry
is shared between processes through the state sync.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from pointsman.policy.signals.scrape import Scraper, ScrapeStatus
from pointsman.service.live_engine import LiveEngine
from pointsman.service.settings import Settings

log = logging.getLogger("pointsman.service.feeds")


@dataclass(frozen=True)
class FeedStatus:
    """What the scraper knows of one endpoint: its ``ScrapeStatus`` and ``age_s`` of the last
    good scrape (None before one)."""

    status: ScrapeStatus
    age_s: float | None


class SignalFeeds:
    """Scrapes the serving fleet's engines (see the module). ``rounds``: rounds completed."""

    def __init__(self, live: LiveEngine, settings: Settings) -> None:
        self.live = live
        self.interval_s = settings.scrape_interval_s
        self.timeout_s = settings.scrape_timeout_s
        self.failures_to_unhealthy = settings.scrape_failures_to_unhealthy
        self.rounds = 0
        self._scraper: Scraper | None = None
        self._fleet_revision: str | None = None

    def _targets_changed(self) -> bool:
        return self._fleet_revision != self.live.engine.fleet.revision

    async def _rebuild(self) -> Scraper:
        state = self.live.engine.state
        if self._scraper is not None:
            await self._scraper.aclose()
        self._scraper = Scraper(state.scrape_targets(), timeout_s=self.timeout_s)
        self._fleet_revision = state.fleet.revision
        return self._scraper

    async def poll_once(self) -> None:
        """One round: scrape every endpoint, update health, let tripped endpoints recover."""
        scraper = self._scraper if self._scraper is not None and not self._targets_changed() else await self._rebuild()
        state = self.live.engine.state
        await scraper.poll_once(state.board)
        state.apply_scrape_status(scraper.status(), self.failures_to_unhealthy)
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
            if self._scraper is not None:
                await self._scraper.aclose()

    def status(self) -> dict[str, FeedStatus]:
        """Per scraped endpoint id, its scrape status and the age of its last good scrape."""
        if self._scraper is None:
            return {}
        now = time.monotonic()
        return {ep: FeedStatus(st, None if st.last_ok_at is None else max(0.0, now - st.last_ok_at))
                for ep, st in self._scraper.status().items()}
