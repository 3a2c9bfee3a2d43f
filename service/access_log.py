"""No secrets in the access log: query-string values are dropped from uvicorn's access lines.

The service reads no query parameter (API keys come from headers only, ``service/auth.py``), so
a query string in a request line is at best noise and at worst a credential a client put in the URL
(``?api_key=sk-...``). ``install()`` adds ``RedactQuery`` to the ``uvicorn.access`` logger: each
line keeps the parameters' names and shows ``[redacted]`` for every value
(``POST /v1/route?api_key=[redacted] HTTP/1.1``). Idempotent; the lifespan calls it at start, after
uvicorn has configured its loggers.
"""

from __future__ import annotations

import logging
from urllib.parse import parse_qsl

ACCESS_LOGGER = "uvicorn.access"
REDACTED = "[redacted]"


def redact_query(path: str) -> str:
    """``path`` with every query value replaced by ``[redacted]`` (names kept, in order); a path
    without ``?`` is returned as is."""
    base, sep, query = path.partition("?")
    if not sep:
        return path
    names = [name for name, _ in parse_qsl(query, keep_blank_values=True)]
    return f"{base}?{'&'.join(f'{name}={REDACTED}' for name in names)}" if names else f"{base}?{REDACTED}"


class RedactQuery(logging.Filter):
    """Rewrites the request path argument of uvicorn's access records (``redact_query``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) >= 3 and isinstance(args[2], str) and "?" in args[2]:
            record.args = (*args[:2], redact_query(args[2]), *args[3:])
        return True


_FILTER = RedactQuery()


def install() -> None:
    """Add the redaction to the ``uvicorn.access`` logger (once)."""
    logging.getLogger(ACCESS_LOGGER).addFilter(_FILTER)
