"""The fleet: every target a request can go to, with its pools, endpoints and prices.

A fleet file is YAML (``apiVersion: pointsman/v1``, ``kind: Fleet``); see
``policy/defaults/fleet.yaml`` for a documented example. Two kinds of target:

- ``onprem``: one open model served by our own GPUs, in an ``aggregated`` pool
  and/or a ``prefill`` + ``decode`` pool pair (prefill/decode disaggregation).
  Priced by GPU-hours and power; each pool states per-replica prefill and decode
  throughput in tokens/s (see ``policy/cost.py`` for how cost follows).
- ``frontier``: a paid API tier, priced per 1M input, cached input and output tokens.

``load_fleet(path) -> Fleet`` validates the file and raises ``FleetError`` listing
every problem as ``file:line:col: code: message``.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import AfterValidator, Field, StringConstraints, field_validator, model_validator

from pointsman.errors import FleetError, Problem
from pointsman.policy.located import LocatedDocument, StrictModel, parse_yaml, read_text, validate

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
PositiveFloat = Annotated[float, Field(gt=0)]
NonNegativeFloat = Annotated[float, Field(ge=0)]


class Endpoint(StrictModel):
    """One replica (or an API base URL): ``url`` (http/https), optional ``name``."""

    url: Url
    name: str | None = None


class Capabilities(StrictModel):
    """What requests a target can serve: tool calls, image inputs."""

    tools: bool = True
    images: bool = False


class Pool(StrictModel):
    """A group of identical replicas of one model.

    ``prefill_tokens_per_s`` / ``decode_tokens_per_s``: one replica's throughput
    under full batching (prompt tokens processed per second; output tokens generated
    per second, summed over all concurrent requests). ``gpus_per_replica``: GPUs one
    replica occupies (tensor-parallel degree). ``kv_cache_capacity_tokens``: tokens of
    KV cache one replica holds (optional; the prefix index bounds itself by it).
    """

    gpus_per_replica: PositiveInt
    prefill_tokens_per_s: PositiveFloat
    decode_tokens_per_s: PositiveFloat
    kv_cache_capacity_tokens: PositiveInt | None = None
    endpoints: list[Endpoint] = Field(min_length=1)

    @field_validator("endpoints", mode="before")
    @classmethod
    def _urls_as_endpoints(cls, v: Any) -> Any:
        if isinstance(v, list):
            return [{"url": e} if isinstance(e, str) else e for e in v]
        return v


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


class OnPremTarget(StrictModel):
    """An open model on our own GPUs. Prices: ``usd_per_gpu_hour`` (rental or amortized
    purchase), plus power at ``power_kw_per_gpu`` × ``usd_per_kwh`` (0 when the hourly
    price already includes power)."""

    kind: Literal["onprem"]
    model: str = Field(min_length=1)
    description: str = ""
    context_window_tokens: PositiveInt
    capabilities: Capabilities = Capabilities()
    usd_per_gpu_hour: NonNegativeFloat
    power_kw_per_gpu: NonNegativeFloat = 0.0
    usd_per_kwh: NonNegativeFloat = 0.0
    default_output_tokens: PositiveInt | None = None
    default_mode: Mode | None = None
    pools: Pools

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
    """List prices in USD per 1M tokens: input, cached input (prompt-cache hits), output."""

    usd_per_1m_input_tokens: NonNegativeFloat
    usd_per_1m_cached_input_tokens: NonNegativeFloat
    usd_per_1m_output_tokens: NonNegativeFloat


class FrontierTarget(StrictModel):
    """A paid API tier: ``provider``, upstream ``model`` name, ``base_url``, list prices."""

    kind: Literal["frontier"]
    provider: str = Field(min_length=1)
    model: str = Field(min_length=1)
    base_url: Url
    description: str = ""
    context_window_tokens: PositiveInt
    capabilities: Capabilities = Capabilities(images=True)
    prices: FrontierPrices
    default_output_tokens: PositiveInt | None = None

    @property
    def modes(self) -> tuple[str, ...]:
        """A frontier API is one aggregated service from our point of view."""
        return ("aggregated",)


Target = Annotated[Union[OnPremTarget, FrontierTarget], Field(discriminator="kind")]


class Metadata(StrictModel):
    """Name, description and labels of a fleet or policy file."""

    name: str = ""
    description: str = ""
    labels: dict[str, str] = {}


class FleetDefaults(StrictModel):
    """Fleet-wide defaults. ``output_tokens``: output length assumed for cost when the
    request sets no ``max_tokens`` and the target has no ``default_output_tokens``."""

    output_tokens: PositiveInt = 256


class FleetSpec(StrictModel):
    """The validated content of a fleet file."""

    apiVersion: Literal["pointsman/v1"]
    kind: Literal["Fleet"]
    metadata: Metadata = Metadata()
    defaults: FleetDefaults = FleetDefaults()
    targets: dict[TargetName, Target] = Field(min_length=1)


@dataclass(frozen=True)
class Fleet:
    """A validated fleet: ``targets`` by name (file order), ``file``, ``revision`` (sha256 of the file, 16 hex)."""

    spec: FleetSpec
    file: str
    revision: str
    targets: dict[str, OnPremTarget | FrontierTarget] = field(default_factory=dict)

    def output_tokens(self, target: str, max_output_tokens: int | None) -> int:
        """Output tokens assumed for cost: the request's cap, else the target's default, else the fleet's."""
        if max_output_tokens:
            return max_output_tokens
        return self.targets[target].default_output_tokens or self.spec.defaults.output_tokens


def _semantic_problems(spec: FleetSpec, doc: LocatedDocument) -> list[Problem]:
    problems = []
    for name, target in spec.targets.items():
        if isinstance(target, OnPremTarget) and target.default_mode is not None and target.default_mode not in target.modes:
            line, col = doc.mark(("targets", name, "default_mode"))
            problems.append(Problem(doc.file, line, col, "unsupported-mode",
                                    f"target '{name}' has no pools for mode '{target.default_mode}' "
                                    f"(it supports {', '.join(target.modes)})"))
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
    return Fleet(spec=spec, file=file, revision=revision, targets=dict(spec.targets))


def load_fleet(path: str | Path = DEFAULT_FLEET_PATH) -> Fleet:
    """Read and validate a fleet file (default: the packaged one); raises ``FleetError``."""
    return parse_fleet(read_text(path, FleetError), str(path))
