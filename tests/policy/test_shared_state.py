"""Two FleetStates sharing one real Redis behave as two replicas of one fleet: what one
dispatches, pushes or marks, the other sees; an outcome settled on either releases the load
on both; a replica that starts late loads the shared state whole."""

from __future__ import annotations

import asyncio
import time
import uuid
from urllib.parse import quote

import pytest

from pointsman.errors import BudgetError
from pointsman.policy.fleet import DEFAULT_FLEET_PATH, load_fleet
from pointsman.policy.signals.fleet_state import Dispatch, DispatchRecord, FleetState
from pointsman.policy.signals.shared_state import Change, RedisSync, SharedRecord, deferred_writes, open_sync

E8 = "http://llama-8b-0.inference.internal:8000/v1"
E8B = "http://llama-8b-1.inference.internal:8000/v1"
P70 = "http://llama-70b-prefill-0.inference.internal:8000/v1"
D70 = "http://llama-70b-decode-0.inference.internal:8000/v1"


@pytest.fixture(scope="module")
def fleet():
    return load_fleet(DEFAULT_FLEET_PATH)


@pytest.fixture
def pair(fleet, redis_url):
    """Two replicas' states on one fresh key prefix."""
    prefix = quote(f"{{t-{uuid.uuid4().hex[:8]}}}:", safe="")
    made = []

    def replica(inbox=None, stream_max_len=None):
        sync = RedisSync.from_url(f"{redis_url}?prefix={prefix}", block_ms=100)
        if stream_max_len is not None:
            sync.stream_max_len = stream_max_len
        st = FleetState(fleet, sync=sync)
        if inbox is not None:
            st.sync.set_inbox(*inbox)
        st.start_sync()
        made.append(st)
        return st

    yield replica
    for st in made:
        st.close()


def eventually(check, timeout_s=5.0):
    deadline = time.monotonic() + timeout_s
    while True:
        got = check()
        if got or time.monotonic() > deadline:
            return got
        time.sleep(0.01)


def inflight(st, endpoint):
    load = st.board.get(endpoint)
    return 0 if load is None else load.inflight_requests


def dispatch(st, did, endpoint=E8, prefill=None, target="onprem-8b", mode="aggregated", session="", hashes=()):
    record = DispatchRecord(did, target, mode, endpoint, prefill, ("tenant:acme",), 0.01, False, 300, 1.0, 1.0,
                            st.monotonic())
    return st.dispatch(Dispatch(record, list(hashes), False, session))


def test_a_dispatch_counts_on_both_and_an_outcome_on_either_releases_both(pair):
    a, b = pair(), pair()
    dispatch(a, "d1", endpoint=D70, prefill=P70, target="onprem-70b", mode="disaggregated")
    assert inflight(a, D70) == 1 and inflight(a, P70) == 1
    assert eventually(lambda: inflight(b, D70) == 1 and inflight(b, P70) == 1)
    settled = b.settle("d1", prompt_tokens=300, completion_tokens=20)   # the outcome reaches the other replica
    assert settled.target == "onprem-70b" and settled.mode == "disaggregated" and settled.released_load == 2
    assert inflight(b, D70) == 0
    assert eventually(lambda: inflight(a, D70) == 0 and inflight(a, P70) == 0)


def test_an_outcome_before_the_dispatch_change_arrives_still_prices_and_releases(pair):
    a, b = pair(), pair()
    dispatch(a, "d2")
    settled = b.settle("d2", prompt_tokens=300, completion_tokens=10)  # b may not have applied it yet
    assert settled.target == "onprem-8b" and settled.actual_cost_usd > 0 and settled.released_load >= 1
    assert eventually(lambda: inflight(a, E8) == 0 and inflight(b, E8) == 0)
    again = a.settle("d2", prompt_tokens=300, completion_tokens=10, target="onprem-8b")
    assert again.released_load == 0


def test_a_dispatch_change_applied_after_its_outcome_counts_nothing(pair):
    """The outcome reaches replica b before b's reader applied the dispatch (b behind, as under load):
    b takes the record from Redis and releases it; the dispatch change, applied afterwards, must not count
    the finished request in flight on b until the TTL (b's own release change is never applied to b)."""
    a, b = pair(), pair()
    held, apply = [], b.sync._apply
    b.sync._apply = held.append  # b's reader falls behind: what it reads waits here
    time.sleep(0.3)  # the reader takes its apply function before each XREAD (block_ms 100)
    dispatch(a, "d5", endpoint=D70, prefill=P70, target="onprem-70b", mode="disaggregated")
    assert eventually(lambda: any(c.kind == "dispatch" and c.record.decision_id == "d5" for c in held))
    settled = b.settle("d5", prompt_tokens=300, completion_tokens=10)
    assert settled.released_load == 2
    b.sync._apply = apply
    time.sleep(0.3)
    for change in held:  # b catches up
        apply(change)
    assert (inflight(b, D70), inflight(b, P70)) == (0, 0)
    assert eventually(lambda: inflight(a, D70) == 0 and inflight(a, P70) == 0)
    dispatch(a, "d6")  # later dispatches still count on b
    assert eventually(lambda: inflight(b, E8) == 1)


def test_deferred_dispatches_are_in_redis_once_awaited_in_order(pair):
    """What the service does on its event loop (``deferred_writes``): dispatches queued for the
    writer thread, pipelined, and awaited before the ids leave. Once awaited, each record is in Redis
    (the other replica's outcome takes it: its target and both in-flight entries), and the changes
    arrived in the order they were made (the last session wins on the other replica)."""
    a, b = pair(), pair()
    ids = [f"q{i}" for i in range(40)]

    async def decide_all() -> None:
        with deferred_writes() as pending:
            for i, did in enumerate(ids):
                dispatch(a, did, endpoint=E8 if i % 2 else E8B, session="s-deferred")
        await pending.written()

    asyncio.run(decide_all())
    for did in ids:   # nothing applied on b yet is needed: the record is taken from Redis
        assert a.sync.take(did) is not None
    assert eventually(lambda: b.session("s-deferred") is not None)
    assert eventually(lambda: b.session("s-deferred")[1] == b.fleet.endpoint_id(E8))  # the last dispatch's
    assert a.sync.status().write_errors == 0


def test_deferred_dispatches_survive_a_lost_connection_and_lost_scripts(pair):
    """The writer thread sends deferred dispatches on its own connection. When Redis closes it and
    forgets its scripts (what a restart does), the next dispatches are still written: once more on a
    new connection, the script loaded with the call; none is counted failed, and the other replica
    applies them."""
    a, b = pair(), pair()

    async def decide(ids) -> None:
        with deferred_writes() as pending:
            for did in ids:
                dispatch(a, did)
        await pending.written()

    asyncio.run(decide(["r0"]))
    local_port = a.sync._writer._conn._sock.getsockname()[1]
    a.sync.client.execute_command("CLIENT", "KILL", "ADDR", f"127.0.0.1:{local_port}")
    a.sync.client.script_flush()
    asyncio.run(decide(["r1", "r2"]))
    assert a.sync.status().write_errors == 0
    assert [a.sync.take(did) is not None for did in ("r0", "r1", "r2")] == [True, True, True]
    assert eventually(lambda: b.sync.status().applied == 6)  # the three dispatches and their releases


def test_a_refused_outcome_leaves_the_shared_record_for_the_corrected_one(pair):
    """Finding E: an outcome naming an unknown target is refused before the other replica's record is
    taken, so the corrected report still finds the decision's target, prices it and releases its load."""
    a, b = pair(), pair()
    dispatch(a, "d3")
    with pytest.raises(BudgetError, match="unknown here"):
        b.settle("d3", prompt_tokens=300, completion_tokens=10, target="no-such-target")
    settled = b.settle("d3", prompt_tokens=300, completion_tokens=10)
    assert settled.target == "onprem-8b" and settled.actual_cost_usd > 0 and settled.released_load >= 1
    assert eventually(lambda: inflight(a, E8) == 0)


def test_an_outcome_forwarded_to_another_logs_inbox_is_delivered_once_and_confirmed(pair):
    delivered, attempts, confirmed = [], [], []

    def deliver_a(payloads):
        attempts.append(len(payloads))
        if len(attempts) == 1:
            return False  # the log was unavailable: the entries stay and come again
        delivered.extend(payloads)
        return True

    a = pair(inbox=("log-a", deliver_a))
    b = pair(inbox=("log-b", lambda payloads: True, lambda keys: confirmed.extend(keys) or True))
    sent = b.sync.forward([("log-a", "d9", '{"decision_id":"d9"}'), ("log-a", "d9/2", '{"decision_id":"d9","n":2}')])
    assert sent == b.sync.incarnation() and sent.split()[0].replace(".", "").isdigit()  # "<epoch> <run_id>"
    assert eventually(lambda: len(delivered) == 2)
    assert delivered == ['{"decision_id":"d9"}', '{"decision_id":"d9","n":2}'] and attempts[0] >= 1
    assert eventually(lambda: a.sync.status().forwarded_in == 2) and b.sync.status().forwarded_in == 0
    assert eventually(lambda: sorted(confirmed) == ["d9", "d9/2"])  # the owner stored them: the forwarder forgets them
    time.sleep(0.3)
    assert len(delivered) == 2 and len(confirmed) == 2  # deleted once stored and once read: never twice
    a.sync.client.delete(f"{a.sync.prefix}epoch")  # what a FLUSHALL does to this prefix's epoch (other tests share Redis)
    assert b.sync.incarnation() != sent  # a store that came back empty is another incarnation


def test_telemetry_health_sessions_and_prefixes_cross(pair):
    a, b = pair(), pair()
    a.push_load("llama-8b-1", {"num_requests_waiting": 40, "kv_cache_usage": 0.5})
    assert eventually(lambda: (b.board.get(E8B) or None) is not None and b.board.get(E8B).num_requests_waiting == 40)
    a.set_health("llama-8b-0", False, "drained for maintenance")
    assert eventually(lambda: not b.is_healthy(E8) and b.healthy_endpoints("onprem-8b") == 1)
    assert "drained" in b.unhealthy()[E8]
    a.set_health("llama-8b-0", True)
    assert eventually(lambda: b.is_healthy(E8))
    dispatch(a, "d3", endpoint=E8B, session="s-1", hashes=[11, 12, 13])
    assert eventually(lambda: b.session("s-1") == ("onprem-8b", E8B))
    assert eventually(lambda: b.prefix_index("onprem-8b", False).match([11, 12, 13]).get(E8B) == 3)


def test_scrape_health_stays_local_and_does_not_clear_an_operator_mark(pair, fleet):
    a, b = pair(), pair()
    a.set_health("llama-8b-0", False, "drained", source="operator")
    a.set_health("llama-8b-0", True, source="scrape")           # a scrape answered: the operator mark stays
    assert not a.is_healthy(E8)
    a.set_health("llama-8b-1", False, "scrape failed 3x: timeout", source="scrape")
    assert eventually(lambda: not b.is_healthy(E8))
    time.sleep(0.1)
    assert b.is_healthy(E8B)                                    # each replica scrapes for itself


def test_a_replica_that_starts_late_loads_the_live_state(pair):
    a = pair()
    dispatch(a, "d4", endpoint=E8B)
    a.push_load("llama-8b-0", {"num_requests_running": 7})
    a.set_health("llama-70b-decode-1", False, "drained")
    late = pair()
    assert inflight(late, E8B) == 1
    assert late.board.get(E8).num_requests_running == 7
    assert not late.is_healthy("http://llama-70b-decode-1.inference.internal:8000/v1")


def test_a_replica_whose_reader_fell_behind_the_stream_cap_reloads_the_state(pair):
    """The change stream is capped (``stream_max_len``); a reader held up while more changes than the cap
    arrived finds its last entry trimmed and loads the state whole, so it counts every dispatch."""
    a, b = pair(stream_max_len=50), pair(stream_max_len=50)
    with b.sync._lock:  # the reader waits for this lock between reads: held up
        for i in range(300):
            dispatch(a, f"behind-{i}")
        assert a.sync.client.xlen(f"{a.sync.prefix}changes") < 300  # trimmed
    assert eventually(lambda: inflight(b, E8) == 300)
    assert b.sync.status().reloads >= 2


def test_redis_down_keeps_local_accounting_and_counts_failures(fleet):
    sync = RedisSync.from_url("redis://127.0.0.1:1/0", timeout_s=0.2)
    st = FleetState(fleet, sync=sync)
    dispatch(st, "d5")
    assert inflight(st, E8) == 1
    assert st.settle("d5", prompt_tokens=10, completion_tokens=1).released_load == 1
    assert inflight(st, E8) == 0
    status = sync.status()
    assert status.write_errors == 2 and (status.last_error or "").startswith("release: ")
    sync.close()


def test_changes_round_trip_and_bad_urls():
    record = SharedRecord("d", "t", "aggregated", "e", None, ("tenant:a",), 0.5, True, 10, 1.0, 1.0, 1.5e9)
    assert SharedRecord.from_json(record.to_json()) == record
    change = Change("dispatch", "o", 1.5e9, record=record, block_hashes=(1, 2), session_id="s")
    assert Change.from_json(change.to_json()) == change
    health = Change("health", "o", 1.0, endpoint="e", healthy=False, reason="x")
    assert Change.from_json(health.to_json()) == health
    with pytest.raises(ValueError, match="not a state change"):
        Change.from_json('{"kind": "nope"}')
    with pytest.raises(ValueError, match="scheme 'http'"):
        open_sync("http://localhost:6379")
    assert not open_sync(None).shared


def test_the_other_replica_knows_the_decisions_output_cap(pair):
    """An ok outcome without usage answered by another target is booked at the decision's output cap
    (``routes_reports.estimate_booking``, from ``known``). The replica the outcome reaches holds the
    decision's record from the shared state, which ``known`` prefers to the signed id; it dropped the
    cap (0: the fleet's default 256 output tokens, a request capped at 4,000 booked 15.5x too little on
    frontier-large). Found by a fresh-eyes test."""
    a, b = pair(), pair()
    record = DispatchRecord("d-cap", "onprem-8b", "aggregated", E8, None, ("tenant:acme",), 0.01, False, 300, 1.0,
                            1.0, a.monotonic(), output_cap_tokens=4000)
    a.dispatch(Dispatch(record, [], False, ""))
    assert eventually(lambda: b.record("d-cap") is not None)
    known = b.known("d-cap")
    assert known is not None and known.output_cap_tokens == 4000  # before: 0


def test_a_reload_announce_redis_refused_is_sent_while_the_reader_follows(pair, monkeypatch):
    """An announce that failed while the reader saw no gap (Redis refused the write: a restart between two
    reads, a full memory) is sent at the next periodic check. Before, unsent announces went out only after
    the reader's own reconnect, so another worker kept the old file for good (the CI failure of
    test_a_budgets_reload_while_redis_is_down_reaches_every_worker_when_it_is_back, once in about 5 runs)."""
    import redis

    from pointsman.policy.signals import shared_state

    monkeypatch.setattr(shared_state, "RELOAD_CHECK_S", 0.2)
    a, b = pair(), pair()
    seen: list[str] = []
    b.sync.on_reload(seen.append)
    real, calls = RedisSync._announce, []

    def refused_once(self, what):
        calls.append(what)
        if len(calls) == 1:
            raise redis.ConnectionError("refused")
        return real(self, what)

    monkeypatch.setattr(RedisSync, "_announce", refused_once)
    a.sync.announce_reload("budgets")  # refused: kept to be sent; both readers stay connected
    # the stream's announce and the count check may both bring it (a re-read of an unchanged file is a no-op)
    assert eventually(lambda: "budgets" in seen), (calls, seen)


def test_reloads_announced_before_a_process_follows_are_re_read_when_it_starts(fleet, redis_url):
    """A process reads its files before its reader starts: a reload another worker announced in between is in
    ``{P}reloads`` but not in the stream this process follows. At the first check it re-reads every file
    counted (the hook set before ``start``, as the service does); later checks only what changed since.
    Before, the first check only took the counts, so such a worker kept the old budgets for good (the
    flaky failure of test_a_budgets_reload_applies_on_every_worker under load)."""
    prefix = quote(f"{{t-{uuid.uuid4().hex[:8]}}}:", safe="")
    first = FleetState(fleet, sync=RedisSync.from_url(f"{redis_url}?prefix={prefix}", block_ms=100))
    late = FleetState(fleet, sync=RedisSync.from_url(f"{redis_url}?prefix={prefix}", block_ms=100))
    try:
        first.start_sync()
        first.sync.announce_reload("budgets")  # while the late process has read its files but not followed yet
        first.sync.announce_reload("policy")
        seen: list[str] = []
        late.sync.on_reload(seen.append)
        late.start_sync()
        assert sorted(seen) == ["budgets", "policy"]
        late.start_sync()  # a new state's start (a fleet reload): nothing changed, nothing re-read
        assert sorted(seen) == ["budgets", "policy"]
        first.sync.announce_reload("fleet")
        assert eventually(lambda: "fleet" in seen), seen
    finally:
        first.close()
        late.close()
