"""What ``pointsman serve`` reports of spend that served spend leaves out (a real ``pointsman serve``, packaged fleet).

Shadow outcomes (another model's answer to the same prompt, for evaluation) are API bills too: before, they moved
neither ``/metrics`` nor ``/v1/fleet``. Now their usage is priced on their ``served_target`` into
``pointsman_shadow_spend_usd_total{target}`` and ``/v1/fleet``'s ``shadow_spent_usd``, once per stored outcome, and
into no budget nor served spend.

An on-prem effective price per token carries idle GPUs only when telemetry reports utilization: without it the
fleet's ``assumed_utilization`` (1.0, packaged) prices busy GPU time only. Before, ``/v1/fleet`` did not say which;
now each on-prem target's ``utilization`` says what its usage is priced at, whether measured, and ``lower_bound``."""

from __future__ import annotations

import re
from pathlib import Path

import httpx

#: 1,000 prompt and 1,000 output tokens on frontier-large (gpt-4o: $2.50 and $10.00 per 1M)
SHADOW_USD = (1000 * 2.50 + 1000 * 10.00) / 1e6


def _sample(metrics: str, name: str, target: str) -> float | None:
    found = re.search(rf'^{name}\{{target="{target}"\}} (\S+)$', metrics, re.M)
    return None if found is None else float(found.group(1))


def test_a_shadow_outcome_is_reported_as_shadow_spend_and_charged_to_nothing_else(tmp_path: Path, serve):
    _, base = serve(tmp_path / "data", watch_fleet="false", watch_policy="false", scrape_interval_s="0")
    with httpx.Client(base_url=base, timeout=30) as c:
        d = c.post("/v1/route", json={"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 20}).json()
        t = d["target"]
        assert t.startswith("onprem-"), d
        served = {"decision_id": d["decision_id"], "usage": {"prompt_tokens": 10, "completion_tokens": 5}}
        shadow = {"decision_id": d["decision_id"], "outcome_id": "shadow-large", "served_target": "frontier-large",
                  "shadow": True, "usage": {"prompt_tokens": 1000, "completion_tokens": 1000}}
        acks = c.post("/v1/outcomes", json=[served, shadow]).json()["acks"]
        assert [a["status"] for a in acks] == ["stored", "stored"], acks
        assert acks[1]["settlement"] is None
        retried = c.post("/v1/outcomes", json=shadow).json()["acks"]  # a retry counts once
        assert retried[0]["status"] == "duplicate", retried
        metrics = c.get("/metrics").text
        fleet = c.get("/v1/fleet").json()["targets"]
    assert _sample(metrics, "pointsman_shadow_spend_usd_total", "frontier-large") == SHADOW_USD
    assert not _sample(metrics, "pointsman_budget_spend_usd_total", "frontier-large")
    assert _sample(metrics, "pointsman_budget_spend_usd_total", t) == acks[0]["settlement"]["actual_cost_usd"]
    assert fleet["frontier-large"]["shadow_spent_usd"] == SHADOW_USD
    assert fleet["frontier-large"]["effective_price"]["spent_usd"] == 0
    assert fleet[t]["shadow_spent_usd"] == 0
    assert fleet[t]["effective_price"]["spent_usd"] == round(acks[0]["settlement"]["actual_cost_usd"], 9)  # nano-USD


def test_the_fleet_says_whether_on_prem_prices_rest_on_measured_or_assumed_utilization(tmp_path: Path, serve):
    _, base = serve(tmp_path / "data", watch_fleet="false", watch_policy="false", scrape_interval_s="0")
    with httpx.Client(base_url=base, timeout=30) as c:
        assumed = c.get("/v1/fleet").json()["targets"]
        r = c.post("/v1/telemetry", json=[
            {"endpoint": "llama-8b-0", "load": {"prefill_utilization": 0.4, "decode_utilization": 0.6}},
            {"endpoint": "llama-8b-1", "load": {"prefill_utilization": 0.2, "decode_utilization": 0.4}}])
        assert r.status_code == 200, r.text
        measured = c.get("/v1/fleet").json()["targets"]
    assert assumed["onprem-8b"]["utilization"] == {
        "mode": "aggregated", "prefill_utilization": 1.0, "decode_utilization": 1.0, "measured": False,
        "assumed_utilization": 1.0, "lower_bound": True}
    assert assumed["frontier-large"]["utilization"] is None
    got = measured["onprem-8b"]["utilization"]
    assert (got["measured"], got["lower_bound"]) == (True, False)
    assert (round(got["prefill_utilization"], 9), round(got["decode_utilization"], 9)) == (0.3, 0.5)
    assert measured["onprem-70b"]["utilization"]["lower_bound"] is True  # no telemetry there
