"""The scikit-learn head: estimator conventions and sklearn ↔ onnxruntime parity on real prompts."""

import numpy as np
import pytest
from sklearn.base import clone

from pointsman.datasets.sources import get_source
from pointsman.estimator.export import export_head, head_parity
from pointsman.estimator.head import DifficultyHead
from pointsman.estimator.markers import request_matrix
from pointsman.estimator.model_source import bundled_model_dir
from pointsman.training.encoder_build import embed_texts, encoder_from_model_dir
from pointsman.training.examples import build_examples


@pytest.fixture(scope="module")
def real_xy(tmp_path_factory):
    built = encoder_from_model_dir(bundled_model_dir())
    from pointsman.estimator.encoders import load_tokenizer

    ex = build_examples(
        [get_source("arena_bench_v1"), get_source("routellm_mtbench"), get_source("routellm_mmlu")],
        tokenizer=load_tokenizer(built.tokenizer_path),
        max_rows_per_source={"routellm_mmlu": 300},
    )
    emb = embed_texts(built, [f.query_text for f in ex.features], tmp_path_factory.mktemp("cache"))
    X = np.hstack([emb, request_matrix(ex.features)]).astype(np.float32)
    return X, ex.y_gap, ex.y, np.asarray(ex.group), emb.shape[1]


@pytest.mark.parametrize("kind", ["mlp", "logistic"])
def test_sklearn_and_onnxruntime_agree_on_real_prompts(real_xy, tmp_path, kind):
    X, y, y_cal, groups, dim = real_xy
    head = DifficultyHead(n_embedding=dim, kind=kind, n_members=2, max_iter=60, n_folds=2, alpha=10.0 if kind == "mlp" else 100.0)
    assert head.fit(X, y, groups=groups, calibration_y=y_cal) is head
    export_head(head, X.shape[1], tmp_path / "head.onnx")
    assert head_parity(head, tmp_path / "head.onnx", X) < 1e-4
    p = head.predict_proba(X)[:, 1]
    assert p.min() >= 0 and p.max() <= 1 and p.std() > 0


def test_estimator_conventions(real_xy):
    X, y, _, groups, dim = real_xy
    head = DifficultyHead(n_embedding=dim, hidden=8, n_members=1, max_iter=30, n_folds=2, random_state=3)
    params = head.get_params()
    assert params["hidden"] == 8 and params["random_state"] == 3
    assert not hasattr(head, "ranker_")
    twin = clone(head)
    assert twin.get_params() == params
    head.fit(X, y, groups=groups)
    for attr in ("ranker_", "calibration_slope_", "calibration_intercept_", "oof_proba_", "classes_", "n_features_in_"):
        assert hasattr(head, attr)
    assert not np.isnan(head.oof_proba_).any()
    assert list(head.classes_) == [0, 1] and head.n_features_in_ == X.shape[1]
    # Platt is monotone: calibration never reorders the ranker's scores
    order = np.argsort(head.ranker_score(X[:50]))
    assert np.all(np.diff(head.predict_proba(X[:50])[order, 1]) >= -1e-12)
    with pytest.raises(ValueError, match="soft labels"):
        clone(head).fit(X, y * 2)


def test_gate_lowers_anchors_and_exports_with_parity(tmp_path):
    """The easy-anchor gate: the ranker never sees the anchors, the gate pushes requests that look
    like them down, and the ONNX head computes exactly what scikit-learn does (MatMul + Softplus)."""

    rng = np.random.default_rng(0)
    n, d = 600, 12
    X = rng.normal(size=(n, d)).astype(np.float32)
    anchor = np.zeros(n, dtype=bool)
    anchor[:150] = True
    X[:150, 1] += 3.0  # the anchors sit apart on one direction
    y = 1.0 / (1.0 + np.exp(-X[:, 0]))
    kw = dict(n_embedding=6, kind="logistic", alpha=10.0, n_folds=3)
    gated = DifficultyHead(**kw, gate_weight=3.0, gate_shift=2.0, gate_alpha=10.0).fit(
        X, y, easy_anchor=anchor, calibration_y=np.where(anchor, 0.0, y))
    plain = DifficultyHead(**kw).fit(X[~anchor], y[~anchor])
    # the ranker is the same model either way: it is fitted on the substantive rows only
    np.testing.assert_allclose(gated.ranker_.predict_proba(X)[:, 1], plain.ranker_.predict_proba(X)[:, 1])
    p = gated.predict_proba(X)[:, 1]
    assert p[anchor].mean() < 0.5 * p[~anchor].mean()
    assert gated.gate_score(X[anchor]).mean() < 0 < gated.gate_score(X[~anchor]).mean()
    path = tmp_path / "head.onnx"
    export_head(gated, d, path)
    assert head_parity(gated, path, X) < 1e-5
    assert plain.gate_coef_ is None and np.isinf(plain.gate_score(X)).all()
    with pytest.raises(ValueError, match="every row is an easy anchor"):
        DifficultyHead(**kw, gate_weight=1.0).fit(X, y, easy_anchor=np.ones(n, dtype=bool))
