"""``policy/media_tokens.py`` and ``pointsman/media.py``: the tokens an image is counted at on a target are at least
what its provider bills for it at the size read from its header, and at most what it bills at its largest (a size
not known), at each detail level; the sizes, seconds and pages read are the ones Pillow and the ``wave`` module
write. The providers' rules are written out here from their docs, independently of the module, and LiteLLM
1.110.2's (``token_counter.estimate_image_tokens``, offline: it reads the size from an inline PNG header) is a
second opinion where it knows the model."""

import base64
import io
import math
import struct
import wave
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pointsman.errors import FleetError
from pointsman.media import MIN_AUDIO_BYTES_PER_S, audio_seconds, file_size, image_size
from pointsman.policy.fleet import DEFAULT_FLEET_PATH, load_fleet, parse_fleet, target_image_rule
from pointsman.policy.media_tokens import CLAUDE, CLAUDE_HIGH, OPENAI_RULES, UNKNOWN, GeminiTiles, Grid, image_rule
from pointsman.request import RequestView, parse_route_request

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


@settings(max_examples=500, deadline=None)
@given(w=SIDES, h=SIDES, detail=DETAILS, model=st.sampled_from(sorted(RULES)))
def test_the_count_at_a_size_is_at_least_the_providers_rule_and_at_most_its_largest(w, h, detail, model):
    rule = image_rule(*model)
    assert rule(None, detail) >= rule((w, h), detail) >= RULES[model](w, h, detail)


@settings(max_examples=300, deadline=None)
@given(w=SIDES, h=SIDES, detail=DETAILS, model=st.sampled_from(sorted(LITELLM)))
def test_the_count_of_an_inline_image_is_at_least_litellms(w, h, detail, model):
    """Read from the request as the service reads it (``RequestView.media``: the PNG header in the data URL)."""
    from litellm.litellm_core_utils.token_counter import estimate_image_tokens

    url = png(w, h)
    request = parse_route_request({"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": url, **({"detail": detail} if detail else {})}}]}]})
    (size, read_detail), = RequestView.of(request).media.images
    assert size == (w, h) and read_detail == detail
    assert image_rule(*model)(size, read_detail) >= estimate_image_tokens(LITELLM[model], url, detail or "auto")


@settings(max_examples=300, deadline=None)
@given(w=SIDES, h=SIDES, dw=st.integers(0, 4000), dh=st.integers(0, 4000), detail=DETAILS,
       rule=st.sampled_from([CLAUDE, CLAUDE_HIGH, *(r for _, r in OPENAI_RULES if isinstance(r, Grid))]))
def test_the_area_and_patch_counts_grow_with_the_image(w, h, dw, dh, detail, rule):
    """Claude's and OpenAI's patch rules never bill a larger image less (OpenAI's tile rule does: 800 x 1600 px
    bills 6 tiles, 768 x 1600 px 8, so it is not checked)."""
    assert rule((w, h), detail) <= rule((w + dw, h + dh), detail)


@settings(max_examples=200, deadline=None)
@given(w=SIDES, h=SIDES, detail=DETAILS)
def test_an_unknown_target_counts_the_most_any_rule_bills_at_the_size(w, h, detail):
    """At a read size, the most of every rule with a largest count and of Gemini 2.x's uncapped tiles; at an unknown
    size, at least every capped rule's largest (Gemini 2.x documents none: declare ``image_tokens`` there)."""
    known = [image_rule(*m) for m in RULES]
    assert UNKNOWN((w, h), detail) == max(max(r((w, h), detail) for r in known), GeminiTiles()((w, h), detail))
    assert max(r((w, h), detail) for r in known) <= UNKNOWN(None, detail)


@settings(max_examples=60, deadline=None)
@given(w=st.integers(1, 3000), h=st.integers(1, 3000), fmt=st.sampled_from(["PNG", "JPEG", "GIF", "WEBP", "WEBP-L"]),
       exif=st.booleans())
def test_the_header_gives_the_size_pillow_wrote(w, h, fmt, exif):
    """PNG, JPEG (with a 20 kB EXIF segment before its frame header), GIF, WebP (lossy VP8, lossless VP8L, and
    VP8X when it carries EXIF) as Pillow writes them."""
    from PIL import Image

    out = io.BytesIO()
    extra = {"exif": b"Exif\0\0" + b"\0" * 20000} if exif and fmt in ("JPEG", "WEBP") else {}
    Image.new("RGB", (w, h)).save(out, fmt[:4], lossless=fmt == "WEBP-L", **extra)
    assert image_size(base64.b64encode(out.getvalue()).decode()) == (w, h)


def test_a_damaged_or_remote_image_has_no_size():
    assert image_size(None) is None and image_size("not base64!") is None
    assert image_size(base64.b64encode(b"\xff\xd8\xff\xe0\x00").decode()) is None  # a JPEG cut short
    request = parse_route_request({"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "https://example.com/a.png", "detail": "low"}}]}]})
    assert RequestView.of(request).media.images == ((None, "low"),)


@settings(max_examples=50, deadline=None)
@given(rate=st.sampled_from([8000, 16000, 24000, 44100, 48000]), channels=st.integers(1, 2),
       width=st.sampled_from([1, 2, 3, 4]), frames=st.integers(0, 50000))
def test_a_wav_lasts_what_its_header_says(rate, channels, width, frames):
    out = io.BytesIO()
    with wave.open(out, "wb") as f:
        f.setnchannels(channels)
        f.setsampwidth(width)
        f.setframerate(rate)
        f.writeframes(b"\0" * frames * channels * width)
    assert audio_seconds(base64.b64encode(out.getvalue()).decode(), "wav") == pytest.approx(frames / rate)


def test_another_audio_format_is_bounded_by_its_bytes():
    data = base64.b64encode(b"\xff\xfb" * 3000).decode()  # 6,000 bytes of MP3 frames
    assert audio_seconds(data, "mp3") == 6000 / MIN_AUDIO_BYTES_PER_S
    assert audio_seconds(None, "mp3") is None and audio_seconds(data[:8], "wav") is None  # no WAV header


@settings(max_examples=20, deadline=None)
@given(pages=st.integers(1, 40))
def test_a_pdf_has_the_pages_pillow_wrote(pages):
    from PIL import Image

    out = io.BytesIO()
    Image.new("L", (8, 8)).save(out, "PDF", save_all=True, append_images=[Image.new("L", (8, 8))] * (pages - 1))
    assert file_size(base64.b64encode(out.getvalue()).decode()) == (pages, True)


def test_a_pdf_page_tree_in_an_object_stream_and_other_files():
    stream = zlib.compress(b"2 0 << /Type /Pages /Kids [] /Count 37 >>")
    pdf = (b"%%PDF-1.5\n3 0 obj << /Type /ObjStm /N 1 /First 4 /Filter /FlateDecode /Length %d >>\nstream\r\n"
           % len(stream)) + stream + b"\nendstream\nendobj\n"
    assert file_size(base64.b64encode(pdf).decode()) == (37, True)
    assert file_size(base64.b64encode(b"%PDF-1.7 encrypted").decode()) == (None, True)
    # an object stream that cannot be read may hold the page tree: an outline's /Count 3 is no bound then
    unread = b"%PDF-1.5\n4 0 obj << /Type /Outlines /Count 3 >> endobj\n3 0 obj << /Type /ObjStm /Filter /FlateDecode >>\nstream\n"
    assert file_size(base64.b64encode(unread + b"\x00garbage\nendstream").decode()) == (None, True)
    assert file_size(base64.b64encode(unread + stream + b"\nendstream").decode()) == (37, True)
    assert file_size(base64.b64encode(b"a,b\n1,2\n").decode()) == (8, False)  # no PDF: its bytes
    assert file_size(None) == (None, False)


def test_a_pdf_inflated_past_the_bound_has_no_page_count(monkeypatch):
    """Inflating stops at ``MAX_INFLATED`` bytes in all (a stream that inflates to gigabytes costs no more); what was
    not read may hold the page tree, so the count is not known."""
    import pointsman.media

    big = zlib.compress(b" " * 5000 + b"2 0 << /Type /Pages /Count 9 >>")
    pdf = (b"%PDF-1.5\n4 0 obj << /Type /Outlines /Count 2 >> endobj\n"
           b"3 0 obj << /Type /ObjStm /Filter /FlateDecode >>\nstream\n" + big + b"\nendstream\n")
    assert file_size(base64.b64encode(pdf).decode()) == (9, True)
    monkeypatch.setattr(pointsman.media, "MAX_INFLATED", 4096)
    assert file_size(base64.b64encode(pdf).decode()) == (None, True)


def test_an_onprem_target_that_takes_images_states_its_count():
    """No provider rule applies to an on-prem vision model: the fleet names the missing ``image_tokens``."""
    line = "    capabilities: {tools: true, images: false}   # Llama 3.1 is text-only\n"
    text = DEFAULT_FLEET_PATH.read_text(encoding="utf-8")
    assert line in text
    with pytest.raises(FleetError, match="onprem-8b' takes images but states no image_tokens"):
        parse_fleet(text.replace(line, "    capabilities: {tools: true, images: true}\n", 1))
    fleet = parse_fleet(text.replace(line, "    capabilities: {tools: true, images: true}\n    image_tokens: {high: 1280}\n", 1))
    assert target_image_rule(fleet.targets["onprem-8b"])((100, 100), None) == 1280


def test_the_largest_bills_and_the_fallback():
    """The maxima the rules reach (worked out in the module's docstring) and the fallback above them all."""
    assert max(tiles(w, h, "high", 2833, 5667) for w in range(64, 4097, 64) for h in range(64, 4097, 64)) \
        == image_rule("openai", "gpt-4o-mini")(None, "high") == 48169
    assert image_rule("openai", "gpt-4o")(None, "low") == 85
    for provider, model in [(None, "Qwen/Qwen2.5-VL-7B-Instruct"), ("google", "gemini-2.5-flash"), ("acme", "gpt-4o"),
                            ("openai", "gpt-5-codex-mini"), ("openai", "gpt-5.1-codex-mini"), ("azure", "o3-mini")]:
        assert image_rule(provider, model) == UNKNOWN  # no documented maximum known: the largest
    assert image_rule("openai", "gpt-5-mini-2025-08-07") == image_rule("openai", "gpt-5-mini")  # listed: its own
    assert image_rule("openai", "gpt-4o-mini-2024-07-18")(None, "high") == 48169
    # Gemini 2.x's tiles at a read size: 10,000 px square is 14 x 14 tiles of 258, past every capped rule
    assert image_rule("google", "gemini-2.0-flash")((10_000, 10_000), None) == 258 * 14 * 14 == 50568
    assert image_rule("google", "gemini-2.0-flash")((384, 384), None) >= 258
    assert UNKNOWN(None, "high") >= max(image_rule(*m)(None, "high") for m in RULES)
    fleet = load_fleet()  # the packaged fleet's OpenAI tiers
    assert target_image_rule(fleet.targets["frontier-small"])(None, None) == 48169
    assert target_image_rule(fleet.targets["frontier-small"])((512, 512), None) == 8500
    assert target_image_rule(fleet.targets["frontier-large"])(None, "low") == 85
