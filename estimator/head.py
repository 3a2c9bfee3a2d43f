"""The difficulty head: a scikit-learn classifier over embedding ⊕ request features.

``DifficultyHead`` follows scikit-learn's estimator conventions (``fit`` returns
``self``, learned attributes end in ``_``, ``get_params``/``set_params`` work). It
has two parts:

1. the *ranker* ``ranker_``: a ``Pipeline`` of per-block scaling (``StandardScaler`` on
   the embedding columns, ``MinMaxScaler`` on the request features, so rare 0/1 flags
   do not become huge z-scores) and a soft-voting ensemble of small MLPs trained
   on soft labels (each row weighted by its label, see ``expand_soft_labels``);
2. a Platt calibration ``p_hard = sigmoid(a * logit(q) + b)`` of the ranker's
   probability ``q``, fitted on out-of-fold ranker outputs (``oof_proba_``) against the
   calibration labels (Platt 1999; the sigmoid method of ``CalibratedClassifierCV``).
   The map is increasing (a fitted slope below ``MIN_CALIBRATION_SLOPE``, out-of-fold scores that
   do not rank the labels, is raised to it, flat at the base rate), so it changes no ranking (APGR,
   AUC), only the probabilities.
3. optionally (``gate_weight`` > 0 and rows marked ``easy_anchor`` in ``fit``) a *gate*: a linear
   classifier ``g(x)`` of "a substantive request" against easy anchors (requests every chat model
   answers acceptably: greetings, look-ups, edits of pasted text), which lowers the ranker's
   log-odds by ``gate_weight * softplus(-(g(x) + gate_shift))``: about 0 for a request that looks
   substantive, up to ``gate_weight`` x its distance past the boundary for one that looks trivial.
   The ranker never sees the anchors (their comparison labels do not exist), so it ranks
   substantive requests as before; the calibration sees both.

It passes scikit-learn's ``check_estimator`` (``tests/estimator/test_head_contract.py``): inputs
go through ``validate_data`` / ``_check_sample_weight``, predictions through ``check_is_fitted``,
and ``__sklearn_tags__`` declares a binary classifier on dense input. The one deliberate
departure: ``y`` may be *soft* labels in [0, 1] (the ranking target), not only two classes.

Training-only: imports scikit-learn. Export with ``estimator.export.export_head``.
"""

from __future__ import annotations

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.compose import ColumnTransformer
from sklearn.ensemble import VotingClassifier
from sklearn.linear_model import LogisticRegression
from sklearn.neural_network import MLPClassifier
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import MinMaxScaler, StandardScaler
from sklearn.utils import Tags
from sklearn.utils.multiclass import type_of_target
from sklearn.utils.validation import _check_sample_weight, check_consistent_length, check_is_fitted, column_or_1d, validate_data

from pointsman.datasets.splits import assign_folds

_EPS = 1e-6
#: Smallest Platt slope kept: a fitted slope below it (out-of-fold scores that do not rank the
#: labels) becomes this, with the intercept of the base rate, so the map stays increasing.
MIN_CALIBRATION_SLOPE = 0.01
#: ``classes_`` of a head fitted on soft labels or on 0/1 labels: ``p_hard`` is the probability of 1.
_SOFT_CLASSES = (0, 1)


def _logit(p: np.ndarray) -> np.ndarray:
    q: np.ndarray = np.clip(np.asarray(p, dtype=np.float64), _EPS, 1.0 - _EPS)
    return np.asarray(np.log(q) - np.log1p(-q), dtype=np.float64)


def expand_soft_labels(y: np.ndarray, weight: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Turn soft labels into a weighted binary problem for any scikit-learn classifier.

    Row i becomes two rows: label 1 with weight ``weight[i]*y[i]`` and label 0 with
    weight ``weight[i]*(1-y[i])``; the weighted log-loss equals the soft-label
    cross-entropy. Returns ``(index (2n,), labels int64 (2n,), weights float64 (2n,))``
    where ``index`` points back into the original rows (for features and groups).
    Rows whose expanded weight is 0 are dropped.
    """
    y = np.asarray(y, dtype=np.float64)
    weight = np.asarray(weight, dtype=np.float64)
    n = len(y)
    index = np.concatenate([np.arange(n), np.arange(n)])
    labels = np.concatenate([np.ones(n, dtype=np.int64), np.zeros(n, dtype=np.int64)])
    weights = np.concatenate([weight * y, weight * (1.0 - y)])
    keep = weights > 0
    return index[keep], labels[keep], weights[keep]


def _is_soft(values: np.ndarray) -> bool:
    """Numeric values all in [0, 1] (soft labels, or the classes 0 and 1)."""
    return values.dtype.kind in "biuf" and bool(np.all((values >= 0) & (values <= 1)))


def _targets(y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(soft labels float64 (n,), classes_)`` from a validated 1-D ``y``: soft labels in [0, 1]
    (continuous) or 0/1 labels are taken as they are (``classes_`` [0, 1]); any other two labels
    (strings, {-1, 1}, ...) become 1 for ``classes_[1]`` (the larger, as ``np.unique`` sorts) and
    0 for ``classes_[0]``. Raises ``ValueError`` for more than two classes and for continuous
    values outside [0, 1]."""
    y_type = type_of_target(y, input_name="y", raise_unknown=True)
    if y_type == "continuous":
        if not _is_soft(y):
            raise ValueError(
                "y must be soft labels in [0, 1] or two classes; got continuous values in "
                f"[{float(np.min(y)):g}, {float(np.max(y)):g}] (a regression target?)"
            )
        return np.asarray(y, dtype=np.float64), np.array(_SOFT_CLASSES)
    if y_type != "binary":
        raise ValueError(f"Only binary classification is supported. The type of the target is {y_type}.")
    if _is_soft(y):
        return np.asarray(y, dtype=np.float64), np.array(_SOFT_CLASSES)
    classes = np.unique(y)
    if len(classes) < 2:
        raise ValueError(f"DifficultyHead can't train when only one class is present: {classes[0]!r}")
    return np.asarray(y == classes[1], dtype=np.float64), classes


def _calibration_targets(calibration_y: object, classes: np.ndarray, n: int) -> np.ndarray:
    """``calibration_y`` as soft labels of ``classes[1]`` (n,): values in [0, 1] when the head has
    the 0/1 classes, else labels among ``classes``."""
    raw = np.asarray(column_or_1d(calibration_y, warn=True))
    check_consistent_length(raw, np.empty(n))
    if raw.dtype.kind in "biuf" and raw.dtype.kind != "b":
        raw = raw.astype(np.float64)
        if not np.all(np.isfinite(raw)):
            raise ValueError("calibration_y must not contain NaN or infinity")
    if np.array_equal(classes, _SOFT_CLASSES) and raw.dtype.kind in "biuf":
        if not _is_soft(raw):
            raise ValueError("calibration_y must be soft labels in [0, 1]")
        return np.asarray(raw, dtype=np.float64)
    unknown = np.setdiff1d(raw, classes)
    if len(unknown):
        raise ValueError(f"calibration_y has labels {unknown[:5].tolist()} not among the classes {classes.tolist()}")
    return np.asarray(raw == classes[1], dtype=np.float64)


class DifficultyHead(ClassifierMixin, BaseEstimator):
    """Calibrated ``p_hard`` from float features (n, n_embedding + n_request).

    Parameters: ``n_embedding`` (leading embedding columns; the rest are request
    features), ``kind`` (``mlp`` ensemble or a single ``logistic`` regression with
    ``C = 1/alpha``), ``hidden`` (MLP hidden units), ``alpha`` (L2 penalty), ``n_members``
    (MLPs in the soft-voting ensemble, seeds ``random_state + i``), ``max_iter``,
    ``n_folds`` (cross-fitting folds for the calibration; 0 = no calibration),
    ``random_state``, ``scale`` (``blocks``: z-scores on the embedding, min-max on the request
    features; ``standard``: z-scores on every column, so each block weighs by its spread),
    ``gate_weight`` / ``gate_shift`` / ``gate_alpha`` (the easy-anchor gate, see the module; L2
    penalty ``gate_alpha`` on z-scored inputs; weight 0 = no gate).

    ``fit(X, y, sample_weight=None, groups=None, calibration_y=None, calibration_weight=None)``:
    ``y`` are soft labels in [0, 1] (the ranking target), or two class labels (``classes_[1]``,
    the larger, is the positive class: 1 for 0/1 labels); ``groups`` are leakage-safe
    group keys for the folds (``datasets.splits.group_key``); the calibration fits
    ``calibration_y`` (default ``y``) with ``calibration_weight`` (default ``sample_weight``);
    ``easy_anchor`` bool (n,) marks easy-anchor rows: the ranker skips them and, with
    ``gate_weight`` > 0, the gate learns them (their ``y`` is ignored; their calibration label is
    their ``calibration_y``).

    Learned attributes: ``ranker_``, ``gate_coef_`` float64 (n_features,) and ``gate_intercept_``
    (the gate on raw inputs; None without a gate), ``calibration_slope_``, ``calibration_intercept_``,
    ``oof_proba_`` (uncalibrated out-of-fold ranker probabilities, (n,); NaN if
    ``n_folds == 0``), ``classes_`` ([0, 1] for soft or 0/1 labels, else the two labels),
    ``n_features_in_`` (and ``feature_names_in_`` for a DataFrame), ``n_iter_`` (iterations of
    the final ranker's longest-running member).
    """

    def __init__(
        self,
        n_embedding: int = 384,
        kind: str = "mlp",
        hidden: int = 16,
        alpha: float = 10.0,
        n_members: int = 3,
        max_iter: int = 200,
        n_folds: int = 5,
        random_state: int = 0,
        scale: str = "blocks",
        gate_weight: float = 0.0,
        gate_shift: float = 2.0,
        gate_alpha: float = 10.0,
    ) -> None:
        self.n_embedding = n_embedding
        self.kind = kind
        self.hidden = hidden
        self.alpha = alpha
        self.n_members = n_members
        self.max_iter = max_iter
        self.n_folds = n_folds
        self.random_state = random_state
        self.scale = scale
        self.gate_weight = gate_weight
        self.gate_shift = gate_shift
        self.gate_alpha = gate_alpha

    def __sklearn_tags__(self) -> Tags:
        """A binary classifier (soft labels allowed) on dense, finite float input."""
        tags = super().__sklearn_tags__()
        tags.classifier_tags.multi_class = False
        tags.input_tags.sparse = False
        tags.input_tags.allow_nan = False
        return tags

    def _make_ranker(self, n_features: int) -> Pipeline:
        emb = list(range(self.n_embedding))
        req = list(range(self.n_embedding, n_features))
        if self.scale == "standard":
            blocks = [("all", StandardScaler(), emb + req)]
        elif self.scale == "blocks":
            blocks = [("embedding", StandardScaler(), emb)]
            if req:
                blocks.append(("request", MinMaxScaler(), req))
        else:
            raise ValueError(f"scale must be 'blocks' or 'standard', got {self.scale!r}")
        if self.kind == "logistic":
            members = [("logistic", LogisticRegression(C=1.0 / self.alpha, max_iter=max(self.max_iter, 1000)))]
        elif self.kind == "mlp":
            members = [
                (
                    f"mlp{i}",
                    MLPClassifier(
                        hidden_layer_sizes=(self.hidden,),
                        alpha=self.alpha,
                        max_iter=self.max_iter,
                        random_state=self.random_state + i,
                    ),
                )
                for i in range(self.n_members)
            ]
        else:
            raise ValueError(f"kind must be 'mlp' or 'logistic', got {self.kind!r}")
        return Pipeline(
            [
                ("scale", ColumnTransformer(blocks)),
                ("vote", VotingClassifier(members, voting="soft", flatten_transform=False)),
            ]
        )

    def _fit_ranker(self, X: np.ndarray, y: np.ndarray, w: np.ndarray) -> Pipeline:
        idx, lab, sw = expand_soft_labels(y, w)
        ranker = self._make_ranker(X.shape[1])
        ranker.fit(X[idx], lab, vote__sample_weight=sw)
        return ranker

    def fit(
        self,
        X: np.ndarray,
        y: np.ndarray,
        sample_weight: np.ndarray | None = None,
        groups: np.ndarray | list[str] | None = None,
        calibration_y: np.ndarray | None = None,
        calibration_weight: np.ndarray | None = None,
        easy_anchor: np.ndarray | None = None,
    ) -> DifficultyHead:
        """Fit the ranker on soft labels and the Platt calibration on out-of-fold scores.

        ``X`` float (n, n_features), finite, dense; ``y`` float (n,) in [0, 1] or two class
        labels; weights float (n,) >= 0, not all 0. Raises ``ValueError`` for mismatched
        shapes, NaN or infinite values, labels outside [0, 1], more than two classes, or a
        single class (after weighting).
        """
        X, y_raw = validate_data(self, X, y, dtype=np.float32)
        X = np.asarray(X, dtype=np.float32)
        y, classes = _targets(np.asarray(y_raw))
        n = len(X)
        if X.shape[1] < self.n_embedding:
            raise ValueError(f"X has {X.shape[1]} columns, fewer than n_embedding={self.n_embedding}")
        w = np.asarray(_check_sample_weight(sample_weight, X, dtype=np.float64, ensure_non_negative=True))
        if not (np.sum(w * y) > 0 and np.sum(w * (1.0 - y)) > 0):
            only = classes[1] if np.sum(w * y) > 0 else classes[0]
            raise ValueError(
                f"DifficultyHead can't train when only one class is present (class {only!r}, after sample weights)"
            )
        if groups is not None:
            check_consistent_length(X, groups)
        cal_y = y if calibration_y is None else _calibration_targets(calibration_y, classes, n)
        cal_w = w if calibration_weight is None else np.asarray(
            _check_sample_weight(calibration_weight, X, dtype=np.float64, ensure_non_negative=True)
        )
        anchor = np.zeros(n, dtype=bool) if easy_anchor is None else np.asarray(column_or_1d(easy_anchor), dtype=bool)
        check_consistent_length(X, anchor)
        if anchor.all():
            raise ValueError("every row is an easy anchor: the ranker has nothing to learn from")
        real = ~anchor
        gated = self.gate_weight > 0 and anchor.any()
        self.gate_coef_: np.ndarray | None = None
        self.gate_intercept_ = 0.0
        self.oof_proba_ = np.full(n, np.nan)
        self.calibration_slope_, self.calibration_intercept_ = 1.0, 0.0
        if self.n_folds and self.n_folds >= 2:
            keys = [str(g) for g in groups] if groups is not None else [str(i) for i in range(n)]
            folds = assign_folds(keys, self.n_folds, seed=self.random_state)
            for f in range(self.n_folds):
                test = folds == f
                if not test.any() or test.all():
                    continue
                ranker = self._fit_ranker(X[~test & real], y[~test & real], w[~test & real])
                self.gate_coef_, self.gate_intercept_ = (  # the gate out of fold too
                    self._fit_gate(X[~test], anchor[~test], w[~test]) if gated else (None, 0.0))
                self.oof_proba_[test] = self._gated(ranker.predict_proba(X[test])[:, 1], X[test])
            ok = ~np.isnan(self.oof_proba_)
            z = _logit(self.oof_proba_[ok])[:, None]
            idx, lab, sw = expand_soft_labels(cal_y[ok], cal_w[ok])
            platt = LogisticRegression(C=1e4, max_iter=1000).fit(z[idx], lab, sample_weight=sw)
            self.calibration_slope_ = float(platt.coef_[0, 0])
            self.calibration_intercept_ = float(platt.intercept_[0])
            if self.calibration_slope_ < MIN_CALIBRATION_SLOPE:
                # Out-of-fold scores that do not rank the labels (few or noisy rows) fit a slope <= 0,
                # which would reverse the ranker's order: keep the order, flat at the base rate.
                base_rate = float(np.clip(np.average(cal_y[ok], weights=cal_w[ok]), _EPS, 1.0 - _EPS))
                self.calibration_slope_ = MIN_CALIBRATION_SLOPE
                self.calibration_intercept_ = float(_logit(np.array([base_rate]))[0]
                                                    - MIN_CALIBRATION_SLOPE * np.average(z[:, 0], weights=cal_w[ok]))
        self.gate_coef_, self.gate_intercept_ = self._fit_gate(X, anchor, w) if gated else (None, 0.0)
        self.ranker_ = self._fit_ranker(X[real], y[real], w[real])
        self.classes_ = classes
        self.n_iter_ = max(int(np.max(m.n_iter_)) for m in self.ranker_.named_steps["vote"].estimators_)
        return self

    def _fit_gate(self, X: np.ndarray, anchor: np.ndarray, w: np.ndarray) -> tuple[np.ndarray | None, float]:
        """The gate (substantive 1 / easy anchor 0) fitted on z-scored ``X``, the anchors weighing as
        much in all as the other rows (each side keeps its rows' relative ``w``), on raw inputs:
        ``(coef (n_features,), intercept)``; ``(None, 0.0)`` when a side is empty."""
        real = ~anchor
        if not (anchor.any() and real.any()):
            return None, 0.0
        gw = np.where(anchor, w / max(w[anchor].sum(), _EPS), w / max(w[real].sum(), _EPS))
        scaler = StandardScaler().fit(X)
        gate = LogisticRegression(C=1.0 / self.gate_alpha, max_iter=3000)
        gate.fit(scaler.transform(X), real.astype(np.int64), sample_weight=gw * len(gw) / gw.sum())
        coef = gate.coef_[0] / scaler.scale_
        return np.asarray(coef, dtype=np.float64), float(gate.intercept_[0] - np.dot(coef, scaler.mean_))

    def gate_score(self, X: np.ndarray) -> np.ndarray:
        """The gate's log-odds that each request is substantive, not an easy anchor: float64 (n,);
        +inf without a gate."""
        if self.gate_coef_ is None:
            return np.full(len(X), np.inf)
        return np.asarray(np.asarray(X, dtype=np.float64) @ self.gate_coef_ + self.gate_intercept_, dtype=np.float64)

    def _gated(self, q: np.ndarray, X: np.ndarray) -> np.ndarray:
        """``q`` lowered by the gate: sigmoid(logit(q) - gate_weight * softplus(-(g + gate_shift)))."""
        if self.gate_coef_ is None:
            return np.asarray(q, dtype=np.float64)
        z = _logit(q) - self.gate_weight * np.logaddexp(0.0, -(self.gate_score(X) + self.gate_shift))
        return np.asarray(1.0 / (1.0 + np.exp(-z)), dtype=np.float64)

    def _ranker_proba(self, X: np.ndarray) -> np.ndarray:
        """The ranker's uncalibrated probability ``q`` of ``classes_[1]``, lowered by the gate when
        there is one: float64 (n,)."""
        check_is_fitted(self)
        X = np.asarray(validate_data(self, X, dtype=np.float32, reset=False), dtype=np.float32)
        return self._gated(np.asarray(self.ranker_.predict_proba(X)[:, 1], dtype=np.float64), X)

    def ranker_score(self, X: np.ndarray) -> np.ndarray:
        """Uncalibrated score ``logit(q)`` of the ranker: float64 (n,). Same order as
        ``decision_function`` whenever the Platt slope is positive."""
        return _logit(self._ranker_proba(X))

    def decision_function(self, X: np.ndarray) -> np.ndarray:
        """Calibrated log-odds ``a * logit(q) + b`` of ``classes_[1]``: float64 (n,);
        ``predict_proba`` is its sigmoid and ``predict`` its sign (scikit-learn's contract)."""
        return self._platt(self._ranker_proba(X))

    def _platt(self, q: np.ndarray) -> np.ndarray:
        return np.asarray(self.calibration_slope_ * _logit(q) + self.calibration_intercept_, dtype=np.float64)

    def calibrate(self, q: np.ndarray) -> np.ndarray:
        """Apply the Platt map to ranker probabilities ``q`` (n,): calibrated ``p_hard`` (n,)."""
        check_is_fitted(self)
        z = self._platt(q)
        return np.asarray(1.0 / (1.0 + np.exp(-z)), dtype=np.float64)

    def predict_proba(self, X: np.ndarray) -> np.ndarray:
        """Calibrated probabilities float64 (n, 2): column 1 is ``p_hard`` (of ``classes_[1]``)."""
        p = self.calibrate(self._ranker_proba(X))
        return np.column_stack([1.0 - p, p])

    def predict(self, X: np.ndarray) -> np.ndarray:
        """``classes_[1]`` where ``p_hard >= 0.5`` else ``classes_[0]`` (int64 0/1 for soft labels): (n,)."""
        positive = self.predict_proba(X)[:, 1] >= 0.5
        return np.asarray(self.classes_[positive.astype(np.int64)])
