"""``DifficultyHead`` against scikit-learn's own estimator contract (``parametrize_with_checks``),
its label handling, and its predictions pinned to the values computed before it was made to pass.

Both kinds are checked, each in a small, fast configuration: ``mlp`` (the training recipe's
head) and ``logistic`` (the retraining loop's challenger). ``expected_failed_checks`` lists the
checks that contradict a deliberate design choice, each with the reason; ``xfail_strict``
turns a listed check that starts passing into a failure, so the list cannot go stale.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils.estimator_checks import parametrize_with_checks

from pointsman.estimator.head import DifficultyHead

FAST = dict(n_embedding=0, n_members=1, hidden=4, max_iter=50, n_folds=2)

#: Why weighted and repeated rows do not give the same head (both kinds).
_SAMPLE_WEIGHT_EQUIVALENCE = (
    "cross-fitting draws the calibration folds per row (one fold key per row when no groups are "
    "given): a row repeated k times gets k keys and may sit in several folds, a row weighted k "
    "sits in one, so the out-of-fold Platt fit sees different data (on the check's 15 rows a "
    "logistic fold's training part even holds a single class). Without folds (n_folds=0) both "
    "fits agree to float32 precision (~1e-7 relative: the ranker runs in float32, the dtype the "
    "ONNX export serves), at the edge of the check's rtol=1e-7."
)


def expected_failed_checks(head: DifficultyHead) -> dict[str, str]:
    """The checks ``head`` is known to fail, with the reason (see the module docstring)."""
    # check_methods_subset_invariance of the logistic kind used to be listed: float32 BLAS rounds a
    # row alone differently from the same row in a batch (~5e-7 relative, above the check's
    # rtol=1e-7). On the check's 20 rows the 2-fold out-of-fold Platt slope comes out below
    # MIN_CALIBRATION_SLOPE and is now floored at it, which shrinks that difference below the
    # tolerance, so the check passes for both kinds.
    del head  # the same list for both kinds
    return {"check_sample_weight_equivalence_on_dense_data": _SAMPLE_WEIGHT_EQUIVALENCE}


@pytest.mark.slow  # fits ~250 small heads
@parametrize_with_checks(
    [DifficultyHead(kind="mlp", **FAST), DifficultyHead(kind="logistic", **FAST)],
    expected_failed_checks=expected_failed_checks,
    xfail_strict=True,
)
def test_sklearn_estimator_checks(estimator, check):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)  # max_iter=50 keeps the checks fast
        check(estimator)


# -- label handling -----------------------------------------------------------------------------


def _blobs(n=40, seed=0):
    rng = np.random.default_rng(seed)
    y = np.arange(n) % 2
    X = rng.normal(size=(n, 3)) + 2.0 * y[:, None]
    return X, y


def _fast(**kw):
    return DifficultyHead(**{**FAST, **kw})


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_soft_labels_and_0_1_labels_give_classes_0_1():
    X, y = _blobs()
    soft = _fast().fit(X, np.where(y == 1, 0.8, 0.2))
    hard = _fast().fit(X, y)
    for head in (soft, hard):
        assert head.classes_.tolist() == [0, 1] and head.classes_.dtype == np.int64
        assert head.predict(X).dtype == np.int64
    assert hard.n_features_in_ == 3 and hard.n_iter_ >= 1


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_other_binary_labels_are_encoded_larger_label_positive():
    X, y = _blobs()
    words = np.array(["easy", "hard"])[y]
    head = _fast().fit(X, words)
    assert head.classes_.tolist() == ["easy", "hard"]
    assert set(head.predict(X)) <= {"easy", "hard"}
    same = _fast().fit(X, y)  # "hard" plays the part of 1: the same fit
    np.testing.assert_array_equal(head.predict_proba(X), same.predict_proba(X))
    cal = _fast().fit(X, words, calibration_y=words[::-1])
    assert cal.classes_.tolist() == ["easy", "hard"]


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_decision_function_is_the_calibrated_log_odds():
    X, y = _blobs()
    head = _fast(n_members=2).fit(X, np.where(y == 1, 0.9, 0.3))
    z = head.decision_function(X)
    np.testing.assert_allclose(z, head.calibration_slope_ * head.ranker_score(X) + head.calibration_intercept_)
    np.testing.assert_allclose(head.predict_proba(X)[:, 1], 1.0 / (1.0 + np.exp(-z)))
    np.testing.assert_array_equal(head.predict(X), (z >= 0).astype(np.int64))


@pytest.mark.parametrize(
    ("y", "match"),
    [
        (np.linspace(-1.0, 2.0, 40), "soft labels in \\[0, 1\\].*continuous"),  # a regression target
        (np.arange(40) % 3, "Only binary classification is supported"),
        (np.ones(40), "only one class"),
        (np.full(40, "x"), "only one class"),
        (np.r_[np.nan, np.zeros(39)], "NaN"),
    ],
)
def test_bad_targets_are_refused(y, match):
    X, _ = _blobs()
    with pytest.raises(ValueError, match=match):
        _fast().fit(X, y)


def test_bad_weights_and_calibration_labels_are_refused():
    X, y = _blobs()
    with pytest.raises(ValueError, match="one class"):  # weights leave one class
        _fast().fit(X, y, sample_weight=y.astype(float))
    with pytest.raises(ValueError, match="(?i)negative"):
        _fast().fit(X, y, sample_weight=np.r_[-1.0, np.ones(39)])
    with pytest.raises(ValueError, match="soft labels"):
        _fast().fit(X, y, calibration_y=np.full(40, 1.5))
    with pytest.raises(ValueError, match="inconsistent numbers of samples"):
        _fast().fit(X, y, groups=["g"] * 39)
    with pytest.raises(ValueError, match="n_embedding"):
        _fast(n_embedding=4).fit(X, y)


# -- predictions unchanged ----------------------------------------------------------------------


def _pinned_data(n=60, d=6, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d)).astype(np.float32)
    X[:, 3:] = rng.integers(0, 3, size=(n, d - 3))
    y = 1 / (1 + np.exp(-(X[:, 0] - X[:, 4] + 0.3 * rng.normal(size=n))))
    y[:5] = [0.0, 1.0, 0.0, 1.0, 0.5]
    w = rng.uniform(0.2, 2.0, size=n)
    groups = np.array([f"g{i % 17}" for i in range(n)])
    return X, y, w, groups, (y > 0.5).astype(np.float64)


def _pinned_fit(name):
    X, y, w, groups, y_cal = _pinned_data()
    params, fit_kw = {
        "mlp": (dict(n_embedding=3, kind="mlp", hidden=4, n_members=2, max_iter=50, n_folds=3, random_state=1),
                dict(groups=groups, calibration_y=y_cal)),
        "mlp_weighted": (dict(n_embedding=3, kind="mlp", hidden=5, n_members=1, max_iter=40, n_folds=2),
                         dict(sample_weight=w)),
        "logistic": (dict(n_embedding=3, kind="logistic", alpha=2.0, n_folds=3),
                     dict(sample_weight=w, groups=groups, calibration_y=y_cal, calibration_weight=w[::-1].copy())),
        "nocal": (dict(n_embedding=6, kind="mlp", hidden=3, n_members=1, max_iter=30, n_folds=0), {}),
    }[name]
    return DifficultyHead(**params).fit(X, y, **fit_kw), X[:8]


nan = math.nan
#: Computed with the head as it was before it followed scikit-learn's validation conventions
#: (commit ca48ded); ``ranker_score`` was then called ``decision_function``.
PINNED = {
    "mlp": {
        "proba": [0.24592241791443786, 0.2159767481298916, 0.0031233420825198806, 0.1509539112530142, 0.24385466695725716, 0.06248311289971382, 0.06617384425059339, 0.3522330292292359],
        "ranker_score": [0.8206293256661159, 0.7826830187157295, -0.22369285767486258, 0.6842429046432181, 0.8181154333894491, 0.4636541948411327, 0.4774428919222124, 0.935564167695049],
        "predict": [0, 0, 0, 0, 0, 0, 0, 0],
        "oof": [0.6940135955810547, 0.6865156292915344, 0.46096640825271606, 0.6684503555297852, 0.6877526044845581, 0.6174813508987427, 0.6313116550445557, 0.7153651714324951],
        "slope": 4.4480950127345, "intercept": -4.770716355666671,
    },
    "mlp_weighted": {
        "proba": [0.3306905511142044, 0.33121258299639766, 0.29651701027218674, 0.3333006877854161, 0.2997117372091733, 0.29468336452939803, 0.31430692132969495, 0.35527744986583537],
        "ranker_score": [0.5713505227704718, 0.583835492668658, -0.2699860010513335, 0.6336760077144448, -0.18913227781809105, -0.31662024661078025, 0.17420055685537195, 1.1493214581826865],
        "predict": [0, 0, 0, 0, 0, 0, 0, 0],
        "oof": [0.6468238234519958, 0.6133760809898376, 0.4347017705440521, 0.6292678713798523, 0.44404420256614685, 0.42060282826423645, 0.5550100207328796, 0.7957057952880859],
        "slope": 0.18883721897555486, "intercept": -0.8129557041510977,
    },
    "logistic": {
        "proba": [0.007674473670386933, 0.5335324964667826, 1.0150820941654524e-05, 0.2295387220343699, 0.5630664130917472, 0.006397098812089834, 0.0033513519959745696, 0.49157328183681637],
        "ranker_score": [-1.2513404749852697, -0.1981339532214833, -2.650096701907243, -0.4816984694898785, -0.17298997166095642, -1.28998696402667, -1.4269035155745045, -0.2335553881072494],
        "predict": [0, 1, 0, 0, 1, 0, 0, 0],
        "oof": [0.2247256189584732, 0.4027681350708008, 0.07705800980329514, 0.35517293214797974, 0.44701889157295227, 0.2357153594493866, 0.1910974681377411, 0.4644562900066376],
        "slope": 4.744067769051126, "intercept": 1.074292524463323,
    },
    "nocal": {
        "proba": [0.42219910025596624, 0.4096911549568176, 0.28747081756591797, 0.5257618427276611, 0.46443220973014826, 0.5103131532669067, 0.525076150894165, 0.42507979273796087],
        "ranker_score": [-0.31375234089324433, -0.36524227086718575, -0.9076995181393108, 0.10313870271004122, -0.14251186920037406, 0.041258464794189265, 0.1003888278847439, -0.30195436226807404],
        "predict": [0, 0, 0, 1, 0, 1, 1, 0],
        "oof": [nan, nan, nan, nan, nan, nan, nan, nan],
        "slope": 1.0, "intercept": 0.0,
    },
}


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
@pytest.mark.parametrize("name", sorted(PINNED))
def test_predictions_match_the_values_before_the_sklearn_conventions(name):
    head, X = _pinned_fit(name)
    want = PINNED[name]
    # The same computation as before, to the precision the library versions allow: the values were
    # pinned on one scikit-learn/scipy/numpy build, and a newer build (scikit-learn 1.9.1, scipy
    # 1.17.1, numpy 2.4.6) moves the float32 MLPs by ~4e-8 relative (float32 rounding, BLAS) and the
    # logistic ranker by ~1.4e-4 (lbfgs stops at its tol=1e-4, at an iterate that moves with the
    # release). Each is held to its own solver's precision, far below any change of the recipe.
    rtol = 1e-3 if name == "logistic" else 1e-6
    np.testing.assert_allclose(head.predict_proba(X)[:, 1], want["proba"], rtol=rtol, atol=0)
    np.testing.assert_allclose(head.ranker_score(X), want["ranker_score"], rtol=rtol, atol=0)
    np.testing.assert_allclose(head.oof_proba_[:8], want["oof"], rtol=rtol, atol=0)
    np.testing.assert_array_equal(head.predict(X), want["predict"])
    assert head.calibration_slope_ == pytest.approx(want["slope"], rel=rtol)
    assert head.calibration_intercept_ == pytest.approx(want["intercept"], rel=rtol, abs=1e-15)
    assert head.classes_.tolist() == [0, 1]
    assert clone(head).get_params() == head.get_params()


def test_calibration_never_reverses_the_rankers_order():
    """On labels the features do not predict, out-of-fold scores can fit a Platt slope below 0,
    which would flip the ranking: the slope is floored at ``MIN_CALIBRATION_SLOPE`` (flat at the
    base rate), so ``p_hard`` orders rows as the ranker does."""
    from pointsman.estimator.head import MIN_CALIBRATION_SLOPE

    floored = 0
    for seed in range(12):
        rng = np.random.default_rng(seed)
        X = rng.normal(size=(40, 5)).astype(np.float32)
        y = rng.integers(0, 2, 40).astype(np.float64)
        head = DifficultyHead(n_embedding=0, kind="logistic", alpha=1.0, n_folds=4, random_state=seed).fit(X, y)
        assert head.calibration_slope_ >= MIN_CALIBRATION_SLOPE
        probe = rng.normal(size=(30, 5)).astype(np.float32)
        assert np.array_equal(np.argsort(head.predict_proba(probe)[:, 1]), np.argsort(head.ranker_score(probe)))
        if head.calibration_slope_ == MIN_CALIBRATION_SLOPE:
            floored += 1
            assert head.predict_proba(probe)[:, 1].mean() == pytest.approx(y.mean(), abs=0.02)
    assert floored >= 1  # the noise made at least one fit want a reversing slope
