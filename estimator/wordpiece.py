"""BERT WordPiece token ids at a fraction of ``tokenizers``' cost, exactly the same ids.

``word_piece_ids(tokenizer)`` returns ``ids(text) -> list[int]``, equal to
``tokenizer.encode(text, add_special_tokens=False).ids`` for the tokenizers of BERT's family
(``BertNormalizer`` lower-casing + ``BertPreTokenizer`` + ``WordPiece``: the MiniLM tokenizer the
bundled model counts and embeds with), or None for any other tokenizer (then callers use
``tokenizers``). Measured on real prompts (``scripts/bench_decision.py``): about 6x less CPU than
``encode_batch_fast`` (~0.25 us per character, most of it offset bookkeeping in the normalizer).

How: BERT tokenization is local to the text between whitespace. The normalizer maps characters one
by one (removing control characters, lower-casing, stripping accents, spacing out CJK characters)
and the pre-tokenizer splits at whitespace and punctuation, so the ids of a text are the ids of its
whitespace-separated chunks, in order. A chunk of ASCII letters, digits and punctuation is
lower-cased and split at punctuation in C (``str.lower``, one regex), and each word is looked up
in a table of words already split into pieces (greedy longest match first, ``##`` continuations,
``[UNK]`` for a word over ``max_input_chars_per_word`` or with no split): natural text repeats its
words, so the table answers almost every word; the chunk's ids are kept too. A chunk with any other
character (accents, CJK, emoji, typographic quotes) is encoded by ``tokenizers`` alone (and kept).
A text with ASCII control characters, or with more than ``MAX_LIBRARY_CHUNKS`` new non-ASCII chunks,
is encoded by ``tokenizers`` whole: Python's ``str.split`` and BERT disagree on what separates
words there (BERT drops ``\\x0b``, ``\\x1c`` ... where Python splits), and a text of thousands of
distinct short non-ASCII chunks costs less in one library call than in one call each.

``unk_offsets(text)`` gives the character offsets of the ``[UNK]`` tokens of ``text`` (what the library's
``encoding.offsets`` says for them), for the token-count bounds (``features``, ``token_bounds``) without a
second library pass over the whole text: an ASCII word is its own span, a non-ASCII chunk holding an
``[UNK]`` is encoded alone by the library (its offsets shifted by the chunk's start; BERT tokens never
cross whitespace, and a character the normalizer drops at a chunk's start belongs to no token either way).
Only the chunks whose ids hold an ``[UNK]`` are looked at (found by searching the text, ``_chunk_start``), and
their spans are kept in a table as their ids are (~90 against ~320 us for a 2,000-character prompt with ten).

The tables are bounded (``MAX_ENTRIES`` each, then cleared); they are shared by the threads of one
process (dict operations hold the GIL; two threads may compute the same entry twice). Equality with
``tokenizers`` is a property test over generated text (``tests/estimator/test_wordpiece.py``).
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Callable
from itertools import chain
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:  # pragma: no cover
    from tokenizers import Tokenizer

#: Entries kept per table (words, chunks) before it is cleared: ~10 MB at most.
MAX_ENTRIES = 1 << 17
#: Longest word or chunk kept in a table (longer ones are split again each time).
MAX_KEPT_CHARS = 64
#: New non-ASCII chunks one text may send to ``tokenizers`` one by one before it is encoded whole.
MAX_LIBRARY_CHUNKS = 32
#: ASCII characters BERT's normalizer removes (controls but tab, newline and carriage return).
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
#: A lower-cased ASCII chunk's words: runs of letters and digits, and each punctuation character.
_ASCII_WORDS = re.compile(r"[a-z0-9]+|[!-/:-@\[-`{-~]")


class UnkOffsets:
    """The ``[UNK]`` tokens of a text as an encoding-like object: ``ids`` (the unknown token's id, once per
    ``[UNK]``) and ``offsets`` (their (start, end) character offsets), in order."""

    __slots__ = ("ids", "offsets")

    def __init__(self, ids: list[int], offsets: list[tuple[int, int]]) -> None:
        self.ids = ids
        self.offsets = offsets


class _Table(dict[str, tuple[int, ...]]):
    """str -> ids, computed by ``make`` on a miss and kept (short keys, bounded size)."""

    def __init__(self, make: Callable[[str], tuple[int, ...]]) -> None:
        super().__init__()
        self._make = make

    def __missing__(self, key: str) -> tuple[int, ...]:
        value = self._make(key)
        if len(key) <= MAX_KEPT_CHARS:
            if len(self) >= MAX_ENTRIES:
                self.clear()
            self[key] = value
        return value


class WordPieceIds:
    """``ids(text)``: ``tokenizer.encode(text, add_special_tokens=False).ids`` (see the module);
    build with ``word_piece_ids``."""

    def __init__(self, tokenizer: Tokenizer, vocab: dict[str, int], unk: int, max_word_chars: int,
                 prefix: str, specials: list[str]) -> None:
        self._tokenizer = tokenizer
        #: added (special) tokens are matched in the raw text before normalization: such a text goes whole
        self._specials = re.compile("|".join(map(re.escape, specials)), re.IGNORECASE) if specials else None
        #: a character every special token starts with and no case mapping changes ("[" for BERT's):
        #: a text without it holds none (the case-insensitive search is the slow part)
        firsts = {t[0] for t in specials if t}
        first = firsts.pop() if len(firsts) == 1 else None
        self._special_start = first if first is not None and first.lower() == first.upper() == first else None
        self._vocab = vocab
        self._unk = unk
        #: The unknown token's id.
        self.unk = unk
        self._max_word = max_word_chars
        self._prefix = prefix
        self._longest = max(map(len, vocab)) if vocab else 1
        self._words = _Table(self._pieces)
        #: chunk -> ids: split here (ASCII) or by the library (any other character)
        self._chunks = _Table(self._chunk)
        #: chunk holding an [UNK] -> its [UNK] tokens' (start, end) offsets in it, flat
        self._unk_spans = _Table(self._chunk_unk_spans)

    def _pieces(self, word: str) -> tuple[int, ...]:
        """WordPiece of one lower-cased ASCII word: greedy longest match, ``##`` continuations."""
        n = len(word)
        if n > self._max_word:
            return (self._unk,)
        vocab, prefix, longest = self._vocab, self._prefix, self._longest
        out: list[int] = []
        start = 0
        while start < n:
            end = min(n, start + longest)
            found = None
            while end > start:
                found = vocab.get(word[start:end] if start == 0 else prefix + word[start:end])
                if found is not None:
                    break
                end -= 1
            if found is None:
                return (self._unk,)
            out.append(found)
            start = end
        return tuple(out)

    def _ascii_chunk(self, chunk: str) -> tuple[int, ...]:
        return tuple(chain.from_iterable(map(self._words.__getitem__, _ASCII_WORDS.findall(chunk.lower()))))

    def _chunk(self, chunk: str) -> tuple[int, ...]:
        if chunk.isascii():
            return self._ascii_chunk(chunk)
        return tuple(self._tokenizer.encode(chunk, add_special_tokens=False).ids)

    def _whole(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def _goes_whole(self, text: str) -> bool:
        """Whether ``text`` goes to the library whole whatever its chunks: special-token text,
        control characters, NEL."""
        if self._specials is not None and (self._special_start is None or self._special_start in text) \
                and self._specials.search(text) is not None:
            return True
        return _CONTROL.search(text) is not None or ("\x85" in text and not text.isascii())

    def _chunk_ids(self, text: str) -> list[tuple[int, ...]] | None:
        """The ids of each chunk of ``text``, or None when ``text`` goes to the library whole (``_goes_whole``,
        or more than ``MAX_LIBRARY_CHUNKS`` distinct non-ASCII chunks not in the table yet)."""
        got = self._split_ids(text)
        return None if got is None else got[1]

    def _split_ids(self, text: str) -> tuple[list[str], list[tuple[int, ...]]] | None:
        """``text``'s chunks (``text.split()``) and ``_chunk_ids(text)``, or None as that."""
        if self._goes_whole(text):
            return None
        chunks, table = text.split(), self._chunks
        if text.isascii():
            return chunks, list(map(table.__getitem__, chunks))
        got: list[tuple[int, ...] | None] = list(map(table.get, chunks))
        if None in got:  # new chunks: too many new non-ASCII ones cost less in one library call
            new = {c for c, ids in zip(chunks, got) if ids is None and not c.isascii()}
            if len(new) > MAX_LIBRARY_CHUNKS:
                return None
            return chunks, [table[c] if ids is None else ids for c, ids in zip(chunks, got)]
        return chunks, cast("list[tuple[int, ...]]", got)  # no None in it

    def ids(self, text: str) -> list[int]:
        """The token ids of ``text`` without special tokens (exactly ``tokenizers``')."""
        got = self._chunk_ids(text)
        if got is None:
            return self._whole(text)
        return list(chain.from_iterable(got))

    def unk_offsets(self, text: str) -> UnkOffsets:
        """The ``[UNK]`` tokens of ``text`` and their character offsets, as the library's encoding of
        ``text`` (no special tokens) has them (see the module). Cost: the chunks' ids (``ids``' pass), a search
        for each chunk holding an ``[UNK]`` (``_chunk_start``) and a library call per such non-ASCII chunk not
        seen before (its spans are kept, as its ids; the whole text when ``ids`` would send it whole)."""
        unk, ids, offsets = self._unk, [], []
        split = self._split_ids(text)
        if split is None:
            encoding = self._tokenizer.encode(text, add_special_tokens=False)
            for token_id, span in zip(encoding.ids, encoding.offsets):
                if token_id == unk:
                    ids.append(unk)
                    offsets.append(span)
            return UnkOffsets(ids, offsets)
        chunks, chunk_ids = split
        start = 0
        for k in [k for k, got in enumerate(chunk_ids) if unk in got]:
            chunk = chunks[k]
            start = _chunk_start(text, chunk, start)
            spans = self._unk_spans[chunk]
            for i in range(0, len(spans), 2):
                ids.append(unk)
                offsets.append((start + spans[i], start + spans[i + 1]))
            start += len(chunk)
        return UnkOffsets(ids, offsets)

    def _chunk_unk_spans(self, chunk: str) -> tuple[int, ...]:
        """The ``[UNK]`` tokens' offsets in one chunk, flat (start, end, start, end ...): an ASCII word is its
        own span; another chunk's are the library's offsets of the chunk encoded alone."""
        spans: list[int] = []
        if chunk.isascii():
            for w in _ASCII_WORDS.finditer(chunk.lower()):
                if self._words[w.group()] == (self._unk,):
                    spans += (w.start(), w.end())
            return tuple(spans)
        encoding = self._tokenizer.encode(chunk, add_special_tokens=False)
        for token_id, (a, b) in zip(encoding.ids, encoding.offsets):
            if token_id == self._unk:
                spans += (a, b)
        return tuple(spans)


def _chunk_start(text: str, chunk: str, start: int) -> int:
    """Where ``chunk``, the next of ``text``'s chunks holding an ``[UNK]`` after offset ``start``, begins: its
    first occurrence from ``start`` between whitespace (or the text's ends). An earlier such occurrence would
    be an earlier chunk equal to it, so holding an ``[UNK]`` too, and found before it."""
    n, end = len(chunk), len(text)
    at = text.find(chunk, start)
    while at >= 0 and not ((at == 0 or text[at - 1].isspace()) and (at + n == end or text[at + n].isspace())):
        at = text.find(chunk, at + 1)
    if at < 0:  # not a chunk of ``text`` after ``start``: a caller's error
        raise ValueError(f"{chunk!r} is not a chunk of the text after offset {start}")
    return at


_BUILT: OrderedDict[int, tuple[Tokenizer, WordPieceIds | None]] = OrderedDict()


def word_piece(tokenizer: Tokenizer | None) -> WordPieceIds | None:
    """``WordPieceIds(tokenizer)`` when ``tokenizer`` is BERT's kind (``BertNormalizer`` with
    lower-casing and text cleaning, ``BertPreTokenizer``, ``WordPiece``), else None. Built once per
    tokenizer object (the last four are kept)."""
    if tokenizer is None:
        return None
    got = _BUILT.get(id(tokenizer))
    if got is not None and got[0] is tokenizer:
        return got[1]
    built = _build(tokenizer)
    _BUILT[id(tokenizer)] = (tokenizer, built)
    while len(_BUILT) > 4:
        _BUILT.popitem(last=False)
    return built


def word_piece_ids(tokenizer: Tokenizer | None) -> Callable[[str], list[int]] | None:
    """``word_piece(tokenizer).ids``, or None when ``tokenizer`` is not BERT's kind."""
    built = word_piece(tokenizer)
    return None if built is None else built.ids


def _build(tokenizer: Tokenizer) -> WordPieceIds | None:
    import json

    from tokenizers import models, normalizers, pre_tokenizers

    model = getattr(tokenizer, "model", None)
    if not (isinstance(getattr(tokenizer, "normalizer", None), normalizers.BertNormalizer)
            and isinstance(getattr(tokenizer, "pre_tokenizer", None), pre_tokenizers.BertPreTokenizer)
            and isinstance(model, models.WordPiece)):
        return None
    # the settings as the tokenizer will apply them (the Python objects do not expose all of them)
    spec = json.loads(tokenizer.to_str())
    norm = spec.get("normalizer") or {}
    # the ASCII path lower-cases and drops control characters itself; accents and CJK go to the library
    if not (norm.get("lowercase") and norm.get("clean_text")) or spec.get("truncation") or spec.get("padding"):
        return None
    vocab = tokenizer.get_vocab(with_added_tokens=False)
    unk = vocab.get(model.unk_token)
    if unk is None:
        return None
    specials = [str(t["content"]) for t in spec.get("added_tokens") or [] if isinstance(t, dict) and t.get("content")]
    return WordPieceIds(tokenizer, vocab, unk, int(model.max_input_chars_per_word), model.continuing_subword_prefix,
                        specials)


__all__ = ["MAX_LIBRARY_CHUNKS", "UnkOffsets", "WordPieceIds", "word_piece", "word_piece_ids"]
