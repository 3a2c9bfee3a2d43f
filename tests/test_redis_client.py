"""``pointsman.redis_client``: after a call timed out, calls through the gate are refused at once (``Hung``, a
redis-py ``TimeoutError``, without calling Redis) for ``HUNG_PAUSE_S``; then one call tries again while the others
are refused until its timeout has passed; an answer opens the gate. The clock is a stand-in (no timing); the
client's retry policy is none (a retry to a hung Redis would wait the timeout again)."""

from __future__ import annotations

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from pointsman import redis_client
from pointsman.redis_client import HUNG_PAUSE_S, HangGate, Hung


def test_the_gate_waits_once_then_refuses_until_one_call_tries_again(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(redis_client.time, "monotonic", lambda: now[0])
    gate, calls = HangGate(timeout_s=2.0), []

    def hung() -> None:
        calls.append("sent")
        raise RedisTimeoutError("Timeout reading from socket")

    with pytest.raises(RedisTimeoutError) as first:
        gate.call(hung)
    assert not isinstance(first.value, Hung) and calls == ["sent"]
    for _ in range(3):  # refused at once, Redis not called
        with pytest.raises(Hung):
            gate.call(hung)
    assert calls == ["sent"] and gate.hung
    now[0] += HUNG_PAUSE_S
    assert not gate.hung
    tries: list[str] = []

    def probe() -> str:  # while this call waits, the others are refused
        with pytest.raises(Hung):
            gate.call(lambda: tries.append("another"))
        return "answered"

    assert gate.call(probe) == "answered" and tries == []
    assert gate.call(lambda: "open") == "open"  # answered: open again
    with pytest.raises(RedisConnectionError):  # a refused connection is not a hang: no pause
        gate.call(lambda: (_ for _ in ()).throw(RedisConnectionError("refused")))
    assert gate.call(lambda: "open") == "open"


def test_the_client_retries_nothing():
    client = redis_client.redis_client("redis://127.0.0.1:1/0")
    try:
        conn = client.connection_pool.make_connection()
        assert conn.retry.get_retries() == 0
        assert client.connection_pool.connection_kwargs["socket_timeout"] == redis_client.TIMEOUT_S
    finally:
        client.close()
