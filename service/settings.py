"""Service and CLI settings (pydantic-settings): environment variables prefixed
``POINTSMAN_``, overridden by explicit arguments (CLI options).

- ``POINTSMAN_FLEET_PATH``: fleet file (YAML); default the packaged ``policy/defaults/fleet.yaml``.
- ``POINTSMAN_POLICY_PATH``: routing policy (YAML + CEL); default the packaged ``default.yaml``.
- ``POINTSMAN_MODEL``: estimator model spec for ``load_estimator`` (``bundled``, ``champion``,
  ``models:/NAME@ALIAS``, or a directory); default the bundled model.
- ``POINTSMAN_ESTIMATOR_TIMEOUT_MS``: time budget per estimate, an overrun counts as
  unavailable; default none.
- ``POINTSMAN_ESTIMATOR_THREADS``: onnxruntime threads per session; default 1.
- ``POINTSMAN_DATA_DIR``: data folder (MLflow store, downloaded models); default ``./data``.
- ``POINTSMAN_MAX_BODY_BYTES``: largest accepted request body in bytes; default 8 MiB (8388608).
- ``POINTSMAN_HOST`` / ``POINTSMAN_PORT``: bind address and port of ``pointsman serve``;
  default ``127.0.0.1:8000``.
- ``POINTSMAN_LOG_LEVEL``: uvicorn and app log level; default ``info``.
- ``POINTSMAN_BUDGET_LEDGER``: budget ledger URL (``policy/budget.py`` ``open_ledger``):
  ``sqlite:///path.db`` or ``redis://host:port/db`` (several service replicas share one);
  default ``sqlite`` at ``<POINTSMAN_DATA_DIR>/budget.db``.
- ``POINTSMAN_BUDGETS_PATH``: budgets file (YAML, ``kind: Budgets``: per ``tenant:``, ``team:``
  or ``key:`` scope a ``day`` and/or ``month`` limit in USD; see ``policy/budget.py``);
  default none: every request unlimited (spend is still recorded).
- ``POINTSMAN_BUDGET_FAIL_OPEN``: when the ledger is unreachable, route requests that have
  budgets anyway (``true``) or refuse them with 503 (``false``, default).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from pointsman.policy.compiler import DEFAULT_POLICY_PATH
from pointsman.policy.fleet import DEFAULT_FLEET_PATH

DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024


class Settings(BaseSettings):
    """Settings for the decision service and the CLI; see the module table for each field."""

    model_config = SettingsConfigDict(env_prefix="POINTSMAN_", extra="ignore", protected_namespaces=())

    fleet_path: Path = DEFAULT_FLEET_PATH
    policy_path: Path = DEFAULT_POLICY_PATH
    model: str | None = None
    estimator_timeout_ms: float | None = Field(default=None, gt=0)
    estimator_threads: int = Field(default=1, ge=1)
    data_dir: Path = Path("data")
    max_body_bytes: int = Field(default=DEFAULT_MAX_BODY_BYTES, gt=0)
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    log_level: str = "info"
    budget_ledger: str | None = None
    budgets_path: Path | None = None
    budget_fail_open: bool = False
