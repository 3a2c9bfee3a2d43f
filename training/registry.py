"""MLflow: tracking training runs, registering models, resolving ``models:/`` URIs.

Embedded default: a SQLite tracking store ``<data_dir>/mlflow.db`` with artifacts
under ``<data_dir>/mlartifacts`` (``estimator.loading.data_dir``, i.e.
``$POINTSMAN_DATA_DIR`` or ``./data``); ``MLFLOW_TRACKING_URI`` overrides both.
A model version's artifacts are a Pointsman model directory (``manifest.json``,
ONNX files, tokenizer) logged under the run's ``model/`` artifact path.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pointsman.errors import ModelNotFoundError
from pointsman.estimator.loading import REGISTERED_NAME, data_dir, default_tracking_uri

EXPERIMENT_NAME = "pointsman-difficulty"
_MODELS_URI = re.compile(r"^models:/(?P<name>[^/@]+)(?:@(?P<alias>[^/@]+)|/(?P<version>\d+))$")


@dataclass(frozen=True)
class RunRecord:
    """What a training run left in MLflow: run id, tracking URI, registered version (or None)."""

    run_id: str
    tracking_uri: str
    model_name: str | None
    model_version: str | None
    alias: str | None


def _quiet() -> None:
    for name in ("mlflow", "alembic", "alembic.runtime.migration"):
        logging.getLogger(name).setLevel(logging.WARNING)


def _embedded() -> bool:
    return not os.environ.get("MLFLOW_TRACKING_URI")


def client():
    """An ``MlflowClient`` bound to the tracking store (``default_tracking_uri()``), used for
    tracking and the registry alike. No global MLflow state is touched (``mlflow.set_tracking_uri``
    would export ``MLFLOW_TRACKING_URI`` to the process). Creates ``data_dir()`` for the
    embedded store."""
    from mlflow import MlflowClient

    _quiet()
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    uri = default_tracking_uri()
    if _embedded():
        data_dir().mkdir(parents=True, exist_ok=True)
    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def ensure_experiment(mlflow_client, name: str = EXPERIMENT_NAME) -> str:
    """The experiment id of ``name``, created if absent (artifacts under
    ``<data_dir>/mlartifacts`` for the embedded store)."""
    exp = mlflow_client.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    location = (data_dir() / "mlartifacts").as_uri() if _embedded() else None
    return mlflow_client.create_experiment(name, artifact_location=location)


def log_training_run(
    model_dir: str | Path,
    params: dict[str, Any],
    metrics: dict[str, float],
    *,
    register: bool = True,
    alias: str | None = "champion",
    model_name: str = REGISTERED_NAME,
    tags: dict[str, str] | None = None,
) -> RunRecord:
    """Log one training run: params, metrics, the model directory as artifacts under
    ``model/``; if ``register``, create a version of ``model_name`` from them and point
    ``alias`` at it. Returns the ``RunRecord``."""
    from mlflow.entities import Metric, Param

    c = client()
    uri = default_tracking_uri()
    run = c.create_run(ensure_experiment(c), tags=tags or {})
    run_id = run.info.run_id
    now = int(time.time() * 1000)
    try:
        c.log_batch(
            run_id,
            metrics=[Metric(k, float(v), now, 0) for k, v in metrics.items() if v is not None and v == v],
            params=[Param(k, str(v)[:500]) for k, v in params.items()],
        )
        c.log_artifacts(run_id, str(model_dir), artifact_path="model")
    except Exception:
        c.set_terminated(run_id, status="FAILED")
        raise
    c.set_terminated(run_id)
    if not register:
        return RunRecord(run_id, uri, None, None, None)
    try:
        c.get_registered_model(model_name)
    except Exception:  # noqa: BLE001 - RESOURCE_DOES_NOT_EXIST
        c.create_registered_model(model_name, description="Pointsman difficulty estimator (p_hard), ONNX")
    mv = c.create_model_version(model_name, source=f"{run.info.artifact_uri}/model", run_id=run_id)
    if alias:
        c.set_registered_model_alias(model_name, alias, mv.version)
    return RunRecord(run_id, uri, model_name, str(mv.version), alias)


def parse_models_uri(uri: str) -> tuple[str, str | None, str | None]:
    """``models:/NAME@ALIAS`` → (NAME, ALIAS, None); ``models:/NAME/VERSION`` → (NAME, None, VERSION).
    Raises ``ModelNotFoundError`` for anything else."""
    m = _MODELS_URI.match(uri)
    if not m:
        raise ModelNotFoundError(f"invalid model URI {uri!r}: expected models:/NAME@ALIAS or models:/NAME/VERSION")
    return m["name"], m["alias"], m["version"]


def download_registered_model(uri: str) -> tuple[Path, str]:
    """Resolve ``uri`` in the registry and return ``(model_dir, label)``.

    The version's artifacts are downloaded once into ``<data_dir>/models/NAME/VERSION``
    and reused. ``label`` reads e.g. ``models:/pointsman-difficulty/3 (@champion)``.
    Raises ``ModelNotFoundError`` when the model, alias or version does not exist.
    """
    import mlflow

    name, alias, version = parse_models_uri(uri)
    c = client()
    try:
        mv = c.get_model_version_by_alias(name, alias) if alias else c.get_model_version(name, version)
    except Exception as exc:  # noqa: BLE001 - MlflowException for missing model/alias/version
        what = f"alias @{alias}" if alias else f"version {version}"
        raise ModelNotFoundError(
            f"{uri}: registered model {name!r} has no {what} in {default_tracking_uri()} ({type(exc).__name__})"
        ) from None
    target = data_dir() / "models" / name / str(mv.version)
    if not (target / "manifest.json").is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{mv.version}-", dir=target.parent))
        try:
            tracking = default_tracking_uri()
            source = c.get_model_version_download_uri(name, mv.version)
            got = Path(mlflow.artifacts.download_artifacts(
                artifact_uri=source, dst_path=str(tmp), tracking_uri=tracking, registry_uri=tracking
            ))
            if not (got / "manifest.json").is_file():
                raise ModelNotFoundError(f"{uri}: version {mv.version} has no manifest.json among its artifacts")
            if target.exists():
                shutil.rmtree(target)
            got.rename(target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    label = f"models:/{name}/{mv.version}" + (f" (@{alias})" if alias else "")
    return target, label
