"""On-prem requests are priced at the utilization of the pools they ran on, over HTTP against a real
``pointsman serve``: an aggregated request prefilled locally on a decode endpoint (the default policy's
``short_prompts_on_decode``) at the decode pool's, and an outcome served by another on-prem target than
the decision's at that target's (the fleet's assumed utilization without telemetry), never at the
pools of the decision's target."""

from __future__ import annotations

import httpx
import pytest

from pointsman.policy.cost import estimate_cost, usage_cost
from pointsman.policy.fleet import load_fleet

PROMPT = {"model": "auto", "max_tokens": 50,
          "messages": [{"role": "user", "content": "hi there, what is the capital of France?"}]}


@pytest.fixture(scope="module")
def base(serve_module, tmp_path_factory) -> str:
    """A service whose 70B aggregated endpoints report a 20% utilization and a short queue, its decode
    endpoints 60% and none: a short prompt runs on a decode endpoint."""
    _, url = serve_module(tmp_path_factory.mktemp("data"))
    loads = [(f"llama-70b-{i}", {"prefill_utilization": 0.2, "decode_utilization": 0.2,
                                 "num_requests_waiting": 10, "num_requests_running": 10}) for i in range(2)]
    loads += [(f"llama-70b-decode-{i}", {"prefill_utilization": 0.6, "decode_utilization": 0.6,
                                         "num_requests_waiting": 0, "num_requests_running": 0}) for i in range(4)]
    r = httpx.post(f"{url}/v1/telemetry", json=[{"endpoint": e, "load": load} for e, load in loads])
    assert r.status_code == 200, r.text
    return url


def _outcome(url: str, decision_id: str, **fields: object) -> float:
    r = httpx.post(f"{url}/v1/outcomes", json={"decision_id": decision_id, "status": "ok",
                                               "usage": {"prompt_tokens": 14, "completion_tokens": 50}, **fields})
    assert r.status_code == 200, r.text
    return float(r.json()["acks"][0]["settlement"]["actual_cost_usd"])


def test_a_request_on_a_decode_endpoint_is_priced_at_the_decode_pools_utilization(base):
    """Before: estimated and booked at the aggregated pool's 20% (3x the rent per token of the decode
    pool's 60%, where it ran): $0.0000608 for 14 + 50 tokens."""
    fleet = load_fleet()
    t = fleet.targets["onprem-70b"]
    d = httpx.post(f"{base}/v1/route", json={**PROMPT, "routing": {"explain": True}}).json()
    assert (d["target"], d["mode"]) == ("onprem-70b", "aggregated"), d
    assert d["endpoints"][0]["name"].startswith("llama-70b-decode-"), d["endpoints"]
    cost = d["trace"]["cost"]
    assert (cost["prefill_utilization"], cost["decode_utilization"]) == (0.6, 0.6)  # before: 0.2, 0.2
    pools = (t.pools.decode, t.pools.decode)
    want = estimate_cost("onprem-70b", t, "aggregated", d["prompt_tokens"], 50, utilization=0.6, pools=pools).usd
    assert d["estimated_cost_usd"] == pytest.approx(want, rel=1e-9)
    booked = _outcome(base, d["decision_id"])
    assert booked == pytest.approx(usage_cost("onprem-70b", t, "aggregated", prompt_tokens=14, completion_tokens=50,
                                              prefill_utilization=0.6, decode_utilization=0.6, pools=pools).usd,
                                   rel=1e-6)


def test_an_outcome_served_by_another_on_prem_target_is_priced_at_its_utilization(base):
    """A gateway fell back from the 70B model to the 8B one, whose endpoints report 25% utilization. Before: the
    8B usage was priced at the utilization the decision's estimate used for the 70B pools (20% here), and then at
    the fleet's assumed utilization (1.0) whatever the 8B pool reported: $0.0000225 against $0.0000869 at its 25%
    (found by a new-user tester)."""
    fleet = load_fleet()
    d = httpx.post(f"{base}/v1/route", json=PROMPT).json()
    assert d["target"] == "onprem-70b", d
    r = httpx.post(f"{base}/v1/telemetry", json=[{"endpoint": f"llama-8b-{i}", "load": {
        "prefill_utilization": 0.25, "decode_utilization": 0.25}} for i in range(2)])
    assert r.status_code == 200, r.text
    booked = _outcome(base, d["decision_id"], served_target="onprem-8b")
    want = usage_cost("onprem-8b", fleet.targets["onprem-8b"], "aggregated", prompt_tokens=14, completion_tokens=50,
                      prefill_utilization=0.25, decode_utilization=0.25).usd
    assert booked == pytest.approx(want, rel=1e-6)


def test_an_ok_outcome_without_usage_on_another_target_books_it_at_the_assumed_utilization(tmp_path):
    """An ok outcome without usage served by another on-prem target books the larger of the decision's
    estimate and the request priced on the target that served it (``estimate_booking``), the latter at
    the fleet's ``assumed_utilization`` like any usage priced there (``FleetState._price``). Before, it was
    priced at full utilization: with ``assumed_utilization: 0.25`` a fallback to the 70B model booked the
    8B decision's estimate, a quarter of what its GPU time costs at the fleet's own assumption."""
    import yaml

    from pointsman.policy.fleet import DEFAULT_FLEET_PATH
    from tests.service.conftest import static_policy_client

    spec = yaml.safe_load(DEFAULT_FLEET_PATH.read_text(encoding="utf-8"))
    spec.setdefault("defaults", {})["assumed_utilization"] = 0.25
    with static_policy_client(tmp_path, spec, 0.1) as c:
        d = c.post("/v1/route", json=PROMPT).json()
        assert d["target"] == "onprem-8b", d
        r = c.post("/v1/outcomes", json={"decision_id": d["decision_id"], "status": "ok", "served_target": "onprem-70b"})
        assert r.status_code == 200, r.text
        booked = r.json()["acks"][0]["settlement"]["actual_cost_usd"]
    t = load_fleet(tmp_path / "fleet.yaml").targets["onprem-70b"]
    want = estimate_cost("onprem-70b", t, t.modes[0], d["prompt_tokens"], 50, utilization=0.25).usd
    assert want > d["estimated_cost_usd"]
    assert booked == pytest.approx(want, rel=1e-6)  # before: the 70B pools at utilization 1.0, 4x less
