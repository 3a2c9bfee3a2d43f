"""RoutingEngine end to end with a fixed-difficulty estimator."""

import json
import re

import pytest

from pointsman.estimator.estimate import DifficultyEstimate, FixedDifficulty
from pointsman.policy.cost import estimate_cost
from pointsman.policy.decision import host_port
from pointsman.policy.engine import RoutingEngine
from pointsman.policy.fleet import load_fleet, parse_fleet
from pointsman.policy.live import SUBSET_REASON
from pointsman.policy.rules.compiler import DEFAULT_POLICY_PATH, STATIC_POLICY_PATH, compile_policy, load_policy
from pointsman.policy.selection.filters import NoEligibleTarget
from pointsman.request import parse_route_request, request_from_prompt


@pytest.fixture(scope="module")
def fleet():
    return load_fleet()


@pytest.fixture(scope="module")
def policy(fleet):
    return load_policy(STATIC_POLICY_PATH, fleet)


def engine(fleet, policy, p_hard=0.1):
    return RoutingEngine(fleet, policy, FixedDifficulty(p_hard))


def exact(tokens: int, **extra):
    """A request whose prompt length the gateway states exactly."""
    return parse_route_request({"messages": [{"role": "user", "content": "hello"}],
                                "routing": {"prompt_tokens": tokens}, **extra})


@pytest.mark.parametrize("p_hard,tokens,target,mode,rule", [
    (0.05, 30, "onprem-8b", "aggregated", "default"),
    (0.49, 511, "onprem-8b", "aggregated", "default"),
    (0.54, 100, "onprem-70b", "aggregated", "medium-prompt"),
    (0.60, 8000, "onprem-70b", "disaggregated", "long-cold-prompt"),
    (0.10, 512, "onprem-70b", "disaggregated", "long-cold-prompt"),
    (0.67, 30, "frontier-large", "aggregated", "hard-prompt"),
    (0.99, 100000, "frontier-large", "aggregated", "hard-prompt"),
    (None, 30, "onprem-70b", "aggregated", "estimator-unavailable"),
])
def test_decisions(fleet, policy, p_hard, tokens, target, mode, rule):
    d = engine(fleet, policy, p_hard).route(exact(tokens))
    assert (d.target, d.mode, d.rule) == (target, mode, rule)
    assert d.model == fleet.targets[target].model
    assert d.prompt_tokens == tokens
    assert d.p_hard == p_hard and d.difficulty_available is (p_hard is not None)
    # cost of the chosen target and mode, 256 output tokens (the fleet default)
    want = estimate_cost(target, fleet.targets[target], mode, tokens, 256).usd
    assert d.estimated_cost_usd == pytest.approx(want)


def test_decision_fields_and_json(fleet, policy):
    d = engine(fleet, policy, 0.1).route(exact(4000, max_tokens=100))
    assert re.fullmatch(r"[0-9a-f]{32}", d.decision_id)
    assert d.base_url == "http://llama-70b-decode-0.inference.internal:8000/v1"
    # chosen endpoint first, then fallback_endpoints (2) per role
    assert [e.role for e in d.endpoints] == ["prefill", "prefill", "decode", "decode", "decode"]
    assert [f.to_dict() for f in d.fallbacks] == [{"target": "frontier-small", "model": "gpt-4o-mini-2024-07-18",
                                                   "base_url": "https://api.openai.com/v1", "mode": "aggregated"}]
    assert d.estimated_cost_usd == pytest.approx(
        (4000 / 12192 * 2 + 100 / 6651 * 2) * 2.5 / 3600)
    assert d.policy_revision == policy.revision and d.fleet_revision == fleet.revision
    assert d.estimator_version == "fixed"
    assert set(d.timings_ms) == {"features", "estimator", "policy", "total"}
    assert d.labels == {"reason": "long-prompt"}
    body = json.loads(json.dumps(d.to_dict()))
    assert set(body) == {"decision_id", "target", "model", "base_url", "mode", "endpoints", "prefill_url", "forward_headers", "fallbacks",
                         "estimated_cost_usd", "rule", "labels", "p_hard", "difficulty_available", "prompt_tokens",
                         "policy_revision", "fleet_revision", "estimator_version", "timings_ms", "verify_prefix_tokens", "trace"}
    assert "trace" not in d.to_dict(explain=False)
    trace = body["trace"]
    assert [r["rule"] for r in trace["rules"]] == ["estimator-unavailable", "hard-prompt", "long-cold-prompt"]
    assert trace["signals"]["request.prompt_tokens"] == {"value": 4000, "age_s": 0.0}
    assert trace["signals"]["difficulty.p_hard"] == {"value": 0.1, "age_s": 0.0}
    assert [c["target"] for c in trace["candidates"]] == list(fleet.targets)
    assert trace["candidates"][1]["mode"] == "disaggregated"
    assert trace["cost"]["output_tokens"] == 100


def test_pd_forwarding_contract(fleet, policy):
    """A disaggregated decision: send to base_url (a decode endpoint), never endpoints[0] (a prefill
    endpoint); the prefill endpoint is prefill_url and x-prefiller-host-port (llm-d's sidecar header)."""
    d = engine(fleet, policy, 0.1).route(exact(4000, max_tokens=100))
    assert d.mode == "disaggregated" and d.endpoints[0].role == "prefill"
    body = d.to_dict(explain=False)
    assert body["base_url"] == "http://llama-70b-decode-0.inference.internal:8000/v1" != body["endpoints"][0]["url"]
    assert body["prefill_url"] == body["endpoints"][0]["url"] == "http://llama-70b-prefill-0.inference.internal:8000/v1"
    assert body["forward_headers"] == {"x-pointsman-decision-id": d.decision_id,
                                       "x-prefiller-host-port": "llama-70b-prefill-0.inference.internal:8000"}
    agg = engine(fleet, policy, 0.05).route(exact(30)).to_dict(explain=False)
    assert agg["mode"] == "aggregated" and agg["prefill_url"] is None
    assert agg["forward_headers"] == {"x-pointsman-decision-id": agg["decision_id"]}
    assert agg["base_url"] == agg["endpoints"][0]["url"]


def test_endpoint_subset_restricts_the_candidates(fleet, policy):
    """A proxy's subset hint: only the named endpoints may be picked; a target with none of them is
    ineligible (health), and the trace names the others as dropped."""
    one = "http://llama-8b-1.inference.internal:8000/v1"
    e = engine(fleet, policy, 0.05)
    for _ in range(3):  # in-flight load would otherwise spread the picks over both replicas
        d = e.route(exact(30), endpoint_subset={one})
        assert (d.target, d.base_url, [x.url for x in d.endpoints]) == ("onprem-8b", one, [one])
    assert d.fallbacks == ()  # no other target has an endpoint in the subset
    assert d.trace["dropped_endpoints"]["http://llama-8b-0.inference.internal:8000/v1"] == SUBSET_REASON
    pd = {"http://llama-70b-prefill-1.inference.internal:8000/v1", "http://llama-70b-decode-3.inference.internal:8000/v1"}
    d = engine(fleet, policy, 0.1).route(exact(4000, max_tokens=100), endpoint_subset=pd)
    assert d.mode == "disaggregated" and {x.url for x in d.endpoints} == pd
    assert d.prefill is not None and d.prefill.url == "http://llama-70b-prefill-1.inference.internal:8000/v1"
    with pytest.raises(NoEligibleTarget, match="health: no healthy endpoint"):
        engine(fleet, policy, 0.05).route(exact(30), endpoint_subset=set())


@pytest.mark.parametrize("url,want", [
    ("http://10.0.0.7:8000/v1", "10.0.0.7:8000"), ("https://api.openai.com/v1", "api.openai.com:443"),
    ("http://llama-0.internal/v1", "llama-0.internal:80"), ("http://[fd00::7]:8000", "[fd00::7]:8000"),
])
def test_host_port(url, want):
    assert host_port(url) == want


class Exploding:
    version = "boom-1"
    tokenizer = None

    def estimate(self, features):
        raise RuntimeError("onnx session died")


class Invalid:
    version = "nan-1"
    tokenizer = None

    def estimate(self, features):
        return DifficultyEstimate(float("nan"), True, 0.1)


@pytest.mark.parametrize("estimator,error", [(Exploding(), "RuntimeError: onnx session died"), (Invalid(), "invalid p_hard nan")])
def test_failing_estimator_routes_through_the_unavailable_rule(fleet, policy, estimator, error):
    d = RoutingEngine(fleet, policy, estimator).route(request_from_prompt("hi"))
    assert (d.rule, d.difficulty_available, d.p_hard) == ("estimator-unavailable", False, None)
    assert d.trace["estimator"]["error"] == error
    assert d.estimator_version == estimator.version


def test_runtime_error_in_a_rule_is_named_in_the_decision(fleet):
    text = ("apiVersion: pointsman/v1\nkind: RoutingPolicy\nrules:\n"
            "  - name: hard\n    when: difficulty.p_hard > 0.5\n    route: {target: frontier-large}\n"
            "  - name: default\n    route: {target: onprem-8b}\n")
    d = RoutingEngine(fleet, compile_policy(text, fleet), FixedDifficulty(None)).route(request_from_prompt("hi"))
    assert d.rule == "default"
    assert d.trace["rules"][0] == {"rule": "hard", "result": "error", "error": "no such overload: difficulty.p_hard is null"}


def test_images_skip_text_only_models(fleet, policy):
    req = parse_route_request({"messages": [{"role": "user", "content": [
        {"type": "text", "text": "what is in this picture?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]})
    d = engine(fleet, policy, 0.1).route(req)
    # the image counts IMAGE_TOKENS (765): a long prompt for the static policy's rules
    assert (d.target, d.rule) == ("frontier-small", "long-cold-prompt") and d.prompt_tokens > 765
    assert d.trace["rules"][-1]["note"].startswith("onprem-70b ineligible (capabilities: does not accept image inputs)")
    assert {c["target"]: c["eligible"] for c in d.trace["candidates"]} == {
        "onprem-8b": False, "onprem-70b": False, "frontier-small": True, "frontier-large": True}


def test_prompt_longer_than_every_context_window(fleet, policy):
    huge = request_from_prompt("x" * 10_000_000)
    with pytest.raises(NoEligibleTarget, match=r"no eligible target: .*context-window: needs 2,500,005 tokens"):
        engine(fleet, policy).route(huge)


def test_policy_must_match_the_fleet(fleet, policy):
    other = parse_fleet(open(fleet.file).read().replace("usd_per_kwh: 0.0", "usd_per_kwh: 0.11", 1))
    with pytest.raises(ValueError, match="compiled against fleet revision"):
        RoutingEngine(other, policy, FixedDifficulty(0.1))


def test_with_policy_and_estimator_return_new_engines(fleet, policy):
    e = engine(fleet, policy)
    text = ("apiVersion: pointsman/v1\nkind: RoutingPolicy\nrules:\n  - name: all\n    route: {target: frontier-small}\n")
    e2 = e.with_policy(compile_policy(text, fleet))
    assert e.route(request_from_prompt("hi")).target == "onprem-8b"
    assert e2.route(request_from_prompt("hi")).target == "frontier-small"
    assert e.with_estimator(FixedDifficulty(0.9)).route(request_from_prompt("hi")).target == "frontier-large"


def test_long_unbroken_words_are_not_undercounted_past_the_context_window(fleet, policy):
    # WordPiece turns a word of over 100 characters into one [UNK]: counted that way, 600 KB of
    # hex was 77 tokens and 8 MB of "x" 981, routed to a 128k-window frontier target. The bound the
    # filter compares counts an [UNK] by its bytes (1.5 per token: BPE tokenizers give hex ~1.75
    # characters per token), so 195,000 hex characters (~111k o200k tokens) need ~130k tokens
    import random

    from pointsman.estimator.model_source import load_estimator

    real = RoutingEngine(fleet, policy, load_estimator("bundled"))
    rng = random.Random(0)
    fits_onprem_only = "".join(rng.choice("0123456789abcdef") for _ in range(195_000))
    d = real.route(request_from_prompt(fits_onprem_only), dispatch=False)
    assert d.prompt_tokens >= 195_000 // 4
    assert fleet.targets[d.target].context_window_tokens > 128_000  # not a 128,000-token frontier target
    for text in ("".join(rng.choice("0123456789abcdef") for _ in range(600_000)), "ACGT" * 150_000, "x" * 8_000_000):
        with pytest.raises(NoEligibleTarget, match=r"no eligible target: .*context-window: needs [\d,]+ tokens"):
            real.route(request_from_prompt(text), dispatch=False)


def test_a_trace_built_later_has_the_cost_the_rule_read(fleet):
    """Without ``routing.explain`` nothing is recorded while the rules run; a trace built afterwards still
    lists the cost() a rule named, from the decision's signals (the price it was decided on)."""
    d = engine(fleet, load_policy(DEFAULT_POLICY_PATH, fleet), 0.665).route(exact(18918), dispatch=False)
    assert d.rule != "hard-prompt"
    large = next(c["estimated_cost_usd"] for c in d.trace["candidates"] if c["target"] == "frontier-large")
    assert d.trace["signals"]['cost("frontier-large")'] == {"value": large, "age_s": 0.0}
    assert large == pytest.approx(0.049855)
