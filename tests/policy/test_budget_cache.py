"""The budget snapshot cache never disagrees with the ledger in a way that refuses wrongly.

Each interleaving is forced with a real SQLite ledger: ``HookedLedger`` runs a hook in the middle
of a ledger call (after the read or the commit, before it returns), so another change lands
exactly where a race would put it.
"""

from collections.abc import Callable
from datetime import UTC, datetime

import pytest

from pointsman.estimator.estimate import FixedDifficulty
from pointsman.policy.budget.config import BudgetConfig
from pointsman.policy.budget.ledger import BudgetSnapshot, Reservation
from pointsman.policy.budget.sqlite_ledger import SqliteLedger
from pointsman.policy.engine import RoutingEngine
from pointsman.policy.fleet import load_fleet
from pointsman.policy.rules.compiler import compile_policy
from pointsman.policy.selection.filters import NoEligibleTarget
from pointsman.policy.signals.fleet_state import Dispatch, DispatchRecord, FleetState
from pointsman.request import parse_route_request

NOW = datetime(2025, 3, 14, 12, tzinfo=UTC).timestamp()
E8 = "http://llama-8b-0.inference.internal:8000/v1"
ACME = ("tenant:acme",)


class HookedLedger(SqliteLedger):
    """A real SQLite ledger that runs ``after_read`` once a snapshot has been read and
    ``after_reserve`` once a reservation has committed (each once, then cleared)."""

    after_read: Callable[[], None] | None = None
    after_reserve: Callable[[], None] | None = None
    reads = 0

    def snapshot(self, scopes, now=None) -> BudgetSnapshot:
        snap = super().snapshot(scopes, now)
        self.reads += 1
        hook, self.after_read = self.after_read, None
        if hook is not None:
            hook()
        return snap

    def reserve(self, decision_id, scopes, estimated_cost_usd, now=None) -> Reservation:
        res = super().reserve(decision_id, scopes, estimated_cost_usd, now)
        hook, self.after_reserve = self.after_reserve, None
        if hook is not None:
            hook()
        return res


@pytest.fixture(scope="module")
def fleet():
    return load_fleet()


def replica(fleet, path, limit=1.0, ttl_s=60.0):
    """A FleetState on the ledger at ``path`` whose kept snapshots never age out in these tests
    (``ttl_s`` 60 s), so only the cache's own bookkeeping can make them right."""
    config = BudgetConfig.from_dict({"budgets": [{"scope": "tenant:acme", "window": "day", "limit_usd": limit}]})
    return FleetState(fleet, HookedLedger(path, config), clock=lambda: NOW, budget_snapshot_ttl_s=ttl_s)


def hold(st, did, usd):
    record = DispatchRecord(did, "onprem-8b", "aggregated", E8, None, ACME, usd, False, 400, 1.0, 1.0, 100.0)
    return st.dispatch(Dispatch(record, [], False, ""), now=NOW)


def reserved_usd(st):
    return st.budget_snapshot(ACME, NOW).binding.reserved_usd


def ledger_reserved_usd(st):
    return st.ledger.snapshot(ACME, NOW).binding.reserved_usd


def test_a_read_during_a_reservation_does_not_count_it_twice(fleet, tmp_path):
    st = replica(fleet, tmp_path / "b.db")
    # the read runs after the hold committed and before this replica counted it in its cache
    st.ledger.after_reserve = lambda: st.budget_snapshot(ACME, NOW)
    hold(st, "d1", 0.60)
    assert ledger_reserved_usd(st) == pytest.approx(0.60)
    assert reserved_usd(st) == pytest.approx(0.60)  # before: $1.20, and a $0.30 request refused
    assert st.budget_snapshot(ACME, NOW).fits(0.30)


def test_a_read_overlapping_a_release_is_not_kept(fleet, tmp_path):
    st = replica(fleet, tmp_path / "b.db")
    hold(st, "d1", 0.90)
    # the read sees the hold; the release commits (and is applied here) before the read is kept
    st.ledger.after_read = lambda: st.release("d1", now=NOW)
    assert st.budget_snapshot(ACME, NOW).binding.reserved_usd == pytest.approx(0.90)  # what it read
    assert ledger_reserved_usd(st) == 0.0
    assert reserved_usd(st) == 0.0  # before: the released $0.90 kept counting for the TTL


def test_a_read_overlapping_a_settlement_is_not_kept(fleet, tmp_path):
    st = replica(fleet, tmp_path / "b.db")
    hold(st, "d1", 0.90)
    st.ledger.after_read = lambda: st.settle("d1", prompt_tokens=0, completion_tokens=0, actual_cost_usd=0.01,
                                             now=NOW)
    st.budget_snapshot(ACME, NOW)
    snap = st.budget_snapshot(ACME, NOW)
    assert (snap.binding.reserved_usd, snap.binding.settled_usd) == (0.0, pytest.approx(0.01))


def test_a_settlement_of_scopes_this_replica_does_not_know_is_not_kept(fleet, tmp_path):
    a, b = replica(fleet, tmp_path / "b.db"), replica(fleet, tmp_path / "b.db")
    hold(b, "theirs", 0.90)  # another replica's decision; its outcome arrives here
    assert reserved_usd(a) == pytest.approx(0.90)  # kept by a
    a.settle("theirs", prompt_tokens=0, completion_tokens=0, actual_cost_usd=0.0, now=NOW)
    assert reserved_usd(a) == 0.0  # before: a kept the settled hold (it did not know the scopes)
    hold(b, "theirs-2", 0.90)
    a.budgets_changed()  # nothing kept: the next read goes to the ledger
    a.ledger.after_read = lambda: a.release("theirs-2", now=NOW)  # scopes unknown here, mid-read
    a.budget_snapshot(ACME, NOW)
    assert reserved_usd(a) == 0.0


POLICY = """apiVersion: pointsman/v1
kind: RoutingPolicy
rules:
  - name: default
    route: {target: onprem-8b}
"""


def test_a_refusal_is_confirmed_by_the_ledger_not_the_cache(fleet, tmp_path):
    a, b = replica(fleet, tmp_path / "b.db"), replica(fleet, tmp_path / "b.db")
    engine = RoutingEngine(fleet, compile_policy(POLICY, fleet), FixedDifficulty(0.1), state=a)
    request = parse_route_request({"messages": [{"role": "user", "content": "hi"}],
                                   "routing": {"tenant": "acme", "explain": True}})
    what_if = RoutingEngine(fleet, compile_policy(POLICY, fleet), FixedDifficulty(0.1), state=b)
    est = what_if.route(request, dispatch=False).estimated_cost_usd
    hold(b, "theirs", 1.0 - est / 2)  # another replica holds almost all of the $1
    assert not a.budget_snapshot(ACME, NOW).fits(est)  # a keeps that read (60 s here)
    b.release("theirs", now=NOW)  # the other replica's call failed: its hold is gone
    reads = a.ledger.reads
    decision = engine.route(request)  # before: "no eligible target: onprem-8b (budget: ...)"
    assert decision.target == "onprem-8b" and a.ledger.reads == reads + 1
    assert ledger_reserved_usd(a) == pytest.approx(est, abs=1e-9)
    hold(b, "theirs-2", 1.0 - est - est / 2)  # now the ledger itself is full: the refusal stands, confirmed
    with pytest.raises(NoEligibleTarget, match="budget"):
        engine.route(request)


def test_a_snapshot_kept_from_yesterday_is_not_read_after_midnight(fleet, tmp_path):
    """A snapshot read 10 ms before 00:00 UTC served decisions for its 50 ms TTL after midnight: the
    budget signals read yesterday's spend against today's clock (spent_fraction 0.96, pace_gap 0.96),
    so budget-pacing.yaml sent a p_hard 0.9 prompt to onprem-8b by its budget-reserve rule instead of
    frontier-large. A kept snapshot now serves only the UTC day it was read in."""
    from pointsman.policy.rules.compiler import DEFAULT_POLICY_DIR, load_policy

    midnight = datetime(2025, 3, 15, tzinfo=UTC).timestamp()
    clock = [midnight - 0.01]
    config = BudgetConfig.from_dict({"budgets": [{"scope": "tenant:acme", "window": "day", "limit_usd": 1.0}]})
    st = FleetState(fleet, SqliteLedger(tmp_path / "b.db", config), clock=lambda: clock[0])
    st.ledger.reserve("yesterday", ACME, 0.96, now=clock[0])
    engine = RoutingEngine(fleet, load_policy(DEFAULT_POLICY_DIR / "budget-pacing.yaml", fleet), FixedDifficulty(0.9),
                           state=st)
    request = parse_route_request({"messages": [{"role": "user", "content": "hi"}], "routing": {"tenant": "acme"}})
    assert engine.route(request, dispatch=False).rule == "budget-reserve"  # 96% of today's budget spent
    clock[0] = midnight + 0.01  # 20 ms later: a new UTC day, nothing spent in it yet
    assert st.budget_snapshot(ACME, clock[0]).binding.window_id == "day:2025-03-15"
    assert engine.route(request, dispatch=False).rule == "hard-prompt-paced"


def test_a_month_budget_running_ahead_paces_beside_a_day_budget_with_less_left(fleet, tmp_path):
    """budget-pacing.yaml raises the frontier's p_hard bar by ``pace_gain x pace_gap``. With a day budget of $10 and
    a month budget of $100, on 10 March at 23:00 UTC with $9 spent today and $60 this month, the day budget binds
    (least USD left: $1) and is on pace (0.9 spent at 0.96 of the day), while the month has spent 0.6 of its limit
    at 0.32 of its window. The signals read the binding budget alone, so pace_gap was -0.06 and a p_hard 0.75
    prompt went to frontier-large; they now take the largest gap over the budgets (0.28: the bar 0.67 + 0.14)."""
    from pointsman.policy.rules.compiler import DEFAULT_POLICY_DIR, load_policy

    now = datetime(2025, 3, 10, 23, tzinfo=UTC).timestamp()
    config = BudgetConfig.from_dict({"budgets": [{"scope": "tenant:acme", "window": "day", "limit_usd": 10.0},
                                                 {"scope": "tenant:acme", "window": "month", "limit_usd": 100.0}]})
    st = FleetState(fleet, SqliteLedger(tmp_path / "b.db", config), clock=lambda: now)
    for day in range(2, 8):  # $51 settled earlier this month
        then = datetime(2025, 3, day, 12, tzinfo=UTC).timestamp()
        st.ledger.reserve(f"day-{day}", ACME, 8.5, now=then)
        st.ledger.settle(f"day-{day}", 8.5, now=then)
    st.ledger.reserve("today", ACME, 9.0, now=now)
    engine = RoutingEngine(fleet, load_policy(DEFAULT_POLICY_DIR / "budget-pacing.yaml", fleet), FixedDifficulty(0.75),
                           state=st)
    request = parse_route_request({"messages": [{"role": "user", "content": "hi"}],
                                   "routing": {"tenant": "acme", "explain": True}})
    decision = engine.route(request, dispatch=False)
    signals = decision.to_dict()["trace"]["signals"]
    binding = st.budget_snapshot(ACME, now).binding
    assert (binding.window, binding.remaining_usd) == ("day", pytest.approx(1.0))
    assert signals["budget.spent_fraction"]["value"] == pytest.approx(0.9)  # the day's: nearer its limit than 0.6
    assert signals["budget.pace_gap"]["value"] == pytest.approx(0.6 - (9 + 23 / 24) / 31)  # before: 0.9 - 23/24
    assert decision.target != "frontier-large" and decision.rule != "hard-prompt-paced"
