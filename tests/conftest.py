"""Shared fixtures.

``redis_url``: a real ``redis-server`` (from PATH) on a free local port, without
persistence (``--save '' --appendonly no``), started once per test session and
killed at teardown. Without ``redis-server`` the tests that use it are skipped,
unless ``POINTSMAN_REQUIRE_REDIS=1`` (CI), where they fail.

The suite runs on two pytest-xdist workers (``make test``: ``-n 2``), so each worker, and every
process it starts, keeps its numeric libraries to one thread: two workers each spinning a BLAS or
OpenMP pool per core oversubscribe a 2-core machine several times over (the learning-curve test took
85 s instead of 20). Hypothesis has no per-example deadline: a loaded machine is not a failure.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator

import pytest
from hypothesis import settings

if os.environ.get("PYTEST_XDIST_WORKER"):
    for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[_var] = "1"
    from threadpoolctl import threadpool_limits

    threadpool_limits(1)

settings.register_profile("pointsman", deadline=None)
settings.load_profile("pointsman")

# No network at test time: LiteLLM reads its packaged price map instead of fetching one.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _answers_ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2) as s:
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def _start_redis(binary: str) -> tuple[subprocess.Popen, int]:
    """Start redis-server on a free port; retries a few ports if one is taken in between."""
    last = ""
    for _ in range(5):
        port = _free_port()
        log = tempfile.TemporaryFile()
        proc = subprocess.Popen(
            [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--daemonize", "no", "--loglevel", "warning"],
            stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline and proc.poll() is None:
            if _answers_ping(port):
                return proc, port
            time.sleep(0.02)
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=5)
        log.seek(0)
        last = log.read().decode("utf-8", "replace")[-500:]
    raise RuntimeError(f"redis-server did not answer PING on a free port: {last}")


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """URL of a live, empty-at-start redis-server (``redis://127.0.0.1:PORT/0``)."""
    binary = shutil.which("redis-server")
    if binary is None:
        reason = "redis-server is not on PATH (install it: apt-get install -y redis-server)"
        if os.environ.get("POINTSMAN_REQUIRE_REDIS") == "1":
            pytest.fail(f"POINTSMAN_REQUIRE_REDIS=1 but {reason}")
        pytest.skip(reason)
    proc, port = _start_redis(binary)
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


class BudgetLedgerFactory:
    """Opens budget ledgers of one backend (``sqlite`` or ``redis``) in fresh stores.

    ``store()`` names a new, empty store (a SQLite file or a Redis key prefix);
    ``open(config, store)`` opens a ledger on it (a new store when None). Several
    ledgers opened on one store share it, like two processes or two replicas.
    """

    def __init__(self, backend: str, tmp_dir, redis_url: str | None) -> None:
        self.backend, self.tmp_dir, self.redis_url = backend, tmp_dir, redis_url
        self._opened: list = []
        self._n = 0

    def store(self) -> str:
        import uuid

        self._n += 1
        if self.backend == "sqlite":
            return str(self.tmp_dir / f"ledger-{self._n}-{uuid.uuid4().hex[:8]}.db")
        return f"{{test-{uuid.uuid4().hex}}}:"

    def open(self, config=None, store: str | None = None):
        from pointsman.policy.budget.redis_ledger import RedisLedger
        from pointsman.policy.budget.sqlite_ledger import SqliteLedger

        store = store or self.store()
        if self.backend == "sqlite":
            ledger = SqliteLedger(store, config)
        else:
            from urllib.parse import quote

            ledger = RedisLedger.from_url(f"{self.redis_url}?prefix={quote(store, safe='')}", config)
        self._opened.append(ledger)
        return ledger

    def close_all(self) -> None:
        for ledger in self._opened:
            ledger.close()


@pytest.fixture(params=["sqlite", "redis"])
def budget_ledgers(request, tmp_path_factory) -> Iterator[BudgetLedgerFactory]:
    """A ``BudgetLedgerFactory`` for each backend in turn (the redis one needs ``redis_url``)."""
    url = request.getfixturevalue("redis_url") if request.param == "redis" else None
    factory = BudgetLedgerFactory(request.param, tmp_path_factory.mktemp("budget"), url)
    yield factory
    factory.close_all()


@pytest.fixture(scope="session")
def standin():
    """The stand-in engine module (``tests/fixtures/standin_engine.py``: vLLM/SGLang ``/metrics``
    pages and KV-event publishers speaking the real wire formats)."""
    import importlib.util
    import sys
    from pathlib import Path

    if "standin_engine" not in sys.modules:
        path = Path(__file__).resolve().parent / "fixtures" / "standin_engine.py"
        spec = importlib.util.spec_from_file_location("standin_engine", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["standin_engine"] = module
        spec.loader.exec_module(module)
    return sys.modules["standin_engine"]
