"""A worker that dies while the budgets or policy file on disk is broken (a rejected reload: the running
files keep serving) does not take the service down: ``pointsman serve --workers 2`` with a real Redis, the
file broken, one worker SIGKILLed (as the OOM killer does). Its replacement fails to start on the broken
file; the other worker keeps answering, and once the file is fixed a replacement starts and both serve.
Before, uvicorn's supervisor took the replacement's failed start for a broken app and stopped the whole
service (the surviving worker too): a rejected reload plus any worker death was an outage."""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest

from pointsman.policy.rules.compiler import DEFAULT_POLICY_PATH

pytestmark = pytest.mark.slow

BUDGETS = "apiVersion: pointsman/v1\nkind: Budgets\nbudgets:\n  - {scope: 'tenant:t1', window: day, limit_usd: 100}\n"
BROKEN = "apiVersion: pointsman/v1\nkind: Budgets\nbudgets:\n  - {scope: 'tenant:t1', window: day, limit_usd: 100\n"
ROUTE = {"messages": [{"role": "user", "content": "Say hello."}], "routing": {"tenant": "t1"}}


def _workers(parent: int) -> set[int]:
    """The pids of ``parent``'s uvicorn worker processes (multiprocessing spawn children)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (entry / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == parent and b"spawn_main" in cmdline:
            found.add(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        return "Z" not in Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False


@pytest.mark.parametrize("broken", ["budgets", "policy"])
def test_a_worker_dying_while_a_file_is_broken_leaves_the_service_up(tmp_path, serve, redis_url, broken):
    budgets, policy = tmp_path / "budgets.yaml", tmp_path / "policy.yaml"
    budgets.write_text(BUDGETS)
    packaged = DEFAULT_POLICY_PATH
    policy.write_text(packaged.read_text())
    prefix = f"%7Brespawn-{uuid.uuid4().hex[:8]}%7D:"
    proc, base = serve(tmp_path / "data", workers="2", budgets_path=str(budgets), policy_path=str(policy),
                       state_url=f"{redis_url}?prefix={prefix}", budget_ledger=f"{redis_url}?prefix={prefix}b:")
    errors: list[str] = []
    reader = threading.Thread(target=lambda: errors.extend(line.decode() for line in proc.stderr), daemon=True)
    reader.start()
    assert httpx.post(f"{base}/v1/route", json=ROUTE, timeout=30).status_code == 200
    (budgets if broken == "budgets" else policy).write_text(BROKEN if broken == "budgets" else "rules: [\n")
    workers = _workers(proc.pid)
    assert len(workers) == 2
    victim = min(workers)
    os.kill(victim, signal.SIGKILL)
    # the replacement reads the broken file and fails to start
    deadline = time.monotonic() + 120
    while not any("Application startup failed" in line for line in errors):
        assert time.monotonic() < deadline, "no replacement worker tried to start"
        time.sleep(0.1)
    seen = _workers(proc.pid) | {victim}  # the survivor, and the failed replacement while it exits
    budgets.write_text(BUDGETS)
    policy.write_text(packaged.read_text())
    # the service stays up and a new replacement starts on the fixed file
    deadline = time.monotonic() + 120
    while not {pid for pid in _workers(proc.pid) if _alive(pid)} - seen:
        assert proc.poll() is None, f"the service stopped: {''.join(errors)[-600:]}"
        assert time.monotonic() < deadline, "no replacement worker started after the file was fixed"
        time.sleep(0.2)
    for _ in range(8):
        with httpx.Client(timeout=30) as client:  # a new connection: either worker
            assert client.post(f"{base}/v1/route", json=ROUTE).status_code == 200
    assert proc.poll() is None
    assert len({pid for pid in _workers(proc.pid) if _alive(pid)}) == 2


def test_a_worker_starting_while_another_creates_its_metrics_file(tmp_path, serve, redis_url):
    """Each worker keeps its counters in files of ``PROMETHEUS_MULTIPROC_DIR``, created empty and then sized
    (prometheus_client's ``MmapedDict``); a scrape, or a worker's start (registering the collector reads every
    file), that reads one in between read 0 bytes: ``struct.error``. Seen starting ``serve --workers 2``: the
    second worker's start failed, and uvicorn stopped the service a minute later, after it had served. Here the
    empty file is left in place: a scrape answers, and a replacement worker starts."""
    proc, base = serve(tmp_path / "data", workers="2", state_url=redis_url)
    workers = _workers(proc.pid)
    environ = Path(f"/proc/{min(workers)}/environ").read_bytes().split(b"\0")
    environ = dict(item.split(b"=", 1) for item in environ if b"=" in item)
    metrics_dir = Path(os.fsdecode(environ[b"PROMETHEUS_MULTIPROC_DIR"]))
    (metrics_dir / "counter_4194303.db").touch()  # as a starting worker has it, before it is sized
    assert httpx.get(f"{base}/metrics", timeout=30).status_code == 200
    os.kill(min(workers), signal.SIGKILL)
    deadline = time.monotonic() + 120
    while not {pid for pid in _workers(proc.pid) if _alive(pid)} - workers:
        assert proc.poll() is None, "the service stopped"
        assert time.monotonic() < deadline, "no replacement worker started"
        time.sleep(0.2)
    for _ in range(8):
        with httpx.Client(timeout=30) as client:  # a new connection: either worker
            assert client.get(f"{base}/metrics").status_code == 200
    assert proc.poll() is None
