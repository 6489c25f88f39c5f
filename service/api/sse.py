"""Server-sent events from the progress log (FastAPI's own `fastapi.sse`).

The stream polls the database (in the threadpool, never blocking the loop), so it works the
same with several API processes; each event carries its id, and a client that reconnects with
`Last-Event-ID` continues where it left off. The stream ends with an `end` event once the thing
watched is done or failed, or after `sse_max_seconds` (the client then reconnects).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

from fastapi import HTTPException, Request
from fastapi.sse import ServerSentEvent
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from service.crud import events
from service.db import Database
from service.models import DONE, FAILED, Event
from service.schemas import EventOut
from service.settings import Settings

IDLE_POLL_MAX_SECONDS = 2.0  # a stream with no news polls ever less often, up to this (idle clients cost ~nothing)


def open_streams(request: Request) -> int:
    return int(getattr(request.app.state, "sse_clients", 0))


async def stream_slot(request: Request) -> None:
    """A dependency of the event-stream routes: 503 when `max_sse_clients` streams are open."""
    settings: Settings = request.app.state.settings
    if open_streams(request) >= settings.max_sse_clients:
        raise HTTPException(503, f"{settings.max_sse_clients} event streams are open, the most this service keeps; "
                                 "try again later", headers={"Retry-After": "5"})


def _none(_s: Session) -> list[int]:
    return []


def event_out(e: Event) -> EventOut:
    return EventOut(id=e.id, kind=e.kind, stage=e.stage, fraction=e.fraction, message=e.message,
                    search_id=e.search_id, job_id=e.job_id, run_id=e.run_id, created_at=e.created_at)


async def stream(request: Request, db: Database, settings: Settings, *, after: int,
                 status: Callable[[Session], str], search_ids: Callable[[Session], list[int]] = _none,
                 job_id: int | None = None, run_id: int | None = None) -> AsyncIterator[ServerSentEvent]:
    deadline = time.monotonic() + settings.sse_max_seconds
    limit = 500

    def poll() -> tuple[str, list[EventOut]]:
        with db.session() as s:
            st = status(s)
            evs = events.since(s, after, search_ids=search_ids(s), job_id=job_id, run_id=run_id, limit=limit)
            return st, [event_out(e) for e in evs]

    state = request.app.state
    state.sse_clients = open_streams(request) + 1
    wait = settings.sse_poll_seconds
    try:
        while True:
            st, evs = await run_in_threadpool(poll)
            for e in evs:
                after = e.id
                yield ServerSentEvent(data=e.model_dump(mode="json"), event=e.kind, id=str(e.id))
            if st in (DONE, FAILED) and len(evs) < limit:
                yield ServerSentEvent(data={"status": st}, event="end")
                return
            if time.monotonic() > deadline or await request.is_disconnected():
                return
            # news: look again soon; none: back off, so hundreds of idle streams cost little
            wait = settings.sse_poll_seconds if evs else min(wait * 1.5, max(IDLE_POLL_MAX_SECONDS,
                                                                            settings.sse_poll_seconds))
            await asyncio.sleep(wait)
    finally:
        state.sse_clients = open_streams(request) - 1
