"""Aggregated vs disaggregated per request: guards for every route, benefit tests for auto."""

import pytest

from pointsman.policy.fleet import load_fleet
from pointsman.policy.selection.pd_mode import DisaggregationSpec, decide_mode, pd_pool_gpus

SPEC = DisaggregationSpec()


@pytest.fixture(scope="module")
def fleet():
    return load_fleet()


def mode(fleet, route_mode, target="onprem-70b", spec=SPEC, prompt=8000, output=256, hit=0.0, saturated=False):
    return decide_mode(spec, fleet.targets[target], route_mode, prompt_tokens=prompt, output_tokens=output,
                       prefix_hit_ratio=hit, prefill_saturated=saturated, gpus=pd_pool_gpus(fleet.targets[target]))


def test_default_fleet_pd_pool_is_at_the_threshold(fleet):
    assert pd_pool_gpus(fleet.targets["onprem-70b"]) == 12 and pd_pool_gpus(fleet.targets["onprem-8b"]) == 0


@pytest.mark.parametrize("kw,want,reason", [
    ({}, "disaggregated", "disaggregate"),
    ({"prompt": 512}, "aggregated", "512 uncached prompt tokens <= min_uncached_prompt_tokens 512"),
    ({"prompt": 5000, "hit": 0.9}, "aggregated", "500 uncached prompt tokens"),  # short once the cache is counted
    ({"prompt": 20000, "hit": 0.85}, "aggregated", "stay local: prefix hit ratio 0.85 >= max_local_hit_ratio 0.8"),
    ({"output": 16}, "aggregated", "16 output tokens <= min_output_tokens 16"),
    ({"saturated": True}, "aggregated", "the prefill pool is saturated"),
    ({"spec": DisaggregationSpec(min_pool_gpus=16)}, "aggregated", "12 healthy GPUs < min_pool_gpus 16"),
])
def test_auto_follows_the_rules_of_thumb(fleet, kw, want, reason):
    got = mode(fleet, "auto", **kw)
    assert got.mode == want and reason in got.reason
    assert got.inputs["pd_pool_gpus"] == 12


def test_explicit_disaggregated_keeps_only_the_guards(fleet):
    assert mode(fleet, "disaggregated", prompt=100).mode == "disaggregated"  # short prompt: the author decided
    assert mode(fleet, "disaggregated", hit=0.95).mode == "disaggregated"
    assert mode(fleet, "disaggregated", saturated=True).mode == "aggregated"
    assert mode(fleet, "disaggregated", spec=DisaggregationSpec(min_pool_gpus=13)).mode == "aggregated"
    assert mode(fleet, "disaggregated", spec=DisaggregationSpec(min_pool_gpus=0), saturated=False).mode == "disaggregated"


def test_aggregated_routes_and_single_mode_targets(fleet):
    assert mode(fleet, "aggregated").mode == "aggregated"
    assert mode(fleet, "auto", target="onprem-8b").mode == "aggregated"
    assert mode(fleet, "auto", target="frontier-large").mode == "aggregated"
