"""Settlement is conserved across replicas and ledger outages, as a property (issue 22): two
``FleetState`` replicas share one ledger and the signing key, each with its own spend journal;
decisions are dispatched on either, with the ledger up or down; their outcomes (the same report,
retried) arrive on either replica, with the ledger up or down; journals are replayed at any
moment. Whatever the order, once the ledger is back and both journals are replayed, the tenant's
booked spend equals the sum of the acknowledged settlements (one per decision), nothing is left
in a journal, and each decision is booked once. Signed ids: claims survive the round trip, and a
forged or altered id does not verify."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pointsman.policy.budget.config import BudgetConfig
from pointsman.policy.budget.journal import SettleArgs, SpendJournal
from pointsman.policy.budget.ledger import LedgerUnavailable
from pointsman.policy.budget.sqlite_ledger import SqliteLedger
from pointsman.policy.cost import usage_cost
from pointsman.policy.decision import new_decision_id
from pointsman.policy.fleet import DEFAULT_FLEET_PATH, load_fleet
from pointsman.policy.signals.fleet_state import Dispatch, DispatchRecord, FleetState
from pointsman.policy.signals.signed_ids import DecisionSigner

NOW = time.time()  # the ids' own timestamps are the wall clock: a decision books in the windows of its time
E8 = "http://llama-8b-0.inference.internal:8000/v1"
SCOPES = ("tenant:acme", "team:acme/search")
FLEET = load_fleet()


class Outage:
    """The shared ledger behind a switch: while ``down``, every call fails as a backend would
    (``LedgerUnavailable``, nothing changed)."""

    def __init__(self, ledger: SqliteLedger) -> None:
        self.ledger, self.down = ledger, False

    def __getattr__(self, name: str) -> object:
        attr = getattr(self.ledger, name)
        if name in ("reserve", "settle", "release", "snapshot") and callable(attr):
            def call(*args: object, **kwargs: object) -> object:
                if self.down:
                    raise LedgerUnavailable("budget ledger: connection refused")
                return attr(*args, **kwargs)
            return call
        return attr


STEP = st.one_of(
    st.tuples(st.just("route"), st.integers(0, 1), st.booleans()),
    st.tuples(st.just("outcome"), st.integers(0, 7), st.integers(0, 1), st.booleans()),
    st.tuples(st.just("replay"), st.integers(0, 1), st.booleans()),
)


#: A budget on the tenant, far above what the steps spend: its decisions hold their estimate at dispatch.
BUDGETED = BudgetConfig.from_dict({"budgets": [{"scope": "tenant:acme", "window": "day", "limit_usd": 1e6}]})


@settings(max_examples=25, deadline=None)
@given(steps=st.lists(STEP, min_size=1, max_size=25), budgeted=st.booleans())
def test_booked_spend_equals_acknowledged_across_replicas_and_outages(steps, budgeted):
    """``budgeted``: the tenant has a budget (each dispatch holds its estimate in the ledger, refused
    while the ledger is down) or none (a dispatch writes nothing to the ledger; settlement books it)."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        ledger = Outage(SqliteLedger(root / "budget.db", BUDGETED if budgeted else BudgetConfig()))
        signer = DecisionSigner(b"k" * 32)
        replicas = [FleetState(FLEET, ledger, clock=lambda: NOW, signer=signer,  # type: ignore[arg-type]
                               journal=SpendJournal(root / f"journal-{i}.db")) for i in range(2)]
        decisions: list[str] = []
        acked: dict[str, float] = {}
        for step in steps:
            if step[0] == "route":
                _, r, up = step
                ledger.down = not up
                record = DispatchRecord(new_decision_id(), "onprem-8b", "aggregated", E8, None, SCOPES, 0.01, False,
                                        400, 0.7, 0.4, replicas[r].monotonic())
                try:
                    dispatched = replicas[r].dispatch(Dispatch(record, [], False), now=NOW)
                except LedgerUnavailable:
                    assert budgeted and not up  # fail-closed: a budgeted request is refused, nothing held
                    continue
                assert dispatched.reserved == budgeted
                decisions.append(dispatched.decision_id)
            elif step[0] == "outcome" and decisions:
                _, k, r, up = step
                decision_id = decisions[k % len(decisions)]
                ledger.down = not up
                n = decisions.index(decision_id)  # the same report, retried
                try:
                    settled = replicas[r].settle(decision_id, prompt_tokens=300 + n, completion_tokens=20 + n, now=NOW)
                except LedgerUnavailable:
                    continue  # not acknowledged (a 503): the gateway retries
                acked.setdefault(decision_id, settled.actual_cost_usd)
                assert settled.actual_cost_usd == pytest.approx(acked[decision_id], abs=1e-12)
            elif step[0] == "replay":
                _, r, up = step
                ledger.down = not up
                replicas[r].replay_journal()
        ledger.down = False
        for replica in replicas:
            replica.replay_journal()
            assert replica.journal is not None and len(replica.journal) == 0
        for scope in SCOPES:
            booked = next(s for s in ledger.snapshot([scope], NOW).statuses if s.window == "day").settled_usd
            assert booked == pytest.approx(sum(acked.values()), abs=1e-9 * (len(acked) + 1))
        for decision_id in acked:  # booked once: a repeat anywhere is a replay
            again = replicas[0].settle(decision_id, prompt_tokens=1, completion_tokens=1, now=NOW)
            assert again.replayed
        ledger.ledger.close()


def test_signed_ids_round_trip_and_refuse_forgeries():
    signer = DecisionSigner(b"s" * 32)
    base = new_decision_id()
    signed = signer.sign(base, target="onprem-8b", mode="aggregated", scopes=SCOPES, estimated_cost_usd=0.0123,
                         prefill_utilization=0.5, decode_utilization=0.25, inbox="log-a")
    claims = signer.verify(signed)
    assert claims is not None and signed.startswith(base + ".")
    assert (claims.target, claims.scopes, claims.estimated_cost_usd, claims.inbox) == ("onprem-8b", SCOPES, 0.0123,
                                                                                      "log-a")
    assert abs(claims.issued_s - int(base[:12], 16) / 1000) < 1e-9
    other = signer.sign(new_decision_id(), target="frontier-large", mode="aggregated", scopes=("tenant:x",),
                        estimated_cost_usd=9.0, prefill_utilization=1.0, decode_utilization=1.0, inbox="")
    payload = other.split(".")[1]
    assert signer.verify(f"{base}.{payload}.{signed.split('.')[2]}") is None  # claims swapped
    assert signer.verify(signed[:-1] + ("A" if signed[-1] != "A" else "B")) is None  # signature altered
    assert DecisionSigner(b"t" * 32).verify(signed) is None  # another key
    assert signer.verify(base) is None and signer.verify("x.y.z") is None


@given(cut=st.integers(0, 400), char=st.sampled_from("AZaz09-_./"))
@settings(max_examples=60, deadline=None, derandomize=True, database=None)
def test_signed_escalation_ids_verify_only_unaltered(cut, char):
    """An escalation id carries its own claims and its decision's (scopes, inbox); any one-character
    change anywhere in it (the decision id it carries, its claims, its MAC) makes it not verify."""
    signer = DecisionSigner(b"s" * 32)
    decision = signer.sign(new_decision_id(), target="onprem-8b", mode="aggregated", scopes=SCOPES,
                           estimated_cost_usd=0.0123, prefill_utilization=0.5, decode_utilization=0.25, inbox="log-a")
    eid = signer.sign_escalation(decision, target="frontier-small", mode="aggregated", estimated_cost_usd=0.5,
                                 prefill_utilization=0.0, decode_utilization=0.0, issued_s=1_700_000_000.25)
    claims = signer.verify(eid)
    assert claims is not None and claims.escalates == decision
    assert (claims.target, claims.scopes, claims.inbox, claims.estimated_cost_usd, claims.issued_s) == \
        ("frontier-small", SCOPES, "log-a", 0.5, 1_700_000_000.25)
    plain = signer.verify(decision)
    assert plain is not None and plain.escalates == ""
    i = cut % len(eid)
    altered = eid[:i] + char + eid[i + 1:]
    if altered != eid:
        assert signer.verify(altered) is None
    assert DecisionSigner(b"t" * 32).verify(eid) is None
    assert signer.verify(f"{decision}/escalation") is None  # the unsigned form


def test_concurrent_journal_adds_keep_one_settlement_per_decision(tmp_path):
    """Threads journaling at once (group-committed): every decision id is kept once, the first
    ``add`` of each says new and every other says kept, and all of them read back."""
    import threading

    journal = SpendJournal(tmp_path / "journal.db")
    args: SettleArgs = {"actual_cost_usd": 0.01, "now": NOW, "target": "onprem-8b", "prompt_tokens": 1,
                        "cached_tokens": 0, "completion_tokens": 1, "scopes": list(SCOPES), "issued_s": NOW}
    new: list[bool] = []
    lock = threading.Lock()

    def add(k: int) -> None:
        for i in range(30):
            got = journal.add(f"d{(i + k) % 30}", args)
            with lock:
                new.append(got)

    threads = [threading.Thread(target=add, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert new.count(True) == 30 and len(new) == 120
    assert sorted(d for d, _ in journal.pending()) == sorted(f"d{i}" for i in range(30)) and len(journal) == 30


def _priced(factor: int):
    """The default fleet with onprem-8b's GPU price times ``factor`` (its revision differs with it)."""
    text = DEFAULT_FLEET_PATH.read_text()
    path = Path(tempfile.mkdtemp()) / "fleet.yaml"
    path.write_text(text.replace("usd_per_gpu_hour: 2.50", f"usd_per_gpu_hour: {2.5 * factor}", 1))
    return load_fleet(path)


PRICED = [_priced(f) for f in (1, 2, 3)]
RELOAD_STEP = st.one_of(
    st.tuples(st.just("route"), st.integers(0, 1)),
    st.tuples(st.just("reload"), st.integers(0, len(PRICED) - 1)),
    st.tuples(st.just("outcome"), st.integers(0, 7), st.integers(0, 1)),
)


@settings(max_examples=40, deadline=None)
@given(steps=st.lists(RELOAD_STEP, min_size=1, max_size=25))
def test_an_outcome_books_the_prices_its_decision_was_made_at_across_reloads(steps):
    """Two replicas (one ledger, one key) reload the same fleets (onprem-8b's GPU price x1, x2, x3) between
    decisions and outcomes, in any order; an outcome reaching either replica (its record there, else its signed
    id), at any time, books the usage at the prices of the fleet its decision was made on, once; the tenant's
    books hold the sum. Before, an outcome after a reload was booked at the new prices."""
    with tempfile.TemporaryDirectory() as tmp:
        ledger = SqliteLedger(Path(tmp) / "budget.db", BudgetConfig())
        signer = DecisionSigner(b"k" * 32)
        replicas = [FleetState(PRICED[0], ledger, clock=lambda: NOW, signer=signer) for _ in range(2)]
        decisions: list[tuple[str, float]] = []  # (id, what its outcome must book)
        booked: dict[str, float] = {}
        for step in steps:
            if step[0] == "route":
                state = replicas[step[1]]
                record = DispatchRecord(new_decision_id(), "onprem-8b", "aggregated", E8, None, SCOPES, 0.01, False,
                                        400, 0.7, 0.4, state.monotonic(), fleet_revision=state.fleet.revision)
                n = len(decisions)
                usd = usage_cost("onprem-8b", state.fleet.targets["onprem-8b"], "aggregated", prompt_tokens=300 + n,
                                 completion_tokens=20 + n, prefill_utilization=0.7, decode_utilization=0.4).usd
                decisions.append((state.dispatch(Dispatch(record, [], False), now=NOW).decision_id, usd))
            elif step[0] == "reload":
                replicas = [r.rebuild(PRICED[step[1]]) for r in replicas]
            elif decisions:
                _, k, r = step
                decision_id, usd = decisions[k % len(decisions)]
                n = k % len(decisions)
                settled = replicas[r].settle(decision_id, prompt_tokens=300 + n, completion_tokens=20 + n, now=NOW)
                assert settled.actual_cost_usd == pytest.approx(usd, rel=1e-9)
                booked[decision_id] = usd
        status = next(s for s in ledger.snapshot([SCOPES[0]], NOW).statuses if s.window == "day")
        assert status.settled_usd == pytest.approx(sum(booked.values()), abs=1e-9 * (len(booked) + 1))
        ledger.close()
