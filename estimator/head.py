"""The difficulty head: a scikit-learn classifier over embedding ⊕ request features.

``DifficultyHead`` follows scikit-learn's estimator conventions (``fit`` returns
``self``, learned attributes end in ``_``, ``get_params``/``set_params`` work). It
has two parts:

1. the *ranker* ``ranker_``: a ``Pipeline`` of per-block scaling (``StandardScaler`` on
   the embedding columns, ``MinMaxScaler`` on the request features, so rare 0/1 flags
   do not become huge z-scores) and a soft-voting ensemble of small MLPs trained
   on soft labels (each row weighted by its label, see ``training.labels.expand_soft_labels``);
2. a Platt calibration ``p_hard = sigmoid(a * logit(q) + b)`` of the ranker's
   probability ``q``, fitted on out-of-fold ranker outputs (``oof_proba_``) against the
   calibration labels (Platt 1999; the sigmoid method of ``CalibratedClassifierCV``).
   The map is monotone, so it changes no ranking (APGR, AUC), only the probabilities.

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

from pointsman.datasets.splits import assign_folds

_EPS = 1e-6


def _logit(p: np.ndarray) -> np.ndarray:
    q: np.ndarray = np.clip(np.asarray(p, dtype=np.float64), _EPS, 1.0 - _EPS)
    return np.asarray(np.log(q) - np.log1p(-q), dtype=np.float64)


def _expand(y: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n = len(y)
    idx = np.concatenate([np.arange(n), np.arange(n)])
    lab = np.concatenate([np.ones(n, dtype=np.int64), np.zeros(n, dtype=np.int64)])
    sw = np.concatenate([w * y, w * (1.0 - y)])
    keep = sw > 0
    return idx[keep], lab[keep], sw[keep]


class DifficultyHead(ClassifierMixin, BaseEstimator):
    """Calibrated ``p_hard`` from float features (n, n_embedding + n_request).

    Parameters: ``n_embedding`` (leading embedding columns; the rest are request
    features), ``kind`` (``mlp`` ensemble or a single ``logistic`` regression with
    ``C = 1/alpha``), ``hidden`` (MLP hidden units), ``alpha`` (L2 penalty), ``n_members``
    (MLPs in the soft-voting ensemble, seeds ``random_state + i``), ``max_iter``,
    ``n_folds`` (cross-fitting folds for the calibration; 0 = no calibration),
    ``random_state``.

    ``fit(X, y, sample_weight=None, groups=None, calibration_y=None, calibration_weight=None)``:
    ``y`` are soft labels in [0, 1] (the ranking target); ``groups`` are leakage-safe
    group keys for the folds (``datasets.splits.group_key``); the calibration fits
    ``calibration_y`` (default ``y``) with ``calibration_weight`` (default ``sample_weight``).

    Learned attributes: ``ranker_``, ``calibration_slope_``, ``calibration_intercept_``,
    ``oof_proba_`` (uncalibrated out-of-fold ranker probabilities, (n,); NaN if
    ``n_folds == 0``), ``classes_`` ([0, 1]), ``n_features_in_``.
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
    ) -> None:
        self.n_embedding = n_embedding
        self.kind = kind
        self.hidden = hidden
        self.alpha = alpha
        self.n_members = n_members
        self.max_iter = max_iter
        self.n_folds = n_folds
        self.random_state = random_state

    def _make_ranker(self, n_features: int) -> Pipeline:
        emb = list(range(self.n_embedding))
        req = list(range(self.n_embedding, n_features))
        blocks = [("embedding", StandardScaler(), emb)]
        if req:
            blocks.append(("request", MinMaxScaler(), req))
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
        idx, lab, sw = _expand(y, w)
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
    ) -> DifficultyHead:
        """Fit the ranker on soft labels and the Platt calibration on out-of-fold scores.

        ``X`` float (n, n_features); ``y`` float (n,) in [0, 1]; weights float (n,) >= 0.
        Raises ``ValueError`` for mismatched shapes or labels outside [0, 1].
        """
        X = np.asarray(X, dtype=np.float32)
        y = np.asarray(y, dtype=np.float64)
        n = len(X)
        if X.ndim != 2 or len(y) != n:
            raise ValueError(f"X must be (n, d) and y (n,); got {X.shape} and {y.shape}")
        if X.shape[1] < self.n_embedding:
            raise ValueError(f"X has {X.shape[1]} columns, fewer than n_embedding={self.n_embedding}")
        if np.isnan(y).any() or (y < 0).any() or (y > 1).any():
            raise ValueError("y must be soft labels in [0, 1] without NaN")
        w = np.ones(n) if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
        cal_y = y if calibration_y is None else np.asarray(calibration_y, dtype=np.float64)
        cal_w = w if calibration_weight is None else np.asarray(calibration_weight, dtype=np.float64)
        self.oof_proba_ = np.full(n, np.nan)
        self.calibration_slope_, self.calibration_intercept_ = 1.0, 0.0
        if self.n_folds and self.n_folds >= 2:
            keys = [str(g) for g in groups] if groups is not None else [str(i) for i in range(n)]
            folds = assign_folds(keys, self.n_folds, seed=self.random_state)
            for f in range(self.n_folds):
                test = folds == f
                if not test.any() or test.all():
                    continue
                ranker = self._fit_ranker(X[~test], y[~test], w[~test])
                self.oof_proba_[test] = ranker.predict_proba(X[test])[:, 1]
            ok = ~np.isnan(self.oof_proba_)
            z = _logit(self.oof_proba_[ok])[:, None]
            idx, lab, sw = _expand(cal_y[ok], cal_w[ok])
            platt = LogisticRegression(C=1e4, max_iter=1000).fit(z[idx], lab, sample_weight=sw)
            self.calibration_slope_ = float(platt.coef_[0, 0])
            self.calibration_intercept_ = float(platt.intercept_[0])
        self.ranker_ = self._fit_ranker(X, y, w)
        self.classes_ = np.array([0, 1])
        self.n_features_in_ = X.shape[1]
        return self

    def decision_function(self, X: np.ndarray) -> np.ndarray:
        """Uncalibrated score ``logit(q)`` of the ranker: float64 (n,)."""
        return _logit(self.ranker_.predict_proba(np.asarray(X, dtype=np.float32))[:, 1])

    def calibrate(self, q: np.ndarray) -> np.ndarray:
        """Apply the Platt map to ranker probabilities ``q`` (n,): calibrated ``p_hard`` (n,)."""
        z = self.calibration_slope_ * _logit(q) + self.calibration_intercept_
        return 1.0 / (1.0 + np.exp(-z))

    def predict_proba(self, X: np.ndarray) -> np.ndarray:
        """Calibrated probabilities float64 (n, 2): column 1 is ``p_hard``."""
        p = self.calibrate(self.ranker_.predict_proba(np.asarray(X, dtype=np.float32))[:, 1])
        return np.column_stack([1.0 - p, p])

    def predict(self, X: np.ndarray) -> np.ndarray:
        """1 where ``p_hard >= 0.5`` else 0: int64 (n,)."""
        return (self.predict_proba(X)[:, 1] >= 0.5).astype(np.int64)
