"""`--slo-ttft-s` / `--slo-tpot-s` of `pointsman replay` and `pointsman plan` set the objectives the
SLO-aware policy routes by, not only the ones the run is scored on: a run with the options is the
run of a fleet file whose service class has those objectives."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from pointsman.cli.main import main
from pointsman.datasets.sources import shared_datasets_dir
from pointsman.errors import DataError
from pointsman.policy.fleet import DEFAULT_FLEET_PATH
from pointsman.policy.rules.compiler import DEFAULT_POLICY_DIR

QUICK = ["--estimator", "fixed:0.3", "--outcomes", "none", "--no-cascade", "--policy", str(DEFAULT_POLICY_DIR / "default.yaml")]


def _conv() -> Path:
    try:
        return shared_datasets_dir() / "azure_llm_2023/AzureLLMInferenceTrace_conv.csv"
    except DataError:
        pytest.skip("shared datasets not found")


def _fleet_with(tmp_path: Path, ttft_s: float, tpot_s: float) -> Path:
    doc = yaml.safe_load(DEFAULT_FLEET_PATH.read_text(encoding="utf-8"))
    doc["slo_classes"]["interactive"].update(ttft_s=ttft_s, tpot_s=tpot_s)
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path


def test_replay_routes_by_the_overridden_objectives(tmp_path: Path) -> None:
    # TPOT 15 ms: the 70B model (about 21 ms a token) is predicted to miss it, so the SLO-aware default sends
    # the requests elsewhere; before, the option reached the scoring alone and the policy kept them on the 70B
    # (0% frontier, 0% SLO, where the fleet file with the same class gave 100% frontier and 80% SLO)
    summaries = []
    for name, extra in (("option", ["--slo-ttft-s", "1.5", "--slo-tpot-s", "0.015"]),
                        ("file", ["--fleet", str(_fleet_with(tmp_path, 1.5, 0.015))])):
        out = tmp_path / name
        res = CliRunner().invoke(main, ["replay", str(_conv()), "--limit", "60", "--no-baselines", *QUICK, *extra,
                                        "--out", str(out)])
        assert res.exit_code == 0, res.output
        doc = json.loads((out / "report.json").read_text())
        assert doc["meta"]["slo"] == "TTFT <= 1.5 s, TPOT <= 0.015 s"
        summaries.append(doc["runs"]["default"]["summary"])
    assert summaries[0]["frontier_share"] > 0
    assert summaries[0] == summaries[1]


def test_plan_writes_and_routes_by_the_overridden_objectives(tmp_path: Path) -> None:
    out = tmp_path / "plan"
    res = CliRunner().invoke(main, ["plan", str(_conv()), "--limit", "40", *QUICK, "--workers", "1",
                                    "--search-requests", "0", "--time-budget-s", "60", "--min-quality-share", "0",
                                    "--tune", "none", "--slo-tpot-s", "0.05", "--out", str(out)])
    assert res.exit_code == 0, res.output
    planned = yaml.safe_load((out / "fleet.yaml").read_text(encoding="utf-8"))
    # the deployed fleet routes by the objectives the plan was made for
    assert planned["slo_classes"]["interactive"]["tpot_s"] == 0.05
    assert planned["slo_classes"]["interactive"]["ttft_s"] == 2.0
