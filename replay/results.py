"""Results of one simulated replay: ``RequestResult`` per trace request, ``ReplicaStats``
per replica, ``ReplayResult`` for the whole run.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pointsman.replay.sim_fleet import (
    SimFleet,
)


@dataclass(frozen=True, slots=True)
class RequestResult:
    """What happened to one trace request. Times in seconds on the trace clock.

    - ``routed_target``: the router's choice (``None`` when the router rejected it); ``target``:
      where it ran (differs when spilled to a fallback or the spill target).
    - ``replica`` / ``decode_replica``: pool indices (``None`` for frontier).
    - ``rejected``: ``None``, or why it was refused: ``queue_full``, ``context_length``,
      ``kv_capacity`` (admission control), or the router's reason; rejected requests have
      no latencies.
    - ``queue_s``: arrival to prefill start (0 for frontier).
    - ``ttft_s``; ``tpot_s`` = (e2e - ttft) / (output_tokens - 1), ``None`` when one
      output token; ``e2e_s``; ``finish_s``.
    - ``prefix_hit_tokens``: prompt tokens found in the replica's prefix cache (frontier: in the
      provider's prompt cache, billed at the cached-input price);
      ``restored_tokens``: restored from the shared KV tier; ``transfer_s``: P/D KV transfer.
    - ``cost_usd``: API bill for frontier requests; 0 on-prem (on-prem cost is per GPU-hour).
    - ``escalated``: the cascade escalated it after its on-prem draft (``replay.cascade``): it paid
      both calls, and ``target`` is the frontier tier that answered; ``escalation_delay_s``: the
      seconds from arrival to the escalated call's start (the draft's prefill and the tokens it
      decoded before the verify: what the cascade added to the latency), None when not escalated.
    """

    index: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    routed_target: str | None
    target: str | None
    mode: str
    replica: int | None
    decode_replica: int | None
    frontier: bool
    spilled: bool
    rejected: str | None
    queue_s: float | None
    ttft_s: float | None
    tpot_s: float | None
    e2e_s: float | None
    finish_s: float | None
    prefix_hit_tokens: int
    restored_tokens: int
    transfer_s: float
    cost_usd: float
    escalated: bool = False
    escalation_delay_s: float | None = None


@dataclass(frozen=True, slots=True)
class ReplicaStats:
    """Busy time of one replica over the replay, in seconds, split into prefill and decode.

    ``prefill_tokens``: prompt tokens computed (not cached; recomputation after a preemption
    included); ``decode_steps``: engine steps run; ``restored_tokens``: tokens restored from
    the shared KV tier; ``preemptions``: requests preempted (to be recomputed); ``work_s``: the
    part of the busy time that grows with the tokens computed (``ReplicaSpec.work_s``: what they
    need however they are batched; a replica decoding one sequence is busy, not loaded).
    """

    target: str
    role: str
    index: int
    gpus: int
    prefill_busy_s: float
    decode_busy_s: float
    prefill_tokens: int
    decode_steps: int
    restored_tokens: int
    preemptions: int = 0
    work_s: float = 0.0


@dataclass(frozen=True)
class ReplayResult:
    """Output of ``simulate``.

    ``requests``: one ``RequestResult`` per trace request, in trace order.
    ``replicas``: ``ReplicaStats`` per on-prem replica. ``start_s``/``end_s``: first
    arrival and the later of the last finish and the last arrival (the replay window, over
    which GPUs are provisioned).
    ``timeline``: per on-prem target, busy GPU-seconds (a replica's busy seconds x its GPUs) summed
    over its replicas in ``int(window_s // timeline_bin_s) + 1`` bins of ``timeline_bin_s`` from
    ``start_s``: ``{"prefill_busy_gpu_s": [...], "decode_busy_gpu_s": [...]}`` (divide by the
    target's GPUs x bin for utilization).
    ``unmodelled_escalations``: on-prem target -> drafts the verify rules escalated there, kept as
    the drafts (``replay.cascade`` simulates escalations to frontier tiers only).
    ``refused_escalations``: drafts an escalating verify rule matched but no target took (the
    ``budget`` filter excluded its targets, their holds did not fit, or no healthy endpoint): not escalated, as the
    service answers them.
    """

    requests: list[RequestResult]
    replicas: list[ReplicaStats]
    fleet: SimFleet
    start_s: float
    end_s: float
    seed: int
    timeline_bin_s: float
    timeline: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    unmodelled_escalations: dict[str, int] = field(default_factory=dict)
    refused_escalations: int = 0

    @property
    def window_s(self) -> float:
        """Replay window length in seconds (end_s - start_s)."""
        return self.end_s - self.start_s

