"""Features of a draft: what the on-prem model answered (or began to answer), for the verifier.

A cascade (FrugalGPT, AutoMix) lets the cheap model answer first and escalates to the
frontier when the answer looks bad. ``draft_features(draft, prompt_tokens, p_hard)`` turns
one draft into ``DraftFeatures``: plain numbers, flags and log-probability statistics, at a
bounded cost (the text is read up to ``MAX_DRAFT_CHARS`` characters, the log-probabilities up
to ``MAX_LOGPROBS`` values). ``DraftFeatures.vector()`` is the verifier head's input,
float32 of shape ``(len(FEATURE_NAMES),)``, in ``FEATURE_NAMES`` order.

Markers (``refusal``, ``hedging``) are English phrase lists read in the first
``MARKER_CHARS`` characters (a refusal says so at once); ``caveats`` counts apologies,
disclaimers, moralizing and filler ("I apologize", "not appropriate", "respectful", "I hope this
helps", ...) in the first ``CAVEAT_CHARS`` characters (a chat model that lectures instead of
answering loses; on the shared AlpacaEval answers of llama-2-7b-chat the count alone predicts a
loss with AUC 0.70); ``list_items`` counts lines that open a bulleted or numbered item (a
structured answer) in the text read; ``repetition`` is the share of word trigrams that repeat an
earlier one (0 = none, near 1 = a loop), over the first ``REPETITION_WORDS`` words;
``opening_overlap`` is the share of the words of the draft's first sentence that occur in the
prompt (its last user message, ``prompt_of``, first ``PROMPT_CHARS`` characters): an answer that
opens on the prompt's own terms gets to the point ("The color of the sky is blue.", "Job Title:
Software Engineer"), one that opens with thanks, a greeting or a lecture does not (on the shared
AlpacaEval answers of llama-2-7b-chat the 127 of 604 drafts with an overlap of 0.4 or more lose
14% of the time, the rest 30%; docs/cascade.md). Length counts: ``tokens`` is the engine's
``completion_tokens`` when given, else the number of log-probabilities, else characters / 4.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from pointsman.request import RequestView

#: Characters of draft text read at most.
MAX_DRAFT_CHARS = 32_768
#: Log-probabilities read at most.
MAX_LOGPROBS = 8_192
#: Characters the refusal and hedging markers look at.
MARKER_CHARS = 600
#: Characters the caveat count reads.
CAVEAT_CHARS = 2_000
#: Characters of the draft (for its first sentence) and of the prompt ``opening_overlap`` reads.
PROMPT_CHARS = 2_000
#: Words the repetition measure reads.
REPETITION_WORDS = 2_000
#: A token whose log-probability is below this is "low confidence" (probability < 0.2).
LOW_LOGPROB = math.log(0.2)

_REFUSAL = re.compile(
    r"\b(?:i(?:'m| am) sorry|i apologi[sz]e|i can(?:no|')t (?:help|assist|provide|fulfil|comply|do that|answer)"
    r"|i(?:'m| am) (?:not able|unable) to|as an ai\b|as a language model|i (?:will|won')t be able to"
    r"|cannot (?:fulfil|comply|assist)|not (?:appropriate|ethical) (?:for me )?to|i must (?:decline|refuse))",
    re.IGNORECASE)
_HEDGING = re.compile(
    r"\b(?:i(?:'m| am) not (?:sure|certain)|i don'?t know|it(?:'s| is) (?:hard|difficult) to say|it depends"
    r"|i (?:do not|don'?t) have (?:enough|access|the ability)|may or may not|i (?:cannot|can'?t) (?:be sure|verify)"
    r"|without more (?:information|context)|my knowledge cutoff)",
    re.IGNORECASE)
_CAVEATS = re.compile(
    r"\b(?:i apologi[sz]e|i cannot|i can'?t|not (?:appropriate|ethical|possible)|respectful|harmful|offensive"
    r"|safe and|positive and|i'?m just an ai|as a responsible|i must inform|i would like to clarify"
    r"|not a (?:valid|meaningful)|does ?n[o']t make sense|please let me know|i hope this helps|is there anything else)",
    re.IGNORECASE)
_LIST_ITEM = re.compile(r"^[ \t]*(?:[-*•+]|\d{1,3}[.)])[ \t]+\S", re.MULTILINE)
_WORD = re.compile(r"\w+")
_SENTENCE = re.compile(r"[^.!?\n]+")
#: Finish reasons the engines report (OpenAI's set); anything else reads as ``other``.
FINISH_REASONS = ("stop", "length", "content_filter", "tool_calls", "function_call")


@dataclass(frozen=True)
class Draft:
    """One draft as the gateway reports it (``POST /v1/verify``).

    ``text``: the answer or its first tokens ('' when only counts are known); ``finish_reason``:
    the engine's (``stop``, ``length``, ...; '' when unknown or still streaming);
    ``logprobs``: per-token log-probabilities (each <= 0) when the engine returned them;
    ``completion_tokens``: the engine's count, else None; ``partial``: only the first tokens
    (streaming), so length and finish reason say less."""

    text: str = ""
    finish_reason: str = ""
    logprobs: tuple[float, ...] = ()
    completion_tokens: int | None = None
    partial: bool = False


#: The verifier head's input, in order (``DraftFeatures.vector``).
FEATURE_NAMES = ("log_tokens", "log_length_ratio", "empty", "truncated", "partial", "refusal", "hedging",
                 "repetition", "has_logprobs", "logprob_mean", "logprob_min", "low_logprob_share", "p_hard",
                 "log_caveats", "log_list_items", "opening_overlap")


@dataclass(frozen=True)
class DraftFeatures:
    """The features of one draft (see the module). ``length_ratio``: draft tokens / prompt
    tokens (prompt at least 1); ``logprob_*`` are None without log-probabilities;
    ``p_hard``: the decision's difficulty estimate (0.5 when unavailable); ``caveats``,
    ``list_items``: counts (see the module; 0 in rows logged before they existed);
    ``opening_overlap``: 0-1 (see the module; 0 without the prompt and in rows logged before it existed)."""

    tokens: int
    length_ratio: float
    finish_reason: str
    truncated: bool
    partial: bool
    empty: bool
    refusal: bool
    hedging: bool
    repetition: float
    logprob_mean: float | None
    logprob_min: float | None
    low_logprob_share: float | None
    p_hard: float
    caveats: int = 0
    list_items: int = 0
    opening_overlap: float = 0.0

    def vector(self) -> NDArray[np.float32]:
        """The head's input, float32 ``(len(FEATURE_NAMES),)``: counts as log1p, flags 0/1,
        log-probability statistics 0 when absent (``has_logprobs`` says which)."""
        has = self.logprob_mean is not None
        return np.array([
            math.log1p(self.tokens), math.log(max(self.length_ratio, 1e-3)), float(self.empty),
            float(self.truncated), float(self.partial), float(self.refusal), float(self.hedging), self.repetition,
            float(has), self.logprob_mean or 0.0, self.logprob_min or 0.0, self.low_logprob_share or 0.0,
            self.p_hard, math.log1p(self.caveats), math.log1p(self.list_items), self.opening_overlap],
            dtype=np.float32)

    def to_dict(self) -> dict[str, object]:
        """The features as a JSON-ready dict (the outcome log's ``verifications`` row, traces)."""
        return {"tokens": self.tokens, "length_ratio": self.length_ratio, "finish_reason": self.finish_reason,
                "truncated": self.truncated, "partial": self.partial, "empty": self.empty, "refusal": self.refusal,
                "hedging": self.hedging, "repetition": self.repetition, "logprob_mean": self.logprob_mean,
                "logprob_min": self.logprob_min, "low_logprob_share": self.low_logprob_share, "p_hard": self.p_hard,
                "caveats": self.caveats, "list_items": self.list_items, "opening_overlap": self.opening_overlap}


#: Characters per token where a draft's length in tokens is not known (``draft_features`` counts so).
CHARS_PER_TOKEN = 4


def draft_prefix(text: str, prefix_tokens: int | None) -> Draft:
    """What a gateway verifies of the answer ``text`` with early verification: its first
    ``prefix_tokens`` N tokens (the first ``CHARS_PER_TOKEN`` x N characters, ``partial``, N
    ``completion_tokens``, no finish reason yet) when it is longer than that; else the whole
    answer (finish reason ``stop``), as when ``prefix_tokens`` is None. For training and replay
    on answers stored whole."""
    if prefix_tokens is None or len(text) <= CHARS_PER_TOKEN * prefix_tokens:
        return Draft(text=text, finish_reason="stop")
    return Draft(text=text[: CHARS_PER_TOKEN * prefix_tokens], completion_tokens=prefix_tokens, partial=True)


def repetition(text: str) -> float:
    """Share 0-1 of word trigrams in the first ``REPETITION_WORDS`` words of ``text`` that
    repeat an earlier trigram (0 for fewer than 4 words)."""
    words = [w.lower() for w in _WORD.findall(text[:MAX_DRAFT_CHARS])[:REPETITION_WORDS]]
    grams = list(zip(words, words[1:], words[2:]))
    if len(grams) < 2:
        return 0.0
    return 1.0 - len(set(grams)) / len(grams)


def prompt_of(view: RequestView | None) -> str:
    """The text the draft answers: the last user message of the request ``view`` (the last message
    when none is a user's; '' without a view or messages)."""
    if view is None or not view.texts:
        return ""
    for message, text in zip(reversed(view.request.messages), reversed(view.texts)):
        if message.role == "user":
            return text
    return view.texts[-1]


def opening_overlap(text: str, prompt: str) -> float:
    """Share 0-1 of the words of ``text``'s first sentence (the first non-blank run of its first
    ``PROMPT_CHARS`` characters without ``.``, ``!``, ``?`` or a newline) that occur among the words
    of ``prompt``'s first ``PROMPT_CHARS`` characters, lower-cased; 0.0 when either has no words.
    Cost bounded by ``PROMPT_CHARS`` characters of each."""
    first = next((m.group() for m in _SENTENCE.finditer(text[:PROMPT_CHARS]) if m.group().strip()), "")
    words = set(_WORD.findall(first.lower()))
    if not words or not prompt:
        return 0.0
    return len(words.intersection(_WORD.findall(prompt[:PROMPT_CHARS].lower()))) / len(words)


def draft_features(draft: Draft, prompt_tokens: int, p_hard: float | None, prompt: str = "") -> DraftFeatures:
    """Features of ``draft`` for a prompt of ``prompt_tokens`` tokens whose decision estimated
    ``p_hard`` (None: unavailable, read as 0.5); ``prompt``: the text it answers (``prompt_of``; ''
    when unknown: ``opening_overlap`` 0, read as a draft that does not open on the prompt's terms).
    Never raises for a valid ``Draft``."""
    text = draft.text[:MAX_DRAFT_CHARS]
    logprobs = [lp for lp in draft.logprobs[:MAX_LOGPROBS] if math.isfinite(lp)]
    if draft.completion_tokens is not None:
        tokens = int(draft.completion_tokens)
    elif logprobs:
        tokens = len(logprobs)
    else:
        tokens = math.ceil(len(draft.text) / 4)
    head = text[:MARKER_CHARS]
    finish = draft.finish_reason if draft.finish_reason in FINISH_REASONS or not draft.finish_reason else "other"
    mean = min_ = low = None
    if logprobs:
        mean = float(sum(logprobs) / len(logprobs))
        min_ = float(min(logprobs))
        low = sum(lp < LOW_LOGPROB for lp in logprobs) / len(logprobs)
    return DraftFeatures(
        tokens=tokens, length_ratio=tokens / max(int(prompt_tokens), 1), finish_reason=finish,
        truncated=finish == "length", partial=bool(draft.partial), empty=tokens == 0 or not text.strip() and not logprobs,
        refusal=bool(_REFUSAL.search(head)), hedging=bool(_HEDGING.search(head)), repetition=repetition(text),
        logprob_mean=mean, logprob_min=min_, low_logprob_share=low,
        p_hard=0.5 if p_hard is None or not math.isfinite(p_hard) else float(p_hard),
        caveats=len(_CAVEATS.findall(text[:CAVEAT_CHARS])), list_items=len(_LIST_ITEM.findall(text)),
        opening_overlap=opening_overlap(text, prompt))
