"""Fixtures for the service tests: ``serve``, a starter of real ``pointsman serve`` processes.

``serve(data_dir, port=None, **env) -> (process, base_url)`` starts ``python -m pointsman
serve`` on a free port (or ``port``) with ``POINTSMAN_DATA_DIR=data_dir`` (and ``env`` as
``POINTSMAN_*`` variables), waits until ``/readyz`` answers 200 (60 s at most), and every
process it started is stopped at teardown (SIGTERM, then SIGKILL).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import httpx
import pytest


def free_port() -> int:
    """A free local TCP port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL after 15 s; no-op when it already exited."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def serve() -> Iterator[Callable[..., tuple[subprocess.Popen, str]]]:
    yield from _starter()


@pytest.fixture(scope="module")
def serve_module() -> Iterator[Callable[..., tuple[subprocess.Popen, str]]]:
    """``serve`` whose processes live until the test module ends (one service for several tests)."""
    yield from _starter()


def start_serve(settings: Callable[[], dict[str, str]], started: list[subprocess.Popen],
                port: int | None = None) -> tuple[subprocess.Popen, str]:
    """Start ``python -m pointsman serve`` on ``port`` (else a free one) with ``settings()`` as
    ``POINTSMAN_*`` variables beside the test environment; appended to ``started`` (the caller stops
    them). Waits until ``/readyz`` answers 200 (60 s at most). A free port can be taken (another test's
    ephemeral port) before serve binds it: then, without a given ``port``, up to three tries, each on a
    fresh port and with ``settings()`` called again (a setting may name a port too). Returns the
    process and its base URL; raises ``AssertionError`` with serve's stderr when it exits."""
    for attempt in range(3):
        chosen = port or free_port()
        env = {**os.environ, "ORT_DISABLE_TELEMETRY": "1", "MLFLOW_DISABLE_TELEMETRY": "true", "HF_HUB_OFFLINE": "1",
               **settings()}
        proc = subprocess.Popen([sys.executable, "-m", "pointsman", "serve", "--port", str(chosen),
                                 "--log-level", "warning"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        started.append(proc)
        base = f"http://127.0.0.1:{chosen}"
        deadline = time.monotonic() + 60
        while proc.poll() is None:
            try:
                if httpx.get(f"{base}/readyz", timeout=1).status_code == 200:
                    return proc, base
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "service did not start within 60 s"
            time.sleep(0.1)
        error = proc.stderr.read().decode()
        assert port is None and "address already in use" in error and attempt < 2, error
    raise AssertionError("unreachable")


def _starter() -> Iterator[Callable[..., tuple[subprocess.Popen, str]]]:
    started: list[subprocess.Popen] = []

    def start(data_dir, port: int | None = None, **settings: str) -> tuple[subprocess.Popen, str]:
        env = {"POINTSMAN_DATA_DIR": str(data_dir), **{f"POINTSMAN_{k.upper()}": str(v) for k, v in settings.items()}}
        return start_serve(lambda: env, started, port)

    yield start
    for proc in started:
        stop(proc)
