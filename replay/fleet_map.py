"""The simulated fleet built from the policy engine's fleet file (the same YAML the engine uses).

``sim_fleet(fleet) -> SimFleet`` maps every target of a ``policy.fleet.Fleet``; the
simulator's defaults (``replay.hardware``: model shapes from Hugging Face configs, GPU
datasheets, efficiency assumptions) fill what the file does not say, and the file
overrides them. What comes from where:

==============================================  ============================================
fleet file key                                  simulator field
==============================================  ============================================
``model`` (a preset: Llama 3.1 8B, 3.3/3.1 70B)  model shape (``hardware.MODEL_PRESETS``);
  or ``replay.model_shape``                       required for other models
pool endpoints                                  replicas per pool (aggregated, prefill, decode)
pool ``gpus_per_replica``                       tensor-parallel degree: FLOP/s, HBM bandwidth, GPU-hours
pool ``kv_cache_capacity_tokens``               KV blocks per replica (else derived from HBM)
pool ``max_num_batched_tokens``                 tokens per step (vLLM's flag: the largest prefill chunk)
pool ``max_num_seqs``                           sequences running at once (vLLM's flag; the router's bounded-load floor)
``kv_bytes_per_token``                          KV bytes per token (else from the model shape)
``context_window_tokens``                       ``max_model_len``
``usd_per_gpu_hour`` / ``usd_per_kwh``          GPU-hour and energy prices
``power_kw_per_gpu``                            busy power per GPU (else the GPU's TDP)
``shared_kv``                                   shared KV tier (capacity, restore bandwidth, latency)
frontier ``prices``                             input, cached-input and output prices
frontier ``prompt_cache_min_tokens``            the provider's prompt-cache threshold
frontier ``prompt_cache: explicit``             no prompt cache (a trace's requests mark no cache_control)
frontier ``context_window_tokens``              longest prompt + output it accepts
``replay.*`` (on-prem)                          GPU, weight precision, MFU, bandwidth efficiency,
                                                overheads, KV page size (kv_block_tokens),
                                                admission limit, P/D link, idle power, latency
                                                coefficients
``replay.*`` (frontier)                         latency distribution, prompt-cache TTL
``replay.spill_target`` (fleet)                 where refused on-prem requests go
==============================================  ============================================

Defaults when the file is silent: H100 SXM (``hardware.H100_SXM``), BF16 weights, MFU
0.5, 80% of HBM bandwidth, 0.3 ms step overhead (``hardware.replica_spec_for``), vLLM V1's
scheduler on an H100 (8192 tokens per step, 16-token KV pages) at the pool's default
``max_num_seqs``, 256 sequences, admission
limit ``DEFAULT_MAX_WAITING`` requests waiting per replica, a P/D link of one NIC per GPU
of the prefill replica (``hardware.LinkSpec.for_gpus``), idle power = busy power × the
GPU's idle/TDP ratio, frontier latency ``hardware.FrontierSpec`` defaults, spill to the
frontier tier with the highest output price.

``EndpointMap`` pairs the engine's endpoint ids with the simulator's replicas
(``(target, role, index)``), in fleet-file order on both sides.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from pointsman.errors import FleetError, Problem
from pointsman.located import parse_yaml
from pointsman.policy.fleet import Fleet, FrontierTarget
from pointsman.policy.fleet import OnPremTarget as FleetOnPrem
from pointsman.replay.hardware import (
    GPU_PRESETS,
    FrontierSpec,
    LinkSpec,
    ModelSpec,
    ReplicaSpec,
    SharedKVTierSpec,
    model_preset,
    replica_spec_for,
)
from pointsman.replay.sim_fleet import ROLE_AGGREGATED, ROLE_DECODE, ROLE_PREFILL, OnPremTarget, SimFleet

#: Requests waiting for prefill per replica before admission control refuses more (an
#: assumption: a gateway limit that keeps queueing delay bounded; ``replay.max_waiting``).
DEFAULT_MAX_WAITING = 16
#: Tokens per KV block in the simulator: the Mooncake traces' hash block size.
BLOCK_TOKENS = 512

_DERIVE_KEYS = ("prefill_mfu", "decode_mfu", "bandwidth_efficiency", "step_overhead_s", "prefill_overhead_s",
                "kv_block_tokens")
_COEFFICIENT_KEYS = ("prefill_s_per_token", "prefill_s_per_token_pair", "decode_base_s", "decode_per_seq_s",
                     "decode_per_kv_token_s")
_FRONTIER_KEYS = ("ttft_median_s", "ttft_sigma", "tpot_median_s", "tpot_sigma")


@dataclass(frozen=True)
class EndpointMap:
    """Engine endpoint id <-> simulator replica. ``by_id[endpoint_id] = (target, role, index)``
    (role ``aggregated``/``prefill``/``decode``; a frontier target's endpoint id is its name,
    role ``api``, index 0); ``ids[(target, role)]`` lists the ids of a pool by index."""

    by_id: dict[str, tuple[str, str, int]]
    ids: dict[tuple[str, str], tuple[str, ...]]

    @classmethod
    def of(cls, fleet: Fleet) -> EndpointMap:
        """The map of ``fleet`` (pools in file order, as ``sim_fleet`` builds them)."""
        by_id: dict[str, tuple[str, str, int]] = {}
        ids: dict[tuple[str, str], tuple[str, ...]] = {}
        for (target, role), endpoints in fleet.pools.items():
            ids[(target, role)] = tuple(e.id for e in endpoints)
            for i, e in enumerate(endpoints):
                by_id[e.id] = (target, role, i)
        return cls(by_id, ids)


def _problem(fleet: Fleet, path: tuple, code: str, message: str) -> Problem:
    """A problem located at ``path`` in the fleet file (line 0 when the file cannot be re-read)."""
    line = col = 0
    try:
        doc = parse_yaml(Path(fleet.file).read_text(encoding="utf-8"), fleet.file, FleetError)
        line, col = doc.mark(path)
    except (OSError, FleetError):
        pass
    return Problem(fleet.file, line, col, code, message)


def _model_of(name: str, t: FleetOnPrem, fleet: Fleet, problems: list[Problem]) -> ModelSpec | None:
    shape = t.replay.model_shape if t.replay is not None else None
    if shape is not None:
        return ModelSpec(name=t.model, params=shape.params, layers=shape.layers, kv_heads=shape.kv_heads,
                         head_dim=shape.head_dim, q_dim=shape.q_dim, max_model_len=t.context_window_tokens)
    preset = model_preset(t.model)
    if preset is None:
        problems.append(_problem(fleet, ("targets", name, "model"), "unknown-model",
                                 f"the replay simulator has no preset for model '{t.model}'; give its shape as "
                                 f"targets.{name}.replay.model_shape {{params, layers, kv_heads, head_dim, q_dim}}"))
    return preset


def _replica(name: str, role: str, t: FleetOnPrem, model: ModelSpec, fleet: Fleet,
             problems: list[Problem]) -> ReplicaSpec | None:
    pool = t.pools_by_role()[role]
    hints = t.replay
    gpu_name = (hints.gpu if hints is not None else None) or "H100-SXM"
    gpu = GPU_PRESETS.get(gpu_name)
    if gpu is None:
        problems.append(_problem(fleet, ("targets", name, "replay", "gpu"), "unknown-gpu",
                                 f"unknown GPU '{gpu_name}' (known: {', '.join(GPU_PRESETS)})"))
        return None
    opts = {k: getattr(hints, k) for k in _DERIVE_KEYS if hints is not None and getattr(hints, k) is not None}
    weight_dtype = (hints.weight_dtype if hints is not None else None) or "bf16"
    capacity = pool.kv_cache_capacity_tokens
    try:
        spec = replica_spec_for(model, gpu, pool.gpus_per_replica, weight_dtype=weight_dtype,
                                kv_bytes_per_token=t.kv_bytes_per_token, block_tokens=BLOCK_TOKENS,
                                kv_capacity_blocks=None if capacity is None else max(1, capacity // BLOCK_TOKENS),
                                max_num_batched_tokens=pool.max_num_batched_tokens,
                                max_num_seqs=pool.max_num_seqs, **opts)
    except ValueError as exc:
        problems.append(_problem(fleet, ("targets", name, "pools", role), "invalid-value",
                                 f"{exc}; set kv_cache_capacity_tokens, more gpus_per_replica, or "
                                 f"replay.weight_dtype: fp8"))
        return None
    busy_kw = t.power_kw_per_gpu or gpu.tdp_kw
    idle_kw = hints.idle_power_kw_per_gpu if hints is not None and hints.idle_power_kw_per_gpu is not None \
        else busy_kw * gpu.idle_kw / gpu.tdp_kw
    spec = dataclasses.replace(spec, name=f"{name}/{role}:{spec.name}", max_model_len=t.context_window_tokens,
                               gpu_tdp_kw=busy_kw, gpu_idle_kw=idle_kw)
    if hints is None:
        return spec
    return dataclasses.replace(spec, **{k: getattr(hints, k) for k in _COEFFICIENT_KEYS if getattr(hints, k) is not None})


def _frontier(name: str, t: FrontierTarget) -> FrontierSpec:
    p = t.prices
    extra = {}
    if t.replay is not None:
        extra = {k: getattr(t.replay, k) for k in _FRONTIER_KEYS if getattr(t.replay, k) is not None}
    return FrontierSpec(name=name, input_usd_per_mtok=p.usd_per_1m_input_tokens,
                        output_usd_per_mtok=p.usd_per_1m_output_tokens,
                        # explicit caching caches only requests marking cache_control, which a trace's do not
                        cached_input_usd_per_mtok=None if t.prompt_cache == "explicit" else p.usd_per_1m_cached_input_tokens,
                        prompt_cache_min_tokens=t.prompt_cache_min_tokens,
                        prompt_cache_ttl_s=t.prompt_cache_ttl_s, block_tokens=BLOCK_TOKENS,
                        max_model_len=t.context_window_tokens, **extra)


def sim_fleet(fleet: Fleet) -> SimFleet:
    """The ``SimFleet`` for a validated policy ``Fleet`` (see the module docstring for the
    mapping). Raises ``FleetError`` listing every problem located in the fleet file: a model
    without a preset or ``replay.model_shape``, an unknown ``replay.gpu``, weights that leave
    no KV room."""
    problems: list[Problem] = []
    on_prem: list[OnPremTarget] = []
    frontier: list[FrontierSpec] = []
    for name, t in fleet.targets.items():
        if isinstance(t, FrontierTarget):
            frontier.append(_frontier(name, t))
            continue
        model = _model_of(name, t, fleet, problems)
        if model is None:
            continue
        roles = t.pools_by_role()
        specs: dict[str, ReplicaSpec] = {}
        for role in roles:
            spec = _replica(name, role, t, model, fleet, problems)
            if spec is not None:
                specs[role] = spec
        if len(specs) < len(roles):
            continue
        hints = t.replay
        link = LinkSpec.for_gpus((specs.get(ROLE_PREFILL) or specs.get(ROLE_AGGREGATED) or next(iter(specs.values()))).gpus)
        if hints is not None and (hints.link_bytes_per_s is not None or hints.link_latency_s is not None):
            link = LinkSpec(hints.link_bytes_per_s or link.bytes_per_s,
                            link.latency_s if hints.link_latency_s is None else hints.link_latency_s)
        max_waiting: int | None = DEFAULT_MAX_WAITING
        if hints is not None and "max_waiting" in hints.model_fields_set:
            max_waiting = hints.max_waiting
        shared = None
        if t.shared_kv is not None:
            shared = SharedKVTierSpec(capacity_blocks=max(1, t.shared_kv.capacity_tokens // BLOCK_TOKENS),
                                      restore_bytes_per_s=t.shared_kv.bandwidth_bytes_per_s,
                                      latency_s=t.shared_kv.latency_s)
        base = specs.get(ROLE_AGGREGATED) or specs[ROLE_PREFILL]
        on_prem.append(OnPremTarget(
            name=name, replica=base,
            aggregated_replicas=len(t.pools.aggregated.endpoints) if t.pools.aggregated else 0,
            prefill_replicas=len(t.pools.prefill.endpoints) if t.pools.prefill else 0,
            decode_replicas=len(t.pools.decode.endpoints) if t.pools.decode else 0,
            link=link, shared_kv=shared, max_waiting=max_waiting, gpu_hour_usd=t.usd_per_gpu_hour,
            electricity_usd_per_kwh=t.usd_per_kwh,
            prefill_replica=specs.get(ROLE_PREFILL), decode_replica=specs.get(ROLE_DECODE)))
    if problems:
        raise FleetError(problems)
    spill = None
    if frontier:
        spill = max(frontier, key=lambda f: f.output_usd_per_mtok).name
    if fleet.spec.replay is not None and "spill_target" in fleet.spec.replay.model_fields_set:
        spill = fleet.spec.replay.spill_target
    return SimFleet(on_prem=tuple(on_prem), frontier=tuple(frontier), spill_target=spill)


__all__ = ["BLOCK_TOKENS", "DEFAULT_MAX_WAITING", "EndpointMap", "sim_fleet"]
