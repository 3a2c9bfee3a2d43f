"""FleetState: dispatch reserves and counts, settle books the actual cost and releases
(idempotent, across replicas), release, health, pushes, scrape health, effective prices."""

from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hst

from pointsman.errors import BudgetError, RequestError
from pointsman.policy.budget.config import BudgetConfig
from pointsman.policy.budget.ledger import BudgetExceeded, UnknownReservation
from pointsman.policy.budget.sqlite_ledger import SqliteLedger
from pointsman.policy.budget.units import MAX_SETTLE_TOKENS
from pointsman.policy.cost import estimate_cost
from pointsman.policy.fleet import DEFAULT_FLEET_PATH, load_fleet, parse_fleet
from pointsman.policy.signals.fleet_state import Dispatch, DispatchRecord, FleetState
from pointsman.policy.signals.scrape import ScrapeStatus
from pointsman.request import request_scopes

NOW = datetime(2025, 3, 14, 12, tzinfo=UTC).timestamp()
E8 = "http://llama-8b-0.inference.internal:8000/v1"
P70, D70 = "http://llama-70b-prefill-0.inference.internal:8000/v1", "http://llama-70b-decode-0.inference.internal:8000/v1"


@pytest.fixture(scope="module")
def fleet():
    return load_fleet()


@pytest.fixture
def ledger_path(tmp_path):
    return tmp_path / "budget.db"


def state(fleet, path, limit=None, **kw):
    budgets = [] if limit is None else [{"scope": "tenant:acme", "window": "day", "limit_usd": limit}]
    ledger = SqliteLedger(path, BudgetConfig.from_dict({"budgets": budgets}))
    return FleetState(fleet, ledger, clock=lambda: NOW, **kw)


def dispatch(st, did, target="onprem-8b", mode="aggregated", endpoint=E8, prefill=None, usd=0.01, hashes=(1, 2, 3)):
    record = DispatchRecord(did, target, mode, endpoint, prefill, ("tenant:acme",), usd, False, 400, 1.0, 1.0, 100.0)
    return st.dispatch(Dispatch(record, list(hashes), False, "s1"), now=NOW)


def test_dispatch_reserves_counts_and_records(fleet, ledger_path):
    st = state(fleet, ledger_path, limit=1.0)
    rec = dispatch(st, "d1", target="onprem-70b", mode="disaggregated", endpoint=D70, prefill=P70)
    assert rec.reserved and st.ledger.snapshot(["tenant:acme"], NOW).binding.reserved_usd == pytest.approx(0.01)
    loads = st.board.get_many([D70, P70], 100.0)
    assert loads[D70].inflight_requests == 1 and loads[P70].inflight_requests == 1
    assert st.prefix_index("onprem-70b", False).match([1, 2, 3]) == {D70: 3, P70: 3}
    assert st.session("s1", 101.0) == ("onprem-70b", D70)
    assert st.session("s1", 100.0 + 901) is None  # the session TTL is 900 s


def test_settle_books_the_actual_cost_once_and_releases_load(fleet, ledger_path):
    st = state(fleet, ledger_path, limit=1.0)
    dispatch(st, "d1", target="onprem-70b", mode="disaggregated", endpoint=D70, prefill=P70)
    got = st.settle("d1", prompt_tokens=400, completion_tokens=100, cached_tokens=0, now=NOW)
    want = estimate_cost("onprem-70b", fleet.targets["onprem-70b"], "disaggregated", 400, 100).usd
    assert got.actual_cost_usd == pytest.approx(want) and got.released_load == 2 and not got.replayed
    assert got.settlement.reserved_usd == pytest.approx(0.01)
    assert st.board.get_many([D70, P70], 100.0)[D70].inflight_requests == 0
    again = st.settle("d1", prompt_tokens=999, completion_tokens=999, now=NOW)
    assert again.replayed and again.actual_cost_usd == got.actual_cost_usd and again.released_load == 0
    binding = st.ledger.snapshot(["tenant:acme"], NOW).binding
    assert (binding.reserved_usd, binding.settled_usd) == (0.0, pytest.approx(want, abs=1e-9))  # nano-USD
    assert got.to_dict()["hold_state"] == "held"


def test_settle_on_another_replica_needs_the_target_or_the_cost(fleet, ledger_path):
    a = state(fleet, ledger_path, limit=1.0)
    b = state(fleet, ledger_path, limit=1.0)  # a second replica on the same ledger
    dispatch(a, "d1")
    with pytest.raises(BudgetError, match="pass its target"):
        b.settle("d1", prompt_tokens=10, completion_tokens=10)
    got = b.settle("d1", prompt_tokens=10, completion_tokens=10, actual_cost_usd=0.003, now=NOW)
    assert got.actual_cost_usd == 0.003 and got.settlement.reserved_usd == pytest.approx(0.01)
    assert a.settle("d1", prompt_tokens=10, completion_tokens=10, now=NOW).replayed  # the ledger replays it
    with pytest.raises(UnknownReservation):
        b.settle("never", prompt_tokens=1, completion_tokens=1, target="onprem-8b")
    with pytest.raises(BudgetError, match="completion_tokens"):
        b.settle("d1", prompt_tokens=1, completion_tokens=-1)
    for huge in (2**63, 2**62, MAX_SETTLE_TOKENS + 1):  # the ledger's 64-bit sums never overflow
        with pytest.raises(BudgetError, match="prompt_tokens must be an integer in"):
            b.settle("d2", prompt_tokens=huge, completion_tokens=1, target="onprem-8b")


def test_release_drops_the_hold_and_the_load(fleet, ledger_path):
    st = state(fleet, ledger_path, limit=1.0)
    dispatch(st, "d1")
    assert st.release("d1") is True
    assert st.ledger.snapshot(["tenant:acme"], NOW).binding.reserved_usd == 0.0
    assert st.board.get(E8, 100.0).inflight_requests == 0
    assert st.release("d1") is False


def test_a_refused_reservation_changes_nothing(fleet, ledger_path):
    st = state(fleet, ledger_path, limit=0.015)
    dispatch(st, "d1", usd=0.01)
    with pytest.raises(BudgetExceeded):
        dispatch(st, "d2", usd=0.01)
    assert st.record("d2") is None and st.board.get(E8, 100.0).inflight_requests == 1


def test_without_a_ledger_nothing_is_reserved_but_load_is_counted(fleet):
    st = FleetState(fleet)
    rec = dispatch(st, "d1")
    assert not rec.reserved and st.board.get(E8, 100.0).inflight_requests == 1
    got = st.settle("d1", prompt_tokens=400, completion_tokens=10)
    assert got.settlement is None and got.released_load == 1


def test_health_counts_and_scrape_status(fleet):
    st = FleetState(fleet)
    assert st.healthy_endpoints("onprem-8b") == 2
    st.set_health("llama-8b-0", False, "connection refused")
    st.set_health("llama-8b-0", False, "again")  # idempotent count
    assert st.healthy_endpoints("onprem-8b") == 1 and st.unhealthy() == {E8: "again"}
    st.set_health(E8, True)
    assert st.healthy_endpoints("onprem-8b") == 2
    with pytest.raises(RequestError, match="unknown endpoint"):
        st.set_health("nope", False)
    status = {E8: ScrapeStatus("m", consecutive_failures=3, last_error="timeout"),
              "http://llama-8b-1.inference.internal:8000/v1": ScrapeStatus("m", last_ok_at=1.0)}
    assert st.apply_scrape_status(status) == [E8]
    assert "scrape failed 3x: timeout" in st.unhealthy()[E8]
    assert st.scrape_targets() == {}  # the packaged fleet's placeholder URLs are not scraped
    scraping = FleetState(parse_fleet(DEFAULT_FLEET_PATH.read_text().replace("scrape_metrics: false",
                                                                                   "scrape_metrics: true")))
    assert set(scraping.scrape_targets()) == {e for e, i in fleet.endpoints.items() if i.role != "api"}
    assert scraping.scrape_targets()[E8] == "http://llama-8b-0.inference.internal:8000/metrics"


def test_only_endpoints_the_fleet_asks_for_are_scraped_and_a_scrape_mark_ends_with_the_scraping():
    """Issue 22: a fleet without ``defaults.scrape_metrics`` scraped every on-prem endpoint; and a
    fleet reload that stopped scraping one kept its ``scrape`` mark, which nothing would clear."""
    text = DEFAULT_FLEET_PATH.read_text()
    absent = text.replace("  scrape_metrics: false\n", "").replace(
        '- {name: llama-8b-0, url: "http://llama-8b-0.inference.internal:8000/v1"}',
        '- {name: llama-8b-0, url: "http://llama-8b-0.inference.internal:8000/v1", '
        'metrics_url: "http://llama-8b-0.inference.internal:9090/metrics"}')
    assert absent != text and "scrape_metrics" not in absent.split("slo_classes")[0]
    st = FleetState(parse_fleet(absent))
    assert st.scrape_targets() == {E8: "http://llama-8b-0.inference.internal:9090/metrics"}
    st.set_health(E8, False, "scrape failed 3x: timeout", source="scrape")
    st.set_health(E8, False, "drained", source="operator")
    kept = st.rebuild(parse_fleet(absent))  # still scraped: both marks stay
    assert kept.unhealthy() == {E8: "scrape failed 3x: timeout; drained"}
    off = kept.rebuild(parse_fleet(absent.replace("defaults:\n", "defaults:\n  scrape_metrics: false\n")))
    assert off.scrape_targets() == {} and off.unhealthy() == {E8: "drained"}


def test_push_by_name_and_bad_pushes(fleet):
    st = FleetState(fleet)
    load = st.push_load("llama-8b-0", {"num_requests_running": 3, "kv_cache_usage": 0.5}, now=10.0)
    assert load.endpoint == E8 and st.board.get(E8, 11.0).num_requests_running == 3
    with pytest.raises(RequestError, match="did you mean 'kv_cache_usage'"):
        st.push_load(E8, {"kv_cache_usag": 0.5})
    with pytest.raises(RequestError) as info:
        st.push_load("llama-8b-9", {"num_requests_running": 1})
    assert info.value.field == "endpoint"
    status = st.fleet_status(now=12.0)
    ep = next(e for e in status["onprem-8b"]["endpoints"] if e["id"] == E8)
    assert ep["load"]["age_s"] == 2.0 and ep["healthy"] is True


def test_effective_prices_from_settled_outcomes(fleet, ledger_path):
    # the records are made at monotonic 100 s: with the real monotonic clock (the machine's uptime) their
    # wall time, and so the day they are booked in, moved to the day before NOW once the uptime passed 12 h
    st = state(fleet, ledger_path, monotonic=lambda: 100.0)
    for i in range(3):
        dispatch(st, f"d{i}", target="frontier-small", endpoint="frontier-small")
        st.settle(f"d{i}", prompt_tokens=1000, completion_tokens=500, actual_cost_usd=0.0006, now=NOW)
    prices = st.effective_prices("day", NOW)
    fs = prices["frontier-small"]
    assert (fs.outcomes, fs.completion_tokens, fs.spent_usd) == (3, 1500, pytest.approx(0.0018))
    assert fs.usd_per_token == pytest.approx(0.0018 / 1500) and fs.list_usd_per_output_token == pytest.approx(0.6e-6)
    assert prices["onprem-8b"].usd_per_token is None
    assert FleetState(fleet).effective_prices() == {}


def test_request_scopes():
    assert request_scopes("acme", "search", "k_1") == ("tenant:acme", "team:search", "key:k_1")
    assert request_scopes(None, "", None) == ()
    with pytest.raises(RequestError) as info:
        request_scopes("two words", None)
    assert info.value.field == "routing.tenant"


def test_budget_snapshots_are_cached_briefly_with_own_reservations_counted(fleet, ledger_path):
    a = state(fleet, ledger_path, limit=1.0)
    b = state(fleet, ledger_path, limit=1.0)  # another replica
    first = a.budget_snapshot(("tenant:acme",), NOW)
    assert first.binding.spent_usd == 0.0
    dispatch(a, "mine", usd=0.1)  # this replica's hold shows at once
    dispatch(b, "theirs", usd=0.2)  # the other replica's within the TTL
    assert a.budget_snapshot(("tenant:acme",), NOW + 0.01).binding.spent_usd == pytest.approx(0.1)
    assert a.budget_snapshot(("tenant:acme",), NOW + 0.06).binding.spent_usd == pytest.approx(0.3)
    assert a.budget_snapshot(("tenant:other",), NOW) is None  # no budget applies
    fresh = state(fleet, ledger_path, limit=1.0, budget_snapshot_ttl_s=0.0)
    assert fresh.budget_snapshot(("tenant:acme",), NOW).binding.spent_usd == pytest.approx(0.3)


@settings(max_examples=60, deadline=None)
@given(hst.lists(hst.tuples(hst.integers(0, 5000), hst.integers(0, 6000), hst.booleans(), hst.booleans()), max_size=12))
def test_inflight_prefill_tokens_are_the_uncached_prompts_in_flight(fleet, steps):
    """For any dispatches (prompt tokens, tokens cached where they prefill, aggregated or disaggregated) and
    releases, each endpoint's in-flight prompt tokens are the prefill still owed there: the prompts but their
    cached prefix, on the prefill side only (the queue scorer reads them as queued work), and 0 once all are
    released."""
    s = FleetState(fleet, None, clock=lambda: NOW)
    owed: dict[str, dict[str, int]] = {E8: {}, P70: {}, D70: {}}
    for i, (prompt, cached, disaggregated, release_now) in enumerate(steps):
        did = f"d{i}"
        target, mode, endpoint, prefill = ("onprem-70b", "disaggregated", D70, P70) if disaggregated else \
            ("onprem-8b", "aggregated", E8, None)
        record = DispatchRecord(did, target, mode, endpoint, prefill, (), 0.0, False, prompt, 1.0, 1.0, 100.0,
                                cached_tokens=cached)
        s.dispatch(Dispatch(record, [], False), now=NOW)
        owed[prefill or endpoint][did] = max(0, prompt - cached)
        if release_now:
            s.release(did, now=NOW)
            owed[prefill or endpoint].pop(did)
        loads = s.board.get_many([E8, P70, D70], 100.0)
        for e in (E8, P70, D70):
            assert (loads[e].inflight_prompt_tokens if e in loads else 0) == sum(owed[e].values())
    for e in (E8, P70):
        for did in list(owed[e]):
            s.release(did, now=NOW)
    assert all(x.inflight_prompt_tokens == 0 for x in s.board.get_many([E8, P70, D70], 100.0).values())
