"""Budget admission agrees with the ledger under concurrency and failing upstreams, end to end.

Two real ``pointsman serve`` replicas share one budget ledger (SQLite file, or a real
redis-server). Eight gateway clients each route on one replica, "call" the upstream, which
fails 30% of the time (reported as ``error``/``timeout``/``cancelled`` without usage: the hold
is released), and report the outcome to the other replica (a load balancer in front of both). Every decision reserves ~$0.50 against a tenant budget of
8 reservations + every ok call's cost + 5% of one reservation: with at most eight requests in
flight the ledger never holds more, so every refusal would be false (and one stale hold in a
replica's view of the ledger is enough to refuse).
Afterwards nothing is held and the ledger's settled total is the sum of the acknowledgements.
"""

from __future__ import annotations

import concurrent.futures
import random
import threading

import httpx
import pytest

from pointsman.estimator.estimate import FixedDifficulty
from pointsman.policy.budget.config import BudgetConfig
from pointsman.policy.budget.factory import open_ledger
from pointsman.policy.engine import RoutingEngine
from pointsman.policy.fleet import load_fleet
from pointsman.policy.rules.compiler import compile_policy
from pointsman.request import parse_route_request

POLICY = """apiVersion: pointsman/v1
kind: RoutingPolicy
rules:
  - name: default
    route: {target: frontier-large}
"""
BODY = {"messages": [{"role": "user", "content": "Summarise the incident report in three lines."}],
        "max_tokens": 50_000, "routing": {"tenant": "acme"}}
CLIENTS, ROUNDS = 8, 12
#: What an ok call costs on frontier-large: 12 prompt tokens at $2.50/M + 20 completion tokens at $10/M.
OK_COST_USD = 12 * 2.50e-6 + 20 * 10.0e-6


def estimate_usd() -> float:
    """What one decision reserves (frontier-large, 50,000 output tokens at $10/M: ~$0.50)."""
    fleet = load_fleet()
    engine = RoutingEngine(fleet, compile_policy(POLICY, fleet), FixedDifficulty(0.5))
    return engine.route(parse_route_request(BODY), dispatch=False).estimated_cost_usd


def upstream_failure(rng: random.Random) -> str | None:
    """The upstream call's fate: ``error``/``timeout``/``cancelled`` 30% of the time, else None (ok)."""
    return rng.choice(["error", "timeout", "cancelled"]) if rng.random() < 0.3 else None


def ok_calls() -> int:
    """How many upstream calls succeed over the whole run (each client's draws are seeded)."""
    n = 0
    for i in range(CLIENTS):
        rng = random.Random(i)
        n += sum(upstream_failure(rng) is None for _ in range(ROUNDS))
    return n


def run_clients(bases: list[str]) -> tuple[list[str], float, int]:
    """Eight clients, four deciding on each replica and reporting outcomes to the other (a load
    balancer in front of both); returns (refusals, acknowledged settled USD, outcomes)."""
    refusals: list[str] = []
    acked_usd: list[float] = []
    lock = threading.Lock()

    def client(i: int) -> None:
        rng = random.Random(i)
        deciding, reporting = bases[i % 2], bases[(i + 1) % 2]
        with httpx.Client(base_url=deciding, timeout=30) as route, httpx.Client(base_url=reporting, timeout=30) as report:
            for _ in range(ROUNDS):
                r = route.post("/v1/route", json=BODY)
                if r.status_code != 200:
                    with lock:
                        refusals.append(f"{r.status_code} {r.text[:300]}")
                    continue
                outcome: dict[str, object] = {"decision_id": r.json()["decision_id"]}
                failure = upstream_failure(rng)
                if failure:
                    outcome["status"] = failure
                else:
                    outcome["usage"] = {"prompt_tokens": 12, "completion_tokens": 20}
                ack = report.post("/v1/outcomes", json=outcome)
                assert ack.status_code in (200, 201, 202), ack.text  # 202: forwarded to the deciding replica
                settlement = ack.json()["acks"][0].get("settlement")
                with lock:
                    acked_usd.append(settlement["actual_cost_usd"] if settlement else 0.0)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return refusals, sum(acked_usd), len(acked_usd)


def start_both(serve, data_dirs, **settings) -> list[str]:
    """Start two ``pointsman serve`` replicas at once (each start waits for its /readyz)."""
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        return [proc_base[1] for proc_base in pool.map(lambda d: serve(d, **settings), data_dirs)]


@pytest.mark.parametrize("backend", ["sqlite", "redis"])
def test_concurrent_clients_with_failing_upstreams_see_no_false_denial(backend, serve, tmp_path, request):
    est = estimate_usd()
    assert 0.45 < est < 0.55
    # the most the ledger can ever hold: 7 other requests in flight + every ok call settled + this one
    settled_usd = ok_calls() * OK_COST_USD
    limit_usd = 8 * est + settled_usd + 0.05 * est
    budgets = tmp_path / "budgets.yaml"
    budgets.write_text(f"kind: Budgets\nbudgets:\n  - {{scope: 'tenant:acme', window: day, limit_usd: {limit_usd:.9f}}}\n")
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    settings = {"budgets_path": budgets, "policy_path": policy, "scrape_interval_s": 0, "model": "bundled"}
    if backend == "sqlite":  # both replicas on one data folder: one outcome log, one ledger
        url = f"sqlite:///{tmp_path / 'budget.db'}"
        bases = start_both(serve, [tmp_path / "data"] * 2, budget_ledger=url, **settings)
    else:  # separate data folders; outcomes reach the deciding replica's log through the shared state
        redis = request.getfixturevalue("redis_url")
        url = f"{redis}?prefix=admission-{tmp_path.name}:"
        bases = start_both(serve, [tmp_path / "replica-0", tmp_path / "replica-1"], budget_ledger=url, state_url=redis,
                           **settings)

    refusals, acked_usd, outcomes = run_clients(bases)

    assert refusals == []  # before: 422 "no eligible target: frontier-large (budget: ...)" while the ledger had room
    assert outcomes == CLIENTS * ROUNDS
    assert acked_usd == pytest.approx(settled_usd)  # so no refusal could have been a true one
    ledger = open_ledger(url, BudgetConfig.load(budgets))
    try:
        day = next(s for s in ledger.snapshot(["tenant:acme"]).statuses if s.window == "day")
    finally:
        ledger.close()
    assert day.reserved_usd == 0.0  # nothing held afterwards
    assert day.settled_usd == pytest.approx(acked_usd, abs=1e-6)  # settled = the acknowledgements
