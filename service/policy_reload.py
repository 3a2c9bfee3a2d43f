"""Policy hot reload: by file watch and by ``POST /v1/policy/reload``.

``reload_policy(live, path, source)`` reads and compiles the policy file against the
serving fleet. A valid file is swapped in (``LiveEngine.swap_policy``: decisions in
flight finish on the policy they started with); an invalid one is rejected as a whole
with every problem located (``file:line:col: code: message``) and the running policy
keeps serving. ``validate_policy_text`` compiles text without serving it
(``POST /v1/policy/validate``).

``watch_policy(live, path, stop)`` follows the file (``file_watch.watch_file``): it is
recompiled whenever its bytes change; each worker process watches for itself.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path

from pointsman.errors import PolicyError
from pointsman.policy.fleet import Fleet
from pointsman.policy.rules.compiler import CompiledPolicy, compile_policy, load_policy
from pointsman.service.file_watch import WATCH_DEBOUNCE_MS, watch_file
from pointsman.service.live_engine import LiveEngine, ReloadResult

log = logging.getLogger("pointsman.service.policy")


def validate_policy_text(text: str, fleet: Fleet, file: str = "<request>") -> CompiledPolicy:
    """Compile ``text`` against ``fleet``; raises ``PolicyError`` with every problem located in ``file``."""
    return compile_policy(text, fleet, file)


def reload_policy(live: LiveEngine, path: str | Path, source: str = "endpoint",
                  on_result: Callable[[ReloadResult], None] | None = None) -> ReloadResult:
    """Read, compile and swap in the policy at ``path`` (see the module); returns the result
    (also passed to ``on_result``). Never raises for a bad file: the problems are in the result."""
    with live.changing():  # compiled against the fleet it will serve with (a fleet reload waits)
        try:
            policy = load_policy(path, live.engine.fleet)
        except PolicyError as exc:
            result = live.reject_policy(exc.problems, source)
            log.error("policy %s rejected (%d problem(s)); still serving revision %s:\n%s", path, len(exc.problems),
                      result.revision, "\n".join(str(p) for p in exc.problems))
        else:
            result = live.swap_policy(policy, source)
            if result.changed:
                log.info("policy %s reloaded (%s): revision %s -> %s", path, source, result.previous_revision,
                         result.revision)
    if on_result is not None:
        on_result(result)
    return result


async def watch_policy(live: LiveEngine, path: str | Path, stop: asyncio.Event,
                       on_result: Callable[[ReloadResult], None] | None = None,
                       debounce_ms: int = WATCH_DEBOUNCE_MS) -> None:
    """Reload the policy whenever the file at ``path`` changes, until ``stop`` is set
    (``file_watch.watch_file``). Compiling runs in a worker thread; the event loop keeps serving."""
    await watch_file(path, stop, lambda p: reload_policy(live, p, "watch", on_result), "policy", debounce_ms)
