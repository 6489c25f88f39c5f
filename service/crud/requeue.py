"""An operator's requeue: a task (search or run) that failed, or whose worker holds it, goes back to
the queue with its attempts reset; a worker still holding it loses its lease (its next heartbeat
or result is refused with 409, and it drops the work)."""

from __future__ import annotations

from typing import Literal

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from service.crud import events
from service.crud.errors import Conflict, NotFound
from service.models import DONE, QUEUED, Run, Search

Kind = Literal["search", "run"]


def requeue(s: Session, kind: Kind, task_id: int, who: str) -> str:
    """The task's status before; Conflict when it is done (its result is stored: nothing to redo)."""
    T: type[Search] | type[Run] = Search if kind == "search" else Run
    status = s.scalar(select(T.status).where(T.id == task_id))
    if status is None:
        raise NotFound(f"no {kind} {task_id}")
    if status == DONE:
        raise Conflict(f"{kind} {task_id} is done: its result is stored, there is nothing to requeue")
    s.execute(update(T).where(T.id == task_id).values(
        status=QUEUED, stage=QUEUED, attempts=0, lease_owner=None, lease_token=None, lease_expires_at=None,
        error=None, error_kind=None, finished_at=None))
    job_id = s.scalar(select(Run.job_id).where(Run.id == task_id)) if kind == "run" else None
    ids = {"search_id": task_id} if kind == "search" else {"run_id": task_id, "job_id": job_id}
    events.add(s, "status", stage=QUEUED, message=f"requeued by {who} (was {status})", **ids)
    return status
