"""The static encoder computed in numpy from its ONNX file's table: the same embedding as onnxruntime
running that file (float32 rounding apart), and only for a graph ``export.build_static_onnx`` writes."""

import dataclasses

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pointsman.estimator.encoders import StaticEncoder, load_tokenizer, session_options
from pointsman.estimator.export import build_static_onnx
from pointsman.estimator.manifest import read_manifest
from pointsman.estimator.model_source import bundled_model_dir, load_estimator

#: float32 sums in another order: the embeddings differ by ~1e-6 at most (measured 1.1e-6 on real prompts)
ATOL = 1e-5


@pytest.fixture(scope="module")
def bundled():
    spec = read_manifest(bundled_model_dir()).encoder
    path = bundled_model_dir() / spec.file
    enc = StaticEncoder(path, load_tokenizer(bundled_model_dir() / spec.tokenizer), spec)
    session = ort.InferenceSession(str(path), sess_options=session_options(1), providers=["CPUExecutionProvider"])
    return enc, session


def _ort(session, ids):
    return session.run(None, {"input_ids": np.asarray(ids, dtype=np.int64)})[0][0]


@settings(max_examples=60, deadline=None)
@given(ids=st.lists(st.integers(0, 29524), min_size=1, max_size=512))
def test_bundled_table_embeds_as_onnxruntime_runs_the_file(bundled, ids):
    enc, session = bundled
    got = enc.encode("", ids)
    assert got.dtype == np.float32 and got.shape == (enc.dim,)
    kept = enc.token_ids("", ids)  # [UNK] dropped, the window cut
    if kept.size:
        np.testing.assert_allclose(got, _ort(session, kept), rtol=0, atol=ATOL)
    else:
        assert not got.any()


def test_texts_embed_as_onnxruntime_runs_the_file(bundled):
    enc, session = bundled
    for text in ["Write a haiku about autumn leaves.", "Prove that there are infinitely many primes. " * 40,
                 "日本語の質問です。東京の人口は？", "def f(x):\n    return x ** 2\n" * 30]:
        np.testing.assert_allclose(enc.encode(text), _ort(session, enc.token_ids(text)), rtol=0, atol=ATOL)
    assert not enc.encode("\u2063").any()  # no known token: zeros, as before


@pytest.mark.parametrize("quantize", ["int8-per-row", "fp32"])
def test_both_quantizations_match_onnxruntime(tmp_path, quantize):
    rng = np.random.default_rng(0)
    table = rng.normal(size=(300, 16)).astype(np.float32)
    table[7] = 0.0  # a zero row (scale 1)
    path = tmp_path / "encoder.onnx"
    build_static_onnx(table, path, quantize)
    spec = dataclasses.replace(read_manifest(bundled_model_dir()).encoder, dim=16, quantization=quantize)
    enc = StaticEncoder(path, load_tokenizer(bundled_model_dir() / spec.tokenizer), spec)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for ids in ([7], [7, 7], [0, 1, 2, 299], list(rng.integers(0, 300, 400))):
        np.testing.assert_allclose(enc.encode("", ids), _ort(session, enc.token_ids("", ids)), rtol=0, atol=ATOL)


def test_another_graph_is_refused(tmp_path):
    """A file whose graph is not the static encoder's (here its mean turned into a max) is not computed
    as if it were: the model fails to load instead."""
    model = onnx.load(str(bundled_model_dir() / "encoder.onnx"))
    next(n for n in model.graph.node if n.op_type == "ReduceMean").op_type = "ReduceMax"
    path = tmp_path / "encoder.onnx"
    onnx.save(model, str(path))
    spec = read_manifest(bundled_model_dir()).encoder
    with pytest.raises(ValueError, match="not a static encoder graph"):
        StaticEncoder(path, load_tokenizer(bundled_model_dir() / spec.tokenizer), spec)


def test_sanity_suite_scores_as_with_onnxruntime(bundled):
    """The shipped model's p_hard over the sanity suite's requests with the encoder in numpy and with
    onnxruntime running its file: the same up to float32 rounding (measured 1.8e-6 at most)."""
    from pointsman.estimator.features import extract_features
    from pointsman.request import parse_route_request
    from pointsman.training.sanity import messages_of, read_pairs

    est = load_estimator("bundled")
    features = [extract_features(parse_route_request({"messages": messages_of(r)}), est.tokenizer)
                for pair in read_pairs("sanity") for r in (pair.easy, pair.hard)]
    numpy_p = est.estimate_batch(features)
    _, session = bundled
    enc = est.encoder

    def on_onnxruntime(text, tokens=None):
        ids = enc.token_ids(text, tokens)
        return _ort(session, ids) if ids.size else np.zeros(enc.dim, dtype=np.float32)

    enc.encode = on_onnxruntime
    np.testing.assert_allclose(numpy_p, est.estimate_batch(features), rtol=0, atol=1e-5)
