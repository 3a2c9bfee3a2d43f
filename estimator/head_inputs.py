"""The head's input for a request: embedding ⊕ ``markers`` request features ⊕ the optional
blocks of ``estimator.conversation`` (rarity; conversation facts with a conversation-aware
embedding), one code path for serving (``DifficultyEstimator``) and training.

``HeadInputs(encoder, blocks, pooling).vector(features, query_token_ids) -> float32 (1, d)`` and
``.matrix(features, query_embeddings=None) -> float32 (n, d)``, d = dim + len(FEATURE_NAMES)
+ len(block_names(blocks)).

Pooling (``POOLINGS``, the manifest's ``head.pooling``): ``mean`` embeds the query window as one text.
``instruction`` weighs a request's instruction apart from material pasted after it: "Translate this
into English: <three paragraphs>" is a translation request whatever the paragraphs say, and a plain
mean over the tokens lets the paragraphs decide. When ``instruction_end`` finds the instruction, the
embedding is ``unit(INSTRUCTION_WEIGHT * unit(E(instruction)) + unit(E(rest)))``, the rest being the
pasted material; otherwise it is the mean's. A turn with earlier turns (the conversation block's
context) is read as one mean with them: there the earlier turns say what the task is, and the turn's
first line is not the whole instruction (this also ranked the chat sources left out better).
Chosen on the sanity suite and leave-one-chat-source-out together, and checked on the holdout suite
it was not chosen on (``docs/retraining.md``).
"""

from __future__ import annotations

import re

import numpy as np

from pointsman.estimator.conversation import VocabularyRarity, conversation_vector
from pointsman.estimator.encoders import StaticEncoder, TransformerEncoder
from pointsman.estimator.features import RequestFeatures
from pointsman.estimator.manifest import POOLINGS
from pointsman.estimator.markers import request_matrix, request_vector
from pointsman.estimator.wordpiece import word_piece_ids

#: A query shorter than this (characters) is all instruction.
INSTRUCTION_MIN_QUERY_CHARS = 240
#: The instruction ends within this many characters of the query's start...
INSTRUCTION_MAX_CHARS = 300
#: ...and at least this many characters of material follow it.
PASTED_MIN_CHARS = 120
#: The instruction's weight against the rest's in the pooled embedding.
INSTRUCTION_WEIGHT = 2.0
#: An instruction of at most this many words may be a greeting or a label ("Hello there.", "Question:",
#: "Hi! I have a question."), not the task, unless it ends with a colon after two words or more
#: ("Summarize this:", "Translate this into German:": what introduces pasted material): the estimator
#: then also reads the query as one mean and keeps the larger ``p_hard`` (``short_instruction``; the safe side).
SHORT_INSTRUCTION_WORDS = 5
#: Words that make a colon a label's, not an instruction's: "Quick question:", "Here is my question:",
#: "Background info:" announce the request itself (or its context), where "Summarize this note:" announces
#: material. "Answer this question:" counts as a label too: the rest is the task, and reading it whole is
#: the safe side.
LABEL_WORDS = frozenset("question questions q query context background problem task frage pregunta domanda "
                        "vraag".split())
#: Where an instruction can end: after a line break, or after a colon, question mark or full stop and a
#: space. Every cut is just after a whitespace character, so WordPiece (which never joins across
#: whitespace) gives the query's ids as the instruction's ids followed by the rest's.
_INSTRUCTION_END = re.compile(r"\n|[:?.]\s")


def instruction_end(query: str) -> int:
    """Where the instruction of ``query`` ends and pasted material starts: a character offset, or 0
    when the query is all instruction (shorter than ``INSTRUCTION_MIN_QUERY_CHARS``, or no end of a
    line or sentence in its first ``INSTRUCTION_MAX_CHARS`` characters leaves ``PASTED_MIN_CHARS``
    after it). The first such end counts: "Fix the typos: <note>" → the offset after ": "."""
    if len(query) < INSTRUCTION_MIN_QUERY_CHARS:
        return 0
    for m in _INSTRUCTION_END.finditer(query, 0, INSTRUCTION_MAX_CHARS):
        if m.end() >= 8 and len(query) - m.end() >= PASTED_MIN_CHARS:
            return m.end()
    return 0


def short_instruction(instruction: str) -> bool:
    """Whether ``instruction`` (a query cut at ``instruction_end``) may be a preamble, so the pooled reading
    alone could miss the task after it: at most ``SHORT_INSTRUCTION_WORDS`` words, unless they are two or
    more ending with a colon and holding no label's word (``LABEL_WORDS``)."""
    head = instruction.rstrip()
    words = [w for w in (w.strip(":").strip("?!.,").lower() for w in head.split()) if w]
    if len(words) > SHORT_INSTRUCTION_WORDS:
        return False
    introduces_material = head.endswith(":") and len(words) >= 2 and LABEL_WORDS.isdisjoint(words)
    return not introduces_material


def _unit(v: np.ndarray) -> np.ndarray:
    norm = float(np.linalg.norm(v))
    return v / norm if norm > 0.0 else v


class HeadInputs:
    """Builds head inputs for one model's layout.

    ``encoder``: the model's encoder (``StaticEncoder`` takes token ids: ``takes_token_ids``).
    ``blocks``: the optional blocks the head reads (``conversation.head_layout``): ``"rarity"``,
    ``"conversation"``. With ``"conversation"`` the embedding reads the last user turn's ids
    followed by its context's (``RequestFeatures.context_text``), cut at the encoder's window.
    ``pooling``: one of ``POOLINGS`` (module docstring). Raises ``ValueError`` for another.
    """

    def __init__(self, encoder: StaticEncoder | TransformerEncoder, blocks: tuple[str, ...] = (),
                 pooling: str = "mean") -> None:
        if pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS}, got {pooling!r}")
        self.encoder = encoder
        self.blocks = blocks
        self.pooling = pooling
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

    def instruction_cut(self, f: RequestFeatures) -> int:
        """Where this layout pools ``f``'s instruction apart from the rest (``instruction_end``), 0 when it
        reads the query as one mean (``mean`` pooling, a turn read with its context, no instruction found)."""
        if self.pooling != "instruction" or (self.reads_conversation and f.context_text):
            return 0
        return instruction_end(f.query_text)

    def _embed(self, f: RequestFeatures, ids: list[int] | None, pooled: bool = True) -> np.ndarray:
        context = f.context_text if self.reads_conversation else ""
        cut = self.instruction_cut(f) if pooled else 0
        if cut:
            return self._instruction_pooled(f.query_text, cut, ids)
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

    def _instruction_pooled(self, query: str, cut: int, ids: list[int] | None) -> np.ndarray:
        """``unit(INSTRUCTION_WEIGHT * unit(E(query[:cut])) + unit(E(query[cut:])))``: float32 (dim,).
        ``ids``: the query's ids when known; the instruction's are its first ones (``_INSTRUCTION_END``)."""
        instruction, rest = query[:cut], query[cut:]
        if self._takes_ids:
            head = self._ids(instruction)
            tail = ids[len(head):] if ids is not None else self._ids(rest)
            e_instruction, e_rest = self.encoder.encode(instruction, head), self.encoder.encode(rest, tail)
        else:
            e_instruction, e_rest = self.encoder.encode(instruction), self.encoder.encode(rest)
        pooled = INSTRUCTION_WEIGHT * _unit(np.asarray(e_instruction, dtype=np.float64)) \
            + _unit(np.asarray(e_rest, dtype=np.float64))
        return _unit(pooled).astype(np.float32)

    def _extra(self, f: RequestFeatures, ids: list[int] | None) -> list[np.ndarray]:
        out: list[np.ndarray] = []
        if self._rarity is not None:
            out.append(self._rarity.vector(self._ids(f.query_text) if ids is None else ids))
        if self.reads_conversation:
            out.append(conversation_vector(f))
        return out

    def vector(self, features: RequestFeatures, query_token_ids: list[int] | None = None,
               pooled: bool = True) -> np.ndarray:
        """The head's input for one request: float32 (1, d). ``query_token_ids``:
        ``tokenizer.encode(features.query_text, add_special_tokens=False).ids`` when known.
        ``pooled=False``: the query read as one mean whatever the layout's pooling (the "whole" reading)."""
        ids = self._query_ids(features, query_token_ids)
        emb = self._embed(features, ids, pooled)
        parts = [emb, request_vector(features), *self._extra(features, ids)]
        return np.concatenate(parts)[None, :].astype(np.float32, copy=False)

    def _query_ids(self, features: RequestFeatures, query_token_ids: list[int] | None) -> list[int] | None:
        """The query's ids ``vector`` reads: ``query_token_ids``, else tokenized when a block or the context needs them."""
        if query_token_ids is None and self._takes_ids and \
                (self._rarity is not None or (self.reads_conversation and features.context_text)):
            return self._ids(features.query_text)
        return query_token_ids

    def whole(self, pooled_row: np.ndarray, features: RequestFeatures,
              query_token_ids: list[int] | None = None) -> np.ndarray:
        """``vector(features, query_token_ids, pooled=False)`` from ``pooled_row``, ``vector(features,
        query_token_ids)`` float32 (1, d): the same markers and blocks (they do not depend on the pooling),
        only the embedding read again as one mean. Float32 (1, d), bit-identical to ``vector``'s."""
        emb = self._embed(features, self._query_ids(features, query_token_ids), pooled=False)
        out = pooled_row.copy()
        out[0, :emb.shape[0]] = emb
        return out

    def matrix(self, features: list[RequestFeatures], query_embeddings: np.ndarray | None = None,
               pooled: bool = True) -> np.ndarray:
        """Head inputs for many requests: float32 (n, d). ``query_embeddings``: the embeddings of
        the ``query_text``s (n, dim) when already computed (a training cache); rows with a
        conversation context, or an instruction apart (``instruction_end``), are embedded again.
        ``pooled=False``: as ``vector``'s."""
        emb = self.encoder.encode_batch([f.query_text for f in features]) if query_embeddings is None \
            else np.array(query_embeddings, dtype=np.float32, copy=True)
        ids: list[list[int] | None] = [None] * len(features)
        if self._rarity is not None or self.reads_conversation:
            ids = [self._ids(f.query_text) for f in features]
        for i, f in enumerate(features):  # the rows whose embedding is not the query window's alone
            context = self.reads_conversation and bool(f.context_text)
            if context or (pooled and self.instruction_cut(f)):
                emb[i] = self._embed(f, ids[i], pooled)
        cols = [emb, request_matrix(features)]
        if self._rarity is not None or self.reads_conversation:
            cols.append(np.stack([np.concatenate(self._extra(f, i)) for f, i in zip(features, ids)])
                        if features else np.zeros((0, 0), dtype=np.float32))
        return np.hstack(cols).astype(np.float32, copy=False)


__all__ = ["INSTRUCTION_WEIGHT", "LABEL_WORDS", "POOLINGS", "SHORT_INSTRUCTION_WORDS", "HeadInputs", "instruction_end",
           "short_instruction"]
