"""Fleet shapes: how many replicas each on-prem pool has, whether a model runs aggregated,
disaggregated (prefill + decode pools) or both, how large its shared KV tier is, and which GPU
type the fleet rents; and the fleet file each shape becomes.

``ShapeSpace.of(fleet_doc, fleet, ...)`` reads the base fleet (the YAML document as loaded and its
validated ``Fleet``): every on-prem target's pools are templates. A target may be disaggregated
only when the base fleet declares its prefill and decode pools (their replica settings are the
templates). Its shared KV tier capacity is one of ``kv_levels`` (0 = no tier): the base tier's
capacity times ``KV_FACTORS``. ``ShapeSpace.fleet_text(shape)`` writes the base document with
the shape's endpoint lists, tier and GPU; new endpoints are named after the base ones
(``llama-70b-prefill-2``), URLs placeholders in the base's pattern: replace them when you deploy.

A disaggregated target's prefill replicas may be wider than the template (``Pools.prefill_tp``: 2 or
4 times its ``gpus_per_replica``, at most ``MAX_GPUS_PER_REPLICA``): tensor parallelism over more
GPUs divides a long prompt's prefill time, which no number of replicas can (a prompt whose prefill
on an idle template replica exceeds the TTFT objective misses it on any count of them). The wider
pool's ``prefill_tokens_per_s`` and ``decode_tokens_per_s`` scale with its GPUs and its KV cache
gets 90% of the added HBM; the simulator derives its FLOP/s and bandwidth from the GPU count
(``replay.hardware``: linear in the GPUs, with the target's calibrated MFU: an optimistic reading of
tensor parallelism, which loses some of it to all-reduces).

A target's pools that decode (aggregated and decode) may run with a smaller step budget than the
template's (``Pools.max_num_batched_tokens``: one of ``STEP_TOKENS``; vLLM's
``--max-num-batched-tokens``, the pool's ``max_num_batched_tokens``): a step then carries a prefill
chunk of at most that many tokens beside the answers decoding there, so a long prompt stalls each of
their steps by one small chunk instead of its whole prefill (a 512-token budget on the packaged 70B
replica: 42 ms at most). The policy's stall check reads the same budget
(``policy.selection.latency.batch_tpot_s``), and the simulator schedules with it. Prefill pools keep
the template's budget (a larger one prefills no slower).

``policy_text(shape)`` is the policy the shape is replayed with: its tuned settings
(``plan.tuning``) and, when the shape has a P/D pool smaller than the policy's
``disaggregation.min_pool_gpus`` guard (12 GPUs by default), that guard lowered to the pool's
GPUs: a P/D pool the plan rents is one the policy may use (otherwise every request stays
aggregated and the pool's replicas idle or serve as aggregated ones).

A target with no replica at all is left out of the fleet file (a pool nobody uses is not rented):
valid only when the policy compiles without it, e.g. the default policy, whose 8B rules are
``if_fleet_has: [onprem-8b]`` (``policy.rules.schema``); at least one on-prem target stays.

A GPU type other than the base fleet's (``plan.prices.GPU_PRICES``, or your quote:
``ShapeSpace.with_prices``) sets ``replay.gpu``, ``usd_per_gpu_hour`` and ``power_kw_per_gpu`` of
every on-prem target, scales each pool's
``prefill_tokens_per_s`` by the ratio of dense matmul FLOP/s and ``decode_tokens_per_s`` by the
ratio of HBM bandwidth (what the engine's cost model reads), and gives each replica's KV cache
90% of the extra HBM (vLLM's ``gpu_memory_utilization``).
"""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace

import yaml

from pointsman.plan.prices import GPU_PRICES, HOURS_PER_MONTH, GPUPrice, kv_tier_usd_per_month
from pointsman.plan.tuning import Tuning, TuningSpace
from pointsman.policy.fleet import Fleet, OnPremTarget
from pointsman.replay.hardware import GPU_PRESETS

#: Shared KV tier capacities searched, as multiples of the base fleet's tier (0 = no tier).
KV_FACTORS = (0.0, 0.5, 1.0, 2.0)

#: GPUs of the widest replica searched (one 8-GPU node).
MAX_GPUS_PER_REPLICA = 8

#: ``disaggregation.min_pool_gpus`` of a policy that does not set it (``DisaggregationSpec``'s default).
DEFAULT_MIN_POOL_GPUS = 12

#: Step budgets (tokens per engine step) searched for the pools that decode, besides the template's.
STEP_TOKENS = (2048, 512)

#: Idle power as a share of busy power (``replay.hardware``'s H100 assumption, 70 W of 700 W).
IDLE_POWER_SHARE = 0.1

ROLES = ("aggregated", "prefill", "decode")


@dataclass(frozen=True, order=True)
class Pools:
    """Replica counts of one on-prem target (``aggregated``, ``prefill``, ``decode``), the
    index of its shared KV tier capacity in ``TargetSpace.kv_levels``, ``prefill_tp``: how many
    times the template's GPUs each prefill replica has (1, 2 or 4) and ``max_num_batched_tokens``:
    the step budget of its aggregated and decode pools (0: the template's; else one of
    ``STEP_TOKENS``; module docstring)."""

    aggregated: int
    prefill: int = 0
    decode: int = 0
    kv_level: int = 0
    prefill_tp: int = 1
    max_num_batched_tokens: int = 0

    def count(self, role: str) -> int:
        """Replicas of the pool with ``role``."""
        return int(getattr(self, role))


@dataclass(frozen=True, order=True)
class Shape:
    """One fleet shape: ``pools`` per on-prem target (in the base fleet's order) and ``gpu``, the
    GPU preset every on-prem replica runs on; ``tuning``: the policy's settings replayed with it
    (``plan.tuning``: one value index per knob; () when nothing is tuned)."""

    pools: tuple[tuple[str, Pools], ...]
    gpu: str
    tuning: Tuning = ()

    def of(self, target: str) -> Pools:
        """The pools of ``target``."""
        return dict(self.pools)[target]

    def with_pools(self, target: str, pools: Pools) -> Shape:
        """This shape with ``target``'s pools replaced."""
        return replace(self, pools=tuple((n, pools if n == target else p) for n, p in self.pools))


@dataclass(frozen=True)
class TargetSpace:
    """What may change in one on-prem target: ``gpus_per_replica`` by role, ``disaggregable``
    (the base declares prefill and decode pools), ``kv_levels`` (tier capacities in tokens, 0
    first), ``kv_bytes_per_token``, its ``usd_per_gpu_hour``, ``power_kw_per_gpu`` and
    ``usd_per_kwh`` on the base GPU."""

    name: str
    gpus_per_replica: Mapping[str, int]
    disaggregable: bool
    kv_levels: tuple[int, ...]
    kv_bytes_per_token: int
    usd_per_gpu_hour: float
    power_kw_per_gpu: float
    usd_per_kwh: float


def _base_gpu(target: OnPremTarget) -> str:
    return (target.replay.gpu if target.replay is not None and target.replay.gpu else None) or "H100-SXM"


@dataclass(frozen=True)
class ShapeSpace:
    """The shapes a plan searches (module docstring): ``targets`` in the base fleet's order,
    ``gpus`` (GPU presets; the base fleet's first), ``max_replicas`` per pool, ``base`` (the base
    fleet's own shape, the policy as written) and the base fleet ``doc`` (YAML as loaded);
    ``prices``: the price of each GPU type but the base's (list, or your quote: ``of``);
    ``policy``: the policy settings searched with the shape (``with_policy``); ``kv_tiers``: False
    when the trace has no prefix block ids, so no request can restore a prefix from a tier and no
    shape but the base (compared as it is) has one (``without_kv_tiers``)."""

    doc: Mapping[str, object]
    targets: tuple[TargetSpace, ...]
    gpus: tuple[str, ...]
    max_replicas: int
    base: Shape
    prices: Mapping[str, GPUPrice] = field(default_factory=dict)
    policy: TuningSpace = field(default_factory=lambda: TuningSpace({}))
    kv_tiers: bool = True

    def without_kv_tiers(self) -> ShapeSpace:
        """This space with no shared KV tier in any shape but the base (a trace without prefix block ids)."""
        return replace(self, kv_tiers=False)

    def with_policy(self, policy: TuningSpace) -> ShapeSpace:
        """This space searching ``policy``'s knobs too (the base shape takes the policy as written)."""
        return replace(self, policy=policy, base=replace(self.base, tuning=policy.base))

    def with_prices(self, quotes: Mapping[str, float]) -> ShapeSpace:
        """This space with your USD per GPU-hour of some of the other GPU types (``quotes``, by preset
        name; the rest stay at list). Raises ``ValueError`` for a GPU type not considered, the base
        fleet's (the fleet file's ``usd_per_gpu_hour`` prices it), or a price that is not a positive
        finite number."""
        for g, usd in quotes.items():
            if g == self.gpus[0]:
                raise ValueError(f"{g} is the base fleet's GPU: the fleet file's usd_per_gpu_hour prices it")
            if g not in self.prices:
                raise ValueError(f"{g} is not among the other GPU types considered ({', '.join(self.prices) or 'none'}): "
                                 "add it to --gpus")
            if not math.isfinite(usd) or usd <= 0:
                raise ValueError(f"{g}: expected a positive number of USD per GPU-hour, not {usd:g}")
        return replace(self, prices={g: replace(p, usd_per_gpu_hour=quotes[g], source="your quote") if g in quotes else p
                                     for g, p in self.prices.items()})

    @classmethod
    def of(cls, doc: Mapping[str, object], fleet: Fleet, kv_bytes: Mapping[str, int], *,
           gpus: tuple[str, ...] = (), max_replicas: int = 8) -> ShapeSpace:
        """The space around the base fleet ``doc`` / ``fleet``; ``kv_bytes``: KV bytes per token
        of each on-prem target (the simulator's). ``gpus``: GPU presets to consider besides the
        base one, at list prices (``GPU_PRICES``; ``with_prices``). Raises ``ValueError`` for a GPU
        without a price or datasheet, or on-prem targets on different GPUs when ``gpus`` asks to
        change them."""
        targets: list[TargetSpace] = []
        pools: list[tuple[str, Pools]] = []
        base_gpus = set()
        for name, t in fleet.targets.items():
            if not isinstance(t, OnPremTarget):
                continue
            base_gpus.add(_base_gpu(t))
            roles = t.pools_by_role()
            tier = t.shared_kv.capacity_tokens if t.shared_kv is not None else 0
            levels = tuple(sorted({int(tier * f) for f in KV_FACTORS})) if tier else (0,)
            targets.append(TargetSpace(
                name, {r: p.gpus_per_replica for r, p in roles.items()}, "prefill" in roles, levels,
                kv_bytes[name], t.usd_per_gpu_hour, t.power_kw_per_gpu, t.usd_per_kwh))
            pools.append((name, Pools(len(roles["aggregated"].endpoints) if "aggregated" in roles else 0,
                                      len(roles["prefill"].endpoints) if "prefill" in roles else 0,
                                      len(roles["decode"].endpoints) if "decode" in roles else 0,
                                      levels.index(tier))))
        base_gpu = sorted(base_gpus)[0] if base_gpus else "H100-SXM"
        extra = tuple(g for g in gpus if g != base_gpu)
        for g in extra:
            if g not in GPU_PRICES or g not in GPU_PRESETS:
                raise ValueError(f"unknown GPU {g!r} (known: {', '.join(GPU_PRICES)})")
        if extra and len(base_gpus) > 1:
            raise ValueError(f"the fleet's on-prem targets run on different GPUs ({', '.join(sorted(base_gpus))}); "
                             "--gpus needs one")
        top = max((p.count(r) for _, p in pools for r in ROLES), default=1)
        return cls(doc, tuple(targets), (base_gpu, *extra), max(max_replicas, top), Shape(tuple(pools), base_gpu),
                   {g: GPU_PRICES[g] for g in extra})

    # -- the space ---------------------------------------------------------------------------

    def target(self, name: str) -> TargetSpace:
        """The ``TargetSpace`` named ``name``."""
        return next(t for t in self.targets if t.name == name)

    def valid(self, shape: Shape) -> bool:
        """Counts within 0..max_replicas, prefill and decode both or neither (and only where the
        base declares them), an aggregated or prefill replica in each target kept (one without
        any replica is dropped; at least one target is kept), a known tier level (none without
        ``kv_tiers``) and step budget."""
        if self.targets and all(_dropped(shape.of(t.name)) for t in self.targets):
            return False
        for t in self.targets:
            p = shape.of(t.name)
            counts = (p.aggregated, p.prefill, p.decode)
            if min(counts) < 0 or max(counts) > self.max_replicas or not 0 <= p.kv_level < len(t.kv_levels):
                return False
            if not self.kv_tiers and t.kv_levels[p.kv_level] and not _dropped(p):
                return False
            if (p.prefill > 0) != (p.decode > 0) or (p.prefill and not t.disaggregable):
                return False
            if p.prefill_tp not in (1, 2, 4) or (p.prefill_tp > 1 and not p.prefill) \
                    or p.prefill_tp * t.gpus_per_replica.get("prefill", 1) > MAX_GPUS_PER_REPLICA:
                return False
            if (p.aggregated + p.prefill == 0 and not _dropped(p)) or p.max_num_batched_tokens not in (0, *STEP_TOKENS):
                return False
        return shape.gpu in self.gpus and len(shape.tuning) == len(self.policy.knobs)

    def neighbors(self, shape: Shape) -> Iterator[Shape]:
        """Valid shapes one step away: one replica more or fewer in one pool, one moved between
        two pools of a target, all of a target's replicas switched between aggregated and
        prefill + decode (GPUs kept), prefill replicas twice or half as wide, another step budget,
        the next tier capacity up or down (none without ``kv_tiers``), another GPU type, one policy
        knob to its next value (``TuningSpace.neighbors``)."""
        seen: set[Shape] = set()

        def emit(s: Shape) -> Iterator[Shape]:
            for gone in self.targets:  # a dropped target's tier, width and budget do not exist: one shape
                if _dropped(s.of(gone.name)):
                    s = s.with_pools(gone.name, Pools(0))
                elif not self.kv_tiers:  # the base's neighbours without its tier
                    s = s.with_pools(gone.name, replace(s.of(gone.name), kv_level=0))
            if s != shape and s not in seen and self.valid(s):
                seen.add(s)
                yield s

        for t in self.targets:
            p = shape.of(t.name)
            for role in ROLES:
                for d in (-1, 1):
                    yield from emit(shape.with_pools(t.name, replace(p, **{role: p.count(role) + d})))
                    if role != "aggregated" and p.count(role) + d == 0:  # the pair goes together
                        yield from emit(shape.with_pools(t.name, replace(p, prefill=0, decode=0, prefill_tp=1)))
            if t.disaggregable and p.prefill == 0:
                yield from emit(shape.with_pools(t.name, replace(p, prefill=1, decode=1)))
                yield from emit(shape.with_pools(t.name, replace(p, aggregated=p.aggregated - 2, prefill=1, decode=1)))
            for a in ROLES:
                for b in ROLES:
                    if a != b:
                        yield from emit(shape.with_pools(t.name, replace(p, **{a: p.count(a) - 1, b: p.count(b) + 1})))
            if t.disaggregable and p.aggregated >= 2 and p.prefill == 0:
                half = p.aggregated // 2
                yield from emit(shape.with_pools(t.name, replace(p, aggregated=0, prefill=p.aggregated - half,
                                                                 decode=half)))
            if p.prefill:
                yield from emit(shape.with_pools(t.name, replace(p, aggregated=p.aggregated + p.prefill + p.decode,
                                                                 prefill=0, decode=0, prefill_tp=1)))
                for tp in (p.prefill_tp * 2, p.prefill_tp // 2):
                    yield from emit(shape.with_pools(t.name, replace(p, prefill_tp=tp)))
            for budget in (0, *STEP_TOKENS):
                yield from emit(shape.with_pools(t.name, replace(p, max_num_batched_tokens=budget)))
            for d in (-1, 1):
                yield from emit(shape.with_pools(t.name, replace(p, kv_level=p.kv_level + d)))
        for g in self.gpus:
            yield from emit(replace(shape, gpu=g))
        for tuning in self.policy.neighbors(shape.tuning):
            yield from emit(replace(shape, tuning=tuning))

    def covered_by(self, small: Shape, big: Shape) -> bool:
        """Whether ``big`` has at least as many replicas in every pool, prefill replicas at least as
        wide and at least the tier of ``small``, on the same GPU type, step budgets and policy
        settings (so ``small`` cannot serve more, if capacity never hurts)."""
        if small.gpu != big.gpu or small.tuning != big.tuning:
            return False
        for t in self.targets:
            a, b = small.of(t.name), big.of(t.name)
            if a.aggregated > b.aggregated or a.prefill > b.prefill or a.decode > b.decode or a.kv_level > b.kv_level \
                    or (a.prefill and a.prefill_tp > b.prefill_tp) or a.max_num_batched_tokens != b.max_num_batched_tokens:
                return False
        return True

    # -- prices ------------------------------------------------------------------------------

    def _rates(self, t: TargetSpace, gpu: str) -> tuple[float, float]:
        if gpu == self.gpus[0]:
            return t.usd_per_gpu_hour, t.power_kw_per_gpu
        price = self.prices[gpu]
        return price.usd_per_gpu_hour, price.power_kw_per_gpu

    def gpus_of(self, shape: Shape, target: str | None = None) -> int:
        """On-prem GPUs of ``shape`` (of one ``target`` when given)."""
        total = 0
        for t in self.targets:
            if target is None or t.name == target:
                p = shape.of(t.name)
                total += sum(p.count(r) * t.gpus_per_replica.get(r, t.gpus_per_replica.get("aggregated", 1))
                             * (p.prefill_tp if r == "prefill" else 1) for r in ROLES)
        return total

    def kv_tier_tokens(self, shape: Shape, target: str) -> int:
        """Shared KV tier capacity of ``target`` in ``shape``, tokens (0 = none)."""
        p = shape.of(target)
        return 0 if _dropped(p) else self.target(target).kv_levels[p.kv_level]

    def kv_usd_per_month(self, shape: Shape) -> float:
        """DRAM rent of every shared KV tier of ``shape`` per month (``plan.prices``)."""
        return sum(kv_tier_usd_per_month(self.kv_tier_tokens(shape, t.name), t.kv_bytes_per_token)
                   for t in self.targets)

    def floor_usd_per_month(self, shape: Shape) -> float:
        """A lower bound of ``shape``'s monthly cost without replaying it: GPU rent, idle power and
        the KV tiers' DRAM (busy power and frontier bills can only add)."""
        total = self.kv_usd_per_month(shape)
        for t in self.targets:
            usd_h, kw = self._rates(t, shape.gpu)
            total += self.gpus_of(shape, t.name) * (usd_h + kw * IDLE_POWER_SHARE * t.usd_per_kwh) * HOURS_PER_MONTH
        return total

    def label(self, shape: Shape) -> str:
        """``onprem-8b A2 | onprem-70b A2 P2 D4 KV1.5M`` (``P2/TP4``: prefill replicas of 4 GPUs, wider
        than the template's; ``B512``: a step budget of 512 tokens) (+ `` | H200-SXM`` off the base GPU, + `` |
        p_hard_frontier=0.61`` for policy knobs off the policy's own values)."""
        parts = []
        for t in self.targets:
            p = shape.of(t.name)
            if _dropped(p):
                parts.append(f"{t.name} none")
                continue
            wide = f"/TP{p.prefill_tp * t.gpus_per_replica.get('prefill', 1)}" if p.prefill_tp > 1 else ""
            s = f"{t.name} A{p.aggregated}" + (f" P{p.prefill}{wide} D{p.decode}" if p.prefill else "")
            tier = t.kv_levels[p.kv_level]
            if tier:
                s += f" KV{tier / 1e6:g}M"
            if p.max_num_batched_tokens:
                s += f" B{p.max_num_batched_tokens}"
            parts.append(s)
        knobs = self.policy.label(shape.tuning)
        return " | ".join(parts) + ("" if shape.gpu == self.gpus[0] else f" | {shape.gpu}") \
            + (f" | {knobs}" if knobs else "")

    # -- the policy --------------------------------------------------------------------------

    def pd_guard(self, shape: Shape) -> int | None:
        """The ``disaggregation.min_pool_gpus`` the shape's policy needs (module docstring): the GPUs
        of its smallest P/D pool when that is below the policy's own guard, else None."""
        if not self.policy.doc:  # no policy document: the policy file as written
            return None
        section = self.policy.doc.get("disaggregation")
        own = section.get("min_pool_gpus", DEFAULT_MIN_POOL_GPUS) if isinstance(section, dict) else \
            DEFAULT_MIN_POOL_GPUS
        pd = [self.gpus_of(replace(shape, pools=((t.name, replace(shape.of(t.name), aggregated=0)),)), t.name)
              for t in self.targets if shape.of(t.name).prefill]
        return min(pd) if pd and min(pd) < own else None

    def policy_as_written(self, shape: Shape) -> bool:
        """Whether ``shape`` replays the policy file itself (no setting tuned, no guard lowered)."""
        return shape.tuning == self.base.tuning and self.pd_guard(shape) is None

    def policy_text(self, shape: Shape, header: str = "") -> str:
        """The policy ``shape`` is replayed with, as YAML after ``header`` comment lines (module docstring)."""
        return self.policy.policy_text(shape.tuning, header, self.pd_guard(shape))

    # -- the fleet file ----------------------------------------------------------------------

    def fleet_doc(self, shape: Shape) -> dict[str, object]:
        """The base fleet document with ``shape`` applied (module docstring)."""
        doc: dict[str, object] = copy.deepcopy(dict(self.doc))
        targets = doc["targets"]
        assert isinstance(targets, dict)
        for t in self.targets:
            p = shape.of(t.name)
            if _dropped(p):
                del targets[t.name]
                continue
            raw = targets[t.name]
            pools = raw["pools"]
            templates = {r: pools.get(r) for r in ROLES}
            templates["aggregated"] = templates["aggregated"] or templates["prefill"]
            for role in ROLES:
                n = p.count(role)
                if n == 0:
                    pools.pop(role, None)
                    continue
                pool = copy.deepcopy(templates[role])
                pool["endpoints"] = _endpoints(pool.get("endpoints", []), n, f"{t.name}-{role}")
                if role == "prefill" and p.prefill_tp > 1:
                    _widen(pool, p.prefill_tp, self.gpus[0], t.kv_bytes_per_token)
                if role != "prefill" and p.max_num_batched_tokens:
                    pool["max_num_batched_tokens"] = p.max_num_batched_tokens
                pools[role] = pool
            mode = raw.get("default_mode")
            if (mode == "aggregated" and not p.aggregated) or (mode == "disaggregated" and not p.prefill):
                raw["default_mode"] = "disaggregated" if p.prefill else "aggregated"  # the mode the shape has
            tier = t.kv_levels[p.kv_level]
            if tier:
                raw["shared_kv"]["capacity_tokens"] = tier
            else:
                raw.pop("shared_kv", None)
            if shape.gpu != self.gpus[0]:
                _regpu(raw, self.gpus[0], self.prices[shape.gpu], t.kv_bytes_per_token)
        return doc

    def fleet_text(self, shape: Shape, header: str = "", labels: Mapping[str, str] | None = None) -> str:
        """``fleet_doc(shape)`` as YAML, after ``header`` comment lines, with ``labels`` added to
        ``metadata.labels``."""
        doc = self.fleet_doc(shape)
        if labels:
            meta = doc.setdefault("metadata", {})
            assert isinstance(meta, dict)
            meta.setdefault("labels", {}).update(labels)
        body = yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, width=120)
        comments = "".join(f"# {line}\n" if line else "#\n" for line in header.splitlines())
        return comments + body


def _dropped(p: Pools) -> bool:
    """Whether a target with pools ``p`` is left out of the fleet (no replica at all)."""
    return p.aggregated == p.prefill == p.decode == 0


def _endpoints(base: list[object], n: int, stem: str) -> list[object]:
    """``n`` endpoints: the base's first ones, then new ones named and addressed after the base's
    first (its trailing number counted on), or ``stem-i`` when it has none."""
    out = [copy.deepcopy(e) for e in base[:n]]
    first = base[0] if base else None
    first_name = first.get("name") if isinstance(first, dict) else None
    first_url = first.get("url") if isinstance(first, dict) else first if isinstance(first, str) else None
    prefix = re.sub(r"\d+$", "", first_name) if first_name else f"{stem}-"
    for i in range(len(out), n):
        name = f"{prefix}{i}"
        url = first_url.replace(first_name, name) if first_url and first_name and first_name in first_url \
            else f"http://{name}.invalid:8000/v1"
        out.append({"name": name, "url": url})
    return out


def _widen(pool: dict[str, object], times: int, gpu: str, kv_bytes: int) -> None:
    """Make one pool's replicas ``times`` as wide (module docstring), on GPU preset ``gpu``."""
    gpus = int(pool["gpus_per_replica"])  # type: ignore[call-overload]
    pool["gpus_per_replica"] = gpus * times
    for key in ("prefill_tokens_per_s", "decode_tokens_per_s"):
        pool[key] = round(float(pool[key]) * times, 1)  # type: ignore[arg-type]
    if pool.get("kv_cache_capacity_tokens"):
        extra = gpus * (times - 1) * GPU_PRESETS[gpu].hbm_bytes * 0.9 / kv_bytes
        pool["kv_cache_capacity_tokens"] = int(pool["kv_cache_capacity_tokens"] + extra)


def _regpu(raw: dict[str, object], old: str, price: GPUPrice, kv_bytes: int) -> None:
    """Move one target's raw fleet entry from GPU ``old`` to ``price.gpu`` at that price (module docstring)."""
    new = price.gpu
    a, b = GPU_PRESETS[old], GPU_PRESETS[new]
    hints = raw.setdefault("replay", {})
    assert isinstance(hints, dict)
    hints["gpu"] = new
    raw["usd_per_gpu_hour"] = price.usd_per_gpu_hour
    raw["power_kw_per_gpu"] = price.power_kw_per_gpu
    dtype = str(hints.get("weight_dtype") or "bf16")
    pools = raw["pools"]
    assert isinstance(pools, dict)
    for pool in pools.values():
        pool["prefill_tokens_per_s"] = round(pool["prefill_tokens_per_s"] * b.linear_flops(dtype) / a.linear_flops(dtype), 1)
        pool["decode_tokens_per_s"] = round(pool["decode_tokens_per_s"] * b.hbm_bytes_per_s / a.hbm_bytes_per_s, 1)
        if pool.get("kv_cache_capacity_tokens"):
            extra = pool["gpus_per_replica"] * (b.hbm_bytes - a.hbm_bytes) * 0.9 / kv_bytes
            pool["kv_cache_capacity_tokens"] = max(1, int(pool["kv_cache_capacity_tokens"] + extra))


__all__ = ["DEFAULT_MIN_POOL_GPUS", "KV_FACTORS", "MAX_GPUS_PER_REPLICA", "ROLES", "STEP_TOKENS", "Pools", "Shape",
           "ShapeSpace", "TargetSpace"]
