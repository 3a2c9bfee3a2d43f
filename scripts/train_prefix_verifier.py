"""The verifier on draft prefixes: APGR by prefix length N, for the shipped heuristic and for a
head trained on prefixes of permissively licensed answers.

    .venv/bin/python scripts/train_prefix_verifier.py                  # evaluate (about 3 min, 2 cores)
    .venv/bin/python scripts/train_prefix_verifier.py --out DIR        # also export the trained head to DIR

Training data (Apache-2.0, may ship): Arena-Bench-V1 (``arena_bench_v1``): the answers of its 6
weak models (``datasets.sources``) to 300 Chatbot-Arena prompts, each labelled "lost" where its
GPT-4 single grade is below the strong model's (2 strong models: 12 pairs), every answer cut to
its first N tokens for each N of ``PREFIXES`` and also whole (``estimator.draft.draft_prefix``: the
first 4N characters, ``partial``), so one head scores any prefix a gateway sends; ``p_hard`` from
the bundled difficulty model (which trained on these prompts: in sample for this table).
With ``--out`` the head (``training.verifier.fit_verifier``) is exported there (``verifier.onnx``
+ ``verifier.json``, servable as ``POINTSMAN_VERIFIER=DIR``). It is not shipped: held out it ranks
below the heuristic (docs/cascade.md, "Early verification").

Evaluation, per N (same run):
- **held out**: AlpacaEval 1.0, llama-2-7b-chat-hf's answers vs gpt4_1106_preview (CC BY-NC:
  evaluation only, never trained on; the bundled difficulty model never saw it either), each draft
  cut to N: APGR of the trained head, of the shipped heuristic (v2: a partial draft's length reads as
  a typical answer's) and of v1 (every prefix read as a short answer), of the prompt alone
  (``p_hard``), and the share of drafts each heuristic scores ``p_bad >= 0.6`` (``cascade.yaml``'s
  doubtful-draft threshold: what a fixed rule escalates);
- **cross-validated on the training table**: 5 folds by prompt (a prompt's 12 pairs and every
  prefix of its answers in one fold), the head refitted per fold: pooled APGR per N over the pairs.
"""

from __future__ import annotations

import json
from pathlib import Path

import click
import numpy as np

from pointsman.datasets.sources import get_source, shared_datasets_dir
from pointsman.estimator.draft import FEATURE_NAMES
from pointsman.estimator.model_source import load_estimator
from pointsman.estimator.verifier import HeuristicVerifier, OnnxVerifier
from pointsman.training.draft_eval import draft_matrix
from pointsman.training.metrics import apgr, roc_auc, weak_worse
from pointsman.training.model_dir import PARITY_ATOL
from pointsman.training.verifier import export_verifier, fit_verifier, verifier_use

#: Prefix lengths (tokens) the head learns and is evaluated at; None = the whole draft.
PREFIXES: tuple[int | None, ...] = (16, 32, 64, 128, 256, None)


def _name(n: int | None) -> str:
    return "whole" if n is None else str(n)


@click.command()
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Export the trained head to this directory (default: not exported).")
@click.option("--folds", default=5, show_default=True)
@click.option("--seed", default=0, show_default=True)
def main(out: Path | None, folds: int, seed: int) -> None:
    root = shared_datasets_dir()
    estimator = load_estimator("bundled")
    arena = get_source("arena_bench_v1")
    arena_drafts = root / "arena_bench_v1" / "model_outputs_long.csv.gz"
    pairs = [(w, s) for w in arena.weak for s in arena.strong]
    xs, ys, ws, ss, groups, ns = [], [], [], [], [], []
    for n in PREFIXES:
        for weak, strong in pairs:
            x, w, s, _, ids = draft_matrix(estimator, arena.path(), weak, strong, arena_drafts, prefix_tokens=n)
            xs.append(x)
            ys.append(weak_worse(w, s))
            ws.append(w)
            ss.append(s)
            groups += ids
            ns += [_name(n)] * len(ids)
    x, y, w_all, s_all = np.vstack(xs), np.concatenate(ys), np.concatenate(ws), np.concatenate(ss)
    group, n_of = np.asarray(groups), np.asarray(ns)
    click.echo(f"training rows: {len(y)} ({len(pairs)} pairs x {len(PREFIXES)} prefix settings), lost {y.mean():.1%}")

    # cross-validation by prompt on the training table
    prompts = np.unique(group)
    fold_of = dict(zip(np.random.default_rng(seed).permutation(prompts), np.arange(len(prompts)) % folds))
    row_fold = np.asarray([fold_of[g] for g in group])
    cv = np.empty(len(y))
    for k in range(folds):
        test = row_fold == k
        cv[test] = fit_verifier(x[~test], y[~test]).predict_proba(x[test])[:, 1]

    head = fit_verifier(x, y)
    if out is not None:
        provenance: dict[str, object] = {
            "table": str(arena.path()), "license": arena.license, "drafts": str(arena_drafts),
            "pairs": [list(p) for p in pairs], "prefix_tokens": [_name(n) for n in PREFIXES], "rows": int(len(y)),
            "positives": int(y.sum()), "p_hard": "bundled model (in sample for this table)",
            "use": verifier_use(arena.license), "script": "scripts/train_prefix_verifier.py"}
        export_verifier(head, out, provenance)
        served = OnnxVerifier(out)
        parity = float(np.max(np.abs(served.p_bad_batch(x) - head.predict_proba(x.astype(np.float64))[:, 1])))
        if parity > PARITY_ATOL:
            raise click.ClickException(f"ONNX head disagrees with scikit-learn by {parity:.2e}")
        click.echo(f"exported {served.version} to {out} (ONNX parity {parity:.1e})")

    ae = get_source("alpacaeval_ae1")
    ae_drafts = root / "alpacaeval" / "model_outputs_long.csv.gz"
    heuristic = HeuristicVerifier()
    v1_partial = FEATURE_NAMES.index("partial")

    def score_v1(v: np.ndarray) -> float:  # v1 read a prefix's length as it is: the partial flag had weight 0
        return heuristic.p_bad_vector(np.where(np.arange(len(v)) == v1_partial, 0.0, v))
    rows: dict[str, dict[str, float]] = {}
    click.echo(f"\n{'N tokens':>8} | held out: AlpacaEval {ae.weak[0]} vs {ae.strong[0]}: APGR heuristic v2 / v1 / "
               f"arena head / prompt only; share p_bad >= 0.6 v2 / v1 | Arena-Bench CV by prompt: APGR head (AUC)")
    for n in PREFIXES:
        xa, wa, sa, p_hard, _ = draft_matrix(estimator, ae.path(), ae.weak[0], ae.strong[0], ae_drafts, prefix_tokens=n)
        ya = weak_worse(wa, sa)
        h = head.predict_proba(xa.astype(np.float64))[:, 1]
        hh = np.array([heuristic.p_bad_vector(v) for v in xa])
        h1 = np.array([score_v1(v) for v in xa])
        mine = n_of == _name(n)
        # pooled over the 12 pairs: each pair's rows are one weak model's drafts against one strong model
        cv_apgr = float(np.mean([apgr(w_all[mine & (pair_idx == i)], s_all[mine & (pair_idx == i)],
                                      cv[mine & (pair_idx == i)]) for i in range(len(pairs))])) \
            if (pair_idx := _pair_index(len(pairs), [len(v) for v in ys])) is not None else float("nan")
        rows[_name(n)] = {"heldout_apgr_head": apgr(wa, sa, h), "heldout_apgr_heuristic": apgr(wa, sa, hh),
                          "heldout_apgr_heuristic_v1": apgr(wa, sa, h1),
                          "share_p_bad_06_v2": float((hh >= 0.6).mean()), "share_p_bad_06_v1": float((h1 >= 0.6).mean()),
                          "heldout_apgr_prompt": apgr(wa, sa, p_hard), "heldout_auc_head": roc_auc(ya, h),
                          "heldout_n": int(len(ya)), "cv_apgr_head_mean_over_pairs": cv_apgr,
                          "cv_auc_head": roc_auc(y[mine], cv[mine])}
        r = rows[_name(n)]
        click.echo(f"{_name(n):>8} | {r['heldout_apgr_heuristic']:.3f} / {r['heldout_apgr_heuristic_v1']:.3f} / "
                   f"{r['heldout_apgr_head']:.3f} / {r['heldout_apgr_prompt']:.3f}; {r['share_p_bad_06_v2']:.1%} / "
                   f"{r['share_p_bad_06_v1']:.1%} (n={r['heldout_n']}) | "
                   f"{r['cv_apgr_head_mean_over_pairs']:.3f} ({r['cv_auc_head']:.3f})")
    click.echo("\n" + json.dumps(rows, indent=1))


def _pair_index(n_pairs: int, sizes: list[int]) -> np.ndarray:
    """Which of the ``n_pairs`` pairs each stacked row belongs to (blocks in order, repeated per prefix)."""
    return np.concatenate([np.full(size, i % n_pairs) for i, size in enumerate(sizes)])


if __name__ == "__main__":
    main()
