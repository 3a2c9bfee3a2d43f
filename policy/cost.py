"""Estimated cost of one request on one target, in USD, and the effective price per token.

Frontier (list prices, per 1M tokens)::

    usd = (uncached_prompt_tokens * p_in + cached_prompt_tokens * p_cached_in + output_tokens * p_out) / 1e6

``cached_prompt_tokens`` is the expected cached prefix (the provider's prompt cache,
tracked by the prefix index); providers cache only prompts of at least
``prompt_cache_min_tokens`` (OpenAI: 1,024), so below that nothing is cached. A target with
explicit caching (``prompt_cache: explicit``, Anthropic) caches only a request that marks
``cache_control``: unmarked, nothing is credited; marked, the uncached part of a long enough
prompt is priced as a cache write (``usd_per_1m_cache_write_input_tokens``, else 1.25 x input),
which errs high for the part after the last breakpoint.

On-prem (GPU-seconds of each phase at the pool's full-load throughput, spread over
the pool's current utilization, plus power for the busy GPU-seconds)::

    prefill_gpu_s = uncached_prompt_tokens / prefill_tokens_per_s * gpus_per_replica   (prefill pool)
    decode_gpu_s  = output_tokens / decode_tokens_per_s * gpus_per_replica             (decode pool)
    usd = prefill_gpu_s * (usd_per_gpu_hour / u_prefill + power_kw_per_gpu * usd_per_kwh) / 3600
        + decode_gpu_s  * (usd_per_gpu_hour / u_decode  + power_kw_per_gpu * usd_per_kwh) / 3600

In aggregated mode both phases use the aggregated pool; disaggregated, prefill runs
on the prefill pool and decode on the decode pool (the KV transfer between them is
not priced). Utilization ``u`` (0-1] is the share of GPU time doing useful work: the
GPU-hour is paid whether busy or idle, so at half utilization each token carries
twice the rental (the effective price per token). Power is drawn by busy GPUs, so
it is not spread. The engine feeds the pool's measured ``prefill_utilization`` /
``decode_utilization`` (telemetry), else the fleet's ``assumed_utilization``, floored
at ``min_utilization``. Cached prompt tokens skip prefill on-prem.

Images, audio and files: ``prompt_tokens`` is the request's count with ``features.IMAGE_TOKENS`` (765) per image
and nothing for audio and files; the estimate counts them by the target's rules instead, at the size read from their
inline bytes (``target_prompt_tokens``, ``policy/media_tokens.py``: a 512-px image 8,500 tokens on gpt-4o-mini, one
of unknown size up to 48,169; audio 10 tokens a second on OpenAI; a PDF page 3,000 + an image). The context-window
filter compares the same count, from the safe-side bound; on-prem, the predicted prefill, the P/D thresholds, the
picker and the dispatch record (the prefill queued on the endpoint) count it too (``LiveSignals.target_prompt_tokens``),
and so does the decision's ``prompt_tokens``. A structured output schema (``response_format``) counts on frontier
targets only (``schema_tokens``: OpenAI bills it as input; vLLM constrains decoding with it, outside the prompt).

Reported usage (``usage_cost``) adds prompt-cache writes at their own prices (5-minute and
1-hour lifetimes, ``FrontierPrices``); on-prem a write is ordinary prefill.

``effective_prices(ledger, fleet, window)``: per target, everything settled ÷ tokens
produced over the window, from the budget ledger's settled outcomes.
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pointsman.estimator.billed_tokens import billed_tokens
from pointsman.estimator.features import IMAGE_TOKENS, IMAGE_TOKENS_UPPER, count_tokens_upper
from pointsman.policy.budget.ledger import BudgetLedger, EffectivePrice
from pointsman.policy.fleet import Fleet, FrontierTarget, OnPremTarget, Pool, target_image_rule
from pointsman.policy.media_tokens import SMALLEST, media_tokens

if TYPE_CHECKING:  # pragma: no cover
    from pointsman.request import RequestView


@dataclass(frozen=True)
class CostEstimate:
    """One candidate's estimated cost: ``usd`` and its basis (tokens; GPU-seconds and the
    utilizations used on-prem, else 0 and 1)."""

    target: str
    mode: str
    usd: float
    prompt_tokens: int
    cached_prompt_tokens: int
    output_tokens: int
    prefill_gpu_s: float = 0.0
    decode_gpu_s: float = 0.0
    prefill_utilization: float = 1.0
    decode_utilization: float = 1.0

    def to_dict(self) -> dict[str, object]:
        """JSON-ready dict of every field."""
        return {
            "target": self.target, "mode": self.mode, "estimated_cost_usd": self.usd,
            "prompt_tokens": self.prompt_tokens, "cached_prompt_tokens": self.cached_prompt_tokens,
            "output_tokens": self.output_tokens, "prefill_gpu_s": self.prefill_gpu_s,
            "decode_gpu_s": self.decode_gpu_s, "prefill_utilization": self.prefill_utilization,
            "decode_utilization": self.decode_utilization,
        }


def _check_utilization(name: str, value: float) -> float:
    if not 0.0 < value <= 1.0:
        raise ValueError(f"{name} must be in (0, 1], got {value}")
    return value


def estimate_cost(name: str, target: OnPremTarget | FrontierTarget, mode: str, prompt_tokens: int,
                  output_tokens: int, cached_prompt_tokens: int = 0, utilization: float = 1.0, *,
                  prefill_utilization: float | None = None, decode_utilization: float | None = None,
                  pools: tuple[Pool, Pool] | None = None, cache_control: bool = False,
                  cache_write_1h: bool = False) -> CostEstimate:
    """Cost in USD of ``prompt_tokens`` in and ``output_tokens`` out on ``target`` in ``mode``
    (formulas in the module docstring). ``utilization`` applies to both phases unless
    ``prefill_utilization`` / ``decode_utilization`` are given; ``pools`` (prefill pool,
    decode pool) overrides the mode's pools (an aggregated request prefilled locally on a
    decode endpoint runs both phases on the decode pool). ``cache_control``: the request marks a
    prompt-cache breakpoint (read by a frontier target with ``prompt_cache: explicit`` only);
    ``cache_write_1h``: a breakpoint asks the 1-hour lifetime, whose write price applies. Raises
    ``KeyError`` if the target lacks the mode's pools and ``ValueError`` for a utilization outside (0, 1]."""
    cached = max(0, min(cached_prompt_tokens, prompt_tokens))
    if isinstance(target, FrontierTarget):
        p = target.prices
        p_uncached = p.usd_per_1m_input_tokens
        if prompt_tokens < target.prompt_cache_min_tokens or (target.prompt_cache == "explicit" and not cache_control):
            cached = 0
        elif target.prompt_cache == "explicit":  # the marked prompt's uncached part is written to the cache
            p_write, multiplier = ((p.usd_per_1m_cache_write_1h_input_tokens, CACHE_WRITE_1H_MULTIPLIER) if cache_write_1h
                                   else (p.usd_per_1m_cache_write_input_tokens, CACHE_WRITE_MULTIPLIER))
            p_uncached = multiplier * p_uncached if p_write is None else p_write
        usd = ((prompt_tokens - cached) * p_uncached + cached * p.usd_per_1m_cached_input_tokens
               + output_tokens * p.usd_per_1m_output_tokens) / 1e6
        return CostEstimate(name, mode, usd, prompt_tokens, cached, output_tokens)
    u_p = _check_utilization("utilization", utilization if prefill_utilization is None else prefill_utilization)
    u_d = _check_utilization("utilization", utilization if decode_utilization is None else decode_utilization)
    prefill_pool, decode_pool = pools or target.pool_pair(mode)
    prefill_gpu_s = (prompt_tokens - cached) / prefill_pool.prefill_tokens_per_s * prefill_pool.gpus_per_replica
    decode_gpu_s = output_tokens / decode_pool.decode_tokens_per_s * decode_pool.gpus_per_replica
    rent, power = target.usd_per_gpu_hour, target.power_kw_per_gpu * target.usd_per_kwh
    usd = (prefill_gpu_s * (rent / u_p + power) + decode_gpu_s * (rent / u_d + power)) / 3600.0
    return CostEstimate(name, mode, usd, prompt_tokens, cached, output_tokens, prefill_gpu_s, decode_gpu_s, u_p, u_d)


def target_prompt_tokens(target: OnPremTarget | FrontierTarget, request: Mapping[str, Any],
                         view: RequestView | None = None, *, window: bool = False) -> int:
    """Prompt tokens of a request on ``target``, from its ``request`` namespace (``namespaces.request_signals``) and,
    for a request with images, audio or files, its ``view`` (``RequestView.media``: their sizes; None, as in policy
    cases: images of unknown size, audio and files not counted): ``prompt_tokens`` (the cost) with its images counted
    by the target's rule (``fleet.target_image_rule``, at their read size and detail; an image of unread size, given
    by URL, at the most the rule bills) instead of ``IMAGE_TOKENS`` (``IMAGE_TOKENS_UPPER``) each, and its audio
    and files added
    (``media_tokens.media_tokens``). A count the gateway supplied (``prompt_tokens_exact``) is taken for text alone
    and the media added to it (errs high by what it counted for them). When an audio or file part's size is not
    known, at least the target's window less the output it must hold (its cap, else 1 token), the most a provider
    bills for a prompt it accepts. A text-only request reads nothing more. Never below 0.

    ``window``: the count the context-window filter checks, which refuses a target only for what the request surely
    needs there: the text at its safe-side bound ``prompt_tokens_upper`` (a batch's ``longest_prompt_tokens_upper``),
    and an image of unread size (a PDF's page: its image, its text not counted) at the least its rule bills
    (``media_tokens.SMALLEST``): three image URLs may bill 3 x 48,169 tokens on gpt-4o-mini, over its 128,000-token
    window, or 3 x 8,500; the request goes there and the cost (the budget hold) counts the most.

    A structured output schema (``RouteRequest.response_format``, read from the ``view``; policy cases have none):
    a frontier target's provider puts it in the model's input and bills it as input, so its count and window count
    add ``schema_tokens``, and a supplied count is taken as the prompt's alone (errs high by the schema if the
    gateway counted it); vLLM enforces it by constrained decoding, outside the prompt: on-prem nothing is added."""
    count: int = (request.get("longest_prompt_tokens_upper") or max(  # a case may set only the count
        request["prompt_tokens"], request.get("prompt_tokens_upper", 0))) if window else request["prompt_tokens"]
    if isinstance(target, FrontierTarget) and view is not None:
        count += schema_tokens(view)
    images: int = request.get("images", 0)
    if not images and not request.get("has_audio") and not request.get("has_files"):
        return count
    rule = target_image_rule(target)
    counted = (IMAGE_TOKENS_UPPER if window else IMAGE_TOKENS) * images  # what the count gave the images
    unread = SMALLEST if window else None
    text = count if request.get("prompt_tokens_exact") else max(0, count - counted)
    if view is None:
        low = int(request.get("images_low_detail", 0))
        return text + (images - low) * rule(unread, None) + low * rule(unread, "low")
    tokens, unknown = media_tokens(rule, target.provider if isinstance(target, FrontierTarget) else None, view.media,
                                   unread)
    if not unknown:
        return text + tokens
    reserved = int(request["max_output_tokens"]) if request.get("max_output_tokens_set") else 1
    return max(text + tokens, target.context_window_tokens - reserved)


_SCHEMA_TOKENS: weakref.WeakKeyDictionary[RequestView, int] = weakref.WeakKeyDictionary()


def schema_tokens(view: RequestView) -> int:
    """Tokens of the request's structured output schema on a frontier target: its ``response_format`` (any JSON
    object; anything else, malformed or absent, 0) as compact JSON, counted on the safe side as the prompt's text is
    priced (``billed_tokens`` over ``count_tokens_upper``, tokenizer-free: O(its bytes), ~2 ms for 180 KB),
    once per view (memoized: every frontier target's cost and window read it). Never below 0."""
    out = _SCHEMA_TOKENS.get(view)
    if out is None:
        fmt = view.request.response_format
        text = json.dumps(fmt, separators=(",", ":"), ensure_ascii=False) if isinstance(fmt, dict) else ""
        out = _SCHEMA_TOKENS[view] = billed_tokens(text, count_tokens_upper(text, None)) if text else 0
    return out


#: Price of a prompt-cache write per input token's price when the fleet declares none: Anthropic's
#: published multipliers (docs.anthropic.com "Pricing", prompt caching; Bedrock's are the same),
#: 1.25x for the default 5-minute lifetime and 2x for 1 hour. Only Anthropic-shaped usage reports
#: writes, and no provider charges more, so an undeclared write price errs high, never books 0.
CACHE_WRITE_MULTIPLIER = 1.25
CACHE_WRITE_1H_MULTIPLIER = 2.0


def usage_cost(name: str, target: OnPremTarget | FrontierTarget, mode: str, *, prompt_tokens: int,
               completion_tokens: int, cached_tokens: int = 0, cache_write_tokens: int = 0,
               cache_write_1h_tokens: int = 0, prefill_utilization: float | None = None,
               decode_utilization: float | None = None, pools: tuple[Pool, Pool] | None = None) -> CostEstimate:
    """The actual cost in USD of reported usage (``pointsman.usage_shapes.UsageCounts``' counts:
    ``cached_tokens`` and the cache writes are parts of ``prompt_tokens``). Frontier::

        usd = (uncached * p_in + cached * p_cached_in + writes_5m * p_write + writes_1h * p_write_1h
               + completion * p_out) / 1e6,   uncached = prompt - cached - writes_5m - writes_1h

    (reported cache reads are priced whatever ``prompt_cache_min_tokens`` says: the provider
    billed them; a write price the target does not declare is ``CACHE_WRITE_MULTIPLIER`` (1.25) or
    ``CACHE_WRITE_1H_MULTIPLIER`` (2) x ``p_in``, Anthropic's published ones). On-prem: ``estimate_cost``
    (cache reads skip prefill; writes are prefill; ``pools``: the pools it ran on, as there). Raises
    ``ValueError`` when the parts exceed ``prompt_tokens``."""
    writes = cache_write_tokens + cache_write_1h_tokens
    if cached_tokens + writes > prompt_tokens:
        raise ValueError(f"cached ({cached_tokens}) + cache writes ({writes}) exceed prompt_tokens ({prompt_tokens})")
    if not isinstance(target, FrontierTarget):
        return estimate_cost(name, target, mode, prompt_tokens, completion_tokens, cached_tokens,
                             prefill_utilization=prefill_utilization, decode_utilization=decode_utilization,
                             pools=pools)
    p = target.prices
    p_write = p.usd_per_1m_cache_write_input_tokens
    p_write_1h = p.usd_per_1m_cache_write_1h_input_tokens
    usd = ((prompt_tokens - cached_tokens - writes) * p.usd_per_1m_input_tokens
           + cached_tokens * p.usd_per_1m_cached_input_tokens
           + cache_write_tokens * (CACHE_WRITE_MULTIPLIER * p.usd_per_1m_input_tokens if p_write is None else p_write)
           + cache_write_1h_tokens * (CACHE_WRITE_1H_MULTIPLIER * p.usd_per_1m_input_tokens
                                      if p_write_1h is None else p_write_1h)
           + completion_tokens * p.usd_per_1m_output_tokens) / 1e6
    return CostEstimate(name, mode, usd, prompt_tokens, cached_tokens, completion_tokens)


def pool_utilization(measured: float | None, fleet: Fleet) -> float:
    """The utilization to price a pool at: the measured fraction floored at the fleet's
    ``min_utilization``, else the fleet's ``assumed_utilization``."""
    d = fleet.spec.defaults
    if measured is None:
        return d.assumed_utilization
    return min(1.0, max(d.min_utilization, measured))


@dataclass(frozen=True)
class TargetPrice(EffectivePrice):
    """A target's effective price per token over one window (``budget.ledger.EffectivePrice``: from
    settled outcomes, ``usd_per_token`` = spent ÷ completion tokens, ``usd_per_total_token``
    = spent ÷ (prompt + completion) tokens, None without tokens) beside
    ``list_usd_per_output_token``: the list/benchmark price of one output token for
    comparison (frontier: list price; on-prem: decode GPU-seconds at full load × $/GPU-hour
    + power)."""

    list_usd_per_output_token: float

    def to_dict(self) -> dict[str, object]:
        """JSON-ready dict of every field and both per-token prices."""
        return {**vars(self), "usd_per_token": self.usd_per_token, "usd_per_total_token": self.usd_per_total_token}


def list_price_per_output_token(target: OnPremTarget | FrontierTarget) -> float:
    """USD of one output token at list price (frontier) or at full-load decode throughput (on-prem)."""
    if isinstance(target, FrontierTarget):
        return target.prices.usd_per_1m_output_tokens / 1e6
    pool = target.pools.aggregated or target.pools.decode
    assert pool is not None
    gpu_s = pool.gpus_per_replica / pool.decode_tokens_per_s
    return gpu_s * (target.usd_per_gpu_hour + target.power_kw_per_gpu * target.usd_per_kwh) / 3600.0


def effective_prices(ledger: BudgetLedger, fleet: Fleet, window: str = "day", now: float | None = None) -> dict[str, TargetPrice]:
    """Per target (file order), the effective price per token over the ``day``/``month`` UTC
    window containing ``now`` (Unix s; None = now), from ``ledger.effective_price_per_token``.
    Raises ``BudgetError`` for an unknown window, ``LedgerUnavailable`` if the backend fails."""
    out = {}
    for name, target in fleet.targets.items():
        p = ledger.effective_price_per_token(name, window, now)
        out[name] = TargetPrice(**vars(p), list_usd_per_output_token=list_price_per_output_token(target))
    return out
