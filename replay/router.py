"""The router interface of the simulator: what a router sees at a request's arrival
(``FleetView`` of ``ReplicaView``s, Protocols the simulator implements) and what it
answers (``Assignment``); ``ObservingRouter``: a router that also hears first tokens and
completions (as a gateway sees them). Routers (``baselines``, ``engine_router``) import only this.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from pointsman.datasets.traces import TraceRequest
from pointsman.replay.kvcache import SharedKVStore
from pointsman.replay.results import RequestResult
from pointsman.replay.sim_fleet import (
    AGGREGATED,
    ROLE_AGGREGATED,
    SimFleet,
)


@dataclass(frozen=True, slots=True)
class Assignment:
    """A router's answer for one request.

    ``target``: a target name of the fleet, or ``None`` when the router rejects the request
    (``rejected`` says why; see ``Assignment.reject``). ``mode``: ``"aggregated"`` or
    ``"disaggregated"`` (on-prem only). ``replica``: index in the aggregated pool (or the
    prefill pool when disaggregated); ``None`` = the least-loaded one. ``replica_pool``:
    in aggregated mode, the pool ``replica`` indexes: ``None`` (the aggregated pool) or
    ``"decode"`` (prefill locally on that decode replica). ``decode_replica``: index in the
    decode pool; ``None`` = least loaded when the prefill ends. Replica fields are ignored
    for frontier targets. ``fallbacks``: assignments tried in order when admission control
    refuses this one (before the fleet's spill target). ``output_tokens``: on an on-prem placement
    of this assignment (not its fallbacks), the answer stops after this many tokens (a draft an
    early verification cancelled, ``replay.cascade``); None = the request's own length.
    """

    target: str | None
    mode: str = AGGREGATED
    replica: int | None = None
    decode_replica: int | None = None
    replica_pool: str | None = None
    fallbacks: tuple[Assignment, ...] = ()
    rejected: str | None = None
    output_tokens: int | None = None

    @staticmethod
    def reject(reason: str) -> Assignment:
        """The router refuses the request (e.g. ``no_eligible_target``): it is rejected with ``reason``."""
        return Assignment(None, rejected=reason)


class ReplicaView(Protocol):
    """Read-only view of one simulated replica, as a router sees it at decision time.

    Names follow vLLM's metrics: ``num_requests_waiting`` (queued for prefill, or
    waiting for KV room on a decode replica), ``num_requests_running`` (prefilling,
    decoding, or KV in transit to it), ``kv_cache_usage`` (fraction 0-1 of KV blocks
    pinned by requests). The simulator's ``SimReplicaView`` implements it.
    """

    @property
    def target(self) -> str:
        """Name of the on-prem target this replica belongs to."""
        ...

    @property
    def role(self) -> str:
        """``aggregated``, ``prefill`` or ``decode``."""
        ...

    @property
    def index(self) -> int:
        """Index of the replica in its pool (what ``Assignment.replica`` refers to)."""
        ...

    @property
    def num_requests_waiting(self) -> int:
        """Requests queued for prefill here, or prefilled and waiting for KV room (decode pool)."""
        ...

    @property
    def num_requests_running(self) -> int:
        """Requests prefilling, decoding, or with KV in transit to this replica."""
        ...

    @property
    def kv_cache_usage(self) -> float:
        """Fraction 0-1 of this replica's KV blocks pinned by requests."""
        ...

    @property
    def kv_capacity_tokens(self) -> int:
        """KV capacity of this replica in tokens."""
        ...

    @property
    def waiting_prompt_tokens(self) -> int:
        """Prompt tokens of the requests queued here for prefill."""
        ...

    def cached_prefix_tokens(self, request: TraceRequest) -> int:
        """Tokens of ``request``'s prompt whose leading blocks are resident here (0 without hashes)."""
        ...

    def cached_prefix_blocks(self, block_hashes: Sequence[int]) -> int:
        """Leading ``block_hashes`` resident in this replica's KV cache (no state change)."""
        ...

    @property
    def cached_blocks(self) -> int:
        """Hashed prompt blocks resident here (pinned or evictable): the size of a KV-event index."""
        ...

    def busy_s(self, now_s: float) -> tuple[float, float]:
        """(prefill, decode) busy seconds of this replica from the start of the replay up to ``now_s``."""
        ...


class FleetView(Protocol):
    """Read-only fleet state handed to the router: the clock (``now_s``), the ``SimFleet`` spec
    (``fleet``), ``target_names``, ``request_index`` (position in the trace of the request being
    routed) and every replica's view. The simulator's ``SimFleetView`` implements it."""

    now_s: float
    fleet: SimFleet
    target_names: tuple[str, ...]
    request_index: int

    def frontier_cached_blocks(self, target: str, block_hashes: Sequence[int]) -> int:
        """Leading ``block_hashes`` the frontier tier ``target`` holds in its prompt cache now (0 if none)."""
        ...

    def shared_tier_blocks(self, target: str) -> SharedKVStore | None:
        """The on-prem ``target``'s shared KV tier content, or None."""
        ...

    def replicas(self, target: str, role: str = ROLE_AGGREGATED) -> tuple[ReplicaView, ...]:
        """Views of the replicas in ``target``'s ``role`` pool, by index; () if none."""
        ...

    def is_frontier(self, target: str) -> bool:
        """True if ``target`` names a frontier API tier of the fleet."""
        ...


class Router(Protocol):
    """``router(request, fleet_view) -> Assignment``, called once per request at its arrival
    (positional arguments: implementations name them as they like)."""

    def __call__(self, request: TraceRequest, fleet: FleetView, /) -> Assignment: ...


@runtime_checkable
class ObservingRouter(Router, Protocol):
    """A ``Router`` that also hears what a gateway hears: ``on_first_token(index, time_s)`` when
    an on-prem request's first token is sampled, ``on_complete(result)`` when a request
    completes (or is rejected). The simulator calls both in simulated time."""

    def on_first_token(self, index: int, time_s: float, /) -> None: ...

    def on_complete(self, result: RequestResult, /) -> None: ...
