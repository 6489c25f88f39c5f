"""/api/tasks: the worker protocol (claim with a lease, heartbeat with progress, result, failure).

    POST /api/tasks/claim                 {worker, kinds}      -> 200 task (with token) | 204 nothing to do
    POST /api/tasks/{kind}/{id}/heartbeat {token, stage?, fraction?, message?, step?, checkpoint?}
                                                               -> 200 {lease_expires_at} | 409 lease lost
    POST /api/tasks/search/{id}/result    {token, report: FrontierReport}   -> 200 | 409
    POST /api/tasks/run/{id}/result       {token, report: RunReport}        -> 200 | 409
    POST /api/tasks/{kind}/{id}/fail      {token, error, input_error, retry} -> 200 | 409

A worker needs no database: this is all it talks to. Reports may be sent gzip-compressed
(`Content-Encoding: gzip`). A 409 means the claim is over (its lease expired and another worker
took the task): stop and drop the work.
"""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Depends, Response

from service import queue
from service.api.deps import DB, Config, Id, worker_auth
from service.api.errors import StrictJSONRoute
from service.schemas import Ack, ClaimIn, Error, FailIn, HeartbeatIn, HeartbeatOut, RunResultIn, SearchResultIn, TaskOut

router = APIRouter(prefix="/api/tasks", tags=["worker protocol"], route_class=StrictJSONRoute,
                   dependencies=[Depends(worker_auth)])
Kind = Literal["search", "run"]
LOST = {409: {"model": Error, "description": "the claim is over: drop the task"}}


@router.post("/claim", response_model=TaskOut, responses={204: {"description": "nothing to do"}},
             summary="Claim the oldest queued task (or one whose lease expired)")
def claim(body: ClaimIn, db: DB, settings: Config):
    c = queue.claim(db, body.worker, list(dict.fromkeys(body.kinds)), settings.lease_seconds, settings.max_attempts)
    if c is None:
        return Response(status_code=204)
    return TaskOut(kind=c.kind, id=c.id, token=c.token, attempt=c.attempt, lease_seconds=c.lease_seconds,
                   lease_expires_at=c.lease_expires_at, **c.payload)


@router.post("/{kind}/{task_id}/heartbeat", response_model=HeartbeatOut, responses=LOST,
             summary="Renew the lease, report progress")
def heartbeat(kind: Kind, task_id: Id("task"), body: HeartbeatIn, db: DB, settings: Config) -> HeartbeatOut:
    expires = queue.heartbeat(db, kind, task_id, body.token, settings.lease_seconds, stage=body.stage,
                              fraction=body.fraction, message=body.message, step=body.step,
                              checkpoint=body.checkpoint)
    return HeartbeatOut(lease_expires_at=expires)


@router.post("/search/{task_id}/result", response_model=Ack, responses=LOST, summary="A search's frontier")
def search_result(task_id: Id("task"), body: SearchResultIn, db: DB) -> Ack:
    queue.complete_search(db, task_id, body.token, body.report)
    return Ack()


@router.post("/run/{task_id}/result", response_model=Ack, responses=LOST, summary="A run's RunReport")
def run_result(task_id: Id("task"), body: RunResultIn, db: DB) -> Ack:
    queue.complete_run(db, task_id, body.token, body.report)
    return Ack()


@router.post("/{kind}/{task_id}/fail", response_model=Ack, responses=LOST,
             summary="The task failed (input errors are final; others may be retried)")
def fail(kind: Kind, task_id: Id("task"), body: FailIn, db: DB, settings: Config) -> Ack:
    queue.fail(db, kind, task_id, body.token, body.error, input_error=body.input_error, retry=body.retry,
               max_attempts=settings.max_attempts)
    return Ack()
