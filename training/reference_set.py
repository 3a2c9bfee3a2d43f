"""The fixed Apache/MIT reference prompt mix and the model's p_hard quantiles on it.

A calibrated ``p_hard`` from a weak signal stays in a narrow band, and where that band
sits depends on the model; so policy thresholds are best set as *quantiles* of a
model's p_hard on a fixed prompt mix ("route the hardest 15% to the frontier tier").
``pointsman train`` publishes those quantiles in the model's ``manifest.json``
(``reference_p_hard``), so tooling (``scripts/p_hard_quantiles.py --from-manifest``)
derives thresholds without the data.

The mix: up to ``PER_SET`` prompts (sampled with ``random.Random(0)``) from each of
Arena-Bench-V1, RouteLLM MT-Bench (turn 1), RouteLLM MMLU and RouteLLM GSM8K — all
Apache-2.0 repositories (MMLU/GSM8K MIT). Not a held-out set: these prompts are in the
training data; the quantiles describe the p_hard *distribution*, not its quality.
"""

from __future__ import annotations

import csv
import gzip
import random
import sys
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

import numpy as np

from pointsman.datasets.sources import shared_datasets_dir
from pointsman.errors import EstimatorError

if TYPE_CHECKING:  # pragma: no cover
    from pointsman.estimator.estimate import Estimator

#: (table under the shared datasets folder, prompt column) of the reference mix.
REFERENCE_SETS: tuple[tuple[str, str], ...] = (
    ("arena_bench_v1/arena_bench_v1_gpt4_single_scores.csv", "prompt"),
    ("routellm/mtbench_mixtral_vs_gpt4.csv", "prompt_turn1"),
    ("routellm/mmlu_mixtral_vs_gpt4.csv.gz", "prompt"),
    ("routellm/gsm8k_mixtral_vs_gpt4.csv.gz", "prompt"),
)
#: Prompts sampled per set.
PER_SET = 300
#: Quantile levels published in the manifest: 0.05, 0.10, ..., 0.95.
LEVELS: tuple[float, ...] = tuple(round(0.05 * i, 2) for i in range(1, 20))


class ReferenceBlock(TypedDict):
    """A manifest's ``reference_p_hard``: the mix (``sets`` as ``table:column``, ``per_set``), the
    prompts scored (``n``) and the pooled quantiles (``{"0.05": p, ..., "0.95": p}``)."""

    sets: list[str]
    per_set: int
    n: int
    quantiles: dict[str, float]


def reference_prompts(path: Path, column: str, n: int = PER_SET) -> list[str]:
    """Up to ``n`` non-empty prompts from ``column`` of a (gzipped) CSV, shuffled with
    ``random.Random(0)`` (deterministic). Raises ``OSError``/``KeyError`` for a missing
    file or column."""
    opener = gzip.open if path.suffix == ".gz" else open
    csv.field_size_limit(sys.maxsize)
    with opener(path, "rt", encoding="utf-8", newline="") as f:
        rows = [r[column] for r in csv.DictReader(f) if r.get(column, "").strip()]
    random.Random(0).shuffle(rows)
    return rows[:n]


def quantile(values: list[float] | np.ndarray, q: float) -> float:
    """Linear-interpolated quantile of ``values`` at level ``q`` in [0, 1]."""
    return float(np.quantile(np.asarray(values, dtype=np.float64), q))


def score_reference(estimator: Estimator, root: str | Path | None = None,
                    per_set: int = PER_SET) -> dict[str, list[float]]:
    """p_hard of every reference prompt, per set: ``{table: [p_hard, ...]}``.

    ``estimator``: a ``DifficultyEstimator`` (scored one request at a time through
    ``extract_features`` + ``estimate``, exactly as served). Raises ``EstimatorError`` when it
    cannot score a prompt."""
    from pointsman.estimator.features import extract_features
    from pointsman.request import request_from_prompt

    def p_hard(text: str) -> float:
        got = estimator.estimate(extract_features(request_from_prompt(text), estimator.tokenizer))
        if got.p_hard is None:
            raise EstimatorError(f"{estimator.version} could not score a reference prompt: {got.error}")
        return float(got.p_hard)

    root = Path(root) if root else shared_datasets_dir()
    return {rel: [p_hard(t) for t in reference_prompts(root / rel, column, per_set)] for rel, column in REFERENCE_SETS}


def reference_quantiles(per_set_scores: dict[str, list[float]]) -> ReferenceBlock:
    """The manifest's ``reference_p_hard`` block from ``score_reference`` output:
    ``{"sets": [...], "per_set": N, "n": total, "quantiles": {"0.05": p, ..., "0.95": p}}``
    (quantiles of the pooled mix, p_hard values in [0, 1])."""
    pooled = [p for ps in per_set_scores.values() for p in ps]
    if not pooled:
        raise ValueError("no reference prompts were scored")
    return ReferenceBlock(
        sets=[f"{rel}:{col}" for rel, col in REFERENCE_SETS],
        per_set=PER_SET,
        n=len(pooled),
        quantiles={f"{q:.2f}": round(quantile(pooled, q), 6) for q in LEVELS},
    )


def threshold_for_share(reference: ReferenceBlock, share: float) -> float:
    """The p_hard threshold that about ``share`` (0–1) of the reference mix reaches:
    the ``1 - share`` quantile, linearly interpolated between the published levels
    (clamped to the 0.05/0.95 levels). Raises ``ValueError`` for a share outside (0, 1)."""
    if not 0.0 < share < 1.0:
        raise ValueError(f"share must be in (0, 1), got {share}")
    levels = np.array(sorted(float(k) for k in reference["quantiles"]))
    values = np.array([reference["quantiles"][f"{q:.2f}"] for q in levels])
    return float(np.interp(1.0 - share, levels, values))
