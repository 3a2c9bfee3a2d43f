"""The sanity suite (training/sanity.py) through ``pointsman evaluate --pairs``: a small pairs file and
the shipped one, scored by the bundled model through the service's scoring path; bad files; the
Wilson interval against scipy's; and the shipped model held to issue 21's bar (xfail until v3)."""

from __future__ import annotations

import json
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from pointsman.cli.training import register
from pointsman.estimator.model_source import load_estimator
from pointsman.policy.engine import RoutingEngine
from pointsman.policy.fleet import load_fleet
from pointsman.policy.rules.compiler import STATIC_POLICY_PATH, load_policy
from pointsman.request import parse_route_request
from pointsman.training.sanity import (
    APPROVAL_TOLERANCE,
    approved_request,
    concordance,
    messages_of,
    read_pairs,
    score_request,
    shipped_pairs_path,
    wilson_interval,
)

GREETING = "Hi!"
PROOF = "Prove there are infinitely many primes of the form 4k+3."
CONVERSATION = [{"role": "user", "content": PROOF},
                {"role": "assistant", "content": "Sketch: consider N = 4·p1···pn − 1. Shall I write it out?"},
                {"role": "user", "content": "yes, go on"}]
TOOL = [{"role": "user", "content": "What's the weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": '{"temp_c": 18}'}]


@pytest.fixture(scope="module")
def bundled():
    return load_estimator("bundled")


def cli() -> click.Group:
    group = click.Group()
    register(group)
    return group


def write_pairs(path: Path, rows: list[object]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


def pair(id_: str, easy: object, hard: object, category: str = "code") -> dict[str, object]:
    return {"id": id_, "category": category, "lang": "en", "easy": easy, "hard": hard}


def test_score_request_is_the_p_hard_the_engine_routes_on(bundled):
    fleet = load_fleet()
    engine = RoutingEngine(fleet, load_policy(STATIC_POLICY_PATH, fleet), bundled)
    for request in (GREETING, PROOF, CONVERSATION, TOOL):
        decision = engine.route(parse_route_request({"messages": messages_of(request)}), dispatch=False)
        assert decision.difficulty_available
        assert score_request(bundled, request) == decision.p_hard


def test_evaluate_pairs_on_a_small_file(tmp_path, bundled):
    """An identical pair is a tie (half); a pair and its mirror image give exactly one concordant pair
    between them, whatever the model: 2 of 4."""
    path = write_pairs(tmp_path / "pairs.jsonl", [
        pair("tie", PROOF, PROOF, "math"),
        pair("chat", GREETING, CONVERSATION, "conversation"),
        "",  # blank lines are skipped
        pair("chat-mirror", CONVERSATION, GREETING, "conversation"),
        pair("tool", TOOL, TOOL, "tool"),
    ])
    res = CliRunner().invoke(cli(), ["evaluate", "--pairs", str(path), "--model", "bundled", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["n"] == 4 and out["ties"] == 2 and out["concordance"] == 0.5
    lo, hi = wilson_interval(2.0, 4)
    assert (out["ci95_low"], out["ci95_high"]) == (lo, hi) and lo < 0.5 < hi
    assert out["per_category"] == {"conversation": {"n": 2, "concordance": 0.5}, "math": {"n": 1, "concordance": 0.5},
                                   "tool": {"n": 1, "concordance": 0.5}}
    # the worst pair is whichever of the mirrored two is ranked the wrong way, by the engine's own scores
    p_greeting, p_conversation = score_request(bundled, GREETING), score_request(bundled, CONVERSATION)
    assert p_greeting != p_conversation
    wrong = "chat" if p_greeting > p_conversation else "chat-mirror"
    assert out["worst"][0]["id"] == wrong and out["worst"][0]["inversion"] == pytest.approx(abs(p_greeting - p_conversation))
    # approval: the hard side of "chat" ends in "yes, go on"; compared with its request alone
    (check,) = out["approval"]["checks"]
    assert check["id"] == "chat" and check["p_conversation"] == pytest.approx(p_conversation)
    assert check["p_request"] == pytest.approx(score_request(bundled, PROOF))
    assert check["ok"] == (abs(check["difference"]) <= APPROVAL_TOLERANCE)

    text = CliRunner().invoke(cli(), ["evaluate", "--pairs", str(path), "--model", "bundled"])
    assert text.exit_code == 0, text.output
    assert f"concordance 0.5000  95% CI {lo:.4f}-{hi:.4f} (Wilson)" in text.output
    assert "2 ties" in text.output and f"approval: {out['approval']['ok']} of 1 conversations" in text.output
    assert text.output.index(wrong) > text.output.index("worst pairs")


def test_evaluate_pairs_saved_with_a_byte_order_mark(tmp_path, bundled):
    """A pairs file saved with a UTF-8 byte-order mark is the same file: it was refused as
    'pairs.jsonl:1: not valid JSON (Unexpected UTF-8 BOM ...)'."""
    path = write_pairs(tmp_path / "pairs.jsonl", [pair("chat", GREETING, PROOF, "math")])
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    res = CliRunner().invoke(cli(), ["evaluate", "--pairs", str(path), "--model", "bundled", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["n"] == 1


def test_evaluate_the_shipped_suite(bundled):
    res = CliRunner().invoke(cli(), ["evaluate", "--pairs", "sanity", "--model", "bundled", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert Path(out["pairs_file"]) == shipped_pairs_path() and out["model_version"] == bundled.version
    pairs = read_pairs("sanity")
    assert out["n"] == len(pairs) >= 240
    assert sum(c["n"] for c in out["per_category"].values()) == out["n"]
    assert set(out["per_category"]) == {"code", "math", "science", "writing", "lookup", "chit-chat", "reasoning", "data",
                                        "multilingual", "conversation", "tool"}
    assert min(c["n"] for c in out["per_category"].values()) >= 20
    assert len({p.lang for p in pairs if p.category == "multilingual"}) >= 5
    approvals = [p.id for p in pairs if approved_request(p.hard) is not None]
    assert [c["id"] for c in out["approval"]["checks"]] == approvals and len(approvals) >= 16
    assert all(p.category == "conversation" for p in pairs if p.id in approvals)
    # length alone cannot reach the bar: some easy requests are the longer ones
    assert out["length_concordance"] < 0.9
    wins = sum(p["p_hard"] > p["p_easy"] for p in out["pairs"]) + 0.5 * out["ties"]
    assert out["concordance"] == wins / out["n"]


#: The shipped model's floor on the sanity suite: the v3.1 model ranks 0.936 of the pairs right (v3
#: 0.88, v2 0.45, prompt length alone 0.80); issue 21's goal is 0.95. A retrained model must not fall back.
SHIPPED_FLOOR = 0.92


def test_the_shipped_model_ranks_the_sanity_pairs_and_approvals_inherit():
    report = concordance("bundled", "sanity")
    failed = [(a.id, round(a.difference, 4)) for a in report.approvals if not a.ok]
    assert report.concordance >= SHIPPED_FLOOR, (report.concordance, report.ci95, [p.id for p in report.worst()])
    assert report.concordance > report.length_concordance  # better than prompt length alone
    assert not failed and report.approvals, failed


BAD = [
    ("{not json", "not valid JSON"),
    ('["a", "b"]', "expected a JSON object"),
    ('{"id": "x", "category": "code", "lang": "en", "easy": "hi"}', "field 'hard': missing"),
    ('{"id": 7, "category": "code", "lang": "en", "easy": "hi", "hard": "prove it"}', "field 'id': expected a non-empty string"),
    ('{"id": "x", "category": "code", "lang": "en", "easy": 3, "hard": "prove it"}', "field 'easy': expected a string or a non-empty list"),
    ('{"id": "x", "category": "code", "lang": "en", "easy": "  ", "hard": "prove it"}', "field 'easy': empty request"),
    ('{"id": "x", "category": "code", "lang": "en", "easy": "hi", "hard": [{"role": "robot", "content": "x"}]}',
     "field 'hard.messages[0].role'"),
]


@pytest.mark.parametrize(("line", "message"), BAD)
def test_a_bad_line_is_one_error_with_file_line_and_field(tmp_path, line, message):
    good = json.dumps(pair("ok", GREETING, PROOF))
    path = write_pairs(tmp_path / "bad.jsonl", [good, line])
    res = CliRunner().invoke(cli(), ["evaluate", "--pairs", str(path), "--model", "bundled"])
    assert res.exit_code == 2, res.output
    assert res.stderr.count("\n") == 1 and res.stderr.startswith(f"Error: {path}:2: "), res.stderr
    assert message in res.stderr


def test_duplicate_ids_empty_and_missing_files(tmp_path):
    dup = write_pairs(tmp_path / "dup.jsonl", [pair("a", GREETING, PROOF), pair("a", GREETING, PROOF)])
    empty = write_pairs(tmp_path / "empty.jsonl", ["", "  "])
    for path, message in ((dup, f"{dup}:2: field 'id': duplicate id 'a' (first on line 1)"),
                          (empty, f"{empty}: no pairs"), (tmp_path / "absent.jsonl", "cannot read the pairs file")):
        res = CliRunner().invoke(cli(), ["evaluate", "--pairs", str(path)])
        assert res.exit_code == 2 and message in res.stderr, res.output
    res = CliRunner().invoke(cli(), ["evaluate", "--pairs", "sanity", "--table", "t.csv"])
    assert res.exit_code == 2 and "--pairs scores a sanity suite" in res.stderr
    res = CliRunner().invoke(cli(), ["evaluate"])
    assert res.exit_code == 2 and "--table PATH --weak COL --strong COL, or --pairs" in res.stderr


def test_approval_is_a_short_user_turn_after_an_assistant_reply():
    assert approved_request(CONVERSATION) == [CONVERSATION[0]]
    assert approved_request(PROOF) is None and approved_request(TOOL) is None
    long_reply = CONVERSATION[:2] + [{"role": "user", "content": "now prove the same for primes of the form 8k+7"}]
    assert approved_request(long_reply) is None


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 2000).flatmap(lambda n: st.tuples(st.integers(0, n), st.just(n))))
def test_wilson_interval_is_scipys(kn):
    from scipy.stats import binomtest

    k, n = kn
    ours = wilson_interval(k, n)
    theirs = binomtest(k, n).proportion_ci(0.95, method="wilson")
    assert ours == pytest.approx((theirs.low, theirs.high), abs=1e-12)
