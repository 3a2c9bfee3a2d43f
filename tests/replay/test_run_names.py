"""Every policy given to ``pointsman replay`` gets its own run: two files with the same name in other
folders (two versions of ``default.yaml``), or a file named after a baseline, are both reported."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from pointsman.cli.main import main
from pointsman.policy.rules.compiler import STATIC_POLICY_PATH


def _trace(tmp_path: Path) -> Path:
    trace = tmp_path / "trace.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"2023-11-16 18:15:{i:02d}.0000000,{300 + 7 * i},{40 + i}\n" for i in range(20)))
    return trace


def test_policies_with_the_same_file_name_are_both_replayed(tmp_path: Path):
    """Before: 'replaying 20 requests ... through 1 policies', one row named x (the second file's:
    every request to the frontier), the first silently dropped."""
    text = STATIC_POLICY_PATH.read_text()
    (tmp_path / "v1").mkdir()
    (tmp_path / "v2").mkdir()
    (tmp_path / "v1" / "x.yaml").write_text(text)
    (tmp_path / "v2" / "x.yaml").write_text(text.replace("p_hard_frontier: 0.67", "p_hard_frontier: 0.2"))
    out = tmp_path / "out"
    res = CliRunner().invoke(main, ["replay", str(_trace(tmp_path)), "--policy", str(tmp_path / "v1" / "x.yaml"),
                                    "--policy", str(tmp_path / "v2" / "x.yaml"), "--no-baselines", "--estimator",
                                    "fixed:0.5", "--outcomes", "none", "--out", str(out)])
    assert res.exit_code == 0, res.output
    runs = json.loads((out / "report.json").read_text())["runs"]
    assert sorted(runs) == ["v1/x", "v2/x"], sorted(runs)
    assert runs["v1/x"]["summary"]["frontier_share"] == 0.0
    assert runs["v2/x"]["summary"]["frontier_share"] == 1.0


def test_a_policy_named_like_a_baseline_keeps_its_own_run(tmp_path: Path):
    """A policy file ``random.yaml`` and the ``random`` baseline: before, report.json kept one of them
    under 'random' (the baseline, written last)."""
    (tmp_path / "random.yaml").write_text(STATIC_POLICY_PATH.read_text().replace("p_hard_frontier: 0.67",
                                                                                 "p_hard_frontier: 0.2"))
    out = tmp_path / "out"
    res = CliRunner().invoke(main, ["replay", str(_trace(tmp_path)), "--policy", str(tmp_path / "random.yaml"),
                                    "--estimator", "fixed:0.5", "--outcomes", "none", "--out", str(out)])
    assert res.exit_code == 0, res.output
    runs = json.loads((out / "report.json").read_text())["runs"]
    policy = [name for name, run in runs.items() if run["kind"] == "policy"]
    assert policy == [f"{tmp_path.name}/random"], sorted(runs)
    assert runs[policy[0]]["summary"]["frontier_share"] == 1.0
    assert runs["random"]["kind"] == "baseline"
