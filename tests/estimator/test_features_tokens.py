"""Tokenize once: the query window's token ids cut out of the counting pass equal a second
tokenization of the window exactly, and the estimator's head input is bit-identical with them."""

import random
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, models, pre_tokenizers

from pointsman.estimator.features import (
    COUNT_SAMPLE_CHARS,
    QUERY_WINDOW_CHARS,
    extract_features,
    span_token_ids,
    splits_words_locally,
    tokenized_features,
)
from pointsman.estimator.model_source import load_estimator
from pointsman.request import parse_route_request

# words and characters where a tokenizer's normalizer and word splitting get interesting:
# control characters inside words, lowercasing that grows a character, CJK, accents and
# combining marks (NFD reordering), emoji, words over WordPiece's 100-character limit
ODD = ["ab\x00cd", "İstanbul", "東京タワー", "café naïve", "e\u0301\u0323x", "a\u0345\u0301b", "\ufffd",
       "😀👍🏽", "x" * 150, "foo-bar_baz", "\t\r\n", "Ω≈ç√∫", "ﬁ", "ǅ", "\u200b", "ＡＢＣ", "!?", "3.14159",
       "a" + "\u0301" * 5, "playing", "unbelievably"]
WORDS = ("the of and to in is that for it as with was on be by this are from at or an which have not but "
         "model request cache token latency prefill decode throughput server policy budget cost").split()


@pytest.fixture(scope="module")
def est():
    return load_estimator("bundled")


def _text(rng: random.Random, n_chars: int) -> str:
    parts, size = [], 0
    while size < n_chars:
        piece = rng.choice(ODD) if rng.random() < 0.1 else rng.choice(WORDS)
        piece += rng.choice([" ", " ", " ", "\n", "", ", ", ".\n\n"])
        parts.append(piece)
        size += len(piece)
    return "".join(parts)[:n_chars]


def test_the_bundled_tokenizer_splits_words_locally(est):
    assert splits_words_locally(est.tokenizer)
    assert est.takes_query_token_ids


def test_span_ids_equal_tokenizing_the_span_alone(est):
    tok, rng = est.tokenizer, random.Random(3)
    for _ in range(400):
        text = _text(rng, rng.choice([50, 700, 3000]))
        enc = tok.encode(text, add_special_tokens=False)
        a = rng.randint(0, len(text))
        b = rng.randint(a, len(text))
        assert span_token_ids(enc, text, a, b, tok) == tok.encode(text[a:b], add_special_tokens=False).ids, (a, b)


def test_query_window_ids_equal_a_second_tokenization(est):
    tok, rng = est.tokenizer, random.Random(5)
    seen_windowed = seen_multi = 0
    for _ in range(150):
        messages = [{"role": rng.choice(["system", "user", "assistant", "user"]),
                     "content": _text(rng, rng.choice([1, 300, QUERY_WINDOW_CHARS, 2500, 6000]))}
                    for _ in range(rng.randint(1, 4))]
        request = parse_route_request({"messages": messages})
        features, ids = tokenized_features(request, tok)
        assert features == extract_features(request, tok)
        if len("\n".join(m["content"] for m in messages)) > COUNT_SAMPLE_CHARS:
            assert ids is None  # the conversation was sampled: the caller tokenizes the window
            continue
        assert ids == tok.encode(features.query_text, add_special_tokens=False).ids
        seen_windowed += features.query_chars > QUERY_WINDOW_CHARS
        seen_multi += len(messages) > 1
    assert seen_windowed > 10 and seen_multi > 10


def test_head_input_is_bit_identical_with_the_ids(est):
    rng = random.Random(11)
    for n_chars in (20, 900, 2047, 2049, 5000):
        request = parse_route_request({"messages": [{"role": "system", "content": _text(rng, 300)},
                                                    {"role": "user", "content": _text(rng, n_chars)}]})
        features, ids = tokenized_features(request, est.tokenizer)
        assert ids is not None
        once = est.estimate(features, ids)
        twice = est.estimate(extract_features(request, est.tokenizer))
        assert once.p_hard == twice.p_hard
        assert np.array_equal(once.features, twice.features)


def test_no_ids_without_a_whole_tokenization_or_a_word_local_tokenizer(est):
    request = parse_route_request({"messages": [{"role": "user", "content": "what is a KV cache?"}]})
    assert tokenized_features(request, None)[1] is None
    assert tokenized_features(request, est.tokenizer, with_ids=False)[1] is None
    exact = parse_route_request({"messages": [{"role": "user", "content": "hi"}], "routing": {"prompt_tokens": 9}})
    assert tokenized_features(exact, est.tokenizer)[1] is None  # nothing was tokenized
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel()
    assert not splits_words_locally(bpe)
    assert tokenized_features(request, bpe)[1] is None


@pytest.mark.parametrize("text", ["", "Hello World 42", "ÀÉ Σσ ٣٤ ǅ Ⅻ 𝐀 ＡＢＣ １２ ² ß İ", "plain ascii, no caps",
                                  "MIXED Case 2024-11-29 and 中文 ２"])
def test_marker_upper_and_digit_counts_match_their_definitions(text):
    import re

    from pointsman.estimator.markers import _upper_and_digits

    digits = re.findall(r"\d", text)
    assert _upper_and_digits(text) == (sum(1 for c in text if c.isupper()), len(digits),
                                       sum(1 for d in digits if not d.isascii()))


def test_marker_regex_shortcuts_count_what_the_regexes_count():
    """The shortcuts (only the branches whose strings the text holds, choices per line, no digits no
    numbers) give the regexes' own counts on prompts built from the pieces each pattern looks for."""
    from pointsman.estimator import markers as m

    pieces = ["A) yes", "(b) no", "c. maybe", "D: x", "Answer:", "Answer: \n", "options:", "option:", "```",
              "    indented", "\t", "=>", "x;", "a; \n", "{", "}", "#include <stdio.h>", "<div>", "</a-b>", "f()",
              "3 + 4", "12,5", "1.5", "$x$", "\\frac", "\\sqrt", "\\(", "٣ × ٤", "no digits here", "\n", "\n\n",
              " ", "Which option is right?", "B)\tfoo", "(A).", "e) not a choice",
              # the call branch counted apart (markers._calls): a \w before (), covered or not by another match
              "    f()", "     _()", "    \tg()", "#include()", "é()", "()", "x()()", "(()", "1()", "٣()", "    ()"]
    rng = random.Random(17)
    for _ in range(3000):
        text = "".join(rng.choice(pieces) + rng.choice(["", " ", "\n"]) for _ in range(rng.randint(0, 12)))
        _, digits, wide_digits = m._upper_and_digits(text)
        assert m._code_symbols(text) == len(m._CODE_SYMBOLS.findall(text)), text
        assert m._operators(text, digits, wide_digits) == len(m._OPERATOR.findall(text)), text
        assert m._numbers(text, digits, wide_digits) == len(re.findall(r"\d+(?:[.,]\d+)?", text)), text
        assert m._choices(text) == len(m._CHOICES.findall(text)), text
        if not digits:
            assert not m._NUMBER.findall(text)
            if "\\" not in text and "$" not in text:
                assert not m._OPERATOR.findall(text), text


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(list("ax_9é٣ \n\t();{}<>=#$\\`+*") + ["    ", "\n    f()", "#include", "()", "```", "</b>", "1.5", "\\frac"]),
                max_size=40).map("".join))
def test_marker_code_and_math_counts_match_the_regexes(text):
    """The code, number and operator counts (branch subsets, the call branch apart, ``[0-9]`` for ASCII
    digits) are the regexes' own, over text made of what their branches look for."""
    from pointsman.estimator import markers as m

    _, digits, wide_digits = m._upper_and_digits(text)
    assert m._code_symbols(text) == len(m._CODE_SYMBOLS.findall(text))
    assert m._operators(text, digits, wide_digits) == len(m._OPERATOR.findall(text))
    assert m._numbers(text, digits, wide_digits) == len(re.findall(r"\d+(?:[.,]\d+)?", text))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(list("abcXYZ09 +\n\t.-_") + ["++", "C++", "\u212a", "İ", "é", "ß", "ǅ", "٣", "２",
                                                             "Ⅻ", "😀", "\ud800", "中"]), max_size=60).map("".join))
def test_marker_words_and_counts_match_their_definitions(text):
    import re

    from pointsman.estimator import markers as m

    assert m._words(text.lower()) == m._WORD.findall(text.lower())
    words = m._words(text.lower()) + ["sum", "code", "json", "format", "explain", "logic", "given"] * (len(text) % 3)
    assert m._vocab_counts(words) == {name: m._count_words(words, vocab) for name, vocab in m._VOCABS.items()}
    digits = re.findall(r"\d", text)
    assert m._upper_and_digits(text) == (sum(1 for c in text if c.isupper()), len(digits),
                                         sum(1 for d in digits if not d.isascii()))
    assert m._numbers(text, len(digits), sum(1 for d in digits if not d.isascii())) == \
        len(re.findall(r"\d+(?:[.,]\d+)?", text))  # the pattern as first written


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(list("abcGIV ++\n\t\r.") + ["given", "Below", "\x85", "\xa0", "\u2028", "\x1c", "İ",
                                                             "ΑΣ", "Σ", "ß", "\ud800", "中"]), max_size=30).map("".join))
def test_the_first_line_words_of_a_text_of_one_line_are_its_words(text):
    """``request_vector`` reads a text of one line's (stripped) first-line words as its words: stripping
    (Unicode whitespace, not only ``\\n``) changes no run of ``[a-z]`` in the lower-cased text."""
    from pointsman.estimator import markers as m

    stripped = text.strip()
    if stripped and "\n" not in stripped:
        assert m._words(stripped.split("\n", 1)[0].lower()) == m._words(text.lower())


def _hex(n: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    return "".join(rng.choice("0123456789abcdef") for _ in range(n))


@pytest.mark.parametrize("text,at_least", [
    ("x" * 101, 101 // 4),
    ("see " + "x" * 101 + " here", 101 // 4 + 2),
    ("y" * 60 + "\x1c" + "y" * 60, 120 // 4),  # the control character is dropped: one 120-char word
    (_hex(600_000), 150_000),  # sampled for counting
    ("ACGT" * 150_000, 150_000),
    ("x" * 8_000_000, 2_000_000),
])
def test_words_longer_than_wordpiece_allows_count_one_token_per_4_chars(est, text, at_least):
    # WordPiece makes any word over 100 characters a single [UNK]; counted as such, 8 MB is 981 tokens
    features = extract_features(parse_route_request({"messages": [{"role": "user", "content": text}]}), est.tokenizer)
    assert at_least <= features.prompt_tokens <= 1.05 * at_least + 10, features.prompt_tokens


def test_long_words_count_the_same_on_the_offsets_path(est):
    # a system message makes the user turn a window cut out of the counting pass (offsets tracked)
    body = {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hash: " + _hex(2000)}]}
    features, ids = tokenized_features(parse_route_request(body), est.tokenizer)
    assert ids is not None and ids.count(est.tokenizer.token_to_id("[UNK]")) == 1  # the encoder input is unchanged
    assert features.prompt_tokens == 2 + 2 + 500 + 2 * 4  # "be brief", "hash :", [UNK] counted as 2000/4, 2 messages


def test_ordinary_prompts_count_exactly_their_tokens(est):
    rng = random.Random(5)
    for n_chars in (50, 3000, COUNT_SAMPLE_CHARS):
        text = _text(rng, n_chars).replace("x" * 150, "xyz")
        request = parse_route_request({"messages": [{"role": "user", "content": text}]})
        exact = len(est.tokenizer.encode(text, add_special_tokens=False).ids)
        assert extract_features(request, est.tokenizer).prompt_tokens == exact + 4


def test_an_implausibly_low_supplied_count_does_not_shrink_the_bound(est):
    """A gateway's ``routing.prompt_tokens`` of 10 for 200 KB of text (a count of the last turn, say) is
    not trusted: the prompt is counted and bounded as if no count was sent; a plausible one wins."""
    text = "The cache holds the prefix of every request. " * 4500  # ~200 KB, ~45k tokens
    low = parse_route_request({"messages": [{"role": "user", "content": text}], "routing": {"prompt_tokens": 10}})
    unsent = parse_route_request({"messages": [{"role": "user", "content": text}]})
    f_low, f_unsent = extract_features(low, est.tokenizer), extract_features(unsent, est.tokenizer)
    assert not f_low.prompt_tokens_exact
    assert (f_low.prompt_tokens, f_low.prompt_tokens_upper) == (f_unsent.prompt_tokens, f_unsent.prompt_tokens_upper)
    assert f_low.prompt_tokens_upper > 40_000
    plausible = parse_route_request({"messages": [{"role": "user", "content": text}],
                                     "routing": {"prompt_tokens": 40_000}})  # about its real count
    f_ok = extract_features(plausible, est.tokenizer)
    assert f_ok.prompt_tokens_exact and f_ok.prompt_tokens == f_ok.prompt_tokens_upper == 40_000


def test_the_context_window_filter_sees_through_an_implausibly_low_supplied_count():
    """Through the engine: 600 KB sent with ``routing.prompt_tokens: 10`` fits no target's window, so the
    decision is refused by the ``context_window`` filter instead of being routed (finding B)."""
    from pointsman.estimator.estimate import FixedDifficulty
    from pointsman.policy.engine import RoutingEngine
    from pointsman.policy.fleet import load_fleet
    from pointsman.policy.rules.compiler import DEFAULT_POLICY_PATH, load_policy
    from pointsman.policy.selection.filters import NoEligibleTarget

    fleet = load_fleet()
    engine = RoutingEngine(fleet, load_policy(DEFAULT_POLICY_PATH, fleet), FixedDifficulty(0.3))
    text = "Summarise this log line by line. " * 20_000  # ~660 KB, ~140k tokens by any tokenizer
    request = parse_route_request({"messages": [{"role": "user", "content": text}], "routing": {"prompt_tokens": 10}})
    with pytest.raises(NoEligibleTarget) as refused:
        engine.route(request)
    assert "context-window: needs" in str(refused.value)


def test_a_count_of_the_last_turn_only_or_without_the_messages_is_not_trusted(est):
    """Review finding 4: a supplied count that covers the last turn of a long conversation (15 characters
    per token overall, under the 16 limit) or leaves out 60,000 short messages is counted here instead."""
    turn = "The router reads the cache state before it decides where the prompt goes. "
    convo = [{"role": "user", "content": turn * 800}, {"role": "assistant", "content": turn * 800},
             {"role": "user", "content": turn * 400}]
    last_turn_only = extract_features(parse_route_request({"messages": convo, "routing": {"prompt_tokens": 5_700}}),
                                      est.tokenizer)
    assert not last_turn_only.prompt_tokens_exact and last_turn_only.prompt_tokens > 25_000
    many = [{"role": "user" if i % 2 == 0 else "assistant", "content": "ok"} for i in range(6_000)]
    short = extract_features(parse_route_request({"messages": many, "routing": {"prompt_tokens": 750}}), est.tokenizer)
    assert not short.prompt_tokens_exact and short.prompt_tokens >= 6_000
    honest = extract_features(parse_route_request({"messages": convo, "routing": {"prompt_tokens": 28_000}}),
                              est.tokenizer)
    assert honest.prompt_tokens_exact and honest.prompt_tokens == 28_000


def test_tool_definitions_and_images_count_as_prompt_tokens(est):
    """Review finding 3: 800 KB of tool definitions and 200 images counted as no tokens, so the request
    passed the context-window filter at a tiny estimated cost. Tools count as their JSON text (after the
    messages), images as IMAGE_TOKENS each (IMAGE_TOKENS_UPPER in the bound)."""
    from pointsman.estimator.features import IMAGE_TOKENS, IMAGE_TOKENS_UPPER
    from pointsman.policy.selection.filters import NoEligibleTarget

    tool = {"type": "function", "function": {"name": "lookup", "description": "Look up a record by its key. " * 40,
                                             "parameters": {"type": "object", "properties": {}}}}
    plain = {"messages": [{"role": "user", "content": "Which tool fits?"}]}
    with_tools = {**plain, "tools": [tool] * 600}  # ~800 KB of JSON
    f_plain = extract_features(parse_route_request(plain), est.tokenizer)
    f_tools = extract_features(parse_route_request(with_tools), est.tokenizer)
    assert f_tools.prompt_tokens > 100_000 and f_tools.prompt_tokens_upper >= f_tools.prompt_tokens
    assert f_tools.query_text == f_plain.query_text  # the estimator still reads the user's turn
    image = {"type": "image_url", "image_url": {"url": "https://example.com/a.png", "detail": "high"}}
    pics = {"messages": [{"role": "user", "content": [{"type": "text", "text": "Which tool fits?"}] + [image] * 200}]}
    f_pics = extract_features(parse_route_request(pics), est.tokenizer)
    assert f_pics.prompt_tokens - f_plain.prompt_tokens == 200 * IMAGE_TOKENS
    assert f_pics.prompt_tokens_upper - f_plain.prompt_tokens_upper == 200 * IMAGE_TOKENS_UPPER

    from pointsman.estimator.estimate import FixedDifficulty
    from pointsman.policy.engine import RoutingEngine
    from pointsman.policy.fleet import load_fleet
    from pointsman.policy.rules.compiler import DEFAULT_POLICY_PATH, load_policy

    fleet = load_fleet()
    engine = RoutingEngine(fleet, load_policy(DEFAULT_POLICY_PATH, fleet), FixedDifficulty(0.3))
    with pytest.raises(NoEligibleTarget, match="context-window: needs"):
        engine.route(parse_route_request(with_tools))
