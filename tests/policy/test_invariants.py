"""Invariants of issue 22 as properties over generated inputs (hypothesis); each failed on the code
before its fix (the failing example is in the commit that fixed it)."""

from __future__ import annotations

import unicodedata

from hypothesis import given, settings
from hypothesis import strategies as st

from pointsman.errors import RequestError
from pointsman.estimator.estimate import FixedDifficulty
from pointsman.policy.budget.config import BudgetConfig
from pointsman.policy.engine import RoutingEngine
from pointsman.policy.fleet import EndpointInfo, Pool, load_fleet
from pointsman.policy.rules.compiler import STATIC_POLICY_PATH, compile_policy, load_policy
from pointsman.policy.selection.pickers import EndpointSelectionSpec, MinCostPicker, PickInput, PoolView
from pointsman.policy.signals.fleet_state import FleetState
from pointsman.policy.signals.load_board import EndpointLoad
from pointsman.request import RequestView, parse_route_request, request_from_prompt

FAST = settings(max_examples=60, deadline=None)


@FAST
@given(n=st.integers(2, 6), picks=st.integers(2, 120), running=st.integers(0, 5), prompt=st.integers(1, 5000),
       output=st.integers(1, 2000))
def test_endpoints_that_tie_on_score_share_picks_evenly(n, picks, running, prompt, output):
    """Fair ties: n endpoints with the same reading, each pick released before the next (so they stay
    tied), are chosen within one pick of each other. Before: every pick went to the first in file order."""
    pool = Pool(gpus_per_replica=1, prefill_tokens_per_s=10_000, decode_tokens_per_s=5_000,
                endpoints=[f"http://e{i}:8000/v1" for i in range(n)])
    eps = [EndpointInfo(u, u, f"e{i}", "t", "aggregated", pool) for i, u in enumerate(pool.endpoints)]
    loads = [EndpointLoad(e.id, "push", 0.0, num_requests_running=running) for e in eps]
    picker = MinCostPicker(EndpointSelectionSpec())
    counts = [0] * n
    for turn in range(picks):
        chosen = picker.pick(PickInput(prompt, output, turn=turn), PoolView("t", "aggregated", pool, eps, loads, [True] * n)).chosen
        assert chosen is not None
        counts[chosen] += 1
    assert max(counts) - min(counts) <= 1, counts


@FAST
@given(prompts=st.lists(st.text(st.characters(codec="utf-8", categories=("L", "N", "Zs")), min_size=1, max_size=40)
                        .filter(str.strip), min_size=2, max_size=40))
def test_the_engine_shares_tied_endpoints_evenly(prompts):
    """Through the engine (default fleet, a short prompt goes to onprem-8b's two idle endpoints), each
    decision settled before the next, so the endpoints stay tied. Before: the first endpoint got all."""
    fleet = load_fleet()
    engine = RoutingEngine(fleet, load_policy(STATIC_POLICY_PATH, fleet), FixedDifficulty(0.1), state=FleetState(fleet))
    counts: dict[str, int] = {}
    for text in prompts:
        d = engine.route(request_from_prompt(text))
        assert d.target == "onprem-8b"
        counts[d.endpoints[0].url] = counts.get(d.endpoints[0].url, 0) + 1
        engine.state.settle(d.decision_id, prompt_tokens=d.prompt_tokens, completion_tokens=10)
    assert len(prompts) < 2 or len(counts) == 2, counts
    assert max(counts.values()) - min(counts.values(), default=0) <= 1, counts


MEDIUM = " ".join(f"Sentence {i} of a medium-sized prompt about routing requests to replicas." for i in range(60))


@FAST
@given(pattern=st.lists(st.booleans(), min_size=2, max_size=60))
def test_tied_endpoints_share_picks_evenly_whatever_else_the_traffic_does(pattern):
    """Short prompts (onprem-8b's two idle endpoints, tied) interleaved with medium ones (onprem-70b), each
    settled before the next: the 8B endpoints' picks stay within one of each other. Before, ties took turns
    by the count of every decision, so with every other request going to the 70B model all 8B requests went
    to the same endpoint (20 of 20 over HTTP, alternating)."""
    fleet = load_fleet()
    engine = RoutingEngine(fleet, load_policy(STATIC_POLICY_PATH, fleet), FixedDifficulty(0.1), state=FleetState(fleet))
    counts = {e.url: 0 for e in fleet.pool_endpoints("onprem-8b", "aggregated")}
    for i, short in enumerate(pattern):
        d = engine.route(request_from_prompt(f"Say hi {i}." if short else f"{MEDIUM} {i}"))
        assert (d.target == "onprem-8b") == short
        if short:
            counts[d.endpoints[0].url] += 1
        engine.state.settle(d.decision_id, prompt_tokens=d.prompt_tokens, completion_tokens=10)
    assert max(counts.values()) - min(counts.values()) <= 1, counts


ZERO_WIDTH = ("\u200b", "\u200c", "\u200d", "\u2060", "\ufeff", "\u00ad")
NAMES = st.text(st.characters(codec="utf-8", categories=("L", "M", "N")), min_size=1, max_size=20)


def _look_alikes(draw, name: str) -> list[str]:
    zw = draw(st.sampled_from(ZERO_WIDTH))
    at = draw(st.integers(0, len(name)))
    return [name, unicodedata.normalize("NFD", name), unicodedata.normalize("NFC", name), name[:at] + zw + name[at:]]


@FAST
@given(data=st.data(), name=NAMES)
def test_one_identity_per_string(data, name):
    """Look-alike strings — NFC, NFD, a zero-width character inside — are one tenant, team and session
    (one budget scope, one ``request.tenant``), or all refused; a budgets file naming the scope in any
    of those forms limits every one of them. Before: an NFD tenant missed its tenant's $0 budget, and a
    zero-width variant was a second, unlimited scope."""
    views, refused = [], 0
    variants = _look_alikes(data.draw, name)
    for v in variants:
        try:
            req = parse_route_request({"messages": [{"role": "user", "content": "hi"}],
                                       "routing": {"tenant": v, "team": v, "session_id": v}})
            views.append(RequestView.of(req))
        except RequestError:
            refused += 1
    assert refused in (0, len(variants)), (variants, refused)
    if refused:
        return
    assert len({view.scopes for view in views}) == 1, [view.scopes for view in views]
    assert len({(view.routing.tenant, view.routing.session_id) for view in views}) == 1
    written = data.draw(st.sampled_from(variants))
    config = BudgetConfig.from_dict({"apiVersion": "pointsman/v1", "kind": "Budgets",
                                      "budgets": [{"scope": f"tenant:{written}", "window": "day", "limit_usd": 0}]})
    assert all(config.budgets_for(view.scopes) for view in views), (written, [view.scopes for view in views])


_WORD = st.sampled_from(["the", "cache", "of", "a", "conversation", "information", "international",
                         "accommodation", "turn", "prefill", "decode", "endpoint", "é", "数据", "42", "x\ny"])
#: Texts of a few runs of one word each (runs make long texts likely within a few examples).
WORDS = st.lists(st.tuples(_WORD, st.integers(1, 400)), min_size=1, max_size=5).map(
    lambda runs: " ".join(" ".join([w] * n) for w, n in runs))


@FAST
@given(first=WORDS, answer=WORDS, follow_up=WORDS)
def test_the_new_part_of_a_follow_up_is_not_counted_cached(first, answer, follow_up):
    """Conservation in cache accounting, through the engine (default fleet, onprem-8b): after turn 1 is
    dispatched, turn 2 (turn 1, the answer, a new question) counts as cached at most the share of its
    text the fleet has seen — never the new part, never more than its prompt. Before: 128-token blocks
    of 512 bytes were counted as 128 tokens each, so a text of more than 4 bytes per token (English)
    was counted 100% cached (708 new tokens of 3,022 in the fault campaign)."""
    fleet = load_fleet()
    policy = compile_policy("apiVersion: pointsman/v1\nkind: RoutingPolicy\nrules:\n"
                            "  - name: all\n    route: {target: onprem-8b, mode: aggregated}\n", fleet)
    engine = RoutingEngine(fleet, policy, FixedDifficulty(0.1), state=FleetState(fleet))
    turn1 = [{"role": "user", "content": first}]
    d1 = engine.route(parse_route_request({"messages": turn1}))
    turn2 = [*turn1, {"role": "assistant", "content": answer}, {"role": "user", "content": follow_up}]
    req2 = parse_route_request({"messages": turn2, "routing": {"explain": True}})
    d2 = engine.route(req2)
    assert d1.target == d2.target == "onprem-8b"
    seen = len(RequestView.of(parse_route_request({"messages": turn1})).conversation_utf8)
    total = len(RequestView.of(req2).conversation_utf8)
    for pool in d2.trace["endpoints"]:
        for c in pool["candidates"]:
            assert c["local_hit_tokens"] + c["shared_hit_tokens"] <= d2.prompt_tokens
            assert c["local_hit_tokens"] <= d2.prompt_tokens * seen / total + 1e-9, (c, d1.prompt_tokens, seen, total)
