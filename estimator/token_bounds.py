"""A safe-side upper bound of a prompt's token count, for the eligibility decisions that must not
undercount (the context-window filter): ``request.prompt_tokens_upper``.

Why a bound beside the count: ``features.count_tokens`` counts with the estimator's tokenizer
(BERT's WordPiece for the bundled model), and past ``COUNT_SAMPLE_CHARS`` it tokenizes a sample and
extrapolates. Two things make that count too low for a target's window:

- the targets' own tokenizers (BPE: OpenAI's o200k/cl100k, Claude's, DeepSeek's) count what WordPiece
  drops or folds: whitespace runs (a newline and its indentation are a token in BPE, nothing in
  WordPiece) and characters outside the vocabulary (a word of emoji or rare CJK characters is one
  ``[UNK]`` in WordPiece, a few byte-level tokens per character in BPE);
- a sample misses what it does not see: head and tail of prose around 100 KB of logs or numbers
  in the middle extrapolated to 0.55x of the true count.

The bound, per tokenized piece: its ids, plus for every ``[UNK]`` its span's UTF-8 bytes at
``UNK_BYTES_PER_TOKEN`` per token (instead of 1), plus one token per newline; at least its
``class_units`` (below), which count what WordPiece's normalizer drops (control and zero-width
characters, tabs, long runs of spaces). Past
``COUNT_SAMPLE_CHARS`` the pieces are the head, the tail and ``MIDDLE_SLICES`` slices spread over the
middle (``sample_pieces``), and the part no piece covers is bounded by the larger of two
extrapolations: the pieces' mean tokens per character, and the largest tokens per *class unit*
among the pieces times the class units of the unseen part. ``class_units(text)`` is a cheap count
over the whole text (C-speed byte operations): ASCII punctuation and control characters, runs of
ASCII letters and digits, newlines, tabs, runs of spaces and non-ASCII characters (4-byte ones,
emoji, twice), about the pre-tokens every tokenizer starts from; so a dense middle the slices missed still counts.

Documented bound (``tests/estimator/test_token_bounds.py``, text generated in the test: prose, code,
logs, numbers, CJK, emoji, whitespace/control padding, and prose around a dense middle): the bound is >= the estimator
tokenizer's true count, and >= 0.85x of the largest count of o200k, cl100k, Claude's and
DeepSeek-V3's tokenizers when they are available offline (litellm ships them). It is not a proof
for every text: a text whose unseen middle has more tokens per class unit than every piece
(mixed scripts, say) can exceed it; uniformly random CJK code points reach 0.84x of cl100k's count,
a run of combining marks 0.5x of Claude's. A gateway that knows the exact count sends
``routing.prompt_tokens``, and then that is both the count and the bound (unless it is implausibly low:
``features.MAX_CHARS_PER_SUPPLIED_TOKEN``).
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from tokenizers import Encoding, Tokenizer

    from pointsman.estimator.wordpiece import UnkOffsets

#: Bytes of an ``[UNK]`` span per token in the bound: a 3-byte character counts 2, a 4-byte one 3 (BPE
#: tokenizers give an emoji 1-3 tokens, a CJK character outside their merges 2-3, a hex run about one
#: per 2-3 bytes).
UNK_BYTES_PER_TOKEN = 1.5
#: Slices spread over the middle of a sampled text, beside its head and tail.
MIDDLE_SLICES = 8


def sample_pieces(text: str, budget_chars: int) -> list[str]:
    """``text`` as one piece when it fits ``budget_chars``, else its head (1/4 of the budget), its
    tail (1/4) and ``MIDDLE_SLICES`` equal slices (together 1/2) at evenly spaced places of the
    middle. Pieces are cut on character offsets (a cut word costs at most a token more)."""
    n = len(text)
    if n <= budget_chars:
        return [text]
    edge = budget_chars // 4
    size = (budget_chars - 2 * edge) // MIDDLE_SLICES
    middle = n - 2 * edge
    step = middle / MIDDLE_SLICES
    pieces = [text[:edge]]
    for i in range(MIDDLE_SLICES):
        start = edge + int(i * step + (step - size) / 2)
        pieces.append(text[start:start + size])
    pieces.append(text[n - edge:])
    return pieces


# byte classes: w = ASCII letter/digit, s = other ASCII whitespace, n = newline, p = ASCII punctuation
# and control, c = UTF-8 continuation byte, u = start of a 2- or 3-byte character, e = of a 4-byte one
_CLASSES = bytes(
    ord("w") if (48 <= b <= 57 or 65 <= b <= 90 or 97 <= b <= 122) else
    ord("n") if b == 10 else
    ord("t") if b == 9 else
    ord("s") if b in (11, 12, 13, 32) else
    ord("p") if b < 128 else
    ord("c") if b < 0xC0 else
    ord("u") if b < 0xF0 else ord("e")
    for b in range(256))
#: the classes folded into w (a letter or digit), s (a space) and x (anything else), to count runs
_FOLDED = bytes(b if b in (ord("w"), ord("s")) else ord("x") for b in range(256))


#: Encoded length from which ``class_units`` counts with numpy (one vectorised pass per class instead of
#: CPython's two- and three-byte substring searches, which crawl on text where the first byte is everywhere):
#: ~3x faster on 500 KB; below this the bytes methods' lower overhead wins.
NUMPY_FROM_BYTES = 8192


def class_units(text: str) -> int:
    """Cheap pre-token count of ``text``: ASCII punctuation and control characters + runs of ASCII
    letters and digits + newlines + tabs + runs of 2 or more spaces, and every 16 spaces in a row,
    + non-ASCII characters
    (4-byte ones twice). What WordPiece drops and BPE counts (control and zero-width characters,
    tabs, long runs of spaces) is in it. O(len(text)) in byte operations (numpy from
    ``NUMPY_FROM_BYTES``; both ways give the same count, ``tests/estimator/test_token_bounds.py``)."""
    if not text:
        return 0
    return class_units_utf8(text.encode("utf-8", "surrogatepass"))


def class_units_utf8(raw: bytes) -> int:
    """``class_units`` of a text given as its UTF-8 ``raw`` (``surrogatepass`` for a lone surrogate), for a
    caller that has the bytes already (``RequestView.utf8``): the same count without encoding again."""
    if len(raw) >= NUMPY_FROM_BYTES:
        return _class_units_numpy(raw)
    if not raw:
        return 0
    k = raw.translate(_CLASSES)
    folded = k.translate(_FOLDED)
    runs = folded.count(b"xw") + folded.count(b"sw") + (k[:1] == b"w")
    space_runs = folded.count(b"xss") + folded.count(b"wss") + (k[:2] == b"ss")
    return (k.count(b"p") + k.count(b"n") + k.count(b"t") + k.count(b"s" * 16) + k.count(b"u") + 2 * k.count(b"e")
            + runs + space_runs)


def _class_units_numpy(raw: bytes) -> int:
    """``class_units`` of UTF-8 ``raw`` (at least 3 bytes) with numpy: the byte classes of ``_CLASSES`` as
    boolean masks (uint8 arithmetic wraps, so ``a - 48 < 10`` tests 48..57), run starts as rising edges.
    Passes a text cannot need are skipped: the lead bytes of an ASCII text, the space runs and the 16-space
    count of a text with fewer adjacent spaces than they need."""
    a = np.frombuffer(raw, dtype=np.uint8)
    cnz = np.count_nonzero
    high = cnz(a >= 0x80)
    leads = cnz(a >= 0xC0) + cnz(a >= 0xF0) if high else 0  # u once, e twice
    word = ((a | 32) - 97 < 26) | (a - 48 < 10)  # ASCII letter or digit
    space = (a == 32) | (a - 11 < 3)  # 11, 12, 13, 32
    newlines, tabs = cnz(a == 10), cnz(a == 9)
    ascii_other = len(a) - high - cnz(word) - cnz(space) - newlines - tabs  # class p
    runs = cnz(word[1:] > word[:-1]) + int(word[0])
    pairs = space[1:] & space[:-1]  # pairs[i]: a space at i and at i + 1
    n_pairs = cnz(pairs)
    space_runs = cnz(pairs[1:] > space[:-2]) + int(pairs[0]) if n_pairs else 0
    # 16 spaces in a row hold 15 pairs
    sixteens = space.view(np.uint8).tobytes().count(b"\x01" * 16) if n_pairs >= 15 else 0
    return int(ascii_other + newlines + tabs + leads + runs + space_runs + sixteens)


@functools.lru_cache(maxsize=8)
def unk_id(tokenizer: Tokenizer) -> int | None:
    """The id of ``tokenizer``'s model's unknown token (None without one), read once per tokenizer
    object (the tokenizers objects' properties cost a few µs a read; a tokenizer's model is set when it is
    loaded, ``encoders.load_tokenizer``)."""
    unk_token = getattr(getattr(tokenizer, "model", None), "unk_token", None)
    return tokenizer.token_to_id(unk_token) if isinstance(unk_token, str) else None


def unk_byte_tokens(text: str, ids: list[int], encoding: Encoding | UnkOffsets | None, tokenizer: Tokenizer) -> int:
    """Tokens to add to ``len(ids)`` (``text``'s ids, no special tokens) for its ``[UNK]`` tokens,
    each counted by its span's UTF-8 bytes at ``UNK_BYTES_PER_TOKEN`` per token instead of as 1.
    0 when the tokenizer has no unknown token or ``ids`` holds none. ``encoding``: ``text``
    encoded with offsets (or its ``[UNK]`` tokens alone, ``wordpiece.UnkOffsets``), or None to encode
    it again here when needed."""
    unk = unk_id(tokenizer)
    if unk is None or unk not in ids:
        return 0
    if encoding is None:
        encoding = tokenizer.encode(text, add_special_tokens=False)
    extra = 0
    for token_id, (a, b) in zip(encoding.ids, encoding.offsets):
        if token_id == unk:
            extra += math.ceil(len(text[a:b].encode("utf-8", "surrogatepass")) / UNK_BYTES_PER_TOKEN) - 1
    return max(0, extra)


def piece_upper(text: str, ids: list[int], encoding: Encoding | UnkOffsets | None,
                tokenizer: Tokenizer) -> tuple[int, int, int]:
    """The bound for one tokenized piece as (ids + one token per newline, the rest up to the bound:
    the ``[UNK]`` bytes' extra tokens, or more when ``class_units`` is larger than both together,
    the piece's ``class_units``)."""
    base = len(ids) + text.count("\n")
    units = class_units(text)
    bound = max(base + unk_byte_tokens(text, ids, encoding, tokenizer), units)
    return base, bound - base, units


def extrapolated_upper(text: str, pieces: list[str], bounds: list[tuple[int, int, int]],
                       units: int | None = None) -> int:
    """The bound of ``text`` from its sampled ``pieces`` (``sample_pieces``) and their ``piece_upper``
    values: their sum plus, for the characters no piece covers, the larger of (mean tokens per
    character) x characters and (largest ids per class unit of a piece) x class units. ``units``:
    ``class_units(text)`` when the caller has it (``class_units_utf8`` of bytes it has), else computed."""
    total = sum(base + extra for base, extra, _ in bounds)
    seen_chars = sum(len(p) for p in pieces)
    rest_chars = max(0, len(text) - seen_chars)
    if rest_chars == 0:
        return total
    units = class_units(text) if units is None else units
    rest_units = max(0, units - sum(piece_units for _, _, piece_units in bounds))
    per_char = total / max(1, seen_chars)
    per_unit = max(1.0, *(base / max(1, piece_units) for base, _, piece_units in bounds))
    return total + math.ceil(max(per_char * rest_chars, per_unit * rest_units))
