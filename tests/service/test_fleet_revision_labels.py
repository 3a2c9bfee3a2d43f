"""Outcome labels tell the frontier tier apart by the fleet a decision was made on (a real ``pointsman serve``).

Before: the labels read today's fleet file, so a target re-kinded later (the 70B moved from on-prem to a hosted
provider under the same name) turned the answers it gave as an on-prem model into frontier answers: old decisions
were relabelled silently. Now the service keeps each fleet revision's target kinds in the outcome log (at start and
at every reload) and the labels read them by the decision's ``fleet_revision``.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import httpx

from pointsman.outcome_log.store import OutcomeLog
from pointsman.policy.fleet import DEFAULT_FLEET_PATH, load_fleet
from pointsman.training.challenger import logged_frontier_share
from pointsman.training.logged_examples import logged_examples
from pointsman.training.outcome_labels import LabelRules
from tests.service.conftest import wait

POLICY = """apiVersion: pointsman/v1
kind: RoutingPolicy
metadata: {name: by-length}
rules:
  - name: long
    when: request.prompt_tokens >= 30
    route: {target: onprem-70b}
  - name: short
    route: {target: onprem-8b}
"""
SHORT = {"messages": [{"role": "user", "content": "hello there"}]}
LONG = {"messages": [{"role": "user", "content": "hello there " * 40}]}


def _rekinded(text: str) -> str:
    """The packaged fleet with ``onprem-70b`` a hosted (``kind: frontier``) target: frontier-small's entry under that name."""
    head, _, rest = text.partition("  onprem-70b:\n")
    small, _, tail = rest.partition("  frontier-small:\n")[2].partition("  frontier-large:\n")
    return f"{head}  onprem-70b:\n{small}  frontier-small:\n{small}  frontier-large:\n{tail}"


def test_labels_read_the_fleet_each_decision_was_made_on(tmp_path: Path, serve):
    fleet_path = tmp_path / "fleet.yaml"
    fleet_path.write_text(DEFAULT_FLEET_PATH.read_text())
    (tmp_path / "policy.yaml").write_text(POLICY)
    _, base = serve(tmp_path / "data", fleet_path=fleet_path, policy_path=tmp_path / "policy.yaml",
                    watch_fleet="false", watch_policy="false", scrape_interval_s="0")
    judged = {"onprem-8b": 0.9, "onprem-70b": 0.2, "frontier-large": 0.5}
    with httpx.Client(base_url=base, timeout=30) as c:

        def traffic() -> str:
            """One short decision (to onprem-8b) judged beside shadow answers of the 70B and frontier-large, and one
            long one (to onprem-70b) without outcomes; returns the short one's id."""
            d = c.post("/v1/route", json=SHORT).json()
            assert d["target"] == "onprem-8b", d
            assert c.post("/v1/route", json=LONG).json()["target"] == "onprem-70b"
            batch = [{"decision_id": d["decision_id"], "outcome_id": f"{d['decision_id']}-{t}", "served_target": t,
                      "shadow": t != "onprem-8b", "quality": {"judge_score": s, "judge": "j"}} for t, s in judged.items()]
            r = c.post("/v1/outcomes", json=batch)
            assert [a["status"] for a in r.json()["acks"]] == ["stored"] * 3, r.text
            return d["decision_id"]

        old = traffic()
        fleet_path.write_text(_rekinded(DEFAULT_FLEET_PATH.read_text()))
        r = c.post("/v1/fleet/reload")
        assert r.status_code == 200 and r.json()["changed"], r.text
        new = traffic()
    today = load_fleet(fleet_path)
    assert today.targets["onprem-70b"].kind == "frontier"
    db = tmp_path / "data" / "outcomes.db"
    with OutcomeLog(db) as log:
        wait(lambda: log.counts()["decisions"] == 4, "the four decisions logged")
        ex = logged_examples(log, LabelRules(), today)
        # fleet A: the 70B's 0.2 is a weak answer below frontier-large's 0.5 (one of two weak answers worse);
        # fleet B: the 70B is frontier, onprem-8b's 0.9 beats both frontier answers
        assert dict(zip(ex.decision_id, ex.y)) == {old: 0.5, new: 0.0} and ex.by_today_fleet == 0
        # the long decision to onprem-70b is on-prem under fleet A, frontier under fleet B
        assert logged_frontier_share(log, LabelRules().strong_tier(today, log.fleet_kinds())) == 0.25
    with sqlite3.connect(db) as conn:  # a log written before fleet revisions were kept: today's fleet, counted
        conn.execute("DELETE FROM fleet_revisions")
    with OutcomeLog(db) as log:
        ex = logged_examples(log, LabelRules(), today)
        assert dict(zip(ex.decision_id, ex.y)) == {old: 0.0, new: 0.0} and ex.by_today_fleet == 2
        # an explicit strong_targets rule still decides alone
        ex = logged_examples(log, LabelRules(strong_targets=("frontier-large",)), today)
        assert dict(zip(ex.decision_id, ex.y)) == {old: 0.5, new: 0.5} and ex.by_today_fleet == 0


def test_a_fleet_replaced_right_after_its_reload_is_kept_too(tmp_path: Path):
    """Two fleet reloads back to back (the file watcher, an admin call, another worker's announcement), a decision made
    on the first fleet in between: the first one's kinds are kept under its revision too. Before, the reload's hook
    (after the reload lock) kept the fleet serving when it ran: the second, so the first fleet's decisions were labelled
    by today's fleet. The interleaving is forced in the real app: the first reload's hook routes, then reloads again."""
    from fastapi.testclient import TestClient

    from pointsman.service.app import create_app
    from pointsman.service.settings import Settings

    fleet_path, policy_path = tmp_path / "fleet.yaml", tmp_path / "policy.yaml"
    fleet_path.write_text(DEFAULT_FLEET_PATH.read_text())
    policy_path.write_text(POLICY)
    settings = Settings(data_dir=tmp_path / "data", fleet_path=fleet_path, policy_path=policy_path, watch_policy=False,
                        watch_fleet=False, watch_budgets=False, scrape_interval_s=0)
    decided: list[str] = []
    with TestClient(create_app(settings)) as c:
        rt = c.app.state.runtime  # type: ignore[attr-defined]
        hook = rt.record_fleet_reload

        def then_decided_and_reloaded(result):
            if not decided:
                decided.append(c.post("/v1/route", json=LONG).json()["fleet_revision"])
                fleet_path.write_text(DEFAULT_FLEET_PATH.read_text())
                assert rt.reload_file("fleet").changed
            hook(result)

        rt.record_fleet_reload = then_decided_and_reloaded
        fleet_path.write_text(_rekinded(DEFAULT_FLEET_PATH.read_text()))
        assert c.post("/v1/fleet/reload").json()["changed"]
        fleet_path.write_text(_rekinded(DEFAULT_FLEET_PATH.read_text()))  # the first fleet's file, to read its revision
        assert decided == [load_fleet(fleet_path).revision] != [rt.live.engine.fleet.revision]  # made on the first
    with OutcomeLog(tmp_path / "data" / "outcomes.db") as log:
        kinds = log.fleet_kinds()
    assert kinds.get(decided[0], {}).get("onprem-70b") == "frontier", kinds
