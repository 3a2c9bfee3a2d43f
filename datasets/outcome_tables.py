"""Wide outcome tables: one row per prompt, one score column per model.

The shared datasets' format (``../shared/datasets/README.md``): columns
``prompt_id, category, prompt`` (RouteLLM's MT-bench has ``prompt_turn1`` and
``prompt_turn2`` instead of ``prompt``), optional metadata columns, then one
numeric column per model holding that model's score on the prompt (0/1
correctness, a 1–10 judge score, or a 0–1 win score against a reference).
Gzip and plain CSV are both read.

``read_outcome_table(path) -> OutcomeTable``; ``OutcomeTable.column(name)``
resolves a model column with a did-you-mean error.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from pointsman.errors import DataError

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np
    import pandas as pd
    from numpy.typing import NDArray

#: Columns that describe the prompt, never a model's score.
META_COLUMNS = frozenset(
    {
        "prompt_id",
        "category",
        "prompt",
        "prompt_turn1",
        "prompt_turn2",
        "question_id",
        "turn",
        "gold_answer",
        "contaminated_in_routellm_train",
    }
)


@dataclass
class OutcomeTable:
    """A wide outcome table with each row's conversation rebuilt.

    ``frame``: the table as read (pandas DataFrame, one row per prompt).
    ``messages``: per row, the OpenAI-style message list the prompt stands for
    (one user turn; for MT-bench turn 2: user turn 1, an empty assistant turn, user turn 2).
    ``model_columns``: the score columns, in file order.
    """

    path: Path
    frame: pd.DataFrame
    messages: list[list[dict[str, str]]]
    model_columns: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.frame)

    @property
    def prompt_ids(self) -> list[str]:
        """Row ids as strings (``prompt_id`` column)."""
        return [str(v) for v in self.frame["prompt_id"]]

    @property
    def categories(self) -> list[str]:
        """Row categories as strings (``category`` column, empty if absent)."""
        if "category" not in self.frame.columns:
            return [""] * len(self.frame)
        return [str(v) for v in self.frame["category"]]

    def column(self, name: str) -> str:
        """Return ``name`` if it is a model column, else raise ``DataError``.

        The message lists the available model columns and the closest matches
        (difflib, case-insensitive).
        """
        if name in self.model_columns:
            return name
        lowered = {c.lower(): c for c in self.model_columns}
        close = difflib.get_close_matches(name.lower(), list(lowered), n=3, cutoff=0.5)
        hint = f" Did you mean {', '.join(repr(lowered[c]) for c in close)}?" if close else ""
        raise DataError(
            f"{self.path}: no model column {name!r}.{hint} "
            f"Available model columns: {', '.join(self.model_columns)}"
        )

    def scores(self, name: str) -> NDArray[np.float64]:
        """Scores of model column ``name`` as a float64 array (n,); NaN where the cell is empty."""
        return self.frame[self.column(name)].to_numpy(dtype="float64")


def _messages_for_row(row: pd.Series, multi_turn: bool) -> list[dict[str, str]]:
    if not multi_turn:
        return [{"role": "user", "content": str(row["prompt"])}]
    first = str(row["prompt_turn1"])
    turn = int(row["turn"]) if "turn" in row and row["turn"] == row["turn"] else 1
    if turn <= 1:
        return [{"role": "user", "content": first}]
    # The assistant's turn-1 answer is not in the table; an empty assistant turn keeps the shape.
    return [
        {"role": "user", "content": first},
        {"role": "assistant", "content": ""},
        {"role": "user", "content": str(row["prompt_turn2"])},
    ]


def read_outcome_table(path: str | Path) -> OutcomeTable:
    """Read a wide outcome table (gzip or plain CSV) from ``path``.

    Raises ``DataError`` when the file is missing or unreadable, when it has no
    ``prompt_id`` column, no ``prompt`` (or ``prompt_turn1``/``prompt_turn2``)
    column, or no numeric model column. Model columns are the numeric columns
    that are not metadata (``META_COLUMNS``) and do not end in ``_response``.
    """
    import pandas as pd

    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    try:
        frame = pd.read_csv(path, compression="infer", low_memory=False)
    except (OSError, UnicodeDecodeError, EOFError, pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise DataError(f"{path}: cannot read as a CSV outcome table ({type(exc).__name__}: {exc})") from None
    except Exception as exc:  # gzip.BadGzipFile, zlib.error and friends
        raise DataError(f"{path}: cannot read as a CSV outcome table ({type(exc).__name__}: {exc})") from None
    cols = list(frame.columns)
    if "prompt_id" not in cols:
        raise DataError(f"{path}: missing column 'prompt_id' (columns: {', '.join(map(str, cols))})")
    multi_turn = "prompt" not in cols
    if multi_turn and not {"prompt_turn1", "prompt_turn2"} <= set(cols):
        raise DataError(
            f"{path}: missing column 'prompt' (or 'prompt_turn1' and 'prompt_turn2'); "
            f"columns: {', '.join(map(str, cols))}"
        )
    model_columns = [
        c
        for c in cols
        if c not in META_COLUMNS
        and not str(c).endswith("_response")
        and pd.api.types.is_numeric_dtype(frame[c])
    ]
    if not model_columns:
        raise DataError(f"{path}: no numeric model score columns (columns: {', '.join(map(str, cols))})")
    text_cols = ["prompt_turn1", "prompt_turn2"] if multi_turn else ["prompt"]
    frame[text_cols] = frame[text_cols].fillna("")
    messages = [_messages_for_row(row, multi_turn) for _, row in frame.iterrows()]
    return OutcomeTable(path=path, frame=frame, messages=messages, model_columns=model_columns)
