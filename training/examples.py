"""Training examples from the public outcome sources: one row per prompt with its
request features, soft label, weight and leakage-safe group key.

``build_examples(sources, root, tokenizer, ...) -> Examples``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from pointsman.datasets.outcome_tables import read_outcome_table
from pointsman.datasets.sources import OutcomeSource
from pointsman.datasets.splits import group_key
from pointsman.estimator.features import RequestFeatures, extract_features
from pointsman.request import parse_route_request
from pointsman.training.labels import pairwise_gap_share, pairwise_worse_share

if TYPE_CHECKING:  # pragma: no cover
    from tokenizers import Tokenizer

#: Score margin per score kind: a pair counts as "weak worse" when strong - weak > margin.
DEFAULT_MARGINS = {"correct01": 0.0, "judge_1_10": 0.0, "win_vs_reference": 0.0}
#: Score range per score kind, for graded gap labels (``pairwise_gap_share``).
SCORE_SCALES = {"correct01": 1.0, "judge_1_10": 9.0, "win_vs_reference": 1.0}


@dataclass
class Examples:
    """Prompts with labels, aligned arrays of length n.

    ``source``: source name per row; ``prompt_id``; ``group``: leakage-safe key
    (``datasets.splits.group_key``); ``features``: ``RequestFeatures`` per row;
    ``y``: float64 soft label in [0, 1]; ``n_pairs``: weak/strong pairs behind ``y``;
    ``category``: the table's category. ``y_panel``/``y_panel_gap``: the same labels over the
    source's panel × strong model pairs (``OutcomeSource.panel``: many models' outcomes on the
    prompt, a less noisy measure of its difficulty), NaN where the source has no panel or the row
    no panel pair.
    """

    source: np.ndarray
    prompt_id: np.ndarray
    group: np.ndarray
    category: np.ndarray
    features: list[RequestFeatures]
    y: np.ndarray
    y_gap: np.ndarray
    n_pairs: np.ndarray
    weak_score: np.ndarray
    strong_score: np.ndarray
    licenses: dict[str, str] = field(default_factory=dict)
    anchor_rates: dict[str, dict[str, float]] = field(default_factory=dict)
    y_panel: np.ndarray = field(default_factory=lambda: np.empty(0))
    y_panel_gap: np.ndarray = field(default_factory=lambda: np.empty(0))

    def __post_init__(self) -> None:
        if len(self.y_panel) != len(self.y):
            self.y_panel = np.full(len(self.y), np.nan)
        if len(self.y_panel_gap) != len(self.y):
            self.y_panel_gap = np.full(len(self.y), np.nan)

    def __len__(self) -> int:
        return len(self.y)

    def concat(self, other: Examples) -> Examples:
        """The rows of ``self`` followed by ``other``'s (licenses and anchor rates merged)."""
        def cat(a: np.ndarray, b: np.ndarray) -> np.ndarray:
            return np.concatenate([a, b])

        return Examples(
            source=cat(self.source, other.source), prompt_id=cat(self.prompt_id, other.prompt_id),
            group=cat(self.group, other.group), category=cat(self.category, other.category),
            features=self.features + other.features, y=cat(self.y, other.y), y_gap=cat(self.y_gap, other.y_gap),
            n_pairs=cat(self.n_pairs, other.n_pairs), weak_score=cat(self.weak_score, other.weak_score),
            strong_score=cat(self.strong_score, other.strong_score), licenses={**self.licenses, **other.licenses},
            anchor_rates={**self.anchor_rates, **other.anchor_rates}, y_panel=cat(self.y_panel, other.y_panel),
            y_panel_gap=cat(self.y_panel_gap, other.y_panel_gap),
        )

    def subset(self, mask: np.ndarray) -> Examples:
        """Rows where boolean ``mask`` (n,) is True (or the given int indices)."""
        idx = np.flatnonzero(mask) if np.asarray(mask).dtype == bool else np.asarray(mask)
        return Examples(
            source=self.source[idx],
            prompt_id=self.prompt_id[idx],
            group=self.group[idx],
            category=self.category[idx],
            features=[self.features[i] for i in idx],
            y=self.y[idx],
            y_gap=self.y_gap[idx],
            n_pairs=self.n_pairs[idx],
            weak_score=self.weak_score[idx],
            strong_score=self.strong_score[idx],
            licenses=dict(self.licenses),
            anchor_rates=dict(self.anchor_rates),
            y_panel=self.y_panel[idx],
            y_panel_gap=self.y_panel_gap[idx],
        )


def _row_mean(scores: np.ndarray) -> np.ndarray:
    """Mean of the non-NaN scores per row (NaN where a row has none): float64 (n,)."""
    ok = ~np.isnan(scores)
    total = np.where(ok, scores, 0.0).sum(axis=1)
    count = ok.sum(axis=1)
    return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def features_for_messages(messages: Sequence[Mapping[str, object]], tokenizer: Tokenizer | None) -> RequestFeatures:
    """``RequestFeatures`` of an OpenAI-style message list, through the same request
    validation and feature extraction the service uses (so train and serve agree)."""
    return extract_features(parse_route_request({"messages": messages}), tokenizer)


def build_examples(
    sources: list[OutcomeSource],
    root: str | Path | None = None,
    tokenizer: Tokenizer | None = None,
    margins: dict[str, float] | None = None,
    max_rows_per_source: dict[str, int] | None = None,
    seed: int = 0,
) -> Examples:
    """Load each source's table and label every prompt over the source's weak × strong
    models (``pairwise_worse_share`` and ``pairwise_gap_share``), and over its panel × strong
    models when it has a panel (``OutcomeSource.panel``: ``y_panel``, ``y_panel_gap``).

    ``margins``: per score kind (default ``DEFAULT_MARGINS``). ``max_rows_per_source``:
    keep a deterministic random subset (``seed``) of at most that many rows of a
    source (e.g. MMLU's 14k). Rows with no scored pair and rows whose prompt is
    empty are dropped. Raises ``DataError`` for unreadable tables or unknown columns.
    """
    margins = {**DEFAULT_MARGINS, **(margins or {})}
    src_col: list[str] = []
    prompt_col: list[str] = []
    group_col: list[str] = []
    category_col: list[str] = []
    y_col: list[float] = []
    y_gap_col: list[float] = []
    n_pairs_col: list[int] = []
    weak_col: list[float] = []
    strong_col: list[float] = []
    panel_col: list[float] = []
    panel_gap_col: list[float] = []
    feats: list[RequestFeatures] = []
    licenses: dict[str, str] = {}
    anchor_rates: dict[str, dict[str, float]] = {}
    for src in sources:
        table = read_outcome_table(src.path(root))
        weak = np.stack([table.scores(c) for c in src.weak], axis=1)
        strong = np.stack([table.scores(c) for c in src.strong], axis=1)
        y, n_pairs = pairwise_worse_share(weak, strong, margins[src.score_kind])
        y_gap, _ = pairwise_gap_share(weak, strong, SCORE_SCALES[src.score_kind])
        y_panel = y_panel_gap = np.full(len(y), np.nan)
        if src.panel:
            panel = np.stack([table.scores(c) for c in src.panel], axis=1)
            y_panel, _ = pairwise_worse_share(panel, strong, margins[src.score_kind])
            y_panel_gap, _ = pairwise_gap_share(panel, strong, SCORE_SCALES[src.score_kind])
        weak_mean = _row_mean(weak)
        strong_mean = _row_mean(strong)
        rows = np.flatnonzero(n_pairs > 0)
        if src.anchor is not None:
            a_worse, a_pairs = pairwise_worse_share(table.scores(src.anchor), strong, margins[src.score_kind])
            a_gap, _ = pairwise_gap_share(table.scores(src.anchor), strong, SCORE_SCALES[src.score_kind])
            ok = a_pairs > 0
            anchor_rates[src.name] = {"worse": float(a_worse[ok].mean()), "gap": float(a_gap[ok].mean())}
        limit = (max_rows_per_source or {}).get(src.name)
        if limit is not None and len(rows) > limit:
            rng = np.random.default_rng(seed)
            rows = np.sort(rng.choice(rows, size=limit, replace=False))
        ids, cats = table.prompt_ids, table.categories
        for i in rows:
            messages = table.messages[i]
            if not any(str(m.get("content") or "").strip() for m in messages):
                continue
            feats.append(features_for_messages(messages, tokenizer))
            src_col.append(src.name)
            prompt_col.append(ids[i])
            group_col.append(group_key(messages))
            category_col.append(cats[i])
            y_col.append(y[i])
            y_gap_col.append(y_gap[i])
            n_pairs_col.append(n_pairs[i])
            weak_col.append(weak_mean[i])
            strong_col.append(strong_mean[i])
            panel_col.append(y_panel[i])
            panel_gap_col.append(y_panel_gap[i])
        licenses[src.name] = src.license
    return Examples(
        source=np.asarray(src_col, dtype=object),
        prompt_id=np.asarray(prompt_col, dtype=object),
        group=np.asarray(group_col, dtype=object),
        category=np.asarray(category_col, dtype=object),
        features=feats,
        y=np.asarray(y_col, dtype=np.float64),
        y_gap=np.asarray(y_gap_col, dtype=np.float64),
        n_pairs=np.asarray(n_pairs_col, dtype=np.int64),
        weak_score=np.asarray(weak_col, dtype=np.float64),
        strong_score=np.asarray(strong_col, dtype=np.float64),
        licenses=licenses,
        anchor_rates=anchor_rates,
        y_panel=np.asarray(panel_col, dtype=np.float64),
        y_panel_gap=np.asarray(panel_gap_col, dtype=np.float64),
    )


#: The source name of the easy anchors' rows (``datasets.easy_anchors``).
EASY_ANCHORS = "easy_anchors"


def anchor_examples(tokenizer: Tokenizer | None, root: str | Path | None = None) -> Examples:
    """The easy anchors (``datasets.easy_anchors.easy_anchor_prompts``) as examples of source
    ``EASY_ANCHORS``: label 0 (the cheap answer is acceptable), no model scores (NaN), one pair each.
    Without the shared datasets, the template anchors alone."""
    from pointsman.datasets.easy_anchors import easy_anchor_prompts

    prompts = easy_anchor_prompts(root)
    n = len(prompts)
    messages = [[{"role": "user", "content": p}] for p in prompts]
    return Examples(
        source=np.full(n, EASY_ANCHORS, dtype=object),
        prompt_id=np.asarray([f"anchor-{i:04d}" for i in range(n)], dtype=object),
        group=np.asarray([group_key(m) for m in messages], dtype=object),
        category=np.full(n, "easy", dtype=object),
        features=[features_for_messages(m, tokenizer) for m in messages],
        y=np.zeros(n), y_gap=np.zeros(n), n_pairs=np.ones(n, dtype=np.int64),
        weak_score=np.full(n, np.nan), strong_score=np.full(n, np.nan),
        licenses={EASY_ANCHORS: "Apache-2.0"},
    )
