"""Errors raised by Pointsman, as one tree. The classes below are defined here; the ones
marked with a module live beside the code that raises them and subclass these.

::

    PointsmanError                   base of everything Pointsman raises on purpose
    ├── RequestError                 a routing request or outcome is malformed (HTTP 4xx);
    │   │                            ``.field`` names the offending field, e.g. "messages[2].content[0].type"
    │   ├── OutcomeItemError         one item of an outcome batch is invalid      (pointsman.outcome)
    │   └── NoEligibleTarget         no rule produced an eligible target; ``.exclusions`` say why
    │                                                                   (pointsman.policy.selection.filters)
    ├── ConfigError                  a configuration file is invalid; ``.problems`` lists
    │   │                            every problem as ``file:line:col: code: message``
    │   ├── FleetError               the fleet file (targets, pools, endpoints, prices)
    │   ├── PolicyError              a policy file (rules, filters, CEL expressions)
    │   └── BudgetConfigError        a budgets file (also a BudgetError)  (pointsman.policy.budget.config)
    ├── EstimatorError               the difficulty estimator cannot produce p_hard
    │   └── ModelNotFoundError       no model at the given path or registry URI
    ├── BudgetError                  the budget ledger refused or failed an operation
    │   ├── BudgetExceeded           a reservation does not fit a budget; nothing held
    │   ├── UnknownReservation       settle/release of an id the ledger has no record of
    │   └── LedgerUnavailable        the backend failed; the operation had no effect
    │                                                                   (these three: pointsman.policy.budget.ledger)
    ├── ScrapeError                  an engine's /metrics page is unreadable   (pointsman.policy.signals.scrape)
    ├── KVEventError                 a KV-cache event message or payload is malformed; also a ValueError
    │                                                                   (pointsman.policy.signals.kv_events)
    ├── TargetTokenizerError         a target's tokenizer.json or chat template cannot be loaded, or the
    │                                template refused a conversation; also a ValueError
    │                                                                   (pointsman.policy.signals.engine_hashes)
    ├── PromotionRefused             the challenger did not beat the champion  (pointsman.training.promote)
    └── DataError                    an outcome table, trace or log is unreadable or has wrong columns

Outside the tree, by design: the service's ``HTTPError`` (an HTTP answer, ``service/http_errors.py``)
and the CLI's click exceptions (``cli/errors.py``), which translate these at the edges.
An estimator that overruns its time budget is not an error: the estimate comes back
unavailable (``DifficultyEstimate.error`` starting ``timeout:``) and the policy decides.

Every error's ``str()`` is a complete, user-facing message.
"""

from __future__ import annotations

from dataclasses import dataclass


class PointsmanError(Exception):
    """Base class of every error Pointsman raises on purpose."""


class RequestError(PointsmanError, ValueError):
    """A request (route, outcome, telemetry) is malformed.

    ``field`` is a dotted/indexed path to the offending field (``"messages[0].content"``),
    or ``None`` when the problem is the request as a whole. Maps to HTTP 400/422.
    """

    def __init__(self, message: str, field: str | None = None) -> None:
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}" if field else message)


@dataclass(frozen=True)
class Problem:
    """One located problem in a configuration file.

    ``line`` and ``col`` are 1-based; 0 means unknown. ``code`` is a short
    kebab-case identifier (``unknown-key``, ``cel-syntax``, ``unknown-target``).
    """

    file: str
    line: int
    col: int
    code: str
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}: {self.code}: {self.message}"


class ConfigError(PointsmanError):
    """A configuration file is invalid; ``problems`` lists every problem found, in file order."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(str(p) for p in self.problems) or "invalid configuration")


class FleetError(ConfigError):
    """The fleet file is invalid (unknown keys, missing prices, duplicate targets, ...)."""


class PolicyError(ConfigError):
    """The policy file is invalid; the running policy, if any, keeps serving."""


class EstimatorError(PointsmanError):
    """The difficulty estimator could not produce ``p_hard`` for a request."""


class ModelNotFoundError(EstimatorError, FileNotFoundError):
    """No estimator model at the given directory or registry URI."""


class BudgetError(PointsmanError):
    """The budget ledger refused or failed an operation (reserve, settle)."""


class DataError(PointsmanError, ValueError):
    """An outcome table, trace or log is unreadable or lacks required columns."""
