"""uvicorn's httptools protocol with bounded request headers: ``pointsman serve``'s HTTP protocol (``PROTOCOL``).

uvicorn reads a request's line and headers without a size or time limit (its keep-alive timeout covers only the
idle time after a response, and stops at a request's first byte), before the app or its API keys see anything. So a
caller without a key held memory and connections at will: eight connections each sending 100 MB of one unfinished
header took the process from 245 MB to 1,085 MB, and a connection that sent half a request line stayed open for good
(the process's open-file limit is the number of such connections that stop it accepting any).

``LimitedHttpTools`` answers 431 and closes a connection whose request line and headers pass ``MAX_HEADER_BYTES``
before they end (Envoy's default limit is 60 KiB), and closes one whose headers have not ended
``POINTSMAN_BODY_READ_TIMEOUT_S`` after the connection opened or its previous response was sent (the time a body has
after its headers, ``bodies.read_body``; read from the environment once per process, as each worker's app reads it).
"""

from __future__ import annotations

import asyncio
from functools import cache
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from pointsman.service.settings import Settings

#: Most bytes of a request line and its headers (the 431 above it).
MAX_HEADER_BYTES = 64 * 1024
#: What ``pointsman serve`` hands uvicorn as its ``http`` protocol (imported by name in each worker).
PROTOCOL = "pointsman.service.http_protocol:LimitedHttpTools"


@cache
def header_timeout_s() -> float:
    """Seconds a request's headers may take: ``POINTSMAN_BODY_READ_TIMEOUT_S`` (the environment's, read once)."""
    return Settings().body_read_timeout_s


class LimitedHttpTools(HttpToolsProtocol):
    """``HttpToolsProtocol`` with a size (``MAX_HEADER_BYTES``) and time (``header_timeout_s``) limit on each request's
    line and headers (see the module)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_headers = True  # between a request's end (or the connection's start) and the next one's headers' end
        self._header_bytes = 0
        self._header_timer: asyncio.TimerHandle | None = None

    def _arm(self) -> None:
        self._disarm()
        if self._in_headers:
            self._header_timer = self.loop.call_later(header_timeout_s(), self._headers_too_slow)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_too_slow(self) -> None:
        self._header_timer = None
        if self._in_headers and not self.transport.is_closing():
            self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]  # as uvicorn's
        """Start the first request's header clock."""
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        """Stop the header clock."""
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        """Feed the parser; 431 and close once the current request's line and headers pass ``MAX_HEADER_BYTES``."""
        if self._in_headers:
            self._header_bytes += len(data)
        super().data_received(data)
        if self._in_headers and self._header_bytes > MAX_HEADER_BYTES and not self.transport.is_closing():
            msg = f"request line and headers over {MAX_HEADER_BYTES:,} bytes"
            self.transport.write(b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: text/plain; "
                                 b"charset=utf-8\r\nconnection: close\r\ncontent-length: %d\r\n\r\n%s"
                                 % (len(msg), msg.encode()))
            self.transport.close()

    def on_headers_complete(self) -> None:
        """The headers ended: stop their clock."""
        self._in_headers = False
        self._disarm()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        """The request ended: the next one's headers are counted from here (their clock starts with the response)."""
        self._in_headers, self._header_bytes = True, 0
        super().on_message_complete()

    def on_response_complete(self) -> None:
        """The response was sent: the next request's headers have ``header_timeout_s`` from now."""
        super().on_response_complete()
        self._arm()
