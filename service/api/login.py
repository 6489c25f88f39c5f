"""The dashboard's login: `/login?token=...` (the link `paretoplan serve` prints, as Jupyter does)
checks the token and keeps it in an HttpOnly, SameSite=Strict cookie, so the page's scripts never
see it and no other site's page can send it; `/logout` drops it. `/login` without a token is a
small form to paste one into."""

from __future__ import annotations

import html

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from service.api.auth import COOKIE, USER_SCOPES, authenticator

COOKIE_DAYS = 30
PAGE = """<!doctype html><html><head><meta charset="utf-8"><title>paretoplan: log in</title></head>
<body style="font-family: sans-serif; max-width: 36em; margin: 4em auto">
<h1>paretoplan</h1><p>{message}</p>
<form method="get" action="/login"><label>API token <input name="token" type="password" size="48"
autocomplete="current-password" autofocus></label> <button type="submit">Log in</button></form>
<p style="color:#555">The link <code>paretoplan serve</code> prints logs you in; <code>paretoplan token create
--scopes read,submit</code> makes a token.</p></body></html>"""
CSP = "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'"


def page(message: str, status: int = 200) -> HTMLResponse:
    return HTMLResponse(PAGE.format(message=html.escape(message)), status_code=status,
                        headers={"Content-Security-Policy": CSP, "Cache-Control": "no-store"})


def mount(app: FastAPI) -> None:
    @app.get("/login", include_in_schema=False)
    def login(request: Request, token: str | None = None) -> Response:
        if not token:
            return page("Log in with an API token.")
        auth = authenticator(request)
        try:
            scopes, _ = auth.lookup(token[:200])
        except HTTPException:
            scopes = None
        if scopes is None or not (scopes & USER_SCOPES):
            return page("That token is not valid (unknown, revoked, or a worker's).", status=401)
        response = RedirectResponse("/", status_code=303)
        response.set_cookie(COOKIE, token, max_age=COOKIE_DAYS * 86400, httponly=True, samesite="strict",
                            secure=request.url.scheme == "https", path="/")
        response.headers["Cache-Control"] = "no-store"
        return response

    @app.get("/logout", include_in_schema=False)
    def logout() -> Response:
        response = RedirectResponse("/login", status_code=303)
        response.delete_cookie(COOKIE, path="/")
        return response
