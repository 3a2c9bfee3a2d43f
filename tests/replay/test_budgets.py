"""Budgets in replay: a real ledger on the simulated clock. Once the budget is spent the
policy's budget rule moves requests to the cheaper target, then the exhausted budget refuses
every target; frontier spend in the ledger equals the simulated bills; same input, same run."""

from __future__ import annotations

from pathlib import Path

import pytest

from pointsman.datasets.traces import TraceRequest
from pointsman.errors import BudgetError
from pointsman.estimator.estimate import FixedDifficulty
from pointsman.policy.budget.config import BudgetConfig
from pointsman.policy.fleet import load_fleet
from pointsman.policy.rules.compiler import load_policy
from pointsman.replay.budgets import check_applies
from pointsman.replay.fleet_map import sim_fleet
from pointsman.replay.runs import replay_all
from pointsman.replay.summary import format_table

FLEET = """\
apiVersion: pointsman/v1
kind: Fleet
targets:
  small:
    kind: onprem
    model: meta-llama/Llama-3.1-8B-Instruct
    context_window_tokens: 32768
    usd_per_gpu_hour: 2.5
    pools:
      aggregated:
        gpus_per_replica: 1
        prefill_tokens_per_s: 50000
        decode_tokens_per_s: 20000
        endpoints: [{name: s0, url: "http://s0/v1"}]
  api:
    kind: frontier
    provider: openai
    model: gpt-4o
    base_url: https://api.openai.com/v1
    context_window_tokens: 32768
    prices: {usd_per_1m_input_tokens: 2.5, usd_per_1m_cached_input_tokens: 1.25, usd_per_1m_output_tokens: 10}
"""

POLICY = """\
apiVersion: pointsman/v1
kind: RoutingPolicy
filters: {budget: true}
rules:
  - name: reserve
    when: budget.limited && budget.spent_fraction >= 0.5
    route: {target: small}
  - name: default
    route: {target: api, fallbacks: [small]}
"""

#: 1,000-token prompts, 100-token answers, one every 10 s (each finishes before the next).
TRACE = [TraceRequest(arrival_s=10.0 * i, prompt_tokens=1000, output_tokens=100) for i in range(40)]
#: One api request bills 1000 x 2.5e-6 + 100 x 1e-5 = $0.0035 (estimated with 256 output tokens:
#: $0.00506), so the $0.01 budget is half spent after two of them.
LIMIT_USD = 0.01


def _run(tmp_path: Path):
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "fleet.yaml").write_text(FLEET, encoding="utf-8")
    (tmp_path / "policy.yaml").write_text(POLICY, encoding="utf-8")
    fleet = load_fleet(tmp_path / "fleet.yaml")
    budgets = BudgetConfig.from_dict({"budgets": [{"scope": "tenant:t1", "window": "day", "limit_usd": LIMIT_USD}]})
    runs = replay_all(TRACE, fleet, sim_fleet(fleet), {"p": load_policy(tmp_path / "policy.yaml", fleet)},
                      FixedDifficulty(0.5), baselines=False, budgets=budgets, tenant="t1")
    return runs[0]


def test_budget_moves_requests_to_the_cheaper_target_then_refuses(tmp_path: Path) -> None:
    run = _run(tmp_path)
    reqs = run.result.requests
    targets = [r.target if r.rejected is None else r.rejected for r in reqs]
    assert targets[:2] == ["api", "api"]  # $0.007 of $0.01 spent: 70% >= 50%
    n_small = targets.index("no_eligible_target") - 2
    assert n_small >= 1 and targets[2:2 + n_small] == ["small"] * n_small
    assert set(targets[2 + n_small:]) == {"no_eligible_target"}  # exhausted: nothing fits
    assert run.rules == {"default": 2, "reserve": n_small, "(no eligible target)": 40 - 2 - n_small}
    [b] = run.budget
    assert (b["scope"], b["window"], b["window_id"], b["limit_usd"]) == ("tenant:t1", "day", "day:2026-01-01", LIMIT_USD)
    assert b["reserved_usd"] == 0.0  # every hold settled or released
    api_bills = sum(r.cost_usd for r in reqs if r.target == "api")
    assert api_bills == pytest.approx(2 * 0.0035)
    assert api_bills < b["settled_usd"] <= LIMIT_USD  # the on-prem requests' cost-model cost is booked too
    assert run.summary.budget_spent_usd == pytest.approx(b["settled_usd"])
    assert run.summary.budget_limit_usd == LIMIT_USD
    assert "budget $" in format_table({"p": run.summary})


def test_budget_replay_is_deterministic(tmp_path: Path) -> None:
    a, b = _run(tmp_path / "a"), _run(tmp_path / "b")
    assert [(r.target, r.rejected, r.ttft_s) for r in a.result.requests] == \
        [(r.target, r.rejected, r.ttft_s) for r in b.result.requests]
    assert a.budget == b.budget


def test_a_budgets_file_that_does_not_apply_is_refused() -> None:
    budgets = BudgetConfig.from_dict({"budgets": [{"scope": "tenant:acme", "window": "day", "limit_usd": 5}]})
    check_applies(budgets, "acme")
    with pytest.raises(BudgetError, match=r"tenant:replay.*tenant:acme"):
        check_applies(budgets, "replay", "b.yaml")


def test_the_budget_pacing_example_reserves_then_runs_out() -> None:
    """The packaged fleet and ``budget-pacing.yaml``: every prompt as hard as can be (p_hard 1.0; the
    paced bar starts at the v3.1 estimator's p_hard_frontier, 0.67), a $0.02 day budget. GPT-4o while
    the paced bar stays under 1.0, then the reserve rule's 8B model at 95% spent, then nothing fits:
    every target refused."""
    from pointsman.policy.rules.compiler import DEFAULT_POLICY_DIR

    fleet = load_fleet()
    budgets = BudgetConfig.from_dict({"budgets": [{"scope": "tenant:replay", "window": "day", "limit_usd": 0.02}]})
    policy = load_policy(DEFAULT_POLICY_DIR / "budget-pacing.yaml", fleet)
    run = replay_all(TRACE[:30], fleet, sim_fleet(fleet), {"budget-pacing": policy}, FixedDifficulty(1.0),
                     baselines=False, budgets=budgets)[0]
    targets = [r.target if r.rejected is None else r.rejected for r in run.result.requests]
    large = targets.index("onprem-70b")  # the first request GPT-4o's estimate no longer fits
    assert large >= 3 and targets[:large] == ["frontier-large"] * large
    assert "frontier-large" not in targets[large:]
    # with p_hard 1.0 only the reserve rule picks the 8B model; it comes after every frontier request
    eight = [i for i, t in enumerate(targets) if t == "onprem-8b"]
    assert len(eight) == run.rules["budget-reserve"] >= 1
    assert min(eight) > max(i for i, t in enumerate(targets) if t.startswith("frontier"))
    refused = targets.index("no_eligible_target")
    assert refused > max(eight) and set(targets[refused:]) == {"no_eligible_target"}
    [b] = run.budget
    assert 0.95 * 0.02 <= b["settled_usd"] + b["reserved_usd"] <= 0.0205


def test_refused_requests_at_the_end_keep_the_window_open(tmp_path: Path) -> None:
    """GPUs are paid until the trace ends even when its last requests are refused."""
    run = _run(tmp_path)
    assert run.result.requests[-1].rejected == "no_eligible_target"
    assert run.result.end_s == TRACE[-1].arrival_s
