"""The head's input for a request: embedding ⊕ ``markers`` request features ⊕ the optional
blocks of ``estimator.conversation`` (rarity; conversation facts with a conversation-aware
embedding), one code path for serving (``DifficultyEstimator``) and training.

``HeadInputs(encoder, blocks).vector(features, query_token_ids) -> float32 (1, d)`` and
``.matrix(features, query_embeddings=None) -> float32 (n, d)``, d = dim + len(FEATURE_NAMES)
+ len(block_names(blocks)).
"""

from __future__ import annotations

import numpy as np

from pointsman.estimator.conversation import VocabularyRarity, conversation_vector
from pointsman.estimator.encoders import StaticEncoder, TransformerEncoder
from pointsman.estimator.features import RequestFeatures
from pointsman.estimator.markers import request_matrix, request_vector
from pointsman.estimator.wordpiece import word_piece_ids


class HeadInputs:
    """Builds head inputs for one model's layout.

    ``encoder``: the model's encoder (``StaticEncoder`` takes token ids: ``takes_token_ids``).
    ``blocks``: the optional blocks the head reads (``conversation.head_layout``): ``"rarity"``,
    ``"conversation"``. With ``"conversation"`` the embedding reads the last user turn's ids
    followed by its context's (``RequestFeatures.context_text``), cut at the encoder's window.
    """

    def __init__(self, encoder: StaticEncoder | TransformerEncoder, blocks: tuple[str, ...] = ()) -> None:
        self.encoder = encoder
        self.blocks = blocks
        self.reads_conversation = "conversation" in blocks
        self._tokenizer = encoder.tokenizer
        self._word_pieces = word_piece_ids(encoder.tokenizer)
        self._rarity = VocabularyRarity(encoder.tokenizer) if "rarity" in blocks else None
        self._takes_ids = isinstance(encoder, StaticEncoder)

    def _ids(self, text: str) -> list[int]:
        if self._word_pieces is not None:  # the library's ids at a sixth of its cost (``wordpiece``)
            return self._word_pieces(text)
        # no offsets needed: tokenizers' encode_batch_fast (>= 0.20) skips tracking them
        fast = getattr(self._tokenizer, "encode_batch_fast", None)
        if fast is not None:
            return list(fast([text], add_special_tokens=False)[0].ids)
        return list(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def _embed(self, f: RequestFeatures, ids: list[int] | None) -> np.ndarray:
        context = f.context_text if self.reads_conversation else ""
        if self._takes_ids:
            if ids is None and (context or self._rarity is not None):
                ids = self._ids(f.query_text)
            if context:
                return np.asarray(self.encoder.encode(f.query_text, (ids or []) + self._ids(context)), dtype=np.float32)
            if ids is not None:
                return np.asarray(self.encoder.encode(f.query_text, ids), dtype=np.float32)
            return np.asarray(self.encoder.encode(f.query_text), dtype=np.float32)
        text = f"{f.query_text}\n{context}" if context else f.query_text
        return np.asarray(self.encoder.encode(text), dtype=np.float32)

    def _extra(self, f: RequestFeatures, ids: list[int] | None) -> list[np.ndarray]:
        out: list[np.ndarray] = []
        if self._rarity is not None:
            out.append(self._rarity.vector(self._ids(f.query_text) if ids is None else ids))
        if self.reads_conversation:
            out.append(conversation_vector(f))
        return out

    def vector(self, features: RequestFeatures, query_token_ids: list[int] | None = None) -> np.ndarray:
        """The head's input for one request: float32 (1, d). ``query_token_ids``:
        ``tokenizer.encode(features.query_text, add_special_tokens=False).ids`` when known."""
        ids = query_token_ids
        if ids is None and (self._rarity is not None or (self.reads_conversation and features.context_text)) \
                and self._takes_ids:
            ids = self._ids(features.query_text)
        emb = self._embed(features, ids)
        parts = [emb, request_vector(features), *self._extra(features, ids)]
        return np.concatenate(parts)[None, :].astype(np.float32, copy=False)

    def matrix(self, features: list[RequestFeatures], query_embeddings: np.ndarray | None = None) -> np.ndarray:
        """Head inputs for many requests: float32 (n, d). ``query_embeddings``: the embeddings of
        the ``query_text``s (n, dim) when already computed (a training cache); rows with a
        conversation context are embedded again with it."""
        emb = self.encoder.encode_batch([f.query_text for f in features]) if query_embeddings is None \
            else np.array(query_embeddings, dtype=np.float32, copy=True)
        ids: list[list[int] | None] = [None] * len(features)
        if self._rarity is not None or self.reads_conversation:
            ids = [self._ids(f.query_text) for f in features]
        if self.reads_conversation:
            for i, f in enumerate(features):
                if f.context_text:
                    emb[i] = self._embed(f, ids[i])
        cols = [emb, request_matrix(features)]
        if self._rarity is not None or self.reads_conversation:
            cols.append(np.stack([np.concatenate(self._extra(f, i)) for f, i in zip(features, ids)])
                        if features else np.zeros((0, 0), dtype=np.float32))
        return np.hstack(cols).astype(np.float32, copy=False)


__all__ = ["HeadInputs"]
