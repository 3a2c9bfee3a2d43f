"""The prompt's token count that prices it: an estimate of what the targets' BPE tokenizers count, made to
err high (``request.prompt_tokens``, the cost estimate, the budget hold; ``RequestFeatures.billed_prompt_tokens``).

Why not the estimator's count (``features.count_tokens``, ``RequestFeatures.prompt_tokens``): it counts with
BERT's WordPiece, which drops newlines, reads a word of emoji or Thai (or any word over 100 characters: hex,
base64, digits, DNA) as one ``[UNK]`` (counted at ~4 characters per token), and gives a CJK character one token
where BPE gives 1-3. Against the largest count of o200k, cl100k, Claude's and DeepSeek-V3's tokenizers it
reads Thai at 0.03x, emoji 0.07x, a hex run 0.43x, a digit run 0.60x, Chinese 0.86x. It stays what the
difficulty estimator reads (its model was trained on it: ``log_prompt_tokens``); the money reads this one.

``billed_tokens(text, vocabulary_count) = max(vocabulary_count, ceil(byte_class_estimate(text)))``:

- ``vocabulary_count`` is the estimator's count: a vocabulary knows English and code words (a rare word is
  split as BPE splits it), which no byte statistic does;
- ``byte_class_estimate`` is ``WEIGHTS`` times ``byte_class_counts``: counts over the whole UTF-8 text of
  byte-class runs, pairs and triples (byte operations, no tokenizer), and per non-ASCII character the most tokens any
  of the four tokenizers gives it alone (``char_tokens.bin``, ~7 KB, built by ``scripts/build_char_tokens.py``).
  The fitted weights solve a linear program (``scripts/measure_token_counts.py --fit``) over generated and
  real texts of every category (``scripts/token_texts.py``): the larger of the two at or above 1.03x the
  largest real count wherever the vocabulary count is below it (0.9x for prose and code), least overshoot,
  English and code weighted most. An LP over a sample: its answer moves with the sample (letter runs
  0.93-1.14 across the samples tried); the held-out measurement is the evidence.

Measured ratios and cost: ``docs/policy.md`` ("Token counts on the safe side"). Known gaps: letter soup of an
alphabetic script other than Latin (random Cyrillic letters: real words merge, soup does not) reads ~0.7x;
short soup of ASCII symbols, digits and letters 0.88-1.0x; Russian prose reads 1.66x (the vocabulary count).
"""

from __future__ import annotations

import functools
import math
import zlib
from pathlib import Path

import numpy as np

#: The characters' token table: one byte per code point (U+0000..U+10FFFF), quarter tokens, zlib-compressed.
CHAR_TOKENS_PATH = Path(__file__).with_name("char_tokens.bin")

#: Weight of each count of ``byte_class_counts`` (tokens per count; the non-ASCII table's sum at 1.0x).
WEIGHTS = {
    "letter_runs": 0.93, "case_ups": 0.29, "consonant_triples": 1.33, "deep_letters": 0.23, "digit_groups": 1.36,
    "digits_after_space": 1.61, "punctuation_runs": 1.02, "newline_runs": 1.59, "non_ascii": 1.08,
    # not fitted (the texts the weights were fitted on have none): every tokenizer gives an ASCII control
    # character a token of its own, and merges at most 64 spaces, 16 newlines, 8 tabs in a row into one
    "controls": 1.0, "space_repeats": 1 / 64, "newline_repeats": 1 / 16, "tab_repeats": 1 / 8,
    # a letter or punctuation byte that repeats the two before it ("xxxxxxxx", "--------"): at most 8 in a row
    # make a token (``'-' * 400``: 6 tokens in o200k, ``'a' * 400``: 50)
    "repeats": 1 / 8,
}

# byte classes: 0 a byte of a non-ASCII character, 1 lower vowel, 2 lower consonant, 3 upper vowel, 4 upper
# consonant, 5 digit, 6 punctuation, 7 newline, 8 space, 9 tab, 10 another control character (VT, FF, DEL...),
# and a repeat: a letter or punctuation byte equal to the two bytes before it, of no class (no count but its own)
_LOWER, _UPPER, _CONSONANTS, _LETTERS = (1, 2), (3, 4), (2, 4), (1, 2, 3, 4)
_DIGIT, _PUNCT, _NEWLINE, _SPACE, _TAB, _CONTROL = 5, 6, 7, 8, 9, 10


def _class(b: int) -> int:
    if b >= 128:
        return 0
    c = chr(b)
    if c.isalpha():
        return (1 if c.islower() else 3) + (c not in "aeiouAEIOU")
    if c.isdigit():
        return _DIGIT
    return _NEWLINE if c in "\n\r" else _SPACE if c == " " else _TAB if c == "\t" else \
        _CONTROL if b < 32 or b == 127 else _PUNCT


_CLASSES = bytes(_class(b) for b in range(256))


@functools.cache
def char_tokens() -> np.ndarray:
    """Quarter tokens per code point (uint8, 0x110000,), read once from ``CHAR_TOKENS_PATH``."""
    return np.frombuffer(zlib.decompress(CHAR_TOKENS_PATH.read_bytes()), dtype=np.uint8)


def byte_class_counts(text: str, raw: bytes | None = None) -> dict[str, float]:
    """The counts ``WEIGHTS`` weighs, of ``text`` (``raw``: its UTF-8, ``surrogatepass``, when the caller has it),
    by name: ``byte_class_vector``."""
    vector = byte_class_vector(text.encode("utf-8", "surrogatepass") if raw is None else raw)
    return dict(zip(WEIGHTS, vector.tolist()))


def byte_class_vector(raw: bytes) -> np.ndarray:
    """The counts ``WEIGHTS`` weighs (float64, in its order) of the UTF-8 text ``raw``: per byte its class, a
    letter or punctuation byte equal to the two before it a repeat (of no other count); runs start where the
    class before differs (two bytes of no class before ``raw``); ``digit_groups`` = digit runs + a third of the
    digits with two before them; ``deep_letters`` and the non-ASCII characters' table sum. Additive across a
    newline: ``v(a + b) == v(a) + v(b)`` when ``a`` ends with one and ``b`` starts with none (what
    ``session_texts`` reuses). O(len(raw)): up to ``SMALL_BYTES`` by ~30 operations on Python ints holding a
    byte per byte (``_small_counts``), above it by ~20 numpy passes over the same flags (``_numpy_counts``);
    both give the same counts."""
    got = _small_counts(raw) if len(raw) <= SMALL_BYTES else _numpy_counts(raw)
    got["digit_groups"] = got["digit_runs"] + got["digit_triples"] / 3
    got["non_ascii"] = 0.0
    if not raw.isascii():
        got["non_ascii"] = int(char_tokens()[_code_points(raw)].sum(dtype=np.int64)) / 4
    return np.array([got[name] for name in WEIGHTS], dtype=np.float64)


# a byte's flags (``_FLAGS``; in the small path a byte per byte of the text in a Python int, byte i at bits
# 8i..8i+7: shifting left by 8 moves each byte onto the next one's lane, zero lanes before the text): bit 0
# letter, 1 lower letter, 2 upper letter, 3 consonant, 4 digit, 5 punctuation, 6 newline, 7 space
_LETTER, _LOWER_BIT, _UPPER_BIT, _CONSONANT_BIT, _DIGIT_BIT, _PUNCT_BIT, _NEWLINE_BIT, _SPACE_BIT = range(8)
_FLAGS = bytes((c in _LETTERS) | (c in _LOWER) << 1 | (c in _UPPER) << 2 | (c in _CONSONANTS) << 3 | (c == _DIGIT) << 4
               | (c == _PUNCT) << 5 | (c == _NEWLINE) << 6 | (c == _SPACE) << 7 for c in _CLASSES)
_TABS = bytes(c == _TAB for c in _CLASSES)
_NOT_CONTROL = bytes(b for b in range(256) if _CLASSES[b] != _CONTROL)
#: Longest text (bytes) ``byte_class_vector`` counts with Python ints (``_small_counts``): below it their ~30
#: operations cost less than numpy's passes and per-call overhead (English: 16 us against 44 at 1 KB, 27 against
#: 48 at 2 KB, even at 4 KB; code, JSON, emoji in text about the same).
SMALL_BYTES = 4096
_LANES = SMALL_BYTES + 8
#: per flag bit, that bit set in every lane; 0x7F, 0x80 in every lane
_BIT = [int.from_bytes(bytes([1 << bit]) * _LANES, "little") for bit in range(8)]
_K7F = int.from_bytes(b"\x7f" * _LANES, "little")


def _numpy_counts(raw: bytes) -> dict[str, float]:
    """``_small_counts(raw)`` (any length) with numpy: the same flags as uint8 arrays (``p``, ``c``: of the byte
    before and of the byte; ``a``: two before), a count of a flag bit per ``count_nonzero``; ~20 passes of byte
    operations (no left shift of uint8: numpy 2.4's is not vectorised, ``p + p`` is)."""
    n = len(raw)
    b = np.frombuffer(raw, dtype=np.uint8)
    cnz = np.count_nonzero
    f = np.frombuffer(b"\0\0" + raw.translate(_FLAGS), dtype=np.uint8)  # two lanes of no flag before the text
    a, p, c = f[:-2], f[1:-1], f[2:]
    tabs = cnz(b == 9)
    controls = cnz(c == 0) - tabs - (0 if raw.isascii() else cnz(b >= 128))  # no flag: control, tab or non-ASCII
    repeats = 0
    if n > 2:
        same = b[1:] == b[:-1]
        repeat = same[1:] & same[:-1]
        repeat &= (c[2:] & np.uint8(0b100001)) != 0  # a letter or punctuation byte equal to the two before it
        if repeat.any():
            at = np.flatnonzero(repeat) + 4
            f = f.copy()
            f[at] &= ~np.uint8(0b101111)  # a repeat is of no letter or punctuation count
            a, p, c = f[:-2], f[1:-1], f[2:]
            repeats = len(at)

    def bits(x: np.ndarray, bit: int) -> float:
        return float(cnz(x & np.uint8(1 << bit)))

    starts = c & ~p
    triples = c & p
    triples &= a
    deep = 0
    if n >= 6:  # letters with 7 letters before them (the two lanes before the text have none)
        run = (f & np.uint8(1)).view(bool)
        for step in (1, 2, 4):
            run = run[:-step] & run[step:]
        deep = int(cnz(run))
    tab_triples = 0
    if tabs >= 3:
        t = b == 9
        tab_triples = int(cnz(t[2:] & t[1:-1] & t[:-2]))
    return {
        "letter_runs": bits(starts, _LETTER), "case_ups": bits((p + p) & c, _UPPER_BIT),  # lower (bit 1) before
        "consonant_triples": bits(triples, _CONSONANT_BIT), "digit_runs": bits(starts, _DIGIT_BIT),
        "digit_triples": bits(triples, _DIGIT_BIT),
        "digits_after_space": bits((p >> np.uint8(3)) & c, _DIGIT_BIT),  # space (bit 7) before
        "punctuation_runs": bits(starts, _PUNCT_BIT), "newline_runs": bits(starts, _NEWLINE_BIT),
        "controls": float(controls), "space_repeats": bits(triples, _SPACE_BIT),
        "newline_repeats": bits(triples, _NEWLINE_BIT), "tab_repeats": float(tab_triples), "repeats": float(repeats),
        "deep_letters": deep,
    }


def _small_counts(raw: bytes) -> dict[str, float]:
    """The counts ``WEIGHTS`` weighs but ``digit_groups`` and ``non_ascii`` (by name, floats; with ``digit_runs`` and
    ``digit_triples``) of ``raw`` (``len(raw) <= SMALL_BYTES``) from Python ints of ``raw``'s bytes and flags
    (``_FLAGS``): a flag's run starts are ``f & ~(f << 8)``, its triples ``f & f << 8 & f << 16``, counted by
    ``int.bit_count`` of one bit per lane; repeats by the exact zero-byte test of ``x ^ (x << 8)``."""
    f = int.from_bytes(raw.translate(_FLAGS), "little")
    x = int.from_bytes(raw, "little")
    d = x ^ (x << 8)  # lane i: raw[i] ^ raw[i - 1]
    cut = 8 * (_LANES - len(raw) - 1)  # constants of lanes 0..len(raw), as long as d (an operation costs the longer)
    k7f = _K7F >> cut
    equal = ~(((d & k7f) + k7f) | d) & (_BIT[7] >> cut)  # 0x80 where raw[i] == raw[i - 1] (no carry leaves a lane)
    repeat = equal & (equal << 8) & ((f << 7) | (f << 2))  # and raw[i - 2]; a letter (bit 0) or punctuation (5)
    if repeat:
        repeat >>= 7
        f &= ~(repeat * 0b101111)  # a repeat is of no letter or punctuation count
    starts = f & ~(f << 8)
    triples = f & (f << 8) & (f << 16)
    deep = f & (f << 8)
    deep &= deep << 16
    deep &= deep << 32
    tabs = 0
    if b"\t\t\t" in raw:
        t = int.from_bytes(raw.translate(_TABS), "little")
        tabs = (t & (t << 8) & (t << 16)).bit_count()
    return {
        "letter_runs": float((starts & _BIT[_LETTER]).bit_count()),
        "case_ups": float(((f << 9) & f & _BIT[_UPPER_BIT]).bit_count()),  # lower (bit 1) one lane before
        "consonant_triples": float((triples & _BIT[_CONSONANT_BIT]).bit_count()),
        "digit_runs": float((starts & _BIT[_DIGIT_BIT]).bit_count()),
        "digit_triples": float((triples & _BIT[_DIGIT_BIT]).bit_count()),
        "digits_after_space": float(((f << 5) & f & _BIT[_DIGIT_BIT]).bit_count()),  # space (bit 7) one lane before
        "punctuation_runs": float((starts & _BIT[_PUNCT_BIT]).bit_count()),
        "newline_runs": float((starts & _BIT[_NEWLINE_BIT]).bit_count()),
        "controls": float(len(raw.translate(None, _NOT_CONTROL))),  # the non-controls deleted
        "space_repeats": float((triples & _BIT[_SPACE_BIT]).bit_count()),
        "newline_repeats": float((triples & _BIT[_NEWLINE_BIT]).bit_count()),
        "tab_repeats": float(tabs),
        "repeats": float(repeat.bit_count()),
        "deep_letters": (deep & _BIT[_LETTER]).bit_count(),
    }


def _code_points(raw: bytes) -> np.ndarray:
    """The code points of ``raw``'s non-ASCII characters: decoded from their UTF-8 lead and continuation bytes
    with numpy where they are few (one pass over the bytes, then theirs: ~0.1 ms for 450 KB of English with a
    few), by the codecs where they are many (over 1 in 16 bytes: CJK text, ~2 ms for 450,000 characters, where
    numpy's gathers took ~40) and up to ``SMALL_BYTES`` (numpy's dozen calls cost more there: ~8 us against ~20
    at 2 KB). Bytes that are not UTF-8 (no text the service makes) decode to some code point."""
    if len(raw) <= SMALL_BYTES:
        try:  # the codecs' code points of UTF-8 are those numpy decodes
            cp = np.frombuffer(raw.decode("utf-8", "surrogatepass").encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
            return cp[cp >= 128]
        except UnicodeDecodeError:
            pass
    b = np.frombuffer(raw + b"\0\0\0", dtype=np.uint8)
    lead = np.flatnonzero(b[:-3] >= 0xC0)
    if 16 * len(lead) > len(raw):
        try:
            text = raw.decode("utf-8", "surrogatepass")
        except UnicodeDecodeError:
            text = raw.decode("utf-8", "replace")
        cp = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
        return cp[cp >= 128]
    b0, b1, b2, b3 = (b[lead + k].astype(np.int64) & (0xFF if k == 0 else 0x3F) for k in range(4))
    cp = np.where(b0 < 0xE0, (b0 & 0x1F) << 6 | b1,
                  np.where(b0 < 0xF0, (b0 & 0x0F) << 12 | b1 << 6 | b2, (b0 & 0x07) << 18 | b1 << 12 | b2 << 6 | b3))
    return np.minimum(cp, 0x10FFFF)


#: ``WEIGHTS`` as a vector in ``byte_class_vector``'s order.
WEIGHT_VECTOR = np.array(list(WEIGHTS.values()), dtype=np.float64)


def byte_class_estimate(text: str, raw: bytes | None = None) -> float:
    """``WEIGHTS`` · ``byte_class_counts(text, raw)``: the byte statistics' token estimate of ``text``."""
    return float(WEIGHT_VECTOR @ byte_class_vector(text.encode("utf-8", "surrogatepass") if raw is None else raw))


def billed_tokens(text: str, vocabulary_count: int, raw: bytes | None = None) -> int:
    """The tokens ``text`` is priced at: ``max(vocabulary_count, ceil(byte_class_estimate(text)))``
    (``vocabulary_count``: the estimator's count of ``text``, ``features.count_tokens``)."""
    return max(vocabulary_count, math.ceil(byte_class_estimate(text, raw)))
