"""``pointsman train --table`` and ``pointsman evaluate --folds`` through the CLI, on a small
operator table in tmp_path (the bundled encoder; no MLflow)."""

import json

import click
import numpy as np
import pytest
from click.testing import CliRunner

from pointsman.cli.training import TABLE_GATE_SHIFT, register
from pointsman.estimator.model_source import bundled_model_dir
from pointsman.training.recipe import TrainConfig

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
    return _write_table(tmp_path / "ops.csv", "small,small-b,big", lambda i, hard: "0,0.5,1" if hard else "1,1,1")


def _write_table(path, columns, scores):
    """A wide table of the WORDS x TOPICS prompts (hard ones first per word); ``scores(i, hard)`` gives
    row ``i``'s model columns as CSV text."""
    rows, i = [f"prompt_id,category,prompt,{columns}"], 0
    for w in WORDS:
        for hard, topics in ((True, TOPICS_HARD), (False, TOPICS_EASY)):
            for t in topics:
                rows.append(f'{"h" if hard else "e"}{i},x,"{t.format(w)}",{scores(i, hard)}')
                i += 1
    path.write_text("\n".join(rows) + "\n")
    return path


def _train(cli, table, out, *extra, weak="small,small-b"):
    warm = () if "--warm-start" in extra else ("--warm-start", "none")
    return CliRunner().invoke(cli, ["train", "--table", str(table), "--weak", weak, "--strong", "big",
                                    "--encoder-from", str(bundled_model_dir()), "--folds", "2", "--no-mlflow",
                                    "--output", str(out), "--json", *warm, *extra])


def test_train_table_then_crossvalidate(cli, table, tmp_path, monkeypatch):
    monkeypatch.setenv("POINTSMAN_DATA_DIR", str(tmp_path / "data"))
    out = tmp_path / "model"
    res = _train(cli, table, out, "--license", "LicenseRef-ops-internal")
    assert res.exit_code == 0, res.output
    manifest = json.loads((out / "manifest.json").read_text())
    (src,) = manifest["training"]["sources"]
    assert src["license"] == "LicenseRef-ops-internal" and src["weak_models"] == ["small", "small-b"]
    assert src["prompts"] == 59  # "Suggest a name for my cat." is a request of the sanity suite: not trained on
    provenance = (out / "PROVENANCE.md").read_text()
    assert "LicenseRef-ops-internal" in provenance and "not a shippable default" in provenance
    res = CliRunner().invoke(cli, ["evaluate", "--model", str(out), "--table", str(table), "--weak", "small",
                                   "--strong", "big", "--folds", "3", "--json"])
    assert res.exit_code == 0, res.output
    cv = json.loads(res.output)
    assert cv["folds"] == 3 and len(cv["fold_apgr"]) == 3 and cv["n"] == 59  # the cat's name: a suite request
    assert cv["sanity_excluded"] == 1
    assert cv["train_weak"] == ["small", "small-b"]  # the model's own training columns label the refits
    # hard and easy prompts are worlds apart: out-of-fold the recipe ranks them well above random
    assert cv["random_apgr"] == pytest.approx(0.5) and cv["apgr"] > 0.7
    assert cv["apgr"] <= cv["oracle_apgr"] + 1e-9
    assert cv["apgr_mean"] == pytest.approx(np.mean(cv["fold_apgr"]), abs=1e-5)
    assert {"length_apgr", "oracle_apgr", "apgr_sd"} <= set(cv)


@pytest.fixture
def with_suite(table, tmp_path):
    """``table`` plus requests of the shipped suites (both files; the single-message pairs among the first
    15 of each), their easy side labelled easy, their hard side hard; the number of suite rows it holds
    (the fixture's own "Suggest a name for my cat." is a request of the suite too)."""
    import csv

    from pointsman.training.sanity import read_pairs, shipped_suite_paths

    pairs = [p for path in shipped_suite_paths() for p in read_pairs(path)[:15]
             if isinstance(p.easy, str) and isinstance(p.hard, str)]
    path = tmp_path / "with_suite.csv"
    path.write_text(table.read_text())
    with path.open("a", newline="") as f:
        w = csv.writer(f)
        for i, p in enumerate(pairs):
            w.writerow([f"se{i}", "x", p.easy, 1, 1, 1])
            w.writerow([f"sh{i}", "x", p.hard, 0, 0.5, 1])
    return path, 2 * len(pairs) + 1


def test_train_table_leaves_out_the_sanity_suites_requests(cli, table, with_suite, tmp_path, monkeypatch):
    """An operator's table that holds requests of the shipped suites trains the same head as the table
    without them: those rows are what promote and evaluate --pairs score. Their count is printed and kept
    in the manifest's metrics."""
    monkeypatch.setenv("POINTSMAN_DATA_DIR", str(tmp_path / "data"))
    with_suite, n = with_suite
    res = _train(cli, with_suite, tmp_path / "m")
    assert res.exit_code == 0, res.output
    assert f"{n} table rows are requests of the sanity suites: not trained on" in res.stderr
    manifest = json.loads((tmp_path / "m" / "manifest.json").read_text())
    assert manifest["metrics"]["data/sanity_excluded"] == n >= 41
    assert manifest["training"]["sources"][0]["prompts"] == 59
    assert _train(cli, table, tmp_path / "plain").exit_code == 0
    assert (tmp_path / "m" / "head.onnx").read_bytes() == (tmp_path / "plain" / "head.onnx").read_bytes()


def test_evaluate_leaves_out_the_sanity_suites_requests(cli, table, with_suite, tmp_path, monkeypatch):
    """``evaluate --folds`` and ``evaluate`` on a table score none of its rows that are requests of the
    shipped suites, and no refit trains on them: the table with the suite's pairs added gives the plain
    table's numbers, and says how many rows it left out."""
    monkeypatch.setenv("POINTSMAN_DATA_DIR", str(tmp_path / "data"))
    with_suite, n = with_suite
    model = tmp_path / "m"
    assert _train(cli, table, model).exit_code == 0
    plain, suite = _crossval(cli, model, table), _crossval(cli, model, with_suite)
    assert (plain["sanity_excluded"], suite["sanity_excluded"]) == (1, n)
    assert suite["n"] == plain["n"] == 59
    for key in ("apgr", "auc", "fold_apgr", "length_apgr", "oracle_apgr"):
        assert suite[key] == plain[key], key
    res = CliRunner().invoke(cli, ["evaluate", "--model", str(model), "--table", str(with_suite), "--weak", "small",
                                   "--strong", "big", "--folds", "3"])
    assert res.exit_code == 0, res.output
    assert f"(59 prompts; {n} requests of the sanity suites left out)" in res.output
    scored = [json.loads(CliRunner().invoke(cli, ["evaluate", "--model", str(model), "--table", str(t), "--weak",
                                                  "small", "--strong", "big", "--json"]).output)
              for t in (table, with_suite)]
    assert [s["sanity_excluded"] for s in scored] == [1, n] and scored[0]["n"] == scored[1]["n"] == 59
    assert scored[0]["apgr"] == scored[1]["apgr"] and scored[1]["n_skipped"] == 0


def test_evaluate_says_when_the_model_trained_on_the_table(cli, table, noisy_table, tmp_path, monkeypatch):
    """``evaluate --table T`` of a model ``train --table T`` wrote scores the rows it trained on: an in-sample
    APGR that reads like a held-out one (on the shared AlpacaEval table, 0.697 against 0.631 with --folds 5).
    It says so (``in_sample``), and names --folds; another table, and the shipped model on a table it never
    read, are not in sample."""
    monkeypatch.setenv("POINTSMAN_DATA_DIR", str(tmp_path / "data"))
    model = tmp_path / "m"
    assert _train(cli, table, model).exit_code == 0

    def evaluate(t, *extra):
        res = CliRunner().invoke(cli, ["evaluate", "--model", str(model), "--table", str(t), "--weak", "small",
                                       "--strong", "big", *extra])
        assert res.exit_code == 0, res.output
        return res.output

    assert json.loads(evaluate(table, "--json"))["in_sample"] is True
    assert "in sample: the model trained on this table's rows; --folds K gives held-out numbers" in evaluate(table)
    assert json.loads(evaluate(noisy_table, "--json"))["in_sample"] is False
    assert "in sample" not in evaluate(noisy_table)


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


ARENA_WEAK = ["mistralai/Mistral-7B-Instruct-v0.1", "Llama-2-70b-chat", "vicuna-33b-v1.3", "openchat_3.5",
              "Starling-LM-7B-alpha", "mistralai/Mixtral-8x7B-Instruct-v0.1", "claude-1", "claude-2.1",
              "claude-instant-1", "gpt-3.5-turbo", "gpt-3.5-turbo-1106", "palm-2-chat-bison-001"]  # and its label panel


@pytest.fixture
def shared(tmp_path, monkeypatch):
    """A shared datasets folder whose Arena-Bench-V1 table is 30 hard/easy chat prompts (1-10 scores)."""
    root = tmp_path / "shared"
    (root / "arena_bench_v1").mkdir(parents=True)
    rows = ["prompt_id,category,prompt," + ",".join(f'"{c}"' for c in ARENA_WEAK) + ",gpt-4-1106-preview,gpt-4-0314"]
    for i, w in enumerate(WORDS):
        for j, t in enumerate(TOPICS_HARD):
            rows.append(f'ah{i}{j},x,"{t.format(w)} (arena)",' + ",".join(["3"] * len(ARENA_WEAK)) + ",9,8")
            rows.append(f'ae{i}{j},x,"{TOPICS_EASY[j].format(w)} (arena)",' + ",".join(["8"] * len(ARENA_WEAK)) + ",8,8")
    (root / "arena_bench_v1" / "arena_bench_v1_gpt4_single_scores.csv").write_text("\n".join(rows) + "\n")
    monkeypatch.setenv("POINTSMAN_SHARED_DATASETS", str(root))
    return root


@pytest.fixture
def noisy_table(tmp_path):
    """60 prompts where the weak column's own verdicts are mostly noise (it loses about 2 in 3 hard prompts
    and 1 in 3 easy ones, drawn at random, unrelated to the words) while five panel models lose every hard
    prompt and no easy one: the panel says which prompts are hard, the pair alone barely does."""
    coin = np.random.default_rng(7).random(60)
    return _write_table(tmp_path / "noisy.csv", "small,p1,p2,p3,p4,p5,big",
                        lambda i, hard: f"{int(coin[i] < 1 / 3)},0,0,0,0,0,1" if hard else
                        f"{int(coin[i] < 2 / 3)},1,1,1,1,1,1")


def _crossval(cli, model, table, weak="small"):
    res = CliRunner().invoke(cli, ["evaluate", "--model", str(model), "--table", str(table), "--weak", weak,
                                   "--strong", "big", "--folds", "3", "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


def test_label_panel_denoises_the_pair_and_is_recorded(cli, noisy_table, tmp_path, monkeypatch):
    monkeypatch.setenv("POINTSMAN_DATA_DIR", str(tmp_path / "data"))
    scores = {}
    for weight in ("0", "1"):
        out = tmp_path / f"m{weight}"
        res = _train(cli, noisy_table, out, "--panel-weight", weight, weak="small")
        assert res.exit_code == 0, res.output
        manifest = json.loads((out / "manifest.json").read_text())
        (src,) = manifest["training"]["sources"]
        if weight == "1":  # every column but the strong one; named only when the recipe reads it
            assert src["panel_models"] == ["small", "p1", "p2", "p3", "p4", "p5"]
            assert "Label panel of noisy (weight 1.0 of each prompt's label): small, p1" in (out / "PROVENANCE.md").read_text()
        else:
            assert "panel_models" not in src
        assert manifest["training"]["recipe"]["panel_weight"] == float(weight)
        scores[weight] = _crossval(cli, out, noisy_table)
    # judged on the noisy pair itself, the refits that learned from the panel rank it better out of fold
    assert scores["1"]["apgr"] > scores["0"]["apgr"] + 0.05
    assert scores["1"]["apgr"] <= scores["1"]["oracle_apgr"] + 1e-9


def test_warm_start_trains_beside_licensed_rows_and_crossval_keeps_them(cli, table, shared, tmp_path, monkeypatch):
    monkeypatch.setenv("POINTSMAN_DATA_DIR", str(tmp_path / "data"))
    out = tmp_path / "warm"
    res = _train(cli, table, out, "--warm-start", "arena_bench_v1", "--warm-start-share", "1")
    assert res.exit_code == 0, res.output
    manifest = json.loads((out / "manifest.json").read_text())
    names = {s["name"]: s for s in manifest["training"]["sources"]}
    assert set(names) == {"ops", "arena_bench_v1"}
    assert names["arena_bench_v1"]["license"] == "Apache-2.0" and names["arena_bench_v1"]["prompts"] == 60
    assert manifest["training"]["recipe"]["warm_start"] == "arena_bench_v1"
    provenance = (out / "PROVENANCE.md").read_text()
    assert "not a shippable default" in provenance  # the table's licence is unknown
    assert "Warm start: arena_bench_v1, together weighing 1.0 x the other sources' rows" in provenance
    cv = _crossval(cli, out, table)
    assert cv["n"] == 59 and cv["apgr"] > 0.7  # scored on the table's rows only, the warm rows always train


def test_warm_start_of_an_unknown_source_is_named(cli, table, tmp_path):
    res = _train(cli, table, tmp_path / "m", "--warm-start", "arena_bench")
    assert res.exit_code == 2 and "arena_bench" in res.output and "Traceback" not in res.output


def test_panel_and_warm_start_options_need_a_table(cli, tmp_path):
    res = CliRunner().invoke(cli, ["train", "--panel-weight", "0.5", "--no-mlflow", "--output", str(tmp_path / "m")])
    assert res.exit_code == 2 and "--table only" in res.output


def test_warm_start_without_the_shared_tables_says_how_to_go_on(cli, table, tmp_path, monkeypatch):
    monkeypatch.setenv("POINTSMAN_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("POINTSMAN_SHARED_DATASETS", str(tmp_path / "no-shared"))
    res = _train(cli, table, tmp_path / "m", "--warm-start", "arena_bench_v1")
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert "warm start reads arena_bench_v1" in res.output and "--warm-start none" in res.output
    res = _train(cli, table, tmp_path / "m")  # --warm-start none: the table alone trains anywhere
    assert res.exit_code == 0, res.output


def test_crossval_refits_the_recipes_gate(cli, table, tmp_path, monkeypatch):
    """``evaluate --folds`` scores the head ``train`` writes: a recipe with the easy anchors refits the gate
    in every fold, which only ever lowers a prompt's score (the ranker is the same) and lowers some; a
    recipe that does not name the anchors (trained before them) refits none."""
    import shutil

    from pointsman.estimator.difficulty import DifficultyEstimator
    from pointsman.training.crossval import crossval_scores, recipe_of

    monkeypatch.setenv("POINTSMAN_DATA_DIR", str(tmp_path / "data"))
    gated = tmp_path / "gated"
    res = _train(cli, table, gated)
    assert res.exit_code == 0, res.output
    recipe = json.loads((gated / "manifest.json").read_text())["training"]["recipe"]
    assert recipe["easy_anchors"] is True and recipe["gate_weight"] > 0
    assert recipe["gate_shift"] == TABLE_GATE_SHIFT != TrainConfig.gate_shift  # a table's gate, not the chat recipe's
    plain = tmp_path / "plain"
    shutil.copytree(gated, plain)
    manifest = json.loads((plain / "manifest.json").read_text())
    del manifest["training"]["recipe"]["easy_anchors"]
    (plain / "manifest.json").write_text(json.dumps(manifest))
    est_gated, est_plain = DifficultyEstimator(gated), DifficultyEstimator(plain)
    assert recipe_of(est_gated).easy_anchors and not recipe_of(est_plain).easy_anchors
    with_gate = crossval_scores(est_gated, table, "small", "big", 3)
    without = crossval_scores(est_plain, table, "small", "big", 3)
    assert np.array_equal(with_gate.prompt_id, without.prompt_id)
    assert np.all(with_gate.score <= without.score + 1e-6)
    assert np.any(with_gate.score < without.score - 1e-3)
