"""Who may call what: API tokens with scopes, checked on every route by a typed dependency.

A token is `ppt_` and 43 url-safe characters (256 random bits). Only its sha256 is stored (table
`api_tokens`), so a copy of the database lets nobody in; a random secret of that length needs no
salt or slow hash. Scopes:

- `read`: GET the jobs, frontiers, strategies, runs, profiles, catalog, event streams;
- `submit`: submit jobs, profiles and estimates, select, launch and resize;
- `admin`: everything a user may do, and the admin endpoints (requeue a task);
- `worker`: the worker protocol (/api/tasks/*, and the gang workers' /api/gangs/*) and nothing
  else. A user token, even an admin's, is refused there, and a worker token is refused everywhere
  else: a stolen worker token cannot read jobs, and no user can post a forged frontier.

A request carries its token as `Authorization: Bearer <token>`; the dashboard's requests carry it
in the HttpOnly, SameSite=Strict cookie that `/login?token=...` sets (the link `paretoplan serve`
prints). Two tokens may come from the settings instead of the table: `admin_token` (read, submit,
admin; `serve` makes one per start when none is set, as Jupyter does) and `worker_token` (worker).
With `auth` off (`serve --no-auth`, refused unless the service listens on loopback only) the user
scopes are granted to every request; the worker protocol still needs a worker token.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Annotated, Literal

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy import select
from sqlalchemy.orm import Session

from service.db import Database
from service.models import ApiToken, utcnow

Scope = Literal["read", "submit", "admin", "worker"]
SCOPES: tuple[Scope, ...] = ("read", "submit", "admin", "worker")
USER_SCOPES: frozenset[str] = frozenset({"read", "submit", "admin"})
COOKIE = "paretoplan_token"
PREFIX = "ppt_"
CACHE_SECONDS = 5.0  # a revoked token stops working within this long in every API process
MAX_TOKEN_CHARS = 200


def new_secret() -> str:
    return PREFIX + secrets.token_urlsafe(32)


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()


def parse_scopes(text: str) -> list[Scope]:
    """'read,submit' -> ['read', 'submit']; ValueError naming what is not a scope."""
    given = [p.strip() for p in text.split(",") if p.strip()]
    bad = [p for p in given if p not in SCOPES]
    if bad or not given:
        raise ValueError(f"scopes are a comma-separated list of {', '.join(SCOPES)}; got {text!r}")
    if "worker" in given and len(set(given)) > 1:
        raise ValueError("a worker token has the worker scope alone (a worker must not read or submit jobs)")
    return [s for s in SCOPES if s in given]


def create_token(s: Session, name: str, scopes: list[Scope], secret: str | None = None) -> tuple[ApiToken, str]:
    """Store a token (a new random secret unless one is given, e.g. from docker-compose's .env);
    the secret is returned once and never stored."""
    secret = secret or new_secret()
    if len(secret) < 24 or len(secret) > MAX_TOKEN_CHARS:
        raise ValueError(f"a token must have 24 to {MAX_TOKEN_CHARS} characters")
    row = ApiToken(name=name[:200], secret_sha256=digest(secret), scopes=",".join(scopes))
    s.add(row)
    s.flush()
    return row, secret


def revoke_token(s: Session, token_id: int) -> bool:
    row = s.get(ApiToken, token_id)
    if row is None or row.revoked_at is not None:
        return False
    row.revoked_at = utcnow()
    return True


@dataclass(frozen=True)
class Principal:
    """Who a request is: the scopes its token grants and where the token came from."""

    scopes: frozenset[str]
    via: Literal["bearer", "cookie", "no-auth"]
    name: str


class Authenticator:
    """Maps a request's token to a Principal: the configured tokens first (constant-time compares),
    then the table, with a short cache so a busy endpoint does not query it on every call."""

    def __init__(self, db: Database, *, enabled: bool, admin_token: str | None, worker_token: str | None) -> None:
        self.db = db
        self.enabled = enabled
        self.admin_token = admin_token
        self.worker_token = worker_token
        self._cache: dict[str, tuple[float, frozenset[str] | None, str]] = {}
        self._lock = threading.Lock()

    def lookup(self, secret: str) -> tuple[frozenset[str] | None, str]:
        for configured, scopes, name in ((self.admin_token, USER_SCOPES, "admin (settings)"),
                                         (self.worker_token, frozenset({"worker"}), "worker (settings)")):
            if configured and hmac.compare_digest(configured.encode("utf-8", "surrogatepass"),
                                                  secret.encode("utf-8", "surrogatepass")):
                return scopes, name
        key = digest(secret)
        now = time.monotonic()
        with self._lock:
            hit = self._cache.get(key)
        if hit is not None and hit[0] > now:
            return hit[1], hit[2]
        with self.db.session() as s:
            row = s.scalars(select(ApiToken).where(ApiToken.secret_sha256 == key)).first()
            found = (frozenset(row.scopes.split(",")), row.name) if row is not None and row.revoked_at is None \
                else (None, "")
        with self._lock:
            if len(self._cache) > 10_000:  # many wrong tokens must not grow it without end
                self._cache.clear()
            self._cache[key] = (now + CACHE_SECONDS, *found)
        return found

    def token_of(self, request: Request, *, cookie: bool) -> tuple[str | None, Literal["bearer", "cookie"]]:
        header = request.headers.get("authorization")
        if header:
            kind, _, value = header.partition(" ")
            if kind.lower() != "bearer" or not value.strip():
                raise HTTPException(401, "Authorization must be 'Bearer <token>'",
                                    headers={"WWW-Authenticate": 'Bearer realm="paretoplan"'})
            return value.strip(), "bearer"
        if cookie:
            kept = request.cookies.get(COOKIE)
            if kept:
                return kept, "cookie"
        return None, "bearer"

    def principal(self, request: Request, *, worker_route: bool) -> Principal | None:
        """The request's principal; None without a token (a user route with auth off grants the user scopes)."""
        secret, via = self.token_of(request, cookie=not worker_route)
        if secret is None:
            if not self.enabled and not worker_route:
                return Principal(USER_SCOPES, "no-auth", "no-auth")
            return None
        if len(secret) > MAX_TOKEN_CHARS:
            raise _unauthorized("the token is not valid")
        scopes, name = self.lookup(secret)
        if scopes is None:
            if not self.enabled and not worker_route and via == "cookie":
                return Principal(USER_SCOPES, "no-auth", "no-auth")  # a stale cookie of an earlier start
            raise _unauthorized("the token is not valid (unknown or revoked)")
        return Principal(scopes, via, name)


def _unauthorized(message: str) -> HTTPException:
    return HTTPException(401, message, headers={"WWW-Authenticate": 'Bearer realm="paretoplan"'})


def authenticator(request: Request) -> Authenticator:
    auth: Authenticator = request.app.state.auth
    return auth


# the scheme in the OpenAPI document (Swagger UI's Authorize button, schemathesis); the header is read above
BEARER = HTTPBearer(auto_error=False, description="an API token: paretoplan token create --scopes ...")


WORKER_PREFIXES = ("/api/tasks/", "/api/gangs/")  # the worker protocol: a single worker's, a gang's


def is_worker_route(path: str) -> bool:
    return path.startswith(WORKER_PREFIXES)


def authorize(who: Principal | None, scope: Scope) -> Principal:
    """`who` if it may use a route needing `scope`; else the 401 or 403 saying why."""
    worker_route = scope == "worker"
    if who is None:
        hint = ("send the worker token (paretoplan worker reads PARETOPLAN_WORKER_TOKEN)" if worker_route else
                "send 'Authorization: Bearer <token>' (paretoplan token create) or log in with the link "
                "paretoplan serve prints")
        raise _unauthorized(f"authentication required: {hint}")
    if worker_route:
        if "worker" not in who.scopes:
            raise HTTPException(403, "the worker protocol takes a worker token, not a user's")
    elif "worker" in who.scopes:
        raise HTTPException(403, "a worker token is for the worker protocol (/api/tasks, /api/gangs) only")
    elif scope not in who.scopes and "admin" not in who.scopes:
        raise HTTPException(403, f"this token lacks the '{scope}' scope")
    return who


def require(scope: Scope):
    """A dependency granting the route to a token with `scope` (or `admin`, for the user scopes)."""
    worker_route = scope == "worker"

    def check(request: Request, _documented: Annotated[HTTPAuthorizationCredentials | None, Depends(BEARER)]
              ) -> Principal:
        who = getattr(request.state, "principal", None)  # GuardMiddleware authenticated it before the body was read
        if who is None:
            who = authenticator(request).principal(request, worker_route=worker_route)
        return authorize(who, scope)

    check.__name__ = f"require_{scope}"
    return check


READ, SUBMIT, ADMIN, WORKER = (Depends(require(s)) for s in ("read", "submit", "admin", "worker"))
Reader = Annotated[Principal, READ]
Submitter = Annotated[Principal, SUBMIT]
Admin = Annotated[Principal, ADMIN]
Worker = Annotated[Principal, WORKER]
