"""Estimated cost of one request on one target, in USD.

Frontier (list prices, per 1M tokens)::

    usd = (uncached_prompt_tokens * p_in + cached_prompt_tokens * p_cached_in + output_tokens * p_out) / 1e6

On-prem (GPU-seconds of each phase at the pool's full-load throughput, the way an
effective price per token is computed from GPU-hours)::

    prefill_gpu_s = uncached_prompt_tokens / prefill_tokens_per_s * gpus_per_replica   (prefill pool)
    decode_gpu_s  = output_tokens / decode_tokens_per_s * gpus_per_replica             (decode pool)
    usd_per_gpu_s = (usd_per_gpu_hour + power_kw_per_gpu * usd_per_kwh) / 3600
    usd           = (prefill_gpu_s + decode_gpu_s) * usd_per_gpu_s / utilization

In aggregated mode both phases use the aggregated pool; disaggregated, prefill runs
on the prefill pool and decode on the decode pool (the KV transfer between them is
not priced). ``utilization`` (0-1] spreads idle GPU time over the tokens that are
served: 1.0 prices at the benchmark's full-load throughput; the policy issue feeds
the pool's measured utilization here. Cached prompt tokens skip prefill on-prem and
get the cached-input price on a frontier API.
"""

from __future__ import annotations

from dataclasses import dataclass

from pointsman.policy.fleet import FrontierTarget, OnPremTarget


@dataclass(frozen=True)
class CostEstimate:
    """One candidate's estimated cost: ``usd`` and its basis (tokens; GPU-seconds on-prem, else 0)."""

    target: str
    mode: str
    usd: float
    prompt_tokens: int
    cached_prompt_tokens: int
    output_tokens: int
    prefill_gpu_s: float = 0.0
    decode_gpu_s: float = 0.0

    def to_dict(self) -> dict:
        """JSON-ready dict of every field."""
        return {
            "target": self.target, "mode": self.mode, "estimated_cost_usd": self.usd,
            "prompt_tokens": self.prompt_tokens, "cached_prompt_tokens": self.cached_prompt_tokens,
            "output_tokens": self.output_tokens, "prefill_gpu_s": self.prefill_gpu_s,
            "decode_gpu_s": self.decode_gpu_s,
        }


def estimate_cost(name: str, target: OnPremTarget | FrontierTarget, mode: str, prompt_tokens: int,
                  output_tokens: int, cached_prompt_tokens: int = 0, utilization: float = 1.0) -> CostEstimate:
    """Cost in USD of ``prompt_tokens`` in and ``output_tokens`` out on ``target`` in ``mode``
    (formulas in the module docstring). Raises ``KeyError`` if the target lacks the mode's
    pools and ``ValueError`` for a utilization outside (0, 1]."""
    cached = max(0, min(cached_prompt_tokens, prompt_tokens))
    uncached = prompt_tokens - cached
    if isinstance(target, FrontierTarget):
        p = target.prices
        usd = (uncached * p.usd_per_1m_input_tokens + cached * p.usd_per_1m_cached_input_tokens
               + output_tokens * p.usd_per_1m_output_tokens) / 1e6
        return CostEstimate(name, mode, usd, prompt_tokens, cached, output_tokens)
    if not 0.0 < utilization <= 1.0:
        raise ValueError(f"utilization must be in (0, 1], got {utilization}")
    prefill_pool, decode_pool = target.pool_pair(mode)
    prefill_gpu_s = uncached / prefill_pool.prefill_tokens_per_s * prefill_pool.gpus_per_replica
    decode_gpu_s = output_tokens / decode_pool.decode_tokens_per_s * decode_pool.gpus_per_replica
    usd_per_gpu_s = (target.usd_per_gpu_hour + target.power_kw_per_gpu * target.usd_per_kwh) / 3600.0
    usd = (prefill_gpu_s + decode_gpu_s) * usd_per_gpu_s / utilization
    return CostEstimate(name, mode, usd, prompt_tokens, cached, output_tokens, prefill_gpu_s, decode_gpu_s)
