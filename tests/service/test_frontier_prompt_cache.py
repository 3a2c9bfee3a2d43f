"""The frontier provider's prompt cache expires in the service's cost estimate: a repeat within
the target's ``prompt_cache_TTL_S`` is estimated with its cached prefix, one after it without
(over HTTP, a fake monotonic clock on the fleet state)."""

import pytest
from fastapi.testclient import TestClient

from pointsman.estimator.estimate import FixedDifficulty
from pointsman.policy.engine import RoutingEngine
from pointsman.policy.fleet import DEFAULT_FLEET_PATH, FleetError, load_fleet, parse_fleet
from pointsman.policy.rules.compiler import DEFAULT_POLICY_PATH, load_policy
from pointsman.replay.fleet_map import sim_fleet
from pointsman.service.app import create_app
from pointsman.service.bootstrap import build_state
from pointsman.service.settings import Settings

TTL_S = 300.0  # the packaged fleet's frontier-large prompt_cache_TTL_S (the default; replay reads it too)
# About 1,800 tokens of one prompt: above the provider's 1,024-token caching threshold.
PROMPT = " ".join(f"Paragraph {i}: the quarterly report lists revenue, costs and margins." for i in range(150))


#: frontier-large as an Anthropic-style tier: cached only where a request marks cache_control, writes at 1.25x.
EXPLICIT = ("prompt_cache_ttl_s: 300\n", "prompt_cache_ttl_s: 300\n    prompt_cache: explicit\n")
WRITE = ("usd_per_1m_cache_write_input_tokens: 2.50      # as", "usd_per_1m_cache_write_input_tokens: 3.125      # as")
WRITE_1H = ("usd_per_1m_cache_write_1h_input_tokens: 2.50", "usd_per_1m_cache_write_1h_input_tokens: 5.00")


def _routed(tmp_path, fleet):
    settings = Settings(data_dir=tmp_path, policy_path=DEFAULT_POLICY_PATH, watch_policy=False)
    state = build_state(settings, fleet)
    clock = [1000.0]
    state.monotonic = lambda: clock[0]
    engine = RoutingEngine(fleet, load_policy(DEFAULT_POLICY_PATH, fleet), FixedDifficulty(0.95), state=state)
    with TestClient(create_app(settings, engine=engine, owns_engine=True)) as c:
        def route(marked: bool = False, ttl: str | None = None, messages: list | None = None) -> dict:
            mark = {"type": "ephemeral", **({"ttl": ttl} if ttl else {})}
            content = [{"type": "text", "text": PROMPT, **({"cache_control": mark} if marked else {})}]
            r = c.post("/v1/route", json={"messages": messages or [{"role": "user", "content": content}]})
            assert r.status_code == 200, r.text
            assert r.json()["target"] == "frontier-large", r.json()
            return r.json()
        yield route, clock


@pytest.fixture
def routed(tmp_path):
    """(route(marked=False), clock): routes PROMPT (hard: the default policy sends it to frontier-large) at
    ``clock[0]``, as a text part marked with ``cache_control`` when ``marked``."""
    yield from _routed(tmp_path, load_fleet())


def _explicit_fleet():
    """The packaged fleet with frontier-large as an Anthropic-style tier (writes 1.25x input, 2x for 1 hour)."""
    text = DEFAULT_FLEET_PATH.read_text(encoding="utf-8")
    for old, new in (EXPLICIT, WRITE):
        head, found, tail = text.rpartition(old)  # the last: frontier-large's
        assert found and head.rfind("frontier-large:") > head.rfind("frontier-small:")
        text = head + new + tail
    head, found, tail = text.rpartition(WRITE_1H[0])  # the line after the 5-minute write price's
    assert found and "frontier-large:" not in tail
    return parse_fleet(head + WRITE_1H[1] + tail)


def test_explicit_caching_credits_only_a_marked_prompt_and_prices_its_write(tmp_path):
    fleet = _explicit_fleet()
    assert fleet.targets["frontier-large"].prompt_cache == "explicit"
    assert fleet.targets["frontier-small"].prompt_cache == "automatic"
    routes = _routed(tmp_path, fleet)
    route, clock = next(routes)
    cold = route()["estimated_cost_usd"]
    clock[0] += 1.0
    assert route()["estimated_cost_usd"] == cold  # unmarked: the provider caches nothing, nothing credited
    marked = route(marked=True)["estimated_cost_usd"]
    assert marked > cold  # the first marked request writes its prompt at the write price (1.25x input here)
    clock[0] += 1.0
    assert route(marked=True)["estimated_cost_usd"] < cold  # its repeat reads the prefix the marked one wrote
    assert {f.name: f.cached_input_usd_per_mtok for f in sim_fleet(fleet).frontier}["frontier-large"] is None


def test_a_repeat_within_the_lifetime_is_estimated_cached_after_it_uncached(routed):
    route, clock = routed
    cold = route()["estimated_cost_usd"]
    clock[0] += TTL_S / 2
    warm = route()["estimated_cost_usd"]
    assert warm < cold  # most of the prompt counted cached
    clock[0] += TTL_S + 1  # the prefix unused longer than the lifetime: the provider cleared it
    assert route()["estimated_cost_usd"] == cold


def test_the_service_and_replay_read_one_lifetime_and_the_old_key_names_its_new_place():
    text = DEFAULT_FLEET_PATH.read_text(encoding="utf-8")
    large = "prompt_cache_min_tokens: 1024   # as frontier-small\n    prompt_cache_ttl_s: 300"
    assert large in text
    fleet = parse_fleet(text.replace(large, large.replace("300", "600")))
    assert fleet.targets["frontier-large"].prompt_cache_ttl_s == 600
    assert {f.name: f.prompt_cache_ttl_s for f in sim_fleet(fleet).frontier}["frontier-large"] == 600
    old = text.replace("    replay:\n      quality_columns:\n        alpacaeval_ae1: gpt-3.5-turbo-1106",
                       "    replay:\n      prompt_cache_ttl_s: 600\n      quality_columns:\n"
                       "        alpacaeval_ae1: gpt-3.5-turbo-1106", 1)
    assert old != text
    with pytest.raises(FleetError, match=r"moved-key: targets.frontier-small.replay.prompt_cache_ttl_s moved to "
                                         r"targets.frontier-small.prompt_cache_ttl_s"):
        parse_fleet(old)


def test_a_one_hour_breakpoint_is_estimated_at_the_one_hour_write_price(tmp_path):
    """Anthropic prices a write with ``cache_control: {ttl: "1h"}`` at 2x input, the default 5-minute one at
    1.25x; the estimate priced every marked write at the 5-minute price, low for a 1-hour one (the estimate
    holds the budget and compares targets, so it errs high, never low) -- found by a fresh-eyes tester."""
    fleet = _explicit_fleet()
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    routes = _routed(tmp_path / "a", fleet)
    five = next(routes)[0](marked=True)
    routes.close()
    routes = _routed(tmp_path / "b", fleet)
    hour = next(routes)[0](marked=True, ttl="1h")
    routes.close()
    assert hour["prompt_tokens"] == five["prompt_tokens"]
    # the whole prompt is written: the difference is the prompt at (5.00 - 3.125) $/Mtok
    assert hour["estimated_cost_usd"] - five["estimated_cost_usd"] == pytest.approx(
        hour["prompt_tokens"] * (5.00 - 3.125) / 1e6, rel=1e-6)


def test_an_explicit_cache_holds_the_prompt_only_up_to_its_last_breakpoint(tmp_path):
    """The provider caches a marked request's prefix up to its last ``cache_control`` breakpoint; the text
    after it is not written. The prefix index kept the whole marked prompt, so a repeat of a request whose
    system prompt is marked (and whose long question is not) was credited the question as cached too and
    estimated low -- found by a fresh-eyes tester."""
    question = " ".join(f"Question {i}: how did the margins of the quarter move, and why?" for i in range(150))

    def messages(mark_system: bool) -> list:
        mark = {"cache_control": {"type": "ephemeral"}}
        return [{"role": "system", "content": [{"type": "text", "text": PROMPT, **(mark if mark_system else {})}]},
                {"role": "user", "content": [{"type": "text", "text": question, **({} if mark_system else mark)}]}]

    repeats = {}
    for mark_system in (True, False):
        (tmp_path / str(mark_system)).mkdir()
        routes = _routed(tmp_path / str(mark_system), _explicit_fleet())
        route, clock = next(routes)
        first = route(messages=messages(mark_system))
        clock[0] += 1.0
        repeats[mark_system] = route(messages=messages(mark_system))["estimated_cost_usd"]
        assert repeats[mark_system] < first["estimated_cost_usd"]  # a cached prefix is read
        routes.close()
    # marked at the end, the whole prompt is read from the cache; marked after the system prompt, the question
    # (about 1,900 tokens) is not, and pays the input price (2.50 $/Mtok) instead of the cached one (1.25 $/Mtok)
    assert repeats[True] - repeats[False] > 1500 * (2.50 - 1.25) / 1e6
