"""The key every replica signs decision ids with (``policy/signals/signed_ids.py``): a signed id
carries what settling its outcome needs, so the key must be the same in every process that may
receive an outcome.

Where it comes from, first found:

1. ``POINTSMAN_DECISION_KEY`` (a secret; its SHA-256 is the key);
2. with a shared state (``POINTSMAN_STATE_URL``): a key stored in Redis the first time any
   replica starts (``SET NX``): the one it cached in ``<data_dir>/decision.key`` if any (so a
   replica restarted after Redis lost its data keeps signing with the key the running replicas
   verify with), else a random one; cached there so a replica can start while Redis is away. To
   change the key, set ``POINTSMAN_DECISION_KEY``;
3. ``<data_dir>/decision.key``: created once (random, mode 0600; the workers of one host share it).
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
from pathlib import Path

from pointsman.errors import DataError
from pointsman.policy.signals.shared_state import RedisSync, StateSync
from pointsman.policy.signals.signed_ids import DecisionSigner
from pointsman.service.settings import Settings

log = logging.getLogger("pointsman.service")

#: The key's file under the data folder (hex).
KEY_FILE = "decision.key"


def _read(path: Path) -> bytes | None:
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise DataError(f"cannot read the decision signing key {path}: {exc}") from None
    try:
        key = bytes.fromhex(text)
    except ValueError:
        raise DataError(f"{path}: not a hex decision signing key; delete it to make a new one") from None
    if len(key) < 16:
        raise DataError(f"{path}: the decision signing key is shorter than 16 bytes; delete it to make a new one")
    return key


def _publish(path: Path, hex_key: str, replace: bool) -> None:
    """Write ``hex_key`` to ``path`` atomically (a temporary file linked or renamed into place);
    without ``replace`` an existing file wins. Raises ``OSError``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, hex_key.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        if replace:
            os.replace(tmp, path)
        else:
            try:
                os.link(tmp, path)
            except FileExistsError:
                pass
    finally:
        tmp.unlink(missing_ok=True)


def decision_signer(settings: Settings, sync: StateSync) -> DecisionSigner:
    """The signer of this service's decision ids (see the module). Raises ``DataError`` when no
    key can be had (the data folder unwritable, or Redis away with no cached key)."""
    if settings.decision_key is not None and settings.decision_key.get_secret_value():
        return DecisionSigner(hashlib.sha256(settings.decision_key.get_secret_value().encode()).digest())
    path = Path(settings.data_dir) / KEY_FILE
    if isinstance(sync, RedisSync):
        try:
            cached = _read(path)
        except DataError as exc:  # unreadable: Redis's key (or a new one) replaces it below
            log.warning("%s", exc)
            cached = None
        try:
            # the cached key first: after Redis lost its data, the replicas still running sign with it
            hex_key = sync.shared_key(cached.hex() if cached is not None else secrets.token_hex(32))
        except DataError as exc:
            if cached is None:
                raise DataError(f"{exc}, and no copy is cached in {path}: start Redis, or set POINTSMAN_DECISION_KEY "
                                "to the same secret on every replica") from None
            log.warning("decision signing key read from %s (the shared state is unavailable: %s)", path, exc)
            return DecisionSigner(cached)
        try:
            _publish(path, hex_key, replace=True)
        except OSError as exc:
            log.warning("decision signing key not cached in %s: %s", path, exc)
        return DecisionSigner(bytes.fromhex(hex_key))
    key = _read(path)
    if key is None:
        try:
            _publish(path, secrets.token_hex(32), replace=False)
        except OSError as exc:
            raise DataError(f"cannot create the decision signing key {path}: {exc}") from None
        key = _read(path)
        assert key is not None
    return DecisionSigner(key)


__all__ = ["KEY_FILE", "decision_signer"]
