"""Errors as JSON `{"detail": message}`, strict JSON bodies, the body size limit, gzip bodies.

- every error: a status and one readable sentence in `detail` (422 also lists `errors`);
- request JSON must be JSON: NaN and Infinity are refused (and `\\u0000`, which PostgreSQL text
  cannot hold), 422;
- a body over `max_body_bytes` is refused with 413 before it is read when it says its length,
  and as soon as it grows past the limit when it is chunked;
- `Content-Encoding: gzip` bodies (workers send their reports so) are inflated, up to
  `max_inflated_bytes` (413 beyond: no zip bombs).
"""

from __future__ import annotations

import json
import logging
import math
import re
import zlib
from collections.abc import Callable
from typing import Any

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from sqlalchemy.exc import DataError, DBAPIError, InterfaceError, OperationalError, StatementError
from sqlalchemy.exc import TimeoutError as SQLTimeoutError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from search import InputError
from service.crud.errors import Conflict, NotFound

log = logging.getLogger("paretoplan.service")


def _reject_constant(name: str):
    raise json.JSONDecodeError(f"{name} is not valid JSON", name, 0)


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):  # 1e999: valid JSON, but no database column or JSON answer holds it
        raise json.JSONDecodeError(f"number {text} is out of range", text, 0)
    return value


# a UTF-16 surrogate written as an escape, or as the bytes UTF-8 forbids (json.loads takes them)
_MAYBE_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]")


def _lone_surrogate(obj: Any) -> str | None:
    """The first string (key or value) holding a lone surrogate: UTF-8 cannot encode it, so
    PostgreSQL cannot store it and no answer holding it can be written. Iterative: deep JSON is
    bounded by the body size, not by the stack."""
    stack = [obj]
    while stack:
        x = stack.pop()
        if isinstance(x, str):
            try:
                x.encode("utf-8")
            except UnicodeEncodeError:
                return x
        elif isinstance(x, dict):
            stack.extend(x.keys())
            stack.extend(x.values())
        elif isinstance(x, list):
            stack.extend(x)
    return None


def strict_loads(body: bytes | str):
    """json.loads, refusing what JSON columns and answers cannot hold: NaN, Infinity, 1e999, \\u0000,
    lone surrogates (\\udfff)."""
    raw = body.encode("utf-8", "surrogatepass") if isinstance(body, str) else body
    if b"\\u0000" in raw:
        raise json.JSONDecodeError("NUL characters (\\u0000) are not accepted", "", raw.find(b"\\u0000"))
    data = json.loads(raw, parse_constant=_reject_constant, parse_float=_finite_float)
    if _MAYBE_SURROGATE.search(raw) and (bad := _lone_surrogate(data)) is not None:
        where = raw.find(b"\\u")
        raise json.JSONDecodeError(f"a lone UTF-16 surrogate in the string {bad.encode('utf-8', 'backslashreplace')[:60]!r}"
                                   " is not text", "", max(where, 0))
    return data


OFF_LOOP_BYTES = 64 * 1024  # bodies larger than this are parsed in a worker thread, not on the event loop


class StrictJSONRequest(Request):
    async def json(self):
        if not hasattr(self, "_json"):
            body = await self.body()
            self._json = strict_loads(body) if len(body) <= OFF_LOOP_BYTES else await run_in_threadpool(strict_loads, body)
        return self._json


class StrictJSONRoute(APIRoute):
    """The route class of every router: its requests parse JSON strictly."""

    def get_route_handler(self) -> Callable:
        handler = super().get_route_handler()

        async def strict(request: Request) -> Response:
            return await handler(StrictJSONRequest(request.scope, request.receive))

        return strict


def _where(loc) -> str:
    parts = [str(p) for p in loc if p not in ("body",)]
    return ".".join(parts)


def _message(err: dict) -> str:
    where = _where(err.get("loc", ()))
    msg = err.get("msg", "invalid")
    ctx = err.get("ctx") or {}
    if err.get("type") == "json_invalid" and ctx.get("error"):
        msg = f"{msg}: {ctx['error']}"
        where = f"body at character {where}" if where else "body"
    elif err.get("type") == "missing":
        msg = "field required"
    return f"{where}: {msg}" if where else msg


async def validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
    errors = exc.errors()
    first = _message(errors[0]) if errors else "invalid request"
    more = f" (and {len(errors) - 1} more problems)" if len(errors) > 1 else ""
    slim = [{"loc": [str(x) for x in e.get("loc", ())], "msg": e.get("msg", ""), "type": e.get("type", "")}
            for e in errors[:20]]
    return JSONResponse({"detail": first + more, "errors": slim}, status_code=422)


async def input_error(_request: Request, exc: InputError) -> JSONResponse:
    field = getattr(exc, "field", None)  # service.crud.errors.FieldError: which field it concerns
    if field is not None:
        return JSONResponse({"detail": str(exc), "errors": [{"loc": ["body", field], "msg": str(exc),
                                                              "type": "value_error"}]}, status_code=422)
    return JSONResponse({"detail": str(exc)}, status_code=422)


async def not_found(_request: Request, exc: NotFound) -> JSONResponse:
    return JSONResponse({"detail": str(exc.args[0]) if exc.args else "not found"}, status_code=404)


async def conflict(_request: Request, exc: Conflict) -> JSONResponse:
    return JSONResponse({"detail": str(exc)}, status_code=409)


async def http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
    detail = exc.detail if isinstance(exc.detail, str) else json.dumps(exc.detail)
    return JSONResponse({"detail": detail}, status_code=exc.status_code, headers=getattr(exc, "headers", None))


async def database_busy(_request: Request, exc: Exception) -> JSONResponse:
    """Unreachable, timed out, locked, pool exhausted: the request may well work in a moment."""
    log.warning("database error: %s", exc)
    return JSONResponse({"detail": "the database is unavailable or busy; try again"}, status_code=503,
                        headers={"Retry-After": "1"})


async def database_refused(_request: Request, exc: Exception) -> JSONResponse:
    """A value the database cannot hold (out of range for its column, not text it can store): the
    request's fault. The transaction was rolled back: nothing of it is stored."""
    log.warning("database refused a value: %s", exc)
    cause = getattr(exc, "orig", None) or exc
    first = str(cause).splitlines()[0][:300] if str(cause) else type(cause).__name__
    return JSONResponse({"detail": f"a value is out of what the database can store: {first}"}, status_code=422)


async def statement_error(request: Request, exc: StatementError) -> JSONResponse:
    """SQLAlchemy wraps what the driver raised: sort it into refused (422) or unavailable (503)."""
    orig = exc.orig
    if isinstance(orig, (OverflowError, ValueError, UnicodeError)):
        return await database_refused(request, exc)
    if isinstance(exc, DBAPIError) and (exc.connection_invalidated or isinstance(exc, InterfaceError)):
        return await database_busy(request, exc)
    return await unexpected(request, exc)


async def unexpected(_request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error", exc_info=exc)
    return JSONResponse({"detail": f"internal error: {type(exc).__name__}: {exc}"}, status_code=500)


def install(app) -> None:
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(InputError, input_error)
    app.add_exception_handler(NotFound, not_found)
    app.add_exception_handler(Conflict, conflict)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(OperationalError, database_busy)
    app.add_exception_handler(InterfaceError, database_busy)
    app.add_exception_handler(SQLTimeoutError, database_busy)
    app.add_exception_handler(DataError, database_refused)
    app.add_exception_handler(StatementError, statement_error)
    app.add_exception_handler(Exception, unexpected)


class _TooLarge(StarletteHTTPException):
    """Raised from inside `receive`: FastAPI lets HTTP exceptions through its body parsing."""

    def __init__(self, message: str) -> None:
        super().__init__(413, message)
        self.message = message


class BodyLimitMiddleware:
    """413 for bodies over the limit; gzip bodies inflated within a second limit."""

    def __init__(self, app: ASGIApp, max_body_bytes: int, max_inflated_bytes: int) -> None:
        self.app = app
        self.limit = max_body_bytes
        self.inflated_limit = max_inflated_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.lower(): v for k, v in scope.get("headers", [])}
        length = headers.get(b"content-length")
        if length is not None:
            try:
                n = int(length)
            except ValueError:
                n = -1
            if n > self.limit:
                await self._refuse(scope, send, f"request body of {n} bytes is over the limit of {self.limit} bytes")
                return
        encoding = headers.get(b"content-encoding", b"").strip().lower()
        if encoding not in (b"", b"identity", b"gzip"):
            await self._refuse(scope, send, f"Content-Encoding {encoding.decode(errors='replace')!r} is not "
                                            "supported (gzip is)", status=415)
            return
        started = False
        total = 0

        async def limited() -> Message:
            nonlocal total
            message = await receive()
            if message["type"] == "http.request":
                total += len(message.get("body", b""))
                if total > self.limit:
                    raise _TooLarge(f"request body is over the limit of {self.limit} bytes")
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        inner_receive: Receive = limited
        if encoding == b"gzip":
            inner_receive = self._inflating(limited)
        try:
            await self.app(scope, inner_receive, tracking_send)
        except _TooLarge as e:
            if started:
                raise
            await self._refuse(scope, send, e.message)
        except _BadGzip as e:
            if started:
                raise
            await self._refuse(scope, send, e.detail, status=400)

    def _inflating(self, receive: Receive) -> Receive:
        """Read the whole gzip body, inflate it (bounded), hand it on as one message."""
        done = False
        limit = self.inflated_limit

        async def inflated() -> Message:
            nonlocal done
            if done:
                return await receive()
            chunks = []
            while True:
                message = await receive()
                if message["type"] != "http.request":
                    return message
                chunks.append(message.get("body", b""))
                if not message.get("more_body", False):
                    break
            done = True
            out = await run_in_threadpool(_inflate, b"".join(chunks), limit)
            return {"type": "http.request", "body": out, "more_body": False}

        return inflated

    @staticmethod
    async def _refuse(scope: Scope, send: Send, message: str, status: int = 413) -> None:
        response = JSONResponse({"detail": message}, status_code=status, headers={"Connection": "close"})
        await response(scope, _empty_receive, send)


def _inflate(data: bytes, limit: int) -> bytes:
    """gzip-inflate `data` (in a worker thread), stopping as soon as the output passes `limit`:
    a bomb costs at most `limit` bytes of memory and the time to inflate them, never the loop."""
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = d.decompress(data, limit + 1)
    except zlib.error as e:
        raise _BadGzip(f"body is not valid gzip: {e}") from None
    if len(out) > limit or d.unconsumed_tail:
        raise _TooLarge(f"gzip body inflates to over the limit of {limit} bytes")
    if not d.eof:
        raise _BadGzip("body is not valid gzip: it ends before its end")
    return out


class _BadGzip(StarletteHTTPException):
    def __init__(self, message: str) -> None:
        super().__init__(400, message)


async def _empty_receive() -> Message:
    return {"type": "http.disconnect"}
