"""Build a ``RoutingEngine`` from settings: fleet, compiled policy, estimator and the live
``FleetState`` (with its budget ledger), each loaded once (by the service's lifespan,
or by a CLI command).

The budget ledger comes from ``POINTSMAN_BUDGET_LEDGER`` (default SQLite under the data
folder) with the budgets of ``POINTSMAN_BUDGETS_PATH``; ``build_engine(settings,
ledger=False)`` builds a state without one (a CLI what-if that must not create files),
unless a ledger or budgets file is configured explicitly.

The difficulty estimator comes from ``pointsman.estimator.model_source.load_estimator(spec)``.
When that module is absent or the model cannot load, the engine still works with an
``UnavailableEstimator``: every decision sees ``difficulty.available == false`` and
the policy's rule for that case decides; ``LoadedEngine.estimator_error`` says why.
Fleet and policy errors are not softened: they raise ``FleetError`` / ``PolicyError``
with every problem located.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from pointsman.estimator.estimate import DifficultyEstimate, Estimator
from pointsman.policy.budget.config import BudgetConfig
from pointsman.policy.budget.factory import open_ledger
from pointsman.policy.budget.journal import DEFAULT_JOURNAL_NAME, SpendJournal
from pointsman.policy.budget.ledger import BudgetLedger
from pointsman.policy.engine import RoutingEngine
from pointsman.policy.fleet import Fleet, load_fleet
from pointsman.policy.rules.compiler import load_policy
from pointsman.policy.signals.fleet_state import FleetState
from pointsman.policy.signals.shared_state import open_sync
from pointsman.service.decision_key import decision_signer
from pointsman.service.keys import key_names
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


def load_estimator(spec: str | None, timeout_ms: float | None = None, threads: int = 1) -> tuple[Estimator, str | None]:
    """(estimator, error): the real estimator for ``spec`` (``timeout_ms`` budget per estimate,
    ``threads`` onnxruntime threads), or an ``UnavailableEstimator`` and why."""
    if importlib.util.find_spec("pointsman.estimator.model_source") is None:
        reason = "pointsman.estimator.model_source is not installed"
        return UnavailableEstimator(reason), reason
    from pointsman.estimator.model_source import load_estimator as _load

    try:
        return _load(spec, timeout_ms=timeout_ms, intra_op_threads=threads), None
    except Exception as exc:  # noqa: BLE001 - a broken model must not stop routing; the reason is reported
        reason = f"{type(exc).__name__}: {exc}"
        return UnavailableEstimator(reason), reason


def open_budget_ledger(settings: Settings, check_keys: bool = False, journal: bool = False) -> BudgetLedger:
    """The ledger ``settings`` name, with their budgets. Raises ``BudgetConfigError`` (located)
    for a bad budgets file (with ``check_keys``, the service's: a ``key:`` scope naming none of its
    API keys too; with ``journal``, a spend journal restoring a Redis ledger: a ``record_retention_s`` too short
    to restore), ``BudgetError`` for a bad URL, ``LedgerUnavailable`` if it cannot open."""
    names = key_names(settings) if check_keys else None
    restored = journal and (settings.budget_ledger or "").split(":", 1)[0].lower() in ("redis", "rediss", "unix")
    config = BudgetConfig.load(settings.budgets_path, names, restored) if settings.budgets_path else BudgetConfig()
    return open_ledger(settings.budget_ledger, config, data_dir=settings.data_dir)


def build_state(settings: Settings, fleet: Fleet, ledger: bool = True, shared: bool = False) -> FleetState:
    """A ``FleetState`` for ``fleet`` with the configured ledger (none when ``ledger`` is False
    and neither ``budget_ledger`` nor ``budgets_path`` is set) and, with ``shared`` (the service),
    the shared-state sync of ``POINTSMAN_STATE_URL`` (not started: ``FleetState.start_sync``)."""
    want = ledger or settings.budget_ledger is not None or settings.budgets_path is not None
    if not shared:
        return FleetState(fleet, open_budget_ledger(settings) if want else None,
                          budget_fail_open=settings.budget_fail_open)
    sync = open_sync(settings.state_url)
    return FleetState(fleet, open_budget_ledger(settings, check_keys=True, journal=True) if want else None,
                      budget_fail_open=settings.budget_fail_open,
                      sync=sync, signer=decision_signer(settings, sync),
                      journal=SpendJournal(Path(settings.data_dir) / DEFAULT_JOURNAL_NAME) if want else None)


def build_engine(settings: Settings, ledger: bool = True, shared: bool = False) -> LoadedEngine:
    """Load fleet, policy, estimator and live state named by ``settings`` (the caller reports
    ``estimator_error``); ``shared``: with the shared-state sync (the service; the CLI decides
    alone). Raises ``FleetError``, ``PolicyError`` or ``BudgetConfigError`` (every problem,
    located) for bad config files, ``BudgetError`` for a bad ledger URL."""
    fleet = load_fleet(settings.fleet_path)
    policy = load_policy(settings.policy_path, fleet)
    state = build_state(settings, fleet, ledger, shared)
    estimator, error = load_estimator(settings.model, settings.estimator_timeout_ms, settings.estimator_threads)
    return LoadedEngine(RoutingEngine(fleet, policy, estimator, state=state), error)
