"""For every interleaving of forwards (sent, sent but reported failed as a timed-out send is, not sent at all),
Redis losing the forwarder's and owner's keys (what ``FLUSHALL`` does to them) and the forwarder's once-a-second
resend, with the owner's reader starting at any point: every outcome the forwarder kept ends up in the owner's
log, and the forwarder's outbox empties (the owner acknowledged each). Real redis-server and outcome logs, the
service's ``send_forwards``/``resend_forwards``; a hypothesis property over the schedule."""

from __future__ import annotations

import json
import time
import uuid
from urllib.parse import quote

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pointsman.outcome import parse_outcomes
from pointsman.outcome_log.store import OutcomeLog
from pointsman.policy.signals.shared_state import RedisSync
from pointsman.service.prometheus import ServiceMetrics
from pointsman.service.runtime import FORWARD_CONFIRM_S, FORWARD_KEEP_S, resend_forwards, send_forwards

OPS = st.lists(st.sampled_from(["post", "post_timed_out", "post_unsent", "flush", "resend"]), min_size=1, max_size=10)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS, owner_starts_at=st.integers(0, 10))
def test_every_kept_forward_ends_in_the_owners_log(redis_url, tmp_path_factory, ops, owner_starts_at):
    folder = tmp_path_factory.mktemp("forward")
    prefix = f"{{t-{uuid.uuid4().hex[:8]}}}:"
    log_a, log_b = OutcomeLog(folder / "a.db"), OutcomeLog(folder / "b.db")
    a, b = (RedisSync.from_url(f"{redis_url}?prefix={quote(prefix, safe='')}", block_ms=100) for _ in range(2))
    metrics = ServiceMetrics()

    def deliver(payloads):
        items = parse_outcomes([json.loads(p) for p in payloads])
        log_a.append_outcomes(items, known={o.decision_id: "onprem-8b" for o in items})
        return True

    def confirm(keys):
        log_b.forwards_confirmed(keys)
        return True

    a.set_inbox(log_a.log_id, deliver)
    b.set_inbox(log_b.log_id, lambda payloads: True, confirm)
    b.start(lambda change: None, lambda view: None)
    posted = []
    try:
        for i, op in enumerate([*ops, "end"]):
            if i == min(owner_starts_at, len(ops)):
                a.start(lambda change: None, lambda view: None)
            if op.startswith("post"):
                outcome = parse_outcomes({"decision_id": f"d{i}", "usage": {"prompt_tokens": 10, "completion_tokens": 1}})[0]
                row = (log_a.log_id, outcome.key, outcome.model_dump_json(exclude_unset=True))
                log_b.append_outcomes([], received_s=time.time() - 60, forwards=[(log_a.log_id, outcome)])  # acknowledged
                posted.append(outcome.decision_id)
                if op == "post":
                    assert send_forwards(log_b, b, [row])
                elif op == "post_timed_out":
                    b.forward([row])  # Redis applied it, but the caller saw a timeout: not marked sent
            elif op == "flush":
                keys = list(a.client.scan_iter(match=f"{prefix}*"))
                if keys:
                    a.client.delete(*keys)
            elif op == "resend":
                resend_forwards(log_b, b, metrics)
        deadline = time.monotonic() + 20  # no timing claim: the owner reads within a read interval
        while time.monotonic() < deadline:
            resend_forwards(log_b, b, metrics)  # what the service does every second
            if log_a.counts()["outcomes"] == len(posted) and log_b.forwards_pending() == 0:
                break
            time.sleep(0.05)
        assert [o for o in posted if log_a.outcome(o) is None] == [] and log_a.counts()["outcomes"] == len(posted)
        assert log_b.forwards_pending() == 0 and log_b.counts()["outcomes"] == 0
    finally:
        for sync in (a, b):
            sync.close()
        log_a.close()
        log_b.close()


def test_a_forward_no_owner_confirmed_within_the_keep_period_is_dropped_and_counted(redis_url, tmp_path):
    """An owner whose data folder is gone never reads its inbox: after ``FORWARD_KEEP_S`` the row is dropped (counted,
    logged), a younger one is kept and sent again."""
    prefix = quote(f"{{t-{uuid.uuid4().hex[:8]}}}:", safe="")
    sync = RedisSync.from_url(f"{redis_url}?prefix={prefix}", block_ms=100)
    metrics = ServiceMetrics()
    with OutcomeLog(tmp_path / "b.db") as log_b:
        old, young = parse_outcomes([{"decision_id": d, "usage": {"prompt_tokens": 10, "completion_tokens": 1}}
                                     for d in ("gone", "kept")])
        log_b.append_outcomes([], received_s=time.time() - FORWARD_KEEP_S - 60, forwards=[("log-gone", old)])
        log_b.append_outcomes([], received_s=time.time() - 60, forwards=[("log-gone", young)])
        try:
            assert resend_forwards(log_b, sync, metrics) == 1  # the young one, never sent
        finally:
            sync.close()
        assert log_b.forwards_pending() == 1 and metrics.forwards_dropped._value.get() == 1


def test_a_forward_whose_acknowledgement_was_trimmed_is_sent_again_and_confirmed(redis_url, tmp_path):
    """The owner stored the outcome and acknowledged it, but the ``acks`` stream (capped at ``ACKS_MAX_LEN``) lost
    the acknowledgement before the forwarder read it (the forwarder away for minutes; an owner of an earlier version
    acknowledges nothing): the row, sent to the current Redis, is sent again once left unconfirmed
    ``FORWARD_CONFIRM_S``, then after a doubling wait; the owner stores the duplicate once and acknowledges it, and the
    outbox empties (before: pending for ``FORWARD_KEEP_S``, then dropped and counted as lost)."""
    prefix = f"{{t-{uuid.uuid4().hex[:8]}}}:"
    url = f"{redis_url}?prefix={quote(prefix, safe='')}"
    log_a, log_b = OutcomeLog(tmp_path / "a.db"), OutcomeLog(tmp_path / "b.db")
    a, b = (RedisSync.from_url(url, block_ms=100) for _ in range(2))
    metrics = ServiceMetrics()

    def deliver(payloads):
        items = parse_outcomes([json.loads(p) for p in payloads])
        log_a.append_outcomes(items, known={o.decision_id: "onprem-8b" for o in items})
        return True

    try:
        a.set_inbox(log_a.log_id, deliver)
        b.set_inbox(log_b.log_id, lambda payloads: True, lambda keys: log_b.forwards_confirmed(keys) or True)
        outcome = parse_outcomes({"decision_id": "d0", "usage": {"prompt_tokens": 10, "completion_tokens": 1}})[0]
        t0 = time.time()
        log_b.append_outcomes([], received_s=t0, forwards=[(log_a.log_id, outcome)])
        assert send_forwards(log_b, b, [(log_a.log_id, outcome.key, outcome.model_dump_json(exclude_unset=True))], t0)
        a.start(lambda change: None, lambda view: None)
        acks = f"{prefix}acks:{log_b.log_id}"
        deadline = time.monotonic() + 20  # no timing claim: the owner reads within a read interval
        while not a.client.xlen(acks) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert log_a.outcome("d0") is not None and a.client.xlen(acks) == 1
        a.client.xtrim(acks, maxlen=0)  # trimmed before the forwarder read it
        b.start(lambda change: None, lambda view: None)
        assert resend_forwards(log_b, b, metrics, now=t0 + FORWARD_CONFIRM_S - 1) == 0 and log_b.forwards_pending() == 1
        t1 = t0 + FORWARD_CONFIRM_S + 1
        a.close()  # the owner away again: the resend is not acknowledged yet
        assert resend_forwards(log_b, b, metrics, now=t1) == 1
        assert resend_forwards(log_b, b, metrics, now=t1 + (t1 - t0) - 1) == 0  # waits as long as it had waited
        t2 = t1 + (t1 - t0) + 1
        assert resend_forwards(log_b, b, metrics, now=t2) == 1
        a = RedisSync.from_url(url, block_ms=100)
        a.set_inbox(log_a.log_id, deliver)
        a.start(lambda change: None, lambda view: None)
        deadline = time.monotonic() + 20
        while log_b.forwards_pending() and time.monotonic() < deadline:
            resend_forwards(log_b, b, metrics, now=t2)  # what the service does every second
            time.sleep(0.05)
        assert log_b.forwards_pending() == 0 and log_a.counts()["outcomes"] == 1  # the duplicates stored once
        assert metrics.forwards_dropped._value.get() == 0
    finally:
        for sync in (a, b):
            sync.close()
        log_a.close()
        log_b.close()
