"""The budget ledger's contract: the ``BudgetLedger`` Protocol both backends implement
(``sqlite_ledger.SqliteLedger``, ``redis_ledger.RedisLedger``), its results (``Reservation``,
``Settlement``, ``BudgetSnapshot``, ``EffectivePrice``), its errors, and the admission rule
they share (``refusal``, ``build_snapshot``). The life of a decision's money and what cannot
happen are in the package docstring (``pointsman.policy.budget``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Protocol, runtime_checkable

from pointsman.errors import BudgetError
from pointsman.policy.budget.config import BudgetConfig
from pointsman.policy.budget.units import Window, to_nusd, to_usd, windows_at

# -- errors -----------------------------------------------------------------------------


class BudgetExceeded(BudgetError):
    """A reservation does not fit one of the request's budgets; nothing was held.

    Fields: ``scope``, ``window`` (``day``/``month``), ``window_id``, ``limit_usd``,
    ``spent_usd`` (settled + reserved in the window), ``requested_usd``,
    ``remaining_usd`` (``max(0, limit - spent)``).
    """

    def __init__(self, scope: str, window: str, window_id: str, limit_usd: float, spent_usd: float,
                 requested_usd: float) -> None:
        self.scope, self.window, self.window_id = scope, window, window_id
        self.limit_usd, self.spent_usd, self.requested_usd = limit_usd, spent_usd, requested_usd
        self.remaining_usd = max(0.0, limit_usd - spent_usd)
        super().__init__(f"budget exceeded: {scope} has ${self.remaining_usd:.9f} of ${limit_usd:.9f} left in "
                         f"{window_id} (spent ${spent_usd:.9f}); this request needs ${requested_usd:.9f}")


class UnknownReservation(BudgetError):
    """``settle``/``release`` named a decision id the ledger has no record of (never
    reserved, or older than ``record_retention_s``). ``decision_id`` holds the id."""

    def __init__(self, decision_id: str) -> None:
        self.decision_id = decision_id
        super().__init__(f"no reservation for decision '{decision_id}' (never reserved, or its record expired)")


class LedgerUnavailable(BudgetError):
    """The backend failed (SQLite locked past its timeout, Redis unreachable). The
    operation had no effect; the caller decides whether to fail open or closed."""


# -- windows and units ------------------------------------------------------------------


# -- configuration ----------------------------------------------------------------------


# -- results ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Reservation:
    """A hold of ``reserved_usd`` for ``decision_id`` on every scope in ``scopes``, booked
    in ``windows`` (``{"day": "day:2025-03-14", "month": "month:2025-03"}``); counts
    until ``expires_s`` (Unix seconds) unless settled or released first."""

    decision_id: str
    scopes: tuple[str, ...]
    reserved_usd: float
    created_s: float
    expires_s: float
    windows: dict[str, str]


@dataclass(frozen=True)
class Settlement:
    """The actual cost booked for a decision. ``overrun_usd = max(0, actual - reserved)``.
    ``replayed`` is True when this settle repeated an earlier one (nothing changed; the
    fields are the first settlement's). ``hold_state`` says what the hold was when the
    first settle arrived: ``held``, ``expired``, ``released``, or ``unreserved`` (never reserved: booked
    from the decision's scopes). ``day_id``: the day window it was booked in (a reservation's: taken when it was
    held), when the ledger says (a new settle on the Redis ledger), else None."""

    decision_id: str
    reserved_usd: float
    actual_cost_usd: float
    settled_s: float
    target: str | None
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    hold_state: str
    replayed: bool = False
    day_id: str | None = None

    @property
    def overrun_usd(self) -> float:
        """How much the actual cost exceeded the reservation (USD, >= 0)."""
        return max(0.0, self.actual_cost_usd - self.reserved_usd)


@dataclass(frozen=True)
class BudgetStatus:
    """One scope in one window at one moment. ``limit_usd`` None means unlimited;
    ``spent_usd = settled_usd + reserved_usd`` (live holds); ``remaining_usd`` is
    ``max(0, limit - spent)``, ``inf`` when unlimited."""

    scope: str
    window: str
    window_id: str
    window_end_s: float
    limit_usd: float | None
    settled_usd: float
    reserved_usd: float

    @property
    def spent_usd(self) -> float:
        """Settled plus reserved-but-unsettled, USD."""
        return self.settled_usd + self.reserved_usd

    @property
    def remaining_usd(self) -> float:
        """USD left before the limit (>= 0); ``math.inf`` when unlimited."""
        return math.inf if self.limit_usd is None else max(0.0, self.limit_usd - self.spent_usd)


@dataclass(frozen=True)
class BudgetSnapshot:
    """Every scope of a request in both windows at ``now``; the budget signals come from it.

    ``binding`` is the limited status with the least remaining USD (None: unlimited).
    ``fits(cost_usd)`` answers "would a reservation of this cost succeed now?" for any
    number of candidate costs without touching the backend again.
    """

    now: float
    statuses: tuple[BudgetStatus, ...]

    @cached_property
    def binding(self) -> BudgetStatus | None:
        """The limited status with the least ``remaining_usd``; None when no budget applies."""
        limited = [s for s in self.statuses if s.limit_usd is not None]
        return min(limited, key=lambda s: s.remaining_usd) if limited else None

    @property
    def remaining_usd(self) -> float:
        """Least remaining USD over every applicable budget; ``math.inf`` when unlimited."""
        b = self.binding
        return math.inf if b is None else b.remaining_usd

    def fits(self, cost_usd: float) -> bool:
        """True when ``reserve`` of ``cost_usd`` would pass every budget in this snapshot
        (the same rule: not exhausted, and spent + cost <= limit, in nano-USD)."""
        need = to_nusd(cost_usd)
        for s in self.statuses:
            if s.limit_usd is None:
                continue
            limit, spent = to_nusd(s.limit_usd), to_nusd(s.settled_usd) + to_nusd(s.reserved_usd)
            if spent >= limit or spent + need > limit:
                return False
        return True

    def remaining_by_scope(self) -> dict[str, float]:
        """``{scope: least remaining USD over its windows}``, ``math.inf`` for unlimited scopes."""
        out: dict[str, float] = {}
        for s in self.statuses:
            out[s.scope] = min(out.get(s.scope, math.inf), s.remaining_usd)
        return out


@dataclass(frozen=True)
class EffectivePrice:
    """Effective price per token of ``target`` over one window, from settled outcomes.

    ``spent_usd`` is every settled cost on the target (USD); ``usd_per_token`` is
    ``spent_usd / completion_tokens`` (tokens produced, the standard meaning) and
    ``usd_per_total_token`` is ``spent_usd / (prompt_tokens + completion_tokens)``;
    each is None when its token count is 0. ``cached_tokens`` counts the prompt tokens
    served from cache (a subset of ``prompt_tokens`` in OpenAI's usage). Outcomes are
    booked in the window of their reservation.
    """

    target: str
    window: str
    window_id: str
    spent_usd: float
    outcomes: int
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int

    @property
    def total_tokens(self) -> int:
        """Prompt plus completion tokens."""
        return self.prompt_tokens + self.completion_tokens

    @property
    def usd_per_token(self) -> float | None:
        """USD per completion token; None without completion tokens."""
        return self.spent_usd / self.completion_tokens if self.completion_tokens else None

    @property
    def usd_per_total_token(self) -> float | None:
        """USD per prompt-or-completion token; None without tokens."""
        return self.spent_usd / self.total_tokens if self.total_tokens else None


# -- the interface ----------------------------------------------------------------------


@runtime_checkable
class BudgetLedger(Protocol):
    """What the engine and the service call; ``SqliteLedger`` and ``RedisLedger`` implement it.

    Every ``now`` is Unix time in seconds (None: the wall clock); every amount is USD.
    All methods are safe to call from many threads; see each backend for processes.
    Backend failures raise ``LedgerUnavailable``; bad arguments raise ``BudgetError``.
    """

    config: BudgetConfig

    def reserve(self, decision_id: str, scopes: Sequence[str], estimated_cost_usd: float,
                now: float | None = None) -> Reservation:
        """Hold ``estimated_cost_usd`` on every scope; raises ``BudgetExceeded`` (nothing held)
        when a budget would be exceeded, ``BudgetError`` if ``decision_id`` was reserved before."""
        ...

    def settle(self, decision_id: str, actual_cost_usd: float, now: float | None = None,
               target: str | None = None, prompt_tokens: int = 0, cached_tokens: int = 0,
               completion_tokens: int = 0, scopes: Sequence[str] | None = None,
               issued_s: float | None = None) -> Settlement:
        """Replace the hold by the actual cost (idempotent: a repeat returns the first
        settlement with ``replayed=True``). Without a reservation (the ledger was down at
        dispatch, or the decision was never reserved), ``scopes`` and ``issued_s`` (the decision's
        Unix time) book it in that time's windows, ``hold_state`` ``unreserved``; raises
        ``UnknownReservation`` when there is no reservation and no ``scopes``."""
        ...

    def release(self, decision_id: str, now: float | None = None) -> bool:
        """Drop the hold; True if one was live, False if already settled, released or
        expired. Raises ``UnknownReservation``."""
        ...

    def set_hold(self, decision_id: str, cost_usd: float, now: float | None = None) -> bool:
        """Make a live hold ``cost_usd`` (USD, up or down, never refused): its cost became known before
        its settlement (a cascade's draft, booked at that cost by the same verify). True if a hold was live;
        False if settled, released, expired or never reserved (nothing changes). ``BudgetError`` for bad
        arguments."""
        ...

    def snapshot(self, scopes: Sequence[str], now: float | None = None) -> BudgetSnapshot:
        """Status of every scope in both windows at ``now`` (read-only for the budgets)."""
        ...

    def remaining(self, scopes: Sequence[str], now: float | None = None) -> dict[str, float]:
        """``{scope: remaining USD}`` (least over its windows; ``math.inf`` when unlimited)."""
        ...

    def effective_price_per_token(self, target: str, window: str = "day",
                                  now: float | None = None) -> EffectivePrice:
        """Spend and tokens of ``target`` in the ``day``/``month`` window containing ``now``."""
        ...

    def set_config(self, config: BudgetConfig) -> None:
        """Swap budgets and timing for the next operations (hot reload); holds stay."""
        ...

    def purge(self, now: float | None = None) -> int:
        """Delete records older than ``record_retention_s``; returns how many went."""
        ...

    def close(self) -> None:
        """Release connections."""
        ...


def build_snapshot(config: BudgetConfig, scopes: Sequence[str], now: float,
                   counters: dict[tuple[str, str], tuple[int, int]]) -> BudgetSnapshot:
    """Assemble a snapshot from ``counters[(scope, window_id)] = (reserved_nusd, settled_nusd)``
    (missing keys are zero); shared by the backends."""
    windows = windows_at(now)
    limits = {(b.scope, b.window): b.limit_usd for b in config.budgets_for(scopes)}
    statuses = []
    for scope in scopes:
        for kind, w in windows.items():
            held, settled = counters.get((scope, w.id), (0, 0))
            statuses.append(BudgetStatus(scope, kind, w.id, w.end_s, limits.get((scope, kind)),
                                         to_usd(settled), to_usd(max(0, held))))
    return BudgetSnapshot(now=now, statuses=tuple(statuses))


def refusal(config: BudgetConfig, scopes: Sequence[str], windows: dict[str, Window], need_nusd: int,
            counters: dict[tuple[str, str], tuple[int, int]]) -> BudgetExceeded | None:
    """The first budget that refuses ``need_nusd`` given ``counters`` (as in ``build_snapshot``),
    or None when it fits all. The admission rule both backends apply."""
    for b in config.budgets_for(scopes):
        w = windows[b.window]
        held, settled = counters.get((b.scope, w.id), (0, 0))
        spent, limit = max(0, held) + settled, b.limit_nusd
        if spent >= limit or spent + need_nusd > limit:
            return BudgetExceeded(b.scope, b.window, w.id, b.limit_usd, to_usd(spent), to_usd(need_nusd))
    return None
