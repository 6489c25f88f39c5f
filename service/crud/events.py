"""The progress log."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import ColumnElement, or_, select
from sqlalchemy.orm import Session

from service.models import Event


def add(s: Session, kind: str, *, search_id: int | None = None, job_id: int | None = None,
        run_id: int | None = None, stage: str | None = None, fraction: float | None = None,
        message: str | None = None) -> None:
    s.add(Event(kind=kind, search_id=search_id, job_id=job_id, run_id=run_id, stage=stage, fraction=fraction,
                message=message))


def since(s: Session, after: int, *, search_ids: Sequence[int] = (), job_id: int | None = None,
          run_id: int | None = None, limit: int = 500) -> list[Event]:
    """Events after id `after` that concern any of the given searches, the job or the run."""
    conds: list[ColumnElement[bool]] = []
    if search_ids:
        conds.append(Event.search_id.in_(list(search_ids)))
    if job_id is not None:
        conds.append(Event.job_id == job_id)
    if run_id is not None:
        conds.append(Event.run_id == run_id)
    if not conds:
        return []
    q = select(Event).where(Event.id > after, or_(*conds)).order_by(Event.id).limit(limit)
    return list(s.scalars(q))
