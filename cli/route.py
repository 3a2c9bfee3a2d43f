"""``pointsman route`` (one decision, printed) and ``pointsman serve`` (the HTTP service).

Bad input (empty prompt, empty or malformed message file, invalid UTF-8, a missing
file, invalid fleet or policy files, a model named by ``--model`` / ``POINTSMAN_MODEL`` that cannot load, a prompt
no target can take) prints one clear
``Error: ...`` line (config files: one line per located problem) and exits with
status 2; never a traceback. A request a budget refuses (``POST /v1/route``'s 429
``budget_exhausted``) prints ``Error: budget_exhausted: no eligible target: ...`` and exits with status 3.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypedDict, TypeVar, Unpack, get_args

import click
from pydantic import ValidationError

from pointsman.cli.errors import BudgetRefused, ConfigProblems, InputError, validation_message
from pointsman.errors import BudgetError, ConfigError, DataError, RequestError
from pointsman.json_types import JSONObject, JSONValue
from pointsman.outcome_log.store import OutcomeLog
from pointsman.policy.decision import Decision
from pointsman.policy.selection.filters import NoEligibleTarget
from pointsman.request import parse_route_request
from pointsman.service.bootstrap import LoadedEngine, build_engine
from pointsman.service.ext_proc_body import decided_body
from pointsman.service.model_follower import followed
from pointsman.service.settings import LogLevel, Settings

F = TypeVar("F", bound=Callable[..., object])


#: seconds uvicorn's supervisor waits for a worker's health-check answer before it kills the worker (``serve``).
WORKER_HEALTHCHECK_S = 30


class _ServerOptions(TypedDict):
    """What ``serve`` hands ``uvicorn.run`` in both its modes."""

    host: str
    port: int
    log_level: str
    loop: str
    http: str


def config_options(fn: F) -> F:
    """``--fleet``, ``--policy``, ``--model``: override ``POINTSMAN_FLEET_PATH``, ``_POLICY_PATH``, ``_MODEL``."""
    fn = click.option("--model", "model", default=None, metavar="SPEC",
                      help="Estimator model (directory or registry URI) [env POINTSMAN_MODEL; default: the packaged model].")(fn)
    fn = click.option("--policy", "policy_path", default=None, type=click.Path(path_type=Path),
                      help="Policy file [env POINTSMAN_POLICY_PATH; default: the packaged default policy].")(fn)
    fn = click.option("--fleet", "fleet_path", default=None, type=click.Path(path_type=Path),
                      help="Fleet file [env POINTSMAN_FLEET_PATH; default: the packaged fleet].")(fn)
    return fn


class SettingsOverrides(TypedDict, total=False):
    """The ``Settings`` fields command-line options set (None: the option was not given)."""

    fleet_path: Path | None
    policy_path: Path | None
    model: str | None
    host: str | None
    port: int | None
    max_body_bytes: int | None
    log_level: str | None
    workers: int | None
    ext_proc_port: int | None
    ext_proc_host: str | None
    allow_unauthenticated: bool | None


def _check_bindable(host: str, port: int, option: str) -> None:
    """Raise ``InputError`` naming ``option`` when ``host:port`` cannot be bound now (in use, or no such
    address); the socket is closed at once (SO_REUSEADDR, so the server binds it right after)."""
    import socket

    try:
        infos = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM)
        family, _, _, _, address = infos[0]
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(address)
    except OSError as exc:
        raise InputError(f"{option}: cannot bind {host}:{port}: {exc.strerror or exc}") from None


def settings_from(**overrides: Unpack[SettingsOverrides]) -> Settings:
    """Settings from the environment, with the given non-None values on top; an invalid
    ``POINTSMAN_*`` variable raises ``InputError`` naming it."""
    given = {k: v for k, v in overrides.items() if v is not None}
    try:
        return Settings(**given)  # type: ignore[arg-type]  # the keys and value types are SettingsOverrides' (None left out)
    except ValidationError as exc:
        raise InputError(validation_message(exc)) from None


def load(settings: Settings, ledger: bool = True, shared: bool = False) -> LoadedEngine:
    """Build the engine (``shared``: with the shared-state sync, for ``serve``); config problems
    become ``ConfigProblems``, a bad ledger URL or a named model that cannot load (``--model`` /
    ``POINTSMAN_MODEL``, unless a followed alias: ``serve``'s model follower loads it when the registry
    answers) an ``InputError``; other estimator trouble (no model named, the estimator not installed) a warning."""
    try:
        loaded = build_engine(settings, ledger=ledger, shared=shared)
    except ConfigError as exc:
        raise ConfigProblems(exc) from None
    except BudgetError as exc:
        raise InputError(f"budget ledger: {exc}") from None
    except DataError as exc:  # the data folder (decision signing key) unusable: one Error: line
        raise InputError(str(exc)) from None
    if loaded.estimator_error and settings.model is not None and not followed(settings.model):
        loaded.engine.state.close()
        raise InputError(f"model {settings.model!r} (--model / POINTSMAN_MODEL) cannot be loaded: {loaded.estimator_error}")
    if loaded.estimator_error:
        click.echo(f"Warning: difficulty estimator unavailable ({loaded.estimator_error}); "
                   "deciding with difficulty.available == false", err=True)
    return loaded


def _decode(raw: bytes, what: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{what} is not valid UTF-8 (byte 0x{raw[exc.start]:02x} at offset {exc.start})") from None


def _read_messages(path: Path) -> JSONObject:
    """A chat request body from a JSON file: a message list, or a full request object (Chat Completions, or
    Anthropic Messages, Responses, Completions read as ``POST /v1/route`` reads them: ``decided_body``)."""
    what = f"--messages {path}"
    try:
        raw = sys.stdin.buffer.read() if str(path) == "-" else path.read_bytes()
    except FileNotFoundError:
        raise InputError(f"{what}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"{what}: is a directory") from None
    except OSError as exc:
        raise InputError(f"{what}: {exc.strerror or exc}") from None
    text = _decode(raw, what)
    if not text.strip():
        raise InputError(f"{what}: file is empty; expected a JSON message list or chat request")
    try:
        data: JSONValue = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{what}: malformed JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except RecursionError:
        raise InputError(f"{what}: malformed JSON: nested too deeply") from None
    if isinstance(data, list):
        data = {"messages": data}
    if isinstance(data, dict) and any(key in data for key in ("messages", "input", "prompt")):
        try:  # another API's request (Anthropic Messages, Responses, Completions), read as POST /v1/route reads it
            return decided_body(data)
        except RequestError as exc:
            raise InputError(f"{what}: {exc}") from None
    raise InputError(f"{what}: expected a JSON list of messages or a request object (\"messages\", \"input\" or "
                     f"\"prompt\"), got {type(data).__name__ if not isinstance(data, dict) else 'an object without them'}")


def _entries(trace: Mapping[str, object], section: str) -> list[Mapping[str, object]]:
    """The entries (objects) of a list section of a decision's trace (``rules``, ``candidates``)."""
    items = trace.get(section)
    return [item for item in items if isinstance(item, Mapping)] if isinstance(items, list) else []


#: How ``--explain`` names the reading of a short follow-up that ``p_hard`` is (``DifficultyEstimate.reading``).
READINGS = {"continued": "of the request this short follow-up continues",
            "alone": "of this short follow-up read alone, above the request it continues"}


def _shown(value: object) -> str:
    """A signal's value for the terminal: floats to 6 significant digits, anything else as JSON."""
    return f"{value:.6g}" if isinstance(value, float) else json.dumps(value, ensure_ascii=False, default=str)


def _print_human(d: Decision, explain: bool) -> None:
    p_hard = f"{d.p_hard:.3f}" if d.p_hard is not None else "unavailable"
    estimator = d.trace.get("estimator") if explain else None
    reading = estimator.get("reading") if isinstance(estimator, Mapping) else None
    if reading in READINGS:
        p_hard += f" ({READINGS[reading]})"
    t = d.timings_ms
    lines = [
        ("target", f"{d.target} ({d.model})"),
        ("mode", d.mode),
        ("base_url", d.base_url),
        ("rule", d.rule),
        ("p_hard", p_hard),
        ("prompt", f"{d.prompt_tokens:,} tokens"),
        ("cost", f"${d.estimated_cost_usd:.6f} (estimated)"),
        ("endpoints", ", ".join(f"{e.name or e.url} ({e.role})" for e in d.endpoints)),
        ("fallbacks", ", ".join(f.target for f in d.fallbacks) or "none"),
        ("timings", f"features {t['features']:.2f} ms, estimator {t['estimator']:.2f} ms, "
                    f"policy {t['policy']:.2f} ms, total {t['total']:.2f} ms"),
        ("decision", d.decision_id),
    ]
    for key, value in lines:
        click.echo(f"{key:<10} {value}")
    if explain:
        click.echo("rules:")
        for r in _entries(d.trace, "rules"):
            extra = f" ({r['error']})" if "error" in r else f" ({r['note']})" if "note" in r else ""
            click.echo(f"  {r['rule']:<24} {r['result']}{extra}")
        signals = d.trace.get("signals")
        if isinstance(signals, Mapping) and signals:
            click.echo("signals (the values the rules tried refer to; a condition may stop before reading each):")
            for name, read in signals.items():
                click.echo(f"  {name:<40} {_shown(read.get('value') if isinstance(read, Mapping) else read)}")
        click.echo("candidates:")
        for c in _entries(d.trace, "candidates"):
            status = "eligible" if c["eligible"] else f"excluded: {c['excluded_by']}"
            click.echo(f"  {c['target']:<16} {c['mode']:<14} ${c['estimated_cost_usd']:.6f}  {status}")


@click.command("route")
@click.argument("prompt", required=False)
@click.option("--messages", "messages_path", type=click.Path(path_type=Path), default=None,
              help="JSON file with an OpenAI-style message list or a full request: Chat Completions, Anthropic "
                   "Messages, Responses or Completions, read as POST /v1/route reads it ('-' for stdin).")
@click.option("--json", "as_json", is_flag=True, help="Print the decision as one JSON object.")
@click.option("--explain", is_flag=True, help="Include the trace: every rule evaluated, candidates and costs.")
@click.option("--max-tokens", type=click.IntRange(min=1), default=None, help="The request's output cap.")
@click.option("--tenant", default=None, help="routing.tenant")
@click.option("--team", default=None, help="routing.team")
@click.option("--session-id", default=None, help="routing.session_id")
@click.option("--slo-class", default=None, help="routing.slo_class")
@config_options
def route_command(prompt: str | None, messages_path: Path | None, as_json: bool, explain: bool,
                  max_tokens: int | None, tenant: str | None, team: str | None, session_id: str | None,
                  slo_class: str | None,
                  fleet_path: Path | None, policy_path: Path | None, model: str | None) -> None:
    """Decide where PROMPT (or the chat in --messages) runs, and print the decision.

    PROMPT '-' reads the prompt from stdin. A what-if: nothing is reserved or recorded
    (budgets are read when POINTSMAN_BUDGET_LEDGER or POINTSMAN_BUDGETS_PATH is set).
    """
    if prompt is not None and messages_path is not None:
        raise InputError("give either PROMPT or --messages, not both")
    if prompt is None and messages_path is None:
        raise InputError("give a PROMPT argument or --messages FILE")
    if messages_path is not None:
        body: JSONObject = _read_messages(messages_path)
    else:
        assert prompt is not None
        text = _decode(sys.stdin.buffer.read(), "stdin") if prompt == "-" else prompt
        if not text.strip():
            raise InputError("the prompt is empty")
        body = {"messages": [{"role": "user", "content": text}]}
    given = body.get("routing")
    routing: JSONObject = dict(given) if isinstance(given, dict) else {}
    for key, value in (("tenant", tenant), ("team", team), ("session_id", session_id), ("slo_class", slo_class)):
        if value is not None:
            routing[key] = value
    if explain:
        routing["explain"] = True
    if routing:
        body["routing"] = routing
    if max_tokens is not None:  # the cap: a body's max_completion_tokens would otherwise win over it
        body = {**{k: v for k, v in body.items() if k != "max_completion_tokens"}, "max_tokens": max_tokens}
    try:
        request = parse_route_request(body)
    except RequestError as exc:
        raise InputError(str(exc)) from None
    loaded = load(settings_from(fleet_path=fleet_path, policy_path=policy_path, model=model), ledger=False)
    try:
        decision = loaded.engine.route(request, dispatch=False)
    except NoEligibleTarget as exc:
        raise (BudgetRefused if exc.by_budget else InputError)(str(exc)) from None
    except (RequestError, BudgetError) as exc:  # no eligible target; ledger unavailable
        raise InputError(str(exc)) from None
    finally:
        loaded.engine.state.close()
    if as_json:
        click.echo(json.dumps(decision.to_dict(explain=explain)))
    else:
        _print_human(decision, explain)


@click.command("serve")
@click.option("--host", default=None, help="Bind address [env POINTSMAN_HOST; default 127.0.0.1].")
@click.option("--port", type=click.IntRange(0, 65535), default=None, help="Port [env POINTSMAN_PORT; default 8000].")
@click.option("--max-body-bytes", type=click.IntRange(min=1), default=None,
              help="Largest accepted request body [env POINTSMAN_MAX_BODY_BYTES; default 8 MiB].")
@click.option("--log-level", default=None, type=click.Choice(get_args(LogLevel), case_sensitive=False),
              help="Log level [env POINTSMAN_LOG_LEVEL; default info].")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="Worker processes [env POINTSMAN_WORKERS; default 1].")
@click.option("--ext-proc-port", type=click.IntRange(0, 65535), default=None,
              help="Also serve Envoy ext_proc (Gateway API Inference Extension endpoint picker) on this gRPC port "
                   "[env POINTSMAN_EXT_PROC_PORT; default off].")
@click.option("--ext-proc-host", default=None,
              help="Bind address of the ext_proc port; with API keys, each stream must carry one in its gRPC "
                   "metadata [env POINTSMAN_EXT_PROC_HOST; default the --host].")
@click.option("--allow-unauthenticated", is_flag=True, default=None,
              help="Serve on a non-loopback --host with no API key at all (every caller is admin) "
                   "[env POINTSMAN_ALLOW_UNAUTHENTICATED; default: refuse to start].")
@config_options
def serve_command(host: str | None, port: int | None, max_body_bytes: int | None, log_level: str | None,
                  workers: int | None, ext_proc_port: int | None, ext_proc_host: str | None,
                  allow_unauthenticated: bool | None,
                  fleet_path: Path | None, policy_path: Path | None, model: str | None) -> None:
    """Run the decision service (see docs/service.md for the endpoints) with uvicorn."""
    import importlib.util
    import os
    import shutil
    import tempfile

    import uvicorn

    from pointsman.service.app import create_app, keys_of
    from pointsman.service.app import ext_proc_host as ext_proc_bind_host
    from pointsman.service.http_protocol import PROTOCOL
    from pointsman.service.supervisor import Supervisor

    overrides = SettingsOverrides(host=host, port=port, max_body_bytes=max_body_bytes, log_level=log_level,
                                  workers=workers, ext_proc_port=ext_proc_port, ext_proc_host=ext_proc_host,
                                  allow_unauthenticated=allow_unauthenticated or None, fleet_path=fleet_path,
                                  policy_path=policy_path, model=model)
    settings = settings_from(**overrides)
    if settings.ext_proc_port is not None and (importlib.util.find_spec("grpc") is None
                                               or importlib.util.find_spec("envoy") is None):
        raise InputError("--ext-proc-port needs the ext-proc extra: pip install 'pointsman[ext-proc]' (grpcio, xds-protos)")
    if settings.ext_proc_port:  # a busy or unbindable ext_proc port is one Error: line, not a traceback at startup
        _check_bindable(ext_proc_bind_host(settings), settings.ext_proc_port, "--ext-proc-port")
    try:
        keys_of(settings)  # API key settings and files, and the safe default, are checked here, before anything loads
    except ValueError as exc:
        raise InputError(str(exc)) from None
    if settings.workers > 1 and not settings.state_url:
        raise InputError(f"--workers {settings.workers} needs shared state: set POINTSMAN_STATE_URL=redis://HOST:PORT/DB "
                         "(each worker would otherwise count only its own requests, so load, sessions and outcome "
                         "releases would split between them); or run one worker per process")
    loaded = load(settings, shared=settings.workers == 1)  # config errors are reported here, before the server starts
    try:  # an unwritable data folder is one Error: line here, not a traceback from the app's start-up
        OutcomeLog(settings.outcome_log_path()).close()
    except DataError as exc:
        raise InputError(str(exc)) from None
    level = settings.log_level.lower()
    # uvloop and httptools by name, not uvicorn's "auto": asyncio's loop leaves TCP_NODELAY off
    # on the sockets of uvicorn's multi-worker listener (+40 ms per response, Nagle and delayed
    # ACK), and uvloop sets it on every TCP connection (scripts/load_service.py's docstring).
    # uvloop is a serving dependency except on Windows, where it does not exist.
    loop = "uvloop" if importlib.util.find_spec("uvloop") is not None else "auto"
    # httptools, with each request's line and headers bounded in size and time (service/http_protocol.py)
    server = _ServerOptions(host=settings.host, port=settings.port, log_level=level, loop=loop, http=PROTOCOL)
    if settings.workers == 1:
        app = create_app(settings, engine=loaded.engine, owns_engine=True, estimator_error=loaded.estimator_error,
                         freeze=True)
        uvicorn.run(app, **server)
        return
    loaded.engine.state.close()
    # each worker process builds its own app from the environment: hand the options over there
    for key, value in overrides.items():
        if value is not None:
            os.environ[f"POINTSMAN_{key.upper()}"] = str(value)
    # uvicorn pings each worker and kills one that does not answer within timeout_worker_healthcheck (5 s by
    # default): a worker loading the estimator (onnxruntime, numpy holding the GIL) on a busy node missed it and
    # was killed at start-up, twice in a row at load average 7.6 on 2 cores. 30 s lets it load; a hung worker is
    # still replaced, later.
    # a scrape reaches one worker: the workers keep their counters in files there and each exports their sum
    metrics_dir = os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="pointsman-metrics-")
    try:
        # uvicorn.run's --workers path, with a supervisor that keeps serving when a replacement worker fails to
        # start on a file broken since the start (service/supervisor.py)
        config = uvicorn.Config("pointsman.service.app:create_app_from_env", factory=True, workers=settings.workers,
                                timeout_worker_healthcheck=WORKER_HEALTHCHECK_S, **server)
        Supervisor(config, sockets=[config.bind_socket()]).run()
    finally:
        shutil.rmtree(metrics_dir, ignore_errors=True)


def register(group: click.Group) -> None:
    """Attach ``route`` and ``serve`` to the ``pointsman`` group."""
    group.add_command(route_command)
    group.add_command(serve_command)
