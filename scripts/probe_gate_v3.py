#!/usr/bin/env python
"""Issue 21, after v3.1: can the easy-anchor gate, the ranking label or a MiniLM second stage do better on the
criterion that chose v3.1 (``scripts/select_recipe_v3.py``: mean of the sanity suite's concordance and
leave-one-chat-source-out APGR; AlpacaEval and the holdout suite printed for the record, never chosen on)?

Every candidate is v3.1's head taken apart: the ranker (the shipped logistic head without a gate, on the
shipped head inputs, trained on the chat sources only) and a linear gate (``DifficultyHead._fit_gate``,
substantive vs easy anchor) whose penalty ``w * softplus(-(g + s))`` lowers the ranker's log-odds, exactly
as ``estimator.head`` does; the Platt map is increasing, so it is left out. Families (``--family``):

- ``reads``: what the gate reads: the shipped head input; the embedding alone; without the length columns;
  with the word-rarity block (``estimator.conversation.RARITY_NAMES``) that the ranker does not read; gate
  L2 penalty 30 or 300 instead of 100.
- ``ranker``: the ranker's L2 penalty 1,000 or 10,000 instead of 3,000; the ranker reading the easy anchors
  too (label 0.02), together weighing 5% or 20% of the chat rows.
- ``rows``: more substantive rows for the gate only: MMLU question stems (RouteLLM's table, Apache-2.0; the
  text before the options) that the weak model (Mixtral-8x7B) answered wrongly, 1,000 drawn, weighing 1/4 or
  1/2 of the substantive side; all subjects, or college/professional-level ones.
- ``labels``: the ranker's label: v3.1's graded gap; the share of Arena-Bench-V1's 12 panel models
  (``OutcomeSource.panel``) graded below 7 of 10 (``ACCEPTABLE_GRADE``); Rasch item difficulty fitted over
  the same 12 graded non-frontier models (acceptable = grade >= 7; ``sigmoid(b_item - mean ability)``); the
  weak models' unacceptable share (``select_recipe_v3``'s ``acceptable``); the gap counted only beyond a
  margin of 1 or 2 grade points (near-ties acceptable); the panel and Rasch labels also half-and-half with the gap.
  MT-bench has one weak model: only the margin and weak-share labels change its rows.
- ``anslen``: the ranker's label from the length of answer a prompt calls for (Arena-Bench-V1's answers of
  17 models, ``model_outputs_long.csv.gz``, Apache-2.0; lengths in the static encoder's WordPiece tokens):
  the median log answer length of the 8 stronger models (``STRONGER``: GPT-4 x2, GPT-3.5 x2, Claude x3,
  Mixtral); the same minus the prompt's log length; the median log length of the answers graded acceptable
  (7+; the stronger models' where none is). Each as a within-source percentile in (0, 1), alone or mixed
  with the gap (weights 0.25 / 0.5), or as a second ranker on Arena's rows alone whose log-odds, times
  ``beta``, are added to v3.1's. MT-bench has no answers in ``../shared`` (verdicts only), so its rows keep
  the gap label, and the fold that holds Arena-Bench-V1 out never sees a length label: its LOCO APGR is
  v3.1's by construction; the candidates differ in the suites, MT-bench LOCO and AlpacaEval.
- ``stage2``: a second-stage gate on all-MiniLM-L6-v2's embedding (the first 32 tokens, ⊕ the request
  features), run only for queries of at most 32 tokens whose static gate penalty exceeds ``tau``; its
  penalty replaces the static one, or the smaller (the safe side) or the mean of the two is kept. Prints
  the share of requests that take it (AlpacaEval and chat prompts as traffic). Needs the MiniLM encoder
  (built and cached like ``pointsman train --encoder minilm``).

- ``nonlinear``: non-linear gates in place of the logistic one, fitted on the same rows and weights per held-out
  source, each model's score mapped to g by a Platt fit on its inner out-of-fold scores: gradient boosting (on
  the head input, or 32 embedding PCs + the request features), an MLP (16 or 32 hidden units, 3 seeds averaged);
  also the logistic gate Platt-mapped, and the logistic gate plus log_query_chars x the first 4/8/16 embedding PCs.

``failures`` lists the sanity pairs v3.1 orders wrongly, with each side's ranker log-odds and gate penalty.

    nice -n 10 python scripts/probe_gate_v3.py --family reads|ranker|rows|labels|anslen|stage2|nonlinear|failures [--json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from select_recipe_v3 import ACCEPTABLE_GRADE, AE  # noqa: E402

from pointsman.data_dir import data_dir  # noqa: E402
from pointsman.datasets.outcome_tables import OutcomeTable, read_outcome_table  # noqa: E402
from pointsman.datasets.sources import OutcomeSource, default_training_sources, get_source, shared_datasets_dir  # noqa: E402
from pointsman.estimator.difficulty import DifficultyEstimator  # noqa: E402
from pointsman.estimator.head import DifficultyHead  # noqa: E402
from pointsman.estimator.head_inputs import HeadInputs  # noqa: E402
from pointsman.estimator.markers import FEATURE_NAMES  # noqa: E402
from pointsman.estimator.model_source import bundled_model_dir  # noqa: E402
from pointsman.training.examples import EASY_ANCHORS, Examples, anchor_examples, build_examples, features_for_messages  # noqa: E402
from pointsman.training.metrics import apgr  # noqa: E402
from pointsman.training.recipe import TrainConfig  # noqa: E402
from pointsman.training.sanity import messages_of, read_pairs  # noqa: E402
from pointsman.training.train import anchored_rank_targets, build_encoder  # noqa: E402

GRID = ((1.0, 1.0), (2.0, 1.0), (2.0, 2.0), (4.0, 2.0), (4.0, 3.0))
HELD = ("arena_bench_v1", "routellm_mtbench")
HOLDOUT = str(Path(__file__).resolve().parents[1] / "datasets" / "sanity_holdout_pairs.jsonl")
LENGTH_COLUMNS = ("log_prompt_tokens", "log_query_chars", "log_lines", "log_paragraphs", "log_numbers")
WEAK = "mistralai/Mixtral-8x7B-Instruct-v0.1"
COLLEGE = ("college", "professional", "abstract", "formal", "electrical", "machine", "econometrics", "astronomy",
           "virology", "medical", "anatomy", "prehistory", "international", "jurisprudence")
STAGE2_TOKENS = 32


@dataclass
class Sets:
    """Head inputs (and anything a gate reads) of every scored set: training rows, suites, AlpacaEval."""

    train: np.ndarray
    sanity: tuple[np.ndarray, np.ndarray]
    holdout: tuple[np.ndarray, np.ndarray]
    ae: np.ndarray


def _softplus(x: np.ndarray) -> np.ndarray:
    return np.asarray(np.logaddexp(0.0, x), dtype=np.float64)


def _times(x: np.ndarray | tuple[np.ndarray, np.ndarray], cols: np.ndarray) -> Any:
    """``x`` (or each array of a pair) with its columns multiplied by ``cols`` (0 drops a column from a gate)."""
    return tuple(a * cols for a in x) if isinstance(x, tuple) else x * cols


def _per_source(ex: Examples, fn: Callable[[OutcomeSource, OutcomeTable], np.ndarray | None]) -> np.ndarray:
    """``ex.y_gap`` with each source's rows replaced by ``fn(source, table)`` per prompt where it answers."""
    out = ex.y_gap.astype(np.float64).copy()
    for name in np.unique(ex.source):
        if name == EASY_ANCHORS:
            continue
        src = get_source(str(name))
        table = read_outcome_table(src.path())
        val = fn(src, table)
        if val is None:
            continue
        row = {pid: i for i, pid in enumerate(table.prompt_ids)}
        m = ex.source == name
        out[m] = [val[row[pid]] for pid in ex.prompt_id[m]]
    return out


def _unacceptable(table: OutcomeTable, cols: tuple[str, ...] | list[str]) -> np.ndarray:
    sc = np.stack([table.scores(c) for c in cols], axis=1)
    with np.errstate(invalid="ignore"):
        return np.asarray(np.nanmean(np.where(np.isnan(sc), np.nan, sc < ACCEPTABLE_GRADE), axis=1))


def _rasch(src: OutcomeSource, table: OutcomeTable) -> np.ndarray | None:
    """P(a model of mean ability is not acceptable) per prompt, from a Rasch model over the graded
    non-frontier models (llama-13b, a base model, left out)."""
    from sklearn.linear_model import LogisticRegression

    if not src.panel:
        return None
    cols = [c for c in table.model_columns if c not in src.strong and c != "llama-13b"]
    sc = np.stack([table.scores(c) for c in cols], axis=1)
    n, k = sc.shape
    items, models = np.nonzero(~np.isnan(sc))
    design = np.zeros((len(items), n + k))
    design[np.arange(len(items)), items] = -1.0
    design[np.arange(len(items)), n + models] = 1.0
    ok = (sc[items, models] >= ACCEPTABLE_GRADE).astype(np.int64)
    coef = LogisticRegression(C=1.0, fit_intercept=False, max_iter=5000).fit(design, ok).coef_[0]
    return np.asarray(1.0 / (1.0 + np.exp(-(coef[:n] - coef[n:].mean()))))


def _margin_gap(margin: float) -> Callable[[OutcomeSource, OutcomeTable], np.ndarray]:
    def fn(src: OutcomeSource, table: OutcomeTable) -> np.ndarray:
        weak = np.stack([table.scores(c) for c in src.weak], axis=1)
        strong = np.stack([table.scores(c) for c in src.strong], axis=1)
        d = (strong[:, None, :] - weak[:, :, None]).reshape(len(weak), -1)
        with warnings.catch_warnings():  # a prompt no pair graded: NaN, read as 0.5
            warnings.simplefilter("ignore", RuntimeWarning)
            share = np.nanmean(np.where(np.isnan(d), np.nan, d > margin), axis=1)
        return np.asarray(np.nan_to_num(share, nan=0.5))
    return fn


LABELS: dict[str, Callable[[OutcomeSource, OutcomeTable], np.ndarray | None]] = {
    "panel unacceptable": lambda src, table: _unacceptable(table, src.panel) if src.panel else None,
    "rasch": _rasch,
    "weak unacceptable": lambda src, table: _unacceptable(table, src.weak),
    "gap beyond 1": _margin_gap(1.0),
    "gap beyond 2": _margin_gap(2.0),
}


#: Arena-Bench-V1's models whose answers measure how much a prompt calls for: mean GPT-4 grade 6.2-8.9 of 10.
STRONGER = ("gpt-4-1106-preview", "gpt-4-0314", "gpt-3.5-turbo", "gpt-3.5-turbo-1106", "claude-1", "claude-2.1",
            "claude-instant-1", "mistralai/Mixtral-8x7B-Instruct-v0.1")


def answer_length_labels(tokenizer) -> dict[str, Callable[[OutcomeSource, OutcomeTable], np.ndarray | None]]:
    """``anslen`` labels: name -> fn(source, table) giving, for Arena-Bench-V1 (None elsewhere: no answers),
    a within-source percentile (rank - 0.5) / n in (0, 1) per prompt of the table."""
    import pandas as pd
    from scipy.stats import rankdata

    d = pd.read_csv(shared_datasets_dir() / "arena_bench_v1" / "model_outputs_long.csv.gz")
    d["log_tokens"] = np.log1p([len(e.ids) for e in tokenizer.encode_batch([str(o) for o in d.output],
                                                                            add_special_tokens=False)])
    lengths = d.pivot(index="prompt_id", columns="model", values="log_tokens")

    def pct(v: np.ndarray) -> np.ndarray:
        return np.asarray((rankdata(v) - 0.5) / len(v))

    def stronger(table: OutcomeTable) -> np.ndarray:
        return np.asarray(lengths.loc[list(table.prompt_ids), list(STRONGER)].median(axis=1))

    def over_prompt(table: OutcomeTable) -> np.ndarray:
        prompts = np.log1p([len(e.ids) for e in tokenizer.encode_batch([str(x) for x in table.frame["prompt"]],
                                                                        add_special_tokens=False)])
        return stronger(table) - prompts

    def acceptable(table: OutcomeTable) -> np.ndarray:
        cols = [c for c in table.model_columns if c in lengths.columns]
        ok = np.stack([table.scores(c) >= ACCEPTABLE_GRADE for c in cols], axis=1)
        L = lengths.loc[list(table.prompt_ids), cols].to_numpy()
        with warnings.catch_warnings():  # no acceptable answer: the stronger models' median
            warnings.simplefilter("ignore", RuntimeWarning)
            med = np.nanmedian(np.where(ok, L, np.nan), axis=1)
        return np.where(np.isnan(med), stronger(table), med)

    def only_arena(fn: Callable[[OutcomeTable], np.ndarray]) -> Callable[[OutcomeSource, OutcomeTable], np.ndarray | None]:
        return lambda src, table: pct(fn(table)) if src.name == "arena_bench_v1" else None

    return {"answer length": only_arena(stronger), "answer length / prompt length": only_arena(over_prompt),
            "acceptable answers' length": only_arena(acceptable)}


def mmlu_stems(college: bool, n: int = 1000, seed: int = 0) -> list[str]:
    """Question stems (before the options) of RouteLLM's MMLU rows the weak model answered wrongly."""
    import pandas as pd

    d = pd.read_csv(shared_datasets_dir() / "routellm" / "mmlu_mixtral_vs_gpt4.csv.gz")
    d = d[d[WEAK] == 0]
    if college:
        d = d[d.category.str.startswith(COLLEGE)]
    texts = [t for t in (str(p).split("\nA.")[0].strip() for p in d.prompt) if 10 <= len(t) <= 600]
    pick = np.random.default_rng(seed).choice(len(texts), size=min(n, len(texts)), replace=False)
    return [texts[i] for i in pick]


class Probe:
    """The shipped layout's rows, suites and AlpacaEval, and v3.1's ranker and gate taken apart."""

    def __init__(self) -> None:
        self.cfg = TrainConfig(encoder_from=str(bundled_model_dir()))
        sources = default_training_sources(self.cfg.sources)
        cache = data_dir() / "cache"
        self.built = build_encoder(self.cfg, sources, cache)
        self.est = DifficultyEstimator(bundled_model_dir())
        self.chat = build_examples(sources, tokenizer=self.est.tokenizer)
        self.rows = self.chat.concat(anchor_examples(self.est.tokenizer))
        self.inputs = HeadInputs(self.est.encoder, self.cfg.blocks, self.cfg.pooling)
        self.ae = build_examples([get_source(n) for n in AE], tokenizer=self.est.tokenizer)
        self.feats = {
            "train": self.rows.features, "ae": self.ae.features,
            **{f"{name}/{side}": [features_for_messages(messages_of(getattr(p, side)), self.est.tokenizer)
                                  for p in read_pairs(spec)]
               for name, spec in (("sanity", "sanity"), ("holdout", HOLDOUT)) for side in ("easy", "hard")},
        }
        self.X = self.sets(lambda f: self.inputs.matrix(f))
        self.real = self.rows.source != EASY_ANCHORS
        self.n_chat = len(self.chat)
        self._rankers: dict[tuple[str, str], DifficultyHead] = {}
        self.labels = dict(LABELS)

    def sets(self, make: Callable[[list], np.ndarray]) -> Sets:
        f = self.feats
        return Sets(make(f["train"]), (make(f["sanity/easy"]), make(f["sanity/hard"])),
                    (make(f["holdout/easy"]), make(f["holdout/hard"])), make(f["ae"]))

    def label(self, name: str, mix: float) -> Examples:
        if name == "gap":
            return self.rows
        y = _per_source(self.rows, self.labels[name])
        return dataclasses.replace(self.rows, y_gap=mix * y + (1.0 - mix) * self.rows.y_gap)

    def ranker(self, label: str, mix: float, held: str, alpha: float = 3000.0, anchor_share: float = 0.0) -> DifficultyHead:
        """The ranker without ``held``; with ``anchor_share`` > 0 it also reads the easy anchors (label
        ``label_clip``), weighing that share of the other rows together."""
        key = (f"{label}/{mix}/{alpha}/{anchor_share}", held)
        if key not in self._rankers:
            ex = self.label(label, mix)
            keep = (self.real | (anchor_share > 0)) & (ex.source != held)
            y, w, anchor = anchored_rank_targets(ex.subset(keep), self.cfg)
            if anchor_share > 0:
                y[anchor], w[anchor] = self.cfg.label_clip, anchor_share * w[~anchor].sum() / anchor.sum()
            self._rankers[key] = DifficultyHead(n_embedding=384, kind=self.cfg.head, alpha=alpha, n_folds=0,
                                                scale=self.cfg.scale).fit(self.X.train[keep], y, w)
        return self._rankers[key]

    def aux_ranker(self, label: str, held: str) -> DifficultyHead | None:
        """A second ranker on Arena-Bench-V1's rows alone (the only ones with answers) with ``label``; None when
        ``held`` is that source."""
        if held == "arena_bench_v1":
            return None
        key = (f"aux/{label}", held)
        if key not in self._rankers:
            ex = self.label(label, 1.0)
            keep = ex.source == "arena_bench_v1"
            y, w, _ = anchored_rank_targets(ex.subset(keep), self.cfg)
            self._rankers[key] = DifficultyHead(n_embedding=384, kind=self.cfg.head, alpha=self.cfg.alpha, n_folds=0,
                                                scale=self.cfg.scale).fit(self.X.train[keep], y, w)
        return self._rankers[key]

    def gate(self, G: Sets, held: str, alpha: float, extra: tuple[np.ndarray, float] | None) -> tuple[np.ndarray, float]:
        keep = self.rows.source != held
        _, w, anchor = anchored_rank_targets(self.rows.subset(keep), self.cfg)
        X, a = G.train[keep], anchor
        if extra is not None:  # substantive rows for the gate only, weighing `share` of that side
            rows, share = extra
            w_extra = np.full(len(rows), share / (1.0 - share) * w[~anchor].sum() / len(rows))
            X, a, w = np.vstack([X, rows]), np.concatenate([a, np.zeros(len(rows), dtype=bool)]), np.concatenate([w, w_extra])
        coef, bias = DifficultyHead(gate_alpha=alpha)._fit_gate(X, a, w)
        assert coef is not None
        return coef, bias

    def measure(self, weight: float, shift: float, *, label: str = "gap", mix: float = 1.0, G: Sets | None = None,
                alpha: float = 100.0, extra: tuple[np.ndarray, float] | None = None,
                stage2: tuple[Sets, Sets, str, float] | None = None, ranker_alpha: float = 3000.0,
                anchor_share: float = 0.0, aux: tuple[str, float] | None = None,
                gate_fn: Callable[[str, np.ndarray], np.ndarray] | None = None) -> dict[str, float]:
        """Sanity and holdout concordance, LOCO APGR, criterion, AlpacaEval APGR of one candidate;
        ``gate_fn(held, X)``: the gate's log-odds g (n,) in place of the linear gate's (``nonlinear``)."""
        G = G or self.X

        def score(held: str, pick: Callable[[Sets], np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
            z = self.ranker(label, mix, held, ranker_alpha, anchor_share).ranker_score(pick(self.X))
            if aux is not None and (second := self.aux_ranker(aux[0], held)) is not None:
                z = z + aux[1] * second.ranker_score(pick(self.X))
            if gate_fn is None:
                coef, bias = self.gate(G, held, alpha, extra)
                pen = weight * _softplus(-(pick(G) @ coef + bias + shift))
            else:
                pen = weight * _softplus(-(gate_fn(held, pick(G)) + shift))
            took = np.zeros(len(z), dtype=bool)
            if stage2 is not None:
                M, tokens, rule, tau = stage2
                c2, b2 = self.gate(M, held, alpha, None)
                pen2 = weight * _softplus(-(pick(M) @ c2 + b2 + shift))
                took = (pick(tokens)[:, 0] <= STAGE2_TOKENS) & (pen > tau)
                pen = np.where(took, {"replace": pen2, "min": np.minimum(pen, pen2), "mean": (pen + pen2) / 2}[rule], pen)
            return z - pen, took

        out: dict[str, float] = {}
        took_suites = []
        for name in ("sanity", "holdout"):
            (easy, e_took), (hard, h_took) = (score("", lambda s, i=i: getattr(s, name)[i]) for i in (0, 1))
            d = hard - easy
            out[name] = float(np.mean(d > 0) + 0.5 * np.mean(d == 0))
            took_suites += [e_took, h_took]
        for held in HELD:
            m = np.zeros(len(self.rows), dtype=bool)
            m[: self.n_chat] = self.chat.source == held
            s, _ = score(held, lambda x: x.train[m])
            mc = m[: self.n_chat]
            out[held] = apgr(self.chat.weak_score[mc], self.chat.strong_score[mc], s)
        out["loco"] = (out["arena_bench_v1"] + out["routellm_mtbench"]) / 2
        out["criterion"] = (out["sanity"] + out["loco"]) / 2
        s, took_ae = score("", lambda x: x.ae)
        out["alpacaeval_apgr"] = apgr(self.ae.weak_score, self.ae.strong_score, s)
        if stage2 is not None:
            _, took_chat = score("", lambda x: x.train[: self.n_chat])
            out["stage2_share_ae"] = float(took_ae.mean())
            out["stage2_share_chat"] = float(took_chat.mean())
            out["stage2_share_suites"] = float(np.concatenate(took_suites).mean())
        return out


def candidates(p: Probe, family: str) -> list[tuple[str, Callable[[float, float], dict[str, float]]]]:
    """(name, measure(weight, shift)) of the family's candidates; the shipped gate comes first."""
    shipped: list[tuple[str, Callable[[float, float], dict[str, float]]]] = [
        ("shipped (gap; gate reads the head input, alpha 100)", lambda w, s: p.measure(w, s))]
    if family == "reads":
        names = [f"emb_{i}" for i in range(384)] + list(FEATURE_NAMES) + ["log_context_chars", "short_followup"]
        drop_len = np.array([n not in LENGTH_COLUMNS for n in names], dtype=np.float32)
        emb_only = np.array([n.startswith("emb_") for n in names], dtype=np.float32)
        rarity = HeadInputs(p.est.encoder, ("rarity",) + p.cfg.blocks, p.cfg.pooling)
        with_rarity = p.sets(lambda f: rarity.matrix(f))
        only_emb, no_len = (Sets(*(_times(getattr(p.X, k), cols) for k in ("train", "sanity", "holdout", "ae")))
                            for cols in (emb_only, drop_len))
        return shipped + [
            ("gate reads the embedding only", lambda w, s: p.measure(w, s, G=only_emb)),
            ("gate reads no length columns", lambda w, s: p.measure(w, s, G=no_len)),
            ("gate reads + word rarity", lambda w, s: p.measure(w, s, G=with_rarity)),
            ("gate alpha 30", lambda w, s: p.measure(w, s, alpha=30.0)),
            ("gate alpha 300", lambda w, s: p.measure(w, s, alpha=300.0)),
        ]
    if family == "ranker":
        return shipped + [(f"ranker alpha {a:g}", lambda w, s, a=a: p.measure(w, s, ranker_alpha=a)) for a in (1000.0, 10000.0)] \
            + [(f"ranker reads the anchors too, share {r:g}", lambda w, s, r=r: p.measure(w, s, anchor_share=r))
               for r in (0.05, 0.2)]
    if family == "rows":
        out = shipped
        for college in (False, True):
            stems = p.inputs.matrix([features_for_messages([{"role": "user", "content": t}], p.est.tokenizer)
                                     for t in mmlu_stems(college)])
            for share in (0.25, 0.5):
                out = out + [(f"+ MMLU stems the weak model failed ({'college-level' if college else 'all'}), "
                              f"share {share:g}", lambda w, s, x=stems, sh=share: p.measure(w, s, extra=(x, sh)))]
        return out
    if family == "labels":
        mixes = {"panel unacceptable": (1.0, 0.5), "rasch": (1.0, 0.5)}
        return shipped + [(f"label: {name}{'' if mix == 1 else ', half with the gap'}",
                           lambda w, s, n=name, m=mix: p.measure(w, s, label=n, mix=m))
                          for name in LABELS for mix in mixes.get(name, (1.0,))]
    if family == "anslen":
        length = answer_length_labels(p.est.tokenizer)
        p.labels.update(length)
        return shipped + [(f"label: {name}{'' if mix == 1 else f' x {mix:g} + gap x {1 - mix:g}'}",
                           lambda w, s, n=name, m=mix: p.measure(w, s, label=n, mix=m))
                          for name in length for mix in (1.0, 0.5, 0.25)] \
            + [(f"+ {beta:g} x a ranker of {name} (Arena rows)",
                lambda w, s, n=name, b=beta: p.measure(w, s, aux=(n, b)))
               for name in ("answer length", "acceptable answers' length") for beta in (0.5, 1.0)]
    if family == "stage2":
        from pointsman.estimator.encoders import make_encoder
        from pointsman.estimator.manifest import EncoderSpec
        from pointsman.training.encoder_build import build_minilm

        built = build_minilm(data_dir() / "cache", [f.query_text for f in p.chat.features[:200]])
        spec = EncoderSpec("minilm", built.onnx_path.name, built.tokenizer_path.name, STAGE2_TOKENS, 384,
                           built.spec.quantization, True)
        mini = make_encoder(built.onnx_path.parent, spec, intra_op_threads=2)
        M = p.sets(lambda f: np.hstack([mini.encode_batch([x.query_text for x in f]), p.inputs.matrix(f)[:, 384:]]))
        tokens = p.sets(lambda f: np.array([[len(p.est.tokenizer.encode(x.query_text, add_special_tokens=False).ids)]
                                            for x in f], dtype=np.float64))
        return shipped + [(f"stage 2 MiniLM gate, {rule}, tau {tau:g}",
                           lambda w, s, r=rule, t=tau: p.measure(w, s, stage2=(M, tokens, r, t)))
                          for rule, tau in (("replace", 0.3), ("min", 0.0), ("min", 0.3), ("mean", 0.3))]
    if family == "nonlinear":
        return shipped + nonlinear_gates(p)
    raise SystemExit(f"unknown family {family!r}")


Fit = Callable[[np.ndarray, np.ndarray, np.ndarray], Callable[[np.ndarray], np.ndarray]]


def nonlinear_gates(p: Probe) -> list[tuple[str, Callable[[float, float], dict[str, float]]]]:
    """``nonlinear``: gate models in place of the logistic gate, each fitted per held-out source on the same rows
    and weights as ``DifficultyHead._fit_gate`` (substantive 1 / anchor 0, each side summing to the same weight);
    a model's raw score becomes g by a Platt fit on its out-of-fold scores (5 stratified inner folds)."""
    from sklearn.decomposition import PCA
    from sklearn.ensemble import HistGradientBoostingClassifier
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold
    from sklearn.neural_network import MLPClassifier
    from sklearn.preprocessing import StandardScaler

    def hgb(pca: int) -> Fit:
        def fit(X: np.ndarray, y: np.ndarray, w: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
            pc = PCA(pca, random_state=0).fit(X[:, :384]) if pca else None
            f = (lambda Z: np.hstack([pc.transform(Z[:, :384]), Z[:, 384:]])) if pc else (lambda Z: Z)
            m = HistGradientBoostingClassifier(max_iter=100, max_depth=3, learning_rate=0.1, min_samples_leaf=20,
                                               l2_regularization=1.0, early_stopping=False, random_state=0)
            m.fit(f(X), y, sample_weight=w)
            return lambda Z: m.decision_function(f(Z))
        return fit

    def mlp(hidden: int, alpha: float = 1.0, seeds: int = 3) -> Fit:
        def fit(X: np.ndarray, y: np.ndarray, w: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
            sc = StandardScaler().fit(X)
            ms = [MLPClassifier((hidden,), alpha=alpha, max_iter=1000, random_state=s).fit(sc.transform(X), y, sample_weight=w)
                  for s in range(seeds)]
            return lambda Z: np.mean([np.log(np.clip(m.predict_proba(sc.transform(Z)), 1e-9, 1)) @ [-1, 1] for m in ms], axis=0)
        return fit

    def linear(k: int) -> Fit:  # the logistic gate (alpha 100), plus log_query_chars x the first k embedding PCs
        def fit(X: np.ndarray, y: np.ndarray, w: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
            pc = PCA(k, random_state=0).fit(X[:, :384]) if k else None
            f = (lambda Z: np.hstack([Z, Z[:, [385]] * pc.transform(Z[:, :384])])) if pc else (lambda Z: Z)
            coef, bias = DifficultyHead(gate_alpha=100.0)._fit_gate(f(X), y == 0, w)
            assert coef is not None
            return lambda Z: f(Z) @ coef + bias
        return fit

    def gate(fit: Fit, platt: bool) -> Callable[[str, np.ndarray], np.ndarray]:
        cache: dict[str, tuple[Callable[[np.ndarray], np.ndarray], float, float]] = {}

        def g(held: str, Z: np.ndarray) -> np.ndarray:
            if held not in cache:
                keep = p.rows.source != held
                _, w, anchor = anchored_rank_targets(p.rows.subset(keep), p.cfg)
                w = np.where(anchor, w / w[anchor].sum(), w / w[~anchor].sum()) * len(w) / 2
                X, y, a, b = p.X.train[keep], (~anchor).astype(np.int64), 1.0, 0.0
                if platt:
                    oof = np.zeros(len(y))
                    for tr, te in StratifiedKFold(5, shuffle=True, random_state=0).split(X, y):
                        oof[te] = fit(X[tr], y[tr], w[tr])(X[te])
                    lr = LogisticRegression(C=1e4).fit(oof[:, None], y, sample_weight=w)
                    a, b = float(lr.coef_[0, 0]), float(lr.intercept_[0])
                cache[held] = (fit(X, y, w), a, b)
            model, a, b = cache[held]
            return np.asarray(a * model(Z) + b)
        return g

    out = [("linear gate, Platt-calibrated out of fold", gate(linear(0), True))] \
        + [(f"linear + log_query_chars x {k} embedding PCs", gate(linear(k), False)) for k in (4, 8, 16)] \
        + [("gradient boosting (100 trees, depth 3), 32 embedding PCs + request features", gate(hgb(32), True)),
           ("MLP 16 hidden, 3 seeds", gate(mlp(16), True)), ("MLP 32 hidden, 3 seeds", gate(mlp(32), True)),
           ("gradient boosting, full input", gate(hgb(0), True))]
    return [(name, lambda w, s, g=g: p.measure(w, s, gate_fn=g)) for name, g in out]


def anslen_diagnostics(p: Probe, folds: int = 5) -> None:
    """What the answer-length labels measure, before any gate: their Spearman correlation with the gap label on
    Arena-Bench-V1; a ranker trained on Arena's rows with each (alone, no gate) scored on MT-bench and
    AlpacaEval (APGR); and Arena-Bench-V1 APGR out of ``folds`` folds (by ``group``) of the ranker trained on
    the other Arena folds with that label beside MT-bench's rows with the gap, against the gap on both."""
    from scipy.stats import spearmanr

    arena, mt = (p.chat.source == name for name in HELD)
    fold = np.unique(p.chat.group, return_inverse=True)[1] % folds
    X = p.X.train[: p.n_chat]
    for name in ["gap", *[n for n in p.labels if n not in LABELS]]:
        ex = p.label(name, 1.0).subset(np.arange(len(p.rows)) < p.n_chat)
        rho = spearmanr(ex.y_gap[arena], p.chat.y_gap[arena]).statistic
        aux = p.aux_ranker(name, "") if name != "gap" else p.ranker("gap", 1.0, "routellm_mtbench")
        assert aux is not None
        mt_apgr = apgr(p.chat.weak_score[mt], p.chat.strong_score[mt], aux.ranker_score(X[mt]))
        ae_apgr = apgr(p.ae.weak_score, p.ae.strong_score, aux.ranker_score(p.X.ae))
        oof = np.zeros(int(arena.sum()))
        for k in range(folds):
            train = ~(arena & (fold == k))
            y, w, _ = anchored_rank_targets(ex.subset(train), p.cfg)
            head = DifficultyHead(n_embedding=384, kind=p.cfg.head, alpha=p.cfg.alpha, n_folds=0,
                                  scale=p.cfg.scale).fit(X[train], y, w)
            test = arena & (fold == k)
            oof[fold[arena] == k] = head.ranker_score(X[test])
        cv = apgr(p.chat.weak_score[arena], p.chat.strong_score[arena], oof)
        print(f"  {name:32s} spearman with gap (Arena) {rho:+.3f}; ranker on Arena alone: MT-bench APGR {mt_apgr:.4f} "
              f"AE {ae_apgr:.4f}; Arena {folds}-fold APGR {cv:.4f}", flush=True)


def failures(p: Probe, weight: float = 2.0, shift: float = 2.0) -> None:
    """The sanity pairs v3.1's ranker and gate order wrongly, with each side's ranker log-odds and gate penalty."""
    ranker = p.ranker("gap", 1.0, "")
    coef, bias = p.gate(p.X, "", 100.0, None)
    pairs = read_pairs("sanity")
    (easy, hard) = p.X.sanity
    z = [ranker.ranker_score(x) for x in (easy, hard)]
    pen = [weight * _softplus(-(x @ coef + bias + shift)) for x in (easy, hard)]
    wrong = np.flatnonzero(z[1] - pen[1] <= z[0] - pen[0])
    print(f"{len(wrong)} of {len(pairs)} pairs ordered wrongly (ranker log-odds z, gate penalty g; score z - g)")
    for i in wrong:
        hard_text = str(pairs[i].hard if isinstance(pairs[i].hard, str) else pairs[i].hard[-1]["content"])
        print(f"  {pairs[i].id:18s} easy z {z[0][i]:+.2f} g {pen[0][i]:.2f} | hard z {z[1][i]:+.2f} g {pen[1][i]:.2f}  "
              f"{hard_text[:60]!r}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--family", required=True,
                    choices=("reads", "ranker", "rows", "labels", "anslen", "stage2", "nonlinear", "failures"))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    p = Probe()
    if args.family == "failures":
        failures(p)
        return
    rows = []
    family = candidates(p, args.family)
    if args.family == "anslen" and not args.json:
        anslen_diagnostics(p)
    for name, measure in family:
        for weight, shift in GRID:
            r = measure(weight, shift)
            rows.append((f"{name}, gate w{weight:g} s{shift:g}", r))
            if not args.json:
                extra = "".join(f" {k[7:]} {v:.3f}" for k, v in r.items() if k.startswith("stage2_"))
                print(f"{rows[-1][0]:78s} sanity {r['sanity']:.4f} arena {r['arena_bench_v1']:.4f} "
                      f"mt {r['routellm_mtbench']:.4f} loco {r['loco']:.4f} criterion {r['criterion']:.4f} "
                      f"AE {r['alpacaeval_apgr']:.4f} holdout {r['holdout']:.4f}{extra}", flush=True)
    if args.json:
        print(json.dumps(dict(rows), indent=2))


if __name__ == "__main__":
    main()
