"""The dashboard's hook into the service: `mount(app)` serves the page at `/` and its assets.

`service.app.create_app` calls `mount(app)` when this module offers it. Everything the page needs
is served from here, nothing from a CDN: the HTML, CSS and JavaScript modules under `web/static/`
as they are (no build step), and plotly.js as Plotly's own *basic* distribution
(`web/static/vendor/plotly-basic.min.js`, npm `plotly.js-basic-dist-min` 4.1.1, MIT, the same
plotly.js version as the `plotly` Python package's full bundle). The chart draws only scatter traces, lines
and annotations, which the basic bundle holds; at 1.2 MB instead of 4.8 MB the browser compiles it
in a quarter of the time, which is most of a cold page load (bench/dashboard_render.py).
"""

from __future__ import annotations

from pathlib import Path

STATIC = Path(__file__).resolve().parent / "static"
PLOTLY_URL = "/static/vendor/plotly-basic.min.js"
NO_CACHE = {"Cache-Control": "no-cache"}  # revalidate (ETag): a new version of the page shows at once
VENDOR_CACHE = {"Cache-Control": "public, max-age=86400"}  # changes only with a release: a day, then ETag


def mount(app) -> None:
    from fastapi.responses import FileResponse
    from fastapi.staticfiles import StaticFiles

    index = STATIC / "index.html"

    @app.get("/", include_in_schema=False)
    def dashboard() -> FileResponse:
        return FileResponse(index, media_type="text/html", headers=NO_CACHE)

    class Static(StaticFiles):
        def file_response(self, full_path, *args, **kwargs):
            response = super().file_response(full_path, *args, **kwargs)
            response.headers.update(VENDOR_CACHE if "/vendor/" in str(full_path) else NO_CACHE)
            return response

    app.mount("/static", Static(directory=STATIC), name="static")
