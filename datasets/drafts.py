"""Drafts: the answers models gave to a table's prompts (for the cascade's verifier).

``read_drafts(path, model) -> dict[prompt_id, text]`` reads a long CSV (gzip or plain) with
columns ``prompt_id``, ``model`` and ``output`` (one row per prompt and model, as
``../shared/datasets/alpacaeval/model_outputs_long.csv.gz`` holds AlpacaEval's 53 models'
answers; that data is non-commercial: evaluate on it, never ship a verifier trained on it).
Raises ``DataError`` for an unreadable file, missing columns, or a model with no rows (with
did-you-mean).
"""

from __future__ import annotations

import difflib
from pathlib import Path

from pointsman.errors import DataError

#: Columns a drafts file needs.
DRAFT_COLUMNS = ("prompt_id", "model", "output")


def read_drafts(path: str | Path, model: str) -> dict[str, str]:
    """``model``'s answer per prompt id (see the module). Empty answers read as ''."""
    import pandas as pd

    try:
        frame = pd.read_csv(path, usecols=lambda c: c in DRAFT_COLUMNS, dtype=str, keep_default_na=False)
    except (OSError, ValueError) as exc:
        raise DataError(f"{path}: cannot read the drafts ({exc})") from None
    missing = [c for c in DRAFT_COLUMNS if c not in frame.columns]
    if missing:
        raise DataError(f"{path}: the drafts need columns {', '.join(DRAFT_COLUMNS)}; missing {', '.join(missing)}")
    rows = frame[frame["model"] == model]
    if rows.empty:
        models = sorted(set(frame["model"]))
        close = difflib.get_close_matches(model, models, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else f" ({len(models)} models in the file)"
        raise DataError(f"{path}: no drafts of model '{model}'{hint}")
    return dict(zip(rows["prompt_id"].astype(str), rows["output"].astype(str)))
