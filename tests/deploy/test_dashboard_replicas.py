"""The dashboard's in-flight panel against a real Prometheus scraping two ``pointsman serve`` replicas that share
their live state through a real Redis. Every replica exports the in-flight requests of the whole fleet (an
outcome on any replica releases its decision everywhere), so the panel must count each endpoint once, not once
per replica: before, 6 decisions in flight showed as 12."""

from __future__ import annotations

import subprocess
import time
import uuid

import httpx
import yaml

from tests.deploy.test_observability import SCRAPE_CONFIG, _binary, _query, _stop, dashboard_expressions
from tests.service.conftest import free_port, start_serve


def test_the_in_flight_panel_counts_each_request_once_with_two_replicas(tmp_path, redis_url):
    prom_bin = _binary("prometheus")
    (expr,) = [e for title, e in dashboard_expressions() if title == "In-flight requests"]
    prefix = f"%7Bdash-{uuid.uuid4().hex[:8]}%7D:"
    procs: list = []
    try:
        bases = [start_serve(lambda i=i: {"POINTSMAN_DATA_DIR": str(tmp_path / f"data{i}"),
                                          "POINTSMAN_STATE_URL": f"{redis_url}?prefix={prefix}"}, procs)[1]
                 for i in range(2)]
        for i in range(6):  # no outcome: all six stay in flight
            r = httpx.post(f"{bases[i % 2]}/v1/route", json={"messages": [{"role": "user", "content": f"Say hello {i}."}]})
            assert r.status_code == 200, r.text
        config = yaml.safe_load(SCRAPE_CONFIG.read_text())
        config["global"]["scrape_interval"] = config["global"]["evaluation_interval"] = "1s"
        config.pop("rule_files")
        config["scrape_configs"][0]["static_configs"] = [{"targets": [b.removeprefix("http://") for b in bases]}]
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
        prom_port = free_port()
        procs.append(prom := subprocess.Popen(
            [prom_bin, f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn"]))
        api, deadline = f"http://127.0.0.1:{prom_port}/api/v1", time.monotonic() + 60
        while True:  # both replicas scraped, each with the six in flight
            try:
                seen = _query(api, "count(count by (instance) (pointsman_inflight_requests))")
                if seen and seen[0]["value"][1] == "2":
                    break
            except (httpx.TransportError, ValueError, KeyError):
                pass
            assert prom.poll() is None and time.monotonic() < deadline, "prometheus did not scrape both replicas"
            time.sleep(0.25)
        result = _query(api, expr.replace("$instance", ".*"))
        assert sum(float(s["value"][1]) for s in result) == 6
    finally:
        for proc in reversed(procs):
            _stop(proc)
