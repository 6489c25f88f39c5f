"""/api/jobs: submit, list, follow, read the frontier, select, launch, resize."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, File, Form, Header, Query, Request, UploadFile
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.sse import EventSourceResponse
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from search import InputError
from service.api import sse
from service.api.auth import READ, SUBMIT
from service.api.deps import DB, Config, JobId, ResizeId
from service.api.errors import StrictJSONRoute, strict_loads
from service.crud import jobs, profiles, resizes, runs
from service.schemas import Error, FrontierOut, JobCreate, JobDetail, JobList, LaunchIn, ResizeIn, ResizeOut, RunOut, SelectIn

router = APIRouter(prefix="/api/jobs", tags=["jobs"], route_class=StrictJSONRoute)
ERRORS: dict[int | str, dict[str, Any]] = {404: {"model": Error}, 409: {"model": Error}, 422: {"model": Error}}


def _submit(db, body: JobCreate) -> JobDetail:
    profile = None
    if body.profile_id is not None:
        with db.session() as s:
            profile = profiles.document(s, body.profile_id)
    prepared = jobs.prepare(body, profile)  # every check before anything is written
    with db.write_session() as s:
        job_id = jobs.create(s, prepared).id
    with db.session() as s:
        return jobs.detail(s, job_id)


@router.post("", dependencies=[SUBMIT], status_code=201, response_model=JobDetail,
             responses={422: {"model": Error}, 413: {"model": Error}},
             summary="Submit a job: its search runs in the background")
def create_job(body: JobCreate, db: DB) -> JobDetail:
    """The smallest body: `{"model": "gpt2-medium", "devices": 8, "device": "h100-80gb", "global_batch": 32}`.
    An identical earlier request is answered from its stored frontier (`cached`: true)."""
    return _submit(db, body)


@router.post("/upload", dependencies=[SUBMIT], status_code=201, response_model=JobDetail, responses={422: {"model": Error}},
             summary="Submit a job whose model is an uploaded OpGraph JSON file")
def upload_job(db: DB, graph: Annotated[UploadFile, File(description="OpGraph JSON (paretoplan search --dump-graph)")],
               request: Annotated[str, Form(description="the rest of the job as JSON, e.g. {\"devices\": 4}")] = "{}"
               ) -> JobDetail:
    try:
        fields = strict_loads(request)
        data = strict_loads(graph.file.read())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InputError(f"not valid JSON: {e}") from None
    if not isinstance(fields, dict):
        raise InputError("request: expected a JSON object")
    try:
        body = JobCreate.model_validate({**fields, "graph": data})
    except ValidationError as e:
        raise RequestValidationError(e.errors(include_url=False, include_context=False)) from None
    return _submit(db, body)


@router.get("", dependencies=[READ], response_model=JobList, summary="List jobs, newest first")
def list_jobs(db: DB, status: Literal["queued", "running", "done", "failed"] | None = None,
              limit: Annotated[int, Query(ge=1, le=1000)] = 100,
              offset: Annotated[int, Query(ge=0, le=2**31 - 1)] = 0) -> JobList:
    with db.session() as s:
        total, items = jobs.listing(s, status, limit, offset)
    return JobList(total=total, items=items)


@router.get("/{job_id}", dependencies=[READ], response_model=JobDetail, responses=ERRORS, summary="A job: status and progress")
def get_job(job_id: JobId, db: DB) -> JobDetail:
    with db.session() as s:
        return jobs.detail(s, job_id)


@router.get("/{job_id}/frontier", dependencies=[READ], response_model=FrontierOut, responses=ERRORS,
            summary="The Pareto points (plans by strategy id) and the baselines")
def get_frontier(job_id: JobId, db: DB,
                 devices: Annotated[int | None, Query(gt=0, le=1_000_000,
                                                      description="another device count the job has a search for: one of "
                                                                  "its device_counts, or a resize's")] = None,
                 plans: Annotated[bool, Query(description="inline every point's full Plan, as "
                                                          "`paretoplan search --json` does")] = False,
                 ) -> FrontierOut:
    with db.session() as s:
        return jobs.frontier(s, job_id, devices, plans=plans)


def _job_exists(job_id: JobId, db: DB) -> int:
    with db.session() as s:
        return jobs.get(s, job_id).search_id


@router.get("/{job_id}/events", dependencies=[READ], response_class=EventSourceResponse, responses=ERRORS,
            summary="Server-sent events: the search's progress, then `end`")
async def job_events(job_id: JobId, request: Request, db: DB, settings: Config,
                     search_id: Annotated[int, Depends(_job_exists)], _slot: Annotated[None, Depends(sse.stream_slot)],
                     last_event_id: Annotated[int | None, Header(ge=0, le=2**62)] = None):
    from service.crud import searches

    async for ev in sse.stream(request, db, settings, after=last_event_id or 0, job_id=job_id,
                               status=lambda s: searches.get(s, search_id).status,
                               search_ids=lambda s: [search_id]):
        yield ev


@router.post("/{job_id}/select", dependencies=[SUBMIT], response_model=JobDetail, responses=ERRORS,
             summary="Select a strategy of the job's frontier")
def select(job_id: JobId, body: SelectIn, db: DB) -> JobDetail:
    with db.write_session() as s:
        jobs.select_strategy(s, job_id, body.strategy_id)
    with db.session() as s:
        return jobs.detail(s, job_id)


@router.post("/{job_id}/launch", dependencies=[SUBMIT], status_code=201, response_model=RunOut, responses=ERRORS,
             summary="Queue a run of a strategy for the workers")
def launch(job_id: JobId, db: DB, body: LaunchIn | None = None) -> RunOut:
    body = body or LaunchIn()
    with db.write_session() as s:
        run_id = runs.launch(s, job_id, body.strategy_id, body.steps, body.checkpoint_every).id
    with db.session() as s:
        return runs.out(s, runs.get(s, run_id))


@router.get("/{job_id}/runs", dependencies=[READ], response_model=list[RunOut], responses=ERRORS, summary="The job's runs")
def job_runs(job_id: JobId, db: DB) -> list[RunOut]:
    with db.session() as s:
        return [runs.out(s, r) for r in runs.for_job(s, job_id)]


async def _resize_answer(db, resize_id: int, job_id: int, wait: float) -> JSONResponse:
    deadline = time.monotonic() + wait

    def look():
        with db.session() as s:
            r = resizes.get(s, job_id, resize_id)
            return resizes.is_settled(s, r), r

    while True:
        settled, r = await run_in_threadpool(look)
        if settled or time.monotonic() >= deadline:
            break
        await asyncio.sleep(0.2)

    def answer():
        with db.session() as s:
            return resizes.out(s, resizes.get(s, job_id, resize_id))

    out = await run_in_threadpool(answer)
    return JSONResponse(out.model_dump(mode="json"), status_code=202 if out.status == "pending" else 200,
                        headers={"Location": f"/api/jobs/{job_id}/resizes/{resize_id}"})


@router.post("/{job_id}/resize", dependencies=[SUBMIT], response_model=ResizeOut, responses={**ERRORS, 202: {"model": ResizeOut}},
             summary="Record new resources; answers with the plan the job would move to")
async def resize(job_id: JobId, body: ResizeIn, db: DB, settings: Config,
                 wait: Annotated[float, Query(ge=0, le=3600, description="seconds to wait for the answer")] = 0.0):
    """200 with `strategy` when the frontier for the new resources is known (stored, or searched within
    `wait` seconds); 202 with status `pending` while its search is queued or running (poll the Location)."""

    def record() -> int:
        with db.session() as s:
            job = jobs.get(s, job_id, with_request=True)
            request = job.request
        req, devices, memory = resizes.prepare(request, body)
        with db.write_session() as s:
            return resizes.create(s, job_id, req, devices, memory).id

    resize_id = await run_in_threadpool(record)
    return await _resize_answer(db, resize_id, job_id, min(wait, settings.resize_wait_max_seconds))


@router.get("/{job_id}/resizes/{resize_id}/frontier", dependencies=[READ], response_model=FrontierOut, responses=ERRORS,
            summary="The frontier searched for a resize's resources")
def get_resize_frontier(job_id: JobId, resize_id: ResizeId, db: DB) -> FrontierOut:
    with db.session() as s:
        return resizes.frontier(s, job_id, resize_id)


@router.get("/{job_id}/resizes/{resize_id}", dependencies=[READ], response_model=ResizeOut,
            responses={**ERRORS, 202: {"model": ResizeOut}},
            summary="A resize's answer")
async def get_resize(job_id: JobId, resize_id: ResizeId, db: DB, settings: Config,
                     wait: Annotated[float, Query(ge=0, le=3600)] = 0.0):
    return await _resize_answer(db, resize_id, job_id, min(wait, settings.resize_wait_max_seconds))
