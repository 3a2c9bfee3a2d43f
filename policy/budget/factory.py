"""``open_ledger(url, config, data_dir)``: the budget ledger a URL names (SQLite by default,
Redis for several replicas).
"""

from __future__ import annotations

from pathlib import Path

from pointsman.errors import BudgetError
from pointsman.policy.budget.config import BudgetConfig
from pointsman.policy.budget.ledger import BudgetLedger

#: File name of the embedded ledger under the data folder.
DEFAULT_SQLITE_NAME = "budget.db"


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
        from pointsman.policy.budget.sqlite_ledger import SqliteLedger
        return SqliteLedger(Path(data_dir) / DEFAULT_SQLITE_NAME, config)
    scheme = url.split(":", 1)[0].lower()
    if scheme == "sqlite":
        from pointsman.policy.budget.sqlite_ledger import SqliteLedger
        return SqliteLedger.from_url(url, config)
    if scheme in ("redis", "rediss", "unix"):
        from pointsman.policy.budget.redis_ledger import RedisLedger
        return RedisLedger.from_url(url, config)
    raise BudgetError(f"budget ledger URL '{url}': scheme '{scheme}' is not sqlite, redis, rediss or unix")

