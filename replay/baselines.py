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

**Anchors**: the published replica pickers of the field, re-implemented from their sources
(cited in each class, defaults as shipped), difficulty-blind, over the same replicas as
``OnPremWide`` (``_Anchor``): ``LlmD`` (``llm-d``: llm-d's default scheduling profile),
``DynamoKv`` (``dynamo-kv``: NVIDIA Dynamo's KV router cost), ``SglangCacheAware``
(``sglang-cache-aware``: SGLang's router policy). They see what a gateway sees: the
engines' metrics (waiting requests, KV usage), the real cache content where the original
reads KV events (Dynamo), their own routing history otherwise, and first tokens and
completions (``ObservingRouter``). Block granularity: the trace's 512-token blocks stand in
for their 16-token / 64-character blocks (the traces carry no text).
"""

from __future__ import annotations

import math
import random
from collections import Counter, OrderedDict
from collections.abc import Sequence

from pointsman.datasets.traces import TraceRequest
from pointsman.replay.results import RequestResult
from pointsman.replay.router import Assignment, FleetView, ReplicaView
from pointsman.replay.sim_fleet import AGGREGATED, DISAGGREGATED, ROLE_AGGREGATED, ROLE_PREFILL

#: Tokens per trace block (Mooncake ``hash_ids``), the anchors' block unit here.
TRACE_BLOCK_TOKENS = 512


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


def _slots(fleet: FleetView, targets: tuple[str, ...] | None) -> tuple[list[tuple[str, str, int]], tuple[ReplicaView, ...]]:
    """Every on-prem replica that takes new requests (``OnPremWide``'s order) and its view."""
    slots, views = [], []
    for t in fleet.fleet.on_prem:
        if targets is not None and t.name not in targets:
            continue
        for role, mode in ((ROLE_AGGREGATED, AGGREGATED), (ROLE_PREFILL, DISAGGREGATED)):
            for i, v in enumerate(fleet.replicas(t.name, role)):
                slots.append((t.name, mode, i))
                views.append(v)
    if not slots:
        raise ValueError("the fleet has no on-prem replicas")
    return slots, tuple(views)


class _LRU:
    """An LRU set of block hashes bounded by ``capacity`` (an approximate prefix index)."""

    __slots__ = ("capacity", "_d")

    def __init__(self, capacity: int) -> None:
        self.capacity = max(1, capacity)
        self._d: OrderedDict[int, None] = OrderedDict()

    def __contains__(self, h: object) -> bool:
        return h in self._d

    def __len__(self) -> int:
        return len(self._d)

    def add(self, hashes: Sequence[int]) -> None:
        """Insert or refresh ``hashes`` (head last, so a prefix's head is evicted last)."""
        d = self._d
        for h in reversed(hashes):
            if h in d:
                d.move_to_end(h)
            else:
                d[h] = None
        while len(d) > self.capacity:
            d.popitem(last=False)

    def leading(self, hashes: Sequence[int]) -> int:
        """Leading ``hashes`` present (no recency change)."""
        n = 0
        for h in hashes:
            if h not in self._d:
                break
            n += 1
        return n


class _Anchor:
    """Shared plumbing of the anchors: the candidates are every on-prem replica that takes
    new requests, as for ``OnPremWide`` (aggregated replicas; prefill replicas in
    disaggregated mode, the decode replica the least loaded at prefill end; ``targets``
    limits them), so an anchor uses the same hardware as the other fleet-wide baselines;
    ``choose`` picks one from their views; ``on_first_token`` / ``on_complete`` keep the
    router's own state. ``seed`` drives random tie-breaks."""

    name = "anchor"

    def __init__(self, *, seed: int = 0, targets: tuple[str, ...] | None = None) -> None:
        self.targets = targets
        self.rng = random.Random(seed)
        self._slots: list[tuple[str, str, int]] | None = None
        self._views: tuple[ReplicaView, ...] = ()
        self.routed: dict[int, int] = {}  # trace index -> slot

    def __call__(self, request: TraceRequest, fleet: FleetView) -> Assignment:
        if self._slots is None:
            self._slots, self._views = _slots(fleet, self.targets)
            self.start(self._views)
        i = self.choose(request, self._views)
        self.record(fleet.request_index, request, i)
        target, mode, idx = self._slots[i]
        return Assignment(target, mode, idx)

    def start(self, views: tuple[ReplicaView, ...]) -> None:
        """Size the router's state for ``views`` (called once, at the first request)."""

    def choose(self, request: TraceRequest, views: tuple[ReplicaView, ...]) -> int:
        """Index into ``views`` of the replica for ``request``."""
        raise NotImplementedError

    def record(self, index: int, request: TraceRequest, slot: int) -> None:
        """Book trace request ``index`` routed to ``slot``."""
        self.routed[index] = slot

    def on_first_token(self, index: int, time_s: float, /) -> None:
        """An on-prem request's first token (nothing to do by default)."""

    def on_complete(self, result: RequestResult, /) -> None:
        """A request completed or was refused: forget it."""
        self.routed.pop(result.index, None)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class LlmD(_Anchor):
    """llm-d's default scheduling profile: ``queue-scorer`` 2, ``kv-cache-utilization-scorer`` 2,
    ``prefix-cache-scorer`` 3, ``max-score-picker``, no filters.

    Source: the EPP's built-in default (``llm-d/llm-d-inference-scheduler``
    ``pkg/epp/config/loader/defaults.go`` @520af478, ``loadDefaultConfig``; the same weights in
    the llm-d "inference-scheduling" guide's values, ``llm-d/llm-d``
    ``guides/inference-scheduling/scheduler/inference-scheduling.values.yaml`` @086f217d).
    Per candidate ``r`` (scorers under ``pkg/epp/framework/plugins/scheduling/scorer/``):

    - queue = (max q - q_r) / (max q - min q) over the candidates, q = ``num_requests_waiting``;
      1.0 for all when max = min (``queuedepth/queue.go``);
    - kv = 1 - ``kv_cache_usage`` (``kvcacheutilization``);
    - prefix = matched blocks / request blocks (``prefix/plugin.go``), from the approximate
      prefix producer (``approximateprefix``): a per-replica LRU of the block hashes routed
      there, capacity = the replica's KV blocks (``autoTune`` from ``CacheNumBlocks``), only
      the first ``maxPrefixBlocksToMatch`` 256 x 16-token blocks = 4,096 tokens hashed (here
      the first 8 trace blocks); matched = the replica's share of the longest leading run any
      replica holds (``matchLongestPrefix``); after the pick all those hashes go to the
      chosen replica's LRU (``PreRequest``);
    - score = 2 queue + 2 kv + 3 prefix (clamped scores times weights, summed, not
      normalised); the highest wins, ties uniformly at random (shuffle, then stable sort).

    The saturation detector sheds only requests with negative priority; replayed requests
    have none, so it is left out. Without block hashes (Azure) prefix is 0: queue + KV balancing.
    """

    name = "llm-d"
    #: (queue, kv-cache-utilization, prefix-cache) weights of the default profile.
    WEIGHTS = (2.0, 2.0, 3.0)
    #: maxPrefixBlocksToMatch 256 x blockSizeTokens 16.
    MAX_PREFIX_TOKENS = 256 * 16

    def start(self, views: tuple[ReplicaView, ...]) -> None:
        """One LRU index per replica, sized to its KV capacity in trace blocks."""
        self.index = [_LRU(v.kv_capacity_tokens // TRACE_BLOCK_TOKENS) for v in views]

    def scores(self, request: TraceRequest, views: tuple[ReplicaView, ...]) -> list[float]:
        """The weighted score of every candidate for ``request`` (no state change)."""
        wq, wk, wp = self.WEIGHTS
        hashes = (request.block_hashes or ())[: math.ceil(self.MAX_PREFIX_TOKENS / TRACE_BLOCK_TOKENS)]
        q = [v.num_requests_waiting for v in views]
        qmin, qmax = min(q), max(q)
        run = []
        for h in hashes:
            if not any(h in idx for idx in self.index):
                break
            run.append(h)
        out = []
        for v, idx, qr in zip(views, self.index, q):
            s_q = 1.0 if qmax == qmin else (qmax - qr) / (qmax - qmin)
            s_kv = min(1.0, max(0.0, 1.0 - v.kv_cache_usage))
            s_p = sum(1 for h in run if h in idx) / len(hashes) if hashes else 0.0
            out.append(wq * s_q + wk * s_kv + wp * s_p)
        return out

    def choose(self, request: TraceRequest, views: tuple[ReplicaView, ...]) -> int:
        """The highest score; ties uniformly at random."""
        scores = self.scores(request, views)
        top = max(scores)
        best = [i for i, x in enumerate(scores) if x == top]
        return best[0] if len(best) == 1 else self.rng.choice(best)

    def record(self, index: int, request: TraceRequest, slot: int) -> None:
        """``PreRequest``: the hashed prefix goes to the chosen replica's LRU."""
        hashes = (request.block_hashes or ())[: math.ceil(self.MAX_PREFIX_TOKENS / TRACE_BLOCK_TOKENS)]
        if hashes:
            self.index[slot].add(hashes)


class DynamoKv(_Anchor):
    """NVIDIA Dynamo's KV router: the worker with the lowest cost
    ``overlap_score_weight * prefill_blocks + decode_blocks`` (a logit, lower is better).

    Source: ``ai-dynamo/dynamo`` ``lib/llm/src/kv_router/scheduler.rs`` @db19bd2a
    (``DefaultWorkerSelector::select_worker``, ``softmax_sample``) and ``sequence.rs`` @581ee33e
    (``ActiveSequences``); defaults ``KvRouterConfig::default()`` (``config.rs`` @0435b58a):
    ``overlap_score_weight`` 1.0, ``router_temperature`` 0.0, output blocks not tracked. Per worker w:

    - overlap(w) = leading request blocks cached on w (KV events: the simulator's real cache);
    - new(w) = max(0, prompt tokens - overlap(w) x block size);
    - prefill_blocks(w) = (prefill tokens routed to w and not yet prefilled + new(w)) / block
      size (the router's tracker: added at routing, removed at the first token);
    - decode_blocks(w) = distinct block hashes of w's active requests (routed, not finished)
      plus this request's blocks not among them;
    - temperature 0: every worker with the minimum logit is a candidate, ties to the
      smallest index tree (blocks cached on the worker), then at random; temperature T > 0:
      probabilities proportional to exp(-(logit - min) / ((max - min) x T)).

    The block size is the trace's (512 tokens; Dynamo uses the engine's, 16 with vLLM).
    Without block hashes: least queued prefill work.
    """

    name = "dynamo-kv"
    OVERLAP_SCORE_WEIGHT = 1.0
    TEMPERATURE = 0.0

    def __init__(self, *, seed: int = 0, targets: tuple[str, ...] | None = None,
                 overlap_score_weight: float = OVERLAP_SCORE_WEIGHT, temperature: float = TEMPERATURE) -> None:
        super().__init__(seed=seed, targets=targets)
        self.weight = overlap_score_weight
        self.temperature = temperature
        self._pending: dict[int, int] = {}  # trace index -> its new prefill tokens, until its first token

    def start(self, views: tuple[ReplicaView, ...]) -> None:
        """The tracker: queued prefill tokens and active block hashes per worker."""
        self.prefill_tokens = [0] * len(views)
        self.active: list[Counter[int]] = [Counter() for _ in views]
        self._new: list[int] = []
        self._hashes: dict[int, frozenset[int]] = {}

    def logits(self, request: TraceRequest, views: tuple[ReplicaView, ...]) -> list[float]:
        """Every worker's logit for ``request`` (no state change); also keeps each worker's
        new prefill tokens for ``record``."""
        hashes = request.block_hashes or ()
        distinct = set(hashes)
        out, self._new = [], []
        for v, queued, act in zip(views, self.prefill_tokens, self.active):
            overlap = v.cached_prefix_blocks(hashes) if hashes else 0
            new = max(0, request.prompt_tokens - overlap * TRACE_BLOCK_TOKENS)
            self._new.append(new)
            decode = len(act) + sum(1 for h in distinct if h not in act)
            out.append(self.weight * (queued + new) / TRACE_BLOCK_TOKENS + decode)
        return out

    def choose(self, request: TraceRequest, views: tuple[ReplicaView, ...]) -> int:
        """Argmin of the logits (temperature 0: ties to the smallest tree, then random), or a
        softmax draw at temperature > 0."""
        logits = self.logits(request, views)
        lo, hi = min(logits), max(logits)
        if self.temperature <= 0 or hi == lo:
            cands = [i for i, x in enumerate(logits) if x == lo]
            smallest = min(views[i].cached_blocks for i in cands)
            cands = [i for i in cands if views[i].cached_blocks == smallest]
            return cands[0] if len(cands) == 1 else self.rng.choice(cands)
        weights = [math.exp(-(x - lo) / ((hi - lo) * self.temperature)) for x in logits]
        return self.rng.choices(range(len(logits)), weights)[0]

    def record(self, index: int, request: TraceRequest, slot: int) -> None:
        """Add the request's new prefill tokens and its blocks to the chosen worker."""
        super().record(index, request, slot)
        new = self._new[slot]
        self.prefill_tokens[slot] += new
        self._pending[index] = new
        hashes = frozenset(request.block_hashes or ())
        self._hashes[index] = hashes
        self.active[slot].update(hashes)

    def on_first_token(self, index: int, time_s: float, /) -> None:
        """Prefill done (``mark_prefill_completed``): its tokens leave the worker's queue."""
        self._prefill_done(index)

    def _prefill_done(self, index: int) -> None:
        new = self._pending.pop(index, None)
        slot = self.routed.get(index)
        if new is not None and slot is not None:
            self.prefill_tokens[slot] -= new

    def on_complete(self, result: RequestResult, /) -> None:
        """``free``: the request's blocks leave the worker's active set (its prefill too, if it
        never ran there: spilled or refused)."""
        self._prefill_done(result.index)
        slot = self.routed.get(result.index)
        hashes = self._hashes.pop(result.index, frozenset())
        if slot is not None and hashes:
            act = self.active[slot]
            act.subtract(hashes)
            for h in hashes:
                if act[h] <= 0:
                    del act[h]
        super().on_complete(result)


class SglangCacheAware(_Anchor):
    """SGLang's router, ``cache_aware`` policy (sgl-model-gateway), with the CLI defaults.

    Source: ``sgl-project/sglang`` ``sgl-model-gateway/src/policies/cache_aware.rs`` @b93974f1;
    defaults of ``python -m sglang_router.launch_router`` (``router_args.py`` @6614f984):
    ``cache_threshold`` 0.3, ``balance_abs_threshold`` 64, ``balance_rel_threshold`` 1.5,
    ``max_tree_size`` 2^26 characters (the Rust library's defaults are 0.5 / 32 / 1.1 and
    10,000, ``policies/mod.rs`` @0edb07a1). Per request:

    - load(w) = requests the router sent to w that have not completed (its own counter);
    - imbalanced iff max load - min load > 64 and max load > 1.5 x min load: the least
      loaded worker (the first on ties);
    - otherwise the longest prefix match in the router's approximate tree of routed
      requests: if matched / request length > 0.3, the worker holding the deepest match
      (the first on ties), else the least loaded worker;
    - the request's blocks are then inserted under the chosen worker.

    The tree holds routed block hashes per worker (LRU), matched in trace blocks instead of
    characters; its cap is 2^26 characters / 4 characters per token / 512 tokens = 32,768
    blocks per worker, enforced at insertion (SGLang evicts every 60 s). Without block hashes
    the match rate is 0: least loaded, unless imbalanced (the same).
    """

    name = "sglang-cache-aware"
    CACHE_THRESHOLD = 0.3
    BALANCE_ABS_THRESHOLD = 64
    BALANCE_REL_THRESHOLD = 1.5
    #: max_tree_size 2^26 characters at 4 characters per token, in 512-token blocks.
    MAX_TREE_BLOCKS = 2**26 // (4 * TRACE_BLOCK_TOKENS)

    def start(self, views: tuple[ReplicaView, ...]) -> None:
        """Per worker: the router's load counter and its tree of routed blocks."""
        self.load = [0] * len(views)
        self.tree = [_LRU(self.MAX_TREE_BLOCKS) for _ in views]

    def choose(self, request: TraceRequest, views: tuple[ReplicaView, ...]) -> int:
        """See the class docstring."""
        load = self.load
        lo, hi = min(load), max(load)
        least = load.index(lo)
        if hi - lo > self.BALANCE_ABS_THRESHOLD and hi > lo * self.BALANCE_REL_THRESHOLD:
            return least
        hashes = request.block_hashes or ()
        if not hashes:
            return least
        matched = [t.leading(hashes) for t in self.tree]
        best = max(range(len(matched)), key=lambda i: (matched[i], -i))
        return best if matched[best] / len(hashes) > self.CACHE_THRESHOLD else least

    def record(self, index: int, request: TraceRequest, slot: int) -> None:
        """Insert the request under the chosen worker; count it in its load."""
        super().record(index, request, slot)
        if request.block_hashes:
            self.tree[slot].add(request.block_hashes)
        self.load[slot] += 1

    def on_complete(self, result: RequestResult, /) -> None:
        """The request is done: it leaves its worker's load."""
        slot = self.routed.get(result.index)
        if slot is not None:
            self.load[slot] -= 1
        super().on_complete(result)


ANCHORS: dict[str, type[_Anchor]] = {cls.name: cls for cls in (LlmD, DynamoKv, SglangCacheAware)}
"""Anchor router classes by name: llm-d, dynamo-kv, sglang-cache-aware."""
