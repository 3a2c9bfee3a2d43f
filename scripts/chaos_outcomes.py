#!/usr/bin/env python
"""Fault suite for outcomes and spend: real ``redis-server`` and real ``pointsman serve``
processes, clients routing and reporting outcomes while a part is killed, then the numbers.

Scenarios (``--scenario``, default all):

- ``redis-kill`` / ``redis-kill-open``: two replicas (own data folders, as on two hosts) share one
  redis-server for the budget ledger and the live state; clients route on one replica and post
  every other outcome to the *other* replica (the rest to the same one); Redis is SIGKILLed for
  ``--outage-s`` (5 s) mid-run and restarted on its append-only file (``appendfsync always``, so
  the restart itself loses nothing), with
  ``POINTSMAN_BUDGET_FAIL_OPEN`` false (the default: requests with budgets are refused with 503
  meanwhile, and are not answered decisions) and true;
- ``replica-kill``: the same pair, one replica SIGKILLed mid-run; clients carry on with the
  survivor (outcomes of the dead replica's decisions go there). Just before the kill a burst of
  decisions is made on the victim whose outcomes never come (their gateway died with it): the
  survivor must stop counting them in flight within the reservation TTL;
- ``disk-full``: one replica whose outcome log lives on a small tmpfs (``mount -t tmpfs``, root
  only) that is filled with a file mid-run (writes fail with ENOSPC), then emptied.

Clients retry an outcome on a 503 or a dropped connection (as ``docs/service.md`` asks) until it
is acknowledged (``stored``, ``duplicate``, ``forwarded``) or ``--deadline-s`` passes; any other
answer (404, 409, 422) is final. Printed per scenario:

- ``sent``: decisions answered (200 from ``/v1/route``), ``acked`` their outcomes acknowledged,
  ``lost`` = sent - acked (final refusals + never acknowledged), ``retries`` (503s and drops);
- per tenant, ``booked_usd`` (the ledger's settled spend) vs ``acked_usd`` (the sum of each
  decision's acknowledged settlement); ``journal`` settlements still waiting for the ledger;
- for the Redis outages, ``journal_pending_before_restart``: settlements the replicas kept in their
  spend journals (``pointsman_spend_journal_pending``) just before Redis came back;
- ``inflight_after_ttl`` per live replica (the load board's in-flight requests, ``/v1/fleet``),
  read ``--ttl-s`` + 1 s after the last dispatch, and ``held_usd_after_ttl`` (budget holds);
- for ``replica-kill``, ``survivor_inflight_at_kill``; for ``disk-full``, what ``/readyz`` and an
  outcome answered while the disk was full.

    python scripts/chaos_outcomes.py [--scenario redis-kill redis-kill-open replica-kill disk-full]
                                     [--clients 8] [--run-s 6] [--outage-s 5] [--ttl-s 6] [--json]

``tests/service/test_chaos_outcomes.py`` runs the same scenarios, shorter, and asserts 0 lost,
booked == acknowledged and 0 in flight after the TTL.
"""

from __future__ import annotations

import os

os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from contextlib import contextmanager  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402

import httpx  # noqa: E402

TENANTS = ("t0", "t1", "t2", "t3")
#: The budgets every replica reads: t3 has one (so fail-closed refuses it while the ledger is away),
#: large enough never to bind; the short reservation TTL is the in-flight TTL too.
BUDGETS = """apiVersion: pointsman/v1
kind: Budgets
reservation_ttl_s: {ttl_s}
record_retention_s: 86400
budgets:
  - {{scope: "tenant:t3", window: day, limit_usd: 100000}}
"""
LEDGER_PREFIX = "{pointsman-budget}:"


def free_port() -> int:
    """A free local TCP port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- processes -------------------------------------------------------------------------------------


class Redis:
    """A redis-server on ``port`` with its append-only file in ``folder`` (``appendfsync always``):
    ``kill()`` SIGKILLs it, ``start()`` starts it again on the same file."""

    def __init__(self, folder: Path) -> None:
        self.folder, self.port = folder, free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not on PATH (apt-get install -y redis-server)")
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.folder), "--save", "",
             "--appendonly", "yes", "--appendfsync", "always", "--daemonize", "no", "--loglevel", "warning"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(64).startswith(b"+PONG"):
                        return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.kill()


@dataclass
class Replica:
    """One ``pointsman serve`` process."""

    name: str
    proc: subprocess.Popen[bytes]
    base: str
    data_dir: Path
    alive: bool = True

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.alive = False

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.alive = False


def start_replicas(specs: list[tuple[str, Path, dict[str, str]]]) -> list[Replica]:
    """Start ``pointsman serve`` for each ``(name, data folder, POINTSMAN_* settings)`` at once and
    wait until each ``/readyz`` answers 200 (90 s at most). Raises ``RuntimeError``."""
    out = []
    for name, data_dir, settings in specs:
        port = free_port()
        env = {**os.environ, "POINTSMAN_DATA_DIR": str(data_dir), "POINTSMAN_WATCH_POLICY": "false",
               "POINTSMAN_MODEL_POLL_INTERVAL_S": "0", **{f"POINTSMAN_{k.upper()}": v for k, v in settings.items()}}
        proc = subprocess.Popen([sys.executable, "-m", "pointsman", "serve", "--port", str(port), "--log-level",
                                 "warning"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        out.append(Replica(name, proc, f"http://127.0.0.1:{port}", data_dir))
    deadline = time.monotonic() + 90
    for r in out:
        while True:
            try:
                if httpx.get(f"{r.base}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if r.proc.poll() is not None:
                raise RuntimeError(f"{r.name} exited: {r.proc.stderr.read().decode() if r.proc.stderr else ''}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{r.name} did not start within 90 s")
            time.sleep(0.1)
    return out


# -- clients ---------------------------------------------------------------------------------------


@dataclass
class Tally:
    """What the clients saw. ``decisions``: decision id -> tenant for every answered decision;
    ``acked``: decision id -> its acknowledged settlement's cost (USD); ``refused``: final answers."""

    decisions: dict[str, str] = field(default_factory=dict)
    acked: dict[str, float] = field(default_factory=dict)
    refused: list[str] = field(default_factory=list)
    retries: int = 0
    route_errors: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


def _live(replicas: list[Replica], i: int) -> Replica:
    """The ``i``-th replica if alive, else the next live one."""
    for k in range(len(replicas)):
        r = replicas[(i + k) % len(replicas)]
        if r.alive:
            return r
    raise RuntimeError("no live replica")


def try_outcome(replicas: list[Replica], target: int, body: dict[str, object], tally: Tally) -> bool:
    """One attempt to post an outcome to replica ``target`` (the next live one once it died): True
    when it is settled for good (acknowledged, or refused with a final answer), False to retry
    (a 503 or a dropped connection)."""
    decision_id = str(body["decision_id"])
    try:
        r = httpx.post(f"{_live(replicas, target).base}/v1/outcomes", json=body, timeout=10)
    except httpx.TransportError:
        r = None
    if r is None or r.status_code == 503:
        with tally.lock:
            tally.retries += 1
        return False
    ack = r.json().get("acks", [{}])[0]
    with tally.lock:
        if r.status_code in (200, 202) and ack.get("status") in ("stored", "duplicate", "forwarded"):
            settlement = ack.get("settlement") or {}
            tally.acked[decision_id] = float(settlement.get("actual_cost_usd") or 0.0)
        else:
            tally.refused.append(f"{r.status_code} {ack.get('status')}: {ack.get('message')}")
    return True


def client(k: int, replicas: list[Replica], tally: Tally, stop: threading.Event, hold_s: float,
           deadline: list[float]) -> None:
    """Route on replica k + n (mod n replicas) and post each outcome ``hold_s`` later (the request
    runs meanwhile), every other one to the next replica (the other of two), the others to the
    same one; outcomes answered 503 or dropped are retried every 0.2 s
    while routing goes on, as a gateway's outcome queue would. After ``stop``, only the retries,
    until ``deadline[0]``."""
    n = 0
    tenant = TENANTS[k % len(TENANTS)]
    pending: list[tuple[float, int, dict[str, object]]] = []  # (due, replica, body)
    with httpx.Client(timeout=10) as http:
        while (not stop.is_set() or pending) and time.monotonic() < deadline[0]:
            now = time.monotonic()
            for item in [p for p in pending if p[0] <= now]:
                pending.remove(item)
                if not try_outcome(replicas, item[1], item[2], tally):
                    pending.append((time.monotonic() + 0.2, item[1], item[2]))
            if stop.is_set():
                time.sleep(0.05)
                continue
            n += 1
            route_on = (k + n) % len(replicas)
            try:
                r = http.post(f"{_live(replicas, route_on).base}/v1/route", json={
                    "messages": [{"role": "user", "content": f"Summarise chapter {n} of the report for client {k}."}],
                    "routing": {"tenant": tenant}})
            except httpx.TransportError:
                r = None
            if r is None or r.status_code != 200:  # refused (fail-closed ledger away, ...): not answered
                with tally.lock:
                    tally.route_errors += 1
                time.sleep(0.05)
                continue
            decision_id = r.json()["decision_id"]
            with tally.lock:
                tally.decisions[decision_id] = tenant
            pending.append((time.monotonic() + hold_s, route_on + 1 + n % 2, {  # every other one to the other replica
                "decision_id": decision_id, "outcome_id": f"c{k}-{n}",
                "usage": {"prompt_tokens": 200 + 7 * n, "completion_tokens": 50 + n}, "ttft_ms": 120.0}))
            time.sleep(0.02)


@contextmanager
def clients(replicas: list[Replica], tally: Tally, count: int, hold_s: float,
            settle_s: float = 60.0) -> Iterator[None]:
    """Run ``count`` client threads for the ``with`` block; on exit they stop routing and have
    ``settle_s`` to get their last outcomes acknowledged."""
    stop = threading.Event()
    deadline = [float("inf")]
    threads = [threading.Thread(target=client, args=(k, replicas, tally, stop, hold_s, deadline), daemon=True)
               for k in range(count)]
    for t in threads:
        t.start()
    try:
        yield
    finally:
        deadline[0] = time.monotonic() + settle_s
        stop.set()
        for t in threads:
            t.join(timeout=settle_s + 15)


# -- measuring -------------------------------------------------------------------------------------


def booked_usd(redis_url: str, data_dirs: list[Path]) -> dict[str, float]:
    """Each tenant's settled spend in the ledger (every day window): Redis when ``redis_url``,
    else the first data folder's SQLite ledger."""
    out = dict.fromkeys(TENANTS, 0.0)
    if redis_url:
        import redis

        client_ = redis.Redis.from_url(redis_url, decode_responses=True)
        for tenant in TENANTS:
            for key in client_.scan_iter(match=f"{LEDGER_PREFIX}s:day:*:tenant:{tenant}"):
                out[tenant] += int(client_.hget(key, "settled") or 0) / 1e9
        client_.close()
        return out
    import sqlite3

    with sqlite3.connect(data_dirs[0] / "budget.db") as conn:
        for tenant in TENANTS:
            row = conn.execute("SELECT COALESCE(SUM(settled_nusd), 0) FROM budget_spend WHERE scope = ? AND "
                               "window_id LIKE 'day:%'", (f"tenant:{tenant}",)).fetchone()
            out[tenant] = int(row[0]) / 1e9
    return out


def held_usd(redis_url: str, data_dirs: list[Path]) -> float:
    """Budget holds still counted, every tenant, every day window (USD), after a sweep."""
    if redis_url:
        import redis

        from pointsman.policy.budget.redis_ledger import RedisLedger

        ledger = RedisLedger.from_url(redis_url)
        ledger.purge()  # sweeps holds past their TTL (a sweep runs on every ledger call)
        ledger.close()
        client_ = redis.Redis.from_url(redis_url, decode_responses=True)
        total = 0
        for key in client_.scan_iter(match=f"{LEDGER_PREFIX}s:day:*"):
            total += max(0, int(client_.hget(key, "held") or 0))
        client_.close()
        return total / 1e9
    import sqlite3

    with sqlite3.connect(data_dirs[0] / "budget.db") as conn:
        row = conn.execute("SELECT COALESCE(SUM(reserved_nusd), 0) FROM budget_reservations WHERE state = 'held' "
                           "AND expires_s > ?", (time.time(),)).fetchone()
    return int(row[0]) / 1e9


def journal_entries(data_dirs: list[Path]) -> int:
    """Settlements still waiting in the spend journals (not the booked ones they keep)."""
    from pointsman.policy.budget.journal import DEFAULT_JOURNAL_NAME, SpendJournal

    return sum(len(SpendJournal(d / DEFAULT_JOURNAL_NAME)) for d in data_dirs if (d / DEFAULT_JOURNAL_NAME).exists())


def inflight(replica: Replica) -> int:
    """Requests the replica counts in flight (every endpoint's ``inflight_requests``)."""
    fleet = httpx.get(f"{replica.base}/v1/fleet", timeout=10).json()
    return sum(int((e.get("load") or {}).get("inflight_requests") or 0)
               for t in fleet["targets"].values() for e in t["endpoints"])


def journal_pending(replica: Replica) -> int:
    """The replica's ``pointsman_spend_journal_pending`` (``/metrics``; 0 when it has none)."""
    for line in httpx.get(f"{replica.base}/metrics", timeout=10).text.splitlines():
        if line.startswith("pointsman_spend_journal_pending "):
            return int(float(line.split()[1]))
    return 0


def acked_usd(tally: Tally) -> dict[str, float]:
    """Each tenant's acknowledged spend (one settlement per decision)."""
    out = dict.fromkeys(TENANTS, 0.0)
    for decision_id, usd in tally.acked.items():
        out[tally.decisions[decision_id]] += usd
    return out


def report(tally: Tally, redis_url: str, replicas: list[Replica], ttl_s: float, last_dispatch: float) -> dict:
    """The scenario's numbers (module docstring), waiting for the journal to drain (30 s at most)
    and for ``ttl_s`` + 1 s after ``last_dispatch`` (monotonic)."""
    dirs = [r.data_dir for r in replicas]
    acked = acked_usd(tally)
    deadline = time.monotonic() + 30
    booked = booked_usd(redis_url, dirs)
    while time.monotonic() < deadline and (journal_entries(dirs) or any(
            abs(booked[t] - acked[t]) > 1e-6 for t in TENANTS)):
        time.sleep(0.5)
        booked = booked_usd(redis_url, dirs)
    time.sleep(max(0.0, last_dispatch + ttl_s + 1.0 - time.monotonic()))
    return {
        "sent": len(tally.decisions), "acked": len(tally.acked),
        "lost": len(tally.decisions) - len(tally.acked), "final_refusals": tally.refused[:5],
        "retries": tally.retries, "route_refusals": tally.route_errors,
        "booked_usd": {t: round(v, 9) for t, v in booked.items()},
        "acked_usd": {t: round(v, 9) for t, v in acked.items()},
        "journal": journal_entries(dirs),
        "inflight_after_ttl": {r.name: inflight(r) for r in replicas if r.alive},
        "held_usd_after_ttl": round(held_usd(redis_url, dirs), 9),
    }


# -- scenarios -------------------------------------------------------------------------------------


def _pair(root: Path, redis: Redis, ttl_s: float, **settings: str) -> list[Replica]:
    budgets = root / "budgets.yaml"
    budgets.write_text(BUDGETS.format(ttl_s=ttl_s))
    common = {"state_url": redis.url, "budget_ledger": redis.url, "budgets_path": str(budgets), **settings}
    return start_replicas([(name, root / name, common) for name in ("a", "b")])


def redis_kill(root: Path, *, fail_open: bool, clients_n: int = 8, run_s: float = 6.0, outage_s: float = 5.0,
               ttl_s: float = 6.0, hold_s: float = 0.1) -> dict:
    """Two replicas on one redis-server, which is SIGKILLed for ``outage_s`` mid-run."""
    redis = Redis(root)
    replicas = _pair(root, redis, ttl_s, budget_fail_open="true" if fail_open else "false")
    tally = Tally()
    try:
        with clients(replicas, tally, clients_n, hold_s):
            time.sleep(run_s / 2)
            redis.kill()
            time.sleep(outage_s)
            journaled = sum(journal_pending(r) for r in replicas)
            redis.start()
            time.sleep(run_s / 2)
        last = time.monotonic()
        return {"scenario": f"redis SIGKILLed {outage_s:g} s, fail-{'open' if fail_open else 'closed'}",
                "journal_pending_before_restart": journaled, **report(tally, redis.url, replicas, ttl_s, last)}
    finally:
        for r in replicas:
            r.stop()
        redis.stop()


def replica_kill(root: Path, *, clients_n: int = 8, run_s: float = 6.0, ttl_s: float = 6.0, hold_s: float = 0.1,
                 abandoned: int = 20) -> dict:
    """Two replicas on one redis-server; one is SIGKILLed mid-run, just after ``abandoned``
    decisions on it whose outcomes never come."""
    redis = Redis(root)
    replicas = _pair(root, redis, ttl_s)
    victim, survivor = replicas
    tally = Tally()
    try:
        with clients(replicas, tally, clients_n, hold_s):
            time.sleep(run_s / 2)
            for i in range(abandoned):
                httpx.post(f"{victim.base}/v1/route", timeout=10, json={
                    "messages": [{"role": "user", "content": f"abandoned {i}"}], "routing": {"tenant": "t0"}})
            victim.kill()
            time.sleep(0.5)
            at_kill = inflight(survivor)
            time.sleep(run_s / 2)
        last = time.monotonic()
        return {"scenario": "a replica SIGKILLed", "survivor_inflight_at_kill": at_kill,
                "abandoned_on_victim": abandoned, **report(tally, redis.url, replicas, ttl_s, last)}
    finally:
        for r in replicas:
            r.stop()
        redis.stop()


@contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` mounted at ``path`` for the block (root only). Raises ``PermissionError``
    when it cannot be mounted."""
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    if done.returncode != 0:
        raise PermissionError(f"cannot mount a tmpfs at {path}: {done.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def fill(path: Path) -> Path:
    """Fill the file system of ``path`` with one file (until ENOSPC); returns it."""
    filler = path / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:  # unbuffered: nothing is left to flush (and fail with ENOSPC again) at close
        while os.write(fd, b"\0" * 65536) > 0:
            pass
    except OSError:
        pass
    finally:
        os.close(fd)
    return filler


def disk_full(root: Path, *, clients_n: int = 4, run_s: float = 6.0, full_s: float = 4.0, ttl_s: float = 6.0,
              hold_s: float = 0.1) -> dict:
    """One replica whose outcome log is on a 16 MiB tmpfs, filled for ``full_s`` mid-run."""
    budgets = root / "budgets.yaml"
    budgets.write_text(BUDGETS.format(ttl_s=ttl_s))
    with tmpfs(root / "log", "16m") as log_dir:
        replicas = start_replicas([("a", root / "a", {"outcome_log": str(log_dir / "outcomes.db"),
                                                      "budgets_path": str(budgets)})])
        (replica,) = replicas
        tally = Tally()
        try:
            with clients(replicas, tally, clients_n, hold_s):
                time.sleep(run_s / 2)
                filler = fill(log_dir)
                time.sleep(full_s / 2)
                ready = httpx.get(f"{replica.base}/readyz", timeout=10)
                d = httpx.post(f"{replica.base}/v1/route", timeout=10,
                               json={"messages": [{"role": "user", "content": "while the disk is full"}],
                                     "routing": {"tenant": "t1"}}).json()
                probe = httpx.post(f"{replica.base}/v1/outcomes", timeout=10, json={
                    "decision_id": d["decision_id"], "usage": {"prompt_tokens": 10, "completion_tokens": 5}})
                time.sleep(full_s / 2)
                filler.unlink()
                time.sleep(1.5)
                ready_after = httpx.get(f"{replica.base}/readyz", timeout=10)
                retried = httpx.post(f"{replica.base}/v1/outcomes", timeout=10, json={
                    "decision_id": d["decision_id"], "usage": {"prompt_tokens": 10, "completion_tokens": 5}})
                if retried.status_code == 200:
                    with tally.lock:
                        tally.decisions[d["decision_id"]] = "t1"
                        tally.acked[d["decision_id"]] = float(retried.json()["acks"][0]["settlement"]["actual_cost_usd"])
                time.sleep(run_s / 2)
            last = time.monotonic()
            return {"scenario": "outcome log disk full", "disk": "tmpfs 16 MiB, filled with a file (ENOSPC)",
                    "readyz_while_full": ready.status_code, "readyz_check": ready.json()["checks"].get("outcome_log"),
                    "outcome_while_full": f"{probe.status_code} {probe.json().get('error', {}).get('code', '')}",
                    "readyz_after": ready_after.status_code, "outcome_retried_after": retried.status_code,
                    **report(tally, "", replicas, ttl_s, last)}
        finally:
            for r in replicas:
                r.stop()


SCENARIOS = ("redis-kill", "redis-kill-open", "replica-kill", "disk-full")


def run(name: str, args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory(prefix=f"chaos-{name}-") as tmp:
        root = Path(tmp)
        common = {"clients_n": args.clients, "run_s": args.run_s, "ttl_s": args.ttl_s}
        if name == "redis-kill":
            return redis_kill(root, fail_open=False, outage_s=args.outage_s, **common)
        if name == "redis-kill-open":
            return redis_kill(root, fail_open=True, outage_s=args.outage_s, **common)
        if name == "replica-kill":
            return replica_kill(root, **common)
        return disk_full(root, **common)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenario", nargs="+", choices=SCENARIOS, default=list(SCENARIOS))
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--run-s", type=float, default=6.0)
    ap.add_argument("--outage-s", type=float, default=5.0)
    ap.add_argument("--ttl-s", type=float, default=6.0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    for name in args.scenario:
        result = run(name, args)
        if args.json:
            print(json.dumps(result))
            continue
        print(f"== {result.pop('scenario')}")
        for key, value in result.items():
            print(f"  {key}: {value}")


if __name__ == "__main__":
    main()
