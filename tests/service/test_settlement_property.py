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
