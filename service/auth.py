"""API keys in three roles: ``gateway``, ``telemetry`` and ``admin``.

Keys come from settings (``POINTSMAN_GATEWAY_API_KEYS``, ``POINTSMAN_TELEMETRY_API_KEYS``,
``POINTSMAN_ADMIN_API_KEYS``):
comma-separated entries, each ``name=secret`` or a bare ``secret`` (its name is then
``key-`` + the first 8 hex of its sha256), and from key files re-read while serving
(``POINTSMAN_*_API_KEYS_FILE``, ``service/keys.py``). A client sends its key as
``Authorization: Bearer <secret>`` or ``x-api-key: <secret>``; never in the query string (URLs are
logged, by proxies too: a 401 says so, and the service's access log drops query values, ``access_log.py``).

========================================  ============  ==============  ==========
endpoint                                  gateway key   telemetry key   admin key
========================================  ============  ==============  ==========
``POST /v1/route``, ``/v1/outcomes``,     yes           no (403)        yes
``/v1/verify``
``POST /v1/telemetry``                    no (403)      yes             yes
``GET /v1/fleet``, ``GET /v1/policy``,    no (403)      no (403)        yes
``POST /v1/policy/validate``, ``/reload``
``GET /v1/budgets``, ``POST .../reload``
``/healthz``, ``/readyz``, ``/metrics``   open (probes and Prometheus scrapes)
========================================  ============  ==============  ==========

Telemetry (load pushes and health marks) moves every tenant's routing (marking every endpoint
unhealthy leaves no target), so it takes its own role, for engine sidecars, not a gateway's key.
No key → 401 (``WWW-Authenticate: Bearer``); an unknown key → 401; a key of another role than the
endpoint's (admin keys excepted) → 403. The presented key is compared with every configured key by
``hmac.compare_digest`` (constant time, no early exit). Secrets are ``SecretStr`` in the
settings and never logged; logs and budgets name keys by their name (``Principal.key_id``,
budget scope ``key:<name>``).

With no key configured at all, authentication is off: every caller is an anonymous admin.
That keeps the embedded-defaults quick start (``make serve`` on 127.0.0.1) working; the
service logs a warning at startup saying so, and refuses to start that way on a non-loopback
address unless the operator allows it explicitly (``service/keys.py``).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

from fastapi import Request, Security
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from starlette.requests import HTTPConnection

from pointsman.request import valid_scope_name
from pointsman.service.http_errors import HTTPError

ROLES = ("gateway", "telemetry", "admin")

_bearer = HTTPBearer(auto_error=False, description="An API key: `Authorization: Bearer <key>`.")
_header = APIKeyHeader(name="x-api-key", auto_error=False, description="An API key in the `x-api-key` header.")


@dataclass(frozen=True)
class Principal:
    """Who is calling: ``key_id`` (the key's name; None when authentication is off) and ``role``."""

    key_id: str | None
    role: str


@dataclass(frozen=True)
class _Key:
    key_id: str
    secret: bytes
    role: str


@dataclass(frozen=True)
class KeyEntry:
    """One configured key before parsing: its ``role``, its ``text`` (``name=secret`` or ``secret``)
    and ``where`` it was written (``POINTSMAN_GATEWAY_API_KEYS: entry 2``, ``/etc/keys/gateway:3``)."""

    role: str
    text: str
    where: str


def setting_entries(role: str, text: str | None, setting: str) -> list[KeyEntry]:
    """The comma-separated entries of one setting's value; raises ``ValueError`` for an empty entry
    in a non-blank value (``a,,b``)."""
    entries: list[KeyEntry] = []
    for n, entry in enumerate((text or "").split(","), start=1):
        entry = entry.strip()
        if not entry:
            if text and text.strip():
                raise ValueError(f"{setting}: entry {n} is empty")
            continue
        entries.append(KeyEntry(role, entry, f"{setting}: entry {n}"))
    return entries


class KeyRing:
    """The configured keys. ``KeyRing.parse(gateway, admin)`` from the settings' strings
    (``name=secret`` or ``secret`` entries, comma-separated); raises ``ValueError`` naming the
    setting for an empty entry, a duplicate name or a secret shorter than 8 characters (the
    message never contains a secret)."""

    def __init__(self, keys: list[_Key]) -> None:
        self._keys = tuple(keys)

    @classmethod
    def parse(cls, gateway: str | None, admin: str | None) -> KeyRing:
        """Parse both settings' values (plain strings, None = no keys)."""
        return cls.of_entries([*setting_entries("gateway", gateway, "POINTSMAN_GATEWAY_API_KEYS"),
                               *setting_entries("admin", admin, "POINTSMAN_ADMIN_API_KEYS")])

    @classmethod
    def of_entries(cls, entries: list[KeyEntry]) -> KeyRing:
        """The ring of ``entries`` (``name=secret`` or ``secret`` each); raises ``ValueError`` naming the
        entry's place for a secret shorter than 8 characters, a duplicate name or a duplicate secret."""
        keys: list[_Key] = []
        seen_ids: set[str] = set()
        seen_secrets: set[bytes] = set()
        for entry in entries:
            name, sep, secret = entry.text.partition("=")
            if not sep:
                name, secret = "", entry.text
            name, secret = name.strip(), secret.strip()
            where = f"{entry.where}{f' ({name})' if name else ''}"
            if len(secret) < 8:
                raise ValueError(f"{where}: a key needs at least 8 characters")
            if name and not valid_scope_name(name):
                raise ValueError(f"{entry.where}: a key name must be 1-200 characters without spaces "
                                 f"(it names the key:<name> budget scope), got {name[:40]!r}")
            raw = secret.encode("utf-8")
            key_id = name or f"key-{hashlib.sha256(raw).hexdigest()[:8]}"
            if key_id in seen_ids:
                raise ValueError(f"{entry.where}: key name '{key_id}' is used twice")
            if raw in seen_secrets:
                raise ValueError(f"{where}: the same key is configured twice")
            seen_ids.add(key_id)
            seen_secrets.add(raw)
            keys.append(_Key(key_id, raw, entry.role))
        return cls(keys)

    @property
    def enabled(self) -> bool:
        """True when at least one key is configured (authentication on)."""
        return bool(self._keys)

    @property
    def names(self) -> frozenset[str]:
        """The keys' names (their ``key:<name>`` budget scopes)."""
        return frozenset(k.key_id for k in self._keys)

    def counts(self) -> dict[str, int]:
        """Number of keys per role."""
        return {role: sum(k.role == role for k in self._keys) for role in ROLES}

    def identify(self, presented: str) -> Principal | None:
        """The principal of ``presented``, or None when it matches no key. Compares against every
        key with ``hmac.compare_digest`` (no early exit)."""
        raw = presented.encode("utf-8", "surrogateescape")
        found: _Key | None = None
        for key in self._keys:
            if hmac.compare_digest(raw, key.secret) and found is None:
                found = key
        return None if found is None else Principal(found.key_id, found.role)


def presented_key(bearer: HTTPAuthorizationCredentials | None, header: str | None) -> str | None:
    """The key the caller sent: the bearer token, else the ``x-api-key`` header, else None."""
    if bearer is not None and bearer.credentials:
        return bearer.credentials
    return header or None


def header_key(request: HTTPConnection) -> str | None:
    """``presented_key`` read from ``request``'s headers directly, as FastAPI's ``HTTPBearer`` and
    ``APIKeyHeader`` read them (``Authorization: Bearer <key>``, the scheme in any case; else
    ``x-api-key``): the hot paths (``app.PointsmanApp``) authenticate without dependency injection."""
    authorization = api_key = None
    for name, value in request.scope["headers"]:  # the first of each, as ``request.headers.get``
        if name == b"authorization":
            authorization = value if authorization is None else authorization
        elif name == b"x-api-key":
            api_key = value if api_key is None else api_key
    scheme, _, credentials = (authorization or b"").decode("latin-1").partition(" ")
    credentials = credentials.strip()
    if scheme.lower() == "bearer" and credentials:
        return credentials
    return (api_key or b"").decode("latin-1") or None


def authenticate(request: HTTPConnection, role: str, key: str | None) -> Principal:
    """The principal of ``key`` (the key ``request`` presented) when it may call an endpoint of ``role``
    (a key of that role, or an admin key). Raises ``HTTPError`` 401/403 (see the module)."""
    ring: KeyRing = request.app.state.keys.ring()
    if not ring.enabled:
        return Principal(None, "admin")
    if key is None:
        query = " (a key in the URL's query string is not read: URLs are logged)" if request.url.query else ""
        raise HTTPError(401, "this endpoint needs an API key: send 'Authorization: Bearer <key>' or "
                             f"'x-api-key'{query}",
                        type="authentication_error", code="missing_api_key",
                        headers={"WWW-Authenticate": "Bearer"})
    principal = ring.identify(key)
    if principal is None:
        raise HTTPError(401, "the API key is not valid", type="authentication_error", code="invalid_api_key",
                        headers={"WWW-Authenticate": "Bearer"})
    if principal.role not in (role, "admin"):
        raise HTTPError(403, f"this endpoint needs {'an admin' if role == 'admin' else f'a {role} or admin'} key; key "
                             f"'{principal.key_id}' has the {principal.role} role", type="permission_error",
                        code="forbidden")
    return principal


def may_report(principal: Principal | None, scopes: Iterable[str]) -> bool:
    """Whether ``principal`` may report on (verify a draft of, or post the outcome of) a decision
    with these budget ``scopes``: a decision routed under a gateway key (``key:<name>``) only by
    that key or an admin key, so a decision id seen in a forwarded header cannot spend another
    key's budget; any decision with authentication off or without a key scope."""
    if principal is None or principal.key_id is None or principal.role == "admin":
        return True
    keys = [s for s in scopes if s.startswith("key:")]
    return not keys or f"key:{principal.key_id}" in keys


def require(role: str) -> Callable[..., Awaitable[Principal]]:
    """A FastAPI dependency admitting callers whose key has ``role`` (``authenticate``; the security
    schemes it declares document the keys in OpenAPI)."""
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}; roles: {', '.join(ROLES)}")

    async def dependency(request: Request, bearer: HTTPAuthorizationCredentials | None = Security(_bearer),
                         header: str | None = Security(_header)) -> Principal:
        return authenticate(request, role, presented_key(bearer, header))

    return dependency
