"""Writing a model directory (``estimator.manifest``): the step every training ends with.

``write_model_dir(model_dir, encoder, head, X_sample, training, metrics) -> Manifest``:

1. remove the model files an earlier run left there (``MODEL_FILES``, the manifest,
   ``PROVENANCE.md`` and a verifier head, ``estimator.verifier.VERIFIER_FILES``);
2. copy the encoder's ONNX file and tokenizer in as ``encoder.onnx`` and ``tokenizer.json``;
3. export the fitted head to ONNX (``head.onnx``, ``estimator.export.export_head``) and check it
   against scikit-learn on ``X_sample``: the max absolute difference is recorded as
   ``metrics["export/parity_max_abs"]`` and may not exceed ``PARITY_ATOL``;
4. write ``manifest.json``: the content version of the three files, the encoder spec (with the
   file names it was copied to), the head spec (parameters and Platt calibration), the
   caller's ``training`` block (``TableTraining`` or ``OutcomeLogTraining``, as JSON) and the
   metrics (floats rounded to 6 digits).

Both trainings use it: ``training.train`` (public outcome tables; a built or reused encoder)
and ``training.challenger`` (logged outcomes; the encoder of the serving model). Each writes
its own ``PROVENANCE.md`` (``training.provenance``) when its manifest is final.
"""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, NotRequired, TypedDict

import numpy as np

from pointsman.errors import EstimatorError
from pointsman.estimator.conversation import block_names
from pointsman.estimator.manifest import MANIFEST_FILE, HeadSpec, Manifest, content_version
from pointsman.estimator.markers import FEATURE_NAMES
from pointsman.estimator.registry import REGISTERED_NAME
from pointsman.estimator.verifier import VERIFIER_FILES
from pointsman.json_types import JSONObject
from pointsman.training.encoder_build import BuiltEncoder
from pointsman.training.json_data import to_json_object

if TYPE_CHECKING:  # pragma: no cover
    from pointsman.estimator.head import DifficultyHead

#: Max |scikit-learn − onnxruntime| allowed on the parity sample at export (and end to end).
PARITY_ATOL = 1e-4
#: The files of a model directory the manifest's content version covers, in that order.
MODEL_FILES = ("encoder.onnx", "tokenizer.json", "head.onnx")
PROVENANCE_FILE = "PROVENANCE.md"
#: In a challenger's model directory: the conversation keys it trained on, sorted, one a line.
TRAINED_CONVERSATIONS_FILE = "trained_conversations.txt"
HEAD_ESTIMATOR = "pointsman.estimator.head.DifficultyHead"


class SourceRecord(TypedDict):
    """One training source in a ``TableTraining`` block; ``panel_models``: its label panel
    (``OutcomeSource.panel``), when it has one."""

    name: str
    table: str
    license: str
    origin: str
    score_kind: str
    weak_models: list[str]
    strong_models: list[str]
    prompts: int
    panel_models: NotRequired[list[str]]


class VerifierRecord(TypedDict):
    """The cascade's verifier head a table-trained model carries (``training.table_verifier``;
    ``pointsman train --table --drafts``): its ``files`` in the model directory and ``version``;
    the ``table`` and its ``license``, the ``drafts`` file and the (weak, strong) column ``pairs``
    whose drafts and verdicts it learned, ``rows`` (drafts) and ``positives`` (drafts that lost);
    ``p_hard``: where its prompt-difficulty feature came from (``out-of-fold``: the difficulty
    head's cross-fitting; ``model``: the trained model's own, in sample); ``use``: ``any`` or
    evaluation only (``training.verifier.verifier_use``); ``parity_max_abs``: max |scikit-learn −
    onnxruntime| on its training rows."""

    files: list[str]
    version: str
    table: str
    license: str
    drafts: str
    pairs: list[list[str]]
    rows: int
    positives: int
    p_hard: str
    use: str
    parity_max_abs: float


class TableTraining(TypedDict):
    """The manifest's ``training`` block of a model trained on the public outcome tables
    (``training.train``); ``verifier``: with ``--drafts``, its verifier head; ``easy_anchors``: the
    count of easy-anchor rows (``datasets.easy_anchors``) when the recipe adds them; ``reliability``:
    the reliability diagram of the out-of-fold ``p_hard`` (``training.train.reliability``)."""

    recipe: JSONObject
    sources: list[SourceRecord]
    label: str
    base_model: str
    command: str
    verifier: NotRequired[VerifierRecord]
    easy_anchors: NotRequired[int]
    reliability: NotRequired[list[JSONObject]]


class HoldoutRecord(TypedDict):
    """Which conversations a challenger never trained on (``logged_examples.holdout_mask``)."""

    n_folds: int
    fold: int
    seed: int
    key: str


class BaseModelRecord(TypedDict):
    """The model whose encoder and feature space a challenger reuses."""

    version: str
    source: str


class WarmStartRecord(TypedDict):
    """The prior rows a challenger trained on beside the logged ones (``training.warm_start``):
    ``enabled`` (asked for), ``prior_rows`` (0 when off or skipped) per ``prior_sources`` with their
    ``prior_licenses``, ``prior_weight_per_row`` (``half_n / (logged_rows + half_n)``, a logged row
    weighs 1) and ``prior_weight_total``, ``logged_rows``/``logged_weight_total``, ``half_n``, and
    ``skipped``: why the prior was left out although enabled (None otherwise)."""

    enabled: bool
    prior_rows: int
    prior_sources: dict[str, int]
    prior_licenses: dict[str, str]
    prior_weight_per_row: float
    prior_weight_total: float
    logged_rows: int
    logged_weight_total: float
    half_n: float
    skipped: str | None


class OutcomeLogTraining(TypedDict):
    """The manifest's ``training`` block of a challenger trained from logged outcomes
    (``training.challenger``); ``compare.trained_on`` reads ``trained_conversations`` back (the
    conversation keys of its training rows, one a line in that file of the model directory, and their
    count and sha256; models without it: ``source``, ``holdout`` and ``data_until_s``), the drift
    report ``p_hard_deciles``."""

    source: str
    outcome_log: str
    window: str
    since_s: float | None
    until_s: float | None
    data_until_s: float
    n_labeled: int
    n_train: int
    n_holdout: int
    label_signals: dict[str, int]
    label_rules: dict[str, object]
    holdout: HoldoutRecord
    config: dict[str, object]
    feature_space: str | None
    base_model: BaseModelRecord
    p_hard_deciles: list[float]
    frontier_share: float
    command: str
    warm_start: WarmStartRecord
    trained_conversations: dict[str, object]


def head_feature_names(dim: int, blocks: tuple[str, ...] = ()) -> list[str]:
    """The head's input layout for an encoder of ``dim``: ``emb_0 .. emb_{dim-1}``, the request
    features (``estimator.markers.FEATURE_NAMES``), then the optional ``blocks``
    (``estimator.conversation.block_names``), as ``DifficultyEstimator`` expects."""
    return [f"emb_{i}" for i in range(dim)] + list(FEATURE_NAMES) + block_names(blocks)


def pointsman_version() -> str:
    """The installed package's version ("unknown" when it is not installed)."""
    try:
        from importlib.metadata import version

        return version("pointsman")
    except Exception:  # noqa: BLE001
        return "unknown"


def rounded(metrics: Mapping[str, float | int]) -> JSONObject:
    """``metrics`` as a manifest stores them: floats rounded to 6 digits (other values as they are)."""
    out: JSONObject = {}
    for k, v in metrics.items():
        out[k] = round(v, 6) if isinstance(v, float) else v
    return out


def write_model_dir(model_dir: Path, encoder: BuiltEncoder, head: DifficultyHead, X_sample: np.ndarray,
                    training: TableTraining | OutcomeLogTraining, metrics: dict[str, float],
                    blocks: tuple[str, ...] = (), pooling: str = "mean") -> Manifest:
    """Write the model directory (see the module docstring) and return its manifest; records
    ``export/parity_max_abs`` in ``metrics``. ``blocks``: the optional head-input blocks the head
    reads (``estimator.conversation``); ``pooling``: how its embedding pools the query
    (``estimator.manifest.POOLINGS``). Raises ``EstimatorError`` when the ONNX head
    disagrees with scikit-learn on ``X_sample`` by more than ``PARITY_ATOL``."""
    from pointsman.estimator.export import export_head, head_parity

    encoder_file, tokenizer_file, head_file = MODEL_FILES
    model_dir.mkdir(parents=True, exist_ok=True)
    # a head retrained in place (``--encoder-from`` the output directory) keeps its encoder files
    in_place = encoder.onnx_path.resolve() == (model_dir / encoder_file).resolve() \
        and encoder.tokenizer_path.resolve() == (model_dir / tokenizer_file).resolve()
    for stale in (MANIFEST_FILE, *(MODEL_FILES[2:] if in_place else MODEL_FILES), PROVENANCE_FILE, *VERIFIER_FILES):
        (model_dir / stale).unlink(missing_ok=True)
    if not in_place:
        shutil.copyfile(encoder.onnx_path, model_dir / encoder_file)
        shutil.copyfile(encoder.tokenizer_path, model_dir / tokenizer_file)
    feature_names = head_feature_names(encoder.spec.dim, blocks)
    fields = export_head(head, len(feature_names), model_dir / head_file)
    parity = head_parity(head, model_dir / head_file, X_sample)
    metrics["export/parity_max_abs"] = parity
    if parity > PARITY_ATOL:
        raise EstimatorError(f"ONNX head disagrees with scikit-learn: max |diff| {parity:.2e} > {PARITY_ATOL:g}")
    manifest = Manifest(
        name=REGISTERED_NAME,
        version=content_version(model_dir, list(MODEL_FILES), feature_names, REGISTERED_NAME, pooling),
        encoder=dataclasses.replace(encoder.spec, file=encoder_file, tokenizer=tokenizer_file),
        head=HeadSpec(file=head_file, input=fields["input"], output=fields["output"], feature_names=feature_names,
                      opset=fields["opset"], estimator=HEAD_ESTIMATOR, pooling=pooling,
                      params={**head.get_params(), "calibration_slope": head.calibration_slope_,
                              "calibration_intercept": head.calibration_intercept_}),
        training=to_json_object(training),
        metrics=rounded(metrics),
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
        pointsman_version=pointsman_version(),
    )
    manifest.write(model_dir)
    return manifest


__all__ = ["MODEL_FILES", "PARITY_ATOL", "PROVENANCE_FILE", "BaseModelRecord", "HoldoutRecord", "OutcomeLogTraining",
           "SourceRecord", "TableTraining", "VerifierRecord", "head_feature_names", "pointsman_version", "rounded",
           "write_model_dir"]
