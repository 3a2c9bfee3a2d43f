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
from pointsman.policy.rules.compiler import STATIC_POLICY_PATH, load_policy
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
