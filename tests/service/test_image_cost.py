"""An image request's cost estimate over HTTP (POST /v1/route, the packaged fleet and default policy) is at
least what the target's provider bills for the image at its largest: the request does not say its size.
The packaged frontier-small is gpt-4o-mini, whose images bill 2,833 + 5,667 tokens per 512-px tile
(OpenAI's "Calculating costs"), 33x gpt-4o's, at $0.15 per 1M input tokens."""

import math

import pytest
from fastapi.testclient import TestClient

from pointsman.estimator.estimate import FixedDifficulty
from pointsman.policy.engine import RoutingEngine
from pointsman.policy.fleet import DEFAULT_FLEET_PATH, load_fleet, parse_fleet
from pointsman.policy.rules.compiler import DEFAULT_POLICY_PATH, load_policy
from pointsman.service.app import create_app
from pointsman.service.bootstrap import build_state
from pointsman.service.settings import Settings

OUT = 16  # max_tokens of every request


def openai_tile_tokens(width: int, height: int, base: int, per_tile: int) -> int:
    """OpenAI's high-detail rule: fit in 2048 x 2048, short side down to 768, 512-px tiles."""
    scale = min(1.0, 2048 / max(width, height))
    w, h = width * scale, height * scale
    scale = min(1.0, 768 / min(w, h))
    w, h = math.floor(w * scale), math.floor(h * scale)
    return base + per_tile * math.ceil(w / 512) * math.ceil(h / 512)


#: The most gpt-4o-mini bills for an image of unknown size at high detail (a 768 x 2048 image: 8 tiles).
MINI_MOST = max(openai_tile_tokens(w, h, 2833, 5667) for w in range(256, 4097, 128) for h in range(256, 4097, 128))


@pytest.fixture
def route(tmp_path):
    """route(body, fleet=None) -> the /v1/route answer (200) on ``fleet`` (default: the packaged one)."""
    clients = []

    def post(body: dict, fleet=None) -> dict:
        fleet = fleet or load_fleet()
        settings = Settings(data_dir=tmp_path / str(len(clients)), policy_path=DEFAULT_POLICY_PATH, watch_policy=False)
        engine = RoutingEngine(fleet, load_policy(DEFAULT_POLICY_PATH, fleet), FixedDifficulty(0.05),
                               state=build_state(settings, fleet))
        client = TestClient(create_app(settings, engine=engine, owns_engine=True))
        clients.append(client.__enter__())
        r = client.post("/v1/route", json={"max_tokens": OUT, **body})
        assert r.status_code == 200, r.text
        return r.json()

    yield post
    for c in clients:
        c.__exit__(None, None, None)


def _image_request(detail: str | None = None, routing: dict | None = None) -> dict:
    image = {"url": "https://example.com/scan.png", **({"detail": detail} if detail else {})}
    return {"messages": [{"role": "user", "content": [{"type": "text", "text": "What does this form say?"},
                                                       {"type": "image_url", "image_url": image}]}],
            **({"routing": routing} if routing else {})}


@pytest.mark.parametrize("detail", [None, "auto", "high"])
def test_an_image_on_gpt_4o_mini_is_estimated_at_least_at_its_largest_bill(route, detail):
    d = route(_image_request(detail))
    assert d["target"] == "frontier-small"  # gpt-4o-mini: the on-prem models take no images
    floor = (MINI_MOST * 0.15 + OUT * 0.60) / 1e6  # the image alone, at its price, and the output
    assert MINI_MOST == 2833 + 8 * 5667 and d["estimated_cost_usd"] >= floor, (d["estimated_cost_usd"], floor)


def test_a_low_detail_image_on_gpt_4o_mini_is_estimated_at_least_at_2833_tokens(route):
    low = route(_image_request("low"))["estimated_cost_usd"]
    assert low >= (2833 * 0.15 + OUT * 0.60) / 1e6
    assert low < route(_image_request("high"))["estimated_cost_usd"]  # and below a high-detail one


def test_a_supplied_prompt_count_gets_the_image_added(route):
    """A gateway's routing.prompt_tokens may count an image any way (LiteLLM counts 250 for an image URL):
    the image is added on top of it by the target's rule."""
    d = route(_image_request(routing={"prompt_tokens": 300}))
    assert d["target"] == "frontier-small" and d["prompt_tokens"] == 300
    assert d["estimated_cost_usd"] >= ((300 + MINI_MOST) * 0.15 + OUT * 0.60) / 1e6


def test_the_fleet_states_a_target_image_count(route):
    """``image_tokens`` on a fleet target replaces its provider's default rule."""
    text = DEFAULT_FLEET_PATH.read_text(encoding="utf-8")
    head, found, tail = text.partition("    model: gpt-4o-mini-2024-07-18\n")
    assert found
    fleet = parse_fleet(head + found + "    image_tokens: {high: 100000, low: 3000}\n" + tail)
    high = route(_image_request(), fleet)["estimated_cost_usd"]
    low = route(_image_request("low"), fleet)["estimated_cost_usd"]
    assert high >= (100000 * 0.15 + OUT * 0.60) / 1e6 > (MINI_MOST * 0.15 + OUT * 0.60) / 1e6
    assert (3000 * 0.15 + OUT * 0.60) / 1e6 <= low < (3000 * 0.15 + 200 * 0.15 + OUT * 0.60) / 1e6
