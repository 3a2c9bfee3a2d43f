"""Tied endpoints share picks evenly over HTTP whatever the traffic to other pools: short prompts (onprem-8b's
two idle replicas) alternating with medium ones (onprem-70b), each settled before the next. Before, ties took
turns by the count of every decision, so all 20 short prompts went to llama-8b-0."""

from collections import Counter

from fastapi.testclient import TestClient

from pointsman.estimator.estimate import FixedDifficulty
from pointsman.policy.engine import RoutingEngine
from pointsman.policy.fleet import load_fleet
from pointsman.policy.rules.compiler import STATIC_POLICY_PATH, load_policy
from pointsman.service.app import create_app
from pointsman.service.bootstrap import build_state
from pointsman.service.settings import Settings

MEDIUM = " ".join(f"Sentence {i} of a medium-sized prompt about routing requests to replicas." for i in range(60))


def test_interleaved_traffic_does_not_pin_tied_endpoints(tmp_path):
    fleet = load_fleet()
    settings = Settings(data_dir=tmp_path, watch_policy=False, watch_fleet=False, scrape_interval_s=0)
    engine = RoutingEngine(fleet, load_policy(STATIC_POLICY_PATH, fleet), FixedDifficulty(0.1),
                           state=build_state(settings, fleet))
    picks: Counter[str] = Counter()
    with TestClient(create_app(settings, engine=engine, owns_engine=True)) as c:
        for i in range(40):
            content = f"Say hi {i}." if i % 2 == 0 else f"{MEDIUM} {i}"
            d = c.post("/v1/route", json={"messages": [{"role": "user", "content": content}], "max_tokens": 20}).json()
            assert (d["target"] == "onprem-8b") == (i % 2 == 0)
            if d["target"] == "onprem-8b":
                picks[d["endpoints"][0]["name"]] += 1
            r = c.post("/v1/outcomes", json={"decision_id": d["decision_id"], "usage": {"prompt_tokens": 10,
                                                                                       "completion_tokens": 5}})
            assert r.status_code == 200, r.text
    assert picks == {"llama-8b-0": 10, "llama-8b-1": 10}
