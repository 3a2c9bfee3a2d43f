"""Invariants of `pointsman replay`'s report on any small trace, through the CLI: tokens and spend are
conserved and each derived number is its parts (cost = on-prem + frontier, $/Mtok = cost / output tokens,
on-prem cost = GPU rent over the window + energy, utilization within the provisioned GPU time)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pointsman.cli.main import main
from pointsman.policy.rules.compiler import DEFAULT_POLICY_DIR

FLEET = yaml.safe_load((Path(DEFAULT_POLICY_DIR).parent / "fleet.yaml").read_text())

#: (gap to the previous arrival in ms, prompt tokens, output tokens); prompts up to past the 128k windows
REQUEST = st.tuples(st.integers(0, 3000), st.integers(1, 140_000), st.integers(1, 3000))


def _rent_and_idle() -> tuple[float, float]:
    """(USD per hour of renting the packaged fleet's on-prem GPUs, USD per hour of their idle power)."""
    rent = idle = 0.0
    for t in FLEET["targets"].values():
        for pool in t.get("pools", {}).values():
            n = len(pool["endpoints"]) * pool["gpus_per_replica"]
            rent += n * t["usd_per_gpu_hour"]
            idle += n * t["power_kw_per_gpu"] * 0.1 * t["usd_per_kwh"]  # idle power: 70/700 of busy (docs/replay.md)
    return rent, idle


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(requests=st.lists(REQUEST, min_size=1, max_size=12), p_hard=st.sampled_from([0.05, 0.5, 0.95]))
def test_tokens_and_spend_are_conserved(tmp_path: Path, requests: list[tuple[int, int, int]], p_hard: float) -> None:
    lines, t_ms = [], 0
    for gap, prompt, output in requests:
        t_ms += gap
        lines.append(json.dumps({"timestamp": t_ms, "input_length": prompt, "output_length": output,
                                 "hash_ids": list(range(-(-prompt // 512)))}))
    trace = tmp_path / "trace.jsonl"
    trace.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    res = CliRunner().invoke(main, ["replay", str(trace), "--policy", str(DEFAULT_POLICY_DIR / "default.yaml"),
                                    "--no-baselines", "--estimator", f"fixed:{p_hard}", "--outcomes", "none",
                                    "--out", str(out)])
    assert res.exit_code == 0, res.output
    s = json.loads((out / "report.json").read_text())["runs"]["default"]["summary"]
    n = len(requests)
    assert s["requests"] == n and s["completed"] + s["rejected"] == n
    # every request is accounted for: a completed one by its tokens, a refused one by nothing
    assert s["completed"] == sum(s["target_requests"].values())
    if s["rejected"] == 0:
        assert s["prompt_tokens"] == sum(p for _, p, _ in requests)
        assert s["output_tokens"] == sum(o for _, _, o in requests)
    assert s["prompt_tokens"] <= sum(p for _, p, _ in requests) and s["output_tokens"] <= sum(o for _, _, o in requests)
    # spend: the total is its parts, the price per token is the total over the tokens
    assert s["total_cost_usd"] == pytest.approx(s["onprem_cost_usd"] + s["frontier_cost_usd"])
    if s["output_tokens"]:
        assert s["effective_usd_per_mtok"] == pytest.approx(s["total_cost_usd"] / s["output_tokens"] * 1e6)
    rent, idle = _rent_and_idle()
    window_h = s["window_s"] / 3600
    assert s["window_s"] >= (t_ms - requests[0][0]) / 1000 - 1e-9  # the window holds every arrival
    assert s["onprem_cost_usd"] == pytest.approx((rent + idle) * window_h + s["onprem_busy_energy_usd"])
    # utilization: busy GPU time within the provisioned GPU time, fleet-wide and per target
    assert 0.0 <= s["prefill_utilization"] + s["decode_utilization"] <= 1.0 + 1e-9
    for u in s["utilization"].values():
        assert 0.0 <= u["prefill"] + u["decode"] <= 1.0 + 1e-9
    # busy energy is (busy kW - idle kW) x busy hours: at most every GPU busy the whole window
    top = sum(len(p["endpoints"]) * p["gpus_per_replica"] * t["power_kw_per_gpu"] * 0.9 * t["usd_per_kwh"]
              for t in FLEET["targets"].values() for p in t.get("pools", {}).values()) * window_h
    assert 0.0 <= s["onprem_busy_energy_usd"] <= top * (1 + 1e-9)
    # SLO: over every request, a met one completed
    assert 0.0 <= s["slo_attainment"] <= s["completed"] / n + 1e-12
    if s["window_s"] > 0:
        assert s["goodput_rps"] == pytest.approx(s["slo_attainment"] * n / s["window_s"])
