"""`pointsman serve` as a real process: it starts, answers POST /v1/route and /healthz, and stops on
SIGTERM gracefully (the decision log drained)."""

import signal

import httpx

from pointsman.outcome_log.store import OutcomeLog


def test_serve_answers_route_and_healthz(tmp_path, serve):
    proc, base = serve(tmp_path, decision_log_flush_ms=60_000)  # decisions wait in memory until shutdown
    health = httpx.get(f"{base}/healthz", timeout=1)
    assert health.status_code == 200 and health.json()["status"] == "ok"
    r = httpx.post(f"{base}/v1/route", json={"messages": [{"role": "user", "content": "What is 2 + 2?"}]}, timeout=10)
    assert r.status_code == 200
    assert r.headers["x-pointsman-target"] == r.json()["target"]
    assert (tmp_path / "budget.db").exists()  # the decision was reserved in the default SQLite ledger
    bad = httpx.post(f"{base}/v1/route", content=b"{", timeout=10)
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "malformed_json"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=15) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal after shutting down
    with OutcomeLog(tmp_path / "outcomes.db") as log:
        assert log.decision(r.json()["decision_id"]) is not None
