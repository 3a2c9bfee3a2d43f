#!/usr/bin/env python
"""Choose difficulty v3's easy-anchor gate by two criteria that no single one can game: the sanity
suite's concordance (``datasets/sanity_pairs.jsonl``, never trained on) and leave-one-chat-source-out
APGR (``scripts/select_recipe_v2.py``'s ``loco``: train without Arena-Bench-V1, score it; the same for
RouteLLM MT-bench). ``criterion`` is their mean; AlpacaEval and the holdout suite
(``datasets/sanity_holdout_pairs.jsonl``) are printed for the record and never chosen on.

Two ranking labels: ``gap`` (v2's: the graded strong - weak score gap over model pairs, centered per
source) and ``acceptable`` ("is the cheap answer good enough?": the share of the source's weak models
whose answer is not acceptable, a GPT-4 single grade below ``ACCEPTABLE_GRADE`` of 10, centered per
source the same way).

Each candidate is the shipped recipe (``TrainConfig()``: chat sources, gap label centered per source,
logistic alpha 3000, conversation block, static encoder of ``estimator/default_model``) with the easy
anchors (``datasets.easy_anchors``) and the head's gate at the given weight, shift and L2 penalty;
``--no-anchors`` rows are the v2 recipe. Heads are fitted without cross-fitting (the Platt map is
increasing: it changes no ranking).

    nice -n 10 .venv/bin/python scripts/select_recipe_v3.py [--pooling mean|instruction] [--json]
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
from pathlib import Path

os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")

import numpy as np  # noqa: E402

from pointsman.data_dir import data_dir  # noqa: E402
from pointsman.datasets.sources import default_training_sources, get_source  # noqa: E402
from pointsman.estimator.difficulty import DifficultyEstimator  # noqa: E402
from pointsman.estimator.head_inputs import HeadInputs  # noqa: E402
from pointsman.estimator.manifest import POOLINGS  # noqa: E402
from pointsman.estimator.model_source import bundled_model_dir  # noqa: E402
from pointsman.training.examples import EASY_ANCHORS, anchor_examples, build_examples, features_for_messages  # noqa: E402
from pointsman.training.metrics import apgr  # noqa: E402
from pointsman.training.recipe import TrainConfig  # noqa: E402
from pointsman.training.sanity import messages_of, read_pairs  # noqa: E402
from pointsman.training.train import anchored_rank_targets, build_encoder, head_inputs  # noqa: E402

AE = ("alpacaeval_ae1",)
GRID = {"gate_weight": (1.0, 2.0, 4.0), "gate_shift": (1.0, 2.0, 3.0), "gate_alpha": (100.0,)}
#: A single grade (1-10) at or above this is an acceptable answer (MT-bench's and Arena's judges give 7 to
#: a helpful answer with minor flaws).
ACCEPTABLE_GRADE = 7.0


def unacceptable_share(ex) -> np.ndarray:
    """Per row of ``ex`` (chat sources), the share of the source's weak models graded below
    ``ACCEPTABLE_GRADE``: float64 (n,), NaN where no weak model was graded."""
    from pointsman.datasets.outcome_tables import read_outcome_table

    out = np.full(len(ex), np.nan)
    for name in np.unique(ex.source):
        src = get_source(str(name))
        table = read_outcome_table(src.path())
        weak = np.stack([table.scores(c) for c in src.weak], axis=1)
        with np.errstate(invalid="ignore"):
            share = np.nanmean(np.where(np.isnan(weak), np.nan, weak < ACCEPTABLE_GRADE), axis=1)
        row = {pid: i for i, pid in enumerate(table.prompt_ids)}
        m = ex.source == name
        out[m] = [share[row[pid]] for pid in ex.prompt_id[m]]
    return out


def _head(cfg: TrainConfig, ex, X: np.ndarray, gate: dict[str, float] | None, label: str):
    from pointsman.estimator.head import DifficultyHead

    if label == "acceptable":  # the same per-source centering as the gap label, on the other target
        real = ex.source != EASY_ANCHORS
        ex = dataclasses.replace(ex, y_gap=ex.y_gap.copy())
        ex.y_gap[real] = unacceptable_share(ex.subset(real))
    y, w, anchor = anchored_rank_targets(ex, cfg)
    head = DifficultyHead(n_embedding=384, kind=cfg.head, alpha=cfg.alpha, n_folds=0, scale=cfg.scale,
                          **(gate or {"gate_weight": 0.0}))
    return head.fit(X, y, w, easy_anchor=anchor)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--pooling", choices=POOLINGS, default=TrainConfig.pooling,
                    help="how the embedding pools the query (estimator.head_inputs)")
    args = ap.parse_args()
    cfg = TrainConfig(encoder_from=str(bundled_model_dir()), pooling=args.pooling)
    sources = default_training_sources(cfg.sources)
    cache = data_dir() / "cache"
    built = build_encoder(cfg, sources, cache)
    est = DifficultyEstimator(bundled_model_dir())
    chat = build_examples(sources, tokenizer=est.tokenizer)
    anchors = anchor_examples(est.tokenizer)
    both = chat.concat(anchors)
    X_all = head_inputs(built, both, cache, cfg.blocks, cfg.pooling)
    inputs = HeadInputs(est.encoder, cfg.blocks, cfg.pooling)

    def vec(request) -> np.ndarray:
        return inputs.vector(features_for_messages(messages_of(request), est.tokenizer))[0]

    suites = {}
    for name in ("sanity", str(Path(__file__).resolve().parents[1] / "datasets" / "sanity_holdout_pairs.jsonl")):
        pairs = read_pairs(name)
        suites[name] = (np.stack([vec(p.easy) for p in pairs]), np.stack([vec(p.hard) for p in pairs]))
    ae = build_examples([get_source(n) for n in AE], tokenizer=est.tokenizer)
    X_ae = head_inputs(built, ae, cache, cfg.blocks, cfg.pooling)

    def concordance(head, name: str) -> float:
        E, H = suites[name]
        d = head.decision_function(H) - head.decision_function(E)
        return float(np.mean(d > 0) + 0.5 * np.mean(d == 0))

    def measure(gate: dict[str, float] | None, label: str) -> dict[str, float]:
        keep = np.ones(len(both), dtype=bool) if gate else both.source != EASY_ANCHORS
        out: dict[str, float] = {}
        head = _head(cfg, both.subset(keep), X_all[keep], gate, label)
        out["sanity"], out["holdout"] = (concordance(head, name) for name in suites)
        for held in ("arena_bench_v1", "routellm_mtbench"):
            train = keep & (both.source != held)
            h = _head(cfg, both.subset(train), X_all[train], gate, label)
            m = chat.source == held
            out[held] = apgr(chat.weak_score[m], chat.strong_score[m], h.decision_function(X_all[: len(chat)][m]))
        out["loco"] = (out["arena_bench_v1"] + out["routellm_mtbench"]) / 2
        out["criterion"] = (out["sanity"] + out["loco"]) / 2
        out["alpacaeval_apgr"] = apgr(ae.weak_score, ae.strong_score, head.decision_function(X_ae))
        return out

    rows = []
    for label in ("gap", "acceptable"):
        rows.append((f"{label}, no anchors", measure(None, label)))
        for weight, shift, alpha in itertools.product(*GRID.values()):
            gate = {"gate_weight": weight, "gate_shift": shift, "gate_alpha": alpha}
            rows.append((f"{label}, gate w{weight:g} s{shift:g} a{alpha:g}", measure(gate, label)))
    if args.json:
        print(json.dumps({name: r for name, r in rows}, indent=2))
        return
    print(f"pooling: {cfg.pooling}")
    print(f"{'candidate':32s} {'sanity':>7s} {'arena':>7s} {'mtbench':>7s} {'loco':>7s} {'criterion':>9s} {'AE apgr':>8s} "
          f"{'holdout':>8s}")
    for name, r in sorted(rows, key=lambda kv: -kv[1]["criterion"]):
        print(f"{name:32s} {r['sanity']:7.4f} {r['arena_bench_v1']:7.4f} {r['routellm_mtbench']:7.4f} {r['loco']:7.4f} "
              f"{r['criterion']:9.4f} {r['alpacaeval_apgr']:8.4f} {r['holdout']:8.4f}")


if __name__ == "__main__":
    main()
