"""Operating budgets through the real app: ``GET /v1/budgets`` (admin), the budget gauges in
``/metrics``, and hot reload of the budgets file (``POST /v1/budgets/reload`` and the file
watcher): a broken file keeps the running budgets and names every problem as file:line:col."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr

from pointsman.outcome import MAX_ID_CHARS
from pointsman.policy.signals.signed_ids import DecisionSigner
from pointsman.service.app import create_app
from pointsman.service.settings import Settings

ADMIN = {"Authorization": "Bearer admin-secret-0123"}
GATEWAY = {"Authorization": "Bearer gateway-secret-0123"}
BODY = {"messages": [{"role": "user", "content": "hello there"}], "max_tokens": 1000, "routing": {"tenant": "acme"}}


def budgets_yaml(day_usd: float) -> str:
    return ("apiVersion: pointsman/v1\nkind: Budgets\nbudgets:\n"
            f"  - {{scope: 'tenant:acme', window: day, limit_usd: {day_usd}}}\n"
            "  - {scope: 'tenant:acme', window: month, limit_usd: 100}\n")


def app(tmp_path, budgets, **kw):
    settings = Settings(data_dir=tmp_path, watch_policy=False, watch_fleet=False, scrape_interval_s=0,
                        budgets_path=budgets, gateway_api_keys=SecretStr("gw=gateway-secret-0123"),
                        admin_api_keys=SecretStr("ops=admin-secret-0123"), **kw)
    return TestClient(create_app(settings))


def status(c, window="day"):
    r = c.get("/v1/budgets", headers=ADMIN)
    assert r.status_code == 200, r.text
    return next(b for b in r.json()["budgets"] if b["window"] == window), r.json()


def metric(c, name, scope="tenant:acme", window="day"):
    for line in c.get("/metrics").text.splitlines():
        if line.startswith(f'{name}{{scope="{scope}",window="{window}"}}'):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} for {scope}/{window} not in /metrics")


def test_budgets_report_limit_settled_held_remaining_and_reset(tmp_path):
    budgets = tmp_path / "budgets.yaml"
    budgets.write_text(budgets_yaml(5))
    with app(tmp_path, budgets, watch_budgets=False) as c:
        assert c.get("/v1/budgets", headers=GATEWAY).status_code == 403  # admin only
        assert c.get("/v1/budgets").status_code == 401
        day, body = status(c)
        assert body["file"] == str(budgets) and body["watching"] is False and body["last_reload"] is None
        assert (day["limit_usd"], day["settled_usd"], day["held_usd"], day["remaining_usd"]) == (5.0, 0.0, 0.0, 5.0)
        midnight = (datetime.now(UTC) + timedelta(days=1)).strftime("%Y-%m-%dT00:00:00Z")
        assert day["resets_at"] == midnight and 0 < day["resets_in_s"] <= 86400
        assert status(c, "month")[0]["resets_at"].endswith("-01T00:00:00Z")

        decision = c.post("/v1/route", json=BODY, headers=GATEWAY).json()
        est = decision["estimated_cost_usd"]
        day, _ = status(c)
        assert day["held_usd"] == pytest.approx(est, abs=1e-9) and day["remaining_usd"] == pytest.approx(5 - est, abs=1e-9)
        assert metric(c, "pointsman_budget_held_usd") == pytest.approx(est, abs=1e-9)
        assert metric(c, "pointsman_budget_remaining_usd") == pytest.approx(5 - est, abs=1e-9)

        ack = c.post("/v1/outcomes", headers=GATEWAY, json={
            "decision_id": decision["decision_id"], "usage": {"prompt_tokens": 10, "completion_tokens": 10}}).json()
        actual = ack["acks"][0]["settlement"]["actual_cost_usd"]
        day, _ = status(c)
        assert (day["held_usd"], day["settled_usd"]) == (0.0, pytest.approx(actual, abs=1e-9))
        assert day["spent_usd"] == pytest.approx(actual, abs=1e-9) and day["remaining_usd"] == pytest.approx(5 - actual, abs=1e-9)
        assert metric(c, "pointsman_budget_held_usd") == 0.0


def test_a_broken_budgets_file_keeps_the_running_budgets_and_a_valid_one_applies(tmp_path):
    budgets = tmp_path / "budgets.yaml"
    budgets.write_text(budgets_yaml(5))
    with app(tmp_path, budgets) as c:
        assert status(c)[1]["watching"] is True
        revision = status(c)[1]["revision"]
        budgets.write_text(budgets_yaml(5).replace("window: day", "window: fortnight"))
        r = c.post("/v1/budgets/reload", headers=ADMIN)
        assert r.status_code == 422 and r.json()["ok"] is False
        assert r.json()["problems"][0]["text"].startswith(f"{budgets}:4:")
        assert "budgets[0].window" in r.json()["problems"][0]["text"]
        day, body = status(c)
        assert day["limit_usd"] == 5.0 and body["revision"] == revision  # the old budgets keep applying
        assert body["last_reload"]["ok"] is False

        budgets.write_text(budgets_yaml(0))  # a zero budget: nothing may be spent
        r = c.post("/v1/budgets/reload", headers=ADMIN)  # (the watcher may have applied it a moment before)
        assert r.status_code == 200 and r.json()["ok"] is True and r.json()["revision"] != revision, r.text
        assert status(c)[0]["limit_usd"] == 0.0
        refused = c.post("/v1/route", json=BODY, headers=GATEWAY)
        # a refusal for the budget alone, as the ext_proc picker's (before: 422 no_eligible_target, which
        # the Python client and the LiteLLM integrations took for a failure and routed around)
        assert refused.status_code == 429 and refused.json()["error"]["code"] == "budget_exhausted", refused.text
        assert "tenant:acme" in refused.json()["error"]["message"]
        assert 'pointsman_decision_errors_total{code="budget_exhausted"} 1.0' in c.get("/metrics").text

        budgets.write_text(budgets_yaml(7.5))  # the watcher applies a change without a request
        deadline = time.monotonic() + 20
        while status(c)[0]["limit_usd"] != 7.5:
            assert time.monotonic() < deadline, "the budgets watcher did not apply the file within 20 s"
            time.sleep(0.1)
        assert status(c)[1]["last_reload"]["source"] == "watch"
        assert c.post("/v1/route", json=BODY, headers=GATEWAY).status_code == 200
        assert 'pointsman_budgets_reloads_total{result="rejected",source="endpoint"} 1.0' in c.get("/metrics").text


def test_a_limit_the_ledger_cannot_count_is_refused_not_a_500_per_decision(tmp_path):
    """A limit of 1e300 ('no limit, really') loaded and reloaded ok, then every decision of its scope was a 500
    internal_error: the ledger counts nano-USD, and 1e300 x 1e9 is infinity, which no integer holds. The file
    is refused now (the ledgers count in signed 64-bit nano-USD: at most MAX_LIMIT_USD), naming the key."""
    budgets = tmp_path / "budgets.yaml"
    budgets.write_text(budgets_yaml(5))
    with app(tmp_path, budgets, watch_budgets=False) as c:
        budgets.write_text(budgets_yaml(5).replace("limit_usd: 100", "limit_usd: 1e300"))
        r = c.post("/v1/budgets/reload", headers=ADMIN)
        assert r.status_code == 422 and r.json()["ok"] is False, r.text
        assert "budgets[1].limit_usd" in r.json()["problems"][0]["text"]
        assert c.post("/v1/route", json=BODY, headers=GATEWAY).status_code == 200


def test_a_long_non_ascii_tenant_is_routed_and_its_outcome_settled(tmp_path):
    """Tenant and team names may be 200 characters of any script, and the signed decision id carries them:
    escaped as JSON's \\uXXXX, 150 'é' made a 3,457-character id where ids were checked to 1,024, so a budgeted
    tenant's every decision was a 500 (the ledger refused the id) and an unbudgeted one's outcome a 422 on
    decision_id: never settled, its spend never booked. The claims are UTF-8 now and ids may be MAX_ID_CHARS
    (8,192) long, which the longest claims fit."""
    tenant, team = "é" * 200, "渋" * 200
    budgets = tmp_path / "budgets.yaml"
    budgets.write_text("apiVersion: pointsman/v1\nkind: Budgets\nbudgets:\n"
                       f"  - {{scope: 'tenant:{tenant}', window: day, limit_usd: 5}}\n")
    with app(tmp_path, budgets, watch_budgets=False) as c:
        for routing in ({"tenant": tenant, "team": team}, {"tenant": "ü" * 200, "team": team}):  # budgeted, and not
            r = c.post("/v1/route", json={**BODY, "routing": routing}, headers=GATEWAY)
            assert r.status_code == 200, r.text
            ack = c.post("/v1/outcomes", headers=GATEWAY, json={
                "decision_id": r.json()["decision_id"], "usage": {"prompt_tokens": 10, "completion_tokens": 10}})
            assert ack.status_code == 200, ack.text
            assert ack.json()["acks"][0]["status"] == "stored" and ack.json()["acks"][0]["settlement"] is not None
        day = next(b for b in c.get("/v1/budgets", headers=ADMIN).json()["budgets"] if b["window"] == "day")
        assert day["settled_usd"] > 0 and day["held_usd"] == 0.0
    # the longest claims: three 200-character names of escaped control characters, of 4-byte characters
    signer = DecisionSigner(b"k" * 16)
    for ch in ("\x01", "\U0001F600", '"'):
        scopes = (f"tenant:{ch * 200}", f"team:{ch * 200}", f"key:{ch * 200}")
        decision_id = signer.sign("0" * 32, target="t" * 63, mode="disaggregated", scopes=scopes,
                                  estimated_cost_usd=1e300, prefill_utilization=0.123456789012345,
                                  decode_utilization=0.123456789012345, inbox="f" * 32, prompt_tokens=10**12,
                                  output_cap_tokens=10**12)
        escalation = signer.sign_escalation(decision_id, target="t" * 63, mode="disaggregated",
                                            estimated_cost_usd=1e300, prefill_utilization=0.1, decode_utilization=0.1,
                                            issued_s=1e10)
        assert len(escalation) + len("/shadow:") + 128 <= MAX_ID_CHARS
        assert signer.verify(escalation) is not None and signer.verify(decision_id).scopes == scopes


def test_reload_without_a_budgets_file_says_so(tmp_path):
    with app(tmp_path, None) as c:
        r = c.post("/v1/budgets/reload", headers=ADMIN)
        assert r.status_code == 422 and "POINTSMAN_BUDGETS_PATH" in r.json()["problems"][0]["message"]
        assert c.get("/v1/budgets", headers=ADMIN).json()["budgets"] == []


def test_a_reload_that_changes_the_reservation_ttl_applies_to_the_in_flight_records(tmp_path):
    """The in-flight record's lifetime (shared records' TTL, the local sweep) follows the reloaded
    ``reservation_ttl_s``: it was read once at start."""
    budgets = tmp_path / "budgets.yaml"
    budgets.write_text("reservation_ttl_s: 600\n" + budgets_yaml(5))
    with app(tmp_path, budgets, watch_budgets=False) as c:
        state = c.app.state.fleet_state
        assert state.record_ttl_s == 600.0
        budgets.write_text("reservation_ttl_s: 120\n" + budgets_yaml(5))
        assert c.post("/v1/budgets/reload", headers=ADMIN).status_code == 200
        assert c.app.state.fleet_state.record_ttl_s == 120.0


def test_an_ok_outcome_without_usage_books_the_target_that_served_it(tmp_path):
    """An ``ok`` outcome without usage books the decision's estimate, counting its estimated tokens
    (so the effective price per token is not inflated), and when another target served it, at least
    the request's price there: it booked the decision's target's estimate under the served target's
    name (an on-prem estimate for a frontier-large answer, 45x too little). Found by a fresh-eyes test."""
    from pointsman.policy.cost import estimate_cost

    budgets = tmp_path / "budgets.yaml"
    budgets.write_text(budgets_yaml(5))
    with app(tmp_path, budgets, watch_budgets=False) as c:
        fleet = c.app.state.runtime.live.engine.fleet
        body = {"messages": [{"role": "user", "content": "Summarise the plot of Hamlet in two sentences."}],
                "routing": {"tenant": "acme"}}
        same = c.post("/v1/route", json=body, headers=GATEWAY).json()
        other = c.post("/v1/route", json=body, headers=GATEWAY).json()
        assert same["target"] == other["target"] != "frontier-large"
        r = c.post("/v1/outcomes", json={"decision_id": same["decision_id"], "status": "ok"}, headers=GATEWAY)
        settled = r.json()["acks"][0]["settlement"]
        assert settled["actual_cost_usd"] == pytest.approx(same["estimated_cost_usd"])
        price = c.get("/v1/fleet", headers=ADMIN).json()["targets"][same["target"]]["effective_price"]
        assert price["completion_tokens"] == fleet.output_tokens(same["target"], None) > 0  # not 0: no inflated $/token
        assert price["prompt_tokens"] == same["prompt_tokens"]
        r = c.post("/v1/outcomes", json={"decision_id": other["decision_id"], "status": "ok",
                                         "served_target": "frontier-large"}, headers=GATEWAY)
        settled = r.json()["acks"][0]["settlement"]
        large = fleet.targets["frontier-large"]
        want = estimate_cost("frontier-large", large, large.modes[0], other["prompt_tokens"],
                             fleet.output_tokens("frontier-large", None)).usd
        assert settled["target"] == "frontier-large"
        assert settled["actual_cost_usd"] == pytest.approx(want) and want > 10 * other["estimated_cost_usd"]


def test_a_budget_refusal_is_429_when_other_targets_cannot_take_the_request(tmp_path):
    """A tenant over its budget sends an image: the on-prem targets are text-only (capabilities), the
    frontier ones refused by the budget. Every target that could serve it is over budget, so it is a
    refusal (429 budget_exhausted), not a failure to fail open on: it was 422 no_eligible_target, which
    PointsmanClient and the LiteLLM integrations route around, serving the image unbudgeted on the
    gateway's default deployment. Found by a fresh-eyes test."""
    budgets = tmp_path / "budgets.yaml"
    budgets.write_text(budgets_yaml(0))
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
    body = {**BODY, "messages": [{"role": "user", "content": [{"type": "text", "text": "what is this?"}, image]}]}
    with app(tmp_path, budgets, watch_budgets=False) as c:
        refused = c.post("/v1/route", json=body, headers=GATEWAY)
        assert refused.status_code == 429 and refused.json()["error"]["code"] == "budget_exhausted", refused.text
        message = refused.json()["error"]["message"]
        assert "capabilities" in message and "tenant:acme" in message


def test_an_ok_outcome_without_usage_on_another_target_keeps_the_requests_output_cap(tmp_path):
    """A request capped at 4,000 output tokens, routed on-prem and answered by frontier-large without
    usage, books the request priced there with its cap, as the decision's own estimate counts it:
    it booked the fleet's default 256 output tokens ($0.002575 instead of $0.040015, 15.5x too little).
    The cap travels in the signed id, so any replica books the same. Found by a fresh-eyes test."""
    from pointsman.policy.cost import estimate_cost

    budgets = tmp_path / "budgets.yaml"
    budgets.write_text(budgets_yaml(5))
    with app(tmp_path, budgets, watch_budgets=False) as c:
        fleet = c.app.state.runtime.live.engine.fleet
        body = {**BODY, "max_tokens": 4000}
        d = c.post("/v1/route", json=body, headers=GATEWAY).json()
        assert d["target"] != "frontier-large"
        r = c.post("/v1/outcomes", json={"decision_id": d["decision_id"], "status": "ok",
                                         "served_target": "frontier-large"}, headers=GATEWAY)
        settled = r.json()["acks"][0]["settlement"]
        large = fleet.targets["frontier-large"]
        want = estimate_cost("frontier-large", large, large.modes[0], d["prompt_tokens"], 4000).usd
        assert settled["actual_cost_usd"] == pytest.approx(want)  # before: 256 output tokens' worth
        assert status(c)[0]["settled_usd"] == pytest.approx(want, abs=1e-9)


def test_an_ok_outcome_without_usage_on_another_target_books_all_n_answers(tmp_path):
    """OpenAI's ``n``: 3 answers of at most 4,000 tokens, routed on-prem and answered by frontier-large
    without usage, book 12,000 output tokens there, as the decision's own estimate counts them; the
    signed id carried the per-answer cap, so the booking priced one answer (a third), and without a cap
    it carried none (one answer of the fleet's default). Found by a fresh-eyes test."""
    from pointsman.policy.cost import estimate_cost

    budgets = tmp_path / "budgets.yaml"
    budgets.write_text(budgets_yaml(5))
    with app(tmp_path, budgets, watch_budgets=False) as c:
        fleet = c.app.state.runtime.live.engine.fleet
        d = c.post("/v1/route", json={**BODY, "max_tokens": 4000, "n": 3}, headers=GATEWAY).json()
        assert d["target"] != "frontier-large"
        r = c.post("/v1/outcomes", json={"decision_id": d["decision_id"], "status": "ok",
                                         "served_target": "frontier-large"}, headers=GATEWAY)
        settled = r.json()["acks"][0]["settlement"]
        large = fleet.targets["frontier-large"]
        want = estimate_cost("frontier-large", large, large.modes[0], d["prompt_tokens"], 3 * 4000).usd
        assert settled["actual_cost_usd"] == pytest.approx(want)  # before: one answer's 4,000 tokens
        assert status(c)[0]["settled_usd"] == pytest.approx(want, abs=1e-9)
        # without a cap: 3 answers of the fleet's default output each (before: one)
        d = c.post("/v1/route", json={k: v for k, v in {**BODY, "n": 3}.items() if k != "max_tokens"},
                   headers=GATEWAY).json()
        r = c.post("/v1/outcomes", json={"decision_id": d["decision_id"], "status": "ok",
                                         "served_target": "frontier-large"}, headers=GATEWAY)
        default = fleet.output_tokens("frontier-large", None)
        want = estimate_cost("frontier-large", large, large.modes[0], d["prompt_tokens"], 3 * default).usd
        assert r.json()["acks"][0]["settlement"]["actual_cost_usd"] == pytest.approx(want)


def test_a_request_for_n_answers_reserves_n_answers(tmp_path):
    """OpenAI's ``n``: every answer is decoded and billed. A request for 5 answers of at most 100 tokens
    is estimated, and held in its budget, at 500 output tokens; it was held at 100 (n was ignored:
    frontier-large $0.001035 held for up to $0.005035 of answers). Found by a fresh-eyes test."""
    from pointsman.policy.cost import estimate_cost

    budgets = tmp_path / "budgets.yaml"
    budgets.write_text(budgets_yaml(5))
    with app(tmp_path, budgets, watch_budgets=False) as c:
        fleet = c.app.state.runtime.live.engine.fleet
        body = {**BODY, "max_tokens": 100, "n": 5}
        d = c.post("/v1/route", json=body, headers=GATEWAY).json()
        spec = fleet.targets[d["target"]]
        trace = c.post("/v1/route", json={**body, "routing": {"explain": True}}, headers=GATEWAY).json()["trace"]
        assert trace["cost"]["output_tokens"] == 500  # before: 100
        if d["target"].startswith("frontier"):
            assert d["estimated_cost_usd"] == pytest.approx(
                estimate_cost(d["target"], spec, spec.modes[0], d["prompt_tokens"], 500).usd)
        assert status(c)[0]["held_usd"] == pytest.approx(d["estimated_cost_usd"], abs=1e-9)
        bad = c.post("/v1/route", json={**body, "n": 0}, headers=GATEWAY)
        assert bad.status_code == 422 and bad.json()["error"]["param"] == "n"


def test_only_the_routing_key_or_an_admin_reports_a_key_budgets_outcome(tmp_path):
    """A decision routed under gateway key ``gw`` (budget scope ``key:gw``) takes its outcome (and a
    draft's verify) from ``gw`` or an admin key, not from another gateway key: the decision id travels in headers to the
    upstream, and key ``other`` booked $0.65 to ``key:gw`` with it. Found by a fresh-eyes test."""
    budgets = tmp_path / "budgets.yaml"
    budgets.write_text(budgets_yaml(5))
    settings = Settings(data_dir=tmp_path, watch_policy=False, watch_fleet=False, scrape_interval_s=0,
                        budgets_path=budgets, watch_budgets=False,
                        gateway_api_keys=SecretStr("gw=gateway-secret-0123,other=other-secret-0123"),
                        admin_api_keys=SecretStr("ops=admin-secret-0123"))
    other = {"Authorization": "Bearer other-secret-0123"}
    usage = {"prompt_tokens": 100_000, "completion_tokens": 40_000}
    with TestClient(create_app(settings)) as c:
        mine, ops = (c.post("/v1/route", json=BODY, headers=GATEWAY).json() for _ in range(2))
        r = c.post("/v1/outcomes", json={"decision_id": mine["decision_id"], "status": "ok", "usage": usage},
                   headers=other)
        assert r.status_code == 422 and r.json()["error"]["param"] == "decision_id", r.text
        assert "another gateway key" in r.json()["error"]["message"]
        batch = c.post("/v1/outcomes", json=[{"decision_id": mine["decision_id"], "status": "ok", "usage": usage}],
                       headers=other).json()
        assert batch["acks"][0]["status"] == "invalid" and batch["counts"] == {"invalid": 1}
        v = c.post("/v1/verify", json={"decision_id": mine["decision_id"], "draft": {"text": "Hi there."},
                                       "usage": usage}, headers=other)  # would book the draft's tokens
        assert v.status_code == 422 and v.json()["error"]["param"] == "decision_id", v.text
        assert status(c)[0]["settled_usd"] == 0  # nothing booked by the other key
        for headers, d in ((GATEWAY, mine), (ADMIN, ops)):  # the routing key, and an admin
            r = c.post("/v1/outcomes", json={"decision_id": d["decision_id"], "status": "ok",
                                             "usage": {"prompt_tokens": 10, "completion_tokens": 5}}, headers=headers)
            assert r.status_code == 200 and r.json()["acks"][0]["status"] == "stored", r.text


def test_another_key_cannot_take_a_decisions_outcome_id_and_keep_its_spend_off_the_budget(tmp_path):
    """Outcome ids are one namespace: key ``other`` posted an outcome of its own decision under ``gw``'s decision id
    (seen in a forwarded header) as its ``outcome_id``, and ``gw``'s real outcome was then a 409 conflict, never
    stored nor settled: 40,000 tokens kept off ``key:gw``'s and ``tenant:acme``'s budgets. Found by a security review."""
    budgets = tmp_path / "budgets.yaml"
    budgets.write_text(budgets_yaml(5))
    settings = Settings(data_dir=tmp_path, watch_policy=False, watch_fleet=False, scrape_interval_s=0,
                        budgets_path=budgets, watch_budgets=False,
                        gateway_api_keys=SecretStr("gw=gateway-secret-0123,other=other-secret-0123"),
                        admin_api_keys=SecretStr("ops=admin-secret-0123"))
    other = {"Authorization": "Bearer other-secret-0123"}
    small = {"prompt_tokens": 10, "completion_tokens": 5}
    with TestClient(create_app(settings)) as c:
        mine = c.post("/v1/route", json=BODY, headers=GATEWAY).json()["decision_id"]
        theirs = c.post("/v1/route", json={**BODY, "routing": {}}, headers=other).json()["decision_id"]
        for squat in (mine, f"{mine}/shadow:frontier-small", f"{mine}-frontier"):
            r = c.post("/v1/outcomes", json={"decision_id": theirs, "outcome_id": squat, "usage": small}, headers=other)
            assert r.status_code == 422 and r.json()["error"]["param"] == "outcome_id", r.text
        r = c.post("/v1/outcomes", json={"decision_id": mine, "status": "ok",
                                         "usage": {"prompt_tokens": 100, "completion_tokens": 40_000}}, headers=GATEWAY)
        assert r.status_code == 200 and r.json()["acks"][0]["status"] == "stored", r.text
        assert status(c)[0]["settled_usd"] > 0
        own = c.post("/v1/outcomes", json={"decision_id": theirs, "outcome_id": f"{theirs}-onprem", "usage": small},
                     headers=other)  # a key derived from its own decision's id stays its own
        assert own.status_code == 200 and own.json()["acks"][0]["status"] == "stored", own.text


def test_a_refusal_names_a_small_limit_as_it_is(tmp_path):
    """A limit under a cent was printed '$0.00' in the refusal ('has $0.000010 of $0.00 left'): the
    limit is printed with the remaining amount's precision."""
    budgets = tmp_path / "budgets.yaml"
    budgets.write_text(budgets_yaml(0.00001))
    with app(tmp_path, budgets, watch_budgets=False) as c:
        refused = c.post("/v1/route", json=BODY, headers=GATEWAY)
        assert refused.status_code == 429, refused.text
        assert "tenant:acme has $0.000010000 of $0.000010000 left this day" in refused.json()["error"]["message"]


def test_the_trace_says_what_the_decision_reserved(tmp_path):
    """``trace.budget.reserved_usd`` is what the ledger holds for the decision: its estimate when a
    budget applies to one of its scopes, None when none does (nothing is held; its outcome books
    unreserved). Before, every dispatched decision's trace said its estimate was reserved: a tenant
    without a budget read reserved_usd 2.6e-05 while its outcome's settlement said reserved_usd 0.0."""
    budgets = tmp_path / "budgets.yaml"
    budgets.write_text(budgets_yaml(1.0))
    with app(tmp_path, str(budgets)) as c:
        for tenant, held in (("acme", True), ("other", False)):
            body = {**BODY, "routing": {"tenant": tenant, "explain": True}}
            d = c.post("/v1/route", json=body, headers=GATEWAY).json()
            assert d["trace"]["budget"]["reserved_usd"] == (d["estimated_cost_usd"] if held else None), d["trace"]
            r = c.post("/v1/outcomes", headers=GATEWAY, json={
                "decision_id": d["decision_id"], "usage": {"prompt_tokens": 3, "completion_tokens": 4}})
            settlement = r.json()["acks"][0]["settlement"]
            assert settlement["hold_state"] == ("held" if held else "unreserved")
            assert settlement["reserved_usd"] == pytest.approx(d["trace"]["budget"]["reserved_usd"] or 0.0, abs=1e-9)


def test_a_key_budget_naming_no_api_key_is_refused(tmp_path):
    """``key:<name>`` budgets bind the API key the caller authenticated with; one naming no configured
    key never applies. Before, a misspelt name (key:gw-1 for the key gw1) loaded without a word (serve
    started and served) and that key's spending stayed unlimited. Now serve refuses to start (exit 2, the
    scope located, the key names and a did-you-mean), a reload is rejected with the running budgets kept,
    and a budget naming a configured key applies."""
    import os
    import subprocess
    import sys

    from tests.service.conftest import free_port, stop

    budgets = tmp_path / "budgets.yaml"
    budgets.write_text("apiVersion: pointsman/v1\nkind: Budgets\nbudgets:\n"
                       "  - {scope: 'key:gw-1', window: day, limit_usd: 0.01}\n")
    env = {**os.environ, "POINTSMAN_DATA_DIR": str(tmp_path / "data"),
           "POINTSMAN_BUDGETS_PATH": str(budgets), "POINTSMAN_GATEWAY_API_KEYS": "gw1=gateway-secret-0123",
           "POINTSMAN_ADMIN_API_KEYS": "ops=admin-secret-0123"}
    proc = subprocess.Popen([sys.executable, "-m", "pointsman", "serve", "--port", str(free_port())], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _, stderr = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        stop(proc)
        raise AssertionError("serve started with a budget for a key it does not have") from None
    assert proc.returncode == 2, stderr
    assert (f"{budgets}:4:13: unknown-key: budgets[0].scope: 'key:gw-1' names no API key, so it never applies: "
            "the service's API keys are gw1, ops; did you mean 'gw1'?") in stderr, stderr

    budgets.write_text(budgets_yaml(1.0))
    with app(tmp_path, str(budgets), watch_budgets=False) as c:
        assert status(c)[0]["limit_usd"] == 1.0
        budgets.write_text(budgets_yaml(1.0) + "  - {scope: 'key:gw2', window: day, limit_usd: 0.01}\n")
        r = c.post("/v1/budgets/reload", headers=ADMIN)
        assert r.status_code == 422 and "'key:gw2' names no API key" in r.text and "did you mean 'gw'" in r.text
        assert [b["scope"] for b in c.get("/v1/budgets", headers=ADMIN).json()["budgets"]] == ["tenant:acme"] * 2
        budgets.write_text(budgets_yaml(1.0) + "  - {scope: 'key:gw', window: day, limit_usd: 0.0}\n")
        assert c.post("/v1/budgets/reload", headers=ADMIN).status_code == 200
        r = c.post("/v1/route", json=BODY, headers=GATEWAY)
        assert r.status_code in (429, 422) and "key:gw" in r.text, r.text  # its $0 budget binds the key
