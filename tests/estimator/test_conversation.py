"""Conversations read whole: earlier user turns in bounded windows, a short turn inheriting what it
continues, the optional head-input blocks (``estimator.conversation``, ``estimator.head_inputs``)."""

import functools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pointsman.estimator.conversation import (
    CONVERSATION_NAMES,
    RARITY_NAMES,
    VocabularyRarity,
    block_names,
    conversation_vector,
    head_layout,
)
from pointsman.estimator.difficulty import DifficultyEstimator, read_alone
from pointsman.estimator.encoders import make_encoder
from pointsman.estimator.features import CONTEXT_TURNS, CONTEXT_WINDOW_CHARS, extract_features
from pointsman.estimator.head_inputs import HeadInputs
from pointsman.estimator.manifest import read_manifest
from pointsman.estimator.markers import FEATURE_NAMES
from pointsman.estimator.model_source import bundled_model_dir
from pointsman.request import parse_route_request

HARD = ("Implement a lock-free multi-producer multi-consumer queue in C++ with hazard pointers, "
        "and prove that it is linearizable.")
EASY = "Suggest a cute name for my new kitten."


def _features(*turns: str, tokenizer=None):
    messages = []
    for i, t in enumerate(turns):
        messages.append({"role": "user", "content": t})
        if i < len(turns) - 1:
            messages.append({"role": "assistant", "content": "Sure, here it is. " * 20})
    return extract_features(parse_route_request({"messages": messages}), tokenizer)


@pytest.fixture(scope="module")
def encoder():
    d = bundled_model_dir()
    return make_encoder(d, read_manifest(d).encoder)


def _cos(a, b):
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_context_is_earlier_user_turns_most_recent_first():
    f = _features("first question", "second question", "yes")
    assert f.query_text == "yes"
    assert f.context_text == "second question\nfirst question"
    assert f.context_chars == len("second question") + len("first question")
    assert _features("only turn").context_text == ""


def test_context_cost_is_bounded_for_long_conversations():
    turns = [f"turn {i} " + "x" * 5000 for i in range(200)] + ["go on"]
    f = _features(*turns)
    parts = f.context_text.split("\n")
    assert len(parts) <= CONTEXT_TURNS * 2  # each window may hold one joining newline
    assert len(f.context_text) <= CONTEXT_TURNS * (CONTEXT_WINDOW_CHARS + 1)
    assert f.context_text.startswith("turn 199 ")  # the most recent earlier turn first
    assert f.context_chars == sum(len(t) for t in turns[-1 - CONTEXT_TURNS:-1])


def test_tool_result_after_a_user_turn_reads_that_turn():
    request = parse_route_request({"messages": [
        {"role": "user", "content": HARD},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "run", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
    ]})
    f = extract_features(request)
    assert f.query_text == HARD and f.context_text == ""


def test_a_short_follow_up_is_at_least_as_hard_as_what_it_continues():
    """The estimator scores a short follow-up as the larger p_hard of the request it continues and of
    itself read alone: "yes, do it" after a hard request scores at least the request alone (exactly it
    when the follow-up alone scores lower), and a short hard question after "hi" keeps its own score."""
    est = DifficultyEstimator(bundled_model_dir())
    tok = est.tokenizer

    def p(f):
        return est.estimate(f).p_hard

    for first, short in ((HARD, "yes, do it"), (HARD, "go on"), (EASY, "thanks"), ("hi", "Prove the Collatz conjecture.")):
        f = _features(first, short, tokenizer=tok)
        assert f.continues is not None and f.continues.query_text == first
        alone = p(read_alone(f))
        assert p(f) == pytest.approx(max(alone, p(f.continues)), abs=1e-6)  # float32: a batch of two vs one
        assert p(f) >= p(_features(first, tokenizer=tok))  # the continued request alone: the same features
    # a chain of short turns continues the last long one (or the first turn): one cut, no recursion
    chain = _features(HARD, "ok", "go on", tokenizer=tok)
    assert chain.continues is not None and chain.continues.query_text == HARD and chain.continues.continues is None


def test_long_turn_keeps_its_own_difficulty(encoder):
    inputs = HeadInputs(encoder, ("conversation",))
    dim = encoder.dim
    alone = inputs.vector(_features(HARD, tokenizer=encoder.tokenizer))[0, :dim]
    after_easy = inputs.vector(_features(EASY, HARD, tokenizer=encoder.tokenizer))[0, :dim]
    assert _cos(alone, after_easy) > 0.9


def test_vector_and_matrix_agree_and_layout_names(encoder):
    blocks = ("rarity", "conversation")
    inputs = HeadInputs(encoder, blocks)
    feats = [_features(HARD, tokenizer=encoder.tokenizer), _features(EASY, "go on", tokenizer=encoder.tokenizer),
             _features("hi", tokenizer=encoder.tokenizer)]
    M = inputs.matrix(feats)
    assert M.shape == (3, encoder.dim + len(FEATURE_NAMES) + len(RARITY_NAMES) + len(CONVERSATION_NAMES))
    for i, f in enumerate(feats):
        np.testing.assert_allclose(inputs.vector(f)[0], M[i], atol=1e-6)
    names = [f"emb_{i}" for i in range(encoder.dim)] + list(FEATURE_NAMES) + block_names(blocks)
    assert head_layout(names, encoder.dim) == blocks
    assert head_layout(names[: encoder.dim + len(FEATURE_NAMES)], encoder.dim) == ()
    assert head_layout(names + ["extra"], encoder.dim) is None
    assert conversation_vector(feats[1])[1] == 1.0 and conversation_vector(feats[0])[1] == 0.0


def test_rarity_orders_common_and_rare_words(encoder):
    rarity = VocabularyRarity(encoder.tokenizer)
    tok = encoder.tokenizer
    common = rarity.vector(tok.encode("the cat is on the mat", add_special_tokens=False).ids)
    rare = rarity.vector(tok.encode("linearizability of hazard pointers", add_special_tokens=False).ids)
    assert rare[0] > common[0] and rare[3] > common[3]
    assert np.all(rarity.vector([]) == 0)


def test_shipped_model_reads_the_conversation():
    """Through the engine's path (tokenized_features -> estimate with the query's ids)."""
    from pointsman.estimator.features import tokenized_features
    from pointsman.estimator.model_source import load_estimator

    est = load_estimator("bundled")
    assert "conversation" in est.blocks

    def p_hard(*turns):
        messages = []
        for i, t in enumerate(turns):
            messages.append({"role": "user", "content": t})
            if i < len(turns) - 1:
                messages.append({"role": "assistant", "content": "Here is a first answer."})
        f, ids = tokenized_features(parse_route_request({"messages": messages}), est.tokenizer)
        got = est.estimate(f, ids)
        assert got.available, got.error
        if f.continues is None:
            np.testing.assert_allclose(est.feature_vector(f)[0], got.features, atol=1e-6)  # ids path == text path
        else:  # a short follow-up: the head input of what it continues, or of itself read alone
            alone = read_alone(f)
            assert min(np.abs(est.feature_vector(g)[0] - got.features).max() for g in (f.continues, alone)) < 1e-6
        return got.p_hard

    hard, easy = p_hard(HARD), p_hard(EASY)
    assert hard > easy
    after_hard, after_easy = p_hard(HARD, "yes, do it"), p_hard(EASY, "yes, do it")
    assert after_hard > after_easy
    assert abs(after_hard - hard) < abs(after_easy - hard)


_WORDS = st.sampled_from("prove the queue lock free thanks please write a sql query sort list hello go on ok yes "
                         "design raft consensus capital france translate typo derive theorem kernel".split())


@settings(max_examples=40, deadline=None)
@given(first=st.lists(_WORDS, min_size=1, max_size=40).map(" ".join),
       short=st.lists(_WORDS, min_size=1, max_size=6).map(" ".join).filter(lambda t: len(t) < 64))
def test_a_short_follow_up_never_lowers_p_hard(first, short):
    """Invariant over generated conversations: a short follow-up scores at least what the request it
    continues scores alone (the follow-up rule only raises p_hard)."""
    est = _bundled()
    f = _features(first, short, tokenizer=est.tokenizer)
    alone = est.estimate(_features(f.continues.query_text, tokenizer=est.tokenizer)).p_hard
    assert est.estimate(f).p_hard >= alone - 1e-6  # float32: a batch of two runs differs in the last bits


@settings(max_examples=40, deadline=None)
@given(first=st.lists(_WORDS, min_size=1, max_size=40).map(" ".join),
       short=st.lists(_WORDS, min_size=1, max_size=6).map(" ".join).filter(lambda t: len(t) < 64))
def test_a_short_follow_up_scores_one_of_its_two_readings(first, short):
    """Invariant over generated conversations: a short follow-up scores exactly the larger of the
    request it continues and itself as a one-turn request, never more than both (before, the
    'alone' reading kept the conversation's turn, message and token counts: "Сколько будет 2+2?"
    0.012, "да" 0.520, the conversation of the two 0.784)."""
    est = _bundled()
    got = est.estimate(_features(first, short, tokenizer=est.tokenizer))
    readings = {"continued": est.estimate(_features(first, tokenizer=est.tokenizer)).p_hard,
                "alone": est.estimate(_features(short, tokenizer=est.tokenizer)).p_hard}
    assert got.p_hard == pytest.approx(max(readings.values()), abs=1e-5)
    assert got.p_hard == pytest.approx(readings[got.reading], abs=1e-5)


def test_a_short_turn_continues_only_the_recent_turns():
    """A short turn inherits from the last ``CONTEXT_TURNS`` user turns, not from a request further
    back (a hard request five turns back no longer sets the score of "thanks, that's all!")."""
    hard = "Write a complete optimizing compiler in Rust for a subset of C, with SSA and register allocation."
    recent = _features(hard, "ok", "thanks, that's all!")
    assert recent.continues is not None and recent.continues.query_text == hard
    far = _features(hard, "ok", "and then?", "fine", "sure", "thanks, that's all!")
    assert far.continues is not None and far.continues.query_text == "ok"  # the earliest of the last four
    assert far.alone is not None and far.alone.turns == 1 and far.alone.query_text == "thanks, that's all!"


@settings(max_examples=25, deadline=None)
@given(turns=st.lists(st.lists(_WORDS, min_size=1, max_size=30).map(" ".join), min_size=1, max_size=4))
def test_batch_scores_each_request_as_the_service_does(turns):
    """Invariant over generated conversations: ``estimate_batch`` (``pointsman evaluate --table``) gives
    each request the ``p_hard`` ``estimate`` (the service) gives it, short follow-ups included (before,
    the batch read a follow-up with its context, not its two readings)."""
    est = _bundled()
    feats = [_features(*turns[: k + 1], tokenizer=est.tokenizer) for k in range(len(turns))]
    single = [est.estimate(f).p_hard for f in feats]
    np.testing.assert_allclose(est.estimate_batch(feats), single, atol=1e-5)


@functools.cache
def _bundled() -> DifficultyEstimator:
    return DifficultyEstimator(bundled_model_dir())
