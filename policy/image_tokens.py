"""Prompt tokens an image input bills on a target: the most its provider's rule gives, per detail level.

Pointsman does not read images (``request.ImagePart``): their width and height are not known, so an
image is counted at the most its target's provider bills for it at the detail it asks (OpenAI's
``image_url.detail``: ``low``, else ``high``/``auto``, which may bill as high). A fleet target states
it as ``image_tokens: {high: N, low: M}``; without one, ``default_image_tokens`` reads the rule from the
target's provider and model. The provider rules (token counts for a ``w`` x ``h`` px image):

- OpenAI tile models (platform.openai.com/docs/guides/images-vision, "Calculating costs"; LiteLLM
  ``token_counter._TILE_IMAGE_TOKEN_COSTS``): ``low`` = base; ``high`` = base + per_tile x tiles, the
  image fit in 2048 x 2048, then its short side scaled down to 768, tiles of 512 px: at most 2 x 4 = 8
  tiles. Base/per tile: gpt-4o, gpt-4.1, gpt-4.5, gpt-4-turbo 85/170 (at most 1,445); gpt-4o-mini
  2,833/5,667 (at most 48,169: 33x gpt-4o's tokens at 1/17 of its price); o1, o3 75/150 (1,275);
  gpt-5, gpt-5.1 70/140 (1,190).
- OpenAI patch models (same page, "GPT-4.1-mini, GPT-4.1-nano, o4-mini"): ceil(w/32) x ceil(h/32) patches,
  scaled down to at most 1,536, times a multiplier: gpt-4.1-mini 1.62, gpt-4.1-nano 2.46, o4-mini 1.72,
  gpt-5-mini 1.62 and gpt-5-nano 2.46 (the docs' values; the community measured 1.2 and 1.5 for gpt-5's,
  community.openai.com/t/1344040, so the docs' err high). ``detail: low`` is measured to have no effect on
  them (community.openai.com/t/1377015): low = high. LiteLLM 1.110.2 (``_patch_image_limits``) has
  gpt-4.1-mini fit images in 2048 px and cap 6,144 patches instead: up to 64 x 64 = 4,096 patches, so
  gpt-4.1-mini counts that, the larger (6,636 against the docs' 2,489).
- Anthropic Claude (platform.claude.com/docs/en/build-with-claude/vision): about w x h / 750 tokens, an image
  over 1,568 px on its long edge or ~1,600 tokens scaled down first; the docs' table of the largest sizes
  not scaled reaches 784 x 1,568 px (1:2), 1,639 tokens: at most 1,640. Claude Opus 4.7 and later, Sonnet and
  Haiku 5 and later (LiteLLM ``_ANTHROPIC_IMAGE_LIMITS`` "claude-high"; adk-vision's ``ClaudeVisionTier``):
  ceil(w/28) x ceil(h/28), long edge to 2,576 px, at most 4,784. No detail parameter.
- Google Gemini 3 (ai.google.dev/gemini-api/docs/media-resolution): a fixed count per image by
  ``media_resolution``: low 280, medium 560, high 1,120 (the default), ultra high 2,240 (per part): at
  most 2,240. Gemini 2.x: 258 per image up to 384 x 384 px, else 258 per 768-px tile, with no documented
  largest tile count: counted ``UNKNOWN`` (declare ``image_tokens`` from a measurement).

Anything else (another provider, an on-prem model, a model not listed, OpenAI's gpt-5.2 and later) counts
``UNKNOWN``: the most any rule above bills, so an undeclared target's estimate errs high. It does not cover
a model that bills an image by its original size without a cap (LiteLLM has gpt-5.6-* and gpt-6-astra so at
detail ``original``/``auto``): such a target must state ``image_tokens``. The fleet's ``image_tokens`` overrides.
"""

from __future__ import annotations

import math
import re

from pydantic import Field

from pointsman.located import StrictModel

#: OpenAI's tile rule at its largest: 8 tiles of 512 px (a 768 x 2048 image after its resizes).
MAX_TILES = 8
#: OpenAI's patch rule at its largest: 1,536 patches of 32 px (the docs); gpt-4.1-mini's as LiteLLM has it:
#: 2048 x 2048 px, 4,096 patches.
MAX_PATCHES = 1536
MAX_PATCHES_LITELLM = 4096


class ImageTokens(StrictModel):
    """Prompt tokens one image input bills on a target, at most: ``high`` at detail ``high`` or ``auto``
    (or none), ``low`` at detail ``low`` (absent: ``high``)."""

    high: int = Field(ge=0)
    low: int | None = Field(default=None, ge=0)


def _tiles(base: int, per_tile: int) -> ImageTokens:
    return ImageTokens(high=base + MAX_TILES * per_tile, low=base)


def _patches(multiplier: float, patches: int = MAX_PATCHES) -> ImageTokens:
    return ImageTokens(high=math.ceil(patches * multiplier))


#: (provider family, model name prefix) -> the most an image bills; the first prefix that matches wins.
OPENAI_RULES: tuple[tuple[str, ImageTokens], ...] = (
    ("gpt-4o-mini", _tiles(2833, 5667)),
    ("gpt-4.1-mini", _patches(1.62, MAX_PATCHES_LITELLM)),
    ("gpt-4.1-nano", _patches(2.46)),
    ("o4-mini", _patches(1.72)),
    ("gpt-5-mini", _patches(1.62)),
    ("gpt-5-nano", _patches(2.46)),
    ("gpt-4o", _tiles(85, 170)),
    ("gpt-4.1", _tiles(85, 170)),
    ("gpt-4.5", _tiles(85, 170)),
    ("gpt-4-turbo", _tiles(85, 170)),
    ("o1", _tiles(75, 150)),
    ("o3", _tiles(75, 150)),
    ("gpt-5.1", _tiles(70, 140)),
    ("gpt-5", _tiles(70, 140)),  # gpt-5-2025-08-07, gpt-5-chat-latest; not gpt-5.2 on (patches: unknown)
)
CLAUDE = ImageTokens(high=1640)
CLAUDE_HIGH = ImageTokens(high=4784)
GEMINI_3 = ImageTokens(high=2240)

_CLAUDE_VERSION = re.compile(r"claude-(?:(?:haiku|sonnet|opus)-)?(\d+)(?:[-.](\d{1,2})(?!\d))?")
_GEMINI_VERSION = re.compile(r"gemini-(\d+)")


def image_tokens(rule: ImageTokens, detail: str | None) -> int:
    """Tokens one image bills at most under ``rule`` (``ImageTokens``, from the fleet or
    ``default_image_tokens``) at ``detail`` (the request's ``image_url.detail``; None when it names none):
    ``rule.low`` for ``"low"`` when the rule has one, else ``rule.high``. Pure; no errors."""
    return rule.low if detail == "low" and rule.low is not None else rule.high


_KNOWN = (*(rule for _, rule in OPENAI_RULES), CLAUDE, CLAUDE_HIGH, GEMINI_3)
#: A target whose rule is not known: the most any known rule bills, at each detail level.
UNKNOWN = ImageTokens(high=max(r.high for r in _KNOWN), low=max(image_tokens(r, "low") for r in _KNOWN))


def default_image_tokens(provider: str | None, model: str) -> ImageTokens:
    """The rule for a target that declares no ``image_tokens``: by ``model`` (its name after the last
    ``/``, lower case; a dated snapshot matches its family) for ``provider`` ``openai`` or ``azure``
    (``OPENAI_RULES``), a Claude model on any provider (``CLAUDE``; ``CLAUDE_HIGH`` from Claude 4.7 on),
    a Gemini 3 or later model (``GEMINI_3``); else ``UNKNOWN`` (an on-prem target passes None)."""
    name = model.rsplit("/", 1)[-1].lower()
    if provider in ("openai", "azure"):
        for prefix, rule in OPENAI_RULES:
            if name == prefix or name.startswith(prefix + "-"):
                return rule
    if (claude := _CLAUDE_VERSION.search(name)) is not None:
        return CLAUDE_HIGH if (int(claude[1]), int(claude[2] or 0)) >= (4, 7) else CLAUDE
    if (gemini := _GEMINI_VERSION.search(name)) is not None and int(gemini[1]) >= 3:
        return GEMINI_3
    return UNKNOWN
