"""Training the cascade's verifier head: draft features in, "the draft loses" out.

``fit_verifier(X, y) -> Pipeline``: a ``StandardScaler`` then an L2 ``LogisticRegression``
(C=0.1: 16 features and a few hundred rows; a logistic head's probabilities are calibrated
by its loss) over ``estimator.draft.FEATURE_NAMES`` rows (float32 (n, 16)); ``y`` (n,) is 1.0
where the weak model's answer lost (``training.metrics.weak_worse``).

``export_verifier(head, directory, provenance)`` writes ``verifier.onnx`` (skl2onnx, opset
``estimator.export.OPSET``, input ``features`` float32 (n, 16), output ``probabilities``
(n, 2), no ZipMap) and ``verifier.json`` (version = content hash, features, provenance: the
table, its licence and the row count), which ``estimator.verifier.OnnxVerifier`` serves
(``POINTSMAN_VERIFIER=DIR``). ``logged_examples(log, fleet)`` reads training rows from the
outcome log (verified drafts whose outcomes carry a label). Training data with a non-commercial licence (AlpacaEval) is
for evaluation: such a head must not be shipped, and its provenance says so (``verifier_use(license)``).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import Pipeline, make_pipeline
from sklearn.preprocessing import StandardScaler

from pointsman.errors import DataError
from pointsman.estimator.draft import FEATURE_NAMES, DraftFeatures
from pointsman.estimator.export import ML_OPSET, OPSET
from pointsman.estimator.verifier import VERIFIER_FILES
from pointsman.outcome_log.store import OutcomeLog
from pointsman.policy.fleet import Fleet
from pointsman.training.outcome_labels import LabelRules, label_decision

#: L2 strength of the head's logistic regression (inverse).
C = 0.1
#: ``verifier_use`` of a head trained on non-commercial data.
EVALUATION_ONLY = "evaluation only (non-commercial training data)"


def is_noncommercial(license_: str) -> bool:
    """Whether a licence name marks non-commercial data (``CC-BY-NC-4.0``, ``... non-commercial``)."""
    return "nc" in license_.lower().replace("-", " ").split() or "non-commercial" in license_.lower()


def verifier_use(license_: str) -> str:
    """What a head trained on data under ``license_`` may be used for, as its provenance records it:
    ``EVALUATION_ONLY`` for non-commercial data (never ship it), else ``"any"``."""
    return EVALUATION_ONLY if is_noncommercial(license_) else "any"


def fit_verifier(x: np.ndarray, y: np.ndarray) -> Pipeline:
    """Fit the head on draft-feature rows ``x`` (n, 16) and loss labels ``y`` (n,); returns the
    fitted pipeline. Raises ``ValueError`` when ``y`` has one class only."""
    if len(np.unique(y)) < 2:
        raise ValueError("the verifier needs drafts that lost and drafts that did not")
    return make_pipeline(StandardScaler(), LogisticRegression(C=C, max_iter=1000)).fit(x.astype(np.float64), y)


def export_verifier(head: Pipeline, directory: str | Path, provenance: dict[str, object]) -> Path:
    """Write the head as ``verifier.onnx`` + ``verifier.json`` into ``directory`` (created);
    returns the directory."""
    from skl2onnx import convert_sklearn
    from skl2onnx.common.data_types import FloatTensorType

    onx = convert_sklearn(head, initial_types=[("features", FloatTensorType([None, len(FEATURE_NAMES)]))],
                          target_opset={"": OPSET, "ai.onnx.ml": ML_OPSET},
                          options={id(head.steps[-1][1]): {"zipmap": False}})
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    data = onx.SerializeToString()
    (out / VERIFIER_FILES[0]).write_bytes(data)
    meta = {"version": f"verifier-{hashlib.sha256(data).hexdigest()[:12]}", "features": list(FEATURE_NAMES),
            "provenance": provenance}
    (out / VERIFIER_FILES[1]).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    return out


def logged_examples(log: OutcomeLog, fleet: Fleet, rules: LabelRules | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(X, y)`` from the outcome log: every verified draft (``verifications``: its features)
    whose decision's outcomes give a label by ``rules`` (``training.outcome_labels``; the weak
    tier's judged or rated answers, e.g. a shadow outcome of the draft with a judge score);
    ``y`` is 1.0 where the label says the weak tier fell short (> 0.5). Raises ``DataError``."""
    rules = rules or LabelRules()
    tier = rules.strong_tier(fleet, log.fleet_kinds())
    xs, ys = [], []
    for row in log.verifications():
        decision = log.decision(str(row["decision_id"]))
        label = None if decision is None else label_decision(decision, rules, tier.of(decision))
        features = row["features"]
        if label is None or not isinstance(features, dict):
            continue
        try:
            xs.append(DraftFeatures(**features).vector())
        except TypeError:
            continue  # a row written by another version of the features
        ys.append(float(label.y > 0.5))
    if not xs:
        raise DataError(f"{log.path}: no verified draft has a labelled outcome (judge scores or ratings of the "
                        "weak tier's answer)")
    return np.stack(xs), np.asarray(ys)
