"""Discrete-event fleet simulator: replays a trace through a router against a ``SimFleet``.

``simulate(trace, fleet, router, seed=...)`` returns a ``ReplayResult`` with one
``RequestResult`` per trace request (in trace order) and busy time per replica.
Deterministic: the same trace, fleet, router and seed give identical results
(events at equal times run in the order they were scheduled; frontier latencies
come from one seeded RNG per tier).

Serving model of one replica (vLLM-v0-like, kept simple on purpose):

- **Prefill runs to completion, one request at a time, FCFS, with priority over
  decode**: when the replica is free and the head of its waiting queue fits (KV
  blocks via ``PrefixCache.acquire``, and a free batch slot), it prefills that
  request alone; otherwise it runs decode steps. The prefix hit is looked up when
  the prefill starts, and at least one prompt token is always computed. The prefill
  emits the first token: TTFT = prefill end - arrival.
- **Decode is continuous batching**: each step produces one token for every
  running sequence and takes ``ReplicaSpec.decode_step_s(batch, kv_tokens)``,
  where a sequence's context is prompt + tokens generated so far. A sequence that
  joins after prefill needs ``output_tokens - 1`` steps. Steps are simulated in
  closed form between batch changes: the replica jumps to the step that completes
  the next sequence, and an arriving prefill or a sequence joining the batch
  interrupts it at the next step boundary (the step in flight always completes).
- **KV**: a request pins its prompt's hashed blocks plus private blocks for the rest
  of prompt + output (reserved up front: no preemption is modelled). Requests that
  can never fit (or exceed ``max_model_len``) are refused at arrival.
- **P/D disaggregation**: the prefill replica computes the prompt and the first
  token, then the request waits for KV room and a batch slot on its decode replica;
  the KV of the prompt blocks not already cached there moves over the target's link
  (``LinkSpec.transfer_s``; links are not contended); the prefill replica keeps
  its pins until the transfer ends; the sequence joins the decode batch at the next
  step boundary. The decode replica is the router's, or the least loaded one when
  the prefill ends.
- **Shared KV tier** (optional per target): prompts are written through after
  prefill; a prefill may restore the next leading blocks from the tier when
  restore time + the remaining prefill beats recomputing them (the restore is
  counted as prefill time).
- **Local prefill on a decode replica**: an aggregated assignment may name a replica of
  the decode pool (``Assignment.replica_pool="decode"``: the replica holding the prompt's
  prefix prefills it itself, as the policy engine decides for warm prompts); it queues,
  prefills and decodes there like an aggregated request.
- **Frontier tiers** have no queue: TTFT and TPOT are drawn per request. The provider's
  prompt cache (``FrontierSpec``) holds block hashes used within ``prompt_cache_ttl_s``;
  cached leading blocks of prompts of at least ``prompt_cache_min_tokens`` bill at the
  cached-input price (``prefix_hit_tokens`` of a frontier request).
- **Admission control**: a request routed to a replica whose waiting queue is at
  the target's ``max_waiting``, or that is too long for it, goes to the assignment's
  ``fallbacks`` in order, then to the fleet's ``spill_target`` (``spilled=True`` once it
  runs anywhere but where it was routed), or is rejected with a reason. A frontier tier
  refuses requests longer than its ``max_model_len`` (``context_length``). A router may
  also reject a request itself (``Assignment.reject(reason)``).
- **Completion callback**: ``simulate(..., on_complete=f)`` calls ``f(result)`` with the
  request's ``RequestResult`` at the simulated time it completes (a rejection: at its
  arrival), before any later arrival is routed, so a router can learn from outcomes
  (the policy engine settles its budget reservations this way).
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Callable, Sequence
from heapq import heappop, heappush
from typing import TypeAlias

from pointsman.datasets.traces import TraceRequest
from pointsman.replay.hardware import FrontierSpec
from pointsman.replay.kvcache import PrefixCache, PromptCache, SharedKVStore
from pointsman.replay.results import ReplayResult, ReplicaStats, RequestResult
from pointsman.replay.router import Assignment, Router
from pointsman.replay.sim_fleet import (
    AGGREGATED,
    DISAGGREGATED,
    ROLE_AGGREGATED,
    ROLE_DECODE,
    ROLE_PREFILL,
    OnPremTarget,
    SimFleet,
)

# --------------------------------------------------------------------------- simulator internals

_IDLE, _PREFILL, _DECODE = 0, 1, 2
_EV_REPLICA, _EV_TRANSFER, _EV_FINISH = 0, 1, 2


class _Job:
    __slots__ = (
        "index", "req", "arrival_s", "routed", "target", "mode", "rep", "drep", "drep_index",
        "hashes", "priv", "dpriv", "start_s", "first_s", "finish_s", "hit_tokens",
        "restored_tokens", "transfer_s", "spilled", "rejected", "cost_usd", "frontier", "result",
    )  # fmt: skip

    def __init__(self, index: int, req: TraceRequest, routed: str | None) -> None:
        self.index = index
        self.req = req
        self.arrival_s = req.arrival_s
        self.routed = routed
        self.target = routed
        self.mode = AGGREGATED
        self.rep: _Replica | None = None  # on-prem: the (prefill) replica; None on a frontier tier
        self.drep: _Replica | None = None  # disaggregated: the decode replica, once chosen
        self.drep_index: int | None = None
        self.hashes: Sequence[int] = ()
        self.priv = 0
        self.dpriv = 0
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

    def on_prem(self) -> _Replica:
        """The replica the job was queued on (a simulator bug when it has none)."""
        if self.rep is None:
            raise RuntimeError(f"simulator bug: request {self.index} has no replica")
        return self.rep


class _Target:
    __slots__ = ("spec", "pools", "tier", "prefill_bins", "decode_bins")

    def __init__(self, spec: OnPremTarget) -> None:
        self.spec = spec
        self.tier = SharedKVStore(spec.shared_kv.capacity_blocks) if spec.shared_kv else None
        self.prefill_bins: list[float] = []
        self.decode_bins: list[float] = []
        self.pools = {
            role: [_Replica(self, role, i) for i in range(spec.pool_size(role))]
            for role in (ROLE_AGGREGATED, ROLE_PREFILL, ROLE_DECODE)
        }


class _Replica:
    __slots__ = (
        "tgt", "target", "role", "index", "spec", "cache", "waiting", "pending", "running", "joining",
        "inbound", "state", "token", "steps", "kv", "t0", "c", "half", "k", "prefill_job", "prefill_end",
        "busy_prefill_s", "busy_decode_s", "prefill_tokens", "restored_tokens",
    )  # fmt: skip

    def __init__(self, tgt: _Target, role: str, index: int) -> None:
        self.tgt = tgt
        self.target = tgt.spec.name
        self.role = role
        self.index = index
        self.spec = tgt.spec.spec_for(role)
        self.cache = PrefixCache(self.spec.kv_capacity_blocks)
        self.waiting: deque[_Job] = deque()  # queued for prefill
        self.pending: deque[_Job] = deque()  # decode role: prefilled, waiting for KV room here
        self.running: list[tuple[int, int, _Job]] = []  # heap of (end_step, seq, job)
        self.joining: list[_Job] = []  # decode role: transferred, join at the next step boundary
        self.inbound = 0  # decode role: transfers in flight to this replica
        self.state = _IDLE
        self.token = 0  # invalidates stale completion events
        self.steps = 0  # decode steps run so far
        self.kv = 0  # context tokens of the running sequences
        self.t0 = 0.0  # decode epoch: start time, first-step time c, growth half = pk*b/2, planned steps k
        self.c = 0.0
        self.half = 0.0
        self.k = 0
        self.prefill_job: _Job | None = None
        self.prefill_end = 0.0
        self.busy_prefill_s = 0.0
        self.busy_decode_s = 0.0
        self.prefill_tokens = 0
        self.restored_tokens = 0

    def load(self) -> int:
        return (
            len(self.waiting) + len(self.pending) + len(self.running) + len(self.joining)
            + self.inbound + (self.prefill_job is not None)
        )  # fmt: skip


def _add_busy(bins: list[float], start: float, end: float, origin: float, width: float) -> None:
    """Add the interval [start, end) to per-bin busy seconds."""
    b = int((start - origin) // width)
    last = int((end - origin) // width)
    if last >= len(bins):
        bins.extend([0.0] * (last + 1 - len(bins)))
    if b == last:
        bins[b] += end - start
        return
    edge = origin + (b + 1) * width
    bins[b] += edge - start
    for i in range(b + 1, last):
        bins[i] += width
    bins[last] += end - (origin + last * width)


class SimReplicaView:
    """``router.ReplicaView`` of one simulated replica, as a router sees it at decision time.

    Names follow vLLM's metrics: ``num_requests_waiting`` (queued for prefill, or
    waiting for KV room on a decode replica), ``num_requests_running`` (prefilling,
    decoding, or KV in transit to it), ``kv_cache_usage`` (fraction 0-1 of KV blocks
    pinned by requests).
    """

    __slots__ = ("_r",)

    def __init__(self, replica: _Replica) -> None:
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
        """Requests queued for prefill here, or prefilled and waiting for KV room (decode pool)."""
        r = self._r
        return len(r.waiting) + len(r.pending)

    @property
    def num_requests_running(self) -> int:
        """Requests prefilling, decoding, or with KV in transit to this replica."""
        r = self._r
        return len(r.running) + len(r.joining) + r.inbound + (r.prefill_job is not None)

    @property
    def kv_cache_usage(self) -> float:
        """Fraction 0-1 of this replica's KV blocks pinned by requests."""
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
    def kv_capacity_tokens(self) -> int:
        """KV capacity of this replica in tokens."""
        return self._r.spec.kv_capacity_tokens

    @property
    def waiting_prompt_tokens(self) -> int:
        """Prompt tokens of the requests queued here for prefill (O(queue length))."""
        return sum(j.req.prompt_tokens for j in self._r.waiting)

    def busy_s(self, now_s: float) -> tuple[float, float]:
        """(prefill, decode) busy seconds of this replica from the start of the replay up to
        ``now_s`` (the simulator's current time), the phase in progress counted up to now."""
        r = self._r
        prefill, decode = r.busy_prefill_s, r.busy_decode_s
        if r.state == _PREFILL:
            prefill -= max(0.0, r.prefill_end - now_s)
        elif r.state == _DECODE:
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
                 sim: _Simulator | None = None) -> None:
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


#: A scheduled event: (time, sequence number, kind, replica or job, replica token).
_Event: TypeAlias = tuple[float, int, int, _Replica | _Job, int]


class _Simulator:
    def __init__(self, fleet: SimFleet, router: Router, seed: int, timeline_bin_s: float,
                 on_complete: Callable[[RequestResult], None] | None = None) -> None:
        self.fleet = fleet
        self.router = router
        self.on_complete = on_complete
        self.seed = seed
        self.bin_s = timeline_bin_s
        self.origin = 0.0
        self.now = 0.0
        self.heap: list[_Event] = []
        self.seq = 0
        self.targets = {t.name: _Target(t) for t in fleet.on_prem}
        self.frontier = {f.name: f for f in fleet.frontier}
        self.rngs = {f.name: random.Random(f"{seed}:{f.name}") for f in fleet.frontier}
        self.fcaches = {f.name: PromptCache(f.prompt_cache_ttl_s) for f in fleet.frontier}
        views = {
            (name, role): tuple(SimReplicaView(r) for r in reps)
            for name, tgt in self.targets.items()
            for role, reps in tgt.pools.items()
            if reps
        }
        self.view = SimFleetView(fleet, views, self)

    # ---- driver

    def run(self, trace: Sequence[TraceRequest]) -> list[_Job]:
        order = sorted(range(len(trace)), key=lambda i: trace[i].arrival_s)
        jobs: dict[int, _Job] = {}
        if order:
            self.origin = trace[order[0]].arrival_s
        heap = self.heap
        for i in order:
            req = trace[i]
            t = req.arrival_s
            while heap and heap[0][0] <= t:
                self._step()
            self.now = t
            jobs[i] = self._arrive(i, req)
        while heap:
            self._step()
        return [jobs[i] for i in range(len(trace))]

    def _push(self, t: float, kind: int, obj: _Replica | _Job, token: int = 0) -> None:
        self.seq += 1
        heappush(self.heap, (t, self.seq, kind, obj, token))

    def _step(self) -> None:
        t, _, kind, obj, token = heappop(self.heap)
        self.now = t
        if isinstance(obj, _Replica):  # _EV_REPLICA
            if obj.token == token:
                self._replica_done(obj)
        elif kind == _EV_TRANSFER:
            self._transfer_done(obj)
        else:
            self._complete(obj)

    def _complete(self, job: _Job) -> None:
        """The request is done (finished or rejected): build its result, tell the observer."""
        job.result = _result(job)
        if self.on_complete is not None:
            self.on_complete(job.result)

    # ---- arrival, routing, admission

    def _arrive(self, index: int, req: TraceRequest) -> _Job:
        view = self.view
        view.now_s = self.now
        view.request_index = index
        a = self.router(req, view)
        job = _Job(index, req, a.target)
        if a.target is None:
            job.rejected = a.rejected or "rejected_by_router"
            self._complete(job)
            return job
        reason = self._place(job, a)
        for fb in a.fallbacks:
            if reason is None:
                break
            reason = self._place(job, fb)
        if reason is not None:
            self._refuse(job, reason)
        if job.target != job.routed and job.rejected is None:
            job.spilled = True
        return job

    def _place(self, job: _Job, a: Assignment) -> str | None:
        """Queue ``job`` where ``a`` says (or serve it on a frontier tier); returns None, or the
        admission-control reason it was refused (nothing changed then)."""
        req = job.req
        job.target = a.target
        frontier = self.frontier.get(a.target) if a.target is not None else None
        if frontier is not None:
            if frontier.max_model_len is not None and req.prompt_tokens + req.output_tokens > frontier.max_model_len:
                return "context_length"
            self._serve_frontier(job, frontier)
            return None
        tgt = self.targets.get(a.target) if a.target is not None else None
        if tgt is None:
            raise ValueError(f"router returned unknown target {a.target!r}; fleet targets: {list(self.fleet.target_names)}")
        job.mode = a.mode
        if a.mode == AGGREGATED:
            role = a.replica_pool or ROLE_AGGREGATED
            if role not in (ROLE_AGGREGATED, ROLE_DECODE):
                raise ValueError(f"router returned replica_pool {a.replica_pool!r}; expected None or 'decode'")
            pool = tgt.pools[role]
        elif a.mode == DISAGGREGATED:
            pool = tgt.pools[ROLE_PREFILL]
        else:
            raise ValueError(f"router returned mode {a.mode!r}; expected 'aggregated' or 'disaggregated'")
        if not pool:
            raise ValueError(f"router returned {a.mode} for target {a.target!r}, which has no {a.mode} pool"
                             + (f" ({a.replica_pool})" if a.replica_pool else ""))
        spec = pool[0].spec
        bt = spec.block_tokens
        p, o = req.prompt_tokens, req.output_tokens
        hashes = req.block_hashes or ()
        nh = len(hashes)
        if nh and nh != -(-p // bt):
            raise ValueError(
                f"request {job.index}: {nh} block hashes for {p} prompt tokens do not match "
                f"block_tokens={bt} of target {a.target!r}"
            )
        job.hashes = hashes
        total_blocks = max(nh, -(-(p + o) // bt))
        job.drep_index = None
        if a.mode == AGGREGATED:
            job.priv = total_blocks - nh
            job.dpriv = 0
        else:
            job.priv = max(nh, -(-p // bt)) - nh
            job.dpriv = total_blocks - nh
            dspec = tgt.pools[ROLE_DECODE][0].spec
            if total_blocks > dspec.kv_capacity_blocks:
                return "kv_capacity"
            job.drep_index = self._check_index(a.decode_replica, tgt.pools[ROLE_DECODE], a)
        if p + o > spec.max_model_len:
            return "context_length"
        if (job.priv + nh if a.mode == DISAGGREGATED else total_blocks) > spec.kv_capacity_blocks:
            return "kv_capacity"
        idx = self._check_index(a.replica, pool, a)
        rep = pool[idx] if idx is not None else min(pool, key=_Replica.load)
        limit = tgt.spec.max_waiting
        if limit is not None and len(rep.waiting) >= limit:
            return "queue_full"
        job.rep = rep
        rep.waiting.append(job)
        if rep.state == _IDLE:
            self._schedule(rep)
        elif rep.state == _DECODE and len(rep.waiting) == 1:
            self._interrupt(rep)
        return None

    @staticmethod
    def _check_index(i: int | None, pool: list[_Replica], a: Assignment) -> int | None:
        if i is not None and not 0 <= i < len(pool):
            raise ValueError(f"router returned replica index {i} for a pool of {len(pool)} in {a}")
        return i

    def _refuse(self, job: _Job, reason: str) -> None:
        spill = self.fleet.spill_target
        if spill is not None and self._place(job, Assignment(spill)) is None:
            return
        job.target = job.routed
        job.rejected = reason
        self._complete(job)

    def _serve_frontier(self, job: _Job, spec: FrontierSpec) -> None:
        rng = self.rngs[spec.name]
        req = job.req
        ttft = rng.lognormvariate(math.log(spec.ttft_median_s), spec.ttft_sigma)
        tpot = rng.lognormvariate(math.log(spec.tpot_median_s), spec.tpot_sigma)
        job.frontier = True
        job.target = spec.name
        job.mode = AGGREGATED
        job.rep = job.drep = None
        job.start_s = self.now
        job.first_s = self.now + ttft
        job.finish_s = job.first_s + (req.output_tokens - 1) * tpot
        cached = self._frontier_cache(spec, req)
        job.hit_tokens = cached
        job.cost_usd = spec.cost_usd(req.prompt_tokens, req.output_tokens, cached)
        self._push(job.finish_s, _EV_FINISH, job)

    def _frontier_cache(self, spec: FrontierSpec, req: TraceRequest) -> int:
        """Prompt tokens served from the provider's prompt cache; records the prompt's blocks."""
        hashes = req.block_hashes
        if spec.cached_input_usd_per_mtok is None or not hashes or req.prompt_tokens < spec.prompt_cache_min_tokens:
            return 0
        hit = self.fcaches[spec.name].use(hashes, self.now)
        return min(hit * spec.block_tokens, req.prompt_tokens)

    def frontier_cached_blocks(self, target: str, hashes: Sequence[int], now: float) -> int:
        """Leading ``hashes`` in frontier tier ``target``'s prompt cache at ``now`` (no state change)."""
        cache = self.fcaches.get(target)
        return 0 if cache is None else cache.peek(hashes, now)

    # ---- replica scheduling

    def _schedule(self, rep: _Replica) -> None:
        """Start the replica's next activity; called only when it is not busy."""
        if rep.joining:
            for job in rep.joining:
                self._join(rep, job)
            rep.joining.clear()
        if rep.waiting:
            job = rep.waiting[0]
            if rep.role == ROLE_PREFILL or (
                len(rep.running) + len(rep.joining) + rep.inbound < rep.spec.max_batch_size
            ):
                hit = rep.cache.acquire(job.hashes, job.priv)
                if hit is not None:
                    rep.waiting.popleft()
                    self._start_prefill(rep, job, hit)
                    return
        if rep.running:
            self._start_decode(rep)
            return
        rep.state = _IDLE

    def _start_prefill(self, rep: _Replica, job: _Job, hit_blocks: int) -> None:
        spec = rep.spec
        now = self.now
        p = job.req.prompt_tokens
        hit = min(hit_blocks * spec.block_tokens, p - 1)
        dur = spec.prefill_s(p - hit, hit)
        tier, shared = rep.tgt.tier, rep.tgt.spec.shared_kv  # a tier exactly when the target has shared_kv
        if tier is not None and shared is not None and job.hashes and hit < p - 1:
            extra = tier.prefix_blocks(job.hashes, hit_blocks)
            if extra:
                restorable = min((hit_blocks + extra) * spec.block_tokens, p - 1) - hit
                with_restore = shared.restore_s(restorable * spec.kv_bytes_per_token) + spec.prefill_s(
                    p - hit - restorable, hit + restorable
                )
                if with_restore < dur:
                    dur = with_restore
                    job.restored_tokens = restorable
                    rep.restored_tokens += restorable
        job.start_s = now
        job.hit_tokens = hit
        rep.prefill_tokens += p - hit - job.restored_tokens
        rep.prefill_job = job
        rep.state = _PREFILL
        rep.token += 1
        rep.busy_prefill_s += dur
        rep.prefill_end = now + dur
        _add_busy(rep.tgt.prefill_bins, now, now + dur, self.origin, self.bin_s)
        self._push(now + dur, _EV_REPLICA, rep, rep.token)

    def _start_decode(self, rep: _Replica) -> None:
        spec = rep.spec
        b = len(rep.running)
        c = spec.decode_base_s + b * spec.decode_per_seq_s + rep.kv * spec.decode_per_kv_token_s
        half = spec.decode_per_kv_token_s * b / 2
        k = rep.running[0][0] - rep.steps
        rep.t0, rep.c, rep.half, rep.k = self.now, c, half, k
        rep.state = _DECODE
        rep.token += 1
        self._push(self.now + k * c + half * k * (k - 1), _EV_REPLICA, rep, rep.token)

    def _interrupt(self, rep: _Replica) -> None:
        """End the current decode epoch at the first step boundary at or after now."""
        elapsed = self.now - rep.t0
        c, half = rep.c, rep.half

        def t_of(j: int) -> float:  # time for j steps from the epoch start
            return j * c + half * j * (j - 1)

        if half > 0:
            lin = c - half
            j = math.ceil((-lin + math.sqrt(lin * lin + 4 * half * elapsed)) / (2 * half))
        else:
            j = math.ceil(elapsed / c) if c > 0 else 1
        j = max(j, 1)
        while j > 1 and t_of(j - 1) >= elapsed:
            j -= 1
        while t_of(j) < elapsed:
            j += 1
        if j >= rep.k:
            return
        rep.k = j
        rep.token += 1
        self._push(rep.t0 + t_of(j), _EV_REPLICA, rep, rep.token)

    def _join(self, rep: _Replica, job: _Job) -> None:
        """Add a prefilled sequence to the decode batch at the current step boundary."""
        req = job.req
        rep.kv += req.prompt_tokens + 1
        self.seq += 1
        heappush(rep.running, (rep.steps + req.output_tokens - 1, self.seq, job))

    def _replica_done(self, rep: _Replica) -> None:
        now = self.now
        if rep.state == _PREFILL:
            job = rep.prefill_job
            if job is None:
                raise RuntimeError(f"simulator bug: {rep.target}/{rep.role}[{rep.index}] ended a prefill of nothing")
            rep.prefill_job = None
            job.first_s = now
            tier = rep.tgt.tier
            if tier is not None and job.hashes:
                tier.put(job.hashes)
            if job.req.output_tokens == 1:
                job.finish_s = now
                rep.cache.release(job.hashes, job.priv)
                if rep.role == ROLE_DECODE:
                    self._admit(rep)
                self._complete(job)
            elif job.mode == AGGREGATED:
                self._join(rep, job)
            else:
                self._to_decode(job)
        else:  # decode epoch ended
            rep.busy_decode_s += now - rep.t0
            _add_busy(rep.tgt.decode_bins, rep.t0, now, self.origin, self.bin_s)
            running = rep.running
            rep.kv += len(running) * rep.k
            rep.steps += rep.k
            freed = False
            done = []
            while running and running[0][0] <= rep.steps:
                job = heappop(running)[2]
                req = job.req
                job.finish_s = now
                rep.kv -= req.prompt_tokens + req.output_tokens
                rep.cache.release(job.hashes, job.dpriv if job.mode == DISAGGREGATED else job.priv)
                freed = freed or rep.role == ROLE_DECODE
                done.append(job)
            if freed:
                self._admit(rep)
            for job in done:
                self._complete(job)
        rep.state = _IDLE
        self._schedule(rep)

    # ---- P/D disaggregation

    def _to_decode(self, job: _Job) -> None:
        pool = job.on_prem().tgt.pools[ROLE_DECODE]
        drep = pool[job.drep_index] if job.drep_index is not None else min(pool, key=_Replica.load)
        job.drep = drep
        drep.pending.append(job)
        self._admit(drep)

    def _admit(self, drep: _Replica) -> None:
        """Start KV transfers for pending sequences while the decode replica has room (FIFO)."""
        spec = drep.spec
        link = drep.tgt.spec.link
        while drep.pending:
            if len(drep.running) + len(drep.joining) + drep.inbound >= spec.max_batch_size:
                return
            job = drep.pending[0]
            hit = drep.cache.acquire(job.hashes, job.dpriv)
            if hit is None:
                return
            drep.pending.popleft()
            p = job.req.prompt_tokens
            moved = p - min(hit * spec.block_tokens, p)
            job.transfer_s = link.transfer_s(moved * spec.kv_bytes_per_token) if moved else 0.0
            drep.inbound += 1
            self._push(self.now + job.transfer_s, _EV_TRANSFER, job)

    def _transfer_done(self, job: _Job) -> None:
        prep, drep = job.on_prem(), job.drep
        if drep is None:
            raise RuntimeError(f"simulator bug: request {job.index} transferred to no decode replica")
        prep.cache.release(job.hashes, job.priv)
        if prep.state == _IDLE:
            self._schedule(prep)
        drep.inbound -= 1
        if drep.state == _DECODE:
            drep.joining.append(job)
            self._interrupt(drep)
        else:
            self._join(drep, job)
            if drep.state == _IDLE:
                self._schedule(drep)


def _result(job: _Job) -> RequestResult:
    req = job.req
    rep, drep = job.rep, job.drep
    queue = ttft = tpot = e2e = None
    if job.rejected is None:
        start, first, finish = job.start_s, job.first_s, job.finish_s
        if start is None or first is None or finish is None:
            raise RuntimeError(f"simulator bug: request {job.index} completed without its start, first or last token")
        queue = start - job.arrival_s
        ttft = first - job.arrival_s
        e2e = finish - job.arrival_s
        tpot = (finish - first) / (req.output_tokens - 1) if req.output_tokens > 1 else None
    return RequestResult(
        index=job.index,
        arrival_s=job.arrival_s,
        prompt_tokens=req.prompt_tokens,
        output_tokens=req.output_tokens,
        routed_target=job.routed,
        target=job.target,
        mode=job.mode,
        replica=rep.index if rep is not None and not job.frontier else None,
        decode_replica=drep.index if drep is not None and not job.frontier else None,
        frontier=job.frontier,
        spilled=job.spilled,
        rejected=job.rejected,
        queue_s=queue,
        ttft_s=ttft,
        tpot_s=tpot,
        e2e_s=e2e,
        finish_s=job.finish_s,
        prefix_hit_tokens=job.hit_tokens,
        restored_tokens=job.restored_tokens,
        transfer_s=job.transfer_s,
        cost_usd=job.cost_usd,
    )


def simulate(
    trace: Sequence[TraceRequest],
    fleet: SimFleet,
    router: Router,
    *,
    seed: int = 0,
    timeline_bin_s: float = 10.0,
    on_complete: Callable[[RequestResult], None] | None = None,
) -> ReplayResult:
    """Replay ``trace`` through ``router`` against ``fleet``; see the module docstring for the model.

    ``trace`` need not be sorted (requests are taken in arrival order, ties in trace
    order). ``seed`` drives the frontier latency draws (a router has its own seed).
    ``on_complete(result)`` is called for every request at its simulated completion time.
    Raises ValueError when the router returns an unknown target, a mode the target
    has no pool for, or a replica index out of range, or when a request's block hashes
    do not match the target's ``block_tokens``.
    """
    if timeline_bin_s <= 0:
        raise ValueError(f"timeline_bin_s must be > 0, got {timeline_bin_s}")
    sim = _Simulator(fleet, router, seed, timeline_bin_s, on_complete)
    jobs = sim.run(trace)
    for tgt in sim.targets.values():  # every request finished and gave its KV back
        for reps in tgt.pools.values():
            for r in reps:
                if r.cache.used_blocks or r.load() or r.state != _IDLE:
                    raise RuntimeError(f"simulator bug: {r.target}/{r.role}[{r.index}] not drained at the end")
    results = [j.result or _result(j) for j in jobs]
    # the window runs to the last finish or the last arrival, whichever is later: the fleet is
    # provisioned while the trace runs even when its last requests are refused
    ends = [r.finish_s for r in results if r.finish_s is not None] + [r.arrival_s for r in results]
    start = sim.origin
    end = max(ends, default=start)
    replicas = [
        ReplicaStats(
            target=r.target,
            role=r.role,
            index=r.index,
            gpus=r.spec.gpus,
            prefill_busy_s=r.busy_prefill_s,
            decode_busy_s=r.busy_decode_s,
            prefill_tokens=r.prefill_tokens,
            decode_steps=r.steps,
            restored_tokens=r.restored_tokens,
        )
        for tgt in sim.targets.values()
        for reps in tgt.pools.values()
        for r in reps
    ]
    n_bins = int((end - start) // timeline_bin_s) + 1

    def _bins(values: list[float]) -> list[float]:
        return values + [0.0] * (n_bins - len(values))

    timeline = {
        name: {"prefill_busy_s": _bins(t.prefill_bins), "decode_busy_s": _bins(t.decode_bins)}
        for name, t in sim.targets.items()
    }
    return ReplayResult(
        requests=results,
        replicas=replicas,
        fleet=fleet,
        start_s=start,
        end_s=end,
        seed=seed,
        timeline_bin_s=timeline_bin_s,
        timeline=timeline,
    )
