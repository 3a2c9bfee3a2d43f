"""Every shipped policy passes its sibling cases file; the runner reports mismatches."""

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pointsman.errors import PolicyError
from pointsman.policy.cases import run_cases
from pointsman.policy.rules.compiler import DEFAULT_POLICY_DIR

CASES = sorted(DEFAULT_POLICY_DIR.glob("*.cases.yaml"))


def test_every_shipped_policy_has_cases():
    policies = {p.name.removesuffix(".yaml") for p in DEFAULT_POLICY_DIR.glob("*.yaml") if not p.name.endswith(".cases.yaml")}
    assert policies and policies == {p.name.removesuffix(".cases.yaml") for p in CASES}


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.name)
def test_shipped_cases_pass(path):
    results = run_cases(path)
    assert results
    failed = [f"{r.name}: {r.message}" for r in results if not r.passed]
    assert not failed


def test_a_wrong_expectation_fails_with_a_message(tmp_path: Path):
    (tmp_path / "p.yaml").write_text((DEFAULT_POLICY_DIR / "static.yaml").read_text())
    (tmp_path / "p.cases.yaml").write_text(
        "apiVersion: pointsman/v1\nkind: PolicyCases\npolicy: p.yaml\ncases:\n"
        "  - name: wrong\n    signals: {difficulty: {p_hard: 0.9}}\n    expect: {target: onprem-8b, rule: default}\n")
    [r] = run_cases(tmp_path / "p.cases.yaml")
    assert not r.passed
    assert r.message == "target: expected 'onprem-8b', got 'frontier-large'; rule: expected 'default', got 'hard-prompt'"


@pytest.mark.parametrize("cases, problem", [
    ("  - name: nothing checked\n    signals: {difficulty: {p_hard: 0.9}}\n    expect: {}\n",
     ":7:13: invalid-value: cases[0].expect: a case must expect something"),
    ("  - name: only nulls\n    signals: {difficulty: {p_hard: 0.9}}\n    expect: {target: null}\n",
     ":7:13: invalid-value: cases[0].expect: a case must expect something"),
    ("  []\n", ":5:3: invalid-value: cases: List should have at least 1 item"),
    # an error and a target: the target was never checked when the error came (passed)
    ("  - name: both\n    signals: {budget: {limited: true, remaining_usd: 0.0}}\n"
     "    expect: {error: no-eligible-target, target: frontier-large, rule: default}\n",
     ":7:13: invalid-value: cases[0].expect: a case expecting error no-eligible-target has no decision to check "
     "target, rule against"),
])
def test_a_cases_file_that_cannot_fail_is_refused(tmp_path: Path, cases: str, problem: str):
    """`expect: {}` passed whatever the policy decided, and `cases: []` ran nothing: both printed
    '... passed, 0 failed' and exited 0. Now a located problem and exit 1, from `policy test` and `policy check`."""
    from click.testing import CliRunner

    from pointsman.cli.main import main

    (tmp_path / "p.yaml").write_text((DEFAULT_POLICY_DIR / "static.yaml").read_text())
    path = tmp_path / "p.cases.yaml"
    path.write_text("apiVersion: pointsman/v1\nkind: PolicyCases\npolicy: p.yaml\ncases:\n" + cases)
    for command in ("test", "check"):
        res = CliRunner().invoke(main, ["policy", command, str(tmp_path / "p.yaml") if command == "test" else str(path)])
        assert res.exit_code == 1, res.output
        assert f"{path}{problem}" in res.output, res.output


@pytest.mark.parametrize("excluded_by, message", [
    ("{frontier-large: budget}", None),
    ("{frontier-large: health}", "excluded_by[frontier-large]: expected 'health', got 'budget'"),
    ("{onprem-8b: budget}", "excluded_by[onprem-8b]: expected 'budget', got None"),
])
def test_excluded_by_is_checked_when_the_decision_routes(tmp_path: Path, excluded_by: str, message: str | None):
    """`excluded_by` was checked only when no target was eligible: a case that routed passed whatever
    it claimed was excluded (1 of 1 such cases passed with a wrong filter, exit 0)."""
    from click.testing import CliRunner

    from pointsman.cli.main import main

    (tmp_path / "p.yaml").write_text((DEFAULT_POLICY_DIR / "budget-pacing.yaml").read_text())
    (tmp_path / "p.cases.yaml").write_text(
        "apiVersion: pointsman/v1\nkind: PolicyCases\npolicy: p.yaml\ncases:\n"
        "  - name: frontier over budget\n"
        "    signals: {difficulty: {p_hard: 0.99}, budget: {limited: true, remaining_usd: 0.001, limit_usd: 0.01}}\n"
        f"    expect: {{target: onprem-70b, excluded_by: {excluded_by}}}\n")
    res = CliRunner().invoke(main, ["policy", "test", str(tmp_path / "p.cases.yaml")])
    assert res.exit_code == (0 if message is None else 1), res.output
    if message:
        assert message in res.output, res.output


def test_a_case_moves_past_a_target_its_budget_would_refuse(tmp_path: Path):
    """With ``filters: {budget: false}`` the reservation at dispatch refuses a target the budget cannot pay
    (``POST /v1/route`` then takes the fallback), but ``policy test`` passed a case expecting the rule's
    target, frontier-large ($0.0026 against $0.0001 left); now the case sees the fallback, or
    ``no-eligible-target`` when no candidate fits."""
    from click.testing import CliRunner

    from pointsman.cli.main import main

    (tmp_path / "p.yaml").write_text("apiVersion: pointsman/v1\nkind: RoutingPolicy\nfilters: {budget: false}\nrules:\n"
                                     "  - name: big\n    route: {target: frontier-large, fallbacks: [onprem-8b]}\n")
    budget = "{limited: true, remaining_usd: %s, limit_usd: 1.0, scope: 'tenant:tiny', window: day}"
    (tmp_path / "p.cases.yaml").write_text(
        "apiVersion: pointsman/v1\nkind: PolicyCases\npolicy: p.yaml\ncases:\n"
        f"  - name: over budget\n    signals: {{budget: {budget % 0.0001}}}\n    expect: {{target: frontier-large}}\n"
        f"  - name: in budget\n    signals: {{budget: {budget % 0.5}}}\n"
        "    expect: {target: frontier-large, fallbacks: [onprem-8b]}\n"
        f"  - name: fallback\n    signals: {{budget: {budget % 0.0001}}}\n"
        "    expect: {target: onprem-8b, rule: big, fallbacks: [], excluded_by: {frontier-large: budget}}\n"
        f"  - name: nothing fits\n    signals: {{budget: {budget % 0.0}}}\n    expect: {{error: no-eligible-target}}\n")
    res = CliRunner().invoke(main, ["policy", "test", str(tmp_path / "p.cases.yaml")])
    assert res.exit_code == 1, res.output
    assert res.output.splitlines()[0].endswith("over budget: target: expected 'frontier-large', got 'onprem-8b'")
    assert res.output.splitlines()[-1] == "3 passed, 1 failed", res.output


@pytest.mark.parametrize("budget, expect", [
    ("{limited: true, spent_usd: 5.0, limit_usd: 5.0}", "{error: no-eligible-target}"),  # remaining 0
    ("{spent_usd: 5.0, limit_usd: 5.0}", "{error: no-eligible-target}"),  # amounts given: a budget applies
    ("{limit_usd: 0.0}", "{error: no-eligible-target}"),  # a zero budget
    ("{limited: true, spent_usd: 97.0, limit_usd: 100.0, window_elapsed_fraction: 0.9}",
     "{target: onprem-8b, rule: budget-reserve}"),  # spent_fraction 0.97
    ("{limited: true, remaining_usd: 3.0, limit_usd: 100.0}", "{target: onprem-8b, rule: budget-reserve}"),
    ("{limited: true, spent_usd: 70.0, limit_usd: 100.0, window_elapsed_fraction: 0.5}",
     "{target: onprem-70b, rule: medium-prompt}"),  # pace_gap 0.2 raises the bar above 0.72
])
def test_a_case_budget_reads_as_the_amounts_it_gives(tmp_path: Path, budget: str, expect: str):
    """A case's budget fields not given are derived from those given, as the ledger's snapshot would
    have them (remaining = limit - spent, spent_fraction = spent / limit, pace_gap = spent_fraction -
    window_elapsed_fraction; amounts given: a budget applies). Before, each kept its example value: a
    budget spent to its limit ({spent_usd: 5, limit_usd: 5}) still had remaining_usd infinite, so every
    target fitted, and spent_fraction 0 hid 97% spent from budget-pacing's reserve rule: 6 of 6 cases failed
    with the policy routing as if no budget applied (onprem-8b by its default rule, frontier-large at 0.72)."""
    from click.testing import CliRunner

    from pointsman.cli.main import main

    (tmp_path / "p.yaml").write_text((DEFAULT_POLICY_DIR / "budget-pacing.yaml").read_text())
    (tmp_path / "p.cases.yaml").write_text(
        "apiVersion: pointsman/v1\nkind: PolicyCases\npolicy: p.yaml\ncases:\n"
        f"  - name: case\n    signals: {{difficulty: {{p_hard: 0.72}}, budget: {budget}}}\n    expect: {expect}\n")
    res = CliRunner().invoke(main, ["policy", "test", str(tmp_path / "p.cases.yaml")])
    assert res.exit_code == 0, res.output


def test_unknown_signal_in_a_case_is_a_located_error(tmp_path: Path):
    (tmp_path / "p.yaml").write_text((DEFAULT_POLICY_DIR / "static.yaml").read_text())
    path = tmp_path / "p.cases.yaml"
    path.write_text("apiVersion: pointsman/v1\nkind: PolicyCases\npolicy: p.yaml\ncases:\n"
                    "  - name: typo\n    signals:\n      difficulty: {phard: 0.9}\n    expect: {target: onprem-8b}\n")
    with pytest.raises(PolicyError, match=r"p.cases.yaml:7:20: unknown-signal: unknown signal 'difficulty.phard'; did you mean 'p_hard'\?"):
        run_cases(path)


def test_a_missing_policy_or_fleet_is_located_at_the_cases_line_naming_it(tmp_path: Path):
    """A cases file naming a policy (or fleet) that is not there: before, the error named that file at 0:0
    (``p-typo.yaml:0:0: file-not-found``), a file the user never passed; now it is at the ``policy:`` line."""
    (tmp_path / "p.yaml").write_text((DEFAULT_POLICY_DIR / "static.yaml").read_text())
    path = tmp_path / "p.cases.yaml"
    path.write_text("apiVersion: pointsman/v1\nkind: PolicyCases\nfleet: no-fleet.yaml\npolicy: p-typo.yaml\ncases:\n"
                    "  - name: c\n    signals: {difficulty: {p_hard: 0.9}}\n    expect: {target: frontier-large}\n")
    with pytest.raises(PolicyError) as err:
        run_cases(path)
    lines = str(err.value).splitlines()
    assert lines[0].startswith(f"{path}:3:8: file-not-found: fleet: no such file"), lines
    assert lines[1].startswith(f"{path}:4:9: file-not-found: policy: no such file"), lines


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.name)
def test_the_context_grown_rule_by_rule_decides_as_the_whole_one(path):
    """``decide(lazy=True)`` (the engine's path: signals only later rules read are not computed) gives
    every shipped case the same verdict, modes, fallbacks and errors as the context built at once."""
    from pointsman.policy.cases import case_signals, load_cases
    from pointsman.policy.engine import decide
    from pointsman.policy.live import StaticSignals
    from pointsman.policy.selection.filters import NoEligibleTarget

    spec, _, fleet, policy = load_cases(path)
    assert len(policy.rule_plans) == len(policy.rules)
    for case in spec.cases:
        signals = case_signals(fleet, policy, case.signals)
        base = {"request": signals["request"], "difficulty": signals["difficulty"]}
        got = []
        for lazy in (False, True):
            try:
                o = decide(fleet, policy, base, StaticSignals(fleet, policy, signals), lazy=lazy)
            except NoEligibleTarget as exc:
                got.append(("no-eligible-target", exc.exclusions))
                continue
            v = o.verdict
            got.append((v.rule.name, v.target, v.mode, v.fallbacks, v.codes, v.details, o.mode, o.fallbacks,
                        o.exclusions))
        assert got[0] == got[1], case.name


def test_a_verify_case_drafts_on_the_target_the_case_routed_to(tmp_path: Path):
    """The service gives ``draft.target``/``draft.on_prem`` from the decision's target, but a case's draft
    was always written by onprem-8b: ``static.yaml`` routes p_hard 0.9 to frontier-large, whose refusal
    the ``frontier-draft`` rule accepts in the service, while ``policy test`` escalated it
    (``broken-draft``). A case that sets ``draft.target`` keeps it."""
    from click.testing import CliRunner

    from pointsman.cli.main import main

    (tmp_path / "p.yaml").write_text((DEFAULT_POLICY_DIR / "static.yaml").read_text())
    (tmp_path / "p.cases.yaml").write_text(
        "apiVersion: pointsman/v1\nkind: PolicyCases\npolicy: p.yaml\ncases:\n"
        "  - name: a frontier-large refusal is accepted\n"
        "    signals: {difficulty: {p_hard: 0.9}, draft: {refusal: true}}\n"
        "    expect: {target: frontier-large, action: accept, verify_rule: frontier-draft}\n"
        "  - name: a 70B refusal escalates\n"
        "    signals: {difficulty: {p_hard: 0.6}, draft: {refusal: true}}\n"
        "    expect: {target: onprem-70b, action: escalate, escalate_to: frontier-small, verify_rule: broken-draft}\n"
        "  - name: a draft the case names keeps its writer\n"
        "    signals: {difficulty: {p_hard: 0.9}, draft: {refusal: true, target: onprem-70b, on_prem: true}}\n"
        "    expect: {action: escalate, verify_rule: broken-draft}\n")
    res = CliRunner().invoke(main, ["policy", "test", str(tmp_path / "p.cases.yaml")])
    assert res.exit_code == 0, res.output
    assert res.output.splitlines()[-1] == "3 passed, 0 failed", res.output


def test_a_cases_routing_names_are_read_as_the_service_reads_them(tmp_path: Path):
    """The service reads ``routing.tenant`` in one form (NFC, no zero-width characters), so a tenant
    "café" written decomposed, or "acme" with a zero-width space, matches ``request.tenant == "café"``
    (``pointsman route --tenant`` says rule ``cafe``); ``policy test`` compared the raw string and
    said ``d``."""
    from click.testing import CliRunner

    from pointsman.cli.main import main

    (tmp_path / "p.yaml").write_text(
        "apiVersion: pointsman/v1\nkind: RoutingPolicy\nrules:\n"
        "  - name: cafe\n    when: request.tenant == 'café' && request.team == 'acme'\n"
        "    route: {target: frontier-large}\n  - name: d\n    route: {target: onprem-8b}\n", encoding="utf-8")
    (tmp_path / "p.cases.yaml").write_text(
        "apiVersion: pointsman/v1\nkind: PolicyCases\npolicy: p.yaml\ncases:\n"
        "  - name: decomposed\n    signals: {request: {tenant: \"cafe\\u0301\", team: \"ac\\u200bme\"}}\n"
        "    expect: {rule: cafe, target: frontier-large}\n", encoding="utf-8")
    res = CliRunner().invoke(main, ["policy", "test", str(tmp_path / "p.cases.yaml")])
    assert res.exit_code == 0, res.output
    assert res.output.splitlines()[-1] == "1 passed, 0 failed", res.output


@pytest.mark.parametrize("signals, problem", [
    ('{difficulty: {p_hard: "0.9"}}', 'difficulty.p_hard: Input should be a valid number'),
    ("{difficulty: {p_hard: 7}}", "difficulty.p_hard: Input should be less than or equal to 1"),
    ("{difficulty: {p_hard: -0.1}}", "difficulty.p_hard: Input should be greater than or equal to 0"),
    ("{difficulty: {p_hard: true}}", "difficulty.p_hard: Input should be a valid number"),
    ('{difficulty: {available: "false"}}', "difficulty.available: Input should be a valid boolean"),
    ('{request: {prompt_tokens: "200"}}', "request.prompt_tokens: Input should be a valid integer"),
    ("{cache: {prefix_hit_ratio: 1.5}}", 'cache["onprem-8b"].prefix_hit_ratio: Input should be less than or equal to 1'),
    ("{load: {onprem-8b: {kv_cache_usage: 2}}}",
     'load["onprem-8b"].kv_cache_usage: Input should be less than or equal to 1'),
    ('{draft: {p_bad: "0.2"}}', "draft.p_bad: Input should be a valid number"),
])
def test_a_case_signal_is_typed_as_the_service_types_it(tmp_path: Path, signals: str, problem: str):
    """``p_hard: "0.9"`` read as the number 0.9 and ``p_hard: 7`` as a probability of 7 (both cases
    passed, exit 0; so did ``"false"`` for a bool and ``"200"`` for an int): a case's value is held to
    the signal's type, a share or probability to [0, 1]; a located error naming the field, exit 1."""
    from click.testing import CliRunner

    from pointsman.cli.main import main

    (tmp_path / "p.yaml").write_text((DEFAULT_POLICY_DIR / "static.yaml").read_text())
    path = tmp_path / "p.cases.yaml"
    path.write_text("apiVersion: pointsman/v1\nkind: PolicyCases\npolicy: p.yaml\ncases:\n"
                    f"  - name: typed\n    signals: {signals}\n    expect: {{target: frontier-large}}\n")
    res = CliRunner().invoke(main, ["policy", "test", str(path)])
    assert res.exit_code == 1, res.output
    assert f"{path}:6:5: invalid-value: {problem}\n" in res.output, res.output


@given(st.one_of(st.floats(), st.integers(), st.none()))
def test_a_case_p_hard_is_read_iff_a_probability_or_null(p_hard):
    from pointsman.policy.cases import case_signals
    from pointsman.policy.fleet import DEFAULT_FLEET_PATH, load_fleet
    from pointsman.policy.rules.compiler import load_policy

    fleet = load_fleet(DEFAULT_FLEET_PATH)
    policy = load_policy(DEFAULT_POLICY_DIR / "static.yaml", fleet)
    ok = p_hard is None or 0 <= p_hard <= 1
    try:
        signals = case_signals(fleet, policy, {"difficulty": {"p_hard": p_hard}})
    except ValueError as exc:
        assert not ok, exc
        assert str(exc).startswith("difficulty.p_hard: ")
    else:
        assert ok and signals["difficulty"]["p_hard"] == p_hard


def test_a_case_moves_past_a_target_with_no_healthy_endpoint_as_the_engine_does(tmp_path: Path):
    """With the ``health`` filter off, the engine still never places a request on a target with no healthy
    endpoint: it takes the next fallback (``engine.place``). ``policy test`` passed a case expecting the
    down target, which the serving engine (shown here on a real ``RoutingEngine``) never picks."""
    from pointsman.estimator.estimate import FixedDifficulty
    from pointsman.policy.engine import RoutingEngine
    from pointsman.policy.fleet import load_fleet
    from pointsman.policy.rules.compiler import load_policy
    from pointsman.request import parse_route_request

    (tmp_path / "p.yaml").write_text("apiVersion: pointsman/v1\nkind: RoutingPolicy\nfilters: {health: false}\nrules:\n"
                                     "  - name: d\n    route: {target: onprem-70b, fallbacks: [onprem-8b]}\n")
    (tmp_path / "p.cases.yaml").write_text(
        "apiVersion: pointsman/v1\nkind: PolicyCases\npolicy: p.yaml\ncases:\n"
        "  - name: the 70B pools are down\n    signals: {load: {onprem-70b: {healthy_endpoints: 0}}}\n"
        "    expect: {target: onprem-8b, rule: d, fallbacks: [], excluded_by: {onprem-70b: health}}\n"
        "  - name: every pool is down\n    signals: {load: {onprem-70b: {healthy_endpoints: 0}, onprem-8b: {healthy_endpoints: 0}}}\n"
        "    expect: {error: no-eligible-target, excluded_by: {onprem-70b: health, onprem-8b: health}}\n")
    results = run_cases(tmp_path / "p.cases.yaml")
    assert [(r.passed, r.message) for r in results] == [(True, ""), (True, "")]
    fleet = load_fleet()
    engine = RoutingEngine(fleet, load_policy(tmp_path / "p.yaml", fleet), FixedDifficulty(0.3))
    for pool in fleet.targets["onprem-70b"].pools_by_role().values():
        for e in pool.endpoints:
            engine.state.set_health(e.name, False, "down")
    d = engine.route(parse_route_request({"messages": [{"role": "user", "content": "hi"}]}), dispatch=False)
    assert (d.rule, d.target) == ("d", "onprem-8b")


_P_HARD_ONLY = ("apiVersion: pointsman/v1\nkind: RoutingPolicy\nrules:\n"
                "  - name: hard\n    when: difficulty.p_hard >= 0.4\n    route: {target: frontier-large}\n"
                "  - name: default\n    route: {target: onprem-8b}\n")


def test_a_case_without_the_estimator_reads_p_hard_null_as_the_service(tmp_path: Path, monkeypatch):
    """Without the estimator the service reads `difficulty.p_hard` null (a rule comparing it errors and is
    skipped): POST /v1/route answered rule `default`. A case giving `difficulty: {available: false}` alone
    kept the example p_hard 0.5, so `policy test` said `hard` (frontier-large) and passed a case that the
    service contradicts. Now each follows from the other, and a case giving both in a form the service
    never reads (a p_hard without the estimator) is a located error."""
    from click.testing import CliRunner
    from fastapi.testclient import TestClient

    from pointsman.cli.main import main
    from pointsman.service.app import create_app

    (tmp_path / "p.yaml").write_text(_P_HARD_ONLY)
    cases = tmp_path / "p.cases.yaml"
    head = "apiVersion: pointsman/v1\nkind: PolicyCases\npolicy: p.yaml\ncases:\n"
    cases.write_text(head + "  - name: estimator down\n    signals: {difficulty: {available: false}}\n"
                     "    expect: {target: onprem-8b, rule: default}\n"
                     "  - name: p_hard null\n    signals: {difficulty: {p_hard: null}}\n"
                     "    expect: {target: onprem-8b, rule: default}\n")
    res = CliRunner().invoke(main, ["policy", "test", str(cases)])
    assert res.exit_code == 0, res.output

    monkeypatch.setenv("POINTSMAN_MODEL", str(tmp_path / "no-such-model"))
    monkeypatch.setenv("POINTSMAN_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("POINTSMAN_POLICY_PATH", str(tmp_path / "p.yaml"))
    with TestClient(create_app()) as c:
        assert c.get("/healthz").json()["estimator"]["available"] is False
        d = c.post("/v1/route", json={"messages": [{"role": "user", "content": "Prove sqrt(2) is irrational."}]}).json()
    assert (d["target"], d["rule"], d["p_hard"]) == ("onprem-8b", "default", None)

    cases.write_text(head + "  - name: both\n    signals: {difficulty: {available: false, p_hard: 0.9}}\n"
                     "    expect: {target: onprem-8b}\n")
    res = CliRunner().invoke(main, ["policy", "check", str(cases)])
    assert res.exit_code == 1
    assert f"{cases}:6:5: invalid-value: difficulty.p_hard: null when difficulty.available is false" in res.output, res.output


def test_a_case_load_counts_its_queue_in_outstanding_requests_as_the_service(tmp_path: Path, monkeypatch):
    """The service reads `outstanding_requests` as running + waiting when the engines report both: ten
    waiting on the 8B endpoints (POST /v1/telemetry) overflow a rule `outstanding_requests > 8`. A case
    giving `num_requests_waiting: 10` kept the example's 0 outstanding, so `policy test` stayed on-prem and
    passed a case the service contradicts."""
    from click.testing import CliRunner
    from fastapi.testclient import TestClient

    from pointsman.cli.main import main
    from pointsman.service.app import create_app

    (tmp_path / "p.yaml").write_text(
        "apiVersion: pointsman/v1\nkind: RoutingPolicy\nrules:\n"
        "  - name: overflow\n    when: load[\"onprem-8b\"].outstanding_requests > 8\n    route: {target: frontier-small}\n"
        "  - name: default\n    route: {target: onprem-8b}\n")
    cases = tmp_path / "p.cases.yaml"
    cases.write_text("apiVersion: pointsman/v1\nkind: PolicyCases\npolicy: p.yaml\ncases:\n"
                     "  - name: a queue of ten\n    signals: {load: {onprem-8b: {num_requests_waiting: 10}}}\n"
                     "    expect: {target: frontier-small, rule: overflow}\n"
                     "  - name: no telemetry, nine in flight\n"
                     "    signals: {load: {onprem-8b: {num_requests_running: null, num_requests_waiting: null, "
                     "inflight_requests: 9}}}\n"
                     "    expect: {target: frontier-small, rule: overflow}\n")
    res = CliRunner().invoke(main, ["policy", "test", str(cases)])
    assert res.exit_code == 0, res.output

    monkeypatch.setenv("POINTSMAN_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("POINTSMAN_POLICY_PATH", str(tmp_path / "p.yaml"))
    with TestClient(create_app()) as c:
        for ep, waiting in (("llama-8b-0", 6), ("llama-8b-1", 4)):
            load = {"num_requests_running": 0, "num_requests_waiting": waiting}
            assert c.post("/v1/telemetry", json={"endpoint": ep, "load": load}).status_code == 200
        d = c.post("/v1/route", json={"messages": [{"role": "user", "content": "hi"}]}).json()
    assert (d["target"], d["rule"]) == ("frontier-small", "overflow")


def test_a_case_cache_hit_ratio_prices_its_cached_prefix_as_the_service(tmp_path: Path, monkeypatch):
    """The service prices `cost()` with the cached prefix its `cache.prefix_hit_ratio` reads: a follow-up of
    a ~100k-token prompt sent to frontier-small reads 0.998 and costs $0.0079 there, so a rule
    `cost("frontier-small") < 0.01` fires (POST /v1/route). A case giving `prefix_hit_ratio: 0.95` alone kept
    0 `prefix_hit_tokens`, which is what its cost() read: $0.0152, and `policy test` routed by `default`.
    Each now follows from the other and the case's prompt tokens."""
    from click.testing import CliRunner
    from fastapi.testclient import TestClient

    from pointsman.cli.main import main
    from pointsman.service.app import create_app

    (tmp_path / "p.yaml").write_text(
        "apiVersion: pointsman/v1\nkind: RoutingPolicy\nrules:\n"
        "  - name: force\n    when: request.tenant == \"force\"\n    route: {target: frontier-small}\n"
        "  - name: cheap-with-cache\n    when: cost(\"frontier-small\") < 0.01\n    route: {target: frontier-small}\n"
        "  - name: default\n    route: {target: onprem-70b}\n")
    cases = tmp_path / "p.cases.yaml"
    cases.write_text("apiVersion: pointsman/v1\nkind: PolicyCases\npolicy: p.yaml\ncases:\n"
                     "  - name: a 95% cached 100k prompt\n"
                     "    signals: {request: {prompt_tokens: 100000}, cache: {frontier-small: {prefix_hit_ratio: 0.95}}}\n"
                     "    expect: {target: frontier-small, rule: cheap-with-cache}\n"
                     "  - name: a cold 100k prompt\n"
                     "    signals: {request: {prompt_tokens: 100000}}\n"
                     "    expect: {target: onprem-70b, rule: default}\n"
                     "  - name: 95k cached tokens of 100k\n"
                     "    signals: {request: {prompt_tokens: 100000}, cache: {prefix_hit_tokens: 95000}}\n"
                     "    expect: {target: frontier-small, rule: cheap-with-cache}\n")
    res = CliRunner().invoke(main, ["policy", "test", str(cases)])
    assert res.exit_code == 0, res.output

    monkeypatch.setenv("POINTSMAN_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("POINTSMAN_POLICY_PATH", str(tmp_path / "p.yaml"))
    text = " ".join(f"Row {i}: sensor {i % 17} read {i * 31 % 997} units at station {i % 29}." for i in range(5000))
    first = [{"role": "user", "content": text + " Which station has the highest mean?"}]
    follow_up = [*first, {"role": "assistant", "content": "Station 3."}, {"role": "user", "content": "And the lowest?"}]
    with TestClient(create_app()) as c:
        forced = c.post("/v1/route", json={"messages": first, "routing": {"tenant": "force"}}).json()
        d = c.post("/v1/route", json={"messages": follow_up, "routing": {"explain": True}}).json()
    assert forced["prompt_tokens"] > 90_000 and forced["estimated_cost_usd"] > 0.01
    assert d["trace"]["signals"]['cost("frontier-small")']["value"] < 0.01
    assert (d["target"], d["rule"]) == ("frontier-small", "cheap-with-cache")


def test_a_case_prediction_meets_the_slo_as_the_service_scores_it(tmp_path: Path, monkeypatch):
    """The service's `predict[t].meets_slo` and `slo_score` follow from the predicted times and the request's
    SLO class. A case giving `ttft_s: 3.0` alone kept the example's `meets_slo: true` (and objectives of 2 s
    and 0.1 s whatever its `request.slo_class`), so a rule `!predict["onprem-70b"].meets_slo` never fired in
    `policy test`, while POST /v1/route overflows once the 70B endpoints report 10 waiting requests of a long
    prompt (an idle 70B meets the SLO)."""
    from click.testing import CliRunner
    from fastapi.testclient import TestClient

    from pointsman.cli.main import main
    from pointsman.service.app import create_app

    (tmp_path / "p.yaml").write_text(
        "apiVersion: pointsman/v1\nkind: RoutingPolicy\nrules:\n"
        "  - name: overflow\n    when: '!predict[\"onprem-70b\"].meets_slo'\n    route: {target: frontier-small}\n"
        "  - name: default\n    route: {target: onprem-70b}\n")
    cases = tmp_path / "p.cases.yaml"
    cases.write_text("apiVersion: pointsman/v1\nkind: PolicyCases\npolicy: p.yaml\ncases:\n"
                     "  - name: 3 s misses the interactive 2 s\n    signals: {predict: {onprem-70b: {ttft_s: 3.0}}}\n"
                     "    expect: {target: frontier-small, rule: overflow}\n"
                     "  - name: 3 s meets the long-context 6 s\n"
                     "    signals: {request: {slo_class: long-context}, predict: {onprem-70b: {ttft_s: 3.0}}}\n"
                     "    expect: {target: onprem-70b, rule: default}\n"
                     "  - name: a score over 1\n    signals: {predict: {onprem-70b: {slo_score: 1.5}}}\n"
                     "    expect: {target: frontier-small, rule: overflow}\n")
    res = CliRunner().invoke(main, ["policy", "test", str(cases)])
    assert res.exit_code == 0, res.output

    monkeypatch.setenv("POINTSMAN_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("POINTSMAN_POLICY_PATH", str(tmp_path / "p.yaml"))
    text = " ".join(f"Clause {i}: the tenant shall pay {i * 13 % 97} units by day {i % 28}." for i in range(700))
    body = {"messages": [{"role": "user", "content": text}], "routing": {"explain": True}}
    with TestClient(create_app()) as c:
        idle = c.post("/v1/route", json=body).json()
        for ep in c.app.state.fleet_state.fleet.endpoints:
            if "llama-70b" in ep:
                load = {"num_requests_running": 1, "num_requests_waiting": 10}
                assert c.post("/v1/telemetry", json={"endpoint": ep, "load": load}).status_code == 200
        busy = c.post("/v1/route", json=body).json()
    assert busy["trace"]["signals"]['predict["onprem-70b"].meets_slo']["value"] is False
    assert (idle["rule"], busy["rule"]) == ("default", "overflow")
