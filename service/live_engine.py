"""The engine the service decides with now, and how it changes while serving.

A ``RoutingEngine`` is immutable. ``LiveEngine`` holds a reference to the current one;
a policy reload or a model swap builds a new engine (``with_policy`` /
``with_estimator``, sharing the ``FleetState``: load, prefix indexes, budget ledger) and
replaces the reference in one assignment. A request reads ``live.engine`` once and
decides on that engine to the end, so decisions in flight finish on the policy and
estimator they started with, and no decision ever sees half a change. Swaps are
serialized by a lock, so a policy reload and a model swap at the same moment both land; a
fleet or policy reload holds it (``changing``) from reading the serving engine to swapping the
one it built from it, so a model swapped in meanwhile is not replaced by the old one.

``LiveEngine`` also remembers what the last policy reload, model swap, fleet and budgets reload
did (``last_reload``, ``last_swap``, ``last_fleet_reload``, ``last_budgets_reload``) and what the
model follower saw last (``follow``) for ``GET /v1/policy``, ``/v1/fleet``, ``/v1/budgets``,
``/healthz`` and the metrics. Whenever a policy starts serving, each of its rules left out on the
fleet (``if_fleet_has``) is logged as a warning (``warn_omitted``).
"""

from __future__ import annotations

import logging
import threading
import time
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field

from pointsman.errors import Problem
from pointsman.estimator.estimate import Estimator
from pointsman.json_types import JSONObject
from pointsman.policy.engine import RoutingEngine
from pointsman.policy.rules.compiler import CompiledPolicy

log = logging.getLogger("pointsman.service.policy")


def warn_omitted(policy: CompiledPolicy) -> None:
    """Log a warning naming each rule of ``policy`` left out on its fleet (``if_fleet_has``): a target
    removed from the fleet, or misspelled there, turns such rules off instead of failing the load."""
    for name, why in policy.omitted:
        log.warning("policy %s: rule '%s' left out (if_fleet_has): %s", policy.file, name, why)


@dataclass(frozen=True)
class ReloadResult:
    """One policy (re)load attempt: ``ok``; ``changed`` (a new revision now serves);
    ``revision`` serving after it and ``previous_revision``; ``problems`` (located, when
    rejected); ``source`` (``endpoint``, ``watch``; ``fleet`` for a policy a fleet reload recompiled); ``at`` (Unix s)."""

    ok: bool
    changed: bool
    revision: str
    previous_revision: str
    problems: tuple[Problem, ...] = ()
    source: str = "endpoint"
    at: float = field(default_factory=time.time)

    def to_dict(self) -> JSONObject:
        """JSON-ready summary (problems as ``{file, line, col, code, message, text}``)."""
        return {"ok": self.ok, "changed": self.changed, "revision": self.revision,
                "previous_revision": self.previous_revision, "source": self.source, "at": self.at,
                "problems": [problem_dict(p) for p in self.problems]}


@dataclass(frozen=True)
class SwapResult:
    """One model swap attempt: ``ok``; ``changed``; estimator ``version`` serving after it and
    ``previous_version``; ``source`` (the model's origin, e.g. ``models:/NAME/3 (@champion)``);
    ``error`` when the new model could not load (the old one keeps serving); ``at`` (Unix s)."""

    ok: bool
    changed: bool
    version: str
    previous_version: str
    source: str | None = None
    error: str | None = None
    at: float = field(default_factory=time.time)

    def to_dict(self) -> JSONObject:
        """JSON-ready summary."""
        return asdict(self)


@dataclass(frozen=True)
class FollowStatus:
    """What the model follower (``service/model_follower.py``) saw at its last poll: the followed
    ``spec``; ``serving`` (the registry version serving, ``bundled``, or None when unknown);
    ``wanted`` (where the alias pointed, None when unread); ``registry_reachable`` (None before
    the first poll); ``problem``: why the serving model is kept although the alias says otherwise
    or could not be read (an unreachable registry, a vanished alias, a version that failed to
    load), None when it follows; ``polled_at`` (Unix s)."""

    spec: str
    serving: str | None
    wanted: str | None = None
    registry_reachable: bool | None = None
    problem: str | None = None
    polled_at: float | None = None

    def to_dict(self) -> JSONObject:
        """JSON-ready summary."""
        return asdict(self)


def problem_dict(p: Problem) -> JSONObject:
    """A located problem as JSON: its fields plus ``text`` (``file:line:col: code: message``)."""
    return {"file": p.file, "line": p.line, "col": p.col, "code": p.code, "message": p.message, "text": str(p)}


class LiveEngine:
    """The current engine (see the module). ``LiveEngine(engine, estimator_error=None)``;
    ``estimator_error``: why the estimator is unavailable (None when it loaded)."""

    def __init__(self, engine: RoutingEngine, estimator_error: str | None = None) -> None:
        self._engine = engine
        warn_omitted(engine.policy)
        self._lock = threading.RLock()
        self.estimator_error = estimator_error
        self.last_reload: ReloadResult | None = None
        self.last_swap: SwapResult | None = None
        self.last_fleet_reload: ReloadResult | None = None
        self.follow: FollowStatus | None = None
        self.last_budgets_reload: ReloadResult | None = None

    @property
    def engine(self) -> RoutingEngine:
        """The engine new decisions use (read it once per decision)."""
        return self._engine

    def changing(self) -> AbstractContextManager[object]:
        """Hold while reading ``engine``, building a changed engine from it and swapping that in
        (a reload): no other swap lands in between, to be overwritten. Decisions never wait on it."""
        return self._lock

    def swap_policy(self, policy: CompiledPolicy, source: str = "endpoint") -> ReloadResult:
        """Serve ``policy`` from now on (a no-op when its revision already serves); returns the result."""
        with self._lock:
            old = self._engine
            changed = policy.revision != old.policy.revision or policy.file != old.policy.file
            if changed:
                self._engine = old.with_policy(policy)
                warn_omitted(policy)
            result = ReloadResult(True, changed, policy.revision, old.policy.revision, (), source)
            self.last_reload = result
            return result

    def reject_policy(self, problems: list[Problem], source: str = "endpoint") -> ReloadResult:
        """Record a rejected policy (the running one keeps serving); returns the result."""
        with self._lock:
            rev = self._engine.policy.revision
            result = ReloadResult(False, False, rev, rev, tuple(problems), source)
            self.last_reload = result
            return result

    def swap_estimator(self, estimator: Estimator, error: str | None = None) -> SwapResult:
        """Serve ``estimator`` from now on; ``error``: why it is an unavailable stand-in (None when
        it is a real model). Returns the result."""
        with self._lock:
            old = self._engine
            before = str(old.estimator.version)
            self._engine = old.with_estimator(estimator)
            self.estimator_error = error
            source = getattr(estimator, "source", None)  # where a registry model came from; optional
            result = SwapResult(True, True, str(estimator.version), before, None if source is None else str(source), None)
            self.last_swap = result
            return result

    def swap_engine(self, engine: RoutingEngine, result: ReloadResult) -> ReloadResult:
        """Serve ``engine`` (a reloaded fleet with its recompiled policy) from now on; records
        ``result`` as the last fleet reload, and as the last policy reload (source ``fleet``) when the
        policy file compiled to another revision, and returns it."""
        with self._lock:
            old = self._engine.policy.revision
            self._engine = engine
            self.last_fleet_reload = result
            if engine.policy.revision != old:
                self.last_reload = ReloadResult(True, True, engine.policy.revision, old, (), "fleet")
            warn_omitted(engine.policy)
            return result

    def reject_fleet(self, problems: list[Problem], source: str = "endpoint") -> ReloadResult:
        """Record a rejected fleet file, or one its policy does not compile against (the running
        pair keeps serving); returns the result."""
        with self._lock:
            rev = self._engine.fleet.revision
            result = ReloadResult(False, False, rev, rev, tuple(problems), source)
            self.last_fleet_reload = result
            return result

    def reject_estimator(self, error: str, source: str | None = None) -> SwapResult:
        """Record a model that failed to load (the running one keeps serving); returns the result."""
        with self._lock:
            v = str(self._engine.estimator.version)
            result = SwapResult(False, False, v, v, source, error)
            self.last_swap = result
            return result
