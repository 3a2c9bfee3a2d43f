"""Budget ledger latency: reserve, settle and snapshot, per backend, one thread.

    .venv/bin/python scripts/bench_budget.py                       # SQLite (normal, full) and Redis
    .venv/bin/python scripts/bench_budget.py --n 20000 --backend sqlite
    .venv/bin/python scripts/bench_budget.py --redis-url redis://127.0.0.1:6379/0

Each decision carries two scopes (tenant and team) with a day and a month budget
large enough never to refuse; every reserve is followed, after a batch, by its
settle. SQLite runs on a file in a temporary folder (``--dir`` to choose the disk).
Without ``--redis-url`` a private ``redis-server`` is started from PATH on a free
port (no persistence) and stopped at the end; Redis is skipped if there is none.
Also reports the throughput of 8 threads reserving+settling concurrently, and a
paced run (1 ms between decisions, like a service's steady load) with p99.9 and max:
back-to-back loops leave SQLite's background WAL checkpoint no gap to catch up in.
Prints microseconds: p50, p99 and mean per operation.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import click

from pointsman.policy.budget.config import BudgetConfig
from pointsman.policy.budget.redis_ledger import RedisLedger
from pointsman.policy.budget.sqlite_ledger import SqliteLedger

NOW = 1741953600.0  # 2025-03-14 12:00 UTC
SCOPES = ("tenant:acme", "team:acme/search")
CONFIG = BudgetConfig.from_dict({"budgets": [
    {"scope": "tenant:acme", "window": "day", "limit_usd": 1e6},
    {"scope": "tenant:acme", "window": "month", "limit_usd": 1e7},
    {"scope": "team:acme/search", "window": "day", "limit_usd": 1e6}]})


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def measure(ledger, n: int, tag: str) -> dict[str, list[float]]:
    """n reserves, n snapshots and n settles (batches of 100), timed one by one, in µs."""
    out: dict[str, list[float]] = {"reserve": [], "snapshot": [], "settle": []}
    clock = time.perf_counter
    for start in range(0, n, 100):
        ids = [f"{tag}-{i}" for i in range(start, min(n, start + 100))]
        for did in ids:
            t = clock()
            ledger.snapshot(SCOPES, NOW)
            out["snapshot"].append((clock() - t) * 1e6)
            t = clock()
            ledger.reserve(did, SCOPES, 0.0042, NOW)
            out["reserve"].append((clock() - t) * 1e6)
        for did in ids:
            t = clock()
            ledger.settle(did, 0.0031, NOW, target="frontier-large", prompt_tokens=800, completion_tokens=200)
            out["settle"].append((clock() - t) * 1e6)
    return out


def threaded(make_ledger, n_threads: int, per_thread: int, tag: str) -> float:
    """Decisions (reserve + settle) per second with ``n_threads`` threads, one ledger each."""
    ledgers = [make_ledger() for _ in range(n_threads)]
    barrier = threading.Barrier(n_threads + 1)

    def run(k: int) -> None:
        barrier.wait()
        for i in range(per_thread):
            did = f"{tag}-t{k}-{i}"
            ledgers[k].reserve(did, SCOPES, 0.0042, NOW)
            ledgers[k].settle(did, 0.0031, NOW)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(n_threads)]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    rate = n_threads * per_thread / (time.perf_counter() - t0)
    for ledger in ledgers:
        ledger.close()
    return rate


def paced(ledger, seconds: float, tag: str) -> list[float]:
    """Reserve + settle with a 1 ms pause between decisions (a service's steady load,
    leaving the background WAL checkpoint room to run) for ``seconds``; µs per operation."""
    xs: list[float] = []
    clock = time.perf_counter
    end, i = clock() + seconds, 0
    while clock() < end:
        t = clock()
        ledger.reserve(f"{tag}-{i}", SCOPES, 0.0042, NOW)
        xs.append((clock() - t) * 1e6)
        t = clock()
        ledger.settle(f"{tag}-{i}", 0.0031, NOW)
        xs.append((clock() - t) * 1e6)
        i += 1
        time.sleep(0.001)
    return xs


def report_paced(name: str, xs: list[float]) -> None:
    click.echo(f"{name:<22} paced: {len(xs) / 2:,.0f} decisions, reserve+settle ops p50 {pct(xs, 0.5):.0f} "
               f"p99 {pct(xs, 0.99):.0f} p99.9 {pct(xs, 0.999):.0f} max {max(xs):.0f} µs")


def report(name: str, res: dict[str, list[float]], rate: float) -> None:
    for op, xs in res.items():
        click.echo(f"{name:<22} {op:<9} {pct(xs, 0.5):8.1f} {pct(xs, 0.99):8.1f} {statistics.fmean(xs):8.1f}")
    click.echo(f"{name:<22} 8 threads: {rate:,.0f} decisions/s (reserve + settle)")


def start_redis() -> tuple[subprocess.Popen, str] | None:
    import socket

    binary = shutil.which("redis-server")
    if binary is None:
        return None
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    import redis

    for _ in range(200):
        try:
            redis.Redis.from_url(url).ping()
            return proc, url
        except redis.exceptions.ConnectionError:
            time.sleep(0.02)
    proc.kill()
    return None


@click.command()
@click.option("--n", default=5000, show_default=True, help="operations of each kind per backend")
@click.option("--backend", type=click.Choice(["all", "sqlite", "redis"]), default="all", show_default=True)
@click.option("--redis-url", default=None, help="use this Redis instead of starting one")
@click.option("--paced-s", default=5.0, show_default=True, help="seconds of paced load per backend (0: skip)")
@click.option("--dir", "folder", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="folder for the SQLite files (default: a temporary folder)")
def main(n: int, backend: str, redis_url: str | None, paced_s: float, folder: Path | None) -> None:
    """Print reserve/snapshot/settle latency (µs) per backend."""
    click.echo(f"{'backend':<22} {'op':<9} {'p50_us':>8} {'p99_us':>8} {'mean_us':>8}   (n={n}, 1 thread)")
    tmp = Path(tempfile.mkdtemp(dir=folder))
    try:
        if backend in ("all", "sqlite"):
            for sync in ("normal", "full"):
                path = tmp / f"bench-{sync}.db"
                ledger = SqliteLedger(path, CONFIG, synchronous=sync)
                measure(ledger, min(n, 500), "warm")
                res = measure(ledger, n, "run")
                xs = paced(ledger, paced_s, "paced") if paced_s > 0 else []
                ledger.close()
                rate = threaded(lambda: SqliteLedger(path, CONFIG, synchronous=sync), 8, max(1, n // 8), "thr")
                report(f"sqlite sync={sync}", res, rate)
                if xs:
                    report_paced(f"sqlite sync={sync}", xs)
        if backend in ("all", "redis"):
            server = None
            if redis_url is None:
                server = start_redis()
                if server is None:
                    click.echo("redis: skipped (no redis-server on PATH)", err=True)
                    return
                redis_url = server[1]
            try:
                prefix = f"{{bench-{time.time_ns()}}}:"
                ledger = RedisLedger.from_url(f"{redis_url}?prefix={prefix}", CONFIG)
                measure(ledger, min(n, 500), "warm")
                res = measure(ledger, n, "run")
                xs = paced(ledger, paced_s, "paced") if paced_s > 0 else []
                ledger.close()
                rate = threaded(lambda: RedisLedger.from_url(f"{redis_url}?prefix={prefix}", CONFIG), 8,
                                max(1, n // 8), "thr")
                report("redis (localhost)", res, rate)
                if xs:
                    report_paced("redis (localhost)", xs)
            finally:
                if server is not None:
                    server[0].terminate()
                    server[0].wait(timeout=10)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
