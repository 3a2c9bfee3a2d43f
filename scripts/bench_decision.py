#!/usr/bin/env python
"""In-process decision latency of ``RoutingEngine.route`` on one core.

Prints p50/p99 of the whole decision and of each step (features, estimator, policy)
for prompts of about 30, 500 and 8,000 tokens and a 100,000-token multi-turn
conversation, with the estimator's share of the total. Targets (issue 2): p99 <= 5 ms
up to 512 tokens, <= 25 ms at 100,000 tokens.

Uses the real estimator (``pointsman.estimator.model_source.load_estimator``) when it
loads, else ``FixedDifficulty`` and says so. Pins the process to one CPU
(``os.sched_setaffinity``) and onnxruntime/OpenMP to one thread (environment set
before anything imports onnxruntime).

    python scripts/bench_decision.py [--model SPEC] [--iterations N] [--json] [--cel]

``--cel`` also measures common-expression-language's cost per evaluation with a
reused context, a dict per call and a context built per decision (the evaluator's
choice; see ``policy/rules/evaluator.py``).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

WORDS = ("the of and to in is that for it as with was on be by this are from at or an which have not but "
         "model request cache token latency prefill decode throughput server policy budget cost router GPU "
         "function return value error string number list python code write explain why how what when where "
         "data table query index memory thread process network packet protocol design system user answer "
         "question example compute integral derivative matrix vector proof theorem lemma history science").split()


def text_of(n_words: int, rng: random.Random) -> str:
    """English-like filler text of ``n_words`` words from a fixed vocabulary."""
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


def workloads(rng: random.Random) -> list[tuple[str, dict[str, Any]]]:
    """(label, chat request body) for the four sizes; word counts are tuned to the token targets
    as counted by the MiniLM (BERT WordPiece) tokenizer, ~1.1 tokens per word of this vocabulary."""
    conv: list[dict[str, Any]] = [{"role": "system", "content": text_of(200, rng)}]
    for _ in range(40):  # 40 turns of ~1,250 tokens each way: ~100k tokens
        conv.append({"role": "user", "content": text_of(1120, rng)})
        conv.append({"role": "assistant", "content": text_of(1120, rng)})
    conv.append({"role": "user", "content": text_of(60, rng) + " What should we do next?"})
    return [
        ("~30 tokens", {"messages": [{"role": "user", "content": text_of(22, rng) + "?"}]}),
        ("~500 tokens", {"messages": [{"role": "user", "content": text_of(455, rng)}]}),
        ("~8,000 tokens", {"messages": [{"role": "user", "content": text_of(7250, rng)}]}),
        ("~100k-token conversation", {"messages": conv}),
    ]


def pct(values: list[float], q: float) -> float:
    """The q-th percentile (0-100), nearest-rank."""
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * len(s) + 0.5) - 1))]


def load_engine(model: str | None) -> tuple[Any, str]:
    """(engine on the default fleet and policy, a note naming the estimator used)."""
    from pointsman.estimator.estimate import FixedDifficulty
    from pointsman.policy.engine import RoutingEngine
    from pointsman.policy.fleet import load_fleet
    from pointsman.policy.rules.compiler import DEFAULT_POLICY_PATH, load_policy
    from pointsman.service.bootstrap import UnavailableEstimator, load_estimator

    fleet = load_fleet()
    policy = load_policy(DEFAULT_POLICY_PATH, fleet)
    estimator, error = load_estimator(model)
    if isinstance(estimator, UnavailableEstimator):
        note = f"real estimator NOT loaded ({error}); using FixedDifficulty(0.3): estimator time is ~0"
        estimator = FixedDifficulty(0.3)
    else:
        note = f"real estimator {getattr(estimator, 'version', '?')}"
    return RoutingEngine(fleet, policy, estimator), note


def bench_route(engine: Any, body: dict[str, Any], iterations: int) -> dict[str, Any]:
    """Time ``iterations`` decisions of one request (after 50 warm-up ones); milliseconds per step."""
    from pointsman.request import parse_route_request

    request = parse_route_request(body)
    for _ in range(min(50, iterations)):
        engine.route(request)
    total, feats, est, pol, parse = [], [], [], [], []
    tokens = 0
    for _ in range(iterations):
        t0 = time.perf_counter()
        d = engine.route(request)
        total.append((time.perf_counter() - t0) * 1e3)
        feats.append(d.timings_ms["features"])
        est.append(d.timings_ms["estimator"])
        pol.append(d.timings_ms["policy"])
        tokens = d.prompt_tokens
    for _ in range(max(10, iterations // 10)):
        t0 = time.perf_counter()
        parse_route_request(body)
        parse.append((time.perf_counter() - t0) * 1e3)
    return {
        "prompt_tokens": tokens, "target": d.target, "rule": d.rule, "n": iterations,
        "total_p50_ms": pct(total, 50), "total_p99_ms": pct(total, 99),
        "features_p50_ms": pct(feats, 50), "features_p99_ms": pct(feats, 99),
        "estimator_p50_ms": pct(est, 50), "estimator_p99_ms": pct(est, 99),
        "policy_p50_ms": pct(pol, 50), "policy_p99_ms": pct(pol, 99),
        "estimator_share": sum(est) / sum(total) if sum(total) else 0.0,
        "parse_p50_ms": pct(parse, 50),
    }


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

    def per(fn: Any, n: int = 20000) -> float:
        return min(timeit.repeat(fn, number=n, repeat=5)) / n * 1e6

    def new_ctx_full() -> None:
        c = cel.Context(snap)
        for p in progs:
            p.execute(c)

    def new_ctx_pruned() -> None:
        c = cel.Context(pruned)
        for p in progs:
            p.execute(c)

    def dict_each() -> None:
        for p in progs:
            p.execute(snap)

    return {
        "one_eval_reused_context_us": per(lambda: progs[1].execute(ctx)),
        "one_eval_dict_per_call_us": per(lambda: progs[1].execute(snap)),
        "decision_4_rules_dict_per_call_us": per(dict_each),
        "decision_4_rules_context_per_decision_full_snapshot_us": per(new_ctx_full),
        "decision_4_rules_context_per_decision_pruned_us": per(new_ctx_pruned),
    }


def main() -> None:
    """Parse arguments, pin to one CPU, run every workload, print the table (or JSON)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=os.environ.get("POINTSMAN_MODEL"), help="estimator model spec")
    parser.add_argument("--iterations", type=int, default=1000, help="decisions per workload (100k: a fifth)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--cel", action="store_true", help="also measure CEL evaluation strategies")
    args = parser.parse_args()

    pinned = "no"
    if hasattr(os, "sched_setaffinity"):
        cpu = min(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpu})
        pinned = f"cpu {cpu}"
    engine, note = load_engine(args.model)
    rng = random.Random(7)
    results = {}
    for label, body in workloads(rng):
        n = args.iterations if "100k" not in label else max(20, args.iterations // 5)
        results[label] = bench_route(engine, body, n)
    out: dict[str, Any] = {"estimator": note, "pinned": pinned, "python": sys.version.split()[0], "results": results}
    if args.cel:
        out["cel"] = bench_cel()
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print(f"estimator: {note}; pinned to {pinned}; OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}")
    print(f"{'workload':<26}{'tokens':>8}{'p50 ms':>9}{'p99 ms':>9}{'est p50':>9}{'est p99':>9}"
          f"{'feat p50':>9}{'pol p50':>9}{'est share':>10}{'parse p50':>10}  target/rule")
    for label, r in results.items():
        print(f"{label:<26}{r['prompt_tokens']:>8,}{r['total_p50_ms']:>9.3f}{r['total_p99_ms']:>9.3f}"
              f"{r['estimator_p50_ms']:>9.3f}{r['estimator_p99_ms']:>9.3f}{r['features_p50_ms']:>9.3f}"
              f"{r['policy_p50_ms']:>9.3f}{r['estimator_share']:>10.0%}{r['parse_p50_ms']:>10.3f}  "
              f"{r['target']}/{r['rule']}")
    print("targets: p99 <= 5 ms up to 512 tokens, <= 25 ms at 100k tokens "
          "(route() only; parse p50 is the RouteRequest validation a service adds)")
    if args.cel:
        print("CEL (common-expression-language), microseconds:")
        for k, v in out["cel"].items():
            print(f"  {k:<58}{v:8.2f}")


if __name__ == "__main__":
    main()
