"""Cost model, checked against hand-computed figures from the default fleet's prices."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pointsman.policy.cost import estimate_cost, schema_tokens, target_prompt_tokens
from pointsman.policy.fleet import FrontierTarget, load_fleet
from pointsman.request import RequestView, parse_route_request

FLEET = load_fleet()


@pytest.fixture(scope="module")
def fleet():
    return load_fleet()


def test_frontier_list_prices(fleet):
    # gpt-4o: $2.50 in, $1.25 cached in, $10.00 out per 1M tokens
    c = estimate_cost("frontier-large", fleet.targets["frontier-large"], "aggregated", 1000, 500)
    assert c.usd == pytest.approx(1000 * 2.5e-6 + 500 * 10e-6)  # 0.0075
    c = estimate_cost("frontier-large", fleet.targets["frontier-large"], "aggregated", 2000, 500, cached_prompt_tokens=1800)
    assert c.usd == pytest.approx(200 * 2.5e-6 + 1800 * 1.25e-6 + 500 * 10e-6)  # 0.00775
    assert c.cached_prompt_tokens == 1800


def test_frontier_prompt_cache_needs_its_minimum_length(fleet):
    # OpenAI caches prompts of 1,024 tokens or more: a 1,000-token prompt pays full input price
    c = estimate_cost("frontier-large", fleet.targets["frontier-large"], "aggregated", 1000, 500, cached_prompt_tokens=800)
    assert c.cached_prompt_tokens == 0 and c.usd == pytest.approx(1000 * 2.5e-6 + 500 * 10e-6)


def test_onprem_gpu_seconds(fleet):
    t = fleet.targets["onprem-8b"]  # 1 GPU, 55,200 prefill tok/s, 22,714 decode tok/s, $2.50/h with its power
    c = estimate_cost("onprem-8b", t, "aggregated", 55200, 22714)
    assert c.prefill_gpu_s == pytest.approx(1.0)
    assert c.decode_gpu_s == pytest.approx(1.0)
    assert c.usd == pytest.approx(2 * 2.50 / 3600)
    # power on top for owned GPUs (usd_per_kwh): busy GPU-seconds x kW x $/kWh
    owned = estimate_cost("onprem-8b", t.model_copy(update={"usd_per_kwh": 0.10}), "aggregated", 55200, 22714)
    assert owned.usd == pytest.approx(2 * (2.50 + 1.275 * 0.10) / 3600)


def test_disaggregated_uses_the_prefill_and_decode_pools(fleet):
    # 2 GPUs per replica, 12,192 prefill tok/s, 6,651 decode tok/s; power at $0.10/kWh, as for owned GPUs
    t = fleet.targets["onprem-70b"].model_copy(update={"usd_per_kwh": 0.10})
    c = estimate_cost("onprem-70b", t, "disaggregated", 12192, 6651)
    assert (c.prefill_gpu_s, c.decode_gpu_s) == (pytest.approx(2.0), pytest.approx(2.0))
    assert c.usd == pytest.approx(4 * 2.6275 / 3600)
    # at half utilization the rental per token doubles; power follows busy GPU-seconds
    half = estimate_cost("onprem-70b", t, "disaggregated", 12192, 6651, utilization=0.5)
    assert half.usd == pytest.approx(4 * (2.50 / 0.5 + 1.275 * 0.10) / 3600)
    split = estimate_cost("onprem-70b", t, "disaggregated", 12192, 6651, prefill_utilization=0.5, decode_utilization=1.0)
    assert split.usd == pytest.approx((2 * (2.50 / 0.5 + 0.1275) + 2 * 2.6275) / 3600)
    assert (split.prefill_utilization, split.decode_utilization) == (0.5, 1.0)


def test_aggregated_on_a_decode_endpoint_uses_the_decode_pool(fleet):
    t = fleet.targets["onprem-70b"]
    c = estimate_cost("onprem-70b", t, "aggregated", 12192, 6651, pools=(t.pools.decode, t.pools.decode))
    assert (c.prefill_gpu_s, c.decode_gpu_s) == (pytest.approx(2.0), pytest.approx(2.0))


def test_cached_prefix_skips_prefill_on_prem(fleet):
    t = fleet.targets["onprem-8b"]
    c = estimate_cost("onprem-8b", t, "aggregated", 1000, 0, cached_prompt_tokens=1000)
    assert c.prefill_gpu_s == 0 and c.usd == 0


def test_unsupported_mode_and_bad_utilization(fleet):
    with pytest.raises(KeyError):
        estimate_cost("onprem-8b", fleet.targets["onprem-8b"], "disaggregated", 10, 10)
    with pytest.raises(ValueError, match="utilization"):
        estimate_cost("onprem-8b", fleet.targets["onprem-8b"], "aggregated", 10, 10, utilization=0)


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40),
                     lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                     max_leaves=12)


@settings(max_examples=60, deadline=None)
@given(fmt=_json)
def test_a_response_format_counts_on_frontier_targets_only(fmt):
    """Any ``response_format`` (well-formed or not) leaves an on-prem target's prompt tokens at the request's count
    (vLLM constrains decoding with a schema, outside the prompt) and adds to a frontier target's exactly its
    ``schema_tokens``: > 0 for a JSON object, 0 for anything else; the window count adds the same."""
    view = RequestView.of(parse_route_request({"messages": [{"role": "user", "content": "hi"}], "response_format": fmt}))
    request = {"prompt_tokens": 9, "prompt_tokens_upper": 12}
    schema = schema_tokens(view)
    assert (schema > 0) == isinstance(fmt, dict)
    for t in FLEET.targets.values():
        added = schema if isinstance(t, FrontierTarget) else 0
        assert target_prompt_tokens(t, request, view) == 9 + added
        assert target_prompt_tokens(t, request, view, window=True) == 12 + added
        assert target_prompt_tokens(t, request) == 9  # policy cases: no view, no schema
