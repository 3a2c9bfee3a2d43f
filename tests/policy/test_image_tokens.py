"""``policy/image_tokens.py``: the tokens an image is counted at on a target are at least what its provider
bills for it, whatever its size (the request does not say it) and at each detail level. The providers'
rules are written out here from their docs, independently of the module, and LiteLLM 1.110.2's
(``token_counter.estimate_image_tokens``, offline: it reads the size from an inline PNG header) is a second
opinion where it knows the model."""

import base64
import math
import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from pointsman.policy.fleet import load_fleet, target_image_tokens
from pointsman.policy.image_tokens import UNKNOWN, default_image_tokens, image_tokens

DETAILS = st.sampled_from([None, "low", "high", "auto"])
SIDES = st.integers(min_value=1, max_value=8000)  # Anthropic's largest; OpenAI takes up to 20 MB


def tiles(w: int, h: int, detail: str | None, base: int, per_tile: int) -> int:
    """OpenAI's tile models: low = base; else fit in 2048 x 2048, short side down to 768, 512-px tiles."""
    if detail == "low":
        return base
    s = min(1.0, 2048 / max(w, h))
    s = s * min(1.0, 768 / (min(w, h) * s))
    return base + per_tile * math.ceil(math.floor(w * s) / 512) * math.ceil(math.floor(h * s) / 512)


def patches(w: int, h: int, multiplier: float, cap: int = 1536) -> int:
    """OpenAI's patch models: 32-px patches; over ``cap``, shrunk to fit (the docs' algorithm); x multiplier."""
    n = math.ceil(w / 32) * math.ceil(h / 32)
    if n > cap:
        s = math.sqrt(cap * 32 ** 2 / (w * h))
        s *= min(math.floor(w * s / 32) / (w * s / 32), math.floor(h * s / 32) / (h * s / 32))
        n = math.ceil(int(w * s) / 32) * math.ceil(int(h * s) / 32)
    return math.ceil(n * multiplier)


def claude(w: int, h: int) -> int:
    """Anthropic (before Claude 4.7): w x h / 750, scaled down first to a 1,568-px long edge and ~1,600 tokens
    (the docs' table of sizes not scaled reaches 784 x 1568 px: 1,639 tokens)."""
    s = min(1.0, 1568 / max(w, h), math.sqrt(1639 * 750 / (w * h)))
    return math.ceil(int(w * s) * int(h * s) / 750)


#: (provider, model) -> its rule, from the provider's docs.
RULES = {
    ("openai", "gpt-4o-2024-08-06"): lambda w, h, d: tiles(w, h, d, 85, 170),
    ("openai", "gpt-4o-mini-2024-07-18"): lambda w, h, d: tiles(w, h, d, 2833, 5667),
    ("azure", "gpt-4.1"): lambda w, h, d: tiles(w, h, d, 85, 170),
    ("openai", "o3"): lambda w, h, d: tiles(w, h, d, 75, 150),
    ("openai", "gpt-5-2025-08-07"): lambda w, h, d: tiles(w, h, d, 70, 140),
    ("openai", "gpt-4.1-mini"): lambda w, h, d: patches(w, h, 1.62),
    ("openai", "gpt-4.1-nano-2025-04-14"): lambda w, h, d: patches(w, h, 2.46),
    ("openai", "o4-mini"): lambda w, h, d: patches(w, h, 1.72),
    ("openai", "gpt-5-mini"): lambda w, h, d: patches(w, h, 1.62),
    ("openai", "gpt-5-nano"): lambda w, h, d: patches(w, h, 2.46),
    ("anthropic", "claude-sonnet-4-5-20250929"): lambda w, h, d: claude(w, h),
    ("bedrock", "anthropic.claude-3-5-sonnet-20241022-v2:0"): lambda w, h, d: claude(w, h),
    ("google", "gemini-3-pro-preview"): lambda w, h, d: 2240,  # media_resolution ultra high, the most
}
#: LiteLLM model names whose image rule it knows (the same families, and OpenAI models this module does
#: not know: their targets count UNKNOWN). Not gpt-5.6-* or gpt-6-astra: LiteLLM has them bill by the
#: image's original size without a cap (no safe default; their fleet entries must state image_tokens).
LITELLM = {
    ("openai", "gpt-4o-2024-08-06"): "gpt-4o", ("openai", "gpt-4o-mini-2024-07-18"): "gpt-4o-mini",
    ("azure", "gpt-4.1"): "gpt-4.1", ("openai", "o3"): "o3", ("openai", "gpt-5-2025-08-07"): "gpt-5",
    ("openai", "gpt-4.1-mini"): "gpt-4.1-mini", ("anthropic", "claude-sonnet-4-5-20250929"): "claude-sonnet-4-5",
    ("anthropic", "claude-opus-4-7"): "anthropic/claude-opus-4-7", ("openai", "gpt-5.2"): "gpt-5.2",
    ("openai", "gpt-5.4"): "gpt-5.4", ("openai", "gpt-5.4-mini"): "gpt-5.4-mini", ("openai", "gpt-5.5"): "gpt-5.5",
}


def png(w: int, h: int) -> str:
    """A data URL of a PNG header of ``w`` x ``h`` px (what LiteLLM reads the size from)."""
    ihdr = struct.pack(">II", w, h) + b"\x08\x02\x00\x00\x00"
    return "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDR" + ihdr + b"\0" * 4).decode()


@settings(max_examples=300, deadline=None)
@given(w=SIDES, h=SIDES, detail=DETAILS, model=st.sampled_from(sorted(RULES)))
def test_the_count_is_at_least_the_providers_rule(w, h, detail, model):
    rule = RULES[model]
    assert image_tokens(default_image_tokens(*model), detail) >= rule(w, h, detail)


@settings(max_examples=300, deadline=None)
@given(w=SIDES, h=SIDES, detail=DETAILS, model=st.sampled_from(sorted(LITELLM)))
def test_the_count_is_at_least_litellms(w, h, detail, model):
    from litellm.litellm_core_utils.token_counter import estimate_image_tokens

    counted = image_tokens(default_image_tokens(*model), detail)
    assert counted >= estimate_image_tokens(LITELLM[model], png(w, h), detail or "auto")


def test_the_largest_bills_and_the_fallback():
    """The maxima the rules reach (worked out in the module's docstring) and the fallback above them all."""
    assert max(tiles(w, h, "high", 2833, 5667) for w in range(64, 4097, 64) for h in range(64, 4097, 64)) \
        == image_tokens(default_image_tokens("openai", "gpt-4o-mini"), "high") == 48169
    assert image_tokens(default_image_tokens("openai", "gpt-4o"), "low") == 85
    for provider, model in [(None, "Qwen/Qwen2.5-VL-7B-Instruct"), ("google", "gemini-2.5-flash"), ("acme", "gpt-4o")]:
        assert default_image_tokens(provider, model) == UNKNOWN  # no documented maximum known: the largest
    assert UNKNOWN.high >= max(image_tokens(default_image_tokens(*m), "high") for m in RULES)
    fleet = load_fleet()  # the packaged fleet's OpenAI tiers
    assert image_tokens(target_image_tokens(fleet.targets["frontier-small"]), None) == 48169
    assert image_tokens(target_image_tokens(fleet.targets["frontier-large"]), "low") == 85
