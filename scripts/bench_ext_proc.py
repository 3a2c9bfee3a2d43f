#!/usr/bin/env python
"""ext_proc endpoint-picker decision latency against ``POST /v1/route``, same requests, same run.

Starts one ``pointsman serve --ext-proc-port`` process (default fleet and policy, the bundled
estimator, a temporary data folder: decisions and outcomes are logged as in production), then for
each prompt size (default 500 and 100,000 tokens, counted with the service's own tokenizer) sends
``--requests`` distinct chat requests both ways, alternating one by one so both see the same
server state:

- **ext_proc**: a gRPC client doing what Envoy's ext_proc filter does in FULL_DUPLEX_STREAMED
  mode: one stream per request, the request headers (with ``protocol_config``), then the body in
  64 KiB chunks; the time is from the first message written to the last request-body response
  read (the picked endpoint's headers response, then the body streamed back): what the proxy
  waits for before it can forward. Untimed afterwards: the response phase (headers and a JSON body
  with usage), so every decision's outcome is recorded and its load released.
- **/v1/route**: the same body (the same prompt; OpenAI chat JSON) posted over a keep-alive
  HTTP connection (httpx), send to full answer; untimed afterwards: ``POST /v1/outcomes``.

Prints p50/p99 (ms) per size and path, and the ext_proc overhead: the difference of the p50s and
of the p99s, and the median of the per-request paired differences. Client and server share the
machine's cores (the header line says how many); the client's own CPU is in both paths' times.

Prompts: real prompts from the shared outcome tables (Arena-Bench-V1 and RouteLLM MT-bench,
``../shared/datasets``), concatenated from a different starting prompt for each request and cut
at the wanted token count, so no two requests share a prefix.

    python scripts/bench_ext_proc.py [--sizes 500 100000] [--requests 200] [--warmup 10] [--json]
                                     [--rates 400 800 --duration 10]

Targets (issue 13): ext_proc p99 <= 10 ms at 500 tokens and <= 50 ms at 100,000 tokens.

``--rates R ...`` measures ext_proc decisions per second instead (issue 24: >= 800/s at p99 <= 25 ms):
for each rate and size, streams start on schedule at R per second for ``--duration`` seconds (open
loop, after a second of warm-up at that rate; one stream per request on one channel), each as above
(request phase timed from its scheduled start, response phase untimed); printed per row: streams
done per second, p50/p99 ms, errors, and the server's CPU (all its threads, from /proc) per decision.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import csv
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
import httpx
import numpy as np

from pointsman.service import ext_proc_wire as wire

REPO = Path(__file__).resolve().parent.parent
CHUNK = 64 * 1024
HEADERS = {":method": "POST", ":path": "/v1/chat/completions", ":authority": "bench", "content-type": "application/json"}
MODES = ("FULL_DUPLEX_STREAMED", "FULL_DUPLEX_STREAMED")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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


def sized_prompts(n_tokens: int, count: int) -> list[str]:
    """``count`` prompts of ``n_tokens`` tokens (the bundled tokenizer, no special tokens), each
    starting at a different real prompt."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(REPO / "estimator" / "default_model" / "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    texts = source_prompts()
    out = []
    for i in range(count):
        parts, j, chars, want = [], i, 0, n_tokens * 5
        while True:
            while chars < want:
                parts.append(texts[j % len(texts)])
                chars += len(parts[-1]) + 2
                j += 1
            text = "\n\n".join(parts)
            enc = tok.encode(text, add_special_tokens=False)
            if len(enc.ids) >= n_tokens:
                out.append(text[: enc.offsets[n_tokens - 1][1]])
                break
            want = int(want * 1.5)
    return out


def body_of(prompt: str) -> bytes:
    return json.dumps({"model": "auto", "max_tokens": 256, "messages": [{"role": "user", "content": prompt}]}).encode()


async def ext_proc_call(stub: object, body: bytes) -> tuple[float, str]:
    """One Envoy-like stream; returns (ms to the end of the request phase, decision id)."""
    call = stub.Process()  # type: ignore[attr-defined]
    t0 = time.perf_counter()
    await call.write(wire.headers_request("request", HEADERS, body_modes=MODES))
    chunks = [body[i:i + CHUNK] for i in range(0, len(body), CHUNK)]
    for i, chunk in enumerate(chunks):
        await call.write(wire.body_request("request", chunk, i == len(chunks) - 1))
    decision_id = ""
    while True:
        r = wire.as_dict(await call.read())
        if "immediateResponse" in r:
            raise RuntimeError(f"the picker refused: {r['immediateResponse']}")
        if "requestHeaders" in r:
            for h in r["requestHeaders"]["response"]["headerMutation"]["setHeaders"]:
                if h["header"]["key"] == "x-pointsman-decision-id":
                    decision_id = base64.b64decode(h["header"]["rawValue"]).decode()
        sr = r.get("requestBody", {}).get("response", {}).get("bodyMutation", {}).get("streamedResponse", {})
        if sr.get("endOfStream"):
            break
    elapsed = (time.perf_counter() - t0) * 1e3
    # untimed: the response phase, so the outcome is recorded and the load released
    await call.write(wire.headers_request("response", {":status": "200", "content-type": "application/json"}))
    await call.read()
    await call.write(wire.body_request("response", b'{"usage": {"prompt_tokens": 10, "completion_tokens": 20}}', True))
    await call.read()
    await call.done_writing()
    return elapsed, decision_id


async def bench(base: str, grpc_port: int, sizes: list[int], n: int, warmup: int) -> dict[str, dict[str, object]]:
    results: dict[str, dict[str, object]] = {}
    async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel, \
            httpx.AsyncClient(base_url=base, timeout=30) as http:
        stub = wire.stub(channel)
        for size in sizes:
            bodies = [body_of(p) for p in sized_prompts(size, n + warmup)]
            ext, route, tokens = [], [], []
            for k, body in enumerate(bodies):
                e_ms, _ = await ext_proc_call(stub, body)
                t0 = time.perf_counter()
                resp = await http.post("/v1/route", content=body, headers={"content-type": "application/json"})
                r_ms = (time.perf_counter() - t0) * 1e3
                resp.raise_for_status()
                d = resp.json()
                await http.post("/v1/outcomes", json={"decision_id": d["decision_id"],
                                                      "usage": {"prompt_tokens": 10, "completion_tokens": 20}})
                if k >= warmup:
                    ext.append(e_ms)
                    route.append(r_ms)
                    tokens.append(d["prompt_tokens"])
            e, r = np.array(ext), np.array(route)
            results[str(size)] = {
                "requests": n, "body_bytes_mean": int(np.mean([len(b) for b in bodies])),
                "prompt_tokens_reported_mean": float(np.mean(tokens)),
                "ext_proc_p50_ms": float(np.percentile(e, 50)), "ext_proc_p99_ms": float(np.percentile(e, 99)),
                "route_p50_ms": float(np.percentile(r, 50)), "route_p99_ms": float(np.percentile(r, 99)),
                "overhead_p50_ms": float(np.percentile(e, 50) - np.percentile(r, 50)),
                "overhead_p99_ms": float(np.percentile(e, 99) - np.percentile(r, 99)),
                "overhead_paired_median_ms": float(np.median(e - r)),
            }
    return results


def server_cpu_s(pid: int) -> float:
    """CPU seconds (user + system, all threads) of process ``pid`` so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def rate_row(stub: object, bodies: list[bytes], rate: float, duration: float, pid: int) -> dict[str, float]:
    """Open loop: streams start at ``rate`` per second (a second of warm-up, then ``duration`` s measured);
    latency from each stream's scheduled start to the end of its request phase."""
    async def one(k: int, at: float, out: list[float] | None, errors: list[str]) -> None:
        await asyncio.sleep(max(0.0, at - time.perf_counter()))
        try:
            await ext_proc_call(stub, bodies[k % len(bodies)])
        except Exception as exc:  # noqa: BLE001 - counted, the row goes on
            errors.append(type(exc).__name__)
            return
        if out is not None:
            out.append((time.perf_counter() - at) * 1e3)

    errors: list[str] = []
    start = time.perf_counter() + 0.05
    await asyncio.gather(*(one(k, start + k / rate, None, errors) for k in range(int(rate))))  # warm-up
    lat: list[float] = []
    n = int(rate * duration)
    cpu0, t0 = server_cpu_s(pid), time.perf_counter()
    await asyncio.gather(*(one(k, t0 + k / rate, lat, errors) for k in range(n)))
    wall, cpu = time.perf_counter() - t0, server_cpu_s(pid) - cpu0
    a = np.array(lat) if lat else np.array([float("nan")])
    return {"rate": rate, "done_per_s": len(lat) / wall, "p50_ms": float(np.percentile(a, 50)),
            "p99_ms": float(np.percentile(a, 99)), "errors": len(errors), "srv_cpu_ms": cpu * 1e3 / max(1, len(lat))}


async def rates(grpc_port: int, sizes: list[int], rate_list: list[float], duration: float,
                pid: int) -> dict[str, list[dict[str, float]]]:
    out: dict[str, list[dict[str, float]]] = {}
    async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        stub = wire.stub(channel)
        for size in sizes:
            bodies = [body_of(p) for p in sized_prompts(size, 50)]
            out[str(size)] = [await rate_row(stub, bodies, r, duration, pid) for r in rate_list]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[500, 100_000])
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--rates", type=float, nargs="+", default=None, metavar="RATE",
                    help="open-loop ext_proc decisions per second instead (see the module)")
    ap.add_argument("--duration", type=float, default=10.0, help="measured seconds per --rates row")
    args = ap.parse_args()
    port, grpc_port = free_port(), free_port()
    with tempfile.TemporaryDirectory() as data:
        env = {**os.environ, "POINTSMAN_DATA_DIR": data, "ORT_DISABLE_TELEMETRY": "1", "MLFLOW_DISABLE_TELEMETRY": "true",
               "HF_HUB_OFFLINE": "1", "POINTSMAN_MAX_BODY_BYTES": str(16 * 1024 * 1024)}
        proc = subprocess.Popen([sys.executable, "-m", "pointsman", "serve", "--port", str(port), "--ext-proc-port",
                                 str(grpc_port), "--log-level", "warning"], env=env)
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if httpx.get(f"{base}/readyz", timeout=1).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("pointsman serve did not start")
                time.sleep(0.1)
            if args.rates:
                rows = asyncio.run(rates(grpc_port, args.sizes, args.rates, args.duration, proc.pid))
            else:
                results = asyncio.run(bench(base, grpc_port, args.sizes, args.requests, args.warmup))
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
    if args.rates:
        print(json.dumps(rows, indent=2) if args.json else
              f"# ext_proc, open loop, {os.cpu_count()} cores shared by server and client\n"
              f"{'tokens':>8} {'rate/s':>7} {'done/s':>7} {'p50 ms':>8} {'p99 ms':>8} {'errors':>6} {'srv_cpu_ms':>10}\n"
              + "\n".join(f"{size:>8} {r['rate']:>7.0f} {r['done_per_s']:>7.0f} {r['p50_ms']:>8.2f} {r['p99_ms']:>8.2f} "
                          f"{r['errors']:>6.0f} {r['srv_cpu_ms']:>10.2f}" for size, rs in rows.items() for r in rs))
        return
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"# {os.cpu_count()} cores shared by server and client; {args.requests} requests per size, alternating paths")
    print(f"{'tokens':>8} {'body KiB':>9} {'ext_proc p50':>13} {'p99':>7} {'/v1/route p50':>14} {'p99':>7} "
          f"{'overhead p50':>13} {'p99':>7} {'paired median':>14}")
    for size, r in results.items():
        print(f"{size:>8} {r['body_bytes_mean'] / 1024:>9.0f} {r['ext_proc_p50_ms']:>13.2f} {r['ext_proc_p99_ms']:>7.2f} "
              f"{r['route_p50_ms']:>14.2f} {r['route_p99_ms']:>7.2f} {r['overhead_p50_ms']:>13.2f} "
              f"{r['overhead_p99_ms']:>7.2f} {r['overhead_paired_median_ms']:>14.2f}")


if __name__ == "__main__":
    main()
