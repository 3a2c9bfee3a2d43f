"""The shared budget ledger for several service replicas: Redis, via the ``redis`` package.

Why it cannot overspend: reserve, settle, release and snapshot are each one Lua
script (``register_script``; sent as EVALSHA). Redis runs a script to completion
without running any other client's command in between, so the read of the
counters, the admission check and the hold are one atomic step for every replica
that shares the server. Limits travel with each call (every replica holds the
budget config), the counters live in Redis.

Keys (``P`` is the prefix, default ``{pointsman-budget}:``; the braces are a hash tag
so a cluster would keep them in one slot; amounts are integer nano-USD)::

    P r:<decision_id>            hash  the reservation: state, reserved, scopes, window ids,
                                       and after settle the actual cost, target, tokens
                                       (TTL record_retention_s)
    P s:<window_id>:<scope>      hash  held, settled                 (TTL: window end + keep)
    P t:<window_id>:<target>     hash  usd, prompt, cached, completion, outcomes  (same TTL)
    P expiry                     zset  decision_id scored by expires_s (live holds only)
    P a:<uid>                    string this store counts a spend journal's sums (``add_sums``; TTL
                                       record_retention_s from the last call)
    P epoch                      string this store's incarnation: Redis TIME ("<s>.<us>") when the
                                       first script found it missing (no TTL)

Every script first *sweeps*: holds whose ``expires_s`` <= now (at most 1000 per call;
any left are swept by the next call and meanwhile still count, which can only
refuse, never overspend) leave ``held`` and become ``expired``.

``now`` is the calling replica's clock; TTLs are computed relative to it. Durability
is Redis's own (run it with ``appendonly yes`` and ``appendfsync everysec`` to keep
spend across a Redis restart). What Redis still loses (the file's tail not yet ``fsync``ed when
the machine dies, or everything: FLUSHALL, a new volume) the replicas book again from their spend
journals (``FleetState.restore_spend``), told by ``incarnation`` (``pointsman.redis_epoch``): every script creates ``epoch``
before it writes anything else, so a missing (then new) epoch means every write made after the
old one was created is gone. Keep ``maxmemory-policy noeviction`` (an evicted epoch would be read as
a lost store) and never delete the epoch alone. Tested against standalone redis-server 7.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, TypeAlias, cast
from urllib.parse import parse_qs, urlencode, urlsplit, urlunsplit

from pointsman.errors import BudgetError
from pointsman.policy.budget.config import BudgetConfig
from pointsman.policy.budget.ledger import (
    BudgetExceeded,
    BudgetSnapshot,
    EffectivePrice,
    LedgerUnavailable,
    Reservation,
    Settlement,
    UnknownReservation,
    build_snapshot,
)
from pointsman.policy.budget.units import (
    check_id,
    check_scopes,
    checked_reserve_args,
    checked_settle_args,
    current_time,
    to_nusd,
    to_usd,
    window_of,
    windows_at,
)
from pointsman.redis_client import HangGate, redis_client
from pointsman.redis_epoch import EPOCH_LUA, INCARNATION_LUA, incarnation_of

if TYPE_CHECKING:  # pragma: no cover
    from redis import Redis
    from redis.commands.core import Script

    from pointsman.policy.budget.journal import Sum

#: What the ledger's Lua scripts return (``decode_responses=True``): strings and integers.
Reply: TypeAlias = list[str | int]

DEFAULT_PREFIX = "{pointsman-budget}:"
#: Seconds spend/usage keys outlive their window beyond record retention (a late settle
#: can still find its window's counters).
KEEP_AFTER_WINDOW_S = 86400

# ARGV[1] prefix, ARGV[2] now (Unix seconds, as text). Amounts stay strings from
# ARGV/HMGET (HINCRBY takes them as they are; Lua doubles are exact below 2^53 nano-USD).
_SWEEP = EPOCH_LUA + """
local NOW = ARGV[2]
local function holds(scopes, w1, w2, amount, sign)
  if amount == '0' then return end
  for scope in string.gmatch(scopes, '[^\\n]+') do
    for _, w in ipairs({w1, w2}) do
      local sk = P .. 's:' .. w .. ':' .. scope
      if sign > 0 or redis.call('EXISTS', sk) == 1 then
        redis.call('HINCRBY', sk, 'held', (sign > 0) and amount or ('-' .. amount))
      end
    end
  end
end
local function sweep()
  local ids = redis.call('ZRANGEBYSCORE', P .. 'expiry', '-inf', NOW, 'LIMIT', 0, 1000)
  for _, id in ipairs(ids) do
    local rk = P .. 'r:' .. id
    local f = redis.call('HMGET', rk, 'state', 'reserved', 'scopes', 'day', 'month')
    if f[1] == 'held' then
      holds(f[3], f[4], f[5], f[2], -1)
      redis.call('HSET', rk, 'state', 'expired')
    end
    redis.call('ZREM', P .. 'expiry', id)
  end
end
local function ttl(keep_until)
  return string.format('%d', math.max(60, math.floor(tonumber(keep_until) - tonumber(NOW))))
end
sweep()
"""

# ARGV: 3 id, 4 need, 5 expires_s, 6 retention_s, 7 day_id, 8 month_id, 9 day keep-until,
# 10 month keep-until, 11 scopes ('\n'-joined), 12 n budgets, then (scope, window_id, limit) each.
_RESERVE = _SWEEP + """
local id, need = ARGV[3], ARGV[4]
local rk = P .. 'r:' .. id
if redis.call('EXISTS', rk) == 1 then return {'dup'} end
local n = tonumber(ARGV[12])
for i = 0, n - 1 do
  local sk = P .. 's:' .. ARGV[14 + 3 * i] .. ':' .. ARGV[13 + 3 * i]
  local v = redis.call('HMGET', sk, 'held', 'settled')
  local spent = math.max(0, tonumber(v[1]) or 0) + (tonumber(v[2]) or 0)
  local limit = tonumber(ARGV[15 + 3 * i])
  if spent >= limit or spent + tonumber(need) > limit then
    return {'refused', tostring(i), string.format('%d', spent)}
  end
end
holds(ARGV[11], ARGV[7], ARGV[8], need, 1)
for scope in string.gmatch(ARGV[11], '[^\\n]+') do
  redis.call('EXPIRE', P .. 's:' .. ARGV[7] .. ':' .. scope, ttl(ARGV[9]))
  redis.call('EXPIRE', P .. 's:' .. ARGV[8] .. ':' .. scope, ttl(ARGV[10]))
end
redis.call('HSET', rk, 'state', 'held', 'reserved', need, 'scopes', ARGV[11], 'day', ARGV[7], 'month', ARGV[8],
           'dkeep', ARGV[9], 'mkeep', ARGV[10], 'created', NOW, 'expires', ARGV[5])
redis.call('EXPIRE', rk, ARGV[6])
redis.call('ZADD', P .. 'expiry', ARGV[5], id)
return {'ok'}
"""

# ARGV: 3 id, 4 actual, 5 target ('' for none), 6 prompt, 7 cached, 8 completion tokens; without a
# reservation, 9 scopes ('\n'-joined; '' = unknown), 10 day_id, 11 month_id, 12 day keep-until,
# 13 month keep-until, 14 retention_s book it as 'unreserved'.
_SETTLE = _SWEEP + """
local id, actual, target = ARGV[3], ARGV[4], ARGV[5]
local rk = P .. 'r:' .. id
local f = redis.call('HMGET', rk, 'state', 'reserved', 'scopes', 'day', 'month', 'dkeep', 'mkeep')
if not f[1] then
  if ARGV[9] == '' then return {'unknown'} end
  f = {'unreserved', '0', ARGV[9], ARGV[10], ARGV[11], ARGV[12], ARGV[13]}
  redis.call('HSET', rk, 'state', 'unreserved', 'reserved', '0', 'scopes', ARGV[9], 'day', ARGV[10],
             'month', ARGV[11], 'dkeep', ARGV[12], 'mkeep', ARGV[13], 'created', NOW, 'expires', NOW)
  redis.call('EXPIRE', rk, ARGV[14])
end
if f[1] == 'settled' then
  local r = redis.call('HMGET', rk, 'reserved', 'actual', 'settled_s', 'target', 'pt', 'ct', 'comp', 'hold_state')
  table.insert(r, 1, 'replay')
  return r
end
if f[1] == 'held' then holds(f[3], f[4], f[5], f[2], -1) end
for scope in string.gmatch(f[3], '[^\\n]+') do
  for _, w in ipairs({{f[4], f[6]}, {f[5], f[7]}}) do
    local sk = P .. 's:' .. w[1] .. ':' .. scope
    redis.call('HINCRBY', sk, 'settled', actual)
    redis.call('EXPIRE', sk, ttl(w[2]))
  end
end
if target ~= '' then
  for _, w in ipairs({{f[4], f[6]}, {f[5], f[7]}}) do
    local tk = P .. 't:' .. w[1] .. ':' .. target
    redis.call('HINCRBY', tk, 'usd', actual)
    redis.call('HINCRBY', tk, 'prompt', ARGV[6])
    redis.call('HINCRBY', tk, 'cached', ARGV[7])
    redis.call('HINCRBY', tk, 'completion', ARGV[8])
    redis.call('HINCRBY', tk, 'outcomes', 1)
    redis.call('EXPIRE', tk, ttl(w[2]))
  end
end
redis.call('HSET', rk, 'state', 'settled', 'hold_state', f[1], 'actual', actual, 'settled_s', NOW,
           'target', target, 'pt', ARGV[6], 'ct', ARGV[7], 'comp', ARGV[8])
redis.call('ZREM', P .. 'expiry', id)
return {'ok', f[1], f[2], f[4]}
"""

# ARGV: 3 the journal's uid, 4 retention_s, 5 the epoch the caller read, then per sum 6 scopes ('\n'-joined), 7 day_id,
# 8 month_id, 9 day keep-until, 10 month keep-until, 11 target ('' for none), 12 nano-USD, 13 prompt, 14 cached,
# 15 completion tokens, 16 settlements (11 each): what their settles book, in one step, unless a:<uid> was there;
# -1 (nothing written) in another epoch than the caller's.
_ADD_SUMS = _SWEEP + """
if redis.call('GET', P .. 'epoch') ~= ARGV[5] then return -1 end
if redis.call('SET', P .. 'a:' .. ARGV[3], '1', 'EX', ARGV[4], 'GET') then return 0 end
local n = 0
for i = 6, #ARGV, 11 do
  for _, w in ipairs({{ARGV[i + 1], ARGV[i + 3]}, {ARGV[i + 2], ARGV[i + 4]}}) do
    for scope in string.gmatch(ARGV[i], '[^\\n]+') do
      local sk = P .. 's:' .. w[1] .. ':' .. scope
      redis.call('HINCRBY', sk, 'settled', ARGV[i + 6])
      redis.call('EXPIRE', sk, ttl(w[2]))
    end
    if ARGV[i + 5] ~= '' then
      local tk = P .. 't:' .. w[1] .. ':' .. ARGV[i + 5]
      for j, field in ipairs({'usd', 'prompt', 'cached', 'completion', 'outcomes'}) do
        redis.call('HINCRBY', tk, field, ARGV[i + 5 + j])
      end
      redis.call('EXPIRE', tk, ttl(w[2]))
    end
  end
  n = n + tonumber(ARGV[i + 10])
end
return n
"""

# ARGV: 3 id.
_RELEASE = _SWEEP + """
local rk = P .. 'r:' .. ARGV[3]
local f = redis.call('HMGET', rk, 'state', 'reserved', 'scopes', 'day', 'month')
if not f[1] then return {'unknown'} end
if f[1] ~= 'held' then return {'noop'} end
holds(f[3], f[4], f[5], f[2], -1)
redis.call('HSET', rk, 'state', 'released')
redis.call('ZREM', P .. 'expiry', ARGV[3])
return {'ok'}
"""

# ARGV: 3 id, 4 the hold's new amount.
_SET_HOLD = _SWEEP + """
local rk = P .. 'r:' .. ARGV[3]
local f = redis.call('HMGET', rk, 'state', 'reserved', 'scopes', 'day', 'month')
if f[1] ~= 'held' then return {'noop'} end
local delta = tonumber(ARGV[4]) - tonumber(f[2])
if delta ~= 0 then
  holds(f[3], f[4], f[5], string.format('%d', math.abs(delta)), delta > 0 and 1 or -1)
  redis.call('HSET', rk, 'reserved', ARGV[4])
end
return {'ok'}
"""

# ARGV: 3.. spend key suffixes ('<window_id>:<scope>'); returns held, settled per key.
_SNAPSHOT = _SWEEP + """
local out = {}
for i = 3, #ARGV do
  local v = redis.call('HMGET', P .. 's:' .. ARGV[i], 'held', 'settled')
  out[#out + 1] = v[1] or '0'
  out[#out + 1] = v[2] or '0'
end
return out
"""


def _redis_errors() -> tuple[type[BaseException], ...]:
    import redis

    return (redis.exceptions.RedisError,)


class RedisLedger:
    """Budget ledger in Redis (see the module docstring for the guarantee).

    ``client``: a ``redis.Redis`` with ``decode_responses=True`` (``from_url`` builds one).
    ``prefix``: key prefix, so several ledgers can share one server. Thread-safe (the
    client's connection pool is), fork-safe (redis-py reconnects in a child).
    """

    def __init__(self, client: Redis, config: BudgetConfig | None = None, prefix: str = DEFAULT_PREFIX) -> None:
        self.client = client
        self.config = config or BudgetConfig()
        self.prefix = prefix
        self._errors = _redis_errors()
        self._gate = HangGate.of(client)  # a hung Redis: one socket timeout, then refused at once (redis_client)
        self._reserve = client.register_script(_RESERVE)
        self._settle = client.register_script(_SETTLE)
        self._release = client.register_script(_RELEASE)
        self._set_hold = client.register_script(_SET_HOLD)
        self._snapshot = client.register_script(_SNAPSHOT)
        self._add_sums = client.register_script(_ADD_SUMS)
        self._incarnation = client.register_script(INCARNATION_LUA)

    @classmethod
    def from_url(cls, url: str, config: BudgetConfig | None = None, timeout_s: float = 2.0) -> RedisLedger:
        """``redis://[:password@]host:port/db`` (``rediss://``, ``unix://`` too), optional
        query ``prefix``; other query parameters go to redis-py. Connects lazily."""
        parts = urlsplit(url)
        query = parse_qs(parts.query)
        prefix = query.pop("prefix", [DEFAULT_PREFIX])[-1]
        clean = urlunsplit(parts._replace(query=urlencode(query, doseq=True)))
        try:
            client = redis_client(clean, timeout_s)
        except (ValueError, TypeError) as exc:
            raise BudgetError(f"budget ledger URL '{url}': {exc}") from None
        return cls(client, config, prefix=prefix)

    def _run(self, script: Script, args: list[str]) -> Reply:
        try:
            out: Reply = self._gate.call(lambda: script(keys=[], args=args))
        except self._errors as exc:
            raise LedgerUnavailable(f"budget ledger (redis): {exc}") from exc
        return out

    def _head(self, now: float) -> list[str]:
        return [self.prefix, repr(now)]

    # -- the ledger -----------------------------------------------------------------------

    def reserve(self, decision_id: str, scopes: Sequence[str], estimated_cost_usd: float,
                now: float | None = None) -> Reservation:
        """Hold ``estimated_cost_usd`` (USD) on every scope, atomically (module docstring).

        Raises ``BudgetExceeded`` (nothing held), ``BudgetError`` for bad arguments or a
        ``decision_id`` reserved before, ``LedgerUnavailable`` when Redis fails.
        """
        scopes, need, now = checked_reserve_args(decision_id, scopes, estimated_cost_usd, now)
        config = self.config
        windows = windows_at(now)
        expires = now + config.reservation_ttl_s
        keep = config.record_retention_s + KEEP_AFTER_WINDOW_S
        budgets = config.budgets_for(scopes)
        args: list[str] = self._head(now) + [
            decision_id, str(need), repr(expires), str(max(1, math.ceil(config.record_retention_s))),
            windows["day"].id, windows["month"].id, repr(windows["day"].end_s + keep),
            repr(windows["month"].end_s + keep), "\n".join(scopes), str(len(budgets))]
        for b in budgets:
            args += [b.scope, windows[b.window].id, str(b.limit_nusd)]
        out = self._run(self._reserve, args)
        if out[0] == "dup":
            raise BudgetError(f"decision '{decision_id}' already has a reservation")
        if out[0] == "refused":
            b = budgets[int(out[1])]
            raise BudgetExceeded(b.scope, b.window, windows[b.window].id, b.limit_usd, to_usd(int(out[2])),
                                 to_usd(need))
        return Reservation(decision_id, scopes, to_usd(need), now, expires, {k: w.id for k, w in windows.items()})

    def settle(self, decision_id: str, actual_cost_usd: float, now: float | None = None,
               target: str | None = None, prompt_tokens: int = 0, cached_tokens: int = 0,
               completion_tokens: int = 0, scopes: Sequence[str] | None = None,
               issued_s: float | None = None) -> Settlement:
        """Replace the hold by ``actual_cost_usd`` (USD), booked in the reservation's windows,
        and add the tokens to ``target``'s usage. Without a reservation, ``scopes`` (and
        ``issued_s``, the decision's Unix time: its windows; default ``now``) book it as an
        ``unreserved`` settlement. A repeat returns the first settlement with ``replayed=True`` and
        changes nothing. Raises ``UnknownReservation`` (no reservation, no ``scopes``),
        ``BudgetError`` for bad arguments, ``LedgerUnavailable``."""
        actual, now = checked_settle_args(decision_id, actual_cost_usd, now, target, prompt_tokens, cached_tokens,
                                          completion_tokens)
        unreserved = ["", "", "", "", "", ""]
        if scopes is not None:
            windows = windows_at(now if issued_s is None else float(issued_s))
            keep = self.config.record_retention_s + KEEP_AFTER_WINDOW_S
            unreserved = ["\n".join(check_scopes(scopes)) or "\n", windows["day"].id, windows["month"].id,
                          repr(windows["day"].end_s + keep), repr(windows["month"].end_s + keep),
                          str(max(1, math.ceil(self.config.record_retention_s)))]
        out = self._run(self._settle, self._head(now) + [
            decision_id, str(actual), target or "", str(prompt_tokens), str(cached_tokens), str(completion_tokens),
            *unreserved])
        if out[0] == "unknown":
            raise UnknownReservation(decision_id)
        if out[0] == "replay":
            reserved, act, settled_s, tgt, pt, ct, comp, hold_state = out[1:]
            return Settlement(decision_id, to_usd(int(reserved)), to_usd(int(act)), float(settled_s),
                              str(tgt) or None, int(pt), int(ct), int(comp), str(hold_state), replayed=True)
        return Settlement(decision_id, to_usd(int(out[2])), to_usd(actual), now, target, prompt_tokens, cached_tokens,
                          completion_tokens, str(out[1]), day_id=str(out[3]))

    def release(self, decision_id: str, now: float | None = None) -> bool:
        """Drop the hold; True if it was live, False if already settled, released or expired.
        Raises ``UnknownReservation``, ``LedgerUnavailable``."""
        check_id(decision_id)
        out = self._run(self._release, self._head(current_time(now)) + [decision_id])
        if out[0] == "unknown":
            raise UnknownReservation(decision_id)
        return out[0] == "ok"

    def set_hold(self, decision_id: str, cost_usd: float, now: float | None = None) -> bool:
        """Make a live hold ``cost_usd`` (USD); False (nothing changed) unless one is live. See
        ``BudgetLedger.set_hold``; raises ``BudgetError``, ``LedgerUnavailable``."""
        check_id(decision_id)
        cost = to_nusd(cost_usd)
        return self._run(self._set_hold, self._head(current_time(now)) + [decision_id, str(cost)])[0] == "ok"

    def snapshot(self, scopes: Sequence[str], now: float | None = None) -> BudgetSnapshot:
        """Every scope in both windows at ``now`` (USD); holds past ``expires_s`` do not count.
        Raises ``BudgetError`` for a bad scope, ``LedgerUnavailable``."""
        scopes = check_scopes(scopes)
        now = current_time(now)
        keys = [(s, w.id) for s in scopes for w in windows_at(now).values()]
        out = self._run(self._snapshot, self._head(now) + [f"{w}:{s}" for s, w in keys])
        counters = {key: (int(out[2 * i]), int(out[2 * i + 1])) for i, key in enumerate(keys)}
        return build_snapshot(self.config, scopes, now, counters)

    def remaining(self, scopes: Sequence[str], now: float | None = None) -> dict[str, float]:
        """``{scope: remaining USD}``, least over its windows, ``math.inf`` when unlimited."""
        return self.snapshot(scopes, now).remaining_by_scope()

    def effective_price_per_token(self, target: str, window: str = "day", now: float | None = None) -> EffectivePrice:
        """Settled spend and tokens of ``target`` in the window containing ``now``
        (see ``EffectivePrice``); raises ``BudgetError`` for an unknown window."""
        check_id(target, "target")
        w = window_of(window, current_time(now))
        try:
            v = self._gate.call(lambda: self.client.hmget(f"{self.prefix}t:{w.id}:{target}", "usd", "outcomes", "prompt",
                                                          "cached", "completion"))
        except self._errors as exc:
            raise LedgerUnavailable(f"budget ledger (redis): {exc}") from exc
        spent, outcomes, prompt, cached, completion = (int(x or 0) for x in v)
        return EffectivePrice(target, w.kind, w.id, to_usd(spent), outcomes, prompt, cached, completion)

    def incarnation(self) -> tuple[str, str]:
        """``(epoch, run_id)`` (``pointsman.redis_epoch``): the store's epoch (created when missing) and the Redis
        process's ``run_id`` (new at every start; '' where ``INFO`` is refused). One round trip; for a slow timer,
        not per decision. Raises ``LedgerUnavailable``."""
        return incarnation_of(self._run(self._incarnation, [self.prefix]))

    def add_sums(self, uid: str, sums: Sequence[Sum], epoch: str, now: float | None = None) -> int:
        """Book a spend journal's ``sums`` (``SpendJournal.compact``) as their settlements' settles would have, in
        their windows (scopes' ``settled``, the target's usage), in one step, unless this store already counts the
        sums of the journal ``uid`` (``P a:<uid>``: then only its TTL, ``record_retention_s``, starts again; with no
        ``sums`` a call notes that the store counts them). ``epoch``: the store's epoch the caller judged by
        (``incarnation``); a store of another epoch (emptied since) is left as it is. Returns how many settlements
        were booked (0: already there). Raises ``LedgerUnavailable`` (for another epoch too)."""
        now = current_time(now)
        keep = self.config.record_retention_s + KEEP_AFTER_WINDOW_S
        args = self._head(now) + [uid, str(max(1, math.ceil(self.config.record_retention_s))), epoch]
        for s in sums:
            day, month = windows_at(s.at_s).values()
            args += ["\n".join(s.scopes), day.id, month.id, repr(day.end_s + keep), repr(month.end_s + keep),
                     s.target or "", str(s.cost_nusd), str(s.prompt_tokens), str(s.cached_tokens),
                     str(s.completion_tokens), str(s.settlements)]
        booked = int(cast(int, self._run(self._add_sums, args)))  # Lua returns an integer here
        if booked < 0:
            raise LedgerUnavailable(f"budget ledger (redis): its store is no longer epoch {epoch} (emptied since it was read)")
        return booked

    def set_config(self, config: BudgetConfig) -> None:
        """Use ``config`` from the next operation on (one reference swap; holds stay)."""
        self.config = config

    def purge(self, now: float | None = None) -> int:
        """Redis expires records by their TTL, so this only sweeps expired holds; returns 0."""
        self.snapshot((), now)
        return 0

    def close(self) -> None:
        """Close the client's connections."""
        self.client.close()

    def __repr__(self) -> str:
        return f"RedisLedger({self.client!r}, prefix={self.prefix!r})"
