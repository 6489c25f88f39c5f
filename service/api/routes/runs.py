"""/api/runs: a launched strategy, and measured vs predicted when it is done."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Header, Request
from fastapi.sse import EventSourceResponse

from service.api import sse
from service.api.deps import DB, Config, RunId
from service.api.errors import StrictJSONRoute
from service.crud import runs
from service.schemas import Error, RunOut

router = APIRouter(prefix="/api/runs", tags=["runs"], route_class=StrictJSONRoute)


@router.get("/{run_id}", response_model=RunOut, responses={404: {"model": Error}},
            summary="A run: status, progress, measured vs predicted")
def get_run(run_id: RunId, db: DB) -> RunOut:
    with db.session() as s:
        return runs.out(s, runs.get(s, run_id))


def _run_exists(run_id: RunId, db: DB) -> int:
    with db.session() as s:
        return runs.get(s, run_id).id


@router.get("/{run_id}/events", response_class=EventSourceResponse, responses={404: {"model": Error}},
            summary="Server-sent events of a run, then `end`")
async def run_events(run_id: RunId, request: Request, db: DB, settings: Config,
                     _exists: Annotated[int, Depends(_run_exists)],
                     last_event_id: Annotated[int | None, Header(ge=0, le=2**62)] = None):
    async for ev in sse.stream(request, db, settings, after=last_event_id or 0, run_id=run_id,
                               status=lambda s: runs.get(s, run_id).status):
        yield ev
