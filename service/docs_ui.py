"""Interactive API docs served by the service itself: ``/docs`` (Swagger UI) and ``/redoc`` (ReDoc),
their JavaScript, CSS and favicon from ``/docs-static/`` — nothing from a CDN, so the pages work on
an air-gapped network (FastAPI's defaults load both from cdn.jsdelivr.net).

The files are those the ``fastapi-offline`` package (MIT) ships in its ``static/`` folder:
``swagger-ui-bundle.js`` and ``swagger-ui.css`` (Swagger UI 5, Apache-2.0, swagger-api/swagger-ui),
``redoc.standalone.js`` (ReDoc 2, MIT, Redocly/redoc) and ``favicon.png``; only the files are
used, the pages are FastAPI's own ``get_swagger_ui_html`` / ``get_redoc_html`` pointed at them (ReDoc
without Google Fonts). ``install_docs(app)`` adds the routes; the app is created with
``docs_url=None, redoc_url=None``.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

STATIC_URL = "/docs-static"
#: The four asset files served under ``STATIC_URL``.
ASSETS = ("swagger-ui-bundle.js", "swagger-ui.css", "redoc.standalone.js", "favicon.png")


def static_dir() -> Path:
    """The folder holding ``ASSETS`` (``fastapi_offline/static``)."""
    return Path(str(files("fastapi_offline") / "static"))


def install_docs(app: FastAPI) -> None:
    """Mount the assets and add ``/docs``, ``/docs/oauth2-redirect`` and ``/redoc`` (none in the schema)."""
    app.mount(STATIC_URL, StaticFiles(directory=static_dir()), name="docs-static")
    title = f"{app.title} API"

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url="/openapi.json", title=title, oauth2_redirect_url="/docs/oauth2-redirect",
                                   swagger_js_url=f"{STATIC_URL}/swagger-ui-bundle.js",
                                   swagger_css_url=f"{STATIC_URL}/swagger-ui.css",
                                   swagger_favicon_url=f"{STATIC_URL}/favicon.png")

    @app.get("/docs/oauth2-redirect", include_in_schema=False)
    async def swagger_ui_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @app.get("/redoc", include_in_schema=False)
    async def redoc() -> HTMLResponse:
        return get_redoc_html(openapi_url="/openapi.json", title=title, redoc_js_url=f"{STATIC_URL}/redoc.standalone.js",
                              redoc_favicon_url=f"{STATIC_URL}/favicon.png", with_google_fonts=False)
