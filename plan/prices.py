"""What a fleet shape costs per month: GPU list prices, power per GPU and shared-KV-tier DRAM.

Sources (public list prices change; ``pointsman plan --gpu-price`` takes your own quotes,
``ShapeSpace.with_prices``):

- ``H100-SXM`` $2.50 per GPU-hour: the packaged fleet's figure, the low end of the $2.49-3.99
  on-demand list prices of GPU clouds (Lambda, CoreWeave, Crusoe, 2025-26);
- ``H200-SXM`` $3.50 per GPU-hour: Nebius AI Cloud's on-demand price of one H200 with 16 vCPUs and
  200 GiB RAM (docs.nebius.com, "billing changes October 2025": 1 x $2.668 + 16 x $0.012 +
  200 x $0.0032 = $3.50);
- ``A100-SXM-80GB`` $1.49 per GPU-hour: the low end of the $1.49-2.49 on-demand range listed for
  Lambda, CoreWeave, vast.ai and RunPod in early 2026;
- power per GPU including the host's share: DGX H100 and DGX H200 10.2 kW for 8 GPUs
  (1.275 kW), DGX A100 6.5 kW for 8 GPUs (0.8125 kW) (NVIDIA DGX datasheets, maximum system power);
- shared KV tier DRAM: $0.004237 per GiB-hour (2^30 bytes: Compute Engine bills memory in "GB" of
  2^30 bytes, cloud.google.com/compute/vm-instance-pricing), its on-demand price of custom machine memory
  (N1/N2, us-central1), i.e. about $3.09 per GiB-month;
- a month is 730 hours (8,760 / 12).
"""

from __future__ import annotations

from dataclasses import dataclass

#: Hours in an average month (8,760 / 12).
HOURS_PER_MONTH = 730.0

#: Bytes in a GiB, the unit Compute Engine prices memory by.
GIB_BYTES = 2**30
#: USD per GiB-hour of host DRAM for a shared KV tier (module docstring).
DRAM_USD_PER_GIB_HOUR = 0.004237


@dataclass(frozen=True)
class GPUPrice:
    """One GPU type a plan may rent: ``gpu`` (a ``replay.hardware.GPU_PRESETS`` name),
    ``usd_per_gpu_hour`` (list price), ``power_kw_per_gpu`` (busy power including the host's
    share, kW) and ``source`` (where the price comes from)."""

    gpu: str
    usd_per_gpu_hour: float
    power_kw_per_gpu: float
    source: str


GPU_PRICES: dict[str, GPUPrice] = {
    "H100-SXM": GPUPrice("H100-SXM", 2.50, 1.275, "GPU clouds' on-demand list prices, low end (Lambda, CoreWeave, "
                         "Crusoe 2025-26); DGX H100 10.2 kW / 8"),
    "H200-SXM": GPUPrice("H200-SXM", 3.50, 1.275, "Nebius AI Cloud on-demand, 1 GPU + 16 vCPU + 200 GiB (Oct 2025); "
                         "DGX H200 10.2 kW / 8"),
    "A100-SXM-80GB": GPUPrice("A100-SXM-80GB", 1.49, 0.8125, "on-demand list prices early 2026, low end "
                              "(Lambda, CoreWeave, vast.ai, RunPod); DGX A100 6.5 kW / 8"),
}
"""GPU types ``pointsman plan --gpus`` may choose from, by preset name."""


def kv_tier_usd_per_month(capacity_tokens: int, kv_bytes_per_token: int) -> float:
    """Monthly DRAM rent (USD) of a shared KV tier holding ``capacity_tokens`` tokens of
    ``kv_bytes_per_token`` bytes each: its GiB (bytes / ``GIB_BYTES``) at ``DRAM_USD_PER_GIB_HOUR``."""
    return capacity_tokens * kv_bytes_per_token / GIB_BYTES * DRAM_USD_PER_GIB_HOUR * HOURS_PER_MONTH


__all__ = ["DRAM_USD_PER_GIB_HOUR", "GIB_BYTES", "GPU_PRICES", "HOURS_PER_MONTH", "GPUPrice", "kv_tier_usd_per_month"]
