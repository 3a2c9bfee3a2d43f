"""The declared signals (SIGNALS) and the snapshot builders agree, and the reference lists them."""

from pointsman.estimator.estimate import DifficultyEstimate
from pointsman.estimator.features import extract_features
from pointsman.policy.signals import SIGNALS, difficulty_signals, example_signals, reference_markdown, request_signals
from pointsman.request import parse_route_request

CEL_TYPES = {"int": int, "double": float, "bool": bool, "string": str}


def test_request_snapshot_matches_the_declaration():
    req = parse_route_request({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                               "routing": {"tenant": "acme"}})
    snap = request_signals(extract_features(req), req, 256)
    assert set(snap) == set(SIGNALS["request"].fields)
    for name, value in snap.items():
        assert type(value) is CEL_TYPES[SIGNALS["request"].fields[name].type], name
    assert (snap["tenant"], snap["session_id"], snap["max_output_tokens"], snap["max_output_tokens_set"]) == ("acme", "", 256, False)


def test_difficulty_snapshot_matches_the_declaration():
    assert difficulty_signals(DifficultyEstimate(0.3, True, 1.0)) == {"p_hard": 0.3, "available": True}
    assert difficulty_signals(DifficultyEstimate(0.3, False, 1.0, "x")) == {"p_hard": None, "available": False}
    assert set(difficulty_signals(DifficultyEstimate(None, False, 0.0))) == set(SIGNALS["difficulty"].fields)


def test_example_snapshot_declares_every_field():
    ex = example_signals({"a": 1})
    for name, ns in SIGNALS.items():
        if ns.fields is not None:
            assert set(ex[name]) == set(ns.fields)
    assert ex["variables"] == {"a": 1}


def test_reference_lists_every_signal():
    text = reference_markdown()
    for ns in SIGNALS.values():
        for name in ns.fields or {}:
            assert f"`{ns.name}.{name}`" in text
    assert "`cost(target: string) -> double`" in text
