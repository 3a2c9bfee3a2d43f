"""The simulated fleet: on-prem targets (pools of replicas) and frontier API tiers.

An on-prem target serves one model. It may have an aggregated pool (prefill and
decode on one replica), a disaggregated pair of pools (prefill replicas hand their
KV cache over a link to decode replicas), or both. Costs are per GPU-hour
provisioned over the replay window plus energy; frontier tiers bill per token.

This is the simulator's own fleet description; ``replay.fleet_map`` builds one from
the policy engine's fleet file.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pointsman.replay.hardware import (
    FrontierSpec,
    LinkSpec,
    ReplicaSpec,
    SharedKVTierSpec,
    llama_8b_h100,
    llama_70b_h100_tp4,
)

AGGREGATED = "aggregated"
DISAGGREGATED = "disaggregated"
ROLE_AGGREGATED, ROLE_PREFILL, ROLE_DECODE = "aggregated", "prefill", "decode"


@dataclass(frozen=True)
class OnPremTarget:
    """One on-prem model target.

    - ``replica``: the spec of every replica of this target, unless ``prefill_replica`` /
      ``decode_replica`` give the P/D pools their own (e.g. another tensor-parallel degree).
    - ``aggregated_replicas`` / ``prefill_replicas`` / ``decode_replicas``: pool sizes
      (prefill and decode must both be 0 or both >= 1).
    - ``link``: each prefill replica's KV transfer link (contended by its transfers).
    - ``shared_kv``: optional shared KV tier for this model's prefixes.
    - ``max_waiting``: admission limit per replica: a request routed to a replica
      with this many requests already waiting for prefill is spilled (to the fleet's
      ``spill_target``) or rejected; ``None`` = unbounded queue.
    - ``gpu_hour_usd``: price of one GPU-hour provisioned (assumption: $2.50, within
      the $1.90-$2.94 on-demand H100 SXM range of public GPU clouds in 2025).
    - ``electricity_usd_per_kwh``: energy price on top (assumption: $0.08, about the
      US industrial average); set 0 when ``gpu_hour_usd`` already includes power.
    """

    name: str
    replica: ReplicaSpec
    aggregated_replicas: int = 0
    prefill_replicas: int = 0
    decode_replicas: int = 0
    link: LinkSpec = field(default_factory=LinkSpec)
    shared_kv: SharedKVTierSpec | None = None
    max_waiting: int | None = None
    gpu_hour_usd: float = 2.50
    electricity_usd_per_kwh: float = 0.08
    prefill_replica: ReplicaSpec | None = None
    decode_replica: ReplicaSpec | None = None

    def __post_init__(self) -> None:
        if min(self.aggregated_replicas, self.prefill_replicas, self.decode_replicas) < 0:
            raise ValueError(f"target {self.name!r}: replica counts must be >= 0")
        if (self.prefill_replicas == 0) != (self.decode_replicas == 0):
            raise ValueError(f"target {self.name!r}: prefill and decode pools must both be empty or both non-empty")
        if self.aggregated_replicas + self.prefill_replicas == 0:
            raise ValueError(f"target {self.name!r}: no replicas")

    def spec_for(self, role: str) -> ReplicaSpec:
        """The ``ReplicaSpec`` of the replicas in the pool with ``role``."""
        if role == ROLE_PREFILL and self.prefill_replica is not None:
            return self.prefill_replica
        if role == ROLE_DECODE and self.decode_replica is not None:
            return self.decode_replica
        return self.replica

    @property
    def gpus(self) -> int:
        """GPUs provisioned for this target across all its pools."""
        return sum(self.pool_size(r) * self.spec_for(r).gpus for r in (ROLE_AGGREGATED, ROLE_PREFILL, ROLE_DECODE))

    def pool_size(self, role: str) -> int:
        """Replicas in the pool with ``role`` (aggregated, prefill or decode)."""
        return {
            ROLE_AGGREGATED: self.aggregated_replicas,
            ROLE_PREFILL: self.prefill_replicas,
            ROLE_DECODE: self.decode_replicas,
        }[role]


@dataclass(frozen=True)
class SimFleet:
    """A fleet to replay against: on-prem targets, frontier tiers and the spill target.

    ``spill_target``: name of a frontier tier that takes requests refused by an
    on-prem target's admission control (queue full, too long, does not fit its KV
    cache); ``None`` = such requests are rejected. Raises ValueError on duplicate
    names or an unknown / non-frontier spill target.
    """

    on_prem: tuple[OnPremTarget, ...] = ()
    frontier: tuple[FrontierSpec, ...] = ()
    spill_target: str | None = None

    def __post_init__(self) -> None:
        names = [t.name for t in self.on_prem] + [f.name for f in self.frontier]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"duplicate target names: {dupes}")
        if self.spill_target is not None and self.spill_target not in {f.name for f in self.frontier}:
            raise ValueError(f"spill_target {self.spill_target!r} is not a frontier tier of this fleet")

    @property
    def target_names(self) -> list[str]:
        """All target names, on-prem first, in declaration order."""
        return [t.name for t in self.on_prem] + [f.name for f in self.frontier]


def default_fleet(
    *,
    replicas_70b: int = 8,
    disaggregated: tuple[int, int] | None = None,
    with_8b: bool = False,
    spill: bool = True,
) -> SimFleet:
    """The default replay fleet.

    - ``onprem-70b``: Llama-3.3-70B on 4x H100 (TP4), ``replicas_70b`` aggregated
      replicas, plus ``disaggregated=(prefill, decode)`` P/D pools when given;
      admission limit 16 waiting requests per replica.
    - ``onprem-8b`` (when ``with_8b``): Llama-3.1-8B on 1x H100, 4 aggregated replicas.
    - ``frontier-large``: GPT-4o list prices; ``frontier-small``: GPT-4o-mini list
      prices ($0.15 / $0.60 per 1M input / output tokens) with a faster TPOT.
    - ``spill``: refused on-prem requests go to ``frontier-large``.
    """
    p, d = disaggregated or (0, 0)
    on_prem = [
        OnPremTarget(
            name="onprem-70b",
            replica=llama_70b_h100_tp4(),
            aggregated_replicas=replicas_70b,
            prefill_replicas=p,
            decode_replicas=d,
            link=LinkSpec.for_gpus(4),
            max_waiting=16,
        )
    ]
    if with_8b:
        on_prem.append(OnPremTarget(name="onprem-8b", replica=llama_8b_h100(), aggregated_replicas=4, max_waiting=16))
    frontier = (
        FrontierSpec(name="frontier-large"),
        FrontierSpec(
            name="frontier-small", input_usd_per_mtok=0.15, output_usd_per_mtok=0.60, tpot_median_s=0.008,
            cached_input_usd_per_mtok=0.075,
        ),
    )
    return SimFleet(on_prem=tuple(on_prem), frontier=frontier, spill_target="frontier-large" if spill else None)
