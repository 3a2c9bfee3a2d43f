"""A disaggregated request's prompt is prefill work on its prefill endpoint only, over HTTP (default fleet and
policy): its decode endpoint decodes it after the KV transfer. Before, the decode endpoint was also counted the
prompt's tokens as prefill queued there: after one 11,412-token request (decode-0) and six of 664 tokens (two on
each other decode endpoint), decode-0 read a 0.96 s queue, so the next request went to an endpoint decoding
two requests instead of decode-0, decoding one. Each decode pick now goes to a least-loaded decode endpoint."""

from fastapi.testclient import TestClient

from pointsman.estimator.estimate import FixedDifficulty
from pointsman.policy.engine import RoutingEngine
from pointsman.policy.fleet import load_fleet
from pointsman.policy.rules.compiler import DEFAULT_POLICY_PATH, load_policy
from pointsman.service.app import create_app
from pointsman.service.bootstrap import build_state
from pointsman.service.settings import Settings


def test_a_decode_endpoint_queues_no_prefill_for_disaggregated_requests(tmp_path):
    fleet = load_fleet()
    settings = Settings(data_dir=tmp_path, watch_policy=False, watch_fleet=False, scrape_interval_s=0)
    engine = RoutingEngine(fleet, load_policy(DEFAULT_POLICY_PATH, fleet), FixedDifficulty(0.3),
                           state=build_state(settings, fleet))

    def route(c: TestClient, words: int, i: int) -> dict:
        text = f"doc {i} " + " ".join(f"w{i}x{j}" for j in range(words))
        r = c.post("/v1/route", json={"messages": [{"role": "user", "content": text}], "max_tokens": 200,
                                      "routing": {"explain": True}})
        assert r.status_code == 200, r.text
        d = r.json()
        assert (d["target"], d["mode"]) == ("onprem-70b", "disaggregated")
        return d

    with TestClient(create_app(settings, engine=engine, owns_engine=True)) as c:
        queued = []
        for i, words in enumerate([2170] + [140] * 7):
            d = route(c, words, i)
            pick = next(p for p in d["trace"]["endpoints"] if p["role"] == "decode")
            chosen = next(e["name"] for e in d["endpoints"] if e["role"] == "decode")
            outstanding = {x["endpoint"]: x["outstanding_requests"] for x in pick["candidates"]}
            assert outstanding[chosen] == min(outstanding.values()), (i, chosen, outstanding)
            queued += [x["queue"] for x in pick["candidates"]]
    assert set(queued) == {0}  # no prefill is queued on a decode endpoint
