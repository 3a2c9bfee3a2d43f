#!/usr/bin/env python
"""What retraining from logged outcomes buys, by how many are logged: APGR against n for the
challenger of ``pointsman train --from-outcomes``, with and without its warm start.

One table of judged answers stands for an operator's traffic (default: the shared AlpacaEval
table, on-prem ``llama-2-7b-chat-hf``, frontier ``gpt4_1106_preview``). Every prompt is routed
by the engine with the shipped model and its decision and the two tiers' judged answers are
written to a real outcome log in the work folder (``OutcomeLog``, ``record_decision``,
``append_outcomes``: what ``POST /v1/route`` and ``POST /v1/outcomes`` store). Then, the code
path of ``train --from-outcomes`` (``training.challenger``): labels from the log
(``logged_examples``, judge pair), head inputs as logged (``head_matrix``), the prior rows of the
warm start (``load_prior``) and ``fit_head``, with ``ChallengerConfig`` defaults. Per seed, the
conversations of one fold in ``--holdout-folds`` (``holdout_mask``, as the challenger holds out)
are the evaluation prompts; n prompts drawn from the rest are "the log" the head trains on.
Each row: APGR (``training.metrics``) of the weak vs strong scores on the held-out prompts,
mean ± sd over seeds, cold (logged rows only) and warm (plus the prior rows, each weighing
``half / (n + half)``), the paired differences warm − cold and warm − shipped model (same
held-out prompts), and ECE against the held-out labels; n = 0 is the shipped model as it is.

    nice -n 10 .venv/bin/python scripts/learning_curve.py [--seeds 5] [--ns 50,100,200,400,all] [--json]

Embeddings are computed once per run (logged at decision time, the prior once). Everything is
written to ``--work`` (default: a temporary folder); AlpacaEval is CC BY-NC 4.0: evaluation only,
no model is kept.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

import numpy as np  # noqa: E402

TABLE = "alpacaeval/ae1_judge-gpt4_ref-text_davinci_003.csv.gz"
WEAK, STRONG = "llama-2-7b-chat-hf", "gpt4_1106_preview"
WEAK_TARGET, STRONG_TARGET = "onprem-8b", "frontier-large"
JUDGE = "table judge"


def write_log(log_path: Path, table_path: Path, weak: str, strong: str, model: str) -> tuple[object, int]:
    """Route every prompt of the table with ``model`` and log the decision and both tiers' judged
    answers (the tier the decision did not pick as a shadow). Returns (the estimator, decisions)."""
    from pointsman.datasets.outcome_tables import read_outcome_table
    from pointsman.estimator.model_source import load_estimator
    from pointsman.outcome_log.store import OutcomeLog, record_decision
    from pointsman.policy.engine import RoutingEngine
    from pointsman.policy.fleet import load_fleet
    from pointsman.policy.rules.compiler import STATIC_POLICY_PATH, load_policy
    from pointsman.request import parse_route_request

    table = read_outcome_table(table_path)
    w, s = table.scores(weak), table.scores(strong)
    est = load_estimator(model, intra_op_threads=2)
    fleet = load_fleet()
    engine = RoutingEngine(fleet, load_policy(STATIC_POLICY_PATH, fleet), est)
    log = OutcomeLog(log_path)
    n = 0
    for i, messages in enumerate(table.messages):
        if np.isnan(w[i]) or np.isnan(s[i]) or not any(str(m.get("content") or "").strip() for m in messages):
            continue
        request = parse_route_request({"messages": messages})
        d = engine.route(request, dispatch=False)
        record_decision(log, d, request, est)
        front = d.target.startswith("frontier")
        acks = log.append_outcomes([
            {"decision_id": d.decision_id, "outcome_id": d.decision_id + "-weak", "served_target": WEAK_TARGET,
             "served_model": weak, "shadow": front, "quality": {"judge_score": float(w[i]), "judge": JUDGE}},
            {"decision_id": d.decision_id, "outcome_id": d.decision_id + "-strong", "served_target": STRONG_TARGET,
             "served_model": strong, "shadow": not front, "quality": {"judge_score": float(s[i]), "judge": JUDGE}},
        ])
        if not all(a.ok for a in acks):
            raise RuntimeError(f"outcomes not stored: {acks}")
        n += 1
    log.close()
    return est, n


def _sizes(spec: str, pool: int) -> list[tuple[str, int]]:
    """``(key, n)`` per entry of ``spec`` ("50,100,all"): ``all`` is the whole pool, a number at
    most the pool; raises ``SystemExit`` on anything else."""
    out = []
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        if part == "all":
            out.append(("all", pool))
        elif part.isdigit() and int(part) > 0:
            out.append((part, min(int(part), pool)))
        else:
            raise SystemExit(f"--ns: expected positive counts or 'all', got {part!r}")
    return out


def _ms(values: list[float]) -> tuple[float, float]:
    a = np.asarray(values, dtype=np.float64)
    a = a[np.isfinite(a)]
    return (float(a.mean()), float(a.std(ddof=1)) if len(a) > 1 else 0.0) if len(a) else (float("nan"), float("nan"))


def learning_curve(table_path: Path, weak: str, strong: str, *, ns: str, seeds: int, holdout_folds: int,
                   half: float, model: str, work: Path, head_settings: dict | None = None, log=print) -> dict:
    """The curve as a JSON-ready dict: ``rows`` (one per n: per-seed APGR/ECE cold and warm, their
    mean and sd, the paired gain, the prior weight), ``shipped`` (n = 0), counts and settings."""
    from pointsman.outcome_log.store import OutcomeLog
    from pointsman.policy.fleet import load_fleet
    from pointsman.training.challenger import ChallengerConfig, fit_head, load_prior
    from pointsman.training.logged_examples import head_matrix, holdout_mask, logged_examples
    from pointsman.training.metrics import label_metrics, oracle_apgr
    from pointsman.training.outcome_labels import LabelRules
    from pointsman.training.warm_start import prior_weight

    t0 = time.perf_counter()
    est, n_logged = write_log(work / "outcomes.db", table_path, weak, strong, model)
    log(f"logged {n_logged} decisions with judged answers of {weak} and {strong}: {time.perf_counter() - t0:.0f} s")
    rules = LabelRules(weak_models=(weak,), strong_models=(strong,))
    ex = logged_examples(OutcomeLog(work / "outcomes.db"), rules, load_fleet())
    hm = head_matrix(ex, est)
    rows = ex.subset(hm.rows)
    X, y, ws, ss, groups = hm.X, rows.y, rows.weak_score, rows.strong_score, rows.group
    n_emb = est.manifest.encoder.dim
    prior, skipped = load_prior(ChallengerConfig(), est, log)
    if prior is None:
        raise SystemExit(f"the warm start's prior rows are not available: {skipped}")
    log(f"prior rows: {len(prior)} {prior.counts()}; {len(y)} labeled logged rows; {time.perf_counter() - t0:.0f} s")

    results: dict[str, dict[str, list[float]]] = {}
    shipped_apgr: list[float] = []
    shipped_ece: list[float] = []
    oracle: list[float] = []
    for seed in range(seeds):
        test = holdout_mask(groups, holdout_folds, 0, seed)
        pool = np.flatnonzero(~test)
        order = np.random.default_rng(seed).permutation(pool)
        sizes = _sizes(ns, len(pool))
        base = label_metrics(y[test], ws[test], ss[test], est.predict_matrix(X[test]).astype(np.float64))
        shipped_apgr.append(base["apgr"])
        shipped_ece.append(base["ece"])
        oracle.append(oracle_apgr(ws[test], ss[test]))
        seed_prior = prior.subset(~np.isin(prior.group, groups[test]))  # as train_challenger: no held-out prompt
        for key, n in sizes:
            train = np.sort(order[:n])
            r = results.setdefault(key, {"cold_apgr": [], "warm_apgr": [], "cold_ece": [], "warm_ece": [], "n_per_seed": []})
            r["n_per_seed"].append(float(n))
            for name, warm in (("cold", False), ("warm", True)):
                cfg = ChallengerConfig(seed=seed, warm_start=warm, prior_half_n=half, **(head_settings or {}))
                head = fit_head(X[train], y[train], groups[train], n_emb, cfg, seed_prior if warm else None)
                m = label_metrics(y[test], ws[test], ss[test], head.predict_proba(X[test])[:, 1])
                r[f"{name}_apgr"].append(m["apgr"])
                r[f"{name}_ece"].append(m["ece"])
        log(f"seed {seed}: {int(test.sum())} held-out prompts, n in {[n for _, n in sizes]}; "
            f"{time.perf_counter() - t0:.0f} s")

    out_rows = []
    for key, r in results.items():
        gain = [w - c for w, c in zip(r["warm_apgr"], r["cold_apgr"])]
        n = float(np.mean(r["n_per_seed"]))
        weight = float(np.mean([prior_weight(int(k), half) for k in r["n_per_seed"]]))
        row = {"key": key, "n": n, "prior_weight_per_row": weight, "prior_weight_total": weight * len(prior), **r}
        for k in ("cold_apgr", "warm_apgr", "cold_ece", "warm_ece"):
            row[f"{k}_mean"], row[f"{k}_sd"] = _ms(r[k])
        row["gain_mean"], row["gain_sd"] = _ms(gain)
        row["warm_vs_shipped_mean"], row["warm_vs_shipped_sd"] = _ms(
            [w - b for w, b in zip(r["warm_apgr"], shipped_apgr)])
        out_rows.append(row)
    sm, ssd = _ms(shipped_apgr)
    return {"table": str(table_path), "weak": weak, "strong": strong, "model": est.version, "seeds": seeds,
            "holdout_folds": holdout_folds, "half_n": half, "logged": int(len(y)), "prior_rows": len(prior),
            "prior_sources": prior.counts(), "shipped": {"apgr": shipped_apgr, "apgr_mean": sm, "apgr_sd": ssd,
                                                         "ece_mean": _ms(shipped_ece)[0]},
            "oracle_apgr_mean": _ms(oracle)[0], "rows": out_rows, "seconds": time.perf_counter() - t0}


def _finite(v: object) -> object:
    """``v`` with NaN floats as None (strict JSON)."""
    if isinstance(v, float):
        return None if v != v else v
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_finite(x) for x in v]
    return v


def format_table(res: dict) -> str:
    """The curve as a Markdown table."""
    lines = ["| logged n | prior weight / row | APGR cold | APGR warm | warm − cold | warm − shipped | ECE cold | ECE warm |",
             "|---|---|---|---|---|---|---|---|"]
    s = res["shipped"]
    lines.append(f"| 0 (shipped model) | — | {s['apgr_mean']:.3f} ± {s['apgr_sd']:.3f} | — | — | — | {s['ece_mean']:.3f} | — |")
    for r in res["rows"]:
        n = f"all ({r['n']:.0f})" if r["key"] == "all" else f"{r['n']:.0f}"
        lines.append(f"| {n} | {r['prior_weight_per_row']:.3f} | {r['cold_apgr_mean']:.3f} ± {r['cold_apgr_sd']:.3f} | "
                     f"{r['warm_apgr_mean']:.3f} ± {r['warm_apgr_sd']:.3f} | {r['gain_mean']:+.3f} ± {r['gain_sd']:.3f} | "
                     f"{r['warm_vs_shipped_mean']:+.3f} ± {r['warm_vs_shipped_sd']:.3f} | "
                     f"{r['cold_ece_mean']:.3f} | {r['warm_ece_mean']:.3f} |")
    lines.append(f"\noracle APGR {res['oracle_apgr_mean']:.3f}, random 0.5; {res['logged']} logged prompts, "
                 f"{res['prior_rows']} prior rows {res['prior_sources']}; {res['seeds']} seeds, "
                 f"1/{res['holdout_folds']} of conversations held out per seed; {res['seconds']:.0f} s")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--table", type=Path, help=f"wide outcome table (default: <shared datasets>/{TABLE})")
    ap.add_argument("--weak", default=WEAK, help="the on-prem model's column")
    ap.add_argument("--strong", default=STRONG, help="the frontier model's column")
    ap.add_argument("--ns", default="50,100,200,400,all", help="logged outcomes to train on (comma-separated; all = "
                                                              "every prompt outside the held-out fold)")
    ap.add_argument("--seeds", type=int, default=5, help="held-out folds and samples per n")
    ap.add_argument("--holdout-folds", type=int, default=5, help="1/K of the conversations held out per seed")
    ap.add_argument("--half", type=float, default=None,
                    help="prior weight half point (default: training.warm_start.PRIOR_HALF_N)")
    ap.add_argument("--alpha", type=float, help="head L2 penalty (default: ChallengerConfig's)")
    ap.add_argument("--scale", choices=["blocks", "standard"], help="head input scaling (default: ChallengerConfig's)")
    ap.add_argument("--model", default="bundled", help="the model routing and whose encoder the heads read")
    ap.add_argument("--work", type=Path, help="work folder for the outcome log (default: a temporary folder)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = ap.parse_args(argv)
    from pointsman.datasets.sources import shared_datasets_dir
    from pointsman.training.warm_start import PRIOR_HALF_N

    _sizes(args.ns, 1)  # refuse a bad --ns before any work
    work = args.work or Path(tempfile.mkdtemp(prefix="pointsman-learning-curve-"))
    work.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("POINTSMAN_DATA_DIR", str(work / "data"))
    if (work / "outcomes.db").exists():
        raise SystemExit(f"{work / 'outcomes.db'} exists: give an empty --work folder")
    table = args.table or shared_datasets_dir() / TABLE
    res = learning_curve(table, args.weak, args.strong, ns=args.ns, seeds=args.seeds,
                         holdout_folds=args.holdout_folds, half=args.half or PRIOR_HALF_N, model=args.model,
                         work=work,
                         head_settings={k: v for k, v in (("alpha", args.alpha), ("scale", args.scale)) if v is not None},
                         log=lambda m: print(m, file=sys.stderr, flush=True))
    if args.json:
        print(json.dumps(_finite(res), indent=2, allow_nan=False))
    else:
        print(format_table(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
