"""A restore pass cut short resumes where it stopped (``SpendJournal.restored_to``): a real redis-server, replicas
(``FleetState``) with their spend journals, the ledger failing mid-pass (``interrupted``). The pass's progress is kept
with its ``restoring`` mark and belongs to the incarnation it read (epoch and run_id) and to how it chose its rows: a
Redis restarted or flushed since makes the next pass start at the first row again. Whatever the interleaving, each
settlement is counted once in Redis and kept once in the journals (a row or a sum)."""

from __future__ import annotations

import json
import sqlite3
import tempfile
from collections.abc import Callable
from contextlib import closing
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from pointsman.policy.budget.journal import KEEP_RECENT_S, SpendJournal
from pointsman.policy.budget.units import to_nusd
from pointsman.policy.signals.fleet_state import FleetState
from tests.policy.test_ledger_restore import (  # noqa: F401 - _redis_binary: the fixture skips without redis-server
    BUDGETED,
    UNBUDGETED,
    Clock,
    _redis_binary,
    _store,
    folded_meanwhile,
    interrupted,
    settle_one,
    tick,
    until_restored,
)


def counted(state: FleetState, run: Callable[[], object]) -> int:
    """How many ledger ``settle`` calls ``state`` makes while ``run`` runs."""
    settle, calls = state.ledger.settle, [0]  # type: ignore[union-attr]

    def call(*args, **kwargs):
        calls[0] += 1
        return settle(*args, **kwargs)

    state.ledger.settle = call  # type: ignore[union-attr]
    try:
        run()
    finally:
        del state.ledger.settle  # type: ignore[union-attr]
    return calls[0]


def journal_spend(paths: set[Path]) -> dict[str, int]:
    """Each scope's settled nano-USD as the journals keep it: their rows (booked or waiting) and their sums."""
    out: dict[str, int] = {}
    for path in paths:
        with closing(sqlite3.connect(path)) as conn:
            for (args,) in conn.execute("SELECT args FROM journal"):
                a = json.loads(args)
                for scope in a["scopes"] or ():
                    out[scope] = out.get(scope, 0) + to_nusd(a["actual_cost_usd"])
        for s in SpendJournal(path).sums():
            for scope in s.scopes:
                out[scope] = out.get(scope, 0) + s.cost_nusd
    return out


@pytest.mark.parametrize("then", ["resume", "restart", "flush"])
def test_a_pass_cut_short_resumes_after_the_rows_it_booked_again(tmp_path, then):
    """A flushed store, 40 rows to book again; Redis goes away after 25 of them. The next pass books the 15 left
    (``resume``; before, all 40 again: under failures more frequent than a pass lasts it never ended). Redis restarted
    meanwhile (a new run_id: what the pass booked may be lost) or flushed again: the next pass books all 40."""
    with _store(tmp_path, n=1) as (redis, ledger, (replica,)):
        acked = {scope: 0 for scope in BUDGETED}
        for i in range(40):
            cost = settle_one(replica, BUDGETED, i)
            for scope in BUDGETED:
                acked[scope] += cost
        tick(replica)
        redis.flushall()
        interrupted(replica, 1 + 25, reply_lost=False)  # add_sums, then 25 rows
        if then == "restart":
            redis.kill()
            redis.start()
        elif then == "flush":
            redis.flushall()
        assert counted(replica, replica.restore_spend) == (15 if then == "resume" else 40)
        assert replica.journal is not None and not replica.journal.restore_unfinished()
        until_restored([replica], ledger, acked, deadline_s=10.0)
        redis.flushall()  # and the journal keeps each settlement once
        until_restored([replica], ledger, acked, deadline_s=10.0)


STEP = st.one_of(
    st.tuples(st.just("settle"), st.integers(0, 1), st.booleans()),
    st.tuples(st.just("tick"), st.integers(0, 1)),  # a pass cut short resumes here
    # Redis flushed (or not), then gone mid-pass after some writes (the last one applied, its reply lost, or not)
    st.tuples(st.just("cut"), st.integers(0, 1), st.integers(0, 6), st.booleans(), st.booleans()),
    st.tuples(st.just("flush")),
    st.tuples(st.just("restart")),  # SIGKILL and start: a new run_id, nothing lost
    # back to one of the marks since the last FLUSHALL (a file's unsynced tail). Not to before a FLUSHALL: a row booked
    # again after it then reads as booked elsewhere (``_booked_elsewhere``) and is forgotten, with or without resuming
    st.tuples(st.just("crash"), st.integers(0, 1000)),
    st.tuples(st.just("compact"), st.integers(0, 1)),  # a worker sharing the journal tries to fold every row
    st.tuples(st.just("fold"), st.integers(0, 1), st.booleans()),  # an hour on, a worker folds while one restores
    st.tuples(st.just("age")),  # an hour and more passes: the replicas fold what they booked into sums
)


@pytest.mark.parametrize("shared", [False, True], ids=["own-journals", "one-journal"])
@settings(max_examples=25, deadline=None)
# a pass cut short after its first rows, Redis's file then cut back to before them (the epoch kept, a new run_id): the
# next pass must book them again (it would skip them resuming after a pass of another run_id)
@example(steps=[("cut", 0, 0, False, True), ("cut", 0, 3, False, False), ("crash", 0)])
@given(steps=st.lists(STEP, min_size=1, max_size=16))
def test_a_resumed_restore_counts_each_settlement_once(shared, steps):
    """Settlements on two replicas (a journal each, or two workers sharing one), passes cut short after any number of
    writes (the last one applied with its reply lost, or not), resumed by a tick of either worker, Redis flushed,
    restarted or cut back to an earlier acknowledged moment between, compaction tried while a pass is unfinished (it
    folds nothing) and an hour passing (it folds), in any order: once every replica has ticked, each scope's spend in
    Redis is exactly the sum of the acknowledged settlements, and so is what the journals keep; and so again after one
    more FLUSHALL."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        clock = Clock()
        with _store(root, clock=clock, shared=shared) as (redis, ledger, replicas):
            acked = {scope: 0 for scope in BUDGETED + UNBUDGETED}
            marks = [redis.mark()]
            for n in range(6):  # rows enough for a pass to be cut short in its middle
                scopes = BUDGETED if n % 2 else UNBUDGETED
                cost = settle_one(replicas[n % 2], scopes, n)
                for scope in scopes:
                    acked[scope] += cost
            for r in replicas:
                tick(r)
            for n, step in enumerate(steps, 6):
                if step[0] == "settle":
                    scopes = BUDGETED if step[2] else UNBUDGETED
                    cost = settle_one(replicas[step[1]], scopes, n)
                    for scope in scopes:
                        acked[scope] += cost
                elif step[0] == "tick":
                    tick(replicas[step[1]])
                elif step[0] == "cut":
                    if step[4]:
                        redis.flushall()
                        marks = []
                    interrupted(replicas[step[1]], step[2], step[3])
                elif step[0] == "flush":
                    redis.flushall()
                    marks = []
                elif step[0] == "restart":
                    redis.kill()
                    redis.start()
                elif step[0] == "crash":
                    mark = marks[step[1] % len(marks)]
                    redis.crash(mark)
                    redis.start()
                    marks = [m for m in marks if m[0] != mark[0] or m[1] <= mark[1]]
                elif step[0] == "compact":
                    journal = replicas[step[1]].journal
                    assert journal is not None
                    if journal.restore_unfinished():  # else folding now is not this protocol's (``age`` folds)
                        assert SpendJournal(journal.path).compact(clock() + 1, 0.0) == 0
                elif step[0] == "fold":
                    tick(replicas[step[1]])
                    clock.ahead += KEEP_RECENT_S
                    if step[2]:
                        redis.flushall()
                    folded_meanwhile(replicas[step[1]], clock)
                    marks = []
                else:
                    clock.age(replicas)
                    marks = []  # seen since: a machine's death loses only what was written after
                marks.append(redis.mark())
            paths = {r.journal.path for r in replicas if r.journal is not None}
            until_restored(replicas, ledger, acked, deadline_s=10.0)
            assert journal_spend(paths) == acked
            redis.flushall()
            until_restored(replicas, ledger, acked, deadline_s=10.0)
            assert journal_spend(paths) == acked
