"""Where a run's quality gap and bills come from (``replay/breakdown.py``), through ``pointsman
replay``: the rows add up to the run, and a rejected request scores 0 in quality (refusing hard
prompts cannot raise a router's quality)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from pointsman.cli.main import main
from pointsman.datasets.sources import get_source
from pointsman.policy.fleet import load_fleet
from pointsman.policy.rules.compiler import STATIC_POLICY_PATH
from pointsman.replay.breakdown import by_rule
from pointsman.replay.fleet_map import sim_fleet
from pointsman.replay.results import ReplayResult, RequestResult
from pointsman.replay.summary import SLO, summarize

WEAK = get_source("alpacaeval_ae1").weak[0]


def test_rule_rows_add_up_to_the_run(tmp_path):
    trace = tmp_path / "trace.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"2023-11-16 18:15:{i:02d}.0000000,{300 + 7 * i},{40 + i}\n" for i in range(40)))
    drafts = tmp_path / "drafts.csv"  # every on-prem draft is a refusal: the cascade escalates them
    drafts.write_text("prompt_id,model,output\n" + "\n".join(
        f"ae{i:03d},{WEAK},\"I'm sorry, but I cannot help with that.\"" for i in range(1, 806)) + "\n")
    out = tmp_path / "out"
    res = CliRunner().invoke(main, ["replay", str(trace), "--policy", str(STATIC_POLICY_PATH), "--no-baselines",
                                    "--estimator", "fixed:0.5", "--drafts", str(drafts), "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "static by deciding rule" in res.output
    run = json.loads((out / "report.json").read_text())["runs"]["static"]
    rows, s = run["by_rule"], run["summary"]
    assert sum(x["requests"] for x in rows) == s["requests"] == 40
    assert {x["rule"] for x in rows} == set(run["rules"])
    assert sum(x["escalated"] for x in rows) == s["escalated"] > 0
    assert sum(x["frontier_usd"] for x in rows) == pytest.approx(s["frontier_cost_usd"])
    assert sum(sum(x["ran_on"].values()) for x in rows) == s["completed"]
    reference = sum(x["reference_quality"] * x["requests"] for x in rows) / 40
    assert sum(x["gap"] for x in rows) == pytest.approx(reference - s["quality"])
    assert sum(x["slo_missed"] for x in rows) == pytest.approx(40 * (1 - s["slo_attainment"]))


def test_a_rejected_request_scores_zero_quality():
    fleet = load_fleet()
    sim = sim_fleet(fleet)

    def request(i: int, rejected: str | None) -> RequestResult:
        done = rejected is None
        return RequestResult(index=i, arrival_s=float(i), prompt_tokens=100, output_tokens=10,
                             routed_target="onprem-70b" if done else None, target="onprem-70b" if done else None,
                             mode="aggregated", replica=0 if done else None, decode_replica=None, frontier=False,
                             spilled=False, rejected=rejected, queue_s=0.0 if done else None,
                             ttft_s=0.1 if done else None, tpot_s=0.01 if done else None, e2e_s=0.2 if done else None,
                             finish_s=i + 0.2 if done else None, prefix_hit_tokens=0, restored_tokens=0,
                             transfer_s=0.0, cost_usd=0.0)

    result = ReplayResult([request(0, None), request(1, "queue_full")], [], sim, 0.0, 2.0, 0, 10.0)
    s = summarize(result, SLO(), lambda r: 0.8)
    assert s.quality == pytest.approx(0.4)  # (0.8 + 0) / 2, not 0.8 over the completed one
    rows = by_rule(result, {0: ("a", "onprem-70b", "aggregated", 0.2), 1: ("b", "", "", None)}, SLO(),
                   lambda r: 0.8, lambda r: 1.0)
    gap = {x.rule: x.gap for x in rows}
    assert gap == {"a": pytest.approx(0.1), "b": pytest.approx(0.5)}
    assert sum(gap.values()) == pytest.approx(1.0 - s.quality)
