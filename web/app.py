"""The dashboard's hook into the service: `mount(app)` serves the page at `/` and its assets.

`service.app.create_app` calls `mount(app)` when this module offers it. Everything the page needs
is served from here, nothing from a CDN: the HTML, CSS and JavaScript modules under `web/static/`
as they are (no build step), and plotly.js from the installed `plotly` Python package
(`plotly/package_data/plotly.min.js`), so the dashboard works offline.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

STATIC = Path(__file__).resolve().parent / "static"
PLOTLY_URL = "/static/vendor/plotly.min.js"
NO_CACHE = {"Cache-Control": "no-cache"}  # revalidate (ETag): a new version of the page shows at once


def plotly_js() -> Path | None:
    """plotly.min.js of the installed plotly package (found without importing plotly)."""
    spec = importlib.util.find_spec("plotly")
    for root in (spec.submodule_search_locations or []) if spec else []:
        path = Path(root) / "package_data" / "plotly.min.js"
        if path.is_file():
            return path
    return None


def mount(app) -> None:
    from fastapi.responses import FileResponse, JSONResponse
    from fastapi.staticfiles import StaticFiles

    index = STATIC / "index.html"

    @app.get("/", include_in_schema=False)
    def dashboard() -> FileResponse:
        return FileResponse(index, media_type="text/html", headers=NO_CACHE)

    @app.get(PLOTLY_URL, include_in_schema=False)
    def plotly():
        path = plotly_js()
        if path is None:
            return JSONResponse({"detail": "plotly.min.js not found: install the plotly package"}, status_code=404)
        # the file changes only with the plotly package: cache it for a day, revalidate by ETag after
        return FileResponse(path, media_type="text/javascript", headers={"Cache-Control": "public, max-age=86400"})

    class Static(StaticFiles):
        def file_response(self, *args, **kwargs):
            response = super().file_response(*args, **kwargs)
            response.headers.update(NO_CACHE)
            return response

    app.mount("/static", Static(directory=STATIC), name="static")
