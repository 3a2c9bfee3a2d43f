"""A quick training run on a tiny subset: model directory, manifest, provenance, MLflow."""

import json

import numpy as np
import pytest

from pointsman.datasets.easy_anchors import easy_anchor_prompts
from pointsman.datasets.sources import DEFAULT_TRAINING_SOURCES
from pointsman.errors import DataError, ModelNotFoundError
from pointsman.estimator.model_source import bundled_model_dir, load_estimator
from pointsman.training.recipe import TrainConfig
from pointsman.training.train import train

TINY = dict(
    max_rows_per_source={s: 40 for s in DEFAULT_TRAINING_SOURCES},
    n_folds=2,
    n_members=1,
    max_iter=40,
)


@pytest.fixture
def data(tmp_path, monkeypatch):
    monkeypatch.setenv("POINTSMAN_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return tmp_path


def test_tiny_training_writes_a_loadable_model(data):
    cfg = TrainConfig(encoder_from=str(bundled_model_dir()), **TINY)
    out = data / "model"
    result = train(cfg, out, use_mlflow=False, log=lambda m: None)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["version"] == result.manifest.version
    assert manifest["encoder"]["kind"] == "static"
    assert [s["name"] for s in manifest["training"]["sources"]] == list(DEFAULT_TRAINING_SOURCES)
    m = result.metrics
    assert m["export/parity_max_abs"] < 1e-4 and m["export/end_to_end_max_abs"] < 1e-4
    assert 0.0 <= m["heldout/chat_apgr"] <= 1.5 and m["train/n_prompts"] == len(DEFAULT_TRAINING_SOURCES) * 40 + len(easy_anchor_prompts())
    assert m["heldout/easy_anchors/mean_p_hard"] < 0.2  # the gate learned the easy anchors
    prov = (out / "PROVENANCE.md").read_text()
    assert "Apache-2.0" in prov and "CC BY-NC" in prov and "pointsman train" in prov
    ref = manifest["reference_p_hard"]
    assert ref["n"] == 300 + 160 + 300 + 300  # arena, MT-bench (both turn rows), MMLU, GSM8K
    qs = [ref["quantiles"][k] for k in sorted(ref["quantiles"])]
    assert len(qs) == 19 and qs == sorted(qs) and 0.0 <= qs[0] <= qs[-1] <= 1.0
    est = load_estimator(out)
    assert est.version == result.manifest.version
    assert est.manifest.reference_p_hard == ref
    p = est.estimate_batch([])
    assert p.shape == (0,)


def test_training_refuses_alpacaeval(data):
    with pytest.raises(DataError, match="refusing"):
        train(TrainConfig(sources=("arena_bench_v1", "alpacaeval_ae1")), data / "m", use_mlflow=False)


@pytest.mark.slow
def test_mlflow_register_champion_and_load_back(data):
    cfg = TrainConfig(encoder_from=str(bundled_model_dir()), **TINY)
    result = train(cfg, None, register=True, use_mlflow=True, log=lambda m: None)
    assert result.run.model_version == "1" and result.run.alias == "champion"
    assert (data / "data" / "mlflow.db").is_file() and (data / "data" / "mlartifacts").is_dir()
    champ = load_estimator("champion")
    assert champ.source == "models:/pointsman-difficulty/1 (@champion)"
    assert champ.version == result.manifest.version
    again = load_estimator("models:/pointsman-difficulty/1")
    assert again.version == champ.version and np.isfinite(again.estimate_batch([]).sum())
    with pytest.raises(ModelNotFoundError, match="no alias @challenger"):
        load_estimator("models:/pointsman-difficulty@challenger")
    with pytest.raises(ModelNotFoundError, match="invalid model URI"):
        load_estimator("models:/pointsman-difficulty/1/extra")
