"""Finding and loading a difficulty model: ``load_estimator(spec)``.

Specs:

- ``None`` or ``"bundled"``: the default model shipped in ``estimator/default_model/``
  (found through the installed package, so editable and regular installs both work);
- a directory path: that model directory (``estimator.manifest``);
- ``"models:/NAME@ALIAS"`` or ``"models:/NAME/VERSION"``: a registered model in the
  MLflow tracking store (``MLFLOW_TRACKING_URI``, else the embedded SQLite store
  ``$POINTSMAN_DATA_DIR/mlflow.db``), downloaded once into ``$POINTSMAN_DATA_DIR/models``;
  needs the ``train`` extra (MLflow);
- ``"champion"``: ``models:/pointsman-difficulty@champion`` if the store exists and has
  that alias, else the bundled model; the returned estimator's ``source`` says which.

Serving path: imports nothing beyond onnxruntime, tokenizers and numpy unless a
registry spec is given (then MLflow, lazily).
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import resources
from pathlib import Path

from pointsman.data_dir import data_dir
from pointsman.errors import ModelNotFoundError
from pointsman.estimator.difficulty import DifficultyEstimator
from pointsman.estimator.registry import (
    CHAMPION_ALIAS,
    REGISTERED_NAME,
    download_registered_model,
    registry_store_exists,
)


def bundled_model_dir() -> Path:
    """Directory of the shipped default model inside the installed package."""
    return Path(str(resources.files("pointsman.estimator").joinpath("default_model")))


def _bundled(open_dir: Callable[[Path, str], DifficultyEstimator]) -> DifficultyEstimator:
    path = bundled_model_dir()
    if not (path / "manifest.json").is_file():
        raise ModelNotFoundError(
            f"the bundled default model is missing from {path}; build it with "
            "`pointsman train --output estimator/default_model --no-register`"
        )
    return open_dir(path, "bundled")


def _from_registry(uri: str, open_dir: Callable[[Path, str], DifficultyEstimator]) -> DifficultyEstimator:
    if not registry_store_exists():
        raise ModelNotFoundError(
            f"cannot resolve {uri}: no MLflow tracking store (set MLFLOW_TRACKING_URI or train first; "
            f"the embedded store would be {data_dir() / 'mlflow.db'})"
        )
    model_dir, label = download_registered_model(uri)
    return open_dir(model_dir, label)


def load_estimator(
    spec: str | Path | None = None,
    *,
    timeout_ms: float | None = None,
    intra_op_threads: int = 1,
) -> DifficultyEstimator:
    """Load the difficulty model named by ``spec`` (see the module docstring).

    ``timeout_ms``: per-estimate time budget (``None`` = none); ``intra_op_threads``:
    onnxruntime threads (1 for in-process serving). Raises ``ModelNotFoundError`` with
    a message naming the spec and what was expected.
    """

    def open_dir(path: Path, source: str) -> DifficultyEstimator:
        return DifficultyEstimator(path, source=source, timeout_ms=timeout_ms, intra_op_threads=intra_op_threads)

    if spec is None or str(spec) == "bundled":
        return _bundled(open_dir)
    text = str(spec)
    if text == "champion":
        uri = f"models:/{REGISTERED_NAME}@{CHAMPION_ALIAS}"
        if not registry_store_exists():
            est = _bundled(open_dir)
            est.source = "bundled (no MLflow tracking store, so no champion)"
            return est
        try:
            return _from_registry(uri, open_dir)
        except ModelNotFoundError as exc:
            est = _bundled(open_dir)
            est.source = f"bundled (champion unavailable: {exc})"
            return est
    if text.startswith("models:/"):
        return _from_registry(text, open_dir)
    path = Path(text).expanduser()
    if path.is_dir():
        return open_dir(path, str(path.resolve()))
    raise ModelNotFoundError(
        f"no model at {text!r}: expected 'bundled', 'champion', 'models:/NAME@ALIAS', "
        "'models:/NAME/VERSION' or an existing model directory"
    )
