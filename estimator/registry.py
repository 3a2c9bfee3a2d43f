"""The MLflow registry, read side: the tracking store's location, the registered model
name and its ``champion`` alias, ``models:/`` URIs, and downloading a registered version.
Serving reads the registry through this module only (the write side, training runs and
registration, is ``pointsman.training.registry``). MLflow is imported lazily.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from pointsman.data_dir import data_dir
from pointsman.errors import ModelNotFoundError

if TYPE_CHECKING:  # pragma: no cover
    from mlflow import MlflowClient

#: Registered model name in MLflow and alias of the serving model.
REGISTERED_NAME = "pointsman-difficulty"
CHAMPION_ALIAS = "champion"


def default_tracking_uri() -> str:
    """``$MLFLOW_TRACKING_URI`` if set, else ``sqlite:///<data_dir>/mlflow.db``."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{data_dir() / 'mlflow.db'}"


def registry_store_exists() -> bool:
    """True when a tracking store is configured: ``MLFLOW_TRACKING_URI`` is set or the
    embedded ``<data_dir>/mlflow.db`` exists (so loading never creates a store)."""
    return bool(os.environ.get("MLFLOW_TRACKING_URI")) or (data_dir() / "mlflow.db").is_file()

_MODELS_URI = re.compile(r"^models:/(?P<name>[^/@]+)(?:@(?P<alias>[^/@]+)|/(?P<version>\d+))$")


def _quiet() -> None:
    for name in ("mlflow", "alembic", "alembic.runtime.migration"):
        logging.getLogger(name).setLevel(logging.WARNING)


def embedded_store() -> bool:
    """True when no ``MLFLOW_TRACKING_URI`` is set: the embedded SQLite store under ``data_dir()``."""
    return not os.environ.get("MLFLOW_TRACKING_URI")


def client() -> MlflowClient:
    """An ``MlflowClient`` bound to the tracking store (``default_tracking_uri()``), used for
    tracking and the registry alike. No global MLflow state is touched (``mlflow.set_tracking_uri``
    would export ``MLFLOW_TRACKING_URI`` to the process). Creates ``data_dir()`` for the
    embedded store. Raises ``ModelNotFoundError`` when MLflow is not installed or cannot open the
    store (a ``file:`` store, which MLflow 3 refuses; a scheme it does not know), naming the setting."""
    try:
        from mlflow import MlflowClient
        from mlflow.exceptions import MlflowException
    except ImportError as exc:
        raise ModelNotFoundError(f"MLflow is not installed ({exc}); install the train extra: "
                                 "pip install 'pointsman[train]'") from None

    _quiet()
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    uri = default_tracking_uri()
    if embedded_store():
        data_dir().mkdir(parents=True, exist_ok=True)
    try:
        return MlflowClient(tracking_uri=uri, registry_uri=uri)
    except MlflowException as exc:
        where = f"the embedded MLflow store {uri}" if embedded_store() else f"MLFLOW_TRACKING_URI={uri}"
        if "MLFLOW_ALLOW_FILE_STORE" in str(exc):  # mlflow 3: the file store is in maintenance mode
            raise ModelNotFoundError(
                f"{where}: MLflow no longer opens a file store; use a database (sqlite:///PATH/mlflow.db) or a "
                f"tracking server (http://HOST:PORT), or unset it for the embedded store {data_dir() / 'mlflow.db'} "
                "(`mlflow migrate-filestore` moves existing runs)") from None
        raise ModelNotFoundError(f"{where}: {_first_line(exc)}") from None


def parse_models_uri(uri: str) -> tuple[str, str | None, str | None]:
    """``models:/NAME@ALIAS`` → (NAME, ALIAS, None); ``models:/NAME/VERSION`` → (NAME, None, VERSION).
    Raises ``ModelNotFoundError`` for anything else."""
    m = _MODELS_URI.match(uri)
    if not m:
        raise ModelNotFoundError(f"invalid model URI {uri!r}: expected models:/NAME@ALIAS or models:/NAME/VERSION")
    return m["name"], m["alias"], m["version"]


#: What an MLflow client error says when the tracking server could not be reached at all.
_UNREACHABLE = ("Max retries exceeded", "Connection refused", "Failed to establish a new connection",
                "Name or service not known", "timed out", "ConnectionError", "Temporary failure in name resolution")


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]


def _unreachable(exc: BaseException) -> bool:
    """True when ``exc`` (or what caused it) says the tracking server did not answer, as opposed to
    answering that the model, alias or version does not exist."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, (ConnectionError, TimeoutError)) or any(m in str(seen) for m in _UNREACHABLE):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def download_registered_model(uri: str) -> tuple[Path, str]:
    """Resolve ``uri`` in the registry and return ``(model_dir, label)``.

    The version's artifacts are downloaded once into ``<data_dir>/models/NAME/VERSION``
    and reused. ``label`` reads e.g. ``models:/pointsman-difficulty/3 (@champion)``.
    Raises ``ModelNotFoundError`` when the model, alias or version does not exist.
    """
    name, alias, version = parse_models_uri(uri)
    c = client()
    import mlflow
    try:
        mv = c.get_model_version_by_alias(name, alias) if alias else c.get_model_version(name, str(version))
    except Exception as exc:  # noqa: BLE001 - MlflowException for missing model/alias/version
        if _unreachable(exc):
            raise ModelNotFoundError(
                f"{uri}: the MLflow tracking server {default_tracking_uri()} is unreachable ({_first_line(exc)})"
            ) from None
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
