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

from fastapi import Request, Response
from fastapi.responses import FileResponse, RedirectResponse

STATIC = Path(__file__).resolve().parent / "static"
PLOTLY_URL = "/static/vendor/plotly-basic.min.js"
NO_CACHE = {"Cache-Control": "no-cache"}  # revalidate (ETag): a new version of the page shows at once
VENDOR_CACHE = {"Cache-Control": "public, max-age=86400"}  # changes only with a release: a day, then ETag


# The page runs only its own scripts and styles, and talks only to this server: markup that got
# into a field it shows could run nothing even if it were inserted as HTML (web/static/js/format.js
# inserts every shown value as text). Plotly sets inline styles, hence 'unsafe-inline' for styles.
def _inline_script_hashes(page: str) -> str:
    """CSP sources for the page's own inline scripts (its early prefetch), by their sha256."""
    import base64
    import hashlib
    import re

    return " ".join(f"'sha256-{base64.b64encode(hashlib.sha256(body.encode()).digest()).decode()}'"
                    for body in re.findall(r"<script>(.*?)</script>", page, flags=re.S))


CSP = ("default-src 'self'; script-src 'self' {hashes}; style-src 'self' 'unsafe-inline'; img-src 'self' data: blob:; "
       "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
SECURITY_HEADERS = {"Content-Security-Policy": CSP.format(hashes=_inline_script_hashes((STATIC / "index.html").read_text())),
                    "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"}


def _logged_in(request) -> bool:
    """Whether the request carries a token of a user (the login cookie, or a bearer header), as the
    service's authenticator judges it (`app.state.auth`; web does not import the service)."""
    auth = getattr(request.app.state, "auth", None)
    if auth is None:
        return True
    try:
        who = auth.principal(request, worker_route=False)
    except Exception:  # noqa: BLE001 - a malformed header or an unreachable database: not logged in
        return False
    return who is not None and "worker" not in who.scopes


def mount(app) -> None:
    from fastapi.staticfiles import StaticFiles

    index = STATIC / "index.html"

    @app.get("/", include_in_schema=False)
    def dashboard(request: Request) -> Response:
        if not _logged_in(request):
            return RedirectResponse("/login", status_code=303)
        return FileResponse(index, media_type="text/html", headers={**NO_CACHE, **SECURITY_HEADERS})

    class Static(StaticFiles):
        def file_response(self, full_path, *args, **kwargs):
            response = super().file_response(full_path, *args, **kwargs)
            response.headers.update(VENDOR_CACHE if "/vendor/" in str(full_path) else NO_CACHE)
            return response

    app.mount("/static", Static(directory=STATIC), name="static")
