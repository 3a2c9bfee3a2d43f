"""The cascade's verifier in training: ``pointsman evaluate --drafts`` through the CLI on a small
table of answers, and a trained head exported to ONNX and served by ``OnnxVerifier`` with the
same probabilities as scikit-learn."""

from __future__ import annotations

import dataclasses
import json

import click
import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from pointsman.cli.training import register
from pointsman.errors import ModelNotFoundError
from pointsman.estimator.draft import FEATURE_NAMES, Draft, DraftFeatures, draft_features, opening_overlap
from pointsman.estimator.model_source import bundled_model_dir
from pointsman.estimator.verifier import HeuristicVerifier, OnnxVerifier, load_verifier
from pointsman.training import metrics as M
from pointsman.training.verifier import export_verifier, fit_verifier

TOPICS = ["the sea", "prime numbers", "a cat", "Dijkstra's algorithm", "France", "quadratics", "rust traits",
          "tea", "the moon", "sorting"]


@pytest.fixture
def files(tmp_path):
    """40 prompts; the weak model loses exactly where its answer is a refusal or a stub."""
    rows, answers, weak, strong = [], [], [], []
    for i in range(40):
        prompt = f"Tell me something careful and specific about {TOPICS[i % 10]} (case {i})."
        bad = i % 3 == 0
        text = "I'm sorry, but I cannot help with that." if bad and i % 2 else "Yes." if bad else \
            " ".join(f"Point {k}: {TOPICS[(i + k) % 10]} has property {k * i} worth noting." for k in range(12))
        weak.append(0 if bad else 1)
        strong.append(1)
        rows.append(f'p{i},t,"{prompt}",{weak[-1]},{strong[-1]}')
        answers.append(f'p{i},weak-model,"{text}",{len(text)},weak-model')
    table = tmp_path / "t.csv"
    table.write_text("prompt_id,category,prompt,weak-model,strong-model\n" + "\n".join(rows) + "\n")
    drafts = tmp_path / "d.csv"
    drafts.write_text("prompt_id,model,output,output_chars,generator\n" + "\n".join(answers) + "\n")
    return table, drafts, np.array(weak, float), np.array(strong, float)


def test_evaluate_drafts_through_the_cli(files, tmp_path, monkeypatch):
    table, drafts, w, s = files
    monkeypatch.setenv("POINTSMAN_DATA_DIR", str(tmp_path / "data"))
    group = click.Group()
    register(group)
    args = ["evaluate", "--table", str(table), "--weak", "weak-model", "--strong", "strong-model", "--model", "bundled"]
    res = CliRunner().invoke(group, [*args, "--drafts", str(drafts), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["draft_n"] == 40 and len(out["draft_apgr_folds"]) == 5
    # the drafts carry the whole signal (refusals and stubs lose): the verifier finds it, the prompt cannot
    assert out["draft_auc"] > 0.95 and out["draft_heuristic_auc"] > 0.95
    assert out["draft_apgr"] == pytest.approx(M.oracle_apgr(w, s), abs=0.05) and out["prompt_apgr"] < out["draft_apgr"]
    assert 0 < out["draft_cpt80"] <= 0.5
    text = CliRunner().invoke(group, [*args, "--drafts", str(drafts)])
    assert text.exit_code == 0 and "cascade (drafts of weak-model, 40 rows)" in text.output
    # early verification: the first 2 tokens (8 characters) no longer show the refusals
    early = CliRunner().invoke(group, [*args, "--drafts", str(drafts), "--draft-prefix-tokens", "2", "--json"])
    assert early.exit_code == 0, early.output
    cut = json.loads(early.output)
    assert cut["draft_prefix_tokens"] == 2 and out["draft_prefix_tokens"] is None
    assert cut["draft_heuristic_auc"] < out["draft_heuristic_auc"] - 0.1
    alone = CliRunner().invoke(group, [*args, "--draft-prefix-tokens", "2"])
    assert alone.exit_code == 2 and "give --drafts" in alone.output
    bad = CliRunner().invoke(group, [*args, "--drafts", str(drafts).replace("d.csv", "nope.csv")])
    assert bad.exit_code == 2 and "Error:" in bad.output and "nope.csv" in bad.output
    # a row that is a request of the sanity suite (with its draft) is neither scored nor trained on
    suite_table, suite_drafts = tmp_path / "ts.csv", tmp_path / "ds.csv"
    suite_table.write_text(table.read_text() + 'sx,t,"Suggest a name for my cat.",0,1\n')
    suite_drafts.write_text(drafts.read_text() + "sx,weak-model,Whiskers.,9,weak-model\n")
    res = CliRunner().invoke(group, ["evaluate", "--table", str(suite_table), "--weak", "weak-model", "--strong",
                                     "strong-model", "--model", "bundled", "--drafts", str(suite_drafts), "--json"])
    assert res.exit_code == 0, res.output
    with_suite = json.loads(res.output)
    assert with_suite["n"] == with_suite["draft_n"] == 40 and with_suite["sanity_excluded"] == 1
    assert with_suite["draft_apgr"] == out["draft_apgr"] and with_suite["apgr"] == out["apgr"]


def test_drafts_of_an_unknown_model_are_named(files, tmp_path):
    table, drafts, *_ = files
    group = click.Group()
    register(group)
    drafts.write_text(drafts.read_text().replace(",weak-model,", ",weak-modle,"))
    res = CliRunner().invoke(group, ["evaluate", "--table", str(table), "--weak", "weak-model", "--strong",
                                     "strong-model", "--model", "bundled", "--drafts", str(drafts)])
    assert res.exit_code == 2 and "did you mean 'weak-modle'" in res.output


def test_a_trained_head_serves_from_onnx_with_sklearn_parity(tmp_path):
    rng = np.random.default_rng(0)
    texts = ["I'm sorry, I cannot do that.", "Sure. " + "Here is a long and careful answer. " * 20, "Maybe?", ""]
    feats = [draft_features(Draft(text=texts[i % 4], logprobs=tuple(-rng.random(5)) if i % 2 else ()), 30,
                            float(rng.random())) for i in range(80)]
    x = np.stack([f.vector() for f in feats])
    y = np.array([float(f.refusal or f.tokens < 5) for f in feats])
    head = fit_verifier(x, y)
    directory = export_verifier(head, tmp_path / "verifier", {"table": "synthetic", "license": "test"})
    served = load_verifier(directory)
    assert isinstance(served, OnnxVerifier) and served.version.startswith("verifier-")
    np.testing.assert_allclose(served.p_bad_batch(x), head.predict_proba(x.astype(np.float64))[:, 1], atol=1e-5)
    assert served.p_bad(feats[0]) == pytest.approx(float(head.predict_proba(x[:1].astype(np.float64))[0, 1]), abs=1e-5)
    meta = json.loads((directory / "verifier.json").read_text())
    assert meta["features"] == list(FEATURE_NAMES) and meta["provenance"]["license"] == "test"
    with pytest.raises(ValueError):
        fit_verifier(x, np.zeros(len(x)))


def test_train_verifier_writes_a_head_the_service_can_load(files, tmp_path):
    from pointsman.cli.main import main
    from pointsman.outcome_log.store import OutcomeLog

    table, drafts, *_ = files
    out = tmp_path / "head"
    res = CliRunner().invoke(main, ["train-verifier", "--table", str(table), "--weak", "weak-model", "--strong",
                                    "strong-model", "--drafts", str(drafts), "--license", "CC-BY-NC-4.0",
                                    "--output", str(out)])
    assert res.exit_code == 0, res.output
    meta = json.loads(res.output)
    assert meta["rows"] == 40 and meta["use"].startswith("evaluation only")
    head = load_verifier(out)
    refusal = draft_features(Draft(text="I'm sorry, but I cannot help with that."), 20, 0.5)
    answer = draft_features(Draft(text=" ".join(f"Point {k} is worth noting." for k in range(40))), 20, 0.5)
    assert head.p_bad(refusal) > 0.5 > head.p_bad(answer)
    OutcomeLog(tmp_path / "empty.db").close()
    res = CliRunner().invoke(main, ["train-verifier", "--from-outcomes", str(tmp_path / "empty.db"),
                                    "--output", str(tmp_path / "h2")])
    assert res.exit_code == 2 and "no verified draft has a labelled outcome" in res.output
    res = CliRunner().invoke(main, ["train-verifier", "--table", str(table), "--output", str(tmp_path / "h3")])
    assert res.exit_code == 2 and "--drafts" in res.output


def test_caveats_and_list_items_are_counted_and_logged_rows_without_them_still_load():
    lecture = ("I apologize, but I cannot provide that. It is not appropriate to ask; please be respectful. "
               "I hope this helps! Is there anything else?")
    f = draft_features(Draft(text=lecture), 10, 0.5)
    assert f.caveats == 6 and f.list_items == 0
    listed = draft_features(Draft(text="Steps:\n1. Boil water\n2) Add tea\n - stir\n* serve\n3.5 is a number\n-x"), 10, 0.5)
    assert listed.caveats == 0 and listed.list_items == 4
    v = listed.vector()
    assert v.shape == (len(FEATURE_NAMES),) and v[FEATURE_NAMES.index("log_list_items")] == pytest.approx(np.log1p(4))
    assert listed.to_dict()["list_items"] == 4
    old_row = {k: v for k, v in f.to_dict().items() if k not in ("caveats", "list_items", "opening_overlap")}
    assert DraftFeatures(**old_row).vector()[FEATURE_NAMES.index("log_caveats")] == 0.0  # an older version's log row
    assert DraftFeatures(**old_row).vector()[FEATURE_NAMES.index("opening_overlap")] == 0.0
    # the shipped heuristic does not read them: its p_bad is the same with or without them
    heuristic = HeuristicVerifier()
    assert heuristic.p_bad(f) == pytest.approx(heuristic.p_bad(DraftFeatures(**old_row)))


def test_a_head_trained_on_other_features_is_refused_with_how_to_retrain(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.random((40, len(FEATURE_NAMES))).astype(np.float32)
    out = export_verifier(fit_verifier(x, (x[:, 0] > 0.5).astype(float)), tmp_path / "head", {"license": "test"})
    meta = json.loads((out / "verifier.json").read_text())
    (out / "verifier.json").write_text(json.dumps({**meta, "features": list(FEATURE_NAMES[:-1])}))  # an older head
    with pytest.raises(ModelNotFoundError, match="other features.*retrain"):
        load_verifier(out)


def test_opening_overlap_reads_the_first_sentence_against_the_prompt():
    prompt = "What color is the sky?"
    assert opening_overlap("The color of the sky is blue. It scatters light.", prompt) == pytest.approx(4 / 6)
    assert opening_overlap("Thank you for your question! The sky is blue.", prompt) == 0.0  # thanks first
    assert opening_overlap("\n\n  ...Blue! Sky", "blue sky") == 1.0  # blank runs skipped, case folded
    assert opening_overlap("", prompt) == opening_overlap("Blue.", "") == 0.0
    f = draft_features(Draft(text="The sky is blue."), 6, 0.5, prompt)
    assert f.opening_overlap == 0.75 and f.to_dict()["opening_overlap"] == 0.75
    assert f.vector()[FEATURE_NAMES.index("opening_overlap")] == pytest.approx(0.75)
    assert draft_features(Draft(text="The sky is blue."), 6, 0.5).opening_overlap == 0.0  # no prompt: none
    # the shipped heuristic does not read it (heuristic-v2 unchanged)
    assert HeuristicVerifier().p_bad(f) == pytest.approx(HeuristicVerifier().p_bad(dataclasses.replace(f, opening_overlap=0.0)))


@settings(max_examples=60, deadline=None)
@given(text=st.text(max_size=3000), prompt=st.text(max_size=3000))
def test_opening_overlap_is_a_bounded_share_on_any_text(text, prompt):
    """Any draft and prompt: a share in [0, 1], never raising; a draft that opens with the prompt's
    own first sentence scores 1."""
    v = opening_overlap(text, prompt)
    assert 0.0 <= v <= 1.0
    f = draft_features(Draft(text=text), 10, 0.5, prompt)
    assert f.opening_overlap == v and np.isfinite(f.vector()).all()
    assert opening_overlap("Paris" + prompt, "Paris" + prompt) == 1.0


def test_crossvalidated_drafts_read_out_of_fold_p_hard(files, tmp_path, monkeypatch):
    """A model trained on the table itself: with --folds, each draft's p_hard comes from a refit that
    never saw its row, and the verifier's folds are the prompt head's."""
    table, drafts, w, s = files
    monkeypatch.setenv("POINTSMAN_DATA_DIR", str(tmp_path / "data"))
    group = click.Group()
    register(group)
    model = tmp_path / "model"
    res = CliRunner().invoke(group, ["train", "--table", str(table), "--weak", "weak-model", "--strong", "strong-model",
                                     "--encoder-from", str(bundled_model_dir()), "--folds", "2", "--warm-start", "none",
                                     "--no-mlflow", "--output", str(model), "--json"])
    assert res.exit_code == 0, res.output
    args = ["evaluate", "--model", str(model), "--table", str(table), "--weak", "weak-model", "--strong",
            "strong-model", "--folds", "4"]
    res = CliRunner().invoke(group, [*args, "--drafts", str(drafts), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["draft_prompt_scores"] == "out-of-fold" and out["folds"] == 4 and len(out["draft_apgr_folds"]) == 4
    assert out["draft_n"] == 40 and out["draft_auc"] > 0.95 and "fold_apgr" in out
    in_sample = CliRunner().invoke(group, [*args[:-2], "--drafts", str(drafts), "--json"])
    assert json.loads(in_sample.output)["draft_prompt_scores"] == "model"
    text = CliRunner().invoke(group, [*args, "--drafts", str(drafts)])
    assert text.exit_code == 0 and "the same 4 folds, out-of-fold p_hard" in text.output


def test_train_table_with_drafts_carries_a_verifier_head_that_evaluate_uses(files, tmp_path, monkeypatch):
    """``train --table --drafts`` writes the verifier head into the model directory (manifest,
    PROVENANCE.md: a non-commercial table makes it evaluation only); ``evaluate --model DIR --drafts``
    scores with that head and says so; a retrain without --drafts leaves no stale head behind."""
    from pointsman.estimator.verifier import OnnxVerifier, model_verifier

    table, drafts, w, s = files
    monkeypatch.setenv("POINTSMAN_DATA_DIR", str(tmp_path / "data"))
    group = click.Group()
    register(group)
    model = tmp_path / "model"
    train = ["train", "--table", str(table), "--weak", "weak-model", "--strong", "strong-model", "--encoder-from",
             str(bundled_model_dir()), "--folds", "2", "--warm-start", "none", "--no-mlflow", "--output", str(model)]
    res = CliRunner().invoke(group, [*train, "--license", "CC-BY-NC-4.0", "--drafts", str(drafts), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["verifier/rows"] == 40
    head = model_verifier(model)
    assert isinstance(head, OnnxVerifier) and isinstance(load_verifier(model), OnnxVerifier)  # POINTSMAN_VERIFIER=DIR
    record = json.loads((model / "manifest.json").read_text())["training"]["verifier"]
    assert record["version"] == head.version and record["rows"] == 40 and record["positives"] == int((w < s).sum())
    assert record["p_hard"] == "out-of-fold" and record["pairs"] == [["weak-model", "strong-model"]]
    assert record["use"].startswith("evaluation only") and record["parity_max_abs"] < 1e-4
    provenance = (model / "PROVENANCE.md").read_text()
    assert "## Verifier head" in provenance and f"`{head.version}`" in provenance
    assert "**Not for shipping:** the verifier head was trained on CC-BY-NC-4.0 data" in provenance

    args = ["evaluate", "--model", str(model), "--table", str(table), "--weak", "weak-model", "--strong",
            "strong-model", "--drafts", str(drafts)]
    res = CliRunner().invoke(group, [*args, "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["verifier"] == "head" and out["verifier_version"] == head.version and out["verifier_in_sample"]
    assert out["draft_n"] == 40 and out["draft_auc"] > 0.95 and len(out["draft_apgr_folds"]) == 5
    assert out["draft_apgr"] == pytest.approx(M.oracle_apgr(w, s), abs=0.05)
    text = CliRunner().invoke(group, args)
    assert text.exit_code == 0 and f"the model's verifier head {head.version} (in sample" in text.output
    cv = json.loads(CliRunner().invoke(group, [*args, "--folds", "2", "--json"]).output)
    assert cv["verifier"] == "cv-head" and not cv["verifier_in_sample"]  # refitted per fold: it saw every row

    res = CliRunner().invoke(group, [*train, "--json"])  # the same directory, no drafts this time
    assert res.exit_code == 0, res.output
    assert model_verifier(model) is None and not (model / "verifier.onnx").exists()
    assert "verifier" not in json.loads((model / "manifest.json").read_text())["training"]
    out = json.loads(CliRunner().invoke(group, [*args, "--json"]).output)
    assert out["verifier"] == "cv-head" and not out["verifier_in_sample"]


def test_train_drafts_need_a_table_and_answers_of_the_weak_column(files, tmp_path, monkeypatch):
    table, drafts, *_ = files
    monkeypatch.setenv("POINTSMAN_DATA_DIR", str(tmp_path / "data"))
    group = click.Group()
    register(group)
    res = CliRunner().invoke(group, ["train", "--drafts", str(drafts), "--no-mlflow", "--output", str(tmp_path / "m")])
    assert res.exit_code == 2 and "--drafts needs --table PATH" in res.output and "Traceback" not in res.output
    assert len(res.output.strip().splitlines()) == 1
    drafts.write_text(drafts.read_text().replace(",weak-model,", ",weak-modle,"))
    res = CliRunner().invoke(group, ["train", "--table", str(table), "--weak", "weak-model", "--strong", "strong-model",
                                     "--encoder-from", str(bundled_model_dir()), "--folds", "2", "--warm-start", "none",
                                     "--drafts", str(drafts), "--no-mlflow", "--output", str(tmp_path / "m")])
    assert res.exit_code == 2 and "did you mean 'weak-modle'" in res.output and "Traceback" not in res.output


def test_undefined_apgr_and_a_fold_without_losses_are_error_lines(files, tmp_path, monkeypatch):
    """Review finding 7: where the strong model is not better on the rows with drafts the APGR is undefined:
    one Error: line (it was a traceback), as is a fold whose verifier has no lost draft to learn from."""
    table, drafts, _, _ = files
    monkeypatch.setenv("POINTSMAN_DATA_DIR", str(tmp_path / "data"))
    group = click.Group()
    register(group)
    tie = tmp_path / "tie.csv"  # the weak model wins every prompt: no gap to recover
    tie.write_text("\n".join(line.rsplit(",", 2)[0] + ",1,1" if i else line
                             for i, line in enumerate(table.read_text().splitlines())) + "\n")
    args = ["evaluate", "--table", str(tie), "--weak", "weak-model", "--strong", "strong-model", "--model", "bundled"]
    res = CliRunner().invoke(group, [*args, "--drafts", str(drafts), "--json"])
    assert res.exit_code == 2 and "Error:" in res.output and "not better than weak" in res.output, res.output
    one_loss = tmp_path / "one.csv"  # one lost prompt: some fold's verifier has no lost draft to learn from
    lines = tie.read_text().splitlines()
    lines[1] = lines[1].rsplit(",", 2)[0] + ",0,1"
    one_loss.write_text("\n".join(lines) + "\n")
    res = CliRunner().invoke(group, [*args[:2], str(one_loss), *args[3:], "--drafts", str(drafts), "--json"])
    assert res.exit_code == 2 and "Error:" in res.output and "lost and drafts that did not" in res.output, res.output


@settings(max_examples=40, deadline=None)
@given(text=st.text(min_size=0, max_size=3000), n=st.integers(1, 400), p_hard=st.floats(0, 1))
def test_a_prefix_scores_as_a_typical_length_answer_and_a_whole_draft_as_it_is(text, n, p_hard):
    """Early verification: ``draft_prefix`` cuts an answer to its first N tokens (4N characters,
    partial) or keeps it whole; the heuristic reads a partial draft's length as a 150-token answer,
    so a prefix of the same text scores the same whatever N (its markers permitting), and a whole
    draft scores as before (v1)."""
    from pointsman.estimator.draft import draft_prefix
    from pointsman.estimator.verifier import PREFIX_REFERENCE_TOKENS

    d = draft_prefix(text, n)
    heuristic = HeuristicVerifier()
    if len(text) > 4 * n:
        assert d.partial and d.text == text[: 4 * n] and d.completion_tokens == n and d.finish_reason == ""
        f = draft_features(d, 100, p_hard)
        same_text_other_n = dataclasses.replace(f, tokens=7 * n + 3)
        assert heuristic.p_bad(f) == pytest.approx(heuristic.p_bad(same_text_other_n))
        whole_like = dataclasses.replace(f, partial=False, tokens=PREFIX_REFERENCE_TOKENS)
        assert heuristic.p_bad(f) == pytest.approx(heuristic.p_bad(whole_like))
    else:
        assert d == Draft(text=text, finish_reason="stop")
        f = draft_features(d, 100, p_hard)
        longer = dataclasses.replace(f, tokens=f.tokens + 100)
        assert heuristic.p_bad(longer) < heuristic.p_bad(f)  # a longer whole answer passes more


def test_train_verifier_from_outcomes_reads_the_frontier_tier_of_the_configured_fleet(tmp_path, monkeypatch):
    """``train-verifier --from-outcomes`` labels drafts by the frontier tier of the fleet, and read the
    packaged one whatever POINTSMAN_FLEET_PATH said: on a fleet whose frontier target is ``gpt-big`` its
    judged answers counted as on-prem ones, so no draft had a label ("no verified draft has a labelled
    outcome"). Decisions, drafts and outcomes go through the service on that fleet."""
    from fastapi.testclient import TestClient

    from pointsman.cli.main import main
    from pointsman.estimator.estimate import FixedDifficulty
    from pointsman.policy.engine import RoutingEngine
    from pointsman.policy.fleet import DEFAULT_FLEET_PATH, load_fleet
    from pointsman.policy.rules.compiler import load_policy
    from pointsman.service.app import create_app
    from pointsman.service.bootstrap import build_state
    from pointsman.service.settings import Settings

    fleet_path, policy_path = tmp_path / "fleet.yaml", tmp_path / "policy.yaml"
    fleet_path.write_text(DEFAULT_FLEET_PATH.read_text().replace("\n  frontier-large:\n", "\n  gpt-big:\n"))
    policy_path.write_text("apiVersion: pointsman/v1\nkind: RoutingPolicy\nmetadata: {name: drafts}\n"
                           "rules:\n  - name: default\n    route: {target: onprem-8b}\n"
                           "verify:\n  rules:\n    - name: accept\n      action: accept\n")
    fleet = load_fleet(fleet_path)
    s = Settings(data_dir=tmp_path, fleet_path=fleet_path, policy_path=policy_path, watch_policy=False,
                 watch_fleet=False, scrape_interval_s=0)
    engine = RoutingEngine(fleet, load_policy(policy_path, fleet), FixedDifficulty(0.3), state=build_state(s, fleet))
    with TestClient(create_app(s, engine=engine, owns_engine=True)) as client:
        for i in range(8):
            d = client.post("/v1/route", json={"model": "auto", "messages": [{"role": "user", "content": f"Question {i}"}]}).json()
            draft = "I'm sorry, but I cannot help with that." if i % 2 else f"Answer {i}: " + "a full answer. " * 20
            assert client.post("/v1/verify", json={"decision_id": d["decision_id"], "draft": {"text": draft}}).status_code == 200
            usage = {"prompt_tokens": 10, "completion_tokens": 20}
            acks = client.post("/v1/outcomes", json=[
                {"decision_id": d["decision_id"], "status": "ok", "usage": usage, "quality": {"judge_score": 1.0 - i % 2}},
                {"decision_id": d["decision_id"], "shadow": True, "served_target": "gpt-big", "status": "ok",
                 "usage": usage, "quality": {"judge_score": 1.0}}]).json()["acks"]
            assert [a["status"] for a in acks] == ["stored", "stored"], acks
    monkeypatch.setenv("POINTSMAN_FLEET_PATH", str(fleet_path))
    res = CliRunner().invoke(main, ["train-verifier", "--from-outcomes", str(tmp_path / "outcomes.db"),
                                    "--output", str(tmp_path / "head")])
    assert res.exit_code == 0, res.output
    assert (json.loads(res.output)["rows"], json.loads(res.output)["positives"]) == (8, 4)
