"""The retraining loop through the service's HTTP API: the service (following
``POINTSMAN_MODEL=champion``, polling fast) logs decisions from ``POST /v1/route`` and
outcomes from ``POST /v1/outcomes`` → ``pointsman train --from-outcomes`` → ``compare`` →
``promote`` → the service swaps to the new champion by itself and new decisions name its
version; then a worse challenger (trained on a log with inverted verdicts, also filled
over HTTP) is refused with both numbers, and the service keeps the champion.

The traffic is synthetic and learnable: questions about mountains are "hard" (the on-prem
model's judged score 0, the frontier's 1), questions about rivers "easy" (both 1).
"""

from __future__ import annotations

import time

import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient

from pointsman.cli.main import main as cli
from pointsman.service.app import create_app
from pointsman.service.settings import Settings

pytestmark = pytest.mark.slow

HARD = ["climb a glacier safely", "acclimatize above 6000 m", "read an avalanche bulletin", "rope up on a ridge",
        "plan a winter ascent", "self-arrest with an ice axe", "cross a crevasse field", "choose crampons",
        "bivouac on a summit", "spot cornices", "use fixed ropes", "descend a scree slope", "train for altitude",
        "navigate a whiteout", "pack for a multi-day traverse", "belay on mixed ground", "estimate rockfall risk",
        "pick a couloir line", "treat altitude sickness", "time a summit push"]
EASY = ["find the source of a river", "measure river flow", "paddle a calm river", "spot otters by a stream",
        "name the longest rivers", "fish in a brook", "read a river map", "picnic by a creek", "skip stones on water",
        "photograph a waterfall", "cross a footbridge", "walk a towpath", "watch herons by the bank",
        "learn about estuaries", "identify river plants", "follow a canal", "draw a river delta",
        "row on a quiet river", "hear a stream at night", "see salmon jump"]
TEMPLATES = ["How do I {x}?", "What is the best way to {x}?", "Give me step by step advice to {x}.",
             "Explain to a beginner how to {x}.", "What mistakes should I avoid when I {x}?"]
JUDGE = "pairwise-judge-0-1"


def send_traffic(c: TestClient, *, inverted: bool = False) -> set[str]:
    """Route every prompt over HTTP and post the judged answers of both tiers (the one the decision
    did not pick as a shadow outcome). Returns the estimator versions the decisions named."""
    versions = set()
    for topics, hard in ((HARD, True), (EASY, False)):
        for x in topics:
            for template in TEMPLATES:
                r = c.post("/v1/route", json={"model": "auto", "temperature": 0.2,
                                              "messages": [{"role": "user", "content": template.format(x=x)}]})
                assert r.status_code == 200, r.text
                d = r.json()
                versions.add(d["estimator_version"])
                fails = hard != inverted
                to_frontier = d["target"].startswith("frontier")
                outcomes = c.post("/v1/outcomes", json=[
                    {"decision_id": d["decision_id"], "outcome_id": d["decision_id"] + "-onprem",
                     "served_target": "onprem-8b", "served_model": "llama-3.1-8b", "shadow": to_frontier,
                     "usage": {"prompt_tokens": 20, "completion_tokens": 200},
                     "quality": {"judge_score": 0.0 if fails else 1.0, "judge": JUDGE}},
                    {"decision_id": d["decision_id"], "outcome_id": d["decision_id"] + "-frontier",
                     "served_target": "frontier-large", "served_model": "gpt-4o", "shadow": not to_frontier,
                     "usage": {"prompt_tokens": 20, "completion_tokens": 200},
                     "quality": {"judge_score": 1.0, "judge": JUDGE}}])
                assert outcomes.status_code == 200 and outcomes.json()["counts"] == {"stored": 2}, outcomes.text
    return versions


def wait_for_version(c: TestClient, predicate, timeout_s: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        health = c.get("/healthz").json()
        if predicate(health["estimator"]):
            return health
        assert time.monotonic() < deadline, f"the service did not swap models: {health}"
        time.sleep(0.1)


def test_retraining_loop_over_http(tmp_path, monkeypatch):
    data = tmp_path / "data"
    monkeypatch.setenv("POINTSMAN_DATA_DIR", str(data))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    settings = Settings(data_dir=data, model="champion", model_poll_interval_s=0.2, watch_policy=False)
    runner = CliRunner()
    with TestClient(create_app(settings)) as c:
        bundled = c.get("/healthz").json()["estimator"]
        assert bundled["available"] and bundled["source"].startswith("bundled")
        assert send_traffic(c) == {bundled["version"]}

        res = runner.invoke(cli, ["train", "--from-outcomes", "--folds", "3", "--json"])
        assert res.exit_code == 0, res.output
        res = runner.invoke(cli, ["compare", "--json"])
        assert res.exit_code == 0, res.output
        # the synthetic mountaineering world asks nothing of the sanity suite (tests/training/test_loop.py tests that gate)
        res = runner.invoke(cli, ["promote", "--min-rows", "15", "--max-sanity-drop", "1"])
        assert res.exit_code == 0, res.output

        health = wait_for_version(c, lambda e: e["source"] == "models:/pointsman-difficulty/1 (@champion)")
        champion = health["estimator"]["version"]
        assert champion != bundled["version"]
        d = c.post("/v1/route", json={"messages": [{"role": "user", "content": "How do I rope up on a ridge?"}]})
        assert d.json()["estimator_version"] == champion
        assert 'pointsman_model_swaps_total{result="ok"} 1.0' in c.get("/metrics").text

    # a worse challenger: the same traffic with inverted verdicts, logged by the service into another log
    bad_log = tmp_path / "inverted.db"
    with TestClient(create_app(settings.model_copy(update={"outcome_log": bad_log}))) as c:
        assert c.get("/healthz").json()["estimator"]["version"] == champion  # starts on the champion
        assert send_traffic(c, inverted=True) == {champion}
        res = runner.invoke(cli, ["train", "--from-outcomes", str(bad_log), "--folds", "3", "--json"])
        assert res.exit_code == 0, res.output
        res = runner.invoke(cli, ["promote", "--min-rows", "15", "--max-sanity-drop", "1"])  # on the service's main log
        assert res.exit_code == 1, res.output
        assert "refused: APGR challenger" in res.output and "vs champion" in res.output
        numbers = res.output.split("refused: APGR challenger ")[1].split(" (gain")[0].split(" vs champion ")
        assert float(numbers[0]) < float(numbers[1])
        time.sleep(0.5)  # a few polls: the alias did not move, the service keeps the champion
        assert c.get("/healthz").json()["estimator"]["version"] == champion
