"""Pointsman's data folder: ``$POINTSMAN_DATA_DIR``, else ``./data``.
"""

from __future__ import annotations

import os
from pathlib import Path


def data_dir() -> Path:
    """Pointsman's data folder: ``$POINTSMAN_DATA_DIR``, else ``./data`` (absolute path).

    Holds the embedded MLflow store (``mlflow.db``, ``mlartifacts/``), downloaded models
    (``models/``) and training caches (``cache/``).
    """
    return Path(os.environ.get("POINTSMAN_DATA_DIR") or "data").resolve()

