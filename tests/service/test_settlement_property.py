"""Settlement is conserved (issue 22 invariant), as a property through the app with its budget ledger
on a real redis-server: whatever retries of the same outcome a gateway sends (one item or in a
batch, the same content again, or another content for the same decision), the spend the ledger
books for the tenant equals the sum of the settlements the service acknowledged as new (not
``replayed``), and no decision stays in flight or keeps a hold. The multi-replica and fault side is
``tests/service`` of the durability work."""

from __future__ import annotations

import uuid

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pointsman.estimator.estimate import FixedDifficulty
from pointsman.policy.engine import RoutingEngine
from pointsman.policy.fleet import load_fleet
from pointsman.policy.rules.compiler import STATIC_POLICY_PATH, load_policy
from pointsman.service.app import create_app
from pointsman.service.bootstrap import build_state
from pointsman.service.settings import Settings

TENANT = "conserve"


@pytest.fixture(scope="module")
def client(tmp_path_factory, redis_url):
    data = tmp_path_factory.mktemp("conserve")
    budgets = data / "budgets.yaml"
    budgets.write_text("apiVersion: pointsman/v1\nkind: Budgets\nbudgets:\n"
                       f"  - {{scope: 'tenant:{TENANT}', window: day, limit_usd: 1000000}}\n", encoding="utf-8")
    db = int(uuid.uuid4().int % 15) + 1
    settings = Settings(data_dir=data, watch_policy=False, watch_fleet=False, scrape_interval_s=0,
                        budgets_path=budgets, budget_ledger=redis_url.rsplit("/", 1)[0] + f"/{db}")
    fleet = load_fleet()
    engine = RoutingEngine(fleet, load_policy(STATIC_POLICY_PATH, fleet), FixedDifficulty(0.1),
                           state=build_state(settings, fleet))
    with TestClient(create_app(settings, engine=engine, owns_engine=True)) as c:
        yield c


def settled_usd(c: TestClient) -> float:
    budgets = c.get("/v1/budgets").json()["budgets"]
    return next(b["settled_usd"] for b in budgets if b["scope"] == f"tenant:{TENANT}")


USAGE = st.fixed_dictionaries({"prompt_tokens": st.integers(1, 5000), "completion_tokens": st.integers(1, 2000)})
#: One decision's outcome posts: each a usage (None: the first one's again), an outcome id, batch or not.
POSTS = st.lists(st.tuples(st.none() | USAGE, st.sampled_from(["o1", "o2", None]), st.booleans()),
                 min_size=1, max_size=4)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(decisions=st.lists(st.tuples(USAGE, POSTS), min_size=1, max_size=4))
def test_booked_spend_equals_the_acknowledged_settlements_across_retries(client, decisions):
    state = client.app.state.fleet_state
    before, acked, ids = settled_usd(client), 0.0, []
    for first, posts in decisions:
        d = client.post("/v1/route", json={"messages": [{"role": "user", "content": "Summarise the plot of Hamlet."}],
                                           "routing": {"tenant": TENANT}}).json()
        ids.append(d["decision_id"])
        for usage, outcome_id, batch in posts:
            item = {"decision_id": d["decision_id"], "usage": usage or first,
                    **({"outcome_id": f"{d['decision_id']}-{outcome_id}"} if outcome_id else {})}
            r = client.post("/v1/outcomes", json=[item] if batch else item)
            assert r.status_code in (200, 409), r.text
            for ack in r.json()["acks"]:
                s = ack["settlement"]
                if s is not None and not s["replayed"]:
                    acked += s["actual_cost_usd"]
    assert settled_usd(client) - before == pytest.approx(acked, abs=1e-8 * len(decisions))
    assert all(state.record(i) is None for i in ids)  # nothing in flight, no hold
    assert client.get("/v1/budgets").json()["budgets"][0]["held_usd"] == pytest.approx(0.0, abs=1e-12)


#: ext_proc's outcome records: ("record", k) stores and settles decision k's outcome as ext_proc does;
#: ("kill", k) stores it and dies before settling (what a SIGKILL between the two leaves in the outcome log);
#: ("restart",) is a service starting again on the data folder (it settles what the log keeps unsettled).
EXT_PROC_STEP = st.one_of(st.tuples(st.sampled_from(["record", "kill"]), st.integers(0, 3)), st.tuples(st.just("restart")))


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(EXT_PROC_STEP, min_size=1, max_size=12))
def test_ext_proc_outcomes_are_booked_once_across_kills_between_store_and_settle(client, steps):
    """Whatever the order of recorded outcomes, outcomes stored by a process killed before settling them, and
    restarts, once a restart has run every stored outcome's decision is booked exactly once, and nothing is
    left unsettled in the outcome log or held."""
    from pointsman.outcome import parse_outcomes
    from pointsman.service.routes_reports import settle_unsettled, store_outcomes

    rt = client.app.state.runtime
    body = {"messages": [{"role": "user", "content": "Summarise the plot of Hamlet."}], "routing": {"tenant": TENANT}}
    decisions = [client.post("/v1/route", json=body).json() for _ in range(4)]
    usage = {"prompt_tokens": 120, "completion_tokens": 30}
    items = [parse_outcomes({"decision_id": d["decision_id"], "outcome_id": f"{d['decision_id']}-x", "status": "ok",
                             "usage": usage})[0] for d in decisions]
    before, reported = settled_usd(client), set()
    for step in [*steps, ("restart",)]:
        if step[0] == "record":
            store_outcomes(rt, [items[step[1]]], unsettled=True)
        elif step[0] == "kill":
            rt.outcome_log.append_outcomes([items[step[1]]], known={items[step[1]].decision_id: decisions[0]["target"]},
                                           unsettled=True)
        else:
            assert settle_unsettled(rt) == 0
        if step[0] != "restart":
            reported.add(step[1])
    ref = client.post("/v1/route", json=body).json()  # the cost of one outcome: a reference decision settled once
    (ack,) = client.post("/v1/outcomes", json={"decision_id": ref["decision_id"], "usage": usage}).json()["acks"]
    cost = ack["settlement"]["actual_cost_usd"]
    assert all(d["target"] == ref["target"] for d in decisions)
    assert settled_usd(client) - before == pytest.approx(cost * (len(reported) + 1), abs=1e-9 * (len(reported) + 1))
    assert rt.outcome_log.unsettled_outcomes() == []
    for i in set(range(4)) - reported:  # never reported: release their holds for the next example
        client.app.state.fleet_state.release(decisions[i]["decision_id"])
    assert client.get("/v1/budgets").json()["budgets"][0]["held_usd"] == pytest.approx(0.0, abs=1e-12)


def test_an_unsettled_outcome_nothing_can_settle_is_dropped_not_retried_forever(client):
    """An outcome kept unsettled that the resend refuses for good (served by a target the fleet no longer has: a
    reload removed it before the restart) is dropped from the unsettled outcomes, so the replay loop stops (before:
    kept, and resent every second for ever)."""
    from pointsman.outcome import parse_outcomes
    from pointsman.service.routes_reports import settle_unsettled

    rt = client.app.state.runtime
    item = parse_outcomes({"decision_id": uuid.uuid4().hex, "status": "ok", "served_target": "removed-by-a-reload",
                           "usage": {"prompt_tokens": 10, "completion_tokens": 5}})[0]
    (ack,) = rt.outcome_log.append_outcomes([item], known={item.decision_id: "onprem-8b"}, unsettled=True)
    assert ack.status == "stored"  # (the service's replay loop may take it first: the same call)
    assert settle_unsettled(rt) == 0
    assert rt.outcome_log.unsettled_outcomes() == []
