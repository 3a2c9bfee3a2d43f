"""Model hot swap: the service follows an MLflow registry alias (``champion`` by default).

When ``POINTSMAN_MODEL`` is ``champion`` or ``models:/NAME@ALIAS``, a ``ModelFollower``
asks the registry every ``POINTSMAN_MODEL_POLL_INTERVAL_S`` seconds which version the
alias points at (one cheap registry read). When that differs from the serving model, it
loads the new version (download once into ``<data dir>/models``, ONNX sessions built) in
a worker thread while the old model keeps serving, then swaps it in atomically
(``LiveEngine.swap_estimator``). A version that fails to load is reported
(``LiveEngine.last_swap``, the ``pointsman_model_swaps_total{result="error"}`` metric, the
log) and the old model keeps serving; the next poll tries again.

``champion`` without a tracking store, or without the alias (never promoted, or rolled
back to the bundled model), means the bundled model, so following it also follows a
rollback. Pinned specs (``bundled``, a directory, ``models:/NAME/VERSION``) are not followed.

Every decision names the estimator version it used (``estimator_version``).
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable
from typing import Protocol

from pointsman.estimator.estimate import Estimator
from pointsman.service.live_engine import LiveEngine, SwapResult

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


class _ModelVersion(Protocol):
    """What the follower reads of an MLflow ``ModelVersion``."""

    @property
    def version(self) -> str | int: ...


class _AliasReader(Protocol):
    """What the follower uses of an ``MlflowClient``: where an alias points."""

    def get_model_version_by_alias(self, name: str, alias: str) -> _ModelVersion: ...


class RegistryResolver:
    """Where an alias points now: ``resolver(spec) -> "<version>" | "bundled"``. One MLflow client
    per resolver (``training.registry.client``; needs the ``train`` extra). Raises when the
    registry cannot be read (the follower keeps the serving model then); ``champion`` without a
    store or without the alias is ``bundled``."""

    def __init__(self) -> None:
        self._client: _AliasReader | None = None

    def __call__(self, spec: str) -> str:
        from pointsman.estimator.registry import CHAMPION_ALIAS, REGISTERED_NAME, registry_store_exists

        if spec == "champion":
            if not registry_store_exists():
                return BUNDLED
            name, alias = REGISTERED_NAME, CHAMPION_ALIAS
        else:
            from pointsman.estimator.registry import parse_models_uri

            name, parsed_alias, _ = parse_models_uri(spec)
            if parsed_alias is None:  # followed() admits only alias specs
                raise ValueError(f"{spec!r} names no alias to follow")
            alias = parsed_alias
        if self._client is None:
            from pointsman.estimator.registry import client

            self._client = client()
        try:
            return str(self._client.get_model_version_by_alias(name, alias).version)
        except Exception as exc:
            if spec == "champion" and getattr(exc, "error_code", "") == "RESOURCE_DOES_NOT_EXIST":
                return BUNDLED
            raise


class ModelFollower:
    """Follows ``spec``'s alias and swaps the estimator of ``live`` (see the module).

    ``load(spec) -> (estimator, error)``: loads the model (``service.bootstrap.load_estimator``
    with the service's timeout and threads); ``wrap(estimator)``: what to serve it as (the
    service wraps it in a ``DeadlineEstimator``); ``resolve(spec) -> key``: where the alias
    points (default ``RegistryResolver``); ``on_result(SwapResult)``: metrics hook."""

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

    def poll_once(self) -> SwapResult | None:
        """One poll (blocking; run it in a worker thread): resolve the alias and swap if it moved.
        Returns the swap result, or None when nothing changed or the registry could not be read."""
        try:
            want = self._resolve(self.spec)
        except Exception as exc:  # noqa: BLE001 - an unreachable registry must not stop serving
            message = f"{type(exc).__name__}: {exc}"
            if message != self.last_error:
                log.warning("cannot read the model registry for %s (%s); keeping estimator %s", self.spec, message,
                            self.live.engine.estimator.version)
            self.last_error = message
            return None
        self.last_error = None
        if want == self.current:
            return None
        estimator, error = self._load(self.spec)
        if error is not None:
            result = self.live.reject_estimator(error, f"{self.spec} -> {want}")
            log.error("model %s (version %s) failed to load: %s; keeping estimator %s", self.spec, want, error,
                      result.version)
        else:
            result = self.live.swap_estimator(self._wrap(estimator))
            self.current = key_of(estimator) or want
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
