"""``billed_tokens.byte_class_vector`` (Python ints up to ``SMALL_BYTES``, numpy flags above) gives, bit for bit,
the counts of the implementation it replaced (``_reference_vector``: one ``bincount`` of byte-class trigrams at
every size), for text of every category, random Unicode and bytes, and through ``SessionTexts``' reuse of a
conversation's counts."""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from pointsman.estimator import billed_tokens as bt
from pointsman.session_texts import SessionTexts

_spec = importlib.util.spec_from_file_location("token_texts", Path(__file__).parents[2] / "scripts" / "token_texts.py")
token_texts = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(token_texts)


_N, _REPEAT = 12, 11  # the classes, the repeat's class


def _masks() -> dict[str, np.ndarray]:
    a, b, c = np.meshgrid(*(np.arange(_N),) * 3, indexing="ij")
    isin, digit, space, newline, tab, punct = np.isin, bt._DIGIT, bt._SPACE, bt._NEWLINE, bt._TAB, bt._PUNCT
    return {
        "letter_runs": isin(c, bt._LETTERS) & ~isin(b, bt._LETTERS),
        "case_ups": isin(b, bt._LOWER) & isin(c, bt._UPPER),
        "consonant_triples": isin(a, bt._CONSONANTS) & isin(b, bt._CONSONANTS) & isin(c, bt._CONSONANTS),
        "digit_runs": (c == digit) & (b != digit),
        "digit_triples": (a == digit) & (b == digit) & (c == digit),
        "digits_after_space": (b == space) & (c == digit),
        "punctuation_runs": (c == punct) & (b != punct),
        "newline_runs": (c == newline) & (b != newline),
        "controls": c == bt._CONTROL,
        "space_repeats": (a == space) & (b == space) & (c == space),
        "newline_repeats": (a == newline) & (b == newline) & (c == newline),
        "tab_repeats": (a == tab) & (b == tab) & (c == tab),
        "repeats": c == _REPEAT,
    }


_MASKS = {name: mask.ravel() for name, mask in _masks().items()}
_MASK_MATRIX = np.stack(list(_MASKS.values())).astype(np.float64)


def _reference_deep_letters(classes: np.ndarray) -> int:
    run = (classes - np.uint8(1)) < 4
    for step in (1, 2, 4):
        if len(run) <= step:
            return 0
        run = run[:-step] & run[step:]
    return int(np.count_nonzero(run))


def _reference_code_points(raw: bytes) -> np.ndarray:
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


def _reference_vector(raw: bytes) -> np.ndarray:
    """``byte_class_vector`` as commit 50ce528 computed it."""
    classes = np.frombuffer(b"\0\0" + raw.translate(bt._CLASSES), dtype=np.uint8)
    if len(raw) > 2:
        byte = np.frombuffer(raw, dtype=np.uint8)
        same = byte[1:] == byte[:-1]
        repeat = same[1:] & same[:-1] & (((classes[4:] - np.uint8(1)) < 4) | (classes[4:] == bt._PUNCT))
        if repeat.any():
            classes = classes.copy()
            classes[4:][repeat] = _REPEAT
    codes = classes[:-2] * np.uint16(_N * _N)
    codes += classes[1:-1] * np.uint16(_N)
    codes += classes[2:]
    got = dict(zip(_MASKS, (_MASK_MATRIX @ np.bincount(codes, minlength=_N ** 3).astype(np.float64)).tolist()))
    got["digit_groups"] = got["digit_runs"] + got["digit_triples"] / 3
    got["deep_letters"] = _reference_deep_letters(classes)
    got["non_ascii"] = 0.0
    if not raw.isascii():
        got["non_ascii"] = int(bt.char_tokens()[_reference_code_points(raw)].sum(dtype=np.int64)) / 4
    return np.array([got[name] for name in bt.WEIGHTS], dtype=np.float64)


#: what the byte classes and repeats turn on: letters of both cases, vowels, digits, punctuation, spaces, tabs,
#: newlines, controls, bytes of non-ASCII characters, runs of one byte
_PIECES = ["word", "Word", "WORD", "xyzzy", "aaaa", "....", "---", "!!", "12", "0000", " ", "   ", "\t\t\t", "\n", "\r\n\n",
           "\x00", "\x0b", "\x7f", "é", "😀", "漢字", "สวัสดี", "a1b2", "{\"k\": [1, 2]}", "0xdeadbeef", "\u200b", "ZZZZ", "oOoO"]
_TEXT = (st.tuples(st.sampled_from(sorted(token_texts.CATEGORIES)), st.integers(0, 10**6), st.integers(0, 7000))
         .map(lambda c: token_texts.CATEGORIES[c[0]](random.Random(c[1]), c[2]).encode("utf-8", "surrogatepass"))
         | st.text(max_size=300).map(lambda t: t.encode("utf-8", "surrogatepass"))
         | st.lists(st.sampled_from(_PIECES), max_size=400).map(lambda p: "".join(p).encode("utf-8"))
         | st.binary(max_size=300))


@given(_TEXT, st.integers(0, 10**6), st.integers(0, 8))
@example(b"aaa", 0, 0)
@example(b"A" * (bt.SMALL_BYTES + 1), 0, 0)
@settings(max_examples=400, deadline=None)
def test_the_counts_are_those_of_the_replaced_implementation(text, seed, repeat):
    """Every category at 0-7000 characters (both paths and their boundary), cut anywhere (a cut character's
    bytes), spliced, with a stray non-ASCII byte among ASCII text (bytes that are not UTF-8, few), repeated."""
    rng = random.Random(seed)
    i, j = sorted((rng.randint(0, len(text)), rng.randint(0, len(text))))
    stray = text + bytes([rng.randrange(128, 256)]) + b"plain ASCII words after it " * rng.randint(0, 200)
    for raw in (text, text[:j], text[:i] + text[j:], stray, text * repeat, text[:bt.SMALL_BYTES], text[:bt.SMALL_BYTES + 1]):
        assert np.array_equal(bt.byte_class_vector(raw), _reference_vector(raw))


@given(st.lists(_TEXT, min_size=1, max_size=5), st.sampled_from(["s1", None]))
@settings(max_examples=100, deadline=None)
def test_a_conversation_kept_per_session_counts_as_with_the_replaced_implementation(turns, key):
    """Turns added one by one to a conversation kept under a session: ``SessionTexts.billed`` with the new
    counts gives what it gives with the replaced ones (the same counts added the same way)."""
    new, old = SessionTexts(min_bytes=1), SessionTexts(min_bytes=1)
    data = b""
    for turn in turns:
        data += b"\n" + turn if data else turn
        assert np.array_equal(new.billed(data, key, bt.byte_class_vector), old.billed(data, key, _reference_vector))
