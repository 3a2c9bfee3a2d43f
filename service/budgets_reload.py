"""Budgets while serving: the status of every budget (``GET /v1/budgets``) and hot reload of the
budgets file (file watch and ``POST /v1/budgets/reload``).

``reload_budgets(live, path, source)`` reads the budgets file (``BudgetConfig.load``). A valid
file is swapped into the ledger (``BudgetLedger.set_config``: holds and spend stay; new limits
apply from the next decision) and the kept budget snapshots are dropped; an invalid one is
rejected as a whole with every problem located (``file:line:col: code: message``) and the
running budgets keep applying. ``watch_budgets`` follows the file (``file_watch.watch_file``).

``budget_statuses(ledger, now)`` is every configured budget in its current window: limit,
settled, held, spent (settled + held), remaining, and when the window resets (UTC).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections.abc import Callable, Collection
from datetime import UTC, datetime
from pathlib import Path

from pointsman.errors import Problem
from pointsman.json_types import JSONValue
from pointsman.policy.budget.config import BudgetConfig, BudgetConfigError
from pointsman.policy.budget.ledger import BudgetLedger
from pointsman.service.file_watch import WATCH_DEBOUNCE_MS, watch_file
from pointsman.service.live_engine import LiveEngine, ReloadResult

log = logging.getLogger("pointsman.service.budgets")


def budgets_revision(config: BudgetConfig) -> str:
    """A short content hash of the budgets (12 hex digits): equal budgets, equal revision."""
    return hashlib.sha256(json.dumps(config.to_dict(), sort_keys=True).encode()).hexdigest()[:12]


def reload_budgets(live: LiveEngine, path: str | Path | None, source: str = "endpoint",
                   on_result: Callable[[ReloadResult], None] | None = None,
                   key_names: Callable[[], Collection[str] | None] | None = None) -> ReloadResult:
    """Read the budgets file at ``path`` and apply it (see the module); returns the result (also
    passed to ``on_result``). Never raises for a bad file: the problems are in the result. Without
    a ledger or a budgets file (``path`` None) the result is a rejection that says so. ``key_names()``:
    the service's API key names now, which its ``key:`` scopes must name (``BudgetConfig.load``)."""
    state = live.engine.state
    ledger = state.ledger
    before = budgets_revision(ledger.config) if ledger is not None else "none"
    problems: tuple[Problem, ...] = ()
    if ledger is None or path is None:
        problems = (Problem("<settings>", 0, 0, "no-budgets-file",
                            "no budgets file is configured: start the service with POINTSMAN_BUDGETS_PATH"),)
    else:
        try:
            config = BudgetConfig.load(path, None if key_names is None else key_names(),
                                       state.journal is not None and callable(getattr(ledger, "add_sums", None)))
        except BudgetConfigError as exc:
            problems = tuple(exc.problems)
    if problems or ledger is None:
        result = ReloadResult(False, False, before, before, problems, source)
        log.error("budgets %s rejected (%d problem(s)); the running budgets keep applying:\n%s", path,
                  len(problems), "\n".join(str(p) for p in problems))
    else:
        after = budgets_revision(config)
        if after != before:
            ledger.set_config(config)
            state.budgets_changed()
            log.info("budgets %s reloaded (%s): revision %s -> %s", path, source, before, after)
        result = ReloadResult(True, after != before, after, before, (), source)
    live.last_budgets_reload = result
    if on_result is not None:
        on_result(result)
    return result


async def watch_budgets(live: LiveEngine, path: str | Path, stop: asyncio.Event,
                        on_result: Callable[[ReloadResult], None] | None = None,
                        debounce_ms: int = WATCH_DEBOUNCE_MS,
                        key_names: Callable[[], Collection[str] | None] | None = None) -> None:
    """Reload the budgets whenever the file at ``path`` changes, until ``stop`` is set."""
    await watch_file(path, stop, lambda p: reload_budgets(live, p, "watch", on_result, key_names), "budgets",
                     debounce_ms)


def budget_statuses(ledger: BudgetLedger, now: float | None = None) -> list[JSONValue]:
    """Every configured budget in the window containing ``now`` (Unix s; default the clock), in
    file order: ``scope``, ``window`` (day/month), ``window_id``, ``limit_usd``, ``settled_usd``
    (outcomes booked), ``held_usd`` (live reservations), ``spent_usd`` (settled + held, what
    admission counts), ``remaining_usd`` (``max(0, limit - spent)``), ``used_ratio`` (spent /
    limit; 1 for a zero limit), ``resets_at`` (ISO 8601 UTC) and ``resets_in_s``. Raises
    ``LedgerUnavailable``."""
    budgets = ledger.config.budgets
    if not budgets:
        return []
    now = time.time() if now is None else now
    scopes = list(dict.fromkeys(b.scope for b in budgets))
    by_key = {(st.scope, st.window): st for st in ledger.snapshot(scopes, now).statuses}
    out: list[JSONValue] = []
    for b in budgets:
        st = by_key[(b.scope, b.window)]
        spent = st.spent_usd
        out.append({"scope": b.scope, "window": b.window, "window_id": st.window_id, "limit_usd": b.limit_usd,
                    "settled_usd": st.settled_usd, "held_usd": st.reserved_usd, "spent_usd": spent,
                    "remaining_usd": max(0.0, b.limit_usd - spent),
                    "used_ratio": spent / b.limit_usd if b.limit_usd > 0 else 1.0,
                    "resets_at": datetime.fromtimestamp(st.window_end_s, tz=UTC).isoformat().replace("+00:00", "Z"),
                    "resets_in_s": max(0.0, st.window_end_s - now)})
    return out
