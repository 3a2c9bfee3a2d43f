#!/usr/bin/env python
"""Token counts against the real tokenizers available offline, per category of text.

For each category of ``scripts/token_texts.py`` (and, with ``POINTSMAN_SHARED_DATASETS`` set, real English
answers of AlpacaEval), at each ``--chars`` size, ``--seeds`` texts: the ratio to the largest real count
(o200k, cl100k, Claude's, DeepSeek-V3's) of

- ``vocab``: the estimator's count (``RequestFeatures.prompt_tokens``, WordPiece; what priced requests before);
- ``billed``: ``billed_tokens`` (``RequestFeatures.billed_prompt_tokens``: what prices them now);
- ``upper``: the context-window bound (``prompt_tokens_upper``);

as min / median / max over the texts, one user message each (its chat overhead taken off), and the real
tokenizers' tokens per character. ``--fit`` instead fits ``billed_tokens.WEIGHTS`` (``fit``: a linear program, the
larger of the vocabulary count and the weighted byte-class counts at or above 1.03x the largest real count on
every text but English-like ones, where 0.9x is the floor and each shortfall is penalised; least overshoot,
English and code weighted most) on seeds other than the measured ones, and prints the weights (~3 min).

    python scripts/measure_token_counts.py [--chars 2000 60000] [--seeds 5] [--fit]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
sys.path.insert(0, str(Path(__file__).parent))

import numpy as np  # noqa: E402
from token_texts import CATEGORIES, reference_tokenizers  # noqa: E402

from pointsman.estimator.billed_tokens import WEIGHTS, byte_class_counts  # noqa: E402
from pointsman.estimator.features import TOKENS_PER_MESSAGE, count_tokens, extract_features  # noqa: E402
from pointsman.estimator.model_source import load_estimator  # noqa: E402
from pointsman.request import request_from_prompt  # noqa: E402

#: Categories where the vocabulary count knows the words: 0.9x is their floor in the fit, not 1.0x.
ENGLISH_LIKE = {"english": 5, "alpacaeval english": 5, "code": 3, "repo code": 3, "json": 2, "french german spanish": 2}


def alpaca_english(n: int, seed: int) -> list[str]:
    root = os.environ.get("POINTSMAN_SHARED_DATASETS")
    path = Path(root or "") / "alpacaeval" / "model_outputs_long.csv.gz"
    if not root or not path.exists():
        return []
    import pandas as pd
    out = pd.read_csv(path).output.dropna()
    out = out[out.str.len() > 200].sample(4 * n, random_state=seed)
    return [o for o in out if o.isascii()][:n]


def repo_code() -> list[str]:
    """This checkout's own Python (``policy/``), each file's first 6,000 characters: real code."""
    root = Path(__file__).parents[1] / "policy"
    return [p.read_text(encoding="utf-8")[:6000] for p in sorted(root.rglob("*.py"))[:200]]


def texts(sizes: list[int], seeds: range, fitting: bool = False) -> list[tuple[str, str]]:
    out = [(name, make(random.Random(seed * 1009 + n), n)) for name, make in CATEGORIES.items()
           for n in sizes for seed in seeds]
    out += [("alpacaeval english", t) for t in alpaca_english(20 * len(seeds) if fitting else 10 * len(seeds), seeds[0])]
    return out + ([("repo code", t) for t in repo_code()] if fitting else [])


def measure(args: argparse.Namespace, tokenizer, refs) -> None:
    rows: dict[str, list[tuple[float, float, float, dict[str, float]]]] = {}
    for name, text in texts(args.chars, range(1000, 1000 + args.seeds)):
        f = extract_features(request_from_prompt(text), tokenizer)
        true = {k: count(text) for k, count in refs.items()}
        top = max(true.values())
        rows.setdefault(name, []).append(((f.prompt_tokens - TOKENS_PER_MESSAGE) / top,
                                          (f.billed_prompt_tokens - TOKENS_PER_MESSAGE) / top,
                                          (f.prompt_tokens_upper - TOKENS_PER_MESSAGE) / top,
                                          {k: v / len(text) for k, v in true.items()}))
    print(f"ratio to the largest real count, min / median / max over texts of {args.chars} characters, "
          f"{args.seeds} seeds; then tokens per character of " + ", ".join(refs))
    print(f"{'category':22s} {'vocab (before)':>18s} {'billed (now)':>18s} {'upper':>18s}   per char")
    for name, r in rows.items():
        cols = [f"{min(v):.2f} {statistics.median(v):.2f} {max(v):.2f}" for v in zip(*(x[:3] for x in r))]
        per = " ".join(f"{statistics.mean(x[3][k] for x in r):.2f}" for k in refs)
        print(f"{name:22s} " + " ".join(f"{c:>18s}" for c in cols) + f"   {per}")


#: Weights not fitted (the texts have none of what they count: ``billed_tokens.WEIGHTS``), and lower bounds.
FIXED = ("controls", "space_repeats", "newline_repeats", "tab_repeats", "repeats")
LOWER = {"digits_after_space": 0.65}  # "0 0 0 ...": a space before a digit is a token of its own


def fit(tokenizer, refs, lam: float = 3.0, margin: float = 1.03) -> None:
    """Fit ``WEIGHTS`` on 30 seeds x 200, 800, 3,000 characters of every category: at or above ``margin`` x the
    real count wherever the vocabulary count is below it (0.9x for ``ENGLISH_LIKE``, whose shortfall below 1.0x
    costs ``lam`` x its overshoot's weight; a text under 60 tokens gets 2 tokens of slack), least weighted
    overshoot of ``max(vocabulary count, estimate)``."""
    from scipy.optimize import linprog
    from scipy.sparse import csr_matrix, hstack, identity, vstack
    names = list(WEIGHTS)
    data = texts([200, 800, 3000], range(30), fitting=True)
    X = np.array([[byte_class_counts(t)[k] for k in names] for _, t in data])
    y = np.array([max(c(t) for c in refs.values()) for _, t in data], dtype=float)
    vocab = np.array([count_tokens(t, tokenizer) for _, t in data], dtype=float)
    cats = [c for c, _ in data]
    share = {c: cats.count(c) for c in set(cats)}
    w = np.array([ENGLISH_LIKE.get(c, 0.5) * 100 / share[c] for c in cats])
    n, k = X.shape
    need = vocab < y  # where the vocabulary count alone is short, the byte classes must cover it
    m, yn = int(need.sum()), y[need]
    soft = np.array([c in ENGLISH_LIKE for c, short in zip(cats, need) if short])
    floor = np.where(soft, 0.9, margin) * yn - np.where(yn < 60, 2, 0)
    xn = csr_matrix(X[need])
    a = vstack([hstack([csr_matrix(X), -identity(n), csr_matrix((n, m))]),  # t >= X w
                hstack([-xn, csr_matrix((m, n)), -identity(m)]),  # shortfall s >= y - X w
                hstack([-xn, csr_matrix((m, n)), csr_matrix((m, m))])])  # X w >= floor
    b = np.concatenate([np.zeros(n), -yn, -floor])
    cost = np.concatenate([np.zeros(k), w / y, lam * np.where(soft, 1.0, 0.0) * w[need] / yn])
    bounds = [(WEIGHTS[nm], WEIGHTS[nm]) if nm in FIXED else (LOWER.get(nm, 0), None) for nm in names]
    bounds += [(v, None) for v in vocab] + [(0, None)] * m
    res = linprog(cost, A_ub=a, b_ub=b, bounds=bounds, method="highs")
    print("fitted weights:", {name: round(float(v), 3) for name, v in zip(names, res.x[:k])})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chars", type=int, nargs="+", default=[2000, 60000])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--fit", action="store_true")
    args = parser.parse_args()
    refs = reference_tokenizers()
    if not refs:
        raise SystemExit("no real tokenizer available offline (litellm, tiktoken, tokenizers)")
    tokenizer = load_estimator("bundled").tokenizer
    fit(tokenizer, refs) if args.fit else measure(args, tokenizer, refs)


if __name__ == "__main__":
    main()
