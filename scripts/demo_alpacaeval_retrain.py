"""Demonstration on real data: retrain the difficulty estimator from one operator's logged
outcomes, promote it, and measure APGR on prompts it did not train on, before and after.

The operator (issue 4): the shared AlpacaEval prompts (604, ae1 table: GPT-4 judge against
text-davinci-003 answers) are its traffic; the on-prem open model is ``llama-2-7b-chat-hf``
(fleet target ``onprem-8b``) and the frontier model ``gpt4_1106_preview``
(``frontier-large``). Every prompt goes through the decision path of the service (the
routing engine with the serving model, the decision logged with its head input but no
prompt text), and the judge's verdicts come back through the outcome path
(``OutcomeLog.append_outcomes``, what ``POST /v1/outcomes`` stores): the served answer and,
as shadow traffic, the other tier's answer — so the logged quality signal is the judge
pair. In the *multi-model* setup the operator also runs its other on-prem open models on
the same prompts in shadow (the 42 open models of the ae1 table), and the label averages
their verdicts against the frontier answer.

Measured, for the single-pair label and the multi-model label:

1. k-fold cross-validation over the 604 prompts (folds by conversation hash): a challenger
   is trained on the logged outcomes of k−1 folds (``train_challenger`` with that holdout)
   and both it and the shipped default are scored on the held-out fold
   (``compare_models``, APGR of llama-2-7b-chat-hf vs gpt4_1106_preview); mean over folds.
2. The loop as an operator runs it: ``train --from-outcomes`` (MLflow, alias @challenger),
   ``promote`` through the gate (APGR better, ECE not worse) — the champion alias moves and
   a new decision names the new model version.

AlpacaEval's data is CC BY-NC 4.0: everything trained here stays in the work folder
(``--work``, default a temporary folder: its own outcome log and MLflow store), never in
``estimator/default_model/``.

Run: ``python scripts/demo_alpacaeval_retrain.py [--folds 5] [--work DIR]``.
The swap to HTTP (issue 6) is ``Traffic.decide`` / ``Traffic.post_outcomes``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402

TABLE = "alpacaeval/ae1_judge-gpt4_ref-text_davinci_003.csv.gz"
WEAK, STRONG = "llama-2-7b-chat-hf", "gpt4_1106_preview"
JUDGE = "alpaca_eval_gpt4 vs text_davinci_003 (win score 0-1)"
#: API-only models in the ae1 table: not the operator's on-prem models.
CLOSED = frozenset({"gpt4", "gpt4_0314", "gpt4_1106_preview", "gpt-3.5-turbo-0301", "gpt-3.5-turbo-1106",
                    "gpt35_turbo_instruct", "text_davinci_001", "claude", "claude-2", "cohere", "mistral-medium"})
BIG = ("33b", "34b", "40b", "65b", "70b")


class Traffic:
    """The operator's side of the service: ask for a decision, report outcomes. Today both go
    through the library the service uses; over HTTP they become ``POST /v1/route`` (the service
    logs the decision) and ``POST /v1/outcomes`` — the only two methods to change."""

    def __init__(self, engine, log, estimator):
        self.engine, self.log, self.estimator = engine, log, estimator

    def decide(self, request):
        """A decision for ``request``, logged the way the service logs it."""
        from pointsman.outcome_log.store import record_decision

        decision = self.engine.route(request, dispatch=False)
        record_decision(self.log, decision, request, self.estimator)
        return decision

    def post_outcomes(self, batch: list[dict]) -> None:
        """Report outcomes (``pointsman.outcome`` payloads); every one must be acknowledged."""
        acks = self.log.append_outcomes(batch)
        bad = [a for a in acks if not a.ok]
        if bad:
            raise RuntimeError(f"outcomes not stored: {bad[:3]}")


def open_models(table) -> list[str]:
    """The ae1 table's open-weight models (the operator's on-prem side), llama-2-7b-chat-hf first."""
    rest = [c for c in table.model_columns if c not in CLOSED and c != WEAK]
    return [WEAK] + rest


def log_traffic(traffic: Traffic, table, shadows: list[str]) -> dict[str, int]:
    """Route every prompt and report the judged answers: the served one and the other tier's as a
    shadow, plus the shadow on-prem models. Returns counts."""
    from pointsman.request import parse_route_request

    weak, strong = table.scores(WEAK), table.scores(STRONG)
    scores = {m: table.scores(m) for m in shadows}
    counts = {"decisions": 0, "outcomes": 0, "to_frontier": 0}
    for i, messages in enumerate(table.messages):
        decision = traffic.decide(parse_route_request({"messages": messages}))
        d = decision.decision_id
        frontier = decision.target.startswith("frontier")
        batch = []
        if not np.isnan(weak[i]):
            batch.append({"decision_id": d, "outcome_id": f"{d}-{WEAK}", "served_target": "onprem-8b",
                          "served_model": WEAK, "shadow": frontier, "quality": {"judge_score": float(weak[i]), "judge": JUDGE}})
        if not np.isnan(strong[i]):
            batch.append({"decision_id": d, "outcome_id": f"{d}-{STRONG}", "served_target": "frontier-large",
                          "served_model": STRONG, "shadow": not frontier,
                          "quality": {"judge_score": float(strong[i]), "judge": JUDGE}})
        for m in shadows:
            if m == WEAK or np.isnan(scores[m][i]):
                continue
            target = "onprem-70b" if any(b in m.lower() for b in BIG) else "onprem-8b"
            batch.append({"decision_id": d, "outcome_id": f"{d}-{m}", "served_target": target, "served_model": m,
                          "shadow": True, "quality": {"judge_score": float(scores[m][i]), "judge": JUDGE}})
        traffic.post_outcomes(batch)
        counts["decisions"] += 1
        counts["outcomes"] += len(batch)
        counts["to_frontier"] += frontier
    return counts


def minilm_base(work: Path) -> Path:
    """A MiniLM model directory (ONNX encoder, 256-token window) whose head is trained on the
    Apache/MIT sources only (at most 300 prompts each; no AlpacaEval), built once in ``work``;
    the challengers take its encoder."""
    from pointsman.datasets.sources import DEFAULT_TRAINING_SOURCES
    from pointsman.training.recipe import TrainConfig
    from pointsman.training.train import train

    out = work / "minilm-base"
    if not (out / "manifest.json").is_file():
        cfg = TrainConfig(encoder="minilm", minilm_max_tokens=256, n_folds=0,
                          max_rows_per_source={s: 300 for s in DEFAULT_TRAINING_SOURCES})
        train(cfg, out, register=False, use_mlflow=False, command="scripts/demo_alpacaeval_retrain.py --minilm",
              log=lambda m: print("  minilm base: " + m))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--folds", type=int, default=5, help="cross-validation folds over the 604 prompts")
    ap.add_argument("--seed", type=int, default=0, help="fold assignment seed (conversation hash)")
    ap.add_argument("--work", type=Path, help="work folder (default: a new temporary folder)")
    ap.add_argument("--json", type=Path, help="also write the numbers to this JSON file")
    ap.add_argument("--minilm", action="store_true",
                    help="the operator opted into storing prompts and retrains on the MiniLM encoder (256 tokens) "
                         "instead of the serving model's static one; the prompts are re-embedded")
    ap.add_argument("--encoder-from", type=Path,
                    help="with --minilm: a MiniLM model directory to take the encoder from (default: build one, "
                         "with a head trained on Apache/MIT data only)")
    args = ap.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="pointsman-alpacaeval-demo-"))
    work.mkdir(parents=True, exist_ok=True)
    os.environ["POINTSMAN_DATA_DIR"] = str(work / "data")
    os.environ.pop("MLFLOW_TRACKING_URI", None)  # the embedded store of the work folder

    from pointsman.datasets.outcome_tables import read_outcome_table
    from pointsman.datasets.sources import shared_datasets_dir
    from pointsman.estimator.difficulty import DifficultyEstimator
    from pointsman.estimator.model_source import bundled_model_dir, load_estimator
    from pointsman.outcome_log.store import OutcomeLog
    from pointsman.policy.engine import RoutingEngine
    from pointsman.policy.fleet import load_fleet
    from pointsman.policy.rules.compiler import DEFAULT_POLICY_PATH, load_policy
    from pointsman.request import request_from_prompt
    from pointsman.training.challenger import ChallengerConfig, train_challenger
    from pointsman.training.compare import compare_models
    from pointsman.training.outcome_labels import LabelRules
    from pointsman.training.promote import Gate, promote

    t0 = time.perf_counter()
    print(f"work folder (AlpacaEval is CC BY-NC: models trained here stay here): {work}")
    table = read_outcome_table(shared_datasets_dir() / TABLE)
    fleet = load_fleet()
    bundled = load_estimator("bundled", intra_op_threads=2)
    engine = RoutingEngine(fleet, load_policy(DEFAULT_POLICY_PATH, fleet), bundled)
    shadows = open_models(table)
    log = OutcomeLog(store_prompts=args.minilm)  # <work>/data/outcomes.db; prompts only with --minilm
    counts = log_traffic(Traffic(engine, log, bundled), table, shadows)
    base = bundled
    if args.minilm:
        base = DifficultyEstimator(args.encoder_from or minilm_base(work), intra_op_threads=2)
        print(f"retraining on the encoder of {base.version} ({base.manifest.encoder.kind}, "
              f"{base.manifest.encoder.max_tokens} tokens) from the stored prompts")
    print(f"logged {counts['decisions']} decisions ({counts['to_frontier']} to the frontier) and "
          f"{counts['outcomes']} judged outcomes ({len(shadows)} on-prem models + the frontier); "
          f"{time.perf_counter() - t0:.0f} s")

    pair = LabelRules(weak_models=(WEAK,), strong_models=(STRONG,))
    labels = {"single-pair": pair, "multi-model": LabelRules(strong_models=(STRONG,))}
    results: dict[str, dict] = {"folds": args.folds, "seed": args.seed, "bundled_version": bundled.version,
                                "encoder": base.manifest.encoder.kind, "on_prem_models": len(shadows), "cv": {}}
    for name, rules in labels.items():
        before, after, eces = [], [], []
        for f in range(args.folds):
            cfg = ChallengerConfig(holdout_folds=args.folds, holdout_fold=f, seed=args.seed)
            out = work / "cv" / name / f"fold{f}"
            train_challenger(log, rules, fleet, cfg, base, output=out, use_mlflow=False, log_fn=lambda m: None)
            cmp = compare_models(log, pair, fleet, bundled, DifficultyEstimator(out, intra_op_threads=2))
            before.append(cmp.champion.metrics["apgr"])
            after.append(cmp.challenger.metrics["apgr"])
            eces.append((cmp.champion.metrics["ece"], cmp.challenger.metrics["ece"]))
            print(f"  {name:12s} fold {f}: n={cmp.n:3d}  APGR shipped default {before[-1]:.4f} -> retrained "
                  f"{after[-1]:.4f}  (ECE {eces[-1][0]:.3f} -> {eces[-1][1]:.3f})")
        results["cv"][name] = {"apgr_before": before, "apgr_after": after, "mean_before": float(np.mean(before)),
                               "mean_after": float(np.mean(after)), "ece": eces}
        print(f"{name}: mean held-out APGR over {args.folds} folds: shipped default {np.mean(before):.4f} -> "
              f"retrained {np.mean(after):.4f}")

    # The loop as an operator runs it: challenger in MLflow, gated promotion, new decisions.
    print("\ntrain --from-outcomes (multi-model label) -> @challenger; promote (gate on the single pair):")
    got = train_challenger(log, labels["multi-model"], fleet, ChallengerConfig(seed=args.seed), base,
                           log_fn=lambda m: print("  " + m))
    result = promote(log, pair, fleet, Gate())
    a, b = result.comparison.champion.metrics, result.comparison.challenger.metrics
    print(f"  promote: {'promoted' if result.promoted else 'refused'}; held-out n={result.comparison.n}: "
          f"APGR {a['apgr']:.4f} -> {b['apgr']:.4f}, ECE {a['ece']:.4f} -> {b['ece']:.4f}"
          + ("" if result.promoted else f"; reasons: {result.reasons}"))
    champion = load_estimator("champion", intra_op_threads=2)
    decision = engine.with_estimator(champion).route(request_from_prompt("Write a limerick about routers."),
                                                      dispatch=False)
    print(f"  @champion: {champion.source}; a new decision names estimator {decision.estimator_version}")
    results["loop"] = {"promoted": result.promoted, "reasons": result.reasons, "n": result.comparison.n,
                       "champion": a, "challenger": b, "challenger_version": got.manifest.version,
                       "new_decision_estimator_version": decision.estimator_version}
    results["seconds"] = time.perf_counter() - t0
    assert not str(bundled_model_dir()).startswith(str(work))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=float))
    print(f"\ndone in {results['seconds']:.0f} s; models and MLflow store in {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
