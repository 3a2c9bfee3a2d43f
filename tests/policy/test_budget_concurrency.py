"""The budget guarantee under concurrency, on SQLite and on a live redis-server:
32 concurrent decisions against one budget never spend more than the budget plus one
request's estimate (issue 3). In fact the ledger keeps the stronger bound: spend stays
within the limit, plus the overruns of settlements above their reservation.

Threads start together behind a barrier and use several ledger objects on one store
(SQLite: 4 connections to one file, plus a test with 4 processes; Redis: 2 clients,
as 2 service replicas would). A deliberately non-atomic ledger shows the checks can fail.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pointsman.policy.budget.config import BudgetConfig
from pointsman.policy.budget.ledger import BudgetExceeded
from pointsman.policy.budget.sqlite_ledger import SqliteLedger
from pointsman.policy.budget.units import NUSD_PER_USD, to_nusd

NOW = datetime(2025, 3, 14, 12, tzinfo=UTC).timestamp()
TENANT, TEAM = "tenant:acme", "team:acme/search"
N = 32
LEDGERS_PER_STORE = {"sqlite": 4, "redis": 2}


@dataclass(frozen=True)
class Req:
    """One decision: its estimate, its scopes, and what its outcome costs (None: released)."""

    estimate_usd: float
    scopes: tuple[str, ...]
    actual_usd: float | None = None


def config(tenant_limit_usd: float, team_limit_usd: float) -> BudgetConfig:
    return BudgetConfig.from_dict({"budgets": [
        {"scope": TENANT, "window": "day", "limit_usd": tenant_limit_usd},
        {"scope": TEAM, "window": "month", "limit_usd": team_limit_usd}]})


cents = st.integers(0, 40).map(lambda c: c / 100)
scopes = st.sampled_from([(TENANT,), (TENANT, TEAM), (TEAM,)])
reserve_only = st.lists(st.builds(Req, cents, scopes), min_size=N, max_size=N)
full_cycle = st.lists(st.builds(lambda e, s, f: Req(e, s, None if f is None else round(e * f, 6)),
                                cents, scopes, st.one_of(st.none(), st.floats(0, 1.5))), min_size=N, max_size=N)
limits = st.tuples(st.integers(0, 300).map(lambda c: c / 100), st.integers(0, 200).map(lambda c: c / 100))


def race(ledgers, reqs: list[Req], settle: bool, barrier=None, offset: int = 0) -> list[bool]:
    """Every request in its own thread, released together; returns which were accepted.
    With ``settle``, an accepted request then settles its ``actual_usd`` (or is released)."""
    barrier = barrier or threading.Barrier(len(reqs))
    accepted: list[bool | None] = [None] * len(reqs)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        ledger, req, did = ledgers[i % len(ledgers)], reqs[i], f"d{offset + i}"
        barrier.wait()
        try:
            ledger.reserve(did, req.scopes, req.estimate_usd, NOW)
            accepted[i] = True
            if settle:
                if req.actual_usd is None:
                    ledger.release(did, NOW)
                else:
                    ledger.settle(did, req.actual_usd, NOW)
        except BudgetExceeded:
            accepted[i] = False
        except BaseException as exc:  # noqa: BLE001 - surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(reqs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return [bool(a) for a in accepted]


def spent_nusd(ledger, scope: str, window: str) -> int:
    status = next(s for s in ledger.snapshot([scope], NOW).statuses if s.window == window)
    return to_nusd(status.settled_usd) + to_nusd(status.reserved_usd)


def violations(cfg: BudgetConfig, ledger, reqs: list[Req], accepted: list[bool], settled: bool) -> list[str]:
    """Every way the outcome breaks the guarantee (empty when it holds).

    For each budget: the ledger's spend equals what the accepted requests hold or cost;
    it stays within the limit plus the overruns (and so within the limit plus one
    request's estimate when no outcome costs more than its estimate); and, for a race of
    reservations alone, every refused request really did not fit the final state.
    """
    out = []
    max_estimate = max(to_nusd(r.estimate_usd) for r in reqs)
    for b in cfg.budgets:
        mine = [(r, a) for r, a in zip(reqs, accepted) if b.scope in r.scopes]
        if settled:
            expected = sum(to_nusd(r.actual_usd) for r, a in mine if a and r.actual_usd is not None)
            overruns = sum(max(0, to_nusd(r.actual_usd) - to_nusd(r.estimate_usd))
                           for r, a in mine if a and r.actual_usd is not None)
        else:
            expected = sum(to_nusd(r.estimate_usd) for r, a in mine if a)
            overruns = 0
        spent = spent_nusd(ledger, b.scope, b.window)
        if spent != expected:
            out.append(f"{b.scope}: ledger says {spent} nUSD spent, the accepted requests account for {expected}")
        if spent > b.limit_nusd + overruns:
            out.append(f"{b.scope}: spent {spent / NUSD_PER_USD} > limit {b.limit_usd} + overruns {overruns}")
        if overruns == 0 and spent > b.limit_nusd + max_estimate:
            out.append(f"{b.scope}: spent {spent / NUSD_PER_USD} > limit {b.limit_usd} + one estimate")
    if not settled:
        for r, a in zip(reqs, accepted):
            if a:
                continue
            fits = all(b.scope not in r.scopes or (
                spent_nusd(ledger, b.scope, b.window) < b.limit_nusd
                and spent_nusd(ledger, b.scope, b.window) + to_nusd(r.estimate_usd) <= b.limit_nusd)
                for b in cfg.budgets)
            if fits:
                out.append(f"refused {r} although it fits the final state")
    return out


#: fork() is only safe from a process without other threads. The full suite leaves many
#: (onnxruntime pools, servers, ledger checkpointers), and a child forked while one of them
#: holds SQLite's global mutex deadlocks in sqlite3.connect. So the fork scenarios run in a
#: fresh interpreter started by ``test_fork_scenarios_in_a_clean_interpreter``.
IN_CLEAN_INTERPRETER = os.environ.get("POINTSMAN_CLEAN_INTERPRETER") == "1"
fork_scenario = pytest.mark.skipif(not IN_CLEAN_INTERPRETER,
                                   reason="fork scenario: runs in a fresh interpreter (see IN_CLEAN_INTERPRETER)")


def test_fork_scenarios_in_a_clean_interpreter():
    if IN_CLEAN_INTERPRETER:
        pytest.skip("already in the clean interpreter")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--import-mode=importlib",
         f"{__file__}::test_concurrent_processes_never_overspend_sqlite",
         f"{__file__}::test_sqlite_commits_survive_a_killed_process"],
        env={**os.environ, "POINTSMAN_CLEAN_INTERPRETER": "1"}, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "4 passed" in result.stdout, result.stdout[-2000:]


def open_store(factory, cfg):
    store = factory.store()
    return [factory.open(cfg, store) for _ in range(LEDGERS_PER_STORE[factory.backend])]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lims=limits, reqs=reserve_only)
def test_concurrent_reservations_never_overspend(budget_ledgers, lims, reqs):
    cfg = config(*lims)
    ledgers = open_store(budget_ledgers, cfg)
    accepted = race(ledgers, reqs, settle=False)
    assert violations(cfg, ledgers[0], reqs, accepted, settled=False) == []


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lims=limits, reqs=full_cycle)
def test_concurrent_decisions_with_outcomes_never_overspend(budget_ledgers, lims, reqs):
    cfg = config(*lims)
    ledgers = open_store(budget_ledgers, cfg)
    accepted = race(ledgers, reqs, settle=True)
    assert violations(cfg, ledgers[0], reqs, accepted, settled=True) == []


def _process_worker(path: str, inherited: SqliteLedger | None, cfg_dict: dict, reqs: list[Req], offset: int,
                    barrier, results) -> None:
    # half the workers use a ledger opened by the parent before the fork (it must reopen its connection)
    ledger = inherited or SqliteLedger(path, BudgetConfig.from_dict(cfg_dict))
    local = threading.Barrier(len(reqs))
    barrier.wait()
    results.put((offset, race([ledger], reqs, settle=False, barrier=local, offset=offset)))


@fork_scenario
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_concurrent_processes_never_overspend_sqlite(tmp_path, seed):
    rng = random.Random(seed)
    reqs = [Req(rng.randint(0, 40) / 100, rng.choice([(TENANT,), (TENANT, TEAM)])) for _ in range(N)]
    cfg = config(rng.randint(50, 300) / 100, rng.randint(50, 200) / 100)
    path = str(tmp_path / "ledger.db")
    # No background checkpointer in the parent: fork() must happen with no other thread
    # alive, or a child can inherit SQLite's global mutex held and hang in sqlite3.connect.
    parent = SqliteLedger(path, cfg, checkpoint_interval_s=0)
    parent.snapshot([TENANT], NOW)  # its connection is live at fork time
    assert threading.active_count() == 1, threading.enumerate()
    ctx = multiprocessing.get_context("fork")
    barrier, results = ctx.Barrier(4), ctx.Queue()
    procs = [ctx.Process(target=_process_worker, args=(path, parent if k % 2 else None, cfg.to_dict(),
                                                       reqs[k * 8:(k + 1) * 8], k * 8, barrier, results))
             for k in range(4)]
    for p in procs:
        p.start()
    accepted: list[bool] = [False] * N
    for _ in procs:
        offset, part = results.get(timeout=60)
        accepted[offset:offset + len(part)] = part
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert violations(cfg, parent, reqs, accepted, settled=False) == []
    assert 0 < sum(accepted) < N  # the scenario is tight enough to refuse some


class CheckThenHold:
    """A deliberately wrong ledger: reads the snapshot, then holds in a second step."""

    def __init__(self, checker, writer) -> None:
        self.checker, self.writer = checker, writer

    def reserve(self, decision_id, scopes, estimated_cost_usd, now):
        if not self.checker.snapshot(scopes, now).fits(estimated_cost_usd):
            raise BudgetExceeded(scopes[0], "day", "", 0.0, 0.0, estimated_cost_usd)
        time.sleep(0.005)
        self.writer.reserve(decision_id, scopes, estimated_cost_usd, now)


def test_the_checks_catch_a_ledger_that_is_not_atomic(budget_ledgers):
    cfg = config(1.0, 1.0)
    store = budget_ledgers.store()
    racy = CheckThenHold(budget_ledgers.open(cfg, store), budget_ledgers.open(BudgetConfig(), store))
    reqs = [Req(0.25, (TENANT,)) for _ in range(N)]
    accepted = race([racy], reqs, settle=False)
    found = violations(cfg, budget_ledgers.open(cfg, store), reqs, accepted, settled=False)
    assert any("> limit" in v for v in found)


def _reserve_settle_then_die(path: str, cfg_dict: dict) -> None:
    import os
    import signal

    ledger = SqliteLedger(path, BudgetConfig.from_dict(cfg_dict))
    ledger.reserve("kept", [TENANT], 0.4, NOW)
    ledger.settle("kept", 0.3, NOW, target="t", completion_tokens=30)
    ledger.reserve("held", [TENANT], 0.5, NOW)
    os.kill(os.getpid(), signal.SIGKILL)


@fork_scenario
def test_sqlite_commits_survive_a_killed_process(tmp_path):
    cfg = config(1.0, 1.0)
    path = str(tmp_path / "ledger.db")
    assert threading.active_count() == 1, threading.enumerate()  # fork() only from a single-threaded process
    proc = multiprocessing.get_context("fork").Process(target=_reserve_settle_then_die, args=(path, cfg.to_dict()))
    proc.start()
    proc.join(timeout=60)
    assert proc.exitcode == -9
    ledger = SqliteLedger(path, cfg)
    assert spent_nusd(ledger, TENANT, "day") == to_nusd(0.8)
    assert ledger.settle("kept", 9.0, NOW).replayed
    assert ledger.effective_price_per_token("t", "day", NOW).completion_tokens == 30
