"""The shipped model and the onnxruntime DifficultyEstimator contract."""

import json
import shutil
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

from pointsman.errors import ModelNotFoundError
from pointsman.estimator.difficulty import DifficultyEstimator
from pointsman.estimator.estimate import Estimator
from pointsman.estimator.features import extract_features
from pointsman.estimator.manifest import content_version, read_manifest
from pointsman.estimator.model_source import bundled_model_dir, load_estimator
from pointsman.request import parse_route_request, request_from_prompt

HARD = [
    "Write a Python function that returns the longest palindromic substring in O(n^2) time and explain its complexity.",
    "Prove that there are infinitely many primes p such that p = 4k + 3.",
    "Implement a lock-free multi-producer single-consumer queue in C++ using std::atomic and explain the memory orderings.",
    "Compute the integral of x^2 * e^(-x) from 0 to infinity and show each step.",
    "Given a SQL table orders(id, customer_id, total, created_at), write a query for each customer's second-largest order.",
]
EASY = [
    "Write a short, friendly birthday message for my coworker Anna.",
    "Give me three ideas for a relaxing weekend at home.",
    "Write a haiku about autumn leaves.",
    "Suggest a name for a golden retriever puppy.",
    "How can I be more productive in the morning?",
]


@pytest.fixture(scope="module")
def est():
    return load_estimator("bundled")


def _p(est, prompt):
    r = est.estimate(extract_features(request_from_prompt(prompt), est.tokenizer))
    assert r.available, r.error
    return r.p_hard


def test_bundled_model_loads_and_follows_the_protocol(est):
    assert isinstance(est, Estimator)
    assert est.source == "bundled"
    manifest = read_manifest(bundled_model_dir())
    assert est.version == manifest.version and est.version.startswith("pointsman-difficulty-")
    files = [manifest.encoder.file, manifest.encoder.tokenizer, manifest.head.file]
    assert content_version(bundled_model_dir(), files, manifest.head.feature_names, manifest.name,
                           manifest.head.pooling) == est.version
    assert {s["license"] for s in manifest.training["sources"]} <= {"Apache-2.0", "MIT"}
    assert not any("alpaca" in s["name"] for s in manifest.training["sources"])


def test_p_hard_is_a_probability(est):
    for prompt in HARD + EASY + ["hi", "?" * 5000, "日本語の質問です。東京の人口は？"]:
        p = _p(est, prompt)
        assert 0.0 <= p <= 1.0


def test_hard_prompts_score_higher_than_trivial_ones(est):
    hard = np.mean([_p(est, t) for t in HARD])
    easy = np.mean([_p(est, t) for t in EASY])
    assert hard > easy


def test_tokenizer_counts_without_padding_or_truncation(est):
    assert est.tokenizer.padding is None and est.tokenizer.truncation is None
    long = "word " * 400
    f = extract_features(request_from_prompt(long), est.tokenizer)
    assert f.prompt_tokens > 128 * 2


def test_batch_matches_single(est):
    feats = [extract_features(request_from_prompt(t), est.tokenizer) for t in HARD + EASY]
    batch = est.estimate_batch(feats)
    single = np.array([est.estimate(f).p_hard for f in feats])
    assert batch.shape == (len(feats),) and batch.dtype == np.float32
    assert np.allclose(batch, single, atol=1e-6)
    assert est.estimate_batch([]).shape == (0,)


def test_image_only_request_is_scored(est):
    req = parse_route_request(
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]}
    )
    f = extract_features(req, est.tokenizer)
    assert f.query_text == ""
    r = est.estimate(f)
    assert r.available and 0 <= r.p_hard <= 1


def test_failures_and_overruns_come_back_unavailable(est):
    f = extract_features(request_from_prompt("hello"), est.tokenizer)
    slow = load_estimator("bundled", timeout_ms=0.0)
    r = slow.estimate(f)
    assert not r.available and r.p_hard is None and r.error.startswith("timeout")

    class Broken:
        def __call__(self, x):
            raise RuntimeError("onnx exploded")

    broken = load_estimator("bundled")
    broken.head = Broken()
    r = broken.estimate(f)
    assert not r.available and "onnx exploded" in r.error and r.latency_ms >= 0
    # a malformed features object (not a valid RequestFeatures) also does not raise
    r = broken.estimate(replace(f, query_text=None))
    assert not r.available


def test_loader_errors(tmp_path, monkeypatch):
    monkeypatch.setenv("POINTSMAN_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    with pytest.raises(ModelNotFoundError, match="no model at"):
        load_estimator(tmp_path / "missing")
    with pytest.raises(ModelNotFoundError, match="not a Pointsman model directory"):
        load_estimator(tmp_path)
    with pytest.raises(ModelNotFoundError, match="no MLflow tracking store"):
        load_estimator("models:/pointsman-difficulty@champion")
    # "champion" without a store falls back to the bundled model and says so
    champ = load_estimator("champion")
    assert champ.source.startswith("bundled") and champ.version == load_estimator().version
    # a manifest that names a missing file
    bad = tmp_path / "bad"
    bad.mkdir()
    manifest = json.loads((bundled_model_dir() / "manifest.json").read_text())
    (bad / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ModelNotFoundError, match="file is missing"):
        load_estimator(bad)
    (bad / "manifest.json").write_text("{not json")
    with pytest.raises(ModelNotFoundError, match="invalid manifest"):
        load_estimator(bad)


def test_serving_imports_no_training_stack():
    code = """
import sys
from pointsman.estimator.model_source import load_estimator
from pointsman.estimator.features import extract_features
from pointsman.request import request_from_prompt
est = load_estimator("bundled")
f = extract_features(request_from_prompt("Write a Python function that merges two sorted lists."), est.tokenizer)
r = est.estimate(f)
assert r.available and 0.0 <= r.p_hard <= 1.0, r
print(sorted(m for m in ("torch", "sklearn", "mlflow", "pandas", "transformers", "skl2onnx", "model2vec")
             if m in sys.modules))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout


def test_bundled_manifest_publishes_reference_quantiles_of_this_model(est):
    from pointsman.training.reference_set import reference_quantiles, score_reference

    ref = est.manifest.reference_p_hard
    qs = list(ref["quantiles"].values())
    assert len(qs) == 19 and qs == sorted(qs) and 0.0 < qs[0] < qs[-1] < 1.0
    # the published numbers are this model's: re-scoring the reference mix reproduces them
    again = reference_quantiles(score_reference(est))
    assert again["n"] == ref["n"]
    assert again["quantiles"] == pytest.approx(ref["quantiles"], abs=1e-5)


def test_manifest_without_reference_quantiles_still_loads(tmp_path):
    old = tmp_path / "old"
    old.mkdir()
    for f in bundled_model_dir().iterdir():
        if f.name != "manifest.json":
            (old / f.name).symlink_to(f)
    manifest = json.loads((bundled_model_dir() / "manifest.json").read_text())
    manifest.pop("reference_p_hard", None)
    (old / "manifest.json").write_text(json.dumps(manifest))
    est = load_estimator(old)
    assert est.manifest.reference_p_hard == {} and est.version == manifest["version"]


@pytest.mark.parametrize("replaced", ["head", "tokenizer"])
def test_a_model_directory_whose_files_are_not_its_manifests_version_is_refused(tmp_path, replaced):
    """Before: a directory whose head.onnx was replaced by another model's (a half-finished copy, an edit)
    loaded and scored with the new head while every decision named the manifest's version. Through the
    CLI: the model is refused, one ``Error:`` line and exit 2 (a model named with ``--model`` that cannot load), and no
    decision is made under the shipped version."""
    from click.testing import CliRunner

    from pointsman.cli.main import main

    model = tmp_path / "model"
    shutil.copytree(bundled_model_dir(), model)
    if replaced == "head":  # another valid head: the shipped one's ONNX with its metadata changed
        import onnx

        head = onnx.load(str(model / "head.onnx"))
        head.producer_version = "edited"
        onnx.save(head, str(model / "head.onnx"))
    else:
        (model / "tokenizer.json").write_text((model / "tokenizer.json").read_text() + "\n")
    with pytest.raises(ModelNotFoundError, match="not the manifest's version"):
        DifficultyEstimator(model)
    shipped = read_manifest(bundled_model_dir()).version
    r = CliRunner().invoke(main, ["route", "--json", "--model", str(model), "Prove that sqrt(2) is irrational."])
    assert r.exit_code == 2 and r.stderr.startswith("Error: ") and "not the manifest's version" in r.stderr, r.output
    assert shipped not in r.stdout and not r.stdout.strip(), r.stdout
