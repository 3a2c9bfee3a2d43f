"""Property tests of the whole engine (hypothesis):

1. a decision always names an existing target that passes every eligibility filter, on
   healthy endpoints of its own pools, or fails with a "no eligible target" error that
   names, for every candidate, the filter that removed it — and that filter's reason holds;
2. 32 concurrent decisions against one budget, through ``RoutingEngine.route`` (filters,
   rules, fallbacks, reservation at dispatch) and then their outcomes, never spend more
   than the budget plus one request's estimate — with SQLite (several ledgers on one
   file, as several processes) and with a live redis-server (two service replicas);
3. the least cost the ``budget`` filter checks (``min_cost``) is at most every placement's.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from unittest import mock

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from pointsman.estimator.estimate import FixedDifficulty
from pointsman.estimator.features import extract_features
from pointsman.policy import engine as engine_module
from pointsman.policy.budget.config import BudgetConfig
from pointsman.policy.budget.units import to_nusd
from pointsman.policy.engine import RoutingEngine
from pointsman.policy.fleet import FrontierTarget, load_fleet
from pointsman.policy.rules.compiler import DEFAULT_POLICY_DIR, load_policy
from pointsman.policy.selection.filters import NoEligibleTarget
from pointsman.policy.signals.fleet_state import FleetState
from pointsman.request import parse_route_request

NOW = datetime(2025, 3, 14, 12, tzinfo=UTC).timestamp()
FLEET = load_fleet()
POLICIES = {p.stem: load_policy(p, FLEET) for p in sorted(DEFAULT_POLICY_DIR.glob("*.yaml"))
            if not p.name.endswith(".cases.yaml")}
ENDPOINTS = sorted(FLEET.endpoints)
FILTER_NAMES = {"context-window", "capabilities", "tenants", "health", "budget"}
TENANT_BUDGETS = {"zero": 0.0, "tiny": 0.002, "rich": 1000.0}


def budgets() -> BudgetConfig:
    return BudgetConfig.from_dict({"budgets": [{"scope": f"tenant:{t}", "window": "day", "limit_usd": v}
                                               for t, v in TENANT_BUDGETS.items()]})


requests = st.fixed_dictionaries({
    "prompt_tokens": st.one_of(st.integers(1, 4000), st.integers(4000, 300_000)),
    "max_tokens": st.one_of(st.none(), st.integers(1, 200_000)),
    "images": st.booleans(),
    "tools": st.booleans(),
    "tenant": st.sampled_from([None, "zero", "tiny", "rich", "acme"]),
    "session": st.sampled_from([None, "s1", "s2"]),
})


def body(r: dict) -> dict:
    content = [{"type": "text", "text": "Describe this carefully."}]
    if r["images"]:
        content.append({"type": "image_url", "image_url": {"url": "https://example.com/x.png"}})
    out = {"messages": [{"role": "user", "content": content}],
           "routing": {"prompt_tokens": r["prompt_tokens"], "tenant": r["tenant"], "session_id": r["session"]}}
    if r["max_tokens"]:
        out["max_tokens"] = r["max_tokens"]
    if r["tools"]:
        out["tools"] = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    return out


#: The least an image of unknown size (given by URL) bills on the packaged frontier targets, which the window must
#: hold (OpenAI's tile rule at one tile: gpt-4o-mini 2,833 + 5,667, gpt-4o 85 + 170); the on-prem ones take no images.
LEAST_IMAGE = {"frontier-small": 8500, "frontier-large": 255}


def prompt_tokens(r: dict, target: str) -> int:
    """The prompt's tokens ``target``'s context window must hold: the supplied count, unless it is implausibly
    low for the text (then the engine counts the prompt itself and compares its safe-side bound, whose 1,600
    tokens an image are replaced), and the image at the least it bills there (the window refuses a target only
    for what surely does not fit; the cost counts the most)."""
    features = extract_features(parse_route_request(body(r)))
    text = r["prompt_tokens"] if features.prompt_tokens_exact else features.prompt_tokens_upper - 1600 * r["images"]
    return text + (LEAST_IMAGE.get(target, 0) if r["images"] else 0)


def filter_holds(filter_name: str, target: str, r: dict, state: FleetState, policy) -> bool:
    """Does ``filter_name`` really exclude ``target`` for request ``r`` (independent check)?"""
    t = FLEET.targets[target]
    if filter_name == "context-window":
        return prompt_tokens(r, target) + (r["max_tokens"] or 1) > t.context_window_tokens
    if filter_name == "capabilities":
        return (r["images"] and not t.capabilities.images) or (r["tools"] and not t.capabilities.tools)
    if filter_name == "tenants":
        allowed = policy.filters.tenants.get(target)
        return allowed is not None and r["tenant"] not in allowed
    if filter_name == "health":  # no healthy endpoint, or no mode whose pools have one
        if state.healthy_endpoints(target) == 0:
            return True
        if isinstance(t, FrontierTarget):
            return False

        def up(role: str) -> bool:
            return any(state.is_healthy(e.id) for e in FLEET.pool_endpoints(target, role))
        aggregated = up("aggregated") or (t.pools.aggregated is None and up("decode"))
        return not aggregated and not (up("prefill") and up("decode"))
    if filter_name == "budget":
        return r["tenant"] in TENANT_BUDGETS
    return False


def eligible(target: str, r: dict, state: FleetState, policy) -> list[str]:
    """Filters the chosen target fails (must be empty)."""
    return [f for f in ("context-window", "capabilities", "tenants")
            if filter_holds(f, target, r, state, policy)] + (["health"] if state.healthy_endpoints(target) == 0 else [])


@pytest.fixture(scope="module")
def ledger(tmp_path_factory):
    from pointsman.policy.budget.sqlite_ledger import SqliteLedger

    led = SqliteLedger(tmp_path_factory.mktemp("props") / "budget.db", budgets())
    yield led
    led.close()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@example(policy_name="default", r={"prompt_tokens": 1, "max_tokens": 131063, "images": False, "tools": False,
                                   "tenant": None, "session": None}, p_hard=None, down=set(), load={}, dispatch=False)
@given(policy_name=st.sampled_from(sorted(POLICIES)), r=requests,
       p_hard=st.one_of(st.none(), st.floats(0, 1)),
       down=st.sets(st.sampled_from(ENDPOINTS), max_size=len(ENDPOINTS)),
       load=st.dictionaries(st.sampled_from(ENDPOINTS), st.integers(0, 80), max_size=6),
       dispatch=st.booleans())
def test_a_decision_names_an_eligible_target_or_says_which_filter_removed_which(
        ledger, policy_name, r, p_hard, down, load, dispatch):
    policy = POLICIES[policy_name]
    state = FleetState(FLEET, ledger, clock=lambda: NOW, monotonic=lambda: 50.0)
    for e in down:
        state.set_health(e, False, "down")
    for e, waiting in load.items():
        if FLEET.endpoints[e].role != "api":
            state.push_load(e, {"num_requests_running": waiting // 2, "num_requests_waiting": waiting}, now=49.0)
    engine = RoutingEngine(FLEET, policy, FixedDifficulty(p_hard), state=state)
    request = parse_route_request(body(r))
    try:
        d = engine.route(request, dispatch=dispatch)
    except NoEligibleTarget as exc:
        message = str(exc)
        assert message.startswith("no eligible target: ")
        assert exc.considered, message
        for target in exc.considered:
            excl = exc.exclusions.get(target)
            assert excl is not None, f"{target} named without a reason: {message}"
            assert excl.filter in FILTER_NAMES and f"{target} ({excl.filter}: " in message
            assert filter_holds(excl.filter, target, r, state, policy), (target, excl, r)
        return
    assert d.target in FLEET.targets
    assert eligible(d.target, r, state, policy) == []
    t = FLEET.targets[d.target]
    assert d.mode in ("aggregated", "disaggregated") and d.endpoints
    for e in d.endpoints:
        if isinstance(t, FrontierTarget):
            assert e.role == "api" and e.url == t.base_url
            continue
        info = FLEET.endpoints[e.url]
        assert info.target == d.target and e.url not in down
    roles = {e.role for e in d.endpoints}
    assert roles == ({"prefill", "decode"} if d.mode == "disaggregated" else {"aggregated"} if not
                     isinstance(t, FrontierTarget) else {"api"})
    assert d.estimated_cost_usd >= 0
    for fb in d.fallbacks:
        assert fb.target in FLEET.targets and fb.target != d.target
        assert eligible(fb.target, r, state, policy) == []
    if dispatch and r["tenant"] in TENANT_BUDGETS:
        assert state.record(d.decision_id).reserved
        state.settle(d.decision_id, prompt_tokens=1, completion_tokens=1, actual_cost_usd=d.estimated_cost_usd)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@example(policy_name="cascade", r={"prompt_tokens": 203, "max_tokens": None, "images": False, "tools": False,
                                   "tenant": None, "session": None}, down=set(), warm=False,
         load={**{e: (80, 0.1, 0.1) for e in ENDPOINTS if "llama-70b-" in e and e[17].isdigit()},
               **{e: (0, 1.0, 1.0) for e in ENDPOINTS if "llama-70b-decode" in e}})  # the Azure replay's request 50
@given(policy_name=st.sampled_from(sorted(POLICIES)), r=requests,
       down=st.sets(st.sampled_from(ENDPOINTS), max_size=len(ENDPOINTS)),
       load=st.dictionaries(st.sampled_from(ENDPOINTS), st.tuples(st.integers(0, 80), st.floats(0, 1), st.floats(0, 1)),
                            max_size=8),
       warm=st.booleans())
def test_the_budget_filters_bound_is_below_every_placement(ledger, policy_name, r, down, load, warm):
    """``min_cost`` (what the ``budget`` filter checks) is at most the cost of every placement ``route`` makes, the
    chosen one's and its fallbacks', whatever the health, the pools' utilizations and the cached prefix (``warm``:
    the same prompt dispatched before): the filter never removes a target whose hold would fit."""
    policy = POLICIES[policy_name]
    state = FleetState(FLEET, ledger, clock=lambda: NOW, monotonic=lambda: 50.0)
    for e in down:
        state.set_health(e, False, "down")
    for e, (waiting, u_p, u_d) in load.items():
        if FLEET.endpoints[e].role != "api":
            state.push_load(e, {"num_requests_running": waiting // 2, "num_requests_waiting": waiting,
                                "prefill_utilization": u_p, "decode_utilization": u_d}, now=49.0)
    engine = RoutingEngine(FLEET, policy, FixedDifficulty(0.5), state=state)
    placed: list[tuple[str, float, float]] = []
    place = engine_module.place

    def checked(live, target, mode):
        out = place(live, target, mode)
        if out is not None:
            placed.append((target, live.min_cost(target).usd, out.cost.usd))
        return out

    request = parse_route_request(body(r))
    with mock.patch.object(engine_module, "place", checked):
        for _ in range(2 if warm else 1):
            try:
                engine.route(request, dispatch=warm)
            except NoEligibleTarget:
                pass
    for target, bound, usd in placed:
        assert bound <= usd * (1 + 1e-12), (target, bound, usd)


# -- the budget under concurrency, through the engine --------------------------------------

N = 32
STATES_PER_STORE = {"sqlite": 4, "redis": 2}


def race(engines, prompts, outcome_factors):
    """Route every request in its own thread (released together), then settle its outcome at
    ``factor`` × the estimate (None: released, never ran). Returns the accepted decisions."""
    barrier = threading.Barrier(len(prompts))
    accepted: list = [None] * len(prompts)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        engine = engines[i % len(engines)]
        request = parse_route_request({"messages": [{"role": "user", "content": "a question"}],
                                       "routing": {"prompt_tokens": prompts[i], "tenant": "acme"}})
        barrier.wait()
        try:
            d = engine.route(request)
        except NoEligibleTarget:
            return
        except BaseException as exc:  # noqa: BLE001 - surfaced below
            errors.append(exc)
            return
        accepted[i] = d
        factor = outcome_factors[i]
        try:
            if factor is None:
                engine.state.release(d.decision_id, NOW)
            else:
                engine.state.settle(d.decision_id, prompt_tokens=prompts[i], completion_tokens=10,
                                    actual_cost_usd=round(d.estimated_cost_usd * factor, 9), now=NOW)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return accepted


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(share=st.one_of(st.just(0.0), st.floats(0.05, 1.2)), p_hard=st.sampled_from([0.1, 0.4, 0.9]),
       prompts=st.lists(st.integers(100, 60_000), min_size=N, max_size=N),
       factors=st.lists(st.one_of(st.none(), st.floats(0.5, 1.0)), min_size=N, max_size=N),
       policy_name=st.sampled_from(["default", "cost-saver", "budget-pacing"]))
def test_32_concurrent_decisions_never_spend_more_than_the_budget_plus_one_estimate(
        budget_ledgers, share, p_hard, prompts, factors, policy_name):
    # the limit is a share of what the 32 requests would cost unconstrained, so they contend for it
    free = RoutingEngine(FLEET, POLICIES[policy_name], FixedDifficulty(p_hard))
    unconstrained = sum(free.route(parse_route_request({"messages": [{"role": "user", "content": "a question"}],
                                                        "routing": {"prompt_tokens": p}}), dispatch=False)
                        .estimated_cost_usd for p in prompts)
    limit = round(share * unconstrained, 6)
    config = BudgetConfig.from_dict({"budgets": [{"scope": "tenant:acme", "window": "day", "limit_usd": limit}]})
    store = budget_ledgers.store()
    engines = []
    for _ in range(STATES_PER_STORE[budget_ledgers.backend]):
        state = FleetState(FLEET, budget_ledgers.open(config, store), clock=lambda: NOW)
        engines.append(RoutingEngine(FLEET, POLICIES[policy_name], FixedDifficulty(p_hard), state=state))
    accepted = race(engines, prompts, factors)
    decisions = [d for d in accepted if d is not None]
    estimates = [d.estimated_cost_usd for d in decisions]
    status = engines[0].state.ledger.snapshot(["tenant:acme"], NOW).binding
    spent = to_nusd(status.settled_usd) + to_nusd(status.reserved_usd)
    max_estimate = to_nusd(max(estimates, default=0.0))
    assert spent <= to_nusd(limit) + max_estimate
    # outcomes never cost more than their estimate here, so the ledger keeps the stronger bound
    assert spent <= to_nusd(limit)
    assert status.reserved_usd == 0.0  # every decision was settled or released
    if limit == 0:
        assert decisions == []  # a zero budget means zero
    booked = sum(to_nusd(round(d.estimated_cost_usd * f, 9)) for d, f in zip(accepted, factors)
                 if d is not None and f is not None)
    assert abs(spent - booked) <= len(decisions)  # nano-USD rounding per outcome
