"""/docs and /redoc load everything from the service itself (no CDN): an air-gapped browser gets the
pages, the scripts, the stylesheet and the favicon from Pointsman, and the OpenAPI document they read."""

import re

from fastapi.testclient import TestClient

from pointsman.service.app import create_app
from pointsman.service.docs_ui import ASSETS, STATIC_URL, static_dir
from pointsman.service.settings import Settings


def test_docs_pages_reference_only_local_assets_and_they_are_served(tmp_path):
    app = create_app(Settings(data_dir=tmp_path, watch_policy=False, watch_fleet=False, scrape_interval_s=0))
    with TestClient(app) as c:
        for page in ("/docs", "/redoc"):
            html = c.get(page)
            assert html.status_code == 200 and html.headers["content-type"].startswith("text/html")
            urls = re.findall(r'(?:src|href)=["\']([^"\']+)["\']', html.text) + re.findall(r"url: ?'([^']+)'", html.text)
            assert urls and not [u for u in urls if u.startswith(("http:", "https:", "//"))], urls
            for url in urls:
                r = c.get(url)
                assert r.status_code == 200 and len(r.content) > 0, url
        assert "swagger-ui-bundle.js" in c.get("/docs").text and "redoc.standalone.js" in c.get("/redoc").text
        assert "fonts.googleapis.com" not in c.get("/redoc").text
        assert c.get("/docs/oauth2-redirect").status_code == 200
        for name in ASSETS:
            r = c.get(f"{STATIC_URL}/{name}")
            assert r.status_code == 200 and r.content == (static_dir() / name).read_bytes()
        assert c.get("/openapi.json").json()["info"]["title"] == "Pointsman"
