"""What ``deploy/`` ships, checked offline: the Kubernetes manifests against the Kubernetes schemas
(``kubernetes-validate``, strict); the Gateway API Inference Extension manifests against schemas written
from the notes (``tests/deploy/schemas``: the InferencePool and HTTPRoute CRDs are not bundled); the
ConfigMaps' fleet and policy compile with Pointsman's own loaders and the Deployment reads them where
they are mounted; the Envoy config parses into Envoy's own ``Bootstrap`` proto (xds-protos) with the
ext_proc filter pointed at Pointsman; the Dockerfile is multi-stage, non-root, and copies files that
exist; the systemd unit runs ``pointsman serve`` unprivileged. (docker, kubectl and envoy cannot run here.)"""

from __future__ import annotations

import configparser
import json
import os
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml
from google.protobuf import json_format

from pointsman.policy.fleet import load_fleet
from pointsman.policy.rules.compiler import load_policy
from pointsman.service.ext_proc import GIE_ROUTING_HEADERS, ROUTING_HEADERS

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
SCHEMAS = Path(__file__).resolve().parent / "schemas"
K8S_VERSION = "1.33"


def docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def by_kind(path: Path) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for d in docs(path):
        out.setdefault(d["kind"], []).append(d)
    return out


@pytest.mark.parametrize("name", ["pointsman.yaml", "redis.yaml"])
def test_kubernetes_manifests_validate_against_the_schemas(name):
    for doc in docs(DEPLOY / "kubernetes" / name):
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_fleet_and_policy_configmaps_compile_and_are_mounted_where_the_deployment_reads_them(tmp_path):
    k = by_kind(DEPLOY / "kubernetes" / "pointsman.yaml")
    maps = {m["metadata"]["name"]: m["data"] for m in k["ConfigMap"]}
    (tmp_path / "fleet.yaml").write_text(maps["pointsman-fleet"]["fleet.yaml"])
    (tmp_path / "policy.yaml").write_text(maps["pointsman-policy"]["policy.yaml"])
    fleet = load_fleet(tmp_path / "fleet.yaml")
    load_policy(tmp_path / "policy.yaml", fleet)
    (deployment,) = k["Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v.get("configMap", {}).get("name") for v in pod["volumes"]}
    for var, cm, key in (("POINTSMAN_FLEET_PATH", "pointsman-fleet", "fleet.yaml"),
                         ("POINTSMAN_POLICY_PATH", "pointsman-policy", "policy.yaml")):
        volume = next(v for v, m in volumes.items() if m == cm)
        assert env[var] == f"{mounts[volume]}/{key}"
    assert pod["securityContext"]["runAsNonRoot"] is True
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert env["POINTSMAN_EXT_PROC_PORT"] == str(ports["grpc"]) == "9002"
    (service,) = k["Service"]
    assert {p["targetPort"] for p in service["spec"]["ports"]} == set(ports)
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]


def test_gateway_api_manifests_validate_and_point_at_pointsman():
    k = by_kind(DEPLOY / "gateway-api" / "inferencepool.yaml")
    pool_schema = json.loads((SCHEMAS / "inferencepool.v1.json").read_text())
    route_schema = json.loads((SCHEMAS / "httproute.v1.json").read_text())
    (pool,) = k["InferencePool"]
    (route,) = k["HTTPRoute"]
    jsonschema.validate(pool, pool_schema)
    jsonschema.validate(route, route_schema)
    service = by_kind(DEPLOY / "kubernetes" / "pointsman.yaml")["Service"][0]
    grpc = next(p for p in service["spec"]["ports"] if p["name"] == "grpc")
    ref = pool["spec"]["endpointPickerRef"]
    assert (ref["name"], ref["port"]["number"]) == (service["metadata"]["name"], grpc["port"])
    backend = route["spec"]["rules"][0]["backendRefs"][0]
    assert (backend["kind"], backend["name"]) == ("InferencePool", pool["metadata"]["name"])
    # the schema is not a rubber stamp: a wrong field or value fails
    bad = {**pool, "spec": {**pool["spec"], "endpointPickerRef": {**ref, "failureMode": "Open"}}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, pool_schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**pool, "spec": {**pool["spec"], "targetPortNumber": 8000}}, pool_schema)


def test_envoy_config_parses_into_envoys_bootstrap_proto():
    from envoy.config.bootstrap.v3 import bootstrap_pb2
    from envoy.extensions.filters.http.ext_proc.v3 import ext_proc_pb2  # noqa: F401 - registers the Any types
    from envoy.extensions.filters.http.header_mutation.v3 import header_mutation_pb2
    from envoy.extensions.filters.http.router.v3 import router_pb2  # noqa: F401
    from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm
    from envoy.extensions.transport_sockets.tls.v3 import tls_pb2  # noqa: F401
    from envoy.extensions.upstreams.http.v3 import http_protocol_options_pb2  # noqa: F401

    boot = json_format.ParseDict(yaml.safe_load((DEPLOY / "envoy" / "envoy.yaml").read_text()), bootstrap_pb2.Bootstrap())
    manager = hcm.HttpConnectionManager()
    boot.static_resources.listeners[0].filter_chains[0].filters[0].typed_config.Unpack(manager)
    ext = ext_proc_pb2.ExternalProcessor()
    assert [f.name for f in manager.http_filters] == ["envoy.filters.http.header_mutation", "envoy.filters.http.ext_proc",
                                                      "envoy.filters.http.router"]
    # every header the picker reads its routing context from is stripped before it: a client cannot name the tenant
    strip = header_mutation_pb2.HeaderMutation()
    manager.http_filters[0].typed_config.Unpack(strip)
    removed = {m.remove for m in strip.mutations.request_mutations}
    assert removed == set(ROUTING_HEADERS) | set(GIE_ROUTING_HEADERS)
    manager.http_filters[1].typed_config.Unpack(ext)
    mode = ext.processing_mode
    assert (mode.request_body_mode, mode.response_body_mode) == (mode.FULL_DUPLEX_STREAMED, mode.FULL_DUPLEX_STREAMED)
    assert list(ext.metadata_options.forwarding_namespaces.untyped) == ["envoy.lb", "envoy.lb.subset_hint"]
    clusters = {c.name: c for c in boot.static_resources.clusters}
    picker = clusters[ext.grpc_service.envoy_grpc.cluster_name]
    address = picker.load_assignment.endpoints[0].lb_endpoints[0].endpoint.address.socket_address
    assert address.port_value == 9002
    assert picker.health_checks[0].grpc_health_check.service_name == "envoy.service.ext_proc.v3.ExternalProcessor"
    assert clusters["original_destination_cluster"].original_dst_lb_config.http_header_name == "x-gateway-destination-endpoint"
    with pytest.raises(json_format.ParseError):  # a misspelt field is caught
        json_format.ParseDict({"static_resources": {"clusterz": []}}, bootstrap_pb2.Bootstrap())


def _dockerfile() -> list[tuple[str, str]]:
    lines, buf = [], ""
    for raw in (DEPLOY / "docker" / "Dockerfile").read_text().splitlines():
        if raw.strip().startswith("#") and not buf:
            continue
        buf += raw.rstrip("\\").strip() + " "
        if not raw.rstrip().endswith("\\"):
            if buf.strip():
                word, _, rest = buf.strip().partition(" ")
                lines.append((word.upper(), rest.strip()))
            buf = ""
    return lines


def test_dockerfile_is_multi_stage_non_root_and_copies_files_that_exist():
    instructions = _dockerfile()
    stages = [i for i, (word, _) in enumerate(instructions) if word == "FROM"]
    assert len(stages) >= 2
    final = instructions[stages[-1]:]
    assert any(w == "COPY" and a.startswith("--from=build") for w, a in final)
    user = [a for w, a in final if w == "USER"]
    assert user and user[-1].split(":")[0] not in ("root", "0")
    assert any(w == "ENTRYPOINT" and json.loads(a) == ["pointsman", "serve"] for w, a in final)
    assert {p for w, a in final if w == "EXPOSE" for p in a.split()} == {"8000", "9002"}
    ignore = (DEPLOY / "docker" / "Dockerfile.dockerignore").read_text().splitlines()
    for word, args in instructions[:stages[-1]]:
        if word == "COPY" and not args.startswith("--from"):
            *sources, _ = shlex.split(args)
            for src in sources:
                assert (ROOT / src).exists(), src
                assert f"!{src.rstrip('/')}" in ignore or f"!{src.rstrip('/')}/**" in ignore, src
    # the bundled model travels as package data of pointsman.estimator
    assert (ROOT / "estimator" / "default_model" / "manifest.json").exists()


def test_systemd_unit_runs_pointsman_serve_unprivileged():
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # keep the keys' case
    unit.read_string((DEPLOY / "systemd" / "pointsman.service").read_text())
    service = unit["Service"]
    command = shlex.split(service["ExecStart"])
    assert Path(command[0]).name == "pointsman" and command[1:] == ["serve"]
    assert service["User"] not in ("root", "0") and service["NoNewPrivileges"] == "true"
    assert service["ReadWritePaths"] == service["WorkingDirectory"] == "/var/lib/pointsman"
    assert service["StateDirectoryMode"] == "0700" and service["UMask"] == "0077"  # the outcome log is no one else's
    assert unit["Install"]["WantedBy"] == "multi-user.target"


def test_litellm_config_enables_the_pointsman_callback():
    config = yaml.safe_load((DEPLOY / "litellm" / "config.yaml").read_text())
    path = config["litellm_settings"]["callbacks"]
    module, _, name = path.rpartition(".")
    import importlib

    pytest.importorskip("litellm")
    handler = getattr(importlib.import_module(module), name)
    from litellm.integrations.custom_logger import CustomLogger

    assert isinstance(handler, CustomLogger)
    targets = {d["model_info"]["pointsman_target"] for d in config["model_list"]}
    assert targets <= set(load_fleet().targets)
    assert sum(bool(d["model_info"].get("pointsman_default")) for d in config["model_list"]) == 1


def _image_env() -> dict[str, str]:
    instructions = _dockerfile()
    final = instructions[[i for i, (w, _) in enumerate(instructions) if w == "FROM"][-1]:]
    return dict(part.split("=", 1) for w, a in final if w == "ENV" for part in shlex.split(a))


def test_every_deploy_starts_under_the_safe_default_rule(tmp_path):
    """Each shipped way to run Pointsman either binds loopback or has API keys (the image and the pod bind
    0.0.0.0, where no key means refusing to start): the pod's keys are files of a required Secret."""
    from pointsman.service.app import keys_of
    from pointsman.service.settings import Settings

    image = _image_env()
    assert image["POINTSMAN_HOST"] == "0.0.0.0"
    with pytest.raises(ValueError, match="refusing to serve on 0.0.0.0"):
        keys_of(Settings(host=image["POINTSMAN_HOST"]))
    run_notes = (DEPLOY / "docker" / "Dockerfile").read_text()
    assert "--env-file pointsman.env" in run_notes and "POINTSMAN_GATEWAY_API_KEYS=envoy=<secret>" in run_notes

    (deployment,) = by_kind(DEPLOY / "kubernetes" / "pointsman.yaml")["Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    host = env.get("POINTSMAN_HOST", image["POINTSMAN_HOST"])
    assert "POINTSMAN_ALLOW_UNAUTHENTICATED" not in env
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    secret_files = {}
    for role in ("gateway", "admin"):
        path = Path(env[f"POINTSMAN_{role.upper()}_API_KEYS_FILE"])
        volume = volumes[mounts[str(path.parent)]]  # the whole directory: a Secret update reaches the file
        assert volume["secret"]["secretName"] == "pointsman-keys" and not volume["secret"].get("optional")
        secret_files[role] = tmp_path / path.name
        secret_files[role].write_text(f"{role}-client={role}-secret-0123")  # what `kubectl create secret` writes
    keys_of(Settings(host=host, gateway_api_keys_file=secret_files["gateway"],
                     admin_api_keys_file=secret_files["admin"]))

    unit_lines = (DEPLOY / "systemd" / "pointsman.service").read_text().splitlines()
    environment = dict(e.split("=", 1) for line in unit_lines if line.startswith("Environment=")
                       for e in shlex.split(line.removeprefix("Environment=")))
    keys_of(Settings(host=environment["POINTSMAN_HOST"]))  # loopback: Envoy beside it on the same host


def test_the_shipped_redis_keeps_the_budget_ledger_across_a_restart():
    """redis.yaml serves the budget ledger too: a Redis that restarts empty loses every settled dollar until the
    replicas book their journals' again (``FleetState.restore_spend``), so it appends every write (fsync each second)
    to a file on a volume that outlives the pod; it refuses writes when full, below its memory limit with room for an
    AOF rewrite's fork, rather than evicting records (the ledger's epoch among them) or being OOM-killed; its service
    is headless, as a StatefulSet's governing service is."""
    k = by_kind(DEPLOY / "kubernetes" / "redis.yaml")
    (redis_set,), (service,) = k["StatefulSet"], k["Service"]
    (container,) = redis_set["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    assert args[args.index("--appendonly") + 1] == "yes" and args[args.index("--appendfsync") + 1] == "everysec"
    assert args[args.index("--maxmemory-policy") + 1] == "noeviction"
    mib = {"mb": 1, "gb": 1024}
    maxmemory = args[args.index("--maxmemory") + 1]
    assert int(maxmemory[:-2]) * mib[maxmemory[-2:]] <= int(container["resources"]["limits"]["memory"][:-2]) // 2
    assert service["spec"]["clusterIP"] == "None" and redis_set["spec"]["serviceName"] == service["metadata"]["name"]
    (claim,) = redis_set["spec"]["volumeClaimTemplates"]
    assert {m["name"]: m["mountPath"] for m in container["volumeMounts"]}[claim["metadata"]["name"]] == "/data"


@pytest.mark.skipif(not (hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("setpriv")
                         and shutil.which("redis-server")), reason="needs root, setpriv and redis-server")
def test_the_shipped_redis_can_write_its_append_only_file_on_a_fresh_volume():
    """A fresh volume is root's (0755); the kubelet gives it to the pod's ``fsGroup`` (group-owned, g+rwx, setgid)
    and nothing else: redis.yaml ran Redis as uid 999 with no fsGroup, so it exited at start ("Can't open or create
    append-only dir appendonlydir: Permission denied"). The real redis-server, with the manifest's args, user and the
    volume as the kubelet prepares it, writes its append-only file there."""
    (redis_set,) = by_kind(DEPLOY / "kubernetes" / "redis.yaml")["StatefulSet"]
    pod = redis_set["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    tmp_path = Path(tempfile.mkdtemp())  # pytest's are root's alone (0700): uid 999 could not reach one
    tmp_path.chmod(0o755)
    volume = tmp_path / "data"
    volume.mkdir(mode=0o755)
    groups = "--clear-groups"
    if (group := pod["securityContext"].get("fsGroup")) is not None:
        os.chown(volume, 0, group)
        volume.chmod(0o2775)
        groups = f"--groups={group}"
    (tmp_path / "run").mkdir(mode=0o777)
    (tmp_path / "run").chmod(0o777)
    sock = tmp_path / "run" / "redis.sock"
    proc = subprocess.Popen(["setpriv", f"--reuid={pod['securityContext']['runAsUser']}", "--regid=0", groups,
                             "redis-server", *container["args"], "--port", "0", "--unixsocket", str(sock),
                             "--dir", str(volume)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        for _ in range(100):  # until it listens or exits
            if sock.exists() or proc.poll() is not None:
                break
            subprocess.run(["sleep", "0.05"], check=True)
        assert proc.poll() is None, proc.communicate()[0][-300:]
        assert subprocess.run(["redis-cli", "-s", str(sock), "set", "k", "v"], capture_output=True, text=True).stdout \
            == "OK\n"
        assert any((volume / "appendonlydir").iterdir())
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(tmp_path)
