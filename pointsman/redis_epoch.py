"""Which incarnation of a Redis store a client talks to, for what keeps copies of writes Redis may lose.

Two things tell it: ``P epoch`` (``P`` a key prefix), Redis ``TIME`` as ``"<s>.<us>"`` when a script that starts
with ``EPOCH_LUA`` found it missing (no TTL), and Redis's ``run_id`` (``INFO server``, new at every start of
redis-server). Every script that writes what a replica keeps a copy of (a ledger's counters, an inbox entry)
creates the epoch before anything else, so all of that was written after the current epoch was created, and a
new epoch means everything written after the old one was created is gone (``FLUSHALL``, a new volume, a Redis
without persistence restarted). A new ``run_id`` means Redis restarted on its files, which may end before what it
acknowledged (the tail an ``appendfsync everysec`` file had not ``fsync``ed when the machine died). A Redis that
refuses ``INFO`` (a managed service that disables or renames it) gives ``run_id`` '' every time, so such a restart
goes unnoticed: the budget ledger's settlements in the lost tail are not booked again (its budgets read that much
low until their windows end), and forwarded outcomes it lost are not sent again as lost, only once left
unconfirmed (``runtime.FORWARD_CONFIRM_S``, minutes later); a new epoch (an emptied store) is still noticed. Keep
``maxmemory-policy noeviction`` (an evicted epoch reads as a lost store) and never delete the epoch alone. Users:
the Redis budget ledger (``FleetState.restore_spend``) and the shared state's forwarded outcomes
(``RedisSync.forward``).
"""

from __future__ import annotations

#: Head of a Lua script (``ARGV[1]`` the prefix, as the local ``P``): creates ``P epoch`` when missing.
EPOCH_LUA = """
local P = ARGV[1]
if redis.call('EXISTS', P .. 'epoch') == 0 then
  local t = redis.call('TIME')
  redis.call('SET', P .. 'epoch', t[1] .. '.' .. t[2])
end
"""
#: Tail of a script that began with ``EPOCH_LUA``: returns ``{epoch, run_id}`` (run_id '' where ``INFO`` is refused).
INCARNATION_RETURN_LUA = """
local info = redis.pcall('INFO', 'server')
local run_id = type(info) == 'string' and string.match(info, 'run_id:(%w+)') or ''
return {redis.call('GET', P .. 'epoch'), run_id}
"""
#: A whole script: the incarnation (``EPOCH_LUA`` and ``INCARNATION_RETURN_LUA``), one round trip.
INCARNATION_LUA = EPOCH_LUA + INCARNATION_RETURN_LUA


def incarnation_of(reply: object) -> tuple[str, str]:
    """``(epoch, run_id)`` from the reply of a script ending with ``INCARNATION_RETURN_LUA``; raises ``ValueError``
    for anything else."""
    if not isinstance(reply, list) or len(reply) != 2:
        raise ValueError(f"not an incarnation reply: {reply!r}")
    return str(reply[0]), str(reply[1])


__all__ = ["EPOCH_LUA", "INCARNATION_LUA", "INCARNATION_RETURN_LUA", "incarnation_of"]
