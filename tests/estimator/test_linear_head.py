"""The difficulty head in numpy (``estimator/linear_head.py``): the p_hard onnxruntime computes running the
same ``head.onnx``, for the shipped model, every graph ``export_head`` writes for a logistic ranker and a
model trained through ``train``; another graph (an MLP ensemble) served on onnxruntime; the sanity suite
routed to the same targets."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pointsman.datasets.sources import DEFAULT_TRAINING_SOURCES
from pointsman.estimator.difficulty import OnnxHead
from pointsman.estimator.export import export_head
from pointsman.estimator.head import DifficultyHead
from pointsman.estimator.linear_head import LinearHead, read_linear_head
from pointsman.estimator.model_source import bundled_model_dir, load_estimator

SHIPPED = bundled_model_dir() / "head.onnx"


def _session(path):
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def _sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


def _tolerance(head: LinearHead, x: np.ndarray) -> np.ndarray:
    """1e-6 plus what onnxruntime's float32 arithmetic may move p_hard by (n,): its sums (2^-20 of their
    terms' magnitude) and 8 ulps of its probabilities q read back as log-odds (8 * 2^-24 / (q (1 - q)):
    near q = 1 a float32 ulp is a few percent of 1 - q, and the gate's penalty can bring the log-odds so
    rounded back to where p_hard is not flat), through the Platt map's slope."""
    x64 = x.astype(np.float64)
    bias = np.asarray(head.bias)
    s = x64 @ head.weights + bias
    magnitude = np.abs(x64) @ np.abs(head.weights) + np.abs(bias) + 1.0
    ranker = np.clip(s[:, 0], head.logit_lo, head.logit_hi)
    gated = np.clip(ranker - head.gate_weight * np.logaddexp(0.0, -s[:, 1]), head.logit_lo, head.logit_hi)
    q, qg = _sigmoid(ranker), _sigmoid(gated)
    p = _sigmoid(head.slope * gated + head.intercept)
    logit_error = (2.0 ** -20 * (magnitude[:, 0] + head.gate_weight * magnitude[:, 1])
                   + 8 * 2.0 ** -24 * (1.0 / (q * (1.0 - q)) + 1.0 / (qg * (1.0 - qg))))
    return 1e-6 + abs(head.slope) * p * (1.0 - p) * logit_error


@st.composite
def head_inputs(draw, d: int):
    """1-3 rows of d columns: normal values at one of several scales (an embedding's, a log count's,
    far past any real input so the ranker's and the gate's clips are hit), some cells set to extremes."""
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
    k = draw(st.integers(1, 3))
    x = rng.normal(size=(k, d)) * draw(st.sampled_from([0.05, 1.0, 5.0, 30.0, 1e3]))
    for i, j, v in draw(st.lists(st.tuples(st.integers(0, k - 1), st.integers(0, d - 1),
                                           st.floats(-1e4, 1e4, width=32)), max_size=6)):
        x[i, j] = v
    return x.astype(np.float32)


def _agrees(head, session, x):
    got = head(x)
    want = session.run(["p_hard"], {"features": x})[0]
    assert got.dtype == np.float32 and got.shape == (len(x),)
    excess = np.abs(got.astype(np.float64) - want) - _tolerance(head, x)
    assert excess.max() <= 0, (x, got, want)


@pytest.fixture(scope="module")
def shipped():
    head = read_linear_head(SHIPPED)
    assert isinstance(head, LinearHead) and head.gate_weight > 0  # the shipped recipe's gate
    return head, _session(SHIPPED)


@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_shipped_head_scores_as_onnxruntime_runs_the_file(shipped, data):
    head, session = shipped
    _agrees(head, session, data.draw(head_inputs(head.weights.shape[0])))


def test_the_clips_are_onnxruntime_s(shipped):
    """Rows far past either clip: p_hard is the Platt map of the clip bound's log-odds, as onnxruntime's."""
    head, session = shipped
    push = np.sign(head.weights[:, 0]).astype(np.float32) * np.float32(1e4)
    x = np.stack([push, -push, np.zeros_like(push)])
    np.testing.assert_allclose(head(x), session.run(["p_hard"], {"features": x})[0], rtol=0, atol=1e-6)
    assert head(x[1:2])[0] == np.float32(_sigmoid(head.slope * head.logit_lo + head.intercept))


def _synthetic(scale, gate_weight, d=12):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(400, d)).astype(np.float32)
    anchor = np.arange(400) < 100
    X[anchor, 1] += 3.0
    y = _sigmoid(X[:, 0])
    head = DifficultyHead(n_embedding=6, kind="logistic", alpha=10.0, n_folds=2, scale=scale,
                          gate_weight=gate_weight, gate_alpha=10.0)
    return head.fit(X, y, easy_anchor=anchor, calibration_y=np.where(anchor, 0.0, y)), X


@pytest.fixture(scope="module", params=[("standard", 2.0), ("standard", 0.0), ("blocks", 2.0), ("blocks", 0.0)],
                ids=lambda p: f"{p[0]}-{'gate' if p[1] else 'no gate'}")
def variant(request, tmp_path_factory):
    """Every head graph ``export_head`` writes for a logistic ranker: either scaling, with or without a gate."""
    fitted, X = _synthetic(*request.param)
    path = tmp_path_factory.mktemp("head") / "head.onnx"
    export_head(fitted, X.shape[1], path)
    head = read_linear_head(path)
    assert isinstance(head, LinearHead) and (head.gate_weight > 0) == (request.param[1] > 0)
    return head, _session(path), fitted, X


@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_every_linear_graph_scores_as_onnxruntime(variant, data):
    head, session, _, X = variant
    _agrees(head, session, data.draw(head_inputs(X.shape[1])))


def test_linear_graphs_score_as_scikit_learn(variant):
    head, _, fitted, X = variant
    np.testing.assert_allclose(head(X), fitted.predict_proba(X)[:, 1], rtol=0, atol=1e-6)


def _edited(tmp_path, edit):
    model = onnx.load(str(SHIPPED))
    edit(model.graph)
    path = tmp_path / "head.onnx"
    onnx.save(model, str(path))
    return path


@pytest.mark.parametrize("edit", [
    lambda g: setattr(next(n for n in g.node if n.op_type == "Softplus"), "op_type", "Relu"),
    lambda g: next(n for n in g.node if n.op_type == "LinearClassifier").attribute[-1].CopyFrom(
        onnx.helper.make_attribute("post_transform", "NONE")),
    lambda g: next(t for t in g.initializer if t.name == "w0").CopyFrom(
        onnx.numpy_helper.from_array(np.array([0.5], dtype=np.float32), "w0")),
    lambda g: (g.node.insert(0, onnx.helper.make_node("Relu", ["features"], ["features_relu"])),
               next(n for n in g.node if n.op_type == "Scaler").input.__setitem__(0, "features_relu")),
], ids=["softplus-relu", "no-logistic", "voting-weight", "relu-before-scaler"])
def test_another_graph_is_left_to_onnxruntime(tmp_path, edit):
    """A head graph that is not the linear head export_head writes is not computed as if it were."""
    assert read_linear_head(_edited(tmp_path, edit)) is None


@pytest.fixture(scope="module", params=["logistic", "mlp"])
def trained(request, tmp_path_factory):
    """A small model trained by ``train`` (the shipped recipe, its head's kind as given); ``train`` itself
    checks the served p_hard against the scikit-learn head (``check_served``)."""
    from pointsman.training.recipe import TrainConfig
    from pointsman.training.train import train

    out = tmp_path_factory.mktemp("trained")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("POINTSMAN_DATA_DIR", str(out / "data"))
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        cfg = TrainConfig(encoder_from=str(bundled_model_dir()), head=request.param, n_folds=2, n_members=1,
                          max_iter=40, max_rows_per_source={s: 20 for s in DEFAULT_TRAINING_SOURCES})
        result = train(cfg, out / "model", use_mlflow=False, log=lambda m: None)
    assert result.metrics["export/end_to_end_max_abs"] < 1e-4
    return request.param, load_estimator(out / "model")


@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_a_trained_model_is_served_by_its_head_s_kind(trained, data):
    """The shipped recipe's head (logistic, gated) in numpy, as onnxruntime runs its file; an MLP ensemble
    on onnxruntime."""
    kind, est = trained
    path = est.model_dir / est.manifest.head.file
    x = data.draw(head_inputs(len(est.manifest.head.feature_names)))
    if kind == "mlp":
        assert isinstance(est.head, OnnxHead) and read_linear_head(path) is None
        np.testing.assert_array_equal(est.predict_matrix(x), _session(path).run(["p_hard"], {"features": x})[0])
    else:
        assert isinstance(est.head, LinearHead) and est.head.gate_weight > 0
        _agrees(est.head, _session(path), x)


def test_sanity_suite_routes_as_with_onnxruntime():
    """The sanity suite's requests routed by the default policy with the shipped head in numpy and on
    onnxruntime running head.onnx: the same targets and rules, the same p_hard up to float32 rounding."""
    from pointsman.policy.engine import RoutingEngine
    from pointsman.policy.fleet import load_fleet
    from pointsman.policy.rules.compiler import DEFAULT_POLICY_PATH, load_policy
    from pointsman.request import parse_route_request
    from pointsman.training.sanity import messages_of, read_pairs

    fleet = load_fleet()
    policy = load_policy(DEFAULT_POLICY_PATH, fleet)
    numpy_est, ort_est = load_estimator("bundled"), load_estimator("bundled")
    ort_est.head = OnnxHead(SHIPPED, "features", "p_hard")
    engines = [RoutingEngine(fleet, policy, e) for e in (numpy_est, ort_est)]
    requests = [{"messages": messages_of(r)} for pair in read_pairs("sanity") for r in (pair.easy, pair.hard)]
    a, b = ([e.route(parse_route_request(r), dispatch=False) for r in requests] for e in engines)
    assert [(d.target, d.rule) for d in a] == [(d.target, d.rule) for d in b]
    assert len({d.target for d in a}) > 1  # the suite reaches both sides of the policy's p_hard threshold
    # measured 1.4e-6 at most: onnxruntime sums the 414 products in float32
    np.testing.assert_allclose([d.p_hard for d in a], [d.p_hard for d in b], rtol=0, atol=5e-6)


@given(slope=st.floats(-1e4, 1e4), intercept=st.floats(-1e4, 1e4), s=st.floats(-100, 100))
def test_a_steep_platt_map_scores_without_overflow(slope, intercept, s):
    """A Platt map fitted on separable rows (a slope of hundreds) sends the clipped log-odds far past
    exp's range: p_hard is the sigmoid's limit, never an OverflowError (train --table of a small separable
    table failed its own end-to-end check so)."""
    head = LinearHead(weights=np.ones((1, 2)), bias=(0.0, 0.0), gate_weight=0.0, logit_lo=-17.0, logit_hi=17.0,
                      slope=slope, intercept=intercept)
    x = float(np.float32(s))
    z = slope * min(max(x, -17.0), 17.0) + intercept
    assert head(np.asarray([[x]], dtype=np.float32))[0] == pytest.approx(_sigmoid(np.float64(z)), abs=1e-7)
