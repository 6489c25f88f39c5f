"""/api/runs: a launched strategy, measured vs predicted when it is done, and resizing it while it runs."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Request
from fastapi.responses import JSONResponse
from fastapi.sse import EventSourceResponse
from starlette.concurrency import run_in_threadpool

from service.api import sse
from service.api.auth import READ, SUBMIT
from service.api.deps import DB, Config, RunId
from service.api.errors import StrictJSONRoute
from service.crud import jobs, resizes, runs
from service.schemas import Error, ResizeIn, ResizeOut, RunOut

router = APIRouter(prefix="/api/runs", tags=["runs"], route_class=StrictJSONRoute)


@router.get("/{run_id}", dependencies=[READ], response_model=RunOut, responses={404: {"model": Error}},
            summary="A run: status, progress, measured vs predicted")
def get_run(run_id: RunId, db: DB) -> RunOut:
    with db.session() as s:
        return runs.out(s, runs.get(s, run_id))


def _run_exists(run_id: RunId, db: DB) -> int:
    with db.session() as s:
        return runs.get(s, run_id).id


@router.get("/{run_id}/events", dependencies=[READ], response_class=EventSourceResponse, responses={404: {"model": Error}},
            summary="Server-sent events of a run, then `end`")
async def run_events(run_id: RunId, request: Request, db: DB, settings: Config,
                     _exists: Annotated[int, Depends(_run_exists)], _slot: Annotated[None, Depends(sse.stream_slot)],
                     last_event_id: Annotated[int | None, Header(ge=0, le=2**62)] = None):
    async for ev in sse.stream(request, db, settings, after=last_event_id or 0, run_id=run_id,
                               status=lambda s: runs.get(s, run_id).status):
        yield ev


RESIZE_ERRORS: dict[int | str, dict[str, Any]] = {
    404: {"model": Error}, 409: {"model": Error, "description": "the run is not running"},
    422: {"model": Error, "description": "the device count is invalid for the job, or no plan on it fits"}}


@router.post("/{run_id}/resize", dependencies=[SUBMIT], status_code=202, response_model=ResizeOut, responses=RESIZE_ERRORS,
             summary="Resize a running run: it stops at the next step, saves, and goes on on the new devices")
async def resize_run(run_id: RunId, body: ResizeIn, db: DB) -> JSONResponse:
    """202: the order is recorded; the run's worker carries it out at its next step boundary
    (save, move to the job's plan for `devices`: the fastest within its memory budget, searched
    first when the job's frontier for them is not stored yet; relaunch; load resharded). Follow
    the run (`GET /api/runs/{id}`: `resize` while pending, then a new entry in `segments`)."""

    def record() -> int:
        with db.session() as s:
            job_id = runs.get(s, run_id).job_id
            request = jobs.get(s, job_id, with_request=True).request
        req, devices, memory = resizes.prepare(request, body)
        with db.write_session() as s:
            return runs.request_resize(s, run_id, req, devices, memory).id

    resize_id = await run_in_threadpool(record)

    def answer() -> ResizeOut:
        with db.session() as s:
            return resizes.out(s, resizes.get(s, runs.get(s, run_id).job_id, resize_id))

    out = await run_in_threadpool(answer)
    return JSONResponse(out.model_dump(mode="json"), status_code=202, headers={"Location": f"/api/runs/{run_id}"})
