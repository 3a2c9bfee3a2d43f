"""Per request: aggregated or prefill/decode-disaggregated, by published rules of thumb.

``decide_mode(spec, target, route_mode, ...) -> ModeDecision``. The rules (thresholds
from the policy's ``disaggregation`` section, ``schema.DisaggregationSpec``):

Guards, for every route that would disaggregate (``disaggregated`` or ``auto``):

1. **small pool**: the healthy endpoints of the target's prefill + decode pools have fewer
   than ``min_pool_gpus`` GPUs (default 12; an endpoint marked unhealthy serves nothing).
   With a handful of GPUs, splitting them into two phases strands capacity: a static
   prefill/decode ratio cannot follow the traffic mix, and aggregated serving with chunked
   prefill does as well (the DistServe and Splitwise papers and vLLM's and Dynamo's deployment guides report
   P/D gains at scale, not on a few GPUs).
2. **saturated prefill pool**: every healthy prefill endpoint queues at least
   ``max_prefill_queue_s`` of prefill work or reads saturated (``load[target].
   prefill_saturated``). Dynamo's conditional disaggregation prefills locally when
   the prefill queue is too long, for the same reason: waiting for a remote prefill
   would cost more TTFT than it saves.

A tripped guard keeps the request aggregated: one endpoint runs both phases, on the
target's aggregated pool or — where the prompt's prefix is cached on a decode
endpoint, or the target has no aggregated pool — on a decode endpoint that
prefills locally (Dynamo's conditional disaggregation; ``engine.place``). With
``short_prompts_on_decode``, a prompt of at most ``min_uncached_prompt_tokens`` tokens
may prefill locally on any decode endpoint too (the picker chooses among both pools): its
prefill (at most 512 tokens, 42 ms on the packaged 70B replicas) barely stalls the answers
decoding there, and the decode pool's replicas share the short requests with the aggregated
pool instead of leaving them all to it.

Benefit tests, for ``auto`` routes only (an explicit ``disaggregated`` route is the
policy author's decision):

3. **short uncached prompt**: ``prompt_tokens × (1 − prefix_hit_ratio)`` ≤
   ``min_uncached_prompt_tokens`` (default 512): prefill is too short to disturb
   decoding, and the KV transfer would cost more than it saves (vLLM and Dynamo set
   their disaggregation thresholds around a few hundred to a thousand tokens).
4. **short output**: ``output_tokens`` ≤ ``min_output_tokens`` (default 16): a
   handful of decode steps gain nothing from a dedicated decode pool, while the KV
   transfer (about 2–3 decode steps for a few thousand tokens of a 70B model over
   400 Gb/s) is paid in full.
5. **cached locally**: ``prefix_hit_ratio`` ≥ ``max_local_hit_ratio`` (default 0.8):
   most of the prefix is already in a local KV cache, so the remaining prefill is
   cheap where the cache is (Dynamo's router likewise prefers the worker with the
   overlap over a remote prefill).

``prefix_hit_ratio`` (rules 3 and 5) is the share cached on the endpoint the request would run
on aggregated (``LiveSignals.local_hit_ratio``: the aggregated picker's first choice), so a
prefix held where the picker would not send the request counts as uncached.

Otherwise ``auto`` disaggregates, unless the policy sets ``by_prediction``:

6. **by prediction**: the request's predicted latency (``policy/selection/latency.py``) in
   each mode, scored against its SLO class (max of TTFT and TPOT over their objectives):
   ``auto`` disaggregates only when that score is lower disaggregated, e.g. when the decode
   pool's batch and the transfer cost less than the prefill interference and queue of the
   aggregated pool; the guards and benefit tests above still come first. With
   ``prefer_disaggregated`` it disaggregates whenever the disaggregated prediction meets the
   SLO (score at most 1), and compares scores only when it does not: a decode pool runs no
   prefill, so no other request's prefill chunk can break a short answer's TPOT there, which
   the aggregated prediction can only estimate from recent load (bursts of long prompts beat
   it), while the KV transfer costs milliseconds (DistServe's case for disaggregation).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated

from pydantic import Field

from pointsman.located import StrictModel
from pointsman.policy.fleet import FrontierTarget, OnPremTarget


class DisaggregationSpec(StrictModel):
    """Prefill/decode rules of thumb (the policy file's ``disaggregation`` section). ``auto`` routes stay
    aggregated when the uncached prompt is at most ``min_uncached_prompt_tokens``, the
    output at most ``min_output_tokens``, or at least ``max_local_hit_ratio`` of the prefix
    is cached where it would run aggregated. Every disaggregated route stays aggregated (when the
    target has an aggregated pool) when its prefill + decode pools have fewer than
    ``min_pool_gpus`` GPUs or the prefill pool is saturated (every healthy prefill
    endpoint queues ``max_prefill_queue_s`` or more, or reads saturated). ``by_prediction``: an
    ``auto`` route that passes every rule disaggregates only when its predicted latency scores
    better disaggregated (rule 6); with ``prefer_disaggregated`` too, it disaggregates whenever the
    disaggregated prediction meets the SLO. ``short_prompts_on_decode``: a prompt of at most
    ``min_uncached_prompt_tokens`` tokens, which stays aggregated, may also run (prefill and
    decode) on any endpoint of the decode pool, not only the aggregated pool (module docstring)."""

    min_uncached_prompt_tokens: Annotated[int, Field(ge=0)] = 512
    min_output_tokens: Annotated[int, Field(ge=0)] = 16
    max_local_hit_ratio: Annotated[float, Field(ge=0, le=1)] = 0.8
    min_pool_gpus: Annotated[int, Field(ge=0)] = 12
    max_prefill_queue_s: Annotated[float, Field(gt=0, allow_inf_nan=False)] = 2.0
    by_prediction: bool = False
    prefer_disaggregated: bool = False
    short_prompts_on_decode: bool = False


@dataclass(frozen=True)
class ModeDecision:
    """The mode a request runs in, ``reason`` (one sentence) and the ``inputs`` it used."""

    mode: str
    reason: str
    inputs: dict[str, object]

    def to_dict(self) -> dict[str, object]:
        """``{"mode", "reason", "inputs"}``."""
        return {"mode": self.mode, "reason": self.reason, "inputs": dict(self.inputs)}


def pd_pool_gpus(target: OnPremTarget | FrontierTarget, usable: Callable[[str], bool] | None = None) -> int:
    """GPUs of the target's prefill + decode pools (0 without them): of their endpoints whose id
    ``usable`` accepts (healthy ones; None: every endpoint)."""
    if isinstance(target, FrontierTarget) or target.pools.prefill is None or target.pools.decode is None:
        return 0
    pools = (target.pools.prefill, target.pools.decode)
    if usable is None:
        return sum(p.gpus for p in pools)
    return sum(p.gpus_per_replica for p in pools for e in p.endpoints if usable(e.url))  # an on-prem id is its URL


def decide_mode(spec: DisaggregationSpec, target: OnPremTarget | FrontierTarget, route_mode: str, *, prompt_tokens: int,
                output_tokens: int, prefix_hit_ratio: float, prefill_saturated: bool, gpus: int,
                predicted: Callable[[], tuple[float | None, float | None]] | None = None) -> ModeDecision:
    """``aggregated`` or ``disaggregated`` for a route of ``route_mode`` (``aggregated``,
    ``disaggregated`` or ``auto``) on ``target`` (rules in the module docstring). ``spec``:
    the policy's ``DisaggregationSpec``; ``prefix_hit_ratio``: share 0-1 of the prompt cached
    on the endpoint it would run on aggregated (``SignalSource.local_hit_ratio``);
    ``prefill_saturated``: ``load[target].prefill_saturated``; ``gpus``: GPUs of the healthy prefill
    and decode endpoints (``pd_pool_gpus``); ``predicted``: called for rule 6 only, gives the
    (aggregated, disaggregated) SLO scores (None: unknown)."""
    modes = target.modes
    uncached = round(prompt_tokens * (1.0 - prefix_hit_ratio))
    inputs = {"route_mode": route_mode, "prompt_tokens": prompt_tokens, "uncached_prompt_tokens": uncached,
              "output_tokens": output_tokens, "prefix_hit_ratio": prefix_hit_ratio,
              "pd_pool_gpus": gpus, "prefill_saturated": prefill_saturated}
    if "disaggregated" not in modes:
        return ModeDecision(modes[0], "the target has no prefill/decode pools", inputs)
    if route_mode == "aggregated":
        return ModeDecision("aggregated", "the route says aggregated", inputs)
    guard = None
    if gpus < spec.min_pool_gpus:
        guard = f"the prefill/decode pools have {gpus} healthy GPUs < min_pool_gpus {spec.min_pool_gpus}"
    elif prefill_saturated:
        guard = "the prefill pool is saturated"
    if guard is not None:
        return ModeDecision("aggregated", f"stay aggregated: {guard}", inputs)
    if route_mode == "disaggregated":
        return ModeDecision("disaggregated", "the route says disaggregated", inputs)
    # auto: the benefit tests
    if uncached <= spec.min_uncached_prompt_tokens:
        return ModeDecision("aggregated", f"stay aggregated: {uncached} uncached prompt tokens <= "
                                          f"min_uncached_prompt_tokens {spec.min_uncached_prompt_tokens}", inputs)
    if output_tokens <= spec.min_output_tokens:
        return ModeDecision("aggregated", f"stay aggregated: {output_tokens} output tokens <= "
                                          f"min_output_tokens {spec.min_output_tokens}", inputs)
    if prefix_hit_ratio >= spec.max_local_hit_ratio:
        return ModeDecision("aggregated", f"stay local: prefix hit ratio {prefix_hit_ratio:.2f} >= "
                                          f"max_local_hit_ratio {spec.max_local_hit_ratio}", inputs)
    if predicted is not None:
        agg, dis = predicted()
        inputs["aggregated_score"], inputs["disaggregated_score"] = agg, dis
        if spec.prefer_disaggregated and dis is not None and dis <= 1.0:
            return ModeDecision("disaggregated", f"disaggregate: predicted SLO score {dis:.2f} disaggregated meets "
                                                 "the SLO (prefer_disaggregated)", inputs)
        if agg is not None and (dis is None or dis >= agg):
            return ModeDecision("aggregated", f"stay aggregated: predicted SLO score {agg:.2f} aggregated <= "
                                              f"{'none' if dis is None else f'{dis:.2f}'} disaggregated", inputs)
        if dis is not None:
            return ModeDecision("disaggregated", f"disaggregate: predicted SLO score {dis:.2f} disaggregated < "
                                                 f"{'none' if agg is None else f'{agg:.2f}'} aggregated", inputs)
    return ModeDecision("disaggregated", "disaggregate: long uncached prompt, long enough output, "
                                         "pools large enough and prefill not saturated", inputs)
