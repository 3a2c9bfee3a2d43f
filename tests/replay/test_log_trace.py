"""Pointsman's decision and outcome log as a replay trace (replay.log_trace), and replayed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from pointsman.cli.main import main
from pointsman.errors import DataError
from pointsman.estimator.estimate import FixedDifficulty
from pointsman.outcome_log.store import OutcomeLog, record_decision
from pointsman.policy.engine import RoutingEngine
from pointsman.policy.fleet import load_fleet
from pointsman.policy.rules.compiler import STATIC_POLICY_PATH, load_policy
from pointsman.replay.log_trace import load_log_trace
from pointsman.request import request_from_prompt


def make_log(path: Path, store_prompts: bool) -> list[str]:
    fleet = load_fleet()
    est = FixedDifficulty(0.3)
    engine = RoutingEngine(fleet, load_policy(STATIC_POLICY_PATH, fleet), est)
    ids = []
    with OutcomeLog(path, store_prompts=store_prompts) as log:
        for i, (prompt, out) in enumerate([("What is 2+2?", 12), ("Write a haiku.", 40), ("No outcome.", None),
                                           ("Summarize Hamlet.", 300)]):
            request = request_from_prompt(prompt)
            decision = engine.route(request, dispatch=False)
            record_decision(log, decision, request, est, time_s=1000.0 + 2.5 * i)
            ids.append(decision.decision_id)
            if out is not None:
                log.append_outcomes([{"decision_id": decision.decision_id,
                                      "usage": {"prompt_tokens": 30 + i, "completion_tokens": out},
                                      "quality": {"judge_score": 7}}])
    return ids


def test_logged_decisions_with_outcomes_become_requests(tmp_path: Path) -> None:
    ids = make_log(tmp_path / "log.db", store_prompts=True)
    trace = load_log_trace(tmp_path / "log.db")
    assert trace.skipped == 1  # the decision without outcome, counted
    assert [(r.arrival_s, r.prompt_tokens, r.output_tokens) for r in trace.requests] == [
        (0.0, 30, 12), (2.5, 31, 40), (7.5, 33, 300)]
    assert [r.prompt_id for r in trace.requests] == [ids[0], ids[1], ids[3]]
    assert trace.texts[1] == [{"role": "user", "content": "Write a haiku."}]
    assert trace.quality == [7, 7, 7]
    assert len(load_log_trace(tmp_path / "log.db", limit=2).requests) == 2
    make_log(tmp_path / "private.db", store_prompts=False)
    assert load_log_trace(tmp_path / "private.db").texts == [None, None, None]
    with pytest.raises(DataError, match="no such outcome log"):
        load_log_trace(tmp_path / "absent.db")


def test_replay_cli_reads_an_outcome_log(tmp_path: Path) -> None:
    make_log(tmp_path / "log.db", store_prompts=True)
    res = CliRunner().invoke(main, ["replay", str(tmp_path / "log.db"), "--out", str(tmp_path / "out"),
                                    "--no-baselines"])
    assert res.exit_code == 0, res.output
    assert "default" in res.output and (tmp_path / "out" / "report.html").is_file()
    # the logged judge scores (of what ran then) are reported, not mixed into the policies' quality
    assert "logged judge_score: mean 7.000 over 3 of 3 outcomes" in res.output
    doc = json.loads((tmp_path / "out" / "report.json").read_text())
    assert doc["meta"]["logged_judge_score"].startswith("mean 7.000 over 3 of 3")


def test_replay_says_how_many_logged_decisions_it_left_out(tmp_path: Path) -> None:
    """A decision no outcome reports completion tokens for (never reported; an error without usage)
    cannot be replayed; it was dropped without a word, so replay and plan sized the fleet for less
    traffic than was logged (here 3 of 5 requests). They now warn with the count (the window's)."""
    make_log(tmp_path / "log.db", store_prompts=False)  # 4 decisions, one without an outcome
    fleet = load_fleet()
    engine = RoutingEngine(fleet, load_policy(STATIC_POLICY_PATH, fleet), FixedDifficulty(0.3))
    with OutcomeLog(tmp_path / "log.db") as log:
        request = request_from_prompt("Failed upstream.")
        decision = engine.route(request, dispatch=False)
        record_decision(log, decision, request, FixedDifficulty(0.3), time_s=1010.0)
        log.append_outcomes([{"decision_id": decision.decision_id, "status": "error", "error": "upstream 503"}])
    res = CliRunner().invoke(main, ["replay", str(tmp_path / "log.db"), "--out", str(tmp_path / "out"),
                                    "--no-baselines", "--policy", str(STATIC_POLICY_PATH)])
    assert res.exit_code == 0, res.output
    assert "replaying 3 requests" in res.stderr
    assert "Warning: 2 of the 5 logged decisions in the window have no outcome with a completion token count" \
        in res.stderr, res.stderr  # before: nothing
    res = CliRunner().invoke(main, ["replay", str(tmp_path / "log.db"), "--out", str(tmp_path / "out"),
                                    "--no-baselines", "--policy", str(STATIC_POLICY_PATH), "--end-s", "5"])
    assert res.exit_code == 0, res.output
    assert "replaying 2 requests" in res.stderr and "Warning" not in res.stderr  # the window holds no such one


def test_a_decision_that_produced_no_tokens_is_left_out_and_counted(tmp_path: Path) -> None:
    """An outcome with completion_tokens 0 (an error or a cancelled request) is real traffic no replay can
    size; it was replayed as a 1-token request (the Azure and Mooncake loaders refuse a 0). Now it is left
    out, counted in ``no_output``, and replay warns with the count."""
    make_log(tmp_path / "log.db", store_prompts=False)  # 4 decisions, one without an outcome
    fleet = load_fleet()
    engine = RoutingEngine(fleet, load_policy(STATIC_POLICY_PATH, fleet), FixedDifficulty(0.3))
    with OutcomeLog(tmp_path / "log.db") as log:
        request = request_from_prompt("Cancelled before its first token.")
        decision = engine.route(request, dispatch=False)
        record_decision(log, decision, request, FixedDifficulty(0.3), time_s=1010.0)
        log.append_outcomes([{"decision_id": decision.decision_id, "status": "cancelled",
                              "usage": {"prompt_tokens": 40, "completion_tokens": 0}}])
    trace = load_log_trace(tmp_path / "log.db")
    assert (trace.skipped, trace.no_output) == (1, 1)
    assert [r.output_tokens for r in trace.requests] == [12, 40, 300]  # before: [12, 40, 300, 1]
    res = CliRunner().invoke(main, ["replay", str(tmp_path / "log.db"), "--out", str(tmp_path / "out"),
                                    "--no-baselines", "--policy", str(STATIC_POLICY_PATH)])
    assert res.exit_code == 0, res.output
    assert "replaying 3 requests" in res.stderr
    assert "Warning: 1 of the 5 logged decisions in the window produced 0 completion tokens" in res.stderr, res.stderr


def test_replay_slices_an_outcome_log_by_start_and_end(tmp_path: Path) -> None:
    """--start-s/--end-s (replay and plan) slice an outcome-log trace as they slice Mooncake and Azure (seconds from the
    first record, start <= arrival < end): they were ignored for a *.db, so the whole log replayed."""
    make_log(tmp_path / "log.db", store_prompts=True)  # usable arrivals 0.0, 2.5 and 7.5 s
    res = CliRunner().invoke(main, ["replay", str(tmp_path / "log.db"), "--out", str(tmp_path / "out"),
                                    "--no-baselines", "--policy", str(STATIC_POLICY_PATH),
                                    "--start-s", "1", "--end-s", "7.5"])
    assert res.exit_code == 0, res.output
    assert "over 1 of 1 outcomes" in res.output  # the logged judge scores of the window's one request
    doc = json.loads((tmp_path / "out" / "report.json").read_text())
    assert doc["meta"]["requests"] == 1 and doc["runs"]["static"]["summary"]["requests"] == 1
    sliced = load_log_trace(tmp_path / "log.db", start_s=1.0, end_s=7.5)
    assert [r.arrival_s for r in sliced.requests] == [2.5]  # not rebased, as Mooncake and Azure slices
    assert [r.arrival_s for r in load_log_trace(tmp_path / "log.db", start_s=2.5, limit=1).requests] == [2.5]


def test_another_programs_database_is_refused_and_left_untouched(tmp_path: Path) -> None:
    """A *.db that is not an outcome log (here: a stand-in for MLflow's store, data/mlflow.db beside
    data/outcomes.db) was opened as one: replay, train --from-outcomes, compare and calibrate added the
    log's tables to it and switched it to WAL, then said 'no requests'. Now: one Error line, exit 2,
    the file byte for byte as it was."""
    import sqlite3

    other = tmp_path / "mlflow.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE experiments (experiment_id INTEGER PRIMARY KEY, name TEXT)")
        conn.execute("INSERT INTO experiments VALUES (0, 'Default')")
    conn.close()
    before = other.read_bytes()
    for args in (["replay", str(other), "--no-baselines", "--out", str(tmp_path / "out")],
                 ["train", "--from-outcomes", str(other), "--no-mlflow", "--output", str(tmp_path / "model")]):
        res = CliRunner().invoke(main, args)
        assert res.exit_code == 2, res.output
        assert "not an outcome log (it holds tables experiments)" in res.output
    assert other.read_bytes() == before
    assert not (tmp_path / "mlflow.db-wal").exists()
    make_log(tmp_path / "log.db", store_prompts=False)  # an outcome log still opens
    assert len(load_log_trace(tmp_path / "log.db").requests) == 3
