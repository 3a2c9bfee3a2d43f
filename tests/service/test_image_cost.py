"""A multimodal request's cost estimate and target over HTTP (POST /v1/route, the packaged fleet and default
policy): an image by URL counts at least what the target's provider bills for it at its largest, an inline image
what it bills at the size its header gives; audio by its seconds, a PDF by its pages; the context-window filter
compares the same per-target count. The packaged frontier-small is gpt-4o-mini, whose images bill 2,833 + 5,667
tokens per 512-px tile (OpenAI's "Calculating costs"), 33x gpt-4o's, at $0.15 per 1M input tokens; frontier-large
is gpt-4o (85 + 170 a tile, $2.50); both have 128,000-token windows."""

import base64
import io
import math
import wave
import zlib

import pytest
from fastapi.testclient import TestClient

from pointsman.estimator.estimate import FixedDifficulty
from pointsman.policy.engine import RoutingEngine
from pointsman.policy.fleet import DEFAULT_FLEET_PATH, load_fleet, parse_fleet
from pointsman.policy.rules.compiler import DEFAULT_POLICY_PATH, load_policy
from pointsman.service.app import create_app
from pointsman.service.bootstrap import build_state
from pointsman.service.settings import Settings

#: max_tokens of every request: a long answer makes gpt-4o-mini the cheaper tier for each request here, so the default
#: policy sends them there (with a short one an image by URL costs less on gpt-4o, and goes there: test_image_overflow.py)
OUT = 2000


def openai_tile_tokens(width: int, height: int, base: int, per_tile: int) -> int:
    """OpenAI's high-detail rule: fit in 2048 x 2048, short side down to 768, 512-px tiles."""
    scale = min(1.0, 2048 / max(width, height))
    w, h = width * scale, height * scale
    scale = min(1.0, 768 / min(w, h))
    w, h = math.floor(w * scale), math.floor(h * scale)
    return base + per_tile * math.ceil(w / 512) * math.ceil(h / 512)


#: The most gpt-4o-mini bills for an image of unknown size at high detail (a 768 x 2048 image: 8 tiles).
MINI_MOST = max(openai_tile_tokens(w, h, 2833, 5667) for w in range(256, 4097, 128) for h in range(256, 4097, 128))


@pytest.fixture
def route(tmp_path):
    """route(body, fleet=None, p_hard=0.05, status=200) -> the /v1/route answer on ``fleet`` (default: the packaged
    one) with the estimator's ``p_hard``."""
    clients = []

    def post(body: dict, fleet=None, p_hard: float = 0.05, status: int = 200) -> dict:
        fleet = fleet or load_fleet()
        settings = Settings(data_dir=tmp_path / str(len(clients)), policy_path=DEFAULT_POLICY_PATH, watch_policy=False)
        engine = RoutingEngine(fleet, load_policy(DEFAULT_POLICY_PATH, fleet), FixedDifficulty(p_hard),
                               state=build_state(settings, fleet))
        client = TestClient(create_app(settings, engine=engine, owns_engine=True))
        clients.append(client.__enter__())
        r = client.post("/v1/route", json={"max_tokens": OUT, **body})
        assert r.status_code == status, r.text
        return r.json()

    yield post
    for c in clients:
        c.__exit__(None, None, None)


def _image_request(detail: str | None = None, routing: dict | None = None, url: str = "https://example.com/scan.png",
                   images: int = 1) -> dict:
    image = {"url": url, **({"detail": detail} if detail else {})}
    return _request(*[{"type": "image_url", "image_url": image}] * images, routing=routing)


def _request(*parts: dict, routing: dict | None = None) -> dict:
    return {"messages": [{"role": "user", "content": [{"type": "text", "text": "What does this form say?"}, *parts]}],
            **({"routing": routing} if routing else {})}


def _fleet(insert: str, after: str = "    model: gpt-4o-mini-2024-07-18\n"):
    """The packaged fleet with ``insert`` (YAML lines) after ``after`` (frontier-small's model line)."""
    head, found, tail = DEFAULT_FLEET_PATH.read_text(encoding="utf-8").partition(after)
    assert found
    return parse_fleet(head + found + insert + tail)


def png_url(w: int, h: int) -> str:
    """A real PNG of ``w`` x ``h`` px as a data URL."""
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (w, h), "white").save(out, "PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


def mini_usd(tokens: int) -> float:
    """gpt-4o-mini's price of ``tokens`` prompt tokens and the ``OUT`` output tokens."""
    return (tokens * 0.15 + OUT * 0.60) / 1e6


@pytest.mark.parametrize("detail", [None, "auto", "high"])
def test_an_image_on_gpt_4o_mini_is_estimated_at_least_at_its_largest_bill(route, detail):
    d = route(_image_request(detail))
    assert d["target"] == "frontier-small"  # gpt-4o-mini: the on-prem models take no images
    floor = (MINI_MOST * 0.15 + OUT * 0.60) / 1e6  # the image alone, at its price, and the output
    assert MINI_MOST == 2833 + 8 * 5667 and d["estimated_cost_usd"] >= floor, (d["estimated_cost_usd"], floor)


def test_a_low_detail_image_on_gpt_4o_mini_is_estimated_at_least_at_2833_tokens(route):
    low = route(_image_request("low"))["estimated_cost_usd"]
    assert low >= (2833 * 0.15 + OUT * 0.60) / 1e6
    assert low < route(_image_request("high"))["estimated_cost_usd"]  # and below a high-detail one


def test_a_supplied_prompt_count_gets_the_image_added(route):
    """A gateway's routing.prompt_tokens may count an image any way (LiteLLM counts 250 for an image URL):
    the image is added on top of it by the target's rule (the answer's ``prompt_tokens`` is the chosen target's
    count, the one its cost prices)."""
    d = route(_image_request(routing={"prompt_tokens": 300}))
    assert d["target"] == "frontier-small" and d["prompt_tokens"] == 300 + MINI_MOST
    assert d["estimated_cost_usd"] >= ((300 + MINI_MOST) * 0.15 + OUT * 0.60) / 1e6


def test_the_fleet_states_a_target_image_count(route):
    """``image_tokens`` on a fleet target replaces its provider's default rule."""
    fleet = _fleet("    image_tokens: {high: 100000, low: 3000}\n")
    high = route(_image_request(), fleet)["estimated_cost_usd"]
    low = route(_image_request("low"), fleet)["estimated_cost_usd"]
    assert high >= (100000 * 0.15 + OUT * 0.60) / 1e6 > (MINI_MOST * 0.15 + OUT * 0.60) / 1e6
    assert (3000 * 0.15 + OUT * 0.60) / 1e6 <= low < (3000 * 0.15 + 200 * 0.15 + OUT * 0.60) / 1e6


def test_an_inline_image_counts_what_its_size_bills(route):
    """A 512-px PNG bills one tile on gpt-4o-mini, 2,833 + 5,667 = 8,500 tokens, not the 48,169 of the largest
    image (before sizes were read, the estimate was 48,169 tokens' worth); a 1,536 x 4,096 one bills 8 tiles (768 x 2,048 once fit)."""
    assert openai_tile_tokens(512, 512, 2833, 5667) == 8500
    small = route(_image_request(url=png_url(512, 512)))
    assert small["target"] == "frontier-small"
    assert small["prompt_tokens"] == route(_request())["prompt_tokens"] + 8500  # the text's and the image's
    assert small["estimated_cost_usd"] == pytest.approx(mini_usd(small["prompt_tokens"]))
    assert route(_image_request(url=png_url(1536, 4096)))["estimated_cost_usd"] >= mini_usd(MINI_MOST)


def test_the_context_window_holds_the_targets_image_count(route):
    """The window filter refuses a target only for what surely will not fit, the cost holds the most. Three images
    by URL bill 3 x 8,500 to 3 x 48,169 = 144,507 tokens on gpt-4o-mini (a 128,000-token window): an easy request
    goes there, held at the most; three inline 1,536 x 4,096 images (8 tiles each once fit) surely do not fit, so
    it is refused there (the filter counted 1,600 an image everywhere and sent it, 200) and, as the default policy
    sends an easy request nowhere else, refused; a hard one goes to gpt-4o (3 x 1,445). Three inline 512-px images
    (3 x 8,500) fit gpt-4o-mini."""
    by_url = route(_image_request(images=3))
    assert by_url["target"] == "frontier-small"
    assert by_url["estimated_cost_usd"] >= mini_usd(3 * MINI_MOST)
    big = png_url(1536, 4096)
    refused = route(_image_request(url=big, images=3), status=422)["error"]["message"]
    assert "frontier-small (context-window: needs 146,5" in refused, refused  # 3 x 48,169, the text and OUT
    assert "onprem-8b (capabilities: does not accept image inputs)" in refused, refused  # named for what it lacks
    assert route(_image_request(url=big, images=3), p_hard=0.95)["target"] == "frontier-large"
    assert route(_image_request(url=png_url(512, 512), images=3))["target"] == "frontier-small"


def wav_base64(seconds: int, rate: int = 16000) -> str:
    """A real WAV (mono, 16-bit) of ``seconds`` of silence, base64."""
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(b"\0\0" * rate * seconds)
    return base64.b64encode(out.getvalue()).decode()


def test_audio_counts_its_seconds(route):
    """A 60-second WAV bills 600 tokens on OpenAI (1 token per 100 ms): it counted 0 before; an MP3 is bounded by
    its bytes at 6 kbit/s (750 bytes a second)."""
    text = DEFAULT_FLEET_PATH.read_text(encoding="utf-8").replace(
        "capabilities: {tools: true, images: true, files: true, audio: false}\n",
        "capabilities: {tools: true, images: true, files: true, audio: true}\n", 1)
    fleet = parse_fleet(text)
    wav = route(_request({"type": "input_audio", "input_audio": {"data": wav_base64(60), "format": "wav"}}), fleet)
    assert wav["target"] == "frontier-small"
    text = route(_request())["prompt_tokens"]
    assert wav["prompt_tokens"] == text + 600 and wav["estimated_cost_usd"] == pytest.approx(mini_usd(text + 600))
    mp3 = base64.b64encode(b"\xff\xfb\x90\x00" * 7500).decode()  # 30,000 bytes: at most 40 s
    d = route(_request({"type": "input_audio", "input_audio": {"data": mp3, "format": "mp3"}}), fleet)
    assert d["prompt_tokens"] == text + 400 and d["estimated_cost_usd"] == pytest.approx(mini_usd(text + 400))


def pdf_base64(pages: int, compressed: bool = False) -> str:
    """A PDF of ``pages`` blank pages (its page tree in a compressed object stream with ``compressed``), base64."""
    if not compressed:
        from PIL import Image

        out = io.BytesIO()
        Image.new("RGB", (100, 100)).save(out, "PDF", save_all=True, append_images=[Image.new("RGB", (100, 100))] * (pages - 1))
        return base64.b64encode(out.getvalue()).decode()
    objects = b"2 0 << /Type /Pages /Kids [] /Count %d >>" % pages
    stream = zlib.compress(objects)
    pdf = (b"%%PDF-1.5\n1 0 obj << /Type /Catalog /Pages 2 0 R >> endobj\n"
           b"3 0 obj << /Type /ObjStm /N 1 /First 4 /Filter /FlateDecode /Length %d >>\nstream\n" % len(stream)
           + stream + b"\nendstream\nendobj\n%EOF\n")
    return base64.b64encode(pdf).decode()


@pytest.mark.parametrize("compressed", [False, True])
def test_a_pdf_counts_its_pages(route, compressed):
    """Each page of a PDF bills its text and an image of it (OpenAI's "File inputs"): 3,000 + the most an image
    bills, per page; it counted 0 before. Two pages on gpt-4o-mini: 2 x (3,000 + 48,169), at $0.15."""
    data = "data:application/pdf;base64," + pdf_base64(2, compressed)
    d = route(_request({"type": "file", "file": {"file_data": data, "filename": "a.pdf"}}))
    assert d["target"] == "frontier-small"
    assert d["prompt_tokens"] == route(_request())["prompt_tokens"] + 2 * (3000 + 48169)
    assert d["estimated_cost_usd"] == pytest.approx(mini_usd(d["prompt_tokens"]))


def test_a_pdf_counts_the_least_its_pages_bill_against_the_window(route):
    """The window filter counts what surely does not fit: a page's image is of unread size, so at the least its rule
    bills (one tile, 8,500 on gpt-4o-mini) and no text (a scanned page has none). A 10-page PDF surely needs
    85,000 tokens there, under its 128,000-token window: it goes, held at the most, 10 x (3,000 + 48,169); it was
    refused (the filter counted the hold, 511,690 tokens, 422)."""
    data = "data:application/pdf;base64," + pdf_base64(10)
    d = route(_request({"type": "file", "file": {"file_data": data, "filename": "a.pdf"}}))
    assert d["target"] == "frontier-small"
    assert d["prompt_tokens"] > 10 * (3000 + 48169)  # the target's count: the text and the pages at the most
    assert d["estimated_cost_usd"] == pytest.approx(mini_usd(d["prompt_tokens"]))
    refused = route(_request({"type": "file", "file": {"file_data": "data:application/pdf;base64," + pdf_base64(16),
                                                        "filename": "a.pdf"}}), status=422)["error"]["message"]
    assert "frontier-small (context-window: needs 138," in refused, refused  # 16 x 8,500 + OUT surely does not fit


def test_a_pdf_of_many_object_stream_headers_is_read_once(route, monkeypatch):
    """Each object stream is inflated once however many ``/Type /ObjStm`` headers precede it: the page count's scan
    read the rest of the file (and inflated its stream) again for every header, so a 336 KB body took 16 s and one
    at the 8 MiB body limit hours (measured by calls, not time: inflations <= streams)."""
    import pointsman.media

    calls = []
    decompressobj = zlib.decompressobj
    monkeypatch.setattr(pointsman.media.zlib, "decompressobj", lambda *a: calls.append(1) or decompressobj(*a))
    pdf = b"%PDF-1.5\n1 0 obj\n" + b"/Type /ObjStm /Filter " * 2000 + b"stream\n" + zlib.compress(
        b"2 0 << /Type /Pages /Count 2 >>") + b"\nendstream\nendobj\n"
    d = route(_request({"type": "file", "file": {"file_data": "data:application/pdf;base64," + base64.b64encode(pdf).decode(),
                                                  "filename": "a.pdf"}}))
    assert d["prompt_tokens"] > 2 * (3000 + 48169)  # the target's count, with the 2 pages read
    assert d["estimated_cost_usd"] == pytest.approx(mini_usd(d["prompt_tokens"]))
    assert len(calls) == 1


def test_a_file_of_unknown_size_counts_the_window(route):
    """A file by reference (``file_id``) has no size here: it counts the rest of the target's window, the most the
    provider can bill for a prompt it takes (it counted 0 before); the window still holds it."""
    d = route(_request({"type": "file", "file": {"file_id": "file-abc"}}))
    assert d["target"] == "frontier-small"
    assert d["estimated_cost_usd"] == pytest.approx(mini_usd(128000 - OUT))


def test_the_endpoint_pickers_reading_keeps_what_the_media_measure():
    """Responses and Anthropic Messages bodies as the Envoy endpoint picker reads them (``chat_request``): an
    ``input_image``'s detail, an ``input_file``'s or a ``document``'s data (a plain-text document: its bytes) and an
    ``input_audio``'s reach the counts
    (the picker had kept only the parts' types: files and audio of unknown size, every image at high detail)."""
    from pointsman.media import Media
    from pointsman.request import RequestView, parse_route_request
    from pointsman.service.ext_proc_body import chat_request

    pdf = pdf_base64(3)
    responses = {"input": [{"role": "user", "content": [
        {"type": "input_image", "image_url": png_url(512, 256), "detail": "low"},
        {"type": "input_file", "filename": "a.pdf", "file_data": "data:application/pdf;base64," + pdf},
        {"type": "input_audio", "input_audio": {"data": wav_base64(2), "format": "wav"}}]}]}
    media = RequestView.of(parse_route_request(chat_request(responses))).media
    assert media == Media(images=(((512, 256), "low"),), audio_seconds=(2.0,), files=((3, True),))
    anthropic = {"max_tokens": 10, "messages": [{"role": "user", "content": [
        {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": pdf}},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": png_url(30, 40).split(",")[1]}},
        {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "Dear Ada, ..."}}]}]}
    assert RequestView.of(parse_route_request(chat_request(anthropic))).media == Media(
        images=(((30, 40), None),), files=((3, True), (13, False)))
