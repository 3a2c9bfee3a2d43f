"""``pointsman train --from-outcomes`` warm-starts from the shipped recipe's licensed chat rows
(``training.warm_start``): through the CLI against a real SQLite outcome log written by
``OutcomeLog``/``record_decision``, the prior rows are in with weight 200/(n+200) each and
recorded in the manifest and metrics; ``--no-warm-start`` leaves them out; a bad log path is one
``Error:`` line.
"""

from __future__ import annotations

import json

import click
import numpy as np
import pytest
from click.testing import CliRunner

from pointsman.cli.training import register as register_training
from pointsman.datasets.sources import DEFAULT_TRAINING_SOURCES, SOURCES
from pointsman.errors import DataError
from pointsman.estimator.head import DifficultyHead
from pointsman.estimator.model_source import load_estimator
from pointsman.outcome_log.store import OutcomeLog
from pointsman.policy.engine import RoutingEngine
from pointsman.policy.fleet import load_fleet
from pointsman.policy.rules.compiler import STATIC_POLICY_PATH, load_policy
from pointsman.training.challenger import ChallengerConfig, fit_head, warm_start_record
from pointsman.training.examples import EASY_ANCHORS
from pointsman.training.warm_start import PRIOR_HALF_N, PriorRows, prior_rows, prior_weight
from tests.training.conftest import log_traffic

HARD = ["prove the four colour theorem", "derive the Black-Scholes equation", "write a lock-free queue in C++",
        "explain the Riemann hypothesis", "design a distributed consensus protocol", "optimise a SQL query plan"]
EASY = ["name a colour", "say hello", "count to five", "spell cat", "name a fruit", "greet a friend"]
TEMPLATES = ["Please {x}.", "Could you {x}?", "I need you to {x} now.", "{x}, thanks."]


def _shared_or_skip() -> None:
    try:
        SOURCES[DEFAULT_TRAINING_SOURCES[0]].path().stat()
    except (DataError, OSError):
        pytest.skip("shared datasets not found (set POINTSMAN_SHARED_DATASETS or check out ../shared beside the repo)")


@pytest.fixture(scope="module")
def bundled():
    return load_estimator("bundled")


@pytest.fixture
def outcome_log(tmp_path, monkeypatch, bundled):
    """48 decisions routed by the engine and logged by the service's writer, each with judged
    answers of both tiers (the one not picked as a shadow): the on-prem model fails the hard asks."""
    monkeypatch.setenv("POINTSMAN_DATA_DIR", str(tmp_path / "data"))
    fleet = load_fleet()
    engine = RoutingEngine(fleet, load_policy(STATIC_POLICY_PATH, fleet), bundled)
    log = OutcomeLog(tmp_path / "outcomes.db")
    assert log_traffic(log, engine, bundled, HARD, EASY, TEMPLATES, judge="j") == 48
    log.close()
    return tmp_path / "outcomes.db"


def cli() -> click.Group:
    group = click.Group()
    register_training(group)
    return group


def _train(log_path, out, *extra):
    res = CliRunner().invoke(cli(), ["train", "--from-outcomes", str(log_path), "--no-mlflow", "--output", str(out),
                                     "--folds", "2", "--json", *extra])
    assert res.exit_code == 0, res.output
    manifest = json.loads((out / "manifest.json").read_text())
    return res, manifest


def test_prior_weight_shrinks_with_logged_outcomes():
    assert prior_weight(0) == 1.0
    assert prior_weight(200) == pytest.approx(0.5) and PRIOR_HALF_N == 200
    assert prior_weight(600) == pytest.approx(0.25)
    with pytest.raises(ValueError):
        prior_weight(10, half=0.0)


def test_fit_head_weighs_prior_rows_as_documented():
    """``fit_head`` with prior rows is the head fitted on [logged; prior] with weights [1; 200/(n+200)],
    ranking targets [clipped y; prior.y_rank] and calibration on the logged rows only."""
    rng = np.random.default_rng(0)
    n, m, d = 40, 60, 6
    X = rng.normal(size=(n, d)).astype(np.float32)
    y = (X[:, 0] > 0).astype(np.float64)
    prior = PriorRows(X=rng.normal(size=(m, d)).astype(np.float32), y_rank=rng.uniform(0.1, 0.9, m),
                      y=rng.uniform(0, 1, m), group=np.array([f"p{i}" for i in range(m)], dtype=object),
                      source=np.array(["arena_bench_v1"] * m, dtype=object), licenses={"arena_bench_v1": "Apache-2.0"})
    groups = np.array([f"g{i}" for i in range(n)], dtype=object)
    cfg = ChallengerConfig(calibration_folds=2, alpha=1.0)
    got = fit_head(X, y, groups, 3, cfg, prior)
    f = 200.0 / (n + 200.0)
    want = DifficultyHead(n_embedding=3, kind="logistic", alpha=1.0, n_folds=2, random_state=0).fit(
        np.vstack([X, prior.X]), np.concatenate([np.clip(y, 0.02, 0.98), prior.y_rank]),
        np.concatenate([np.ones(n), np.full(m, f)]), groups=np.concatenate([groups, prior.group]),
        calibration_y=np.concatenate([y, prior.y]), calibration_weight=np.concatenate([np.ones(n), np.zeros(m)]))
    probe = rng.normal(size=(20, d)).astype(np.float32)
    np.testing.assert_allclose(got.predict_proba(probe), want.predict_proba(probe), rtol=1e-6)
    cold = fit_head(X, y, groups, 3, cfg)
    assert not np.allclose(cold.predict_proba(probe), got.predict_proba(probe))
    rec = warm_start_record(cfg, n, prior)
    assert rec["prior_rows"] == m and rec["prior_weight_per_row"] == pytest.approx(f)
    assert rec["prior_weight_total"] == pytest.approx(m * f) and rec["logged_weight_total"] == n


@pytest.mark.slow
def test_train_from_outcomes_warm_starts_by_default(outcome_log, tmp_path, bundled):
    _shared_or_skip()
    res, manifest = _train(outcome_log, tmp_path / "warm")
    warm = manifest["training"]["warm_start"]
    n_train = manifest["training"]["n_train"]
    prior = prior_rows(bundled)
    assert warm["enabled"] and warm["skipped"] is None
    assert warm["prior_rows"] == len(prior) > 0 and warm["prior_sources"] == prior.counts()
    assert set(warm["prior_sources"]) == {*DEFAULT_TRAINING_SOURCES, EASY_ANCHORS} and "alpacaeval" not in warm["prior_sources"]
    assert set(warm["prior_licenses"].values()) <= {"Apache-2.0", "MIT"}
    assert warm["logged_rows"] == n_train and 0 < n_train < 48
    assert warm["prior_weight_per_row"] == pytest.approx(200.0 / (n_train + 200.0))
    assert warm["prior_weight_total"] == pytest.approx(warm["prior_weight_per_row"] * len(prior))
    metrics = json.loads(res.stdout)
    assert metrics["data/prior_rows"] == len(prior)
    assert metrics["data/prior_weight_per_row"] == pytest.approx(warm["prior_weight_per_row"])
    assert metrics["data/logged_weight_total"] == n_train
    assert f"warm start: {len(prior)} prior rows" in res.stderr
    assert "warm start: " in (tmp_path / "warm" / "PROVENANCE.md").read_text()

    # --no-warm-start: the logged rows alone, and a different head.
    res_off, off = _train(outcome_log, tmp_path / "cold", "--no-warm-start")
    assert off["training"]["warm_start"]["enabled"] is False
    assert off["training"]["warm_start"]["prior_rows"] == 0 and off["training"]["warm_start"]["prior_sources"] == {}
    assert json.loads(res_off.stdout)["data/prior_rows"] == 0
    assert "warm start off" in res_off.stderr
    X = prior.X[:50]
    p_warm = load_estimator(str(tmp_path / "warm")).predict_matrix(X)
    p_cold = load_estimator(str(tmp_path / "cold")).predict_matrix(X)
    assert np.max(np.abs(p_warm - p_cold)) > 1e-3


@pytest.mark.slow
def test_missing_prior_tables_train_on_logged_rows_with_a_warning(outcome_log, tmp_path, monkeypatch):
    monkeypatch.setenv("POINTSMAN_SHARED_DATASETS", str(tmp_path / "nowhere"))
    res, manifest = _train(outcome_log, tmp_path / "m")
    warm = manifest["training"]["warm_start"]
    assert warm["enabled"] and warm["prior_rows"] == 0 and "nowhere" in warm["skipped"]
    assert "Warning: warm start skipped" in res.stderr


@pytest.mark.parametrize("kind", ["missing", "directory", "not-sqlite"])
def test_bad_log_path_is_one_clear_error(tmp_path, kind):
    path = tmp_path / "outcomes.db"
    if kind == "directory":
        path.mkdir()
    elif kind == "not-sqlite":
        path.write_text("decision_id,target\nd1,onprem-8b\n" * 200)
    res = CliRunner().invoke(cli(), ["train", "--from-outcomes", str(path), "--no-mlflow", "--output",
                                     str(tmp_path / "m")])
    assert res.exit_code == 2, res.output
    assert res.output.startswith("Error: ") and str(path) in res.output
    if kind != "not-sqlite":
        assert "no outcome log at" in res.output and "pass --from-outcomes LOG" in res.output
    else:
        assert "cannot open the outcome log (file is not a database)" in res.output
    assert res.exception is None or isinstance(res.exception, SystemExit)


def test_no_warm_start_needs_from_outcomes_or_table(tmp_path):
    res = CliRunner().invoke(cli(), ["train", "--no-warm-start", "--no-mlflow", "--output", str(tmp_path / "m")])
    assert res.exit_code == 2 and "--no-warm-start applies to --from-outcomes and --table only" in res.output
    res = CliRunner().invoke(cli(), ["train", "--table", str(tmp_path / "t.csv"), "--weak", "a", "--strong", "b",
                                     "--no-warm-start", "--warm-start", "arena_bench_v1", "--no-mlflow",
                                     "--output", str(tmp_path / "m")])
    assert res.exit_code == 2 and "give --no-warm-start or --warm-start NAMES, not both" in res.output


def test_the_prior_holds_no_conversation_the_challenger_is_scored_on(tmp_path, monkeypatch, bundled):
    """Logged traffic that holds the prior's own prompts (an operator running MT-bench or Arena-Hard through the
    service) put its held-out conversations into the warm start: the challenger learned the very prompts its
    held-out APGR scores (MT-bench as the log, 10 seeds: +0.067 ± 0.082 held-out APGR over the same head without
    them, higher in every seed). Now the prior rows of held-out conversations are left out, as ``evaluate
    --folds`` leaves a test fold's conversations out of the warm rows; the others stay."""
    _shared_or_skip()
    from pointsman.cli.main import main
    from pointsman.training.logged_examples import holdout_mask

    monkeypatch.setenv("POINTSMAN_DATA_DIR", str(tmp_path / "data"))
    prior = prior_rows(bundled)
    mtbench = [str(p) for p, s in zip(prior.group, prior.source) if s == "routellm_mtbench"]
    fleet = load_fleet()
    engine = RoutingEngine(fleet, load_policy(STATIC_POLICY_PATH, fleet), bundled)
    log = OutcomeLog(tmp_path / "outcomes.db")
    from pointsman.datasets.outcome_tables import read_outcome_table

    table = read_outcome_table(SOURCES["routellm_mtbench"].path())
    firsts = sorted({str(m[0]["content"]) for m in table.messages})  # one conversation per MT-bench question
    assert log_traffic(log, engine, bundled, firsts[:40], firsts[40:], ["{x}"], judge="j") == len(firsts)
    keys = np.array([d.conversation_key for d in log.joined()], dtype=object)
    held = set(keys[holdout_mask(keys)])
    log.close()
    assert held and held <= set(mtbench)
    res = CliRunner().invoke(main, ["train", "--from-outcomes", str(tmp_path / "outcomes.db"), "--folds", "3",
                                    "--json", "--no-mlflow", "--output", str(tmp_path / "m")])
    assert res.exit_code == 0, (res.output, res.exception)
    warm = json.loads((tmp_path / "m" / "manifest.json").read_text())["training"]["warm_start"]
    dropped = sum(str(g) in held for g in prior.group)
    assert dropped >= len(held) > 0
    assert warm["prior_rows"] == len(prior) - dropped, warm  # before: every prior row
    assert f"{dropped} prior rows are conversations held out of this log" in res.stderr
