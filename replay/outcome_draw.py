"""Prompts and per-model outcomes drawn from the shared outcome tables for trace requests
that carry no prompt text (Mooncake, Azure), so replay can run the real difficulty
estimator and score quality.

``OutcomeDraw.load(sources, seed)`` reads the named sources (``datasets.sources``: a wide
table plus its weak and strong model columns) and keeps the rows where both sides have a
score. ``draw.assign(n)`` gives trace request ``i`` the row ``rows[assign(n)[i]]``: a
uniform draw with replacement from ``numpy.random.default_rng(seed)``, so the same seed
gives the same prompts. Each row holds the conversation (OpenAI messages) and two scores
in 0-1: ``weak_score`` (mean over the source's weak model columns that scored the row)
and ``strong_score`` (the same over its strong models). Scores are normalized per
``score_kind``: 0/1 correctness as is, a 1-10 judge rating as (s - 1) / 9, a 0-1 win
score against a reference as is.

Quality of a replayed request (``quality_of``): the score of the model column that stands
for the target it ran on, when the fleet names one for the row's source
(``targets.<name>.replay.quality_columns: {source: column}``, read by ``quality_columns``
and passed to ``OutcomeDraw.load`` as ``target_columns``; ``row.target_scores[target]``);
otherwise the row's ``strong_score`` on a frontier tier and its ``weak_score`` on-prem (the
source's two tiers: e.g. RouteLLM's GPT-4-1106 vs Mixtral-8x7B). A named column the table
lacks is a ``DataError`` naming the target, source and column. Rows are kept only where the
weak, strong and every named column scored. Rejected requests have no quality.

The default source, ``alpacaeval_ae1`` (AlpacaEval 1.0: Llama-2-7B-chat vs GPT-4-1106 win
scores against text-davinci-003, CC BY-NC: evaluation only), is not in the shipped
estimator's training data, so the replayed estimator is scored on prompts it never saw.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from pointsman.datasets.outcome_tables import OutcomeTable, read_outcome_table
from pointsman.datasets.sources import get_source

if TYPE_CHECKING:  # pragma: no cover
    from pointsman.policy.fleet import Fleet

#: Outcome sources drawn by default (``--outcomes``); see the module docstring.
DEFAULT_OUTCOME_SOURCES = ("alpacaeval_ae1",)


@dataclass(frozen=True, slots=True)
class OutcomeRow:
    """One prompt of an outcome table: ``source``, ``prompt_id``, ``messages`` (OpenAI chat
    messages), ``weak_score`` and ``strong_score`` (0-1), and ``target_scores``: fleet target
    -> the 0-1 score of the column that stands for it (only targets that name one for this
    row's source; see the module docstring)."""

    source: str
    prompt_id: str
    messages: tuple[dict[str, str], ...]
    weak_score: float
    strong_score: float
    target_scores: Mapping[str, float] = dataclasses.field(default_factory=dict)


def _normalize(values: np.ndarray, score_kind: str) -> np.ndarray:
    if score_kind == "judge_1_10":
        return (values - 1.0) / 9.0
    return values


def _side_mean(table: OutcomeTable, columns: Sequence[str], kind: str) -> np.ndarray:
    """Row-wise mean of the normalized scores in ``columns`` (NaN where none scored the row)."""
    stacked = np.vstack([_normalize(table.scores(c), kind) for c in columns])
    counts = np.sum(~np.isnan(stacked), axis=0)
    sums = np.nansum(stacked, axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)


@dataclass(frozen=True)
class OutcomeDraw:
    """Rows to draw from (see the module docstring) and the ``seed`` of the draw."""

    rows: tuple[OutcomeRow, ...]
    seed: int
    sources: tuple[str, ...]

    @classmethod
    def load(cls, sources: Sequence[str] = DEFAULT_OUTCOME_SOURCES, seed: int = 0,
             root: str | Path | None = None,
             target_columns: Mapping[str, Mapping[str, str]] | None = None, where: str = "fleet") -> OutcomeDraw:
        """Read ``sources`` (names in ``datasets.sources.SOURCES``) under ``root`` (default: the
        shared datasets folder). ``target_columns``: target -> {source: model column} (see
        ``quality_columns``; ``where`` names the fleet file in errors). Raises ``DataError`` for
        an unknown source, a missing or unreadable table, a named column the table lacks
        (naming target, source and column, with the close matches), or when no row has
        every needed score."""
        from pointsman.errors import DataError

        rows: list[OutcomeRow] = []
        for name in sources:
            src = get_source(name)
            table = read_outcome_table(src.path(root))
            weak = _side_mean(table, [table.column(c) for c in src.weak], src.score_kind)
            strong = _side_mean(table, [table.column(c) for c in src.strong], src.score_kind)
            named: dict[str, np.ndarray] = {}
            for target, columns in (target_columns or {}).items():
                column = columns.get(name)
                if column is None:
                    continue
                try:
                    named[target] = _normalize(table.scores(column), src.score_kind)
                except DataError as exc:
                    raise DataError(f"{where}: targets.{target}.replay.quality_columns.{name} names model column "
                                    f"'{column}', which the {name} table lacks: {exc}") from None
            for i, pid in enumerate(table.prompt_ids):
                if math.isnan(weak[i]) or math.isnan(strong[i]) or any(math.isnan(v[i]) for v in named.values()):
                    continue
                rows.append(OutcomeRow(name, pid, tuple(table.messages[i]), float(weak[i]), float(strong[i]),
                                       {t: float(v[i]) for t, v in named.items()}))
        if not rows:
            raise DataError(f"outcome sources {', '.join(sources)}: no row has both a weak and a strong score")
        return cls(tuple(rows), seed, tuple(sources))

    def assign(self, n: int) -> np.ndarray:
        """Row index for each of ``n`` trace requests, int64 array (n,); same seed, same draw."""
        return np.random.default_rng(self.seed).integers(0, len(self.rows), size=n)

    def by_prompt_id(self) -> dict[str, int]:
        """Row index by ``prompt_id`` (for traces whose requests name their prompt)."""
        return {r.prompt_id: i for i, r in enumerate(self.rows)}


def quality_of(row: OutcomeRow | None, frontier: bool, target: str | None = None) -> float | None:
    """Quality (0-1) of a request that ran on ``target``, a frontier tier (``frontier``) or
    on-prem: the score of the target's named column when the row has one, else the row's
    strong or weak score; None without a row."""
    if row is None:
        return None
    if target is not None:
        score = row.target_scores.get(target)
        if score is not None:
            return score
    return row.strong_score if frontier else row.weak_score


def quality_columns(fleet: Fleet) -> dict[str, dict[str, str]]:
    """Target -> {outcome source: model column} from a ``policy.fleet.Fleet``'s
    ``targets.<name>.replay.quality_columns`` (targets without any are left out)."""
    out: dict[str, dict[str, str]] = {}
    for name, target in fleet.targets.items():
        hints = target.replay
        if hints is not None and hints.quality_columns:
            out[name] = dict(hints.quality_columns)
    return out


__all__ = ["DEFAULT_OUTCOME_SOURCES", "OutcomeDraw", "OutcomeRow", "quality_columns", "quality_of"]
