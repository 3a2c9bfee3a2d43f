"""Build a ``RoutingEngine`` from settings: fleet, compiled policy and estimator,
each loaded once (by the service's lifespan, or by a CLI command).

The difficulty estimator comes from ``pointsman.estimator.loading.load_estimator(spec)``.
When that module is absent or the model cannot load, the engine still works with an
``UnavailableEstimator``: every decision sees ``difficulty.available == false`` and
the policy's rule for that case decides; ``LoadedEngine.estimator_error`` says why.
Fleet and policy errors are not softened: they raise ``FleetError`` / ``PolicyError``
with every problem located.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from pointsman.estimator.estimate import DifficultyEstimate
from pointsman.policy.compiler import load_policy
from pointsman.policy.engine import RoutingEngine
from pointsman.policy.fleet import load_fleet
from pointsman.service.settings import Settings

@dataclass
class UnavailableEstimator:
    """An estimator that is not there: every estimate is unavailable with ``reason``."""

    reason: str
    version: str = "unavailable"
    tokenizer: None = None

    def estimate(self, features: object) -> DifficultyEstimate:
        """Always ``DifficultyEstimate(None, available=False, 0.0, reason)``."""
        return DifficultyEstimate(None, False, 0.0, self.reason)


@dataclass
class LoadedEngine:
    """An engine and, when the estimator could not load, the reason (else None)."""

    engine: RoutingEngine
    estimator_error: str | None


def load_estimator(spec: str | None, timeout_ms: float | None = None, threads: int = 1) -> tuple[object, str | None]:
    """(estimator, error): the real estimator for ``spec`` (``timeout_ms`` budget per estimate,
    ``threads`` onnxruntime threads), or an ``UnavailableEstimator`` and why."""
    if importlib.util.find_spec("pointsman.estimator.loading") is None:
        reason = "pointsman.estimator.loading is not installed"
        return UnavailableEstimator(reason), reason
    from pointsman.estimator.loading import load_estimator as _load

    try:
        return _load(spec, timeout_ms=timeout_ms, intra_op_threads=threads), None
    except Exception as exc:  # noqa: BLE001 - a broken model must not stop routing; the reason is reported
        reason = f"{type(exc).__name__}: {exc}"
        return UnavailableEstimator(reason), reason


def build_engine(settings: Settings) -> LoadedEngine:
    """Load fleet, policy and estimator named by ``settings`` (the caller reports
    ``estimator_error``). Raises ``FleetError`` or
    ``PolicyError`` (every problem, located) for bad config files."""
    fleet = load_fleet(settings.fleet_path)
    policy = load_policy(settings.policy_path, fleet)
    estimator, error = load_estimator(settings.model, settings.estimator_timeout_ms, settings.estimator_threads)
    return LoadedEngine(RoutingEngine(fleet, policy, estimator), error)
