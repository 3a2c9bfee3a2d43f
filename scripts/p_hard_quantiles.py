#!/usr/bin/env python
"""Quantiles of the estimator's p_hard on public prompts: the basis for a policy's thresholds.

A calibrated p_hard from a weak signal stays in a narrow band, so fixed thresholds
(0.62) can leave a tier unused. The default policy's ``p_hard_frontier`` and
``p_hard_onprem_large`` are quantiles of the shipped model's p_hard on the fixed
reference mix of ``pointsman.training.reference_set`` (Arena-Bench-V1, RouteLLM
MT-Bench, MMLU, GSM8K; up to ``--per-set`` prompts each, fixed seed); re-run after
retraining and update them.

``--from-manifest`` reads the quantiles the model publishes in its ``manifest.json``
(``reference_p_hard``, written by ``pointsman train``) instead of scoring the prompts,
so no data is needed.

    python scripts/p_hard_quantiles.py [--model SPEC] [--per-set 300] [--share-frontier 0.15] [--share-large 0.5]
    python scripts/p_hard_quantiles.py --from-manifest [--model SPEC]
"""

from __future__ import annotations

import os

os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

import argparse  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

SHARED = Path(__file__).resolve().parents[2] / "shared" / "datasets"


def main() -> int:
    """Score the prompt mix (or read the manifest) and print quantiles and suggested thresholds."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="estimator spec (default: the bundled model)")
    ap.add_argument("--per-set", type=int, default=300)
    ap.add_argument("--share-frontier", type=float, default=0.15, help="share of prompts at or above p_hard_frontier")
    ap.add_argument("--share-large", type=float, default=0.50, help="share at or above p_hard_onprem_large")
    ap.add_argument("--datasets", type=Path, default=SHARED)
    ap.add_argument("--from-manifest", action="store_true", help="use the manifest's published quantiles")
    args = ap.parse_args()

    from pointsman.estimator.model_source import load_estimator
    from pointsman.training.reference_set import quantile, reference_quantiles, score_reference, threshold_for_share

    est = load_estimator(args.model)
    print(f"model {est.version}")
    if args.from_manifest:
        ref = est.manifest.reference_p_hard
        if not ref:
            print("the manifest publishes no reference_p_hard (model trained before it existed); "
                  "run without --from-manifest", file=sys.stderr)
            return 1
        print(f"manifest reference mix n={ref['n']}: " + "  ".join(
            f"p{round(float(q) * 100)} {v:.3f}" for q, v in ref["quantiles"].items() if q in ("0.10", "0.50", "0.85", "0.90")))
    else:
        per_set = score_reference(est, args.datasets, args.per_set)
        for rel, ps in per_set.items():
            print(f"{rel:<55} n={len(ps):<4} p10 {quantile(ps, .1):.3f}  p50 {quantile(ps, .5):.3f}  "
                  f"p85 {quantile(ps, .85):.3f}  p90 {quantile(ps, .9):.3f}")
        ref = reference_quantiles(per_set)
        everything = [p for ps in per_set.values() for p in ps]
        print(f"mix n={len(everything)}: exact p_hard_frontier = {quantile(everything, 1 - args.share_frontier):.3f}, "
              f"p_hard_onprem_large = {quantile(everything, 1 - args.share_large):.3f}")
    f = threshold_for_share(ref, args.share_frontier)
    m = threshold_for_share(ref, args.share_large)
    print(f"from the published levels: p_hard_frontier = {f:.3f} (top {args.share_frontier:.0%}), "
          f"p_hard_onprem_large = {m:.3f} (top {args.share_large:.0%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
