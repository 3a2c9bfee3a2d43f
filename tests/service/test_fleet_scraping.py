"""``/v1/fleet``'s ``scraping`` says whether any engine's ``/metrics`` is scraped. It read only the scrape interval,
so the embedded fleet (``defaults.scrape_metrics: false``) showed ``"scraping": true`` while ``/readyz`` said every
endpoint's scrape was off (found by a new user)."""

from __future__ import annotations

import httpx

from pointsman.policy.fleet import DEFAULT_FLEET_PATH


def fleet_and_readiness(base: str) -> tuple[bool, set[str]]:
    fleet = httpx.get(f"{base}/v1/fleet", timeout=30).json()
    ready = httpx.get(f"{base}/readyz", timeout=30).json()
    on_prem = [e for e in ready["endpoints"].values() if not str(e["scrape"]).startswith("off: an API")]
    return fleet["scraping"], {str(e["scrape"]).split(":")[0] for e in on_prem}


def test_scraping_is_true_only_when_an_endpoint_is_scraped(tmp_path, serve):
    _, base = serve(tmp_path / "off", scrape_interval_s="5")
    assert fleet_and_readiness(base) == (False, {"off"})  # the embedded fleet scrapes nothing
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(DEFAULT_FLEET_PATH.read_text(encoding="utf-8").replace("scrape_metrics: false", "scrape_metrics: true"),
                     encoding="utf-8")
    _, base = serve(tmp_path / "on", scrape_interval_s="5", fleet_path=str(fleet))
    scraping, states = fleet_and_readiness(base)
    assert scraping and "off" not in states
