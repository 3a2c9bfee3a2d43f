#!/usr/bin/env python
"""Server CPU per decision, in process, and where it goes stage by stage; checked against a budget.

Builds the real app (``create_app(freeze=True)`` as ``pointsman serve`` does: default fleet and
policy, the bundled estimator behind its deadline, the decision log writer on a temporary
folder) and calls it through ASGI (no sockets, no HTTP client: only the server's work counts),
for three workloads built from real prompts of the shared outcome tables
(``scripts/load_service.py``'s ``source_prompts``):

- ``20 words``: the first 20 words of a prompt;
- ``500 tokens``: prompts cut at 500 tokens (the service's tokenizer);
- ``100k tokens``: a 41-turn conversation of about 100,000 tokens (eight of them, each sent again and again
  under its session: what the session caches of a conversation's next turn see);
- ``100k first seen``: the same conversations, each request a new one (its first line numbered): no session
  cache or prefix index holds any of it;

and the outcome path: ``route+outcome``, a ``POST /v1/route`` of 500 tokens followed by its
``POST /v1/outcomes`` (usage, latency), the pair's CPU.

Per workload, two passes on the same app:

1. CPU: ``--n`` requests (after warm-up); the process CPU time (every thread: the event loop,
   the estimator's pool, the decision log writer, the outcome threadpool) per request, and the
   event loop thread's share;
2. stages: the same requests again with a timer around each stage of the path (functions of
   ``service.routes_decisions``, ``policy.engine``, ``estimator``), the median microseconds per
   request of each stage, ``framework`` (ASGI, the hot path's dispatch and key check: the request's
   wall time less its stages) and ``other`` (steps of the decision, ``routes_decisions.route_async``,
   between the timed ones: request and difficulty signals, prefix block hashes, the Decision). The
   benchmark stops with an error when a stage's function does not exist or a stage the workload
   goes through was never called (its cost would silently count as ``framework``).

``--budget FILE`` (default ``scripts/decision_budget.json``) compares the CPU per request and
every stage with the committed budget and exits 1 when one is over it by more than the noise
allowance (``--tolerance``, default 0.35 = 35%, plus 15 us for a stage): the regression check
of ``docs/architecture.md``'s stage budget. ``--write-budget`` writes the measured values as the
new budget instead. The machine's cores may be shared: CPU time is the robust number, stage
medians less so; run twice before believing a failure.

    python scripts/bench_decision.py [--n 1500] [--json] [--no-check] [--write-budget]
                                     [--workloads "20 words" "500 tokens"] [--profile] [--cel]
                                     [--baseline REV [--rounds 3]] [--no-stages] [--stage-cpu]

``--baseline REV`` (with ``--rounds K``, default 3) measures the code of git revision ``REV`` against
this checkout's, alternating: K runs of each, every run a fresh process of this script (the same
measurement, ``--json --no-check`` with the other options given), ``REV``'s packages first on
``PYTHONPATH`` (from ``git archive``; the model files come from there too); prints each workload's
median server CPU per request for both, every run's value and the load average before it, and the
medians per thread group (the runs measure the CPU pass alone: ``--no-stages``), and each run's peak
resident memory (``max_rss_mib``: what the process's caches of long texts hold shows there).

The CPU pass also reports each thread group's CPU per request (the event loop, the estimator's
pool, the decision log writer, other threads; each thread's CPU clock). ``--profile``'s cProfile
counts the event loop thread's CPU time (``time.thread_time``), not wall time.

``--stage-cpu`` times the stages by the event loop thread's CPU clock instead of wall time: on a shared
machine a stage then shows its own CPU, not the time other processes took its core (an await costs nothing,
and the decision log writer's thread is not in any stage: its CPU is its row of the CPU pass).

``--profile`` prints a cProfile (self time) of the CPU pass per workload. ``--cel`` also
measures common-expression-language's cost per evaluation with a reused context, a dict per
call and a context built per decision (the evaluator's choice; see ``policy/rules/evaluator.py``).
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
import functools  # noqa: E402
import importlib  # noqa: E402
import inspect  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402
import pstats  # noqa: E402
import resource  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tarfile  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import tomllib  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

BUDGET = Path(__file__).resolve().parent / "decision_budget.json"
WORKLOADS = ("20 words", "500 tokens", "100k tokens", "100k first seen", "route+outcome")
#: Timed stages: name -> the functions timed for it, each (module, attribute path); a method is
#: "Class.method". A stage's functions are alternatives (the path calls one of them). Nested stages
#: (everything under ``route``) are subtracted from their parent in the report. Every stage a
#: workload goes through must be called in it (``StageClock.missing``): a timer around a function
#: the path no longer calls would silently move its cost into ``framework``.
STAGES: dict[str, tuple[tuple[str, str], ...]] = {
    "read_body": (("pointsman.service.routes_decisions", "read_body"),),
    "decode_json": (("pointsman.service.routes_decisions", "decode_json"),),
    "parse": (("pointsman.service.routes_decisions", "parse_route_request"),),
    # the whole decision: prepare (view, features), the estimate (awaited on the pool), engine.route
    "route": (("pointsman.service.routes_decisions", "route_async"),),
    "view": (("pointsman.request", "RequestView.of"),),
    "features": (("pointsman.policy.engine", "tokenized_features"),),
    # the pool's hand-off awaited on the loop (route_async), or the engine's own call (in a thread)
    "estimator": (("pointsman.service.deadline", "DeadlineEstimator.estimate_async"),
                  ("pointsman.policy.engine", "RoutingEngine._estimate")),
    "policy": (("pointsman.policy.engine", "decide"),),
    "place": (("pointsman.policy.engine", "place"),),
    "dispatch": (("pointsman.policy.signals.fleet_state", "FleetState.dispatch"),),
    "to_dict": (("pointsman.policy.decision", "Decision.to_dict"),),
    "json_response": (("pointsman.service.routes_decisions", "json_answer"),),
    "commit": (("pointsman.service.routes_decisions", "commit_decision"),),
    "outcome_parse": (("pointsman.service.routes_reports", "parse_outcome_items"),),
    "outcome_store": (("pointsman.service.routes_reports", "store_outcomes"),),
}
#: Stages timed inside ``route`` (its ``other`` is what is left).
IN_ROUTE = ("view", "features", "estimator", "policy", "place", "dispatch")
#: Stages only the outcome path goes through.
OUTCOME_STAGES = ("outcome_parse", "outcome_store")


def expected_stages(workload: str) -> list[str]:
    """The stages a request of ``workload`` goes through (each must be called in its stage pass)."""
    return [s for s in STAGES if workload == "route+outcome" or s not in OUTCOME_STAGES]


# -- workloads -------------------------------------------------------------------------------------
def workload_bodies(name: str, count: int = 40) -> list[bytes]:
    """``count`` distinct /v1/route bodies of workload ``name`` (real prompts; a tenant and a session each)."""
    from load_service import sized_prompts, source_prompts

    texts = source_prompts()
    if name == "20 words":
        prompts = [" ".join(t.split()[:20]) for t in texts if len(t.split()) >= 20][:count]
        messages = [[{"role": "user", "content": p}] for p in prompts]
    elif name in ("500 tokens", "route+outcome"):
        messages = [[{"role": "user", "content": p}] for p in sized_prompts(500, count=count)]
    elif name in ("100k tokens", "100k first seen"):
        messages = []
        for i in range(min(count, 8)):  # 400 KB each
            j, conv = i * 97, [{"role": "system", "content": texts[i]}]

            def turn(chars: int) -> str:
                nonlocal j
                out = ""
                while len(out) < chars:
                    out += texts[j % len(texts)] + "\n\n"
                    j += 1
                return out[:chars]
            for _ in range(20):  # ~2,400 tokens a turn each way
                conv += [{"role": "user", "content": turn(10_000)}, {"role": "assistant", "content": turn(10_000)}]
            conv.append({"role": "user", "content": texts[(i * 31 + 5) % len(texts)]})
            messages.append(conv)
        if name == "100k first seen":  # each body a conversation the service has not seen: no session cache helps
            messages = [[{"role": "system", "content": f"Conversation {k}.\n\n" + m[0]["content"]}, *m[1:]]
                        for k, m in ((k, messages[k % len(messages)]) for k in range(count))]
    else:
        raise SystemExit(f"unknown workload {name!r} (one of {', '.join(WORKLOADS)})")
    return [json.dumps({"model": "chat", "messages": m, "routing": {"tenant": "bench", "session_id": f"s-{i}"}}).encode()
            for i, m in enumerate(messages)]


def outcome_body(decision: dict[str, Any]) -> bytes:
    """The ``POST /v1/outcomes`` body a gateway sends for an answered ``decision``."""
    return json.dumps({"decision_id": decision["decision_id"], "status": "ok", "served_target": decision["target"],
                       "usage": {"prompt_tokens": decision["prompt_tokens"], "completion_tokens": 180},
                       "ttft_ms": 120.0, "tpot_ms": 18.0, "e2e_latency_ms": 3400.0}).encode()


# -- ASGI ------------------------------------------------------------------------------------------
async def asgi_post(app: Any, path: str, body: bytes) -> tuple[int, bytes]:
    """One ASGI HTTP request to ``app``; returns (status, response body)."""
    from profile_route import asgi_post as post

    return await post(app, path, body)


async def one(app: Any, workload: str, body: bytes) -> None:
    """One request of ``workload`` (a route, and its outcome for ``route+outcome``)."""
    status, payload = await asgi_post(app, "/v1/route", body)
    if status != 200:
        raise SystemExit(f"/v1/route answered {status}: {payload[:500]!r}")
    if workload == "route+outcome":
        status, answer = await asgi_post(app, "/v1/outcomes", outcome_body(json.loads(payload)))
        if status != 200:
            raise SystemExit(f"/v1/outcomes answered {status}: {answer[:500]!r}")


# -- stage timers ----------------------------------------------------------------------------------
class StageClock:
    """Wraps the ``STAGES`` functions with timers while installed; ``totals`` accumulates seconds
    per stage for the current request (``take()`` returns and resets them). ``clock``: wall time
    (``time.perf_counter``), or the calling thread's CPU time (``time.thread_time``, ``--stage-cpu``)."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.totals: dict[str, float] = {}
        self._undo: list[Callable[[], None]] = []
        self.clock = clock

    def _wrap(self, name: str, fn: Any) -> Any:
        totals, clock = self.totals, self.clock

        if inspect.iscoroutinefunction(fn):
            @functools.wraps(fn)
            async def timed_async(*a: Any, **k: Any) -> Any:
                t0 = clock()
                try:
                    return await fn(*a, **k)
                finally:
                    totals[name] = totals.get(name, 0.0) + clock() - t0
            return timed_async

        @functools.wraps(fn)
        def timed(*a: Any, **k: Any) -> Any:
            t0 = clock()
            try:
                return fn(*a, **k)
            finally:
                totals[name] = totals.get(name, 0.0) + clock() - t0
        return timed

    def install(self) -> None:
        """Wrap every stage function with its timer. Raises ``SystemExit`` naming a stage function
        that does not exist (renamed or moved: the stage would not be measured)."""
        for name, functions in STAGES.items():
            for module_name, path in functions:
                owner: Any = importlib.import_module(module_name)
                *parents, attr = path.split(".")
                for p in parents:
                    owner = getattr(owner, p, None)
                raw = None if owner is None else inspect.getattr_static(owner, attr, None)
                if raw is None:
                    raise SystemExit(f"stage {name}: {module_name}.{path} does not exist; "
                                     "time the stage where the path now runs it (STAGES)")
                if isinstance(raw, classmethod):
                    wrapped: Any = classmethod(self._wrap(name, raw.__func__))
                elif isinstance(raw, staticmethod):
                    wrapped = staticmethod(self._wrap(name, raw.__func__))
                else:
                    wrapped = self._wrap(name, raw)
                setattr(owner, attr, wrapped)
                self._undo.append(functools.partial(setattr, owner, attr, raw))

    def uninstall(self) -> None:
        while self._undo:
            self._undo.pop()()

    def take(self) -> dict[str, float]:
        out = dict(self.totals)
        self.totals.clear()
        return out


# -- passes ----------------------------------------------------------------------------------------
#: Thread name prefix -> the row its CPU is reported in (``threads_ms``); other threads are ``other``.
THREAD_GROUPS = {"pointsman-estimator": "estimator pool", "pointsman-decision-log": "decision log writer"}


def thread_cpu_s() -> dict[str, float]:
    """CPU seconds so far of this process's Python threads by ``THREAD_GROUPS`` row (the event loop's
    thread is ``loop``: the caller's), from each thread's CPU clock. A thread that ended is not counted."""
    import threading

    out: dict[str, float] = {}
    me = threading.get_ident()
    for t in threading.enumerate():
        if t.ident is None:
            continue
        try:
            cpu = time.clock_gettime(time.pthread_getcpuclockid(t.ident))
        except (OSError, ProcessLookupError):  # ended meanwhile
            continue
        row = "loop" if t.ident == me else next((v for k, v in THREAD_GROUPS.items() if t.name.startswith(k)), "other")
        out[row] = out.get(row, 0.0) + cpu
    return out


async def cpu_pass(app: Any, workload: str, bodies: list[bytes], n: int,
                   profile: cProfile.Profile | None) -> dict[str, float]:
    """``n`` requests; process CPU (all threads), and each thread group's (``threads_ms``: the loop,
    the estimator pool, the decision log writer, other threads) per request, in ms."""
    walls = []
    cpu0, loop0, threads0 = time.process_time(), time.thread_time(), thread_cpu_s()
    if profile is not None:
        profile.enable()
    for i in range(n):
        t0 = time.perf_counter()
        await one(app, workload, bodies[i % len(bodies)])
        walls.append(time.perf_counter() - t0)
    if profile is not None:
        profile.disable()
    loop_cpu = time.thread_time() - loop0
    app.state.runtime.writer.flush(timeout_s=30.0)  # the decision log writer's share of these requests
    await asyncio.sleep(0.05)
    cpu = time.process_time() - cpu0
    threads1 = thread_cpu_s()
    threads = {k: round((v - threads0.get(k, 0.0)) * 1e3 / n, 4) for k, v in threads1.items() if k != "loop"}
    return {"cpu_ms": cpu * 1e3 / n, "loop_cpu_ms": loop_cpu * 1e3 / n, "threads_ms": threads,
            "wall_p50_ms": statistics.median(walls) * 1e3}


async def stage_pass(app: Any, workload: str, bodies: list[bytes], n: int, cpu: bool = False) -> dict[str, float]:
    """Median microseconds per request of each stage (see the module), ``framework`` and ``other``; ``cpu``: of
    the event loop thread's CPU time instead of wall time (the request's too)."""
    clock = StageClock(time.thread_time if cpu else time.perf_counter)
    clock.install()
    rows: list[dict[str, float]] = []
    called: set[str] = set()
    try:
        for i in range(n):
            clock.take()
            t0 = clock.clock()
            await one(app, workload, bodies[i % len(bodies)])
            wall = clock.clock() - t0
            row = clock.take()
            called.update(row)
            route = row.get("route", 0.0)
            row["other"] = max(0.0, route - sum(row.get(s, 0.0) for s in IN_ROUTE))
            top = [s for s in row if s not in IN_ROUTE and s != "other"]
            row["framework"] = max(0.0, wall - sum(row[s] for s in top))
            row.pop("route", None)
            row["request"] = wall
            rows.append(row)
    finally:
        clock.uninstall()
    missing = [s for s in expected_stages(workload) if s not in called]
    if missing:
        raise SystemExit(f"{workload}: stage(s) {', '.join(missing)} never called (timed functions: "
                         + "; ".join(f"{s} = " + ", ".join(f"{m}.{p}" for m, p in STAGES[s]) for s in missing)
                         + "): the path no longer runs them there; time them where it does (STAGES)")
    names = sorted({k for r in rows for k in r}, key=lambda s: (s == "request", list(STAGES).index(s)
                                                                 if s in STAGES else len(STAGES)))
    return {s: statistics.median(r.get(s, 0.0) for r in rows) * 1e6 for s in names}


def bench(workloads: list[str], n: int, profile: bool, stages: bool = True, stage_cpu: bool = False) -> dict[str, Any]:
    """Both passes for every workload on one app (the CPU pass alone without ``stages``; ``stage_cpu``: the stages'
    CPU time, ``stage_pass``); the results as a dict."""
    from pointsman.service.app import create_app
    from pointsman.service.settings import Settings

    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="pointsman-bench-") as tmp:
        settings = Settings(data_dir=Path(tmp), watch_policy=False, model_poll_interval_s=0)
        app = create_app(settings, freeze=True)

        async def run() -> None:
            async with app.router.lifespan_context(app):
                out["estimator"] = repr(app.state.runtime.live.engine.estimator)
                for w in workloads:
                    k = n if not w.startswith("100k") else max(20, n // 10)
                    warm = min(200, k)
                    new = w == "100k first seen"  # every pass on bodies no earlier request sent
                    bodies = workload_bodies(w, warm + 2 * k if new else 40)
                    for i in range(warm):
                        await one(app, w, bodies[i % len(bodies)])
                    # the loop thread's CPU time, not wall: a wall-clock profile charges the GIL waits
                    # behind the estimator's pool to whatever the loop was running then
                    prof = cProfile.Profile(time.thread_time) if profile else None
                    res: dict[str, Any] = await cpu_pass(app, w, bodies[warm:] if new else bodies, k, prof)
                    res["stages_us"] = await stage_pass(app, w, bodies[warm + k:] if new else bodies, k, stage_cpu) \
                        if stages else {}
                    res["n"] = k
                    if prof is not None:
                        buf = io.StringIO()
                        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(35)
                        res["profile"] = buf.getvalue()
                    out[w] = res

        asyncio.run(run())
    return out


# -- budget ----------------------------------------------------------------------------------------
def check(results: dict[str, Any], budget: dict[str, Any], tolerance: float) -> list[str]:
    """Over-budget lines: CPU per request over ``budget x (1 + tolerance)``, a stage over
    ``budget x (1 + tolerance) + 15 us``, a budgeted stage not measured. Workloads or stages without
    a budget are not checked."""
    problems = []
    for w, b in budget.get("workloads", {}).items():
        r = results.get(w)
        if r is None:
            continue
        if r["cpu_ms"] > b["cpu_ms"] * (1 + tolerance):
            problems.append(f"{w}: server CPU {r['cpu_ms']:.3f} ms per request > budget {b['cpu_ms']:.3f} ms "
                            f"(+{tolerance:.0%})")
        for s, limit in b.get("stages_us", {}).items():
            got = r["stages_us"].get(s)
            if got is None:
                problems.append(f"{w}: stage {s} has a budget but was not measured")
            elif s != "request" and got > limit * (1 + tolerance) + 15:
                problems.append(f"{w}: stage {s} {got:.0f} us > budget {limit:.0f} us (+{tolerance:.0%} + 15 us)")
    return problems


def bench_cel() -> dict[str, float]:
    """Microseconds per operation for the ways of handing signals to common-expression-language."""
    import timeit

    from cel import cel  # the extension module (see policy/rules/evaluator.py)

    snap = {"request": {"prompt_tokens": 300, "max_output_tokens": 256, "turns": 1, "has_tools": False,
                        "has_images": False, "tenant": "", "session_id": "", "slo_class": ""},
            "difficulty": {"p_hard": 0.4, "available": True},
            "variables": {"p_hard_frontier": 0.62, "p_hard_onprem_large": 0.35, "long_prompt_tokens": 512}}
    pruned = {"request": {"prompt_tokens": 300}, "difficulty": {"p_hard": 0.4, "available": True},
              "variables": snap["variables"]}
    exprs = ["!difficulty.available", "difficulty.p_hard >= variables.p_hard_frontier",
             "request.prompt_tokens >= variables.long_prompt_tokens", "difficulty.p_hard >= variables.p_hard_onprem_large"]
    progs = [cel.compile(e) for e in exprs]
    ctx = cel.Context(snap)

    def per(fn: Any, number: int = 20000) -> float:
        return min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e6

    def new_ctx(s: dict[str, Any]) -> None:
        c = cel.Context(s)
        for p in progs:
            p.execute(c)

    def dict_each() -> None:
        for p in progs:
            p.execute(snap)

    return {
        "one_eval_reused_context_us": per(lambda: progs[1].execute(ctx)),
        "one_eval_dict_per_call_us": per(lambda: progs[1].execute(snap)),
        "decision_4_rules_dict_per_call_us": per(dict_each),
        "decision_4_rules_context_per_decision_full_snapshot_us": per(lambda: new_ctx(snap)),
        "decision_4_rules_context_per_decision_pruned_us": per(lambda: new_ctx(pruned)),
    }


# -- baseline --------------------------------------------------------------------------------------
def baseline_path(rev: str, tmp: Path) -> Path:
    """A folder to put first on ``PYTHONPATH`` so that ``pointsman`` imports git revision ``rev``'s code:
    ``rev``'s tree (``git archive``) under ``tmp`` and the import package laid out from its
    ``pyproject.toml`` ``package-dir`` with symlinks. Raises ``CalledProcessError`` for an unknown ``rev``."""
    tree = tmp / "tree"
    tree.mkdir()
    archive = subprocess.run(["git", "-C", str(Path(__file__).resolve().parents[1]), "archive", rev],
                             check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(tree, filter="data")
    dirs = tomllib.loads((tree / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    root = tmp / "path" / "pointsman"
    root.mkdir(parents=True)
    for f in (tree / dirs["pointsman"]).iterdir():
        (root / f.name).symlink_to(f)
    for name, folder in dirs.items():
        if name != "pointsman":
            (root / name.removeprefix("pointsman.")).symlink_to(tree / folder)
    return tmp / "path"


def compare(rev: str, rounds: int, argv: list[str]) -> dict[str, Any]:
    """``rounds`` runs of ``rev``'s code and of this checkout's, alternating (see the module); per
    workload the CPU per request of every run (ms) and their medians, and the load average before each run."""
    runs: dict[str, list[dict[str, Any]]] = {"base": [], "head": []}
    with tempfile.TemporaryDirectory(prefix="pointsman-baseline-") as tmp:
        path = baseline_path(rev, Path(tmp))
        for _ in range(rounds):
            for side in runs:
                env = dict(os.environ)
                if side == "base":
                    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(path), env.get("PYTHONPATH")) if p)
                load = os.getloadavg()[0]
                out = subprocess.run([sys.executable, __file__, "--json", "--no-check", *argv], env=env, check=True,
                                     capture_output=True, text=True).stdout
                runs[side].append({"load": load, **json.loads(out)})
    workloads = [w for w in WORKLOADS if w in runs["head"][0]]
    return {"baseline": rev, "rounds": rounds, "load_before_runs": {s: [r["load"] for r in rs] for s, rs in runs.items()},
            "max_rss_mib": {s: [r["max_rss_mib"] for r in rs] for s, rs in runs.items()},
            **{w: {s: {"cpu_ms_runs": [round(r[w]["cpu_ms"], 3) for r in rs],
                       "cpu_ms": round(statistics.median(r[w]["cpu_ms"] for r in rs), 3),
                       "threads_ms": {"loop": round(statistics.median(r[w]["loop_cpu_ms"] for r in rs), 3),
                                      **{g: round(statistics.median(r[w].get("threads_ms", {}).get(g, 0.0)
                                                                    for r in rs), 3)
                                         for g in THREAD_GROUPS.values()}}}
                   for s, rs in runs.items()}
               for w in workloads}}


def main() -> None:
    """Parse arguments, run the workloads, print the table (or JSON), check the budget."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=1500, help="requests per pass (100k tokens: a tenth, at least 20)")
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=WORKLOADS)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--budget", type=Path, default=BUDGET, help="the committed budget (JSON)")
    parser.add_argument("--tolerance", type=float, default=0.35, help="noise allowance over the budget (fraction)")
    parser.add_argument("--no-check", action="store_true", help="do not compare with the budget")
    parser.add_argument("--write-budget", action="store_true", help="write the measured values to --budget")
    parser.add_argument("--profile", action="store_true", help="print a cProfile of each CPU pass")
    parser.add_argument("--cel", action="store_true", help="also measure CEL evaluation strategies")
    parser.add_argument("--baseline", metavar="REV", help="measure git revision REV's code against this, alternating")
    parser.add_argument("--rounds", type=int, default=3, help="with --baseline: runs of each")
    parser.add_argument("--no-stages", action="store_true",
                        help="the CPU pass alone (no stage timers; no budget check of the stages)")
    parser.add_argument("--stage-cpu", action="store_true",
                        help="time the stages by the event loop thread's CPU clock, not wall time (a loaded machine "
                             "then slows them less; a wait costs nothing; no budget check: the budget is wall time)")
    args = parser.parse_args()
    if args.baseline:
        forwarded = ["--n", str(args.n), "--no-stages", "--workloads", *args.workloads]
        result = compare(args.baseline, args.rounds, forwarded)
        if args.json:
            print(json.dumps(result, indent=2))
            return
        print(f"server CPU ms per request, median of {args.rounds} alternating runs "
              f"(load average before the runs: {result['load_before_runs']})")
        print(f"{'':<16}{args.baseline[:12]:>14}{'this':>10}  runs (baseline | this)")
        for w in args.workloads:
            b, h = result[w]["base"], result[w]["head"]
            print(f"{w:<16}{b['cpu_ms']:>14.3f}{h['cpu_ms']:>10.3f}  {b['cpu_ms_runs']} | {h['cpu_ms_runs']}")
            for g in b["threads_ms"]:
                print(f"  {g:<20}{b['threads_ms'][g]:>8.3f}{h['threads_ms'][g]:>10.3f}")
        print(f"peak RSS MiB per run (baseline | this): {result['max_rss_mib']['base']} | {result['max_rss_mib']['head']}")
        return

    if (args.no_stages or args.stage_cpu) and args.write_budget:
        parser.error("--write-budget needs the stages' wall times (drop --no-stages and --stage-cpu)")
    results = bench(args.workloads, args.n, args.profile, stages=not args.no_stages, stage_cpu=args.stage_cpu)
    out: dict[str, Any] = {"python": sys.version.split()[0], "cores": os.cpu_count(),
                           "max_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1), **results}
    if args.cel:
        out["cel"] = bench_cel()
    if args.write_budget:
        old = json.loads(args.budget.read_text()) if args.budget.exists() else {}
        workloads = old.get("workloads", {})
        for w in args.workloads:
            r = results[w]
            workloads[w] = {"cpu_ms": round(r["cpu_ms"], 3),
                            "stages_us": {s: round(v, 1) for s, v in r["stages_us"].items()}}
        args.budget.write_text(json.dumps({"about": "scripts/bench_decision.py --write-budget; docs/architecture.md",
                                           "workloads": workloads}, indent=2) + "\n")
    problems = [] if args.no_check or args.no_stages or args.stage_cpu or args.write_budget or not args.budget.exists() else \
        check(results, json.loads(args.budget.read_text()), args.tolerance)
    out["budget_problems"] = problems
    if args.json:
        print(json.dumps({k: v for k, v in out.items()
                          if not isinstance(v, dict) or "profile" not in v} if not args.profile else out, indent=2))
    else:
        print(f"estimator: {results['estimator']}; {os.cpu_count()} cores; in process (ASGI)")
        stages = [s for s in [*STAGES, "other", "framework"] if s != "route"
                  and any(s in results[w]["stages_us"] for w in args.workloads)]
        print(f"{'':<22}" + "".join(f"{w:>15}" for w in args.workloads))
        print(f"{'server CPU ms':<22}" + "".join(f"{results[w]['cpu_ms']:>15.3f}" for w in args.workloads))
        print(f"{'  event loop ms':<22}" + "".join(f"{results[w]['loop_cpu_ms']:>15.3f}" for w in args.workloads))
        for row in [*THREAD_GROUPS.values(), "other"]:
            label = f"  {row.removeprefix('decision ')} ms"  # "log writer": the column's width
            print(f"{label:<22}" + "".join(f"{results[w]['threads_ms'].get(row, 0.0):>15.3f}" for w in args.workloads))
        print(f"{'wall p50 ms':<22}" + "".join(f"{results[w]['wall_p50_ms']:>15.3f}" for w in args.workloads))
        print(f"stages, median us ({'loop thread CPU' if args.stage_cpu else 'wall'}) per request:")
        for s in stages:
            print(f"  {s:<20}" + "".join(f"{results[w]['stages_us'].get(s, float('nan')):>15.1f}"
                                         for w in args.workloads))
        if args.profile:
            for w in args.workloads:
                print(f"--- {w}\n{results[w]['profile']}")
        if args.cel:
            print("CEL (common-expression-language), microseconds:")
            for k, v in out["cel"].items():
                print(f"  {k:<58}{v:8.2f}")
        for p in problems:
            print(f"OVER BUDGET: {p}")
    if problems:
        sys.exit(1)


if __name__ == "__main__":
    main()
