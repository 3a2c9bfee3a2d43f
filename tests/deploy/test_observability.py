"""The Grafana dashboard and the alert rules against a real Prometheus (Debian's ``prometheus``) scraping a
running ``pointsman serve`` that has made decisions: every PromQL expression evaluates without error and
returns series; the server loads the rule file and evaluates every rule without error; ``promtool check
rules`` passes, and ``promtool test rules`` runs ``deploy/prometheus/alerts_test.yaml`` (input series →
the alerts expected firing or not at given times).

The service runs on a fleet whose engines are stand-ins serving vLLM ``/metrics`` pages
(``tests/fixtures/standin_engine.py``), one of them a dead port (scrape failures, an unhealthy endpoint),
with a budget for tenant ``acme`` (so a spend journal) and following ``champion`` in an empty MLflow store (so
the model follower's gauges); the test sends decisions (and one malformed request), outcomes with
usage (spend, effective prices) and telemetry with prefill/decode utilization. Without ``prometheus`` on
PATH the test is skipped, unless ``POINTSMAN_REQUIRE_PROMETHEUS=1`` (CI), where it fails.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest
import yaml

from pointsman.policy.fleet import DEFAULT_FLEET_PATH
from tests.policy.test_ledger_restore import Redis
from tests.service.conftest import free_port, start_serve

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "pointsman-dashboard.json"
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yaml"
ALERT_TESTS = ROOT / "deploy" / "prometheus" / "alerts_test.yaml"
SCRAPE_CONFIG = ROOT / "deploy" / "prometheus" / "prometheus.yml"
#: A rule's expression: ``<series> <comparison> <number>``.
_COMPARISON = re.compile(r"^(?P<lhs>.+?)\s*(?P<op>>=|<=|==|!=|>|<)\s*(?P<rhs>[0-9.e+-]+)$", re.S)


def _binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        reason = f"{name} is not on PATH (apt-get install -y prometheus)"
        if os.environ.get("POINTSMAN_REQUIRE_PROMETHEUS") == "1":
            pytest.fail(f"POINTSMAN_REQUIRE_PROMETHEUS=1 but {reason}")
        pytest.skip(reason)
    return path


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def dashboard_expressions() -> list[tuple[str, str]]:
    """``(panel title, expr)`` of every panel target, Grafana's variables replaced as Grafana would:
    ``$__rate_interval`` by 1m, ``$instance`` (All) by ``.*``."""
    dash = json.loads(DASHBOARD.read_text())
    out = []
    for panel in dash["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"].replace("$__rate_interval", "1m").replace("$instance", ".*")
            out.append((panel["title"], expr))
    return out


def alert_rules() -> list[dict]:
    return [rule for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]]


def _fleet(tmp: Path, standin) -> tuple[Path, list]:
    """The default fleet with every on-prem endpoint on a stand-in engine's /metrics, one on a dead port."""
    doc = yaml.safe_load(DEFAULT_FLEET_PATH.read_text())
    doc["defaults"]["scrape_metrics"] = True
    servers, dead = [], free_port()
    for target in doc["targets"].values():
        for pool in (target.get("pools") or {}).values():
            for ep in pool["endpoints"]:
                if ep["name"] == "llama-70b-decode-3":
                    ep["url"] = f"http://127.0.0.1:{dead}/v1"
                    continue
                server = standin.MetricsServer().start()
                server.metrics.set(running=2, waiting=1, kv_usage=0.3)
                servers.append(server)
                ep["url"] = server.base_url + "/v1"
                ep["metrics_url"] = server.metrics_url
    path = tmp / "fleet.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path, servers


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory, standin):
    prom_bin = _binary("prometheus")
    tmp = tmp_path_factory.mktemp("observability")
    fleet, servers = _fleet(tmp, standin)
    budgets = tmp / "budgets.yaml"
    budgets.write_text("apiVersion: pointsman/v1\nkind: Budgets\nbudgets:\n"
                       "  - {scope: 'tenant:acme', window: day, limit_usd: 0.05}\n", encoding="utf-8")
    procs: list[subprocess.Popen] = []
    (tmp / "redis").mkdir()
    redis = Redis(tmp / "redis")  # shared state: its gauges (PointsmanSharedStateDisconnected) are exported
    try:
        def settings() -> dict[str, str]:  # a fresh ext_proc port with each try of a fresh HTTP port
            return {"POINTSMAN_DATA_DIR": str(tmp), "POINTSMAN_FLEET_PATH": str(fleet), "POINTSMAN_STATE_URL": redis.url,
                    "POINTSMAN_BUDGETS_PATH": str(budgets), "POINTSMAN_SCRAPE_INTERVAL_S": "0.5",
                    "POINTSMAN_DECISION_LOG_FLUSH_MS": "5", "POINTSMAN_EXT_PROC_PORT": str(free_port()),
                    "POINTSMAN_MODEL": "champion", "POINTSMAN_MODEL_POLL_INTERVAL_S": "1",
                    "MLFLOW_TRACKING_URI": f"sqlite:///{tmp / 'mlflow.db'}"}

        _, base = start_serve(settings, procs)
        port, prom_port = int(base.rsplit(":", 1)[1]), free_port()
        _traffic(base)
        # the shipped scrape config, pointed at this service and this rule file
        config = yaml.safe_load(SCRAPE_CONFIG.read_text())
        config["global"]["scrape_interval"] = config["global"]["evaluation_interval"] = "1s"
        config["rule_files"] = [str(ALERTS)]
        config["scrape_configs"][0]["static_configs"] = [{"targets": [f"127.0.0.1:{port}"]}]
        (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
        prom = subprocess.Popen([prom_bin, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'tsdb'}",
                                 f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        procs.append(prom)
        api = f"http://127.0.0.1:{prom_port}/api/v1"
        deadline = time.monotonic() + 60
        while True:  # three scrapes at least (rate() needs two samples in its window) after the model follower's first poll
            try:
                r = httpx.get(f"{api}/query", params={"query": "count_over_time(pointsman_model_follow_problem[1m])"}, timeout=2)
                result = r.json()["data"]["result"] if r.status_code == 200 else []
                if result and float(result[0]["value"][1]) >= 3:
                    break
            except httpx.TransportError:
                pass
            assert prom.poll() is None, prom.stderr.read().decode()
            assert time.monotonic() < deadline, "prometheus did not scrape pointsman's model follower three times in 60 s"
            time.sleep(0.25)
        yield api
    finally:
        for proc in reversed(procs):
            _stop(proc)
        for server in servers:
            server.stop()
        redis.stop()


def _traffic(base: str) -> None:
    """Decisions (tenant acme), outcomes with usage for half of them, telemetry with per-phase
    utilization, one malformed request; then waits until the dead endpoint is marked unhealthy."""
    with httpx.Client(base_url=base, timeout=10) as c:
        prompts = ["What is 2 + 2?", "Prove that there are infinitely many primes, step by step.",
                   "Summarise this report: " + "quarterly revenue grew in every region " * 120]
        for i in range(12):
            d = c.post("/v1/route", json={"messages": [{"role": "user", "content": prompts[i % 3]}],
                                          "routing": {"tenant": "acme"}}).json()
            if i % 2 == 0:
                r = c.post("/v1/outcomes", json={"decision_id": d["decision_id"], "ttft_ms": 120, "e2e_latency_ms": 900,
                                                 "usage": {"prompt_tokens": 40 + i, "completion_tokens": 60}})
                assert r.status_code == 200, r.text
        assert c.post("/v1/route", content=b"{", headers={"content-type": "application/json"}).status_code == 400
        fleet = c.get("/v1/fleet").json()
        reports = []
        for target in fleet["targets"].values():
            for ep in target.get("endpoints", []):
                if ep.get("role") in ("aggregated", "prefill", "decode"):
                    reports.append({"endpoint": ep["name"], "load": {"prefill_utilization": 0.6, "decode_utilization": 0.4}})
        r = c.post("/v1/telemetry", json=reports)
        assert r.status_code == 200, r.text
        deadline = time.monotonic() + 15
        while 'pointsman_endpoint_healthy{endpoint="llama-70b-decode-3",target="onprem-70b"} 0.0' not in c.get("/metrics").text:
            assert time.monotonic() < deadline, "the dead endpoint was not marked unhealthy"
            time.sleep(0.2)


def _query(api: str, expr: str) -> list:
    r = httpx.get(f"{api}/query", params={"query": expr}, timeout=10)
    body = r.json()
    assert r.status_code == 200 and body["status"] == "success", f"{expr}: {body.get('error')}"
    return body["data"]["result"]


@pytest.mark.parametrize("title,expr", dashboard_expressions(), ids=[f"{t}:{i}" for i, (t, _) in enumerate(dashboard_expressions())])
def test_every_dashboard_expression_returns_series(prometheus, title, expr):
    assert _query(prometheus, expr), f"panel '{title}': no series for {expr}"


@pytest.mark.parametrize("rule", alert_rules(), ids=[r["alert"] for r in alert_rules()])
def test_every_alert_expression_evaluates_and_watches_existing_series(prometheus, rule):
    m = _COMPARISON.match(rule["expr"].strip())
    assert m, f"{rule['alert']}: write the expression as '<series> <comparison> <number>'"
    _query(prometheus, rule["expr"])  # the alert's own expression: no error (firing or not)
    assert _query(prometheus, m["lhs"]), f"{rule['alert']}: no series for {m['lhs']}"


def test_prometheus_loads_and_evaluates_every_rule(prometheus):
    deadline = time.monotonic() + 20
    while True:
        groups = httpx.get(f"{prometheus}/rules", timeout=5).json()["data"]["groups"]
        rules = [r for g in groups for r in g["rules"]]
        if rules and all(r.get("lastEvaluation", "").startswith("20") for r in rules):
            break
        assert time.monotonic() < deadline, "rules were not evaluated"
        time.sleep(0.5)
    assert {r["name"] for r in rules} == {r["alert"] for r in alert_rules()}
    assert all(r["health"] == "ok" for r in rules), [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"]
    firing = {r["name"] for r in rules if r["state"] != "inactive"}
    assert {"PointsmanEndpointUnhealthy", "PointsmanScrapeFailing"} <= firing  # the dead endpoint, pending or firing


def test_promtool_checks_the_rules_and_the_scrape_config():
    promtool = _binary("promtool")
    for args in (["check", "rules", str(ALERTS)], ["check", "config", "--syntax-only", str(SCRAPE_CONFIG)]):
        run = subprocess.run([promtool, *args], capture_output=True, text=True)
        assert run.returncode == 0, run.stdout + run.stderr


def test_promtool_unit_tests_of_the_alerts_pass():
    """Budget refusals alone do not fire PointsmanDecisionsFailing, real errors do and it clears; the model
    follower and spend journal alerts fire after their ``for:`` and clear; a short blip stays pending."""
    run = subprocess.run([_binary("promtool"), "test", "rules", str(ALERT_TESTS)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


def test_dashboard_panels_are_well_formed():
    dash = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dash["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}" and panel["targets"], panel["title"]
        assert len({t["refId"] for t in panel["targets"]}) == len(panel["targets"])
    assert {v["name"] for v in dash["templating"]["list"]} == {"datasource", "instance"}
