"""Reading the conversation, not only its last user message, and the words' rarity.

Two optional blocks of head inputs, after the embedding and ``markers.FEATURE_NAMES``; a model
reads them when its head's feature names end with them (``head_layout``), so older models keep
their layout:

- ``CONVERSATION_NAMES`` (and a conversation-aware embedding): the encoder sees the last user
  message's token ids first, then those of up to ``features.CONTEXT_TURNS`` earlier user turns
  (``RequestFeatures.context_text``, bounded windows), cut at the encoder's token window. The
  static encoder averages token vectors, so a long turn keeps its own difficulty (its tokens come
  first and outnumber the context's). Facts: ``log1p`` of the earlier user turns' characters, and
  whether the last turn is a short follow-up (< ``SHORT_TURN_CHARS`` characters after an earlier
  user turn). Since v3 the estimator never feeds a short follow-up's own input to the head: it
  scores the request it continues and the turn read alone (``DifficultyEstimator.estimate``), so
  ``short_followup`` is 0 at serving; the column stays for the head's layout.
- ``RARITY_NAMES``: word rarity from the tokenizer's own vocabulary order (no extra data).
  WordPiece vocabularies of BERT's family list whole words roughly by corpus frequency after
  the single characters, so ``log1p(id - first word id)`` is a log frequency rank; rare words
  split into ``##`` pieces. Values: mean and 90th percentile of the word-start ranks, the share
  of word starts beyond rank 10,000, the share of ``##`` continuation pieces.

Cost: one vocabulary-sized lookup table built per tokenizer (``VocabularyRarity``), then
O(query tokens) per request.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from pointsman.estimator.features import SHORT_TURN_CHARS
from pointsman.estimator.markers import FEATURE_NAMES

if TYPE_CHECKING:  # pragma: no cover
    from tokenizers import Tokenizer

    from pointsman.estimator.features import RequestFeatures

CONVERSATION_NAMES: tuple[str, ...] = ("log_context_chars", "short_followup")
RARITY_NAMES: tuple[str, ...] = ("mean_log_word_rank", "p90_log_word_rank", "rare_word_share", "subword_share")
#: Word rank beyond which a word start counts as rare.
RARE_RANK = 10_000
#: The optional blocks, in the order they follow ``FEATURE_NAMES`` in a head's input.
BLOCKS: tuple[tuple[str, tuple[str, ...]], ...] = (("rarity", RARITY_NAMES), ("conversation", CONVERSATION_NAMES))


def head_layout(feature_names: list[str], dim: int) -> tuple[str, ...] | None:
    """The optional blocks a head reads, from its feature names: ``()`` for
    ``emb_0..emb_{dim-1}`` + ``FEATURE_NAMES`` (the v1 layout), ``("rarity", "conversation")``
    etc. when those blocks follow in ``BLOCKS`` order; None for any other layout."""
    emb = [f"emb_{i}" for i in range(dim)]
    base = len(emb) + len(FEATURE_NAMES)
    if feature_names[:base] != emb + list(FEATURE_NAMES):
        return None
    rest, blocks = feature_names[base:], []
    for name, names in BLOCKS:
        if rest[: len(names)] == list(names):
            blocks.append(name)
            rest = rest[len(names):]
    return tuple(blocks) if not rest else None


def block_names(blocks: tuple[str, ...]) -> list[str]:
    """The feature names of ``blocks`` (a ``head_layout`` answer), in input order."""
    return [n for name, names in BLOCKS if name in blocks for n in names]


def conversation_vector(features: RequestFeatures) -> np.ndarray:
    """``CONVERSATION_NAMES`` of one request: float32 (2,)."""
    followup = bool(features.context_text) and features.query_chars < SHORT_TURN_CHARS
    return np.asarray((math.log1p(features.context_chars), float(followup)), dtype=np.float32)


class VocabularyRarity:
    """``RARITY_NAMES`` from token ids, with per-id tables built once from ``tokenizer``'s vocabulary.

    The first word id is the id of ``"the"`` (the most frequent English word) when the vocabulary
    has it, else 0. ``vector(ids)`` -> float32 (4,); zeros for no ids."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        vocab = tokenizer.get_vocab()
        size = max(vocab.values()) + 1 if vocab else 1
        first = vocab.get("the", 0)
        self.continuation = np.zeros(size, dtype=bool)
        for token, i in vocab.items():
            if token.startswith("##"):
                self.continuation[i] = True
        self.log_rank = np.log1p(np.maximum(np.arange(size) - first, 0)).astype(np.float32)
        self._rare = float(np.log1p(RARE_RANK))

    def vector(self, ids: list[int] | np.ndarray) -> np.ndarray:
        """Rarity of one text's token ids (no special tokens): float32 (4,)."""
        a = np.asarray(ids, dtype=np.int64)
        a = a[(a >= 0) & (a < len(self.log_rank))]
        if a.size == 0:
            return np.zeros(len(RARITY_NAMES), dtype=np.float32)
        cont = self.continuation[a]
        words = self.log_rank[a[~cont]]
        if words.size == 0:
            words = np.zeros(1, dtype=np.float32)
        return np.asarray((words.mean(), np.percentile(words, 90), (words > self._rare).mean(), cont.mean()),
                          dtype=np.float32)


__all__ = ["BLOCKS", "CONVERSATION_NAMES", "RARITY_NAMES", "SHORT_TURN_CHARS", "VocabularyRarity", "block_names",
           "conversation_vector", "head_layout"]
