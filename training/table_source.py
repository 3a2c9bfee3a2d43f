"""Any wide outcome table as a training source (``pointsman train --table``).

``table_source(path, weak, strong, license=None, panel=None) -> OutcomeSource``: the table at
``path`` (``datasets.outcome_tables`` format) with the named weak and strong model columns, its
score kind read from the values, and its license: the operator's (``--license``), else the one
``datasets.sources.SOURCES`` records for a shared table at that path, else ``"unknown"``. Its
``panel`` (the columns whose outcomes may denoise the label, ``TrainConfig.panel_weight``) is
every model column that is not a strong one, unless named.

A table of any license may train a model this way (the operator's own traffic, AlpacaEval
for a study); the license goes into the model's manifest and ``PROVENANCE.md``. Only
``datasets.sources.default_training_sources`` guards the shipped default.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from pointsman.datasets.outcome_tables import read_outcome_table
from pointsman.datasets.sources import SOURCES, OutcomeSource, shared_datasets_dir
from pointsman.errors import DataError

UNKNOWN_LICENSE = "unknown"
_NAME = re.compile(r"[^A-Za-z0-9_]+")


def score_kind_of(values: np.ndarray) -> str:
    """The score kind of a table's model scores (float, NaN for empty cells): ``correct01`` when
    every value is 0 or 1, ``win_vs_reference`` when all lie in [0, 1], else ``judge_1_10``."""
    v = values[~np.isnan(values)]
    if v.size and np.all((v == 0) | (v == 1)):
        return "correct01"
    if v.size and np.all((v >= 0) & (v <= 1)):
        return "win_vs_reference"
    return "judge_1_10"


def known_license(path: Path) -> tuple[str, str] | None:
    """``(license, origin)`` of a shared table (``datasets.sources.SOURCES``) at ``path``, or None."""
    try:
        root = shared_datasets_dir()
    except DataError:
        return None
    resolved = path.resolve()
    for src in SOURCES.values():
        if src.path(root).resolve() == resolved:
            return src.license, src.origin
    return None


def table_source(path: str | Path, weak: tuple[str, ...], strong: tuple[str, ...],
                 license: str | None = None, panel: tuple[str, ...] | None = None) -> OutcomeSource:
    """An ``OutcomeSource`` for the table at ``path``: labels from ``weak`` × ``strong`` model columns
    (each at least one); ``panel``: the model columns of the label's panel (None: every model column
    but the strong ones, the weak ones included). Raises ``DataError`` for an unreadable table or an
    unknown column (with did-you-mean), and for a column named on both sides or a strong column in
    the panel."""
    path = Path(path)
    if not weak or not strong:
        raise DataError("--weak and --strong each need at least one model column")
    both = sorted(set(weak) & set(strong))
    if both:
        raise DataError(f"{path}: column(s) {', '.join(both)} named as both weak and strong")
    table = read_outcome_table(path)
    if panel is None:
        panel = tuple(c for c in table.model_columns if c not in strong)
    elif set(panel) & set(strong):
        raise DataError(f"{path}: strong column(s) {', '.join(sorted(set(panel) & set(strong)))} in the label panel")
    values = np.concatenate([table.scores(c) for c in (*weak, *strong, *panel)])
    known = known_license(path)
    lic = license or (known[0] if known else UNKNOWN_LICENSE)
    origin = known[1] if known else f"operator table {path.name}"
    name = _NAME.sub("_", path.name.split(".")[0]).strip("_") or "table"
    return OutcomeSource(name=name, relpath=str(path.resolve()), license=lic, score_kind=score_kind_of(values),
                         weak=tuple(weak), strong=tuple(strong), domain="table", origin=origin,
                         panel=tuple(panel))


__all__ = ["UNKNOWN_LICENSE", "known_license", "score_kind_of", "table_source"]
