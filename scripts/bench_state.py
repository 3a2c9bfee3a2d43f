"""Live fleet state: decision latency with the state shared through Redis against the embedded
state in the same run, Redis round trips per decision, and the prefix index's memory.

    python scripts/bench_state.py [--decisions 3000] [--json]

1. ``route()`` of a 500-token prompt, dispatch included (the decision's one write), on the
   packaged fleet and default policy with the bundled estimator: p50/p99 in ms with the embedded
   ``LocalSync`` and with ``RedisSync`` on a ``redis-server`` this script starts on a free local
   port (requires ``redis-server`` on PATH). Each decision's outcome is settled, not timed.
   Round trips per decision are counted on the Redis client (commands sent during ``route``),
   and the shared-state write itself (``RedisSync.dispatch``) is timed on its own. The two
   states run in alternating rounds (``--rounds``), so a busy machine slows both alike.
2. Prefix index memory: ``PrefixIndex.record`` of one million distinct blocks over 8 endpoints,
   measured with ``tracemalloc``: bytes per block.

Issue 11's targets: p99 <= 5 ms at 500 tokens with the shared state, at most one Redis round
trip per decision.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path

os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")

from pointsman.estimator.model_source import load_estimator  # noqa: E402
from pointsman.policy.engine import RoutingEngine  # noqa: E402
from pointsman.policy.fleet import load_fleet  # noqa: E402
from pointsman.policy.rules.compiler import DEFAULT_POLICY_PATH, load_policy  # noqa: E402
from pointsman.policy.signals.fleet_state import FleetState  # noqa: E402
from pointsman.policy.signals.prefix_index import PrefixIndex  # noqa: E402
from pointsman.policy.signals.shared_state import LocalSync, RedisSync, StateSync  # noqa: E402
from pointsman.request import RouteRequest, parse_route_request  # noqa: E402

WORDS = ("routing", "latency", "prefill", "decode", "cache", "budget", "replica", "policy", "token", "gateway")


def prompt(i: int, tokens: int = 500) -> str:
    """A prompt of about ``tokens`` WordPiece tokens, distinct per ``i``."""
    return f"request {i}: " + " ".join(WORDS[(i + k) % len(WORDS)] for k in range(tokens - 4))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class CountingRedis:
    """Counts the commands the wrapped ``redis.Redis`` client sends from the deciding thread (each
    script call is one ``EVALSHA``: one round trip; the sync's reader thread is not counted)."""

    def __init__(self) -> None:
        self.commands = 0
        self.thread = threading.get_ident()

    def install(self, client: object) -> None:
        original = client.execute_command  # type: ignore[attr-defined]  # redis.Redis's method, wrapped

        def counted(*args: object, **kwargs: object) -> object:
            if threading.get_ident() == self.thread:
                self.commands += 1
            return original(*args, **kwargs)

        client.execute_command = counted  # type: ignore[attr-defined]  # see above


class Arm:
    """One state (embedded or Redis) under test: its engine and what its decisions measured."""

    def __init__(self, sync: StateSync, counter: CountingRedis | None) -> None:
        fleet = load_fleet()
        self.engine = RoutingEngine(fleet, load_policy(DEFAULT_POLICY_PATH, fleet), load_estimator(None),
                                    state=FleetState(fleet, sync=sync))
        self.engine.state.start_sync()
        self.counter = counter
        self.times: list[float] = []
        self.trips: list[int] = []
        self.writes: list[float] = []
        if sync.shared:
            original = sync.dispatch

            def timed(*args: object, **kwargs: object) -> None:
                t0 = time.perf_counter()
                original(*args, **kwargs)  # type: ignore[arg-type]  # the wrapped method's own arguments
                self.writes.append((time.perf_counter() - t0) * 1e3)

            sync.dispatch = timed  # type: ignore[method-assign]  # timing wrapper

    def run(self, requests: list[RouteRequest], timed: bool = True) -> None:
        for r in requests:
            before = self.counter.commands if self.counter else 0
            t0 = time.perf_counter()
            d = self.engine.route(r)
            elapsed = (time.perf_counter() - t0) * 1e3
            if timed:
                self.times.append(elapsed)
                self.trips.append((self.counter.commands if self.counter else 0) - before)
            self.engine.state.settle(d.decision_id, prompt_tokens=d.prompt_tokens, completion_tokens=8)

    def result(self) -> dict[str, float]:
        self.engine.state.close()
        times = sorted(self.times)
        out = {"p50_ms": statistics.median(times), "p99_ms": times[int(len(times) * 0.99) - 1],
               "mean_ms": statistics.fmean(times), "redis_round_trips_per_decision": statistics.fmean(self.trips),
               "max_round_trips": max(self.trips)}
        if self.writes:
            writes = sorted(self.writes)
            out |= {"write_p50_ms": statistics.median(writes), "write_p99_ms": writes[int(len(writes) * 0.99) - 1]}
        return out


def run_arms(arms: dict[str, Arm], n: int, rounds: int) -> dict[str, dict[str, float]]:
    """``n`` decisions per arm after 50 warm-up ones, in ``rounds`` alternating rounds."""
    requests = [parse_route_request({"messages": [{"role": "user", "content": prompt(i)}]}) for i in range(n + 50)]
    for arm in arms.values():
        arm.run(requests[:50], timed=False)
    step = max(1, n // rounds)
    for start in range(50, n + 50, step):
        for arm in arms.values():
            arm.run(requests[start:start + step])
    return {name: arm.result() for name, arm in arms.items()}


def prefix_memory(blocks: int = 1_000_000, endpoints: int = 8) -> float:
    index = PrefixIndex(default_capacity_tokens=blocks * 128)
    tracemalloc.start()
    start = tracemalloc.get_traced_memory()[0]
    per = blocks // endpoints
    for e in range(endpoints):
        index.record(f"http://e{e}:8000/v1", list(range(e * per, (e + 1) * per)))
    used = tracemalloc.get_traced_memory()[0] - start
    tracemalloc.stop()
    return used / blocks


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--decisions", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    out: dict[str, object] = {}
    binary = shutil.which("redis-server")
    if binary is None:
        print("redis-server not on PATH: the shared-state rows are skipped", file=sys.stderr)
        out |= run_arms({"embedded": Arm(LocalSync(), None)}, args.decisions, args.rounds)
    else:
        port = free_port()
        with tempfile.TemporaryDirectory() as tmp:
            proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
                                     "no", "--dir", tmp], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                time.sleep(0.3)
                sync = RedisSync.from_url(f"redis://127.0.0.1:{port}/0", block_ms=200)
                counter = CountingRedis()
                counter.install(sync.client)
                out |= run_arms({"embedded": Arm(LocalSync(), None), "redis": Arm(sync, counter)},
                                args.decisions, args.rounds)
            finally:
                proc.terminate()
                proc.wait(timeout=5)
    out["prefix_index_bytes_per_block"] = prefix_memory()
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"route() at 500 tokens, dispatch included, {args.decisions} decisions per state in {args.rounds} "
          f"alternating rounds, load average {os.getloadavg()[0]:.1f} "
          f"(python {sys.version.split()[0]}, {Path('/proc/cpuinfo').exists() and os.cpu_count()} cpus):")
    for name in ("embedded", "redis"):
        row = out.get(name)
        if isinstance(row, dict):
            print(f"  {name:9s} p50 {row['p50_ms']:.3f} ms  p99 {row['p99_ms']:.3f} ms  mean {row['mean_ms']:.3f} ms  "
                  f"Redis round trips/decision {row['redis_round_trips_per_decision']:.2f} (max {row['max_round_trips']})"
                  + (f"  shared-state write p50 {row['write_p50_ms']:.3f} ms p99 {row['write_p99_ms']:.3f} ms"
                     if "write_p50_ms" in row else ""))
    print(f"prefix index: {out['prefix_index_bytes_per_block']:.0f} bytes per block "
          f"({out['prefix_index_bytes_per_block'] * 1e6 / 2**20:.0f} MiB per million blocks)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
