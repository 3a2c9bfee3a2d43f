"""The retraining loop on small data: the engine decides and the decisions and outcomes go
into the outcome log → train a challenger from it → compare → promote (the champion alias
moves, load_estimator("champion") gives the new model, new decisions name it) → a worse
challenger is refused with both numbers → rollback, twice.

The traffic is synthetic and learnable: cooking questions are "hard" (the on-prem model's
judged score 0, the frontier's 1) and gardening questions "easy" (both 1). The bundled
model has never seen that split, so a head trained on the logged head inputs beats it.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import click
import numpy as np
import pytest
from click.testing import CliRunner

from pointsman.cli.loop import register
from pointsman.cli.training import register as register_training
from pointsman.estimator.model_source import load_estimator
from pointsman.outcome_log.store import OutcomeLog
from pointsman.policy.engine import RoutingEngine
from pointsman.policy.fleet import load_fleet
from pointsman.policy.rules.compiler import STATIC_POLICY_PATH, load_policy
from pointsman.request import request_from_prompt
from pointsman.training.challenger import ChallengerConfig, train_challenger
from pointsman.training.logged_examples import head_matrix, holdout_mask, logged_examples
from pointsman.training.metrics import apgr
from pointsman.training.outcome_labels import LabelRules
from pointsman.training.promote import Gate, alias_version, promote, rollback
from pointsman.training.sanity import read_pairs
from tests.training.conftest import log_traffic as logged

COOKING = ["braise short ribs", "temper dark chocolate", "make a sourdough starter", "poach an egg", "cook risotto",
           "caramelize onions", "roast a whole chicken", "make fresh pasta", "bake a souffle", "fry tofu crisply",
           "make a roux for gumbo", "sear scallops", "proof brioche dough", "make hollandaise", "smoke a brisket",
           "steam dumplings", "pickle cucumbers", "make pad thai", "cook basmati rice", "bake macarons"]
GARDENING = ["prune roses", "repot a fern", "grow tomatoes on a balcony", "compost kitchen scraps",
             "divide hostas", "plant tulip bulbs", "mulch a vegetable bed", "water succulents", "start seeds indoors",
             "keep aphids off kale", "grow basil from cuttings", "plant a hedge", "care for an orchid",
             "grow strawberries in pots", "aerate a lawn", "plant garlic in autumn", "stake dahlias",
             "overwinter geraniums", "grow blueberries", "build a raised bed"]
TEMPLATES = ["How do I {x}?", "What is the best way to {x} at home?", "Give me step by step advice to {x}.",
             "Explain to a beginner how to {x}.", "What mistakes should I avoid when I {x}?"]
JUDGE = "pairwise-judge-0-1"
# The synthetic cooking/gardening world asks nothing of the sanity suite (its challenger ranks the pairs
# worse than the bundled model: 0.35 vs 0.46 when this was written): the sanity gate has its own test below.
GATE = Gate(min_rows=15, max_sanity_drop=1.0)


def log_traffic(log: OutcomeLog, engine: RoutingEngine, est, *, inverted: bool = False) -> int:
    """Route every synthetic prompt and log it with its judged answers (``conftest.log_traffic``):
    cooking is what the on-prem model fails; ``inverted`` swaps the topics."""
    return logged(log, engine, est, COOKING, GARDENING, TEMPLATES, judge=JUDGE, inverted=inverted)


@pytest.fixture
def data(tmp_path, monkeypatch):
    monkeypatch.setenv("POINTSMAN_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return tmp_path


@pytest.fixture(scope="module")
def world():
    fleet = load_fleet()
    est = load_estimator("bundled")
    return fleet, est, RoutingEngine(fleet, load_policy(STATIC_POLICY_PATH, fleet), est)


def cli():
    group = click.Group()
    register(group)
    register_training(group)
    return group


CFG = ChallengerConfig(calibration_folds=3, alpha=10.0)


@pytest.mark.slow
def test_the_whole_loop_with_the_embedded_store(data, world):
    fleet, bundled, engine = world
    log = OutcomeLog()  # <data dir>/outcomes.db, as the service opens it
    assert log_traffic(log, engine, bundled) == 200

    # train --from-outcomes through the CLI: a challenger, not a champion.
    res = CliRunner().invoke(cli(), ["train", "--from-outcomes", "--folds", "3", "--json"])
    assert res.exit_code == 0, res.output
    from pointsman.estimator.registry import client

    c = client()
    assert alias_version(c, "challenger") == "1" and alias_version(c, "champion") is None
    assert load_estimator("champion").source.startswith("bundled")

    res = CliRunner().invoke(cli(), ["compare", "--json"])
    assert res.exit_code == 0, res.output

    result = promote(log, LabelRules(), fleet, GATE)
    cmp = result.comparison
    assert result.promoted, result.reasons
    assert cmp.challenger.metrics["apgr"] > cmp.champion.metrics["apgr"] + 0.1
    assert 15 <= cmp.n < 200 and cmp.excluded["trained_on"] == 200 - cmp.n  # only its held-out fold
    assert alias_version(c, "champion") == "1" and alias_version(c, "challenger") is None
    champion = load_estimator("champion")
    assert champion.source == "models:/pointsman-difficulty/1 (@champion)"
    assert champion.version == c.get_model_version("pointsman-difficulty", "1").tags.get("pointsman.version", champion.version)
    # The service swaps models by building a new engine: new decisions name the new version.
    new = engine.with_estimator(champion).route(request_from_prompt("How do I poach an egg?"), dispatch=False)
    assert new.estimator_version == champion.version != bundled.version
    runs = c.search_runs([c.get_experiment_by_name("pointsman-promotion").experiment_id])
    assert runs[0].data.tags["pointsman.verdict"] == "promoted"
    assert {"champion/apgr", "challenger/apgr", "champion/ece", "challenger/ece"} <= set(runs[0].data.metrics)
    artifacts = {a.path for a in c.list_artifacts(runs[0].info.run_id, "comparison")}
    assert {"comparison/pgr.png", "comparison/reliability.png", "comparison/comparison.json"} <= artifacts

    # A worse challenger: trained on a log whose judge verdicts are inverted.
    bad_log = OutcomeLog(data / "bad.db")
    log_traffic(bad_log, engine.with_estimator(champion), champion, inverted=True)
    bad = train_challenger(bad_log, LabelRules(), fleet, CFG, champion, log_fn=lambda m: None)
    assert alias_version(c, "challenger") == bad.run.model_version == "2"
    res = CliRunner().invoke(cli(), ["promote", "--min-rows", "15", "--max-sanity-drop", "1"])
    assert res.exit_code == 1, res.output
    assert "refused: APGR challenger" in res.output and "vs champion" in res.output
    numbers = [float(x) for x in res.output.split("refused: APGR challenger ")[1].split(" (gain")[0].split(" vs champion ")]
    assert numbers[0] < numbers[1]
    assert alias_version(c, "champion") == "1"

    # Rollback: back to the bundled model (the champion before version 1), and back again.
    res = CliRunner().invoke(cli(), ["promote", "--rollback"])
    assert res.exit_code == 0, res.output
    assert alias_version(c, "champion") is None and load_estimator("champion").source.startswith("bundled")
    again = rollback()
    assert again.champion_version == "1" and alias_version(c, "champion") == "1"
    assert load_estimator("champion").version == champion.version


@pytest.mark.slow
def test_promote_refuses_a_challenger_that_ranks_the_sanity_suite_worse(data, world):
    """A broken judge fails the on-prem model on obviously easy requests and passes it on obviously hard
    ones (the sanity suite's own single-message pairs with a word added, here on purpose: a challenger built to
    be bad; the suite's own requests are never trained on).
    The challenger learned from that log beats the champion on its held-out traffic, yet ranks the sanity
    pairs far worse: promote refuses it for that alone, and --max-sanity-drop 1 lets it through."""
    fleet, bundled, engine = world
    log = OutcomeLog()
    pairs = [p for p in read_pairs("sanity") if isinstance(p.easy, str) and isinstance(p.hard, str)]
    assert logged(log, engine, bundled, [p.easy for p in pairs], [p.hard for p in pairs], ["{x} Thanks!"], judge=JUDGE) > 300
    bad = train_challenger(log, LabelRules(), fleet, ChallengerConfig(calibration_folds=3, alpha=10.0, warm_start=False),
                           bundled, log_fn=lambda m: None)
    assert bad.run.model_version == "1"
    from pointsman.estimator.registry import client

    res = CliRunner().invoke(cli(), ["promote", "--min-rows", "15", "--json"])
    assert res.exit_code == 1, res.output
    out = json.loads(res.stdout)
    champion, challenger = out["sanity"]["champion"], out["sanity"]["challenger"]
    assert champion["model_version"] == bundled.version and challenger["model_version"] == bad.manifest.version
    assert challenger["concordance"] < champion["concordance"] - 0.02 and champion["n"] == challenger["n"] >= 240
    assert len(out["reasons"]) == 1 and out["reasons"][0].startswith(
        f"sanity concordance challenger {challenger['concordance']:.4f}"), out["reasons"]
    assert f"vs champion {champion['concordance']:.4f}" in out["reasons"][0]
    assert out["challenger"]["apgr"] > out["champion"]["apgr"]  # it did win on its own traffic
    c = client()
    assert alias_version(c, "champion") is None
    run = c.search_runs([c.get_experiment_by_name("pointsman-promotion").experiment_id])[0]
    assert run.data.tags["pointsman.verdict"] == "refused"
    assert run.data.metrics["challenger/sanity_concordance"] == pytest.approx(challenger["concordance"])

    res = CliRunner().invoke(cli(), ["promote", "--min-rows", "15", "--max-sanity-drop", "1"])
    assert res.exit_code == 0, res.output
    assert "ok: sanity concordance challenger" in res.output and alias_version(c, "champion") == "1"


@pytest.mark.slow
def test_compare_keeps_a_trained_conversation_out_when_it_comes_back_later(data, world):
    """A conversation the challenger trained on, logged again after its training data ended (a repeated
    prompt, a later turn: the same conversation key), is not held-out traffic: before, every decision
    logged after ``data_until_s`` counted as held out, so 200 repeats of trained prompts were scored
    beside the 1/5 truly held out, and a model looked better on rows it had learned; with ``--since`` the
    time of the retraining, every one of them counted."""
    fleet, bundled, engine = world
    log = OutcomeLog()
    assert log_traffic(log, engine, bundled) == 200
    res = CliRunner().invoke(cli(), ["train", "--from-outcomes", "--folds", "3", "--json"])
    assert res.exit_code == 0, res.output
    assert log_traffic(log, engine, bundled) == 200  # the same conversations come back

    res = CliRunner().invoke(cli(), ["compare", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    keys = np.array([d.conversation_key for d in log.joined()], dtype=object)
    held = int(holdout_mask(keys).sum())  # the challenger's holdout: fold 0 of 5, seed 0
    assert 0 < held < 400 and held % 2 == 0  # each held-out conversation twice
    assert out["n"] == held and out["excluded"]["trained_on"] == 400 - held, out  # before: n = held / 2 + 200

    times = sorted(d.time_s for d in log.joined())
    since = repr((times[199] + times[200]) / 2)  # only the traffic logged since the challenger was trained
    res = CliRunner().invoke(cli(), ["compare", "--json", "--since", since])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["n"] == held // 2 and out["excluded"]["trained_on"] == 200 - held // 2, out  # before: n = 200


@pytest.mark.slow
def test_train_scores_its_base_only_on_held_out_rows_the_base_did_not_learn(data, world):
    """``train --from-outcomes --seed 1`` on top of a champion trained from the same log with seed 0:
    the new holdout is mostly conversations the champion learned, so its "heldout_base" numbers
    (``held-out APGR ... (base ...)``) scored the champion on its own training rows. Before, all 40
    held-out rows were scored (base APGR as good as on training rows); now only those the champion
    held out too, and the line says on how many."""
    fleet, bundled, engine = world
    log = OutcomeLog()
    assert log_traffic(log, engine, bundled) == 200
    res = CliRunner().invoke(cli(), ["train", "--from-outcomes", "--folds", "3"])
    assert res.exit_code == 0, res.output
    assert promote(log, LabelRules(), fleet, GATE).promoted
    champion = load_estimator("champion")

    res = CliRunner().invoke(cli(), ["train", "--from-outcomes", "--folds", "3", "--seed", "1", "--json"])
    assert res.exit_code == 0, res.output
    metrics = json.loads(res.stdout)
    keys = np.array([d.conversation_key for d in log.joined()], dtype=object)
    held_now, held_before = holdout_mask(keys, seed=1), holdout_mask(keys, seed=0)
    assert metrics["heldout/n"] == held_now.sum() > (held_now & held_before).sum() > 0
    assert metrics["heldout_base/n"] == (held_now & held_before).sum(), metrics  # before: all held_now rows
    ex = logged_examples(log, LabelRules(), fleet)
    clean = holdout_mask(ex.group, seed=1) & holdout_mask(ex.group, seed=0)
    p = champion.predict_matrix(head_matrix(ex.subset(clean), champion).X)
    assert metrics["heldout_base/apgr"] == pytest.approx(apgr(ex.weak_score[clean], ex.strong_score[clean], p))
    assert f"on the {int(clean.sum())} of them the base did not train on" in res.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_loop_against_an_mlflow_server(tmp_path, monkeypatch, world):
    """The same registry operations against ``mlflow server`` (one worker, no job runner)."""
    import httpx

    fleet, bundled, engine = world
    port = _free_port()
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", "MLFLOW_DISABLE_TELEMETRY": "true"}
    store = tmp_path / "server"
    store.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
         "--backend-store-uri", f"sqlite:///{store / 'mlflow.db'}", "--artifacts-destination", str(store / "artifacts")],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "mlflow server did not answer /health"
            time.sleep(0.5)
        monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{port}")
        monkeypatch.setenv("POINTSMAN_DATA_DIR", str(tmp_path / "data"))
        log = OutcomeLog(tmp_path / "outcomes.db")
        log_traffic(log, engine, bundled)
        got = train_challenger(log, LabelRules(), fleet, CFG, bundled, log_fn=lambda m: None)
        assert got.run.tracking_uri == f"http://127.0.0.1:{port}"
        result = promote(log, LabelRules(), fleet, GATE)
        assert result.promoted, result.reasons
        champion = load_estimator("champion")
        assert champion.version == got.manifest.version and champion.source.endswith("(@champion)")
        assert not (tmp_path / "data" / "mlflow.db").exists()  # nothing went to the embedded store
        assert rollback().champion_version is None
        n_features = len(champion.manifest.head.feature_names)
        assert np.isfinite(champion.predict_matrix(np.zeros((1, n_features), dtype=np.float32))).all()
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=15)


@pytest.mark.parametrize("command", ["compare", "promote"])
@pytest.mark.parametrize("uri, says", [
    ("file://{tmp}/mlruns", "MLflow no longer opens a file store; use a database (sqlite:///PATH/mlflow.db)"),
    ("{tmp}/mlruns", "MLflow no longer opens a file store; use a database (sqlite:///PATH/mlflow.db)"),
    ("foo://x", "Model registry functionality is unavailable; got unsupported URI 'foo://x'"),
])
def test_a_tracking_uri_mlflow_cannot_open_is_one_error_line(data, monkeypatch, command, uri, says):
    """``MLFLOW_TRACKING_URI=file:///dir`` (or a bare path) ended ``compare`` and ``promote`` in MLflow's
    traceback, exit 1: MLflow 3 refuses the file store (``MlflowException`` from ``FileStore()``; an unknown
    scheme likewise). Now one ``Error:`` line naming the setting and what to use instead, exit 2."""
    from pointsman.cli.main import main

    OutcomeLog()  # <data dir>/outcomes.db: the log is there, the store is the problem
    uri = uri.format(tmp=data)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    res = CliRunner().invoke(main, [command])
    assert res.exit_code == 2, (res.output, res.exception)
    assert res.output.startswith(f"Error: MLFLOW_TRACKING_URI={uri}: {says}"), res.output
    assert len(res.output.splitlines()) == 1 and not (data / "mlruns").exists()


@pytest.mark.parametrize("flags", [["--encoder", "minilm"], ["--encoder", "static"], ["--eval", "t.csv:w:s"]])
def test_train_from_outcomes_refuses_the_flags_it_does_not_read(tmp_path, flags):
    """``train --from-outcomes`` trains on the encoder of ``--encoder-from`` (the champion's by default)
    and evaluates on held-out logged traffic: ``--encoder minilm`` and ``--eval`` were ignored without a
    word (the challenger kept the static encoder). Now one ``Error:`` line naming them, exit 2, before
    anything is read (the log here does not exist)."""
    from pointsman.cli.main import main

    res = CliRunner().invoke(main, ["train", "--from-outcomes", str(tmp_path / "none.db"), *flags])
    assert res.exit_code == 2, (res.output, res.exception)
    assert res.output.startswith("Error: --from-outcomes trains on the outcome log") and flags[0] in res.output, res.output


def test_train_refuses_an_encoder_with_encoder_from(tmp_path):
    """``--encoder-from DIR`` reuses DIR's encoder and its kind replaced ``--encoder``: ``train --encoder
    minilm --encoder-from estimator/default_model`` trained on the static encoder without a word."""
    from pointsman.cli.main import main

    res = CliRunner().invoke(main, ["train", "--encoder", "minilm", "--encoder-from", str(tmp_path / "model"),
                                    "--no-mlflow", "--output", str(tmp_path / "out")])
    assert res.exit_code == 2, (res.output, res.exception)
    assert res.output == "Error: --encoder-from reuses that model's encoder: give --encoder or --encoder-from, not both\n"


def test_promote_refuses_a_dry_run_rollback(tmp_path, monkeypatch):
    """``promote --rollback`` moved @champion back whatever ``--dry-run`` said (the flag was read by the
    promotion only): a dry run changed the model every service following @champion serves."""
    from pointsman.cli.main import main

    monkeypatch.setenv("POINTSMAN_DATA_DIR", str(tmp_path))
    res = CliRunner().invoke(main, ["promote", "--rollback", "--dry-run"])
    assert res.exit_code == 2, (res.output, res.exception)
    assert res.output == ("Error: --rollback moves @champion back at once; --dry-run applies to a promotion "
                          "only: give one or the other\n")


@pytest.mark.slow
def test_train_from_outcomes_never_trains_on_the_sanity_suites(data, world):
    """Logged traffic that holds the sanity suites' requests (a smoke test through the service, judged like
    the rest) was trained on: a challenger learned 4/5 of the shipped suite's pairs and ``promote`` then
    checked its ranking on them (0.927 -> 0.994 on the pairs it trained on, 0.923 -> 0.923 on those it held
    out, measured through ``serve``). Now a decision whose conversation is a request of either shipped suite
    (``sanity_pairs.jsonl``, ``sanity_holdout_pairs.jsonl``; the conversation key, as the log keeps it) is
    left out of training and of the held-out metrics, and counted in ``data/sanity_excluded``."""
    from pointsman.cli.main import main
    from pointsman.training.sanity import shipped_suite_paths

    fleet, bundled, engine = world
    log = OutcomeLog()
    assert log_traffic(log, engine, bundled) == 200
    suite = [p for f in shipped_suite_paths() for p in read_pairs(f)
             if isinstance(p.easy, str) and isinstance(p.hard, str)]
    assert logged(log, engine, bundled, [p.hard for p in suite], [p.easy for p in suite], ["{x}"], judge=JUDGE) > 600
    out = data / "challenger"
    res = CliRunner().invoke(main, ["train", "--from-outcomes", "--no-warm-start", "--folds", "3", "--json",
                                    "--no-mlflow", "--output", str(out)])
    assert res.exit_code == 0, (res.output, res.exception)
    keys = np.array([d.conversation_key for d in log.joined()], dtype=object)
    in_suite = np.arange(len(keys)) >= 200
    train = ~holdout_mask(keys)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["training"]["n_train"] == int((train & ~in_suite).sum()), manifest["training"]  # before: all of train
    # nor scored among the held-out decisions (before: n_holdout counted the suite's held-out requests too)
    assert manifest["metrics"]["data/sanity_excluded"] == int(in_suite.sum()) > 600
    assert manifest["training"]["n_holdout"] == int((~train & ~in_suite).sum()), manifest["training"]


@pytest.mark.slow
def test_compare_knows_what_a_challenger_trained_on_in_another_log(data, world):
    """``train --from-outcomes OTHER.db`` (another replica's log, last week's copy) and ``compare`` on the live
    log, where the same conversations come back: which conversations a challenger trained on was rebuilt from
    the *compared* log (its rows up to the challenger's data end), so none of these counted and all 200
    decisions, 4/5 of them conversations the challenger had learned, were scored as held out. Now the model
    directory keeps the conversation keys it trained on (``trained_conversations.txt``, its sha256 and count
    in the manifest) and ``compare`` reads them."""
    fleet, bundled, engine = world
    other = OutcomeLog(data / "replica-b.db")
    assert log_traffic(other, engine, bundled) == 200
    res = CliRunner().invoke(cli(), ["train", "--from-outcomes", str(data / "replica-b.db"), "--folds", "3", "--json"])
    assert res.exit_code == 0, res.output
    live = OutcomeLog()  # <data dir>/outcomes.db, what compare and promote read
    assert log_traffic(live, engine, bundled) == 200
    res = CliRunner().invoke(cli(), ["compare", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    held = int(holdout_mask(np.array([d.conversation_key for d in live.joined()], dtype=object)).sum())
    assert 0 < held < 200 and out["n"] == held and out["excluded"]["trained_on"] == 200 - held, out  # before: n = 200


def test_compare_scores_no_request_of_the_sanity_suites(data, world):
    """``compare`` (and so ``promote``'s APGR) scored the logged decisions that are requests of the sanity suites
    as held-out traffic (a challenger never trains on them, so all of them counted as held out): a smoke test of
    the suite through the service, judged like the rest, put its obvious pairs into both models' APGR. They are the sanity check's own pairs, never training or table rows:
    now left out of the comparison and counted (``excluded.sanity_suite``)."""
    from pointsman.cli.main import main
    from pointsman.training.sanity import shipped_suite_paths, suite_requests

    fleet, bundled, engine = world
    log = OutcomeLog()
    assert log_traffic(log, engine, bundled) == 200
    suite = [p for f in shipped_suite_paths() for p in read_pairs(f)
             if isinstance(p.easy, str) and isinstance(p.hard, str)]
    assert logged(log, engine, bundled, [p.hard for p in suite], [p.easy for p in suite], ["{x}"], judge=JUDGE) > 600
    res = CliRunner().invoke(main, ["train", "--from-outcomes", "--no-warm-start", "--folds", "3", "--json"])
    assert res.exit_code == 0, (res.output, res.exception)
    res = CliRunner().invoke(main, ["compare", "--json"])
    assert res.exit_code == 0, (res.output, res.exception)
    out = json.loads(res.stdout)
    keys = np.array([d.conversation_key for d in log.joined()], dtype=object)
    held, in_suite = holdout_mask(keys), suite_requests(keys)
    # the challenger trained on none of them, so each was "held out": before, n was 670, 636 of them the suite's
    assert out["excluded"] == {"trained_on": int((~held & ~in_suite).sum()), "sanity_suite": int(in_suite.sum()),
                               "unscorable": 0} and in_suite.sum() > 600, out["excluded"]
    assert out["n"] == int((held & ~in_suite).sum()), out
