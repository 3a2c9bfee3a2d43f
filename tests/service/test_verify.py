"""``POST /v1/verify`` (the cascade) through the app: accept or escalate real decisions, the
escalation's budget hold and in-flight load accounted once (under ``<id>/escalation``), the
gateway's one outcome settling it and stored once; 404 / 409 / 410; bad input never a 5xx."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pointsman.estimator.estimate import FixedDifficulty
from pointsman.outcome_log.store import OutcomeLog
from pointsman.policy.engine import RoutingEngine
from pointsman.policy.fleet import load_fleet
from pointsman.policy.rules.compiler import STATIC_POLICY_PATH, load_policy
from pointsman.service.app import create_app
from pointsman.service.bootstrap import build_state
from pointsman.service.settings import Settings

GOOD = ("Kickball is played like baseball with a rubber ball that is rolled to the kicker. Each team takes turns "
        "kicking and fielding; runners circle four bases, and the team with more runs after the innings wins. "
        "A game usually lasts six or nine innings, three outs end a half-inning, and a ball caught in the air "
        "is an out. Throwing the ball at a runner below the shoulders also counts, which makes base running "
        "tactical: leads are short, and fielders cover the bases the kicker is most likely to reach.")
REFUSAL = "I'm sorry, but I cannot help with that request."


def _app(tmp_path, **extra: object) -> tuple[TestClient, RoutingEngine]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    policy_path = tmp_path / "policy.yaml"
    shutil.copy(STATIC_POLICY_PATH, policy_path)
    fleet = load_fleet()
    s = Settings(data_dir=tmp_path, policy_path=policy_path, watch_policy=False, watch_fleet=False,
                 scrape_interval_s=0, **extra)
    engine = RoutingEngine(fleet, load_policy(policy_path, fleet), FixedDifficulty(0.3), state=build_state(s, fleet))
    return TestClient(create_app(s, engine=engine, owns_engine=True)), engine


def _budgeted_app(tmp_path) -> tuple[TestClient, RoutingEngine, Callable[[], tuple[float, float]]]:
    """``_app`` with a $100 day budget on ``tenant:acme`` and its (settled, held) USD reader."""
    budgets = tmp_path / "budgets.yaml"
    tmp_path.mkdir(parents=True, exist_ok=True)
    budgets.write_text("apiVersion: pointsman/v1\nkind: Budgets\nbudgets:\n"
                       "  - {scope: 'tenant:acme', window: day, limit_usd: 100}\n")
    client, engine = _app(tmp_path / "svc", budgets_path=budgets)

    def spend() -> tuple[float, float]:
        b = client.get("/v1/budgets").json()["budgets"][0]
        return b["settled_usd"], b["held_usd"]

    return client, engine, spend


def _metric(client: TestClient, name: str, target: str) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(f'{name}{{target="{target}"}}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _route(client: TestClient, text: str = "Explain the rules of kickball.") -> dict:
    r = client.post("/v1/route", json={"model": "auto", "messages": [{"role": "user", "content": text}]})
    assert r.status_code == 200, r.text
    return r.json()


def test_accept_settles_the_draft_and_replays(tmp_path):
    client, engine = _app(tmp_path)
    with client:
        d = _route(client)
        assert d["target"] == "onprem-8b" and engine.state.record(d["decision_id"]) is not None
        held = client.app.state.runtime.cascade.get(d["decision_id"]).decision
        # held for the verify without its trace builder (which keeps the decision's signals alive): the same decision
        assert held.trace_builder is None and held.to_dict(explain=False) == d
        body = {"decision_id": d["decision_id"], "draft": {"text": GOOD, "finish_reason": "stop",
                                                          "logprobs": [-0.1, -0.3, -0.05]},
                "usage": {"prompt_tokens": 12, "completion_tokens": 120}}
        r = client.post("/v1/verify", json=body)
        assert r.status_code == 200, r.text
        a = r.json()
        assert (a["action"], a["rule"], a["escalation_id"], a["replayed"]) == ("accept", "accept", None, False)
        assert 0 <= a["p_bad"] < 0.6 and a["verifier"] == "heuristic-v2" and a["draft"]["tokens"] == 120
        assert a["draft_settlement"]["target"] == "onprem-8b"
        assert engine.state.record(d["decision_id"]) is None  # the draft's on-prem load is released
        again = client.post("/v1/verify", json={**body, "draft": {"text": REFUSAL}}).json()
        assert again == {**a, "replayed": True}
        out = client.post("/v1/outcomes", json={"decision_id": d["decision_id"], "status": "ok",
                                                "usage": {"prompt_tokens": 12, "completion_tokens": 120}})
        assert out.status_code == 200 and out.json()["acks"][0]["settlement"]["replayed"] is True


def test_a_trained_head_reads_the_decision_s_prompt(tmp_path):
    """``opening_overlap`` (the draft's first sentence against the decision's prompt) reaches a served
    head: the same draft scores better after the prompt it opens on than after another one."""
    import numpy as np

    from pointsman.estimator.draft import FEATURE_NAMES
    from pointsman.training.verifier import export_verifier, fit_verifier

    rng = np.random.default_rng(0)
    x = np.zeros((200, len(FEATURE_NAMES)), dtype=np.float32)  # every other input constant: weight 0
    overlap = x[:, FEATURE_NAMES.index("opening_overlap")] = rng.random(200)
    head = export_verifier(fit_verifier(x, (overlap < 0.3).astype(float)), tmp_path / "head",
                           {"table": "synthetic", "license": "test"})
    client, _ = _app(tmp_path / "svc", verifier=str(head))
    draft = {"text": "The rules of kickball are simple: kick the rolled ball and run the bases.", "finish_reason": "stop"}
    with client:
        answers = []
        for prompt in ("Explain the rules of kickball.", "Describe a sunny afternoon in Lisbon."):
            d = _route(client, prompt)
            r = client.post("/v1/verify", json={"decision_id": d["decision_id"], "draft": draft})
            assert r.status_code == 200, r.text
            answers.append(r.json())
        on, off = answers
        assert on["verifier"].startswith("verifier-") and on["draft"]["opening_overlap"] == pytest.approx(4 / 12)
        assert off["draft"]["opening_overlap"] == 0.0 and on["p_bad"] < off["p_bad"]
        logged = client.app.state.runtime.outcome_log.verifications()
        assert [v["features"]["opening_overlap"] for v in logged] == [on["draft"]["opening_overlap"], 0.0]


def test_escalation_is_held_once_and_settled_by_the_one_outcome(tmp_path):
    client, engine = _app(tmp_path, store_drafts=True)
    with client:
        d = _route(client)
        did = d["decision_id"]
        r = client.post("/v1/verify", json={"decision_id": did, "draft": {"text": REFUSAL, "finish_reason": "stop"},
                                            "usage": {"completion_tokens": 11}})
        assert r.status_code == 200, r.text
        a = r.json()
        eid = a["escalation_id"]
        assert (a["action"], a["rule"], a["target"]) == ("escalate", "broken-draft", "frontier-small")
        assert eid.startswith(f"{did}/escalation.")  # signed with its own claims
        assert a["model"] and a["base_url"] and a["endpoints"] and a["estimated_cost_usd"] > 0
        assert a["draft"]["refusal"] is True and a["trace"]["rules"][-1]["rule"] == "broken-draft"
        held = engine.state.record(eid)
        assert held is not None and held.target == "frontier-small"  # the frontier call's hold, in flight
        assert engine.state.record(did) is None  # the draft settled at the verify
        out = client.post("/v1/outcomes", json={"decision_id": did, "status": "ok", "served_target": "frontier-small",
                                                "usage": {"prompt_tokens": 12, "completion_tokens": 300}})
        ack = out.json()["acks"][0]
        assert out.status_code == 200 and ack["status"] == "stored"
        assert ack["settlement"]["decision_id"] == eid
        assert ack["settlement"]["target"] == "frontier-small" and ack["settlement"]["replayed"] is False
        assert engine.state.record(eid) is None
        dup = client.post("/v1/outcomes", json={"decision_id": did, "status": "ok", "served_target": "frontier-small",
                                                "usage": {"prompt_tokens": 12, "completion_tokens": 300}}).json()
        assert dup["acks"][0]["status"] == "duplicate" and dup["acks"][0]["settlement"]["replayed"] is True
        # /metrics counts what the ledger booked: the draft settled at the verify, the escalation's
        # hold and the escalated call's settlement (the verify's were left out)
        spent = {t: _metric(client, "pointsman_budget_spend_usd_total", t) for t in ("onprem-8b", "frontier-small")}
        assert spent["onprem-8b"] > 0 and spent["onprem-8b"] == pytest.approx(a["draft_settlement"]["actual_cost_usd"])
        assert spent["frontier-small"] == pytest.approx(ack["settlement"]["actual_cost_usd"])
        assert _metric(client, "pointsman_budget_reserved_usd_total", "frontier-small") == \
            pytest.approx(a["estimated_cost_usd"])
    with OutcomeLog(tmp_path / "outcomes.db") as log:
        logged = log.decision(did)
        assert logged is not None and len(logged.outcomes) == 1
        v = log.verification(did)
        assert v is not None and v["action"] == "escalate" and v["escalation_target"] == "frontier-small"
        assert v["features"]["refusal"] is True and v["draft_text"] == REFUSAL


def test_a_cancelled_early_draft_is_paid_once_and_its_escalation_released_once(tmp_path):
    """Early verification through the app, with a budget ledger: the draft's first 16 tokens are
    verified (``partial``) and escalated; the verify books those tokens and releases the draft's hold
    and load; a longer prefix verified again changes nothing; the cancelled draft's own report is
    refused (it would book its tokens again and settle the escalation with them); the escalated call's
    outcome settles the escalation hold once, and a retry of it books nothing."""
    client, engine, spend = _budgeted_app(tmp_path)

    with client:
        d = client.post("/v1/route", json={"model": "auto", "messages": [{"role": "user", "content": "Explain kickball."}],
                                           "routing": {"tenant": "acme"}}).json()
        did = d["decision_id"]
        assert d["target"] == "onprem-8b" and spend() == (0.0, pytest.approx(d["estimated_cost_usd"], rel=1e-3))
        prefix = {"decision_id": did, "draft": {"text": REFUSAL[:24], "partial": True},
                  "usage": {"prompt_tokens": 12, "completion_tokens": 16}}
        a = client.post("/v1/verify", json=prefix).json()
        assert (a["action"], a["rule"], a["draft"]["partial"], a["draft"]["tokens"]) == ("escalate", "broken-draft", True, 16)
        draft_usd = a["draft_settlement"]["actual_cost_usd"]
        assert 0 < draft_usd and a["draft_settlement"]["released_load"] == 1
        eid = a["escalation_id"]
        assert engine.state.record(did) is None and engine.state.record(eid) is not None
        settled, held = spend()
        assert settled == pytest.approx(draft_usd, rel=1e-3) and held == pytest.approx(a["estimated_cost_usd"], rel=1e-3)
        longer = client.post("/v1/verify", json={**prefix, "draft": {"text": REFUSAL, "partial": True},
                                                 "usage": {"prompt_tokens": 12, "completion_tokens": 40}}).json()
        assert longer == {**a, "replayed": True} and spend() == (settled, held)
        draft_report = {"decision_id": did, "status": "cancelled", "served_target": "onprem-8b",
                        "usage": {"prompt_tokens": 12, "completion_tokens": 16}}
        r = client.post("/v1/outcomes", json=draft_report)
        assert r.status_code == 422 and "report the escalated call's outcome" in r.json()["error"]["message"]
        assert spend() == (settled, held) and engine.state.record(eid) is not None
        final = {"decision_id": did, "status": "ok", "served_target": "frontier-small",
                 "usage": {"prompt_tokens": 12, "completion_tokens": 300}}
        ack = client.post("/v1/outcomes", json=final).json()["acks"][0]
        assert ack["status"] == "stored" and ack["settlement"]["decision_id"] == eid
        assert ack["settlement"]["hold_state"] == "held" and ack["settlement"]["released_load"] == 1
        frontier_usd = ack["settlement"]["actual_cost_usd"]
        assert spend() == (pytest.approx(draft_usd + frontier_usd, rel=1e-3), 0.0)
        assert engine.state.record(eid) is None
        again = client.post("/v1/outcomes", json=final).json()["acks"][0]
        assert again["status"] == "duplicate" and again["settlement"]["replayed"] is True
        assert spend() == (pytest.approx(draft_usd + frontier_usd, rel=1e-3), 0.0)


def test_any_replica_settles_an_escalation_from_its_signed_id_and_refuses_a_forged_one(tmp_path):
    """Two replicas with one decision key and nothing else shared (their own data folders and
    ledgers): A routes, verifies and escalates; the escalated call's outcome, reported to B under
    the escalation id A answered, is stored as the decision's outcome and settles the escalation on
    its target there, once; the same outcome reported to A under the decision id is a duplicate.
    Escalation ids altered anywhere (claims, MAC, the decision id they carry) are 404 on B."""
    key = "one secret every replica shares"
    a_client, _ = _app(tmp_path / "a", decision_key=key)
    b_client, b_engine = _app(tmp_path / "b", decision_key=key)
    with a_client, b_client:
        did = _route(a_client)["decision_id"]
        v = a_client.post("/v1/verify", json={"decision_id": did, "draft": {"text": REFUSAL, "finish_reason": "stop"},
                                              "usage": {"completion_tokens": 11}}).json()
        eid = v["escalation_id"]
        assert v["action"] == "escalate" and eid.startswith(f"{did}/escalation.")
        claims = b_engine.state.claims(eid)
        assert claims is not None and (claims.target, claims.escalates) == (v["target"], did)
        assert claims.estimated_cost_usd == pytest.approx(v["estimated_cost_usd"])
        outcome = {"status": "ok", "served_target": v["target"], "usage": {"prompt_tokens": 12, "completion_tokens": 300}}
        head, claims_b64, mac = eid.rsplit(".", 2)
        other = _route(a_client)["decision_id"]
        for forged in (f"{head}.{claims_b64}.{'A' * len(mac)}",  # MAC replaced
                       f"{head}.{claims_b64[:-2]}xy.{mac}",  # claims altered
                       f"{other}/escalation.{claims_b64}.{mac}"):  # moved to another (genuine) decision
            r = b_client.post("/v1/outcomes", json={"decision_id": forged, **outcome})
            assert (r.status_code, r.json()["acks"][0]["status"]) == (404, "unknown_decision"), forged
        r = b_client.post("/v1/outcomes", json={"decision_id": eid, **outcome})
        ack = r.json()["acks"][0]
        assert r.status_code == 200 and (ack["status"], ack["decision_id"], ack["outcome_id"]) == ("stored", did, did)
        s = ack["settlement"]
        assert (s["decision_id"], s["target"], s["replayed"], s["hold_state"]) == (eid, v["target"], False, "unreserved")
        assert s["actual_cost_usd"] > 0
        again = b_client.post("/v1/outcomes", json={"decision_id": eid, **outcome}).json()["acks"][0]
        assert again["status"] == "duplicate" and again["settlement"]["replayed"] is True
        on_a = a_client.post("/v1/outcomes", json={"decision_id": did, **outcome}).json()["acks"][0]
        assert on_a["status"] == "stored" and on_a["settlement"]["decision_id"] == eid  # A settles its own hold
        did2 = _route(a_client)["decision_id"]  # an ok outcome without usage books the escalation's estimate
        v2 = a_client.post("/v1/verify", json={"decision_id": did2, "draft": {"text": REFUSAL, "finish_reason": "stop"},
                                               "usage": {"completion_tokens": 11}}).json()
        no_usage = b_client.post("/v1/outcomes", json={"decision_id": v2["escalation_id"], "status": "ok"}).json()
        s2 = no_usage["acks"][0]["settlement"]
        assert (s2["decision_id"], s2["target"]) == (v2["escalation_id"], v2["target"])
        assert s2["actual_cost_usd"] == pytest.approx(v2["estimated_cost_usd"])
    with OutcomeLog(tmp_path / "b" / "outcomes.db") as log:
        stored = log.outcome(did)
        assert stored is not None and stored.decision_id == did and stored.served_target == v["target"]
        assert log.counts()["outcomes"] == 2


def test_unknown_settled_and_expired_decisions(tmp_path):
    client, _ = _app(tmp_path, verify_ttl_s=3600)
    with client:
        r = client.post("/v1/verify", json={"decision_id": "0" * 32, "draft": {"text": "x"}})
        assert (r.status_code, r.json()["error"]["code"]) == (404, "unknown_decision")  # no id this service signed
        signed = _route(client)["decision_id"]
        forged = signed[:12] + "f" * 20 + signed[32:]  # another decision's claims and signature
        r = client.post("/v1/verify", json={"decision_id": forged, "draft": {"text": "x"}})
        assert (r.status_code, r.json()["error"]["code"]) == (404, "unknown_decision")
        d = _route(client)
        client.post("/v1/outcomes", json={"decision_id": d["decision_id"], "status": "ok"})
        r = client.post("/v1/verify", json={"decision_id": d["decision_id"], "draft": {"text": GOOD}})
        assert (r.status_code, r.json()["error"]["code"]) == (409, "decision_settled")
    client, _ = _app(tmp_path / "short", verify_ttl_s=1e-9)
    with client:
        d = _route(client)
        r = client.post("/v1/verify", json={"decision_id": d["decision_id"], "draft": {"text": GOOD}})
        assert (r.status_code, r.json()["error"]["code"]) == (410, "decision_expired")


_VALUE = st.one_of(st.none(), st.booleans(), st.integers(-10, 10**9), st.floats(allow_nan=False, allow_infinity=False),
                   st.text(max_size=30), st.lists(st.floats(-50, 5), max_size=5))


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    client, engine = _app(tmp_path_factory.mktemp("verify"))
    with client:
        yield client


@given(text=st.text(max_size=300), finish=_VALUE, logprobs=_VALUE, partial=_VALUE, usage=st.one_of(
    st.none(), st.dictionaries(st.sampled_from(["prompt_tokens", "completion_tokens", "cached_tokens", "x"]), _VALUE)),
    extra=st.dictionaries(st.sampled_from(["draft", "decision_id", "usage", "junk"]), _VALUE, max_size=1))
@settings(max_examples=40, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
def test_bad_or_odd_drafts_of_real_decisions_never_5xx(shared, text, finish, logprobs, partial, usage, extra):
    d = _route(shared)
    draft: dict[str, object] = {"text": text, "finish_reason": finish, "logprobs": logprobs, "partial": partial}
    body: dict[str, object] = {"decision_id": d["decision_id"], "draft": draft, "usage": usage, **extra}
    r = shared.post("/v1/verify", json=body)
    assert r.status_code in (200, 404, 410, 422), r.text
    if r.status_code == 422:
        assert r.json()["error"]["param"]
    if r.status_code == 200:
        assert r.json()["action"] in ("accept", "escalate")
        shared.post("/v1/outcomes", json={"decision_id": d["decision_id"], "status": "ok"})


def test_impossible_draft_usage_is_a_422_and_books_nothing(tmp_path):
    """The outcome path refuses usage beyond the serving target's context window (one gateway bug
    reporting 10^8 tokens must not book dollars against a tenant and lock it out); the verify settles the
    draft from its usage too, so it must refuse the same usage, before anything is decided or booked."""
    client, engine = _app(tmp_path)
    with client:
        d = _route(client)
        huge = {"prompt_tokens": 100_000_000, "completion_tokens": 100_000_000}
        r = client.post("/v1/verify", json={"decision_id": d["decision_id"], "draft": {"text": GOOD},
                                            "usage": huge})
        assert r.status_code == 422, r.text
        assert r.json()["error"]["param"] == "usage.prompt_tokens"
        assert engine.state.record(d["decision_id"]) is not None  # nothing settled: the draft is still in flight
        ok = client.post("/v1/verify", json={"decision_id": d["decision_id"], "draft": {"text": GOOD},
                                             "usage": {"prompt_tokens": 12, "completion_tokens": 120}})
        assert ok.status_code == 200 and ok.json()["draft_settlement"]["actual_cost_usd"] < 0.01


def test_n_answers_may_add_up_past_one_window_at_the_verify(tmp_path):
    """A request for ``n`` answers generates ``n`` sequences, each within the window; their sum need not be.
    ``n: 8, max_tokens: 20,000`` on onprem-8b (131,072-token window) reporting 150,000 completion tokens was
    refused 422 'impossible' at the verify (the draft then unsettled, its hold and load left); it is within the
    decision's own output cap and settles now. Beyond the cap it is still refused."""
    client, engine = _app(tmp_path)
    with client:
        body = {"model": "auto", "n": 8, "max_tokens": 20_000,
                "messages": [{"role": "user", "content": "Explain the rules of kickball."}]}
        d = client.post("/v1/route", json=body).json()
        assert engine.fleet.targets[d["target"]].context_window_tokens < 150_000
        over = client.post("/v1/verify", json={"decision_id": d["decision_id"], "draft": {"text": GOOD},
                                               "usage": {"prompt_tokens": 12, "completion_tokens": 200_000}})
        assert over.status_code == 422 and "impossible" in over.text, over.text
        ok = client.post("/v1/verify", json={"decision_id": d["decision_id"], "draft": {"text": GOOD},
                                             "usage": {"prompt_tokens": 12, "completion_tokens": 150_000}})
        assert ok.status_code == 200 and "actual_cost_usd" in ok.json()["draft_settlement"], ok.text


def test_cache_parts_beyond_the_prompt_are_a_422_not_an_unsettled_draft(tmp_path):
    """Usage whose cached tokens exceed the prompt cannot be priced: the verify answered 200 with a
    draft_settlement error and left the draft's hold and load in place, and a corrected verify only
    replayed that answer. It is a 422 naming the field now, and the corrected verify settles the draft."""
    client, engine = _app(tmp_path)
    with client:
        d = _route(client)
        bad = client.post("/v1/verify", json={"decision_id": d["decision_id"], "draft": {"text": GOOD},
                                              "usage": {"cached_tokens": 5000, "completion_tokens": 120}})
        assert bad.status_code == 422 and bad.json()["error"]["param"] == "usage.cached_tokens", bad.text
        ok = client.post("/v1/verify", json={"decision_id": d["decision_id"], "draft": {"text": GOOD},
                                             "usage": {"prompt_tokens": 12, "completion_tokens": 120}})
        assert ok.status_code == 200 and "actual_cost_usd" in ok.json()["draft_settlement"], ok.text
        assert engine.state.record(d["decision_id"]) is None


def test_the_cancelled_draft_reported_under_the_escalation_id_is_refused_on_any_replica(tmp_path):
    """The replica that verified refuses an outcome of an escalated decision served by the draft's target
    (the cancelled draft: the verify booked its tokens, and taking it as the one outcome would settle the
    frontier escalation at the on-prem price). Another replica, given the signed escalation id, took it:
    the escalation was booked as the draft's on-prem tokens and the frontier call's own outcome then only
    replayed. The escalation id names its decision, whose signed id names the draft's target: refused too."""
    key = "one secret every replica shares"
    a_client, _ = _app(tmp_path / "a", decision_key=key)
    b_client, _ = _app(tmp_path / "b", decision_key=key)
    with a_client, b_client:
        d = _route(a_client)
        v = a_client.post("/v1/verify", json={"decision_id": d["decision_id"], "draft": {"text": REFUSAL, "partial": True},
                                              "usage": {"completion_tokens": 11}}).json()
        assert v["action"] == "escalate" and v["target"] != d["target"]
        draft = {"decision_id": v["escalation_id"], "status": "cancelled", "served_target": d["target"],
                 "usage": {"prompt_tokens": 12, "completion_tokens": 11}}
        for client in (a_client, b_client):
            r = client.post("/v1/outcomes", json=draft)
            assert r.status_code == 422 and r.json()["error"]["param"] == "served_target", r.text
        ok = b_client.post("/v1/outcomes", json={**draft, "status": "ok", "served_target": v["target"],
                                                 "usage": {"prompt_tokens": 12, "completion_tokens": 300}})
        s = ok.json()["acks"][0]["settlement"]
        assert (s["target"], s["replayed"]) == (v["target"], False)


def test_an_escalated_call_reported_under_the_decision_id_to_another_replica_says_it_is_not_booked(tmp_path):
    """Two replicas sharing one ledger: A verifies and escalates (the draft is settled in the ledger),
    the escalated call's outcome reaches B under the decision id. B cannot know of the escalation, and
    the ledger already booked the decision on the draft's target: the ack says the frontier usage is not
    booked and how to report it, instead of a replayed settlement that looks done; reported under the
    escalation id it is booked once."""
    key = "one secret every replica shares"
    ledger = f"sqlite:///{tmp_path / 'shared-budget.db'}"
    a_client, _ = _app(tmp_path / "a", decision_key=key, budget_ledger=ledger)
    b_client, _ = _app(tmp_path / "b", decision_key=key, budget_ledger=ledger)
    with a_client, b_client:
        d = _route(a_client)
        v = a_client.post("/v1/verify", json={"decision_id": d["decision_id"], "usage": {"completion_tokens": 11},
                                              "draft": {"text": REFUSAL, "finish_reason": "stop"}}).json()
        assert v["action"] == "escalate" and v["target"] != d["target"]
        outcome = {"status": "ok", "served_target": v["target"], "usage": {"prompt_tokens": 12, "completion_tokens": 300}}
        ack = b_client.post("/v1/outcomes", json={"decision_id": d["decision_id"], **outcome}).json()["acks"][0]
        assert ack["status"] == "stored" and ack["settlement"]["replayed"] is True
        assert ack["settlement"]["target"] == d["target"]  # what the ledger booked, not this report
        assert "not booked" in ack["settle_error"] and "escalation_id" in ack["settle_error"]
        again = b_client.post("/v1/outcomes", json={"decision_id": v["escalation_id"], **outcome}).json()["acks"][0]
        assert again["status"] == "duplicate" and again["settle_error"] is None
        s = again["settlement"]
        assert (s["decision_id"], s["target"], s["replayed"]) == (v["escalation_id"], v["target"], False)
        assert s["actual_cost_usd"] > 0


def test_the_cancelled_draft_reported_to_the_other_worker_is_refused_and_the_escalation_booked_once(tmp_path):
    """Two workers of one ``serve`` (one data folder: outcome log, ledger, key). Worker A verifies and
    escalates; the cancelled draft's report reaches worker B under the decision id. B does not hold the
    verify in memory, but the outcome log it shares with A has it: before, B took the draft's report as
    the decision's one outcome, booked its on-prem tokens as the escalation (the draft's twice) and
    released its hold, and the frontier call's own outcome was then a 409 conflict that booked nothing.
    Now B refuses the draft's report as A does, and the escalated call's outcome books the escalation."""
    a_client, _ = _app(tmp_path / "svc")
    b_client, _ = _app(tmp_path / "svc")
    with a_client, b_client:
        d = _route(a_client)
        v = a_client.post("/v1/verify", json={"decision_id": d["decision_id"], "draft": {"text": REFUSAL, "partial": True},
                                              "usage": {"completion_tokens": 11}}).json()
        assert v["action"] == "escalate" and v["target"] != d["target"]
        draft = {"decision_id": d["decision_id"], "status": "cancelled", "served_target": d["target"], "ttft_ms": 40,
                 "usage": {"prompt_tokens": 12, "completion_tokens": 30}}
        r = b_client.post("/v1/outcomes", json=draft)
        assert r.status_code == 422 and r.json()["error"]["param"] == "served_target", r.text
        ok = b_client.post("/v1/outcomes", json={"decision_id": v["escalation_id"], "status": "ok",
                                                 "served_target": v["target"],
                                                 "usage": {"prompt_tokens": 12, "completion_tokens": 300}})
        ack = ok.json()["acks"][0]
        assert ok.status_code == 200 and ack["status"] == "stored", ok.text
        s = ack["settlement"]
        assert (s["decision_id"], s["target"], s["replayed"]) == (v["escalation_id"], v["target"], False)


def test_the_escalated_call_reported_to_the_other_worker_under_the_decision_id_settles_the_escalation(tmp_path):
    """Two workers of one ``serve`` (one data folder). Worker A verifies and escalates; the escalated call's
    outcome reaches worker B under the decision id. B does not hold the verify in memory: the shared
    outcome log's verification names the escalation,
    so B settles ``<decision_id>/escalation`` on the escalation's target, once."""
    a_client, _ = _app(tmp_path / "svc")
    b_client, _ = _app(tmp_path / "svc")
    with a_client, b_client:
        d = _route(a_client)
        v = a_client.post("/v1/verify", json={"decision_id": d["decision_id"], "draft": {"text": REFUSAL},
                                              "usage": {"completion_tokens": 11}}).json()
        assert v["action"] == "escalate" and v["target"] != d["target"]
        report = {"decision_id": d["decision_id"], "status": "ok", "served_target": v["target"],
                  "usage": {"prompt_tokens": 12, "completion_tokens": 300}}
        ack = b_client.post("/v1/outcomes", json=report).json()["acks"][0]
        assert ack["status"] == "stored" and ack["settle_error"] is None, ack
        s = ack["settlement"]
        assert (s["decision_id"], s["target"], s["replayed"]) == (v["escalation_id"], v["target"], False)
        again = b_client.post("/v1/outcomes", json=report).json()["acks"][0]
        assert again["status"] == "duplicate" and again["settlement"]["replayed"] is True


def test_an_escalation_never_falls_back_to_the_draft_s_own_target(tmp_path):
    """A verify rule escalating to frontier-large with the drafting onprem-8b among its fallbacks: the
    escalation listed onprem-8b as a fallback, and a gateway that took it (frontier-large down) reported
    an outcome served by onprem-8b, which is refused as the cancelled draft's (422): the escalation's hold
    stayed and the call went unbooked. With frontier-large over budget the escalation itself went to
    onprem-8b, and then the draft's own report settled it (the draft's tokens booked twice). The draft's
    target is now no candidate of an escalation away from it (policy/rules/verify.py)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "apiVersion: pointsman/v1\nkind: RoutingPolicy\nrules:\n"
        "  - name: default\n    route: {target: onprem-8b}\n"
        "verify:\n  rules:\n"
        "    - name: refusal\n      when: draft.refusal\n      action: escalate\n"
        "      escalate: {target: frontier-large, fallbacks: [onprem-8b, frontier-small]}\n"
        "    - name: accept\n      action: accept\n")
    budgets = tmp_path / "budgets.yaml"
    budgets.write_text("apiVersion: pointsman/v1\nkind: Budgets\nbudgets:\n"
                       "  - {scope: 'tenant:tight', window: day, limit_usd: 0.0001}\n")
    fleet = load_fleet()
    s = Settings(data_dir=tmp_path / "svc", policy_path=policy, watch_policy=False, watch_fleet=False,
                 scrape_interval_s=0, budgets_path=budgets)
    engine = RoutingEngine(fleet, load_policy(policy, fleet), FixedDifficulty(0.3), state=build_state(s, fleet))
    with TestClient(create_app(s, engine=engine, owns_engine=True)) as client:
        verdicts = []
        for tenant in ("acme", "tight"):
            d = client.post("/v1/route", json={"messages": [{"role": "user", "content": "Explain kickball."}],
                                               "routing": {"tenant": tenant}}).json()
            assert d["target"] == "onprem-8b"
            v = client.post("/v1/verify", json={"decision_id": d["decision_id"], "usage": {"completion_tokens": 11},
                                                "draft": {"text": REFUSAL, "finish_reason": "stop"}}).json()
            verdicts.append((v["action"], v["target"], [f["target"] for f in v["fallbacks"]]))
    # tight: frontier-large (~$0.0026 held) and frontier-small (~$0.00016) are over its $0.0001
    assert verdicts == [("escalate", "frontier-large", ["frontier-small"]), ("accept", None, [])]


def test_a_kept_whole_draft_after_an_escalation_is_its_outcome_and_releases_the_escalation(tmp_path):
    """The gateway's verify answer came too late (its timeout is shorter than a relayed or slow verify)
    and it kept the whole draft the verify had read: reported served by the draft's target, the outcome is
    stored as the decision's (the verify booked exactly that draft; nothing is booked again) and the unused
    escalation's budget hold and in-flight load are released at once, not left to the reservation TTL."""
    client, engine = _app(tmp_path)
    with client:
        d = _route(client)
        v = client.post("/v1/verify", json={"decision_id": d["decision_id"], "usage": {"completion_tokens": 11},
                                            "draft": {"text": REFUSAL, "finish_reason": "stop"}}).json()
        assert v["action"] == "escalate" and engine.state.record(v["escalation_id"]) is not None
        kept = {"decision_id": d["decision_id"], "status": "ok", "served_target": d["target"],
                "usage": {"prompt_tokens": 12, "completion_tokens": 11}}
        r = client.post("/v1/outcomes", json=kept)
        ack = r.json()["acks"][0]
        assert r.status_code == 200 and (ack["status"], ack["released"], ack["settlement"]) == ("stored", True, None)
        assert engine.state.record(v["escalation_id"]) is None
        spent = _metric(client, "pointsman_budget_spend_usd_total", d["target"])
        assert spent == pytest.approx(v["draft_settlement"]["actual_cost_usd"])  # the draft, booked once
    with OutcomeLog(tmp_path / "outcomes.db") as log:
        (stored,) = log.decision(d["decision_id"]).outcomes
        assert stored.served_target == d["target"]


def test_a_kept_draft_after_a_prefix_verify_is_paid_once_and_closes_the_escalation(tmp_path):
    """Early verification escalated on the draft's first 16 tokens, but the answer came after the
    gateway's timeout and it kept the draft (the client's behaviour): the draft's ``ok`` report is the
    decision's outcome. The verify booked the prompt and 16 tokens; the rest of the draft is booked under
    the escalation id on the draft's target, which settles the escalation's hold and load once: the spend
    is the draft's alone, nothing held, and the tokens beyond the prefix are what is booked (104 then 208
    of them cost 1 : 2). Before, the report was refused (422): the outcome was lost, the draft's tokens
    beyond the prefix went unbooked and the escalation held its frontier estimate until the TTL. A
    ``cancelled`` draft report is still refused, and an escalated call reported after the kept draft is
    not booked silently."""
    client, engine, spend = _budgeted_app(tmp_path)

    def early(completion: int) -> tuple[dict, dict, dict]:
        d = client.post("/v1/route", json={"model": "auto", "messages": [{"role": "user", "content": "Explain kickball."}],
                                           "routing": {"tenant": "acme"}}).json()
        v = client.post("/v1/verify", json={"decision_id": d["decision_id"], "draft": {"text": REFUSAL[:24], "partial": True},
                                            "usage": {"prompt_tokens": 12, "completion_tokens": 16}}).json()
        assert v["action"] == "escalate" and v["draft"]["tokens"] == 16 and v["target"] != d["target"]
        kept = {"decision_id": d["decision_id"], "status": "ok", "served_target": d["target"],
                "usage": {"prompt_tokens": 12, "completion_tokens": completion}}
        r = client.post("/v1/outcomes", json=kept)
        assert r.status_code == 200, r.text
        return d, v, r.json()["acks"][0]

    with client:
        before = spend()[0]
        d, v, ack = early(120)
        s = ack["settlement"]
        assert ack["status"] == "stored" and ack["settle_error"] is None
        assert (s["decision_id"], s["target"], s["replayed"], s["released_load"]) == (v["escalation_id"], d["target"],
                                                                                      False, 1)
        assert engine.state.record(v["escalation_id"]) is None
        draft_usd = v["draft_settlement"]["actual_cost_usd"]
        rest_104 = s["actual_cost_usd"]
        assert rest_104 > 0 and spend() == (pytest.approx(before + draft_usd + rest_104, abs=3e-9), 0.0)
        late = client.post("/v1/outcomes", json={"decision_id": v["escalation_id"], "status": "ok",
                                                 "served_target": v["target"],
                                                 "usage": {"prompt_tokens": 12, "completion_tokens": 300}})
        assert late.status_code == 409 and late.json()["acks"][0]["status"] == "conflict", late.text
        assert spend() == (pytest.approx(before + draft_usd + rest_104, abs=3e-9), 0.0)
        _, _, ack2 = early(224)
        assert ack2["settlement"]["actual_cost_usd"] == pytest.approx(2 * rest_104, rel=1e-6)
        d3 = client.post("/v1/route", json={"model": "auto", "messages": [{"role": "user", "content": "Explain kickball."}],
                                            "routing": {"tenant": "acme"}}).json()
        v3 = client.post("/v1/verify", json={"decision_id": d3["decision_id"], "draft": {"text": REFUSAL[:24], "partial": True},
                                             "usage": {"prompt_tokens": 12, "completion_tokens": 16}}).json()
        cancelled = client.post("/v1/outcomes", json={"decision_id": d3["decision_id"], "status": "cancelled",
                                                      "served_target": d3["target"],
                                                      "usage": {"prompt_tokens": 12, "completion_tokens": 16}})
        assert cancelled.status_code == 422 and cancelled.json()["error"]["param"] == "served_target"
        assert engine.state.record(v3["escalation_id"]) is not None


@pytest.mark.parametrize("filler, codes", [("x", [410, 200, 200]), ("\N{GRINNING FACE}", [410, 410, 200])],
                         ids=["ascii", "emoji"])
def test_the_request_text_held_for_verification_is_bounded(tmp_path, filler, codes):
    """``POINTSMAN_VERIFY_MAX_PENDING_BYTES``: a decision is held with its request view until verified or
    expired; with long prompts 100,000 held decisions would be tens of GB. Past the cap the oldest are
    forgotten (410: the gateway keeps its draft), the newest still verify. The cap is bytes, not characters:
    1,000 emoji hold about 8 KB (4 bytes each as a ``str`` and in UTF-8), 1,000 ASCII letters about 2 KB
    (before, a cap in characters let an emoji-laden prompt hold four times what it allowed)."""
    client, _ = _app(tmp_path, verify_max_pending_bytes=5000)
    with client:
        ids = [_route(client, f"Explain the rules of kickball, variant {i}. " + filler * 1000)["decision_id"]
               for i in range(3)]
        got = [client.post("/v1/verify", json={"decision_id": i, "draft": {"text": GOOD, "finish_reason": "stop"},
                                               "usage": {"completion_tokens": 20}}).status_code for i in ids]
    assert got == codes


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(adds=st.lists(st.tuples(st.text(st.sampled_from("qé中\N{GRINNING FACE}"), min_size=1, max_size=400),
                               st.floats(0, 50)), min_size=1, max_size=40),
       max_entries=st.integers(1, 8), max_bytes=st.integers(1, 6000))
def test_pending_drafts_forget_the_oldest_first_within_every_bound(adds, max_entries, max_bytes):
    """Over any sequence of decisions (request text length, seconds since the previous one): after each
    add the held decisions are the newest ones (a suffix, in order), the one just added among them, and
    unless it is alone, they fit ``max_entries`` and ``max_bytes`` (each text's ``str`` and UTF-8 sizes) and
    none is older than the TTL."""
    from pointsman.policy.decision import Decision
    from pointsman.request import RequestView, parse_route_request
    from pointsman.service.cascade import PendingDrafts

    ttl = 60.0
    pending = PendingDrafts(ttl, max_entries, max_bytes)
    now, made, sizes = 0.0, [], []
    for i, (text, gap) in enumerate(adds):
        now += gap
        view = RequestView.of(parse_route_request({"messages": [{"role": "user", "content": text}]}))
        decision = Decision(f"d{i}", "t", "m", "", "aggregated", (), (), 0.0, "r", None, False, 1, "", "", "", {},
                            request_view=view)
        pending.add(decision, now)
        made.append(now)
        sizes.append(sys.getsizeof(text) + len(text.encode("utf-8")))
        held = [j for j in range(i + 1) if pending.get(f"d{j}", now) is not None]
        assert held == list(range(i + 1 - len(held), i + 1)) and held[-1] == i
        if len(held) > 1:
            assert len(held) <= max_entries and sum(sizes[j] for j in held) <= max_bytes
            assert all(now - made[j] <= ttl for j in held)
        assert len(pending) == len(held)


def test_a_kept_draft_without_usage_books_its_output_estimate_beyond_the_prefix(tmp_path):
    """A kept draft reported ``ok`` without usage (its answer ran; the gateway lost the usage chunk) books
    the decision's output estimate beyond the verified prefix, as any ok outcome without usage books its
    estimate (``estimate_booking``). Without ``max_tokens`` that estimate is the target's default output
    tokens: before, the kept draft booked the cap alone, 0 - 16 -> 0 tokens, so the draft cost only its
    verified prefix ($6.7e-07 of an $8.3e-06 estimate) while the ack looked settled."""
    budgets = tmp_path / "budgets.yaml"
    tmp_path.mkdir(parents=True, exist_ok=True)
    budgets.write_text("apiVersion: pointsman/v1\nkind: Budgets\nbudgets:\n"
                       "  - {scope: 'tenant:acme', window: day, limit_usd: 100}\n")
    client, engine = _app(tmp_path / "svc", budgets_path=budgets)

    def kept(extra: dict) -> tuple[dict, dict]:
        d = client.post("/v1/route", json={"model": "auto", "messages": [{"role": "user", "content": "Explain kickball."}],
                                           "routing": {"tenant": "acme"}, **extra}).json()
        v = client.post("/v1/verify", json={"decision_id": d["decision_id"], "draft": {"text": REFUSAL[:24], "partial": True},
                                            "usage": {"prompt_tokens": 12, "completion_tokens": 16}}).json()
        assert v["action"] == "escalate" and v["draft"]["tokens"] == 16
        r = client.post("/v1/outcomes", json={"decision_id": d["decision_id"], "status": "ok",
                                              "served_target": d["target"]})
        assert r.status_code == 200, r.text
        return d, r.json()["acks"][0]["settlement"]

    with client:
        d, s = kept({})
        assert s["target"] == d["target"] and engine.state.record(s["decision_id"]) is None
        default = engine.fleet.output_tokens(d["target"], None)
        _, capped = kept({"max_tokens": default})  # the same output estimate, stated by the client
        assert capped["actual_cost_usd"] > 0
        assert s["actual_cost_usd"] == pytest.approx(capped["actual_cost_usd"], rel=1e-9)
        held = client.get("/v1/budgets").json()["budgets"][0]["held_usd"]
        assert held == 0.0


def test_a_draft_a_fallback_wrote_is_priced_and_judged_as_that_target_s(tmp_path):
    """The decision's onprem-8b failed and its fallback frontier-small answered: the gateway verifies that
    draft naming ``served_target`` (as it names it in the outcome). A frontier answer is never escalated
    (the policy's ``frontier-draft`` rule), the verify books it at frontier-small's list prices, and the
    gateway's outcome for it finds it booked on its own target. Before, verify had no ``served_target``
    (422): a draft verified without it was settled at onprem-8b's GPU price, its outcome then booked nothing
    ('already settled on onprem-8b', the frontier bill lost), and a refused frontier-small draft escalated
    to frontier-small itself."""
    client, _, spend = _budgeted_app(tmp_path)
    with client:
        r = client.post("/v1/route", json={"model": "auto", "messages": [{"role": "user", "content": "Rules of kickball?"}],
                                           "routing": {"tenant": "acme"}})
        d = r.json()
        assert d["target"] == "onprem-8b" and "frontier-small" in [f["target"] for f in d["fallbacks"]]
        usage = {"prompt_tokens": 1000, "completion_tokens": 200}
        bill = (1000 * 0.15 + 200 * 0.60) / 1e6  # frontier-small's list prices, USD per 1M tokens
        v = client.post("/v1/verify", json={"decision_id": d["decision_id"], "served_target": "frontier-small",
                                            "draft": {"text": REFUSAL, "finish_reason": "stop"}, "usage": usage})
        assert v.status_code == 200, v.text
        answer = v.json()
        assert (answer["action"], answer["rule"]) == ("accept", "frontier-draft")  # before: escalated to itself
        assert answer["draft_settlement"]["target"] == "frontier-small"
        assert answer["draft_settlement"]["actual_cost_usd"] == pytest.approx(bill)
        o = client.post("/v1/outcomes", json={"decision_id": d["decision_id"], "served_target": "frontier-small",
                                              "usage": usage})
        (ack,) = o.json()["acks"]
        assert ack["status"] == "stored" and ack["settle_error"] is None, ack
        assert spend() == (pytest.approx(bill), 0.0)  # the frontier bill, once
        unknown = client.post("/v1/verify", json={"decision_id": _route(client)["decision_id"], "usage": usage,
                                                  "served_target": "frontier-smal", "draft": {"text": GOOD}})
        assert unknown.status_code == 422 and unknown.json()["error"]["param"] == "served_target"
        assert "did you mean 'frontier-small'" in unknown.json()["error"]["message"]


def test_a_kept_draft_a_fallback_wrote_after_an_escalation_is_booked_once(tmp_path):
    """The decision's onprem-8b was unavailable and its fallback onprem-70b drafted; the verify (naming it) escalated
    the draft, but its answer came after the gateway's timeout and the gateway kept the draft, reporting it served by
    onprem-70b. That outcome is the draft's, which the verify booked: the escalation is released and nothing is
    booked again. Before, the draft's target was taken to be the decision's (onprem-8b), so the report read as the
    escalated call's and the draft's tokens were booked a second time under the escalation."""
    client, _, spend = _budgeted_app(tmp_path)
    with client:
        d = client.post("/v1/route", json={"model": "auto", "messages": [{"role": "user", "content": "Rules of kickball?"}],
                                           "routing": {"tenant": "acme"}}).json()
        assert d["target"] == "onprem-8b" and "onprem-70b" in [f["target"] for f in d["fallbacks"]]
        usage = {"prompt_tokens": 12, "completion_tokens": 11}
        v = client.post("/v1/verify", json={"decision_id": d["decision_id"], "served_target": "onprem-70b", "usage": usage,
                                            "draft": {"text": REFUSAL, "finish_reason": "stop"}}).json()
        assert v["action"] == "escalate" and v["draft_settlement"]["target"] == "onprem-70b", v
        kept = {"decision_id": d["decision_id"], "status": "ok", "served_target": "onprem-70b", "usage": usage}
        ack = client.post("/v1/outcomes", json=kept).json()["acks"][0]
        assert (ack["status"], ack["released"], ack["settlement"]) == ("stored", True, None), ack
        assert spend() == (pytest.approx(v["draft_settlement"]["actual_cost_usd"], abs=1e-9), 0.0)  # before: twice


def test_a_decision_of_a_policy_without_a_verify_section_is_not_called_expired(tmp_path):
    """A policy without a ``verify`` section holds no decision for verification (its drafts stand). A gateway
    verifying such a decision a moment after it was made (its ``verify_prefix_tokens`` null reads as 'verify the
    whole draft') was told 410 ``decision_expired``, 'verify within 600 s, on the replica that made it': untrue
    on both counts. Now the 410 says why (``no_verify_section``) and the outcome settles the draft as usual."""
    policy = tmp_path / "no-verify.yaml"
    text = STATIC_POLICY_PATH.read_text()
    policy.write_text(text[:text.index("\nverify:")] + "\n")
    client, _ = _app(tmp_path / "svc")
    with client:
        client.app.state.runtime.settings.policy_path.write_text(policy.read_text())
        assert client.post("/v1/policy/reload").status_code == 200
        d = _route(client)
        assert d["verify_prefix_tokens"] is None
        r = client.post("/v1/verify", json={"decision_id": d["decision_id"], "draft": {"text": GOOD}})
        error = r.json()["error"]
        assert (r.status_code, error["code"]) == (410, "no_verify_section"), error  # before: decision_expired
        assert "has no verify section" in error["message"] and "within" not in error["message"]
        o = client.post("/v1/outcomes", json={"decision_id": d["decision_id"],
                                              "usage": {"prompt_tokens": 10, "completion_tokens": 20}})
        assert o.json()["acks"][0]["settlement"]["target"] == "onprem-8b"


def test_a_verify_trace_names_the_signals_its_rules_read(tmp_path):
    """``/v1/verify``'s trace had the rules' results but no ``signals`` section, so an escalation (or an accept)
    could not be explained from its answer as a route can: which draft and route signals the rules read, and their
    values. Now ``signals`` gives every signal of the verify rules evaluated, ``{value, age_s}``, as a route's does."""
    client, _ = _app(tmp_path)
    with client:
        d, good = _route(client), _route(client, "Explain the rules of kickball, please.")
        bad = client.post("/v1/verify", json={"decision_id": d["decision_id"],
                                              "draft": {"text": REFUSAL, "finish_reason": "stop"}}).json()
        ok = client.post("/v1/verify", json={"decision_id": good["decision_id"],
                                             "draft": {"text": GOOD, "finish_reason": "stop"}}).json()
    assert (bad["action"], bad["rule"]) == ("escalate", "broken-draft")
    assert bad["trace"]["signals"] == {
        "draft.on_prem": {"value": True, "age_s": 0.0}, "draft.empty": {"value": False, "age_s": 0.0},
        "draft.truncated": {"value": False, "age_s": 0.0}, "draft.partial": {"value": False, "age_s": 0.0},
        "draft.repetition": {"value": bad["draft"]["repetition"], "age_s": 0.0},
        "draft.refusal": {"value": True, "age_s": 0.0}}
    assert (ok["action"], ok["rule"]) == ("accept", "accept")
    signals = ok["trace"]["signals"]  # every rule evaluated: the doubtful-draft rule's budget signal too
    assert signals["draft.p_bad"]["value"] == ok["p_bad"] and signals["draft.refusal"]["value"] is False
    assert set(signals) > {"draft.p_bad", "budget.pace_gap"}, signals  # no budget: its pace_gap reads 0.0
    assert signals["budget.pace_gap"] == {"value": 0.0, "age_s": 0.0}, signals
