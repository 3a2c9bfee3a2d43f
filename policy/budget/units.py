"""Budget units and argument checks: UTC day/month windows, nano-USD amounts, scope and
id syntax, token bounds. Shared by the ledger backends and the budgets file.
"""

from __future__ import annotations

import functools
import math
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from pointsman.errors import BudgetError
from pointsman.outcome import MAX_ID_CHARS

SCOPE_KINDS: tuple[str, ...] = ("tenant", "team", "key")


WINDOWS: tuple[str, ...] = ("day", "month")


#: Nano-USD per USD: the ledger's integer unit.
NUSD_PER_USD = 1_000_000_000


SCOPE_RE = re.compile(r"(tenant|team|key):\S{1,200}")


_ID_RE = re.compile(rf"\S{{1,{MAX_ID_CHARS}}}")


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
    dt = datetime.fromtimestamp(day * 86400.0, tz=UTC)
    if kind == "day":
        start = datetime(dt.year, dt.month, dt.day, tzinfo=UTC)
        return Window("day", f"day:{start:%Y-%m-%d}", start.timestamp(), (start + timedelta(days=1)).timestamp())
    if kind == "month":
        start = datetime(dt.year, dt.month, 1, tzinfo=UTC)
        end = datetime(dt.year + (dt.month == 12), dt.month % 12 + 1, 1, tzinfo=UTC)
        return Window("month", f"month:{start:%Y-%m}", start.timestamp(), end.timestamp())
    raise BudgetError(f"unknown budget window '{kind}' (expected one of: {', '.join(WINDOWS)})")


def day_start_s(day_id: str) -> float:
    """Unix seconds when the day window ``day_id`` (``day:YYYY-MM-DD``, ``window_of``) begins; raises ``ValueError``."""
    return datetime.strptime(day_id.removeprefix("day:"), "%Y-%m-%d").replace(tzinfo=UTC).timestamp()


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
        if not isinstance(s, str) or not SCOPE_RE.fullmatch(s):
            raise BudgetError(f"scope {s!r} is not 'kind:name' with kind one of {', '.join(SCOPE_KINDS)} "
                              f"and a name of 1-200 non-space characters")
        if s not in out:
            out.append(s)
    return tuple(out)


def check_id(value: str, name: str = "decision_id") -> str:
    """Validate a decision id or target name: 1-``MAX_ID_CHARS`` non-space characters (a signed decision id,
    ``policy.signals.signed_ids``, carries its claims); else ``BudgetError``."""
    if not isinstance(value, str) or not _ID_RE.fullmatch(value):
        raise BudgetError(f"{name} must be 1-{MAX_ID_CHARS} non-space characters, got {value!r}")
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

