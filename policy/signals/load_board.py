"""Load per endpoint: pushed snapshots, scraped ``/metrics``, and Pointsman's own in-flight accounting.

``LoadBoard`` is the state store the engine reads once per decision (``get`` /
``get_many``: one lock, O(1) per endpoint, no allocation unless a reading is
stale). Three sources feed it:

1. **push** — ``push(endpoint, snapshot, now)``: a snapshot sent by an engine or an
   exporter (the service exposes it as ``POST /v1/telemetry``). Fields use vLLM's
   names (see ``PUSH_FIELDS``); a bad snapshot raises ``RequestError`` naming the field.
2. **scrape** — ``put_scraped(endpoint, load)``: what ``scrape.Scraper`` read
   from a vLLM or SGLang server's Prometheus ``/metrics``.
3. **inflight** — ``dispatch(endpoint, decision_id, prompt_tokens, now)`` when a
   decision sends a request there, ``release(decision_id)`` when its outcome
   arrives (idempotent; an unknown id is harmless). A dispatch whose outcome never
   arrives is dropped after ``inflight_ttl_s``.

**Merge rule.** The reading of an endpoint is its *freshest external snapshot* (push or
scrape, whichever has the later ``updated_at``), each engine field it does not report
(None) taken from the other source's snapshot — e.g. a gateway's pushed
``prefill_utilization`` beside the scraped queue lengths — while that snapshot is not stale
either (read with a ``StalenessPolicy`` other than ``ignore``: a field older than ``max_age_s``
is not borrowed, whatever the age of the snapshot beside it), plus the requests Pointsman
dispatched there *after* the freshest snapshot was taken and that are still in flight: the
engine could not have counted them yet, and they enter its waiting queue first, so
they are added to ``num_requests_waiting`` (``pending_requests``,
``pending_prompt_tokens``). The reading's age is the freshest snapshot's. Requests dispatched before the snapshot are already in
its running/waiting counts and are not added again. With no external snapshot,
the reading is in-flight accounting alone (``source == "inflight"``: engine fields
null, ``inflight_requests`` and ``pending_*`` known exactly, age 0).

**Staleness.** Every reading carries ``updated_at`` (monotonic seconds) and its age
``age_s(now)``. ``StalenessPolicy(max_age_s, on_stale)`` says what an external
reading older than ``max_age_s`` means; ``apply_staleness`` applies it:

- ``unknown`` (default): the stale snapshot is dropped; the reading falls back to
  in-flight accounting (engine fields null, so a rule reading them errors and is
  skipped, named in the decision; pickers rank by ``outstanding_requests``).
  Safe because it neither trusts old numbers nor, when a scraper hiccups, makes
  the whole fleet look full and pushes every request to a paid frontier tier.
- ``saturated``: the endpoint reads as full — ``kv_cache_usage`` 1.0,
  ``num_requests_waiting`` at least ``SATURATED_WAITING`` — so any load threshold
  trips and load-aware pickers rank it last. For fleets where silence means death.
- ``ignore``: the old values are used as they are (``stale`` is still set).
"""

from __future__ import annotations

import difflib
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from pointsman.errors import RequestError
from pointsman.json_types import JSONScalar

Source = Literal["push", "scrape", "inflight"]
StaleMode = Literal["saturated", "unknown", "ignore"]
SOURCES: tuple[str, ...] = ("push", "scrape", "inflight")
STALE_MODES: tuple[str, ...] = ("saturated", "unknown", "ignore")

#: ``num_requests_waiting`` a stale endpoint reads as under ``on_stale: saturated``.
SATURATED_WAITING = 1_000_000
#: Default lifetime of a dispatch whose outcome never arrives, seconds.
INFLIGHT_TTL_S = 600.0


def outstanding(running: int | None, waiting: int | None, inflight: int) -> int:
    """An endpoint's ``outstanding_requests``: ``running`` + ``waiting`` when its engine reports both, else
    ``inflight`` (Pointsman's own in-flight count). The rule the service reads and ``policy test`` derives."""
    return running + waiting if running is not None and waiting is not None else inflight


@dataclass(frozen=True, slots=True)
class EndpointLoad:
    """One endpoint's load reading (immutable).

    Engine-reported fields (None when the source does not report them):
    ``num_requests_running`` / ``num_requests_waiting`` (requests in the running
    batch / waiting queue; ``waiting`` includes ``pending_requests``, see the merge
    rule), ``kv_cache_usage`` (fraction 0–1 of KV-cache blocks in use),
    ``ttft_p50_ms`` / ``tpot_p50_ms`` (median time to first token / per output token,
    ms), ``prefill_utilization`` / ``decode_utilization`` (fraction 0–1 of the GPU
    busy in each phase, when telemetry reports them), ``prefix_cache_hit_rate``
    (0–1, the engine's own), ``kv_cache_capacity_tokens`` (KV-cache size in tokens),
    ``mean_prompt_tokens`` (mean prompt tokens of the requests it finished lately: the size of a
    waiting request Pointsman did not send, ``pickers.QueueScorer``).

    Pointsman's accounting: ``inflight_requests`` / ``inflight_prompt_tokens`` (our
    dispatches to this endpoint not yet released; the tokens are the prefill each dispatch
    brought there: its prompt but the prefix the endpoint held cached), ``pending_requests`` /
    ``pending_prompt_tokens`` (the part of those dispatched after the external
    snapshot was taken).

    ``updated_at``: monotonic seconds when the external values were measured.
    ``source``: push | scrape | inflight. ``stale`` / ``saturated``: set by
    ``apply_staleness``.
    """

    endpoint: str
    source: str
    updated_at: float
    num_requests_running: int | None = None
    num_requests_waiting: int | None = None
    kv_cache_usage: float | None = None
    ttft_p50_ms: float | None = None
    tpot_p50_ms: float | None = None
    prefill_utilization: float | None = None
    decode_utilization: float | None = None
    prefix_cache_hit_rate: float | None = None
    kv_cache_capacity_tokens: int | None = None
    mean_prompt_tokens: float | None = None
    inflight_requests: int = 0
    inflight_prompt_tokens: int = 0
    pending_requests: int = 0
    pending_prompt_tokens: int = 0
    stale: bool = False
    saturated: bool = False
    #: A pool's reading (``aggregate_loads``): the sum of its endpoints' ``outstanding_requests``.
    pool_outstanding: int | None = None

    @property
    def measured(self) -> bool:
        """Whether ``updated_at`` is when external values were measured: any reading but in-flight accounting
        alone, and the accounting a stale reading fell back to (``on_stale: unknown``), which keeps its age."""
        return self.source != "inflight" or self.stale

    def age_s(self, now: float | None = None) -> float:
        """Seconds since the external values were measured (``measured``); 0 for in-flight accounting alone
        (always current)."""
        if not self.measured:
            return 0.0
        return max(0.0, (time.monotonic() if now is None else now) - self.updated_at)

    @property
    def outstanding_requests(self) -> int:
        """Requests on the endpoint (``outstanding``); a pool's: the sum of its endpoints'."""
        if self.pool_outstanding is not None:
            return self.pool_outstanding
        return outstanding(self.num_requests_running, self.num_requests_waiting, self.inflight_requests)

    def signals(self, now: float | None = None) -> dict[str, JSONScalar]:
        """The reading as a CEL-ready dict (``load[target]`` / ``endpoint`` namespaces): the
        engine fields (null when unknown), ``inflight_requests``, ``pending_prompt_tokens``,
        ``outstanding_requests``, ``age_s``, ``source``, ``stale``, ``saturated``."""
        return {
            "num_requests_running": self.num_requests_running,
            "num_requests_waiting": self.num_requests_waiting,
            "kv_cache_usage": self.kv_cache_usage,
            "ttft_p50_ms": self.ttft_p50_ms,
            "tpot_p50_ms": self.tpot_p50_ms,
            "prefill_utilization": self.prefill_utilization,
            "decode_utilization": self.decode_utilization,
            "prefix_cache_hit_rate": self.prefix_cache_hit_rate,
            "inflight_requests": self.inflight_requests,
            "pending_prompt_tokens": self.pending_prompt_tokens,
            "outstanding_requests": self.outstanding_requests,
            "age_s": self.age_s(now),
            "source": self.source,
            "stale": self.stale,
            "saturated": self.saturated,
        }


@dataclass(frozen=True)
class StalenessPolicy:
    """What an external reading older than ``max_age_s`` seconds means: ``on_stale`` is
    ``unknown`` (default; fall back to in-flight accounting), ``saturated`` (read as
    full) or ``ignore`` (use as is). Raises ValueError naming the field on bad values."""

    max_age_s: float = 10.0
    on_stale: StaleMode = "unknown"

    def __post_init__(self) -> None:
        if not isinstance(self.max_age_s, (int, float)) or isinstance(self.max_age_s, bool) \
                or not math.isfinite(self.max_age_s) or self.max_age_s <= 0:
            raise ValueError(f"max_age_s: must be a finite number of seconds > 0, got {self.max_age_s!r}")
        if self.on_stale not in STALE_MODES:
            raise ValueError(f"on_stale: must be one of {', '.join(STALE_MODES)}, got {self.on_stale!r}")


DEFAULT_STALENESS = StalenessPolicy()


def apply_staleness(load: EndpointLoad, policy: StalenessPolicy, now: float | None = None) -> EndpointLoad:
    """``load`` as ``policy`` says to read it at ``now`` (monotonic s): unchanged when fresh or
    from in-flight accounting; otherwise marked ``stale`` and transformed per ``on_stale``
    (see the module docstring). Returns a new ``EndpointLoad`` only when stale."""
    if load.source == "inflight" or load.age_s(now) <= policy.max_age_s:
        return load
    mode = policy.on_stale
    if mode == "ignore":
        return replace(load, stale=True)
    if mode == "saturated":
        return replace(load, stale=True, saturated=True, kv_cache_usage=1.0,
                       num_requests_waiting=max(load.num_requests_waiting or 0, SATURATED_WAITING))
    return EndpointLoad(  # unknown: in-flight accounting only
        endpoint=load.endpoint, source="inflight", updated_at=load.updated_at,
        inflight_requests=load.inflight_requests, inflight_prompt_tokens=load.inflight_prompt_tokens,
        pending_requests=load.inflight_requests, pending_prompt_tokens=load.inflight_prompt_tokens,
        stale=True)


def mean_reading(loads: Iterable[EndpointLoad | None], healthy: Iterable[bool], attr: str) -> float | None:
    """Mean of ``attr`` (``prefill_utilization``, ...) over the readings of healthy endpoints that report it
    (``loads`` and ``healthy`` side by side; None for an endpoint without a reading); None when none does."""
    values = [v for x, ok in zip(loads, healthy) if x is not None and ok and (v := getattr(x, attr)) is not None]
    return sum(values) / len(values) if values else None


def queue_sum(loads: Iterable[EndpointLoad], attr: str) -> int | None:
    """A pool's ``num_requests_running`` or ``num_requests_waiting`` (``attr``): the sum over its endpoints'
    readings, where one known from in-flight accounting alone adds its pending dispatches to the waiting
    queue (no engine has reported them: the merge rule) and nothing to the running batch. None when no
    endpoint's engine reports the count, or when an engine's reading lacks it."""
    total, known = 0, False
    for x in loads:
        value = getattr(x, attr)
        if value is None:
            if x.source != "inflight":
                return None
            total += x.pending_requests if attr == "num_requests_waiting" else 0
            continue
        known = True
        total += value
    return total if known else None


def aggregate_loads(name: str, loads: Iterable[EndpointLoad]) -> EndpointLoad | None:
    """One pool-level reading from its endpoints' readings (for ``load[target]``), or None if empty.

    Counts and tokens are summed (a count is None if any endpoint lacks it; the queue counts by
    ``queue_sum``; ``outstanding_requests``
    is the sum of each endpoint's own, so one endpoint without telemetry does not hide another's queue);
    ``kv_cache_usage``, latencies, utilizations and hit rates are the mean over the
    endpoints that report them (latency means of p50s approximate the pool's p50);
    ``updated_at`` is the oldest one's (so ``age_s`` is the oldest age); ``source``
    is the common source or ``"mixed"``; ``stale``/``saturated`` if any is.
    """
    loads = list(loads)
    if not loads:
        return None

    def total(attr: str) -> int | None:
        values = [getattr(x, attr) for x in loads]
        return None if any(v is None for v in values) else sum(values)

    def mean(attr: str) -> float | None:
        values = [getattr(x, attr) for x in loads if getattr(x, attr) is not None]
        return sum(values) / len(values) if values else None

    sources = {x.source for x in loads}
    external = [x for x in loads if x.measured]
    return EndpointLoad(
        endpoint=name,
        source=sources.pop() if len(sources) == 1 else "mixed",
        updated_at=min((x.updated_at for x in external), default=max(x.updated_at for x in loads)),
        num_requests_running=queue_sum(loads, "num_requests_running"),
        num_requests_waiting=queue_sum(loads, "num_requests_waiting"),
        kv_cache_usage=mean("kv_cache_usage"),
        ttft_p50_ms=mean("ttft_p50_ms"),
        tpot_p50_ms=mean("tpot_p50_ms"),
        prefill_utilization=mean("prefill_utilization"),
        decode_utilization=mean("decode_utilization"),
        prefix_cache_hit_rate=mean("prefix_cache_hit_rate"),
        kv_cache_capacity_tokens=total("kv_cache_capacity_tokens"),
        mean_prompt_tokens=mean("mean_prompt_tokens"),
        inflight_requests=sum(x.inflight_requests for x in loads),
        inflight_prompt_tokens=sum(x.inflight_prompt_tokens for x in loads),
        pending_requests=sum(x.pending_requests for x in loads),
        pending_prompt_tokens=sum(x.pending_prompt_tokens for x in loads),
        stale=any(x.stale for x in loads),
        saturated=any(x.saturated for x in loads),
        pool_outstanding=sum(x.outstanding_requests for x in loads),
    )


# ---------------------------------------------------------------- push validation

def _no_bool_or_str(value: object) -> object:
    if isinstance(value, (bool, str)):
        raise ValueError(f"must be a number, got {type(value).__name__} {value!r}")
    return value


class PushedSnapshot(BaseModel):
    """A pushed load snapshot (body of ``POST /v1/telemetry`` minus the endpoint):
    vLLM-standard names, every field optional but at least one required; unknown
    fields, NaN/inf, negative counts and fractions outside 0–1 are rejected."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    num_requests_running: int | None = Field(default=None, ge=0)
    num_requests_waiting: int | None = Field(default=None, ge=0)
    kv_cache_usage: float | None = Field(default=None, ge=0.0, le=1.0)
    ttft_p50_ms: float | None = Field(default=None, ge=0.0)
    tpot_p50_ms: float | None = Field(default=None, ge=0.0)
    prefill_utilization: float | None = Field(default=None, ge=0.0, le=1.0)
    decode_utilization: float | None = Field(default=None, ge=0.0, le=1.0)
    prefix_cache_hit_rate: float | None = Field(default=None, ge=0.0, le=1.0)
    kv_cache_capacity_tokens: int | None = Field(default=None, gt=0)
    mean_prompt_tokens: float | None = Field(default=None, ge=0.0)

    @field_validator("*", mode="before")
    @classmethod
    def _numbers_only(cls, value: object) -> object:
        return _no_bool_or_str(value)


#: Field names a pushed snapshot may carry.
PUSH_FIELDS: tuple[str, ...] = tuple(PushedSnapshot.model_fields)


def validate_snapshot(snapshot: object) -> PushedSnapshot:
    """Validate a pushed snapshot (a mapping); raises ``RequestError`` whose ``field`` names
    the first bad field and whose message lists every problem (with "did you mean" for
    unknown fields)."""
    if not isinstance(snapshot, Mapping):
        raise RequestError(f"a load snapshot must be an object, got {type(snapshot).__name__}")
    try:
        parsed = PushedSnapshot.model_validate(dict(snapshot))
    except ValidationError as exc:
        problems: list[tuple[str, str]] = []
        for err in exc.errors():
            field = ".".join(str(p) for p in err["loc"])
            if err["type"] == "extra_forbidden":
                close = difflib.get_close_matches(field, PUSH_FIELDS, n=1)
                hint = f"did you mean '{close[0]}'?" if close else f"known: {', '.join(PUSH_FIELDS)}"
                problems.append((field, f"unknown field ({hint})"))
            elif err["type"] == "value_error":
                problems.append((field, err["msg"].removeprefix("Value error, ")))
            else:
                problems.append((field, f"{err['msg']} (got {err.get('input')!r})"))
        (field, first), rest = problems[0], problems[1:]
        raise RequestError("; ".join([first, *(f"{f}: {m}" for f, m in rest)]), field=field) from None
    if not parsed.model_fields_set:
        raise RequestError(f"a load snapshot needs at least one of: {', '.join(PUSH_FIELDS)}")
    return parsed


# ---------------------------------------------------------------- the board

#: The engine-reported fields of an ``EndpointLoad`` (merged across push and scrape).
ENGINE_FIELDS: tuple[str, ...] = ("num_requests_running", "num_requests_waiting", "kv_cache_usage", "ttft_p50_ms",
                                  "tpot_p50_ms", "prefill_utilization", "decode_utilization", "prefix_cache_hit_rate",
                                  "kv_cache_capacity_tokens", "mean_prompt_tokens")

@dataclass(slots=True)
class _Dispatch:
    endpoint: str
    prompt_tokens: int
    at: float


class _Slot:
    """Per-endpoint state: latest snapshot per external source, our in-flight dispatches,
    the counts of those after the freshest snapshot, and the cached merged view."""

    __slots__ = ("push", "scrape", "merged", "alone", "borrowed_at", "inflight", "inflight_tokens", "newest_at",
                 "after_n", "after_tokens", "view", "view_alone", "stale")

    def __init__(self) -> None:
        self.push: EndpointLoad | None = None
        self.scrape: EndpointLoad | None = None
        self.merged: EndpointLoad | None = None
        self.alone: EndpointLoad | None = None  # the freshest snapshot without borrowed fields (None: none borrowed)
        self.borrowed_at: float | None = None  # ``updated_at`` of the snapshot ``merged`` borrows fields from
        self.inflight: dict[str, _Dispatch] = {}
        self.inflight_tokens = 0
        self.newest_at = 0.0  # max(d.at for d in inflight), 0.0 when none: kept as dispatches come and go
        self.after_n = 0
        self.after_tokens = 0
        self.view: EndpointLoad | None = None
        self.view_alone: EndpointLoad | None = None  # ``view`` built on ``alone``
        self.stale: tuple[StalenessPolicy, EndpointLoad, EndpointLoad] | None = None  # (policy, view, reading)

    def external(self) -> EndpointLoad | None:
        return self.merged

    def merge(self) -> None:
        """Recompute ``merged``: the freshest snapshot, its unreported fields from the other one (``alone``
        and ``borrowed_at`` say which and how old)."""
        p, s = self.push, self.scrape
        self.alone, self.borrowed_at = None, None
        if p is None or s is None:
            self.merged = p or s
            return
        newer, older = (s, p) if s.updated_at > p.updated_at else (p, s)
        missing = {f: getattr(older, f) for f in ENGINE_FIELDS
                   if getattr(newer, f) is None and getattr(older, f) is not None}
        self.merged = replace(newer, **missing) if missing else newer
        if missing:
            self.alone, self.borrowed_at = newer, older.updated_at


class LoadBoard:
    """Thread-safe store of every endpoint's load; see the module docstring for the
    sources, the merge rule and staleness.

    ``inflight_ttl_s``: seconds after which an unreleased dispatch is dropped.
    ``known_endpoints``: if given, ``push`` rejects other endpoint names
    (``set_endpoints`` replaces the set, e.g. on fleet reload). Times are monotonic
    seconds (``time.monotonic()`` when ``now`` is None).
    """

    def __init__(self, *, inflight_ttl_s: float = INFLIGHT_TTL_S,
                 known_endpoints: Iterable[str] | None = None) -> None:
        if not inflight_ttl_s > 0:
            raise ValueError(f"inflight_ttl_s: must be > 0, got {inflight_ttl_s!r}")
        self.inflight_ttl_s = float(inflight_ttl_s)
        self._lock = threading.Lock()
        self._slots: dict[str, _Slot] = {}
        self._dispatches: OrderedDict[str, _Dispatch] = OrderedDict()  # decision_id -> dispatch, oldest first
        self._known: frozenset[str] | None = None
        self.set_endpoints(known_endpoints)

    # -- configuration

    def set_endpoints(self, endpoints: Iterable[str] | None) -> None:
        """Restrict ``push`` to these endpoint names (None: accept any). Existing state is kept."""
        with self._lock:
            self._known = None if endpoints is None else frozenset(endpoints)

    def forget(self, endpoint: str) -> None:
        """Drop everything known of ``endpoint`` (it left the fleet): its readings and its
        in-flight dispatches."""
        with self._lock:
            slot = self._slots.pop(endpoint, None)
            if slot is not None:
                for decision_id in slot.inflight:
                    self._dispatches.pop(decision_id, None)

    def endpoints(self) -> list[str]:
        """Endpoints the board holds any state for."""
        with self._lock:
            return list(self._slots)

    # -- external sources

    def push(self, endpoint: str, snapshot: Mapping[str, object], now: float | None = None) -> EndpointLoad:
        """Record a pushed snapshot measured at ``now``; returns the merged reading.

        Raises ``RequestError`` (field ``endpoint`` or the snapshot field) on bad input;
        the board is unchanged then."""
        if not isinstance(endpoint, str) or not endpoint:
            raise RequestError("must be a non-empty string", field="endpoint")
        known = self._known
        if known is not None and endpoint not in known:
            close = difflib.get_close_matches(endpoint, list(known), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise RequestError(f"unknown endpoint '{endpoint}'{hint}", field="endpoint")
        parsed = validate_snapshot(snapshot)
        now = time.monotonic() if now is None else now
        load = EndpointLoad(endpoint=endpoint, source="push", updated_at=now, **parsed.model_dump())
        with self._lock:
            slot = self._slot(endpoint)
            if slot.push is None or now >= slot.push.updated_at:
                slot.push = load
                self._rebase(slot)
            return self._view(endpoint, slot)

    def put_scraped(self, endpoint: str, load: EndpointLoad) -> None:
        """Record a scraped reading (``metrics_scrape``); an older one than held is ignored."""
        if load.source != "scrape":
            load = replace(load, source="scrape")
        if load.endpoint != endpoint:
            load = replace(load, endpoint=endpoint)
        with self._lock:
            slot = self._slot(endpoint)
            if slot.scrape is None or load.updated_at >= slot.scrape.updated_at:
                slot.scrape = load
                self._rebase(slot)

    # -- in-flight accounting

    def dispatch(self, endpoint: str, decision_id: str, prompt_tokens: int, now: float | None = None) -> None:
        """Count a request sent to ``endpoint`` at ``now`` with ``prompt_tokens`` prompt tokens.

        Dispatching an id that is already in flight moves it (a retry on a fallback
        endpoint). Raises ValueError on an empty id or negative tokens."""
        if not decision_id:
            raise ValueError("decision_id: must be non-empty")
        if prompt_tokens < 0:
            raise ValueError(f"prompt_tokens: must be >= 0, got {prompt_tokens}")
        now = time.monotonic() if now is None else now
        with self._lock:
            self._expire(now)
            if decision_id in self._dispatches:
                self._remove(decision_id)
            d = _Dispatch(endpoint, int(prompt_tokens), now)
            self._dispatches[decision_id] = d
            slot = self._slot(endpoint)
            slot.inflight[decision_id] = d
            slot.inflight_tokens += d.prompt_tokens
            if now > slot.newest_at or len(slot.inflight) == 1:
                slot.newest_at = now
            ext = slot.external()
            if ext is None or d.at > ext.updated_at:
                slot.after_n += 1
                slot.after_tokens += d.prompt_tokens
            slot.view = slot.view_alone = None

    def release(self, decision_id: str) -> bool:
        """Stop counting ``decision_id`` (its outcome arrived). Idempotent: returns False for an
        unknown, expired or already released id."""
        with self._lock:
            if decision_id not in self._dispatches:
                return False
            self._remove(decision_id)
            return True

    def expire(self, now: float | None = None) -> int:
        """Drop dispatches older than ``inflight_ttl_s``; returns how many. Also done on every dispatch and read."""
        with self._lock:
            return self._expire(time.monotonic() if now is None else now)

    # -- reads

    def get(self, endpoint: str, now: float | None = None,
            staleness: StalenessPolicy | None = None) -> EndpointLoad | None:
        """The merged reading of ``endpoint`` (None if the board knows nothing of it), with
        ``staleness`` applied at ``now`` when given."""
        now = time.monotonic() if now is None else now
        with self._lock:
            self._expire(now)
            slot = self._slots.get(endpoint)
            return None if slot is None else self._read(endpoint, slot, now, staleness)

    def get_many(self, endpoints: Iterable[str], now: float | None = None,
                 staleness: StalenessPolicy | None = None) -> dict[str, EndpointLoad]:
        """Readings for the endpoints the board knows among ``endpoints`` (one lock round)."""
        now = time.monotonic() if now is None else now
        out: dict[str, EndpointLoad] = {}
        fresh_after = -math.inf if staleness is None else now - staleness.max_age_s
        with self._lock:
            self._expire(now)
            slots, read, merge = self._slots, self._read, self._view
            for ep in endpoints:
                slot = slots.get(ep)
                if slot is None:
                    continue
                view = slot.view or merge(ep, slot)  # the fast path of _read: a cached, fresh view
                borrowed = slot.borrowed_at
                if (view.updated_at < fresh_after or (borrowed is not None and borrowed < fresh_after)) \
                        and view.source != "inflight":
                    view = read(ep, slot, now, staleness)
                out[ep] = view
        return out

    # -- internals (lock held)

    def _slot(self, endpoint: str) -> _Slot:
        slot = self._slots.get(endpoint)
        if slot is None:
            slot = self._slots[endpoint] = _Slot()
        return slot

    def _rebase(self, slot: _Slot) -> None:
        """Merge the external snapshots again and recount the in-flight dispatches made after the
        (new) freshest one."""
        slot.merge()
        ext = slot.external()
        t = -math.inf if ext is None else ext.updated_at
        after = [d for d in slot.inflight.values() if d.at > t]
        slot.after_n = len(after)
        slot.after_tokens = sum(d.prompt_tokens for d in after)
        slot.view = slot.view_alone = None

    def _remove(self, decision_id: str) -> None:
        d = self._dispatches.pop(decision_id)
        slot = self._slots[d.endpoint]
        del slot.inflight[decision_id]
        slot.inflight_tokens -= d.prompt_tokens
        if d.at >= slot.newest_at:  # the newest left: rescan (expiry and most settlements remove older ones)
            slot.newest_at = max((x.at for x in slot.inflight.values()), default=0.0)
        ext = slot.external()
        if ext is None or d.at > ext.updated_at:
            slot.after_n -= 1
            slot.after_tokens -= d.prompt_tokens
        slot.view = slot.view_alone = None

    def _expire(self, now: float) -> int:
        dispatches, n = self._dispatches, 0
        horizon = now - self.inflight_ttl_s
        while dispatches:
            decision_id, d = next(iter(dispatches.items()))
            if d.at > horizon:
                break
            self._remove(decision_id)
            n += 1
        return n

    def _read(self, endpoint: str, slot: _Slot, now: float,
              staleness: StalenessPolicy | None) -> EndpointLoad:
        """The merged view with ``staleness`` applied; a stale reading is cached per
        (policy, view), so reading a stale endpoint again allocates nothing."""
        view = self._view(endpoint, slot)
        if staleness is None or view.source == "inflight":
            return view
        if now - view.updated_at <= staleness.max_age_s:
            borrowed = slot.borrowed_at
            if borrowed is None or now - borrowed <= staleness.max_age_s or staleness.on_stale == "ignore":
                return view
            return self._view(endpoint, slot, alone=True)  # the other snapshot's fields are stale: not borrowed
        cached = slot.stale
        if cached is not None and cached[1] is view and (cached[0] is staleness or cached[0] == staleness):
            return cached[2]
        reading = apply_staleness(view, staleness, now)
        slot.stale = (staleness, view, reading)
        return reading

    def _view(self, endpoint: str, slot: _Slot, alone: bool = False) -> EndpointLoad:
        """The reading: ``slot``'s merged snapshot (``alone``: its freshest snapshot without the other's
        fields) with the in-flight accounting (cached until the slot changes)."""
        view = slot.view_alone if alone else slot.view
        if view is not None:
            return view
        ext = slot.alone if alone else slot.external()
        n_inflight = len(slot.inflight)
        if ext is None:
            view = EndpointLoad(
                endpoint=endpoint, source="inflight",
                updated_at=slot.newest_at,
                inflight_requests=n_inflight, inflight_prompt_tokens=slot.inflight_tokens,
                pending_requests=slot.after_n, pending_prompt_tokens=slot.after_tokens)
        else:
            waiting = ext.num_requests_waiting
            view = replace(
                ext,
                num_requests_waiting=None if waiting is None else waiting + slot.after_n,
                inflight_requests=n_inflight, inflight_prompt_tokens=slot.inflight_tokens,
                pending_requests=slot.after_n, pending_prompt_tokens=slot.after_tokens)
        if alone:
            slot.view_alone = view
        else:
            slot.view = view
        return view
