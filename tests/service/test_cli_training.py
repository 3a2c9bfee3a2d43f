"""``pointsman evaluate`` / ``pointsman train`` through click's CliRunner."""

import json

import click
import numpy as np
import pytest
from click.testing import CliRunner

from pointsman.cli.training import register
from pointsman.estimator.features import extract_features
from pointsman.estimator.model_source import load_estimator
from pointsman.request import request_from_prompt
from pointsman.training import metrics as M

PROMPTS = [
    "Write a haiku about the sea.",
    "Prove that the square root of 2 is irrational.",
    "Suggest a name for my new kitten.",  # not a sanity-suite request: evaluate leaves those out
    "Implement Dijkstra's algorithm in Rust with a binary heap.",
    "What is the capital city of Peru?",
    "Solve for x: 3x^2 - 12x + 9 = 0.",
]
WEAK = [0, 1, 0, 1, 0, 1]
STRONG = [1, 1, 1, 0, 1, 1]


@pytest.fixture
def cli():
    group = click.Group()
    register(group)
    return group


@pytest.fixture
def table(tmp_path):
    path = tmp_path / "tiny.csv"
    lines = ["prompt_id,category,prompt,weak-model,strong-model"]
    lines += [f'p{i},t,"{p}",{w},{s}' for i, (p, w, s) in enumerate(zip(PROMPTS, WEAK, STRONG))]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_evaluate_json_matches_hand_computation(cli, table, tmp_path, monkeypatch):
    monkeypatch.setenv("POINTSMAN_DATA_DIR", str(tmp_path / "data"))
    res = CliRunner().invoke(cli, ["evaluate", "--table", str(table), "--weak", "weak-model",
                                   "--strong", "strong-model", "--json", "--model", "bundled"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert {"apgr", "cpt50", "cpt80", "auc", "random_apgr", "oracle_apgr", "n"} <= set(out)
    assert out["n"] == 6 and out["random_apgr"] == pytest.approx(0.5)
    # gaps 1,0,1,-1,1,0 (total 2); oracle curve .5,1,1.5,1.5,1.5,1 at c=1/6..1 -> 6.5/6
    assert out["oracle_apgr"] == pytest.approx(6.5 / 6)
    est = load_estimator("bundled")
    p = np.array([est.estimate(extract_features(request_from_prompt(t), est.tokenizer)).p_hard for t in PROMPTS])
    w, s = np.array(WEAK, float), np.array(STRONG, float)
    assert out["apgr"] == pytest.approx(M.apgr(w, s, p), abs=1e-6)
    assert out["auc"] == pytest.approx(M.roc_auc(M.weak_worse(w, s), p), abs=1e-6)
    assert out["model_version"] == est.version


def test_evaluate_text_output(cli, table):
    res = CliRunner().invoke(cli, ["evaluate", "--table", str(table), "--weak", "weak-model",
                                   "--strong", "strong-model", "--model", "bundled"])
    assert res.exit_code == 0, res.output
    assert "APGR" in res.output and "random" in res.output and "oracle" in res.output


def test_evaluate_unknown_column_lists_choices(cli, table):
    res = CliRunner().invoke(cli, ["evaluate", "--table", str(table), "--weak", "weak_model",
                                   "--strong", "strong-model", "--model", "bundled"])
    assert res.exit_code == 2
    assert "Did you mean 'weak-model'" in res.output and "Available model columns" in res.output


@pytest.mark.parametrize("content", [b"\x1f\x8b\x08garbage-not-gzip", None])
def test_evaluate_unreadable_table(cli, tmp_path, content):
    path = tmp_path / "t.csv.gz"
    if content is not None:
        path.write_bytes(content)
    res = CliRunner().invoke(cli, ["evaluate", "--table", str(path), "--weak", "a", "--strong", "b", "--model", "bundled"])
    assert res.exit_code == 2
    assert "Error:" in res.output and "Traceback" not in res.output


def test_evaluate_bad_model_spec(cli, table, tmp_path):
    res = CliRunner().invoke(cli, ["evaluate", "--table", str(table), "--weak", "weak-model",
                                   "--strong", "strong-model", "--model", str(tmp_path / "nope")])
    assert res.exit_code == 2 and "no model at" in res.output


def test_train_refuses_non_commercial_tables(cli, tmp_path):
    res = CliRunner().invoke(cli, ["train", "--tables", "arena_bench_v1,alpacaeval_ae1", "--no-mlflow",
                                   "--output", str(tmp_path / "m")])
    assert res.exit_code == 2 and "refusing" in res.output


@pytest.mark.parametrize("extra, message", [
    (["--seed", "-1"], "'--seed': -1 is not in the range x>=0"),  # before: numpy's ValueError, a traceback
    (["--max-rows", "-3"], "'--max-rows': -3 is not in the range x>=1"),  # before: "negative dimensions"
    (["--folds", "-1"], "'--folds': -1 is not in the range x>=0"),  # before: silently no cross-fitting
    (["--folds", "1"], "1 fold holds nothing out"),
])
def test_train_bad_numbers_are_one_error_line(cli, tmp_path, extra, message):
    res = CliRunner().invoke(cli, ["train", "--no-mlflow", "--output", str(tmp_path / "m"), *extra])
    assert res.exit_code == 2 and message in res.output and "Traceback" not in res.output, res.output
    assert not (tmp_path / "m").exists()
