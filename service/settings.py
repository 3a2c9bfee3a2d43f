"""Service and CLI settings (pydantic-settings): environment variables prefixed
``POINTSMAN_``, overridden by explicit arguments (CLI options).

- ``POINTSMAN_FLEET_PATH``: fleet file (YAML); default the packaged ``policy/defaults/fleet.yaml``.
- ``POINTSMAN_POLICY_PATH``: routing policy (YAML + CEL); default the packaged ``default.yaml``.
- ``POINTSMAN_MODEL``: estimator model spec for ``load_estimator`` (``bundled``, ``champion``,
  ``models:/NAME@ALIAS``, or a directory); default the bundled model.
- ``POINTSMAN_ESTIMATOR_TIMEOUT_MS``: time budget per estimate in ms; an overrun counts as
  unavailable (the policy's ``difficulty.available == false`` rule decides). The service
  enforces it on a small thread pool (``service/deadline.py``), so a hung estimator holds no
  decision longer than this; the hand-off costs about 0.04 ms of CPU per decision
  (measured with ``scripts/profile_route.py``). Default 50 ms (the bundled static-embedding
  model estimates in about 0.5 ms at 500 tokens; a MiniLM transformer model needs ~100 ms at
  512 tokens on 2 cores and a larger budget); ``none`` disables it.
- ``POINTSMAN_ESTIMATOR_THREADS``: onnxruntime threads per session; default 1.
- ``POINTSMAN_DATA_DIR``: data folder (MLflow store, downloaded models); default ``./data``.
- ``POINTSMAN_MAX_BODY_BYTES``: largest accepted request body in bytes; default 8 MiB (8388608).
- ``POINTSMAN_BODY_READ_TIMEOUT_S``: time a request's body may take to arrive after its headers
  (``service/bodies.py``); past it the answer is 408 ``body_timeout`` and the connection closes.
  Default 10 s (8 MiB at about 7 Mbit/s; a gateway on the same network sends it in milliseconds). A request's
  line and headers have as long after the connection opened or its previous response (``http_protocol.py``).
- ``POINTSMAN_HOST`` / ``POINTSMAN_PORT``: bind address and port of ``pointsman serve``;
  default ``127.0.0.1:8000``.
- ``POINTSMAN_LOG_LEVEL``: uvicorn and app log level; default ``info``.
- ``POINTSMAN_BUDGET_LEDGER``: budget ledger URL (``policy/budget/`` ``open_ledger``):
  ``sqlite:///path.db`` or ``redis://host:port/db`` (several service replicas share one);
  default ``sqlite`` at ``<POINTSMAN_DATA_DIR>/budget.db``.
- ``POINTSMAN_BUDGETS_PATH``: budgets file (YAML, ``kind: Budgets``: per ``tenant:``, ``team:``
  or ``key:`` scope a ``day`` and/or ``month`` limit in USD; see ``policy/budget/``);
  default none: every request unlimited (spend is still recorded).
- ``POINTSMAN_BUDGET_FAIL_OPEN``: when the ledger is unreachable, route requests that have
  budgets anyway (``true``) or refuse them with 503 (``false``, default).

Service only (``pointsman serve``):

- ``POINTSMAN_GATEWAY_API_KEYS`` / ``POINTSMAN_ADMIN_API_KEYS``: API keys, comma-separated,
  each ``name=secret`` or a bare ``secret`` (``service/auth.py``). Gateway keys may route and
  post outcomes; admin keys may also post telemetry and read and change policy and fleet state.
- ``POINTSMAN_TELEMETRY_API_KEYS`` (and ``_FILE``): keys that may only post telemetry (load and
  endpoint health, ``POST /v1/telemetry``: engine sidecars); a gateway key may not.
  The name is the key's id in logs and its budget scope (``key:<name>``). Default: none,
  and then authentication is off (a startup warning says so).
- ``POINTSMAN_GATEWAY_API_KEYS_FILE`` / ``POINTSMAN_ADMIN_API_KEYS_FILE``: key files, the same
  entries one or more per line, ``#`` comment lines; re-read within about a second when they
  change, so keys rotate without a restart; a broken or emptied file keeps the keys in force
  (``service/keys.py``). Default: none.
- ``POINTSMAN_ALLOW_UNAUTHENTICATED``: serve on a non-loopback address with no API key at all
  (``serve --allow-unauthenticated``); default ``false``: ``pointsman serve --host 0.0.0.0``
  without keys refuses to start.
- ``POINTSMAN_OUTCOME_LOG``: the decision and outcome log (SQLite); default
  ``<POINTSMAN_DATA_DIR>/outcomes.db``.
- ``POINTSMAN_DECISION_KEY``: the secret every replica signs decision ids with (HMAC-SHA256 of
  the claims settling needs: ``policy/signals/signed_ids.py``); default: a random key kept in
  the shared state (``POINTSMAN_STATE_URL``; cached as ``<data_dir>/decision.key`` for a start
  while Redis is away), else in ``<data_dir>/decision.key`` (the workers of one host share it).
- ``POINTSMAN_STORE_PROMPTS``: also store the prompt text of decisions (operator opt-in);
  default ``false``: a hash, the request features and the head-input vector only.
- ``POINTSMAN_STORE_DRAFTS``: also store the text of drafts sent to ``POST /v1/verify``
  (operator opt-in); default ``false``: the draft's features only.
- ``POINTSMAN_VERIFIER``: the cascade's verifier: ``heuristic`` (default, the documented
  heuristic of ``estimator/verifier.py``) or a directory holding a trained head.
- ``POINTSMAN_VERIFY_TTL_S``: how long a decision can be verified after it was made; default
  600 s (later: 410). ``POINTSMAN_VERIFY_MAX_PENDING``: decisions held for verification at most
  (the oldest are forgotten first); default 100,000. ``POINTSMAN_VERIFY_MAX_PENDING_BYTES``: the memory
  of their request text at most (its ``str`` and UTF-8 forms; the oldest forgotten first); default
  536,870,912 (512 MiB).
- ``POINTSMAN_DECISION_LOG_FLUSH_MS``: how long a decision waits in memory before the
  background writer commits it (batched); default 50 ms. ``POINTSMAN_DECISION_LOG_QUEUE``:
  decisions held in memory at most (beyond it new ones are dropped, counted and logged);
  default 100,000.
- ``POINTSMAN_OUTCOME_FSYNC_MS``: 0 (default): an outcome is acknowledged after its ``fsync``
  (concurrent outcomes share one); > 0: once written to the outcome log's WAL (it survives the
  process being killed), ``fsync``ed in the background at most this long after (an OS crash or
  power loss may lose that last interval's acknowledged outcomes). ``outcome_log/store.py``.
- ``POINTSMAN_WATCH_POLICY``: reload the policy when its file changes; default ``true``.
- ``POINTSMAN_MODEL_POLL_INTERVAL_S``: how often the service asks the MLflow registry
  where the followed alias points (only when ``POINTSMAN_MODEL`` is ``champion`` or
  ``models:/NAME@ALIAS``); default 30 s; 0 disables following.
- ``POINTSMAN_ROUTE_IN_THREADPOOL``: run each decision in the threadpool instead of on the
  event loop; default ``false`` (measured faster on the loop, see ``scripts/load_service.py``).
- ``POINTSMAN_WORKERS``: uvicorn worker processes of ``pointsman serve``; default 1. More than
  one needs ``POINTSMAN_STATE_URL`` (each worker would otherwise see only its own requests).
- ``POINTSMAN_STATE_URL``: where workers and replicas share live state (in-flight requests,
  pushed telemetry, health marks, sessions; ``policy/signals/shared_state.py``):
  ``redis://host:port/db``; default none: this process alone (embedded).
- ``POINTSMAN_SCRAPE_INTERVAL_S``: how often the ``/metrics`` of the endpoints the fleet asks to be
  scraped are read (``defaults.scrape_metrics: true``: every on-prem one; absent: those naming a
  ``metrics_url``; ``false``: none); default 2 s; 0 disables scraping. ``POINTSMAN_SCRAPE_TIMEOUT_S``: per scrape, default 1 s.
  ``POINTSMAN_SCRAPE_FAILURES_TO_UNHEALTHY``: failed scrapes in a row that mark an endpoint
  unhealthy (until it answers again); default 3.
- ``POINTSMAN_WATCH_FLEET``: reload the fleet file (and recompile the policy against it) when
  it changes; default ``true``.
- ``POINTSMAN_WATCH_BUDGETS``: reload the budgets file (``POINTSMAN_BUDGETS_PATH``) when it
  changes; default ``true``. A file with problems is rejected with located errors and the
  running budgets keep applying (``service/budgets_reload.py``).
- ``POINTSMAN_EXT_PROC_PORT``: also serve Envoy's ext_proc as a Gateway API Inference Extension
  endpoint picker on this gRPC port (same process and engine; ``service/ext_proc.py``);
  default none (off). Needs the ``ext-proc`` extra (grpcio, xds-protos). With API keys configured,
  each stream must carry a gateway or admin key in its gRPC metadata (``authorization: Bearer <key>``
  or ``x-api-key``: Envoy's ``grpc_service.initial_metadata``), else it ends UNAUTHENTICATED.
- ``POINTSMAN_EXT_PROC_HOST``: the address the ext_proc port binds; default the HTTP host
  (``POINTSMAN_HOST``). A non-loopback one without API keys is refused as for the HTTP host.
- ``POINTSMAN_EXT_PROC_REQUIRE_KEY``: with API keys configured, streams to the ext_proc port must carry
  one (default ``true``). ``false`` for a Gateway API gateway, whose ``InferencePool`` cannot send
  metadata: then restrict the port to the gateway by the network (``deploy/kubernetes/pointsman.yaml``'s
  NetworkPolicy); decisions made that way have no ``key:`` budget scope.
- ``POINTSMAN_EXT_PROC_DESTINATIONS``: how many ``host:port`` entries the picker puts in
  ``x-gateway-destination-endpoint`` (the picked endpoint, then its fallback endpoints); default
  none: all of them. Set 1 behind a plain Envoy ``ORIGINAL_DST`` cluster, which reads exactly one.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from pointsman.outcome_log.store import DEFAULT_FILE as DEFAULT_LOG_FILE
from pointsman.policy.fleet import DEFAULT_FLEET_PATH
from pointsman.policy.rules.compiler import DEFAULT_POLICY_PATH

#: ``POINTSMAN_*`` names read outside ``Settings``: the gateway clients' and LiteLLM integrations'
#: (``integrations/``), the shared datasets folder, the README's shell variable for a gateway key and the
#: tests' switches.
OTHER_ENV_NAMES = frozenset({"POINTSMAN_URL", "POINTSMAN_API_KEY", "POINTSMAN_ROUTE_TIMEOUT_S",
                             "POINTSMAN_VERIFY_TIMEOUT_S", "POINTSMAN_CASCADE", "POINTSMAN_SHARED_DATASETS",
                             "POINTSMAN_KEY", "POINTSMAN_REQUIRE_REDIS", "POINTSMAN_REQUIRE_PROMETHEUS",
                             "POINTSMAN_CLEAN_INTERPRETER"})

#: uvicorn's log levels.
LogLevel = Literal["critical", "error", "warning", "info", "debug", "trace"]

DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024
#: Default hard time budget per difficulty estimate (ms); ``POINTSMAN_ESTIMATOR_TIMEOUT_MS=none`` disables it.
DEFAULT_ESTIMATOR_TIMEOUT_MS = 50.0


class Settings(BaseSettings):
    """Settings for the decision service and the CLI; see the module table for each field."""

    model_config = SettingsConfigDict(env_prefix="POINTSMAN_", extra="ignore", protected_namespaces=())

    fleet_path: Path = DEFAULT_FLEET_PATH
    policy_path: Path = DEFAULT_POLICY_PATH
    model: str | None = None
    estimator_timeout_ms: float | None = Field(default=DEFAULT_ESTIMATOR_TIMEOUT_MS, gt=0)
    estimator_threads: int = Field(default=1, ge=1)
    data_dir: Path = Path("data")
    max_body_bytes: int = Field(default=DEFAULT_MAX_BODY_BYTES, gt=0)
    body_read_timeout_s: float = Field(default=10.0, gt=0)
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    log_level: LogLevel = "info"
    budget_ledger: str | None = None
    budgets_path: Path | None = None
    budget_fail_open: bool = False
    gateway_api_keys: SecretStr | None = None
    admin_api_keys: SecretStr | None = None
    telemetry_api_keys: SecretStr | None = None
    gateway_api_keys_file: Path | None = None
    admin_api_keys_file: Path | None = None
    telemetry_api_keys_file: Path | None = None
    allow_unauthenticated: bool = False
    outcome_log: Path | None = None
    store_prompts: bool = False
    store_drafts: bool = False
    verifier: str | None = None
    verify_ttl_s: float = Field(default=600.0, gt=0)
    verify_max_pending: int = Field(default=100_000, ge=1)
    verify_max_pending_bytes: int = Field(default=512 * 2**20, ge=1)
    decision_log_flush_ms: float = Field(default=50.0, ge=0)
    outcome_fsync_ms: float = Field(default=0.0, ge=0)
    decision_log_queue: int = Field(default=100_000, ge=1)
    watch_policy: bool = True
    model_poll_interval_s: float = Field(default=30.0, ge=0)
    route_in_threadpool: bool = False
    workers: int = Field(default=1, ge=1)
    state_url: str | None = None
    decision_key: SecretStr | None = None
    scrape_interval_s: float = Field(default=2.0, ge=0)
    scrape_timeout_s: float = Field(default=1.0, gt=0)
    scrape_failures_to_unhealthy: int = Field(default=3, ge=1)
    watch_fleet: bool = True
    watch_budgets: bool = True
    ext_proc_port: int | None = Field(default=None, ge=0, le=65535)
    ext_proc_host: str | None = None
    ext_proc_require_key: bool = True
    ext_proc_destinations: int | None = Field(default=None, ge=1)

    @field_validator("state_url")
    @classmethod
    def _state_url(cls, v: str | None) -> str | None:
        """A Redis URL (``redis://``, ``rediss://``, ``unix://``) or none."""
        if v is None or not v.strip():
            return None
        scheme = v.split(":", 1)[0].lower()
        if scheme not in ("redis", "rediss", "unix"):
            raise ValueError(f"scheme '{scheme}' is not redis, rediss or unix (e.g. redis://127.0.0.1:6379/0)")
        return v

    @field_validator("log_level", mode="before")
    @classmethod
    def _level_case(cls, v: object) -> object:
        """A level in any case (``INFO``); uvicorn reads them lower-case."""
        return v.strip().lower() if isinstance(v, str) else v

    @field_validator("estimator_timeout_ms", mode="before")
    @classmethod
    def _no_timeout(cls, v: object) -> object:
        """``none`` (any case) means no budget."""
        return None if isinstance(v, str) and v.strip().lower() == "none" else v

    def outcome_log_path(self) -> Path:
        """The decision and outcome log file: ``outcome_log``, else ``<data_dir>/outcomes.db``."""
        return self.outcome_log if self.outcome_log is not None else self.data_dir / DEFAULT_LOG_FILE


def unknown_env_settings(environ: Mapping[str, str]) -> list[str]:
    """One message per ``POINTSMAN_*`` name in ``environ`` that nothing reads, with the nearest setting's
    name: pydantic-settings ignores them, so ``POINTSMAN_BUDGET_PATH`` (for ``POINTSMAN_BUDGETS_PATH``)
    left every tenant unlimited without a word."""
    known = {f"POINTSMAN_{name.upper()}" for name in Settings.model_fields} | OTHER_ENV_NAMES
    out = []
    for name in sorted(n for n in environ if n.upper().startswith("POINTSMAN_") and n.upper() not in known):
        near = difflib.get_close_matches(name.upper(), sorted(known), n=1, cutoff=0.8)
        out.append(f"{name} is not a Pointsman setting and is ignored" + (f"; did you mean {near[0]}?" if near else ""))
    return out
