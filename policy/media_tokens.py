"""Prompt tokens a request's images, audio and files bill on a target, on the safe side: at least what its provider's
documented rule bills for the size ``pointsman.media`` reads (an image's width and height, an audio part's seconds,
a PDF's pages), and, where the size is not known, the most the rule can bill (the context-window filter counts an
image of unknown size, a PDF's page image too, at the least it bills instead, a page's text not counted: ``SMALLEST``,
``cost.target_prompt_tokens(window=True)``).

Images. An image given inline (a base64 ``data:`` URL) has its size read from its header; one given by URL is
counted at the most its rule bills at the detail it asks (OpenAI's ``image_url.detail``: ``low``, else
``high``/``auto``, which may bill as high). A fleet target may state ``image_tokens: {high: N, low: M}``: the most
one image bills there, whatever its size; without one, ``image_rule`` reads the rule from the target's provider and
model (token counts for a ``w`` x ``h`` px image):

- OpenAI tile models (platform.openai.com/docs/guides/images-vision, "Calculating costs"; LiteLLM
  ``token_counter._TILE_IMAGE_TOKEN_COSTS``): ``low`` = base; ``high`` = base + per_tile x tiles, the
  image fit in 2048 x 2048, then its short side scaled down to 768, tiles of 512 px: at most 2 x 4 = 8
  tiles. Base/per tile: gpt-4o, gpt-4.1, gpt-4.5, gpt-4-turbo 85/170 (at most 1,445); gpt-4o-mini
  2,833/5,667 (a 512-px image 8,500, at most 48,169: 33x gpt-4o's tokens at 1/17 of its price); o1, o3
  75/150 (1,275); gpt-5, gpt-5.1 70/140 (1,190).
- OpenAI patch models (same page, "GPT-4.1-mini, GPT-4.1-nano, o4-mini"): ceil(w/32) x ceil(h/32) patches,
  scaled down to at most 1,536, times a multiplier: gpt-4.1-mini 1.62, gpt-4.1-nano 2.46, o4-mini 1.72,
  gpt-5-mini 1.62 and gpt-5-nano 2.46 (the docs' values; the community measured 1.2 and 1.5 for gpt-5's,
  community.openai.com/t/1344040, so the docs' err high). ``detail: low`` is measured to have no effect on
  them (community.openai.com/t/1377015): low = high. LiteLLM 1.110.2 (``_patch_image_limits``) has
  gpt-4.1-mini fit images in 2048 px and cap 6,144 patches instead: up to 64 x 64 = 4,096 patches, so
  gpt-4.1-mini counts that cap, the larger. Counted: the unscaled patches, at most the cap (a downscale never
  makes more patches).
- Anthropic Claude (platform.claude.com/docs/en/build-with-claude/vision): about w x h / 750 tokens, an image
  over 1,568 px on its long edge or ~1,600 tokens scaled down first; the docs' table of the largest sizes
  not scaled reaches 784 x 1,568 px (1:2), 1,639 tokens; LiteLLM counts its 28-px cells instead (ceil(w/28) x
  ceil(h/28), 1,568 at most), more for a thin image (1 x 29 px: 2, against 1): counted the larger, at most 1,640. Claude Opus
  4.7 and later, Sonnet and Haiku 5 and later (LiteLLM ``_ANTHROPIC_IMAGE_LIMITS`` "claude-high"; adk-vision's
  ``ClaudeVisionTier``): ceil(w/28) x ceil(h/28), long edge to 2,576 px, at most 4,784. No detail parameter.
- Google Gemini 3 (ai.google.dev/gemini-api/docs/media-resolution): a fixed count per image by
  ``media_resolution``: low 280, medium 560, high 1,120 (the default), ultra high 2,240 (per part): 2,240.
  Gemini 2.x: 258 per image up to 384 x 384 px, else 258 per 768-px tile, with no documented
  largest tile count: counted ``UNKNOWN`` (declare ``image_tokens`` from a measurement), which at a read size
  counts those tiles too (``GEMINI_TILES``: a 10,000 x 10,000 px image 50,568 tokens, past any other rule's most).

Anything else (another provider, a model not listed, OpenAI's gpt-5.2 and later) counts ``UNKNOWN``: at each
size, the most any rule above bills for it, so an undeclared target's estimate errs high. It does not cover a
model that bills an image by its original size without a cap (LiteLLM has gpt-5.6-* and gpt-6-astra so at detail
``original``/``auto``): such a target must state ``image_tokens``. An on-prem target that takes images must state
it (a fleet problem otherwise): its model's count (Qwen2.5-VL's pixels / 784 up to its ``max_pixels``,
LLaVA-1.5's 576, ...) is the serving engine's, not a provider's.

Audio (``input_audio``), per second read (``media.audio_seconds``): OpenAI 10 tokens (1 token per 100 ms of user
audio, platform.openai.com/docs/guides/realtime-costs; $100 per 1M audio tokens, "~$0.06 per minute");
Gemini 32 (ai.google.dev/gemini-api/docs/audio, "each second of audio is represented as 32 tokens"); any other
target 32, the most documented (Anthropic takes no audio).

Files (``file``): a PDF's page is billed as its text and as an image of it (OpenAI, platform.openai.com/docs/
guides/pdf-files: "both the extracted text and an image of each page"; Anthropic, docs "PDF support": "1,500-3,000
tokens per page" of text, and each page an image at the vision rule; Gemini, 258 or its ``media_resolution`` per
page): counted ``PAGE_TEXT_TOKENS`` + the most one image bills on the target, per page. No provider states a
largest text count per page: ``PAGE_TEXT_TOKENS`` is the top of Anthropic's range, the one assumption here that
is not a bound. A file that is no PDF counts its bytes (a byte-level BPE token is at least one byte).

A part whose size is not read (an audio or file part given by reference, an encrypted PDF, a damaged header)
makes ``media_tokens`` answer ``unknown``: ``cost.target_prompt_tokens`` then counts the rest of the target's
context window, the most a provider can bill for a prompt it accepts.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from pydantic import Field

from pointsman.located import StrictModel

if TYPE_CHECKING:  # pragma: no cover
    from pointsman.media import Media

Size = tuple[int, int] | None

#: OpenAI's tile rule at its largest: 8 tiles of 512 px (a 768 x 2048 image after its resizes).
MAX_TILES = 8
#: OpenAI's patch rule at its largest: 1,536 patches of 32 px (the docs); gpt-4.1-mini's as LiteLLM has it:
#: 2048 x 2048 px, 4,096 patches.
MAX_PATCHES = 1536
MAX_PATCHES_LITELLM = 4096
#: Text tokens of one PDF page: the top of Anthropic's "1,500-3,000 tokens per page" (no provider states a most).
PAGE_TEXT_TOKENS = 3000
#: Audio tokens per second: OpenAI's (and Azure OpenAI's), else the most documented (Gemini's).
AUDIO_TOKENS_PER_S = {"openai": 10, "azure": 10}
MAX_AUDIO_TOKENS_PER_S = 32


#: The size an image of unread size counts at where the least it can bill is wanted (the context-window filter):
#: 1 x 1 px, one tile, cell or token (a stated ``image_tokens`` is its count whatever the size).
SMALLEST: Size = (1, 1)


class ImageRule(Protocol):
    """Tokens one image of ``size`` ((width, height) px; None: not known, the most the rule bills) bills at
    ``detail`` (the part's ``detail``; None when it names none). Pure; no errors."""

    def __call__(self, size: Size, detail: str | None) -> int: ...


class ImageTokens(StrictModel):
    """Prompt tokens one image input bills on a target, at most, whatever its size: ``high`` at detail ``high``
    or ``auto`` (or none), ``low`` at detail ``low`` (absent: ``high``). An ``ImageRule``."""

    high: int = Field(ge=0)
    low: int | None = Field(default=None, ge=0)

    def __call__(self, size: Size, detail: str | None) -> int:
        return self.low if detail == "low" and self.low is not None else self.high


@dataclass(frozen=True)
class Tiles:
    """OpenAI's tile rule: ``base`` at detail low, else ``base`` + ``per_tile`` x 512-px tiles of the image fit in
    2048 px and its short side scaled down to 768 (sizes not rounded down: a tile more, never one less)."""

    base: int
    per_tile: int

    def __call__(self, size: Size, detail: str | None) -> int:
        if detail == "low":
            return self.base
        if size is None:
            return self.base + MAX_TILES * self.per_tile
        w, h = size
        s = min(1.0, 2048 / max(w, h))
        s *= min(1.0, 768 / (min(w, h) * s))
        return self.base + self.per_tile * math.ceil(w * s / 512) * math.ceil(h * s / 512)


@dataclass(frozen=True)
class Grid:
    """Tokens per ``px``-square cell of the image, at most ``cap`` cells, times ``multiplier`` (OpenAI's patches,
    Claude 4.7's 28-px cells); detail has no effect."""

    px: int
    cap: int
    multiplier: float = 1.0

    def __call__(self, size: Size, detail: str | None) -> int:
        cells = self.cap if size is None else min(self.cap, math.ceil(size[0] / self.px) * math.ceil(size[1] / self.px))
        return math.ceil(cells * self.multiplier)


@dataclass(frozen=True)
class Area:
    """Claude's rule before 4.7: ceil(w x h / ``px_per_token``), at most ``cap``."""

    px_per_token: int
    cap: int

    def __call__(self, size: Size, detail: str | None) -> int:
        return self.cap if size is None else min(self.cap, math.ceil(size[0] * size[1] / self.px_per_token))


def no_images(size: Size, detail: str | None) -> int:
    """0 tokens: the rule of a target that takes no images (``fleet.target_image_rule``)."""
    return 0


@dataclass(frozen=True)
class Most:
    """The most any of ``rules`` bills for the image (``UNKNOWN``)."""

    rules: tuple[ImageRule, ...]

    def __call__(self, size: Size, detail: str | None) -> int:
        return max(rule(size, detail) for rule in self.rules)


#: (OpenAI model name prefix) -> its rule; the first prefix that matches wins.
OPENAI_RULES: tuple[tuple[str, ImageRule], ...] = (
    ("gpt-4o-mini", Tiles(2833, 5667)),
    ("gpt-4.1-mini", Grid(32, MAX_PATCHES_LITELLM, 1.62)),
    ("gpt-4.1-nano", Grid(32, MAX_PATCHES, 2.46)),
    ("o4-mini", Grid(32, MAX_PATCHES, 1.72)),
    ("gpt-5-mini", Grid(32, MAX_PATCHES, 1.62)),
    ("gpt-5-nano", Grid(32, MAX_PATCHES, 2.46)),
    ("gpt-4o", Tiles(85, 170)),
    ("gpt-4.1", Tiles(85, 170)),
    ("gpt-4.5", Tiles(85, 170)),
    ("gpt-4-turbo", Tiles(85, 170)),
    ("o1", Tiles(75, 150)),
    ("o3", Tiles(75, 150)),
    ("gpt-5.1", Tiles(70, 140)),
    ("gpt-5", Tiles(70, 140)),  # gpt-5-2025-08-07, gpt-5-chat-latest; not gpt-5.2 on (patches: unknown)
)
CLAUDE = Most((Area(750, 1640), Grid(28, 1640)))
CLAUDE_HIGH = Grid(28, 4784)
GEMINI_3 = ImageTokens(high=2240)


@dataclass(frozen=True)
class GeminiTiles:
    """Gemini 2.x's rule at a read size: 258 tokens for an image up to 384 x 384 px, else 258 per 768-px tile; 0 at
    an unknown size (no largest is documented: ``UNKNOWN``'s other rules give its most there)."""

    def __call__(self, size: Size, detail: str | None) -> int:
        if size is None:
            return 0
        w, h = size
        return 258 if w <= 384 and h <= 384 else 258 * math.ceil(w / 768) * math.ceil(h / 768)


#: A target whose rule is not known: at each size and detail, the most any known rule bills.
UNKNOWN = Most((*(rule for _, rule in OPENAI_RULES), CLAUDE, CLAUDE_HIGH, GEMINI_3, GeminiTiles()))

_CLAUDE_VERSION = re.compile(r"claude-(?:(?:haiku|sonnet|opus)-)?(\d+)(?:[-.](\d{1,2})(?!\d))?")
_GEMINI_VERSION = re.compile(r"gemini-(\d+)")


def image_rule(provider: str | None, model: str) -> ImageRule:
    """The rule for a target that declares no ``image_tokens``: by ``model`` (its name after the last
    ``/``, lower case; a dated snapshot matches its family) for ``provider`` ``openai`` or ``azure``
    (``OPENAI_RULES``; a ``mini`` or ``nano`` variant of a family whose entry is neither: ``UNKNOWN``), a Claude
    model on any provider (``CLAUDE``; ``CLAUDE_HIGH`` from Claude 4.7 on), a Gemini 3 or later model
    (``GEMINI_3``); else ``UNKNOWN`` (an on-prem target passes None)."""
    name = model.rsplit("/", 1)[-1].lower()
    if provider in ("openai", "azure"):
        for prefix, rule in OPENAI_RULES:
            if name == prefix or name.startswith(prefix + "-"):
                # a small variant not listed ("gpt-5-codex-mini") may bill as the small models do, not its family
                small = {"mini", "nano"} & set(name.split("-"))
                return UNKNOWN if small and not small & set(prefix.split("-")) else rule
    if (claude := _CLAUDE_VERSION.search(name)) is not None:
        return CLAUDE_HIGH if (int(claude[1]), int(claude[2] or 0)) >= (4, 7) else CLAUDE
    if (gemini := _GEMINI_VERSION.search(name)) is not None and int(gemini[1]) >= 3:
        return GEMINI_3
    return UNKNOWN


def media_tokens(rule: ImageRule, provider: str | None, media: Media, unread: Size = None) -> tuple[int, bool]:
    """(tokens, unknown): the prompt tokens ``media``'s parts bill on a target whose image rule is ``rule`` and whose
    provider is ``provider`` (None on-prem), by the rules of the module docstring; an image of unread size counts as
    one of size ``unread`` (None: the most the rule bills; ``SMALLEST``: the least, and a PDF page then counts its
    image alone, at that size, without its text); ``unknown``: some audio or file
    part's size was not read (not counted in tokens). Pure; no errors."""
    tokens = sum(rule(unread if size is None else size, detail) for size, detail in media.images)
    rate = AUDIO_TOKENS_PER_S.get(provider or "", MAX_AUDIO_TOKENS_PER_S)
    tokens += sum(math.ceil(s * rate) for s in media.audio_seconds if s is not None)
    page = rule(None, None) + PAGE_TEXT_TOKENS if unread is None else rule(unread, None)  # least: no text, image at unread
    tokens += sum(n * page if pdf else n for n, pdf in media.files if n is not None)
    unknown = None in media.audio_seconds or any(n is None for n, _ in media.files)
    return tokens, unknown
