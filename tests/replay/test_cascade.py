"""The cascade in replay (``replay/cascade.py``): a policy's verify rules on each on-prem draft;
an escalated request pays the draft and the frontier call, its latencies add, its quality is the
frontier's; accepted drafts and frontier requests are untouched; ``pointsman replay`` reports it."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from pointsman.datasets.sources import get_source
from pointsman.policy.fleet import load_fleet
from pointsman.policy.rules.compiler import STATIC_POLICY_PATH, load_policy
from pointsman.replay.cascade import CascadeVerify, DraftBook, apply_cascade
from pointsman.replay.fleet_map import sim_fleet
from pointsman.replay.outcome_draw import OutcomeRow, quality_of
from pointsman.replay.results import ReplayResult, RequestResult
from pointsman.replay.summary import summarize

FLEET = load_fleet()
SIM = sim_fleet(FLEET)
WEAK = get_source("alpacaeval_ae1").weak[0]
GOOD = ("Kickball is played like baseball with a rubber ball rolled to the kicker; runners circle four bases, "
        "and the team with more runs after the innings wins. Three outs end a half-inning.")


class Book(DraftBook):
    """Drafts from a dict: (model, prompt id) -> text."""

    def __init__(self, texts: dict[tuple[str, str], str]) -> None:
        super().__init__("unused.csv")
        self.texts = texts

    def text(self, model: str, prompt_id: str) -> str | None:
        return self.texts.get((model, prompt_id))


def _request(i: int, target: str, frontier: bool = False) -> RequestResult:
    return RequestResult(index=i, arrival_s=float(i), prompt_tokens=200, output_tokens=101, routed_target=target,
                         target=target, mode="aggregated", replica=None if frontier else 0, decode_replica=None,
                         frontier=frontier, spilled=False, rejected=None, queue_s=0.0, ttft_s=0.2, tpot_s=0.02,
                         e2e_s=2.2, finish_s=i + 2.2, prefix_hit_tokens=0, restored_tokens=0, transfer_s=0.0,
                         cost_usd=0.01 if frontier else 0.0)


def test_escalations_pay_both_calls_and_take_the_frontier_quality():
    policy = load_policy(STATIC_POLICY_PATH, FLEET)
    reqs = [_request(0, "onprem-8b"), _request(1, "onprem-8b"), _request(2, "frontier-large", frontier=True),
            _request(3, "onprem-8b")]
    rows = [OutcomeRow("alpacaeval_ae1", f"p{i}", ({"role": "user", "content": "q"},), 0.2, 0.9) for i in range(4)]
    book = Book({(WEAK, "p0"): GOOD, (WEAK, "p1"): "I'm sorry, but I cannot help with that."})
    verified = CascadeVerify(rows, SIM, policy, book, {})
    good, refusal = verified.draft(0, "onprem-8b", 200, 0.3), verified.draft(1, "onprem-8b", 200, 0.3)
    assert good is not None and refusal is not None and refusal["refusal"] and not good["refusal"]
    assert verified.draft(3, "onprem-8b", 200, 0.3) is None  # no draft: left as it ran
    small = next(f for f in SIM.frontier if f.name == "frontier-small")
    call_s = small.ttft_median_s + small.tpot_median_s * 100
    bill = (200 * small.input_usd_per_mtok + 101 * small.output_usd_per_mtok) / 1e6
    assert verified.escalated(1, "onprem-8b", 200, 101, 101, "frontier-small") == pytest.approx((call_s, bill))
    assert verified.escalated(3, "onprem-8b", 200, 101, 101, "onprem-70b") is None  # on-prem: not modelled
    result = ReplayResult(reqs, [], SIM, 0.0, 10.0, 0, 10.0)
    out = apply_cascade(result, verified)
    kept, escalated, frontier, no_draft = out.requests
    assert kept == reqs[0] and frontier == reqs[2] and no_draft == reqs[3]
    assert escalated.escalated and escalated.frontier and escalated.target == "frontier-small"
    assert escalated.e2e_s == pytest.approx(2.2 + call_s) and escalated.ttft_s == pytest.approx(2.2 + small.ttft_median_s)
    assert escalated.cost_usd == pytest.approx(bill)
    assert out.unmodelled_escalations == {"onprem-70b": 1}
    assert quality_of(rows[1], escalated.frontier, escalated.target) == 0.9
    summary = summarize(out, None, lambda r: quality_of(rows[r.index], r.frontier, r.target))
    assert summary.escalated == 1 and summary.frontier_share == pytest.approx(0.5)
    assert summary.quality > summarize(result, None, lambda r: quality_of(rows[r.index], r.frontier, r.target)).quality


def test_replay_reports_the_cascade(tmp_path):
    from click.testing import CliRunner

    from pointsman.cli.main import main

    trace = tmp_path / "trace.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"2023-11-16 18:15:{i:02d}.0000000,{300 + 7 * i},{40 + i}\n" for i in range(40)))
    drafts = tmp_path / "drafts.csv"
    lines = [f"ae{i:03d},{WEAK},\"I'm sorry, but I cannot help with that.\"" for i in range(1, 806)]
    drafts.write_text("prompt_id,model,output\n" + "\n".join(lines) + "\n")
    args = ["replay", str(trace), "--policy", str(STATIC_POLICY_PATH), "--no-baselines", "--estimator", "fixed:0.1"]
    on = CliRunner().invoke(main, [*args, "--drafts", str(drafts), "--out", str(tmp_path / "on")])
    assert on.exit_code == 0, on.output
    off = CliRunner().invoke(main, [*args, "--no-cascade", "--out", str(tmp_path / "off")])
    assert off.exit_code == 0, off.output
    assert "escalated" in next(line for line in on.output.splitlines() if line.startswith("policy")).split()
    report_on = json.loads((tmp_path / "on" / "report.json").read_text())
    report_off = json.loads((tmp_path / "off" / "report.json").read_text())
    assert report_on["runs"]["static"]["summary"]["escalated"] > 0  # every draft is a refusal
    assert report_off["runs"]["static"]["summary"]["escalated"] == 0
    assert report_on["meta"]["cascade"].startswith("on") and report_off["meta"]["cascade"].startswith("off")
    assert report_on["runs"]["static"]["summary"]["total_cost_usd"] > report_off["runs"]["static"]["summary"][
        "total_cost_usd"]


def test_early_verification_cuts_the_draft_and_adds_only_its_first_tokens(tmp_path):
    """The same refusing drafts verified whole and at their 8th token (``verify.prefix_tokens``):
    the same requests escalate, each answering the trace's whole output from the frontier, but the
    early one starts the frontier call after 8 draft tokens (less added latency, less decode work
    on-prem)."""
    from click.testing import CliRunner

    from pointsman.cli.main import main

    trace = tmp_path / "trace.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"2023-11-16 18:15:{i:02d}.0000000,{300 + 7 * i},{200 + i}\n" for i in range(40)))
    drafts = tmp_path / "drafts.csv"
    refusal = "I'm sorry, but I cannot help with that. " * 20  # far longer than 8 tokens
    drafts.write_text("prompt_id,model,output\n" + "\n".join(
        f"ae{i:03d},{WEAK},\"{refusal}\"" for i in range(1, 806)) + "\n")
    early = tmp_path / "early.yaml"
    early.write_text(STATIC_POLICY_PATH.read_text().replace("\nverify:\n", "\nverify:\n  prefix_tokens: 8\n"))
    res = CliRunner().invoke(main, ["replay", str(trace), "--policy", str(STATIC_POLICY_PATH), "--policy", str(early),
                                    "--no-baselines", "--estimator", "fixed:0.1", "--drafts", str(drafts),
                                    "--out", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    runs = json.loads((tmp_path / "out" / "report.json").read_text())["runs"]
    whole, cut = runs["static"]["summary"], runs["early"]["summary"]
    # every 8B draft refuses (the 70B model's stand-in has no drafts in this file: it is kept)
    assert whole["escalated"] == cut["escalated"] == whole["target_requests"]["frontier-small"] > 0
    assert runs["static"]["rules"] == runs["early"]["rules"]
    assert cut["output_tokens"] == whole["output_tokens"]  # the frontier answers the whole output
    assert cut["escalation_delay_p99_s"] < whole["escalation_delay_p50_s"]
    assert cut["escalation_delay_p50_s"] < 0.5 * whole["escalation_delay_p50_s"]
    assert cut["decode_utilization"] < whole["decode_utilization"]  # cancelled drafts free their replicas
    assert cut["ttft_p99_s"] < whole["ttft_p99_s"]


def test_the_budget_ledger_books_the_escalated_calls(tmp_path):
    """With ``--budgets`` the ledger is the run's spend: on a fleet whose GPUs cost nothing, what it
    booked equals the frontier bills, escalated calls included, whole-draft and early verification
    alike. Before, an escalation's frontier call (applied after the simulation) was never booked:
    the ledger held the draft's $0 and the report's budget column left every escalation out."""
    from click.testing import CliRunner

    from pointsman.cli.main import main
    from pointsman.policy.fleet import DEFAULT_FLEET_PATH

    trace = tmp_path / "trace.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"2023-11-16 18:15:{i:02d}.0000000,{300 + 7 * i},{200 + i}\n" for i in range(40)))
    drafts = tmp_path / "drafts.csv"
    refusal = "I'm sorry, but I cannot help with that. " * 20
    drafts.write_text("prompt_id,model,output\n" + "\n".join(
        f"ae{i:03d},{WEAK},\"{refusal}\"" for i in range(1, 806)) + "\n")
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(DEFAULT_FLEET_PATH.read_text().replace("usd_per_gpu_hour: 2.50", "usd_per_gpu_hour: 0.0"))
    budgets = tmp_path / "budgets.yaml"
    budgets.write_text("apiVersion: pointsman/v1\nkind: Budgets\nbudgets:\n"
                       "  - {scope: 'tenant:replay', window: day, limit_usd: 1000}\n")
    early = tmp_path / "early.yaml"
    early.write_text(STATIC_POLICY_PATH.read_text().replace("\nverify:\n", "\nverify:\n  prefix_tokens: 8\n"))
    res = CliRunner().invoke(main, ["replay", str(trace), "--fleet", str(fleet), "--policy", str(STATIC_POLICY_PATH),
                                    "--policy", str(early), "--no-baselines", "--estimator", "fixed:0.1",
                                    "--drafts", str(drafts), "--budgets", str(budgets), "--out", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    runs = json.loads((tmp_path / "out" / "report.json").read_text())["runs"]
    for name in ("static", "early"):
        summary = runs[name]["summary"]
        assert summary["escalated"] > 0 and summary["onprem_cost_usd"] == 0.0
        assert summary["budget_spent_usd"] == pytest.approx(summary["frontier_cost_usd"], abs=1e-6), name


@pytest.mark.parametrize("prefix", ["", "  prefix_tokens: 16\n"])
def test_an_escalation_to_an_on_prem_target_is_named_not_hidden(tmp_path, prefix):
    """The replay simulates escalations to frontier tiers only. A policy escalating every 8B draft to
    onprem-70b replayed as 'escalated 0' with the 8B's quality and cost, nothing saying its 40
    escalations were left out; now report.json counts them and the report names them."""
    from click.testing import CliRunner

    from pointsman.cli.main import main

    policy = tmp_path / "up.yaml"
    policy.write_text("apiVersion: pointsman/v1\nkind: RoutingPolicy\nrules:\n"
                      "  - name: d\n    route: {target: onprem-8b, fallbacks: [onprem-70b]}\n"
                      "verify:\n" + prefix + "  rules:\n"
                      "    - name: up\n      when: draft.target == 'onprem-8b'\n      action: escalate\n"
                      "      escalate: {target: onprem-70b, fallbacks: [frontier-small]}\n"
                      "    - name: accept\n      action: accept\n")
    trace = tmp_path / "trace.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"2023-11-16 18:15:{i:02d}.0000000,{300 + 7 * i},{40 + i}\n" for i in range(40)))
    out = tmp_path / "out"
    res = CliRunner().invoke(main, ["replay", str(trace), "--policy", str(policy), "--no-baselines",
                                    "--estimator", "fixed:0.5", "--out", str(out)])
    assert res.exit_code == 0, res.output
    s = json.loads((out / "report.json").read_text())["runs"]["up"]["summary"]
    assert s["target_requests"] == {"onprem-8b": 40} and s["escalated"] == 0
    assert s["unmodelled_escalations"] == 40, s  # before: no such count
    assert "up: the verify rules escalated 40 to onprem-70b (on-prem): not simulated" in res.output


_LIMITS = st.floats(0.0005, 0.03)  # $0.002: 11 of the 31 8B drafts escalate, 20 are refused


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@example(limit=0.002, prefix="")
@given(limit=_LIMITS, prefix=st.sampled_from(["", "  prefix_tokens: 8\n"]))
def test_a_budget_limits_the_escalations_as_the_service_does(tmp_path_factory, limit, prefix):
    """``pointsman replay --budgets`` of a cascade: every escalation is reserved at its verify and refused when
    it does not fit (the draft stands, counted as ``refused_escalations`` and named under the table), so the
    settled spend never exceeds the limit (free GPUs; answers shorter than the 256-token default the holds
    assume: no settled call overruns its hold). Before, escalations were booked after the simulation: the
    ledger went past the limit by their bills and no escalation was ever refused."""
    from click.testing import CliRunner

    from pointsman.cli.main import main
    from pointsman.policy.fleet import DEFAULT_FLEET_PATH

    tmp_path = tmp_path_factory.mktemp("budget")
    trace = tmp_path / "trace.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"2023-11-16 18:15:{i:02d}.0000000,{300 + 7 * i},{200 + i}\n" for i in range(40)))
    drafts = tmp_path / "drafts.csv"
    refusal = "I'm sorry, but I cannot help with that. " * 20
    drafts.write_text("prompt_id,model,output\n" + "\n".join(
        f"ae{i:03d},{WEAK},\"{refusal}\"" for i in range(1, 806)) + "\n")
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(DEFAULT_FLEET_PATH.read_text().replace("usd_per_gpu_hour: 2.50", "usd_per_gpu_hour: 0.0"))
    budgets = tmp_path / "budgets.yaml"
    budgets.write_text("apiVersion: pointsman/v1\nkind: Budgets\nbudgets:\n"
                       f"  - {{scope: 'tenant:replay', window: day, limit_usd: {limit!r}}}\n")
    policy = tmp_path / "static.yaml"
    policy.write_text(STATIC_POLICY_PATH.read_text().replace("\nverify:\n", "\nverify:\n" + prefix))
    res = CliRunner().invoke(main, ["replay", str(trace), "--fleet", str(fleet), "--policy", str(policy),
                                    "--no-baselines", "--estimator", "fixed:0.1", "--drafts", str(drafts),
                                    "--budgets", str(budgets), "--out", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    run = json.loads((tmp_path / "out" / "report.json").read_text())["runs"]["static"]
    [spend] = run["budget"]
    summary = run["summary"]
    assert spend["settled_usd"] + spend["reserved_usd"] <= limit + 1e-9, (spend, summary["escalated"])
    assert summary["budget_spent_usd"] == pytest.approx(summary["frontier_cost_usd"], abs=1e-6)
    # every 8B draft refuses: each is escalated or, when its escalation does not fit, counted as refused
    assert summary["refused_escalations"] == summary["target_requests"].get("onprem-8b", 0), summary
    if summary["refused_escalations"]:
        assert f"static: {summary['refused_escalations']} escalations refused" in res.output


@pytest.mark.parametrize("requests", [1, 3])
def test_the_window_runs_to_the_last_escalated_answer(tmp_path, requests):
    """GPUs are provisioned, and billed, until the last answer: an escalated request's answer comes
    after its draft, so the window must run to it. Every draft a refusal, every request escalated:
    one request of 40 output tokens, its answer 1.21 s after its arrival (the draft's 0.14 s, then the
    frontier call's 0.60 s TTFT and 39 x 12 ms), had a window of 0.142 s, the draft's end: the 18 GPUs
    were billed for 12% of the time the replay took, and the goodput divided by that short window."""
    from click.testing import CliRunner

    from pointsman.cli.main import main

    trace = tmp_path / "trace.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"2023-11-16 18:15:{i:02d}.0000000,300,40\n" for i in range(requests)))
    drafts = tmp_path / "drafts.csv"
    lines = [f"ae{i:03d},{WEAK},\"I'm sorry, but I cannot help with that.\"" for i in range(1, 806)]
    drafts.write_text("prompt_id,model,output\n" + "\n".join(lines) + "\n")
    out = tmp_path / "out"
    res = CliRunner().invoke(main, ["replay", str(trace), "--policy", str(STATIC_POLICY_PATH), "--no-baselines",
                                    "--estimator", "fixed:0.1", "--drafts", str(drafts), "--out", str(out)])
    assert res.exit_code == 0, res.output
    s = json.loads((out / "report.json").read_text())["runs"]["static"]["summary"]
    assert s["escalated"] == s["completed"] == requests
    # the last request arrives at requests - 1 s; its answer takes TTFT + TPOT x 39 after that
    last_answer_s = (requests - 1) + s["ttft_p99_s"] + s["tpot_p99_s"] * 39 if requests == 1 else None
    if last_answer_s is not None:  # one request: its TTFT and TPOT are the percentiles
        assert s["window_s"] == pytest.approx(last_answer_s)  # before: 0.142 s, the draft's end
    assert s["window_s"] >= (requests - 1) + s["ttft_p50_s"]
    # the packaged fleet's 18 GPUs at $2.50/h, its power included (no kWh on top): the rent of the window
    assert s["onprem_cost_usd"] == pytest.approx(18 * 2.50 * s["window_s"] / 3600, rel=1e-9)
    assert s["goodput_rps"] == pytest.approx(s["slo_attainment"] * requests / s["window_s"])
