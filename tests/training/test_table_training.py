"""``pointsman train --table`` and ``pointsman evaluate --folds`` through the CLI, on a small
operator table in tmp_path (the bundled encoder; no MLflow)."""

import json

import click
import numpy as np
import pytest
from click.testing import CliRunner

from pointsman.cli.training import register
from pointsman.estimator.model_source import bundled_model_dir

TOPICS_HARD = ["Prove that {} is irrational.", "Derive the closed form of the {} recurrence and prove it.",
               "Implement a lock-free {} in C++ and argue linearizability."]
TOPICS_EASY = ["Suggest a name for my {}.", "Write a short greeting for my {}.", "What colour is a {}?"]
WORDS = ["cat", "dog", "sqrt(2)", "queue", "fibonacci", "stack", "parrot", "e", "heap", "hamster"]


@pytest.fixture
def cli():
    group = click.Group()
    register(group)
    return group


@pytest.fixture
def table(tmp_path):
    """60 prompts: the weak model loses the hard ones to the strong model, ties on the easy ones."""
    rows = ["prompt_id,category,prompt,small,small-b,big"]
    i = 0
    for w in WORDS:
        for t in TOPICS_HARD:
            rows.append(f'h{i},x,"{t.format(w)}",0,0.5,1')
            i += 1
        for t in TOPICS_EASY:
            rows.append(f'e{i},x,"{t.format(w)}",1,1,1')
            i += 1
    path = tmp_path / "ops.csv"
    path.write_text("\n".join(rows) + "\n")
    return path


def _train(cli, table, out, *extra):
    return CliRunner().invoke(cli, ["train", "--table", str(table), "--weak", "small,small-b", "--strong", "big",
                                    "--encoder-from", str(bundled_model_dir()), "--folds", "2", "--no-mlflow",
                                    "--output", str(out), "--json", *extra])


def test_train_table_then_crossvalidate(cli, table, tmp_path, monkeypatch):
    monkeypatch.setenv("POINTSMAN_DATA_DIR", str(tmp_path / "data"))
    out = tmp_path / "model"
    res = _train(cli, table, out, "--license", "LicenseRef-ops-internal")
    assert res.exit_code == 0, res.output
    manifest = json.loads((out / "manifest.json").read_text())
    (src,) = manifest["training"]["sources"]
    assert src["license"] == "LicenseRef-ops-internal" and src["weak_models"] == ["small", "small-b"]
    assert src["prompts"] == 60
    provenance = (out / "PROVENANCE.md").read_text()
    assert "LicenseRef-ops-internal" in provenance and "not a shippable default" in provenance
    res = CliRunner().invoke(cli, ["evaluate", "--model", str(out), "--table", str(table), "--weak", "small",
                                   "--strong", "big", "--folds", "3", "--json"])
    assert res.exit_code == 0, res.output
    cv = json.loads(res.output)
    assert cv["folds"] == 3 and len(cv["fold_apgr"]) == 3 and cv["n"] == 60
    assert cv["train_weak"] == ["small", "small-b"]  # the model's own training columns label the refits
    # hard and easy prompts are worlds apart: out-of-fold the recipe ranks them well above random
    assert cv["random_apgr"] == pytest.approx(0.5) and cv["apgr"] > 0.7
    assert cv["apgr"] <= cv["oracle_apgr"] + 1e-9
    assert cv["apgr_mean"] == pytest.approx(np.mean(cv["fold_apgr"]), abs=1e-5)
    assert {"length_apgr", "oracle_apgr", "apgr_sd"} <= set(cv)


def test_train_table_license_unknown_by_default(cli, table, tmp_path, monkeypatch):
    monkeypatch.setenv("POINTSMAN_DATA_DIR", str(tmp_path / "data"))
    res = _train(cli, table, tmp_path / "m")
    assert res.exit_code == 0, res.output
    (src,) = json.loads((tmp_path / "m" / "manifest.json").read_text())["training"]["sources"]
    assert src["license"] == "unknown"


@pytest.mark.parametrize("args, message", [
    (["--weak", "small"], "--table needs --weak COL and --strong COL"),
    (["--weak", "smal", "--strong", "big"], "Did you mean 'small'"),
    (["--weak", "big", "--strong", "big"], "named as both weak and strong"),
    (["--weak", "small", "--strong", "big", "--tables", "routellm_mmlu"], "takes no --tables"),
])
def test_train_table_bad_arguments(cli, table, tmp_path, args, message):
    res = CliRunner().invoke(cli, ["train", "--table", str(table), *args, "--no-mlflow", "--output", str(tmp_path / "m")])
    assert res.exit_code == 2
    assert message in res.output
    assert "Traceback" not in res.output


def test_weak_without_table_is_refused(cli, tmp_path):
    res = CliRunner().invoke(cli, ["train", "--weak", "a", "--no-mlflow", "--output", str(tmp_path / "m")])
    assert res.exit_code == 2 and "--table only" in res.output
