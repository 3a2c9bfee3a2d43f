"""`pointsman plan` end to end on a small synthetic trace with a known answer: a prefill-heavy
load that one prefill replica cannot serve within the TTFT objective and two can. The plan must
find a shape with the larger prefill pool, never recommend a dominated shape, write a fleet file
that passes `pointsman policy check`, and `pointsman replay` on that file must reproduce the
planner's numbers. Also: bad input, and the search's time budget."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from pointsman.cli.main import main
from pointsman.datasets.traces import load_trace
from pointsman.estimator.estimate import FixedDifficulty
from pointsman.plan.evaluate import PlanInputs, Workers
from pointsman.plan.search import busiest_window, search
from pointsman.plan.shapes import ShapeSpace
from pointsman.policy.fleet import load_fleet
from pointsman.policy.rules.compiler import DEFAULT_POLICY_DIR
from pointsman.replay.fleet_map import sim_fleet
from pointsman.replay.summary import SLO
from tests.plan.conftest import write_trace

pytestmark = pytest.mark.usefixtures("plan_files")


def _plan(tmp_path: Path, fleet: Path, policy: Path, trace: Path, *extra: str) -> tuple[dict, str]:
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["plan", str(trace), "--fleet", str(fleet), "--policy", str(policy),
                                       "--estimator", "fixed:0.2", "--outcomes", "none", "--max-replicas", "3",
                                       "--out", str(out), *extra])
    assert result.exit_code == 0, result.output
    return json.loads((out / "plan.json").read_text()), result.output


def _planned_month(summary: dict, span_s: float, rec: dict) -> tuple[float, float]:
    """(USD per month, USD per 1M output tokens) of a replayed window as the plan prices a month of
    the shape ``rec`` (plan.json) (plan.evaluate): its time (GPU rent, idle power) scaled by the
    window, its work (frontier bills, busy power, output tokens) by ``span_s``, the span of the
    arrivals, a pool's busy power for at most the span (the replay's busy share of one on-prem target's
    GPU time: its prefill and decode phases are its P/D pools, or both its aggregated pool; a pool's
    replicas equally busy); plus the KV tier."""
    month_s = 730 * 3600
    (name, u), = summary["utilization"].items()  # one on-prem target, all its GPUs of one kind
    p = rec["pools"][name]
    if p["aggregated"]:
        assert not p["prefill"]
        pools = [(u["prefill"] + u["decode"], 1.0)]
    else:
        pf, dc = p["prefill"] * p["prefill_tp"], p["decode"]
        pools = [(u["prefill"], pf / (pf + dc)), (u["decode"], dc / (pf + dc))]
    # per pool, (busy share of the target's GPU time, the pool's share of its GPUs)
    busy_share = sum(b for b, _ in pools)
    capped = sum(min(b, g * span_s / summary["window_s"]) for b, g in pools) / busy_share if busy_share else 1.0
    busy = summary["onprem_busy_energy_usd"]
    usd = ((summary["onprem_cost_usd"] - busy) * month_s / summary["window_s"]
           + (busy * capped + summary["frontier_cost_usd"]) * month_s / span_s + rec["kv_usd_per_month"])
    return usd, usd / (summary["output_tokens"] * month_s / span_s) * 1e6


def _span_s(trace: Path, limit: int | None = None) -> float:
    requests = load_trace(trace, limit=limit)
    return requests[-1].arrival_s - requests[0].arrival_s


def test_prefill_heavy_load_gets_a_larger_prefill_pool(tmp_path: Path, plan_files: tuple[Path, Path]) -> None:
    fleet, policy = plan_files
    trace = write_trace(tmp_path / "trace.jsonl", n=160, rate_rps=10, prompt_tokens=8192, output_tokens=32)
    # the search runs on the busiest 80 requests, the candidates then on all 160 (two worker processes)
    report, output = _plan(tmp_path, fleet, policy, trace, "--scale", "1,2", "--workers", "2", "--search-requests", "80")
    base, rec = report["base"], report["recommended"]
    # the base fleet (1 prefill + 2 decode replicas) misses the goal: prefill is the bottleneck
    assert base["pools"]["small"] == {"aggregated": 0, "prefill": 1, "decode": 2, "kv_level": 0, "prefill_tp": 1,
                                      "max_num_batched_tokens": 0}
    assert base["slo_attainment"] < 0.9
    assert rec is not None and rec["slo_attainment"] >= 0.9
    # more prefill GPUs: more prefill replicas, or wider ones (tensor parallelism)
    assert rec["pools"]["small"]["prefill"] * rec["pools"]["small"]["prefill_tp"] >= 2
    assert rec["requests"] == 160 and all(r["requests"] == 80 for r in report["evaluated"])
    # never a dominated shape: nothing replayed on the whole trace meets the goal for less, and the
    # shape is on the search's Pareto front
    whole = report["whole_trace"]
    assert any(r["label"] == rec["label"] for r in whole)
    assert all(r["usd_per_month"] >= rec["usd_per_month"] for r in whole if r["slo_attainment"] >= 0.9)
    assert rec["label"] in [r["label"] for r in report["front"]]
    on_window = next(r for r in report["evaluated"] if r["label"] == rec["label"])
    assert not any(r["usd_per_month"] <= on_window["usd_per_month"] and r["slo_attainment"] >= on_window["slo_attainment"]
                   and (r["usd_per_month"], r["slo_attainment"]) != (on_window["usd_per_month"], on_window["slo_attainment"])
                   for r in report["evaluated"])  # (a step budget the policy never uses replays the same: a tie)
    assert f"recommended: {rec['label']}" in output
    assert report["growth"][rec["label"]]["2"]["scale"] == 2.0

    # the written fleet passes `pointsman policy check` with the policy it was planned with
    fleet_file = tmp_path / "out" / "fleet.yaml"
    check = CliRunner().invoke(main, ["policy", "check", "--fleet", str(fleet_file), str(policy)])
    assert check.exit_code == 0, check.output

    # and its meta.reproduce command replays the planner's numbers
    reproduce = report["meta"]["reproduce"]
    assert "reproduce" in fleet_file.read_text()
    args = shlex.split(reproduce)[1:] + ["--out", str(tmp_path / "replay")]
    replayed = CliRunner().invoke(main, args)
    assert replayed.exit_code == 0, replayed.output
    summary = json.loads((tmp_path / "replay" / "report.json").read_text())["runs"]["policy"]["summary"]
    assert summary["slo_attainment"] == pytest.approx(rec["slo_attainment"])
    # a month of the replayed window (160 arrivals at 10/s: 0 to 15.9 s)
    assert _planned_month(summary, 15.9, rec) == pytest.approx(
        (rec["usd_per_month"], rec["usd_per_mtok"]), rel=1e-9)
    assert summary["ttft_p99_s"] == pytest.approx(rec["ttft_p99_s"])


@pytest.mark.parametrize("extra, message", [
    (["--scale", "1,x"], "--scale '1,x'"),
    (["--gpus", "B300"], "unknown GPU 'B300'"),
    (["--slo-class", "batch"], "'batch' is not a service class"),
    (["--seed", "-1"], "'--seed': -1 is not in the range x>=0"),  # before: numpy's ValueError, a traceback
    (["--end-s", "nan"], "'--end-s': 'nan' is not a finite number"),  # before: taken as no end
    (["--gpu-price", "H200-SXM=2"], "--gpu-price: H200-SXM is not among the other GPU types considered (none)"),
    (["--gpu-price", "H100-SXM=1.25"], "--gpu-price: H100-SXM is the base fleet's GPU"),
    (["--gpus", "H200-SXM", "--gpu-price", "H200-SXM=0"], "H200-SXM: expected a positive number of USD"),
    (["--gpus", "H200-SXM", "--gpu-price", "H200-SXM=inf"], "H200-SXM: expected a positive number of USD"),
    (["--gpus", "H200-SXM", "--gpu-price", "H200-SXM"], "'H200-SXM': expected GPU=USD per GPU-hour"),
    (["--gpus", "H200-SXM", "--gpu-price", "H200-SXM=2", "--gpu-price", "H200-SXM=3"], "H200-SXM is priced twice"),
])
def test_bad_input_is_one_error_line(tmp_path: Path, plan_files: tuple[Path, Path], extra: list[str],
                                     message: str) -> None:
    fleet, policy = plan_files
    trace = write_trace(tmp_path / "trace.jsonl", n=4, rate_rps=1, prompt_tokens=512, output_tokens=4)
    result = CliRunner().invoke(main, ["plan", str(trace), "--fleet", str(fleet), "--policy", str(policy),
                                       "--estimator", "fixed:0.2", "--outcomes", "none",
                                       "--out", str(tmp_path / "o"), *extra])
    assert result.exit_code == 2
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and message in errors[0], result.output
    assert "Traceback" not in result.output


def test_a_plan_at_a_traffic_scale_is_reproduced_at_that_scale(tmp_path: Path, plan_files: tuple[Path, Path]) -> None:
    """Planned at x2 (--scale 2,3), the recommendation's SLO attainment, TTFT p99 and cost are those of
    the trace at twice its rate; its reproduce command replayed the trace at its own rate ('# at the
    trace's own rate; planned at x2'), so the fleet file's "Reproduce the numbers with" did not: 80
    Poisson arrivals at 6/s of 8,192-token prompts, recommended 'small A0 P3 D1' with TTFT p99 0.497 s
    at x2, replayed 0.242 s. `pointsman replay --scale` replays the planned rate."""
    import random

    fleet, policy = plan_files
    rng, t, lines = random.Random(1), 0.0, []
    for i in range(80):
        t += rng.expovariate(6.0)
        lines.append(json.dumps({"timestamp": int(t * 1000), "input_length": 8192, "output_length": 32,
                                 "hash_ids": list(range(i * 16, i * 16 + 16))}))
    trace = tmp_path / "trace.jsonl"
    trace.write_text("\n".join(lines) + "\n", encoding="utf-8")
    report, output = _plan(tmp_path, fleet, policy, trace, "--scale", "2,3", "--workers", "1", "--max-replays", "30")
    rec = report["recommended"]
    # no outcome rows: no quality, said so (before: "quality nan" in the recommendation and the fleet file)
    assert "quality n/a" in output and "nan" not in output and "nan" not in (tmp_path / "out" / "fleet.yaml").read_text()
    assert rec is not None and rec["scale"] == 1.0  # the plan's own scale: x2 of the trace
    reproduce = shlex.split(report["meta"]["reproduce"])[1:]
    assert reproduce[reproduce.index("--scale") + 1] == "2.0"  # before: no --scale, a comment
    replayed = CliRunner().invoke(main, [*reproduce, "--out", str(tmp_path / "replay")])
    assert replayed.exit_code == 0, replayed.output
    doc = json.loads((tmp_path / "replay" / "report.json").read_text())
    summary = doc["runs"]["policy"]["summary"]
    assert doc["meta"]["scale"] == 2.0
    assert summary["slo_attainment"] == pytest.approx(rec["slo_attainment"])
    assert summary["ttft_p99_s"] == pytest.approx(rec["ttft_p99_s"])  # before: 0.242 s replayed, 0.497 planned
    assert summary["tpot_p99_s"] == pytest.approx(rec["tpot_p99_s"])
    assert _planned_month(summary, _span_s(trace) / 2, rec) == pytest.approx(
        (rec["usd_per_month"], rec["usd_per_mtok"]), rel=1e-9)


def test_bad_trace_is_one_error_line(tmp_path: Path, plan_files: tuple[Path, Path]) -> None:
    fleet, policy = plan_files
    trace = tmp_path / "trace.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": "many"}\n', encoding="utf-8")
    result = CliRunner().invoke(main, ["plan", str(trace), "--fleet", str(fleet), "--policy", str(policy),
                                       "--estimator", "fixed:0.2", "--outcomes", "none", "--out", str(tmp_path / "o")])
    assert result.exit_code == 2
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "trace.jsonl" in errors[0], result.output



def test_a_trace_no_shape_can_serve_at_one_instant_is_one_error_line(tmp_path: Path,
                                                                      plan_files: tuple[Path, Path]) -> None:
    """One arrival too long for every context window: nothing is served and the replay window is
    0 s, so no shape has a monthly cost (the planner used to price every shape at $nan/month and
    search until its time budget)."""
    fleet, policy = plan_files
    trace = tmp_path / "trace.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 1000000000, "output_length": 5}\n', encoding="utf-8")
    result = CliRunner().invoke(main, ["plan", str(trace), "--fleet", str(fleet), "--policy", str(policy),
                                       "--estimator", "fixed:0.2", "--outcomes", "none", "--out", str(tmp_path / "o")])
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "its one request arrives at one instant" in errors[0], result.output
    assert "nan" not in result.output


@pytest.mark.parametrize("requests", [1, 3])
def test_a_trace_without_an_arrival_rate_is_one_error_line(tmp_path: Path, plan_files: tuple[Path, Path],
                                                           requests: int) -> None:
    """A month is priced by the trace's arrival rate; requests at one instant have none. One request
    (512 prompt, 4 output tokens) was planned as if it came again the moment its replay window ended,
    all month: 'recommended: small A0 P1 D1: $3,741/month ... $8.58/M output tokens' (three: $5.26/M),
    from no rate at all."""
    fleet, policy = plan_files
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": 5, "input_length": 512, "output_length": 4, "hash_ids": [i]}) + "\n"
                             for i in range(requests)), encoding="utf-8")
    result = CliRunner().invoke(main, ["plan", str(trace), "--fleet", str(fleet), "--policy", str(policy),
                                       "--estimator", "fixed:0.2", "--outcomes", "none", "--out", str(tmp_path / "o")])
    assert result.exit_code == 2, result.output  # before: 0, and a recommended fleet
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "at one instant: no arrival rate" in errors[0], result.output
    assert "recommended" not in result.output and not (tmp_path / "o" / "fleet.yaml").exists()


def test_a_plan_that_meets_nothing_exits_1_and_leaves_no_fleet_file(tmp_path: Path, plan_files: tuple[Path, Path]) -> None:
    """A TTFT objective no shape can meet: the plan reported 'no shape ... meets' and exited 0, and the
    fleet.yaml an earlier plan had written into --out stayed there, read as this plan's recommendation."""
    fleet, policy = plan_files
    trace = write_trace(tmp_path / "trace.jsonl", n=8, rate_rps=2, prompt_tokens=1024, output_tokens=8)
    out = tmp_path / "out"
    out.mkdir()
    (out / "fleet.yaml").write_text("# an earlier plan's recommendation\n")
    result = CliRunner().invoke(main, ["plan", str(trace), "--fleet", str(fleet), "--policy", str(policy),
                                       "--estimator", "fixed:0.2", "--outcomes", "none", "--max-replicas", "1",
                                       "--workers", "1", "--slo-ttft-s", "0.000001", "--out", str(out)])
    assert result.exit_code == 1, result.output
    assert "no shape replayed on the whole trace meets 90% SLO attainment" in result.output
    assert json.loads((out / "plan.json").read_text())["recommended"] is None
    assert not (out / "fleet.yaml").exists()


def test_the_time_budget_stops_the_search_with_the_best_so_far(tmp_path: Path, plan_files: tuple[Path, Path]) -> None:
    fleet_path, policy = plan_files
    trace = write_trace(tmp_path / "trace.jsonl", n=24, rate_rps=2, prompt_tokens=1024, output_tokens=8)
    fleet = load_fleet(fleet_path)
    kv = {t.name: t.replica.kv_bytes_per_token for t in sim_fleet(fleet).on_prem}
    space = ShapeSpace.of(yaml.safe_load(fleet_path.read_text()), fleet, kv, max_replicas=3)
    inputs = PlanInputs(load_trace(trace), None, None, policy, SLO(2.0, 0.1), "interactive", space)
    with Workers({"search": inputs, "full": inputs}, lambda: FixedDifficulty(0.2), 1) as workers:
        found = search(space, inputs, workers, goal=0.9, deadline=0.0)  # already over
    # the starts are replayed, nothing more: the best so far stands (the base with wider prefill
    # replicas is pruned: the base meets the goal for less)
    assert found.stopped == "time budget"
    assert {space.label(s) for s in found.results} == {"small A0 P1 D2", "small A0 P1 D1", "small A0 P1/TP2 D1"}
    assert found.pruned_cost >= 1
    assert all(r.slo_attainment >= 0.9 for r in found.results.values())  # a light load


def test_other_gpus_are_priced_at_your_quote_and_the_report_says_whose_price(tmp_path: Path,
                                                                             plan_files: tuple[Path, Path]) -> None:
    """--gpu-price H200-SXM=1.25: the H200 shapes pay $1.25 per GPU-hour instead of the $3.50 list price
    (there was no way to give one), A100 stays at list, and the report says which is whose."""
    fleet, policy = plan_files
    trace = write_trace(tmp_path / "trace.jsonl", n=8, rate_rps=2, prompt_tokens=1024, output_tokens=8)
    report, output = _plan(tmp_path, fleet, policy, trace, "--workers", "1", "--gpus", "H200-SXM,A100-SXM-80GB",
                           "--gpu-price", "H200-SXM=1.25", "--max-replays", "20")
    assert report["meta"]["gpu_prices"] == {"H100-SXM": {"usd_per_gpu_hour": 2.5, "source": "fleet file"},
                                            "H200-SXM": {"usd_per_gpu_hour": 1.25, "source": "yours"},
                                            "A100-SXM-80GB": {"usd_per_gpu_hour": 1.49, "source": "list"}}
    assert ("GPU prices: H100-SXM $2.50/GPU-hour (fleet file), H200-SXM $1.25/GPU-hour (yours), "
            "A100-SXM-80GB $1.49/GPU-hour (list)") in output
    h200 = [r for r in report["evaluated"] if r["gpu"] == "H200-SXM"]
    assert h200  # one GPU swap from the base is among the first neighbours
    for r in h200:  # rent at $1.25 plus at most the busy power (1.275 kW at $0.1/kWh) per GPU
        assert r["gpus"] * 1.25 * 730 <= r["onprem_usd_per_month"] <= r["gpus"] * (1.25 + 0.1275) * 730 + 1e-6
    assert "H200-SXM" in (tmp_path / "out" / "plan.txt").read_text()


def test_a_search_stopped_early_says_which_fleets_it_left_untuned_and_unexpanded(tmp_path: Path) -> None:
    """Azure conv, 40 requests, every prompt hard (the cap alone decides how many go to the large tier),
    stopped after 12 replays (--max-replays: the same stop on any machine; the whole search takes 32).
    The recommended fleet (2 GPUs) was reached by a neighbour move carrying a cap, and the stop came before
    its cap was bisected against the floor; the full search recommends a cheaper shape. Before, the
    report said only "search time budget" (a tester's 200 s plan recommended twice what 720 s did), and
    there was no stop that did not depend on the machine's speed."""
    out = tmp_path / "out"
    res = _plan_all_large(tmp_path, out, "--max-replicas", "2", "--min-quality-share", "0.97", "--tune",
                          "hard_prompt_max_usd=c0.1,c0.3,c0.5,c0.7,c0.9", "--max-replays", "12",
                          "--time-budget-s", "3600")
    assert res.exit_code == 0, res.output
    report = json.loads((out / "plan.json").read_text())
    meta, rec, order = report["meta"], report["recommended"], [r["label"] for r in report["evaluated"]]
    assert meta["stopped"] == "replay limit" and len(order) <= 12
    fleet = rec["label"].split(" | hard_prompt_max_usd=")[0]
    assert [u for u in meta["untuned"] if u.startswith(fleet + " | ")], (fleet, meta["untuned"])
    assert meta["unexpanded"] and set(meta["untuned"]) | set(meta["unexpanded"]) <= set(order)
    warning = next(line for line in res.output.splitlines() if line.startswith("WARNING: "))
    assert warning.startswith(f"WARNING: the search stopped at its replay limit before it was done: "
                              f"{len(meta['untuned'])} fleet")
    assert meta["untuned"][0] in warning and meta["unexpanded"][0] in warning
    assert "a longer search may find a cheaper shape than the one recommended" in warning


def test_the_quality_floor_is_all_frontiers_quality_times_the_share(tmp_path: Path) -> None:
    """On the packaged fleet with AlpacaEval outcome rows: the floor is --min-quality-share x the
    quality of everything on frontier-large, the recommended shape reaches it, and the report gives
    its $/Mtok against all-frontier's; then the replay the plan's reproduce command runs works."""
    from pointsman.datasets.sources import shared_datasets_dir
    from pointsman.errors import DataError

    try:
        trace = shared_datasets_dir() / "azure_llm_2023/AzureLLMInferenceTrace_conv.csv"
    except DataError:
        pytest.skip("shared datasets not found")
    out = tmp_path / "out"
    res = CliRunner().invoke(main, ["plan", str(trace), "--limit", "60", "--estimator", "fixed:0.2", "--max-replicas",
                                    "2", "--workers", "1", "--search-requests", "0", "--time-budget-s", "20",
                                    "--min-quality-share", "0.97", "--out", str(out)])
    assert res.exit_code == 0, res.output
    report = json.loads((out / "plan.json").read_text())
    meta, rec = report["meta"], report["recommended"]
    assert 0.5 < meta["all_frontier_quality"] <= 1 and meta["all_frontier_usd_per_mtok"] > 0
    assert meta["min_quality"] == pytest.approx(0.97 * meta["all_frontier_quality"])
    assert rec is not None and rec["quality"] >= meta["min_quality"] and rec["slo_attainment"] >= 0.9
    assert "quality floor: " in res.output and "below all-frontier's $" in res.output
    reproduce = shlex.split(meta["reproduce"])[1:]
    again = CliRunner().invoke(main, [*reproduce, "--out", str(tmp_path / "replay")])
    assert again.exit_code == 0, again.output


def _shared_conv() -> Path:
    from pointsman.datasets.sources import shared_datasets_dir
    from pointsman.errors import DataError

    try:
        return shared_datasets_dir() / "azure_llm_2023/AzureLLMInferenceTrace_conv.csv"
    except DataError:
        pytest.skip("shared datasets not found")


def _plan_all_large(tmp_path: Path, out: Path, *args: str):
    """``pointsman plan`` on 40 conv requests, every prompt hard: the default policy with p_hard_frontier
    0.1 against ``fixed:0.2``, the whole trace searched, no quality floor, ``args`` added. Its own
    hard_prompt_max_usd, $0.04, is over every one of these prompts' large-tier prices (4,085 tokens at
    most: $0.0128), so as written every prompt goes to the large tier."""
    policy = tmp_path / "all-large.yaml"
    text = (DEFAULT_POLICY_DIR / "default.yaml").read_text().replace(
        "  p_hard_frontier: 0.45\n", "  p_hard_frontier: 0.1\n")
    assert "  p_hard_frontier: 0.1\n" in text and "  hard_prompt_max_usd: 0.04\n" in text
    policy.write_text(text, encoding="utf-8")
    return CliRunner().invoke(main, ["plan", str(_shared_conv()), "--limit", "40", "--estimator", "fixed:0.2",
                                     "--policy", str(policy), "--workers", "1", "--search-requests", "0",
                                     "--time-budget-s", "60", "--min-quality-share", "0", *args, "--out", str(out)])


def test_the_plan_tunes_a_threshold_with_the_shape_and_its_policy_file_reproduces(tmp_path: Path) -> None:
    """The default policy with p_hard_frontier 0.1 sends every prompt (p_hard 0.2 here) to
    frontier-large. --tune p_hard_frontier=q0.5,0.9: q0.5 resolves to 0.2 (the trace's median,
    still everything on the frontier), 0.9 keeps the prompts on-prem, far cheaper; the plan
    recommends it, writes it into --out/policy.yaml, and `pointsman replay` with the reproduce
    command (the cascade on, as in the plan's replays) gives the plan's SLO attainment, quality and
    monthly cost and $/Mtok exactly (``_planned_month``)."""
    out = tmp_path / "out"
    res = _plan_all_large(tmp_path, out, "--max-replicas", "2", "--tune", "p_hard_frontier=q0.5,0.9")
    assert res.exit_code == 0, res.output
    report = json.loads((out / "plan.json").read_text())
    labels = {r["label"] for r in report["evaluated"]}
    assert any(label.endswith("| p_hard_frontier=0.2") for label in labels), labels  # the quantile, resolved
    rec = report["recommended"]
    assert rec is not None and rec["label"].endswith("| p_hard_frontier=0.9"), rec
    assert "policy p_hard_frontier=0.9" in res.output
    written = yaml.safe_load((out / "policy.yaml").read_text())
    assert written["variables"]["p_hard_frontier"] == 0.9
    reproduce = shlex.split(report["meta"]["reproduce"])[1:]
    assert reproduce[reproduce.index("--policy") + 1] == str(out / "policy.yaml")
    again = CliRunner().invoke(main, [*reproduce, "--out", str(tmp_path / "replay")])
    assert again.exit_code == 0, again.output
    summary = json.loads((tmp_path / "replay" / "report.json").read_text())["runs"]["policy"]["summary"]
    assert summary["slo_attainment"] == pytest.approx(rec["slo_attainment"])
    assert summary["quality"] == pytest.approx(rec["quality"])
    assert _planned_month(summary, _span_s(_shared_conv(), 40), rec) == pytest.approx(
        (rec["usd_per_month"], rec["usd_per_mtok"]), rel=1e-9)


def test_a_price_cap_is_searched_over_the_traces_frontier_prices(tmp_path: Path) -> None:
    """The default policy with every prompt hard (p_hard_frontier 0.1 against fixed:0.2): its
    hard_prompt_max_usd (a `*_max_usd` variable, searched without --tune) takes the quantiles of
    the trace's frontier-large prices (cost("frontier-large") without a cached prefix: prompt at
    $2.50/M, the fleet's 256 default output tokens at $10/M); the median cap keeps the dearer half
    of the prompts off the large tier, which the plan finds cheaper."""
    from pointsman.datasets.traces import load_trace
    from pointsman.plan.tuning import quantile

    out = tmp_path / "out"
    res = _plan_all_large(tmp_path, out, "--max-replicas", "1", "--tune", "hard_prompt_max_usd=c0.5")
    assert res.exit_code == 0, res.output
    prices = [(r.prompt_tokens * 2.5 + 256 * 10.0) / 1e6 for r in load_trace(_shared_conv(), limit=40)]
    cap = round(quantile(prices, 0.5), 5)
    report = json.loads((out / "plan.json").read_text())
    rec = report["recommended"]
    assert rec is not None and rec["label"].endswith(f"| hard_prompt_max_usd={cap:.4g}"), (cap, rec["label"])
    assert yaml.safe_load((out / "policy.yaml").read_text())["variables"]["hard_prompt_max_usd"] == cap


def test_a_fleet_meeting_the_slo_gets_its_price_cap_by_bisection_against_the_floor(tmp_path: Path) -> None:
    """Every prompt hard (p_hard_frontier 0.1 against fixed:0.2): the cap alone decides how many go to
    the large tier, so quality rises with it. Once a fleet meets the SLO goal the plan bisects the cap
    against the quality floor: the first caps it replays are the two that split the six values in thirds
    (``PROBES`` per round, on any number of workers: the 0.3 and 0.9 quantiles), not the neighbour of the
    policy's own $0.04 (above them all) a one-step move would take, and it recommends a capped setting
    meeting the floor."""
    from pointsman.plan.tuning import quantile

    out = tmp_path / "out"
    res = _plan_all_large(tmp_path, out, "--max-replicas", "1", "--min-quality-share", "0.97",
                          "--tune", "hard_prompt_max_usd=c0.1,c0.3,c0.5,c0.7,c0.9")
    assert res.exit_code == 0, res.output
    report = json.loads((out / "plan.json").read_text())
    capped = [r["label"] for r in report["evaluated"] if "hard_prompt_max_usd=" in r["label"]]
    prices = [(r.prompt_tokens * 2.5 + 256 * 10.0) / 1e6 for r in load_trace(_shared_conv(), limit=40)]
    assert {c.split("| hard_prompt_max_usd=")[1] for c in capped[:2]} == {
        f"{round(quantile(prices, q), 5):.4g}" for q in (0.3, 0.9)}, capped
    rec, floor = report["recommended"], report["meta"]["min_quality"]
    assert rec is not None and "hard_prompt_max_usd=" in rec["label"] and rec["quality"] >= floor > 0


def test_the_plan_replays_the_cascade_as_its_reproduce_command_does(tmp_path: Path) -> None:
    """The packaged default policy (verify section, early verification) planned on a slice: the
    recommended shape's quality and cost are those `pointsman replay` gives with the cascade on
    (the plan used to replay without it while its reproduce command ran with it)."""
    out = tmp_path / "out"
    res = CliRunner().invoke(main, ["plan", str(_shared_conv()), "--limit", "60", "--estimator", "fixed:0.2",
                                    "--max-replicas", "2", "--workers", "1", "--search-requests", "0",
                                    "--time-budget-s", "30", "--min-quality-share", "0", "--tune", "none",
                                    "--out", str(out)])
    assert res.exit_code == 0, res.output
    report = json.loads((out / "plan.json").read_text())
    rec = report["recommended"]
    assert not (out / "policy.yaml").exists()  # nothing tuned: the policy as written
    reproduce = shlex.split(report["meta"]["reproduce"])[1:]
    assert "--no-cascade" not in reproduce
    for flags, same in (([], True), (["--no-cascade"], False)):
        again = CliRunner().invoke(main, [*reproduce, *flags, "--out", str(tmp_path / "replay")])
        assert again.exit_code == 0, again.output
        summary = json.loads((tmp_path / "replay" / "report.json").read_text())["runs"]["default"]["summary"]
        assert (summary["quality"] == pytest.approx(rec["quality"])) is same or summary["escalated"] == 0
        if same:
            assert _planned_month(summary, _span_s(_shared_conv(), 60), rec) == pytest.approx(
                (rec["usd_per_month"], rec["usd_per_mtok"]), rel=1e-9)


@pytest.mark.parametrize("tune, message", [
    ("nope=1", "nope: not a numeric variable of the policy"),
    ("p_hard_frontier=qx", "p_hard_frontier=qx: expected a number, qP or cP"),
    ("hard_prompt_max_usd=c2", "hard_prompt_max_usd=c2: expected a number, qP or cP"),
    ("p_hard_frontier", "expected NAME=V1,V2"),
])
def test_a_bad_tune_is_one_error_line(tmp_path: Path, tune: str, message: str) -> None:
    res = CliRunner().invoke(main, ["plan", str(_shared_conv()), "--limit", "5", "--estimator", "fixed:0.2",
                                    "--tune", tune, "--out", str(tmp_path / "o")])
    assert res.exit_code == 2
    errors = [line for line in res.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and message in errors[0], res.output


def test_the_search_windows_quality_floor_is_scaled_to_its_prompts(tmp_path: Path) -> None:
    """Searching on the busiest 30 of 60 requests: the floor there is --min-quality-share x
    all-frontier's quality on those 30 requests' outcome rows (another draw of prompts than the
    whole trace's, on which the recommendation's floor stays)."""
    from pointsman.policy.fleet import DEFAULT_FLEET_PATH
    from pointsman.replay.outcome_draw import OutcomeDraw, quality_columns, quality_of

    trace = _shared_conv()
    out = tmp_path / "out"
    res = CliRunner().invoke(main, ["plan", str(trace), "--limit", "60", "--search-requests", "30", "--estimator",
                                    "fixed:0.2", "--max-replicas", "2", "--workers", "1", "--time-budget-s", "20",
                                    "--tune", "none", "--out", str(out)])
    assert res.exit_code == 0, res.output
    meta = json.loads((out / "plan.json").read_text())["meta"]
    fleet = load_fleet(DEFAULT_FLEET_PATH)
    draw = OutcomeDraw.load(["alpacaeval_ae1"], 0, target_columns=quality_columns(fleet))
    requests = load_trace(trace, limit=60)
    rows = [draw.rows[i] for i in draw.assign(len(requests))]
    start, end = busiest_window(requests, 30)

    def all_frontier(part: list) -> float:
        return sum(quality_of(r, True, "frontier-large") for r in part) / len(part)

    assert meta["min_quality"] == pytest.approx(0.95 * all_frontier(rows), rel=1e-6)
    expected = meta["min_quality"] * all_frontier(rows[start:end]) / all_frontier(rows)
    assert meta["search_min_quality"] == pytest.approx(expected)
    assert meta["search_min_quality"] != pytest.approx(meta["min_quality"])  # the slice's draw differs


def test_a_month_of_the_trace_bills_its_traffic_not_its_drain(tmp_path: Path, plan_files: tuple[Path, Path]) -> None:
    """10 requests over 9 s with 2,000-token answers: the replay window runs past the last arrival while
    the answers finish (the drain). A month of this traffic is 20,000 output tokens per 9 s; the plan
    scaled the window's tokens and bills by the window instead, so a month held 3,258 Mtok, not 5,840,
    and its $/Mtok read 1.74 where the traffic costs 0.99. GPU rent and idle power still pay for the
    whole month (the window's time)."""
    fleet, policy = plan_files
    trace = write_trace(tmp_path / "trace.jsonl", 10, 1.0, 1024, 2000)
    doc, _ = _plan(tmp_path, fleet, policy, trace, "--workers", "1", "--max-replicas", "2")
    month_s = 730 * 3600
    for r in [doc["base"], *doc["whole_trace"]]:
        assert r["usd_per_month"] / r["usd_per_mtok"] == pytest.approx(20_000 * month_s / 9 / 1e6, rel=1e-9)
        rent_and_idle = r["gpus"] * (2.5 + 1.275 * 0.1 * 0.1) * 730  # the packaged idle share: 10% of TDP
        assert rent_and_idle < r["onprem_usd_per_month"] < rent_and_idle * 1.5


def test_a_trace_without_prefix_blocks_is_planned_without_a_kv_tier(tmp_path: Path, plan_files: tuple[Path, Path]) -> None:
    """An Azure-format trace carries no prefix block ids, so no request can restore a prefix from a shared
    KV tier: a tier there is DRAM rent for nothing. The base fleet's tier was kept by every start of the
    search (the Azure conv plan recommended `onprem-70b A1 KV1.5M B512`: $1,520 of its $8,615 a month);
    now the search starts without one and never adds one, and the recommendation has none."""
    fleet, policy = plan_files
    fleet.write_text(fleet.read_text().replace(
        "    default_mode: disaggregated\n",
        "    default_mode: disaggregated\n"
        "    shared_kv: {capacity_tokens: 1000000, bandwidth_bytes_per_s: 25.0e+9, latency_s: 0.001}\n"))
    trace = tmp_path / "azure.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"2023-11-16 18:15:{i:02d}.0000000,1024,64\n" for i in range(20)))
    doc, _ = _plan(tmp_path, fleet, policy, trace, "--workers", "1", "--max-replicas", "2")
    assert doc["base"]["kv_usd_per_month"] > 0  # the base fleet is compared as it is
    assert doc["recommended"]["kv_usd_per_month"] == 0 and "KV" not in doc["recommended"]["label"]
    tiered = [r["label"] for r in doc["evaluated"] + doc["whole_trace"]
              if r["kv_usd_per_month"] > 0 and r["label"] != doc["base"]["label"]]
    assert tiered == [], tiered  # before: every start of the search (the smallest shapes with KV1M)


def test_an_overloaded_shape_is_reported_and_not_recommended(tmp_path: Path, plan_files: tuple[Path, Path]) -> None:
    """60 distinct 6,144-token prompts at 10/s: one prefill replica's queue grows while they arrive
    (122% of its time) but the 5.9 s trace ends before that costs a TTFT, so the base fleet (1 prefill
    + 2 decode replicas) and 1 + 1 met 100% of the SLO and the plan recommended 1 + 1 (on the
    same rate over 100 requests it meets 85%). Now both are marked overloaded in the report, with the
    pool and why, and the recommendation has the prefill GPUs the prompts need over the span."""
    fleet, policy = plan_files
    trace = write_trace(tmp_path / "trace.jsonl", 60, 10.0, 6144, 32)
    doc, output = _plan(tmp_path, fleet, policy, trace, "--workers", "1", "--max-replicas", "2")
    rec, base = doc["recommended"], doc["base"]
    spec = sim_fleet(load_fleet(fleet)).on_prem[0].spec_for("prefill")
    prefill_s = 60 * spec.prefill_s(6144)  # each prompt in a step of its own, overheads included
    assert rec["pools"]["small"]["prefill"] * rec["pools"]["small"]["prefill_tp"] * _span_s(trace) >= prefill_s
    assert base["slo_attainment"] == 1.0 and base["overloaded"] and base["load"]["small/prefill"] > 1.15
    assert "(overloaded: small/prefill at 12" in output and "), misses the 90% goal" in output  # the base's line
    assert "overloaded (above 100%)" in output and "% overloaded " in output  # the legend, the table's load column
    # what costs less than the recommendation either misses the goal or is overloaded
    assert all(r["overloaded"] or r["slo_attainment"] < 0.9 for r in doc["whole_trace"]
               if r["usd_per_month"] < rec["usd_per_month"])


def test_no_recommendation_names_the_closest_shape_at_digits_that_tell_it_from_the_floor(tmp_path: Path) -> None:
    """The first 300 Azure conv requests, every prompt on the 70B model (p_hard 0.3): each shape scores
    quality 0.91667, the floor is 0.95 x all-frontier's 0.9650 = 0.91675. The table printed 0.9167 for both
    and the verdict "no shape ... meets ... quality 0.917": a refusal its own table seemed to contradict.
    It now prints both at the digits that tell them apart and names the shape that came closest."""
    from pointsman.datasets.sources import shared_datasets_dir
    from pointsman.errors import DataError

    try:
        trace = shared_datasets_dir() / "azure_llm_2023/AzureLLMInferenceTrace_conv.csv"
    except DataError:
        pytest.skip("shared datasets not found")
    out = tmp_path / "out"
    res = CliRunner().invoke(main, ["plan", str(trace), "--limit", "300", "--workers", "1", "--max-replays", "1",
                                    "--search-requests", "0", "--tune", "none", "--estimator", "fixed:0.3",
                                    "--out", str(out)])
    assert res.exit_code == 1, res.output
    doc = json.loads((out / "plan.json").read_text())
    floor = doc["meta"]["min_quality"]
    best = max((r for r in doc["whole_trace"] if r["slo_attainment"] >= 0.9 and not r["overloaded"]),
               key=lambda r: r["quality"])
    assert best["quality"] < floor < best["quality"] + 1e-3 and f"{best['quality']:.4f}" == f"{floor:.4f}"
    line = next(x for x in res.output.splitlines() if x.startswith("no shape replayed"))
    assert f"quality {floor:.5f}: no fleet file written" in line  # before: "quality 0.917"
    assert f"(the closest, {best['label']}, meets the SLO goal at quality {best['quality']:.5f}, under the floor " \
           f"{floor:.5f})" in line


def test_a_plan_without_prompt_text_keeps_the_policys_thresholds(tmp_path: Path) -> None:
    """No prompt text (--outcomes none on a token-count trace): the default knobs' p_hard quantiles have
    no scores. `pointsman plan TRACE --estimator fixed:0.1 --outcomes none` on the packaged default
    policy failed with "Error: --tune p_hard_frontier=q0.3: ... (no p_hard scores for a quantile)",
    an option it was not given. It now plans with the policy's thresholds as written; a --tune
    quantile the user asks for is still an error."""
    trace = tmp_path / "t.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,800,100\n"
                     "2023-11-16 18:17:05.9799600,900,100\n", encoding="utf-8")
    args = ["plan", str(trace), "--estimator", "fixed:0.1", "--outcomes", "none", "--workers", "1", "--max-replays", "1",
            "--out", str(tmp_path / "out")]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output  # before: 2, the --tune error
    assert "recommended: " in res.output and not (tmp_path / "out" / "policy.yaml").exists()
    asked = CliRunner().invoke(main, [*args, "--tune", "p_hard_frontier=q0.5"])
    assert asked.exit_code == 2 and "no p_hard scores for a quantile" in asked.output


def test_the_plan_is_the_same_on_one_worker_and_on_two(tmp_path: Path) -> None:
    """`pointsman plan` (the real command, in a subprocess) with --workers 1 and 2 on 40 conv requests whose
    price cap is bisected against a quality floor, searched on a 30-request window and validated on the
    whole trace: the same report (front, whole-trace table, recommendation) and plan.json but for wall
    times and the worker count. Before, the bisection probed --workers thresholds per round, the
    workers' results were taken in the order they finished, and the validation kept a whole round."""
    import re
    import subprocess
    import sys

    policy = tmp_path / "all-large.yaml"
    policy.write_text((DEFAULT_POLICY_DIR / "default.yaml").read_text().replace(
        "  p_hard_frontier: 0.45\n", "  p_hard_frontier: 0.1\n"), encoding="utf-8")
    outputs, docs = [], []
    for workers in ("1", "2"):
        out = tmp_path / f"out{workers}"
        res = subprocess.run([sys.executable, "-m", "pointsman", "plan", str(_shared_conv()), "--limit", "40",
                              "--search-requests", "30", "--estimator", "fixed:0.2", "--policy", str(policy),
                              "--max-replicas", "1", "--min-quality-share", "0.97", "--time-budget-s", "600",
                              "--tune", "hard_prompt_max_usd=c0.1,c0.3,c0.5,c0.7,c0.9", "--workers", workers,
                              "--out", str(out)], capture_output=True, text=True, check=False)
        assert res.returncode == 0, res.stderr
        outputs.append(re.sub(r"; \d+ s$", "", res.stdout.replace(str(out), "OUT"), flags=re.M))
        doc = json.loads((out / "plan.json").read_text().replace(str(out), "OUT"))
        for row in [doc["base"], doc["recommended"], *doc["front"], *doc["whole_trace"], *doc["evaluated"]]:
            row.pop("wall_s")
        del doc["meta"]["wall_s"], doc["meta"]["workers"]
        docs.append(doc)
    assert docs[0]["meta"]["stopped"] == "converged" and len(docs[0]["whole_trace"]) >= 2
    assert outputs[0] == outputs[1]
    assert docs[0] == docs[1]
