"""Safe defaults on a network: ``pointsman serve`` on a non-loopback host without API keys refuses to
start unless allowed explicitly; keys in key files rotate without a restart, and a broken or emptied
key file keeps the keys in force (it never turns authentication off)."""

from __future__ import annotations

import os
import time

import httpx
import pytest
from click.testing import CliRunner

from pointsman.cli.main import main
from pointsman.service.app import create_app
from pointsman.service.keys import KeySource
from pointsman.service.settings import Settings

ROUTE = {"messages": [{"role": "user", "content": "What is 2 + 2?"}]}
KEY_ENV = ("POINTSMAN_GATEWAY_API_KEYS", "POINTSMAN_ADMIN_API_KEYS", "POINTSMAN_GATEWAY_API_KEYS_FILE",
           "POINTSMAN_ADMIN_API_KEYS_FILE", "POINTSMAN_ALLOW_UNAUTHENTICATED")


@pytest.fixture
def no_keys(monkeypatch):
    for name in KEY_ENV:
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "pointsman.internal"])
def test_serve_on_a_network_without_keys_refuses_to_start_naming_the_settings_and_the_override(no_keys, host):
    r = CliRunner().invoke(main, ["serve", "--host", host, "--port", "1"])
    assert r.exit_code == 2, r.output
    assert r.stderr.count("\n") == 1 and r.stderr.startswith(f"Error: refusing to serve on {host} without API keys")
    for name in ("POINTSMAN_GATEWAY_API_KEYS", "POINTSMAN_ADMIN_API_KEYS", "--allow-unauthenticated",
                 "POINTSMAN_ALLOW_UNAUTHENTICATED"):
        assert name in r.stderr


def test_an_exposed_ext_proc_host_without_keys_refuses_to_start_on_a_loopback_http_host(no_keys):
    """The ext_proc port binds ``--ext-proc-host``: exposing it alone is refused as an exposed --host is."""
    r = CliRunner().invoke(main, ["serve", "--host", "127.0.0.1", "--port", "1", "--ext-proc-port", "0",
                                  "--ext-proc-host", "0.0.0.0"])
    assert r.exit_code == 2, r.output
    assert r.stderr.startswith("Error: refusing to serve on 0.0.0.0 without API keys")


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "localhost", "127.0.0.2"])
def test_loopback_hosts_may_serve_without_keys(tmp_path, host):
    create_app(Settings(data_dir=tmp_path, host=host))  # no ValueError


def test_the_app_refuses_a_network_host_without_keys_unless_allowed(tmp_path):
    with pytest.raises(ValueError, match="refusing to serve on 0.0.0.0 without API keys"):
        create_app(Settings(data_dir=tmp_path, host="0.0.0.0"))
    create_app(Settings(data_dir=tmp_path, host="0.0.0.0", allow_unauthenticated=True))
    create_app(Settings(data_dir=tmp_path, host="0.0.0.0", admin_api_keys="ops=admin-secret-1"))


def test_the_allow_unauthenticated_flag_passes_the_check(tmp_path, no_keys):
    bad = tmp_path / "p.yaml"
    bad.write_text("apiVersion: pointsman/v1\nkind: RoutingPolicy\nrules: []\n")
    r = CliRunner().invoke(main, ["serve", "--host", "0.0.0.0", "--allow-unauthenticated", "--policy", str(bad),
                                  "--port", "1"])
    assert r.exit_code == 2 and r.stderr.startswith(f"Error: {bad}:3:8: invalid-value"), r.stderr  # past the check


def test_serve_on_a_network_starts_when_allowed_explicitly(tmp_path, serve, no_keys):
    _, base = serve(tmp_path, host="0.0.0.0", allow_unauthenticated="true")
    assert httpx.get(f"{base}/healthz", timeout=5).json()["auth"] is False
    assert httpx.post(f"{base}/v1/route", json=ROUTE, timeout=10).status_code == 200


def _write(path, text):
    """Replace ``path`` atomically (as editors, ``kubectl`` Secret volumes and config tools do)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _wait_until_admitted(base, key, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while True:
        r = httpx.post(f"{base}/v1/route", json=ROUTE, headers={"authorization": f"Bearer {key}"}, timeout=10)
        if r.status_code == 200 or time.monotonic() > deadline:
            return r.status_code
        time.sleep(0.1)


def test_key_files_rotate_without_a_restart_and_a_broken_or_emptied_file_keeps_the_old_keys(tmp_path, serve, no_keys):
    gateway, admin = tmp_path / "gateway.keys", tmp_path / "admin.keys"
    gateway.write_text("# this comment line is not a key\nedge=old-secret-123\n\n")
    admin.write_text("ops=admin-secret-123\n")
    _, base = serve(tmp_path, host="0.0.0.0", gateway_api_keys_file=gateway, admin_api_keys_file=admin)

    def status(key):
        headers = {} if key is None else {"authorization": f"Bearer {key}"}
        return httpx.post(f"{base}/v1/route", json=ROUTE, headers=headers, timeout=10).status_code

    assert httpx.get(f"{base}/healthz", timeout=5).json()["auth"] is True
    assert status("old-secret-123") == 200 and status(None) == 401
    assert status("# this comment line is not a key") == 401

    _write(gateway, "edge=new-secret-456\n")
    assert _wait_until_admitted(base, "new-secret-456") == 200
    assert status("old-secret-123") == 401

    for broken in ("edge=short\n", ""):
        _write(gateway, broken)
        time.sleep(1.2)  # longer than the re-read interval: the next request re-reads the file
        assert status("new-secret-456") == 200, broken
        assert status(None) == 401, broken
    gateway.unlink()
    time.sleep(1.2)
    assert status("new-secret-456") == 200 and status(None) == 401


def test_key_source_keeps_the_keys_in_force_when_a_file_breaks(tmp_path):
    path = tmp_path / "keys"
    path.write_text("a=first-secret-1\n# b=comment-secret-2\n")
    source = KeySource([], [("gateway", path, "POINTSMAN_GATEWAY_API_KEYS_FILE")], check_interval_s=0)
    assert source.ring().identify("first-secret-1") is not None
    assert source.ring().identify("# b=comment-secret-2") is None and source.ring().identify("comment-secret-2") is None
    for broken in (b"", b"a=tiny\n", b"\xff\xfe\n", b"a=x-secret-1,a=y-secret-2\n"):
        path.write_bytes(broken)
        os.utime(path, ns=(time.time_ns(), time.time_ns() + len(broken) + 1))
        ring = source.ring()
        assert ring.enabled and ring.identify("first-secret-1") is not None, broken
    path.write_text("a=second-secret-2, b=third-secret-3\n")
    assert source.ring().identify("first-secret-1") is None
    assert {source.ring().identify(k).key_id for k in ("second-secret-2", "third-secret-3")} == {"a", "b"}


@pytest.mark.parametrize("text,message", [("", "holds no key"), ("# only a comment\n", "holds no key"),
                                          ("edge=abc\n", ":1 (edge): a key needs at least 8 characters"),
                                          ("edge gw=secret-12345678\n", ":1: a key name must be 1-200 characters "
                                                                        "without spaces")])
def test_a_bad_key_file_at_start_is_one_error_line_exit_2(tmp_path, no_keys, monkeypatch, text, message):
    path = tmp_path / "gateway.keys"
    path.write_text(text)
    monkeypatch.setenv("POINTSMAN_GATEWAY_API_KEYS_FILE", str(path))
    r = CliRunner().invoke(main, ["serve", "--port", "1"])
    assert r.exit_code == 2, r.output
    assert r.stderr.startswith("Error: ") and r.stderr.count("\n") == 1 and message in r.stderr
    assert "abc" not in r.stderr.replace("a key", "")


def test_a_busy_ext_proc_port_is_one_error_line_exit_2(no_keys):
    """grpcio reports a busy port as a RuntimeError deep in the startup: serve checks it first."""
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = CliRunner().invoke(main, ["serve", "--port", "1", "--ext-proc-port", str(port)])
    assert r.exit_code == 2, r.output
    assert r.stderr.count("\n") == 1 and r.stderr.startswith(f"Error: --ext-proc-port: cannot bind 127.0.0.1:{port}")
