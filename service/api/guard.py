"""What every request must pass before any route sees it: its Host, its Origin, its content type.

- Host: a page on another site can make the browser send requests to this service under the
  attacker's domain name once DNS points that name at 127.0.0.1 (DNS rebinding); the service
  answers only Host names it is known by (`allowed_hosts`; by default the loopback names when it
  listens on loopback), 400 otherwise.
- Origin: a state change (POST, PUT, PATCH, DELETE) that a browser sends from another origin is
  refused (403); requests without Origin (curl, workers) are not browsers' cross-site ones.
- Content type: a state change with a body must be `application/json` (415 otherwise): an HTML
  form can post `text/plain`, `application/x-www-form-urlencoded` or `multipart/form-data` from any
  site without a preflight; JSON it cannot. The upload of a graph file is the one multipart route,
  and its Origin check and token stand in for the preflight.
- Token: an /api/ request (but /api/health) is authenticated here, before its body is read, so a
  caller without a valid token costs no parsing (401); the route's dependency checks the scope.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from fastapi import HTTPException, Request
from fastapi.responses import JSONResponse
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as SQLTimeoutError
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Receive, Scope, Send

from service.api.auth import Authenticator, is_worker_route

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
STATE_CHANGES = {"POST", "PUT", "PATCH", "DELETE"}
MULTIPART_ROUTES = ("/api/jobs/upload",)


def is_loopback(host: str) -> bool:
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def default_allowed_hosts(bind_host: str) -> list[str]:
    """Loopback names for a loopback bind (what DNS rebinding attacks); any name otherwise (a
    service behind a published port is reached by names it cannot know: set allowed_hosts)."""
    return [*LOOPBACK_NAMES, bind_host] if is_loopback(bind_host) else ["*"]


def host_name(value: str) -> str:
    """'example.org:8000' -> 'example.org'; '[::1]:8000' -> '::1'."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1:value.find("]")] if "]" in value else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


class GuardMiddleware:
    def __init__(self, app: ASGIApp, allowed_hosts: list[str], auth: Authenticator) -> None:
        self.app = app
        self.auth = auth
        self.any_host = "*" in allowed_hosts
        self.hosts = {host_name(h) for h in allowed_hosts if h != "*"}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        host = headers.get("host", "")
        if not self.any_host and host_name(host) not in self.hosts:
            await _refuse(scope, send, 400, f"Host {host!r} is not one this service answers to (allowed_hosts)")
            return
        method = scope.get("method", "GET")
        if method in STATE_CHANGES:
            origin = headers.get("origin")
            if origin is not None and origin != "null" and urlsplit(origin).netloc.lower() != host.lower():
                await _refuse(scope, send, 403, f"cross-origin request from {origin!r} refused")
                return
            if origin == "null" or headers.get("sec-fetch-site") == "cross-site":
                await _refuse(scope, send, 403, "cross-site request refused")
                return
            path: str = scope.get("path", "")
            if path.startswith("/api/"):
                problem = _content_type_problem(headers, path)
                if problem is not None:
                    await _refuse(scope, send, 415, problem)
                    return
        path = scope.get("path", "")
        if path.startswith("/api/") and path != "/api/health":
            request = Request(scope)
            try:
                who = await run_in_threadpool(self.auth.principal, request, worker_route=is_worker_route(path))
            except HTTPException as e:
                await _refuse(scope, send, e.status_code, str(e.detail), dict(e.headers or {}))
                return
            except (OperationalError, InterfaceError, SQLTimeoutError):
                await _refuse(scope, send, 503, "the database is unavailable or busy; try again", {"Retry-After": "1"})
                return
            if who is None:
                detail = ("authentication required: send 'Authorization: Bearer <token>'"
                          + (" with the worker token" if is_worker_route(path) else
                             " (paretoplan token create) or log in with the link paretoplan serve prints"))
                await _refuse(scope, send, 401, detail, {"WWW-Authenticate": 'Bearer realm="paretoplan"'})
                return
            scope.setdefault("state", {})["principal"] = who
        await self.app(scope, receive, send)


def _content_type_problem(headers: dict[str, str], path: str) -> str | None:
    kind = headers.get("content-type", "").split(";", 1)[0].strip().lower()
    has_body = headers.get("content-length", "0") not in ("", "0") or "transfer-encoding" in headers
    if not kind and not has_body:
        return None  # a POST with no body (launch with the defaults) carries nothing to forge
    if kind == "application/json":
        return None
    if kind == "multipart/form-data" and path in MULTIPART_ROUTES:
        return None
    return f"Content-Type {kind or '(none)'!r} is not accepted: send application/json"


async def _refuse(scope: Scope, send: Send, status: int, message: str, headers: dict[str, str] | None = None) -> None:
    async def nothing():
        return {"type": "http.disconnect"}

    await JSONResponse({"detail": message}, status_code=status, headers=headers)(scope, nothing, send)
