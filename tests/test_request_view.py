"""``RequestView``'s renderings read from the texts' UTF-8 (encoded once) are what the strings they replace
give: the conversation's bytes and length, the cache breakpoint's bytes, the transcript's sha256; the decision
log's conversation key, kept per first user text, is ``group_key`` of the messages."""

from __future__ import annotations

import hashlib

from hypothesis import given, settings
from hypothesis import strategies as st

from pointsman.datasets.splits import group_key
from pointsman.outcome_log.records import conversation_key
from pointsman.request import RequestView, parse_route_request

_TEXT = st.text(st.characters(blacklist_categories=["Cs"]), max_size=40)
_ROLE = st.sampled_from(["system", "developer", "user", "assistant", "tool"])
_MARK = {"type": "ephemeral"}


@st.composite
def _message(draw: st.DrawFn) -> dict[str, object]:
    role = draw(_ROLE)
    if draw(st.booleans()):
        out: dict[str, object] = {"role": role, "content": draw(_TEXT)}
    else:
        parts = []
        for _ in range(draw(st.integers(1, 3))):
            part: dict[str, object] = {"type": "text", "text": draw(_TEXT)}
            if draw(st.booleans()):
                part["cache_control"] = _MARK
            parts.append(part)
        out = {"role": role, "content": parts}
    if draw(st.booleans()):
        out["cache_control"] = _MARK
    return out


def _old_segments(view: RequestView) -> tuple[str, ...]:
    """The conversation rendered as strings (the reference): the tools declared, then ``role\ntext\n`` per message."""
    tools = (f"tools\n{view.request.tools!r}\n",) if view.request.tools else ()
    return tools + tuple(f"{m.role}\n{t}\n" for m, t in zip(view.request.messages, view.texts))


def _old_conversation(view: RequestView) -> str:
    """The conversation as one string, as prefix hashing once read it (the reference)."""
    return "".join(_old_segments(view))


def _old_breakpoint(view: RequestView) -> int:
    """``cache_breakpoint_bytes`` as it was computed from the rendered segments (the reference)."""
    segments = iter(_old_segments(view))
    end = cut = 0
    if view.request.tools:
        end = len(next(segments).encode())
        cut = end if any(isinstance(t, dict) and "cache_control" in t for t in view.request.tools) else 0
    for m, segment in zip(view.request.messages, segments):
        start, end = end, end + len(segment.encode())
        parts = m.content if isinstance(m.content, list) else []
        if "cache_control" in (m.model_extra or {}) or (parts and "cache_control" in (parts[-1].model_extra or {})):
            cut = end
        elif m.cache_marks():
            cut = max(cut, start)
    return cut


@given(st.lists(_message(), min_size=1, max_size=5), st.sampled_from([None, [{"type": "function", "x": "é"}],
                                                                      [{"cache_control": _MARK, "n": "😀"}]]))
@settings(max_examples=150, deadline=None)
def test_renderings_from_utf8_equal_the_strings_they_replace(messages, tools):
    body: dict[str, object] = {"messages": messages + [{"role": "user", "content": "hello"}]}
    if tools is not None:
        body["tools"] = tools
    view = RequestView.of(parse_route_request(body))
    assert view.conversation_utf8 == _old_conversation(view).encode("utf-8")
    assert view.conversation_bytes == len(_old_conversation(view).encode("utf-8"))
    assert view.prompt_sha256() == hashlib.sha256(view.transcript.encode("utf-8")).hexdigest()
    assert view.cache_breakpoint_bytes == _old_breakpoint(view)
    assert view.utf8 == tuple(t.encode("utf-8") for t in view.texts)


@given(st.lists(_message(), min_size=1, max_size=5), st.lists(_message(), min_size=1, max_size=5))
@settings(max_examples=150, deadline=None)
def test_the_kept_conversation_key_is_group_key_of_the_messages(messages, others):
    """Asked twice (the second answer is the kept one), for two conversations that may share their first user
    text (``others`` starts with ``messages``' first message)."""
    last = [{"role": "user", "content": "hello"}]
    for body in ({"messages": messages + last}, {"messages": messages[:1] + others + last}, {"messages": messages + last}):
        view = RequestView.of(parse_route_request(body))
        old = group_key([{"role": m.role, "content": t} for m, t in zip(view.request.messages, view.texts)])
        assert conversation_key(view) == old
        assert conversation_key(view) == old


def test_a_long_texts_check_encoding_is_the_views_and_requests_still_compare_by_value():
    """``parse_route_request`` keeps the UTF-8 it checked a long text with; the view reads it (not encoded
    again), a text the request no longer holds is encoded afresh, and two parses of one body are equal."""
    body = {"messages": [{"role": "user", "content": "é😀 " * 2000}, {"role": "user", "content": "short"}]}
    from pointsman.request import _KEPT, _kept

    a, b = parse_route_request(body), parse_route_request(body)
    assert a == b
    kept = _kept(a)
    assert kept is not None and list(kept) == [id(a.messages[0].content)]  # the long text only
    view = RequestView.of(a)
    assert view.utf8[0] is kept[id(a.messages[0].content)][1]
    assert view.utf8 == tuple(t.encode("utf-8") for t in view.texts)
    other = a.model_copy(update={"messages": [a.messages[1]]})
    assert RequestView.of(other).utf8 == (b"short",)
    ids = id(a), id(b)
    del a, b, view, other, kept
    assert not set(ids) & set(_KEPT)  # an entry leaves with its request
