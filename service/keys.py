"""Where the API keys in force come from, how they rotate, and the safe default on a network.

``KeySource.from_settings(settings)`` holds the keys of ``POINTSMAN_GATEWAY_API_KEYS`` /
``POINTSMAN_ADMIN_API_KEYS`` / ``POINTSMAN_TELEMETRY_API_KEYS`` plus those of their key files
(``..._FILE``). A key file holds entries like the settings (``name=secret`` or
``secret``), one or more per line (comma-separated); blank lines and lines starting with ``#`` are
not keys. ``KeySource.ring()`` is what ``auth.require`` asks per request: at most every
``check_interval_s`` (0.5 s) it stats the files, and when one changed (inode, size or mtime: a
rewrite, a rename over it, a Kubernetes Secret volume's symlink swap) it re-reads them all, so a
rotated key is in force within about a second, without a restart.

A re-read that fails keeps the keys in force (and logs why, once per change): an unreadable or
vanished file, a malformed entry (``file:line``), or a file with no keys left. An emptied key file
never turns authentication off. At start the same problems are a ``ValueError`` (the CLI's one
``Error:`` line, exit 2).

``exposure_problem(host, ring, allow_unauthenticated)`` is the safe default: serving on a
non-loopback address with no key at all is refused unless the operator allows it explicitly
(``serve --allow-unauthenticated`` or ``POINTSMAN_ALLOW_UNAUTHENTICATED=true``); on 127.0.0.1,
``::1`` or ``localhost`` authentication may stay off (the quick start).
"""

from __future__ import annotations

import ipaddress
import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from pointsman.service.auth import KeyEntry, KeyRing, setting_entries

if TYPE_CHECKING:  # pragma: no cover
    from pointsman.service.settings import Settings

log = logging.getLogger("pointsman.service.keys")

#: How often (s) at most ``KeySource.ring`` stats the key files.
CHECK_INTERVAL_S = 0.5

_Signature = tuple[int, int, int, int] | None


def file_entries(role: str, path: Path, setting: str) -> list[KeyEntry]:
    """The entries of one key file (see the module); raises ``ValueError`` naming ``setting`` and the
    file when it cannot be read or is not UTF-8, or holds no key."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise ValueError(f"{setting}: cannot read {path}: {reason}") from None
    entries: list[KeyEntry] = []
    for n, line in enumerate(text.splitlines(), start=1):
        if line.strip().startswith("#"):
            continue
        entries.extend(KeyEntry(role, part.strip(), f"{path}:{n}") for part in line.split(",") if part.strip())
    if not entries:
        raise ValueError(f"{setting}: {path} holds no key (a key file needs at least one; "
                         "an empty file never turns authentication off)")
    return entries


def _signature(path: Path) -> _Signature:
    """What tells a changed file: (device, inode, size, mtime in ns) of the file ``path`` resolves to."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def key_names(settings: Settings) -> frozenset[str] | None:
    """The names of the API keys ``settings`` configure, read now (key files included), which a budgets
    file's ``key:<name>`` scopes must name; None when the keys cannot be read (nothing to check against)."""
    try:
        return KeySource.from_settings(settings).ring().names
    except ValueError:
        return None


class KeySource:
    """The keys in force (see the module). ``settings``: (role, value, setting name) per role;
    ``files``: (role, path, setting name) per configured key file. Raises ``ValueError`` (naming the
    setting, the file and line) when the keys cannot be read at construction."""

    def __init__(self, settings: list[tuple[str, str | None, str]], files: list[tuple[str, Path, str]],
                 check_interval_s: float = CHECK_INTERVAL_S) -> None:
        self._settings = [e for role, value, name in settings for e in setting_entries(role, value, name)]
        self._files = files
        self._interval_s = check_interval_s
        self._signatures = [_signature(path) for _, path, _ in files]
        self._ring = self._read()
        self._checked_s = time.monotonic()

    @classmethod
    def from_settings(cls, settings: Settings) -> KeySource:
        """The key source ``settings`` configure (``*_API_KEYS`` and ``*_API_KEYS_FILE``)."""
        values = [("gateway", settings.gateway_api_keys, "POINTSMAN_GATEWAY_API_KEYS"),
                  ("telemetry", settings.telemetry_api_keys, "POINTSMAN_TELEMETRY_API_KEYS"),
                  ("admin", settings.admin_api_keys, "POINTSMAN_ADMIN_API_KEYS")]
        files = [("gateway", settings.gateway_api_keys_file, "POINTSMAN_GATEWAY_API_KEYS_FILE"),
                 ("telemetry", settings.telemetry_api_keys_file, "POINTSMAN_TELEMETRY_API_KEYS_FILE"),
                 ("admin", settings.admin_api_keys_file, "POINTSMAN_ADMIN_API_KEYS_FILE")]
        return cls([(role, None if v is None else v.get_secret_value(), name) for role, v, name in values],
                   [(role, path, name) for role, path, name in files if path is not None])

    def _read(self) -> KeyRing:
        """Parse the settings' entries and every key file afresh; raises ``ValueError``."""
        entries = list(self._settings)
        for role, path, setting in self._files:
            entries.extend(file_entries(role, path, setting))
        return KeyRing.of_entries(entries)

    def ring(self) -> KeyRing:
        """The keys in force; re-reads the key files when one changed (at most every ``check_interval_s``)."""
        if not self._files:
            return self._ring
        now = time.monotonic()
        if now - self._checked_s < self._interval_s:
            return self._ring
        self._checked_s = now
        signatures = [_signature(path) for _, path, _ in self._files]
        if signatures != self._signatures:
            self._signatures = signatures
            try:
                ring = self._read()
            except ValueError as exc:
                log.error("API key files changed but cannot be used, keeping the keys in force: %s", exc)
            else:
                self._ring = ring
                counts = ring.counts()
                log.info("API keys reloaded: %d gateway, %d telemetry, %d admin", counts["gateway"],
                         counts["telemetry"], counts["admin"])
        return self._ring


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (127.0.0.0/8, ``::1``); False for any other
    name or address, ``0.0.0.0`` and ``::`` included."""
    name = host.strip().strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def exposure_problem(host: str, ring: KeyRing, allow_unauthenticated: bool) -> str | None:
    """Why serving on ``host`` with ``ring`` must not start (the message, naming the settings and the
    override), or None when it may: keys are configured, the host is loopback, or the operator allowed it."""
    if ring.enabled or allow_unauthenticated or is_loopback(host):
        return None
    return (f"refusing to serve on {host} without API keys: anyone who can reach the port could route, and "
            "read or change the policy and fleet. Set POINTSMAN_GATEWAY_API_KEYS and POINTSMAN_ADMIN_API_KEYS "
            "(or POINTSMAN_GATEWAY_API_KEYS_FILE / POINTSMAN_ADMIN_API_KEYS_FILE), bind 127.0.0.1, or allow it "
            "explicitly with --allow-unauthenticated (POINTSMAN_ALLOW_UNAUTHENTICATED=true)")
