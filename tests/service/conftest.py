"""Fixtures for the service tests: ``serve``, a starter of real ``pointsman serve`` processes.

``serve(data_dir, port=None, **env) -> (process, base_url)`` starts ``python -m pointsman
serve`` on a free port (or ``port``) with ``POINTSMAN_DATA_DIR=data_dir`` (and ``env`` as
``POINTSMAN_*`` variables), waits until ``/readyz`` answers 200 (60 s at most), and every
process it started is stopped at teardown (SIGTERM, then SIGKILL).

For a fleet fed by stand-in engines (``standin`` fixture): ``endpoint_yaml`` writes an endpoint's line,
``serve_fleet`` starts ``serve`` on a fleet and policy beside the bundled tokenizer, ``route`` asks for one
decision and ``wait`` polls until a check holds.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from fastapi.testclient import TestClient


def static_policy_client(data: Path, fleet_spec: dict, p_hard: float) -> TestClient:
    """A ``TestClient`` (use it as a context manager) of the app on the fleet ``fleet_spec`` (written to
    ``data / "fleet.yaml"``), the packaged static policy and a fixed ``p_hard``, its data in ``data``."""
    from pointsman.estimator.estimate import FixedDifficulty
    from pointsman.policy.engine import RoutingEngine
    from pointsman.policy.fleet import load_fleet
    from pointsman.policy.rules.compiler import STATIC_POLICY_PATH, load_policy
    from pointsman.service.app import create_app
    from pointsman.service.bootstrap import build_state
    from pointsman.service.settings import Settings

    fleet_path = data / "fleet.yaml"
    fleet_path.write_text(yaml.safe_dump(fleet_spec), encoding="utf-8")
    settings = Settings(data_dir=data, fleet_path=fleet_path, watch_policy=False, watch_fleet=False,
                        scrape_interval_s=0)
    fleet = load_fleet(fleet_path)
    engine = RoutingEngine(fleet, load_policy(STATIC_POLICY_PATH, fleet), FixedDifficulty(p_hard),
                           state=build_state(settings, fleet))
    return TestClient(create_app(settings, engine=engine, owns_engine=True))


CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")


def endpoint_yaml(name: str, engine: Any = None) -> str:
    """One item of a pool's ``endpoints:`` list (10 spaces in, no newline) named ``name``: with ``engine`` (a
    ``StandinEngine``) its ``base_url`` and ``kv_events`` (``kv_events_url``, ``replay_url``); without, an unreachable
    ``http://<name>.internal:8000/v1``."""
    if engine is None:
        return f'          - {{name: {name}, url: "http://{name}.internal:8000/v1"}}'
    return (f'          - {{name: {name}, url: "{engine.base_url}/v1", '
            f'kv_events: {{url: "{engine.kv_events_url}", replay_url: "{engine.replay_url}"}}}}')


def event_fed_fleet(endpoints: str, target_keys: str = "", more_targets: str = "") -> str:
    """Fleet YAML (for ``serve_fleet``) of one target ``onprem-8b`` fed by vLLM KV events (``kv_events`` naming the
    ``tokenizer.json`` and ``template.jinja`` ``serve_fleet`` writes), one aggregated pool whose ``endpoints`` are the
    given lines (``endpoint_yaml``); ``target_keys``: more lines of that target (4 spaces in, each ending in a newline),
    ``more_targets``: more targets (2 spaces in)."""
    return ("apiVersion: pointsman/v1\nkind: Fleet\ndefaults: {output_tokens: 64, scrape_metrics: false}\ntargets:\n"
            "  onprem-8b:\n    kind: onprem\n    model: meta-llama/Llama-3.1-8B-Instruct\n" + target_keys +
            "    context_window_tokens: 131072\n    usd_per_gpu_hour: 2.5\n"
            "    kv_events: {tokenizer: tokenizer.json, chat_template: template.jinja}\n"
            "    pools:\n      aggregated:\n        gpus_per_replica: 1\n        prefill_tokens_per_s: 20000\n"
            "        decode_tokens_per_s: 20000\n        endpoints:\n" + endpoints + "\n" + more_targets)


#: A policy sending every request to ``onprem-8b``.
TO_8B = "apiVersion: pointsman/v1\nkind: RoutingPolicy\nrules:\n  - name: default\n    route: {target: onprem-8b}\n"


def serve_fleet(tmp_path: Path, serve: Callable[..., tuple[subprocess.Popen, str]], fleet: str, policy: str,
                **settings: Any) -> tuple[str, Any]:
    """Writes ``fleet`` and ``policy`` (YAML text) to ``tmp_path`` as ``fleet.yaml`` and ``policy.yaml``, beside the
    bundled ``tokenizer.json`` and ``CHAT_TEMPLATE`` as ``template.jinja`` (what a fleet's ``kv_events`` names), and
    starts ``serve`` on them (data in ``tmp_path / "data"``, no file watching, ``scrape_interval_s`` 0 unless
    ``settings`` say, ``settings`` as further ``POINTSMAN_*``). Returns the base URL and the ``TargetTokenizer`` of
    those two files."""
    from pointsman.estimator.model_source import bundled_model_dir
    from pointsman.policy.signals.engine_hashes import TargetTokenizer

    shutil.copyfile(bundled_model_dir() / "tokenizer.json", tmp_path / "tokenizer.json")
    (tmp_path / "template.jinja").write_text(CHAT_TEMPLATE)
    (tmp_path / "fleet.yaml").write_text(fleet)
    (tmp_path / "policy.yaml").write_text(policy)
    _, base = serve(tmp_path / "data", fleet_path=tmp_path / "fleet.yaml", policy_path=tmp_path / "policy.yaml",
                    **{"watch_policy": "false", "watch_fleet": "false", "scrape_interval_s": 0, **settings})
    return base, TargetTokenizer.from_files(tmp_path / "tokenizer.json", chat_template_file=tmp_path / "template.jinja")


def route(base: str, body: dict) -> dict:
    """``POST /v1/route`` with ``body`` (asserting 200), then cancels that decision's outcome; returns the decision."""
    r = httpx.post(f"{base}/v1/route", timeout=10, json=body)
    assert r.status_code == 200, r.text
    d = r.json()
    httpx.post(f"{base}/v1/outcomes", timeout=10, json={"decision_id": d["decision_id"], "status": "cancelled"}).raise_for_status()
    return d


def wait(check: Callable[[], Any], what: str) -> None:
    """Polls ``check()`` every 0.05 s until it is truthy; ``AssertionError(what)`` after 15 s."""
    deadline = time.monotonic() + 15
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def free_port() -> int:
    """A free local TCP port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL after 15 s; no-op when it already exited."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def serve() -> Iterator[Callable[..., tuple[subprocess.Popen, str]]]:
    yield from _starter()


@pytest.fixture(scope="module")
def serve_module() -> Iterator[Callable[..., tuple[subprocess.Popen, str]]]:
    """``serve`` whose processes live until the test module ends (one service for several tests)."""
    yield from _starter()


def start_serve(settings: Callable[[], dict[str, str]], started: list[subprocess.Popen],
                port: int | None = None) -> tuple[subprocess.Popen, str]:
    """Start ``python -m pointsman serve`` on ``port`` (else a free one) with ``settings()`` as
    ``POINTSMAN_*`` variables beside the test environment; appended to ``started`` (the caller stops
    them). Waits until ``/readyz`` answers 200 (120 s at most: a start takes seconds, but on a machine
    shared with other work it has taken over 60). A free port can be taken (another test's
    ephemeral port) before serve binds it: then, without a given ``port``, up to three tries, each on a
    fresh port and with ``settings()`` called again (a setting may name a port too). Returns the
    process and its base URL; raises ``AssertionError`` with serve's stderr when it exits."""
    for attempt in range(3):
        chosen = port or free_port()
        env = {**os.environ, "ORT_DISABLE_TELEMETRY": "1", "MLFLOW_DISABLE_TELEMETRY": "true", "HF_HUB_OFFLINE": "1",
               **settings()}
        proc = subprocess.Popen([sys.executable, "-m", "pointsman", "serve", "--port", str(chosen),
                                 "--log-level", "warning"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        started.append(proc)
        base = f"http://127.0.0.1:{chosen}"
        deadline = time.monotonic() + 120
        while proc.poll() is None:
            try:
                if httpx.get(f"{base}/readyz", timeout=1).status_code == 200:
                    return proc, base
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "service did not start within 120 s"
            time.sleep(0.1)
        error = proc.stderr.read().decode()
        assert port is None and "address already in use" in error and attempt < 2, error
    raise AssertionError("unreachable")


def _starter() -> Iterator[Callable[..., tuple[subprocess.Popen, str]]]:
    started: list[subprocess.Popen] = []

    def start(data_dir, port: int | None = None, **settings: str) -> tuple[subprocess.Popen, str]:
        env = {"POINTSMAN_DATA_DIR": str(data_dir), **{f"POINTSMAN_{k.upper()}": str(v) for k, v in settings.items()}}
        return start_serve(lambda: env, started, port)

    yield start
    for proc in started:
        stop(proc)


def logged(data_dir: Path, decision_id: str) -> bool:
    """Whether the outcome log in ``data_dir`` (``outcomes.db``, opened read-only) holds an outcome of ``decision_id``."""
    with sqlite3.connect(f"file:{data_dir / 'outcomes.db'}?mode=ro", uri=True) as c:
        return c.execute("SELECT 1 FROM outcomes WHERE decision_id = ?", (decision_id,)).fetchone() is not None
