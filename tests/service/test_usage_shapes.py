"""Every provider's usage shape through ``POST /v1/outcomes`` on the real app: the USD the budget
ledger books for each is checked against a hand-computed sum of tokens x list prices, and usage
Pointsman cannot price is a 422 naming the fields, with nothing stored and nothing booked."""

from __future__ import annotations

import pytest
import yaml
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st

from pointsman.policy.fleet import DEFAULT_FLEET_PATH
from pointsman.usage_shapes import UsageProblems, read_usage
from tests.service.conftest import static_policy_client


def _frontier(provider: str, model: str, url: str, prices: dict[str, float]) -> dict[str, object]:
    return {"kind": "frontier", "provider": provider, "model": model, "base_url": url,
            "context_window_tokens": 200000, "prices": prices}


#: Test targets at the providers' list prices of docs/service.md ("Usage shapes"), per 1M tokens.
EXTRA_TARGETS = {
    "claude": _frontier("anthropic", "claude-sonnet-4-5", "https://api.anthropic.com/v1", {
        "usd_per_1m_input_tokens": 3.0, "usd_per_1m_cached_input_tokens": 0.30, "usd_per_1m_output_tokens": 15.0,
        "usd_per_1m_cache_write_input_tokens": 3.75, "usd_per_1m_cache_write_1h_input_tokens": 6.0}),
    "gemini": _frontier("google", "gemini-2.5-flash", "https://generativelanguage.googleapis.com/v1beta", {
        "usd_per_1m_input_tokens": 0.30, "usd_per_1m_cached_input_tokens": 0.03, "usd_per_1m_output_tokens": 2.50}),
    "deepseek": _frontier("deepseek", "deepseek-chat", "https://api.deepseek.com/v1", {
        "usd_per_1m_input_tokens": 0.28, "usd_per_1m_cached_input_tokens": 0.028, "usd_per_1m_output_tokens": 0.42}),
}


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    data = tmp_path_factory.mktemp("usage")
    spec = yaml.safe_load(DEFAULT_FLEET_PATH.read_text(encoding="utf-8"))
    spec["targets"].update(EXTRA_TARGETS)
    with static_policy_client(data, spec, 0.2) as c:
        yield c


def _decide(c: TestClient) -> str:
    r = c.post("/v1/route", json={"messages": [{"role": "user", "content": "What is the capital of France?"}]})
    assert r.status_code == 200, r.text
    return r.json()["decision_id"]


def _spent_usd(c: TestClient, target: str) -> float:
    return c.app.state.fleet_state.ledger.effective_price_per_token(target, "day").spent_usd


def _onprem_8b_usd(prompt_uncached: int, completion: int) -> float:
    """onprem-8b in the default fleet at full utilization: GPU-seconds x $2.50/GPU-h, a GPU cloud's price, which
    includes the power (so no kWh on top)."""
    gpu_s = prompt_uncached / 55200 + completion / 22714
    return gpu_s * 2.50 / 3600


# (shape, served target, usage as the provider sends it, USD by hand: tokens x $/1M)
PRICED = [
    ("OpenAI Chat Completions", "frontier-large",
     {"prompt_tokens": 2000, "completion_tokens": 300, "total_tokens": 2300,
      "prompt_tokens_details": {"cached_tokens": 1024, "audio_tokens": 0},
      "completion_tokens_details": {"reasoning_tokens": 100, "audio_tokens": 0, "accepted_prediction_tokens": 0,
                                    "rejected_prediction_tokens": 0}},
     (976 * 2.50 + 1024 * 1.25 + 300 * 10.0) / 1e6),
    ("OpenAI Responses", "frontier-large",
     {"input_tokens": 5000, "input_tokens_details": {"cached_tokens": 4096}, "output_tokens": 800,
      "output_tokens_details": {"reasoning_tokens": 512}, "total_tokens": 5800},
     (904 * 2.50 + 4096 * 1.25 + 800 * 10.0) / 1e6),
    ("Anthropic, 5-minute and 1-hour writes", "claude",
     {"input_tokens": 50, "cache_creation_input_tokens": 3000, "cache_read_input_tokens": 10000,
      "cache_creation": {"ephemeral_5m_input_tokens": 1000, "ephemeral_1h_input_tokens": 2000},
      "output_tokens": 400, "service_tier": "standard", "server_tool_use": {"web_search_requests": 0}},
     (50 * 3.0 + 10000 * 0.30 + 1000 * 3.75 + 2000 * 6.0 + 400 * 15.0) / 1e6),
    ("Anthropic without the TTL split (5 minutes)", "claude",
     {"input_tokens": 20, "cache_creation_input_tokens": 2048, "cache_read_input_tokens": 0, "output_tokens": 100},
     (20 * 3.0 + 2048 * 3.75 + 100 * 15.0) / 1e6),
    ("Gemini usageMetadata (thoughts billed as output)", "gemini",
     {"promptTokenCount": 12000, "cachedContentTokenCount": 8000, "candidatesTokenCount": 500,
      "thoughtsTokenCount": 1500, "toolUsePromptTokenCount": 100, "totalTokenCount": 14100,
      "promptTokensDetails": [{"modality": "TEXT", "tokenCount": 12000}],
      "cacheTokensDetails": [{"modality": "TEXT", "tokenCount": 8000}]},
     (4100 * 0.30 + 8000 * 0.03 + 2000 * 2.50) / 1e6),
    ("Gemini with the output count omitted (proto3): what totalTokenCount leaves", "gemini",
     {"promptTokenCount": 1000, "thoughtsTokenCount": 200, "totalTokenCount": 1500},
     (1000 * 0.30 + (300 + 200) * 2.50) / 1e6),  # 300 candidates + 200 thoughts
    ("Gemini with no output (total = prompt)", "gemini",
     {"promptTokenCount": 1000, "totalTokenCount": 1000}, 1000 * 0.30 / 1e6),
    ("Bedrock Converse with cacheDetails", "claude",
     {"inputTokens": 30, "outputTokens": 200, "cacheReadInputTokens": 4000, "cacheWriteInputTokens": 1500,
      "totalTokens": 5730, "cacheDetails": [{"ttl": "1h", "inputTokens": 500}, {"ttl": "5m", "inputTokens": 1000}]},
     (30 * 3.0 + 4000 * 0.30 + 1000 * 3.75 + 500 * 6.0 + 200 * 15.0) / 1e6),
    ("Bedrock Converse, the split without cacheWriteInputTokens (review finding 8)", "claude",
     {"inputTokens": 1000, "outputTokens": 10, "cacheDetails": [{"ttl": "1h", "inputTokens": 500}]},
     (1000 * 3.0 + 500 * 6.0 + 10 * 15.0) / 1e6),
    ("Bedrock Converse, writes without the split", "claude",
     {"inputTokens": 10, "outputTokens": 20, "cacheWriteInputTokens": 1000, "totalTokens": 1030},
     (10 * 3.0 + 1000 * 3.75 + 20 * 15.0) / 1e6),
    ("DeepSeek cache hit/miss", "deepseek",
     {"prompt_tokens": 3000, "completion_tokens": 700, "total_tokens": 3700, "prompt_cache_hit_tokens": 2560,
      "prompt_cache_miss_tokens": 440, "prompt_tokens_details": {"cached_tokens": 2560},
      "completion_tokens_details": {"reasoning_tokens": 300}},
     (440 * 0.28 + 2560 * 0.028 + 700 * 0.42) / 1e6),
    ("vLLM (details null), on-prem", "onprem-8b",
     {"prompt_tokens": 1000, "total_tokens": 1100, "completion_tokens": 100, "prompt_tokens_details": None},
     _onprem_8b_usd(1000, 100)),
    ("SGLang (cache reads skip prefill), on-prem", "onprem-8b",
     {"prompt_tokens": 1000, "completion_tokens": 100, "total_tokens": 1100,
      "prompt_tokens_details": {"cached_tokens": 600}, "reasoning_tokens": 0},
     _onprem_8b_usd(400, 100)),
    ("Anthropic with its list-price modifiers at list price", "claude",
     {"input_tokens": 100, "output_tokens": 50, "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0,
      "service_tier": "standard", "inference_geo": "not_available", "speed": "standard",
      "server_tool_use": {"web_search_requests": 0, "tool_search_requests": 0}},
     (100 * 3.0 + 50 * 15.0) / 1e6),
    ("LiteLLM's OpenAI-shaped Anthropic usage", "claude",
     {"prompt_tokens": 3600, "completion_tokens": 80, "total_tokens": 3680,
      "prompt_tokens_details": {"cached_tokens": 2000, "text_tokens": 100, "cache_creation_tokens": 1500,
                                "cache_creation_token_details": {"ephemeral_5m_input_tokens": 1000,
                                                                 "ephemeral_1h_input_tokens": 500}},
      "completion_tokens_details": {"reasoning_tokens": 0}, "cache_creation_input_tokens": 1500,
      "cache_read_input_tokens": 2000, "service_tier": "standard"},
     (100 * 3.0 + 2000 * 0.30 + 1000 * 3.75 + 500 * 6.0 + 80 * 15.0) / 1e6),
    ("Pointsman's own keys with a cache write", "claude",
     {"prompt_tokens": 1000, "cached_tokens": 200, "cache_write_tokens": 300, "completion_tokens": 10},
     (500 * 3.0 + 200 * 0.30 + 300 * 3.75 + 10 * 15.0) / 1e6),
    # issue 22: these were 422s that left the decision in flight and its hold held (a retry could
    # never price them); a write price the fleet leaves out is Anthropic's published 2x / 1.25x input
    ("a 1-hour cache write on a target without that price: 2x input", "gemini",
     {"input_tokens": 10, "output_tokens": 5, "cache_creation_input_tokens": 2000,
      "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 2000}},
     (10 * 0.30 + 2000 * 2 * 0.30 + 5 * 2.50) / 1e6),
    ("a Bedrock cache write on a target without a write price: 1.25x input", "deepseek",
     {"inputTokens": 10, "outputTokens": 5, "cacheWriteInputTokens": 100, "totalTokens": 115},
     (10 * 0.28 + 100 * 1.25 * 0.28 + 5 * 0.42) / 1e6),
]


@pytest.mark.parametrize("shape,target,usage,usd", PRICED, ids=[p[0] for p in PRICED])
def test_every_shape_books_its_list_price_in_the_ledger(client, shape, target, usage, usd):
    decision_id = _decide(client)
    before = _spent_usd(client, target)
    r = client.post("/v1/outcomes", json={"decision_id": decision_id, "served_target": target, "usage": usage})
    assert r.status_code == 200, r.text
    ack = r.json()["acks"][0]
    assert ack["status"] == "stored" and ack["settlement"]["target"] == target
    assert ack["settlement"]["actual_cost_usd"] == pytest.approx(usd, abs=1e-9)  # the ledger counts nano-USD
    assert _spent_usd(client, target) - before == pytest.approx(usd, abs=1e-9)
    assert client.app.state.fleet_state.record(decision_id) is None  # settled: nothing in flight, no hold
    logged = client.app.state.runtime.outcome_log.decision(decision_id).outcomes[0]
    assert logged.usage.prompt_tokens == read_usage(usage).prompt_tokens > 0  # never stored with 0 tokens


# (why, served target, usage, the fields the 422 must name)
UNPRICEABLE = [
    ("an unknown key", "frontier-large", {"prompt_tokens": 10, "completion_tokens": 5, "foo_tokens": 1},
     ["usage.foo_tokens"]),
    ("Responses keys mixed into OpenAI's", "frontier-large",
     {"prompt_tokens": 10, "completion_tokens": 5, "output_tokens": 5}, ["usage.output_tokens"]),
    ("US-only inference (1.1x)", "claude", {"input_tokens": 10, "output_tokens": 5, "inference_geo": "us"},
     ["usage.inference_geo"]),
    ("Anthropic usage without its output count", "claude", {"input_tokens": 10, "cache_read_input_tokens": 5},
     ["usage.output_tokens"]),
    ("no count at all", "frontier-large", {}, ["usage.prompt_tokens", "usage.completion_tokens"]),
    ("Gemini with only a prompt count (finding F: was booked as 0 output tokens)", "gemini",
     {"promptTokenCount": 100}, ["usage.candidatesTokenCount"]),
    ("OpenAI audio input tokens", "frontier-large",
     {"prompt_tokens": 100, "completion_tokens": 10, "prompt_tokens_details": {"audio_tokens": 50}},
     ["usage.prompt_tokens_details.audio_tokens"]),
    ("Gemini audio input", "gemini",
     {"promptTokenCount": 100, "candidatesTokenCount": 5,
      "promptTokensDetails": [{"modality": "TEXT", "tokenCount": 70}, {"modality": "AUDIO", "tokenCount": 30}]},
     ["usage.promptTokensDetails[1].tokenCount"]),
    ("Anthropic web searches", "claude",
     {"input_tokens": 10, "output_tokens": 5, "server_tool_use": {"web_search_requests": 2}},
     ["usage.server_tool_use.web_search_requests"]),
    ("a total that contradicts the counts", "frontier-large",
     {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 99}, ["usage.total_tokens"]),
    ("a split that contradicts the write count", "claude",
     {"input_tokens": 10, "output_tokens": 5, "cache_creation_input_tokens": 100,
      "cache_creation": {"ephemeral_5m_input_tokens": 10, "ephemeral_1h_input_tokens": 10}},
     ["usage.cache_creation_input_tokens"]),
    ("a token count that is not an integer", "frontier-large", {"prompt_tokens": "12", "completion_tokens": 5},
     ["usage.prompt_tokens"]),
    ("more reasoning tokens than output tokens, which include them (xAI's convention, its total dropped: was "
     "booked as 9 output tokens)", "frontier-large",
     {"prompt_tokens": 32, "completion_tokens": 9, "completion_tokens_details": {"reasoning_tokens": 94}},
     ["usage.completion_tokens_details.reasoning_tokens"]),
    ("SGLang's reasoning count beyond the completion count", "frontier-large",
     {"prompt_tokens": 32, "completion_tokens": 9, "reasoning_tokens": 94}, ["usage.reasoning_tokens"]),
    ("Responses reasoning beyond its output count", "frontier-large",
     {"input_tokens": 32, "output_tokens": 9, "output_tokens_details": {"reasoning_tokens": 94}},
     ["usage.output_tokens_details.reasoning_tokens"]),
    ("a reasoning count that is not an integer", "frontier-large",
     {"prompt_tokens": 32, "completion_tokens": 9, "completion_tokens_details": {"reasoning_tokens": "5"}},
     ["usage.completion_tokens_details.reasoning_tokens"]),
]


@pytest.mark.parametrize("why,target,usage,fields", UNPRICEABLE, ids=[u[0] for u in UNPRICEABLE])
def test_unpriceable_usage_is_a_422_naming_the_fields_and_nothing_is_booked(client, why, target, usage, fields):
    decision_id = _decide(client)
    before = _spent_usd(client, target)
    r = client.post("/v1/outcomes", json={"decision_id": decision_id, "served_target": target, "usage": usage})
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["param"] == fields[0]
    assert all(f in error["message"] for f in fields[1:]), error["message"]
    logged = client.app.state.runtime.outcome_log.decision(decision_id)
    assert logged is None or logged.outcomes == ()  # not stored
    assert _spent_usd(client, target) == before
    assert client.app.state.fleet_state.record(decision_id) is not None  # still held: a fixed report settles it
    batch = client.post("/v1/outcomes", json=[{"decision_id": decision_id, "served_target": target, "usage": usage}])
    ack = batch.json()["acks"][0]
    assert batch.status_code == 200 and ack["status"] == "invalid" and ack["message"].startswith(f"[0].{fields[0]}: ")


def test_read_usage_names_every_problem_at_once():
    with pytest.raises(UsageProblems) as err:
        read_usage({"input_tokens": -1, "output_tokens": 5, "cache_read_input_tokens": 2**70,
                    "server_tool_use": {"web_fetch_requests": 1}, "service_tier": "priority"})
    assert [f for f, _ in err.value.problems] == [
        "usage.input_tokens", "usage.cache_read_input_tokens", "usage.server_tool_use.web_fetch_requests",
        "usage.service_tier"]


_KEYS = sorted({"prompt_tokens", "completion_tokens", "total_tokens", "prompt_tokens_details", "cached_tokens",
                "input_tokens", "output_tokens", "cache_creation", "cache_creation_input_tokens", "server_tool_use",
                "promptTokenCount", "promptTokensDetails", "inputTokens", "cacheDetails", "cacheWriteInputTokens",
                "ttl", "modality", "tokenCount", "audio_tokens", "ephemeral_1h_input_tokens", "service_tier", "x",
                "cache_creation_token_details", "cache_read_input_tokens", "iterations"})
_LEAF = st.one_of(st.none(), st.booleans(), st.integers(-5, 2**70), st.floats(allow_nan=False),
                  st.sampled_from(["5m", "1h", "AUDIO", "TEXT", "standard", "us"]))
_JSON = st.recursive(_LEAF, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                    st.dictionaries(st.sampled_from(_KEYS), inner, max_size=4)),
                     max_leaves=12)


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(st.sampled_from(_KEYS), _JSON, max_size=6))
def test_any_usage_object_is_read_or_refused_by_field_never_a_crash(usage):
    try:
        counts = read_usage(usage)
    except UsageProblems as exc:
        assert exc.problems and all(f.startswith("usage") for f, _ in exc.problems)
    else:
        assert all(v is None or 0 <= v <= 100_000_000 for v in counts.counts().values())
        parts = (counts.cached_tokens or 0) + (counts.cache_write_tokens or 0) + (counts.cache_write_1h_tokens or 0)
        assert counts.prompt_tokens is None or parts <= counts.prompt_tokens
