"""MLflow, write side: tracking training runs and registering models (the read side,
``models:/`` URIs, the client and downloads, is ``pointsman.estimator.registry``).

Embedded default: a SQLite tracking store ``<data_dir>/mlflow.db`` with artifacts
under ``<data_dir>/mlartifacts`` (``pointsman.data_dir.data_dir``, i.e.
``$POINTSMAN_DATA_DIR`` or ``./data``); ``MLFLOW_TRACKING_URI`` overrides both.
A model version's artifacts are a Pointsman model directory (``manifest.json``,
ONNX files, tokenizer) logged under the run's ``model/`` artifact path.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pointsman.data_dir import data_dir
from pointsman.estimator.registry import REGISTERED_NAME, client, default_tracking_uri, embedded_store

if TYPE_CHECKING:  # pragma: no cover
    from mlflow import MlflowClient

EXPERIMENT_NAME = "pointsman-difficulty"


@dataclass(frozen=True)
class RunRecord:
    """What a training run left in MLflow: run id, tracking URI, registered version (or None)."""

    run_id: str
    tracking_uri: str
    model_name: str | None
    model_version: str | None
    alias: str | None

    def describe(self) -> str:
        """``run <id> in <tracking URI>``, and ``; registered <name> version <n> @<alias>`` when registered."""
        registered = f"; registered {self.model_name} version {self.model_version} @{self.alias}" if self.model_version else ""
        return f"run {self.run_id} in {self.tracking_uri}{registered}"


def ensure_experiment(mlflow_client: MlflowClient, name: str = EXPERIMENT_NAME) -> str:
    """The experiment id of ``name``, created if absent (artifacts under
    ``<data_dir>/mlartifacts`` for the embedded store)."""
    exp = mlflow_client.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    location = (data_dir() / "mlartifacts").as_uri() if embedded_store() else None
    return mlflow_client.create_experiment(name, artifact_location=location)


def log_batch(mlflow_client: MlflowClient, run_id: str, params: Mapping[str, object],
              metrics: Mapping[str, float]) -> None:
    """Log ``params`` (as strings of at most 500 characters) and the finite ``metrics`` of run
    ``run_id`` in one batch, at the current time."""
    from mlflow.entities import Metric, Param

    now = int(time.time() * 1000)
    mlflow_client.log_batch(
        run_id,
        metrics=[Metric(k, float(v), now, 0) for k, v in metrics.items() if v is not None and v == v],
        params=[Param(k, str(v)[:500]) for k, v in params.items()],
    )


def log_training_run(
    model_dir: str | Path,
    params: Mapping[str, object],
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
    c = client()
    uri = default_tracking_uri()
    run = c.create_run(ensure_experiment(c), tags=tags or {})
    run_id = run.info.run_id
    try:
        log_batch(c, run_id, params, metrics)
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


