"""Fixtures of the dashboard's browser tests: a real `paretoplan serve` (uvicorn, SQLite in a temp
directory) with real worker processes (one for searches, one for runs), and Debian's Chromium
driven by Playwright for Python.

Chromium: /usr/bin/chromium (`apt-get install -y chromium`), or PARETOPLAN_CHROMIUM; without one
the tests are skipped, saying so (with PARETOPLAN_REQUIRE_BROWSER=1, as in CI, they fail instead).
Screenshots of every step go to tests/web/artifacts/<test>/ (ignored by git), or under
PARETOPLAN_WEB_ARTIFACTS.
"""

from __future__ import annotations

import os

import pytest

from tests.web.webhelp import NO_CHROMIUM, Page, Shots, chromium_path, launch_chromium, start_service, stop_service


@pytest.fixture(scope="session")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install -e '.[test]')")
    if chromium_path() is None:
        if os.environ.get("PARETOPLAN_REQUIRE_BROWSER") == "1":  # CI: a missing browser is a failure
            pytest.fail(NO_CHROMIUM)
        pytest.skip(NO_CHROMIUM)
    with sync_api.sync_playwright() as p:
        b = launch_chromium(p)
        yield b
        b.close()


@pytest.fixture(scope="session")
def service(browser, tmp_path_factory):
    svc = start_service(tmp_path_factory.mktemp("web-service"))
    yield svc
    stop_service(svc)


@pytest.fixture
def http(service):
    with service.client() as c:
        yield c


@pytest.fixture
def shot(request) -> Shots:
    return Shots(request.node.name)


@pytest.fixture
def open_page(browser, shot):
    pages: list[Page] = []

    def make(base_url: str) -> Page:
        p = Page(browser, base_url)
        pages.append(p)
        return p

    yield make
    for p in pages:
        try:
            shot(p.page, "last", full_page=True)
        except Exception:  # noqa: BLE001 - a closed page has nothing to show
            pass
        p.close()


@pytest.fixture
def web(service, open_page) -> Page:
    return open_page(service.url)
