"""Leakage-safe splits: every prompt is assigned to a fold by a hash of its
normalized first user turn, so the same question can never sit on both sides of
a split — not across sources (GSM8K is in RouteLLM and ZeroEval) and not across
the turns of one conversation (MT-bench turn 1 and turn 2).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence

import numpy as np
from numpy.typing import NDArray

_SPACE = re.compile(r"\s+")


def group_key(messages: Sequence[Mapping[str, object]]) -> str:
    """A stable key for the conversation: sha1 of its first user text, lower-cased,
    whitespace collapsed (hex string, 16 chars)."""
    first = next((m.get("content") for m in messages if m.get("role") == "user"), "") or ""
    if not isinstance(first, str):
        first = str(first)
    norm = " ".join(first.lower().split())  # = _SPACE.sub(" ", first.strip().lower()): \s is what str.split splits at
    return hashlib.sha1(norm.encode("utf-8")).hexdigest()[:16]


def assign_folds(keys: Sequence[str], n_folds: int, seed: int = 0) -> NDArray[np.int64]:
    """Fold index in ``[0, n_folds)`` for each group key: int64 array (n,).

    Deterministic (sha1 of ``f"{seed}:{key}"``), so equal keys always share a fold and
    the assignment does not depend on row order or on which other rows exist.
    """
    if n_folds < 2:
        raise ValueError(f"n_folds must be >= 2, got {n_folds}")
    out = np.empty(len(keys), dtype=np.int64)
    for i, key in enumerate(keys):
        digest = hashlib.sha1(f"{seed}:{key}".encode()).digest()
        out[i] = int.from_bytes(digest[:8], "big") % n_folds
    return out
