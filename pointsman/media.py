"""What a request's media parts measure, read from their inline base64 bytes (an image's header only, never its
pixels): an image's width and height (PNG, JPEG, GIF, WebP), an audio part's seconds (a WAV's from its header, any
other format bounded by its byte size), a file's pages (a PDF's page tree ``/Count``) or, for a file that is no PDF,
its bytes. ``RequestView.media`` reads every part once with these; the provider rules that turn these into
tokens are in ``policy/media_tokens.py``.

Only base64 data (a ``data:`` URL, OpenAI's ``input_audio.data``, Anthropic's ``source.data``) is read; a part
given by reference (an ``https`` URL, a ``file_id``) or one that cannot be read is ``None``: its size is not
known here. An image header costs a few base64 quartets (a JPEG's: a few per marker segment before its frame
header); a WAV's, its first chunks; a PDF is decoded whole (its page count needs a scan) and its compressed
object streams inflated once each, at most ``MAX_INFLATED`` bytes in all for all the files of one request
(``InflateBudget``): a deflate stream inflates up to ~1,000x, so a per-file bound let a 1 MB body of a hundred 11 KB
PDFs inflate and scan 400 MB (38 s of one core, the event loop blocked).
"""

from __future__ import annotations

import base64
import binascii
import re
import struct
import zlib
from dataclasses import dataclass

#: Fewest bytes per second any audio format a provider takes can have: Opus's lowest bitrate, 6 kbit/s
#: (RFC 6716; MP3's is 8 kbit/s, MPEG-2.5 Layer III). A compressed audio part lasts at most its bytes / this.
MIN_AUDIO_BYTES_PER_S = 750
#: Most bytes the PDFs of one request have their compressed object streams inflated to in all while looking for
#: their page counts (``InflateBudget``).
MAX_INFLATED = 1 << 22
_SOF = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})
_COUNT = re.compile(rb"/Count\s+(\d{1,9})")
_OBJSTM = re.compile(rb"/Type\s*/ObjStm")


@dataclass(frozen=True, slots=True)
class Media:
    """A request's non-text parts, in order: ``images`` as (``(width, height)`` px or None, ``detail``: the part's
    ``detail``, None when it names none); ``audio_seconds`` (an upper bound of each ``input_audio`` part's length,
    or None); ``files`` as (PDF pages, or for another file its bytes, or None; ``is_pdf``). None: not known."""

    images: tuple[tuple[tuple[int, int] | None, str | None], ...] = ()
    audio_seconds: tuple[float | None, ...] = ()
    files: tuple[tuple[int | None, bool], ...] = ()


class InflateBudget:
    """The bytes ``file_size`` may still inflate (``left``, from ``MAX_INFLATED``): one per request, shared by its
    files, so many small PDFs cost no more than one large one."""

    __slots__ = ("left",)

    def __init__(self) -> None:
        self.left = MAX_INFLATED


def inline_data(ref: object) -> str | None:
    """The base64 payload a part's reference holds inline: a ``data:...;base64,`` URL (a string, or under
    ``url``, ``file_data``, ``data``), Anthropic's ``{"type": "base64", "data": ...}``, OpenAI's
    ``input_audio.data``; None for a reference (a URL, a ``file_id``)."""
    if isinstance(ref, dict):
        ref = ref.get("url") or ref.get("file_data") or ref.get("data") or ref.get("image_url")
    if not isinstance(ref, str):
        return None
    if ref.startswith("data:"):
        head, sep, payload = ref.partition(",")
        return payload if sep and head.endswith(";base64") else None
    return None if ref.startswith(("http://", "https://", "file-", "gs://", "s3://")) else ref


class _B64:
    """Random access to the bytes of a base64 string without decoding all of it (byte ``i`` lies in
    characters ``4*(i//3)`` to ``4*(i//3)+4``); ``read`` raises ``ValueError`` on characters outside the
    alphabet (a payload with line breaks is not read)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def read(self, start: int, n: int) -> bytes:
        q = start // 3
        chunk = self.text[4 * q:4 * ((start + n + 2) // 3)]
        try:
            raw = base64.b64decode(chunk, validate=True) if len(chunk) % 4 == 0 else base64.b64decode(
                chunk + "=" * (-len(chunk) % 4), validate=True)
        except binascii.Error as exc:
            raise ValueError(str(exc)) from None
        return raw[start - 3 * q:start - 3 * q + n]


def image_size(data: str | None) -> tuple[int, int] | None:
    """(width, height) in px from a base64 image's header (PNG, JPEG, GIF, WebP; the first frame's canvas), or
    None (no data, another format, a damaged header). Reads a few base64 quartets (a JPEG: a few per marker
    segment before its frame header, at most 64 segments)."""
    if not data:
        return None
    b = _B64(data)
    try:
        head = b.read(0, 30)
        if head.startswith(b"\x89PNG\r\n\x1a\n") and head[12:16] == b"IHDR":
            return _positive(*struct.unpack(">II", head[16:24]))
        if head[:6] in (b"GIF87a", b"GIF89a"):
            return _positive(*struct.unpack("<HH", head[6:10]))
        if head[:4] == b"RIFF" and head[8:12] == b"WEBP" and len(head) == 30:
            kind = head[12:16]
            if kind == b"VP8 ":
                w, h = struct.unpack("<HH", head[26:30])
                return _positive(w & 0x3FFF, h & 0x3FFF)
            if kind == b"VP8L":
                bits = int.from_bytes(head[21:25], "little")
                return _positive((bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1)
            if kind == b"VP8X":
                return _positive(int.from_bytes(head[24:27], "little") + 1, int.from_bytes(head[27:30], "little") + 1)
            return None
        if head[:2] == b"\xff\xd8":
            pos = 2
            for _ in range(64):
                seg = b.read(pos, 9)
                if len(seg) < 4 or seg[0] != 0xFF:
                    return None
                if seg[1] in _SOF:
                    return _positive(*reversed(struct.unpack(">HH", seg[5:9]))) if len(seg) == 9 else None
                if seg[1] == 0xFF:  # a fill byte
                    pos += 1
                    continue
                pos += 2 if 0xD0 <= seg[1] <= 0xD8 or seg[1] == 0x01 else 2 + struct.unpack(">H", seg[2:4])[0]
    except (ValueError, struct.error):
        return None
    return None


def _positive(w: int, h: int) -> tuple[int, int] | None:
    return (w, h) if w > 0 and h > 0 else None


def _decoded_bytes(data: str) -> int:
    """Bytes a base64 payload decodes to (from its length and padding)."""
    return len(data) // 4 * 3 - data[-2:].count("=")


def audio_seconds(data: str | None, fmt: object) -> float | None:
    """An upper bound of a base64 audio part's seconds: a WAV's (``fmt`` ``"wav"`` or a RIFF/WAVE header) data
    bytes / (sample rate x block size) from its header; any other format its bytes / ``MIN_AUDIO_BYTES_PER_S``.
    None without data or with a damaged WAV header."""
    if not data:
        return None
    size = _decoded_bytes(data)
    b = _B64(data)
    try:
        head = b.read(0, 12)
        if head[:4] != b"RIFF" or head[8:12] != b"WAVE":
            return None if fmt == "wav" else size / MIN_AUDIO_BYTES_PER_S
        pos, rate = 12, 0
        for _ in range(16):  # chunks before "data": fmt, LIST, fact, ...
            tag, length = struct.unpack("<4sI", b.read(pos, 8))
            if tag == b"fmt ":
                _, _, sample_rate, _, block = struct.unpack("<HHIIH", b.read(pos + 8, 14))
                rate = sample_rate * block
            elif tag == b"data":
                return min(length, size - pos - 8) / rate if rate > 0 else None
            pos += 8 + length + (length & 1)
    except (ValueError, struct.error):
        return None
    return None


def file_size(data: str | None, budget: InflateBudget | None = None) -> tuple[int | None, bool]:
    """A base64 file's measure: (pages, True) for a PDF: the largest ``/Count`` in it or in its compressed object
    streams (a page tree's root counts every page; an outline's or an older revision's may count more: an
    overcount), None when there is none or an object stream cannot be read whole within what is ``left`` of
    ``budget`` (the request's ``InflateBudget``, which this takes what it inflates from; None: a budget of its own,
    ``MAX_INFLATED``) (it may hold the root: an encrypted PDF, another filter); (bytes, False) for another file;
    (None, False) without data or with data that is not base64."""
    if not data:
        return None, False
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return None, False
    if b"%PDF-" not in raw[:1024]:  # a PDF's header is in its first 1,024 bytes
        return len(raw), False
    counts = [int(m[1]) for m in _COUNT.finditer(raw)]
    budget = InflateBudget() if budget is None else budget
    pos = 0
    while (m := _OBJSTM.search(raw, pos)) is not None:  # from the last stream's end: each byte scanned once
        start = raw.find(b"stream", m.end())
        end = raw.find(b"endstream", start)
        if start < 0 or end < 0:
            return None, True
        obj, pos = max(raw.rfind(b"obj", pos, m.start()), pos), end + 9
        if b"/Filter" not in raw[obj:start]:
            continue  # stored as it is: its /Count is read with the file's
        if budget.left <= 0:
            return None, True
        start += 6 + (2 if raw[start + 6:start + 8] == b"\r\n" else 1)
        inflate = zlib.decompressobj()
        try:
            inflated = inflate.decompress(raw[start:end], budget.left)
        except zlib.error:  # another filter, or encrypted
            return None, True
        budget.left -= len(inflated)
        if inflate.unconsumed_tail or budget.left <= 0 and not inflate.eof:
            return None, True
        counts += (int(c[1]) for c in _COUNT.finditer(inflated))
    return (max(counts) if counts else None), True
