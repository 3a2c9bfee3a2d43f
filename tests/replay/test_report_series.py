"""The replay report's time series agree with its summary, through ``pointsman replay``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from pointsman.cli.main import main
from pointsman.policy.rules.compiler import DEFAULT_POLICY_DIR


def tp4_prefill_fleet(tmp_path: Path) -> Path:
    """The packaged fleet with 4-GPU 70B prefill replicas (twice the throughput, as `pointsman plan`'s
    P/TP4 shapes) beside its 2-GPU aggregated and decode ones."""
    doc = yaml.safe_load((Path(DEFAULT_POLICY_DIR).parent / "fleet.yaml").read_text())
    prefill = doc["targets"]["onprem-70b"]["pools"]["prefill"]
    prefill.update(gpus_per_replica=4, prefill_tokens_per_s=2 * prefill["prefill_tokens_per_s"],
                   decode_tokens_per_s=2 * prefill["decode_tokens_per_s"], kv_cache_capacity_tokens=600000)
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@pytest.mark.parametrize("bin_s", [10.0, 2.0])
@pytest.mark.parametrize("tp4_prefill", [False, True])
def test_a_window_shorter_than_its_last_bin_is_billed_for_its_own_seconds(tmp_path, bin_s, tp4_prefill):
    """Three requests over ~5 s, all on-prem (p_hard 0.1). The series' on-prem cost per token times the
    output tokens of each bin adds up to the summary's on-prem cost, and each bin's utilization, weighted
    by its seconds, to the summary's: the last bin holds only the window's end. Before, each bin billed
    (and divided utilization by) a whole bin of the fleet's GPUs: with 10-s bins the one bin read $314/M
    on-prem for a run whose summary is $168/M, its utilization about half the summary's.
    With 4-GPU prefill replicas beside 2-GPU decode ones (tp4_prefill), the series counted each busy
    replica-second at the target's mean GPUs per replica (20/8): with 2-s bins prefill 0.33% and decode
    17.9% against the summary's 0.53% and 14.4%, and the one 10-s bin's on-prem cost $0.08087 against
    the summary's $0.08075 (the decode replicas' busy power at 2.5 GPUs each)."""
    trace = tmp_path / "trace.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 1000, "output_length": 100, "hash_ids": [1, 2]}\n'
                     '{"timestamp": 1000, "input_length": 2000, "output_length": 200, "hash_ids": [3, 4, 5, 6]}\n'
                     '{"timestamp": 2000, "input_length": 1000, "output_length": 100, "hash_ids": [7, 8]}\n')
    out = tmp_path / "out"
    fleet = ["--fleet", str(tp4_prefill_fleet(tmp_path))] if tp4_prefill else []
    res = CliRunner().invoke(main, ["replay", str(trace), *fleet, "--policy", str(DEFAULT_POLICY_DIR / "default.yaml"),
                                    "--no-baselines", "--estimator", "fixed:0.1", "--outcomes", "none",
                                    "--bin-s", str(bin_s), "--out", str(out)])
    assert res.exit_code == 0, res.output
    run = json.loads((out / "report.json").read_text())["runs"]["default"]
    s, series = run["summary"], run["series"]
    assert s["window_s"] % bin_s > 0 and s["frontier_share"] == 0.0
    if tp4_prefill:  # prefilled on the 4-GPU replicas, decoded on 2-GPU ones
        assert s["utilization"]["onprem-70b"]["prefill"] > 0 and s["utilization"]["onprem-70b"]["decode"] > 0
    widths = [min(bin_s, s["window_s"] - t) for t in series["t_s"]]
    if len(widths) == 1:  # every request finishes in the one bin
        assert series["cost_onprem_usd_per_mtok"][0] * s["output_tokens"] / 1e6 == pytest.approx(s["onprem_cost_usd"])
    for phase in ("prefill_utilization", "decode_utilization"):
        busy = sum(u * w for u, w in zip(series[phase], widths))
        assert busy / s["window_s"] == pytest.approx(s[phase], rel=1e-9), phase
