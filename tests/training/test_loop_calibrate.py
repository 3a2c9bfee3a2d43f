"""Calibration: thresholds from recent logged traffic, written into the policy through
validation (atomic, comments kept, invalid results refused); report numbers by hand."""

from __future__ import annotations

import json
import shutil

import click
import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pointsman.cli.loop import register
from pointsman.errors import PolicyError
from pointsman.estimator.model_source import load_estimator
from pointsman.outcome_log.records import DecisionRecord
from pointsman.outcome_log.store import OutcomeLog, record_decision
from pointsman.policy.engine import RoutingEngine
from pointsman.policy.fleet import load_fleet
from pointsman.policy.rules.compiler import DEFAULT_POLICY_DIR, STATIC_POLICY_PATH, load_policy
from pointsman.request import request_from_prompt
from pointsman.training import calibrate as C
from pointsman.training.reports import confusion, drift, operating_threshold

NOW = 1_750_000_000.0


@pytest.fixture(scope="module")
def fleet():
    return load_fleet()


def record(i: int, p: float, prompt_tokens: int = 1000, t: float = NOW - 3600) -> DecisionRecord:
    return DecisionRecord(
        decision_id=f"d{i:05d}", time_s=t, target="onprem-8b", model="m", mode="aggregated", rule="default", p_hard=p,
        difficulty_available=True, estimated_cost_usd=0.0, estimator_version="v1", policy_revision="p",
        fleet_revision="f", request_features={"prompt_tokens": prompt_tokens, "max_output_tokens": None},
        prompt_sha256="0" * 64, conversation_key=f"{i:016x}")


def test_thresholds_by_share_and_by_budget(tmp_path, fleet):
    p = np.arange(1, 101) / 100.0  # 0.01 .. 1.00
    assert C.threshold_for_share(p, 0.2) == 0.81  # 0.81 .. 1.00: 20 requests
    assert C.threshold_for_share(p, 0.0) == 1.0
    cost = np.full(100, 0.5)  # $0.50 each
    t, spend = C.threshold_for_budget(p, cost, span_days=2.0, budget_usd_per_day=5.0)  # $10 over 2 days: 20 requests
    assert (t, spend) == (0.81, 5.0)
    assert C.threshold_for_budget(p, cost, 2.0, 0.1)[0] == 1.0  # even the hardest one is over budget
    assert C.threshold_for_budget(p, cost, 1.0, 1000.0)[0] == 0.01

    with OutcomeLog(tmp_path / "log.db") as log:
        log.append_decisions([record(i, float(p[i]), t=NOW - 86400 + 864 * i) for i in range(100)])
        traffic = C.recent_traffic(log, fleet, "frontier-large", None, since_s=NOW - 86400, until_s=NOW)
    # 1000 prompt tokens and the fleet's output estimate at frontier-large list prices.
    target = fleet.targets["frontier-large"]
    one = (1000 * target.prices.usd_per_1m_input_tokens
           + fleet.output_tokens("frontier-large", None) * target.prices.usd_per_1m_output_tokens) / 1e6
    np.testing.assert_allclose(traffic.frontier_cost_usd, one)
    assert traffic.span_days == 1.0 and traffic.rescored == 0  # the traffic spans the whole day
    cal = C.calibrate(traffic, "p_hard_frontier", budget_usd_per_day=10 * one)
    assert (cal.threshold, cal.frontier_share, cal.method) == (0.91, 0.1, "budget")
    assert cal.spend_usd_per_day == pytest.approx(10 * one)
    clamped = C.calibrate(traffic, "p_hard_frontier", frontier_share=0.5, bounds=(0.6, 0.9))
    assert clamped.threshold == 0.6 and "clamped from 0.51" in clamped.note
    with pytest.raises(ValueError, match="exactly one"):
        C.calibrate(traffic, "x")


_P_HARD = st.one_of(st.sampled_from([0.0, 2.7e-7, 4.8e-7, 4.8e-5, 1e-9, 0.65, 0.72]),
                    st.floats(0.0, 1.0, allow_nan=False))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(p=st.lists(_P_HARD, min_size=1, max_size=60), share=st.floats(0.0, 1.0))
def test_the_written_threshold_routes_the_reported_share(tmp_path, fleet, p, share):
    """Invariant over generated logs: the value written into the policy file, read back, routes
    exactly the requests the report counts (``frontier_share``), however close the p_hard values
    sit (a threshold of 2.7e-7 was written as 0.0 and routed everything)."""
    p = np.asarray(p)
    traffic = C.RecentTraffic(p, np.full(len(p), 0.01), 1.0, 0, {})
    cal = C.calibrate(traffic, "p_hard_frontier", frontier_share=share)
    path = tmp_path / "policy.yaml"
    shutil.copyfile(STATIC_POLICY_PATH, path)
    C.write_policy(path, cal.updates, fleet)
    written = load_policy(path, fleet).variables["p_hard_frontier"]
    assert written == cal.threshold
    assert float(np.mean(p >= written)) == cal.frontier_share
    assert cal.frontier_share == float(np.mean(p >= C.threshold_for_share(p, share)))
    if abs(cal.frontier_share - share) > max(0.02, 1 / len(p)):
        assert "nearest share" in cal.note  # ties: the report says so


@settings(max_examples=60, deadline=None)
@given(rows=st.lists(st.tuples(_P_HARD, st.booleans(), st.floats(0.0, 0.1)), min_size=1, max_size=60),
       share=st.floats(0.0, 1.0), budget=st.floats(0.0, 2.0))
def test_the_reported_share_and_spend_are_what_the_rule_routes(rows, share, budget):
    """Invariant: with decisions the rule never routes (``routable`` false: its other conditions), the
    reported share and $/day are those of the decisions routable and at or above the written threshold,
    and a budget threshold's spend stays within the budget (unless even the hardest alone is over it)."""
    p = np.asarray([r[0] for r in rows])
    routable = np.asarray([r[1] for r in rows])
    cost = np.asarray([r[2] for r in rows])
    traffic = C.RecentTraffic(p, cost, 1.0, 0, {}, routable)
    for cal in (C.calibrate(traffic, "x", frontier_share=share), C.calibrate(traffic, "x", budget_usd_per_day=budget)):
        routed = routable & (p >= cal.threshold)
        assert cal.frontier_share == float(np.mean(routed))
        assert cal.spend_usd_per_day == pytest.approx(float(cost[routed].sum()))
    assert cal.spend_usd_per_day <= budget * (1 + 1e-9) or cal.threshold == 1.0  # 1.0: the hardest alone is over


def test_write_policy_keeps_the_file_and_refuses_invalid_results(tmp_path, fleet):
    path = tmp_path / "policy.yaml"
    shutil.copyfile(STATIC_POLICY_PATH, path)
    before = path.read_text()
    C.write_policy(path, {"p_hard_frontier": 0.4321}, fleet, "pointsman calibrate: test")
    after = path.read_text()
    changed = [(a, b) for a, b in zip(before.splitlines(), after.splitlines()) if a != b]
    assert len(before.splitlines()) == len(after.splitlines()) and len(changed) == 1
    assert changed[0][1].strip() == "p_hard_frontier: 0.4321  # pointsman calibrate: test"
    assert load_policy(path, fleet).variables["p_hard_frontier"] == 0.4321
    assert not list(tmp_path.glob(".policy.yaml.*"))  # no temporary file left behind

    with pytest.raises(PolicyError, match="unknown-variable: variables has no 'p_hard_frontir'; did you mean"):
        C.write_policy(path, {"p_hard_frontir": 0.5}, fleet)
    bad = tmp_path / "int.yaml"
    bad.write_text("apiVersion: pointsman/v1\nkind: RoutingPolicy\nvariables:\n  scale: 2\nrules:\n"
                   "  - name: big\n    when: request.prompt_tokens * variables.scale > 1000\n"
                   "    route: {target: frontier-large}\n  - name: default\n    route: {target: onprem-8b}\n")
    text = bad.read_text()
    with pytest.raises(PolicyError, match=r"int.yaml:7:\d+: type-error"):
        C.write_policy(bad, {"scale": 0.5}, fleet)  # int * double has no overload in CEL
    assert bad.read_text() == text


def test_packaged_policies_round_trip_unchanged():
    for path in sorted(DEFAULT_POLICY_DIR.glob("*.yaml")):
        if path.name.endswith(".cases.yaml"):
            continue
        text = path.read_text()
        assert C.rewrite_variables(text, {}, str(path)) == text, path.name


def test_budget_pacing_bounds(tmp_path, fleet):
    path = tmp_path / "pacing.yaml"
    shutil.copyfile(DEFAULT_POLICY_DIR / "budget-pacing.yaml", path)
    traffic = C.RecentTraffic(np.linspace(0.0, 1.0, 101), np.full(101, 0.01), 1.0)
    cal = C.calibrate(traffic, "p_hard_frontier", budget_usd_per_day=0.2, pace_bound=0.95)
    assert cal.updates == {"p_hard_frontier": 0.81, "pace_gain": 0.14}  # 20 requests of $0.01
    C.write_policy(path, cal.updates, fleet)
    v = load_policy(path, fleet).variables
    assert (v["p_hard_frontier"], v["pace_gain"]) == (0.81, 0.14)
    with pytest.raises(ValueError, match="pace bound"):
        C.calibrate(traffic, "p_hard_frontier", frontier_share=0.1, pace_bound=0.5)


def test_report_numbers_by_hand():
    q = [k / 10 for k in range(1, 10)]
    same = drift(q, np.arange(0.05, 1.0, 0.1))  # one value in each decile bin
    assert same["psi"] == pytest.approx(0.0) and same["ks"] == pytest.approx(0.0)
    shifted = drift(q, np.full(50, 0.05))  # everything in the first bin
    psi = 0.9 * np.log(10) + 9 * (1e-4 - 0.1) * np.log(1e-4 / 0.1)
    assert shifted["psi"] == pytest.approx(psi) and shifted["ks"] == pytest.approx(0.9)
    p = np.array([0.9, 0.8, 0.2, 0.1])
    assert operating_threshold(p, 0.5) == 0.8
    got = confusion(np.array([1.0, 0.0, 1.0, 0.0]), p, 0.8)
    assert (got["tp"], got["fp"], got["fn"], got["tn"], got["frontier_share"]) == (1, 1, 1, 1, 0.5)


def test_calibrate_command(tmp_path, monkeypatch, fleet):
    monkeypatch.setenv("POINTSMAN_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("POINTSMAN_POLICY_PATH", raising=False)
    est = load_estimator("bundled")
    engine = RoutingEngine(fleet, load_policy(STATIC_POLICY_PATH, fleet), est)
    prompts = [f"Question {i}: " + ("prove the theorem about primes" if i % 3 else "say hi") for i in range(30)]
    with OutcomeLog() as log:
        for text in prompts:
            request = request_from_prompt(text)
            record_decision(log, engine.route(request, dispatch=False), request, est)
        logged = log.p_hard_window()
    policy = tmp_path / "policy.yaml"
    shutil.copyfile(STATIC_POLICY_PATH, policy)
    cli = click.Group()
    register(cli)
    res = CliRunner().invoke(cli, ["calibrate", "--frontier-share", "0.2", "--policy", str(policy), "--json"])
    assert res.exit_code == 0, res.output
    want = float(np.quantile(logged, 0.8, method="higher"))
    written = load_policy(policy, fleet).variables["p_hard_frontier"]  # the shortest decimal routing the same rows
    assert written <= want and np.array_equal(np.asarray(logged) >= written, np.asarray(logged) >= want)
    res = CliRunner().invoke(cli, ["calibrate", "--frontier-share", "0.2"])
    assert res.exit_code == 2 and "packaged policies are never written" in res.output
    res = CliRunner().invoke(cli, ["calibrate", "--policy", str(policy)])
    assert res.exit_code == 2 and "exactly one of" in res.output
    res = CliRunner().invoke(cli, ["calibrate", "--policy", str(policy), "--frontier-share", "0.2",
                                   "--since", "yesterday"])
    assert res.exit_code == 2 and "--since: expected Unix seconds or an ISO 8601 time" in res.output


def test_calibrate_warns_when_less_than_a_day_backs_the_projection(tmp_path, monkeypatch, fleet):
    monkeypatch.setenv("POINTSMAN_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    est = load_estimator("bundled")
    engine = RoutingEngine(fleet, load_policy(STATIC_POLICY_PATH, fleet), est)
    with OutcomeLog() as log:  # a few minutes of traffic, logged just now
        for i in range(20):
            request = request_from_prompt(f"Question {i}: prove the theorem about primes")
            record_decision(log, engine.route(request, dispatch=False), request, est)
    policy = tmp_path / "policy.yaml"
    shutil.copyfile(STATIC_POLICY_PATH, policy)
    cli = click.Group()
    register(cli)
    res = CliRunner().invoke(cli, ["calibrate", "--budget-usd-per-day", "5", "--policy", str(policy), "--json",
                                   "--model", "bundled", "--dry-run"])
    assert res.exit_code == 0, res.output
    warning = json.loads(res.stdout)["warnings"][0]
    assert warning.startswith("the $/day projection rests on 20 decisions over ")
    assert " min of logged traffic (less than 1 day)" in warning  # logged in seconds (before: "1.0 h")
    assert res.stderr.startswith(f"Warning: {warning}")  # before: no warning
    text = CliRunner().invoke(cli, ["calibrate", "--budget-usd-per-day", "5", "--policy", str(policy),
                                    "--model", "bundled", "--dry-run"])
    assert text.exit_code == 0 and " min" in text.stdout.split("/day over ")[1]  # before: "over 0.00 days"
    day = C.RecentTraffic(np.zeros(3), np.zeros(3), span_days=1.0)
    assert C.projection_warning(day) is None  # a whole day backs it


def test_budget_threshold_projects_a_short_log_at_its_own_rate(tmp_path, monkeypatch, fleet):
    """20 decisions over the last 10 minutes, each costing ``one`` on frontier-large, and a budget of
    288 x ``one`` a day: 10 minutes of it (1/144 of a day) pays for two requests, the two hardest.
    Before, the span was floored at an hour, so the same log was projected at 1/6 of its rate and the
    threshold sent 12 of 20 (60%) to the frontier: six times the budget."""
    one = _twenty_decisions_over_ten_minutes(tmp_path, monkeypatch, fleet, NOW)
    out = _calibrate_dry_run(tmp_path, 288 * one)
    assert out["span_days"] == pytest.approx(600 / 86400)
    assert (out["threshold"], out["frontier_share"]) == (0.95, 0.1)  # before: 0.45 and 0.6
    assert out["projected_spend_usd_per_day"] == pytest.approx(288 * one)
    assert "over 10.0 min of logged traffic" in out["warnings"][0]


def test_budget_projection_prices_the_prompt_tokens_the_upstream_reported(tmp_path, monkeypatch, fleet):
    """The decision counted 1,000 prompt tokens (the estimator's WordPiece), the frontier's answer reported
    3,000 (what it billed: code and whitespace count more in BPE). Before, the $/day projection priced the
    1,000, so a budget threshold admitted what cost more than the budget."""
    from pointsman.outcome import parse_outcomes

    _log_as_bundled(tmp_path, monkeypatch, [record(i, (i + 1) / 10, t=NOW - 86400 + 8640 * i) for i in range(10)])
    with OutcomeLog() as log:
        log.append_outcomes(parse_outcomes([{"decision_id": f"d{i:05d}", "served_target": "frontier-large",
                                             "usage": {"prompt_tokens": 3000, "completion_tokens": 100}}
                                            for i in range(10)]))
    p = fleet.targets["frontier-large"].prices
    billed = (3000 * p.usd_per_1m_input_tokens + 100 * p.usd_per_1m_output_tokens) / 1e6
    out = _calibrate_dry_run(tmp_path, 3 * billed)
    assert out["projected_spend_usd_per_day"] == pytest.approx(3 * billed)  # before: 7 x the 1,000-token price
    assert (out["threshold"], out["frontier_share"]) == (0.8, 0.3)  # before: 0.4 and 0.7, billed 2.3x the budget


def _log_as_bundled(tmp_path, monkeypatch, records: list[DecisionRecord]) -> None:
    """Log ``records`` as decisions of the bundled estimator in a data folder under ``tmp_path``, the one the
    commands read (``POINTSMAN_DATA_DIR``; no MLflow server)."""
    monkeypatch.setenv("POINTSMAN_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    version = load_estimator("bundled").version
    with OutcomeLog() as log:
        log.append_decisions([DecisionRecord(**{**vars(r), "estimator_version": version}) for r in records])


def _twenty_decisions_over_ten_minutes(tmp_path, monkeypatch, fleet, end_s: float) -> float:
    """Log 20 decisions of the bundled estimator (p_hard 0.05 ... 1.0, one every 30 s over the 10 minutes before
    ``end_s``) in a data folder under ``tmp_path``; returns the USD of one 1,000-token request on frontier-large."""
    _log_as_bundled(tmp_path, monkeypatch, [record(i, (i + 1) / 20, t=end_s - 600 + 30 * i) for i in range(20)])
    target = fleet.targets["frontier-large"]
    return (1000 * target.prices.usd_per_1m_input_tokens
            + fleet.output_tokens("frontier-large", None) * target.prices.usd_per_1m_output_tokens) / 1e6


def _calibrate_dry_run(tmp_path, budget_usd_per_day: float) -> dict:
    """``calibrate --budget-usd-per-day BUDGET --dry-run --json`` of a copy of the static policy for
    frontier-large over the day before ``NOW``: its JSON answer."""
    policy = tmp_path / "policy.yaml"
    shutil.copyfile(STATIC_POLICY_PATH, policy)
    cli = click.Group()
    register(cli)
    res = CliRunner().invoke(cli, ["calibrate", "--budget-usd-per-day", repr(budget_usd_per_day), "--policy", str(policy),
                                   "--json", "--model", "bundled", "--dry-run", "--target", "frontier-large",
                                   "--since", str(NOW - 86400), "--until", str(NOW)])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_an_until_in_the_future_does_not_dilute_the_budget_projection(tmp_path, monkeypatch, fleet):
    """20 decisions over the last 10 minutes and a budget paying for two of them in 10 minutes, with the
    window named up to a week ahead (``--until`` next week: "calibrate for this week"). Nothing can have
    been logged after now, so the projection rests on the same 10 minutes as without ``--until``. Before,
    the span ran to ``--until``: 'projected $0.01/day over 6.90 days' for traffic logged in minutes, the
    threshold sent every request to the frontier, about 20/2 x 1,000 = 10,000 times the budget a day."""
    import time

    now = time.time()
    one = _twenty_decisions_over_ten_minutes(tmp_path, monkeypatch, fleet, now)
    policy = tmp_path / "policy.yaml"
    shutil.copyfile(STATIC_POLICY_PATH, policy)
    cli = click.Group()
    register(cli)
    outs = []
    for until in ([], ["--until", str(now + 7 * 86400)]):
        res = CliRunner().invoke(cli, ["calibrate", "--budget-usd-per-day", repr(288 * one), "--policy", str(policy),
                                       "--json", "--model", "bundled", "--dry-run", "--target", "frontier-large",
                                       "--since", str(now - 601), *until])
        assert res.exit_code == 0, res.output
        outs.append(json.loads(res.stdout))
    for out in outs:
        assert out["span_days"] < 700 / 86400  # the 10 minutes logged (and the seconds this test ran)
        assert (out["threshold"], out["frontier_share"]) == (0.95, 0.1)  # before, with --until: 0.05 and 1.0
        assert "min of logged traffic" in out["warnings"][0]


def test_calibration_counts_only_requests_the_rule_would_route(tmp_path, monkeypatch, fleet):
    """The packaged default policy sends a hard prompt to frontier-large only while it costs at most
    ``hard_prompt_max_usd`` ($0.04) there. 10 short prompts (1,000 tokens, p_hard 0.05-0.5) and 10 long
    ones (20,000 tokens, $0.053 on frontier-large, p_hard 0.55-1.0): before, ``--frontier-share 0.5`` wrote
    0.55 and reported 50% to frontier-large, but at 0.55 the rule routes none of them (every one above it
    is over the cap), and a budget for the 10 short ones a day ($0.051) wrote 1.0 (share 0); now each
    counts only decisions the rule routes once p_hard clears the threshold."""
    _log_as_bundled(tmp_path, monkeypatch, [record(i, (i + 1) / 20, 1000 if i < 10 else 20_000, t=NOW - 86400 + 4000 * i)
                                            for i in range(20)])
    policy = tmp_path / "policy.yaml"
    shutil.copyfile(DEFAULT_POLICY_DIR / "default.yaml", policy)
    cli = click.Group()
    register(cli)
    window = ["--policy", str(policy), "--json", "--model", "bundled", "--dry-run", "--since", str(NOW - 86400),
              "--until", str(NOW)]
    res = CliRunner().invoke(cli, ["calibrate", "--frontier-share", "0.5", *window])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["frontier_target"] == "frontier-large"
    assert (out["threshold"], out["frontier_share"]) == (0.05, 0.5), out  # before: 0.55 and 0.5
    assert "10 of 20 decisions" in out["note"], out
    p = fleet.targets["frontier-large"].prices
    short = (1000 * p.usd_per_1m_input_tokens + fleet.output_tokens("frontier-large", None) * p.usd_per_1m_output_tokens) / 1e6
    res = CliRunner().invoke(cli, ["calibrate", "--budget-usd-per-day", repr(10 * short), *window])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert (out["threshold"], out["frontier_share"]) == (0.05, 0.5), out  # before: 1.0 and 0.0
    assert out["projected_spend_usd_per_day"] == pytest.approx(10 * short)


def test_a_share_among_tied_p_hard_values_is_the_nearest_one_a_threshold_gives(tmp_path, monkeypatch, fleet):
    """Repeated prompts (a canned template, a health probe) give one p_hard to many decisions. 100 decisions:
    20 easy (0.01-0.20), 70 of one template at 0.6313, 10 hard (0.91-1.0); ``--frontier-share 0.2``. A
    threshold can give 0.1 (the 10 hard ones) or 0.8 (the template too): 0.1 is nearer. Before, the 0.8
    quantile landed inside the tie, so calibrate wrote 0.63, sent 80% of the traffic to the frontier and
    noted that 0.8 was 'the nearest share the threshold can give'."""
    p = [(i + 1) / 100 for i in range(20)] + [0.6313] * 70 + [0.91 + i / 100 for i in range(10)]
    _log_as_bundled(tmp_path, monkeypatch, [record(i, v, t=NOW - 86400 + 800 * i) for i, v in enumerate(p)])
    policy = tmp_path / "policy.yaml"
    shutil.copyfile(STATIC_POLICY_PATH, policy)
    cli = click.Group()
    register(cli)
    res = CliRunner().invoke(cli, ["calibrate", "--frontier-share", "0.2", "--policy", str(policy), "--json",
                                   "--model", "bundled", "--dry-run", "--target", "frontier-large",
                                   "--since", str(NOW - 86400), "--until", str(NOW)])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert (out["threshold"], out["frontier_share"]) == (0.91, 0.1), out  # before: 0.63 and 0.8
    assert out["note"] == ("70 of 100 decisions share p_hard 0.6313: the nearest share the threshold can give is "
                           "0.100, not 0.2"), out


@settings(max_examples=80, deadline=None)
@given(p=st.lists(st.sampled_from([0.0, 0.1, 0.35, 0.5, 0.6313, 0.9, 1.0]), min_size=1, max_size=60),
       share=st.floats(0.0, 1.0))
def test_no_threshold_gives_a_share_nearer_the_asked_one(p, share):
    """Invariant over logs with ties: no threshold (an observed p_hard, or 1.0) routes a share strictly
    nearer ``frontier_share`` than the one calibrate chose."""
    p = np.asarray(p)
    cal = C.calibrate(C.RecentTraffic(p, np.full(len(p), 0.01), 1.0, 0, {}), "x", frontier_share=share)
    gap = abs(cal.frontier_share - share)
    for t in [*np.unique(p), 1.0]:
        assert gap <= abs(float(np.mean(p >= t)) - share) + 1e-12, (t, cal)
