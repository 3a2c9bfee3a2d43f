"""An image request through POST /v1/route (the app in process, packaged fleet and default policy, an idle fleet): the
text-only open models cannot take it, so it overflows to a frontier tier, the cheaper of the two that meet the SLO.
gpt-4o-mini (frontier-small) bills an image by URL at up to 48,169 tokens ($0.15/M), gpt-4o (frontier-large) at up to
1,445 ($2.50/M): for one image the large tier is the cheaper ($0.0062 against $0.0074 at 256 output tokens)."""

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pointsman.estimator.estimate import FixedDifficulty
from pointsman.policy.engine import RoutingEngine
from pointsman.policy.fleet import load_fleet
from pointsman.policy.rules.compiler import DEFAULT_POLICY_PATH, load_policy
from pointsman.service.app import create_app
from pointsman.service.bootstrap import build_state
from pointsman.service.settings import Settings

FRONTIER = ("frontier-small", "frontier-large")


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    """The app on the packaged fleet and default policy, p_hard 0.05 (an easy prompt: no hard-prompt rule)."""
    fleet = load_fleet()
    settings_ = Settings(data_dir=tmp_path_factory.mktemp("data"), policy_path=DEFAULT_POLICY_PATH, watch_policy=False)
    engine = RoutingEngine(fleet, load_policy(DEFAULT_POLICY_PATH, fleet), FixedDifficulty(0.05),
                           state=build_state(settings_, fleet))
    with TestClient(create_app(settings_, engine=engine, owns_engine=True)) as c:
        yield c


def _route(client: TestClient, *images: dict, max_tokens: int | None = None) -> dict:
    parts = [{"type": "image_url", "image_url": image} for image in images]
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "what is in this image"}, *parts]}],
            "routing": {"explain": True}, **({"max_tokens": max_tokens} if max_tokens else {})}
    r = client.post("/v1/route", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def test_one_image_goes_to_the_large_tier_it_costs_less_on(client):
    d = _route(client, {"url": "https://example.com/a.png"})
    costs = {c["target"]: c["estimated_cost_usd"] for c in d["trace"]["candidates"]}
    assert costs["frontier-large"] == pytest.approx(0.0061975)   # (10 + 1,445) x $2.50/M + 256 x $10/M
    assert costs["frontier-small"] == pytest.approx(0.00738045)  # (10 + 48,169) x $0.15/M + 256 x $0.60/M
    assert (d["target"], d["rule"]) == ("frontier-large", "cheaper-on-large")
    assert d["estimated_cost_usd"] == costs["frontier-large"]


def test_the_70b_rule_names_the_capability_filter_and_predicts_the_text_alone(client):
    """A 2,000-token answer makes the small tier the cheaper: the 70B rule decides, its prediction counting the text
    the 70B would get (the same as without the image), and the trace names the filter that sent it to its fallback;
    the 8B rules (no eligible target) read nothing."""
    d = _route(client, {"url": "https://example.com/a.png"}, max_tokens=2000)
    text = _route(client, max_tokens=2000)
    assert (d["target"], d["rule"]) == ("frontier-small", "onprem-70b-in-slo")
    results = {r["rule"]: r for r in d["trace"]["rules"]}
    assert "onprem-70b ineligible (capabilities: does not accept image inputs)" in results["onprem-70b-in-slo"]["note"]
    key = 'predict["onprem-70b"].ttft_s'
    assert d["trace"]["signals"][key]["value"] == text["trace"]["signals"][key]["value"]
    assert text["target"] == "onprem-70b"


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(images=st.lists(st.sampled_from(["low", "high", None]), min_size=1, max_size=3),
       max_tokens=st.sampled_from([None, 16, 2000]))
def test_an_image_request_goes_to_the_cheaper_frontier_tier(client, images, max_tokens):
    """Whatever the images' count and detail and the output cap: the frontier tier chosen is the one whose estimated
    cost is the lower (the small one on a tie)."""
    d = _route(client, *[{"url": "https://example.com/a.png", **({"detail": x} if x else {})} for x in images],
               max_tokens=max_tokens)
    costs = {c["target"]: c["estimated_cost_usd"] for c in d["trace"]["candidates"] if c["target"] in FRONTIER}
    assert d["target"] == min(FRONTIER, key=lambda t: (costs[t], t != "frontier-small")), costs
