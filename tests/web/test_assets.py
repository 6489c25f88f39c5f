"""The dashboard's assets are served by the app itself (no browser needed): the page at `/`, its
modules, and plotly.js from the installed plotly package; nothing refers to another host."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

import web.app
from service.app import create_app
from service.settings import Settings
from tests.service.svchelp import AUTH_SETTINGS, TokenAuth

STATIC = Path(web.app.__file__).resolve().parent / "static"


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    db = tmp_path_factory.mktemp("web-assets") / "assets.sqlite"
    settings = Settings(database_url=f"sqlite:///{db}", allowed_hosts=["testserver"], **AUTH_SETTINGS)
    with TestClient(create_app(settings)) as c:
        c.auth = TokenAuth()
        yield c


def test_the_page_is_served_at_the_root_with_its_modules(client):
    r = client.get("/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    page = r.text
    assert "/docs" in page  # the API documentation stays one click away
    refs = re.findall(r'(?:src|href)="(/static/[^"]+)"', page)
    assert "/static/vendor/plotly-basic.min.js" in refs and "/static/js/main.js" in refs
    for ref in refs:
        assert client.get(ref).status_code == 200, ref
    # every module the page imports is there
    for js in (STATIC / "js").glob("*.js"):
        for dep in re.findall(r'from "\./([\w.]+)"', js.read_text()):
            assert (STATIC / "js" / dep).is_file(), f"{js.name} imports missing {dep}"
            content_type = client.get(f"/static/js/{dep}").headers["content-type"]
            assert content_type.startswith(("text/javascript", "application/javascript"))


def test_plotly_is_its_basic_bundle_served_by_the_app(client):
    r = client.get(web.app.PLOTLY_URL)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/javascript")
    assert r.content == (STATIC / "vendor" / "plotly-basic.min.js").read_bytes()
    assert r.content.startswith(b"/**\n* plotly.js (basic - minified) v")
    assert "max-age" in r.headers["cache-control"]  # the vendored file is cached, the page's own are not
    assert client.get("/static/js/main.js").headers["cache-control"] == "no-cache"


def test_no_asset_refers_to_another_host():
    """The page's own files; Plotly's vendored bundle names hosts in code paths the chart never
    takes (MathJax, map tiles): the browser test checks that every request goes to the app."""
    for f in STATIC.rglob("*"):
        if f.is_file() and f.parent.name != "vendor":
            text = f.read_text()
            assert not re.search(r"""(src|href)\s*=\s*["'](https?:)?//""", text), f
            assert not re.search(r"""(import|fetch)\s*\(?\s*["'](https?:)?//""", text), f


def test_the_api_is_untouched_by_the_mount(client):
    assert client.get("/api/health").json()["ok"] is True
    assert client.get("/static/nope.js").status_code == 404
    assert "/" not in client.get("/openapi.json").json()["paths"]


def test_markup_reaches_the_page_only_through_set_html():
    """Every field the page shows is text or goes through format.js's html`...` (which escapes what it
    interpolates): the one assignment of innerHTML is setHtml's, and nothing inserts HTML otherwise."""
    found = []
    for path in sorted((STATIC / "js").glob("*.js")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"\.(innerHTML|outerHTML)\s*=|insertAdjacentHTML|document\.write", line):
                found.append(f"{path.name}:{n}: {line.strip()}")
    assert len(found) == 1, found
    assert found[0].startswith("format.js:") and found[0].endswith("el.innerHTML = markup.text;"), found
