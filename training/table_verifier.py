"""The verifier head of a table-trained model (``pointsman train --table T --drafts D``).

``train_table_verifier(estimator, source, drafts, model_dir, p_hard_of=None) -> VerifierRecord``:
for every weak × strong column pair of ``source`` (``training.table_source``), the weak column's
answers in ``drafts`` (a long CSV ``prompt_id, model, output``, ``datasets.drafts``) are the drafts.
Their feature rows (``training.draft_eval.draft_matrix``: float32 (n, 16), the 16 draft features
with the prompt's ``p_hard``) and "the draft lost" labels (``training.metrics.weak_worse``) of all
pairs, stacked, train one head (``training.verifier.fit_verifier``), written into ``model_dir``
beside the difficulty model (``training.verifier.export_verifier``:
``estimator.verifier.VERIFIER_FILES``). The same directory then serves as ``POINTSMAN_VERIFIER``,
and ``pointsman evaluate --model DIR --drafts`` scores with it (``estimator.verifier.model_verifier``).

``p_hard_of``: each prompt id's out-of-fold ``p_hard`` (the difficulty head's cross-fitting,
``training.train.oof_p_hard``), like the served ``p_hard`` of a prompt the model never saw; without
it, the model's own ``p_hard``, which has seen every row (in sample). The returned record goes into
the manifest (``training.verifier``) and ``PROVENANCE.md``: files, version, table and licence,
drafts, pairs, rows, positives, the ``p_hard`` source and the head's use (``verifier_use``: a
non-commercial table such as AlpacaEval makes it evaluation only, never shipped).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from pointsman.datasets.sources import OutcomeSource
from pointsman.errors import DataError, EstimatorError
from pointsman.estimator.verifier import VERIFIER_FILES, OnnxVerifier
from pointsman.training.draft_eval import draft_matrix
from pointsman.training.evaluate import TableScorer
from pointsman.training.metrics import weak_worse
from pointsman.training.model_dir import PARITY_ATOL, VerifierRecord
from pointsman.training.verifier import export_verifier, fit_verifier, verifier_use


def train_table_verifier(estimator: TableScorer, source: OutcomeSource, drafts: str | Path, model_dir: str | Path,
                         p_hard_of: Mapping[str, float] | None = None) -> VerifierRecord:
    """Train, export and check the verifier head of ``source``'s drafts (see the module); returns
    its record. Raises ``DataError`` (unreadable drafts, a weak column without drafts, fewer than
    10 usable rows of a pair, labels of one class) and ``EstimatorError`` when the exported head
    disagrees with scikit-learn by more than ``PARITY_ATOL``."""
    table = source.path()
    pairs = [(w, s) for w in source.weak for s in source.strong]
    xs, ys = [], []
    for weak, strong in pairs:
        x, w_scores, s_scores, _, _ = draft_matrix(estimator, table, weak, strong, drafts, p_hard_of)
        xs.append(x)
        ys.append(weak_worse(w_scores, s_scores))
    x, y = np.vstack(xs), np.concatenate(ys)
    try:
        head = fit_verifier(x, y)
    except ValueError as exc:
        raise DataError(f"{drafts}: {exc}") from None
    use = verifier_use(source.license)
    provenance: dict[str, object] = {"table": str(table), "license": source.license, "drafts": str(drafts),
                                     "pairs": [list(p) for p in pairs], "rows": int(len(y)),
                                     "positives": int(y.sum()), "use": use}
    export_verifier(head, model_dir, provenance)
    served = OnnxVerifier(model_dir)
    parity = float(np.max(np.abs(served.p_bad_batch(x) - head.predict_proba(x.astype(np.float64))[:, 1])))
    if parity > PARITY_ATOL:
        raise EstimatorError(f"ONNX verifier disagrees with scikit-learn: max |diff| {parity:.2e} > {PARITY_ATOL:g}")
    return VerifierRecord(files=list(VERIFIER_FILES), version=served.version, table=str(table),
                          license=source.license, drafts=str(drafts), pairs=[list(p) for p in pairs], rows=int(len(y)),
                          positives=int(y.sum()), p_hard="model" if p_hard_of is None else "out-of-fold", use=use,
                          parity_max_abs=parity)


__all__ = ["train_table_verifier"]
