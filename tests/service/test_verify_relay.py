"""A verify reaching a process that does not hold its decision is relayed to the one that does
(``service/verify_relay.py``): ``pointsman serve --workers 2`` with live state in a real Redis, each
request on a fresh connection (either worker). Before the relay about half of these verifies were
410 ``decision_expired`` (the other worker held the decision), so the gateway kept every such draft."""

from __future__ import annotations

import signal
import time
import uuid
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.slow

REFUSAL = "I'm sorry, but I cannot help with that request."


def _post(base: str, path: str, body: dict) -> httpx.Response:
    with httpx.Client(base_url=base, timeout=10) as c:  # a new connection: either worker
        return c.post(path, json=body)


def test_every_verify_is_answered_by_the_worker_holding_its_decision(tmp_path, serve, redis_url):
    policy = Path(__file__).resolve().parents[1] / "fixtures" / "cascade_policy.yaml"
    prefix = f"%7Brelay-{uuid.uuid4().hex[:8]}%7D:"
    _, base = serve(tmp_path / "data", workers="2", watch_policy="false", policy_path=str(policy),
                    state_url=f"{redis_url}?prefix={prefix}")
    verify_statuses, settled = [], []
    for i in range(16):
        did = _post(base, "/v1/route", {"messages": [{"role": "user", "content": f"question {i}"}]}).json()["decision_id"]
        body = {"decision_id": did, "draft": {"text": REFUSAL, "finish_reason": "stop"}, "usage": {"completion_tokens": 11}}
        r = _post(base, "/v1/verify", body)
        verify_statuses.append(r.status_code)
        if r.status_code != 200:
            continue
        v = r.json()
        assert (v["action"], v["target"], v["rule"]) == ("escalate", "frontier-large", "refusal")
        again = _post(base, "/v1/verify", body).json()  # replayed, whichever worker answers
        assert again["replayed"] is True and again["escalation_id"] == v["escalation_id"]
        ack = _post(base, "/v1/outcomes", {"decision_id": v["escalation_id"], "status": "ok",
                                           "served_target": "frontier-large",
                                           "usage": {"prompt_tokens": 9, "completion_tokens": 120}}).json()["acks"][0]
        settled.append((ack["status"], ack["settlement"]["decision_id"] == v["escalation_id"],
                        ack["settlement"]["target"]))
    assert verify_statuses == [200] * 16
    assert settled == [("stored", True, "frontier-large")] * 16
    unknown = _post(base, "/v1/verify", {"decision_id": "0" * 32, "draft": {"text": "x"}})
    assert (unknown.status_code, unknown.json()["error"]["code"]) == (404, "unknown_decision")


def test_a_verify_answered_410_is_not_verified_later_by_a_paused_holder(tmp_path, serve, redis_url):
    """Replica B routes; while B is paused (SIGSTOP: a holder busy past the relay's 2 s) a verify reaching A
    is answered 410, so the gateway keeps the draft. Before, B took the relayed verify once it ran again:
    it settled the draft, held an escalation to frontier-large until its TTL and then refused the gateway's
    outcome of the draft (422, "was escalated"). Now B drops the relay its asker gave up on: the draft's
    outcome is stored and settles the draft once, on B as anywhere."""
    policy = Path(__file__).resolve().parents[1] / "fixtures" / "cascade_policy.yaml"
    prefix = f"%7Blate-{uuid.uuid4().hex[:8]}%7D:"
    common = {"watch_policy": "false", "policy_path": str(policy), "state_url": f"{redis_url}?prefix={prefix}",
              "decision_key": "one secret both replicas share", "scrape_interval_s": "0"}
    _, a = serve(tmp_path / "a", **common)
    b_proc, b = serve(tmp_path / "b", **common)
    did = _post(b, "/v1/route", {"messages": [{"role": "user", "content": "question"}]}).json()["decision_id"]
    other = _post(b, "/v1/route", {"messages": [{"role": "user", "content": "another"}]}).json()["decision_id"]
    body = {"decision_id": did, "draft": {"text": REFUSAL, "finish_reason": "stop"}, "usage": {"completion_tokens": 11}}
    b_proc.send_signal(signal.SIGSTOP)
    try:
        late = _post(a, "/v1/verify", body)
    finally:
        b_proc.send_signal(signal.SIGCONT)
    assert (late.status_code, late.json()["error"]["code"]) == (410, "decision_expired")
    # B's relay reads its messages in order: once A's verify of `other` is answered, B has seen the late one
    again = _post(a, "/v1/verify", {**body, "decision_id": other})
    assert (again.status_code, again.json()["action"]) == (200, "escalate")
    r = _post(b, "/v1/outcomes", {"decision_id": did, "status": "ok", "served_target": "onprem-8b",
                                  "usage": {"prompt_tokens": 9, "completion_tokens": 11}})
    assert r.status_code == 200, r.text
    ack = r.json()["acks"][0]
    assert (ack["status"], ack["settlement"]["target"], ack["settlement"]["replayed"]) == ("stored", "onprem-8b", False)


def test_an_asker_waits_for_a_holder_that_took_its_verify_past_the_timeout(redis_url):
    """Two relays on a real Redis: the holder takes the verify at once and answers after the asker's
    timeout. The asker cannot take the claim then, so it waits for the answer instead of answering 410
    while the holder verifies (and escalates) behind it."""
    import redis

    from pointsman.service.verify_relay import VerifyRelay

    prefix = f"{{wait-{uuid.uuid4().hex[:8]}}}:"
    answered: list[dict] = []

    def slow_answer(body: dict) -> tuple[int, dict]:
        time.sleep(2.5)
        answered.append(body)
        return 200, {"action": "escalate", "decision_id": body["decision_id"]}

    def client() -> redis.Redis:
        return redis.Redis.from_url(redis_url, decode_responses=True, socket_timeout=5)

    holder = VerifyRelay(client(), prefix, lambda d: d == "held", slow_answer, timeout_s=1.0).start()
    asker = VerifyRelay(client(), prefix, lambda d: False, slow_answer, timeout_s=1.0).start()
    try:
        deadline = time.monotonic() + 10
        while client().pubsub_numsub(f"{prefix}verify")[0][1] < 2:  # both subscribed
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert asker.ask("held", {"decision_id": "held"}) == (200, {"action": "escalate", "decision_id": "held"})
        assert asker.ask("nobody", {"decision_id": "nobody"}) is None  # no holder: 410 as before
        assert answered == [{"decision_id": "held"}]
    finally:
        holder.close()
        asker.close()
