"""A rule whose every candidate is refused at dispatch (the budget's reservation, no healthy endpoint in the
route's pools) is passed over as one whose candidates a filter removed: the rules after it decide. Before, the
decision stopped there (a 429, ``no_eligible_target``) although a later rule's target could take the request, and
the docs promised "evaluation continues" only for filters. ``policy test`` decides the same."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner
from fastapi.testclient import TestClient

from pointsman.cli.main import main
from pointsman.service.app import create_app
from pointsman.service.settings import Settings

POLICY = """apiVersion: pointsman/v1
kind: RoutingPolicy
filters: {budget: false}   # only the reservation guards the budget
rules:
  - name: big
    when: request.turns >= 1
    route: {target: frontier-large, fallbacks: [frontier-small]}
  - name: default
    route: {target: onprem-8b}
"""


def test_the_rules_after_a_refused_rule_decide(tmp_path: Path) -> None:
    budgets, policy = tmp_path / "budgets.yaml", tmp_path / "p.yaml"
    budgets.write_text("apiVersion: pointsman/v1\nkind: Budgets\nbudgets:\n"
                       "  - {scope: 'tenant:tiny', window: day, limit_usd: 0.000002}\n")
    policy.write_text(POLICY)
    settings = Settings(data_dir=tmp_path, budgets_path=budgets, policy_path=policy, watch_policy=False,
                        watch_fleet=False, watch_budgets=False, scrape_interval_s=0)
    with TestClient(create_app(settings)) as c:
        r = c.post("/v1/route", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5,
                                      "routing": {"tenant": "tiny", "explain": True}})
        other = c.post("/v1/route", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5,
                                          "routing": {"tenant": "other"}}).json()
    assert r.status_code == 200, r.text
    d = r.json()
    assert (d["target"], d["rule"]) == ("onprem-8b", "default"), d
    assert (other["target"], other["rule"]) == ("frontier-large", "big")  # no budget: the first rule
    trace = d["trace"]
    assert [(x["rule"], x["result"]) for x in trace["rules"]] == [("big", "no-eligible-target"), ("default", "matched")]
    assert "frontier-large (budget:" in trace["rules"][0]["error"] and "frontier-small (budget:" in trace["rules"][0]["error"]
    assert set(trace["budget"]["refusals"]) == {"frontier-large", "frontier-small"}
    by_target = {x["target"]: x for x in trace["candidates"]}
    assert by_target["frontier-large"]["excluded_by"].startswith("budget:") and by_target["onprem-8b"]["eligible"]

    # policy test decides the same (a case's budget refuses as the reservation does)
    (tmp_path / "p.cases.yaml").write_text(
        "apiVersion: pointsman/v1\nkind: PolicyCases\npolicy: p.yaml\ncases:\n"
        "  - name: refused at dispatch\n"
        "    signals: {budget: {limited: true, remaining_usd: 0.00005, limit_usd: 0.00005}}\n"
        "    expect: {target: onprem-8b, rule: default, excluded_by: {frontier-large: budget, frontier-small: budget}}\n")
    res = CliRunner().invoke(main, ["policy", "test", str(tmp_path / "p.cases.yaml")])
    assert res.exit_code == 0, res.output
