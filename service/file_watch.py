"""``watch_file(path, stop, on_change, what)``: follow one configuration file while serving.

The policy, fleet and budgets files are watched the same way, with ``watchfiles`` (inotify,
or polling where the platform has no file events): any change in the file's folder (editors
that write a temporary file and rename it, Kubernetes ConfigMap symlink swaps) triggers a
check, and ``on_change(path)`` runs (in a worker thread, so the event loop keeps serving) only
when the file's bytes changed. Each worker process watches for itself, so with several
workers every one of them reloads.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("pointsman.service.watch")

#: Milliseconds of quiet after a file event before the watcher looks (editors write in bursts).
WATCH_DEBOUNCE_MS = 200


def file_digest(path: Path) -> str | None:
    """sha256 of the file's bytes, or None when it cannot be read (being replaced, deleted)."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


async def watch_file(path: str | Path, stop: asyncio.Event, on_change: Callable[[Path], object], what: str,
                     debounce_ms: int = WATCH_DEBOUNCE_MS) -> None:
    """Call ``on_change(path)`` whenever the bytes of the file at ``path`` change, until ``stop``
    is set (see the module). ``what`` names the file in the log (``policy``, ``fleet``,
    ``budgets``: a watcher that breaks says so and names ``POST /v1/<what>/reload``)."""
    from watchfiles import awatch

    path = Path(path).absolute()
    seen = file_digest(path)
    try:
        async for _changes in awatch(path.parent, stop_event=stop, debounce=debounce_ms, recursive=False,
                                     ignore_permission_denied=True):
            digest = file_digest(path)
            if digest is None or digest == seen:
                continue
            seen = digest
            await asyncio.to_thread(on_change, path)
    except Exception:  # noqa: BLE001 - a broken watcher must not stop the service; say so
        log.exception("%s file watcher for %s stopped; reload with POST /v1/%s/reload", what, path, what)
