"""The budgets file (``kind: Budgets``): limits in USD per scope and window, and the
ledger's timing (reservation TTL, record retention). ``BudgetConfig.load(path)`` raises
``BudgetConfigError`` with ``file:line:col`` per problem.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, field_validator, model_validator

from pointsman.errors import BudgetError, ConfigError, Problem
from pointsman.json_types import JSONObject
from pointsman.located import LocatedDocument, StrictModel, did_you_mean, parse_yaml, read_text, validate
from pointsman.policy.budget.units import NUSD_PER_USD, SCOPE_KINDS, SCOPE_RE
from pointsman.request import canonical

DEFAULT_RESERVATION_TTL_S = 600.0


DEFAULT_RECORD_RETENTION_S = 7 * 86400.0
#: Seconds of clock difference (replicas, Redis) ``FleetState.restore_spend`` allows for when it judges a ledger record
#: alive: a Redis ledger whose replicas restore spend needs ``record_retention_s`` above it (``BudgetConfig.load``).
RESTORE_MARGIN_S = 300.0


class BudgetConfigError(ConfigError, BudgetError):
    """A budgets configuration is invalid; ``problems`` names every bad key
    (``budgets[1].limit_usd``) with file:line:col when it came from a file."""


def _check_scope(value: str) -> str:
    """A budget scope, ``request.canonical`` (so it matches a request's scope however either was spelt)."""
    value = canonical(value)
    if not SCOPE_RE.fullmatch(value):
        raise ValueError(f"'{value}' is not a scope: write kind:name with kind one of {', '.join(SCOPE_KINDS)}")
    return value


#: Largest budget limit, USD: what the ledgers count in signed 64-bit nano-USD (SQLite INTEGER, Redis INCRBY)
#: holds, about $9.2 billion; above it a limit is no limit the ledger can reach (before, a limit like 1e300
#: loaded and every decision of its scope failed converting it to nano-USD: infinity).
MAX_LIMIT_USD = 9e9


Usd = Annotated[float, Field(strict=True, ge=0, le=MAX_LIMIT_USD, allow_inf_nan=False)]


#: Longest reservation TTL or record retention, seconds (10 years): Redis refuses an EXPIRE past its range, and
#: its scripts keep what ran before the refusal (before, reservation_ttl_s: 1e300 loaded, and each reservation on
#: the Redis ledger failed, 503, leaving its hold counted on the window's spend).
MAX_SECONDS = 10 * 366 * 86400.0


Seconds = Annotated[float, Field(strict=True, gt=0, le=MAX_SECONDS, allow_inf_nan=False)]


class BudgetSpec(StrictModel):
    """One budget in a file: ``scope`` (kind:name), ``window`` (day|month), ``limit_usd`` in [0, ``MAX_LIMIT_USD``]."""

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

    def to_dict(self) -> JSONObject:
        """The plain-dict form ``from_dict`` reads."""
        return {"reservation_ttl_s": self.reservation_ttl_s, "record_retention_s": self.record_retention_s,
                "budgets": [{"scope": b.scope, "window": b.window, "limit_usd": b.limit_usd} for b in self.budgets]}

    @classmethod
    def from_dict(cls, data: object, source: str = "<budgets>") -> BudgetConfig:
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
    def load(cls, path: str | Path, key_names: Collection[str] | None = None, restored: bool = False) -> BudgetConfig:
        """Read a YAML budgets file; raises ``BudgetConfigError`` with file:line:col per problem.
        ``key_names``: the API key names of the service that applies it (none: authentication is off):
        a ``key:<name>`` scope naming none of them is a problem (``unknown-key``), a budget that could
        never apply (a misspelt key name left that key's spending unlimited); None checks no name.
        ``restored``: its ledger is one whose replicas book again what it lost (Redis, with a spend journal):
        ``record_retention_s`` (seconds) must then exceed ``RESTORE_MARGIN_S``, else no restore ever books anything
        (``FleetState.restore_spend`` re-books only records alive that margin ahead); the SQLite ledger takes less."""
        text = read_text(path, BudgetConfigError)
        doc = parse_yaml(text, str(path), BudgetConfigError)
        config = _from_spec(_validate(doc.data, doc))
        problems = []
        if restored and config.record_retention_s <= RESTORE_MARGIN_S:
            line, col = doc.mark(("record_retention_s",))
            problems.append(Problem(str(path), line, col, "invalid-value",
                                    f"record_retention_s ({config.record_retention_s:g}) must be more than "
                                    f"{RESTORE_MARGIN_S:g} s with a Redis budget ledger: its replicas book again what "
                                    f"it lost only while the records live that margin (for clocks) ahead, so "
                                    f"{config.record_retention_s:g} s would never restore anything"))
        if key_names is not None:
            for i, b in enumerate(config.budgets):
                kind, _, name = b.scope.partition(":")
                if kind == "key" and name not in key_names:
                    line, col = doc.mark(("budgets", i, "scope"))
                    have = (f"the service's API keys are {', '.join(sorted(key_names))}{did_you_mean(name, key_names)}"
                            if key_names else "no API key is configured (authentication is off)")
                    problems.append(Problem(str(path), line, col, "unknown-key",
                                            f"budgets[{i}].scope: '{b.scope}' names no API key, so it never "
                                            f"applies: {have}"))
        if problems:
            raise BudgetConfigError(problems)
        return config


def _validate(data: object, doc: LocatedDocument) -> BudgetsSpec:
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

