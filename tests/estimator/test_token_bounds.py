"""Token counts that never undercount beyond the documented bound (``estimator/token_bounds.py``):
``prompt_tokens_upper`` is >= the estimator tokenizer's true count and >= 0.85x the largest count of
the other real tokenizers available offline (o200k, cl100k, Claude's, DeepSeek-V3's, shipped with
litellm), for prose, code, logs, numbers, CJK, emoji and whitespace/control padding generated here,
short and sampled, and for prose around a dense middle; and the context-window filter compares that bound."""

from __future__ import annotations

import inspect
import json.decoder
import os
import random
import string
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pointsman.estimator.features import COUNT_SAMPLE_CHARS, extract_features
from pointsman.estimator.model_source import load_estimator
from pointsman.policy.engine import RoutingEngine
from pointsman.policy.fleet import load_fleet
from pointsman.policy.rules.compiler import STATIC_POLICY_PATH, load_policy
from pointsman.policy.selection.filters import NoEligibleTarget
from pointsman.request import request_from_prompt

WORDS = ("the of and to in is that for it as with was on be by this are from at or an which have not but model "
         "request cache token latency prefill decode throughput server policy budget cost answer question "
         "because however although government international development community information").split()
CJK = ("的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家学对可她里后小么心多天而能好"
       "都然没日于起还发成事只作当想看文无开手十用主行方又如前所本见经头面公同三已老从动两长知民样现分将外但身些与高意进把法"
       "此实回二理美点月明其种声全工己话儿者向情部正名定女问力机给等几很业最间新什打便位因重被走电四第门相次东政海口使教西再")


def prose(rng: random.Random, n: int) -> str:
    out, size = [], 0
    while size < n:
        sentence = " ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 18))).capitalize() + rng.choice([". ", ", ", ".\n"])
        out.append(sentence)
        size += len(sentence)
    return "".join(out)[:n]


def code(rng: random.Random, n: int) -> str:
    src = inspect.getsource(json.decoder) + inspect.getsource(string)
    start = rng.randrange(len(src) // 2)
    return ((src[start:] + src) * (n // len(src) + 2))[:n]


def logs(rng: random.Random, n: int) -> str:
    lines, size = [], 0
    while size < n:
        line = (f"2026-12-0{rng.randint(1, 9)}T{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}"
                f".{rng.randint(0, 999):03d}Z {rng.choice(['INFO', 'WARN', 'ERROR'])} [worker-{rng.randint(1, 64)}] "
                f"req={rng.getrandbits(64):016x} ip=10.{rng.randint(0, 255)}.{rng.randint(0, 255)}.{rng.randint(0, 255)} "
                f"path=/v1/{rng.choice(['route', 'outcomes'])} status={rng.choice([200, 413, 429])} took={rng.random() * 900:.3f}ms\n")
        lines.append(line)
        size += len(line)
    return "".join(lines)[:n]


def numbers(rng: random.Random, n: int) -> str:
    rows, size = [], 0
    while size < n:
        row = ",".join(f"{rng.uniform(-1e4, 1e4):.6f}" for _ in range(8)) + "\n"
        rows.append(row)
        size += len(row)
    return "".join(rows)[:n]


def cjk(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(CJK) if rng.random() > 0.08 else rng.choice("，。、") for _ in range(n))


def emoji(rng: random.Random, n: int) -> str:
    out, size = [], 0
    while size < n:
        word = "".join(chr(rng.randint(0x1F600, 0x1F64F)) for _ in range(rng.randint(1, 4))) + " "
        out.append(word)
        size += len(word)
    return "".join(out)[:n]


def padded(rng: random.Random, n: int) -> str:
    """Words between what WordPiece drops and BPE counts: tabs, runs of spaces, zero-width and control characters."""
    out, size = [], 0
    while size < n:
        part = rng.choice(WORDS) + rng.choice(["\t\t", "       ", "\u200b\u200b", "\x01", " \t", "\n\t\t"])
        out.append(part)
        size += len(part)
    return "".join(out)[:n]


KINDS = {"prose": prose, "code": code, "logs": logs, "numbers": numbers, "cjk": cjk, "emoji": emoji, "padded": padded}


def dense_middle(rng: random.Random, middle: str, n: int) -> str:
    """Prose head and tail (what a head-and-tail sample sees) around ``n`` characters of dense text."""
    return prose(rng, 12_000) + "\n" + KINDS[middle](rng, n) + "\n" + prose(rng, 12_000)


def texts() -> list[tuple[str, str]]:
    rng = random.Random(14)
    out = [(f"{kind}-{n}", make(rng, n)) for kind, make in KINDS.items() for n in (3_000, 60_000)]
    out += [(f"prose+{m}-middle-{n}", dense_middle(rng, m, n)) for m in ("logs", "numbers", "code") for n in (5_000, 80_000)]
    return out


TEXTS = texts()


@pytest.fixture(scope="module")
def tokenizer():
    return load_estimator("bundled").tokenizer


def _upper(text: str, tokenizer) -> int:
    # one user message: the bound of its text plus the chat overhead of one message
    features = extract_features(request_from_prompt(text), tokenizer)
    assert features.prompt_tokens_upper >= features.prompt_tokens
    return features.prompt_tokens_upper


@pytest.mark.parametrize("name,text", TEXTS, ids=[n for n, _ in TEXTS])
def test_the_bound_is_at_least_the_true_count_of_the_estimators_tokenizer(tokenizer, name, text):
    true = len(tokenizer.encode(text, add_special_tokens=False).ids)
    assert _upper(text, tokenizer) >= true, name


def _other_tokenizers():
    """The real BPE tokenizers available offline: litellm ships o200k/cl100k (tiktoken cache files) and
    Claude's and DeepSeek-V3's tokenizer.json."""
    try:
        import litellm
        import tiktoken
        from tokenizers import Tokenizer
    except ImportError:
        return {}
    folder = Path(litellm.__file__).parent / "litellm_core_utils" / "tokenizers"
    os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(folder))
    out = {}
    for name in ("o200k_base", "cl100k_base"):
        try:
            out[name] = tiktoken.get_encoding(name).encode_ordinary
        except Exception:  # noqa: BLE001 - not cached offline: left out
            continue
    for name in ("anthropic", "deepseek"):
        path = folder / f"{name}_tokenizer.json"
        if path.exists():
            out[name] = Tokenizer.from_file(str(path)).encode
    return out


@pytest.fixture(scope="module")
def others():
    found = _other_tokenizers()
    if not found:
        pytest.skip("no other tokenizer available offline (litellm's tokenizer files, tiktoken)")
    return found


def _count(encode, text: str) -> int:
    out = encode(text)
    return len(out) if isinstance(out, list) else len(out.ids)


@pytest.mark.parametrize("name,text", TEXTS, ids=[n for n, _ in TEXTS])
def test_the_bound_is_at_least_085_of_the_targets_tokenizers(tokenizer, others, name, text):
    counts = {k: _count(encode, text) for k, encode in others.items()}
    upper = _upper(text, tokenizer)
    assert upper >= 0.85 * max(counts.values()), (name, upper, counts)


def test_a_dense_middle_is_not_extrapolated_from_the_prose_around_it(tokenizer):
    rng = random.Random(5)
    text = dense_middle(rng, "numbers", 150_000)
    assert len(text) > COUNT_SAMPLE_CHARS
    features = extract_features(request_from_prompt(text), tokenizer)
    true = len(tokenizer.encode(text, add_special_tokens=False).ids)
    assert features.prompt_tokens_upper >= true > 1.1 * features.prompt_tokens  # the count alone is short


def test_the_context_window_filter_compares_the_bound():
    """Prose around ~200k tokens of numbers: the sampled count said it fits a 128k window, it does not."""
    fleet = load_fleet()
    engine = RoutingEngine(fleet, load_policy(STATIC_POLICY_PATH, fleet), load_estimator("bundled"))
    text = dense_middle(random.Random(9), "numbers", 300_000)
    true = len(engine.estimator.tokenizer.encode(text, add_special_tokens=False).ids)
    assert true > max(t.context_window_tokens for t in fleet.targets.values())
    with pytest.raises(NoEligibleTarget, match=r"context-window: needs [\d,]+ tokens"):
        engine.route(request_from_prompt(text), dispatch=False)


def _class_units_reference(text: str) -> int:
    """``class_units`` spelled out character by character (the docstring's definition)."""
    units, prev, spaces = 0, "", 0
    for ch in text:
        o = ord(ch)
        word = ch.isascii() and ch.isalnum()
        space = ch in " \x0b\x0c\r"
        if word and prev != "w":
            units += 1
        if space:
            spaces += 1
            if spaces == 2:
                units += 1  # a run of 2 or more spaces
            if spaces % 16 == 0:
                units += 1  # every 16 spaces in a row
        else:
            spaces = 0
        if not (word or space or ch == "\n" or ch == "\t") and o < 128:
            units += 1  # ASCII punctuation and control characters
        elif ch in "\n\t":
            units += 1
        elif o >= 128:
            units += 2 if o >= 0x10000 else 1
        prev = "w" if word else "s" if space else "x"
    return units


@pytest.mark.parametrize("size", [0, 1, 2, 3, 40, 3000, 9000, 40_000])
def test_class_units_counts_by_its_definition_on_both_paths(size):
    """The byte-method path (short texts) and the numpy path (from ``NUMPY_FROM_BYTES``) give the
    character-by-character count, on text mixing every class (runs of spaces of every length)."""
    from pointsman.estimator.token_bounds import NUMPY_FROM_BYTES, class_units

    rng = random.Random(size)
    alphabet = ["word", "Z9", " ", "  ", " " * 17, " " * 33, "\t", "\n", "\r", "\x0b\x0c", ".", ",;", "\u00e9",
                "\u4e2d", "\U0001f600", "\x00", "\x7f", "\u200b", "x" * 120]
    parts, n = [], 0
    while n < size:
        parts.append(rng.choice(alphabet))
        n += len(parts[-1].encode("utf-8"))
    text = "".join(parts)[:size]
    assert class_units(text) == _class_units_reference(text)
    if size >= 9000:
        assert len(text.encode("utf-8", "surrogatepass")) >= NUMPY_FROM_BYTES  # the numpy path ran


_FRAGMENTS = ["word", "Z9", " ", "  ", " " * 15, " " * 16, "\t", "\n", "\r", "\x0b\x0c", ".", ",;", "\u00e9",
              "\u4e2d", "\U0001f600", "\x00", "\x7f", "\u200b", "x" * 120, "\ud800"]


@given(st.lists(st.sampled_from(_FRAGMENTS), min_size=1, max_size=40), st.text(max_size=30))
@settings(max_examples=60, deadline=None)
def test_class_units_of_long_text_is_the_reference_count(parts, extra):
    """The numpy path (with its skipped passes: ASCII text, few adjacent spaces) and the UTF-8 entry point
    count what the character-by-character definition counts, over generated text long enough for numpy."""
    from pointsman.estimator.token_bounds import NUMPY_FROM_BYTES, class_units, class_units_utf8

    unit = "".join(parts) + extra
    raw_unit = len(unit.encode("utf-8", "surrogatepass"))
    text = unit * (NUMPY_FROM_BYTES // max(1, raw_unit) + 1)
    raw = text.encode("utf-8", "surrogatepass")
    assert len(raw) >= NUMPY_FROM_BYTES
    assert class_units(text) == class_units_utf8(raw) == _class_units_reference(text)


_PIECE = st.lists(st.sampled_from(_FRAGMENTS), max_size=12).map("".join)


@given(_PIECE, _PIECE, st.integers(0, 3))
@settings(max_examples=150, deadline=None)
def test_class_units_add_across_a_newline(a, b, repeat):
    """``class_units(a + "\\n" + b) == class_units(a) + 1 + class_units(b)`` (what ``session_texts`` and the
    features' count of a conversation's messages rely on), on both paths (``repeat`` makes texts long enough
    for numpy)."""
    from pointsman.estimator.token_bounds import class_units

    a, b = a * (1 + 300 * repeat), b * (1 + 200 * repeat)
    assert class_units(a + "\n" + b) == class_units(a) + 1 + class_units(b)


