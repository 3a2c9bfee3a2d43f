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

``--sync-cpu RATE [--seconds 8] [--baseline REV --rounds 3]`` measures instead what sharing the state
costs in CPU (issue 24): two ``FleetState``s on one Redis (two workers), dispatching RATE per second in
all, alternately, on one event loop as the service does (uvloop when installed, as ``pointsman serve``;
``deferred_writes``, awaited), with each one's
reader applying the other's changes; prints the CPU per dispatch (us) of the process and of its threads
(``/proc``: the loop, both readers, both writers) and the write's p50/p99 as awaited. The same with the
embedded ``LocalSync`` (nothing shared) is the floor. With ``--baseline``, git revision ``REV``'s code and
this checkout's alternate in fresh processes (``bench_decision.py``'s ``baseline_path``).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
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
from pointsman.policy.signals.fleet_state import Dispatch, DispatchRecord, FleetState  # noqa: E402
from pointsman.policy.signals.prefix_index import PrefixIndex  # noqa: E402
from pointsman.policy.signals.shared_state import LocalSync, RedisSync, StateSync, deferred_writes  # noqa: E402
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


def sync_cpu(url: str | None, rate: float, seconds: float) -> dict[str, object]:
    """CPU per dispatch of the shared state (``--sync-cpu``; ``url`` None: ``LocalSync``): us for the
    process and per thread name, over ``seconds`` after a second of warm-up; the awaited write's p50/p99 (ms)."""
    fleet = load_fleet()
    endpoints = [e for e in fleet.endpoints if "llama-8b" in e][:2]
    states = [FleetState(fleet, sync=RedisSync.from_url(url) if url else LocalSync()) for _ in range(2)]
    for st in states:
        st.start_sync()
    waits: list[float] = []

    async def one(k: int) -> None:
        st = states[k % 2]  # a signed id's length: 32 hex, the claims, the MAC
        did = f"{k:032x}.{'c' * 150}.{'m' * 16}"
        record = DispatchRecord(did, "onprem-8b", "aggregated", endpoints[k % len(endpoints)], None,
                                ("tenant:load-test",), 0.0012, False, 500, 0.4, 0.3, st.monotonic())
        t0 = time.perf_counter()
        with deferred_writes() as pending:
            st.dispatch(Dispatch(record, [4 * k + i for i in range(4)], False, f"s-{k % 200}"))
        await pending.written()
        waits.append((time.perf_counter() - t0) * 1e3)

    async def drive(duration_s: float) -> int:
        start, k, tasks = time.perf_counter(), 0, set()
        while (at := start + k / rate) < start + duration_s:
            if (delay := at - time.perf_counter()) > 0:
                await asyncio.sleep(delay)
            task = asyncio.create_task(one(k))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            k += 1
        await asyncio.gather(*tasks)
        return k

    def thread_cpu() -> dict[str, float]:
        out: dict[str, float] = {}
        for t in threading.enumerate():
            try:
                fields = Path(f"/proc/self/task/{t.native_id}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            out[t.name] = out.get(t.name, 0.0) + (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        return out

    run = asyncio.run
    if importlib.util.find_spec("uvloop") is not None:  # the loop ``pointsman serve`` runs on (``cli/route.py``)
        import uvloop

        run = uvloop.run
    run(drive(1.0))
    time.sleep(0.2)
    waits.clear()
    before, cpu0 = thread_cpu(), time.process_time()
    n = run(drive(seconds))
    time.sleep(0.1)  # the readers apply the last changes
    after, cpu1 = thread_cpu(), time.process_time()
    for st in states:
        st.close()
    waits.sort()
    return {"dispatches": n, "process_us": 1e6 * (cpu1 - cpu0) / n,
            "threads_us": {name: 1e6 * (t - before.get(name, 0.0)) / n for name, t in after.items()
                           if t > before.get(name, 0.0)},
            "write_p50_ms": statistics.median(waits), "write_p99_ms": waits[int(len(waits) * 0.99) - 1],
            "write_errors": sum(st.sync.status().write_errors for st in states)}


def sync_cpu_main(args: argparse.Namespace) -> int:
    """``--sync-cpu``: the rows, on a redis-server started here (or ``--redis-url``)."""
    if args.redis_url or args.embedded:
        print(json.dumps(sync_cpu(None if args.embedded else args.redis_url, args.sync_cpu, args.seconds)))
        return 0
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("--sync-cpu needs redis-server on PATH")
    port = free_port()
    sides: list[tuple[str, dict[str, str], list[str]]] = [("embedded", {}, ["--embedded"])]
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
                                 "no", "--dir", tmp], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        redis_args = ["--redis-url", f"redis://127.0.0.1:{port}/0"]
        if args.baseline:
            sys.path.insert(0, str(Path(__file__).resolve().parent))
            from bench_decision import baseline_path

            base = {"PYTHONPATH": os.pathsep.join(p for p in (str(baseline_path(args.baseline, Path(tmp))),
                                                              os.environ.get("PYTHONPATH")) if p)}
            sides += [(args.baseline[:10], base, redis_args), ("this", {}, redis_args)] * args.rounds
        else:
            sides += [("redis", {}, redis_args)] * args.rounds
        try:
            time.sleep(0.3)
            print(f"shared state CPU per dispatch (us), {args.sync_cpu:g} dispatches/s over two states, "
                  f"{args.seconds:g} s per run, load average {os.getloadavg()[0]:.1f}")
            for label, env, extra in sides:
                out = subprocess.run([sys.executable, __file__, "--sync-cpu", str(args.sync_cpu), "--seconds",
                                      str(args.seconds), *extra], env={**os.environ, **env}, check=True,
                                     capture_output=True, text=True).stdout
                r = json.loads(out.strip().splitlines()[-1])
                threads = "  ".join(f"{name} {us:.0f}" for name, us in sorted(r["threads_us"].items()))
                print(f"  {label:>10}  process {r['process_us']:6.0f}  write p50/p99 {r['write_p50_ms']:.2f}/"
                      f"{r['write_p99_ms']:.2f} ms  errors {r['write_errors']}  |  {threads}", flush=True)
        finally:
            proc.terminate()
            proc.wait(timeout=5)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--decisions", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--sync-cpu", type=float, default=None, metavar="RATE",
                    help="the shared state's CPU per dispatch at RATE dispatches/s (see the module)")
    ap.add_argument("--seconds", type=float, default=8.0, help="with --sync-cpu: measured seconds per run")
    ap.add_argument("--baseline", metavar="REV", default=None, help="with --sync-cpu: REV's code alternating")
    ap.add_argument("--redis-url", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--embedded", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.sync_cpu is not None:
        return sync_cpu_main(args)
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
