"""A ``pointsman serve`` SIGKILLed at the instant it sends a budget settlement to its Redis ledger: the
outcome log has committed what the request wrote (an outcome, a verification), the ledger has not
booked it. A TCP proxy between the service and a real redis-server sees the ledger's settle script
(``EVALSHA`` of its SHA-1) go by, SIGKILLs the service and drops the command (Redis never runs it);
the service is restarted on the same data folder and the gateway does what it does when its call
died: it sends the outcome again, or (a verify that never answered) keeps the draft and reports it.
The books must then hold each reported dollar once and nothing held. The last test stalls the settle instead
(a slow verify the gateway gave up on) while another replica books the kept draft."""

from __future__ import annotations

import hashlib
import os
import select
import signal
import socket
import threading
import time
import uuid
from urllib.parse import urlsplit

import httpx
import pytest

from pointsman.policy.budget import redis_ledger

pytestmark = pytest.mark.slow

BUDGETS = "apiVersion: pointsman/v1\nkind: Budgets\nbudgets:\n  - {scope: 'tenant:acme', window: day, limit_usd: 100}\n"
REFUSAL = "I'm sorry, but I cannot help with that request."
SETTLE_SHA = hashlib.sha1(redis_ledger._SETTLE.encode()).hexdigest().encode()


class KillAtSettle:
    """A TCP proxy to the redis-server at ``upstream`` (host, port) on ``port``. While ``armed`` is set with
    a pid, the first client chunk carrying the ledger's settle script SHA SIGKILLs that pid and is dropped
    (its connection closed): the settle never reaches Redis. ``kills`` counts those. While ``stall`` is set
    instead, that chunk waits until ``stall`` is cleared (set ``stalled`` meanwhile), then goes on. While
    ``refuse`` is set, every client chunk closes its connection unsent (the ledger is unreachable)."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.armed: int | None = None
        self.kills = 0
        self.stall = threading.Event()
        self.stalled = threading.Event()
        self.refuse = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                down, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._pipe, args=(down,), daemon=True).start()

    def _pipe(self, down: socket.socket) -> None:
        up = socket.create_connection(self.upstream)
        try:
            while True:
                readable, _, _ = select.select([down, up], [], [])
                for s in readable:
                    data = s.recv(65536)
                    if not data or s is down and self.refuse.is_set():
                        return
                    if s is down and self.stall.is_set() and SETTLE_SHA in data:
                        self.stalled.set()
                        while self.stall.is_set():
                            time.sleep(0.01)
                    if s is down and self.armed is not None and SETTLE_SHA in data:
                        os.kill(self.armed, signal.SIGKILL)
                        self.armed, self.kills = None, self.kills + 1
                        return
                    (up if s is down else down).sendall(data)
        except OSError:
            return
        finally:
            down.close()
            up.close()

    def close(self) -> None:
        self._listener.close()


@pytest.fixture
def ledger(tmp_path, redis_url):
    """(settings for ``serve`` whose budget ledger goes through a ``KillAtSettle`` proxy, the proxy)."""
    parts = urlsplit(redis_url)
    proxy = KillAtSettle((parts.hostname or "127.0.0.1", parts.port or 6379))
    budgets = tmp_path / "budgets.yaml"
    budgets.write_text(BUDGETS)
    prefix = f"%7Bkill-{uuid.uuid4().hex[:8]}%7D:"
    yield {"budgets_path": str(budgets), "budget_ledger": f"redis://127.0.0.1:{proxy.port}/0?prefix={prefix}"}, proxy
    proxy.close()


def acme(base: str) -> tuple[float, float]:
    """tenant:acme's (settled, held) USD today."""
    got = httpx.get(f"{base}/v1/budgets", timeout=10).json()["budgets"][0]
    return got["settled_usd"], got["held_usd"]


def route(base: str) -> dict:
    r = httpx.post(f"{base}/v1/route", json={"model": "auto", "messages": [{"role": "user", "content": "Explain kickball."}],
                                             "routing": {"tenant": "acme"}}, timeout=10)
    assert r.status_code == 200, r.text
    return r.json()


def kill_during(proxy: KillAtSettle, proc, call) -> None:
    """Arm the proxy for ``proc``, make ``call`` (it must die with the connection), wait for the kill."""
    proxy.armed = proc.pid
    with pytest.raises(httpx.TransportError):
        call()
    proc.wait(timeout=10)
    assert proxy.kills == 1 and proc.returncode == -signal.SIGKILL


def test_an_outcome_whose_settle_died_with_the_process_is_booked_once_when_resent(tmp_path, serve, ledger):
    settings, proxy = ledger
    proc, base = serve(tmp_path / "data", **settings)
    port = int(base.rsplit(":", 1)[1])
    outcome = {"outcome_id": "o-1", "status": "ok", "usage": {"prompt_tokens": 12, "completion_tokens": 40}}
    ref = route(base)  # the reference: the same outcome on a decision nobody killed
    r = httpx.post(f"{base}/v1/outcomes", json={**outcome, "outcome_id": "o-ref", "decision_id": ref["decision_id"]},
                   timeout=10)
    paid = r.json()["acks"][0]["settlement"]["actual_cost_usd"]
    assert paid > 0 and acme(base) == (pytest.approx(paid, abs=1e-9), 0.0)

    d = route(base)
    kill_during(proxy, proc, lambda: httpx.post(f"{base}/v1/outcomes", json={**outcome, "decision_id": d["decision_id"]},
                                                timeout=10))
    _, base = serve(tmp_path / "data", port=port, **settings)
    r = httpx.post(f"{base}/v1/outcomes", json={**outcome, "decision_id": d["decision_id"]}, timeout=10)
    assert r.json()["acks"][0]["status"] == "duplicate"  # stored before the kill; its settle is made now
    assert acme(base) == (pytest.approx(2 * paid, abs=1e-9), 0.0)
    r = httpx.post(f"{base}/v1/outcomes", json={**outcome, "decision_id": d["decision_id"]}, timeout=10)
    assert acme(base) == (pytest.approx(2 * paid, abs=1e-9), 0.0)  # and only once


def test_a_kept_draft_whose_verify_died_before_booking_it_is_paid_once(tmp_path, serve, ledger):
    """The verify stored its escalation in the outcome log, then died sending the draft's settlement; the
    gateway's verify call failed, so it kept the draft and reports it (served by the draft's target). The
    draft must be paid (once) and both holds released: before, the kept draft's outcome assumed the verify had
    booked the draft, released the escalation only and booked nothing (the decision's hold left to expire)."""
    settings, proxy = ledger
    proc, base = serve(tmp_path / "data", **settings)
    port = int(base.rsplit(":", 1)[1])

    def verify(decision: dict):
        return httpx.post(f"{base}/v1/verify", json={"decision_id": decision["decision_id"], "draft": {"text": REFUSAL},
                                                     "usage": {"prompt_tokens": 12, "completion_tokens": 40}}, timeout=10)

    def report(decision: dict) -> dict:
        r = httpx.post(f"{base}/v1/outcomes", json={"decision_id": decision["decision_id"], "status": "ok",
                                                    "served_target": decision["target"],
                                                    "usage": {"prompt_tokens": 12, "completion_tokens": 40}}, timeout=10)
        assert r.status_code == 200, r.text
        return r.json()["acks"][0]

    ref = route(base)  # the reference: verified, escalated, the draft kept and reported; nobody killed
    v = verify(ref).json()
    assert v["action"] == "escalate"
    paid = v["draft_settlement"]["actual_cost_usd"]
    report(ref)
    assert paid > 0 and acme(base) == (pytest.approx(paid, abs=1e-9), 0.0)

    d = route(base)
    kill_during(proxy, proc, lambda: verify(d))
    _, base = serve(tmp_path / "data", port=port, **settings)
    ack = report(d)
    assert ack["status"] == "stored", ack
    deadline = time.monotonic() + 10
    while acme(base)[1] > 0:  # holds released by the report (an escalation's release is published at once)
        assert time.monotonic() < deadline, f"holds left: {acme(base)}, ack {ack}"
        time.sleep(0.1)
    assert acme(base) == (pytest.approx(2 * paid, abs=1e-9), 0.0), ack  # before: (paid, held until the TTL)
    report(d)
    assert acme(base) == (pytest.approx(2 * paid, abs=1e-9), 0.0)


def test_an_escalated_calls_outcome_whose_settle_died_is_booked_once_when_resent(tmp_path, serve, ledger):
    """Verified and escalated; the escalated call's outcome (reported under the decision id) is stored and the
    process dies sending the escalation's settlement. Restarted, the escalation is found in the outcome log and
    the resent outcome settles it once: the draft and the escalated call each paid once, nothing held."""
    settings, proxy = ledger
    proc, base = serve(tmp_path / "data", **settings)
    port = int(base.rsplit(":", 1)[1])
    d = route(base)
    v = httpx.post(f"{base}/v1/verify", json={"decision_id": d["decision_id"], "draft": {"text": REFUSAL},
                                              "usage": {"prompt_tokens": 12, "completion_tokens": 40}}, timeout=10).json()
    assert v["action"] == "escalate" and v["target"] != d["target"]
    draft = v["draft_settlement"]["actual_cost_usd"]
    outcome = {"decision_id": d["decision_id"], "status": "ok", "served_target": v["target"],
               "usage": {"prompt_tokens": 12, "completion_tokens": 200}}
    kill_during(proxy, proc, lambda: httpx.post(f"{base}/v1/outcomes", json=outcome, timeout=10))
    _, base = serve(tmp_path / "data", port=port, **settings)
    ack = httpx.post(f"{base}/v1/outcomes", json=outcome, timeout=10).json()["acks"][0]
    assert ack["status"] == "duplicate" and ack["settlement"]["decision_id"] == v["escalation_id"], ack
    escalated = ack["settlement"]["actual_cost_usd"]
    assert escalated > 0 and acme(base) == (pytest.approx(draft + escalated, abs=1e-9), 0.0)
    httpx.post(f"{base}/v1/outcomes", json=outcome, timeout=10)
    assert acme(base) == (pytest.approx(draft + escalated, abs=1e-9), 0.0)


def test_a_kept_draft_booked_whole_elsewhere_while_its_verify_was_slow_is_not_booked_again(tmp_path, serve, ledger,
                                                                                          redis_url):
    """Replicas A and B share live state and a Redis ledger (A's through the proxy). A's verify of a draft's first
    16 tokens escalates and stores the verification, then its settle of the prefix is slow (stalled in the proxy);
    the gateway's verify call times out, it keeps the draft and reports it to B. B knows no escalation: it books the
    whole draft (12 + 120 tokens) under the decision id and forwards the outcome to A's log. A's prefix settle is
    then a replay, and when A stores the forwarded kept draft it must not book the draft's 104 tokens beyond the
    prefix again under the escalation id (before: the whole draft plus those 104 tokens were booked)."""
    settings, proxy = ledger
    prefix = f"%7Bkeep-{uuid.uuid4().hex[:8]}%7D:"
    _, a = serve(tmp_path / "a", **settings, state_url=f"{redis_url}?prefix={prefix}")
    _, b = serve(tmp_path / "b", **{**settings, "budget_ledger": settings["budget_ledger"].replace(
        f"127.0.0.1:{proxy.port}", urlsplit(redis_url).netloc)}, state_url=f"{redis_url}?prefix={prefix}")
    d = route(a)
    proxy.stall.set()
    results: list[object] = []

    def verify() -> None:
        try:
            results.append(httpx.post(f"{a}/v1/verify", json={
                "decision_id": d["decision_id"], "draft": {"text": REFUSAL[:24], "partial": True},
                "usage": {"prompt_tokens": 12, "completion_tokens": 16}}, timeout=30).json())
        except httpx.TransportError as exc:
            results.append(exc)

    slow = threading.Thread(target=verify)
    slow.start()
    assert proxy.stalled.wait(20)  # the verify is stored, its settle on its way: the gateway gave up on it
    r = httpx.post(f"{b}/v1/outcomes", json={"decision_id": d["decision_id"], "status": "ok", "served_target": d["target"],
                                             "usage": {"prompt_tokens": 12, "completion_tokens": 120}}, timeout=10)
    ack = r.json()["acks"][0]
    assert ack["status"] == "forwarded", ack
    whole = ack["settlement"]["actual_cost_usd"]
    proxy.stall.clear()
    slow.join(30)
    assert isinstance(results[0], dict) and results[0]["action"] == "escalate", results
    assert results[0]["draft_settlement"]["replayed"] is True
    deadline = time.monotonic() + 15
    while acme(a)[1] > 0:  # A releases the escalation's hold when it stores the forwarded kept draft
        assert time.monotonic() < deadline, acme(a)
        time.sleep(0.1)
    assert acme(a) == (pytest.approx(whole, abs=1e-9), 0.0)  # before: whole + the 104 tokens beyond the prefix


def test_spend_journaled_when_sigterm_comes_is_booked_before_the_process_exits(tmp_path, serve, ledger, redis_url):
    """The ledger is unreachable when an outcome comes: its settlement goes to the spend journal. The service is
    told to stop (SIGTERM) while the ledger is still away, and the ledger comes back before the stop ends: the
    journal must be booked before the process exits (its data folder may go with it: an emptyDir pod), without
    restarting it. Before, the journal's replay loop stopped at SIGTERM and the settlement stayed in the file."""
    from pointsman.policy.budget.config import BudgetConfig
    from pointsman.policy.budget.journal import DEFAULT_JOURNAL_NAME, SpendJournal
    from pointsman.policy.budget.redis_ledger import RedisLedger

    settings, proxy = ledger
    proc, base = serve(tmp_path / "data", **settings)
    d = route(base)
    proxy.refuse.set()
    r = httpx.post(f"{base}/v1/outcomes", json={"decision_id": d["decision_id"], "status": "ok",
                                                "usage": {"prompt_tokens": 12, "completion_tokens": 40}}, timeout=30)
    ack = r.json()["acks"][0]
    assert ack["status"] == "stored" and ack["settlement"]["hold_state"] == "journaled", ack
    journal = SpendJournal(tmp_path / "data" / DEFAULT_JOURNAL_NAME)
    assert len(journal) == 1
    proc.send_signal(signal.SIGTERM)
    proxy.refuse.clear()
    assert proc.wait(timeout=60) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal after shutting down
    assert len(journal) == 0
    books = RedisLedger.from_url(settings["budget_ledger"].replace(f"127.0.0.1:{proxy.port}", urlsplit(redis_url).netloc),
                                 BudgetConfig(), timeout_s=5.0)
    status = books.snapshot(["tenant:acme"]).statuses[0]
    assert status.settled_usd == pytest.approx(ack["settlement"]["actual_cost_usd"], abs=1e-9)


def test_an_ext_proc_outcome_stored_when_the_process_died_settling_it_is_booked_after_the_restart(tmp_path, serve,
                                                                                                 ledger):
    """ext_proc records the outcome of a stream itself: stored in the outcome log, then settled. No gateway resends
    it, so a SIGKILL between the two left it stored and never booked (its hold lapsing at the TTL). Restarted on the
    same data folder, the service must book it, once: the books then hold the killed stream's cost beside the
    reference stream's, and nothing held."""
    import asyncio

    import grpc

    from pointsman.outcome_log.store import OutcomeLog
    from pointsman.service import ext_proc_wire as wire
    from tests.service.conftest import free_port
    from tests.service.test_ext_proc import chat, request_phase, response_phase, set_headers

    settings, proxy = ledger
    grpc_port = free_port()
    proc, base = serve(tmp_path / "data", ext_proc_port=grpc_port, scrape_interval_s=0, decision_log_flush_ms=5,
                       **settings)
    port = int(base.rsplit(":", 1)[1])

    def stream() -> str:
        async def scenario() -> str:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
                call = wire.stub(channel).Process(metadata=())
                req = await request_phase(call, chat("Explain kickball."))
                await response_phase(call, 200, "application/json",
                                     [b'{"usage": {"prompt_tokens": 12, "completion_tokens": 40}}'])
                await call.done_writing()
                return set_headers(req[0])["x-pointsman-decision-id"]
        return asyncio.run(scenario())

    stream()  # the reference: nobody killed
    deadline = time.monotonic() + 20
    while (paid := acme(base))[0] == 0:
        assert time.monotonic() < deadline, "the reference stream was never booked"
        time.sleep(0.05)
    assert paid[0] > 0 and paid[1] == 0.0

    proxy.armed = proc.pid
    killed = stream()  # the stream ends; its outcome is stored, then the settle kills the process
    proc.wait(timeout=20)
    assert proxy.kills == 1 and proc.returncode == -signal.SIGKILL
    with OutcomeLog(tmp_path / "data" / "outcomes.db") as log:
        assert log.decision(killed).outcomes, "the outcome was not stored before the kill"
    _, base = serve(tmp_path / "data", port=port, ext_proc_port=grpc_port, scrape_interval_s=0, **settings)
    deadline = time.monotonic() + 20
    while acme(base) != (pytest.approx(2 * paid[0], abs=1e-9), 0.0):  # before: (paid, held until the TTL)
        assert time.monotonic() < deadline, acme(base)
        time.sleep(0.1)
