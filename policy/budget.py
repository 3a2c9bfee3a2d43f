"""Budget ledger: spending limits in USD per tenant, team or API key over UTC calendar
windows, with reservations that make concurrent decisions unable to overspend.

Vocabulary
----------
- **scope**: who a budget belongs to, written ``kind:name`` with kind ``tenant``,
  ``team`` or ``key`` (``tenant:acme``, ``team:acme/search``, ``key:k_9f2c``). Use
  an API key's id, never the secret. A request carries several scopes at once.
- **window**: ``day`` or ``month``, UTC calendar windows: a day runs from 00:00:00
  UTC to the next midnight, a month from the 1st 00:00:00 UTC to the next 1st.
  Window ids read ``day:2025-03-14`` and ``month:2025-03``.
- **budget**: a limit in USD for one scope over one window. A scope may have a
  ``day`` and a ``month`` budget. ``limit_usd: 0`` means nothing may be spent; a
  scope without budgets is unlimited (its spend is still recorded).

Life of a decision's money
--------------------------
1. ``reserve(decision_id, scopes, estimated_cost_usd, now)`` holds the estimate
   against every budget of every scope, atomically: it succeeds only if, for each
   budget, ``spent_usd < limit_usd`` and ``spent_usd + estimated_cost_usd <=
   limit_usd``, where ``spent_usd = settled_usd + reserved_usd`` in the window that
   contains ``now``. Otherwise nothing is held and ``BudgetExceeded`` names the
   first budget that refused. An exhausted budget refuses even a $0 estimate, so
   a zero budget refuses everything.
2. ``settle(decision_id, actual_cost_usd, now, target, ...tokens)`` replaces the
   hold by the actual cost, in the windows of the *reservation* (a decision made at
   23:59:59 UTC is booked on that day even if its outcome arrives after midnight).
   Settling again returns the first settlement and changes nothing.
3. ``release(decision_id)`` drops a hold that will never settle.
4. A hold not settled or released within ``reservation_ttl_s`` (default 600 s)
   *expires*: it stops counting against the budget. If its outcome arrives later,
   ``settle`` still records the actual cost (the money was spent), as it does after
   a ``release``. Set the TTL above the longest request you serve.

What cannot happen, and what can
---------------------------------
Holds and settled costs are integers of nano-USD (1e-9 USD), so sums are exact and
comparisons never drift. Each backend makes the check-and-hold one atomic step
(SQLite: one ``BEGIN IMMEDIATE`` transaction, a database-wide write lock shared by
threads and processes; Redis: one Lua script, which Redis runs without interleaving
any other command). So at any moment, for every budget::

    settled_usd + reserved_usd <= limit_usd + overruns

where ``overruns`` is the sum of ``max(0, actual - reserved)`` over settlements that
exceeded their reservation, plus the cost of outcomes settled after their hold
expired or was released. With estimates that are upper bounds and outcomes that
arrive within the TTL, spend never exceeds the limit. A budget over its limit
refuses every new reservation until its window rolls over.

Records of reservations are kept ``record_retention_s`` (default 7 days) for
idempotent settles; after that, settling the id raises ``UnknownReservation``.

Backends (one URL setting, ``open_ledger``): ``sqlite:///path/to/ledger.db``
(``policy/budget_sqlite.py``, the embedded default) or ``redis://host:port/db``
(``policy/budget_redis.py``, for several service replicas).
"""

from __future__ import annotations

import functools
import math
import re
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any, Iterable, Literal, Protocol, Sequence, runtime_checkable

from pydantic import AfterValidator, Field, field_validator, model_validator

from pointsman.errors import BudgetError, ConfigError, Problem
from pointsman.policy.located import LocatedDocument, StrictModel, parse_yaml, read_text, validate

SCOPE_KINDS: tuple[str, ...] = ("tenant", "team", "key")
WINDOWS: tuple[str, ...] = ("day", "month")
#: Nano-USD per USD: the ledger's integer unit.
NUSD_PER_USD = 1_000_000_000
DEFAULT_RESERVATION_TTL_S = 600.0
DEFAULT_RECORD_RETENTION_S = 7 * 86400.0
#: File name of the embedded ledger under the data folder.
DEFAULT_SQLITE_NAME = "budget.db"

_SCOPE_RE = re.compile(r"(tenant|team|key):\S{1,200}")
_ID_RE = re.compile(r"\S{1,200}")


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
        super().__init__(f"budget exceeded: {scope} has ${self.remaining_usd:.6f} of ${limit_usd:.6f} left in "
                         f"{window_id} (spent ${spent_usd:.6f}); this request needs ${requested_usd:.6f}")


class UnknownReservation(BudgetError):
    """``settle``/``release`` named a decision id the ledger has no record of (never
    reserved, or older than ``record_retention_s``). ``decision_id`` holds the id."""

    def __init__(self, decision_id: str) -> None:
        self.decision_id = decision_id
        super().__init__(f"no reservation for decision '{decision_id}' (never reserved, or its record expired)")


class LedgerUnavailable(BudgetError):
    """The backend failed (SQLite locked past its timeout, Redis unreachable). The
    operation had no effect; the caller decides whether to fail open or closed."""


class BudgetConfigError(ConfigError, BudgetError):
    """A budgets configuration is invalid; ``problems`` names every bad key
    (``budgets[1].limit_usd``) with file:line:col when it came from a file."""


# -- windows and units ------------------------------------------------------------------


@dataclass(frozen=True)
class Window:
    """One UTC calendar window: ``kind`` (day/month), ``id`` (``day:2025-03-14``),
    ``start_s``/``end_s`` Unix seconds (start inclusive, end exclusive)."""

    kind: str
    id: str
    start_s: float
    end_s: float


def window_of(kind: str, now: float) -> Window:
    """The ``day`` or ``month`` UTC window containing Unix time ``now`` (seconds).
    Raises ``BudgetError`` for another kind. Memoized per UTC day (every decision asks)."""
    if kind not in WINDOWS:
        raise BudgetError(f"unknown budget window '{kind}' (expected one of: {', '.join(WINDOWS)})")
    return _window_of_day(kind, math.floor(now / 86400.0))


@functools.lru_cache(maxsize=64)
def _window_of_day(kind: str, day: int) -> Window:
    dt = datetime.fromtimestamp(day * 86400.0, tz=timezone.utc)
    if kind == "day":
        start = datetime(dt.year, dt.month, dt.day, tzinfo=timezone.utc)
        return Window("day", f"day:{start:%Y-%m-%d}", start.timestamp(), (start + timedelta(days=1)).timestamp())
    if kind == "month":
        start = datetime(dt.year, dt.month, 1, tzinfo=timezone.utc)
        end = datetime(dt.year + (dt.month == 12), dt.month % 12 + 1, 1, tzinfo=timezone.utc)
        return Window("month", f"month:{start:%Y-%m}", start.timestamp(), end.timestamp())
    raise BudgetError(f"unknown budget window '{kind}' (expected one of: {', '.join(WINDOWS)})")


def windows_at(now: float) -> dict[str, Window]:
    """Both windows containing ``now``: ``{"day": Window, "month": Window}``."""
    return {kind: window_of(kind, now) for kind in WINDOWS}


def to_nusd(usd: float, name: str = "cost_usd") -> int:
    """USD -> integer nano-USD (rounded). Raises ``BudgetError`` naming ``name`` for a
    negative, NaN, infinite or non-numeric amount."""
    if isinstance(usd, bool) or not isinstance(usd, (int, float)) or not math.isfinite(usd) or usd < 0:
        raise BudgetError(f"{name} must be a finite number >= 0 (USD), got {usd!r}")
    return round(usd * NUSD_PER_USD)


def to_usd(nusd: int) -> float:
    """Integer nano-USD -> USD."""
    return nusd / NUSD_PER_USD


def check_scopes(scopes: Iterable[str]) -> tuple[str, ...]:
    """Validate and de-duplicate scopes (order kept); raises ``BudgetError`` for a malformed one."""
    if isinstance(scopes, str):
        scopes = (scopes,)
    out: list[str] = []
    for s in scopes:
        if not isinstance(s, str) or not _SCOPE_RE.fullmatch(s):
            raise BudgetError(f"scope {s!r} is not 'kind:name' with kind one of {', '.join(SCOPE_KINDS)} "
                              f"and a name of 1-200 non-space characters")
        if s not in out:
            out.append(s)
    return tuple(out)


def check_id(value: str, name: str = "decision_id") -> str:
    """Validate a decision id or target name: 1-200 non-space characters; else ``BudgetError``."""
    if not isinstance(value, str) or not _ID_RE.fullmatch(value):
        raise BudgetError(f"{name} must be 1-200 non-space characters, got {value!r}")
    return value


#: Largest token count of one settlement (each of prompt, cached, completion): the ledgers keep
#: running sums in 64-bit integers, which this keeps far from overflowing.
MAX_SETTLE_TOKENS = 1_000_000_000


def check_tokens(**counts: int) -> None:
    """Each token count must be an int in [0, ``MAX_SETTLE_TOKENS``]; raises ``BudgetError``
    naming the first bad one."""
    for name, v in counts.items():
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_SETTLE_TOKENS:
            raise BudgetError(f"{name} must be an integer in [0, {MAX_SETTLE_TOKENS:,}], got {v!r}")


def current_time(now: float | None) -> float:
    """``now`` (Unix seconds) or the wall clock; raises ``BudgetError`` for a non-finite value."""
    if now is None:
        return time.time()
    if isinstance(now, bool) or not isinstance(now, (int, float)) or not math.isfinite(now):
        raise BudgetError(f"now must be Unix time in seconds, got {now!r}")
    return float(now)



def checked_reserve_args(decision_id: str, scopes: Iterable[str], estimated_cost_usd: float,
                         now: float | None) -> tuple[tuple[str, ...], int, float]:
    """Validate a ``reserve`` call (both ledgers): returns ``(scopes, need_nusd, now_s)``;
    raises ``BudgetError`` naming the bad argument."""
    check_id(decision_id)
    return check_scopes(scopes), to_nusd(estimated_cost_usd, "estimated_cost_usd"), current_time(now)


def checked_settle_args(decision_id: str, actual_cost_usd: float, now: float | None, target: str | None,
                        prompt_tokens: int, cached_tokens: int, completion_tokens: int) -> tuple[int, float]:
    """Validate a ``settle`` call (both ledgers): returns ``(actual_nusd, now_s)``; raises
    ``BudgetError`` naming the bad argument."""
    check_id(decision_id)
    actual = to_nusd(actual_cost_usd, "actual_cost_usd")
    if target is not None:
        check_id(target, "target")
    check_tokens(prompt_tokens=prompt_tokens, cached_tokens=cached_tokens, completion_tokens=completion_tokens)
    return actual, current_time(now)

# -- configuration ----------------------------------------------------------------------


def _check_scope(value: str) -> str:
    if not _SCOPE_RE.fullmatch(value):
        raise ValueError(f"'{value}' is not a scope: write kind:name with kind one of {', '.join(SCOPE_KINDS)}")
    return value


Usd = Annotated[float, Field(strict=True, ge=0, allow_inf_nan=False)]
Seconds = Annotated[float, Field(strict=True, gt=0, allow_inf_nan=False)]


class BudgetSpec(StrictModel):
    """One budget in a file: ``scope`` (kind:name), ``window`` (day|month), ``limit_usd`` >= 0."""

    scope: Annotated[str, AfterValidator(_check_scope)]
    window: Literal["day", "month"]
    limit_usd: Usd


class BudgetsSpec(StrictModel):
    """A budgets document (a file of ``kind: Budgets``, or the same keys as a dict)."""

    apiVersion: Literal["pointsman/v1"] = "pointsman/v1"
    kind: Literal["Budgets"] = "Budgets"
    reservation_ttl_s: Seconds = DEFAULT_RESERVATION_TTL_S
    record_retention_s: Seconds = DEFAULT_RECORD_RETENTION_S
    budgets: list[BudgetSpec] = Field(default_factory=list)

    @field_validator("budgets")
    @classmethod
    def _unique(cls, budgets: list[BudgetSpec]) -> list[BudgetSpec]:
        seen: dict[tuple[str, str], int] = {}
        for i, b in enumerate(budgets):
            first = seen.setdefault((b.scope, b.window), i)
            if first != i:
                raise ValueError(f"budgets[{i}] repeats scope '{b.scope}' window '{b.window}' of budgets[{first}]")
        return budgets

    @model_validator(mode="after")
    def _retention_covers_ttl(self) -> BudgetsSpec:
        if self.record_retention_s < self.reservation_ttl_s:
            raise ValueError(f"record_retention_s ({self.record_retention_s:g}) must be >= "
                             f"reservation_ttl_s ({self.reservation_ttl_s:g})")
        return self


@dataclass(frozen=True)
class Budget:
    """A limit of ``limit_usd`` (USD, >= 0) on ``scope`` (kind:name) over ``window`` (day|month)."""

    scope: str
    window: str
    limit_usd: float

    @property
    def limit_nusd(self) -> int:
        """The limit in nano-USD."""
        return round(self.limit_usd * NUSD_PER_USD)


@dataclass(frozen=True)
class BudgetConfig:
    """Budgets and ledger timing. ``reservation_ttl_s``: seconds a hold counts before it
    expires; ``record_retention_s``: seconds a reservation's record is kept for
    idempotent settles (>= the TTL). Constructing one validates it (``BudgetConfigError``)."""

    budgets: tuple[Budget, ...] = ()
    reservation_ttl_s: float = DEFAULT_RESERVATION_TTL_S
    record_retention_s: float = DEFAULT_RECORD_RETENTION_S

    def __post_init__(self) -> None:
        object.__setattr__(self, "budgets", tuple(self.budgets))
        _validate(self.to_dict(), LocatedDocument("<budgets>", "", self.to_dict(), None))

    @cached_property
    def _by_scope(self) -> dict[str, tuple[Budget, ...]]:
        out: dict[str, list[Budget]] = {}
        for b in self.budgets:
            out.setdefault(b.scope, []).append(b)
        return {s: tuple(bs) for s, bs in out.items()}

    def budgets_for(self, scopes: Iterable[str]) -> list[Budget]:
        """The budgets that apply to a request with these scopes (empty: unlimited)."""
        by = self._by_scope
        return [b for s in scopes for b in by.get(s, ())]

    def to_dict(self) -> dict[str, Any]:
        """The plain-dict form ``from_dict`` reads."""
        return {"reservation_ttl_s": self.reservation_ttl_s, "record_retention_s": self.record_retention_s,
                "budgets": [{"scope": b.scope, "window": b.window, "limit_usd": b.limit_usd} for b in self.budgets]}

    @classmethod
    def from_dict(cls, data: Any, source: str = "<budgets>") -> BudgetConfig:
        """Build from a plain dict::

            {"reservation_ttl_s": 600, "budgets": [
                {"scope": "tenant:acme", "window": "month", "limit_usd": 2000},
                {"scope": "team:acme/search", "window": "day", "limit_usd": 50}]}

        ``apiVersion: pointsman/v1`` and ``kind: Budgets`` are optional. Raises
        ``BudgetConfigError`` listing every problem with the key it concerns
        (``budgets[1].limit_usd: Input should be greater than or equal to 0``).
        """
        return _from_spec(_validate(data, LocatedDocument(source, "", data, None)))

    @classmethod
    def load(cls, path: str | Path) -> BudgetConfig:
        """Read a YAML budgets file; raises ``BudgetConfigError`` with file:line:col per problem."""
        text = read_text(path, BudgetConfigError)
        doc = parse_yaml(text, str(path), BudgetConfigError)
        return _from_spec(_validate(doc.data, doc))


def _validate(data: Any, doc: LocatedDocument) -> BudgetsSpec:
    if not isinstance(data, dict):
        raise BudgetConfigError([Problem(doc.file, 0, 0, "invalid-value",
                                         f"expected a mapping of budget settings, got {type(data).__name__}")])
    spec = validate(doc, BudgetsSpec, BudgetConfigError)
    assert isinstance(spec, BudgetsSpec)
    return spec


def _from_spec(spec: BudgetsSpec) -> BudgetConfig:
    return BudgetConfig(budgets=tuple(Budget(b.scope, b.window, float(b.limit_usd)) for b in spec.budgets),
                        reservation_ttl_s=float(spec.reservation_ttl_s),
                        record_retention_s=float(spec.record_retention_s))


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
    first settle arrived: ``held``, ``expired`` or ``released``."""

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

    def signals(self) -> dict[str, Any]:
        """The ``budget`` namespace: ``remaining_usd``, ``spent_usd``, ``limit_usd``, ``window``
        and ``scope`` of the binding budget, and ``limited``. Unlimited: ``remaining_usd``
        and ``limit_usd`` are ``inf``, ``spent_usd`` 0, ``window`` and ``scope`` ''."""
        b = self.binding
        if b is None:
            return {"remaining_usd": math.inf, "spent_usd": 0.0, "limit_usd": math.inf, "window": "",
                    "scope": "", "limited": False}
        return {"remaining_usd": b.remaining_usd, "spent_usd": b.spent_usd, "limit_usd": b.limit_usd,
                "window": b.window, "scope": b.scope, "limited": True}


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
               completion_tokens: int = 0) -> Settlement:
        """Replace the hold by the actual cost (idempotent: a repeat returns the first
        settlement with ``replayed=True``); raises ``UnknownReservation``."""
        ...

    def release(self, decision_id: str, now: float | None = None) -> bool:
        """Drop the hold; True if one was live, False if already settled, released or
        expired. Raises ``UnknownReservation``."""
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


def open_ledger(url: str | None = None, config: BudgetConfig | None = None,
                data_dir: str | Path = "data") -> BudgetLedger:
    """Open the ledger a URL names:

    - None or ``""``: SQLite at ``<data_dir>/budget.db`` (the embedded default);
    - ``sqlite:///relative/path.db``, ``sqlite:////absolute/path.db`` (SQLAlchemy's
      convention); query ``?synchronous=full`` fsyncs every commit (default ``normal``:
      durable across process crashes, the last commits may be lost on power loss);
    - ``redis://[:password@]host:port/db`` (also ``rediss://``, ``unix://``); query
      ``?prefix=...`` sets the key prefix (default ``{pointsman-budget}:``).

    Raises ``BudgetError`` for another scheme, ``LedgerUnavailable`` if it cannot open.
    """
    config = config or BudgetConfig()
    if not url:
        from pointsman.policy.budget_sqlite import SqliteLedger
        return SqliteLedger(Path(data_dir) / DEFAULT_SQLITE_NAME, config)
    scheme = url.split(":", 1)[0].lower()
    if scheme == "sqlite":
        from pointsman.policy.budget_sqlite import SqliteLedger
        return SqliteLedger.from_url(url, config)
    if scheme in ("redis", "rediss", "unix"):
        from pointsman.policy.budget_redis import RedisLedger
        return RedisLedger.from_url(url, config)
    raise BudgetError(f"budget ledger URL '{url}': scheme '{scheme}' is not sqlite, redis, rediss or unix")


__all__ = [
    "Budget", "BudgetConfig", "BudgetConfigError", "BudgetExceeded", "BudgetLedger", "BudgetSnapshot",
    "BudgetStatus", "EffectivePrice", "LedgerUnavailable", "Reservation", "Settlement", "UnknownReservation",
    "Window", "build_snapshot", "open_ledger", "refusal", "window_of", "windows_at",
]
