"""/docs (Swagger UI) and /redoc render from files the server itself serves: with every request to
another host refused, as on a machine without internet, both pages draw the API's operations."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest

pytestmark = pytest.mark.browser


def offline_page(browser, base_url: str):
    """A page whose requests to any other host fail, as they do without a network; returns the
    page and the list of the URLs it tried to reach elsewhere."""
    context = browser.new_context(base_url=base_url)
    page = context.new_page()
    page.set_default_timeout(60_000)
    own = urlsplit(base_url).netloc
    elsewhere: list[str] = []

    def route(r) -> None:
        if urlsplit(r.request.url).netloc == own:
            r.continue_()
        else:
            elsewhere.append(r.request.url)
            r.abort("internetdisconnected")

    page.route("**/*", route)
    return context, page, elsewhere


def test_swagger_ui_renders_without_the_network(browser, service, shot):
    context, page, elsewhere = offline_page(browser, service.url)
    try:
        page.goto("/docs")
        # Swagger UI draws one block per operation once it has fetched /openapi.json and run its bundle
        page.wait_for_selector(".swagger-ui .opblock")
        assert page.locator(".swagger-ui .opblock").count() >= 10
        assert page.get_by_text("/api/jobs/{job_id}/frontier").first.is_visible()
        shot(page, "swagger-offline")
        assert elsewhere == []
    finally:
        context.close()


def test_redoc_renders_without_the_network(browser, service, shot):
    context, page, elsewhere = offline_page(browser, service.url)
    try:
        page.goto("/redoc")
        # ReDoc's menu lists the operations by their summaries once the standalone bundle has run
        page.wait_for_selector("[role=menuitem]")
        assert page.locator("[role=menuitem]").count() >= 10
        shot(page, "redoc-offline")
        assert elsewhere == []  # no CDN, no web fonts
    finally:
        context.close()
