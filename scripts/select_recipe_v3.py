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

``--gate-reads NAMES`` adds, beside each gate candidate, the same gate reading signals of a specialised
subject (``SPECIALISED_NAMES``: rare and out-of-vocabulary words, capitalised terms, mathematical symbols)
that the ranker does not read; ``--gate-fixed BETA`` fixes the gate's weight on them instead of learning it
(docs/retraining.md, "The gate reads signals of a specialised subject").

    nice -n 10 .venv/bin/python scripts/select_recipe_v3.py [--pooling mean|instruction] [--labels gap,acceptable]
        [--gate-reads all|NAME,... [--gate-fixed BETA]] [--json]
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import re
import sys
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


#: ``--gate-reads NAMES``: signals of a specialised subject, read by the gate only (the ranker never
#: sees them), computed on the instruction (``HeadInputs.instruction_cut``; the whole query when there is
#: no cut) from the WordPiece ids and the text: a word is an alphabetic word start and its ``##`` pieces;
#: ``log_oov_words``: log1p(words of two or more pieces, i.e. outside the vocabulary's ~20k common whole
#: words); ``oov_share``: their share of the words; ``max_word_rank``: the largest log vocabulary rank
#: (``VocabularyRarity``) of a one-piece word, over log 30,000; ``log_rare_words``: log1p(words beyond rank
#: ``RARE_RANK`` or outside the vocabulary); ``log_capitalised``: log1p(capitalised words after a lowercase
#: word, digit or comma: proper nouns and technical terms mid-sentence); ``log_math``: log1p(mathematical
#: symbols and Greek letters, a backslash, ``^`` or ``_``).
SPECIALISED_NAMES = ("log_oov_words", "oov_share", "max_word_rank", "log_rare_words", "log_capitalised", "log_math")
_CAPITALISED = re.compile(r"(?<=[a-z0-9,;] )[A-Z][\w-]+")
_MATH = re.compile(r"[\u0370-\u03ff\u2200-\u22ff\u2190-\u21ff\\^_∫√∞≤≥≈±×÷]")


class Specialised:
    """``SPECIALISED_NAMES`` of a request: per-id tables built once from the tokenizer's vocabulary."""

    def __init__(self, inputs: HeadInputs) -> None:
        from pointsman.estimator.conversation import RARE_RANK, VocabularyRarity

        vocab = inputs.encoder.tokenizer.get_vocab()
        rarity = VocabularyRarity(inputs.encoder.tokenizer)
        self.inputs, self.cont, self.log_rank = inputs, rarity.continuation, rarity.log_rank
        self.alpha = np.zeros(len(self.cont), dtype=bool)
        for token, i in vocab.items():
            if i < len(self.alpha) and token.isalpha():
                self.alpha[i] = True
        self.rare = float(np.log1p(RARE_RANK))
        self.top = float(np.log(30_000))

    def vector(self, f, query_ids: list[int] | None = None) -> np.ndarray:
        """float32 (len(SPECIALISED_NAMES),); ``query_ids``: the query's WordPiece ids when known (serving has
        them), read when the query is read whole; an instruction cut apart is tokenized on its own."""
        cut = self.inputs.instruction_cut(f)
        text = f.query_text[:cut] if cut else f.query_text
        if query_ids is None or cut:
            query_ids = self.inputs._ids(text)
        ids = np.asarray(query_ids, dtype=np.int64)
        out = np.zeros(len(SPECIALISED_NAMES), dtype=np.float32)
        out[4] = np.log1p(len(_CAPITALISED.findall(text)))
        out[5] = np.log1p(len(_MATH.findall(text)))
        if ids.size == 0:
            return out
        starts = np.flatnonzero(~self.cont[ids])
        pieces = np.diff(np.append(starts, ids.size))
        word = self.alpha[ids[starts]]
        if not word.any():
            return out
        oov = word & (pieces >= 2)
        one = word & (pieces == 1)
        ranks = self.log_rank[ids[starts[one]]]
        n_rare = int(oov.sum() + (ranks > self.rare).sum())
        out[0], out[1] = np.log1p(oov.sum()), oov.sum() / word.sum()
        out[2] = ranks.max() / self.top if ranks.size else 0.0
        out[3] = np.log1p(n_rare)
        return out

    def matrix(self, features: list) -> np.ndarray:
        """``vector`` of each request: float32 (n, len(SPECIALISED_NAMES))."""
        return np.stack([self.vector(f) for f in features]).astype(np.float32)


def _head(cfg: TrainConfig, ex, X: np.ndarray, gate: dict[str, float] | None, label: str, gate_only: int = 0,
          gate_fixed: float | None = None):
    """The head of one candidate; the last ``gate_only`` columns of ``X`` are read by the gate only, with
    the gate's raw coefficient on each fixed at ``gate_fixed`` when given (else learned with the rest)."""
    from pointsman.estimator.head import DifficultyHead

    class GateReadsMore(DifficultyHead):
        def _make_ranker(self, n_features: int):
            return super()._make_ranker(n_features - gate_only)

        def _fit_gate(self, X, anchor, w):
            if gate_fixed is None:
                return super()._fit_gate(X, anchor, w)
            coef, bias = super()._fit_gate(X[:, :-gate_only], anchor, w)
            return (None, 0.0) if coef is None else (np.concatenate([coef, np.full(gate_only, gate_fixed)]), bias)

    if label == "acceptable":  # the same per-source centering as the gap label, on the other target
        real = ex.source != EASY_ANCHORS
        ex = dataclasses.replace(ex, y_gap=ex.y_gap.copy())
        ex.y_gap[real] = unacceptable_share(ex.subset(real))
    y, w, anchor = anchored_rank_targets(ex, cfg)
    head = (GateReadsMore if gate_only else DifficultyHead)(
        n_embedding=384, kind=cfg.head, alpha=cfg.alpha, n_folds=0, scale=cfg.scale, **(gate or {"gate_weight": 0.0}))
    return head.fit(X, y, w, easy_anchor=anchor)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--pooling", choices=POOLINGS, default=TrainConfig.pooling,
                    help="how the embedding pools the query (estimator.head_inputs)")
    ap.add_argument("--labels", default="gap,acceptable", help="ranking labels to compare, comma-separated")
    ap.add_argument("--gate-reads", default="", metavar="NAMES",
                    help="also measure each gate reading these of SPECIALISED_NAMES (comma-separated, or 'all') "
                         "beside the head input, which the ranker does not read")
    ap.add_argument("--gate-fixed", type=float, default=None, metavar="BETA",
                    help="with --gate-reads: the gate's coefficient on each of those inputs fixed at BETA, not learned")
    args = ap.parse_args()
    extra = list(SPECIALISED_NAMES) if args.gate_reads == "all" else [n for n in args.gate_reads.split(",") if n]
    if set(extra) - set(SPECIALISED_NAMES):
        ap.error(f"--gate-reads: names among {', '.join(SPECIALISED_NAMES)} or 'all'")
    cols = [SPECIALISED_NAMES.index(n) for n in extra]
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
    special = Specialised(inputs)

    def spec(features: list) -> np.ndarray:
        return special.matrix(features)[:, cols] if cols else np.zeros((len(features), 0), dtype=np.float32)

    suites, suites_extra = {}, {}
    for name in ("sanity", str(Path(__file__).resolve().parents[1] / "datasets" / "sanity_holdout_pairs.jsonl")):
        pairs = read_pairs(name)
        sides = [[features_for_messages(messages_of(getattr(p, side)), est.tokenizer) for p in pairs]
                 for side in ("easy", "hard")]
        suites[name] = tuple(inputs.matrix(f) for f in sides)
        suites_extra[name] = tuple(spec(f) for f in sides)
    ae = build_examples([get_source(n) for n in AE], tokenizer=est.tokenizer)
    X_ae = head_inputs(built, ae, cache, cfg.blocks, cfg.pooling)
    E_all, E_ae = spec(both.features), spec(ae.features)

    def measure(gate: dict[str, float] | None, label: str, gate_reads_more: bool = False) -> dict[str, float]:
        keep = np.ones(len(both), dtype=bool) if gate else both.source != EASY_ANCHORS
        k = len(cols) if gate_reads_more else 0

        def x(a: np.ndarray, b: np.ndarray) -> np.ndarray:
            return np.hstack([a, b]) if k else a

        X = x(X_all, E_all)
        out: dict[str, float] = {}
        head = _head(cfg, both.subset(keep), X[keep], gate, label, k, args.gate_fixed)
        for name in suites:
            d = head.decision_function(x(suites[name][1], suites_extra[name][1])) \
                - head.decision_function(x(suites[name][0], suites_extra[name][0]))
            out["sanity" if name == "sanity" else "holdout"] = float(np.mean(d > 0) + 0.5 * np.mean(d == 0))
        for held in ("arena_bench_v1", "routellm_mtbench"):
            train = keep & (both.source != held)
            h = _head(cfg, both.subset(train), X[train], gate, label, k, args.gate_fixed)
            m = chat.source == held
            out[held] = apgr(chat.weak_score[m], chat.strong_score[m], h.decision_function(X[: len(chat)][m]))
        out["loco"] = (out["arena_bench_v1"] + out["routellm_mtbench"]) / 2
        out["criterion"] = (out["sanity"] + out["loco"]) / 2
        out["alpacaeval_apgr"] = apgr(ae.weak_score, ae.strong_score, head.decision_function(x(X_ae, E_ae)))
        return out

    rows = []
    for label in args.labels.split(","):
        rows.append((f"{label}, no anchors", measure(None, label)))
        for weight, shift, alpha in itertools.product(*GRID.values()):
            gate = {"gate_weight": weight, "gate_shift": shift, "gate_alpha": alpha}
            rows.append((f"{label}, gate w{weight:g} s{shift:g} a{alpha:g}", measure(gate, label)))
            if cols:
                rows.append((f"{label}, gate+spec w{weight:g} s{shift:g} a{alpha:g}", measure(gate, label, True)))
            print(rows[-1][0], flush=True, file=sys.stderr)
    if args.json:
        print(json.dumps({name: r for name, r in rows}, indent=2))
        return
    print(f"pooling: {cfg.pooling}" + (f"; gate+spec reads {','.join(extra)}" if extra else ""))
    print(f"{'candidate':36s} {'sanity':>7s} {'arena':>7s} {'mtbench':>7s} {'loco':>7s} {'criterion':>9s} {'AE apgr':>8s} "
          f"{'holdout':>8s}")
    for name, r in sorted(rows, key=lambda kv: -kv[1]["criterion"]):
        print(f"{name:36s} {r['sanity']:7.4f} {r['arena_bench_v1']:7.4f} {r['routellm_mtbench']:7.4f} {r['loco']:7.4f} "
              f"{r['criterion']:9.4f} {r['alpacaeval_apgr']:8.4f} {r['holdout']:8.4f}")


if __name__ == "__main__":
    main()
