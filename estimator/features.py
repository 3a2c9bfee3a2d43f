"""Request features: what the policy and the estimator know about a request
before it runs, computed at a cost bounded independently of prompt length.

``extract_features(request, tokenizer=None) -> RequestFeatures``.

Bounded cost: the encoder sees at most ``QUERY_WINDOW_CHARS`` of the last user
message (head and tail), and token counting tokenizes at most
``COUNT_SAMPLE_CHARS`` of the conversation and extrapolates by the measured
characters-per-token ratio. A gateway that knows the exact count passes
``routing.prompt_tokens`` and that wins.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from tokenizers import Tokenizer

    from pointsman.request import RouteRequest

#: Characters of the last user message the encoder sees (head 3/4 + tail 1/4).
QUERY_WINDOW_CHARS = 2048
#: Characters of the conversation tokenized to count tokens (head half + tail half).
COUNT_SAMPLE_CHARS = 16384
#: Chat-format overhead per message in tokens (role markers), as in OpenAI's counting guide.
TOKENS_PER_MESSAGE = 4
#: Fallback characters per token when no tokenizer is available (English text, BPE).
CHARS_PER_TOKEN = 4.0


@dataclass(frozen=True)
class RequestFeatures:
    """Cheap facts about one request.

    ``prompt_tokens``: prompt length in tokens (exact when the gateway supplied it,
    ``prompt_tokens_exact``; otherwise counted on a bounded sample and extrapolated).
    ``turns``: number of user messages. ``query_text``: the bounded window of the
    last user message that the encoder embeds (at most ``QUERY_WINDOW_CHARS`` chars).
    ``query_chars``: full length of the last user message in characters.
    """

    prompt_chars: int
    prompt_tokens: int
    prompt_tokens_exact: bool
    turns: int
    n_messages: int
    system_chars: int
    query_chars: int
    query_text: str
    has_tools: bool
    has_images: bool
    n_images: int
    n_tool_calls: int
    max_output_tokens: int | None


def bounded_window(text: str, limit: int) -> str:
    """``text`` if it fits in ``limit`` chars, else its first 3/4·limit and last 1/4·limit chars."""
    if len(text) <= limit:
        return text
    head = (limit * 3) // 4
    return text[:head] + "\n" + text[len(text) - (limit - head - 1) :]


def count_tokens(text: str, tokenizer: Tokenizer | None) -> int:
    """Tokens in ``text``: exact up to ``COUNT_SAMPLE_CHARS`` chars, extrapolated beyond.

    Without a tokenizer, ``ceil(chars / CHARS_PER_TOKEN)``. The tokenizer must have
    padding and truncation disabled. Cost is O(COUNT_SAMPLE_CHARS), not O(len(text)).
    """
    if not text:
        return 0
    if tokenizer is None:
        return math.ceil(len(text) / CHARS_PER_TOKEN)
    sample = text if len(text) <= COUNT_SAMPLE_CHARS else bounded_window(text, COUNT_SAMPLE_CHARS)
    n = len(tokenizer.encode(sample, add_special_tokens=False).ids)
    if sample is text:
        return n
    return max(1, round(n * len(text) / len(sample)))


def extract_features(request: RouteRequest, tokenizer: Tokenizer | None = None) -> RequestFeatures:
    """Compute ``RequestFeatures`` for a validated request.

    ``tokenizer``: a ``tokenizers.Tokenizer`` used for counting (the estimator's);
    ``None`` falls back to a characters-per-token estimate.
    """
    texts = [m.text() for m in request.messages]
    prompt_chars = sum(len(t) for t in texts)
    query = next((t for m, t in zip(reversed(request.messages), reversed(texts)) if m.role == "user" and t), "")
    if not query:  # no user text (e.g. an image-only turn): fall back to the last message with text
        query = next((t for t in reversed(texts) if t), "")
    exact = request.routing.prompt_tokens
    if exact is not None:
        prompt_tokens = exact
    else:
        joined = "\n".join(texts)
        prompt_tokens = count_tokens(joined, tokenizer) + TOKENS_PER_MESSAGE * len(request.messages)
    n_images = sum(m.n_images() for m in request.messages)
    n_tool_calls = sum(len(m.tool_calls or ()) for m in request.messages)
    return RequestFeatures(
        prompt_chars=prompt_chars,
        prompt_tokens=prompt_tokens,
        prompt_tokens_exact=exact is not None,
        turns=sum(m.role == "user" for m in request.messages),
        n_messages=len(request.messages),
        system_chars=sum(len(t) for m, t in zip(request.messages, texts) if m.role in ("system", "developer")),
        query_chars=len(query),
        query_text=bounded_window(query, QUERY_WINDOW_CHARS),
        has_tools=bool(request.tools) or n_tool_calls > 0 or any(m.role == "tool" for m in request.messages),
        has_images=n_images > 0,
        n_images=n_images,
        n_tool_calls=n_tool_calls,
        max_output_tokens=request.max_output_tokens,
    )
