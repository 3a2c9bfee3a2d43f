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
- ``OnPremWide(picker)``: any of the above over every on-prem replica that takes new
  requests, whatever its model (aggregated replicas, and prefill replicas in
  disaggregated mode): a difficulty-blind router that uses the whole on-prem fleet.

With ``mode="disaggregated"`` the picker chooses the prefill replica and the
decode replica is the least loaded one when the prefill ends.
"""

from __future__ import annotations

import random

from pointsman.datasets.traces import TraceRequest
from pointsman.replay.router import Assignment, FleetView, ReplicaView
from pointsman.replay.sim_fleet import AGGREGATED, DISAGGREGATED, ROLE_AGGREGATED, ROLE_PREFILL


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
        """Index into ``replicas`` (0-based) of the replica this request goes to."""
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
        """Index into ``replicas`` (0-based) of the replica this request goes to."""
        return self._rng.randrange(len(replicas))


class LeastLoaded(_Baseline):
    """Replica with the fewest ``num_requests_waiting + num_requests_running``; ties -> lowest index."""

    name = "least-loaded"

    def pick(self, request: TraceRequest, replicas: tuple[ReplicaView, ...]) -> int:
        """Index into ``replicas`` (0-based) of the replica this request goes to."""
        return min(range(len(replicas)), key=lambda i: _load(replicas[i]))


class CacheAware(_Baseline):
    """Replica with the most cached prefix tokens for the request; ties -> least loaded -> lowest index."""

    name = "cache-aware"

    def pick(self, request: TraceRequest, replicas: tuple[ReplicaView, ...]) -> int:
        """Index into ``replicas`` (0-based) of the replica this request goes to."""
        if not request.block_hashes:
            return min(range(len(replicas)), key=lambda i: _load(replicas[i]))
        return min(
            range(len(replicas)),
            key=lambda i: (-replicas[i].cached_prefix_tokens(request), _load(replicas[i])),
        )


class OnPremWide:
    """A baseline picker (``RoundRobin``, ``RandomPick``, ``LeastLoaded``, ``CacheAware``
    instance; its target is ignored) applied to every on-prem replica of the fleet that
    takes new requests: each target's aggregated replicas (aggregated mode) and prefill
    replicas (disaggregated mode, decode replica least loaded at prefill end), in fleet order;
    ``targets``: only these on-prem targets (default: all)."""

    def __init__(self, picker: _Baseline, targets: tuple[str, ...] | None = None) -> None:
        self.picker = picker
        self.targets = targets
        self.name = picker.name
        self._slots: list[tuple[str, str, int]] | None = None
        self._views: tuple[ReplicaView, ...] = ()

    def __call__(self, request: TraceRequest, fleet: FleetView) -> Assignment:
        if self._slots is None:
            slots, views = [], []
            for t in fleet.fleet.on_prem:
                if self.targets is not None and t.name not in self.targets:
                    continue
                for role, mode in ((ROLE_AGGREGATED, AGGREGATED), (ROLE_PREFILL, DISAGGREGATED)):
                    for i, v in enumerate(fleet.replicas(t.name, role)):
                        slots.append((t.name, mode, i))
                        views.append(v)
            if not slots:
                raise ValueError("OnPremWide: the fleet has no on-prem replicas")
            self._slots, self._views = slots, tuple(views)
        target, mode, i = self._slots[self.picker.pick(request, self._views)]
        return Assignment(target, mode, i)

    def __repr__(self) -> str:
        return f"OnPremWide({self.picker!r})"


BASELINES = {cls.name: cls for cls in (RoundRobin, RandomPick, LeastLoaded, CacheAware)}
"""Baseline router classes by name: round-robin, random, least-loaded, cache-aware."""
