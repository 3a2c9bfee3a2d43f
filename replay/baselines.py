"""Baseline routers for replay: fixed target, with a classic replica picker and no difficulty signal.

Each baseline is a small callable ``router(request, fleet_view) -> Assignment``
(see ``pointsman.replay.simulator.Router``) bound to one target:

- ``RoundRobin``: replicas in turn.
- ``RandomPick``: uniformly random replica, from its own seeded RNG.
- ``LeastLoaded``: fewest requests waiting + running; ties to the lowest index.
- ``CacheAware``: longest cached prefix for this request; ties to the least loaded,
  then the lowest index. No load guard: a hot prefix piles onto one replica (the
  known weakness of pure prefix affinity).
- all-on-prem = any of the above on an on-prem target; all-frontier =
  ``RoundRobin("frontier-large")`` (frontier targets ignore the replica).

With ``mode="disaggregated"`` the picker chooses the prefill replica and the
decode replica is the least loaded one when the prefill ends.
"""

from __future__ import annotations

import random

from pointsman.datasets.traces import TraceRequest
from pointsman.replay.fleet import AGGREGATED, DISAGGREGATED, ROLE_AGGREGATED, ROLE_PREFILL
from pointsman.replay.simulator import Assignment, FleetView, ReplicaView


class _Baseline:
    """Shared plumbing: target, mode, and the pool the picker looks at."""

    name = "baseline"

    def __init__(self, target: str, mode: str = AGGREGATED) -> None:
        if mode not in (AGGREGATED, DISAGGREGATED):
            raise ValueError(f"mode must be 'aggregated' or 'disaggregated', got {mode!r}")
        self.target = target
        self.mode = mode
        self._role = ROLE_PREFILL if mode == DISAGGREGATED else ROLE_AGGREGATED

    def __call__(self, request: TraceRequest, fleet: FleetView) -> Assignment:
        replicas = fleet.replicas(self.target, self._role)
        if not replicas:  # frontier target (or no such pool: the simulator reports it)
            return Assignment(self.target, self.mode)
        return Assignment(self.target, self.mode, self.pick(request, replicas))

    def pick(self, request: TraceRequest, replicas: tuple[ReplicaView, ...]) -> int:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.target!r}, mode={self.mode!r})"


def _load(r: ReplicaView) -> int:
    return r.num_requests_waiting + r.num_requests_running


class RoundRobin(_Baseline):
    """Replica ``i mod n`` for the i-th request routed (0-based)."""

    name = "round-robin"

    def __init__(self, target: str, mode: str = AGGREGATED) -> None:
        super().__init__(target, mode)
        self._next = 0

    def pick(self, request: TraceRequest, replicas: tuple[ReplicaView, ...]) -> int:
        i = self._next % len(replicas)
        self._next += 1
        return i


class RandomPick(_Baseline):
    """Uniform random replica from ``random.Random(seed)``: same seed, same picks."""

    name = "random"

    def __init__(self, target: str, mode: str = AGGREGATED, *, seed: int = 0) -> None:
        super().__init__(target, mode)
        self._rng = random.Random(seed)

    def pick(self, request: TraceRequest, replicas: tuple[ReplicaView, ...]) -> int:
        return self._rng.randrange(len(replicas))


class LeastLoaded(_Baseline):
    """Replica with the fewest ``num_requests_waiting + num_requests_running``; ties -> lowest index."""

    name = "least-loaded"

    def pick(self, request: TraceRequest, replicas: tuple[ReplicaView, ...]) -> int:
        return min(range(len(replicas)), key=lambda i: _load(replicas[i]))


class CacheAware(_Baseline):
    """Replica with the most cached prefix tokens for the request; ties -> least loaded -> lowest index."""

    name = "cache-aware"

    def pick(self, request: TraceRequest, replicas: tuple[ReplicaView, ...]) -> int:
        if not request.block_hashes:
            return min(range(len(replicas)), key=lambda i: _load(replicas[i]))
        return min(
            range(len(replicas)),
            key=lambda i: (-replicas[i].cached_prefix_tokens(request), _load(replicas[i])),
        )


BASELINES = {cls.name: cls for cls in (RoundRobin, RandomPick, LeastLoaded, CacheAware)}
"""Baseline router classes by name: round-robin, random, least-loaded, cache-aware."""
