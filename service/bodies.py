"""Reading request bodies: size-limited, time-limited, strict UTF-8, strict JSON.

``read_json(request, settings)`` reads at most ``settings.max_body_bytes`` bytes (413 beyond it,
naming the limit and the setting ``POINTSMAN_MAX_BODY_BYTES``; checked on ``Content-Length`` and again
while streaming, so a chunked body cannot exceed it; the rest of an oversized body up to 64 MiB
is read and discarded first, so clients that write the whole body before reading see the 413,
not a reset) within ``settings.body_read_timeout_s`` of the request's headers (408 and
``Connection: close`` past it: a client that stalls mid-body holds no connection for longer;
uvicorn has no such timeout of its own), then decodes strict UTF-8 and JSON. A client that
closes the connection mid-body is a 400 ``client_disconnected`` (nobody reads it; not an internal error).
Every failure is an ``HTTPError`` 4xx whose message names the problem (empty body,
byte offset of invalid UTF-8, line and column of malformed JSON, the place of an integer with
more digits than Python converts). ``validate_model``
checks one decoded object against a pydantic model and names the first bad field.

Answers: ``JSONAnswer``, Starlette's ``JSONResponse`` encoded by orjson (the same JSON, a tenth of the CPU);
``json_answer`` builds one from headers given as raw pairs (a decision's answer).
"""

from __future__ import annotations

import asyncio
import json
import math
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import orjson
from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect

from pointsman.errors import RequestError
from pointsman.json_types import JSONObject, JSONValue, json_path
from pointsman.outcome import field_problem, json_object
from pointsman.service.http_errors import HTTPError, invalid
from pointsman.service.settings import Settings

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")


#: How much of an oversized body is read and discarded before its 413 (bytes, the whole body counted).
DISCARD_LIMIT_BYTES = 64 * 1024 * 1024


async def read_body(request: Request, settings: Settings) -> bytes:
    """The raw body, at most ``settings.max_body_bytes`` bytes, read within ``settings.body_read_timeout_s``
    seconds; raises ``HTTPError`` 413 beyond the size (see ``too_large``), 408 past the time (``Connection:
    close``), 400 for a bad Content-Length or a client gone mid-body. Reads the ASGI messages as Starlette's
    ``Request.stream`` does (a body it already read is read from it), without its generator."""
    timeout_s = settings.body_read_timeout_s
    try:
        async with asyncio.timeout(timeout_s):
            return await _read_body(request, settings.max_body_bytes)
    except TimeoutError:
        raise HTTPError(408, f"the request body did not arrive within {timeout_s:g} s of its headers "
                             "(setting POINTSMAN_BODY_READ_TIMEOUT_S)", type="request_timeout",
                        param="body_read_timeout_s", code="body_timeout", headers={"Connection": "close"}) from None
    except ClientDisconnect:
        raise HTTPError(400, "the client closed the connection before its body ended",
                        code="client_disconnected") from None


async def _read_body(request: Request, limit: int) -> bytes:
    declared = expect = None
    for name, value in request.scope["headers"]:  # the first of each, as ``Headers.get``
        if name == b"content-length" and declared is None:
            declared = value.decode("latin-1")
        elif name == b"expect" and expect is None:
            expect = value.decode("latin-1")
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise HTTPError(400, f"Content-Length {declared!r} is not a number", code="bad_content_length") from None
        if size > limit:
            waiting = (expect or "").lower() == "100-continue"  # nothing sent yet: do not ask for it
            if not waiting and size <= DISCARD_LIMIT_BYTES:
                await _discard(request)
            raise too_large(size, limit)
    chunks, size = [], 0
    async for chunk in _Chunks(request):
        size += len(chunk)
        if size > DISCARD_LIMIT_BYTES:
            break
        if size <= limit:
            chunks.append(chunk)
    if size > limit:  # the rest was read and discarded (up to DISCARD_LIMIT_BYTES)
        raise too_large(size, limit, at_least=size > DISCARD_LIMIT_BYTES)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def _discard(request: Request) -> None:
    """Read and drop the body, stopping past ``DISCARD_LIMIT_BYTES``. A client that writes its whole body
    before reading the answer (Python's urllib, ``requests``) then reads the 413: closing with its bytes
    unread would make the kernel reset the connection instead."""
    dropped = 0
    async for chunk in _Chunks(request):
        dropped += len(chunk)
        if dropped > DISCARD_LIMIT_BYTES:
            break


class _Chunks:
    """The body's non-empty chunks, as ``Request.stream`` yields them (then ``b""``). Raises ``ClientDisconnect``
    for ``http.disconnect``. An iterator object, not an async generator: no generator to set up and close per
    body."""

    def __init__(self, request: Request) -> None:
        self.request = request
        self.cached: list[bytes] | None = None if not hasattr(request, "_body") else [b"", request._body]
        if self.cached is None and request._stream_consumed:
            raise RuntimeError("Stream consumed")

    def __aiter__(self) -> _Chunks:
        return self

    async def __anext__(self) -> bytes:
        request = self.request
        if self.cached is not None:  # read already (``Request.body``): what ``Request.stream`` gives
            if not self.cached:
                raise StopAsyncIteration
            return self.cached.pop()
        while not request._stream_consumed:
            message = await request.receive()
            if message["type"] == "http.request":
                body: bytes = message.get("body", b"")
                if not message.get("more_body", False):
                    request._stream_consumed = True
                if body:
                    return body
            elif message["type"] == "http.disconnect":
                request._is_disconnected = True
                raise ClientDisconnect()
        raise StopAsyncIteration



def too_large(size: int, limit: int, at_least: bool = False) -> HTTPError:
    """The 413 error for a body of ``size`` bytes over ``limit``, with ``Connection: close`` (the rest of
    the body, if any, is not read). Before it, ``read_body`` reads and discards the rest of a body of
    up to ``DISCARD_LIMIT_BYTES`` (64 MiB), so every client reads the 413; a client that announced
    ``Expect: 100-continue`` is answered at once, before it sends anything. A larger body is closed on
    unread, and a client still writing it may see a connection reset."""
    return HTTPError(413, f"request body is {'over ' if at_least else ''}{size:,} bytes; the limit is {limit:,} bytes "
                          f"(setting POINTSMAN_MAX_BODY_BYTES)", type="request_too_large", param="max_body_bytes",
                     code="body_too_large", headers={"Connection": "close"})


def decode_json(raw: bytes, expected: str = "a JSON chat request") -> JSONValue:
    """Strict UTF-8 and JSON decoding of a body (``json.loads``' values: orjson's reading when it
    is the same); raises ``HTTPError`` 400 naming the problem (``expected`` completes the message for
    an empty body)."""
    if not raw.strip():
        raise HTTPError(400, f"request body is empty; expected {expected}", code="empty_body")
    try:  # orjson first (about twice as fast); the standard library's reading when it refuses or may differ
        fast: JSONValue = orjson.loads(raw)
    except orjson.JSONDecodeError:
        pass
    else:
        if not _wide_float(fast):
            return fast
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise HTTPError(400, f"request body is not valid UTF-8 (byte 0x{raw[exc.start]:02x} at offset {exc.start})",
                        code="invalid_utf8") from None
    try:
        value: JSONValue = json.loads(text)
        return value
    except json.JSONDecodeError as exc:
        raise HTTPError(400, f"malformed JSON: {exc.msg} at line {exc.lineno} column {exc.colno}",
                        code="malformed_json") from None
    except RecursionError:
        raise HTTPError(400, "malformed JSON: nested too deeply", code="malformed_json") from None
    except ValueError:  # an integer past Python's int-conversion limit (sys.get_int_max_str_digits)
        raise _number_too_long(text) from None


def _wide_float(value: JSONValue) -> bool:
    """Whether ``value`` (orjson's reading) holds a float of magnitude >= 2**63: orjson reads an integer
    past 64 bits as a float, where ``json.loads`` keeps the integer (a float literal that large reads
    the same either way). Walks dicts and lists."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
        elif isinstance(v, float) and not -_WIDE < v < _WIDE:
            return True
    return False


_WIDE = float(2**63)


class _LongInt:
    """An integer literal too long to convert, kept as its digit count to name its place."""

    def __init__(self, literal: str) -> None:
        self.digits = len(literal.lstrip("-"))


def _number_too_long(text: str) -> HTTPError:
    """The 400 naming the first integer of ``text`` (valid JSON) that has more digits than Python
    converts (``sys.get_int_max_str_digits``, 4,300 by default): parsed again with such literals kept
    as ``_LongInt``, then found by a walk. Only called after ``json.loads`` refused it."""
    limit = sys.get_int_max_str_digits()

    def parse_int(literal: str) -> int | _LongInt:
        return _LongInt(literal) if limit and len(literal.lstrip("-")) > limit else int(literal)

    try:
        parsed = json.loads(text, parse_int=parse_int)
    except RecursionError:
        return HTTPError(400, "malformed JSON: nested too deeply", code="malformed_json")
    stack: list[tuple[tuple[int | str, ...], object]] = [((), parsed)]
    while stack:
        loc, value = stack.pop()
        if isinstance(value, _LongInt):
            where = json_path(loc) or "the body"
            return HTTPError(400, f"the integer at {where} has {value.digits:,} digits; numbers may have at most "
                                  f"{limit:,}", param=json_path(loc) or None, code="number_too_long")
        items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
        stack.extend(reversed([((*loc, k), v) for k, v in items]))
    return HTTPError(400, "request body has a number that cannot be read", code="number_too_long")


async def read_json(request: Request, settings: Settings, expected: str = "a JSON chat request") -> JSONValue:
    """``decode_json(await read_body(request, settings))``."""
    return decode_json(await read_body(request, settings), expected)


def validate_model(model: type[M], item: object, prefix: str = "") -> M:
    """``model.model_validate(item)``; raises ``RequestError`` naming the first bad field
    (``prefix`` + its path; ``unknown field`` for extras, ``outcome.field_problem``) or a
    non-object ``item``."""
    try:
        return model.model_validate(json_object(item, prefix))
    except ValidationError as exc:
        field, msg = field_problem(exc.errors(include_url=False)[0], prefix)
        raise RequestError(msg, field=field) from None


async def read_parsed(request: Request, settings: Settings, expected: str,
                      parse: Callable[[JSONValue], T]) -> tuple[JSONValue, T]:
    """``read_json`` then ``parse(body)``; returns (body, parsed). A ``RequestError`` from ``parse``
    becomes the 422 naming its field (``http_errors.invalid``)."""
    body = await read_json(request, settings, expected)
    try:
        return body, parse(body)
    except RequestError as exc:
        raise invalid(exc) from None


class JSONAnswer(JSONResponse):
    """``JSONResponse`` rendered by orjson: compact UTF-8 JSON, as Starlette writes it. What orjson
    does not encode as the standard library would (an integer past 64 bits, a non-string key) is
    rendered by ``JSONResponse`` itself, which also refuses NaN and infinities as before."""

    def render(self, content: Any) -> bytes:
        """The body: ``content`` as JSON bytes."""
        try:
            body = orjson.dumps(content)
        except orjson.JSONEncodeError:
            return super().render(content)
        return super().render(content) if b"null" in body and not _finite(content) else body


#: The content type header ``JSONResponse`` writes.
_JSON_CONTENT_TYPE = (b"content-type", b"application/json")


def json_answer(content: Any, headers: list[tuple[bytes, bytes]]) -> JSONAnswer:
    """``JSONAnswer(content, headers=...)`` (status 200) from headers given as ``Response.raw_headers``
    pairs (lower-case names, latin-1 values: what ``init_headers`` makes of a dict's items; ``headers``
    is extended): the same answer, its content-length and content-type appended as ``init_headers``
    appends them, without building the headers from a mapping (a decision's answer, ``/v1/route``)."""
    answer = JSONAnswer.__new__(JSONAnswer)
    answer.status_code, answer.background = 200, None
    answer.body = body = answer.render(content)
    headers += ((b"content-length", str(len(body)).encode("latin-1")), _JSON_CONTENT_TYPE)
    answer.raw_headers = headers
    return answer


def _finite(content: Any) -> bool:
    """Whether ``content`` holds no NaN or infinite float (orjson writes null for one, where
    ``JSONResponse`` refuses it). Walks dicts, lists and tuples with a stack (no call per value: a decision's
    answer holds a few dozen); the exact types first, their subclasses after."""
    stack = [content]
    pop, extend = stack.pop, stack.extend
    while stack:
        v = pop()
        t = type(v)
        if t is str or t is int or t is bool or v is None:
            continue
        if t is float:
            if v - v != 0.0:  # nan - nan and inf - inf are nan
                return False
        elif t is dict:
            extend(v.values())
        elif t is list or t is tuple:
            extend(v)
        elif isinstance(v, dict):
            extend(v.values())
        elif isinstance(v, list | tuple):
            extend(v)
        elif isinstance(v, float) and not math.isfinite(v):
            return False
    return True


def json_body(schema: JSONObject) -> JSONObject:
    """``openapi_extra`` documenting a required JSON request body with ``schema`` (for routes that
    read their body as bytes, so FastAPI cannot see it)."""
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}
