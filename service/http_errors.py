"""Error answers of the decision service, shaped like OpenAI's so a gateway can pass them on.

Every error the service returns is ``{"error": {"message", "type", "param", "code"}}``
(``schemas.ErrorResponse``): ``message`` a complete sentence, ``param`` the offending
field (``messages[0].content``, ``routing.tenat``) or the limit's setting, ``code`` a
short machine-readable code. ``HTTPError`` carries one; ``install_error_handlers(app)``
turns ``HTTPError``, FastAPI's own validation errors and anything unexpected (500,
details only in the log) into that shape. ``ERROR_RESPONSES`` documents them in OpenAPI.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from pointsman.errors import RequestError
from pointsman.service.schemas import ErrorResponse

log = logging.getLogger("pointsman.service")


class HTTPError(Exception):
    """An error answer: HTTP ``status`` and the OpenAI-style error body fields; ``headers``
    are added to the response (``WWW-Authenticate`` on 401)."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers

    def body(self) -> dict[str, object]:
        """The JSON body ``{"error": {...}}``."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        """The JSON response for this error."""
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def unavailable(message: str, code: str) -> HTTPError:
    """A 503 (``type`` ``unavailable``): the service cannot answer now; retrying later may work."""
    return HTTPError(503, message, type="unavailable", code=code)


def invalid(exc: RequestError) -> HTTPError:
    """The 422 (``invalid_value``) for a ``RequestError``: its message, ``param`` its field."""
    return HTTPError(422, exc.message, param=exc.field, code="invalid_value")


def _responses(*codes: int) -> dict[int | str, dict[str, object]]:
    return {c: {"model": ErrorResponse} for c in codes}


#: OpenAPI ``responses`` for the error codes each kind of endpoint can answer.
ERROR_RESPONSES = _responses(400, 401, 403, 408, 413, 422, 503)
#: ``POST /v1/route`` also refuses a request its budgets exclude (429 ``budget_exhausted``).
ROUTE_ERRORS = _responses(400, 401, 403, 408, 413, 422, 429, 503)
AUTH_ERRORS = _responses(401, 403)


_ROUTING_CODES = {404: "not_found", 405: "method_not_allowed"}


def install_error_handlers(app: FastAPI) -> None:
    """Register the handlers that give every error the ``ErrorResponse`` shape."""

    @app.exception_handler(HTTPError)
    async def _http_error(request: Request, exc: HTTPError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(StarletteHTTPException)
    async def _routing_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # Starlette's own answers: 404 (no such path), 405 (wrong method; keeps ``Allow``).
        code = _ROUTING_CODES.get(exc.status_code, "http_error")
        message = {404: f"no such endpoint: {request.url.path}",
                   405: f"{request.method} is not allowed on {request.url.path}"}.get(exc.status_code, str(exc.detail))
        return HTTPError(exc.status_code, message, code=code, headers=dict(exc.headers or {})).response()

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        loc, msg = (tuple(errors[0]["loc"]), str(errors[0]["msg"])) if errors else ((), "invalid request")
        param = ".".join(str(p) for p in loc[1:]) or None
        return HTTPError(422, msg, param=param, code="invalid_value").response()

    @app.exception_handler(Exception)
    async def _internal_error(request: Request, exc: Exception) -> JSONResponse:
        return internal_error(request)


def internal_error(request: Request) -> JSONResponse:
    """The 500 for an unexpected exception while answering ``request`` (logged with its traceback;
    the answer says only that)."""
    log.exception("internal error on %s %s", request.method, request.url.path)
    return HTTPError(500, "internal error; the service log has the details", type="internal_error",
                     code="internal_error").response()
