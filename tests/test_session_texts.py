"""``session_texts.SessionTexts``: what a conversation's next turn reuses from the last one (block hashes, class
units) is what computing them afresh gives, whatever the store held, dropped or was handed by the other consumer."""

from __future__ import annotations

import json
import threading

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from pointsman.estimator.billed_tokens import byte_class_vector
from pointsman.estimator.token_bounds import class_units, class_units_utf8
from pointsman.policy.signals.prefix_index import _chain, _root
from pointsman.request import RequestView, parse_route_request
from pointsman.session_texts import SESSION_TEXTS, SessionTexts

_ROOT = _root(b"text", b"")
_PIECE = st.lists(st.sampled_from(["word", "Z9", " ", "  ", " " * 16, "\n", "\r", "\t", "é", "😀", "漢字", "(", "\x00", "\u200b"]),
                  max_size=12).map(lambda parts: "".join(parts).encode("utf-8"))
_STEPS = st.lists(st.tuples(st.sampled_from(["turn", "append", "cut", "change", "new", "same"]), _PIECE,
                            st.integers(0, 200), st.sampled_from([None, "s1", "s2"]),
                            st.sampled_from(["hashes", "units", "both", "units, hashes", "billed", "billed, units, hashes",
                                             "units, billed"])), min_size=1, max_size=12)


#: Starting texts: any bytes (the hashes and class units read bytes), or UTF-8 text (the billed count's domain)
_START = st.one_of(st.binary(max_size=120),
                   st.text(st.characters(blacklist_categories=("Cs",)), max_size=60).map(lambda t: t.encode("utf-8")))


def _utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


@given(_START, _STEPS, st.integers(1, 9), st.integers(40, 400))
@example(b"((", [("same", b"", 0, "s", "units"), ("change", b"Z9", 0, "s", "hashes"), ("same", b"", 0, "s", "units")],
         1, 400)  # a count carried over to a text that does not start with the counted one would be wrong
@example(b"a\n", [("same", b"", 0, "s", "billed"), ("turn", b"x", 0, "s", "billed")],
         1, 400)  # billed counts a run of newlines once: not carried over to a text going on with a newline
@example(b"\xc0\n\nwordwordwordword", [("same", b"", 0, "s", "billed")], 1, 400)  # not UTF-8: no billed check
@example("é\n\n".encode(), [("same", b"", 0, "s", "billed"), ("append", b"word", 0, "s", "billed")], 1, 400)
@settings(max_examples=200, deadline=None)
def test_hashes_and_units_are_those_computed_afresh(start, steps, block_bytes, max_bytes):
    """Texts extended by turns (a newline and more), appended to, cut, changed in the middle, replaced or
    repeated, under shared and distinct keys, read by any of the consumers in any order with a small
    ``max_bytes``: ``_chain``'s hashes, ``class_units_utf8``'s and ``byte_class_vector``'s counts every time."""
    store, text = SessionTexts(max_bytes=max_bytes, min_bytes=1), start
    for kind, piece, at, key, who in steps:
        if kind == "turn":
            text += b"\n" + piece
        elif kind == "append":
            text += piece
        elif kind == "cut":
            text = text[:at]
        elif kind == "change":
            text = text[:at] + piece + text[at + len(piece):]
        elif kind == "new":
            text = piece * (at % 7 + 1)
        for consumer in who.split(", ") if who != "both" else ("hashes", "units"):
            if consumer == "hashes":
                assert store.hashes(text, key, block_bytes, _ROOT, _chain) == _chain(text, block_bytes, _ROOT)
            elif consumer == "units":
                assert store.units(text, key, class_units_utf8) == class_units_utf8(text)
            else:  # UTF-8 only, as the service makes (bytes that are not decode to some code point: b"\xc0\n" as one)
                billed = store.billed(text, key, byte_class_vector)
                assert not _utf8(text) or np.allclose(billed, byte_class_vector(text))
        assert store._bytes == sum(len(k.data) for k in store._items.values()) <= max_bytes


def test_one_copy_of_a_turn_serves_both_and_the_next_turn_reuses_both():
    """A turn read by both consumers is kept once; its next turn gets both results from it (the count is
    given only the new bytes) and a cut of it (the estimator's) leaves the longer text kept."""
    store, turn1 = SessionTexts(min_bytes=1), b"user\n" + "é lorem ipsum 😀 ".encode() * 500 + b"\n"
    turn2 = turn1 + b"assistant\nan answer\nuser\nmore\n"
    store.hashes(turn1, "s", 64, _ROOT, _chain)
    store.units(turn1, "s", class_units_utf8)
    assert store._bytes == len(turn1) and len(store._items) == 1
    counted: list[int] = []

    def count(data: bytes) -> int:
        counted.append(len(data))
        return class_units_utf8(data)
    assert store.units(turn2, "s", count) == class_units_utf8(turn2) and counted == [len(turn2) - len(turn1)]
    assert store.hashes(turn2, "s", 64, _ROOT, _chain) == _chain(turn2, 64, _ROOT)
    assert store.units(turn1, "s", class_units_utf8) == class_units_utf8(turn1)
    assert store._bytes == len(turn2)


def test_two_threads_reading_one_session_get_fresh_results():
    """The event loop (hashes) and the estimator's pool (units) reading a session's turns at once."""
    store, turns = SessionTexts(min_bytes=1), [b"system\n" + b"x y\n" * 300]
    for i in range(40):
        turns.append(turns[-1] + f"user\nturn {i} {'é' * i}\n".encode())
    bad: list[int] = []

    def hashes() -> None:
        bad.extend(i for i, t in enumerate(turns) if store.hashes(t, "s", 16, _ROOT, _chain) != _chain(t, 16, _ROOT))

    def units() -> None:
        bad.extend(i for i, t in enumerate(turns) if store.units(t, "s", class_units_utf8) != class_units_utf8(t))
    threads = [threading.Thread(target=f) for f in (hashes, units, hashes, units)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert bad == []


_TEXT = _PIECE.map(lambda b: b.decode("utf-8"))
_MESSAGES = st.lists(st.tuples(st.sampled_from(["system", "developer", "user", "assistant", "tool", "function"]),
                               _TEXT), min_size=1, max_size=6)


@given(_MESSAGES, _MESSAGES, st.sampled_from([None, [{"type": "function", "name": "f é\n  x"}]]))
@settings(max_examples=100, deadline=None)
def test_the_features_count_of_a_conversation_is_class_units_of_its_messages(turn1, more, tools):
    """The features' count (``_joined_units``: the conversation's units, kept per session, less its framing)
    is ``class_units`` of the messages joined by newlines (and the tools'), for a conversation and its next
    turn, kept or not."""
    from pointsman.estimator.features import _joined_units

    min_bytes, SESSION_TEXTS.min_bytes = SESSION_TEXTS.min_bytes, 1
    try:
        for messages in ([*turn1, ("user", "go")], [*turn1, ("user", "go"), *more, ("user", "go")]):
            body = {"messages": [{"role": r, "content": t} for r, t in messages], "tools": tools,
                    "routing": {"session_id": "features-test"}}
            view = RequestView.of(parse_route_request(body))
            tools_text = json.dumps(tools, separators=(",", ":"), ensure_ascii=False) if tools else ""
            expected = class_units("\n".join(view.texts) + ("\n" + tools_text if tools_text else ""))
            assert _joined_units(view, tools_text, True)() == _joined_units(view, tools_text, False)() == expected
    finally:
        SESSION_TEXTS.min_bytes = min_bytes


@given(_MESSAGES, _MESSAGES, st.sampled_from([None, [{"type": "function", "name": "f é\n  x"}]]))
@settings(max_examples=60, deadline=None)
def test_the_billed_estimate_of_a_conversation_is_that_of_its_text_kept_or_not(turn1, more, tools):
    """The features' billed estimate (``_billed_estimate``: the conversation's byte-class counts, kept per
    session) is ``byte_class_estimate`` of ``conversation_utf8``, for a conversation and its next turn."""
    from pointsman.estimator.billed_tokens import byte_class_estimate
    from pointsman.estimator.features import _billed_estimate

    min_bytes, SESSION_TEXTS.min_bytes = SESSION_TEXTS.min_bytes, 1
    try:
        for messages in ([*turn1, ("user", "go")], [*turn1, ("user", "go"), *more, ("user", "go")]):
            body = {"messages": [{"role": r, "content": t} for r, t in messages], "tools": tools,
                    "routing": {"session_id": "billed-test"}}
            view = RequestView.of(parse_route_request(body))
            expected = byte_class_estimate("", view.conversation_utf8)
            assert abs(_billed_estimate(view, "") - expected) < 1e-6
    finally:
        SESSION_TEXTS.min_bytes = min_bytes
