"""Cheap request features for the difficulty head: numbers from ``RequestFeatures``
plus text markers (code, math, question type, format constraints) computed on the
bounded query window.

``request_vector(features) -> np.ndarray`` float32 of shape ``(len(FEATURE_NAMES),)``.
Cost is bounded: markers read only ``features.query_text`` (at most
``QUERY_WINDOW_CHARS`` characters, ~0.3 ms). Values are raw (counts as ``log1p``,
flags 0/1, shares 0–1); the head standardizes them.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from pointsman.estimator.features import RequestFeatures

_WORD = re.compile(r"[a-z]+(?:\+\+)?")
#: The code-symbol pattern's branches, in order, each with the strings one of which every match of it holds.
_CODE_BRANCHES = ((r"```", ("```",)), (r"^ {4,}\S", ("    ",)), (r"\t", ("\t",)), (r"=>", ("=>",)),
                  (r";[ \t]*$", (";",)), (r"[{}]", ("{", "}")), (r"#include", ("#include",)),
                  (r"</?[a-zA-Z][\w-]{0,20}>", ("<",)), (r"\w\(\)", ("()",)))
#: The math-operator pattern's branches, each with what every match of it holds (None: a digit).
_OPERATOR_BRANCHES = ((r"\d\s*[-+*/^=<>×÷%]\s*\d", None), (r"\\frac", "\\"), (r"\\sqrt", "\\"),
                      (r"\$[^$\n]+\$", "$"), (r"\\\(", "\\"))
_CODE_SYMBOLS = re.compile("|".join(b for b, _ in _CODE_BRANCHES), re.MULTILINE)
_CODE_WORDS = frozenset(
    "def return import class function print select console python javascript java c++ sql rust golang bash "
    "typescript html css regex api json yaml docker kubernetes linux git code script compile bug debug "
    "variable array string int const var lambda async await".split()
)
_MATH_WORDS = frozenset(
    "calculate compute solve equation equations integral derivative probability percent percentage average "
    "sum product prove theorem total ratio area volume multiply divide fraction factor prime matrix algebra "
    "geometry statistics formula".split()
)
_MATH_PHRASES = ("how many", "how much", "square root")
#: Patterns are written to begin with a single character or class (``\d\d*``, not ``\d+``): then ``re`` skips
#: to where that can match instead of trying the whole pattern at every character (~2x less time).
_NUMBER = re.compile(r"\d\d*(?:[.,]\d+)?")
#: ``_NUMBER`` for a text whose only decimal digits are ASCII (there ``\d`` is ``[0-9]``, a cheaper test).
_ASCII_NUMBER = re.compile(r"[0-9][0-9]*(?:[.,][0-9]+)?")
_DIGIT = re.compile(r"\d")
_OPERATOR = re.compile("|".join(b for b, _ in _OPERATOR_BRANCHES))
#: ``_OPERATOR_BRANCHES``' patterns for a text whose only decimal digits are ASCII.
_ASCII_OPERATOR_PATTERNS = tuple(b.replace("\\d", "[0-9]") for b, _ in _OPERATOR_BRANCHES)
_WH_WORDS = frozenset("what who whom whose when where which why how".split())
_YESNO_WORDS = frozenset("is are was were can could do does did will would should shall has have may".split())
_CREATIVE_WORDS = frozenset(
    "write compose draft create generate rewrite paraphrase imagine pretend brainstorm suggest describe "
    "design plan invent".split()
)
_EXPLAIN_WORDS = frozenset("explain summarize summarise advice tips ideas recommend opinion".split())
_FORMAT_WORDS = frozenset(
    "bullet table json csv markdown format exactly must capitalize capital uppercase lowercase alphabetical "
    "rhyme rhyming acrostic words sentences paragraphs characters".split()
)
_FORMAT_PHRASES = (
    "do not", "don't", "only output", "only respond", "only answer", "start with", "end with",
    "each word", "each sentence", "each line",
)
_CHOICES = re.compile(r"^[ \t]*\(?[A-Da-d][).:][ \t]+\S|\bAnswer:[ \t]*$|\boptions?:", re.MULTILINE)
#: ``_CHOICES``' first branch alone, matched at the start of a line.
_CHOICE_LINE = re.compile(r"[ \t]*\(?[A-Da-d][).:][ \t]+\S")
_SUBSETS: dict[tuple[str, tuple[bool, ...]], re.Pattern[str] | None] = {}


def _subset(name: str, branches: tuple[str, ...], present: tuple[bool, ...], flags: int = 0) -> re.Pattern[str] | None:
    """The alternation of the ``branches`` marked ``present``, in their order (None: none is): it finds the
    same matches as the whole alternation in a text where the others cannot match (at every place the
    first branch that matches is the same), and a pattern of one literal-led branch is scanned for its
    first character instead of trying every branch at every character. Compiled once per subset."""
    key = (name, present)
    if key not in _SUBSETS:
        chosen = [b for b, p in zip(branches, present) if p]
        _SUBSETS[key] = re.compile("|".join(chosen), flags) if chosen else None
    return _SUBSETS[key]
_REASONING_WORDS = frozenset(
    "reason reasoning logic logical puzzle riddle deduce infer assume assumption therefore contradiction".split()
)
_REASONING_PHRASES = ("step by step", "if and only if", "true or false", "which of the following")
_GIVEN_WORDS = frozenset("given following below above".split())
_PARAGRAPH = re.compile(r"\n[ \t]*\n")

FEATURE_NAMES: tuple[str, ...] = (
    "log_prompt_tokens",
    "log_query_chars",
    "log_turns",
    "log_messages",
    "has_system",
    "has_tools",
    "has_images",
    "log_tool_calls",
    "log_lines",
    "log_code_markers",
    "log_math_words",
    "log_numbers",
    "log_math_operators",
    "digit_share",
    "symbol_share",
    "upper_share",
    "non_ascii_share",
    "ends_with_question",
    "log_question_marks",
    "wh_question",
    "yes_no_question",
    "creative_request",
    "explain_request",
    "log_format_constraints",
    "multiple_choice",
    "log_reasoning_markers",
    "given_input",
    "log_paragraphs",
)


_ASCII_UPPER = bytes(range(ord("A"), ord("Z") + 1))
_ASCII_DIGITS = b"0123456789"


#: Bytes that are not ASCII lower-case letters, mapped to a space (UTF-8 bytes of other characters are >= 0x80).
_NOT_A_TO_Z = bytes(b if 97 <= b <= 122 else 32 for b in range(256))
_NON_ASCII = re.compile(r"[^\x00-\x7f][^\x00-\x7f]*")


def _words(lower: str) -> list[str]:
    """``_WORD.findall(lower)``: without ``++`` in ``lower`` its words are its runs of ``[a-z]``, split out
    with byte operations instead of a match object per word."""
    if "++" in lower:
        return _WORD.findall(lower)
    return lower.encode("utf-8", "surrogatepass").translate(_NOT_A_TO_Z).decode("ascii").split()


def _count_words(words: list[str], vocab: frozenset[str]) -> int:
    return sum(map(vocab.__contains__, words))


#: The word lists ``request_vector`` counts, by name.
_VOCABS: dict[str, frozenset[str]] = {"code": _CODE_WORDS, "math": _MATH_WORDS, "explain": _EXPLAIN_WORDS,
                                      "format": _FORMAT_WORDS, "reasoning": _REASONING_WORDS}


def _lists_of_words() -> dict[str, tuple[str, ...]]:
    out: dict[str, tuple[str, ...]] = {}
    for name, vocab in _VOCABS.items():
        for w in vocab:
            out[w] = (*out.get(w, ()), name)
    return out


#: For each word of the lists, the names of the lists it is in.
_VOCAB_OF = _lists_of_words()


def _vocab_counts(words: list[str]) -> dict[str, int]:
    """``_count_words(words, vocab)`` for every list of ``_VOCABS``, in one lookup per word."""
    counts = dict.fromkeys(_VOCABS, 0)
    for w in filter(_VOCAB_OF.__contains__, words):
        for name in _VOCAB_OF[w]:
            counts[name] += 1
    return counts


def _upper_and_digits(text: str) -> tuple[int, int, int]:
    """(characters with ``str.isupper()``, characters ``\\d`` matches, those of them not ASCII) in ``text``;
    its ASCII characters (A-Z and 0-9 exactly) counted on bytes."""
    raw = text.encode("ascii", "ignore")  # the ASCII characters
    upper, digits = len(raw) - len(raw.translate(None, _ASCII_UPPER)), len(raw) - len(raw.translate(None, _ASCII_DIGITS))
    if len(raw) == len(text):
        return upper, digits, 0
    rest = "".join(_NON_ASCII.findall(text))  # the others, looked at one by one
    wide = len(_DIGIT.findall(rest))
    return upper + sum(map(str.isupper, rest)), digits + wide, wide


#: Every string of ``_CODE_BRANCHES``, and for each branch the positions of its strings in that tuple.
_CODE_NEEDLES = tuple(dict.fromkeys(n for _, needles in _CODE_BRANCHES for n in needles))
_CODE_NEEDLE_AT = tuple(tuple(_CODE_NEEDLES.index(n) for n in needles) for _, needles in _CODE_BRANCHES)
_CODE_PATTERNS = tuple(b for b, _ in _CODE_BRANCHES)
_OPERATOR_PATTERNS = tuple(b for b, _ in _OPERATOR_BRANCHES)


_WORD_CHAR = re.compile(r"\w")


def _calls(text: str) -> int | None:
    """How many matches of the code pattern's last branch, ``\\w\\(\\)``, ``_CODE_SYMBOLS.findall(text)`` finds,
    or None when that is not sure without running it. That branch begins with ``\\w``, so ``re`` tries the
    whole alternation at every character; counted apart instead, as its occurrences (a ``\\w`` before a
    ``()``): no other branch can match at a ``\\w``, a ``(`` or a ``)``, so the others' matches are the same with
    or without it, and an occurrence is a match unless another match covers its ``\\w``, which only one
    ending on it can (an indented line's first character, ``^ {4,}\\S``, or ``#include``'s ``e``): then None."""
    count, at = 0, text.find("()", 1)
    while at > 0:
        end = at - 1  # the \w's place
        if _WORD_CHAR.match(text, end):
            line = text.rfind("\n", 0, end) + 1
            if text.endswith("#include", 0, at) or (end - line >= 4 and text.count(" ", line, end) == end - line):
                return None
            count += 1
        at = text.find("()", at + 2)
    return count


def _code_symbols(text: str) -> int:
    """``len(_CODE_SYMBOLS.findall(text))``, with only the branches whose strings ``text`` holds (``_subset``),
    the last one counted apart (``_calls``); 0 without scanning when none does."""
    held = tuple(map(text.__contains__, _CODE_NEEDLES))
    if not any(held):
        return 0
    present = tuple(any(held[i] for i in at) for at in _CODE_NEEDLE_AT)
    calls = _calls(text) if present[-1] else 0
    if calls is not None:
        present = (*present[:-1], False)
    pattern = _subset("code", _CODE_PATTERNS, present, re.MULTILINE)
    return (calls or 0) + (0 if pattern is None else len(pattern.findall(text)))


def _numbers(text: str, digits: int, wide_digits: int) -> int:
    """``len(_NUMBER.findall(text))`` (``digits``: how many characters of ``text`` ``\\d`` matches, ``wide_digits``
    how many of them are not ASCII): every match holds a digit."""
    if not digits:
        return 0
    return len((_NUMBER if wide_digits else _ASCII_NUMBER).findall(text))


def _operators(text: str, digits: int, wide_digits: int) -> int:
    """``len(_OPERATOR.findall(text))`` (``digits``, ``wide_digits``: as ``_numbers``'), with only the branches
    ``text`` can match (``_subset``), ``\\d`` written ``[0-9]`` when its digits are ASCII."""
    if not digits and "\\" not in text and "$" not in text:  # every branch's match holds one of these
        return 0
    present = tuple(digits > 0 if needle is None else needle in text for _, needle in _OPERATOR_BRANCHES)
    if wide_digits:
        pattern = _subset("operator", _OPERATOR_PATTERNS, present)
    else:
        pattern = _subset("ascii operator", _ASCII_OPERATOR_PATTERNS, present)
    return 0 if pattern is None else len(pattern.findall(text))


def _choices(text: str) -> int:
    """``len(_CHOICES.findall(text))``. Without ``Answer:`` or ``option`` only the first branch
    can match; its matches start at a line start and hold no newline, so they are counted per
    line (the same count, without trying three branches at every character)."""
    if "Answer:" in text or "option" in text:
        return len(_CHOICES.findall(text))
    return sum(1 for line in text.split("\n") if _CHOICE_LINE.match(line))


def _count_phrases(lower: str, phrases: tuple[str, ...]) -> int:
    return sum(map(lower.count, phrases))


def request_vector(features: RequestFeatures) -> np.ndarray:
    """Cheap features of one request, in ``FEATURE_NAMES`` order.

    Returns float32 array (len(FEATURE_NAMES),). Reads ``features.query_text`` (bounded
    window of the last user message) and the numeric fields of ``RequestFeatures``.
    Word markers are counted on lower-cased ``[a-z]+`` words; question and request
    types look at the first 3 words of the query (its verb or question word).
    """
    text = features.query_text or ""
    n = max(len(text), 1)
    stripped = text.strip()
    lower = text.lower()
    words = _words(lower)
    vocab = _vocab_counts(words)
    head = words[:3]
    # a text of one line (stripped) has its words on its first line: the [a-z] runs stripping cannot change
    first_line_words = [] if not stripped else words if "\n" not in stripped else \
        _words(stripped.split("\n", 1)[0].lower())
    upper, digits, wide_digits = _upper_and_digits(text)
    letters = sum(map(len, words))
    non_ascii = len(text) - len(text.encode("ascii", "ignore"))
    newlines = text.count("\n")
    spaces = text.count(" ") + newlines + text.count("\t")
    symbols = max(len(text) - spaces - letters - digits - non_ascii, 0)
    values = (
        math.log1p(features.prompt_tokens),
        math.log1p(features.query_chars),
        math.log1p(features.turns),
        math.log1p(features.n_messages),
        float(features.system_chars > 0),
        float(features.has_tools),
        float(features.has_images),
        math.log1p(features.n_tool_calls),
        math.log1p(newlines),
        math.log1p(_code_symbols(text) + vocab["code"]),
        math.log1p(vocab["math"] + _count_phrases(lower, _MATH_PHRASES)),
        math.log1p(_numbers(text, digits, wide_digits)),
        math.log1p(_operators(text, digits, wide_digits)),
        digits / n,
        symbols / n,
        min(upper / max(letters, 1), 1.0),
        non_ascii / n,
        float(stripped.endswith("?")),
        math.log1p(text.count("?")),
        float(bool(head) and head[0] in _WH_WORDS),
        float(bool(head) and head[0] in _YESNO_WORDS),
        float(not _CREATIVE_WORDS.isdisjoint(head)),
        float(vocab["explain"] > 0),
        math.log1p(vocab["format"] + _count_phrases(lower, _FORMAT_PHRASES)),
        float(_choices(text) >= 2),
        math.log1p(vocab["reasoning"] + _count_phrases(lower, _REASONING_PHRASES)),
        float(not _GIVEN_WORDS.isdisjoint(first_line_words)),
        math.log1p(len(_PARAGRAPH.findall(stripped)) + (1 if stripped else 0)),
    )
    return np.asarray(values, dtype=np.float32)


def request_matrix(features: list[RequestFeatures]) -> np.ndarray:
    """``request_vector`` for many requests: float32 array (n, len(FEATURE_NAMES))."""
    if not features:
        return np.zeros((0, len(FEATURE_NAMES)), dtype=np.float32)
    return np.stack([request_vector(f) for f in features])
