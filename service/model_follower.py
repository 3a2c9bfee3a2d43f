"""Model hot swap: the service follows an MLflow registry alias (``champion`` by default).

When ``POINTSMAN_MODEL`` is ``champion`` or ``models:/NAME@ALIAS``, a ``ModelFollower``
asks the registry every ``POINTSMAN_MODEL_POLL_INTERVAL_S`` seconds which version the
alias points at (one registry read: the registered model with its aliases). When that differs
from the serving model, it loads that version *by number* (``models:/NAME/<version>``,
downloaded once into ``<data dir>/models``, ONNX sessions built) in a worker thread while the
old model keeps serving, then swaps it in atomically (``LiveEngine.swap_estimator``).

Every way the alias can move or vanish:

- moved to another version: that version is loaded and swapped in;
- ``champion`` deleted, or its registered model gone (``pointsman promote --rollback`` to the
  bundled model deletes the alias): the bundled model is swapped in. MLflow 3.x answers a
  missing alias with ``INVALID_PARAMETER_VALUE``, not ``RESOURCE_DOES_NOT_EXIST``, so a missing
  alias is told from a failing registry by reading the model's alias list, never by error code;
- a followed custom alias (``models:/NAME@ALIAS``) deleted: there is nothing to fall back to, so
  the serving model is kept and ``problem`` says why;
- the registry unreachable: the serving model is kept, ``registry_reachable`` is false;
- a version that fails to load (missing artifacts, a broken manifest): reported as a failed swap
  (``LiveEngine.last_swap`` with its error, ``pointsman_model_swaps_total{result="error"}``, the
  log) once per version and error, the serving model is kept, and the next polls try again. A
  load that gives anything but the wanted version is such a failure too: a failure is never
  replaced by the bundled model and called a swap.

What the last poll saw is ``LiveEngine.follow`` (``FollowStatus``): ``/healthz`` ``model_follow``
and the ``pointsman_model_registry_reachable`` / ``pointsman_model_follow_problem`` gauges.
``champion`` without a tracking store means the bundled model. Pinned specs (``bundled``, a
directory, ``models:/NAME/VERSION``) are not followed.

Every decision names the estimator version it used (``estimator_version``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Callable
from typing import Protocol

from pointsman.estimator.estimate import Estimator
from pointsman.service.live_engine import FollowStatus, LiveEngine, SwapResult

log = logging.getLogger("pointsman.service.model")

BUNDLED = "bundled"
_VERSION_IN_SOURCE = re.compile(r"^models:/[^/@]+/(?P<version>\d+)")


def followed(spec: str | None) -> bool:
    """True when ``spec`` names a moving alias: ``champion`` or ``models:/NAME@ALIAS``."""
    return spec == "champion" or (spec is not None and spec.startswith("models:/") and "@" in spec)


def key_of(estimator: object) -> str | None:
    """Which registry version an estimator is: the version number of a registry model
    (its ``source`` is ``models:/NAME/V ...``), ``bundled`` for the bundled model, else None."""
    source = str(getattr(estimator, "source", "") or "")
    m = _VERSION_IN_SOURCE.match(source)
    if m:
        return m["version"]
    return BUNDLED if source.startswith(BUNDLED) else None


class AliasVanished(LookupError):
    """The followed custom alias (or its registered model) no longer exists: keep the serving model."""


class _RegisteredModel(Protocol):
    """What the follower reads of an MLflow ``RegisteredModel``: its aliases (alias -> version)."""

    @property
    def aliases(self) -> dict[str, str]: ...


class _ModelReader(Protocol):
    """What the follower uses of an ``MlflowClient``."""

    def get_registered_model(self, name: str) -> _RegisteredModel: ...


def alias_of(spec: str) -> tuple[str, str]:
    """``(registered model name, alias)`` a followed ``spec`` names (``champion`` is
    ``pointsman-difficulty@champion``). Raises ``ModelNotFoundError`` / ``ValueError`` otherwise."""
    from pointsman.estimator.registry import CHAMPION_ALIAS, REGISTERED_NAME, parse_models_uri

    if spec == "champion":
        return REGISTERED_NAME, CHAMPION_ALIAS
    name, alias, _ = parse_models_uri(spec)
    if alias is None:  # followed() admits only alias specs
        raise ValueError(f"{spec!r} names no alias to follow")
    return name, alias


def _missing_model(exc: Exception) -> bool:
    return getattr(exc, "error_code", "") == "RESOURCE_DOES_NOT_EXIST"


class RegistryResolver:
    """Where an alias points now: ``resolver(spec) -> "<version>" | "bundled"``. One MLflow client
    per resolver (``estimator.registry.client``; needs the ``train`` extra). Reads the registered
    model and its aliases (see the module): ``champion`` without a store, without the model or
    without the alias is ``bundled``; a custom alias or model that is gone raises ``AliasVanished``;
    any other failure (the registry cannot be read) raises as it is."""

    def __init__(self) -> None:
        self._client: _ModelReader | None = None

    def __call__(self, spec: str) -> str:
        from pointsman.estimator.registry import registry_store_exists

        if spec == "champion" and not registry_store_exists():
            return BUNDLED
        name, alias = alias_of(spec)
        if self._client is None:
            from pointsman.estimator.registry import client

            self._client = client()
        try:
            model = self._client.get_registered_model(name)
        except Exception as exc:
            if not _missing_model(exc):
                raise
            if spec == "champion":
                return BUNDLED
            raise AliasVanished(f"registered model {name!r} no longer exists") from None
        version = dict(model.aliases).get(alias)
        if version is not None:
            return str(version)
        if spec == "champion":
            return BUNDLED  # never promoted, or rolled back to the bundled model
        raise AliasVanished(f"alias @{alias} of {name!r} no longer exists")


class ModelFollower:
    """Follows ``spec``'s alias and swaps the estimator of ``live`` (see the module).

    ``load(spec) -> (estimator, error)``: loads the model (``service.bootstrap.load_estimator``
    with the service's timeout and threads), called with ``bundled`` or ``models:/NAME/<version>``;
    ``wrap(estimator)``: what to serve it as (the service wraps it in a ``DeadlineEstimator``);
    ``resolve(spec) -> key``: where the alias points (default ``RegistryResolver``);
    ``on_result(SwapResult)``: metrics hook."""

    def __init__(self, live: LiveEngine, spec: str, *, load: Callable[[str], tuple[Estimator, str | None]],
                 wrap: Callable[[Estimator], Estimator] = lambda e: e, resolve: Callable[[str], str] | None = None,
                 on_result: Callable[[SwapResult], None] | None = None) -> None:
        self.live, self.spec = live, spec
        self._load, self._wrap = load, wrap
        self._resolve = resolve or RegistryResolver()
        self._on_result = on_result
        estimator = getattr(live.engine.estimator, "inner", live.engine.estimator)
        self.current = None if live.estimator_error else key_of(estimator)
        self.last_error: str | None = None
        self._failed: tuple[str, str] | None = None
        live.follow = FollowStatus(spec, self.current)

    def _status(self, wanted: str | None, reachable: bool | None, problem: str | None) -> None:
        if problem is not None and problem != self.last_error:
            log.warning("model follower (%s): %s; keeping estimator %s", self.spec, problem,
                        self.live.engine.estimator.version)
        self.last_error = problem
        self.live.follow = FollowStatus(self.spec, self.current, wanted, reachable, problem, time.time())

    def poll_once(self) -> SwapResult | None:
        """One poll (blocking; run it in a worker thread): resolve the alias and swap if it moved.
        Returns the swap result, or None when nothing changed, the registry could not be read, the
        alias vanished, or the version that failed before failed again the same way."""
        try:
            want = self._resolve(self.spec)
        except AliasVanished as exc:
            self._status(None, True, f"{exc}")
            return None
        except Exception as exc:  # noqa: BLE001 - an unreachable registry must not stop serving
            self._status(None, False, f"cannot read the model registry ({type(exc).__name__}: {exc})")
            return None
        if want == self.current:
            self._failed = None
            self._status(want, True, None)
            return None
        load_spec = BUNDLED if want == BUNDLED else f"models:/{alias_of(self.spec)[0]}/{want}"
        estimator, error = self._load(load_spec)
        got = key_of(getattr(estimator, "inner", estimator)) if error is None else None
        if error is None and got not in (want, None):
            error = f"{load_spec} loaded as {getattr(estimator, 'source', '?')!r}, not version {want}"
        if error is not None:
            self._status(want, True, f"version {want} failed to load: {error}")
            if self._failed == (want, error):
                return None  # reported already; tried again, same failure
            self._failed = (want, error)
            result = self.live.reject_estimator(error, f"{self.spec} -> {want}")
            log.error("model %s (version %s) failed to load: %s; keeping estimator %s", self.spec, want, error,
                      result.version)
        else:
            if want != BUNDLED and isinstance(getattr(estimator, "source", None), str):
                with contextlib.suppress(AttributeError):  # a read-only source keeps its own label
                    setattr(estimator, "source", f"{load_spec} (@{alias_of(self.spec)[1]})")  # noqa: B010
            result = self.live.swap_estimator(self._wrap(estimator))
            self.current, self._failed = want, None
            self._status(want, True, None)
            log.info("estimator swapped: %s -> %s (%s)", result.previous_version, result.version, result.source)
        if self._on_result is not None:
            self._on_result(result)
        return result
    async def run(self, interval_s: float, stop: asyncio.Event) -> None:
        """Poll every ``interval_s`` seconds until ``stop`` is set."""
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), timeout=interval_s)
                return
            except TimeoutError:
                pass
            try:
                await asyncio.to_thread(self.poll_once)
            except Exception:  # noqa: BLE001 - keep following
                log.exception("model follower poll failed")
