"""Budgets in replay: a real budget ledger per policy run, on the simulated clock.

``replay_ledger(config, folder)`` opens the embedded ``SqliteLedger`` (``policy/budget/sqlite_ledger.py``,
the service's default backend) on a fresh file in ``folder`` with the budgets of ``config``
(a ``BudgetConfig``, e.g. ``BudgetConfig.load(path)`` of a ``kind: Budgets`` file). The
``EngineRouter`` hands it to its ``FleetState``, so a replayed decision goes through the same
budget path as a served one: the ``budget`` filter and ``budget.*`` signals read ledger
snapshots, dispatch reserves the estimate, and completion settles the simulated actual cost
(frontier: the simulated bill; on-prem: the cost model on the usage, as the service prices an
outcome). Every ``now`` is simulated: ``EPOCH_S`` (2026-01-01T00:00:00Z) + trace seconds, so a
``day`` budget's pacing window starts with the trace and its ``pace_gap`` runs ahead of the
clock by the spent fraction (a trace of T seconds covers T/86400 of the day).

Replayed requests carry one budget scope, ``tenant:<tenant>`` (``REPLAY_TENANT`` unless the
caller picks another); ``check_applies`` refuses a budgets file none of whose budgets applies
to it, so a typo cannot silently replay without budgets.

A cascade's escalations take the same path (``replay.engine_router``, ``cascade``): reserved at the
verify, refused when they do not fit, settled at their bill when the escalated call completes.

``budget_status(ledger, scopes, now)`` is what the report shows: per budget that applies,
its window, limit, settled and still-reserved USD at the end of the run.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TypedDict

from pointsman.errors import BudgetError
from pointsman.policy.budget.config import BudgetConfig
from pointsman.policy.budget.ledger import BudgetLedger
from pointsman.policy.budget.sqlite_ledger import SqliteLedger

#: The tenant replayed requests belong to unless ``--tenant`` says otherwise.
REPLAY_TENANT = "replay"


def replay_scopes(tenant: str) -> tuple[str, ...]:
    """The budget scopes of every replayed request: ``("tenant:<tenant>",)``."""
    return (f"tenant:{tenant}",)


def check_applies(config: BudgetConfig, tenant: str, source: str = "<budgets>") -> None:
    """Raise ``BudgetError`` naming ``source`` and the scopes it does have when none of
    ``config``'s budgets applies to ``tenant:<tenant>``."""
    if not config.budgets_for(replay_scopes(tenant)):
        have = sorted({b.scope for b in config.budgets})
        raise BudgetError(f"{source}: no budget applies to the replayed requests (scope tenant:{tenant}); "
                          f"the file has {', '.join(have) or 'no budgets'}: set --tenant to one of its tenants")


def replay_ledger(config: BudgetConfig, folder: str | Path) -> BudgetLedger:
    """A fresh ``SqliteLedger`` with ``config``'s budgets at ``<folder>/budget.db`` (the file
    must not exist yet: every run starts with nothing spent). Raises ``BudgetError`` when it does."""
    path = Path(folder) / "budget.db"
    if path.exists():
        raise BudgetError(f"{path} exists: a replay ledger starts empty")
    return SqliteLedger(path, config, checkpoint_interval_s=0)


class BudgetSpend(TypedDict):
    """One budget at the end of a replayed run (``budget_status``); USD, ``spent_fraction`` 0-1+."""

    scope: str
    window: str
    window_id: str
    limit_usd: float
    settled_usd: float
    reserved_usd: float
    spent_fraction: float


def budget_status(ledger: BudgetLedger, scopes: Sequence[str], now: float) -> list[BudgetSpend]:
    """Per limited budget of ``scopes`` at Unix time ``now``: ``{scope, window, window_id,
    limit_usd, settled_usd, reserved_usd, spent_fraction}`` (USD; fraction 0-1+, settled +
    reserved over the limit, 1 for a zero budget), in ``scopes`` order, day before month."""
    out: list[BudgetSpend] = []
    for s in ledger.snapshot(tuple(scopes), now).statuses:
        if s.limit_usd is None:
            continue
        spent = s.settled_usd + s.reserved_usd
        out.append(BudgetSpend(scope=s.scope, window=s.window, window_id=s.window_id, limit_usd=s.limit_usd,
                               settled_usd=s.settled_usd, reserved_usd=s.reserved_usd,
                               spent_fraction=spent / s.limit_usd if s.limit_usd > 0 else 1.0))
    return out


__all__ = ["REPLAY_TENANT", "BudgetSpend", "budget_status", "check_applies", "replay_ledger",
           "replay_scopes"]
