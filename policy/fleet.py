"""The fleet: every target a request can go to, with its pools, endpoints and prices.

A fleet file is YAML (``apiVersion: pointsman/v1``, ``kind: Fleet``); see
``policy/defaults/fleet.yaml`` for a documented example. Two kinds of target:

- ``onprem``: one open model served by our own GPUs, in an ``aggregated`` pool
  and/or a ``prefill`` + ``decode`` pool pair (prefill/decode disaggregation).
  Priced by GPU-hours and power; each pool states per-replica prefill and decode
  throughput in tokens/s (see ``policy/cost.py`` for how cost follows).
- ``frontier``: a paid API tier, priced per 1M input, cached input and output tokens.

Optional per on-prem target: ``kv_bytes_per_token`` (KV-cache bytes one token
occupies) and ``shared_kv`` (a shared KV tier, LMCache-style, from which a cached
prefix can be restored onto any endpoint of the target at a transfer cost instead of
being recomputed). Per frontier target: ``prompt_cache_min_tokens`` (the provider
caches prompt prefixes only from this length; OpenAI: 1,024 tokens) and
``prompt_cache_ttl_s`` (a cached prefix unused this long is gone; OpenAI: 5-10 minutes,
default 300 s), read by the service's cost estimate and by replay alike. Per target:
``image_tokens`` (``{high: N, low: M}``: the most prompt tokens one image input bills, at detail high/auto and
low; absent, the provider's rule for the model, ``policy/media_tokens.py``; an on-prem target that takes images
must state it), read by the cost estimate and the context-window filter.

Endpoint ids: every endpoint has an id, unique in the fleet, by which load, health
and the prefix index know it: an on-prem endpoint's ``url``; a frontier target's
name (its API is one endpoint). ``Fleet.endpoints`` maps ids to ``EndpointInfo``;
on-prem endpoints may also be named by their ``name`` (``Fleet.endpoint_id``).

Optional ``slo_classes``: the latency objectives (TTFT and TPOT, seconds) of each service
class a request may name in ``routing.slo_class``; ``defaults.slo_class`` is the class of a
request that names none. Without the section, ``DEFAULT_SLO_CLASSES`` apply. Replay measures
SLO attainment and goodput against them (``docs/replay.md``).

Optional ``replay`` sections (fleet-wide, per on-prem target, per frontier target) hold
what only trace replay (``pointsman replay``, ``pointsman.replay.fleet_map``) reads:
hardware, efficiency and admission assumptions of the simulated fleet, and per target
``quality_columns`` (outcome source -> the model column of its table that stands for the
target when replay scores quality; the source names are checked here, the columns when
replay reads the table). The engine ignores them. See ``docs/replay.md`` for every key and its default.

``load_fleet(path) -> Fleet`` validates the file and raises ``FleetError`` listing
every problem as ``file:line:col: code: message``.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, StringConstraints, field_validator, model_validator

from pointsman.errors import FleetError, Problem
from pointsman.located import LocatedDocument, StrictModel, did_you_mean, parse_yaml, read_text, validate
from pointsman.policy.media_tokens import ImageRule, ImageTokens, image_rule, no_images

#: The packaged default fleet.
DEFAULT_FLEET_PATH = Path(__file__).parent / "defaults" / "fleet.yaml"

Mode = Literal["aggregated", "disaggregated"]
MODES: tuple[str, ...] = ("aggregated", "disaggregated")
TargetName = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9._-]{0,62}$")]


def _check_url(value: str) -> str:
    if not re.fullmatch(r"https?://[^\s/]+\S*", value) or len(value) > 2048:
        raise ValueError(f"'{value}' is not an http:// or https:// URL")
    return value


Url = Annotated[str, AfterValidator(_check_url)]
PositiveInt = Annotated[int, Field(gt=0)]
# Finite: an infinite price or rate made every estimate inf (NaN: every comparison false), and
# /v1/route then answered 500 for every request (inf is not JSON).
PositiveFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]
NonNegativeFloat = Annotated[float, Field(ge=0, allow_inf_nan=False)]
NonNegativeInt = Annotated[int, Field(ge=0)]


def _check_zmq(value: str) -> str:
    if not re.fullmatch(r"(tcp|ipc)://\S+", value) or len(value) > 2048:
        raise ValueError(f"'{value}' is not a ZMQ address (tcp://host:port or ipc://path)")
    return value


ZmqUrl = Annotated[str, AfterValidator(_check_zmq)]


class EndpointEvents(StrictModel):
    """Where an engine publishes its KV-cache events (vLLM's and SGLang's ``--kv-events-config``):
    ``url`` of its ZMQ PUB socket (``tcp://host:5557``), optional ``replay_url`` of its ROUTER
    replay socket (gaps are then filled instead of dropping the endpoint's entries), ``topic``
    (default ``""``). One data-parallel rank per entry: vLLM offsets both ports by the rank."""

    url: ZmqUrl
    replay_url: ZmqUrl | None = None
    topic: str = ""


class Endpoint(StrictModel):
    """One replica (or an API base URL): ``url`` (http/https), optional ``name``,
    ``metrics_url``: where its engine serves Prometheus metrics (default: ``url``'s origin with
    path ``/metrics``, where vLLM and SGLang serve them; naming one asks for the endpoint to be scraped
    unless the fleet sets ``defaults.scrape_metrics: false``), and ``kv_events``: where it publishes
    KV-cache events (for a target with ``kv_events``)."""

    url: Url
    name: str | None = None
    metrics_url: Url | None = None
    kv_events: EndpointEvents | None = None


class Capabilities(StrictModel):
    """What requests a target can serve: tool calls, image inputs, audio inputs (``input_audio``
    parts) and answers (``modalities: ["audio"]``), file inputs (``file`` parts: PDFs, ...)."""

    tools: bool = True
    images: bool = False
    audio: bool = False
    files: bool = False


class Pool(StrictModel):
    """A group of identical replicas of one model.

    ``prefill_tokens_per_s`` / ``decode_tokens_per_s``: one replica's throughput
    under full batching (prompt tokens processed per second; output tokens generated
    per second, summed over all concurrent requests). ``gpus_per_replica``: GPUs one
    replica occupies (tensor-parallel degree). ``kv_cache_capacity_tokens``: tokens of
    KV cache one replica holds (optional; the prefix index bounds itself by it).
    For latency prediction (``policy/selection/latency.py``): ``decode_step_s``, seconds of one
    decode step at a small batch (the inter-token latency of a lone request: reading the
    weights once; the floor of predicted TPOT, and of predicted prefill, whose first token needs
    such a pass; absent: the batch share alone, the prefill work alone), and
    ``max_num_batched_tokens``, the engine's token budget per step (vLLM's
    ``--max-num-batched-tokens``: the largest prefill chunk a decode step can carry; replay's
    simulator schedules the pool's replicas with it too). ``max_num_seqs``: sequences one replica runs
    in a batch at most (vLLM's ``--max-num-seqs``; default 256, vLLM V1's for ``vllm serve`` below the
    H100 class, 1024 on it): the endpoint pickers' bounded-load cap is never below it (``pickers.py``),
    and replay's simulator runs at most that many per replica (capped at ``max_num_batched_tokens``, as vLLM does).
    """

    gpus_per_replica: PositiveInt
    prefill_tokens_per_s: PositiveFloat
    decode_tokens_per_s: PositiveFloat
    kv_cache_capacity_tokens: PositiveInt | None = None
    decode_step_s: PositiveFloat | None = None
    max_num_batched_tokens: PositiveInt = 8192
    max_num_seqs: PositiveInt = 256
    endpoints: list[Endpoint] = Field(min_length=1)

    @field_validator("endpoints", mode="before")
    @classmethod
    def _urls_as_endpoints(cls, v: object) -> object:
        if isinstance(v, list):
            return [{"url": e} if isinstance(e, str) else e for e in v]
        return v

    @property
    def gpus(self) -> int:
        """GPUs of the whole pool: replicas × ``gpus_per_replica``."""
        return len(self.endpoints) * self.gpus_per_replica


class Pools(StrictModel):
    """An on-prem target's pools: ``aggregated``, and/or ``prefill`` + ``decode`` (disaggregated)."""

    aggregated: Pool | None = None
    prefill: Pool | None = None
    decode: Pool | None = None

    @model_validator(mode="after")
    def _shape(self) -> Pools:
        if (self.prefill is None) != (self.decode is None):
            raise ValueError("a disaggregated target needs both a 'prefill' and a 'decode' pool")
        if self.aggregated is None and self.prefill is None:
            raise ValueError("declare an 'aggregated' pool, or 'prefill' and 'decode' pools")
        return self


class TargetEvents(StrictModel):
    """How a target's engines hash the KV-cache blocks they report (so a request's blocks can be
    matched against their ``BlockStored`` events; ``policy/signals/engine_hashes.py``):
    ``engine`` (``vllm`` or ``sglang``: the two hash blocks differently, so a feed read with the
    other's scheme matches nothing); ``tokenizer`` (the model's ``tokenizer.json``) and ``tokenizer_config`` (its
    ``tokenizer_config.json``: the chat template and special tokens) or ``chat_template`` (a
    Jinja file), paths relative to the fleet file; ``hash_algo`` (vLLM's
    ``--prefix-caching-hash-algo``: ``sha256``, the default since vLLM 0.10.2, or
    ``sha256_cbor``); ``hash_seed`` (the engines' ``PYTHONHASHSEED`` if they set one; vLLM ≥ 0.29
    otherwise seeds with a fixed string); both vLLM's only; ``block_size`` (tokens per block:
    vLLM's default 16; SGLang's ``--page-size``, default 1);
    ``max_tokens`` (leading prompt tokens hashed per request); ``shared_media`` (the media, as the events name
    them, whose blocks are the target's ``shared_kv`` tier, reachable from every endpoint: a shared store's
    connector; default none: a block on another medium than ``GPU``, such as vLLM's built-in ``CPU`` offload, is
    the reporting replica's own, restorable there only; ``policy/signals/engine_cache.py``). Endpoints name their event
    sockets (``endpoints[].kv_events``); with events, the target's cache signals are what the
    engines report, not Pointsman's estimate."""

    engine: Literal["vllm", "sglang"] = "vllm"
    tokenizer: str = Field(min_length=1)
    tokenizer_config: str | None = None
    chat_template: str | None = None
    hash_algo: Literal["sha256", "sha256_cbor"] = "sha256"
    hash_seed: str | None = None
    block_size: PositiveInt = 16
    max_tokens: PositiveInt = 32768
    shared_media: frozenset[Annotated[str, StringConstraints(min_length=1)]] = frozenset()

    @model_validator(mode="after")
    def _vllm_settings_for_vllm(self) -> TargetEvents:
        if self.engine == "sglang" and (self.hash_algo != "sha256" or self.hash_seed is not None):
            raise ValueError("hash_algo and hash_seed are vLLM's settings: SGLang hashes its pages with SHA-256, "
                             "unseeded (engine: sglang takes neither)")
        return self


class SharedKV(StrictModel):
    """A shared KV tier reachable from every endpoint of a target (LMCache-style CPU/disk/remote
    store, or a vendor's KV accelerator): ``capacity_tokens`` of KV it holds,
    ``bandwidth_bytes_per_s`` restore bandwidth into one endpoint, ``latency_s`` fixed cost
    per restore. Restoring ``n`` tokens costs ``latency_s + n × kv_bytes_per_token /
    bandwidth_bytes_per_s`` seconds (``prefix_index.SharedKVTier.restore_s``)."""

    capacity_tokens: PositiveInt
    bandwidth_bytes_per_s: PositiveFloat
    latency_s: NonNegativeFloat = 0.0


Fraction01 = Annotated[float, Field(gt=0, le=1)]
#: ``replay.quality_columns``: outcome source name -> model column of its table.
QualityColumns = dict[Annotated[str, StringConstraints(min_length=1)], Annotated[str, StringConstraints(min_length=1)]]


class ReplayModelShape(StrictModel):
    """A model's shape for the replay simulator, as in its Hugging Face ``config.json``:
    ``params`` (parameter count), ``layers``, ``kv_heads``, ``head_dim``, ``q_dim``
    (attention heads × head dim). Needed only for models without a simulator preset."""

    params: PositiveFloat
    layers: PositiveInt
    kv_heads: PositiveInt
    head_dim: PositiveInt
    q_dim: PositiveInt


class OnPremReplay(StrictModel):
    """Replay-only settings of an on-prem target (``pointsman replay``; the engine ignores
    them). Every key is optional; an absent key keeps the simulator's default
    (``docs/replay.md``): ``gpu`` (a GPU preset, default ``H100-SXM``), ``weight_dtype``
    (``bf16``/``fp16``/``fp8``), ``model_shape`` (for models without a preset), efficiency
    factors (``prefill_mfu``, ``decode_mfu``, ``bandwidth_efficiency``), per-step and
    per-prefill overheads in seconds, ``kv_block_tokens`` (KV page size; the scheduler's limits are the
    pool's ``max_num_batched_tokens`` and ``max_num_seqs``, which the engine reads too), ``max_waiting`` (admission
    limit per replica; ``null`` = unbounded), each
    prefill replica's P/D link (``link_bytes_per_s``, ``link_latency_s``),
    ``idle_power_kw_per_gpu``, and the latency coefficients themselves
    (``prefill_s_per_token``, ``prefill_s_per_token_pair``, ``decode_base_s``,
    ``decode_per_seq_s``, ``decode_per_kv_token_s``) to replace the derived ones, and
    ``quality_columns`` (outcome source -> the table's model column scoring this target;
    a source not named scores on-prem targets as its weak model). ``max_num_batched_tokens`` and
    ``max_batch_size`` (now the pool's ``max_num_seqs``) are accepted only to say they moved to each pool (``moved-key``)."""

    gpu: str | None = None
    weight_dtype: Literal["bf16", "fp16", "fp8"] | None = None
    model_shape: ReplayModelShape | None = None
    prefill_mfu: Fraction01 | None = None
    decode_mfu: Fraction01 | None = None
    bandwidth_efficiency: Fraction01 | None = None
    step_overhead_s: NonNegativeFloat | None = None
    prefill_overhead_s: NonNegativeFloat | None = None
    max_batch_size: PositiveInt | None = None
    kv_block_tokens: PositiveInt | None = None
    max_waiting: NonNegativeInt | None = None
    link_bytes_per_s: PositiveFloat | None = None
    link_latency_s: NonNegativeFloat | None = None
    idle_power_kw_per_gpu: NonNegativeFloat | None = None
    max_num_batched_tokens: PositiveInt | None = None
    prefill_s_per_token: PositiveFloat | None = None
    prefill_s_per_token_pair: NonNegativeFloat | None = None
    decode_base_s: PositiveFloat | None = None
    decode_per_seq_s: NonNegativeFloat | None = None
    decode_per_kv_token_s: NonNegativeFloat | None = None
    quality_columns: QualityColumns | None = None


class FrontierReplay(StrictModel):
    """Replay-only settings of a frontier tier: log-normal latency (``ttft_median_s``,
    ``ttft_sigma``, ``tpot_median_s``, ``tpot_sigma``) and ``quality_columns`` (as for on-prem;
    a source not named scores frontier targets as its strong model); absent keys keep the
    simulator's defaults. ``prompt_cache_ttl_s`` is accepted only to say it moved to the target
    (``moved-key``): the service's estimate uses the same lifetime."""

    ttft_median_s: PositiveFloat | None = None
    ttft_sigma: NonNegativeFloat | None = None
    tpot_median_s: PositiveFloat | None = None
    tpot_sigma: NonNegativeFloat | None = None
    prompt_cache_ttl_s: NonNegativeFloat | None = None
    quality_columns: QualityColumns | None = None


class FleetReplay(StrictModel):
    """Replay-only fleet settings: ``spill_target``, the frontier target that takes requests
    refused by on-prem admission control when the decision's fallbacks cannot (default:
    the frontier target with the highest output price; ``null``: reject them)."""

    spill_target: str | None = None


class OnPremTarget(StrictModel):
    """An open model on our own GPUs. Prices: ``usd_per_gpu_hour`` (rental or amortized
    purchase), plus power at ``power_kw_per_gpu`` × ``usd_per_kwh`` (0 when the hourly
    price already includes power). ``kv_link_bytes_per_s``: bytes per second one prefill
    replica sends KV to a decode replica over (P/D transfer; absent: one 400 Gb/s NIC per GPU,
    ``latency.NIC_BYTES_PER_S``). ``image_tokens``: prompt tokens one image input takes at most
    (``high``, and ``low`` at detail low; ``policy/media_tokens.py``): the model's own count, required with
    ``capabilities.images`` (no provider rule applies to an on-prem model). ``lora_adapters``: the LoRA adapters its
    engines serve, by the names of vLLM's ``--lora-modules name=path`` (every endpoint of every pool loads them): a
    request whose ``model`` is one of them runs that adapter there (``Fleet.lora_adapter``)."""

    kind: Literal["onprem"]
    model: str = Field(min_length=1)
    lora_adapters: frozenset[Annotated[str, StringConstraints(min_length=1)]] = frozenset()
    description: str = ""
    context_window_tokens: PositiveInt
    capabilities: Capabilities = Capabilities()
    usd_per_gpu_hour: NonNegativeFloat
    power_kw_per_gpu: NonNegativeFloat = 0.0
    usd_per_kwh: NonNegativeFloat = 0.0
    default_output_tokens: PositiveInt | None = None
    default_mode: Mode | None = None
    image_tokens: ImageTokens | None = None
    kv_bytes_per_token: PositiveInt | None = None
    kv_link_bytes_per_s: PositiveFloat | None = None
    shared_kv: SharedKV | None = None
    kv_events: TargetEvents | None = None
    pools: Pools
    replay: OnPremReplay | None = None

    def pools_by_role(self) -> dict[str, Pool]:
        """The target's pools by role: ``aggregated``, ``prefill``, ``decode`` (those declared)."""
        out = {}
        for role in ("aggregated", "prefill", "decode"):
            pool = getattr(self.pools, role)
            if pool is not None:
                out[role] = pool
        return out

    @property
    def modes(self) -> tuple[str, ...]:
        """Modes this target supports, the default mode first."""
        modes = []
        if self.pools.aggregated is not None:
            modes.append("aggregated")
        if self.pools.prefill is not None:
            modes.append("disaggregated")
        if self.default_mode in modes:
            modes.remove(self.default_mode)
            modes.insert(0, self.default_mode)
        return tuple(modes)

    def pool_pair(self, mode: str) -> tuple[Pool, Pool]:
        """(pool that runs prefill, pool that runs decode) for ``mode``; raises KeyError if unsupported."""
        if mode == "aggregated" and self.pools.aggregated is not None:
            return self.pools.aggregated, self.pools.aggregated
        if mode == "disaggregated" and self.pools.prefill is not None and self.pools.decode is not None:
            return self.pools.prefill, self.pools.decode
        raise KeyError(mode)


class FrontierPrices(StrictModel):
    """List prices in USD per 1M tokens: input, cached input (prompt-cache hits), output, and
    prompt-cache writes with the provider's default 5-minute lifetime
    (``usd_per_1m_cache_write_input_tokens``; Anthropic: 1.25 x input) and a 1-hour lifetime
    (``usd_per_1m_cache_write_1h_input_tokens``; Anthropic: 2 x input). A write price left out
    (None) is priced at those published multipliers of the input price (``cost.CACHE_WRITE_MULTIPLIER``:
    the highest any provider charges, so the booking errs high); providers that bill writes as
    ordinary input (OpenAI) declare the input price."""

    usd_per_1m_input_tokens: NonNegativeFloat
    usd_per_1m_cached_input_tokens: NonNegativeFloat
    usd_per_1m_output_tokens: NonNegativeFloat
    usd_per_1m_cache_write_input_tokens: NonNegativeFloat | None = None
    usd_per_1m_cache_write_1h_input_tokens: NonNegativeFloat | None = None


class FrontierTarget(StrictModel):
    """A paid API tier: ``provider``, upstream ``model`` name, ``base_url``, list prices.
    ``ttft_median_s`` / ``tpot_median_s``: the tier's declared median latency, which latency
    prediction uses when the tier reports none (``load`` readings' ``ttft_p50_ms`` /
    ``tpot_p50_ms``; absent: ``latency.FRONTIER_TTFT_S`` / ``FRONTIER_TPOT_S``).
    ``prompt_cache_min_tokens`` / ``prompt_cache_ttl_s``: the provider caches prompt prefixes
    from this many tokens on and clears one unused for this many seconds (OpenAI: 1,024 tokens,
    5-10 minutes); the cost estimate and replay credit a cached prefix only within the lifetime.
    ``prompt_cache``: ``automatic`` (OpenAI, DeepSeek, Gemini's implicit caching: every long enough
    prompt is cached, writes bill as input) or ``explicit`` (Anthropic, Claude on Bedrock and Vertex:
    only a request that marks a breakpoint with ``cache_control`` is cached, up to its last breakpoint,
    and its uncached prompt bills as a cache write, ``usd_per_1m_cache_write_input_tokens``, or
    ``usd_per_1m_cache_write_1h_input_tokens`` for a 1-hour breakpoint): the estimate of an unmarked
    request credits no cache, and replay (whose requests carry no ``cache_control``) caches nothing.
    ``stored_state``: the tier holds the state a Responses API request continues (``previous_response_id``,
    ``conversation``, ``item_reference`` items, a ``prompt`` template: responses, conversations, items and prompt
    templates the provider stored); None
    (the default) reads true for provider ``openai`` or ``azure`` and false for any other (``holds_stored_state``).
    ``image_tokens``: prompt tokens one image input bills at most (``high``, and ``low`` at detail low): absent,
    the provider's rule for the model (``policy/media_tokens.py``, ``image_rule``)."""

    kind: Literal["frontier"]
    provider: str = Field(min_length=1)
    model: str = Field(min_length=1)
    base_url: Url
    description: str = ""
    context_window_tokens: PositiveInt
    capabilities: Capabilities = Capabilities(images=True)
    prices: FrontierPrices
    prompt_cache_min_tokens: NonNegativeInt = 1024
    prompt_cache_ttl_s: NonNegativeFloat = 300.0
    prompt_cache: Literal["automatic", "explicit"] = "automatic"
    image_tokens: ImageTokens | None = None
    default_output_tokens: PositiveInt | None = None
    ttft_median_s: PositiveFloat | None = None
    tpot_median_s: PositiveFloat | None = None
    stored_state: bool | None = None
    replay: FrontierReplay | None = None

    @property
    def modes(self) -> tuple[str, ...]:
        """A frontier API is one aggregated service from our point of view."""
        return ("aggregated",)

    def pools_by_role(self) -> dict[str, Pool]:
        """A frontier target has no pools of ours."""
        return {}


Target = Annotated[OnPremTarget | FrontierTarget, Field(discriminator="kind")]

#: Providers whose Responses API stores responses and conversations (OpenAI's, and Azure OpenAI's).
STORED_STATE_PROVIDERS = frozenset({"openai", "azure"})


def phase_roles(mode: str) -> tuple[str, str]:
    """(prefill role, decode role): the pools an on-prem target's ``mode`` runs its two phases on
    (``aggregated`` both on the aggregated pool; otherwise the prefill and decode pools)."""
    return ("aggregated", "aggregated") if mode == "aggregated" else ("prefill", "decode")


def target_image_rule(target: OnPremTarget | FrontierTarget) -> ImageRule:
    """The tokens one image input takes on ``target`` (``media_tokens.ImageRule``: by its size and detail): its
    ``image_tokens``, else the provider's rule for its model (``media_tokens.image_rule``; an on-prem target's,
    which the fleet requires to state ``image_tokens`` when it takes images: ``media_tokens.UNKNOWN``); 0 on a
    target without ``capabilities.images``, which never receives one (the capabilities filter keeps the request from
    it), so its cost, predicted prefill and pick count the text it would get."""
    if not target.capabilities.images:
        return no_images
    if target.image_tokens is not None:
        return target.image_tokens
    return image_rule(target.provider if isinstance(target, FrontierTarget) else None, target.model)


def holds_stored_state(target: OnPremTarget | FrontierTarget) -> bool:
    """Whether ``target`` can continue a Responses API request's provider-stored state (``RouteRequest.stored_state``):
    a frontier target's ``stored_state``, by default true for a provider in
    ``STORED_STATE_PROVIDERS``; never an on-prem target (an engine's own response store, vLLM's, is one
    process's: another replica of the pool has none)."""
    if isinstance(target, OnPremTarget):
        return False
    return target.provider in STORED_STATE_PROVIDERS if target.stored_state is None else target.stored_state


class Metadata(StrictModel):
    """Name, description and labels of a fleet or policy file."""

    name: str = ""
    description: str = ""
    labels: dict[str, str] = {}


Fraction = Annotated[float, Field(gt=0, le=1)]


class SLOClass(StrictModel):
    """The latency objectives of one service class, in seconds: a request meets them when its
    time to first token is at most ``ttft_s`` and its time per output token at most ``tpot_s``."""

    ttft_s: PositiveFloat
    tpot_s: PositiveFloat
    description: str = ""


#: Service classes of a fleet file without ``slo_classes``: MLPerf Inference's server-scenario
#: latency constraints (``mlcommons/inference`` ``loadgen/mlperf.conf`` @001712e9):
#: ``interactive`` = Llama 3.1 8B's (TTFT 2,000 ms, TPOT 100 ms; the same TTFT as Llama 2 70B's,
#: whose TPOT is 200 ms; DistServe's chatbot TPOT is 0.1 s too); ``long-context`` = Llama 3.1
#: 405B's, MLPerf's long-context benchmark (prompts to 128K tokens: TTFT 6,000 ms, TPOT 175 ms).
DEFAULT_SLO_CLASSES: dict[str, SLOClass] = {
    "interactive": SLOClass(ttft_s=2.0, tpot_s=0.1, description="MLPerf Inference server scenario, Llama 3.1 8B"),
    "long-context": SLOClass(ttft_s=6.0, tpot_s=0.175,
                             description="MLPerf Inference server scenario, Llama 3.1 405B (long context)"),
}


class FleetDefaults(StrictModel):
    """Fleet-wide defaults. ``output_tokens``: output length assumed for cost when the
    request sets no ``max_tokens`` and the target has no ``default_output_tokens``.
    ``assumed_utilization``: GPU utilization (0–1] an on-prem pool is priced at when its
    telemetry reports none (1.0: the benchmark's full-load throughput);
    ``min_utilization``: the floor of a measured utilization, so an idle pool's price
    per request stays finite (see ``policy/cost.py``). ``scrape_metrics``: whose engine ``/metrics``
    the service scrapes (failed scrapes in a row mark an endpoint unhealthy): ``true`` every on-prem
    endpoint's (its ``metrics_url``, else its URL's ``/metrics``); absent only the endpoints that name
    a ``metrics_url``; ``false`` none. ``slo_class``: the service class of a request that names none
    (a key of the fleet's ``slo_classes``)."""

    output_tokens: PositiveInt = 256
    assumed_utilization: Fraction = 1.0
    min_utilization: Fraction = 0.1
    scrape_metrics: bool | None = None
    slo_class: str = "interactive"


class FleetSpec(StrictModel):
    """The validated content of a fleet file."""

    apiVersion: Literal["pointsman/v1"]
    kind: Literal["Fleet"]
    metadata: Metadata = Metadata()
    defaults: FleetDefaults = FleetDefaults()
    targets: dict[TargetName, Target] = Field(min_length=1)
    slo_classes: dict[Annotated[str, StringConstraints(min_length=1, max_length=64)], SLOClass] = {}
    replay: FleetReplay | None = None


@dataclass(frozen=True)
class EndpointInfo:
    """One endpoint of the fleet: ``id`` (its URL on-prem; the target name for a frontier API),
    ``url`` to call, ``name`` (may be None), ``target``, ``role`` (``aggregated``, ``prefill``,
    ``decode`` or ``api``), and for on-prem its ``pool`` (None for a frontier API)."""

    id: str
    url: str
    name: str | None
    target: str
    role: str
    pool: Pool | None = None
    metrics_url: str | None = None
    kv_events: EndpointEvents | None = None


def _endpoints(targets: dict[str, OnPremTarget | FrontierTarget]) -> dict[str, EndpointInfo]:
    out: dict[str, EndpointInfo] = {}
    for name, target in targets.items():
        if isinstance(target, FrontierTarget):
            out[name] = EndpointInfo(name, target.base_url, name, name, "api")
            continue
        for role, pool in target.pools_by_role().items():
            for e in pool.endpoints:
                out.setdefault(e.url, EndpointInfo(e.url, e.url, e.name, name, role, pool, e.metrics_url, e.kv_events))
    return out


@dataclass(frozen=True)
class Fleet:
    """A validated fleet: ``targets`` by name (file order), ``file``, ``revision`` (sha256 of the
    file, 16 hex), ``endpoints`` by endpoint id (see the module docstring), ``aliases``
    (endpoint name -> id)."""

    spec: FleetSpec
    file: str
    revision: str
    targets: dict[str, OnPremTarget | FrontierTarget] = field(default_factory=dict)
    endpoints: dict[str, EndpointInfo] = field(default_factory=dict)
    aliases: dict[str, str] = field(default_factory=dict)
    pools: dict[tuple[str, str], tuple[EndpointInfo, ...]] = field(default_factory=dict, repr=False)
    positions: dict[tuple[str, str], dict[str, int]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if not self.pools and self.targets:
            pools: dict[tuple[str, str], tuple[EndpointInfo, ...]] = {}
            for name, t in self.targets.items():
                if isinstance(t, FrontierTarget):
                    pools[(name, "api")] = (self.endpoints[name],)
                    continue
                for role, pool in t.pools_by_role().items():
                    pools[(name, role)] = tuple(self.endpoints[e.url] for e in pool.endpoints)
            object.__setattr__(self, "pools", pools)
            object.__setattr__(self, "positions", {k: {e.id: i for i, e in enumerate(v)} for k, v in pools.items()})

    def endpoint_id(self, endpoint: str) -> str | None:
        """The id of an endpoint named by its id, URL or ``name``; None if the fleet has no such endpoint."""
        if endpoint in self.endpoints:
            return endpoint
        return self.aliases.get(endpoint)

    def pool_endpoints(self, target: str, role: str) -> tuple[EndpointInfo, ...]:
        """Endpoints of ``target``'s pool ``role`` in file order (``api``: the frontier endpoint);
        empty if the target has no such pool (precomputed; ``positions[(target, role)]`` maps
        endpoint ids to their index). Raises KeyError for an unknown target."""
        if target not in self.targets:
            raise KeyError(target)
        return self.pools.get((target, role), ())

    @property
    def slo_classes(self) -> dict[str, SLOClass]:
        """The fleet's service classes by name (``DEFAULT_SLO_CLASSES`` when the file has none)."""
        return self.spec.slo_classes or DEFAULT_SLO_CLASSES

    def slo(self, slo_class: str | None = None) -> SLOClass:
        """The objectives of ``slo_class`` (None: ``defaults.slo_class``); KeyError if unknown."""
        return self.slo_classes[slo_class or self.spec.defaults.slo_class]

    @cached_property
    def lora_adapters(self) -> frozenset[str]:
        """Every LoRA adapter some target serves (the union of the on-prem targets' ``lora_adapters``): a request whose
        ``model`` is one of them is eligible only for the targets serving it (``serves``, the ``capabilities`` filter)."""
        return frozenset().union(*(t.lora_adapters for t in self.targets.values() if isinstance(t, OnPremTarget)))

    def serves(self, target: str, model: str | None) -> bool:
        """Whether ``target`` can answer a request for ``model``: False only when ``model`` names a LoRA adapter some
        target serves (``lora_adapters``) and ``target`` does not (its ``model`` would answer without the adapter); any
        other ``model`` is the router's to map. Raises KeyError for an unknown target."""
        return not model or model not in self.lora_adapters or self.lora_adapter(target, model) is not None

    def lora_adapter(self, target: str, model: str | None) -> str | None:
        """The LoRA adapter a request asking for ``model`` runs on ``target``: ``model`` when it is one of the target's
        ``lora_adapters`` (vLLM's OpenAI server selects an adapter by the request's ``model``, before the base model's
        names), else None (the base model). Raises KeyError for an unknown target."""
        t = self.targets[target]
        return model if model and isinstance(t, OnPremTarget) and model in t.lora_adapters else None

    def served_model(self, target: str, model: str | None) -> str:
        """The ``model`` a request asking for ``model`` is forwarded with to ``target``: its LoRA adapter there
        (``lora_adapter``), else the target's ``model``. Raises KeyError for an unknown target."""
        return self.lora_adapter(target, model) or self.targets[target].model

    def output_tokens(self, target: str, max_output_tokens: int | None) -> int:
        """Output tokens assumed for cost: the request's cap, else the target's default, else the fleet's."""
        if max_output_tokens:
            return max_output_tokens
        return self.targets[target].default_output_tokens or self.spec.defaults.output_tokens


#: Per target kind, the replay keys that moved (accepted only to say so, ``moved-key``) and where each lives now.
_MOVED_REPLAY_KEYS = {
    "frontier": [("prompt_cache_ttl_s", "targets.{name}.prompt_cache_ttl_s (the service's cost estimate uses the "
                                        "prompt-cache lifetime too, not only replay)")],
    "onprem": [("max_num_batched_tokens", "each pool: targets.{name}.pools.<role>.max_num_batched_tokens (the engine's "
                                          "stall check reads it too, and P/D pools may differ)"),
               ("max_batch_size", "each pool's max_num_seqs: targets.{name}.pools.<role>.max_num_seqs (vLLM's "
                                  "--max-num-seqs, 256 unless set; the router's bounded-load floor reads it too)")],
}


def _semantic_problems(spec: FleetSpec, doc: LocatedDocument) -> list[Problem]:
    problems = []
    classes = spec.slo_classes or DEFAULT_SLO_CLASSES
    if spec.defaults.slo_class not in classes:
        line, col = doc.mark(("defaults", "slo_class"))
        problems.append(Problem(doc.file, line, col, "unknown-slo-class",
                                f"defaults.slo_class '{spec.defaults.slo_class}' is not a class of slo_classes "
                                f"({', '.join(classes)}){did_you_mean(spec.defaults.slo_class, list(classes))}"))
    spill = spec.replay.spill_target if spec.replay is not None else None
    if spill is not None and not isinstance(spec.targets.get(spill), FrontierTarget):
        line, col = doc.mark(("replay", "spill_target"))
        frontier = [n for n, t in spec.targets.items() if isinstance(t, FrontierTarget)]
        problems.append(Problem(doc.file, line, col, "unknown-target",
                                f"replay.spill_target '{spill}' is not a frontier target of this fleet "
                                f"(frontier targets: {', '.join(frontier) or 'none'}){did_you_mean(spill, frontier)}"))
    problems.extend(_quality_column_problems(spec, doc))
    urls: dict[str, tuple[str, str]] = {}
    names: dict[str, str] = {}
    for name, target in spec.targets.items():
        if isinstance(target, OnPremTarget) and target.default_mode is not None and target.default_mode not in target.modes:
            line, col = doc.mark(("targets", name, "default_mode"))
            problems.append(Problem(doc.file, line, col, "unsupported-mode",
                                    f"target '{name}' has no pools for mode '{target.default_mode}' "
                                    f"(it supports {', '.join(target.modes)})"))
        if isinstance(target, OnPremTarget) and target.shared_kv is not None and target.kv_bytes_per_token is None:
            line, col = doc.mark(("targets", name, "shared_kv"), key=True)
            problems.append(Problem(doc.file, line, col, "missing-key",
                                    f"target '{name}' has a shared_kv tier but no kv_bytes_per_token "
                                    "(needed for the restore time)"))
        for key, where in _MOVED_REPLAY_KEYS[target.kind]:
            if target.replay is not None and getattr(target.replay, key) is not None:
                line, col = doc.mark(("targets", name, "replay", key), key=True)
                problems.append(Problem(doc.file, line, col, "moved-key",
                                        f"targets.{name}.replay.{key} moved to {where.format(name=name)}"))
        if not isinstance(target, OnPremTarget):
            continue
        if target.capabilities.images and target.image_tokens is None:
            line, col = doc.mark(("targets", name, "capabilities"), key=True)
            problems.append(Problem(doc.file, line, col, "missing-key",
                                    f"target '{name}' takes images but states no image_tokens: the most prompt tokens "
                                    "one image takes on its model (e.g. Qwen2.5-VL: max_pixels / 784; LLaVA-1.5: 576), "
                                    "{high: N, low: M}; policy/media_tokens.py"))
        problems.extend(_event_problems(name, target, doc))
        for role, pool in target.pools_by_role().items():
            for i, e in enumerate(pool.endpoints):
                path = ("targets", name, "pools", role, "endpoints", i)
                if e.url in urls:
                    line, col = doc.mark(path)
                    problems.append(Problem(doc.file, line, col, "duplicate-endpoint",
                                            f"endpoint {e.url} is already in {urls[e.url][0]} pool {urls[e.url][1]}"))
                urls.setdefault(e.url, (name, role))
                if e.name is not None:
                    if e.name in names and names[e.name] != e.url:
                        line, col = doc.mark((*path, "name"))
                        problems.append(Problem(doc.file, line, col, "duplicate-endpoint",
                                                f"endpoint name '{e.name}' is already used by {names[e.name]}"))
                    names.setdefault(e.name, e.url)
    return problems


def _event_problems(name: str, target: OnPremTarget, doc: LocatedDocument) -> list[Problem]:
    """A target's KV-event settings: its tokenizer files exist (relative to the fleet file), and
    endpoints with event sockets belong to a target that says how its engines hash."""
    problems = []
    base = Path(doc.file).parent
    events = target.kv_events
    if events is not None:
        for key in ("tokenizer", "tokenizer_config", "chat_template"):
            value = getattr(events, key)
            if value is not None and not (base / value).is_file():
                line, col = doc.mark(("targets", name, "kv_events", key))
                problems.append(Problem(doc.file, line, col, "file-not-found",
                                        f"targets.{name}.kv_events.{key}: no file {value!r} (relative to {base})"))
    for role, pool in target.pools_by_role().items():
        for i, e in enumerate(pool.endpoints):
            if e.kv_events is not None and events is None:
                line, col = doc.mark(("targets", name, "pools", role, "endpoints", i, "kv_events"), key=True)
                problems.append(Problem(doc.file, line, col, "missing-key",
                                        f"endpoint {e.url} publishes KV events but target '{name}' has no "
                                        "kv_events section (its tokenizer and hash settings)"))
    return problems


def _quality_column_problems(spec: FleetSpec, doc: LocatedDocument) -> list[Problem]:
    """``unknown-source`` for a ``replay.quality_columns`` key that names no outcome source
    (``datasets.sources.SOURCES``), located at the key, with did-you-mean."""
    from pointsman.datasets.sources import SOURCES

    problems = []
    for name, target in spec.targets.items():
        columns = target.replay.quality_columns if target.replay is not None else None
        for source in columns or {}:
            if source not in SOURCES:
                line, col = doc.mark(("targets", name, "replay", "quality_columns", source), key=True)
                problems.append(Problem(doc.file, line, col, "unknown-source",
                                        f"targets.{name}.replay.quality_columns: unknown outcome source '{source}' "
                                        f"(known: {', '.join(SOURCES)}){did_you_mean(source, list(SOURCES))}"))
    return problems


def parse_fleet(text: str, file: str = "<fleet>") -> Fleet:
    """Validate fleet YAML text; raises ``FleetError`` listing every problem as file:line:col."""
    doc = parse_yaml(text, file, FleetError)
    spec = validate(doc, FleetSpec, FleetError)
    assert isinstance(spec, FleetSpec)
    problems = _semantic_problems(spec, doc)
    if problems:
        raise FleetError(problems)
    revision = hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]
    targets = dict(spec.targets)
    endpoints = _endpoints(targets)
    aliases = {e.name: e.id for e in endpoints.values() if e.name and e.role != "api" and e.name not in endpoints}
    return Fleet(spec=spec, file=file, revision=revision, targets=targets, endpoints=endpoints, aliases=aliases)


def load_fleet(path: str | Path = DEFAULT_FLEET_PATH) -> Fleet:
    """Read and validate a fleet file (default: the packaged one); raises ``FleetError``."""
    return parse_fleet(read_text(path, FleetError), str(path))
