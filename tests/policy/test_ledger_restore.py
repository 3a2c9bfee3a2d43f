"""Spend a Redis ledger lost is restored from the replicas' spend journals, exactly once: a real
redis-server with an append-only file (``appendfsync everysec``, as deploy/kubernetes/redis.yaml),
replicas (``FleetState``) each with its own journal, and the tick the service runs every second
(``Runtime.replay_spend``: ``FleetState.restore_spend`` then ``replay_journal``). Replicas whose clock runs
ahead (``Clock``) fold what they booked more than ``KEEP_RECENT_S`` ago into their journal's sums.

A SIGKILLed redis-server loses nothing (``write()`` precedes the reply; the kernel keeps the file);
what ``everysec`` loses is the part of the file not yet ``fsync``ed when the *machine* dies (power
loss, a node gone): the file then ends at an earlier command. ``Redis.crash`` does that: SIGKILL,
then cut the append-only file back to its length at an earlier acknowledged moment.
"""

from __future__ import annotations

import shutil
import signal
import socket
import sqlite3
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from pointsman.policy.budget.config import BudgetConfig
from pointsman.policy.budget.journal import KEEP_RECENT_S, WAL_LIMIT_BYTES, Booked, SettleArgs, SpendJournal
from pointsman.policy.budget.ledger import LedgerUnavailable
from pointsman.policy.budget.redis_ledger import RedisLedger
from pointsman.policy.budget.units import window_of
from pointsman.policy.decision import new_decision_id
from pointsman.policy.fleet import load_fleet
from pointsman.policy.signals.fleet_state import RESTORE_LOOKBACK_S, Dispatch, DispatchRecord, FleetState
from pointsman.policy.signals.signed_ids import DecisionSigner

E8 = "http://llama-8b-0.inference.internal:8000/v1"
FLEET = load_fleet()
BUDGETED = ("tenant:acme", "team:acme/search")  # tenant:acme has a budget: its decisions hold at dispatch
UNBUDGETED = ("tenant:zeta",)  # no budget: settlement books it without a reservation
CONFIG = BudgetConfig.from_dict({"budgets": [{"scope": "tenant:acme", "window": "day", "limit_usd": 1e6}]})


@pytest.fixture(autouse=True)
def _redis_binary(redis_url):  # skips (or fails under POINTSMAN_REQUIRE_REDIS) without redis-server
    assert shutil.which("redis-server")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Redis:
    """A redis-server on one port with its append-only file in ``folder`` (``appendfsync everysec``).
    ``mark()`` notes the file's length (a command boundary: nothing else writes meanwhile);
    ``crash(mark)`` SIGKILLs it and cuts the file back to that mark (what a machine's death leaves),
    ``wipe()`` SIGKILLs it and empties the folder (a new volume), ``start()`` starts it on the folder."""

    def __init__(self, folder: Path) -> None:
        self.folder, self.port = folder, _port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.folder), "--save", "",
             "--appendonly", "yes", "--appendfsync", "everysec", "--daemonize", "no", "--loglevel", "warning"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(64).startswith(b"+PONG"):
                        return
            except OSError:
                pass
            time.sleep(0.02)
        raise RuntimeError("redis-server did not start")

    def _incr(self) -> Path:
        manifest = (self.folder / "appendonlydir" / "appendonly.aof.manifest").read_text().splitlines()
        name = [line.split()[1] for line in manifest if line.endswith("type i")][-1]
        return self.folder / "appendonlydir" / name

    def mark(self) -> tuple[str, int]:
        """The file's length once every acknowledged command is in it. Under ``everysec`` Redis answers
        before it writes when the previous background fsync is still running (a slow disk: it postpones
        the ``write()`` up to 2 s), so the length is read only once INFO shows an empty AOF buffer and
        no rewrite pending (a cut at an earlier length would also undo commands from before the mark)."""
        import redis

        client = redis.Redis(port=self.port)
        try:
            deadline = time.monotonic() + 20
            while True:
                info = client.info("persistence")
                if (info["aof_buffer_length"] == 0 and not info["aof_rewrite_in_progress"]
                        and not info["aof_rewrite_scheduled"]):
                    break
                assert time.monotonic() < deadline, f"the AOF buffer never drained: {info}"
                time.sleep(0.01)
        finally:
            client.close()
        f = self._incr()
        return f.name, f.stat().st_size

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def crash(self, mark: tuple[str, int]) -> None:
        self.kill()
        f = self._incr()
        if f.name == mark[0] and mark[1] <= f.stat().st_size:
            with f.open("r+b") as fh:
                fh.truncate(mark[1])

    def wipe(self) -> None:
        self.kill()
        shutil.rmtree(self.folder)
        self.folder.mkdir()

    def flushall(self) -> None:
        import redis

        redis.Redis(port=self.port).flushall()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


class Clock:
    """The replicas' clock: from the second day of the current UTC month on (so hours added stay in one month
    window), ``ahead`` seconds added."""

    def __init__(self) -> None:
        self.base = window_of("month", time.time()).start_s + 86400.0 - time.time()
        self.ahead = 0.0

    def __call__(self) -> float:
        return time.time() + self.base + self.ahead

    def age(self, replicas: list[FleetState]) -> None:
        """Every replica ticks, a minute later notes that the store counts its sums, and once what it booked before
        is older than ``KEEP_RECENT_S`` folds it."""
        for ahead in (0.0, RESTORE_LOOKBACK_S + 60.0, KEEP_RECENT_S):
            self.ahead += ahead
            for r in replicas:
                tick(r)


def tick(state: FleetState) -> None:
    """What ``Runtime.replay_spend`` does every second."""
    state.restore_spend()
    state.replay_journal()


def settled(ledger: RedisLedger, scope: str, now: float | None = None) -> int:
    """Settled spend of ``scope`` in the month window of ``now`` (default: the time), nano-USD."""
    status = next(s for s in ledger.snapshot([scope], now).statuses if s.window == "month")
    return round(status.settled_usd * 1e9)


def settle_one(state: FleetState, scopes: tuple[str, ...], n: int, journaled: bool = False) -> int:
    """Dispatch and settle one decision on ``state``; its acknowledged cost in nano-USD. ``journaled``: the
    ledger is away, the settlement goes to the spend journal."""
    record = DispatchRecord(new_decision_id(), "onprem-8b", "aggregated", E8, None, scopes, 0.01, False, 400, 0.7,
                            0.4, state.monotonic())
    decision_id = state.dispatch(Dispatch(record, [], False)).decision_id
    done = state.settle(decision_id, prompt_tokens=300 + n, completion_tokens=20 + n)
    assert done.journaled == journaled
    return round(done.actual_cost_usd * 1e9)


def until_restored(replicas: list[FleetState], ledger: RedisLedger, acked: dict[str, int], deadline_s: float = 60.0) -> None:
    """Tick every replica until each scope's settled spend is its acknowledged sum (a generous deadline,
    no timing claim), then tick more: it must stay there (restored once, never twice)."""
    end = time.monotonic() + deadline_s
    while True:
        for r in replicas:
            tick(r)
        got = {scope: settled(ledger, scope, replicas[0].clock()) for scope in acked}
        if got == acked or time.monotonic() > end:
            break
        time.sleep(0.05)
    assert got == acked
    for _ in range(3):
        for r in replicas:
            tick(r)
    assert {scope: settled(ledger, scope, replicas[0].clock()) for scope in acked} == acked


def _replicas(root: Path, url: str, n: int = 2, clock: Clock | None = None,
              shared: bool = False) -> tuple[RedisLedger, list[FleetState]]:
    """A ledger to read, and ``n`` replicas, each with its own ledger client and journal (on ``clock``); ``shared``:
    one journal file for all (the workers of one host)."""
    signer = DecisionSigner(b"k" * 32)
    return RedisLedger.from_url(url, CONFIG), [
        FleetState(FLEET, RedisLedger.from_url(url, CONFIG), signer=signer,
                   journal=SpendJournal(root / f"journal-{0 if shared else i}.db"), **({"clock": clock} if clock else {}))
        for i in range(n)]


@contextmanager
def _store(root: Path, n: int = 2, clock: Clock | None = None,
           shared: bool = False) -> Iterator[tuple[Redis, RedisLedger, list[FleetState]]]:
    """A ``Redis`` in ``root / "redis"`` and ``_replicas(root, its url, n, clock, shared)``: yields (redis, the ledger to
    read, the replicas); closes every ledger client and stops Redis on the way out."""
    (root / "redis").mkdir()
    redis = Redis(root / "redis")
    ledger, replicas = _replicas(root, redis.url, n, clock, shared)
    try:
        yield redis, ledger, replicas
    finally:
        for r in replicas:
            r.ledger.close()  # type: ignore[union-attr]
        ledger.close()
        redis.stop()


def interrupted(state: FleetState, calls: int, reply_lost: bool) -> None:
    """``restore_spend`` while Redis goes away after ``calls`` of its ledger writes (``add_sums``, ``settle``);
    ``reply_lost``: that last write was applied, its reply lost (a timeout)."""
    ledger, made = state.ledger, [0]

    def failing(method):
        def call(*args, **kwargs):
            made[0] += 1
            if made[0] <= calls:
                return method(*args, **kwargs)
            if reply_lost and made[0] == calls + 1:
                method(*args, **kwargs)
            raise LedgerUnavailable("budget ledger (redis): gone (test)")
        return call

    ledger.add_sums, ledger.settle = failing(ledger.add_sums), failing(ledger.settle)  # type: ignore[union-attr]
    try:
        state.restore_spend()
    finally:
        del ledger.add_sums, ledger.settle  # type: ignore[union-attr]


def folded_meanwhile(state: FleetState, clock: Clock) -> None:
    """``state`` ticks while a worker sharing its journal (which judged by the store it saw before) folds the rows
    booked more than ``KEEP_RECENT_S`` ago right after ``state`` kept its restore's time (``restoring``), before it reads the rows."""
    assert state.journal is not None
    journal, worker = state.journal, SpendJournal(state.journal.path)
    restoring = journal.restoring

    def then_folded(*args):
        kept = restoring(*args)
        worker.compact(clock() - KEEP_RECENT_S, 0.0)
        return kept

    journal.restoring = then_folded  # type: ignore[method-assign]
    try:
        tick(state)
    finally:
        del journal.restoring  # type: ignore[method-assign]


def test_settlements_acknowledged_before_the_machine_died_are_counted_once(tmp_path):
    """Acknowledged settlements the append-only file had not ``fsync``ed are booked again, once."""
    with _store(tmp_path) as (redis, ledger, replicas):
        acked = {scope: 0 for scope in BUDGETED + UNBUDGETED}
        mark = redis.mark()
        for i in range(12):  # the first six before the file's last fsync, the rest lost with its tail
            if i == 6:
                for r in replicas:
                    tick(r)
                mark = redis.mark()
            scopes = BUDGETED if i % 2 else UNBUDGETED
            cost = settle_one(replicas[i % 2], scopes, i)
            for scope in scopes:
                acked[scope] += cost
        redis.crash(mark)
        redis.start()
        assert settled(ledger, "tenant:acme") < acked["tenant:acme"]  # the loss is real
        until_restored(replicas, ledger, acked)


@pytest.mark.parametrize("loss", ["flushall", "new-volume"])
def test_a_ledger_that_comes_back_empty_gets_the_current_windows_spend_back(tmp_path, loss):
    with _store(tmp_path) as (redis, ledger, replicas):
        acked = {scope: 0 for scope in BUDGETED + UNBUDGETED}
        for i in range(8):
            scopes = BUDGETED if i % 3 else UNBUDGETED
            cost = settle_one(replicas[i % 2], scopes, i)
            for scope in scopes:
                acked[scope] += cost
        for r in replicas:
            tick(r)
        if loss == "flushall":
            redis.flushall()
        else:
            redis.wipe()
            redis.start()
        assert settled(ledger, "tenant:acme") == 0
        until_restored(replicas, ledger, acked)


STEP = st.one_of(
    st.tuples(st.just("settle"), st.integers(0, 1), st.booleans()),
    st.tuples(st.just("tick"), st.integers(0, 1)),
    st.tuples(st.just("crash"), st.integers(0, 1000)),  # back to one of the marks so far (a file's unsynced tail)
    st.tuples(st.just("outage"), st.integers(0, 1)),  # Redis away: an unbudgeted settlement goes to the journal
    st.tuples(st.just("flush")),
    st.tuples(st.just("wipe")),
    st.tuples(st.just("age")),  # an hour and more passes: the replicas fold what they booked into sums
    st.tuples(st.just("interrupt"), st.integers(0, 1), st.integers(0, 3), st.booleans()),  # Redis gone mid-restore
    st.tuples(st.just("fold"), st.integers(0, 1), st.booleans()),  # a worker folds rows while a replica restores them
)


@pytest.mark.parametrize("shared", [False, True], ids=["own-journals", "one-journal"])
@settings(max_examples=30, deadline=None)
@example(steps=[("settle", 0, False), ("fold", 0, True)])  # found at 100 examples (seed 1), missed at 30
@given(steps=st.lists(STEP, min_size=1, max_size=14))
def test_spend_per_scope_is_the_acknowledged_sum_whatever_redis_loses(shared, steps):
    """Settlements on two replicas, with a journal each or workers sharing one (``shared``; into it while Redis is away), ticks, a machine's death (SIGKILL
    and the file cut back to any earlier acknowledged moment since the replicas last saw Redis an hour ago),
    FLUSHALL, a new volume, an hour passing (the journals fold their rows into sums), a restore cut short by
    Redis going away (after a write applied or not), a worker sharing a journal folding it while its replica
    restores (after a FLUSHALL or not), in any order: once every replica has ticked, each scope's spend is the sum of the acknowledged
    settlements, nothing lost, nothing doubled; and so again after one more FLUSHALL."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        clock = Clock()
        with _store(root, clock=clock, shared=shared) as (redis, ledger, replicas):
            acked = {scope: 0 for scope in BUDGETED + UNBUDGETED}
            marks = [redis.mark()]
            for n, step in enumerate(steps):
                if step[0] == "settle":
                    scopes = BUDGETED if step[2] else UNBUDGETED
                    cost = settle_one(replicas[step[1]], scopes, n)
                    for scope in scopes:
                        acked[scope] += cost
                elif step[0] == "tick":
                    tick(replicas[step[1]])
                elif step[0] == "outage":
                    redis.kill()
                    acked[UNBUDGETED[0]] += settle_one(replicas[step[1]], UNBUDGETED, n, journaled=True)
                    redis.start()
                elif step[0] == "crash":
                    mark = marks[step[1] % len(marks)]
                    redis.crash(mark)
                    redis.start()
                    marks = [m for m in marks if m[0] != mark[0] or m[1] <= mark[1]]
                elif step[0] == "flush":
                    redis.flushall()
                elif step[0] == "wipe":
                    redis.wipe()
                    redis.start()
                    marks = []
                elif step[0] == "age":
                    clock.age(replicas)
                    marks = []  # seen since: a machine's death loses only what was written after
                elif step[0] == "fold":  # the replica saw the store, an hour passes (the store flushed or not)
                    tick(replicas[step[1]])
                    clock.ahead += KEEP_RECENT_S
                    if step[2]:
                        redis.flushall()
                    folded_meanwhile(replicas[step[1]], clock)
                    marks = []
                else:
                    interrupted(replicas[step[1]], step[2], step[3])
                marks.append(redis.mark())
            until_restored(replicas, ledger, acked, deadline_s=10.0)
            redis.flushall()  # what the journals keep counts each settlement once too
            until_restored(replicas, ledger, acked, deadline_s=10.0)


def test_a_settlement_whose_record_expired_is_not_booked_again_after_a_restart(tmp_path):
    """Its cost is still counted but its record ``r:<id>`` (which makes a settle idempotent) is gone: booking
    it again would count it twice, so a restart re-applies only settlements whose record is still alive."""
    short = BudgetConfig.from_dict({"reservation_ttl_s": 1, "record_retention_s": 1, "budgets": [
        {"scope": "tenant:acme", "window": "day", "limit_usd": 1e6}]})
    with _store(tmp_path) as (redis, ledger, replicas):
        for r in replicas:
            r.ledger.set_config(short)  # type: ignore[union-attr]
        acked = {scope: 0 for scope in BUDGETED + UNBUDGETED}
        for i in range(4):
            scopes = BUDGETED if i % 2 else UNBUDGETED
            cost = settle_one(replicas[i % 2], scopes, i)
            for scope in scopes:
                acked[scope] += cost
        for r in replicas:
            tick(r)
        deadline = time.monotonic() + 60
        while ledger.client.keys(f"{ledger.prefix}r:*") and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not ledger.client.keys(f"{ledger.prefix}r:*")  # every record expired, the spend still counted
        redis.kill()
        redis.start()
        until_restored(replicas, ledger, acked)


def test_a_journaled_settlement_booked_late_is_restored_after_the_next_crash(tmp_path):
    """A settlement journaled during a 10-minute outage is booked when Redis is back; the machine dies before
    the file's next fsync (a crash loop): the restart re-applies what was booked since Redis was last seen alive,
    and that is when the replay wrote it, not when its outcome arrived."""
    (tmp_path / "redis").mkdir()
    redis = Redis(tmp_path / "redis")
    ledger = RedisLedger.from_url(redis.url, CONFIG)
    offset = [0.0]
    replica = FleetState(FLEET, ledger, signer=DecisionSigner(b"k" * 32), journal=SpendJournal(tmp_path / "j.db"),
                         clock=lambda: time.time() + offset[0])
    try:
        tick(replica)
        redis.kill()
        acked = {UNBUDGETED[0]: settle_one(replica, UNBUDGETED, 0, journaled=True)}
        offset[0] += 600.0  # the outage lasts 10 minutes
        redis.start()
        mark = redis.mark()
        tick(replica)  # Redis seen again (a new run_id, nothing lost), then the journal booked
        assert settled(ledger, UNBUDGETED[0]) == acked[UNBUDGETED[0]]
        redis.crash(mark)  # the machine dies before that booking was fsynced
        redis.start()
        assert settled(ledger, UNBUDGETED[0]) == 0
        until_restored([replica], ledger, acked, deadline_s=5.0)
    finally:
        ledger.close()
        redis.stop()


def test_a_settlement_booked_again_after_a_flush_survives_a_crash_right_after(tmp_path):
    """A flushed store gets a settlement 800 s old back (its record created again, alive ``record_retention_s``
    from now); the machine then dies before that was fsynced, the epoch already on disk: the restart re-applies
    it, its record's expiry counted from the re-booking, not from the first one."""
    (tmp_path / "redis").mkdir()
    redis = Redis(tmp_path / "redis")
    ledger = RedisLedger.from_url(redis.url, BudgetConfig.from_dict({"record_retention_s": 1000, "budgets": [
        {"scope": "tenant:acme", "window": "day", "limit_usd": 1e6}]}))
    offset = [-800.0]  # settled 800 s ago
    replica = FleetState(FLEET, ledger, signer=DecisionSigner(b"k" * 32), journal=SpendJournal(tmp_path / "j.db"),
                         clock=lambda: time.time() + offset[0])
    try:
        acked = {UNBUDGETED[0]: settle_one(replica, UNBUDGETED, 0)}
        tick(replica)
        offset[0] = 0.0
        redis.flushall()
        ledger.snapshot([UNBUDGETED[0]])  # another replica's call makes the new epoch
        mark = redis.mark()
        tick(replica)  # the flush seen: the settlement booked again
        assert settled(ledger, UNBUDGETED[0]) == acked[UNBUDGETED[0]]
        redis.crash(mark)
        redis.start()
        assert settled(ledger, UNBUDGETED[0]) == 0
        until_restored([replica], ledger, acked, deadline_s=5.0)
    finally:
        ledger.close()
        redis.stop()


def _folded(state: FleetState) -> tuple[int, int]:
    """(rows, sums) ``state``'s journal keeps."""
    assert state.journal is not None
    with sqlite3.connect(state.journal.path) as conn:
        rows = conn.execute("SELECT COUNT(*) FROM journal").fetchone()[0]
    return rows, len(state.journal.sums())


def test_an_emptied_ledger_gets_the_settlements_folded_an_hour_ago_back_once(tmp_path):
    """A replica keeps what it booked an hour ago as sums per scope set, target and day, not row by row; a flushed
    store gets them back (spend and the target's usage) with the recent rows, once, however often it ticks."""
    clock = Clock()
    with _store(tmp_path, clock=clock) as (redis, ledger, replicas):
        acked = {scope: 0 for scope in BUDGETED + UNBUDGETED}
        for i in range(10):
            if i == 8:  # the first eight an hour old, folded
                clock.age(replicas)
                assert [_folded(r) for r in replicas] == [(0, 2), (0, 2)]  # two scope sets, one target, one day
            scopes = BUDGETED if i % 3 else UNBUDGETED
            cost = settle_one(replicas[i % 2], scopes, i)
            for scope in scopes:
                acked[scope] += cost
        usage = ledger.effective_price_per_token("onprem-8b", "month", clock())
        assert usage.outcomes == 10
        redis.flushall()
        until_restored(replicas, ledger, acked)
        assert ledger.effective_price_per_token("onprem-8b", "month", clock()) == usage


def test_a_repeated_outcome_settled_elsewhere_is_folded_by_one_journal_only(tmp_path):
    """An outcome reported again, to another replica while Redis is away, after the first replica folded its
    settlement: the second replica's journal keeps it until the ledger says it was booked by another settle,
    then forgets it, so an emptied store gets it back once."""
    clock = Clock()
    with _store(tmp_path, clock=clock) as (redis, ledger, replicas):
        record = DispatchRecord(new_decision_id(), "onprem-8b", "aggregated", E8, None, UNBUDGETED, 0.01, False, 400,
                                0.7, 0.4, replicas[0].monotonic())
        decision_id = replicas[0].dispatch(Dispatch(record, [], False)).decision_id
        acked = {UNBUDGETED[0]: round(replicas[0].settle(decision_id, prompt_tokens=300, completion_tokens=20)
                                      .actual_cost_usd * 1e9)}
        clock.age(replicas)
        redis.kill()
        assert replicas[1].settle(decision_id, prompt_tokens=300, completion_tokens=20).journaled
        redis.start()
        tick(replicas[1])  # booked before: a replay of the first replica's settle
        assert _folded(replicas[1]) == (0, 0)
        redis.flushall()
        until_restored(replicas, ledger, acked)


@pytest.mark.parametrize(("calls", "reply_lost"), [(0, False), (0, True), (1, False), (1, True)])
def test_a_restore_cut_short_books_the_sums_once(tmp_path, calls, reply_lost):
    """Redis goes away while a replica books its sums and rows into a flushed store (after ``calls`` writes; the
    last one applied with its reply lost, or not applied): the next ticks finish the restore, each booked once."""
    clock = Clock()
    with _store(tmp_path, n=1, clock=clock) as (redis, ledger, replicas):
        acked = {scope: 0 for scope in BUDGETED + UNBUDGETED}
        for i in range(4):
            if i == 2:
                clock.age(replicas)
            scopes = BUDGETED if i % 2 else UNBUDGETED
            cost = settle_one(replicas[0], scopes, i)
            for scope in scopes:
                acked[scope] += cost
        tick(replicas[0])
        redis.flushall()
        interrupted(replicas[0], calls, reply_lost)
        until_restored(replicas, ledger, acked)


def test_sums_booked_into_a_flushed_store_are_booked_again_after_the_next_crash(tmp_path):
    """The store is flushed, another replica's call makes the new epoch, this replica books its sums; the machine
    dies before that was fsynced, the epoch already on disk: the restart (same epoch) books the sums again, once."""
    clock = Clock()
    with _store(tmp_path, n=1, clock=clock) as (redis, ledger, replicas):
        acked = {UNBUDGETED[0]: settle_one(replicas[0], UNBUDGETED, 0)}
        clock.age(replicas)
        assert _folded(replicas[0]) == (0, 1)
        redis.flushall()
        ledger.snapshot([UNBUDGETED[0]], clock())  # another replica's call makes the new epoch
        mark = redis.mark()
        tick(replicas[0])  # the flush seen: the sums booked again
        assert settled(ledger, UNBUDGETED[0], clock()) == acked[UNBUDGETED[0]]
        redis.crash(mark)
        redis.start()
        assert settled(ledger, UNBUDGETED[0], clock()) == 0
        until_restored(replicas, ledger, acked, deadline_s=5.0)


def test_a_store_cut_back_to_before_its_flush_keeps_the_sums_it_counted(tmp_path):
    """The store is flushed and the replica books its sums into the new one; the machine dies before the FLUSHALL
    was fsynced: the store is back to its old epoch, which still counts the settlements the sums fold (booked there
    one by one): they are not booked again."""
    clock = Clock()
    with _store(tmp_path, n=1, clock=clock) as (redis, ledger, replicas):
        acked = {UNBUDGETED[0]: settle_one(replicas[0], UNBUDGETED, 0)}
        clock.age(replicas)
        assert _folded(replicas[0]) == (0, 1)
        mark = redis.mark()
        redis.flushall()
        tick(replicas[0])
        assert settled(ledger, UNBUDGETED[0], clock()) == acked[UNBUDGETED[0]]
        redis.crash(mark)
        redis.start()
        until_restored(replicas, ledger, acked, deadline_s=5.0)


def test_a_flush_between_reading_the_incarnation_and_noting_the_sums_loses_nothing(tmp_path):
    """The store is flushed just after a replica read its incarnation, before that same tick notes that the store
    counts its sums (``add_sums`` with none): the note must not land in the new, empty store (it would mark the sums
    counted there, and the next tick, seeing the new epoch, would book none of them)."""
    clock = Clock()
    with _store(tmp_path, n=1, clock=clock) as (redis, ledger, replicas):
        state = replicas[0]
        acked = {UNBUDGETED[0]: settle_one(state, UNBUDGETED, 0)}
        clock.age(replicas)
        assert _folded(state) == (0, 1)
        clock.ahead += 60.0  # a minute later: the tick notes the sums again
        incarnation = state.ledger.incarnation  # type: ignore[union-attr]

        def then_flushed():
            seen = incarnation()
            redis.flushall()
            return seen

        state.ledger.incarnation = then_flushed  # type: ignore[union-attr]
        try:
            tick(state)
        finally:
            del state.ledger.incarnation  # type: ignore[union-attr]
        until_restored(replicas, ledger, acked, deadline_s=5.0)


def test_a_settlement_rebooked_with_its_reply_lost_is_still_kept_for_the_next_flush(tmp_path):
    """The store is flushed; the replica books a settlement again and the reply is lost (Redis went away after
    applying it): the next tick finds it booked (a replay of that lost call, at its time, not the row's), which is
    still this replica's booking: the journal keeps it (at that time), so a restart's replay of it and then a second
    flush get it back too."""
    with _store(tmp_path, n=1) as (redis, ledger, replicas):
        acked = {UNBUDGETED[0]: settle_one(replicas[0], UNBUDGETED, 0)}
        tick(replicas[0])
        redis.flushall()
        interrupted(replicas[0], 1, True)  # add_sums (none to book), then the row's settle: applied, reply lost
        until_restored(replicas, ledger, acked, deadline_s=5.0)
        redis.kill()  # a restart that loses nothing: a new run_id, the row's settle a replay
        redis.start()
        until_restored(replicas, ledger, acked, deadline_s=5.0)
        redis.flushall()
        until_restored(replicas, ledger, acked, deadline_s=5.0)


def test_a_decision_made_before_midnight_and_reserved_after_is_restored_in_its_reservations_day(tmp_path):
    """A decision whose record was made just before midnight UTC and whose hold was taken just after is booked in the
    hold's day (and month); an emptied store gets it back in that day, not in the day the record was made."""
    midnight = window_of("month", time.time()).start_s + 86400.0  # the second day of this month begins
    with _store(tmp_path, n=1, clock=lambda: midnight + 0.5) as (redis, ledger, replicas):  # type: ignore[arg-type]
        state = replicas[0]
        record = DispatchRecord(new_decision_id(), "onprem-8b", "aggregated", E8, None, BUDGETED, 0.01, False, 400, 0.7,
                                0.4, state.monotonic() - 1.0)  # made a second before the hold: the previous day
        decision_id = state.dispatch(Dispatch(record, [], False)).decision_id
        cost = round(state.settle(decision_id, prompt_tokens=300, completion_tokens=20).actual_cost_usd * 1e9)

        def day_settled() -> int:
            status = next(s for s in ledger.snapshot([BUDGETED[0]], midnight + 0.5).statuses if s.window == "day")
            return round(status.settled_usd * 1e9)

        assert day_settled() == cost
        tick(state)
        redis.flushall()
        for _ in range(3):
            tick(state)
        assert day_settled() == cost


def test_a_journal_copied_to_another_replica_restores_each_replicas_spend_once(tmp_path, caplog):
    """Replica 1 starts on a copy of replica 0's journal (a cloned volume) holding folded sums under its ``uid``:
    the copy takes a fresh ``uid`` and drops what it inherited, so a flushed store gets both replicas' spend back,
    once (before, the two shared ``a:<uid>``: one booked its sums, the other nothing)."""
    (tmp_path / "redis").mkdir()
    redis = Redis(tmp_path / "redis")
    clock = Clock()
    ledger, (first,) = _replicas(tmp_path, redis.url, n=1, clock=clock)
    try:
        acked = {scope: 0 for scope in BUDGETED + UNBUDGETED}

        def settle(state: FleetState, n: int) -> None:
            for i in range(n):
                scopes = BUDGETED if i % 2 else UNBUDGETED
                cost = settle_one(state, scopes, i)
                for scope in scopes:
                    acked[scope] += cost

        settle(first, 4)
        clock.age([first])
        assert _folded(first) == (0, 2)
        with closing(sqlite3.connect(tmp_path / "journal-0.db")) as src, \
                closing(sqlite3.connect(tmp_path / "journal-1.db")) as dst:
            src.backup(dst)  # the file as a clone of its volume holds it
        second = FleetState(FLEET, RedisLedger.from_url(redis.url, CONFIG), signer=first.signer,
                            journal=SpendJournal(tmp_path / "journal-1.db"), clock=clock)
        assert "a copy of another replica's journal" in caplog.text
        assert second.journal.uid != first.journal.uid and _folded(second) == (0, 0)  # type: ignore[union-attr]
        settle(second, 3)
        settle(first, 2)
        clock.age([first, second])
        redis.flushall()
        until_restored([first, second], ledger, acked)
    finally:
        for r in (first, *([second] if "second" in locals() else [])):
            r.ledger.close()  # type: ignore[union-attr]
        ledger.close()
        redis.stop()


def test_a_journal_opened_on_another_host_is_a_copy(tmp_path, monkeypatch):
    """Same inode, another host name (a cloned volume mounted elsewhere): a fresh ``uid``, no sums."""
    journal = SpendJournal(tmp_path / "j.db")
    with closing(sqlite3.connect(tmp_path / "j.db")) as conn:
        conn.execute("INSERT INTO sums VALUES ('[\"tenant:a\"]', '', '2026-12-07', 0, 1, 5, 1, 0, 1, 1)")
        conn.commit()
    uid = journal.uid
    assert SpendJournal(tmp_path / "j.db").uid == uid and len(journal.sums()) == 1  # reopened where it lives
    monkeypatch.setattr("socket.gethostname", lambda: "another-host")
    copy = SpendJournal(tmp_path / "j.db")
    assert copy.uid != uid and copy.sums() == []


def test_a_compaction_by_a_worker_sharing_the_journal_during_a_restore_counts_each_settlement_once(tmp_path):
    """Another worker on the same journal tries to fold every row into the sums right after this one read them for a
    flushed store (``compact``, injected before ``add_sums``): it folds nothing until the restore is done
    (``SpendJournal.restoring``), so each settlement is booked once, and kept once: in a row or in the sums, and a
    second flush gets it back once too (before, the row booked again was kept as a row and in the sums: counted
    twice after the next flush)."""
    clock = Clock()
    with _store(tmp_path, n=1, clock=clock) as (redis, ledger, (replica,)):
        worker = SpendJournal(tmp_path / "journal-0.db")
        add_sums = replica.ledger.add_sums  # type: ignore[union-attr]

        def compacted_first(*args, **kwargs):
            worker.compact(clock() + 1, 0.0)
            return add_sums(*args, **kwargs)

        acked = {scope: 0 for scope in BUDGETED + UNBUDGETED}
        for i in range(4):
            scopes = BUDGETED if i % 2 else UNBUDGETED
            cost = settle_one(replica, scopes, i)
            for scope in scopes:
                acked[scope] += cost
        tick(replica)
        redis.flushall()
        replica.ledger.add_sums = compacted_first  # type: ignore[union-attr]
        tick(replica)
        del replica.ledger.add_sums  # type: ignore[union-attr]
        assert _folded(replica) == (4, 0)  # held off while the restore was under way
        until_restored([replica], ledger, acked)
        assert worker.compact(clock() + 1, 0.0) == 4  # once it is done, the rows fold
        redis.flushall()  # the next store gets each settlement once too: from the sums, not also from a row
        until_restored([replica], ledger, acked)
        redis.flushall()  # the next store must get each settlement once too: from the sums or a row, not both
        until_restored([replica], ledger, acked)

def test_a_row_folded_meanwhile_is_not_kept_again_by_a_restore(tmp_path):
    """A restore books a row again (``Booked.again``) after a worker folded it: the journal keeps it in the sums
    only, not in a row too (the next emptied store would count it twice); a new booking is kept as a row."""
    journal = SpendJournal(tmp_path / "j.db")
    args: SettleArgs = {"actual_cost_usd": 0.5, "now": 1000.0, "target": "onprem-8b", "prompt_tokens": 3,
                        "cached_tokens": 0, "completion_tokens": 2, "scopes": ["tenant:a"], "issued_s": None}
    journal.book(Booked("d-1", args, 1000.0, 2000.0))
    assert journal.compact(1001.0, 0.0) == 1
    journal.book(Booked("d-1", args, 5000.0, 6000.0, again=True))
    journal.book(Booked("d-2", args, 5000.0, 6000.0))
    assert [b.decision_id for b in journal.booked(0.0, 0.0)] == ["d-2"]
    assert [(s.cost_nusd, s.settlements) for s in journal.sums()] == [(500_000_000, 1)]


def test_a_restore_does_not_pile_up_the_journals_wal(tmp_path):
    """A Redis that came back empty after 3,540 settlements grew the spend journal's WAL from 4 to 80 MB (an SRE's
    test): the restore read every row in one read transaction kept open for the whole pass, so SQLite could not
    reuse its WAL while the pass booked each row again. Now each page of rows is read apart, and the WAL is cut back
    after checkpoints (``WAL_LIMIT_BYTES``): it stays within a few checkpoints' worth, and every row is restored."""
    with _store(tmp_path, n=1) as (redis, ledger, replicas):
        (replica,) = replicas
        acked = {scope: 0 for scope in BUDGETED}
        for i in range(1500):
            cost = settle_one(replica, BUDGETED, i)
            for scope in BUDGETED:
                acked[scope] += cost
        tick(replica)
        assert replica.journal is not None
        wal = Path(f"{replica.journal.path}-wal")
        redis.flushall()
        until_restored(replicas, ledger, acked)
        assert wal.stat().st_size <= 2 * WAL_LIMIT_BYTES, wal.stat().st_size


def test_a_restore_whose_pass_cannot_be_noted_still_reports_what_it_booked(tmp_path):
    """On a full data disk the pass's note (``SpendJournal.see``) failed after every row was booked again, and the
    error escaped ``restore_spend``: ``pointsman_spend_restored_total`` read 0 while the log said thousands were
    booked (an SRE's test). Now it returns the count; the next call starts over and books nothing twice."""
    with _store(tmp_path, n=1) as (redis, ledger, replicas):
        (replica,) = replicas
        acked = {scope: 0 for scope in BUDGETED}
        for i in range(5):
            cost = settle_one(replica, BUDGETED, i)
            for scope in BUDGETED:
                acked[scope] += cost
        tick(replica)
        redis.flushall()
        assert replica.journal is not None
        journal = replica.journal

        def full_disk(*args, **kwargs):
            raise LedgerUnavailable("spend journal: database or disk is full (test)")

        journal.see = full_disk  # type: ignore[method-assign]
        try:
            assert replica.restore_spend() == 5
        finally:
            del journal.see  # type: ignore[method-assign]
        until_restored(replicas, ledger, acked)


def test_a_restore_cut_short_after_another_worker_finished_it_does_not_hold_compaction_off(tmp_path):
    """Two workers share a journal and Redis restarts: worker 1 reads the incarnation last seen, worker 0 then restores
    and notes the new one, and worker 1's pass, started after that, is cut short (Redis away). Before, its ``restoring``
    mark stayed with the incarnation already seen: no pass ran again to forget it, so ``compact`` folded nothing from
    then on and the journal kept a row per settlement until Redis restarted again. Now the workers, finding the mark
    kept under an incarnation seen since, fold an hour later as before; each settlement is still counted once."""
    clock = Clock()
    with _store(tmp_path, clock=clock, shared=True) as (redis, ledger, (w0, w1)):
        acked = {scope: 0 for scope in BUDGETED + UNBUDGETED}
        for i in range(4):
            scopes = BUDGETED if i % 2 else UNBUDGETED
            cost = settle_one((w0, w1)[i % 2], scopes, i)
            for scope in scopes:
                acked[scope] += cost
        tick(w0)
        tick(w1)
        redis.kill()
        redis.start()
        assert w1.journal is not None
        seen = w1.journal.seen

        def then_restored_by_w0():
            got = seen()
            tick(w0)
            return got

        w1.journal.seen = then_restored_by_w0  # type: ignore[method-assign]
        try:
            interrupted(w1, 0, reply_lost=False)
        finally:
            del w1.journal.seen  # type: ignore[method-assign]
        clock.age([w0, w1])
        assert _folded(w0) == (0, 2)  # folded an hour later: two scope sets, one target, one day
        redis.flushall()
        until_restored([w0, w1], ledger, acked)


def test_a_restore_ends_while_settlements_keep_coming(tmp_path):
    """A flushed store, and a worker sharing the journal settles one more decision for each row the restore books
    again (traffic as fast as the restore). Before, the pass read the rows added meanwhile too (booked in the new store,
    nothing to restore) and never ended: its ``restoring`` time kept ``compact`` off, so the journal grew with the
    traffic for good. Now a pass books the rows kept when it began: it ends, each settlement counted once."""
    with _store(tmp_path, shared=True) as (redis, ledger, (traffic, replica)):
        acked = {scope: 0 for scope in BUDGETED}

        def settled_one() -> None:
            cost = settle_one(traffic, BUDGETED, 0)
            for scope in BUDGETED:
                acked[scope] += cost

        for _ in range(1000):  # a full page of rows (``SpendJournal.booked``): the next page is read
            settled_one()
        tick(replica)
        redis.flushall()
        settle, calls = replica.ledger.settle, [0]  # type: ignore[union-attr]

        def with_traffic(*args, **kwargs):
            calls[0] += 1
            if calls[0] > 1500:  # the pass has not ended: cut it short
                raise LedgerUnavailable("budget ledger (redis): gone (test)")
            settled_one()
            return settle(*args, **kwargs)

        replica.ledger.settle = with_traffic  # type: ignore[union-attr]
        try:
            replica.restore_spend()
        finally:
            del replica.ledger.settle  # type: ignore[union-attr]
        assert calls[0] == 1000
        assert replica.journal is not None and not replica.journal.restore_unfinished()
        until_restored([traffic, replica], ledger, acked)
