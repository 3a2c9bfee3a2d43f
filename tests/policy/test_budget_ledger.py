"""Ledger behaviour, the same for both backends (``budget_ledgers`` runs each test on
SQLite and on a live redis-server): zero and unlimited budgets, several budgets per
request, settle lower/higher, idempotent settle, release, expiry, window rollover,
effective price per token."""

import math
from datetime import UTC, datetime

import pytest

from pointsman.errors import BudgetError
from pointsman.policy.budget.config import BudgetConfig
from pointsman.policy.budget.ledger import BudgetExceeded, BudgetLedger, UnknownReservation

T = datetime(2025, 3, 14, 12, 0, tzinfo=UTC).timestamp()  # a Friday noon, UTC
DAY = 86400.0
ACME = "tenant:acme"
SEARCH = "team:acme/search"


def cfg(*budgets, ttl_s=600.0):
    return BudgetConfig.from_dict({"reservation_ttl_s": ttl_s, "budgets": [
        {"scope": s, "window": w, "limit_usd": lim} for s, w, lim in budgets]})


def spent(ledger, scope, now=T, window="day"):
    return next(s.spent_usd for s in ledger.snapshot([scope], now).statuses if s.window == window)


def test_both_backends_implement_the_protocol(budget_ledgers):
    assert isinstance(budget_ledgers.open(), BudgetLedger)


def test_zero_budget_refuses_everything(budget_ledgers):
    ledger = budget_ledgers.open(cfg((ACME, "day", 0)))
    for i, cost in enumerate([0.0, 1e-9, 0.5, 100.0]):
        with pytest.raises(BudgetExceeded) as err:
            ledger.reserve(f"d{i}", [ACME], cost, T)
        assert (err.value.scope, err.value.window, err.value.limit_usd, err.value.remaining_usd) == (ACME, "day", 0, 0)
    assert spent(ledger, ACME) == 0.0
    with pytest.raises(UnknownReservation):  # a refused reservation leaves nothing to settle
        ledger.settle("d0", 0.0, T)


def test_unlimited_never_refuses_and_still_records_spend(budget_ledgers):
    ledger = budget_ledgers.open(cfg((ACME, "day", 1.0)))  # a budget on another scope
    for i in range(20):
        ledger.reserve(f"d{i}", ["key:k1", SEARCH], 1000.0, T)
    snap = ledger.snapshot(["key:k1"], T)
    assert snap.binding is None and snap.remaining_usd == math.inf and snap.fits(1e12)
    assert spent(ledger, "key:k1") == pytest.approx(20_000.0)
    assert ledger.remaining(["key:k1", ACME], T) == {"key:k1": math.inf, ACME: 1.0}


def test_reservations_fill_a_budget_exactly_then_refuse(budget_ledgers):
    ledger = budget_ledgers.open(cfg((ACME, "day", 1.0)))
    for i in range(10):
        r = ledger.reserve(f"d{i}", [ACME], 0.1, T)
    assert r.reserved_usd == 0.1 and r.expires_s == T + 600 and r.windows == {"day": "day:2025-03-14",
                                                                             "month": "month:2025-03"}
    with pytest.raises(BudgetExceeded) as err:
        ledger.reserve("d10", [ACME], 0.0, T)  # exhausted: even a free request
    assert err.value.spent_usd == pytest.approx(1.0) and err.value.window_id == "day:2025-03-14"
    assert "tenant:acme has $0.000000000 of $1.000000000 left in day:2025-03-14" in str(err.value)


def test_a_reservation_must_fit_every_budget_atomically(budget_ledgers):
    ledger = budget_ledgers.open(cfg((ACME, "month", 10.0), (SEARCH, "day", 1.0), (ACME, "day", 5.0)))
    ledger.reserve("a", [ACME, SEARCH], 0.8, T)
    with pytest.raises(BudgetExceeded) as err:
        ledger.reserve("b", [ACME, SEARCH], 0.3, T)
    assert err.value.scope == SEARCH
    # nothing of the refused one was held anywhere
    assert spent(ledger, ACME) == pytest.approx(0.8) and spent(ledger, ACME, window="month") == pytest.approx(0.8)
    ledger.reserve("c", [ACME], 4.2, T)  # the tenant's day budget is now full...
    with pytest.raises(BudgetExceeded) as err:
        ledger.reserve("d", [ACME], 0.01, T)
    assert (err.value.scope, err.value.window) == (ACME, "day")
    snap = ledger.snapshot([ACME, SEARCH], T)
    assert snap.binding.remaining_usd == 0.0 and not snap.fits(0.0)


def test_settle_lower_frees_budget_and_higher_is_recorded(budget_ledgers):
    ledger = budget_ledgers.open(cfg((ACME, "day", 1.0)))
    ledger.reserve("a", [ACME], 0.6, T)
    ledger.reserve("b", [ACME], 0.4, T)
    with pytest.raises(BudgetExceeded):
        ledger.reserve("c", [ACME], 0.2, T)
    s = ledger.settle("a", 0.3, T, target="onprem-70b")
    assert (s.reserved_usd, s.actual_cost_usd, s.overrun_usd, s.hold_state, s.replayed) == (0.6, 0.3, 0.0, "held", False)
    ledger.reserve("c", [ACME], 0.3, T)  # the 0.3 freed by settling lower
    s = ledger.settle("b", 0.55, T)  # 0.15 over its reservation
    assert s.overrun_usd == pytest.approx(0.15)
    assert spent(ledger, ACME) == pytest.approx(1.15)  # over the limit by that overrun, no more
    with pytest.raises(BudgetExceeded):
        ledger.reserve("d", [ACME], 0.0, T)


def test_settle_is_idempotent(budget_ledgers):
    ledger = budget_ledgers.open(cfg((ACME, "day", 1.0)))
    ledger.reserve("a", [ACME], 0.5, T)
    first = ledger.settle("a", 0.2, T, target="t", prompt_tokens=10, cached_tokens=4, completion_tokens=5)
    again = ledger.settle("a", 0.9, T + 5, target="other", completion_tokens=999)
    assert again.replayed and not first.replayed
    assert (again.actual_cost_usd, again.target, again.completion_tokens, again.settled_s) == (0.2, "t", 5, T)
    assert spent(ledger, ACME) == pytest.approx(0.2)
    price = ledger.effective_price_per_token("t", "day", T)
    assert (price.outcomes, price.completion_tokens, price.cached_tokens) == (1, 5, 4)


def test_a_settlement_without_reservation_books_its_scopes_once_in_its_own_windows(budget_ledgers):
    """A decision admitted while the ledger was down has no reservation: its settlement books on
    the scopes it names, in the windows of the decision's time (not the settle's), once; a late
    reserve of the same id is refused and changes nothing (issue 22: this spend was never booked)."""
    ledger = budget_ledgers.open(cfg((ACME, "day", 1.0)))
    with pytest.raises(UnknownReservation):
        ledger.settle("u", 0.3, T)  # no reservation, no scopes: unknown, as before
    first = ledger.settle("u", 0.3, T + DAY, target="t", completion_tokens=7, scopes=[ACME, SEARCH], issued_s=T)
    again = ledger.settle("u", 0.9, T + DAY, scopes=[ACME], issued_s=T)
    assert (first.hold_state, first.replayed, again.replayed, again.actual_cost_usd) == ("unreserved", False, True, 0.3)
    assert spent(ledger, ACME) == spent(ledger, SEARCH) == pytest.approx(0.3)  # the decision's day, not the settle's
    assert spent(ledger, ACME, T + DAY) == 0.0
    with pytest.raises(BudgetError):
        ledger.reserve("u", [ACME], 0.1, T)
    assert spent(ledger, ACME) == pytest.approx(0.3)


def test_unknown_ids_and_bad_arguments_are_errors(budget_ledgers):
    ledger = budget_ledgers.open(cfg((ACME, "day", 1.0)))
    with pytest.raises(UnknownReservation, match="no reservation for decision 'nope'"):
        ledger.settle("nope", 0.1, T)
    with pytest.raises(UnknownReservation):
        ledger.release("nope", T)
    ledger.reserve("a", [ACME], 0.1, T)
    with pytest.raises(BudgetError, match="already has a reservation"):
        ledger.reserve("a", [ACME], 0.1, T)
    for args, field in [(("b", [ACME], -1.0), "estimated_cost_usd"), (("b", [ACME], math.nan), "estimated_cost_usd"),
                        (("b", ["acme"], 0.1), "scope"), (("", [ACME], 0.1), "decision_id")]:
        with pytest.raises(BudgetError, match=field):
            ledger.reserve(*args, now=T)
    with pytest.raises(BudgetError, match="completion_tokens"):
        ledger.settle("a", 0.1, T, completion_tokens=-1)
    with pytest.raises(BudgetError, match="actual_cost_usd"):
        ledger.settle("a", math.inf, T)
    assert spent(ledger, ACME) == pytest.approx(0.1)


def test_release_drops_the_hold_once(budget_ledgers):
    ledger = budget_ledgers.open(cfg((ACME, "day", 1.0)))
    ledger.reserve("a", [ACME], 1.0, T)
    assert ledger.release("a", T) is True
    assert ledger.release("a", T) is False
    assert spent(ledger, ACME) == 0.0
    ledger.reserve("b", [ACME], 1.0, T)
    # an outcome that arrives after all is recorded (the money was spent)
    s = ledger.settle("a", 0.25, T)
    assert s.hold_state == "released" and spent(ledger, ACME) == pytest.approx(1.25)
    assert ledger.release("b", T) is True
    ledger.settle("b", 0.0, T)
    assert ledger.release("b", T) is False


def test_expired_reservations_stop_counting(budget_ledgers):
    ledger = budget_ledgers.open(cfg((ACME, "day", 1.0), ttl_s=60))
    ledger.reserve("a", [ACME], 0.7, T)
    assert spent(ledger, ACME, T + 59.9) == pytest.approx(0.7)  # still held
    with pytest.raises(BudgetExceeded):
        ledger.reserve("b", [ACME], 0.7, T + 59.9)
    assert spent(ledger, ACME, T + 60) == 0.0  # read-only view: expired at expires_s exactly
    ledger.reserve("b", [ACME], 0.7, T + 60)
    assert spent(ledger, ACME, T + 61) == pytest.approx(0.7)
    assert ledger.release("a", T + 61) is False  # already expired
    late = ledger.settle("a", 0.5, T + 100)  # its outcome still counts
    assert late.hold_state == "expired" and spent(ledger, ACME, T + 101) == pytest.approx(1.2)
    assert spent(ledger, ACME, T + 120) == pytest.approx(0.5)  # "b" expired in turn


def test_window_rollover_resets_the_budget(budget_ledgers):
    ledger = budget_ledgers.open(cfg((ACME, "day", 1.0), (ACME, "month", 1.5), ttl_s=3600))
    midnight = datetime(2025, 3, 15, tzinfo=UTC).timestamp()
    ledger.reserve("late", [ACME], 1.0, midnight - 1)
    with pytest.raises(BudgetExceeded):
        ledger.reserve("x", [ACME], 0.1, midnight - 0.5)
    ledger.reserve("next-day", [ACME], 0.5, midnight)  # a new day; the month still has room
    ledger.settle("late", 0.9, midnight + 10)  # booked on the day it was reserved
    snap = {(s.window, s.window_id): s for s in ledger.snapshot([ACME], midnight + 20).statuses}
    assert snap[("day", "day:2025-03-15")].spent_usd == pytest.approx(0.5)
    assert snap[("month", "month:2025-03")].spent_usd == pytest.approx(1.4)
    assert spent(ledger, ACME, midnight - 1) == pytest.approx(0.9)  # the old day keeps its settled cost
    with pytest.raises(BudgetExceeded) as err:  # the month budget binds now
        ledger.reserve("y", [ACME], 0.2, midnight + 30)
    assert err.value.window == "month" and err.value.remaining_usd == pytest.approx(0.1)
    april = datetime(2025, 4, 1, tzinfo=UTC).timestamp()
    ledger.reserve("z", [ACME], 1.0, april)
    assert ledger.remaining([ACME], april) == {ACME: 0.0}  # day full again, month 0.5 left


def test_effective_price_per_token_from_settled_outcomes(budget_ledgers):
    ledger = budget_ledgers.open()
    ledger.reserve("a", [ACME], 1.0, T)
    ledger.reserve("b", [ACME], 1.0, T)
    ledger.reserve("c", [ACME], 1.0, T + DAY)
    ledger.reserve("d", [ACME], 1.0, T)
    ledger.settle("a", 0.02, T, target="frontier-large", prompt_tokens=1000, cached_tokens=200, completion_tokens=100)
    ledger.settle("b", 0.04, T, target="frontier-large", prompt_tokens=500, completion_tokens=300)
    ledger.settle("c", 0.10, T + DAY, target="frontier-large", prompt_tokens=10, completion_tokens=100)
    ledger.settle("d", 0.50, T, target="onprem-70b")  # no tokens reported
    day = ledger.effective_price_per_token("frontier-large", "day", T)
    assert (day.spent_usd, day.outcomes, day.completion_tokens, day.total_tokens) == (pytest.approx(0.06), 2, 400, 1900)
    assert day.usd_per_token == pytest.approx(0.06 / 400) and day.usd_per_total_token == pytest.approx(0.06 / 1900)
    month = ledger.effective_price_per_token("frontier-large", "month", T)
    assert month.spent_usd == pytest.approx(0.16) and month.completion_tokens == 500
    assert ledger.effective_price_per_token("onprem-70b", "day", T).usd_per_token is None
    assert ledger.effective_price_per_token("nowhere", "day", T).outcomes == 0


def test_config_swap_applies_to_the_next_reservation(budget_ledgers):
    ledger = budget_ledgers.open(cfg((ACME, "day", 1.0)))
    ledger.reserve("a", [ACME], 1.0, T)
    with pytest.raises(BudgetExceeded):
        ledger.reserve("b", [ACME], 1.0, T)
    ledger.set_config(cfg((ACME, "day", 2.0)))
    ledger.reserve("b", [ACME], 1.0, T)
    ledger.set_config(cfg())
    assert ledger.remaining([ACME], T) == {ACME: math.inf}


def test_ledgers_on_one_store_share_state(budget_ledgers):
    store = budget_ledgers.store()
    one = budget_ledgers.open(cfg((ACME, "day", 1.0)), store)
    other = budget_ledgers.open(cfg((ACME, "day", 1.0)), store)
    one.reserve("a", [ACME], 0.6, T)
    with pytest.raises(BudgetExceeded):
        other.reserve("b", [ACME], 0.6, T)
    other.settle("a", 0.1, T)
    assert one.settle("a", 0.5, T).replayed
    one.close()
    reopened = budget_ledgers.open(cfg((ACME, "day", 1.0)), store)  # state survives a reopen
    assert spent(reopened, ACME) == pytest.approx(0.1)


def test_purge_forgets_old_records(budget_ledgers):
    ledger = budget_ledgers.open(BudgetConfig(reservation_ttl_s=60, record_retention_s=3600))
    ledger.reserve("old", [ACME], 0.1, T)
    ledger.settle("old", 0.1, T)
    ledger.reserve("held", [ACME], 0.1, T + 3000)
    purged = ledger.purge(T + 3601)
    if budget_ledgers.backend == "sqlite":  # redis drops records by TTL instead
        assert purged == 1
        with pytest.raises(UnknownReservation):
            ledger.settle("old", 0.1, T + 3602)
    assert ledger.settle("held", 0.1, T + 3602).hold_state == "expired"
    assert spent(ledger, ACME, T + 3602) == pytest.approx(0.2)


def test_a_request_without_scopes_is_unlimited_and_still_priced(budget_ledgers):
    ledger = budget_ledgers.open(cfg((ACME, "day", 0)))
    ledger.reserve("anon", [], 5.0, T)
    ledger.settle("anon", 0.5, T, target="frontier-small", completion_tokens=50)
    assert ledger.effective_price_per_token("frontier-small", "day", T).usd_per_token == pytest.approx(0.01)
    assert ledger.snapshot([], T).statuses == () and ledger.snapshot([], T).fits(1e9)
    ledger.reserve("anon2", [], 5.0, T)
    assert ledger.release("anon2", T) is True


def test_the_longest_reservation_ttl_works_and_a_longer_one_is_refused(budget_ledgers, tmp_path):
    """``reservation_ttl_s: 1e300`` loaded, and on the Redis ledger each reservation then failed (EXPIRE out of
    range: every budgeted request a 503) while the script's hold stayed counted. The budgets file now refuses
    a TTL or retention past ``MAX_SECONDS`` (10 years), and that longest one works on both ledgers."""
    from pointsman.policy.budget.config import MAX_SECONDS, BudgetConfigError

    path = tmp_path / "budgets.yaml"
    path.write_text("apiVersion: pointsman/v1\nkind: Budgets\nreservation_ttl_s: 1.0e+300\n"
                    "record_retention_s: 1.0e+300\nbudgets: []\n")
    with pytest.raises(BudgetConfigError, match=r"budgets.yaml:3:20: invalid-value: reservation_ttl_s: Input should "
                                                r"be less than or equal to 316224000"):
        BudgetConfig.load(path)
    config = BudgetConfig.from_dict({"reservation_ttl_s": MAX_SECONDS, "record_retention_s": MAX_SECONDS,
                                     "budgets": [{"scope": ACME, "window": "day", "limit_usd": 1.0}]})
    ledger = budget_ledgers.open(config)
    ledger.reserve("d1", [ACME], 0.25, T)
    assert spent(ledger, ACME) == pytest.approx(0.25)
    ledger.settle("d1", 0.10, T)
    assert spent(ledger, ACME) == pytest.approx(0.10)


def test_set_hold_moves_a_live_hold_and_nothing_else(budget_ledgers):
    """``set_hold`` over generated sequences of reserve / set_hold / settle / release on both backends: each
    scope's held is the sum of its live holds at their latest amounts and settled the sum of what was booked
    (nothing lost, nothing doubled); set_hold is True exactly on a live hold and changes no other."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    ids = st.sampled_from(["a", "b", "c"])
    amounts = st.integers(0, 5000).map(lambda n: n / 1e6)  # USD, whole nano-USD
    op = st.one_of(st.tuples(st.just("reserve"), ids, amounts), st.tuples(st.just("set_hold"), ids, amounts),
                   st.tuples(st.just("settle"), ids, amounts), st.tuples(st.just("release"), ids, st.just(0.0)))

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(st.lists(op, max_size=14))
    def run(ops):
        ledger = budget_ledgers.open(cfg((ACME, "day", 1e6)))
        live: dict[str, float] = {}
        state: dict[str, str] = {}
        booked = 0.0
        for kind, i, usd in ops:
            if kind == "reserve":
                if i in state:
                    with pytest.raises(BudgetError):
                        ledger.reserve(i, [ACME, SEARCH], usd, T)
                    continue
                ledger.reserve(i, [ACME, SEARCH], usd, T)
                state[i], live[i] = "held", usd
            elif kind == "set_hold":
                assert ledger.set_hold(i, usd, T) is (state.get(i) == "held")
                if state.get(i) == "held":
                    live[i] = usd
            elif kind == "settle":
                if i not in state:
                    continue
                s = ledger.settle(i, usd, T)
                if state[i] != "settled":
                    assert s.reserved_usd == pytest.approx(live.get(i, 0.0), abs=1e-12) or state[i] != "held"
                    booked += usd
                    state[i] = "settled"
                    live.pop(i, None)
            elif i in state:
                assert ledger.release(i, T) is (state[i] == "held")
                if state[i] == "held":
                    state[i] = "released"
                    live.pop(i)
        for scope in (ACME, SEARCH):
            st_ = next(s for s in ledger.snapshot([scope], T).statuses if s.window == "day")
            assert st_.reserved_usd == pytest.approx(sum(live.values()), abs=1e-9)
            assert st_.settled_usd == pytest.approx(booked, abs=1e-9)

    run()
