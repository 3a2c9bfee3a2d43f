"""Property (hypothesis): for any fleet (on-prem targets each serving any set of LoRA adapters, frontier tiers), any
rule's target and fallbacks and any request ``model``, a ``model`` naming an adapter some target serves is routed only
to targets serving it: the decision's target is the rule's first candidate that does, its fallbacks the others that do,
in the rule's order, each answering with the adapter's name; with no candidate serving it the decision is
``NoEligibleTarget``, every candidate excluded by ``capabilities``. Any other ``model`` routes as if no target served
an adapter: the rule's target, then every fallback, each with its own model."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pointsman.estimator.estimate import FixedDifficulty
from pointsman.policy.engine import RoutingEngine
from pointsman.policy.fleet import parse_fleet
from pointsman.policy.rules.compiler import compile_policy
from pointsman.policy.selection.filters import NoEligibleTarget
from pointsman.policy.signals.fleet_state import FleetState
from pointsman.request import parse_route_request

BASE = "meta-llama/Llama-3.1-8B-Instruct"
ADAPTERS = ["sql-lora", "chat-lora", "code-lora"]
ONPREM = """  {name}:
    kind: onprem
    model: {base}
    lora_adapters: [{adapters}]
    context_window_tokens: 131072
    usd_per_gpu_hour: 2.5
    pools:
      aggregated:
        gpus_per_replica: 1
        prefill_tokens_per_s: 20000
        decode_tokens_per_s: 20000
        endpoints:
          - {{name: {name}-0, url: "http://{name}.internal:8000/v1"}}
"""
FRONTIER = """  {name}:
    kind: frontier
    provider: openai
    model: gpt-4o-mini
    base_url: https://{name}.example.com/v1
    context_window_tokens: 128000
    prices: {{usd_per_1m_input_tokens: 0.15, usd_per_1m_cached_input_tokens: 0.075, usd_per_1m_output_tokens: 0.6}}
"""
# per target: the adapters it serves, or None for a frontier tier
TARGETS = st.lists(st.one_of(st.none(), st.frozensets(st.sampled_from(ADAPTERS))), min_size=1, max_size=5)
MODELS = st.one_of(st.none(), st.sampled_from([*ADAPTERS, "other-lora", BASE, "gpt-4o-mini", "auto"]))


@settings(max_examples=120, deadline=None)
@given(targets=TARGETS, model=MODELS, data=st.data())
def test_a_request_naming_an_adapter_goes_only_to_targets_serving_it(targets, model, data):
    names = [f"t{i}" for i in range(len(targets))]
    fleet = parse_fleet("apiVersion: pointsman/v1\nkind: Fleet\ndefaults: {output_tokens: 64, scrape_metrics: false}\n"
                        "targets:\n" + "".join(
                            FRONTIER.format(name=n) if a is None else
                            ONPREM.format(name=n, base=BASE, adapters=", ".join(sorted(a)))
                            for n, a in zip(names, targets, strict=True)))
    candidates = data.draw(st.permutations(names).flatmap(lambda p: st.integers(1, len(p)).map(lambda k: p[:k])))
    policy = compile_policy("apiVersion: pointsman/v1\nkind: RoutingPolicy\nrules:\n  - name: only\n"
                            f"    route: {{target: {candidates[0]}, fallbacks: [{', '.join(candidates[1:])}]}}\n", fleet)
    serves = {n: a is not None and model in a for n, a in zip(names, targets, strict=True)}
    adapter = any(serves.values())
    engine = RoutingEngine(fleet, policy, FixedDifficulty(0.5), state=FleetState(fleet))
    request = parse_route_request({"messages": [{"role": "user", "content": "Monthly orders by region, please."}],
                                   **({"model": model} if model is not None else {})})
    expected = [(t, model if adapter else fleet.targets[t].model) for t in candidates if serves[t] or not adapter]
    if not expected:
        with pytest.raises(NoEligibleTarget) as raised:
            engine.route(request, dispatch=False)
        assert raised.value.considered == candidates
        assert {raised.value.exclusions[t].filter for t in candidates} == {"capabilities"}, str(raised.value)
        return
    d = engine.route(request, dispatch=False)
    assert [(d.target, d.model)] + [(f.target, f.model) for f in d.fallbacks] == expected, (targets, model, candidates)
