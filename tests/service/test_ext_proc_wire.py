"""``ext_proc_wire.read``'s metadata: the subset hint and the served endpoint read from the ``Struct`` values
directly give what protobuf's JSON mapping of them gives (strings and lists of strings, comma-separated
entries; other values ignored), for any metadata value."""

from __future__ import annotations

from google.protobuf import json_format
from hypothesis import given, settings
from hypothesis import strategies as st

from pointsman.service import ext_proc_wire as wire

_text = st.text(alphabet=st.sampled_from("ab1:.,[] \t"), max_size=12)
_scalar = st.one_of(st.none(), st.booleans(), st.floats(allow_nan=False, allow_infinity=False), _text)
_value = st.recursive(_scalar, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                        st.dictionaries(_text, inner, max_size=3)), max_leaves=8)


def _reference(value: object) -> tuple[str, ...]:
    """The entries as read through ``json_format`` (what ``read`` did before)."""
    items = value if isinstance(value, list) else [value]
    return tuple(p.strip() for item in items if isinstance(item, str) for p in item.split(",") if p.strip())


@settings(max_examples=300, deadline=None)
@given(subset=st.one_of(st.none(), _value), served=st.one_of(st.none(), _value), other=_value)
def test_metadata_entries_match_the_json_mapping(subset: object, served: object, other: object) -> None:
    meta: dict[str, dict[str, object]] = {wire.SUBSET_NAMESPACE: {"other": other}, wire.LB_NAMESPACE: {"other": other}}
    if subset is not None:
        meta[wire.SUBSET_NAMESPACE][wire.SUBSET_KEY] = subset
    if served is not None:
        meta[wire.LB_NAMESPACE][wire.SERVED_KEY] = served
    request = wire.headers_request("request", {":path": "/v1/chat/completions"}, metadata=meta)
    msg = wire.read(request)
    hint = json_format.MessageToDict(request.metadata_context.filter_metadata[wire.SUBSET_NAMESPACE])  # type: ignore[attr-defined]
    lb = json_format.MessageToDict(request.metadata_context.filter_metadata[wire.LB_NAMESPACE])  # type: ignore[attr-defined]
    assert msg.subset == (_reference(hint[wire.SUBSET_KEY]) if wire.SUBSET_KEY in hint else None)
    assert msg.served == (_reference(lb.get(wire.SERVED_KEY)) or (None,))[0]


def test_metadata_absent() -> None:
    msg = wire.read(wire.headers_request("request", {":path": "/v1/chat/completions"}))
    assert (msg.subset, msg.served) == (None, None)
