"""`pointsman serve` as a real process: it starts, answers POST /v1/route and /healthz, and stops on SIGTERM."""

import os
import signal
import socket
import subprocess
import sys
import time

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_answers_route_and_healthz(tmp_path):
    port = free_port()
    env = {**os.environ, "ORT_DISABLE_TELEMETRY": "1", "MLFLOW_DISABLE_TELEMETRY": "true", "HF_HUB_OFFLINE": "1",
           "POINTSMAN_DATA_DIR": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-m", "pointsman", "serve", "--port", str(port), "--log-level", "warning"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                health = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
                break
            except httpx.TransportError:
                assert proc.poll() is None, proc.stderr.read().decode()
                assert time.monotonic() < deadline, "service did not start within 60 s"
                time.sleep(0.2)
        assert health.status_code == 200 and health.json()["status"] == "ok"
        r = httpx.post(f"http://127.0.0.1:{port}/v1/route",
                       json={"messages": [{"role": "user", "content": "What is 2 + 2?"}]}, timeout=10)
        assert r.status_code == 200
        assert r.headers["x-pointsman-target"] == r.json()["target"]
        assert (tmp_path / "budget.db").exists()  # the decision was reserved in the default SQLite ledger
        bad = httpx.post(f"http://127.0.0.1:{port}/v1/route", content=b"{", timeout=10)
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "malformed_json"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
