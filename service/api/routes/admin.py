"""/api/admin: what an operator does by hand (an `admin` token)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel

from service import queue
from service.api.auth import Admin
from service.api.deps import DB, TaskId
from service.api.errors import StrictJSONRoute
from service.crud import requeue
from service.schemas import Error

router = APIRouter(prefix="/api/admin", tags=["admin"], route_class=StrictJSONRoute)
ERRORS: dict[int | str, dict[str, Any]] = {404: {"model": Error}, 409: {"model": Error}}


class Requeued(BaseModel):
    kind: queue.Kind
    id: int
    was: str


@router.post("/tasks/{kind}/{task_id}/requeue", response_model=Requeued, responses=ERRORS,
             summary="Put a failed or held task back in the queue, its attempts reset")
def requeue_task(kind: queue.Kind, task_id: TaskId, db: DB, who: Admin) -> Requeued:
    """A worker that holds it loses its lease (its next call is a 409). A done task is a 409."""
    with db.write_session() as s:
        was = requeue.requeue(s, kind, task_id, who.name)
    return Requeued(kind=kind, id=task_id, was=was)
