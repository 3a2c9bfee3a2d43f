#!/usr/bin/env python
"""Quantiles of the estimator's p_hard on public prompts: the basis for a policy's thresholds.

A calibrated p_hard from a weak signal stays in a narrow band, so fixed thresholds
(0.62) can leave a tier unused. The default policy's ``p_hard_frontier`` and
``p_hard_onprem_large`` are quantiles of the shipped model's p_hard on prompts from
the Apache/MIT-licensed sets (Arena-Bench-V1, RouteLLM MT-Bench, MMLU, GSM8K; up to
``--per-set`` prompts each, fixed seed); re-run after retraining and update them.

    python scripts/p_hard_quantiles.py [--model SPEC] [--per-set 300] [--share-frontier 0.15] [--share-large 0.5]
"""

from __future__ import annotations

import os

os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

import argparse  # noqa: E402
import csv  # noqa: E402
import gzip  # noqa: E402
import random  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

SHARED = Path(__file__).resolve().parents[2] / "shared" / "datasets"
SETS = [("arena_bench_v1/arena_bench_v1_gpt4_single_scores.csv", "prompt"),
        ("routellm/mtbench_mixtral_vs_gpt4.csv", "prompt_turn1"),
        ("routellm/mmlu_mixtral_vs_gpt4.csv.gz", "prompt"),
        ("routellm/gsm8k_mixtral_vs_gpt4.csv.gz", "prompt")]


def prompts(path: Path, column: str, n: int) -> list[str]:
    """Up to ``n`` non-empty prompts from ``column`` of a (gzipped) CSV, sampled with a fixed seed."""
    opener = gzip.open if path.suffix == ".gz" else open
    csv.field_size_limit(sys.maxsize)
    with opener(path, "rt", encoding="utf-8", newline="") as f:
        rows = [r[column] for r in csv.DictReader(f) if r.get(column, "").strip()]
    random.Random(0).shuffle(rows)
    return rows[:n]


def quantile(values: list[float], q: float) -> float:
    """Linear-interpolated quantile, q in [0, 1]."""
    s = sorted(values)
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def main() -> None:
    """Score the prompt mix and print per-set quantiles and suggested thresholds."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="estimator spec (default: the bundled model)")
    ap.add_argument("--per-set", type=int, default=300)
    ap.add_argument("--share-frontier", type=float, default=0.15, help="share of prompts at or above p_hard_frontier")
    ap.add_argument("--share-large", type=float, default=0.50, help="share at or above p_hard_onprem_large")
    ap.add_argument("--datasets", type=Path, default=SHARED)
    args = ap.parse_args()

    from pointsman.estimator.features import extract_features
    from pointsman.estimator.loading import load_estimator
    from pointsman.request import request_from_prompt

    est = load_estimator(args.model)
    print(f"model {est.version}")
    everything: list[float] = []
    for rel, column in SETS:
        ps = [est.estimate(extract_features(request_from_prompt(t), est.tokenizer)).p_hard
              for t in prompts(args.datasets / rel, column, args.per_set)]
        everything += ps
        print(f"{rel:<55} n={len(ps):<4} p10 {quantile(ps, .1):.3f}  p50 {quantile(ps, .5):.3f}  "
              f"p85 {quantile(ps, .85):.3f}  p90 {quantile(ps, .9):.3f}")
    f = quantile(everything, 1 - args.share_frontier)
    m = quantile(everything, 1 - args.share_large)
    print(f"mix n={len(everything)}: p_hard_frontier = {f:.3f} (top {args.share_frontier:.0%}), "
          f"p_hard_onprem_large = {m:.3f} (top {args.share_large:.0%})")


if __name__ == "__main__":
    main()
