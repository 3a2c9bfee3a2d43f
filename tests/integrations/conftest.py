"""Fixtures of the integration tests: ``service``, a live ``pointsman serve`` (a subprocess on a
free port) serving the requesting module's ``policy_text`` fixture, with gateway key ``GATEWAY_KEY``
and one budget: tenant ``broke`` may spend $0 a day (``BROKE_TENANT``)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest

GATEWAY_KEY = "gw-secret-for-tests"
BROKE_TENANT = "broke"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory, policy_text: str) -> Iterator[dict]:
    """``pointsman serve`` with the default fleet, the test module's ``policy_text`` fixture and
    the gateway key ``GATEWAY_KEY``."""
    tmp = tmp_path_factory.mktemp("pointsman")
    policy = tmp / "policy.yaml"
    policy.write_text(policy_text)
    budgets = tmp / "budgets.yaml"
    budgets.write_text("apiVersion: pointsman/v1\nkind: Budgets\nbudgets:\n"
                       f"  - {{scope: 'tenant:{BROKE_TENANT}', window: day, limit_usd: 0}}\n")
    port = _free_port()
    env = {**os.environ, "POINTSMAN_DATA_DIR": str(tmp), "POINTSMAN_OUTCOME_LOG": str(tmp / "outcomes.db"),
           "POINTSMAN_WATCH_POLICY": "false", "POINTSMAN_GATEWAY_API_KEYS": f"litellm={GATEWAY_KEY}",
           "POINTSMAN_BUDGETS_PATH": str(budgets), "POINTSMAN_WATCH_BUDGETS": "false",
           "POINTSMAN_DECISION_LOG_FLUSH_MS": "5", "MLFLOW_DISABLE_TELEMETRY": "true",
           "ORT_DISABLE_TELEMETRY": "1", "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-c", "from pointsman.cli.main import main; main()", "serve",
           "--port", str(port), "--policy", str(policy), "--log-level", "warning"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                pytest.fail(f"pointsman serve exited: {proc.stdout.read().decode()[-2000:]}")
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail("pointsman serve did not answer /healthz within 60 s")
            time.sleep(0.1)
        yield {"url": url, "outcome_log": tmp / "outcomes.db"}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
