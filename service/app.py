"""The app factory: `create_app(settings)` migrates the database and wires the routers.

`/` belongs to the dashboard: when the `web` package offers a hook `mount(app)` (in `web/__init__.py`
or `web/app.py`), it is called; until then `/` is a small page pointing at /docs.
"""

from __future__ import annotations

import importlib
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.responses import HTMLResponse

from service.api import errors
from service.api.routes import catalog, estimate, jobs, profiles, runs, strategies, tasks
from service.db import Database
from service.models import Clock, utcnow
from service.settings import Settings

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

    app = FastAPI(title="paretoplan", version="0.1.0", lifespan=lifespan,
                  description="Pareto frontiers of parallel training strategies: submit jobs, follow their "
                              "searches, read frontiers, launch and resize runs. Errors are JSON "
                              "`{\"detail\": message}`.")
    app.state.settings = settings
    app.state.db = db
    app.state.clock = clock
    errors.install(app)
    app.add_middleware(errors.BodyLimitMiddleware, max_body_bytes=settings.max_body_bytes,
                       max_inflated_bytes=settings.max_inflated_bytes)
    for r in (jobs, strategies, runs, profiles, catalog, tasks, estimate):
        app.include_router(r.router)

    @app.get("/api/health", tags=["service"], summary="Liveness and the database in use")
    def health() -> dict:
        with db.session() as s:
            s.connection().exec_driver_sql("SELECT 1")
        return {"ok": True, "database": db.dialect}

    hook = _web_hook()
    if hook is not None:
        hook(app)
    else:
        @app.get("/", response_class=HTMLResponse, include_in_schema=False)
        def index() -> str:
            return PLACEHOLDER

    return app
