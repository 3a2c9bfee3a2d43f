"""Model following against a real MLflow registry, through the service's own follower (built by the
runtime from ``POINTSMAN_MODEL``; its poll interval is long, so each test polls it by hand): the alias
moved, ``pointsman promote --rollback`` to the bundled model (the alias deleted: MLflow 3.x raises
INVALID_PARAMETER_VALUE for it), a version that fails to load, a vanished custom alias, and an
unreachable registry (a tracking URI nobody answers). Stores live in ``tmp_path``; the registry
operations against a real ``mlflow server`` are ``tests/training/test_loop.py``'s."""

from __future__ import annotations

import json
import shutil
import socket
from pathlib import Path

import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient

from pointsman.cli.main import main as cli
from pointsman.estimator.manifest import content_version
from pointsman.estimator.model_source import bundled_model_dir
from pointsman.estimator.registry import REGISTERED_NAME, client
from pointsman.service.app import create_app
from pointsman.service.settings import Settings
from pointsman.training.promote import PREVIOUS_TAG
from pointsman.training.registry import log_training_run

BUNDLED_DIR = bundled_model_dir()
USER = {"messages": [{"role": "user", "content": "How do I poach an egg?"}]}


def model_copy(tmp_path: Path, tag: str) -> tuple[Path, str]:
    """The bundled model directory as another version: its tokenizer file padded with ``tag`` as trailing
    whitespace (the same tokenizer, other bytes), the manifest naming the files' content version."""
    out = tmp_path / f"model-{tag}"
    shutil.copytree(BUNDLED_DIR, out, ignore=shutil.ignore_patterns("PROVENANCE.md"))
    tokenizer = out / "tokenizer.json"
    tokenizer.write_text(tokenizer.read_text() + " " * (1 + sum(map(ord, tag))))
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["version"] = content_version(out, ["encoder.onnx", "tokenizer.json", "head.onnx"],
                                          manifest["head"]["feature_names"], manifest["name"],
                                          manifest["head"].get("pooling", "mean"))
    (out / "manifest.json").write_text(json.dumps(manifest))
    return out, manifest["version"]


def register(tmp_path: Path, tag: str, alias: str | None = "champion", broken: bool = False) -> tuple[str, str]:
    """Register a version (``broken``: artifacts without a manifest); returns (registry version, model version)."""
    if broken:
        path, version = tmp_path / f"broken-{tag}", "broken"
        path.mkdir()
        (path / "README.txt").write_text("no manifest.json here")
    else:
        path, version = model_copy(tmp_path, tag)
    return str(log_training_run(path, {}, {}, alias=alias).model_version), version


def serve(data: Path, model: str = "champion") -> TestClient:
    settings = Settings(data_dir=data, model=model, model_poll_interval_s=3600, watch_policy=False,
                        watch_fleet=False, scrape_interval_s=0)
    return TestClient(create_app(settings))


def serving(c: TestClient) -> str:
    d = c.post("/v1/route", json=USER)
    assert d.status_code == 200, d.text
    assert d.json()["estimator_version"] == c.get("/healthz").json()["estimator"]["version"]
    return d.json()["estimator_version"]


def metric(c: TestClient, name: str) -> float | None:
    for line in c.get("/metrics").text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return None


@pytest.fixture(scope="module")
def empty_store(tmp_path_factory) -> Path:
    """An empty, migrated MLflow SQLite store, copied by each test (migrating one takes seconds)."""
    data = tmp_path_factory.mktemp("mlflow-template")
    mp = pytest.MonkeyPatch()
    mp.setenv("POINTSMAN_DATA_DIR", str(data))
    mp.delenv("MLFLOW_TRACKING_URI", raising=False)
    try:
        client().search_registered_models()
    finally:
        mp.undo()
    return data / "mlflow.db"


@pytest.fixture
def data(tmp_path, monkeypatch, empty_store):
    monkeypatch.setenv("POINTSMAN_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    (tmp_path / "data").mkdir()
    shutil.copy(empty_store, tmp_path / "data" / "mlflow.db")
    return tmp_path / "data"


def test_alias_moved_then_rolled_back_to_the_bundled_model(tmp_path, data):
    v1, model_v1 = register(tmp_path, "v1")
    with serve(data) as c:
        follower = c.app.state.runtime.follower
        bundled = json.loads((BUNDLED_DIR / "manifest.json").read_text())["version"]
        assert serving(c) == model_v1 and follower.current == v1
        assert follower.poll_once() is None  # nothing moved
        v2, model_v2 = register(tmp_path, "v2")  # champion moves to the new version
        swap = follower.poll_once()
        assert swap.ok and (swap.previous_version, swap.version) == (model_v1, model_v2)
        assert swap.source == f"models:/{REGISTERED_NAME}/{v2} (@champion)"
        assert serving(c) == model_v2
        # `pointsman promote --rollback` to the bundled model deletes the alias
        client().set_registered_model_tag(REGISTERED_NAME, PREVIOUS_TAG, "bundled")
        res = CliRunner().invoke(cli, ["promote", "--rollback"])
        assert res.exit_code == 0, res.output
        back = follower.poll_once()
        assert back is not None and back.ok and back.version == bundled and follower.current == "bundled"
        assert serving(c) == bundled
        health = c.get("/healthz").json()
        assert health["model_follow"]["serving"] == "bundled" and health["model_follow"]["problem"] is None
        assert health["last_swap"]["ok"] and metric(c, "pointsman_model_registry_reachable") == 1.0
        # the alias comes back on version 1: followed again
        client().set_registered_model_alias(REGISTERED_NAME, "champion", v1)
        assert follower.poll_once().version == model_v1 and serving(c) == model_v1


def test_a_version_that_fails_to_load_is_a_failure_and_the_model_stays(tmp_path, data):
    v1, model_v1 = register(tmp_path, "v1")
    with serve(data) as c:
        follower = c.app.state.runtime.follower
        assert serving(c) == model_v1
        v2, _ = register(tmp_path, "v2", broken=True)
        failed = follower.poll_once()
        assert failed is not None and not failed.ok and failed.version == model_v1 and "manifest.json" in failed.error
        assert serving(c) == model_v1 and follower.current == v1  # not swapped to the bundled model
        assert follower.poll_once() is None  # tried again, same failure: reported once
        health = c.get("/healthz").json()
        assert health["last_swap"]["ok"] is False and health["estimator"]["version"] == model_v1
        assert health["model_follow"]["wanted"] == v2 and f"version {v2} failed to load" in health["model_follow"]["problem"]
        assert metric(c, 'pointsman_model_swaps_total{result="error"}') == 1.0
        assert metric(c, "pointsman_model_follow_problem") == 1.0
        v3, model_v3 = register(tmp_path, "v3")  # a good version next: followed
        assert follower.poll_once().version == model_v3 and serving(c) == model_v3
        assert metric(c, "pointsman_model_follow_problem") == 0.0


def test_a_vanished_custom_alias_keeps_the_model_and_says_why(tmp_path, data):
    register(tmp_path, "v1", alias="stable")
    with serve(data, f"models:/{REGISTERED_NAME}@stable") as c:
        follower = c.app.state.runtime.follower
        served = serving(c)
        client().delete_registered_model_alias(REGISTERED_NAME, "stable")
        assert follower.poll_once() is None
        assert serving(c) == served
        follow = c.get("/healthz").json()["model_follow"]
        assert follow["registry_reachable"] is True and "alias @stable" in follow["problem"]
        assert "no longer exists" in follow["problem"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_registry_keeps_serving_and_says_so(tmp_path, monkeypatch):
    """A tracking server that does not answer (nothing listens on its port): the service starts on the
    bundled model, and every poll keeps it, reporting the registry unreachable."""
    monkeypatch.setenv("POINTSMAN_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{_free_port()}")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    with serve(tmp_path / "data") as c:
        follower = c.app.state.runtime.follower
        served = serving(c)
        assert follower.poll_once() is None and follower.poll_once() is None
        assert serving(c) == served
        follow = c.get("/healthz").json()["model_follow"]
        assert follow["registry_reachable"] is False and "cannot read the model registry" in follow["problem"]
        assert metric(c, "pointsman_model_registry_reachable") == 0.0
        assert metric(c, "pointsman_model_follow_problem") == 1.0
        assert c.get("/healthz").json()["last_swap"] is None  # nothing was swapped or failed to load
