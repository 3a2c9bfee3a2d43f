"""Fleet hot reload: by file watch and by ``POST /v1/fleet/reload``.

``reload_fleet(live, fleet_path, policy_path, source)`` reads the fleet file, recompiles the
serving policy file against it, rebuilds the live state for the new fleet
(``FleetState.rebuild``: endpoints and targets still in it keep their load, prefix entries,
sessions, health and in-flight requests; removed ones leave every signal) and swaps the new
engine in (``LiveEngine.swap_engine``; decisions in flight finish on the old one). A fleet
file with problems, or one the policy no longer compiles against, is rejected as a whole with
every problem located (``file:line:col: code: message``) and the running fleet and policy keep
serving. ``watch_fleet`` follows the file (``file_watch.watch_file``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path

from pointsman.errors import ConfigError
from pointsman.policy.engine import RoutingEngine
from pointsman.policy.fleet import load_fleet
from pointsman.policy.rules.compiler import load_policy
from pointsman.service.file_watch import WATCH_DEBOUNCE_MS, watch_file
from pointsman.service.live_engine import LiveEngine, ReloadResult

log = logging.getLogger("pointsman.service.fleet")


def reload_fleet(live: LiveEngine, fleet_path: str | Path, policy_path: str | Path | None = None,
                 source: str = "endpoint",
                 on_result: Callable[[ReloadResult], None] | None = None) -> ReloadResult:
    """Read the fleet at ``fleet_path``, recompile the policy (``policy_path``, default the
    serving policy's file) against it and serve both (see the module); returns the result (also
    passed to ``on_result``). Never raises for bad files: the problems are in the result."""
    with live.changing():  # held to the swap: a model swapped in meanwhile is not overwritten
        engine = live.engine
        try:
            fleet = load_fleet(fleet_path)
            if fleet.revision == engine.fleet.revision:
                result = ReloadResult(True, False, fleet.revision, fleet.revision, (), source)
                live.last_fleet_reload = result
            else:
                policy = load_policy(policy_path or engine.policy.file, fleet)
                state = engine.state.rebuild(fleet)
                new = RoutingEngine(fleet, policy, engine.estimator, state=state, filters=engine.filters)
                result = live.swap_engine(new, ReloadResult(True, True, fleet.revision, engine.fleet.revision, (), source))
                log.info("fleet %s reloaded (%s): revision %s -> %s; policy %s recompiled (revision %s)", fleet_path,
                         source, result.previous_revision, result.revision, policy.file, policy.revision)
        except ConfigError as exc:
            result = live.reject_fleet(exc.problems, source)
            log.error("fleet %s rejected (%d problem(s)); still serving fleet revision %s:\n%s", fleet_path,
                      len(exc.problems), result.revision, "\n".join(str(p) for p in exc.problems))
    if on_result is not None:
        on_result(result)
    return result


async def watch_fleet(live: LiveEngine, fleet_path: str | Path, stop: asyncio.Event,
                      on_result: Callable[[ReloadResult], None] | None = None,
                      debounce_ms: int = WATCH_DEBOUNCE_MS) -> None:
    """Reload the fleet whenever the file at ``fleet_path`` changes, until ``stop`` is set
    (``file_watch.watch_file``). Loading and compiling run in a worker thread."""
    await watch_file(fleet_path, stop, lambda p: reload_fleet(live, p, None, "watch", on_result), "fleet",
                     debounce_ms)
