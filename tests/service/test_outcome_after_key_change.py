"""An outcome whose decision id no key here verifies (the service restarted with another
``POINTSMAN_DECISION_KEY`` between the decision and its outcome, the key rotated) is checked against
the decision the outcome log holds. Real ``pointsman serve`` processes on one data folder (the media test: two apps
in turn on one data folder, in this process)."""

from __future__ import annotations

import hashlib

import httpx
import pytest

from pointsman.policy.signals.signed_ids import DecisionSigner
from tests.service.conftest import stop

PROMPT = "the river runs to the sea " * 10_000  # ~60,000 tokens: three of them are more than any window


def signer(secret: str) -> DecisionSigner:
    return DecisionSigner(hashlib.sha256(secret.encode()).digest())  # as service/decision_key.py derives it


def test_a_batch_outcome_after_a_key_change_fits_the_logged_decisions_own_tokens(tmp_path, serve):
    """A Completions batch of three ~60,000-token prompts is decided (each prompt fits the window), and its
    outcome reports all its prompt tokens: more than the window x 1.1, within what the decision counted. After
    a restart with a rotated key its id verifies nowhere, so only the outcome log knows the decision: the
    outcome was refused 422 'impossible' (the decision's own tokens counted 0; the gateway's report lost, the
    spend unbooked). A single prompt's decision reporting that usage is still refused."""
    settings = {"watch_policy": "false", "scrape_interval_s": "0", "decision_log_flush_ms": "5"}
    first, base = serve(tmp_path, decision_key="first-key", **settings)
    decided = []
    for prompt in ([PROMPT] * 3, "Name a river."):
        r = httpx.post(f"{base}/v1/route", json={"model": "auto", "prompt": prompt, "max_tokens": 100}, timeout=60)
        assert r.status_code == 200, r.text[:500]
        decided.append(r.json())
    batch, one = decided
    claims = signer("first-key").verify(batch["decision_id"])
    assert claims is not None and claims.prompt_tokens > 131_072 * 1.1  # signed: its claims carry its tokens
    stop(first)  # its decisions are in the outcome log
    _, base = serve(tmp_path, decision_key="second-key", **settings)
    assert signer("second-key").verify(batch["decision_id"]) is None  # what the restarted service sees

    usage = {"prompt_tokens": claims.prompt_tokens, "completion_tokens": 200}
    r = httpx.post(f"{base}/v1/outcomes", json={"decision_id": batch["decision_id"], "status": "ok",
                                                "served_target": batch["target"], "usage": usage})
    assert r.status_code == 200, r.text  # before: 422 "... is impossible on target ..."
    assert r.json()["acks"][0]["status"] == "stored"
    r = httpx.post(f"{base}/v1/outcomes", json={"decision_id": one["decision_id"], "status": "ok",
                                                "served_target": one["target"], "usage": usage})
    assert r.status_code == 422 and "impossible" in r.text, r.text


def test_an_outcome_only_the_log_knows_is_priced_at_the_fleets_assumed_utilization(tmp_path, serve):
    """A tenant's budget held the decision in the ledger (sqlite, in the data folder); after a restart with a
    rotated key only the outcome log knows the decision (no record, no claims), so its usage is priced from
    the served target alone: at the fleet's ``assumed_utilization``, as any on-prem pool without telemetry
    is priced (``FleetState._price``), and booked on the held budget. Before, at full utilization: with
    ``assumed_utilization: 0.25`` the on-prem usage was booked at a quarter of its GPU time's rent."""
    import yaml

    from pointsman.policy.cost import usage_cost
    from pointsman.policy.fleet import DEFAULT_FLEET_PATH, load_fleet

    spec = yaml.safe_load(DEFAULT_FLEET_PATH.read_text(encoding="utf-8"))
    spec.setdefault("defaults", {})["assumed_utilization"] = 0.25
    fleet_path = tmp_path / "fleet.yaml"
    fleet_path.write_text(yaml.safe_dump(spec), encoding="utf-8")
    budgets = tmp_path / "budgets.yaml"
    budgets.write_text("apiVersion: pointsman/v1\nkind: Budgets\nbudgets:\n"
                       "  - {scope: 'tenant:acme', window: day, limit_usd: 100}\n", encoding="utf-8")
    settings = {"watch_policy": "false", "scrape_interval_s": "0", "decision_log_flush_ms": "5",
                "fleet_path": str(fleet_path), "budgets_path": str(budgets)}
    first, base = serve(tmp_path, decision_key="first-key", **settings)
    d = httpx.post(f"{base}/v1/route", json={"model": "auto", "prompt": "Name a river.", "max_tokens": 50,
                                                  "routing": {"tenant": "acme"}}).json()
    fleet = load_fleet(fleet_path)
    target = fleet.targets[d["target"]]
    assert d["target"].startswith("onprem-") and signer("first-key").verify(d["decision_id"]).decode_utilization == 0.25
    stop(first)
    _, base = serve(tmp_path, decision_key="second-key", **settings)

    r = httpx.post(f"{base}/v1/outcomes", json={"decision_id": d["decision_id"], "status": "ok", "served_target": d["target"],
                                                "usage": {"prompt_tokens": 5, "completion_tokens": 40}})
    assert r.status_code == 200, r.text
    booked = r.json()["acks"][0]["settlement"]["actual_cost_usd"]
    want = usage_cost(d["target"], target, d["mode"], prompt_tokens=5, completion_tokens=40,
                      prefill_utilization=0.25, decode_utilization=0.25).usd
    assert booked == pytest.approx(want, rel=1e-6)  # before: 4x less, the pools at utilization 1.0


def test_an_outcome_only_the_log_knows_books_the_media_its_decision_priced(tmp_path):
    """An image request decided on gpt-4o-mini (frontier-small, whose images bill ~48,000 tokens), its answer
    served by gpt-4o (frontier-large) and reported ``ok`` without usage: the booking prices the decision's prompt
    tokens on the served target. Known from this process's record, the count is the decision's (the image counted);
    after a restart with a rotated key only the outcome log knows the decision, and it booked the text's ~20 tokens
    (the mini's estimate, ~16x less than the record's booking)."""
    from fastapi.testclient import TestClient

    from pointsman.estimator.estimate import FixedDifficulty
    from pointsman.policy.engine import RoutingEngine
    from pointsman.policy.fleet import load_fleet
    from pointsman.policy.rules.compiler import DEFAULT_POLICY_PATH, load_policy
    from pointsman.service.app import create_app
    from pointsman.service.bootstrap import build_state
    from pointsman.service.settings import Settings

    # a 2,000-token answer: the request costs less on gpt-4o-mini (with 16, gpt-4o would take it for less)
    body = {"max_tokens": 2000, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "What does this form say?"},
        {"type": "image_url", "image_url": {"url": "https://example.com/scan.png"}}]}], "routing": {"tenant": "acme"}}
    budgets = tmp_path / "budgets.yaml"  # held in the ledger: the restarted process settles the hold
    budgets.write_text("apiVersion: pointsman/v1\nkind: Budgets\nbudgets:\n"
                       "  - {scope: 'tenant:acme', window: day, limit_usd: 100}\n", encoding="utf-8")

    def app(key: str) -> TestClient:
        settings = Settings(data_dir=tmp_path, policy_path=DEFAULT_POLICY_PATH, watch_policy=False, decision_key=key,
                            decision_log_flush_ms=5, budgets_path=budgets)
        fleet = load_fleet()
        engine = RoutingEngine(fleet, load_policy(DEFAULT_POLICY_PATH, fleet), FixedDifficulty(0.05),
                               state=build_state(settings, fleet))
        return TestClient(create_app(settings, engine=engine, owns_engine=True))

    def booked(client: TestClient, decision: dict) -> float:
        r = client.post("/v1/outcomes", json={"decision_id": decision["decision_id"], "status": "ok",
                                              "served_target": "frontier-large"})
        assert r.status_code == 200, r.text
        return r.json()["acks"][0]["settlement"]["actual_cost_usd"]

    with app("first-key") as first:
        held, logged = (first.post("/v1/route", json=body).json() for _ in range(2))
        assert held["target"] == logged["target"] == "frontier-small" and held["prompt_tokens"] > 40_000
        from_record = booked(first, held)
    with app("second-key") as second:
        assert booked(second, logged) == pytest.approx(from_record, rel=1e-9)  # before: ~16x less
    assert from_record >= held["prompt_tokens"] * 2.5e-6  # gpt-4o's $2.50 per 1M input tokens


def test_after_a_key_change_only_the_routing_key_reports_its_outcome(tmp_path, serve):
    """A decision routed under gateway key ``alice`` takes its outcome from ``alice`` or an admin key only; after a
    restart with a rotated decision key its id verifies nowhere, and key ``bob`` (the id seen in a forwarded header)
    stored the outcome and booked its usage on ``key:alice``'s held budget ($0.0235 on a real serve). Found by a
    security review."""
    budgets = tmp_path / "budgets.yaml"
    budgets.write_text("apiVersion: pointsman/v1\nkind: Budgets\nbudgets:\n"
                       "  - {scope: 'key:alice', window: day, limit_usd: 5}\n")
    settings = {"watch_policy": "false", "scrape_interval_s": "0", "decision_log_flush_ms": "5",
                "budgets_path": str(budgets), "gateway_api_keys": "alice=alice-secret-1,bob=bob-secret-12",
                "admin_api_keys": "ops=ops-secret-123"}
    alice, bob = ({"authorization": f"Bearer {k}"} for k in ("alice-secret-1", "bob-secret-12"))
    first, base = serve(tmp_path, decision_key="first-key", **settings)
    r = httpx.post(f"{base}/v1/route", json={"messages": [{"role": "user", "content": "Name a river."}]},
                   headers=alice, timeout=60)
    assert r.status_code == 200, r.text
    decision = r.json()
    stop(first)
    _, base = serve(tmp_path, decision_key="second-key", **settings)
    outcome = {"decision_id": decision["decision_id"], "usage": {"prompt_tokens": 20, "completion_tokens": 900}}
    r = httpx.post(f"{base}/v1/outcomes", json=outcome, headers=bob, timeout=60)
    assert r.status_code == 422 and r.json()["error"]["param"] == "decision_id", r.text
    r = httpx.post(f"{base}/v1/outcomes", json=outcome, headers=alice, timeout=60)
    assert r.status_code == 200 and r.json()["acks"][0]["status"] == "stored", r.text
