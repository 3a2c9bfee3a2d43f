"""Budgets: spending limits in USD per tenant, team or API key over UTC calendar
windows, with reservations that concurrent decisions cannot race past (each admission is one
atomic check of settled + held + estimate against the limit; an actual cost above its estimate
can still end a window over its limit, see "What cannot happen, and what can").

Vocabulary
----------
- **scope**: who a budget belongs to, written ``kind:name`` with kind ``tenant``,
  ``team`` or ``key`` (``tenant:acme``, ``team:acme/search``, ``key:k_9f2c``). Use
  an API key's id, never the secret. A request carries several scopes at once.
- **window**: ``day`` or ``month``, UTC calendar windows: a day runs from 00:00:00
  UTC to the next midnight, a month from the 1st 00:00:00 UTC to the next 1st.
  Window ids read ``day:2025-03-14`` and ``month:2025-03``.
- **budget**: a limit in USD for one scope over one window. A scope may have a
  ``day`` and a ``month`` budget. ``limit_usd: 0`` means nothing may be spent; a
  scope without budgets is unlimited (its spend is still recorded).

Life of a decision's money
--------------------------
1. ``reserve(decision_id, scopes, estimated_cost_usd, now)`` holds the estimate
   against every budget of every scope, atomically: it succeeds only if, for each
   budget, ``spent_usd < limit_usd`` and ``spent_usd + estimated_cost_usd <=
   limit_usd``, where ``spent_usd = settled_usd + reserved_usd`` in the window that
   contains ``now``. Otherwise nothing is held and ``BudgetExceeded`` names the
   first budget that refused. An exhausted budget refuses even a $0 estimate, so
   a zero budget refuses everything.
2. ``settle(decision_id, actual_cost_usd, now, target, ...tokens)`` replaces the
   hold by the actual cost, in the windows of the *reservation* (a decision made at
   23:59:59 UTC is booked on that day even if its outcome arrives after midnight).
   Settling again returns the first settlement and changes nothing.
3. ``release(decision_id)`` drops a hold that will never settle.
4. A hold not settled or released within ``reservation_ttl_s`` (default 600 s)
   *expires*: it stops counting against the budget. If its outcome arrives later,
   ``settle`` still records the actual cost (the money was spent), as it does after
   a ``release``. Set the TTL above the longest request you serve.

What cannot happen, and what can
---------------------------------
Holds and settled costs are integers of nano-USD (1e-9 USD), so sums are exact and
comparisons never drift. Each backend makes the check-and-hold one atomic step
(SQLite: one ``BEGIN IMMEDIATE`` transaction, a database-wide write lock shared by
threads and processes; Redis: one Lua script, which Redis runs without interleaving
any other command). So at any moment, for every budget::

    settled_usd + reserved_usd <= limit_usd + overruns

where ``overruns`` is the sum of ``max(0, actual - reserved)`` over settlements that
exceeded their reservation, plus the cost of outcomes settled after their hold
expired or was released. With estimates that are upper bounds and outcomes that
arrive within the TTL, spend never exceeds the limit. A budget over its limit
refuses every new reservation until its window rolls over.

Records of reservations are kept ``record_retention_s`` (default 7 days) for
idempotent settles; after that, settling the id raises ``UnknownReservation``.

Backends (one URL setting, ``open_ledger``): ``sqlite:///path/to/ledger.db``
(``sqlite_ledger.py``, the embedded default) or ``redis://host:port/db``
(``redis_ledger.py``, for several service replicas).

Modules: ``units`` (windows, nano-USD, argument checks) → ``config`` (the budgets file) →
``ledger`` (the Protocol, results, errors, the shared admission rule) → ``sqlite_ledger``,
``redis_ledger`` → ``factory`` (``open_ledger``); ``snapshot_cache`` keeps ledger reads briefly for
the decisions that follow, in step with this replica's own changes.
"""
