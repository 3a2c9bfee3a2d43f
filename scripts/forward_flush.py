#!/usr/bin/env python
"""Where forwarded outcomes end up when Redis loses or delays them: real ``redis-server`` and two real ``pointsman
serve`` replicas (own data folders, as two pods) sharing it (``POINTSMAN_STATE_URL``); route + outcome pairs at
``--rate`` a second for ``--run-s`` seconds, each decision made on one replica and its outcome posted to the other
(so every outcome is forwarded to the deciding replica's inbox), with a fault at ``--fault-at-s`` (and every
``--fault-every-s`` after, when set):

- ``flush``: ``FLUSHALL`` (what a new volume or a Redis without persistence restarted does too);
- ``stop``: redis-server SIGSTOPped for ``--stop-s`` seconds (a hung Redis: sends time out, and are applied when it
  resumes).

Latency: the p50/p99/max seconds of ``/v1/route`` and ``/v1/outcomes`` calls sent while Redis was stopped
(``stop``: sent in a stop window; a call that failed counts with its time until it failed), and of all calls.

After the run it waits ``--settle-s`` seconds, stops the replicas and counts, for every outcome acknowledged
(``stored``, ``duplicate``, ``forwarded``), how many of the two outcome logs hold it: ``in_no_log`` and
``in_two_logs`` should be 0, ``in_owner_log`` every one. Also printed: the acknowledgements by status, the
failures, and the outbox rows left (``forwards``, absent before the outbox existed).

    python scripts/forward_flush.py [--fault flush|stop] [--rate 30] [--run-s 30] [--fault-at-s 15]
                                    [--fault-every-s 0] [--stop-s 10] [--settle-s 10] [--json]

Runs the ``pointsman`` of the Python that runs it (another checkout's: run it with that checkout's Python).
"""

from __future__ import annotations

import argparse
import json
import signal
import sqlite3
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from chaos_outcomes import Redis, Replica, start_replicas  # noqa: E402


def pair(i: int, replicas: list[Replica], acks: dict[str, tuple[int, str]], errors: list[str],
         lock: threading.Lock, times: list[tuple[str, float, float]]) -> None:
    """Route on replica ``i % 2``, post the outcome to the other; record the acknowledgement (decision id ->
    (deciding replica, status)) and each call's ``(path, sent at monotonic s, seconds taken)`` in ``times``."""
    owner, other = replicas[i % 2], replicas[(i + 1) % 2]

    def timed(path: str, url: str, body: dict[str, object]) -> httpx.Response:
        sent = time.monotonic()
        try:
            return httpx.post(url, json=body, timeout=60)
        finally:
            with lock:
                times.append((path, sent, time.monotonic() - sent))

    try:
        d = timed("route", f"{owner.base}/v1/route", {"messages": [{"role": "user", "content": f"hello {i}"}]})
        if d.status_code != 200:
            raise RuntimeError(f"route {d.status_code}")
        decision_id = d.json()["decision_id"]
        o = timed("outcomes", f"{other.base}/v1/outcomes", {"decision_id": decision_id, "usage": {
            "prompt_tokens": 100, "completion_tokens": 10}})
        if o.status_code not in (200, 202):
            raise RuntimeError(f"outcome {o.status_code}")
        with lock:
            acks[decision_id] = (i % 2, o.json()["acks"][0]["status"])
    except (httpx.HTTPError, RuntimeError) as exc:
        with lock:
            errors.append(f"{type(exc).__name__}: {exc}")


def logged(data_dir: Path) -> set[str]:
    with sqlite3.connect(f"file:{data_dir / 'outcomes.db'}?mode=ro", uri=True) as c:
        return {str(r[0]) for r in c.execute("SELECT decision_id FROM outcomes")}


def outbox(data_dir: Path) -> int | None:
    with sqlite3.connect(f"file:{data_dir / 'outcomes.db'}?mode=ro", uri=True) as c:
        try:
            return int(c.execute("SELECT COUNT(*) FROM forwards").fetchone()[0])
        except sqlite3.OperationalError:  # a log without the outbox
            return None


def latency(times: list[tuple[str, float, float]], windows: list[tuple[float, float]]) -> dict[str, object]:
    """p50/p99/max seconds per path, of the calls sent in one of ``windows`` (monotonic s) and of all."""
    out: dict[str, object] = {}
    for path in ("route", "outcomes"):
        for name, keep in (("stopped", lambda at: any(a <= at < b for a, b in windows)), ("all", lambda at: True)):
            xs = sorted(took for p, at, took in times if p == path and keep(at))
            if xs:
                out[f"{path}_{name}_s"] = {"n": len(xs), "p50": round(xs[len(xs) // 2], 3),
                                           "p99": round(xs[min(len(xs) - 1, int(len(xs) * 0.99))], 3),
                                           "max": round(xs[-1], 3)}
    return out


def run(args: argparse.Namespace, root: Path) -> dict[str, object]:
    (root / "redis").mkdir()
    redis = Redis(root / "redis")
    replicas = start_replicas([(name, root / name, {"state_url": redis.url, "scrape_interval_s": "0"})
                               for name in ("a", "b")])
    acks: dict[str, tuple[int, str]] = {}
    errors: list[str] = []
    lock = threading.Lock()
    times: list[tuple[str, float, float]] = []
    windows: list[tuple[float, float]] = []
    try:
        with ThreadPoolExecutor(max_workers=64) as pool:
            start, n, next_fault, faults = time.monotonic(), int(args.rate * args.run_s), args.fault_at_s, 0
            for i in range(n):
                at = start + i / args.rate
                if next_fault is not None and at - start >= next_fault:
                    next_fault = next_fault + args.fault_every_s if args.fault_every_s > 0 else None
                    faults += 1
                    if args.fault == "flush":
                        import redis as redis_py

                        redis_py.Redis(port=redis.port).flushall()
                    else:
                        assert redis.proc is not None
                        redis.proc.send_signal(signal.SIGSTOP)
                        windows.append((time.monotonic(), time.monotonic() + args.stop_s))
                        threading.Timer(args.stop_s, redis.proc.send_signal, (signal.SIGCONT,)).start()
                time.sleep(max(0.0, at - time.monotonic()))
                pool.submit(pair, i, replicas, acks, errors, lock, times)
        time.sleep(args.settle_s)
    finally:
        for r in replicas:
            r.stop()
        redis.stop()
    logs = [logged(r.data_dir) for r in replicas]
    statuses: dict[str, int] = {}
    where = {"in_no_log": 0, "in_one_log": 0, "in_two_logs": 0, "in_owner_log": 0, "in_other_log_only": 0}
    for decision_id, (owner, status) in acks.items():
        statuses[status] = statuses.get(status, 0) + 1
        if status not in ("stored", "duplicate", "forwarded"):
            continue
        n_logs = sum(decision_id in log for log in logs)
        where[("in_no_log", "in_one_log", "in_two_logs")[n_logs]] += 1
        where["in_owner_log"] += decision_id in logs[owner]
        where["in_other_log_only"] += n_logs == 1 and decision_id not in logs[owner]
    return {"fault": args.fault, "faults": faults, "pairs": int(args.rate * args.run_s), "acknowledged": statuses, **where,
            "errors": len(errors), "first_errors": errors[:3], "outbox_left": [outbox(r.data_dir) for r in replicas],
            **latency(times, windows)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--fault", choices=("flush", "stop"), default="flush")
    p.add_argument("--rate", type=float, default=30.0)
    p.add_argument("--run-s", type=float, default=30.0)
    p.add_argument("--fault-at-s", type=float, default=15.0)
    p.add_argument("--fault-every-s", type=float, default=0.0)
    p.add_argument("--stop-s", type=float, default=10.0)
    p.add_argument("--settle-s", type=float, default=10.0)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="pointsman-forward-") as tmp:
        result = run(args, Path(tmp))
    print(json.dumps(result) if args.json else "\n".join(f"{k}: {v}" for k, v in result.items()))


if __name__ == "__main__":
    main()
