"""Property (hypothesis): the P/D rules of thumb count as cached only what the endpoint a request runs on holds.

Whatever leading blocks of a prompt each endpoint of the packaged ``onprem-70b`` target holds (2 aggregated, 2
prefill, 4 decode replicas: 12 GPUs) and however busy each is, an ``auto`` request that stays aggregated runs on
an endpoint holding the prefix its mode was decided on (``trace.mode.inputs.uncached_prompt_tokens`` = prompt
tokens - the chosen endpoint's ``local_hit_tokens``), and one whose chosen aggregated endpoint holds less than
``prompt - 512`` tokens and less than 80% of it is never kept aggregated for being short or cached. Before, the mode read the
longest prefix held anywhere: a prompt held 61% on a decode endpoint (which joins the aggregated choice only from
80%) read "stay aggregated" and ran cold on the aggregated pool (``tests/service/test_pd_where_cached.py``)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pointsman.estimator.estimate import FixedDifficulty
from pointsman.policy.engine import RoutingEngine
from pointsman.policy.fleet import load_fleet
from pointsman.policy.rules.compiler import compile_policy
from pointsman.policy.signals.fleet_state import FleetState
from pointsman.policy.signals.prefix_index import MOONCAKE_BLOCK_TOKENS, block_hashes_from_ids
from pointsman.request import parse_route_request

FLEET = load_fleet()
POLICY = compile_policy("apiVersion: pointsman/v1\nkind: RoutingPolicy\nrules:\n"
                        "  - name: default\n    route: {target: onprem-70b, mode: auto}\n", FLEET)
ENDPOINTS = [e for e in FLEET.pool_endpoints("onprem-70b", "aggregated")] + \
    [e for e in FLEET.pool_endpoints("onprem-70b", "decode")] + [e for e in FLEET.pool_endpoints("onprem-70b", "prefill")]
BLOCKS = 8  # 8 blocks of 512 tokens: a 4,096-token prompt


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(held=st.lists(st.integers(0, BLOCKS), min_size=len(ENDPOINTS), max_size=len(ENDPOINTS)),
       running=st.lists(st.integers(0, 60), min_size=len(ENDPOINTS), max_size=len(ENDPOINTS)),
       prompt_tokens=st.integers(600, BLOCKS * MOONCAKE_BLOCK_TOKENS))
def test_a_request_kept_aggregated_for_its_cache_runs_where_the_cache_is(held, running, prompt_tokens):
    state = FleetState(FLEET)
    engine = RoutingEngine(FLEET, POLICY, FixedDifficulty(0.1), state=state)
    ids = [f"b{i}" for i in range(prompt_tokens // MOONCAKE_BLOCK_TOKENS)]
    hashes = block_hashes_from_ids(ids)
    index = state.prefix_index("onprem-70b", True)
    for e, k, r in zip(ENDPOINTS, held, running):
        if k:
            index.record(e.id, hashes[:k])
        state.push_load(e.id, {"num_requests_running": r, "num_requests_waiting": 0})
    d = engine.route(parse_route_request({
        "messages": [{"role": "user", "content": "Summarise the attached report."}], "max_tokens": 200,
        "routing": {"prompt_tokens": prompt_tokens, "prefix_block_hashes": ids, "explain": True}}), dispatch=False)
    trace = d.trace
    inputs = trace["mode"]["inputs"]
    if d.mode == "aggregated":
        name = d.endpoints[0].name
        chosen = next(c for c in trace["endpoints"][0]["candidates"] if c["endpoint"] == name)
        assert abs(inputs["prompt_tokens"] - chosen["local_hit_tokens"] - inputs["uncached_prompt_tokens"]) <= 1, \
            (name, chosen, inputs, trace["mode"]["reason"])
        local = chosen["local_hit_tokens"]
        if local < prompt_tokens - 512 and local < 0.8 * prompt_tokens - 1:  # short neither uncached nor cached there
            reason = trace["mode"]["reason"]
            assert not reason.startswith("stay local") and "uncached prompt tokens" not in reason, trace["mode"]
