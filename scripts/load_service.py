#!/usr/bin/env python
"""Load test of the decision service: decisions per second and p50/p99 latency of
``POST /v1/route`` at several client concurrencies, with 1 and 2 uvicorn worker processes.

For each worker count the script starts ``pointsman serve --workers W`` (default fleet,
policy and bundled estimator; a temporary data folder, so the decision log is written as in
production), then for each concurrency C runs a separate client process (asyncio, C
requests in flight, one keep-alive connection each) for ``--duration`` seconds after a
``--warmup``, and prints one table row. The client (``--client``) is ``raw`` by default: keep-alive
connections on uvloop, each request's bytes built once, answers parsed by httptools (``RawClient``);
``aiohttp`` (installed with LiteLLM in the ``test`` extra; the client of the measurements before
2026-12-06 17:45) and ``httpx`` (about 2.5 times aiohttp's CPU) are the others. The client shares the
server's cores, so its CPU is taken from the server's: against a trivial ASGI app (two uvicorn workers
answering a fixed body: ``--trivial``, 1,000 and 2,000 calls/s open loop) raw used 0.084 / 0.070 ms of
CPU per call, aiohttp 0.298 / 0.240 (0.30 of a core at 1,000/s against 0.08), the server 0.08-0.10 ms;
both offered 2,000/s on time. Latency is measured by the client: send to full response, i.e. what a gateway sees;
``client_cpu`` is the load generator's share of a core; ``srv_cpu_ms`` is the server's CPU
time (all its processes and threads, from /proc) per decision.

Prompts: real prompts from the shared outcome tables (Arena-Bench-V1 and RouteLLM MT-bench,
``../shared/datasets``), concatenated and trimmed to ``--prompt-tokens`` tokens (default
500) as counted by the service's own tokenizer (the bundled model's ``tokenizer.json``); the
table's ``prompt_tokens`` column is what the service reported back.

The machine's cores are shared: the load generator competes with the server for them (the
header line says how many cores there are). ``--client-cpu N`` pins the client to core N
(and ``--server-cpus`` pins the server) to make the split explicit.

    python scripts/load_service.py [--workers 1 2] [--concurrency 1 16 64] [--rates 500 ...]
                                   [--duration 10] [--prompt-tokens 500] [--json]

``load`` is the closed-loop concurrency (that many calls always in flight: throughput at
saturation, and latency = queueing once saturated) or, with ``--rates``, an open-loop arrival
rate (calls start on schedule whatever the answers; latency from the scheduled start),
which checks the target "p99 at 500 decisions/s" directly (``--rates`` with no value: none).

Target (issue 6): >= 500 decisions/s at p99 <= 50 ms.

With more than one worker the server needs shared state: unless ``--env POINTSMAN_STATE_URL=...`` names
one, the script starts a redis-server for those rows and gives the server ``POINTSMAN_STATE_URL`` and
``POINTSMAN_BUDGET_LEDGER`` on it (as ``--pairs`` does).

``--pairs RATE ...`` measures route+outcome pairs instead (issue 22: two workers with Redis at
200 pairs/s, 0 lost, outcome p99 <= 25 ms): the script starts a redis-server and two ``pointsman
serve`` processes on one data folder (the workers of one host: one outcome log, one inbox, one
signing key) with ``POINTSMAN_STATE_URL`` and ``POINTSMAN_BUDGET_LEDGER`` on that Redis; pairs start
at RATE per second (open loop), each ``POST /v1/route`` to the first process and, once answered,
its ``POST /v1/outcomes`` (usage included) to the *second* one, which did not log the decision.
Printed per rate: pairs/s, route p50/p99, outcome p50/p99 (ms, from sending the outcome),
``srv_cpu_ms`` (both processes' CPU, every thread, per route+outcome pair),
the server's own outcome p50/p99 (``srv p50<=``/``srv p99<=``: the upper bound of the
``pointsman_outcome_latency_seconds`` bucket holding it, counted over the row from the second
process's ``/metrics``: request to acknowledgement inside the server, without the client's
and the network's share), ``lost`` (answered decisions whose outcome was not acknowledged)
and the errors. The server-side column matters when this machine cannot generate the rate
(``done/s`` below ``pairs/s``: the client and the route path saturate the cores).

Issue 22's target, met (2026-12-06, ``--pairs 200 --duration 30``, three runs, load average 0.6 before
and no pause): 199 pairs/s, 0 lost, outcome p99 6.9-7.2 ms (server <= 7.5 ms), route p50 4.4 ms; with
other jobs on the cores (load average 4-7) 141-159 pairs/s, outcome p99 128-426 ms, 0 lost. The
history:

Found with ``--pairs 50 100 200`` (two runs; 2 cores shared with other jobs, load average
~10): before issue 22's fix an outcome on the process that had not logged its decision waited
150 ms and retried (``RECENT_DECISION_S``): outcome p50 160-185 ms, p99 265-650 ms, and 4-37
outcomes lost per row (final 404). With signed ids and orphan outcomes: p50 4.5-7 ms at 50
pairs/s (12-21 ms once the route path saturates at ~100 pairs/s on that machine), p99
107-594 ms, 0 lost. What is left of the p99 is the outcome's ``fsync`` (acknowledged only once on
disk) and CPU queueing on that shared machine.

Then (stage timers in the outcome path, 2 serve processes + Redis): at 200 pairs/s the slowest 2%
of outcomes spent 123 ms waiting for the outcome log's lock behind other outcomes' ``fsync``s.
With group commit (``pointsman/group_commit.py``) and the WAL checkpointed in the background, an
outcome waits for the ``fsync`` in flight and its own batch's: at 50 pairs/s on a quieter moment
(load average ~5) outcome p99 16.6 ms (server <= 15 ms), and 8.2 ms (<= 7.5 ms) with
``POINTSMAN_OUTCOME_FSYNC_MS=100``; at 200 pairs/s the machine generated 159/s, outcome p99 49 ms.
A lone 4 KiB ``fsync`` on that disk has p99 94 ms, the floor of any acknowledgement that waits for
one; at load average 7-12 every variant's server-side p99 sat in the 100-250 ms buckets (the
threadpool hop and the loop's wake-up: CPU queueing, ``docs/service.md`` Durability).

``pauses`` (every row): how often the machine itself stopped while the row ran, warm-up included
(``PauseProbe``: wake-ups of a 1 ms sleep in this idle process more than 30 ms late), as
``count/longest ms``. Found with it (issue 24): at 200 pairs/s on a quiet moment the route p50 was
~5 ms but its p99 ~125 ms. A loop-lag probe inside both serve processes and a plain Python
process sleeping 1 ms at a time, run side by side, saw the *same* stalls at the same instants:
~100 ms each, starting on a 100 ms grid, with the VM's steal time rising (``/proc/stat``) -- the
host descheduling the whole VM's vCPUs, 30-40 times in 30 s while the pairs ran (3 in 20 s without
them). A stall of 100 ms holds every call in flight and the backlog behind it, which sets the p99;
no periodic task of the service (checkpoint, group commit, state sync, file watchers, GC) showed up
in the samples taken during the stalls. Less CPU per call makes them rarer; only a quieter
machine removes them.

Then (issue 24, py-spy on the deciding process at 200 pairs/s): its event loop spent 29% of its time
blocked on the estimator's pool and 20% on the dispatch's Redis write; both are awaited now
(``routes_decisions.route_async``), and at 200 pairs/s offered on a machine at load average ~14 the
two processes did 180 pairs/s at 4.70 ms of CPU per pair against main's 153 at 5.65 (same run).

Found with this script (``--uvicorn '--loop asyncio --http h11'`` vs ``'--loop uvloop'``): with
asyncio's event loop, ``--workers 2`` made every response ~45 ms slower (p50 48 ms at
concurrency 1, against 3.6 ms with one worker). For several workers uvicorn binds the
listening socket itself as ``socket.socket(family=...)``, so it and every accepted socket
have ``proto == 0``; asyncio's ``_set_nodelay`` only sets TCP_NODELAY when ``proto ==
IPPROTO_TCP``, so Nagle's algorithm holds the response body (written after the headers)
until the client's delayed ACK (~40 ms). uvloop sets TCP_NODELAY on every TCP connection,
so uvloop (and httptools, faster than h11) are serving dependencies; uvicorn's default
``--loop auto`` picks them.

Also found: Python's cyclic garbage collector paused the server for 60-90 ms about once per
thousand decisions (full collections scanning the ~100,000 objects of the loaded model, fleet
and libraries), which set the p99 of the open-loop rows; ``pointsman serve`` now freezes its
startup heap (``gc.freeze``, ``service/app.py``). This script never posts outcomes, so every
decision stays in flight (load board, budget hold) for the rows after it: later rows run on a
server holding tens of thousands of unsettled decisions.

Also found: with ``--workers 2`` the keep-alive connections a client opens at once can all
land on one worker (the worker that wakes first accepts every pending connection; uvicorn's
workers share one listening socket), and they stay there: per-worker CPU (/proc) showed one
worker idle in one of three concurrency-16 runs, which then ran at ~370 instead of ~600
decisions/s. Rows with few connections vary for that reason; a gateway with many
connections, or one listening socket per worker with SO_REUSEPORT, spreads them.
"""

from __future__ import annotations

import os

os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import argparse  # noqa: E402
import asyncio  # noqa: E402
import csv  # noqa: E402
import json  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
#: Connections the open-loop client may open (a backlog beyond it waits for a free one, and
#: that wait counts in the latency).
OPEN_LOOP_CONNECTIONS = 256


class PauseProbe:
    """Pauses of the machine itself while a row runs: a thread of this (otherwise idle) process sleeps
    1 ms at a time and counts the wake-ups that came more than ``threshold_ms`` late. Such a gap
    stops every process at once (on the shared VM this was written on, ~100 ms with steal time: the
    host descheduling the vCPUs), so no server-side fix can remove the latency it adds to the calls in
    flight. ``with PauseProbe() as probe: ...``; then ``probe.count`` and ``probe.longest_ms``."""

    def __init__(self, threshold_ms: float = 30.0) -> None:
        self.threshold_s = threshold_ms / 1000.0
        self.count, self.longest_ms = 0, 0.0
        self._stop = False
        self._thread: Any = None

    def _run(self) -> None:
        last = time.perf_counter()
        while not self._stop:
            time.sleep(0.001)
            now = time.perf_counter()
            if now - last > self.threshold_s:
                self.count += 1
                self.longest_ms = max(self.longest_ms, (now - last) * 1000.0)
            last = now

    def __enter__(self) -> PauseProbe:
        import threading

        self._thread = threading.Thread(target=self._run, name="pause-probe", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop = True
        self._thread.join()

    def column(self) -> str:
        """``count/longest ms`` for a table row."""
        return f"{self.count}/{self.longest_ms:.0f}"


# -- prompts ---------------------------------------------------------------------------------------
def source_prompts() -> list[str]:
    """Prompt texts from Arena-Bench-V1 and RouteLLM MT-bench (turn 1), in file order."""
    from pointsman.datasets.sources import shared_datasets_dir

    root = shared_datasets_dir()
    texts: list[str] = []
    with open(root / "arena_bench_v1" / "arena_bench_v1_gpt4_single_scores.csv", newline="") as f:
        texts += [row["prompt"] for row in csv.DictReader(f)]
    with open(root / "routellm" / "mtbench_mixtral_vs_gpt4.csv", newline="") as f:
        texts += [row["prompt_turn1"] for row in csv.DictReader(f) if row.get("prompt_turn1")]
    return [t.strip() for t in texts if t and t.strip()]


def sized_prompts(n_tokens: int, count: int = 200) -> list[str]:
    """``count`` prompts of exactly ``n_tokens`` tokens (the service's tokenizer, without special
    tokens): each starts at a different real prompt and continues with the following ones."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(REPO / "estimator" / "default_model" / "tokenizer.json"))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    texts = source_prompts()
    out = []
    for i in range(count):
        text, j = "", i
        while True:
            text = (text + "\n\n" + texts[j % len(texts)]).strip()
            enc = tokenizer.encode(text, add_special_tokens=False)
            if len(enc.ids) >= n_tokens:
                out.append(text[: enc.offsets[n_tokens - 1][1]])
                break
            j += 1
    return out


# -- client (runs in its own process) --------------------------------------------------------------
class _RawConnection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection of the ``raw`` client: a request's bytes written as they are,
    the answer read by ``httptools`` (the server's own parser); one call at a time."""

    def __init__(self) -> None:
        import httptools

        self.parser = httptools.HttpResponseParser(self)
        self.transport: Any = None
        self.answer: asyncio.Future[tuple[int, bytes]] | None = None
        self.body: list[bytes] = []
        self.closed = False

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        answer, self.answer = self.answer, None
        if answer is not None and not answer.done():
            answer.set_result((self.parser.get_status_code(), b"".join(self.body)))
        self.body = []

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.answer is not None and not self.answer.done():
            self.answer.set_exception(exc or ConnectionError("connection closed"))

    async def call(self, request: bytes) -> tuple[int, bytes]:
        self.answer = asyncio.get_running_loop().create_future()
        self.transport.write(request)
        return await self.answer


class RawClient:
    """The lightest client the load generator has (``--client raw``): keep-alive connections, each
    request's bytes built once, answers parsed by ``httptools``; up to ``limit`` connections (a call
    waits for a free one beyond). About a third of aiohttp's CPU per call (the module docstring)."""

    def __init__(self, url: str, headers: dict[str, str], limit: int) -> None:
        from urllib.parse import urlsplit

        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.head = "".join(f"{k}: {v}\r\n" for k, v in {"host": f"{self.host}:{self.port}", **headers}.items())
        self.idle: list[_RawConnection] = []
        self.slots = asyncio.Semaphore(limit)

    def request(self, path: str, body: bytes) -> bytes:
        """The bytes of a ``POST path`` with ``body``."""
        return f"POST {path} HTTP/1.1\r\n{self.head}content-length: {len(body)}\r\n\r\n".encode() + body

    async def post(self, request: bytes) -> tuple[int, bytes]:
        """Send ``request`` (from ``request``) on an idle connection (or a new one); (status, body)."""
        async with self.slots:
            while self.idle and self.idle[-1].closed:
                self.idle.pop()
            if self.idle:
                conn = self.idle.pop()
            else:
                _, conn = await asyncio.get_running_loop().create_connection(_RawConnection, self.host, self.port)
            answer = await conn.call(request)
            if not conn.closed:
                self.idle.append(conn)
            return answer

    def close(self) -> None:
        for conn in self.idle:
            conn.transport.close()


async def drive(url: str, bodies: list[bytes], concurrency: int, duration_s: float, warmup_s: float,
                api_key: str | None, client_lib: str = "aiohttp", rate: float | None = None) -> dict[str, Any]:
    """Drive ``/v1/route`` for ``warmup_s + duration_s`` seconds and measure the calls that started
    after the warm-up. Closed loop (``rate`` None): ``concurrency`` calls always in flight.
    Open loop: calls start at ``rate`` per second whatever the answers (at most ``concurrency``
    connections); latency counts from the scheduled start, so a slow server's backlog shows
    (no coordinated omission). ``client_lib``: ``aiohttp`` or ``httpx``. Returns counts,
    latencies (ms) and the client's own CPU use."""
    headers = {"content-type": "application/json"}
    if api_key:
        headers["authorization"] = f"Bearer {api_key}"
    latencies: list[float] = []
    prompt_tokens: list[int] = []
    errors: dict[str, int] = {}
    start = time.perf_counter()
    cpu_start = time.process_time()
    measure_from, stop_at = start + warmup_s, start + warmup_s + duration_s

    async def one(post: Any, body: bytes, t0: float) -> None:
        try:
            status, payload = await post(body)
        except Exception as exc:  # noqa: BLE001 - count transport errors, keep driving
            status, payload = type(exc).__name__, None
        t1 = time.perf_counter()
        if t0 < measure_from:
            return
        if status == 200:
            latencies.append((t1 - t0) * 1000.0)
            if len(prompt_tokens) < 50:
                prompt_tokens.append(json.loads(payload)["prompt_tokens"])
        else:
            errors[str(status)] = errors.get(str(status), 0) + 1

    async def closed_loop(post: Any, k: int) -> None:
        i = k
        while (t0 := time.perf_counter()) < stop_at:
            await one(post, bodies[i % len(bodies)], t0)
            i += concurrency

    async def open_loop(post: Any) -> None:
        tasks, k = set(), 0
        while (t0 := start + k / rate) < stop_at:
            delay = t0 - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            task = asyncio.create_task(one(post, bodies[k % len(bodies)], t0))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            k += 1
        await asyncio.gather(*list(tasks))

    async def run(post: Any) -> None:
        if rate:
            await open_loop(post)
        else:
            await asyncio.gather(*(closed_loop(post, k) for k in range(concurrency)))

    if client_lib == "raw":
        client = RawClient(url, headers, concurrency)
        requests = {body: client.request("/v1/route", body) for body in bodies}

        async def post_raw(body: bytes) -> tuple[int, bytes]:
            return await client.post(requests[body])

        await run(post_raw)
        client.close()
    elif client_lib == "aiohttp":
        import aiohttp

        connector = aiohttp.TCPConnector(limit=concurrency)
        async with aiohttp.ClientSession(base_url=url, headers=headers, connector=connector) as session:
            async def post(body: bytes) -> tuple[int, bytes]:
                async with session.post("/v1/route", data=body) as resp:
                    return resp.status, await resp.read()

            await run(post)
    else:
        import httpx

        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        async with httpx.AsyncClient(base_url=url, headers=headers, limits=limits, timeout=30.0) as client:
            async def post(body: bytes) -> tuple[int, bytes]:
                resp = await client.post("/v1/route", content=body)
                return resp.status_code, resp.content

            await run(post)
    elapsed = time.perf_counter() - measure_from
    cpu_s = time.process_time() - cpu_start
    lat = np.asarray(latencies)
    return {"decisions": int(lat.size), "elapsed_s": elapsed, "decisions_per_s": lat.size / elapsed,
            "p50_ms": float(np.percentile(lat, 50)) if lat.size else None,
            "p99_ms": float(np.percentile(lat, 99)) if lat.size else None,
            "prompt_tokens": float(np.mean(prompt_tokens)) if prompt_tokens else None, "errors": errors,
            # the load generator's own CPU time (warm-up included) per second of the run: its share of the cores
            "client_cpu_cores": cpu_s / (time.perf_counter() - start)}


async def drive_pairs(url_a: str, url_b: str, bodies: list[bytes], rate: float, duration_s: float,
                      warmup_s: float, client_lib: str = "aiohttp") -> dict[str, Any]:
    """Open-loop route+outcome pairs (module docstring, ``--pairs``): routes on ``url_a``, each
    outcome on ``url_b``; ``client_lib`` ``raw`` or ``aiohttp``. Returns counts, route and outcome
    latencies (ms) and ``lost``."""
    headers = {"content-type": "application/json"}
    route_ms: list[float] = []
    outcome_ms: list[float] = []
    errors: dict[str, int] = {}
    lost = 0
    start = time.perf_counter()
    measure_from, stop_at = start + warmup_s, start + warmup_s + duration_s

    async def pair(a: Any, b: Any, body: bytes, k: int, t0: float) -> None:
        nonlocal lost
        try:
            status, payload = await a("/v1/route", body)
        except Exception as exc:  # noqa: BLE001 - count transport errors, keep driving
            status, payload = type(exc).__name__, b""
        t1 = time.perf_counter()
        if status != 200:
            if t0 >= measure_from:
                errors[f"route {status}"] = errors.get(f"route {status}", 0) + 1
            return
        outcome = json.dumps({"decision_id": json.loads(payload)["decision_id"], "outcome_id": f"p{rate:g}-{k}",
                              "usage": {"prompt_tokens": 500, "completion_tokens": 100 + k % 50},
                              "ttft_ms": 150.0}).encode()
        try:
            ostatus, answer = await b("/v1/outcomes", outcome)
        except Exception as exc:  # noqa: BLE001
            ostatus, answer = type(exc).__name__, b""
        t2 = time.perf_counter()
        acked = ostatus in (200, 202) and json.loads(answer)["acks"][0]["status"] in ("stored", "duplicate",
                                                                                     "forwarded")
        if not acked:
            lost += 1
            errors[f"outcome {ostatus}"] = errors.get(f"outcome {ostatus}", 0) + 1
        if t0 >= measure_from:
            route_ms.append((t1 - t0) * 1000.0)
            if acked:
                outcome_ms.append((t2 - t1) * 1000.0)

    async def schedule(a: Any, b: Any) -> None:
        tasks, k = set(), 0
        while (t0 := start + k / rate) < stop_at:
            delay = t0 - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            task = asyncio.create_task(pair(a, b, bodies[k % len(bodies)], k, t0))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            k += 1
        await asyncio.gather(*list(tasks))

    if client_lib == "raw":
        raw_a, raw_b = RawClient(url_a, headers, OPEN_LOOP_CONNECTIONS), RawClient(url_b, headers, OPEN_LOOP_CONNECTIONS)

        def raw_post(client: RawClient) -> Any:
            async def post(path: str, body: bytes) -> tuple[int, bytes]:
                return await client.post(client.request(path, body))
            return post

        await schedule(raw_post(raw_a), raw_post(raw_b))
        raw_a.close()
        raw_b.close()
    else:
        import aiohttp

        def session_post(session: Any) -> Any:
            async def post(path: str, body: bytes) -> tuple[int, bytes]:
                async with session.post(path, data=body) as resp:
                    return resp.status, await resp.read()
            return post

        connector_a = aiohttp.TCPConnector(limit=OPEN_LOOP_CONNECTIONS)
        connector_b = aiohttp.TCPConnector(limit=OPEN_LOOP_CONNECTIONS)
        async with aiohttp.ClientSession(base_url=url_a, headers=headers, connector=connector_a) as a, \
                aiohttp.ClientSession(base_url=url_b, headers=headers, connector=connector_b) as b:
            await schedule(session_post(a), session_post(b))
    elapsed = time.perf_counter() - measure_from
    r, o = np.asarray(route_ms), np.asarray(outcome_ms)

    def pct(x: Any, q: float) -> float | None:
        return float(np.percentile(x, q)) if x.size else None

    return {"pairs": int(r.size), "pairs_per_s": r.size / elapsed, "route_p50_ms": pct(r, 50),
            "route_p99_ms": pct(r, 99), "outcome_p50_ms": pct(o, 50), "outcome_p99_ms": pct(o, 99),
            "lost": lost, "errors": errors}


def start_redis() -> tuple[subprocess.Popen, str]:
    """A redis-server on a free port without persistence; (process, URL)."""
    import shutil

    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("--pairs and --workers > 1 need redis-server on PATH (apt-get install -y redis-server)")
    port = free_port()
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--loglevel", "warning"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2) as sock:
                sock.sendall(b"PING\r\n")
                if sock.recv(64).startswith(b"+PONG"):
                    return proc, f"redis://127.0.0.1:{port}/0"
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit("redis-server did not start")


def outcome_buckets(url: str) -> dict[float, float]:
    """The cumulative ``pointsman_outcome_latency_seconds`` histogram of the server at ``url``:
    upper bound (s) -> count."""
    import httpx

    text = httpx.get(f"{url}/metrics", timeout=10).text
    out = {}
    for line in text.splitlines():
        if line.startswith("pointsman_outcome_latency_seconds_bucket{"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            out[float(le)] = float(line.rsplit(" ", 1)[1])
    return out


def bucket_quantile(before: dict[float, float], after: dict[float, float], q: float) -> float | None:
    """The upper bound (ms) of the histogram bucket holding quantile ``q`` (0-1) of the observations
    made between two ``outcome_buckets`` readings; None when there were none."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    if not counts or counts[-1] <= 0:
        return None
    for bound, count in zip(bounds, counts):
        if count >= q * counts[-1]:
            return bound * 1000.0
    return None


def pairs_main(args: argparse.Namespace, prompts_file: str, tmp: str, code: str = "",
               code_env: dict[str, str] | None = None) -> None:
    """``--pairs``: the two processes on one data folder and Redis, one row per rate. ``code``: the
    label of the code measured (``--baseline``; printed first in each row), ``code_env`` its environment."""
    redis_proc, url = start_redis()
    env = {"POINTSMAN_STATE_URL": url, "POINTSMAN_BUDGET_LEDGER": url, "POINTSMAN_WATCH_POLICY": "false",
           **dict(kv.split("=", 1) for kv in args.env), **(code_env or {})}
    data_dir = str(Path(tmp) / f"data-pairs-{code}-{time.monotonic_ns()}")
    ports = [free_port(), free_port()]
    procs = []
    try:
        for port in ports:  # one after the other: the first creates the log and the signing key
            procs.append(start_server(1, port, data_dir, args.server_cpus, env, args.uvicorn))
        print(f"{'code':>8} " * bool(code) + f"{'pairs/s':>8} {'done/s':>8} {'route p50':>10} {'route p99':>10} "
              f"{'outcome p50':>12} {'outcome p99':>12} {'srv p50<=':>10} {'srv p99<=':>10} {'lost':>5} "
              f"{'srv_cpu_ms':>10} {'pauses':>8}  errors")
        for rate in args.pairs:
            before = outcome_buckets(f"http://127.0.0.1:{ports[1]}")
            cmd = [sys.executable, __file__, "--drive", f"http://127.0.0.1:{ports[0]}", "--drive-b",
                   f"http://127.0.0.1:{ports[1]}", "--prompts", prompts_file, "--rate", str(rate),
                   "--duration", str(args.duration), "--warmup", str(args.warmup), "--client", args.client]
            cpu0 = sum(tree_cpu_s(p.pid) for p in procs)
            with PauseProbe() as probe:
                out = subprocess.run(cmd, check=True, capture_output=True, text=True)
            r = json.loads(out.stdout.strip().splitlines()[-1])
            # both processes' CPU over the whole row (warm-up included) per pair, the pairs scaled to the whole row
            r["server_cpu_ms_per_pair"] = 1000 * (sum(tree_cpu_s(p.pid) for p in procs) - cpu0) / max(
                r["pairs"] * (args.warmup + args.duration) / args.duration, 1)
            r["machine_pauses"], r["machine_pause_longest_ms"] = probe.count, probe.longest_ms
            after = outcome_buckets(f"http://127.0.0.1:{ports[1]}")
            r["server_outcome_p50_le_ms"] = bucket_quantile(before, after, 0.50)
            r["server_outcome_p99_le_ms"] = bucket_quantile(before, after, 0.99)

            def ms(v: float | None) -> str:
                return f"{v:.2f}" if v is not None else "-"

            print(f"{code[:8]:>8} " * bool(code) + f"{rate:>8g} {r['pairs_per_s']:>8.0f} "
                  f"{ms(r['route_p50_ms']):>10} {ms(r['route_p99_ms']):>10} "
                  f"{ms(r['outcome_p50_ms']):>12} {ms(r['outcome_p99_ms']):>12} "
                  f"{ms(r['server_outcome_p50_le_ms']):>10} {ms(r['server_outcome_p99_le_ms']):>10} "
                  f"{r['lost']:>5} {r['server_cpu_ms_per_pair']:>10.2f} {probe.column():>8}  {r['errors'] or ''}", flush=True)
            if args.json:
                print(json.dumps({"code": code, "rate": rate, **r}))
    finally:
        for proc in procs:
            stop_server(proc)
        redis_proc.terminate()
        redis_proc.wait(timeout=10)


def _loop_run(client_lib: str) -> Any:
    """``asyncio.run``, or ``uvloop.run`` for the ``raw`` client (the lightest client on the lightest loop)."""
    if client_lib != "raw":
        return asyncio.run
    import uvloop

    return uvloop.run


def client_main(args: argparse.Namespace) -> None:
    """``--drive``: run one client measurement and print it as one JSON line."""
    if args.client_cpu is not None:
        os.sched_setaffinity(0, {args.client_cpu})
    prompts = json.loads(Path(args.prompts).read_text())
    bodies = [json.dumps({"model": "chat", "messages": [{"role": "user", "content": p}],
                          "routing": {"tenant": "load-test", "session_id": f"s-{i}"}}).encode()
              for i, p in enumerate(prompts)]
    if args.drive_b:
        result = _loop_run(args.client)(drive_pairs(args.drive, args.drive_b, bodies, args.rate, args.duration,
                                                    args.warmup, "aiohttp" if args.client == "httpx" else args.client))
        print(json.dumps(result))
        return
    result = _loop_run(args.client)(drive(args.drive, bodies, args.concurrency[0], args.duration, args.warmup, args.api_key,
                               args.client, args.rate))
    print(json.dumps(result))


# -- server ----------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def trivial_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The ``--trivial`` server: an ASGI app that reads the request and answers a fixed decision-shaped body."""
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    while (await receive()).get("more_body"):
        pass
    body = b'{"decision_id":"trivial","target":"none","prompt_tokens":0}'
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def start_server(workers: int, port: int, data_dir: str, server_cpus: list[int] | None,
                 extra_env: dict[str, str], uvicorn_args: str | None = None, trivial: bool = False) -> subprocess.Popen:
    """``pointsman serve --workers N`` on ``port`` (or, with ``uvicorn_args``, ``python -m uvicorn``
    on the app factory with those extra options; with ``trivial``, uvicorn on ``trivial_app``, uvloop and
    httptools as ``pointsman serve``); returns once ``/healthz`` answers (60 s at most)."""
    import httpx

    env = {**os.environ, "POINTSMAN_DATA_DIR": data_dir, **extra_env}
    if trivial:
        cmd = [sys.executable, "-m", "uvicorn", "load_service:trivial_app", "--app-dir", str(Path(__file__).parent),
               "--port", str(port), "--workers", str(workers), "--log-level", "warning", "--loop", "uvloop",
               "--http", "httptools", *(uvicorn_args or "").split()]
    elif uvicorn_args is None:
        cmd = [sys.executable, "-c", "from pointsman.cli.main import main; main()", "serve",
               "--port", str(port), "--workers", str(workers), "--log-level", "warning"]
    else:
        cmd = [sys.executable, "-m", "uvicorn", "pointsman.service.app:create_app_from_env", "--factory",
               "--port", str(port), "--workers", str(workers), "--log-level", "warning", *uvicorn_args.split()]
    if server_cpus:
        cmd = ["taskset", "-c", ",".join(map(str, server_cpus)), *cmd]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"pointsman serve exited:\n{proc.stdout.read().decode()[-3000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                # with several workers, give every worker time to finish its startup
                time.sleep(1.0 if workers > 1 else 0.2)
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise SystemExit("pointsman serve did not answer /healthz within 60 s")


def tree_cpu_s(root: int) -> float:
    """CPU seconds (user + system) used so far by process ``root`` and its live descendants (Linux /proc)."""
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(entry)] = int(fields[1])
        times[int(entry)] = (int(fields[11]) + int(fields[12])) / tick
    tree, frontier = {root}, [root]
    while frontier:
        parent = frontier.pop()
        children = [p for p, pp in parents.items() if pp == parent and p not in tree]
        tree.update(children)
        frontier.extend(children)
    return sum(times.get(p, 0.0) for p in tree)


def stop_server(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def run_client(url: str, prompts_file: str, concurrency: int, args: argparse.Namespace,
               rate: float | None = None) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--drive", url, "--prompts", prompts_file, "--concurrency", str(concurrency),
           "--duration", str(args.duration), "--warmup", str(args.warmup)]
    if rate:
        cmd += ["--rate", str(rate)]
    cmd += ["--client", args.client]
    if args.client_cpu is not None:
        cmd += ["--client-cpu", str(args.client_cpu)]
    if args.api_key:
        cmd += ["--api-key", args.api_key]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def worker_rows(args: argparse.Namespace, workers: int, prompts_file: str, tmp: str, extra_env: dict[str, str],
                code: str) -> list[dict[str, Any]]:
    """The rows of one ``pointsman serve --workers W`` (with Redis state when ``workers`` > 1), printed
    as they come; ``code``: the label of the code measured (``--baseline``; printed first in each row)."""
    rows = []
    port = free_port()
    data_dir = str(Path(tmp) / f"data-w{workers}-{code}-{time.monotonic_ns()}")
    redis_proc, env = None, extra_env
    if workers > 1 and "POINTSMAN_STATE_URL" not in extra_env and not args.trivial:  # workers share state in Redis
        redis_proc, url = start_redis()
        env = {"POINTSMAN_STATE_URL": url, "POINTSMAN_BUDGET_LEDGER": url, **extra_env}
    proc = start_server(workers, port, data_dir, args.server_cpus, env, args.uvicorn, args.trivial)
    try:
        runs = [(conc, None) for conc in args.concurrency] + [(OPEN_LOOP_CONNECTIONS, r) for r in args.rates]
        for conc, rate in runs:
            cpu0 = tree_cpu_s(proc.pid)
            with PauseProbe() as probe:
                r = run_client(f"http://127.0.0.1:{port}", prompts_file, conc, args, rate)
            # whole run (warm-up included) over measured decisions scaled to the whole run
            server_cpu = tree_cpu_s(proc.pid) - cpu0
            n_all = r["decisions"] * (args.warmup + args.duration) / args.duration
            r.update(code=code, workers=workers, concurrency=None if rate else conc, rate=rate,
                     server_cpu_ms_per_decision=1000 * server_cpu / max(n_all, 1),
                     machine_pauses=probe.count, machine_pause_longest_ms=probe.longest_ms)
            rows.append(r)
            load = f"{rate:g}/s" if rate else str(conc)

            def ms(v: float | None) -> str:  # None: no call succeeded (see errors)
                return f"{v:>8.2f}" if v is not None else f"{'-':>8}"

            print(f"{code[:8]:>8} " * bool(code) + f"{workers:>7} {load:>7} {r['decisions_per_s']:>12.0f} "
                  f"{ms(r['p50_ms'])} {ms(r['p99_ms'])} {r['prompt_tokens'] or 0:>10.0f} "
                  f"{r['client_cpu_cores']:>10.2f} {r['server_cpu_ms_per_decision']:>10.2f} {probe.column():>8}  "
                  f"{r['errors'] or ''}", flush=True)
    finally:
        stop_server(proc)
        if redis_proc is not None:
            redis_proc.terminate()
            redis_proc.wait(timeout=10)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--concurrency", type=int, nargs="*", default=[1, 16, 64],
                        help="closed-loop rows (default 1 16 64; --concurrency with no value: none)")
    parser.add_argument("--rates", type=float, nargs="*", default=[500.0],
                        help="open-loop rows: calls start at this many per second (default 500, the target)")
    parser.add_argument("--rate", type=float, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--duration", type=float, default=10.0, help="measured seconds per row")
    parser.add_argument("--warmup", type=float, default=2.0, help="unmeasured seconds before each row")
    parser.add_argument("--prompt-tokens", type=int, default=500)
    parser.add_argument("--client", choices=["raw", "aiohttp", "httpx"], default="raw",
                        help="HTTP client of the load generator (raw needs the least CPU per request, httpx the most)")
    parser.add_argument("--client-cpu", type=int, default=None, help="pin the load generator to this core")
    parser.add_argument("--server-cpus", type=int, nargs="+", default=None, help="pin the server to these cores")
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                        help="extra environment for the server (e.g. POINTSMAN_ROUTE_IN_THREADPOOL=true)")
    parser.add_argument("--uvicorn", default=None, metavar="ARGS",
                        help="run `python -m uvicorn` on the app factory with these options (e.g. "
                             "'--loop asyncio --http h11') instead of `pointsman serve`")
    parser.add_argument("--trivial", action="store_true",
                        help="serve a trivial ASGI app instead (uvicorn, uvloop, httptools; a fixed answer): the "
                             "ceiling of the HTTP server and this client on this machine")
    parser.add_argument("--api-key", default=None, help="gateway key, when the server has keys configured")
    parser.add_argument("--json", action="store_true", help="also print every row as JSON")
    parser.add_argument("--pairs", type=float, nargs="+", default=None, metavar="RATE",
                        help="route+outcome pairs per second on two processes with Redis state (see the docstring)")
    parser.add_argument("--baseline", metavar="REV", default=None,
                        help="also measure git revision REV's server code, alternating with this checkout's")
    parser.add_argument("--rounds", type=int, default=2, help="with --baseline: runs of each")
    parser.add_argument("--drive", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--drive-b", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--prompts", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.drive:
        client_main(args)
        return

    extra_env = dict(kv.split("=", 1) for kv in args.env)
    prompts = sized_prompts(args.prompt_tokens)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="pointsman-load-") as tmp:
        codes: list[tuple[str, dict[str, str]]] = [("", {})]
        if args.baseline:  # REV's code first on the servers' PYTHONPATH, alternating with this checkout's
            from bench_decision import baseline_path

            (Path(tmp) / "baseline").mkdir()
            path = str(baseline_path(args.baseline, Path(tmp) / "baseline"))
            base_env = {"PYTHONPATH": os.pathsep.join(p for p in (path, os.environ.get("PYTHONPATH")) if p)}
            codes = [(args.baseline[:8], base_env), ("this", {})] * args.rounds
        prompts_file = str(Path(tmp) / "prompts.json")
        Path(prompts_file).write_text(json.dumps(prompts))
        if args.pairs:
            print(f"# {os.cpu_count()} cores shared; route+outcome pairs, two serve processes on one data folder "
                  f"with Redis state and ledger; {args.prompt_tokens}-token prompts; {args.duration:g} s per row "
                  f"after {args.warmup:g} s warm-up")
            for code, code_env in codes:
                pairs_main(args, prompts_file, tmp, code, code_env)
            return
        print(f"# {os.cpu_count()} cores shared by server and load generator ({args.client} client in its own process"
              f"{f' pinned to core {args.client_cpu}' if args.client_cpu is not None else ', not pinned'}"
              f"{f'; server pinned to {args.server_cpus}' if args.server_cpus else ''}); "
              f"{len(prompts)} prompts of {args.prompt_tokens} tokens; {args.duration:g} s per row after "
              f"{args.warmup:g} s warm-up{'; server env ' + str(extra_env) if extra_env else ''}")
        label = "code" if args.baseline else ""
        print(f"{'code':>8} " * bool(label) + f"{'workers':>7} {'load':>7} {'decisions/s':>12} {'p50 ms':>8} "
              f"{'p99 ms':>8} {'prompt_tok':>10} {'client_cpu':>10} {'srv_cpu_ms':>10} {'pauses':>8}  errors")
        for workers in args.workers:
            for code, code_env in codes:
                rows += worker_rows(args, workers, prompts_file, tmp, {**extra_env, **code_env}, code)
    if args.json:
        for r in rows:
            print(json.dumps(r))


if __name__ == "__main__":
    main()
