"""Helpers of the dashboard's browser tests: finding Chromium, a real service with real workers
(started by the service suite's own helpers), numbered screenshots, pages that record their
requests and errors."""

from __future__ import annotations

import os
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.service.svchelp import ADMIN_TOKEN, Proc, api_client, start_server, start_worker

HERE = Path(__file__).resolve().parent
ARTIFACTS = Path(os.environ.get("PARETOPLAN_WEB_ARTIFACTS") or HERE / "artifacts")
VIEWPORT = {"width": 1400, "height": 1000}
def wait_for(page, expression: str, arg: object = None, timeout: float = 30_000, polling: object = None) -> None:
    """`page.wait_for_function` that keeps within the dashboard's Content-Security-Policy: Playwright
    polls a predicate with `eval` inside the page, which the CSP (no 'unsafe-eval') refuses, so the
    tests would have to switch the policy off; each poll here is one `page.evaluate`, which the
    DevTools protocol runs without eval. `polling` is accepted and ignored (every 50 ms)."""
    deadline = time.monotonic() + timeout / 1000
    while not page.evaluate(expression, arg):
        if time.monotonic() > deadline:
            raise TimeoutError(f"not true within {timeout / 1000:.0f} s: {expression}")
        page.wait_for_timeout(50)


NO_CHROMIUM = ("no Chromium at /usr/bin/chromium: the dashboard's browser tests need Debian's chromium "
               "(apt-get install -y chromium) or PARETOPLAN_CHROMIUM=/path/to/chromium")


def chromium_path() -> str | None:
    for candidate in (os.environ.get("PARETOPLAN_CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium"),
                      shutil.which("chromium-browser")):
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def launch_chromium(playwright):
    return playwright.chromium.launch(executable_path=chromium_path(), args=["--no-sandbox"])


@dataclass
class Service:
    """`paretoplan serve` on a fresh SQLite database, with worker processes beside it."""

    url: str
    db_url: str
    server: Proc
    workers: list[Proc] = field(default_factory=list)

    def client(self) -> httpx.Client:
        return api_client(self.url, timeout=60)


def start_service(tmp: Path, *, workers: tuple[str, ...] = ("search", "run")) -> Service:
    """One worker per entry of `workers` (its kinds: "search", "run" or "search,run")."""
    tmp.mkdir(parents=True, exist_ok=True)
    db_url = f"sqlite:///{tmp}/web.sqlite"
    server = start_server(db_url, tmp)
    svc = Service(server.url, db_url, server)
    try:
        for kinds in workers:
            svc.workers.append(start_worker(server.url, f"web-{kinds.replace(',', '-')}", tmp, kinds=kinds))
    except BaseException:
        stop_service(svc)
        raise
    return svc


def stop_service(svc: Service) -> None:
    for w in svc.workers:
        w.stop()
    svc.server.stop()


class Shots:
    """Numbered screenshots of one test's steps."""

    def __init__(self, name: str) -> None:
        self.dir = ARTIFACTS / re.sub(r"[^\w.-]+", "_", name)
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.n = 0

    def __call__(self, page, step: str, **kwargs) -> Path:
        self.n += 1
        path = self.dir / f"{self.n:02d}-{step}.png"
        page.screenshot(path=str(path), **kwargs)
        return path


class Page:
    """A fresh browser context and page on a base URL, recording every request and page error."""

    def __init__(self, browser, base_url: str, *, logged_in: bool = True) -> None:
        self.context = browser.new_context(viewport=VIEWPORT, base_url=base_url)
        if logged_in:  # as the login link leaves it: the token in an HttpOnly, SameSite=Strict cookie
            self.context.add_cookies([{"name": "paretoplan_token", "value": ADMIN_TOKEN, "url": base_url,
                                       "httpOnly": True, "sameSite": "Strict"}])
        self.page = self.context.new_page()
        self.page.set_default_timeout(60_000)
        self.requests: list[str] = []
        self.errors: list[str] = []
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("console", self._console)

    def _console(self, message) -> None:
        # a 4xx answer the page shows to its user is logged as "Failed to load resource": not an error of the page
        if message.type == "error" and not message.text.startswith("Failed to load resource"):
            self.errors.append(f"console: {message.text}")

    def close(self) -> None:
        self.context.close()
