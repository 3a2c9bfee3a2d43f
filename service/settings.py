"""Service and CLI settings (pydantic-settings): environment variables prefixed
``POINTSMAN_``, overridden by explicit arguments (CLI options).

=============================  ==========================================  =====================================
variable                       meaning                                     default
=============================  ==========================================  =====================================
``POINTSMAN_FLEET_PATH``       fleet file (YAML)                           the packaged ``policy/defaults/fleet.yaml``
``POINTSMAN_POLICY_PATH``      routing policy file (YAML + CEL)            the packaged ``default.yaml``
``POINTSMAN_MODEL``            estimator model spec for ``load_estimator`` the estimator's own default
                               (a directory or a registry URI)
``POINTSMAN_DATA_DIR``         data folder (MLflow store, logs)            ``./data``
``POINTSMAN_MAX_BODY_BYTES``   largest accepted request body, in bytes     8 MiB (8388608)
``POINTSMAN_HOST``             bind address for ``pointsman serve``        ``127.0.0.1``
``POINTSMAN_PORT``             port for ``pointsman serve``                ``8000``
``POINTSMAN_LOG_LEVEL``        uvicorn/app log level                       ``info``
=============================  ==========================================  =====================================
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
    data_dir: Path = Path("data")
    max_body_bytes: int = Field(default=DEFAULT_MAX_BODY_BYTES, gt=0)
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    log_level: str = "info"
