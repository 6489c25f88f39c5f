"""/api/tasks: the worker protocol (claim with a lease, heartbeat with progress, result, failure).

    POST /api/tasks/claim                 {worker, kinds}      -> 200 task (with token) | 204 nothing to do
    POST /api/tasks/{kind}/{id}/heartbeat {token, stage?, fraction?, message?, step?,
                                           checkpoint?, devices?, segments?, resize_id?, resize_outcome?}
                                                               -> 200 {lease_expires_at, resize?} | 409 lease lost
    POST /api/tasks/search/{id}/result    {token, report: FrontierReport}   -> 200 | 409 | 422
    POST /api/tasks/run/{id}/result       {token, report: RunReport}        -> 200 | 409 | 422
    POST /api/tasks/{kind}/{id}/fail      {token, error, input_error, retry} -> 200 | 409

A worker needs no database: this is all it talks to. Reports may be sent gzip-compressed
(`Content-Encoding: gzip`). A 409 means the claim is over (its lease expired and another worker
took the task): stop and drop the work. A 422 on a result means the report is not a valid one
(malformed, inconsistent, or a RunReport of another plan or step count than the run's): nothing
is stored. A run's heartbeat reports where its checkpoints are and its segments, answers a resize
order (`resize_id`, `resize_outcome`) and gets the pending one, if any, in `resize`.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response

from service import queue
from service.api.auth import WORKER
from service.api.deps import DB, AppClock, Config, TaskId
from service.api.errors import StrictJSONRoute
from service.crud import runs
from service.schemas import Ack, ClaimIn, Error, FailIn, HeartbeatIn, HeartbeatOut, RunResultIn, SearchResultIn, TaskOut

router = APIRouter(prefix="/api/tasks", tags=["worker protocol"], route_class=StrictJSONRoute,
                   dependencies=[WORKER])
LOST: dict[int | str, dict[str, Any]] = {409: {"model": Error, "description": "the claim is over: drop the task"}}
RESULT: dict[int | str, dict[str, Any]] = {**LOST, 422: {"model": Error, "description": "not a valid report of this "
                                                                                       "task: nothing was stored"}}


@router.post("/claim", response_model=TaskOut, responses={204: {"description": "nothing to do"}},
             summary="Claim the oldest queued task (or one whose lease expired)")
def claim(body: ClaimIn, db: DB, settings: Config, clock: AppClock) -> TaskOut | Response:
    c = queue.claim(db, body.worker, list(dict.fromkeys(body.kinds)), settings.lease_seconds, settings.max_attempts,
                    clock=clock)
    if c is None:
        return Response(status_code=204)
    return TaskOut(kind=c.kind, id=c.id, token=c.token, attempt=c.attempt, lease_seconds=c.lease_seconds,
                   lease_expires_at=c.lease_expires_at, **c.payload)


@router.post("/{kind}/{task_id}/heartbeat", response_model=HeartbeatOut, responses=LOST,
             summary="Renew the lease, report progress")
def heartbeat(kind: queue.Kind, task_id: TaskId, body: HeartbeatIn, db: DB, settings: Config,
              clock: AppClock) -> HeartbeatOut:
    run = None
    if kind == "run":
        run = {"checkpoint": body.checkpoint, "devices": body.devices,
               "segments": [x.model_dump(mode="json") for x in body.segments] if body.segments is not None else None}
    expires = queue.heartbeat(db, kind, task_id, body.token, settings.lease_seconds, stage=body.stage,
                              fraction=body.fraction, message=body.message, step=body.step, run=run, clock=clock,
                              max_hold_seconds=settings.max_claim_seconds)
    if kind != "run":
        return HeartbeatOut(lease_expires_at=expires)
    if body.resize_id is not None:
        with db.write_session() as s:
            runs.answer_resize(s, task_id, body.resize_id, body.resize_outcome or "done")
    with db.session() as s:
        return HeartbeatOut(lease_expires_at=expires, resize=runs.resize_order(s, task_id))


@router.post("/search/{task_id}/result", response_model=Ack, responses=RESULT, summary="A search's frontier")
def search_result(task_id: TaskId, body: SearchResultIn, db: DB, clock: AppClock) -> Ack:
    queue.complete_search(db, task_id, body.token, body.report, clock=clock)
    return Ack()


@router.post("/run/{task_id}/result", response_model=Ack, responses=RESULT, summary="A run's RunReport")
def run_result(task_id: TaskId, body: RunResultIn, db: DB, clock: AppClock) -> Ack:
    queue.complete_run(db, task_id, body.token, body.report, clock=clock)
    return Ack()


@router.post("/{kind}/{task_id}/fail", response_model=Ack, responses=LOST,
             summary="The task failed (input errors are final; others may be retried)")
def fail(kind: queue.Kind, task_id: TaskId, body: FailIn, db: DB, settings: Config, clock: AppClock) -> Ack:
    queue.fail(db, kind, task_id, body.token, body.error, input_error=body.input_error, retry=body.retry,
               max_attempts=settings.max_attempts, clock=clock, handback=body.handback and not body.input_error)
    return Ack()
