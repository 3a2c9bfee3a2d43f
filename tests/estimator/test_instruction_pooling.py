"""The instruction weighed apart from pasted material (``estimator.head_inputs``, ``pooling: instruction``):
the cut is exact on token ids, serving equals training, the manifest says which pooling a head reads,
and through ``pointsman route`` a pasted easy request stays on-prem."""

import functools
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from pointsman.cli.main import main
from pointsman.errors import ModelNotFoundError
from pointsman.estimator.difficulty import DifficultyEstimator
from pointsman.estimator.encoders import make_encoder
from pointsman.estimator.feature_space import feature_space_of
from pointsman.estimator.features import extract_features, tokenized_features
from pointsman.estimator.head_inputs import (
    INSTRUCTION_MAX_CHARS,
    INSTRUCTION_MIN_QUERY_CHARS,
    PASTED_MIN_CHARS,
    HeadInputs,
    instruction_end,
    short_instruction,
)
from pointsman.estimator.manifest import content_version, read_manifest
from pointsman.estimator.model_source import bundled_model_dir
from pointsman.request import RequestView, parse_route_request

NOTE = ("Hi team, just a reminder that the office will be closed on Monday for the bank holiday. The cleaners will "
        "come on Tuesday morning instead, so please clear your desks before you leave on Friday. If you need to collect "
        "post, the front desk will be open from ten until noon on Tuesday. Thanks, and have a good long weekend!")
LETTER = ("Dear Mrs Patel, thank you for your letter of the 3rd of March. I am pleased to confirm that the books "
          "you ordered have arrived and are ready for collection at our shop on Hill Street. We are open from nine "
          "in the morning until six in the evening on weekdays, and until one on Saturdays.")


@functools.cache
def _encoder():
    return make_encoder(bundled_model_dir(), read_manifest(bundled_model_dir()).encoder)


def _features(text: str):
    return extract_features(parse_route_request({"messages": [{"role": "user", "content": text}]}))


WORDS = st.sampled_from(["Translate", "this", "note", "into", "English", "fix", "the", "typos", "déjà", "vu",
                         "東京", "naïve", "x=3", "C++", "e.g.", "3.14", "über", "ok", "—", "#include"])
SEPS = st.sampled_from([" ", " ", " ", "\n", ": ", "? ", ". ", ":\n", " :", "\t", "\u00a0", "...", ", "])
TEXTS = st.lists(st.tuples(WORDS, SEPS), min_size=1, max_size=120).map(lambda ws: "".join(w + s for w, s in ws))


@settings(max_examples=150, deadline=None)
@given(TEXTS)
def test_the_cut_ends_on_whitespace_and_splits_the_token_ids_exactly(text):
    enc = _encoder()
    cut = instruction_end(text)
    if len(text) < INSTRUCTION_MIN_QUERY_CHARS:
        assert cut == 0
    if not cut:
        return
    assert 8 <= cut <= INSTRUCTION_MAX_CHARS and len(text) - cut >= PASTED_MIN_CHARS
    assert text[cut - 1].isspace()
    ids = enc.tokenizer.encode(text, add_special_tokens=False).ids
    head = enc.tokenizer.encode(text[:cut], add_special_tokens=False).ids
    tail = enc.tokenizer.encode(text[cut:], add_special_tokens=False).ids
    assert ids == head + tail  # so serving may cut the counting pass's ids instead of tokenizing twice


@settings(max_examples=60, deadline=None)
@given(TEXTS)
def test_serving_and_training_pool_alike(text):
    enc = _encoder()
    inputs = HeadInputs(enc, ("conversation",), "instruction")
    f, ids = tokenized_features(parse_route_request({"messages": [{"role": "user", "content": text}]}), enc.tokenizer)
    served = inputs.vector(f, ids)[0]
    np.testing.assert_allclose(served, inputs.vector(f)[0], atol=1e-6)  # with and without the counting pass's ids
    np.testing.assert_allclose(served, inputs.matrix([f])[0], atol=1e-6)  # the training path
    mean = HeadInputs(enc, ("conversation",), "mean").vector(f, ids)[0]
    if instruction_end(f.query_text):
        assert not np.allclose(served[: enc.dim], mean[: enc.dim], atol=1e-4)
    else:
        np.testing.assert_array_equal(served, mean)
    np.testing.assert_array_equal(served[enc.dim:], mean[enc.dim:])  # the request features read the whole query


def test_the_instruction_weighs_against_the_material():
    enc = _encoder()
    mean, pooled = HeadInputs(enc, (), "mean"), HeadInputs(enc, (), "instruction")
    ask = "Could you check this email for spelling mistakes? "
    f = _features(ask + LETTER)
    assert instruction_end(f.query_text) == len(ask)

    def cos(a, b):
        return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))

    instruction = mean.vector(_features(ask))[0, : enc.dim]
    assert cos(pooled.vector(f)[0, : enc.dim], instruction) > cos(mean.vector(f)[0, : enc.dim], instruction) + 0.05
    with pytest.raises(ValueError, match="pooling"):
        HeadInputs(enc, (), "max")


def _copy_with_pooling(tmp_path: Path, pooling: str) -> Path:
    model = tmp_path / pooling
    shutil.copytree(bundled_model_dir(), model)
    raw = json.loads((model / "manifest.json").read_text())
    raw["head"]["pooling"] = pooling
    raw["version"] = content_version(model, ["encoder.onnx", "tokenizer.json", "head.onnx"],
                                     raw["head"]["feature_names"], raw["name"], pooling)  # pooling is in the version
    (model / "manifest.json").write_text(json.dumps(raw))
    return model


def test_the_manifest_names_the_pooling_and_it_is_part_of_the_feature_space(tmp_path: Path):
    shipped = DifficultyEstimator(bundled_model_dir())
    assert shipped.manifest.head.pooling == "instruction"
    mean = DifficultyEstimator(_copy_with_pooling(tmp_path, "mean"))
    assert feature_space_of(mean) != feature_space_of(shipped)  # logged inputs of one do not train the other
    f = _features("Please translate this letter into plain English for me: " + LETTER)
    assert mean.estimate(f).p_hard != pytest.approx(shipped.estimate(f).p_hard, abs=1e-4)
    raw = json.loads((bundled_model_dir() / "manifest.json").read_text())
    raw["head"].pop("pooling")  # a model trained before pooling existed reads the plain mean
    (tmp_path / "mean" / "manifest.json").write_text(json.dumps(raw))
    assert read_manifest(tmp_path / "mean").head.pooling == "mean"
    with pytest.raises(ModelNotFoundError, match="unknown head pooling 'max'"):
        DifficultyEstimator(_copy_with_pooling(tmp_path, "max"))


def test_a_pasted_easy_request_stays_on_prem_through_route(monkeypatch):
    """Through the CLI with the shipped model and default policy: a check, a translation and a summary of
    a pasted note stay on-prem and score below a one-line proof request (v3 scored them 0.50, 0.43 and
    0.40 against the proof's 0.29)."""
    monkeypatch.delenv("POINTSMAN_POLICY_PATH", raising=False)
    runner = CliRunner()

    def route(text: str) -> dict:
        r = runner.invoke(main, ["route", "--json", text], catch_exceptions=False)
        assert r.exit_code == 0, r.output
        return json.loads(r.stdout)

    hard = route("Prove that every finite integral domain is a field, and say exactly where finiteness is used.")
    for ask in ("Could you check this message for spelling mistakes? ", "Translate this into German: ",
                "Summarize this in one sentence:\n"):
        easy = route(ask + NOTE)
        assert not easy["target"].startswith("frontier"), (ask, easy)
        assert easy["p_hard"] < hard["p_hard"], (ask, easy["p_hard"], hard["p_hard"])


def test_a_greeting_or_label_before_a_hard_request_does_not_lower_it():
    """A preamble of a few words ("Hello there.", "Question:") is cut as the instruction; read pooled alone
    it would weigh the greeting twice and send the request on-prem (found by a fresh-eyes tester: a
    Black-Scholes derivation 0.686 -> 0.154). The estimator also reads such a query as one mean and keeps
    the larger p_hard (reading "whole"), through ``estimate`` and ``estimate_batch`` alike."""
    est = DifficultyEstimator(bundled_model_dir())
    task = ("Derive the Black-Scholes partial differential equation from a self-financing delta-hedged portfolio "
            "using Ito's lemma, state every assumption, and explain where the drift of the stock disappears and "
            "why the risk-free rate replaces it.")
    alone = est.estimate(_features(task)).p_hard
    lowered = 0
    for preamble in ("Hello there. ", "Question: ", "Hi! I have a question.\n", "Thanks in advance!\n",
                     "Quick question: ", "Here is my question:\n", "Question : "):
        f = _features(preamble + task)
        cut = instruction_end(f.query_text)
        assert cut and short_instruction(f.query_text[:cut])
        pooled_only = float(est.predict_matrix(est.feature_vector(f))[0])
        lowered += pooled_only < alone - 0.05
        got = est.estimate(f)
        assert got.p_hard >= pooled_only and got.p_hard == pytest.approx(alone, abs=0.03), (preamble, got, alone)
        assert est.estimate_batch([f])[0] == pytest.approx(got.p_hard, abs=1e-6)
    assert lowered >= 2  # the pooled reading alone does lower it: the test would fail without the whole reading
    for ask in ("Could you please check this message for spelling mistakes and fix them? ", "Summarize this: ",
                "Translate this into German: ", "Summarize this note: "):  # real instructions, read pooled alone
        cut = instruction_end(ask + NOTE)
        assert cut and not short_instruction((ask + NOTE)[:cut]), ask


def test_the_whole_reading_reuses_the_pooled_rows_markers_bit_identically():
    """``HeadInputs.whole`` (what ``estimate`` scores a doubted instruction with) equals ``vector(pooled=False)``
    to the bit: only the embedding differs between the two readings, with and without the query's ids,
    for a turn alone and for one read with its conversation."""
    est = DifficultyEstimator(bundled_model_dir())
    inputs = est._inputs
    task = "Derive the Black-Scholes equation from a delta-hedged portfolio using Ito's lemma, step by step."
    turns = [[{"role": "user", "content": "Hello there. " + task + " " + NOTE}],
             [{"role": "user", "content": NOTE}, {"role": "assistant", "content": LETTER},
              {"role": "user", "content": "Hello there. " + task + " " + NOTE}]]
    cases = [tokenized_features(RequestView.of(parse_route_request({"messages": m}), None), est.tokenizer, True)
             for m in turns]
    assert inputs.instruction_cut(cases[0][0]) > 0  # the first is read pooled: the readings differ
    assert not np.array_equal(inputs.vector(*cases[0]), inputs.vector(*cases[0], pooled=False))
    for f, ids in cases:
        for given_ids in (ids, None):
            pooled = inputs.vector(f, given_ids)
            expected = inputs.vector(f, given_ids, pooled=False)
            got = inputs.whole(pooled, f, given_ids)
            assert got.dtype == expected.dtype and got.shape == expected.shape
            np.testing.assert_array_equal(got, expected)
