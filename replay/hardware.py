"""Performance and price specs of simulated replicas, links and frontier tiers.

A ``ReplicaSpec`` holds the coefficients of one small latency model, so a fleet file (or
a test) can state them directly; ``replica_spec_for`` derives them from a model config
and a GPU datasheet, roofline style. One engine step (vLLM V1: every running sequence's
next tokens in one forward pass, decodes and prefill chunks together) takes

    step_s = step_overhead_s
             + max(decode_base_s, d * decode_per_seq_s + n * prefill_s_per_token)
             + kv * decode_per_kv_token_s
             + pairs * prefill_s_per_token_pair
             + (prefill_overhead_s if n else 0)

for ``d`` decode tokens (one per decoding sequence) whose contexts hold ``kv`` tokens in
total, and ``n`` prefill tokens in chunks whose causal attention covers ``pairs`` (query,
key) pairs (a chunk of ``m`` new tokens after ``c`` computed ones: ``m*c + m*(m+1)/2``).

- ``decode_base_s``: reading every weight once (weight bytes / effective HBM bandwidth),
  the memory floor of the linear layers; ``decode_per_seq_s`` / ``prefill_s_per_token``:
  their compute per token (2 FLOPs per parameter, at the decode / prefill MFU). The linear
  layers take the larger of the two: memory-bound below the roofline's ridge (about 300
  tokens per step for FP8 weights on an H100), compute-bound above it.
- ``decode_per_kv_token_s``: reading one context token's K and V in every layer;
  ``prefill_s_per_token_pair``: causal attention FLOPs (QK^T and AV: 4 * layers * q_dim
  per pair) at BF16 (attention is not quantized).
- ``step_overhead_s``: scheduling, sampling, kernel launches and tensor-parallel
  all-reduces per step; ``prefill_overhead_s``: a fixed cost per step with prefill.

KV bytes per token = 2 (K and V) * layers * kv_heads * head_dim * dtype bytes, from
each model's Hugging Face ``config.json``. Efficiency factors (MFU, bandwidth
efficiency, activation reserve, overheads) are assumptions or calibrations, stated
where they are set (the packaged fleet: ``policy/defaults/fleet.yaml``, calibrated by
``scripts/fidelity.py``); override them per fleet.

Scheduler limits (vLLM V1 defaults for ``vllm serve`` on an H100-class GPU,
``vllm/engine/arg_utils.py`` @99d7eb5d): ``max_num_batched_tokens`` 8192 tokens per step,
``max_num_seqs`` 1024 running sequences, KV pages (``block_size``) of 16 tokens
(``vllm/platforms/cuda.py`` @1c0d9ecf). A fleet's replicas take their pool's ``max_num_seqs``
(256 unless set: ``replay.fleet_map``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class ModelSpec:
    """Shape of a decoder-only transformer, as in its Hugging Face ``config.json``.

    ``params``: parameter count; ``q_dim`` = num_attention_heads * head_dim;
    ``dtype_bytes``: bytes per weight and per KV element (2 for BF16).
    """

    name: str
    params: float
    layers: int
    kv_heads: int
    head_dim: int
    q_dim: int
    max_model_len: int
    dtype_bytes: int = 2

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of KV cache per token: 2 * layers * kv_heads * head_dim * dtype_bytes."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    @property
    def weight_bytes(self) -> float:
        """Bytes of weights: params * dtype_bytes."""
        return self.params * self.dtype_bytes


LLAMA_3_1_8B = ModelSpec(
    name="Llama-3.1-8B-Instruct",
    params=8.03e9,  # 8,030,261,248 parameters
    layers=32,  # num_hidden_layers
    kv_heads=8,  # num_key_value_heads (GQA)
    head_dim=128,  # hidden_size 4096 / num_attention_heads 32
    q_dim=4096,
    max_model_len=131_072,  # max_position_embeddings
)
"""meta-llama/Llama-3.1-8B-Instruct config.json: KV = 2*32*8*128*2 = 131,072 B (128 KiB) per token."""

LLAMA_3_3_70B = ModelSpec(
    name="Llama-3.3-70B-Instruct",
    params=70.55e9,  # 70,553,706,496 parameters
    layers=80,
    kv_heads=8,
    head_dim=128,  # hidden_size 8192 / num_attention_heads 64
    q_dim=8192,
    max_model_len=131_072,
)
"""meta-llama/Llama-3.3-70B-Instruct config.json: KV = 2*80*8*128*2 = 327,680 B (320 KiB) per token."""


MODEL_PRESETS: dict[str, ModelSpec] = {
    "meta-llama/llama-3.1-8b-instruct": LLAMA_3_1_8B,
    "meta-llama/llama-3.3-70b-instruct": LLAMA_3_3_70B,
    # Llama 3.1 70B has the same config.json shape as 3.3 70B (80 layers, 8 KV heads, 128K context).
    "meta-llama/llama-3.1-70b-instruct": LLAMA_3_3_70B,
}
"""Model shapes by Hugging Face model id (lower case), for fleet files that name the model."""


def model_preset(model: str) -> ModelSpec | None:
    """The ``ModelSpec`` for a Hugging Face model id (case-insensitive; the id's last path
    segment alone also matches, e.g. ``Llama-3.1-8B-Instruct``), or None if unknown."""
    key = model.strip().lower()
    if key in MODEL_PRESETS:
        return MODEL_PRESETS[key]
    tail = key.rsplit("/", 1)[-1]
    for name, spec in MODEL_PRESETS.items():
        if name.rsplit("/", 1)[-1] == tail:
            return spec
    return None


@dataclass(frozen=True)
class GPUSpec:
    """One GPU's datasheet figures: HBM bytes, HBM bytes/s, dense BF16 and FP8 FLOP/s, power in kW."""

    name: str
    hbm_bytes: float
    hbm_bytes_per_s: float
    bf16_flops: float
    tdp_kw: float
    idle_kw: float
    fp8_flops: float = 0.0

    def linear_flops(self, weight_dtype: str) -> float:
        """Dense tensor-core FLOP/s for matmuls with ``weight_dtype`` weights (``fp8`` uses the
        FP8 peak where the GPU has one, else BF16's)."""
        if weight_dtype == "fp8" and self.fp8_flops > 0:
            return self.fp8_flops
        return self.bf16_flops


H100_SXM = GPUSpec(
    name="H100-SXM5-80GB",
    hbm_bytes=80e9,  # 80 GB HBM3
    hbm_bytes_per_s=3.35e12,  # 3.35 TB/s
    bf16_flops=989.4e12,  # dense BF16 tensor-core peak (1,979 TFLOPS is with 2:4 sparsity)
    tdp_kw=0.700,  # 700 W max board power
    idle_kw=0.070,  # assumption: typical nvidia-smi draw of an idle H100 SXM
    fp8_flops=1978.9e12,  # dense FP8 tensor-core peak (3,958 TFLOPS is with 2:4 sparsity)
)
"""NVIDIA H100 SXM5 datasheet figures (80 GB HBM3, 3.35 TB/s, 989 TFLOPS dense BF16, 1,979 dense FP8, 700 W)."""

H200_SXM = GPUSpec(
    name="H200-SXM-141GB",
    hbm_bytes=141e9,  # 141 GB HBM3e
    hbm_bytes_per_s=4.8e12,  # 4.8 TB/s
    bf16_flops=989.4e12,  # dense BF16 (the datasheet's 1,979 TFLOPS is with sparsity); the H100's compute
    tdp_kw=0.700,  # up to 700 W
    idle_kw=0.070,  # assumption: as the H100 SXM (10% of its maximum power)
    fp8_flops=1978.9e12,  # dense FP8 (3,958 TFLOPS with sparsity)
)
"""NVIDIA H200 Tensor Core GPU datasheet figures (SXM: 141 GB HBM3e, 4.8 TB/s, 989 TFLOPS dense BF16,
1,979 dense FP8, up to 700 W)."""

A100_SXM_80GB = GPUSpec(
    name="A100-SXM4-80GB",
    hbm_bytes=80e9,  # 80 GB HBM2e
    hbm_bytes_per_s=2.039e12,  # 2,039 GB/s
    bf16_flops=312e12,  # dense BF16 tensor-core peak (624 TFLOPS with sparsity); no FP8 tensor cores
    tdp_kw=0.400,  # 400 W
    idle_kw=0.040,  # assumption: 10% of its maximum power, as for the H100
)
"""NVIDIA A100 Tensor Core GPU datasheet figures (SXM 80GB: 80 GB HBM2e, 2,039 GB/s, 312 TFLOPS dense
BF16, no FP8: FP8 weights run their matmuls at the BF16 peak, as vLLM's weight-only FP8 kernels on
Ampere do, 400 W)."""

GPU_PRESETS: dict[str, GPUSpec] = {"H100-SXM": H100_SXM, "H200-SXM": H200_SXM, "A100-SXM-80GB": A100_SXM_80GB}
"""GPUs a fleet file may name (``replay.gpu``)."""

WEIGHT_DTYPE_BYTES: dict[str, float] = {"bf16": 2, "fp16": 2, "fp8": 1}
"""Bytes per weight for the weight precisions a fleet file may name (``replay.weight_dtype``)."""


@dataclass(frozen=True)
class ReplicaSpec:
    """One serving replica (one model instance on ``gpus`` GPUs): latency coefficients and limits.

    Units: seconds, tokens, bytes. KV capacity: ``kv_capacity_blocks`` blocks of
    ``block_tokens`` tokens (``block_tokens`` must equal the trace's hash block size when
    the trace carries block hashes: 512 for Mooncake), allocated in pages of
    ``kv_block_tokens`` tokens (vLLM's ``block_size``; must divide ``block_tokens``).
    ``max_num_seqs``: most sequences running at once (vLLM ``max_num_seqs``, at most
    ``max_num_batched_tokens``); ``max_num_batched_tokens``: tokens scheduled per step
    (vLLM's token budget). ``max_model_len``: longest prompt + output.
    ``kv_admission``: ``"vllm"`` (allocate KV as the context grows, preempt the newest request
    when it runs out; vLLM V1) or ``"reserve"`` (reserve prompt + output at admission and never
    preempt: TensorRT-LLM's default ``GUARANTEED_NO_EVICT`` capacity scheduler, its docs'
    "Useful Runtime Options" and ``SchedulerConfig``).
    ``gpu_tdp_kw``/``gpu_idle_kw``: per-GPU power when busy/idle, for energy cost.
    The step-time coefficients are described in the module docstring.
    """

    name: str
    gpus: int
    kv_capacity_blocks: int
    kv_bytes_per_token: int
    prefill_s_per_token: float
    prefill_s_per_token_pair: float
    decode_base_s: float
    decode_per_seq_s: float
    decode_per_kv_token_s: float
    prefill_overhead_s: float = 0.0
    step_overhead_s: float = 0.0
    block_tokens: int = 512
    kv_block_tokens: int = 16
    max_num_seqs: int = 1024
    max_num_batched_tokens: int = 8192
    max_model_len: int = 131_072
    kv_admission: str = "vllm"
    gpu_tdp_kw: float = 0.700
    gpu_idle_kw: float = 0.070

    def __post_init__(self) -> None:
        if self.kv_admission not in ("vllm", "reserve"):
            raise ValueError(f"replica {self.name!r}: kv_admission must be 'vllm' or 'reserve', got "
                             f"{self.kv_admission!r}")
        if min(self.gpus, self.kv_capacity_blocks, self.block_tokens, self.kv_block_tokens, self.max_num_seqs,
               self.max_num_batched_tokens) < 1:
            raise ValueError(f"replica {self.name!r}: gpus, kv_capacity_blocks, block_tokens, kv_block_tokens, "
                             f"max_num_seqs and max_num_batched_tokens must be >= 1")
        if self.block_tokens % self.kv_block_tokens:
            raise ValueError(f"replica {self.name!r}: kv_block_tokens {self.kv_block_tokens} does not divide "
                             f"block_tokens {self.block_tokens}")
        if self.max_num_seqs > self.max_num_batched_tokens:
            raise ValueError(f"replica {self.name!r}: max_num_seqs {self.max_num_seqs} exceeds "
                             f"max_num_batched_tokens {self.max_num_batched_tokens} (vLLM caps max_num_seqs "
                             f"at the token budget)")

    def step_s(self, decode_tokens: int, kv_tokens: int, prefill_tokens: int = 0, pairs: float = 0.0) -> float:
        """Seconds for one engine step (module docstring): ``decode_tokens`` decoding sequences
        whose contexts hold ``kv_tokens`` tokens in total, plus ``prefill_tokens`` prefill
        tokens covering ``pairs`` causal-attention (query, key) pairs."""
        linear = decode_tokens * self.decode_per_seq_s + prefill_tokens * self.prefill_s_per_token
        return (self.step_overhead_s + max(self.decode_base_s, linear) + kv_tokens * self.decode_per_kv_token_s
                + pairs * self.prefill_s_per_token_pair + (self.prefill_overhead_s if prefill_tokens else 0.0))

    def work_s(self, decode_tokens: int, kv_tokens: int, prefill_tokens: int = 0, pairs: float = 0.0) -> float:
        """The seconds of ``step_s`` (same arguments) that grow with the step's tokens: the linear layers'
        compute, the context reads and the attention, without the overheads and the memory floor
        (``decode_base_s``) that a fuller step shares. What these tokens cost the replica however they
        are batched: a lower bound of the GPU time they need."""
        return (decode_tokens * self.decode_per_seq_s + prefill_tokens * self.prefill_s_per_token
                + kv_tokens * self.decode_per_kv_token_s + pairs * self.prefill_s_per_token_pair)

    def prefill_s(self, new_tokens: int, cached_tokens: int = 0) -> float:
        """Seconds to prefill ``new_tokens`` prompt tokens after ``cached_tokens`` cached ones in
        one step of their own (no chunking, no decodes): ``step_s(0, 0, n, pairs)``.

        Causal attention pairs: token i of the new ones (0-based) attends to
        ``cached_tokens + i + 1`` keys, in total ``n*c + n*(n+1)/2``.
        """
        n, c = new_tokens, cached_tokens
        return self.step_s(0, 0, n, n * c + n * (n + 1) / 2)

    def decode_step_s(self, batch: int, kv_tokens: int) -> float:
        """Seconds for one decode-only step of ``batch`` sequences holding ``kv_tokens`` context tokens in total."""
        return self.step_s(batch, kv_tokens)

    @property
    def kv_capacity_tokens(self) -> int:
        """KV capacity in tokens: kv_capacity_blocks * block_tokens."""
        return self.kv_capacity_blocks * self.block_tokens

    @property
    def kv_pages(self) -> int:
        """KV capacity in pages of ``kv_block_tokens``."""
        return self.kv_capacity_tokens // self.kv_block_tokens


def replica_spec_for(
    model: ModelSpec,
    gpu: GPUSpec,
    gpus: int,
    *,
    prefill_mfu: float = 0.5,
    decode_mfu: float = 0.5,
    bandwidth_efficiency: float = 0.8,
    memory_utilization: float = 0.9,
    activation_reserve_bytes_per_gpu: float = 4e9,
    step_overhead_s: float = 0.0003,
    prefill_overhead_s: float = 0.002,
    block_tokens: int = 512,
    kv_block_tokens: int = 16,
    max_num_seqs: int = 1024,
    max_num_batched_tokens: int = 8192,
    weight_dtype: str = "bf16",
    kv_bytes_per_token: int | None = None,
    kv_capacity_blocks: int | None = None,
) -> ReplicaSpec:
    """Derive a ``ReplicaSpec`` for ``model`` on ``gpus`` tensor-parallel ``gpu``s.

    - peak FLOP/s = gpus * the GPU's dense FLOP/s for ``weight_dtype`` (FP8 weights run
      their matmuls at the FP8 peak; attention stays at BF16); HBM bandwidth = gpus * hbm_bytes_per_s.
    - weight bytes = params * ``WEIGHT_DTYPE_BYTES[weight_dtype]``; KV bytes per token =
      ``kv_bytes_per_token`` if given, else the model's (BF16 KV).
    - prefill: s/token = 2*params / (linear peak * prefill_mfu); s/pair = 4*layers*q_dim / (BF16 peak * prefill_mfu).
    - decode: base = weight_bytes / (bandwidth * bandwidth_efficiency) (the memory floor of a step);
      per seq = 2*params / (linear peak * decode_mfu); per KV token = kv_bytes_per_token / (bandwidth * efficiency);
      ``step_overhead_s`` per step.
    - KV capacity = ``kv_capacity_blocks`` if given, else (gpus * hbm_bytes * memory_utilization
      - weight_bytes - gpus * activation_reserve_bytes_per_gpu) / (kv_bytes_per_token * block_tokens), floored.

    Defaults are assumptions, not measurements: MFU 0.5 (large-prompt prefill on H100
    typically reaches 40-60%), 80% of peak HBM bandwidth, vLLM's default
    ``gpu_memory_utilization`` 0.9, 4 GB per GPU for activations and CUDA graphs; the
    scheduler limits of vLLM V1 on an H100 (module docstring).
    Raises ValueError for an unknown ``weight_dtype`` or when the weights leave no room for KV cache.
    """
    if weight_dtype not in WEIGHT_DTYPE_BYTES:
        raise ValueError(f"weight_dtype {weight_dtype!r}: expected one of {', '.join(WEIGHT_DTYPE_BYTES)}")
    linear_peak = gpus * gpu.linear_flops(weight_dtype)
    attention_peak = gpus * gpu.bf16_flops
    bandwidth = gpus * gpu.hbm_bytes_per_s * bandwidth_efficiency
    kv_bytes = kv_bytes_per_token or model.kv_bytes_per_token
    weight_bytes = model.params * WEIGHT_DTYPE_BYTES[weight_dtype]
    if kv_capacity_blocks is None:
        free = gpus * gpu.hbm_bytes * memory_utilization - weight_bytes - gpus * activation_reserve_bytes_per_gpu
        kv_capacity_blocks = math.floor(free / (kv_bytes * block_tokens))
        if kv_capacity_blocks < 1:
            raise ValueError(f"{model.name} ({weight_dtype}) on {gpus}x{gpu.name}: weights leave no room for KV cache")
    return ReplicaSpec(
        name=f"{model.name}@{gpus}x{gpu.name}" + (f"/{weight_dtype}" if weight_dtype != "bf16" else ""),
        gpus=gpus,
        kv_capacity_blocks=kv_capacity_blocks,
        kv_bytes_per_token=kv_bytes,
        prefill_s_per_token=2 * model.params / (linear_peak * prefill_mfu),
        prefill_s_per_token_pair=4 * model.layers * model.q_dim / (attention_peak * prefill_mfu),
        decode_base_s=weight_bytes / bandwidth,
        decode_per_seq_s=2 * model.params / (linear_peak * decode_mfu),
        decode_per_kv_token_s=kv_bytes / bandwidth,
        prefill_overhead_s=prefill_overhead_s,
        step_overhead_s=step_overhead_s,
        block_tokens=block_tokens,
        kv_block_tokens=kv_block_tokens,
        max_num_seqs=min(max_num_seqs, max_num_batched_tokens),
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=model.max_model_len,
        gpu_tdp_kw=gpu.tdp_kw,
        gpu_idle_kw=gpu.idle_kw,
    )


def llama_8b_h100() -> ReplicaSpec:
    """Llama-3.1-8B on 1x H100 SXM, BF16.

    Derived: KV 128 KiB/token; 773 blocks of 512 tokens (about 396k tokens);
    prefill 32.5 us/token (about 31k tokens/s before attention); decode step at batch 1
    about 6.3 ms (16.06 GB of weights at 2.68 TB/s effective, plus 0.3 ms overhead).
    """
    return replica_spec_for(LLAMA_3_1_8B, H100_SXM, 1)


def llama_70b_h100_tp4() -> ReplicaSpec:
    """Llama-3.3-70B on 4x H100 SXM with tensor parallelism 4, BF16.

    Derived: KV 320 KiB/token; 780 blocks of 512 tokens (about 399k tokens); prefill
    at MFU 0.45 (TP all-reduces cost some of the 0.5), 79 us/token (about 12.6k
    tokens/s before attention); decode step at batch 1 about 15.2 ms: 141 GB of
    weights at 10.7 TB/s effective (13.2 ms) plus 2 ms for 160 all-reduces per step
    (2 per layer, about 12 us each over NVLink; an assumption).
    """
    return replica_spec_for(LLAMA_3_3_70B, H100_SXM, 4, prefill_mfu=0.45, step_overhead_s=0.002)


#: Measured KV-transfer bandwidth per GPU's NIC (bytes/s): one 400 Gb/s ConnectX-7 per GPU
#: (as in a DGX H100) at 84% of its 50 GB/s line rate. Fitted to SGLang's P/D transfer times
#: over Mooncake's transfer engine (4 x 400 GbE: t = 1.8 ms + bytes / 168 GB/s; peak 164.3 GB/s =
#: 82% of line), ``kvcache-ai/Mooncake`` ``docs/source/performance/sglang/sglang-benchmark-results-v1.md``
#: @3b5a5941; Mooncake's own README reports 87% of line over 4 x 200 Gb/s.
NIC_BYTES_PER_S = 42e9
#: Set-up time of one KV transfer (seconds), the intercept of the same fit.
LINK_LATENCY_S = 0.0018


@dataclass(frozen=True)
class LinkSpec:
    """A prefill replica's KV transfer link (its NICs):
    ``transfer_s(bytes) = latency_s + bytes / bytes_per_s`` for a transfer alone.

    The link is **contended**: the simulator shares ``bytes_per_s`` equally among the
    transfers leaving one prefill replica at the same time (processor sharing), and each
    pays ``latency_s`` once. Default: one NIC (``NIC_BYTES_PER_S``, ``LINK_LATENCY_S``);
    ``LinkSpec.for_gpus(n)`` is a replica of ``n`` GPUs with a NIC each. The decode side's
    NICs are not modelled (its pool is at least as large as the prefill pool in the
    packaged fleet).
    """

    bytes_per_s: float = NIC_BYTES_PER_S
    latency_s: float = LINK_LATENCY_S

    @classmethod
    def for_gpus(cls, gpus: int) -> LinkSpec:
        """The link of a replica of ``gpus`` GPUs, one ``NIC_BYTES_PER_S`` NIC per GPU."""
        return cls(gpus * NIC_BYTES_PER_S, LINK_LATENCY_S)

    def transfer_s(self, nbytes: float) -> float:
        """Seconds to move ``nbytes`` bytes of KV cache with the link to itself."""
        return self.latency_s + nbytes / self.bytes_per_s


@dataclass(frozen=True)
class SharedKVTierSpec:
    """A shared KV store (LMCache-style offload to CPU DRAM or a KV accelerator).

    Every completed prefill writes its prompt's full blocks through to the tier (LRU,
    ``capacity_blocks``; the write bandwidth is not modelled); a replica missing a prefix
    locally may restore the next leading blocks from it instead of recomputing them, when
    the restore (``latency_s + bytes / share``) is predicted faster than recomputing. The
    restore bandwidth ``restore_bytes_per_s`` is the **tier's total**, shared equally by the
    restores in flight to all replicas of the target (processor sharing). Default 25 GB/s
    (one 200 Gb/s NIC in front of a remote DRAM pool, an assumption; a local host-to-device
    copy on an H100 reaches about 50 GB/s, vLLM's offloading-connector post,
    ``vllm-project/vllm-project.github.io`` ``_posts/2025-12-29-offloading-connector.md``).
    """

    capacity_blocks: int
    restore_bytes_per_s: float = 25e9
    latency_s: float = 0.001

    def restore_s(self, nbytes: float, sharing: int = 1) -> float:
        """Seconds to restore ``nbytes`` bytes of KV cache onto a replica while ``sharing``
        restores (this one included) share the tier's bandwidth."""
        return self.latency_s + nbytes * max(1, sharing) / self.restore_bytes_per_s


@dataclass(frozen=True)
class FrontierSpec:
    """A frontier API tier: list prices, a latency distribution and the provider's prompt
    cache; unlimited capacity.

    Prices in USD per million tokens. TTFT and TPOT are drawn per request from
    log-normal distributions with the given medians (seconds) and log-space sigmas.
    Defaults: GPT-4o list prices ($2.50 input, $1.25 cached input, $10.00 output per 1M
    tokens, OpenAI pricing page, 2024-25); latency medians 0.6 s TTFT and 12 ms TPOT
    (about 80 tokens/s) are assumptions of the order public API trackers report.

    Prompt cache (OpenAI "Prompt caching" docs): prompts of at least
    ``prompt_cache_min_tokens`` (1,024) tokens have their leading blocks cached; cached
    input tokens bill at ``cached_input_usd_per_mtok``; a cached prefix stays while it is
    used at least every ``prompt_cache_ttl_s`` seconds (OpenAI: 5-10 minutes of
    inactivity; 300 s here). ``cached_input_usd_per_mtok=None`` disables the cache.
    ``block_tokens``: tokens per block hash of the replayed trace (512 for Mooncake).
    ``max_model_len``: the tier's context window (prompt + output tokens); longer requests
    are refused (``context_length``); None = unbounded.
    """

    name: str
    input_usd_per_mtok: float = 2.50
    output_usd_per_mtok: float = 10.00
    ttft_median_s: float = 0.6
    ttft_sigma: float = 0.4
    tpot_median_s: float = 0.012
    tpot_sigma: float = 0.25
    cached_input_usd_per_mtok: float | None = 1.25
    prompt_cache_min_tokens: int = 1024
    prompt_cache_ttl_s: float = 300.0
    block_tokens: int = 512
    max_model_len: int | None = None

    def cost_usd(self, prompt_tokens: int, output_tokens: int, cached_tokens: int = 0) -> float:
        """API bill in USD for one request with ``cached_tokens`` of its prompt served from the
        prompt cache (billed at the cached-input price)."""
        cached_price = self.input_usd_per_mtok if self.cached_input_usd_per_mtok is None else self.cached_input_usd_per_mtok
        return ((prompt_tokens - cached_tokens) * self.input_usd_per_mtok + cached_tokens * cached_price
                + output_tokens * self.output_usd_per_mtok) / 1e6
