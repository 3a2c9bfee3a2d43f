"""Token usage in the shapes of the providers a gateway talks to, read into one priced form.

A gateway forwards the ``usage`` object of the upstream response as it is; ``read_usage(raw)``
recognises its shape by its keys and returns ``UsageCounts``: every prompt token
(``prompt_tokens``, cache reads and writes included), the cache reads (``cached_tokens``), the
cache writes by time-to-live (``cache_write_tokens``: 5 minutes, the providers' default;
``cache_write_1h_tokens``), and every output token (``completion_tokens``, reasoning included).

=====================  =================================================================================
shape                  keys (``usage.…``) and how they are read
=====================  =================================================================================
``pointsman``/OpenAI   ``prompt_tokens`` (all, cached included), ``completion_tokens`` (reasoning
Chat Completions,      included), ``total_tokens`` (= their sum), ``cached_tokens`` or
vLLM, SGLang,          ``prompt_tokens_details.cached_tokens`` (reads), ``cache_write_tokens``,
DeepSeek               ``cache_write_1h_tokens`` (Pointsman's), ``completion_tokens_details.*``,
                       SGLang's ``reasoning_tokens``; DeepSeek's ``prompt_cache_hit_tokens`` (reads) +
                       ``prompt_cache_miss_tokens`` (= ``prompt_tokens``)
OpenAI Responses       ``input_tokens`` (all), ``input_tokens_details.cached_tokens``, ``output_tokens``,
                       ``output_tokens_details.reasoning_tokens``, ``total_tokens``
Anthropic Messages     ``input_tokens`` (uncached only), ``cache_read_input_tokens``,
                       ``cache_creation_input_tokens`` split by ``cache_creation.ephemeral_5m_input_tokens``
                       / ``ephemeral_1h_input_tokens`` (without the split: 5 minutes), ``output_tokens``,
                       ``server_tool_use``, ``service_tier``
Google Gemini          ``usageMetadata``: ``promptTokenCount`` (cached included) +
                       ``toolUsePromptTokenCount``, ``cachedContentTokenCount``, ``candidatesTokenCount``
                       + ``thoughtsTokenCount`` (billed as output), ``totalTokenCount``,
                       ``*TokensDetails`` ``[{modality, tokenCount}]``; zero counts may be omitted (proto3):
                       an absent output count is ``totalTokenCount`` minus the rest, missing without a total
AWS Bedrock Converse   ``inputTokens`` (uncached only), ``cacheReadInputTokens``,
                       ``cacheWriteInputTokens`` split by ``cacheDetails[{ttl: 5m|1h, inputTokens}]``,
                       ``outputTokens``, ``totalTokens`` (= the four)
LiteLLM (a LiteLLM     Chat Completions keys (``prompt_tokens`` includes reads and writes) with Anthropic's
Proxy upstream)        ``cache_read_input_tokens``, ``cache_creation_input_tokens`` beside them, the split
                       in ``prompt_tokens_details.cache_creation_token_details``
=====================  =================================================================================

What cannot be priced from per-token list prices is a problem, never a silent 0: an unknown key,
keys of two shapes mixed, a count that is not an integer in [0, ``MAX_TOKENS``], counts that
contradict each other (a total, a split, reasoning tokens beyond the output count that includes
them), audio tokens (priced apart from text), paid server tools (Anthropic's web search/fetch/tool
search requests), a pricing modifier (a non-standard
``service_tier``, ``inference_geo`` other than global, ``speed`` other than standard),
Anthropic's per-iteration usage. ``read_usage`` raises
``UsageProblems`` naming each field (``usage.cache_creation.ephemeral_1h_input_tokens``). A
missing prompt or output count is not raised here (stored rows may lack one) but listed in
``UsageCounts.missing`` for the caller to refuse.

Serving-safe ground module: standard library only. Used by ``pointsman/outcome.py`` (``Usage``,
``POST /v1/outcomes``), ``service/ext_proc_body.py`` (upstream responses) and priced by
``policy/cost.py`` (``usage_cost``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

#: Largest token count accepted in any field (100 million, far beyond any context window).
MAX_TOKENS = 100_000_000

Problem = tuple[str, str]


class UsageProblems(ValueError):
    """Usage Pointsman cannot price: ``problems`` is every ``(field, message)`` pair, fields named
    from ``usage`` (``usage.cache_creation_input_tokens``)."""

    def __init__(self, problems: list[Problem]) -> None:
        super().__init__("; ".join(f"{f}: {m}" for f, m in problems))
        self.problems = tuple(problems)


@dataclass(frozen=True)
class UsageCounts:
    """One call's token usage in the priced form (see the module). ``cached_tokens`` and the two
    cache-write counts are parts of ``prompt_tokens``; counts a shape did not report are None.
    ``sources`` maps each count to the field it was read from (``"cache_write_1h_tokens":
    "usage.cache_creation.ephemeral_1h_input_tokens"``); ``missing`` names the prompt or output
    counts the usage lacks."""

    shape: str
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int | None = None
    cache_write_tokens: int | None = None
    cache_write_1h_tokens: int | None = None
    sources: dict[str, str] = field(default_factory=dict)
    missing: tuple[str, ...] = ()

    def counts(self) -> dict[str, int | None]:
        """The five counts by name (the outcome schema's ``usage`` keys)."""
        return {"prompt_tokens": self.prompt_tokens, "cached_tokens": self.cached_tokens,
                "completion_tokens": self.completion_tokens, "cache_write_tokens": self.cache_write_tokens,
                "cache_write_1h_tokens": self.cache_write_1h_tokens}


class _Reader:
    """Reads counts out of one usage object, collecting problems."""

    def __init__(self, raw: Mapping[str, object]) -> None:
        self.raw = raw
        self.problems: list[Problem] = []

    def count(self, key: str, within: Mapping[str, object] | None = None, path: str = "") -> int | None:
        obj = self.raw if within is None else within
        v = obj.get(key)
        name = f"usage.{path}{key}"
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int):
            self.problems.append((name, "Input should be a valid integer"))
            return None
        if v < 0:
            self.problems.append((name, "Input should be greater than or equal to 0"))
            return None
        if v > MAX_TOKENS:
            self.problems.append((name, f"Input should be less than or equal to {MAX_TOKENS}"))
            return None
        return v

    def obj(self, key: str, allowed: frozenset[str]) -> Mapping[str, object] | None:
        v = self.raw.get(key)
        if v is None:
            return None
        if not isinstance(v, Mapping):
            self.problems.append((f"usage.{key}", "expected a JSON object"))
            return None
        for k, n in v.items():
            if k not in allowed and n not in (None, 0):  # a null or zero count costs nothing
                self.problems.append((f"usage.{key}.{k}", "unknown usage field: Pointsman cannot price it"))
        return v

    def unpriced(self, name: str, n: int | None, why: str) -> None:
        if n:
            self.problems.append((name, f"{n:,} {why}; Pointsman prices text tokens only"))

    def agree(self, name: str, got: int | None, want: int | None, what: str) -> None:
        if got is not None and want is not None and got != want:
            self.problems.append((name, f"{got:,} is not {what} ({want:,})"))

    def within(self, name: str, part: int | None, whole: int | None, what: str) -> None:
        """A part (reasoning tokens) must fit in the count that includes it."""
        if part is not None and whole is not None and part > whole:
            self.problems.append((name, f"{part:,} is more than {what} ({whole:,}), which includes them"))


def _sum(*counts: int | None) -> int | None:
    return None if any(c is None for c in counts) else sum(c for c in counts if c is not None)


_OPENAI = frozenset({"prompt_tokens", "completion_tokens", "total_tokens", "prompt_tokens_details",
                     "completion_tokens_details", "cached_tokens", "cache_write_tokens", "cache_write_1h_tokens",
                     "prompt_cache_hit_tokens", "prompt_cache_miss_tokens", "reasoning_tokens"})
_OPENAI_PROMPT_DETAILS = frozenset({"cached_tokens", "audio_tokens", "text_tokens", "image_tokens"})
_OPENAI_COMPLETION_DETAILS = frozenset({"reasoning_tokens", "audio_tokens", "accepted_prediction_tokens",
                                        "rejected_prediction_tokens", "text_tokens", "image_tokens"})
_RESPONSES = frozenset({"input_tokens", "output_tokens", "total_tokens", "input_tokens_details",
                        "output_tokens_details"})
_ANTHROPIC_EXTRAS = frozenset({"server_tool_use", "service_tier", "inference_geo", "speed", "iterations"})
_ANTHROPIC = frozenset({"input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens",
                        "cache_creation"}) | _ANTHROPIC_EXTRAS
#: LiteLLM's OpenAI-shaped usage of an Anthropic call (a LiteLLM Proxy upstream): ``prompt_tokens``
#: includes the cache reads and writes, Anthropic's cache keys beside them.
_LITELLM = _OPENAI | _ANTHROPIC_EXTRAS | {"cache_creation_input_tokens", "cache_read_input_tokens"}
_GEMINI = frozenset({"promptTokenCount", "candidatesTokenCount", "totalTokenCount", "cachedContentTokenCount",
                     "thoughtsTokenCount", "toolUsePromptTokenCount", "promptTokensDetails", "cacheTokensDetails",
                     "candidatesTokensDetails", "toolUsePromptTokensDetails", "trafficType"})
_BEDROCK = frozenset({"inputTokens", "outputTokens", "totalTokens", "cacheReadInputTokens",
                      "cacheWriteInputTokens", "cacheDetails"})


def _openai(r: _Reader) -> UsageCounts:
    prompt, completion = r.count("prompt_tokens"), r.count("completion_tokens")
    pd = r.obj("prompt_tokens_details", _OPENAI_PROMPT_DETAILS)
    cd = r.obj("completion_tokens_details", _OPENAI_COMPLETION_DETAILS)
    sources = {"prompt_tokens": "usage.prompt_tokens", "completion_tokens": "usage.completion_tokens"}
    reads: list[tuple[str, int]] = []
    for name, n in (("usage.cached_tokens", r.count("cached_tokens")),
                    ("usage.prompt_tokens_details.cached_tokens",
                     r.count("cached_tokens", pd, "prompt_tokens_details.") if pd else None),
                    ("usage.prompt_cache_hit_tokens", r.count("prompt_cache_hit_tokens"))):
        if n is not None:
            reads.append((name, n))
    cached = reads[0][1] if reads else None
    if reads:
        sources["cached_tokens"] = reads[0][0]
    for name, n in reads[1:]:
        r.agree(name, n, cached, f"{reads[0][0]}, the cache reads it repeats")
    miss = r.count("prompt_cache_miss_tokens")
    if miss is not None:
        r.agree("usage.prompt_cache_miss_tokens", _sum(miss, cached), prompt,
                "plus prompt_cache_hit_tokens: usage.prompt_tokens")
    if pd:
        r.unpriced("usage.prompt_tokens_details.audio_tokens",
                   r.count("audio_tokens", pd, "prompt_tokens_details."), "audio input tokens")
    if cd:
        r.unpriced("usage.completion_tokens_details.audio_tokens",
                   r.count("audio_tokens", cd, "completion_tokens_details."), "audio output tokens")
    r.within("usage.reasoning_tokens", r.count("reasoning_tokens"), completion, "usage.completion_tokens")
    if cd:
        r.within("usage.completion_tokens_details.reasoning_tokens",
                 r.count("reasoning_tokens", cd, "completion_tokens_details."), completion, "usage.completion_tokens")
    r.agree("usage.total_tokens", r.count("total_tokens"), _sum(prompt, completion),
            "usage.prompt_tokens + usage.completion_tokens")
    w5, w1h = r.count("cache_write_tokens"), r.count("cache_write_1h_tokens")
    sources.update(cache_write_tokens="usage.cache_write_tokens", cache_write_1h_tokens="usage.cache_write_1h_tokens")
    return UsageCounts("openai" if miss is None and "prompt_cache_hit_tokens" not in r.raw else "deepseek",
                       prompt, cached, completion, w5, w1h, sources,
                       _missing(prompt, completion, "usage.prompt_tokens", "usage.completion_tokens"))


def _responses(r: _Reader) -> UsageCounts:
    prompt, completion = r.count("input_tokens"), r.count("output_tokens")
    ind = r.obj("input_tokens_details", frozenset({"cached_tokens", "audio_tokens", "text_tokens", "image_tokens"}))
    outd = r.obj("output_tokens_details", frozenset({"reasoning_tokens", "audio_tokens", "text_tokens"}))
    cached = r.count("cached_tokens", ind, "input_tokens_details.") if ind else None
    if ind:
        r.unpriced("usage.input_tokens_details.audio_tokens", r.count("audio_tokens", ind, "input_tokens_details."),
                   "audio input tokens")
    if outd:
        r.within("usage.output_tokens_details.reasoning_tokens", r.count("reasoning_tokens", outd, "output_tokens_details."),
                 completion, "usage.output_tokens")
        r.unpriced("usage.output_tokens_details.audio_tokens", r.count("audio_tokens", outd, "output_tokens_details."),
                   "audio output tokens")
    r.agree("usage.total_tokens", r.count("total_tokens"), _sum(prompt, completion),
            "usage.input_tokens + usage.output_tokens")
    return UsageCounts("openai-responses", prompt, cached, completion, None, None,
                       {"prompt_tokens": "usage.input_tokens", "completion_tokens": "usage.output_tokens",
                        "cached_tokens": "usage.input_tokens_details.cached_tokens"},
                       _missing(prompt, completion, "usage.input_tokens", "usage.output_tokens"))


def _anthropic(r: _Reader) -> UsageCounts:
    uncached, completion = r.count("input_tokens"), r.count("output_tokens")
    reads, writes = r.count("cache_read_input_tokens"), r.count("cache_creation_input_tokens")
    split = r.obj("cache_creation", frozenset({"ephemeral_5m_input_tokens", "ephemeral_1h_input_tokens"}))
    w5, w1h = writes, None
    sources = {"prompt_tokens": "usage.input_tokens", "completion_tokens": "usage.output_tokens",
               "cached_tokens": "usage.cache_read_input_tokens", "cache_write_tokens": "usage.cache_creation_input_tokens"}
    if split is not None:
        w5 = r.count("ephemeral_5m_input_tokens", split, "cache_creation.")
        w1h = r.count("ephemeral_1h_input_tokens", split, "cache_creation.")
        sources.update(cache_write_tokens="usage.cache_creation.ephemeral_5m_input_tokens",
                       cache_write_1h_tokens="usage.cache_creation.ephemeral_1h_input_tokens")
        r.agree("usage.cache_creation_input_tokens", writes, (w5 or 0) + (w1h or 0),
                "the sum of usage.cache_creation.ephemeral_5m_input_tokens and ephemeral_1h_input_tokens")
        if writes is None and (w5 or w1h):
            writes = (w5 or 0) + (w1h or 0)
    _anthropic_extras(r)
    prompt = None if uncached is None else uncached + (reads or 0) + (writes or 0)
    return UsageCounts("anthropic", prompt, reads, completion, w5, w1h, sources,
                       _missing(uncached, completion, "usage.input_tokens", "usage.output_tokens"))


_SERVER_TOOLS = ("web_search_requests", "web_fetch_requests", "tool_search_requests")
#: Values of Anthropic's pricing modifiers that leave the list prices as they are.
_LIST_PRICED = {"service_tier": ("standard",), "inference_geo": ("global", "not_available"), "speed": ("standard",)}


def _anthropic_extras(r: _Reader) -> None:
    """Anthropic's keys beside the counts: paid server tools, pricing modifiers (a priority or batch
    tier, US-only inference at 1.1x, fast mode), per-iteration usage: each is a problem unless it
    leaves the list price as it is."""
    tools = r.obj("server_tool_use", frozenset(_SERVER_TOOLS))
    if tools:
        for key in _SERVER_TOOLS:
            if n := r.count(key, tools, "server_tool_use."):
                r.problems.append((f"usage.server_tool_use.{key}",
                                   f"{n:,} server tool requests are billed per request; Pointsman prices tokens only"))
    for key, plain in _LIST_PRICED.items():
        value = r.raw.get(key)
        if value is not None and value not in plain:
            r.problems.append((f"usage.{key}", f"{value!r} changes the price; Pointsman prices "
                                               f"{' / '.join(plain)} at the fleet's list prices only"))
    if r.raw.get("iterations"):
        r.problems.append(("usage.iterations", "per-iteration usage (context management) is not priced; report "
                                               "the summed counts"))


_LITELLM_WRITE_DETAILS = ("cache_creation_tokens", "cache_write_tokens", "cache_creation_token_details")


def _litellm(r: _Reader) -> UsageCounts:
    """LiteLLM's OpenAI-shaped usage of an Anthropic call: ``prompt_tokens`` includes reads and
    writes; ``cache_read_input_tokens`` / ``cache_creation_input_tokens`` beside it, the 5-minute /
    1-hour split in ``prompt_tokens_details.cache_creation_token_details``."""
    pd = r.raw.get("prompt_tokens_details")
    split = pd.get("cache_creation_token_details") if isinstance(pd, Mapping) else None
    inner = {k: v for k, v in r.raw.items() if k in _OPENAI}
    if isinstance(pd, Mapping):
        inner["prompt_tokens_details"] = {k: v for k, v in pd.items() if k not in _LITELLM_WRITE_DETAILS}
    sub = _Reader(inner)
    counts = _openai(sub)
    r.problems.extend(sub.problems)
    reads, writes = r.count("cache_read_input_tokens"), r.count("cache_creation_input_tokens")
    sources = dict(counts.sources)
    cached = counts.cached_tokens
    if reads is not None:
        r.agree("usage.cache_read_input_tokens", reads, cached, sources.get("cached_tokens", "the cache reads"))
        cached = reads if cached is None else cached
        sources.setdefault("cached_tokens", "usage.cache_read_input_tokens")
    if isinstance(pd, Mapping):
        for key in ("cache_creation_tokens", "cache_write_tokens"):
            r.agree(f"usage.prompt_tokens_details.{key}", r.count(key, pd, "prompt_tokens_details."), writes,
                    "usage.cache_creation_input_tokens")
    w5, w1h = writes, None
    sources["cache_write_tokens"] = "usage.cache_creation_input_tokens"
    if isinstance(split, Mapping):
        path = "prompt_tokens_details.cache_creation_token_details."
        for key, n in split.items():
            if key not in ("ephemeral_5m_input_tokens", "ephemeral_1h_input_tokens") and n not in (None, 0):
                r.problems.append((f"usage.{path}{key}", "a cache lifetime with no fleet price (5 minutes and "
                                                         "1 hour are priced)"))
        w5, w1h = r.count("ephemeral_5m_input_tokens", split, path), r.count("ephemeral_1h_input_tokens", split, path)
        w5 = (writes or 0) - (w1h or 0) if w5 is None else w5
        r.agree("usage.cache_creation_input_tokens", writes, (w5 or 0) + (w1h or 0),
                f"the sum of usage.{path}ephemeral_5m_input_tokens and ephemeral_1h_input_tokens")
        sources.update(cache_write_tokens=f"usage.{path}ephemeral_5m_input_tokens",
                       cache_write_1h_tokens=f"usage.{path}ephemeral_1h_input_tokens")
    _anthropic_extras(r)
    return UsageCounts("litellm", counts.prompt_tokens, cached, counts.completion_tokens, w5, w1h, sources,
                       counts.missing)


def _modalities(r: _Reader, key: str, why: str) -> None:
    v = r.raw.get(key)
    if v is None:
        return
    if not isinstance(v, list):
        r.problems.append((f"usage.{key}", "expected a list of {modality, tokenCount}"))
        return
    for i, d in enumerate(v):
        if not isinstance(d, Mapping) or set(d) - {"modality", "tokenCount"}:
            r.problems.append((f"usage.{key}[{i}]", "expected {modality, tokenCount}"))
            continue
        n = r.count("tokenCount", d, f"{key}[{i}].")
        if d.get("modality") == "AUDIO":
            r.unpriced(f"usage.{key}[{i}].tokenCount", n, why)


def _gemini(r: _Reader) -> UsageCounts:
    prompt = r.count("promptTokenCount")
    # proto3 JSON omits zero counts: an absent tool or thoughts count is 0, and an absent output count is
    # what totalTokenCount leaves (0 when it equals the rest); with no total either it is missing, not 0
    thoughts, total = r.count("thoughtsTokenCount") or 0, r.count("totalTokenCount")
    tool, cached = r.count("toolUsePromptTokenCount") or 0, r.count("cachedContentTokenCount")
    candidates = r.count("candidatesTokenCount")
    if candidates is None and total is not None and prompt is not None:
        candidates = max(0, total - prompt - tool - thoughts)
    for key, why in (("promptTokensDetails", "audio input tokens"), ("cacheTokensDetails", "cached audio tokens"),
                     ("toolUsePromptTokensDetails", "audio tool-use tokens"),
                     ("candidatesTokensDetails", "audio output tokens")):
        _modalities(r, key, why)
    if (traffic := r.raw.get("trafficType")) is not None and not isinstance(traffic, str):
        r.problems.append(("usage.trafficType", "expected a string"))
    completion = None if candidates is None else candidates + thoughts
    r.agree("usage.totalTokenCount", total, _sum(prompt, tool, completion),
            "usage.promptTokenCount + toolUsePromptTokenCount + candidatesTokenCount + thoughtsTokenCount")
    return UsageCounts("gemini", None if prompt is None else prompt + tool, cached, completion, None, None,
                       {"prompt_tokens": "usage.promptTokenCount", "completion_tokens": "usage.candidatesTokenCount",
                        "cached_tokens": "usage.cachedContentTokenCount"},
                       _missing(prompt, completion, "usage.promptTokenCount", "usage.candidatesTokenCount"))


def _bedrock(r: _Reader) -> UsageCounts:
    uncached, completion = r.count("inputTokens"), r.count("outputTokens")
    reads, writes = r.count("cacheReadInputTokens"), r.count("cacheWriteInputTokens")
    sources = {"prompt_tokens": "usage.inputTokens", "completion_tokens": "usage.outputTokens",
               "cached_tokens": "usage.cacheReadInputTokens", "cache_write_tokens": "usage.cacheWriteInputTokens"}
    w5, w1h = writes, None
    details = r.raw.get("cacheDetails")
    if details is not None:
        if not isinstance(details, list):
            r.problems.append(("usage.cacheDetails", "expected a list of {ttl, inputTokens}"))
        else:
            by_ttl = {"5m": 0, "1h": 0}
            for i, d in enumerate(details):
                if not isinstance(d, Mapping) or set(d) - {"ttl", "inputTokens"} or d.get("ttl") not in ("5m", "1h"):
                    r.problems.append((f"usage.cacheDetails[{i}]", "expected {ttl: 5m | 1h, inputTokens}"))
                    continue
                by_ttl[str(d["ttl"])] += r.count("inputTokens", d, f"cacheDetails[{i}].") or 0
            if details:
                w5, w1h = by_ttl["5m"], by_ttl["1h"]
                sources.update(cache_write_tokens="usage.cacheDetails[ttl=5m].inputTokens",
                               cache_write_1h_tokens="usage.cacheDetails[ttl=1h].inputTokens")
                r.agree("usage.cacheWriteInputTokens", writes, w5 + w1h, "the sum of usage.cacheDetails[].inputTokens")
                if writes is None:  # the split without its total: the writes are the split's sum
                    writes = w5 + w1h
    r.agree("usage.totalTokens", r.count("totalTokens"), _sum(uncached, completion, reads or 0, writes or 0),
            "usage.inputTokens + outputTokens + cacheReadInputTokens + cacheWriteInputTokens")
    prompt = None if uncached is None else uncached + (reads or 0) + (writes or 0)
    return UsageCounts("bedrock", prompt, reads, completion, w5, w1h, sources,
                       _missing(uncached, completion, "usage.inputTokens", "usage.outputTokens"))


def _missing(prompt: int | None, completion: int | None, prompt_name: str, completion_name: str) -> tuple[str, ...]:
    return tuple(name for n, name in ((prompt, prompt_name), (completion, completion_name)) if n is None)


#: Shapes in the order they are tried; ``{input_tokens, output_tokens}`` alone reads the same as
#: Responses or Anthropic usage.
_SHAPES: tuple[tuple[str, frozenset[str], Callable[[_Reader], UsageCounts]], ...] = (
    ("OpenAI Chat Completions", _OPENAI, _openai), ("OpenAI Responses", _RESPONSES, _responses),
    ("Anthropic Messages", _ANTHROPIC, _anthropic), ("Gemini usageMetadata", _GEMINI, _gemini),
    ("Bedrock Converse", _BEDROCK, _bedrock), ("LiteLLM (OpenAI-shaped Anthropic)", _LITELLM, _litellm))


def read_usage(raw: Mapping[str, object]) -> UsageCounts:
    """The priced form of one ``usage`` object in any shape of the module's table (keys whose
    value is null count as absent). Raises ``UsageProblems`` naming every field that cannot be
    priced (see the module); a missing prompt or output count is only listed in ``missing``."""
    keys = {k for k, v in raw.items() if v is not None}
    for _, allowed, reader in _SHAPES:
        if keys <= allowed:
            r = _Reader(raw)
            counts = reader(r)
            if r.problems:
                raise UsageProblems(r.problems)
            return _check_parts(counts)
    name, allowed, _ = max(_SHAPES, key=lambda s: len(keys & s[1]))
    problems: list[Problem] = []
    for k in sorted(keys - allowed, key=str):
        other = next((n for n, a, _ in _SHAPES if k in a), None)
        problems.append((f"usage.{k}", f"a key of {other} usage mixed with {name} keys" if other else
                         "unknown usage field: Pointsman cannot price it"))
    raise UsageProblems(problems)


def _check_parts(c: UsageCounts) -> UsageCounts:
    """Cache reads and writes are parts of the prompt: their sum must fit in it."""
    if c.prompt_tokens is None:
        return c
    parts = (c.cached_tokens or 0) + (c.cache_write_tokens or 0) + (c.cache_write_1h_tokens or 0)
    if parts > c.prompt_tokens:
        name = c.sources.get("cached_tokens", "usage.cached_tokens") if c.cached_tokens else "usage"
        raise UsageProblems([(name, f"cached_tokens ({c.cached_tokens or 0}) plus cache writes "
                                    f"({parts - (c.cached_tokens or 0)}) exceeds prompt_tokens ({c.prompt_tokens})")])
    return c


__all__ = ["MAX_TOKENS", "UsageCounts", "UsageProblems", "read_usage"]
