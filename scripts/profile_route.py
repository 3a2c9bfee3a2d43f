#!/usr/bin/env python
"""Server CPU per ``POST /v1/route`` decision, in process, and where it goes.

Builds the real app (default fleet, policy and bundled estimator, the decision log in a
temporary folder, so its background writer runs as in production), runs its lifespan, and
calls it directly through ASGI (no sockets, no HTTP client: only the server's work is
measured) with ~500-token real prompts (the same ones as ``scripts/load_service.py``).

Prints the process CPU time per decision (all threads: the event loop's work plus the
decision log writer's) and the wall time per decision, and for the engine alone the
``RoutingEngine.route`` split (features, estimator, policy). With ``--profile`` it also
prints the top of a cProfile of the calls (cumulative, then self time).

The app is started as ``pointsman serve`` starts it (``create_app(freeze=True)``: the startup
heap frozen out of the garbage collector's full collections); ``--no-freeze`` does not, and
``--gc`` reports the collector's pauses.

    python scripts/profile_route.py [--n 3000] [--prompt-tokens 500] [--profile] [--top 40] [--gc] [--no-freeze]
"""

from __future__ import annotations

import os

os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import asyncio  # noqa: E402
import cProfile  # noqa: E402
import gc  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402
import pstats  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))


async def asgi_post(app: Any, path: str, body: bytes) -> tuple[int, bytes]:
    """One ASGI HTTP request to ``app``; returns (status, response body)."""
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
             "root_path": "", "headers": [(b"host", b"127.0.0.1:8000"), (b"content-type", b"application/json"),
                                          (b"content-length", str(len(body)).encode())],
             "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8000), "state": {}}
    sent = False
    status, chunks = 0, []

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await app(scope, receive, send)
    return status, b"".join(chunks)


class GCPauses:
    """Garbage collection pauses per generation, in ms (a ``gc.callbacks`` hook while ``on``)."""

    def __init__(self) -> None:
        self.pauses: dict[int, list[float]] = {0: [], 1: [], 2: []}
        self.on = False
        self._t = 0.0
        gc.callbacks.append(self._hook)

    def _hook(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._t = time.perf_counter()
        elif self.on:
            self.pauses[info["generation"]].append((time.perf_counter() - self._t) * 1e3)

    def report(self, n: int) -> str:
        """One line per generation: count, max and total pause, total per decision."""
        lines = []
        for gen, p in self.pauses.items():
            if p:
                lines.append(f"  gen{gen}: {len(p)} collections, max {max(p):.2f} ms, total {sum(p):.1f} ms "
                             f"({sum(p) / n:.4f} ms per decision)")
        return "\n".join(lines) or "  no collections"


async def run(app: Any, bodies: list[bytes], n: int, profile: cProfile.Profile | None,
              pauses: GCPauses | None = None) -> dict[str, float]:
    """``n`` decisions (after 200 warm-up ones); CPU and wall ms per decision."""
    for i in range(200):
        status, payload = await asgi_post(app, "/v1/route", bodies[i % len(bodies)])
        if status != 200:
            raise SystemExit(f"/v1/route answered {status}: {payload[:500]!r}")
    if pauses is not None:
        pauses.on = True
    walls = []
    cpu0, wall0, main0 = time.process_time(), time.perf_counter(), time.thread_time()
    if profile is not None:
        profile.enable()
    for i in range(n):
        t0 = time.perf_counter()
        await asgi_post(app, "/v1/route", bodies[i % len(bodies)])
        walls.append((time.perf_counter() - t0) * 1e3)
    if profile is not None:
        profile.disable()
    if pauses is not None:
        pauses.on = False
    wall = time.perf_counter() - wall0
    main_cpu = time.thread_time() - main0
    await asyncio.sleep(0.2)  # let the decision log writer commit the last batch
    cpu = time.process_time() - cpu0
    return {"cpu_ms_per_decision": cpu * 1e3 / n, "wall_ms_per_decision": wall * 1e3 / n,
            "loop_cpu_ms_per_decision": main_cpu * 1e3 / n,
            "wall_p50_ms": statistics.median(walls)}


def engine_split(engine: Any, bodies: list[bytes], n: int) -> dict[str, float]:
    """Median ms of ``RoutingEngine.route`` steps (no dispatch) and of request parsing."""
    from pointsman.request import parse_route_request

    reqs = [parse_route_request(json.loads(b)) for b in bodies]
    out: dict[str, list[float]] = {"features": [], "estimator": [], "policy": [], "total": [], "parse": []}
    for i in range(n):
        d = engine.route(reqs[i % len(reqs)], dispatch=False)
        for k in ("features", "estimator", "policy", "total"):
            out[k].append(d.timings_ms[k])
        t0 = time.perf_counter()
        parse_route_request(json.loads(bodies[i % len(bodies)]))
        out["parse"].append((time.perf_counter() - t0) * 1e3)
    return {k: statistics.median(v) for k, v in out.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=3000, help="measured decisions")
    parser.add_argument("--prompt-tokens", type=int, default=500)
    parser.add_argument("--profile", action="store_true", help="print a cProfile of the measured calls")
    parser.add_argument("--top", type=int, default=40, help="rows of the profile to print")
    parser.add_argument("--no-freeze", action="store_true",
                        help="do not gc.freeze() the startup heap (pointsman serve does)")
    parser.add_argument("--gc", action="store_true", help="also report garbage collection pauses (gc.callbacks)")
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                        help="service setting for this run (e.g. POINTSMAN_ESTIMATOR_TIMEOUT_MS=50)")
    args = parser.parse_args()
    for kv in args.env:
        key, _, value = kv.partition("=")
        os.environ[key] = value

    from load_service import sized_prompts

    from pointsman.service.app import create_app
    from pointsman.service.settings import Settings

    prompts = sized_prompts(args.prompt_tokens, count=50)
    bodies = [json.dumps({"model": "chat", "messages": [{"role": "user", "content": p}],
                          "routing": {"tenant": "load-test", "session_id": f"s-{i}"}}).encode()
              for i, p in enumerate(prompts)]
    with tempfile.TemporaryDirectory(prefix="pointsman-profile-") as tmp:
        settings = Settings(data_dir=Path(tmp), watch_policy=False, model_poll_interval_s=0)
        app = create_app(settings, freeze=not args.no_freeze)
        pauses = GCPauses() if args.gc else None

        async def main_async() -> dict[str, Any]:
            async with app.router.lifespan_context(app):
                rt = app.state.runtime
                prof = cProfile.Profile() if args.profile else None
                res = await run(app, bodies, args.n, prof, pauses)
                res["engine"] = engine_split(rt.live.engine, bodies, min(args.n, 2000))
                res["estimator"] = repr(rt.live.engine.estimator)
                res["prof"] = prof
                return res

        res = asyncio.run(main_async())
    print(f"estimator: {res['estimator']}; {args.n} decisions of {args.prompt_tokens} tokens, in process (ASGI)")
    print(f"server CPU per decision: {res['cpu_ms_per_decision']:.3f} ms (all threads; the event loop's thread "
          f"{res['loop_cpu_ms_per_decision']:.3f} ms); "
          f"wall {res['wall_ms_per_decision']:.3f} ms (p50 {res['wall_p50_ms']:.3f} ms)")
    e = res["engine"]
    print(f"engine.route p50: total {e['total']:.3f} ms = features {e['features']:.3f} + estimator "
          f"{e['estimator']:.3f} + policy {e['policy']:.3f}; json.loads + parse_route_request p50 {e['parse']:.3f} ms")
    if pauses is not None:
        print(f"garbage collection pauses during the measured decisions "
              f"({'startup heap frozen' if not args.no_freeze else 'not frozen'}):\n{pauses.report(args.n)}")
    if res["prof"] is not None:
        for key in ("cumulative", "tottime"):
            buf = io.StringIO()
            pstats.Stats(res["prof"], stream=buf).sort_stats(key).print_stats(args.top)
            print(buf.getvalue())


if __name__ == "__main__":
    main()
