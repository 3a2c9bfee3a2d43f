"""Discrete-event fleet simulator: replays a trace through a router against a ``SimFleet``.

``simulate(trace, fleet, router, seed=...)`` returns a ``ReplayResult`` with one
``RequestResult`` per trace request (in trace order) and busy time per replica.
Deterministic: the same trace, fleet, router and seed give identical results
(events at equal times run in the order they were scheduled; frontier latencies
come from one seeded RNG per tier).

Serving model of one replica: **vLLM V1's scheduler** (``vllm/v1/core/sched/scheduler.py``
@b4622cf9, ``Scheduler.schedule``), one engine step at a time:

- **A step** has a token budget of ``ReplicaSpec.max_num_batched_tokens`` (vLLM's
  ``max_num_batched_tokens``, 8192 for ``vllm serve`` on an H100). The *running*
  requests are served first, in admission order: a decoding sequence takes 1 token, a
  partially prefilled one the rest of its prompt up to the budget left (**chunked
  prefill**). Then, only if the step preempted nothing, *waiting* requests are admitted
  in FCFS order while budget is left and fewer than ``max_num_seqs`` (vLLM's
  ``max_num_seqs``) run: each gets its prefix-cache hit (leading full blocks resident on
  the replica; at least one token is always computed) and a first chunk. A waiting
  request whose KV does not fit stops admission (it never preempts). The step takes
  ``ReplicaSpec.step_s`` of its decode tokens, their context and its prefill chunks.
  After the step, a request whose context is computed samples a token: the first one
  is its TTFT; the last one finishes it.
- **KV pages are allocated incrementally** (``kv_block_tokens`` pages, vLLM's 16-token
  ``block_size``): a prefill chunk allocates pages for its tokens, a decoding sequence one
  page each time its context crosses a page boundary. Full prompt blocks of the trace's
  hash size (512 tokens) are shared hashed blocks (prefix caching; ``kvcache.PrefixCache``).
- **Preemption** when a running request's pages cannot be allocated: the *newest* running
  request (the last admitted, vLLM FCFS ``running.pop()``) is preempted, its pages are
  freed (hashed blocks stay cached, so it may hit its own prefix later), and it goes back
  to the **head** of the waiting queue to be **recomputed** (prompt plus the tokens it
  had generated, vLLM's recompute preemption); retried until the allocation fits or the
  request itself was the victim. No request is admitted in a step that preempted.
- **Pure decode stretches** (no prefill chunk, nothing admissible waiting) are simulated
  in closed form between batch changes: the replica jumps to the step that completes the
  next sequence, or to the last step whose page allocations fit; an arrival, a finished
  transfer or restore, or freed KV interrupts it at the next step boundary (the step in
  flight always completes).
- **P/D disaggregation**: the prefill replica runs the prompt (chunked as above) and
  samples the first token (TTFT), keeps the KV pinned, and the request waits for KV room
  and a batch slot on its decode replica (the router's, or the least loaded one when the
  prefill ends). The KV of the prompt blocks not already cached there then moves over the
  prefill replica's link, **shared** by every transfer leaving that replica at the same
  time (processor sharing; ``LinkSpec``); the sequence joins the decode replica's running
  requests when the transfer ends (admitted like a waiting request: 1 token of budget).
- **Shared KV tier** (optional per target): prompts' full blocks are written through after
  prefill; a request being admitted may restore the next leading blocks from the tier
  when the restore at the current share of the tier's bandwidth is predicted faster than
  recomputing them. Restores load asynchronously (vLLM's KV-connector loads: the request
  holds its pages and waits out of the queue, others are scheduled meanwhile) and share
  the tier's **total** restore bandwidth (``SharedKVTierSpec``) across all replicas.
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
- **Callbacks**: ``simulate(..., on_complete=f)`` calls ``f(result)`` with the request's
  ``RequestResult`` at the simulated time it completes (a rejection: at its arrival),
  before any later arrival is routed, so a router can learn from outcomes (the policy
  engine settles its budget reservations this way); ``on_first_token=g`` calls
  ``g(index, time_s)`` when an on-prem request's first token is sampled.
- **Closed loop** (``closed_loop_clients=N``, benchmark replays): N clients each send the
  trace's requests in order, the next as soon as their previous one completes; arrival
  times are then the send times.

Simplifications, kept on purpose: one partial prefill at a time is the common case but
several may coexist as in vLLM; a request's pages are freed when it finishes (vLLM frees
them as well); the decode side's NICs and the tier's write path are not contended.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections import deque
from collections.abc import Callable, Sequence
from heapq import heappop, heappush
from typing import TypeAlias

from pointsman.datasets.traces import TraceRequest
from pointsman.replay.hardware import FrontierSpec
from pointsman.replay.kvcache import PromptCache
from pointsman.replay.results import ReplayResult, ReplicaStats, RequestResult
from pointsman.replay.router import Assignment, Router
from pointsman.replay.sim_fleet import (
    AGGREGATED,
    DISAGGREGATED,
    ROLE_AGGREGATED,
    ROLE_DECODE,
    ROLE_PREFILL,
    SimFleet,
)
from pointsman.replay.sim_state import (
    EPOCH,
    EPS_BYTES,
    EV_ARRIVAL,
    EV_CHANNEL,
    EV_FINISH,
    EV_REPLICA,
    EV_RESTORE,
    EV_TRANSFER,
    EV_WAKE,
    IDLE,
    STEP,
    SimChannel,
    SimFleetView,
    SimJob,
    SimReplica,
    SimReplicaView,
    SimTarget,
    add_busy,
)

# --------------------------------------------------------------------------- simulator internals

#: A scheduled event: (time, priority, sequence number, kind, replica / channel / job / request
#: index, token). Priority 1 (waking an idle replica) runs after everything else at that time,
#: arrivals included, so requests arriving together are scheduled together.
_Event: TypeAlias = tuple[float, int, int, int, "SimReplica | SimChannel | SimJob | int", int]


class _Simulator:
    def __init__(self, fleet: SimFleet, router: Router, seed: int, timeline_bin_s: float,
                 on_complete: Callable[[RequestResult], None] | None = None,
                 on_first_token: Callable[[int, float], None] | None = None) -> None:
        self.fleet = fleet
        self.router = router
        self.on_complete = on_complete
        self.on_first_token = on_first_token
        self.seed = seed
        self.bin_s = timeline_bin_s
        self.origin = 0.0
        self.now = 0.0
        self.heap: list[_Event] = []
        self.seq = 0
        self.targets = {t.name: SimTarget(t) for t in fleet.on_prem}
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
        self.jobs: dict[int, SimJob] = {}
        self.trace: Sequence[TraceRequest] = ()
        self.queue: deque[int] = deque()  # closed loop: trace indices not sent yet
        self.closed = False

    # ---- driver

    def run(self, trace: Sequence[TraceRequest], clients: int | None = None) -> list[SimJob]:
        self.trace = trace
        order = sorted(range(len(trace)), key=lambda i: trace[i].arrival_s)
        if order:
            self.origin = trace[order[0]].arrival_s
        heap = self.heap
        if clients is not None:
            self.closed = True
            self.queue = deque(range(len(trace)))
            for _ in range(min(clients, len(trace))):
                self._push(self.origin, EV_ARRIVAL, self.queue.popleft())
        else:
            for i in order:
                req = trace[i]
                t = req.arrival_s
                while heap and (heap[0][0] < t or (heap[0][0] == t and not heap[0][1])):
                    self._step()
                self.now = t
                self.jobs[i] = self._arrive(i, req)
        while heap:
            self._step()
        return [self.jobs[i] for i in range(len(trace))]

    def _push(self, t: float, kind: int, obj: SimReplica | SimChannel | SimJob | int, token: int = 0) -> None:
        self.seq += 1
        heappush(self.heap, (t, int(kind == EV_WAKE), self.seq, kind, obj, token))

    def _step(self) -> None:
        t, _, _, kind, obj, token = heappop(self.heap)
        self.now = t
        if isinstance(obj, SimReplica):  # EV_REPLICA, EV_WAKE
            if kind == EV_WAKE:
                obj.wake = False
                if obj.state == IDLE:
                    self._next(obj)
            elif obj.token == token:
                self._replica_done(obj)
        elif isinstance(obj, SimChannel):  # EV_CHANNEL
            if obj.token == token:
                self._channel_done(obj)
        elif isinstance(obj, int):  # EV_ARRIVAL (closed loop)
            req = dataclasses.replace(self.trace[obj], arrival_s=t)
            self.jobs[obj] = self._arrive(obj, req)
        elif kind == EV_TRANSFER:
            self._transfer_done(obj)
        elif kind == EV_RESTORE:
            self._restore_done(obj)
        else:
            self._complete(obj)

    def _complete(self, job: SimJob) -> None:
        """The request is done (finished or rejected): build its result, tell the observer."""
        job.result = _result(job)
        if self.on_complete is not None:
            self.on_complete(job.result)
        if self.closed and self.queue:
            self._push(self.now, EV_ARRIVAL, self.queue.popleft())

    def _first_token(self, job: SimJob, t: float) -> None:
        job.first_s = t
        if self.on_first_token is not None:
            self.on_first_token(job.index, t)

    # ---- arrival, routing, admission

    def _arrive(self, index: int, req: TraceRequest) -> SimJob:
        view = self.view
        view.now_s = self.now
        view.request_index = index
        a = self.router(req, view)
        job = SimJob(index, req, a.target)
        if a.target is None:
            job.rejected = a.rejected or "rejected_by_router"
            self._complete(job)
            return job
        if a.output_tokens is not None and a.target in self.targets:  # a draft cancelled after its first tokens
            job.req = dataclasses.replace(req, output_tokens=max(1, min(req.output_tokens, a.output_tokens)))
        reason = self._place(job, a)
        job.req = req if reason is not None else job.req
        for fb in a.fallbacks:
            if reason is None:
                break
            reason = self._place(job, fb)
        if reason is not None:
            self._refuse(job, reason)
        if job.target != job.routed and job.rejected is None:
            job.spilled = True
        return job

    def _place(self, job: SimJob, a: Assignment) -> str | None:
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
        # Only full blocks are cached (vLLM): the trace's full prompt blocks, then ids of the
        # request's own for the rest of its context (prompt without block ids, output), which
        # no other request shares but which let a preempted request find its own KV again.
        full = (p + o) // bt
        shared = p // bt if nh else 0
        job.n_prompt_blocks = shared
        job.hashes = tuple(hashes[:shared]) + tuple(-(job.index * 1024 + b + 1) for b in range(shared, full))
        job.drep_index = None
        if p + o > spec.max_model_len:
            return "context_length"
        rep0 = pool[0]
        if a.mode == DISAGGREGATED:
            dpool = tgt.pools[ROLE_DECODE]
            if dpool[0].pages(job, p + o) > dpool[0].spec.kv_pages:
                return "kv_capacity"
            if rep0.pages(job, p) > spec.kv_pages:
                return "kv_capacity"
            job.drep_index = self._check_index(a.decode_replica, dpool, a)
        elif rep0.pages(job, p + o) > spec.kv_pages:
            return "kv_capacity"
        idx = self._check_index(a.replica, pool, a)
        rep = pool[idx] if idx is not None else min(pool, key=SimReplica.load)
        limit = tgt.spec.max_waiting
        if limit is not None and len(rep.waiting) >= limit:
            return "queue_full"
        job.rep = job.at = rep
        rep.waiting.append(job)
        self._kick(rep)
        return None

    @staticmethod
    def _check_index(i: int | None, pool: list[SimReplica], a: Assignment) -> int | None:
        if i is not None and not 0 <= i < len(pool):
            raise ValueError(f"router returned replica index {i} for a pool of {len(pool)} in {a}")
        return i

    def _refuse(self, job: SimJob, reason: str) -> None:
        spill = self.fleet.spill_target
        if spill is not None and self._place(job, Assignment(spill)) is None:
            return
        job.target = job.routed
        job.rejected = reason
        self._complete(job)

    def _serve_frontier(self, job: SimJob, spec: FrontierSpec) -> None:
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
        job.finish_s = self.now + ttft + (req.output_tokens - 1) * tpot
        cached = self._frontier_cache(spec, req)
        job.hit_tokens = cached
        job.cost_usd = spec.cost_usd(req.prompt_tokens, req.output_tokens, cached)
        self._push(job.finish_s, EV_FINISH, job)

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

    def _kick(self, rep: SimReplica) -> None:
        """Something changed for ``rep`` (arrival, join, restore done, KV freed): start its next
        step when idle, or end a decode epoch at the next step boundary."""
        if rep.state == IDLE:
            if not rep.wake:
                rep.wake = True
                self._push(self.now, EV_WAKE, rep)
        elif rep.state == EPOCH:
            self._interrupt(rep)

    def _admissible(self, rep: SimReplica, budget: int) -> bool:
        """Whether the step about to be planned would admit anything (no state change)."""
        if budget <= 0:
            return False
        if rep.joining:
            return True
        if not rep.waiting or rep.seqs() >= rep.spec.max_num_seqs:
            return False
        job = rep.waiting[0]
        n = self._hit(rep, job)
        restore = self._restore_plan(rep, job, n)
        if restore is not None:
            return rep.grow(job, n + restore, dry=True)
        return rep.grow(job, n + min(job.n_tokens - n, budget), dry=True)

    def _hit(self, rep: SimReplica, job: SimJob) -> int:
        """Tokens of ``job``'s context that ``rep``'s prefix cache holds (at most all but one)."""
        if not job.hashes:
            return 0
        return min(rep.cache.cached_prefix_blocks(job.hashes) * rep.bt, job.n_tokens - 1)

    def _restore_plan(self, rep: SimReplica, job: SimJob, hit: int) -> int | None:
        """Tokens to restore from the shared tier after ``hit`` local ones, when restoring them
        at the tier's current share is predicted faster than recomputing; else None."""
        tier, shared, chan = rep.tgt.tier, rep.tgt.spec.shared_kv, rep.tgt.tier_channel
        if tier is None or shared is None or chan is None or not job.hashes or hit >= job.n_tokens - 1:
            return None
        start = hit // rep.bt
        extra = tier.prefix_blocks(job.hashes, start)
        if not extra:
            return None
        restorable = min((start + extra) * rep.bt, job.n_tokens - 1) - hit
        if restorable <= 0:
            return None
        spec = rep.spec
        recompute = restorable * spec.prefill_s_per_token + (
            restorable * hit + restorable * (restorable + 1) / 2) * spec.prefill_s_per_token_pair
        restore = shared.restore_s(restorable * spec.kv_bytes_per_token, len(chan.active) + 1)
        return restorable if restore < recompute else None

    def _next(self, rep: SimReplica) -> None:
        """The replica is free at a step boundary: run a decode epoch or plan one step."""
        spec = rep.spec
        budget = spec.max_num_batched_tokens
        if rep.ndec and not rep.partials and not self._admissible(rep, budget - rep.ndec):
            ends = rep.ends
            while ends and ends[0][2] != ends[0][3].ver:  # drop entries of preempted decoders
                heappop(ends)
            k_done = ends[0][0] - rep.steps if ends else 0
            free = rep.cache.free_blocks
            if k_done > 0 and rep.crossings(1) <= free:
                k = k_done
                if rep.crossings(k) > free:  # the last step whose page allocations fit
                    lo, hi = 1, k
                    while hi - lo > 1:
                        mid = (lo + hi) // 2
                        if rep.crossings(mid) <= free:
                            lo = mid
                        else:
                            hi = mid
                    k = lo
                self._start_epoch(rep, k)
                return
        self._plan_step(rep)

    def _plan_step(self, rep: SimReplica) -> None:
        """One vLLM V1 step: running requests in order (preempting the newest when pages run
        out), then admissions if nothing was preempted; see the module docstring."""
        spec = rep.spec
        budget = spec.max_num_batched_tokens
        s = rep.steps
        preempted = False
        # decoders: one token each; the ones crossing a page boundary need a page
        need = rep.res[s % rep.pg] if rep.ndec and not rep.reserve else 0
        if need:
            if rep.cache.grow((), need):
                pass
            else:  # not all fit: allocate in admission order, preempting the newest
                preempted = self._decoders_in_order(rep)
        budget -= rep.ndec
        plan: list[tuple[SimJob, int]] = []
        for job in list(rep.partials):
            if job not in rep.running:
                continue  # preempted meanwhile
            num = min(job.n_tokens - job.n_computed, budget)
            if num <= 0:
                break
            while not rep.grow(job, job.n_computed + num):
                victim = next(reversed(rep.running))
                self._preempt(rep, victim)
                preempted = True
                if victim is job:
                    break
            if job not in rep.running:
                break
            plan.append((job, num))
            budget -= num
        if not preempted:
            budget = self._admit_waiting(rep, budget, plan)
        ndec = rep.ndec
        if not plan and not ndec:
            if preempted:  # everything running was preempted: the next step may admit (vLLM's next iteration)
                self._plan_step(rep)
                return
            rep.state = IDLE
            return
        pre_tokens = sum(n for _, n in plan)
        pairs = sum(n * job.n_computed + n * (n + 1) / 2 for job, n in plan)
        dur = spec.step_s(ndec, rep.kv_dec, pre_tokens, pairs)
        if pre_tokens:
            prefill = pre_tokens * spec.prefill_s_per_token + pairs * spec.prefill_s_per_token_pair
            decode = ndec * spec.decode_per_seq_s + rep.kv_dec * spec.decode_per_kv_token_s
            rep.pfrac = prefill / (prefill + decode) if prefill + decode > 0 else 1.0
        else:
            rep.pfrac = 0.0
        rep.plan, rep.plan_dec = plan, ndec
        now = self.now
        rep.t0, rep.t_end = now, now + dur
        rep.state = STEP
        rep.token += 1
        rep.busy_prefill_s += dur * rep.pfrac
        rep.busy_decode_s += dur * (1.0 - rep.pfrac)
        rep.work_s += spec.work_s(ndec, rep.kv_dec, pre_tokens, pairs)
        tgt = rep.tgt
        if rep.pfrac > 0:
            add_busy(tgt.prefill_bins, now, now + dur * rep.pfrac, self.origin, self.bin_s, spec.gpus)
        if rep.pfrac < 1:
            add_busy(tgt.decode_bins, now + dur * rep.pfrac, now + dur, self.origin, self.bin_s, spec.gpus)
        self._push(now + dur, EV_REPLICA, rep, rep.token)

    def _decoders_in_order(self, rep: SimReplica) -> bool:
        """Allocate the crossing decoders' pages one by one in admission order, preempting the
        newest running request whenever one does not fit. Returns True (it preempted)."""
        pg, s = rep.pg, rep.steps
        for job in list(rep.running):
            if job not in rep.running:
                continue
            if not job.decoding or (s - job.d_s0 + job.d_n0) % pg != 0:
                continue
            while not rep.cache.grow((), 1):
                victim = next(reversed(rep.running))
                self._preempt(rep, victim)
                if victim is job:
                    break
        return True

    def _admit_waiting(self, rep: SimReplica, budget: int, plan: list[tuple[SimJob, int]]) -> int:
        """Admit joining decoders, then waiting requests (FCFS) while budget and seats last."""
        spec = rep.spec
        while rep.joining and budget > 0:  # their first step's page was reserved with the transfer
            job = rep.joining.popleft()
            rep.running[job] = None
            self._add_decoder(rep, job)
            budget -= 1
        while rep.waiting and budget > 0 and rep.seqs() < spec.max_num_seqs:
            job = rep.waiting[0]
            hit = self._hit(rep, job)
            restore = self._restore_plan(rep, job, hit)
            if restore is not None:
                if not rep.grow(job, hit + restore):
                    return budget
                self._start_restore(rep, job, hit, restore)
                continue
            job.n_computed = hit
            if not job.looked_up:
                job.hit_tokens = hit
                job.looked_up = True
            num = min(job.n_tokens - job.n_computed, budget)
            if not rep.grow(job, job.n_computed + num):
                return budget
            rep.waiting.popleft()
            rep.running[job] = None
            rep.partials[job] = None
            if job.start_s is None:
                job.start_s = self.now
            plan.append((job, num))
            budget -= num
        return budget

    def _add_decoder(self, rep: SimReplica, job: SimJob) -> None:
        """``job`` (context computed, ``generated`` tokens sampled) decodes from this step on
        (the page of a first step crossing a page boundary is the caller's to allocate)."""
        job.decoding = True
        job.d_n0 = job.n_computed
        job.d_s0 = rep.steps
        job.d_end = rep.steps + job.req.output_tokens - job.generated
        job.ver += 1
        rep.ndec += 1
        rep.kv_dec += job.n_computed + 1
        rep.res[(job.d_s0 - job.d_n0) % rep.pg] += 1
        self.seq += 1
        heappush(rep.ends, (job.d_end, self.seq, job.ver, job))

    def _drop_decoder(self, rep: SimReplica, job: SimJob) -> int:
        """Stop tracking a decoding ``job``; returns its computed tokens now."""
        n = rep.dec_n(job)
        job.generated = job.req.output_tokens - (job.d_end - rep.steps)
        job.decoding = False
        job.ver += 1
        rep.ndec -= 1
        rep.kv_dec -= n + 1
        rep.res[(job.d_s0 - job.d_n0) % rep.pg] -= 1
        return n

    def _preempt(self, rep: SimReplica, job: SimJob) -> None:
        """Preempt ``job`` (recompute): free its pages, back to the head of the waiting queue."""
        n = self._drop_decoder(rep, job) if job.decoding else job.alloc_n
        rep.free(job, max(n, job.alloc_n), job.pinned_k)  # a reservation may exceed the context
        job.pinned_k = 0
        del rep.running[job]
        rep.partials.pop(job, None)
        job.n_tokens = job.req.prompt_tokens + job.generated
        job.n_computed = job.alloc_n = 0
        rep.waiting.appendleft(job)
        rep.preemptions += 1

    def _start_epoch(self, rep: SimReplica, k: int) -> None:
        spec = rep.spec
        b = rep.ndec
        c = spec.step_s(b, rep.kv_dec)
        half = spec.decode_per_kv_token_s * b / 2
        rep.t0, rep.c, rep.half, rep.k = self.now, c, half, k
        rep.state = EPOCH
        rep.token += 1
        self._push(self.now + k * c + half * k * (k - 1), EV_REPLICA, rep, rep.token)

    def _interrupt(self, rep: SimReplica) -> None:
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
        self._push(rep.t0 + t_of(j), EV_REPLICA, rep, rep.token)

    def _replica_done(self, rep: SimReplica) -> None:
        now = self.now
        if rep.state == EPOCH:
            k = rep.k
            rep.busy_decode_s += now - rep.t0
            add_busy(rep.tgt.decode_bins, rep.t0, now, self.origin, self.bin_s, rep.spec.gpus)
            if not rep.cache.grow((), rep.crossings(k)):
                raise RuntimeError(f"simulator bug: {rep.target}/{rep.role}[{rep.index}] decode epoch over its KV")
            rep.steps += k
            rep.work_s += k * rep.spec.work_s(rep.ndec, rep.kv_dec) + rep.half * k * (k - 1)  # contexts grow each step
            rep.kv_dec += rep.ndec * k
        else:
            rep.steps += 1
            rep.kv_dec += rep.plan_dec
            plan, rep.plan = rep.plan, []
            for job, num in plan:
                job.n_computed += num
                rep.prefill_tokens += num
                if job.n_computed < job.n_tokens:
                    continue
                del rep.partials[job]  # context computed: sample a token
                job.generated += 1
                if job.first_s is None:
                    self._first_token(job, now)
                tier = rep.tgt.tier
                if tier is not None and job.n_prompt_blocks:
                    tier.put(job.hashes[:job.n_prompt_blocks])
                if rep.role == ROLE_PREFILL and job.generated < job.req.output_tokens:
                    del rep.running[job]
                    self._to_decode(rep, job)
                elif job.generated >= job.req.output_tokens:
                    self._finish(rep, job, job.n_computed)
                else:
                    job.n_tokens += 1
                    self._add_decoder(rep, job)
        ends = rep.ends
        while ends and ends[0][0] <= rep.steps:
            _, _, ver, job = heappop(ends)
            if ver != job.ver or not job.decoding:
                continue
            self._finish(rep, job, self._drop_decoder(rep, job))
        rep.state = IDLE
        self._next(rep)

    def _finish(self, rep: SimReplica, job: SimJob, n: int) -> None:
        """``job`` sampled its last token on ``rep``, holding ``n`` tokens: free and complete it."""
        job.finish_s = self.now
        rep.free(job, max(n, job.alloc_n), job.pinned_k)  # a decoder's first page or a reservation may exceed n
        job.pinned_k = 0
        del rep.running[job]
        if rep.role == ROLE_DECODE:
            self._admit_pending(rep)
        self._complete(job)

    # ---- shared KV tier

    def _start_restore(self, rep: SimReplica, job: SimJob, hit: int, tokens: int) -> None:
        chan = rep.tgt.tier_channel
        if chan is None:
            raise RuntimeError("simulator bug: restore without a shared tier")
        rep.waiting.popleft()
        if not job.looked_up:  # the first admission's hit and restore are the request's
            job.hit_tokens = hit
            job.restored_tokens = tokens
            job.looked_up = True
        job.n_computed = hit + tokens
        rep.restored_tokens += tokens
        rep.loading += 1
        if job.start_s is None:
            job.start_s = self.now
        self._channel_add(chan, job, tokens * rep.spec.kv_bytes_per_token)

    def _restore_done(self, job: SimJob) -> None:
        """The restore is the request's admission: it runs on as a partial prefill (holding its
        pages; a later chunk that does not fit preempts as usual)."""
        rep = job.at
        if rep is None:
            raise RuntimeError(f"simulator bug: request {job.index} restored onto no replica")
        rep.loading -= 1
        rep.running[job] = None
        rep.partials[job] = None
        self._kick(rep)

    # ---- shared channels (P/D links, tier restores)

    def _channel_add(self, chan: SimChannel, job: SimJob, nbytes: float) -> None:
        chan.advance(self.now)
        chan.active[job] = nbytes
        self._channel_schedule(chan)

    def _channel_schedule(self, chan: SimChannel) -> None:
        chan.token += 1
        if chan.active:
            self._push(chan.next_done(), EV_CHANNEL, chan, chan.token)

    def _channel_done(self, chan: SimChannel) -> None:
        chan.advance(self.now)
        done = [job for job, left in chan.active.items() if left <= EPS_BYTES]
        if not done:  # rounding: the smallest is within float error of done
            done = [min(chan.active, key=chan.active.__getitem__)]
        for job in done:
            del chan.active[job]
            self._push(self.now + chan.latency_s, chan.done_kind, job)
        self._channel_schedule(chan)

    # ---- P/D disaggregation

    def _to_decode(self, prep: SimReplica, job: SimJob) -> None:
        """A prefill finished on ``prep``: keep its pages pinned and queue it for its decode replica."""
        job.held_n = job.alloc_n
        job.alloc_n = job.pinned_k = 0
        prep.held += 1
        pool = prep.tgt.pools[ROLE_DECODE]
        drep = pool[job.drep_index] if job.drep_index is not None else min(pool, key=SimReplica.load)
        job.drep = drep
        drep.pending.append(job)
        self._admit_pending(drep)

    def _admit_pending(self, drep: SimReplica) -> None:
        """Start KV transfers for pending sequences while the decode replica has room (FIFO)."""
        spec = drep.spec
        while drep.pending:
            if drep.seqs() >= spec.max_num_seqs:
                return
            job = drep.pending[0]
            p = job.req.prompt_tokens
            hit = drep.cache.cached_prefix_blocks(job.hashes) if job.hashes else 0
            # a decode epoch in flight has its page allocations still to make; the room for the
            # first decode token is taken now, so a transferred request can always start
            reserve = drep.crossings(drep.k) if drep.state == EPOCH else 0
            if not drep.grow(job, p + 1, reserve=reserve):
                return
            drep.pending.popleft()
            moved = p - min(hit * drep.bt, p)
            drep.inbound += 1
            prep = job.on_prem()
            link = prep.link
            if moved and link is not None:
                job.transfer_s = -self.now  # completed in _transfer_done
                self._channel_add(link, job, moved * spec.kv_bytes_per_token)
            else:
                job.transfer_s = 0.0
                self._push(self.now, EV_TRANSFER, job)

    def _transfer_done(self, job: SimJob) -> None:
        prep, drep = job.on_prem(), job.drep
        if drep is None:
            raise RuntimeError(f"simulator bug: request {job.index} transferred to no decode replica")
        if job.transfer_s < 0:
            job.transfer_s += self.now
        prep.free(job, job.held_n, prep.pinned(job, job.held_n))
        prep.held -= 1
        job.held_n = 0
        self._kick(prep)
        drep.inbound -= 1
        job.at = drep
        job.n_computed = job.req.prompt_tokens
        job.n_tokens = job.n_computed + 1
        drep.joining.append(job)
        self._kick(drep)


def _result(job: SimJob) -> RequestResult:
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
    on_first_token: Callable[[int, float], None] | None = None,
    closed_loop_clients: int | None = None,
) -> ReplayResult:
    """Replay ``trace`` through ``router`` against ``fleet``; see the module docstring for the model.

    ``trace`` need not be sorted (requests are taken in arrival order, ties in trace
    order). ``seed`` drives the frontier latency draws (a router has its own seed).
    ``on_complete(result)`` is called for every request at its simulated completion time,
    ``on_first_token(index, t)`` at its first token. ``closed_loop_clients=N`` ignores the
    arrival times: N clients send the requests in trace order, each the next one when its
    previous one completes (``RequestResult.arrival_s`` = the send time).
    Raises ValueError when the router returns an unknown target, a mode the target
    has no pool for, or a replica index out of range, or when a request's block hashes
    do not match the target's ``block_tokens``.
    """
    if timeline_bin_s <= 0:
        raise ValueError(f"timeline_bin_s must be > 0, got {timeline_bin_s}")
    if closed_loop_clients is not None and closed_loop_clients < 1:
        raise ValueError(f"closed_loop_clients must be >= 1, got {closed_loop_clients}")
    sim = _Simulator(fleet, router, seed, timeline_bin_s, on_complete, on_first_token)
    jobs = sim.run(trace, closed_loop_clients)
    for tgt in sim.targets.values():  # every request finished and gave its KV back
        for reps in tgt.pools.values():
            for r in reps:
                if r.cache.used_blocks or r.load() or r.held or r.state != IDLE or r.ndec or r.wake:
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
            work_s=r.work_s,
            prefill_tokens=r.prefill_tokens,
            decode_steps=r.steps,
            restored_tokens=r.restored_tokens,
            preemptions=r.preemptions,
        )
        for tgt in sim.targets.values()
        for reps in tgt.pools.values()
        for r in reps
    ]
    n_bins = int((end - start) // timeline_bin_s) + 1

    def _bins(values: list[float]) -> list[float]:
        return values + [0.0] * (n_bins - len(values))

    timeline = {
        name: {"prefill_busy_gpu_s": _bins(t.prefill_bins), "decode_busy_gpu_s": _bins(t.decode_bins)}
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


__all__ = ["SimFleetView", "SimReplicaView", "simulate"]
