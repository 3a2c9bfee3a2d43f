"""The simulator's state of one fleet, and what a router sees of it.

``simulator._Simulator`` (the event loop and vLLM V1's step scheduler) moves these: ``SimJob`` (one
request and its progress on the replica it is on), ``SimReplica`` (one engine replica: its running and
waiting requests, KV pages, prefix cache, P/D link), ``SimTarget`` (an on-prem target's pools and its
shared KV tier), ``SimChannel`` (a link or a tier's restore path shared by every transfer on it:
processor sharing). Routers read them only through ``SimReplicaView`` and ``SimFleetView``
(``router.ReplicaView``, ``router.FleetView``). The serving model is described in ``simulator.py``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Protocol

from pointsman.datasets.traces import TraceRequest
from pointsman.replay.kvcache import PrefixCache, SharedKVStore
from pointsman.replay.results import RequestResult
from pointsman.replay.sim_fleet import AGGREGATED, ROLE_AGGREGATED, ROLE_DECODE, ROLE_PREFILL, OnPremTarget, SimFleet


class _SimulatorState(Protocol):
    """What ``SimFleetView`` reads of the running simulator (``simulator._Simulator``)."""

    targets: dict[str, SimTarget]

    def frontier_cached_blocks(self, target: str, hashes: Sequence[int], now: float) -> int:
        """Leading ``hashes`` in frontier tier ``target``'s prompt cache at ``now``."""
        ...

#: A replica's state: idle, running one engine step, or in a closed-form pure-decode stretch (an epoch).
IDLE, STEP, EPOCH = 0, 1, 2
#: Event kinds of the simulator's queue.
EV_REPLICA, EV_TRANSFER, EV_FINISH, EV_CHANNEL, EV_RESTORE, EV_ARRIVAL, EV_WAKE = 0, 1, 2, 3, 4, 5, 6
#: Bytes below which a shared-channel transfer counts as done (float rounding).
EPS_BYTES = 1e-3


class SimJob:
    """One request in the simulator. Per-replica progress (``n_tokens``, ``n_computed``,
    ``alloc_n``) refers to the replica the request is on now; ``held_n`` is what a prefill
    replica keeps pinned while the KV moves to the decode replica."""

    __slots__ = (
        "index", "req", "arrival_s", "routed", "target", "mode", "rep", "drep", "drep_index",
        "hashes", "n_prompt_blocks", "pinned_k", "n_tokens", "n_computed", "alloc_n", "held_n", "generated",
        "d_n0", "d_s0", "d_end", "ver", "decoding",
        "start_s", "first_s", "finish_s", "hit_tokens", "restored_tokens", "transfer_s", "spilled", "rejected",
        "cost_usd", "frontier", "result", "looked_up", "at",
    )  # fmt: skip

    def __init__(self, index: int, req: TraceRequest, routed: str | None) -> None:
        self.index = index
        self.req = req
        self.arrival_s = req.arrival_s
        self.routed = routed
        self.target = routed
        self.mode = AGGREGATED
        self.rep: SimReplica | None = None  # on-prem: the (prefill) replica; None on a frontier tier
        self.drep: SimReplica | None = None  # disaggregated: the decode replica, once chosen
        self.drep_index: int | None = None
        self.at: SimReplica | None = None  # the replica the request is on now (decode replica after a transfer)
        self.hashes: Sequence[int] = ()  # ids of the full blocks of the request's context (see _place)
        self.n_prompt_blocks = 0  # of which the first ones are the trace's prompt blocks
        self.pinned_k = 0  # hashed blocks this request holds pinned on its replica
        self.n_tokens = req.prompt_tokens  # tokens whose KV the replica must hold before the next sample
        self.n_computed = 0  # of those, computed on this replica
        self.alloc_n = 0  # tokens this replica has allocated pages for
        self.held_n = 0  # P/D: tokens still pinned on the prefill replica during the transfer
        self.generated = 0  # output tokens sampled so far
        self.looked_up = False
        self.d_n0 = 0  # decoding: n_computed at step d_s0 of its replica; finishes at step d_end
        self.d_s0 = 0
        self.d_end = 0
        self.ver = 0  # invalidates stale completion-heap entries
        self.decoding = False
        self.start_s: float | None = None
        self.first_s: float | None = None
        self.finish_s: float | None = None
        self.hit_tokens = 0
        self.restored_tokens = 0
        self.transfer_s = 0.0
        self.spilled = False
        self.rejected: str | None = None
        self.cost_usd = 0.0
        self.frontier = False
        self.result: RequestResult | None = None

    def on_prem(self) -> SimReplica:
        """The replica the job was queued on (a simulator bug when it has none)."""
        if self.rep is None:
            raise RuntimeError(f"simulator bug: request {self.index} has no replica")
        return self.rep


class SimChannel:
    """A bandwidth shared equally by the transfers in flight (processor sharing): a prefill
    replica's link, or a target's shared-tier restore path. Each transfer pays ``latency_s``
    once its bytes are through; ``done_kind`` is the event kind fired then."""

    __slots__ = ("bytes_per_s", "latency_s", "done_kind", "active", "t", "token")

    def __init__(self, bytes_per_s: float, latency_s: float, done_kind: int) -> None:
        self.bytes_per_s = bytes_per_s
        self.latency_s = latency_s
        self.done_kind = done_kind
        self.active: dict[SimJob, float] = {}  # job -> bytes left, in start order
        self.t = 0.0  # time the byte counts were last advanced to
        self.token = 0

    def advance(self, now: float) -> None:
        """Move every active transfer's bytes forward to ``now`` at the equal share."""
        if self.active and now > self.t:
            sent = (now - self.t) * self.bytes_per_s / len(self.active)
            for job in self.active:
                self.active[job] -= sent
        self.t = now

    def next_done(self) -> float:
        """Time at which the transfer with the fewest bytes left finishes its bytes."""
        left = min(self.active.values())
        return self.t + max(0.0, left) * len(self.active) / self.bytes_per_s


class SimTarget:
    __slots__ = ("spec", "pools", "tier", "tier_channel", "prefill_bins", "decode_bins")

    def __init__(self, spec: OnPremTarget) -> None:
        self.spec = spec
        shared = spec.shared_kv
        self.tier = SharedKVStore(shared.capacity_blocks) if shared else None
        self.tier_channel = SimChannel(shared.restore_bytes_per_s, shared.latency_s, EV_RESTORE) if shared else None
        self.prefill_bins: list[float] = []
        self.decode_bins: list[float] = []
        self.pools = {
            role: [SimReplica(self, role, i) for i in range(spec.pool_size(role))]
            for role in (ROLE_AGGREGATED, ROLE_PREFILL, ROLE_DECODE)
        }


class SimReplica:
    __slots__ = (
        "tgt", "target", "role", "index", "spec", "cache", "bt", "pg", "ppb", "link", "wake", "reserve",
        "waiting", "running", "partials", "pending", "joining", "inbound", "loading", "held",
        "ndec", "kv_dec", "res", "ends", "state", "token", "steps",
        "plan", "plan_dec", "t0", "t_end", "pfrac", "c", "half", "k",
        "busy_prefill_s", "busy_decode_s", "work_s", "prefill_tokens", "restored_tokens", "preemptions",
    )  # fmt: skip

    def __init__(self, tgt: SimTarget, role: str, index: int) -> None:
        self.tgt = tgt
        self.target = tgt.spec.name
        self.role = role
        self.index = index
        spec = self.spec = tgt.spec.spec_for(role)
        self.bt = spec.block_tokens
        self.pg = spec.kv_block_tokens
        self.ppb = spec.block_tokens // spec.kv_block_tokens
        self.reserve = spec.kv_admission == "reserve"  # TensorRT-LLM GUARANTEED_NO_EVICT: all KV at admission
        self.cache = PrefixCache(spec.kv_pages, self.ppb)
        link = tgt.spec.link
        self.link = SimChannel(link.bytes_per_s, link.latency_s, EV_TRANSFER) if role == ROLE_PREFILL else None
        self.waiting: deque[SimJob] = deque()  # queued for (re)prefill, FCFS; preempted ones at the head
        self.running: dict[SimJob, None] = {}  # admission order (the last is preempted first)
        self.partials: dict[SimJob, None] = {}  # running requests still prefilling (a suffix of running)
        self.pending: deque[SimJob] = deque()  # decode role: prefilled, waiting for KV room here
        self.joining: deque[SimJob] = deque()  # decode role: transferred, admitted at the next step
        self.inbound = 0  # decode role: transfers in flight to this replica
        self.loading = 0  # restores from the shared tier in flight for this replica
        self.held = 0  # prefill role: finished prefills whose KV is still being sent
        self.ndec = 0  # decoding sequences
        self.kv_dec = 0  # their context tokens read by the next step: sum of (n_computed + 1)
        self.res = [0] * spec.kv_block_tokens  # decoders by the step residue at which they need a page
        self.ends: list[tuple[int, int, int, SimJob]] = []  # heap (finish step, seq, version, job)
        self.state = IDLE
        self.wake = False  # a wake-up is scheduled
        self.token = 0  # invalidates stale step events
        self.steps = 0  # steps run so far
        self.plan: list[tuple[SimJob, int]] = []  # the step in flight: prefill chunks (job, tokens)
        self.plan_dec = 0  # decoders in the step in flight
        self.t0 = 0.0  # start of the step / epoch in flight, its planned end and prefill share
        self.t_end = 0.0
        self.pfrac = 0.0
        self.c = 0.0  # decode epoch: first-step time, growth half = pk*b/2, planned steps k
        self.half = 0.0
        self.k = 0
        self.busy_prefill_s = 0.0
        self.busy_decode_s = 0.0
        self.work_s = 0.0  # the token-proportional part of the busy time (ReplicaSpec.work_s)
        self.prefill_tokens = 0
        self.restored_tokens = 0
        self.preemptions = 0

    def load(self) -> int:
        return (len(self.waiting) + len(self.pending) + len(self.running) + len(self.joining) + self.inbound
                + self.loading)

    def seqs(self) -> int:
        """Sequences counting against ``max_num_seqs``: running, joining, inbound and loading."""
        return len(self.running) + len(self.joining) + self.inbound + self.loading

    # ---- KV pages of one request

    def pinned(self, job: SimJob, n: int) -> int:
        """Full hashed blocks a request holding ``n`` tokens pins."""
        return min(len(job.hashes), n // self.bt)

    def private(self, job: SimJob, n: int) -> int:
        """Private pages of a request holding ``n`` tokens (the tokens past its pinned blocks)."""
        return -(-(n - self.pinned(job, n) * self.bt) // self.pg)

    def pages(self, job: SimJob, n: int) -> int:
        """Pages a request holding ``n`` tokens needs (without sharing)."""
        return self.pinned(job, n) * self.ppb + self.private(job, n)

    def grow(self, job: SimJob, n: int, *, dry: bool = False, reserve: int = 0) -> bool:
        """Allocate pages for ``job`` to hold ``n`` tokens (from ``job.alloc_n``), leaving
        ``reserve`` pages free; ``dry``: only say whether it would fit. Under ``kv_admission
        = "reserve"`` the first allocation takes the request's whole prompt + output."""
        a = job.alloc_n
        if self.reserve:
            n = max(n, job.req.prompt_tokens + job.req.output_tokens)
        k = self.pinned(job, n)
        new = job.hashes[self.pinned(job, a):k]
        delta = self.private(job, n) - self.private(job, a)
        if dry or reserve:
            if not self.cache.can_grow(new, delta + reserve):
                return False
            if dry:
                return True
        if not self.cache.grow(new, delta):
            return False
        job.alloc_n = n
        job.pinned_k = k
        return True

    def free(self, job: SimJob, n: int, pinned_k: int) -> None:
        """Release the pages of ``job`` holding ``n`` tokens, ``pinned_k`` of its blocks pinned as
        hashed ones: the full blocks it filled as private pages since (a decoder's output) are
        cached first, so they stay resident and evictable like the rest (vLLM caches every full block)."""
        k = self.pinned(job, n)
        if k > pinned_k:
            new = job.hashes[pinned_k:k]
            if not self.cache.grow(new, -len(new) * self.ppb):
                raise RuntimeError(f"simulator bug: request {job.index} could not cache its full blocks")
        self.cache.release(job.hashes[:k], self.private(job, n))

    # ---- decoders (advance one token per step, tracked in aggregate)

    def dec_n(self, job: SimJob) -> int:
        """Tokens computed now by a decoding ``job``."""
        return job.d_n0 + self.steps - job.d_s0

    def crossings(self, k: int) -> int:
        """Pages the decoders need over the next ``k`` steps (page boundaries crossed)."""
        if k <= 0 or not self.ndec or self.reserve:
            return 0
        pg, s = self.pg, self.steps
        total = 0
        for r, count in enumerate(self.res):
            if count:
                total += count * ((s + k - 1 - r) // pg - (s - 1 - r) // pg)
        return total


def add_busy(bins: list[float], start: float, end: float, origin: float, width: float, gpus: int) -> None:
    """Add the interval [start, end) (seconds) of a replica of ``gpus`` GPUs to per-bin busy
    GPU-seconds (bins of ``width`` seconds from ``origin``)."""
    if end <= start:
        return
    b = int((start - origin) // width)
    last = int((end - origin) // width)
    if last >= len(bins):
        bins.extend([0.0] * (last + 1 - len(bins)))
    if b == last:
        bins[b] += (end - start) * gpus
        return
    edge = origin + (b + 1) * width
    bins[b] += (edge - start) * gpus
    for i in range(b + 1, last):
        bins[i] += width * gpus
    bins[last] += (end - (origin + last * width)) * gpus


class SimReplicaView:
    """``router.ReplicaView`` of one simulated replica, as a router sees it at decision time.

    Names follow vLLM's metrics: ``num_requests_waiting`` (queued for prefill, loading from
    the shared tier, or waiting for KV room on a decode replica), ``num_requests_running``
    (prefilling, decoding, or KV in transit to it), ``kv_cache_usage`` (fraction 0-1 of KV
    pages pinned by requests).
    """

    __slots__ = ("_r",)

    def __init__(self, replica: SimReplica) -> None:
        self._r = replica

    @property
    def target(self) -> str:
        """Name of the on-prem target this replica belongs to."""
        return self._r.target

    @property
    def role(self) -> str:
        """``aggregated``, ``prefill`` or ``decode``."""
        return self._r.role

    @property
    def index(self) -> int:
        """Index of the replica in its pool (what ``Assignment.replica`` refers to)."""
        return self._r.index

    @property
    def num_requests_waiting(self) -> int:
        """Requests queued for prefill here, loading from the shared tier, or prefilled and
        waiting for KV room (decode pool)."""
        r = self._r
        return len(r.waiting) + len(r.pending) + r.loading

    @property
    def num_requests_running(self) -> int:
        """Requests prefilling, decoding, or with KV in transit to this replica."""
        r = self._r
        return len(r.running) + len(r.joining) + r.inbound

    @property
    def kv_cache_usage(self) -> float:
        """Fraction 0-1 of this replica's KV pages pinned by requests."""
        return self._r.cache.usage

    def cached_prefix_tokens(self, request: TraceRequest) -> int:
        """Tokens of ``request``'s prompt whose leading blocks are resident here (0 without hashes)."""
        hashes = request.block_hashes
        if not hashes:
            return 0
        blocks = self._r.cache.cached_prefix_blocks(hashes)
        return min(blocks * self._r.spec.block_tokens, request.prompt_tokens)

    def cached_prefix_blocks(self, block_hashes: Sequence[int]) -> int:
        """Leading ``block_hashes`` resident in this replica's KV cache (no state change)."""
        return self._r.cache.cached_prefix_blocks(block_hashes)

    @property
    def cached_blocks(self) -> int:
        """Hashed prompt blocks resident here (pinned or evictable): the size of a KV-event index."""
        return self._r.cache.cached_blocks

    @property
    def kv_capacity_tokens(self) -> int:
        """KV capacity of this replica in tokens."""
        return self._r.spec.kv_capacity_tokens

    @property
    def waiting_prompt_tokens(self) -> int:
        """Prompt tokens not yet prefilled here: queued requests' and the rest of partially
        prefilled ones (O(queue length))."""
        r = self._r
        return (sum(j.n_tokens - j.n_computed for j in r.waiting)
                + sum(j.n_tokens - j.n_computed for j in r.partials))

    def busy_s(self, now_s: float) -> tuple[float, float]:
        """(prefill, decode) busy seconds of this replica from the start of the replay up to
        ``now_s`` (the simulator's current time), the step in progress counted up to now."""
        r = self._r
        prefill, decode = r.busy_prefill_s, r.busy_decode_s
        if r.state == STEP:
            left = max(0.0, r.t_end - now_s)
            prefill -= left * r.pfrac
            decode -= left * (1.0 - r.pfrac)
        elif r.state == EPOCH:
            decode += max(0.0, now_s - r.t0)
        return prefill, decode


class SimFleetView:
    """``router.FleetView``: read-only fleet state handed to the router: the clock and every replica's view.

    ``replicas(target, role)`` -> tuple of ``ReplicaView`` (empty for a frontier
    target or a pool the target does not have); ``is_frontier(target)``;
    ``target_names``; ``fleet`` is the ``SimFleet`` spec; ``request_index``: position in
    the trace of the request being routed; ``frontier_cached_blocks(target, hashes)``: leading
    blocks of a prompt in a frontier tier's prompt cache.
    """

    __slots__ = ("now_s", "fleet", "_views", "_frontier", "target_names", "request_index", "_sim")

    def __init__(self, fleet: SimFleet, views: dict[tuple[str, str], tuple[SimReplicaView, ...]],
                 sim: _SimulatorState | None = None) -> None:
        self.now_s = 0.0
        self.fleet = fleet
        self._views = views
        self._frontier = frozenset(f.name for f in fleet.frontier)
        self.target_names = tuple(fleet.target_names)
        self.request_index = -1
        self._sim = sim

    def frontier_cached_blocks(self, target: str, block_hashes: Sequence[int]) -> int:
        """Leading ``block_hashes`` the frontier tier ``target`` holds in its prompt cache now (0 if none)."""
        if self._sim is None or not block_hashes:
            return 0
        return self._sim.frontier_cached_blocks(target, block_hashes, self.now_s)

    def shared_tier_blocks(self, target: str) -> SharedKVStore | None:
        """The on-prem ``target``'s shared KV tier content (``kvcache.SharedKVStore``), or None."""
        if self._sim is None or target not in self._sim.targets:
            return None
        return self._sim.targets[target].tier

    def replicas(self, target: str, role: str = ROLE_AGGREGATED) -> tuple[SimReplicaView, ...]:
        """Views of the replicas in ``target``'s ``role`` pool, by index; () if none."""
        return self._views.get((target, role), ())

    def is_frontier(self, target: str) -> bool:
        """True if ``target`` names a frontier API tier of the fleet."""
        return target in self._frontier
