"""Outcomes of decisions made on a target a fleet reload then removed (a real ``pointsman serve``).

Before: the reload dropped the target, so its in-flight decisions' outcomes were acked ``stored`` with
``settle_error: cannot price decision ... unknown here``: the usage was never booked and the budget hold
stayed until its TTL; one naming the removed target in ``served_target`` was a 422, not stored at all.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from pointsman.policy.cost import usage_cost
from pointsman.policy.fleet import DEFAULT_FLEET_PATH, load_fleet

POLICY = """apiVersion: pointsman/v1
kind: RoutingPolicy
metadata: {name: to-8b}
rules:
  - name: small
    if_fleet_has: [onprem-8b]
    when: request.prompt_tokens >= 0
    route: {target: onprem-8b}
  - name: big
    route: {target: onprem-70b}
"""
BUDGETS = """apiVersion: pointsman/v1
kind: Budgets
budgets:
  - {scope: "tenant:acme", window: day, limit_usd: 10}
"""


def _budget(c: httpx.Client) -> dict:
    (b,) = c.get("/v1/budgets").json()["budgets"]
    return b


def test_outcomes_of_a_removed_target_are_still_booked(tmp_path: Path, serve):
    text = DEFAULT_FLEET_PATH.read_text()
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(text)
    (tmp_path / "policy.yaml").write_text(POLICY)
    (tmp_path / "budgets.yaml").write_text(BUDGETS)
    _, base = serve(tmp_path / "data", fleet_path=fleet, policy_path=tmp_path / "policy.yaml",
                    budgets_path=tmp_path / "budgets.yaml", watch_fleet="false")
    body = {"model": "auto", "max_tokens": 100, "messages": [{"role": "user", "content": "hello there"}],
            "routing": {"tenant": "acme"}}
    with httpx.Client(base_url=base, timeout=30) as c:
        ids = []
        for _ in range(2):
            d = c.post("/v1/route", json=body).json()
            assert d["target"] == "onprem-8b", d
            ids.append(d["decision_id"])
        assert _budget(c)["held_usd"] > 0
        head, _, rest = text.partition("  onprem-8b:\n")
        fleet.write_text(head + "  onprem-70b:\n" + rest.partition("  onprem-70b:\n")[2])
        r = c.post("/v1/fleet/reload")
        assert r.status_code == 200 and r.json()["changed"], r.text
        assert c.post("/v1/route", json=body).json()["target"] == "onprem-70b"
        usage = {"prompt_tokens": 10, "completion_tokens": 2000}
        acks = [c.post("/v1/outcomes", json={"decision_id": ids[0], "status": "ok", "usage": usage}),
                c.post("/v1/outcomes", json={"decision_id": ids[1], "status": "ok", "usage": usage,
                                             "served_target": "onprem-8b"})]
        for r in acks:
            assert r.status_code == 200, r.text
            (ack,) = r.json()["acks"]
            assert ack["status"] == "stored" and ack["settle_error"] is None and ack["settlement"], ack
        old = load_fleet(DEFAULT_FLEET_PATH).targets["onprem-8b"]
        usd = usage_cost("onprem-8b", old, "aggregated", prompt_tokens=10, completion_tokens=2000,
                         prefill_utilization=1.0, decode_utilization=1.0).usd
        assert [r.json()["acks"][0]["settlement"]["actual_cost_usd"] for r in acks] == [
            acks[0].json()["acks"][0]["settlement"]["actual_cost_usd"]] * 2
        booked = acks[0].json()["acks"][0]["settlement"]["actual_cost_usd"]
        assert abs(booked - usd) <= 1e-9 * max(1.0, usd), (booked, usd)
        b = _budget(c)
    # the third decision (on onprem-70b) still holds its estimate; the two outcomes are booked
    assert abs(b["settled_usd"] - 2 * booked) < 1e-8, b


def test_an_outcome_is_booked_at_the_price_its_decision_was_made_at(tmp_path: Path, serve):
    """A fleet reload doubles onprem-8b's GPU price between a decision and its outcome: the outcome is booked at
    the price the decision was made and held at (before: the new price, twice the hold's), whether it reaches
    the replica that decided (its record) or another one (the signed id). A decision made after the reload
    books the new price."""
    text = DEFAULT_FLEET_PATH.read_text()
    assert text.count("usd_per_gpu_hour: 2.50") >= 1
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(text)
    (tmp_path / "policy.yaml").write_text(POLICY)
    (tmp_path / "budgets.yaml").write_text(BUDGETS)
    settings = {"fleet_path": fleet, "policy_path": tmp_path / "policy.yaml", "budgets_path": tmp_path / "budgets.yaml",
                "watch_fleet": "false", "decision_key": "k" * 32}
    _, base = serve(tmp_path / "a", **settings)
    _, other = serve(tmp_path / "b", **settings)
    body = {"model": "auto", "max_tokens": 100, "messages": [{"role": "user", "content": "hello there"}],
            "routing": {"tenant": "acme"}}
    usage = {"prompt_tokens": 10, "completion_tokens": 2000}

    def price(fleet_text: str) -> float:
        fleet.write_text(fleet_text)
        t = load_fleet(fleet).targets["onprem-8b"]
        return usage_cost("onprem-8b", t, "aggregated", **usage, prefill_utilization=1.0, decode_utilization=1.0).usd

    before = price(text)
    with httpx.Client(timeout=30) as c:
        ids = [c.post(f"{base}/v1/route", json=body).json()["decision_id"] for _ in range(2)]
        after = price(text.replace("usd_per_gpu_hour: 2.50", "usd_per_gpu_hour: 5.00", 1))
        assert after > 1.5 * before
        for url in (base, other):
            r = c.post(f"{url}/v1/fleet/reload")
            assert r.status_code == 200 and r.json()["changed"], r.text
        booked = []
        for decision_id, url in zip(ids + [c.post(f"{base}/v1/route", json=body).json()["decision_id"]],
                                    (base, other, base), strict=True):
            r = c.post(f"{url}/v1/outcomes", json={"decision_id": decision_id, "status": "ok", "usage": usage})
            (ack,) = r.json()["acks"]
            assert ack["settle_error"] is None, ack
            booked.append(ack["settlement"]["actual_cost_usd"])
    assert booked == [pytest.approx(before, rel=1e-9), pytest.approx(before, rel=1e-9), pytest.approx(after, rel=1e-9)]
