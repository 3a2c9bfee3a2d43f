"""``estimator.wordpiece``: the same token ids as ``tokenizers`` for every text (property), and None
for tokenizers it does not reproduce."""

from __future__ import annotations

import csv
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pointsman.estimator import wordpiece
from pointsman.estimator.encoders import load_tokenizer
from pointsman.estimator.wordpiece import word_piece_ids

TOKENIZER_JSON = Path(__file__).resolve().parents[2] / "estimator" / "default_model" / "tokenizer.json"

#: Characters where BERT and a naive reading disagree: ASCII controls BERT drops (\x0b \x0c \x1c \x1f
#: \x7f, NUL), whitespace Python and BERT split on, accents and combining marks, CJK, emoji, typographic
#: punctuation, zero-width and format characters, U+FFFD, NEL, no-break spaces, characters that
#: lower-case to two, the special tokens' text.
TRICKY = (" \t\n\r\x0b\x0c\x1c\x1f\x7f\x00\x85\xa0\u2000\u2028\u3000\u200b\u200d\xad\ufeff\ufffd"
          "éÉüßİıǅﬁ\u0301\u0308中文字日本語한국어😀👍🏽✓’“”—…«»¿¡‐·")
ALPHABET = st.sampled_from(list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
                                " .,;:!?'\"()[]{}<>-_=+*/\\|@#$%^&~`") + list(TRICKY))
WORDS = st.sampled_from(["the", "tokenization", "unaffable", "[UNK]", "[unk]", "[PAD]", "x" * 101, "a" * 100,
                         "pneumonoultramicroscopicsilicovolcanoconiosis", "don't", "e.g.", "3.14159", "C++",
                         "naïve", "Straße", "ΑΒΓ", "Привет", "東京", "😀😀", "x\u0301", "\x1c", "\t\n"])


@pytest.fixture(scope="module")
def reference():
    return load_tokenizer(TOKENIZER_JSON)


def _same(reference, ids, text: str) -> None:
    assert ids(text) == reference.encode(text, add_special_tokens=False).ids, repr(text)
    pieces = wordpiece.word_piece(reference)
    if getattr(ids, "__self__", None) is pieces:  # the [UNK] offsets equal the library's too
        encoding = reference.encode(text, add_special_tokens=False)
        unk = pieces.unk_offsets(text)
        expected = [span for token_id, span in zip(encoding.ids, encoding.offsets) if token_id == pieces.unk]
        assert (unk.offsets, unk.ids) == (expected, [pieces.unk] * len(expected)), repr(text)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(alphabet=ALPHABET, max_size=300))
def test_ids_equal_the_library_on_generated_characters(reference, text):
    _same(reference, word_piece_ids(reference), text)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.one_of(WORDS, st.text(alphabet=ALPHABET, max_size=12)), max_size=60),
       st.sampled_from([" ", "\n", "", "\t", " \r\n "]))
def test_ids_equal_the_library_on_generated_words(reference, words, sep):
    _same(reference, word_piece_ids(reference), sep.join(words))


def test_ids_equal_the_library_on_real_prompts(reference):
    root = Path(os.environ.get("POINTSMAN_SHARED_DATASETS", Path(__file__).resolve().parents[3] / "shared" / "datasets"))
    path = root / "arena_bench_v1" / "arena_bench_v1_gpt4_single_scores.csv"
    if not path.exists():
        pytest.skip(f"no shared datasets at {root}")
    with open(path, newline="") as f:
        prompts = [row["prompt"] for row in csv.DictReader(f)][:400]
    ids = word_piece_ids(reference)
    for text in prompts + ["\n\n".join(prompts[:40])]:
        _same(reference, ids, text)


@pytest.mark.parametrize("text", ["a😀 😀 b😀c\n😀", "x" * 101 + " " + "x" * 101 + "y", "y" + "x" * 101 + "  " + "x" * 101,
                                  "Müller😀\t😀 😀", "\u3000😀\u3000a😀\u2028😀 x"])
def test_unk_offsets_of_repeated_and_contained_unknown_chunks(reference, text):
    """The [UNK] chunks are found by searching (``wordpiece._chunk_start``): equal chunks, and a chunk inside
    an earlier one, get their own offsets (the library's), with Unicode whitespace between them."""
    _same(reference, word_piece_ids(reference), text)


def test_many_new_non_ascii_chunks_go_to_the_library_whole(reference, monkeypatch):
    ids = word_piece_ids(reference)
    text = " ".join(f"é{i}" for i in range(3 * wordpiece.MAX_LIBRARY_CHUNKS))
    _same(reference, ids, text)
    _same(reference, ids, text + " 😀 x" + "y" * 101)


def test_the_tables_are_bounded(reference, monkeypatch):
    monkeypatch.setattr(wordpiece, "MAX_ENTRIES", 8)
    ids = wordpiece.WordPieceIds(reference, reference.get_vocab(), 1, 100, "##", ["[PAD]", "[UNK]"]).ids
    text = " ".join(f"w{i}x" for i in range(100))
    _same(reference, ids, text)
    _same(reference, ids, text)


def test_other_tokenizers_get_none(reference):
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

    assert word_piece_ids(None) is None
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.Whitespace()
    assert word_piece_ids(bpe) is None
    cased = Tokenizer.from_str(reference.to_str())
    cased.normalizer = normalizers.BertNormalizer(lowercase=False)
    assert word_piece_ids(cased) is None
    truncating = Tokenizer.from_str(reference.to_str())
    truncating.enable_truncation(16)
    assert word_piece_ids(truncating) is None
