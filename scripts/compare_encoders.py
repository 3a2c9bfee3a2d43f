#!/usr/bin/env python
"""Compare the two encoders of the difficulty estimator side by side.

For the static encoder (model2vec distillation of all-MiniLM-L6-v2) and the MiniLM
transformer encoder it prints: held-out APGR on the training sources (5-fold grouped
cross-validation, from the model's manifest), the transfer test on AlpacaEval ae1
(``llama-2-7b-chat-hf`` vs ``gpt4_1106_preview``: APGR, CPT(50%), CPT(80%), AUC, random
and oracle), model size, and the latency of ``estimate()`` on one onnxruntime thread at
about 32, 128 and 512 tokens and for a 100,000-token prompt (p50/p99 over repeated calls;
``features+estimate`` adds ``extract_features``, the request-feature step that precedes
it in a decision).

Usage::

    .venv/bin/python scripts/compare_encoders.py [--static DIR] [--minilm DIR] [--repeats N]

Missing model directories are trained first (``pointsman train --encoder KIND --output DIR
--no-mlflow``; defaults under ``$POINTSMAN_DATA_DIR/compare``). The static one defaults to
the shipped ``estimator/default_model``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from pointsman.data_dir import data_dir  # noqa: E402
from pointsman.datasets.sources import shared_datasets_dir  # noqa: E402
from pointsman.estimator.features import extract_features  # noqa: E402
from pointsman.estimator.model_source import bundled_model_dir, load_estimator
from pointsman.request import request_from_prompt  # noqa: E402

AE_TABLE = "alpacaeval/ae1_judge-gpt4_ref-text_davinci_003.csv.gz"
WEAK, STRONG = "llama-2-7b-chat-hf", "gpt4_1106_preview"
TEXT = (
    "Our team is migrating a billing service from a monolith to event-driven microservices. "
    "Explain how to keep invoices consistent when payments, refunds and currency conversions "
    "arrive out of order, and sketch the data model, the idempotency keys and the retry policy. "
)


def prompt_of_tokens(tokenizer, n_tokens: int) -> str:
    """A natural-language prompt of about ``n_tokens`` tokens (repeated paragraph, cut by tokens)."""
    reps = max(1, n_tokens // len(tokenizer.encode(TEXT, add_special_tokens=False).ids) + 1)
    enc = tokenizer.encode(TEXT * reps, add_special_tokens=False)
    end = enc.offsets[min(n_tokens, len(enc.offsets)) - 1][1]
    return (TEXT * reps)[:end]


def latency(est, prompt: str, repeats: int) -> dict[str, float]:
    """p50/p99 in ms of ``estimate()`` and of ``extract_features`` + ``estimate()``."""
    req = request_from_prompt(prompt)
    feats = extract_features(req, est.tokenizer)
    for _ in range(10):
        est.estimate(feats)
    only, both = [], []
    for _ in range(repeats):
        t = time.perf_counter()
        est.estimate(feats)
        only.append((time.perf_counter() - t) * 1000)
        t = time.perf_counter()
        est.estimate(extract_features(req, est.tokenizer))
        both.append((time.perf_counter() - t) * 1000)
    return {
        "tokens": feats.prompt_tokens,
        "p50": float(np.percentile(only, 50)),
        "p99": float(np.percentile(only, 99)),
        "full_p50": float(np.percentile(both, 50)),
        "full_p99": float(np.percentile(both, 99)),
    }


def bootstrap_apgr(est, n_boot: int, seed: int = 0) -> tuple[float, float]:
    """95% bootstrap interval of the AlpacaEval APGR (prompts resampled with replacement)."""
    from pointsman.datasets.outcome_tables import read_outcome_table
    from pointsman.training.examples import features_for_messages
    from pointsman.training.metrics import apgr

    table = read_outcome_table(shared_datasets_dir() / AE_TABLE)
    p = est.estimate_batch([features_for_messages(m, est.tokenizer) for m in table.messages])
    w, s = table.scores(WEAK), table.scores(STRONG)
    rng = np.random.default_rng(seed)
    vals = []
    for _ in range(n_boot):
        i = rng.integers(0, len(p), len(p))
        try:
            vals.append(apgr(w[i], s[i], p[i]))
        except ValueError:
            continue
    return float(np.percentile(vals, 2.5)), float(np.percentile(vals, 97.5))


def ensure_model(kind: str, path: Path) -> Path:
    if (path / "manifest.json").is_file():
        return path
    from pointsman.training.recipe import TrainConfig
    from pointsman.training.train import train

    print(f"training {kind} model into {path} ...", flush=True)
    train(TrainConfig(encoder=kind), path, use_mlflow=False, command=f"pointsman train --encoder {kind}")
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--static", type=Path, default=bundled_model_dir())
    ap.add_argument("--minilm", type=Path, default=data_dir() / "compare" / "minilm")
    ap.add_argument("--repeats", type=int, default=300)
    ap.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples for the AE APGR interval")
    args = ap.parse_args()
    from pointsman.training.evaluate import evaluate_table

    rows = {}
    for kind, path in (("static", args.static), ("minilm", args.minilm)):
        path = ensure_model(kind, path)
        est = load_estimator(path, intra_op_threads=1)
        m = est.manifest
        ae = evaluate_table(est, shared_datasets_dir() / AE_TABLE, WEAK, STRONG)
        ae["apgr_ci95"] = bootstrap_apgr(est, args.bootstrap)
        lat = {}
        for n in (32, 128, 512):
            lat[n] = latency(est, prompt_of_tokens(est.tokenizer, n), args.repeats)
        lat[100_000] = latency(est, prompt_of_tokens(est.tokenizer, 100_000), max(30, args.repeats // 10))
        size = sum(f.stat().st_size for f in path.iterdir() if f.is_file())
        rows[kind] = (est, m, ae, lat, size)

    print(f"\nAlpacaEval ae1 transfer test: weak {WEAK} vs strong {STRONG} (never used for training)\n")
    hdr = f"{'':34s}" + "".join(f"{k:>22s}" for k in rows)
    print(hdr)

    def line(label, fn):
        print(f"{label:34s}" + "".join(f"{fn(*rows[k]):>22s}" for k in rows))

    line("version", lambda e, m, a, l, s: e.version[-12:])
    line("encoder (storage)", lambda e, m, a, l, s: f"{m.encoder.dim}d {m.encoder.quantization}")
    line("token window", lambda e, m, a, l, s: str(m.encoder.max_tokens))
    line("int8 cosine to fp32 min/mean", lambda e, m, a, l, s: (
        f"{m.encoder.details['int8_cosine_min']:.4f}/{m.encoder.details['int8_cosine_mean']:.4f}"
        if "int8_cosine_min" in m.encoder.details else
        f"{m.encoder.details.get('row_cosine_min', float('nan')):.4f}/"
        f"{m.encoder.details.get('row_cosine_mean', float('nan')):.4f} rows"))
    line("model size (MB)", lambda e, m, a, l, s: f"{s / 1e6:.1f}")
    for key in ("apgr", "cpt50", "cpt80", "auc", "random_apgr", "oracle_apgr"):
        line(f"AE {key}", lambda e, m, a, l, s, key=key: f"{a[key]:.4f}")
    line("AE apgr 95% bootstrap", lambda e, m, a, l, s: f"{a['apgr_ci95'][0]:.3f}-{a['apgr_ci95'][1]:.3f}")
    line("AE n", lambda e, m, a, l, s: str(a["n"]))
    for src in ("heldout/chat_apgr", "heldout/arena_bench_v1/apgr", "heldout/routellm_mtbench/apgr",
                "heldout/routellm_mmlu/apgr", "heldout/routellm_mmlu/auc", "heldout/routellm_gsm8k/apgr",
                "heldout/zeroeval_crux/apgr", "heldout/ece"):
        line(src, lambda e, m, a, l, s, src=src: f"{m.metrics.get(src, float('nan')):.4f}")
    for n in (32, 128, 512, 100_000):
        line(f"estimate() p50/p99 ms @{n} tok", lambda e, m, a, l, s, n=n: f"{l[n]['p50']:.2f}/{l[n]['p99']:.2f}")
    for n in (32, 128, 512, 100_000):
        line(f"features+estimate p50/p99 @{n}", lambda e, m, a, l, s, n=n: f"{l[n]['full_p50']:.2f}/{l[n]['full_p99']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
