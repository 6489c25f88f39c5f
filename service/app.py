"""The app factory: `create_app(settings)` migrates the database and wires the routers.

`/` belongs to the dashboard: when the `web` package offers a hook `mount(app)` (in `web/__init__.py`
or `web/app.py`), it is called; without the `web` package (a service-only install) `/` is a small page
pointing at /docs.
"""

from __future__ import annotations

import importlib
from contextlib import asynccontextmanager
from pathlib import Path

import fastapi_offline
from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

from service.api import errors, login
from service.api.auth import Authenticator
from service.api.guard import GuardMiddleware
from service.api.routes import admin, catalog, estimate, gangs, jobs, profiles, runs, strategies, tasks
from service.db import Database
from service.models import Clock, utcnow
from service.settings import Settings

# Swagger UI and ReDoc as installed files (the fastapi-offline wheel ships both bundles): FastAPI's
# own /docs loads them from a CDN, which leaves the page blank on a machine without internet.
DOCS_STATIC_DIR = Path(fastapi_offline.__file__).parent / "static"
DOCS_STATIC_URL = "/api-docs-static"
# ReDoc's menu footer loads a logo from cdn.redoc.ly unconditionally; this policy keeps both pages to
# this server, so the browser never tries the network (the logo hides itself when it cannot load).
DOCS_CSP = ("default-src 'self'; script-src 'self' 'unsafe-inline' blob:; worker-src 'self' blob:; "
            "style-src 'self' 'unsafe-inline'; img-src 'self' data:; font-src 'self' data:; connect-src 'self'")

PLACEHOLDER = """<!doctype html><html><head><meta charset="utf-8"><title>paretoplan</title></head>
<body style="font-family: sans-serif; max-width: 40em; margin: 3em auto">
<h1>paretoplan</h1><p>The service is running. The dashboard is not installed yet.</p>
<ul><li><a href="/docs">API documentation (/docs)</a></li><li><a href="/api/jobs">jobs</a></li>
<li><a href="/api/models">models</a></li><li><a href="/api/devices">devices</a></li></ul></body></html>"""


def _web_hook():
    for name in ("web", "web.app"):
        try:
            mod = importlib.import_module(name)
        except ImportError:
            continue
        hook = getattr(mod, "mount", None)
        if callable(hook):
            return hook
    return None


def _own_host_only(page: HTMLResponse) -> HTMLResponse:
    page.headers["Content-Security-Policy"] = DOCS_CSP
    return page


def _mount_docs(app: FastAPI) -> None:
    """/docs (Swagger UI) and /redoc from the installed static files: no request leaves this server."""
    app.mount(DOCS_STATIC_URL, StaticFiles(directory=DOCS_STATIC_DIR), name="api-docs-static")
    openapi_url = app.openapi_url or "/openapi.json"
    oauth2_url = app.swagger_ui_oauth2_redirect_url or "/docs/oauth2-redirect"

    @app.get("/docs", include_in_schema=False)
    def swagger_ui() -> HTMLResponse:
        return _own_host_only(get_swagger_ui_html(openapi_url=openapi_url, title=f"{app.title} - API",
                                   oauth2_redirect_url=oauth2_url,
                                   swagger_js_url=f"{DOCS_STATIC_URL}/swagger-ui-bundle.js",
                                   swagger_css_url=f"{DOCS_STATIC_URL}/swagger-ui.css",
                                   swagger_favicon_url=f"{DOCS_STATIC_URL}/favicon.png"))

    @app.get(oauth2_url, include_in_schema=False)
    def swagger_ui_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @app.get("/redoc", include_in_schema=False)
    def redoc() -> HTMLResponse:
        # with_google_fonts=False: ReDoc's default pulls its fonts from fonts.googleapis.com
        return _own_host_only(get_redoc_html(openapi_url=openapi_url, title=f"{app.title} - API reference",
                              redoc_js_url=f"{DOCS_STATIC_URL}/redoc.standalone.js",
                              redoc_favicon_url=f"{DOCS_STATIC_URL}/favicon.png", with_google_fonts=False))


def create_app(settings: Settings | None = None, *, migrate: bool = True, clock: Clock = utcnow) -> FastAPI:
    """The app on `settings`' database; `clock` is where the queue reads the time (leases, heartbeats)."""
    settings = settings or Settings()
    db = Database(settings.database_url)
    if migrate:
        db.migrate()

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        yield
        db.dispose()

    app = FastAPI(title="paretoplan", version="0.1.0", lifespan=lifespan, docs_url=None, redoc_url=None,
                  description="Pareto frontiers of parallel training strategies: submit jobs, follow their "
                              "searches, read frontiers, launch and resize runs. Errors are JSON "
                              "`{\"detail\": message}`.")
    app.state.settings = settings
    app.state.db = db
    app.state.clock = clock
    app.state.auth = auth = Authenticator(db, enabled=settings.auth, admin_token=settings.admin_token,
                                          worker_token=settings.worker_token)
    errors.install(app)
    app.add_middleware(errors.BodyLimitMiddleware, max_body_bytes=settings.max_body_bytes,
                       max_inflated_bytes=settings.max_inflated_bytes)
    # outermost: Host, Origin, content type and the token are checked before any body is read
    app.add_middleware(GuardMiddleware, allowed_hosts=settings.hosts, auth=auth)
    for r in (jobs, strategies, runs, profiles, catalog, tasks, gangs, estimate, admin):
        app.include_router(r.router)
    login.mount(app)

    @app.get("/api/health", tags=["service"], summary="Liveness and the database in use")
    def health() -> dict:
        with db.session() as s:
            s.connection().exec_driver_sql("SELECT 1")
        return {"ok": True, "database": db.dialect}

    _mount_docs(app)
    hook = _web_hook()
    if hook is not None:
        hook(app)
    else:
        @app.get("/", response_class=HTMLResponse, include_in_schema=False)
        def index() -> str:
            return PLACEHOLDER

    return app
