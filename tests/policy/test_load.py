"""LoadBoard: push validation, in-flight accounting with TTL, the merge rule, staleness modes."""

import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pointsman.errors import RequestError
from pointsman.policy.signals.load_board import (
    SATURATED_WAITING,
    EndpointLoad,
    LoadBoard,
    StalenessPolicy,
    aggregate_loads,
    apply_staleness,
)

A = "http://10.0.0.1:8000"
B = "http://10.0.0.2:8000"


# ---------------------------------------------------------------- push

def test_push_records_fields_and_age():
    board = LoadBoard()
    got = board.push(A, {"num_requests_running": 3, "num_requests_waiting": 2.0, "kv_cache_usage": 0.5,
                         "ttft_p50_ms": 120.0, "tpot_p50_ms": 21.5, "prefill_utilization": 0.7,
                         "decode_utilization": 0.4}, now=100.0)
    assert (got.num_requests_running, got.num_requests_waiting, got.kv_cache_usage) == (3, 2, 0.5)
    assert got.prefill_utilization == 0.7 and got.decode_utilization == 0.4
    assert got.source == "push" and got.updated_at == 100.0
    read = board.get(A, now=104.5)
    assert read.age_s(104.5) == pytest.approx(4.5)
    assert read.signals(104.5)["age_s"] == pytest.approx(4.5)
    assert board.get(B, now=104.5) is None


@pytest.mark.parametrize("snapshot, field, words", [
    ({"kv_cache_usage": 1.5}, "kv_cache_usage", "less than or equal to 1"),
    ({"kv_usage": 0.1}, "kv_usage", "did you mean 'kv_cache_usage'"),
    ({"num_requests_running": -1}, "num_requests_running", "greater than or equal to 0"),
    ({"num_requests_waiting": 2.5}, "num_requests_waiting", "fractional"),
    ({"num_requests_waiting": "3"}, "num_requests_waiting", "must be a number"),
    ({"num_requests_running": True}, "num_requests_running", "must be a number"),
    ({"ttft_p50_ms": float("nan")}, "ttft_p50_ms", "finite"),
    ({"kv_cache_capacity_tokens": 0}, "kv_cache_capacity_tokens", "greater than 0"),
])
def test_push_validation_names_the_field(snapshot, field, words):
    board = LoadBoard()
    board.push(A, {"num_requests_running": 1}, now=1.0)
    with pytest.raises(RequestError) as err:
        board.push(A, snapshot, now=2.0)
    assert err.value.field == field
    assert words in str(err.value)
    assert board.get(A, now=2.0).num_requests_running == 1  # nothing lost, nothing changed


def test_push_lists_every_problem_and_rejects_empty_and_non_mapping():
    board = LoadBoard()
    with pytest.raises(RequestError) as err:
        board.push(A, {"num_requests_running": -1, "tpot_p50_ms": -2}, now=1.0)
    assert err.value.field == "num_requests_running" and "tpot_p50_ms:" in str(err.value)
    with pytest.raises(RequestError, match="at least one of"):
        board.push(A, {}, now=1.0)
    with pytest.raises(RequestError, match="must be an object"):
        board.push(A, [1, 2], now=1.0)
    with pytest.raises(RequestError) as err:
        board.push("", {"num_requests_running": 1}, now=1.0)
    assert err.value.field == "endpoint"


def test_push_unknown_endpoint_when_restricted():
    board = LoadBoard(known_endpoints=[A, B])
    with pytest.raises(RequestError) as err:
        board.push("http://10.0.0.1:8001", {"num_requests_running": 1}, now=1.0)
    assert err.value.field == "endpoint" and "did you mean" in str(err.value)
    board.set_endpoints(None)
    board.push("http://10.0.0.1:8001", {"num_requests_running": 1}, now=1.0)


def test_older_push_does_not_replace_newer():
    board = LoadBoard()
    board.push(A, {"num_requests_running": 5}, now=10.0)
    board.push(A, {"num_requests_running": 1}, now=9.0)
    assert board.get(A, now=10.0).num_requests_running == 5


# ---------------------------------------------------------------- in-flight accounting

def test_dispatch_release_idempotent_and_unknown_id_harmless():
    board = LoadBoard()
    board.dispatch(A, "d1", 100, now=1.0)
    board.dispatch(A, "d2", 50, now=2.0)
    board.dispatch(B, "d3", 7, now=2.0)
    a = board.get(A, now=3.0)
    assert a.source == "inflight" and a.age_s(3.0) == 0.0
    assert (a.inflight_requests, a.inflight_prompt_tokens) == (2, 150)
    assert (a.pending_requests, a.pending_prompt_tokens) == (2, 150)
    assert a.num_requests_running is None and a.outstanding_requests == 2
    assert board.release("d1") is True
    assert board.release("d1") is False
    assert board.release("never-seen") is False
    a = board.get(A, now=3.0)
    assert (a.inflight_requests, a.inflight_prompt_tokens) == (1, 50)
    assert board.get(B, now=3.0).inflight_requests == 1


def test_inflight_reading_is_as_new_as_its_newest_dispatch():
    """An in-flight-only reading's updated_at is the newest dispatch still in flight, whatever
    order dispatches arrive and leave in (kept incrementally, not rescanned per read)."""
    board = LoadBoard(inflight_ttl_s=60.0)
    for i, at in enumerate([5.0, 9.0, 7.0, 9.0, 3.0]):  # out of order, with a tie
        board.dispatch(A, f"d{i}", 1, now=at)
    assert board.get(A, now=10.0).updated_at == 9.0
    board.release("d1")  # one of the two newest
    assert board.get(A, now=10.0).updated_at == 9.0
    board.release("d3")  # the other one
    assert board.get(A, now=10.0).updated_at == 7.0
    board.release("d4")  # an older one: unchanged
    assert board.get(A, now=10.0).updated_at == 7.0
    board.dispatch(A, "d1", 1, now=4.0)  # a new dispatch older than the newest
    assert board.get(A, now=10.0).updated_at == 7.0
    assert board.get(A, now=66.0).updated_at == 7.0  # d0 (5.0) and d1 (4.0) expired
    assert board.get(A, now=68.0).updated_at == 0.0 and board.get(A, now=68.0).inflight_requests == 0
    board.dispatch(A, "late", 1, now=70.0)
    assert board.get(A, now=70.0).updated_at == 70.0


def test_redispatch_moves_the_request():
    board = LoadBoard()
    board.dispatch(A, "d1", 100, now=1.0)
    board.dispatch(B, "d1", 100, now=2.0)  # retried on a fallback endpoint
    assert board.get(A, now=3.0).inflight_requests == 0
    assert board.get(B, now=3.0).inflight_requests == 1
    board.release("d1")
    assert board.get(B, now=3.0).inflight_requests == 0


def test_inflight_ttl_drops_lost_outcomes():
    board = LoadBoard(inflight_ttl_s=60.0)
    board.dispatch(A, "old", 10, now=0.0)
    board.dispatch(A, "new", 20, now=30.0)
    assert board.get(A, now=59.0).inflight_requests == 2
    a = board.get(A, now=61.0)  # "old" is 61 s old
    assert (a.inflight_requests, a.inflight_prompt_tokens) == (1, 20)
    assert board.release("old") is False  # expired: release is harmless
    assert board.expire(now=91.0) == 1
    assert board.get(A, now=91.0).inflight_requests == 0


def test_dispatch_rejects_bad_arguments():
    board = LoadBoard()
    with pytest.raises(ValueError, match="decision_id"):
        board.dispatch(A, "", 10, now=1.0)
    with pytest.raises(ValueError, match="prompt_tokens"):
        board.dispatch(A, "d", -1, now=1.0)
    with pytest.raises(ValueError, match="inflight_ttl_s"):
        LoadBoard(inflight_ttl_s=0)


# ---------------------------------------------------------------- merge rule

def test_merge_adds_only_dispatches_after_the_snapshot():
    board = LoadBoard()
    board.dispatch(A, "before", 1000, now=9.0)  # already counted by the engine at t=10
    board.push(A, {"num_requests_running": 4, "num_requests_waiting": 1}, now=10.0)
    board.dispatch(A, "after1", 300, now=10.5)
    board.dispatch(A, "after2", 200, now=11.0)
    a = board.get(A, now=11.0)
    assert a.num_requests_running == 4
    assert a.num_requests_waiting == 1 + 2
    assert (a.pending_requests, a.pending_prompt_tokens) == (2, 500)
    assert (a.inflight_requests, a.inflight_prompt_tokens) == (3, 1500)
    board.release("before")  # was inside the snapshot: pending unchanged
    board.release("after1")
    a = board.get(A, now=11.0)
    assert a.num_requests_waiting == 1 + 1 and a.pending_prompt_tokens == 200
    # a fresher snapshot absorbs the earlier dispatches
    board.push(A, {"num_requests_running": 5, "num_requests_waiting": 0}, now=12.0)
    a = board.get(A, now=12.0)
    assert (a.num_requests_waiting, a.pending_requests, a.inflight_requests) == (0, 0, 1)


def test_merge_uses_the_freshest_external_source():
    board = LoadBoard()
    board.push(A, {"num_requests_running": 9, "num_requests_waiting": 9}, now=10.0)
    board.put_scraped(A, EndpointLoad(A, "scrape", 12.0, num_requests_running=2, num_requests_waiting=0,
                                      kv_cache_usage=0.25))
    board.dispatch(A, "d", 64, now=11.0)  # after the push, before the scrape: counted by the scrape
    a = board.get(A, now=12.5)
    assert (a.source, a.num_requests_running, a.num_requests_waiting, a.pending_requests) == ("scrape", 2, 0, 0)
    board.put_scraped(A, EndpointLoad(A, "scrape", 11.5, num_requests_running=7))  # late, older: ignored
    assert board.get(A, now=12.5).num_requests_running == 2
    board.push(A, {"num_requests_running": 3, "num_requests_waiting": 1}, now=13.0)
    a = board.get(A, now=13.0)
    assert (a.source, a.num_requests_running, a.num_requests_waiting) == ("push", 3, 1)
    # the freshest snapshot wins field by field: what it does not report comes from the other source
    # (issue 11's combination rule; a push replaces the previous push whole)
    assert a.kv_cache_usage == 0.25
    board.push(A, {"num_requests_running": 4}, now=14.0)
    a = board.get(A, now=14.0)
    assert (a.num_requests_running, a.num_requests_waiting, a.kv_cache_usage) == (4, 0, 0.25)


_FIELDS = ("num_requests_running", "num_requests_waiting", "kv_cache_usage", "prefill_utilization")
_snapshot = st.fixed_dictionaries({}, optional={
    "num_requests_running": st.integers(0, 9), "num_requests_waiting": st.integers(0, 9),
    "kv_cache_usage": st.sampled_from([0.25, 0.5]), "prefill_utilization": st.sampled_from([0.3, 0.9])})


@settings(max_examples=300, deadline=None)
@given(pushes=st.lists(st.tuples(st.floats(0, 60), _snapshot.filter(bool)), max_size=3),
       scrapes=st.lists(st.tuples(st.floats(0, 60), _snapshot), max_size=3), now=st.floats(0, 60),
       max_age_s=st.sampled_from([1.0, 10.0]), on_stale=st.sampled_from(["unknown", "saturated"]))
def test_every_field_read_comes_from_a_snapshot_fresh_at_the_read(pushes, scrapes, now, max_age_s, on_stale):
    """Whatever the pushes and scrapes, a field of the reading comes from a snapshot at most ``max_age_s``
    old (``saturated``'s own markers aside): before, a fresh scrape lent a stale push its age, so a pushed
    field stayed in every reading for as long as the engine was scraped."""
    board, policy = LoadBoard(), StalenessPolicy(max_age_s, on_stale)
    snaps: dict[str, list[tuple[float, dict]]] = {"push": [], "scrape": []}
    for at, snap in pushes:
        board.push(A, snap, now=at)
        snaps["push"].append((at, snap))
    for at, snap in scrapes:
        board.put_scraped(A, EndpointLoad(A, "scrape", at, **snap))
        snaps["scrape"].append((at, snap))
    now = max([now, *(at for at, _ in pushes + scrapes)])
    reading = board.get_many([A], now, policy).get(A)
    assert reading == board.get(A, now, policy)
    if reading is None or reading.saturated:
        return
    held: dict[str, tuple[float, dict]] = {}  # the snapshot of each source the board holds: its latest (ties: the last)
    for src, got in snaps.items():
        for at, snap in got:
            if src not in held or at >= held[src][0]:
                held[src] = (at, snap)
    for f in _FIELDS:
        value = getattr(reading, f)
        if value is None:
            continue
        sources = [at for at, snap in held.values() if snap.get(f) is not None]
        assert sources and now - max(sources) <= max_age_s, (f, value, held, now)


def test_waiting_unknown_stays_unknown():
    board = LoadBoard()
    board.push(A, {"kv_cache_usage": 0.3}, now=1.0)
    board.dispatch(A, "d", 10, now=2.0)
    a = board.get(A, now=2.0)
    assert a.num_requests_waiting is None and a.pending_requests == 1 and a.outstanding_requests == 1


# ---------------------------------------------------------------- staleness

@pytest.fixture
def stale_board():
    board = LoadBoard()
    board.push(A, {"num_requests_running": 4, "num_requests_waiting": 3, "kv_cache_usage": 0.4,
                   "ttft_p50_ms": 200.0}, now=0.0)
    board.dispatch(A, "d1", 100, now=1.0)
    board.dispatch(A, "d2", 60, now=2.0)
    return board


def test_fresh_reading_is_untouched(stale_board):
    policy = StalenessPolicy(max_age_s=10.0, on_stale="saturated")
    a = stale_board.get(A, now=10.0, staleness=policy)
    assert not a.stale and a.num_requests_waiting == 5 and a.kv_cache_usage == 0.4


def test_stale_unknown_falls_back_to_inflight(stale_board):
    a = stale_board.get(A, now=10.5, staleness=StalenessPolicy(max_age_s=10.0, on_stale="unknown"))
    assert a.stale and a.source == "inflight"
    assert a.num_requests_running is None and a.num_requests_waiting is None and a.kv_cache_usage is None
    assert a.ttft_p50_ms is None
    assert (a.inflight_requests, a.pending_requests, a.pending_prompt_tokens) == (2, 2, 160)
    assert a.outstanding_requests == 2


def test_stale_saturated_reads_full(stale_board):
    a = stale_board.get(A, now=10.5, staleness=StalenessPolicy(max_age_s=10.0, on_stale="saturated"))
    assert a.stale and a.saturated and a.kv_cache_usage == 1.0
    assert a.num_requests_waiting == SATURATED_WAITING and a.num_requests_running == 4


def test_stale_ignore_keeps_values(stale_board):
    a = stale_board.get_many([A, B], now=10.5, staleness=StalenessPolicy(max_age_s=10.0, on_stale="ignore"))
    assert list(a) == [A]
    assert a[A].stale and not a[A].saturated and a[A].num_requests_waiting == 5 and a[A].kv_cache_usage == 0.4


def test_default_policy_is_unknown_and_inflight_never_stale():
    assert StalenessPolicy().on_stale == "unknown"
    only = EndpointLoad(A, "inflight", 0.0, inflight_requests=3)
    assert apply_staleness(only, StalenessPolicy(max_age_s=1.0, on_stale="saturated"), now=1e6) is only


@pytest.mark.parametrize("kwargs, field", [
    ({"max_age_s": 0}, "max_age_s"), ({"max_age_s": float("inf")}, "max_age_s"),
    ({"on_stale": "panic"}, "on_stale"),
])
def test_staleness_policy_validation(kwargs, field):
    with pytest.raises(ValueError, match=field):
        StalenessPolicy(**kwargs)


# ---------------------------------------------------------------- pools, threads

def test_aggregate_loads_sums_counts_and_takes_oldest_age():
    a = EndpointLoad(A, "scrape", 10.0, num_requests_running=2, num_requests_waiting=1, kv_cache_usage=0.2,
                     ttft_p50_ms=100.0, inflight_requests=1)
    b = EndpointLoad(B, "push", 14.0, num_requests_running=6, num_requests_waiting=3, kv_cache_usage=0.6,
                     inflight_requests=2)
    pool = aggregate_loads("onprem-70b", [a, b])
    assert (pool.num_requests_running, pool.num_requests_waiting) == (8, 4)
    assert pool.kv_cache_usage == pytest.approx(0.4)
    assert pool.ttft_p50_ms == 100.0  # mean over reporters only
    assert pool.source == "mixed" and pool.age_s(15.0) == pytest.approx(5.0)
    assert pool.inflight_requests == 3
    # an endpoint known from in-flight accounting alone: its pending dispatches wait, none runs
    c = EndpointLoad("c", "inflight", 0.0, inflight_requests=2, pending_requests=2)
    mixed = aggregate_loads("p", [a, c])
    assert (mixed.num_requests_running, mixed.num_requests_waiting, mixed.outstanding_requests) == (2, 3, 5)
    assert aggregate_loads("p", [c]).num_requests_waiting is None  # no engine reports a queue
    assert aggregate_loads("p", [a, EndpointLoad("d", "push", 0.0, num_requests_running=1)]).num_requests_waiting is None
    assert aggregate_loads("p", []) is None


def test_concurrent_dispatch_release_balances():
    board = LoadBoard()
    board.push(A, {"num_requests_running": 0, "num_requests_waiting": 0}, now=0.0)

    def worker(k):
        for i in range(500):
            board.dispatch(A, f"{k}-{i}", 10, now=1.0 + i)
            board.get(A, now=1.0 + i)
            board.release(f"{k}-{i}")

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    a = board.get(A, now=600.0)
    assert (a.inflight_requests, a.pending_requests, a.num_requests_waiting, a.pending_prompt_tokens) == (0, 0, 0, 0)


def test_stale_reading_is_cached_per_view_and_policy(stale_board):
    saturated = StalenessPolicy(max_age_s=10.0, on_stale="saturated")
    first = stale_board.get(A, now=11.0, staleness=saturated)
    assert stale_board.get(A, now=12.0, staleness=StalenessPolicy(max_age_s=10.0, on_stale="saturated")) is first
    assert stale_board.get(A, now=12.0, staleness=StalenessPolicy(max_age_s=10.0, on_stale="unknown")).saturated \
        is False  # another policy: recomputed
    stale_board.dispatch(A, "d3", 40, now=12.0)  # the view changed: recomputed with the new in-flight count
    again = stale_board.get(A, now=12.0, staleness=StalenessPolicy(max_age_s=10.0, on_stale="unknown"))
    assert again.inflight_requests == 3 and again.pending_prompt_tokens == 200
    stale_board.push(A, {"num_requests_running": 1, "num_requests_waiting": 0}, now=12.5)
    fresh = stale_board.get(A, now=13.0, staleness=saturated)
    assert not fresh.stale and fresh.num_requests_waiting == 0
