"""Searches: one per canonical request, shared by every job that asks the same thing."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, undefer

from search import SearchRequest
from service.crud import events
from service.crud.errors import get_or_404
from service.models import DONE, FAILED, QUEUED, Search, Strategy
from service.validation import canonical_key, label

# how get_or_create found the search
NEW, STORED, SHARED, REQUEUED = "new", "stored", "shared", "requeued"


def get(s: Session, search_id: int, *, with_summary: bool = False) -> Search:
    return get_or_404(s, Search, search_id, "search", options=[undefer(Search.summary)] if with_summary else [])


def get_or_create(s: Session, req: SearchRequest, devices: int) -> tuple[Search, str]:
    """The search for `req`: NEW (queued now), STORED (done: its frontier answers at once), SHARED
    (queued or running for an earlier identical job) or REQUEUED (it had failed for a reason
    other than its input, e.g. a worker lost; try again)."""
    key = canonical_key(req)
    found = s.scalars(select(Search).where(Search.key == key)).first()
    if found is None:
        try:
            with s.begin_nested():
                found = Search(key=key, label=label(req), devices=devices, request=req.model_dump(mode="json"),
                               status=QUEUED, progress=0.0, attempts=0)
                s.add(found)
                s.flush()
        except IntegrityError:  # an identical request inserted it concurrently
            found = s.scalars(select(Search).where(Search.key == key)).one()
        else:
            events.add(s, "status", search_id=found.id, stage=QUEUED, message="queued for a worker")
            return found, NEW
    if found.status == DONE:
        return found, STORED
    if found.status == FAILED and found.error_kind != "input":
        found.status, found.attempts, found.error, found.error_kind = QUEUED, 0, None, None
        found.lease_owner = found.lease_token = found.lease_expires_at = None
        found.stage, found.progress, found.started_at, found.finished_at = QUEUED, 0.0, None, None
        events.add(s, "status", search_id=found.id, stage=QUEUED, message="queued again for a new job")
        return found, REQUEUED
    return found, SHARED


def strategies(s: Session, search_id: int) -> list[Strategy]:
    """Frontier points in order, then baselines (without their plans)."""
    q = select(Strategy).where(Strategy.search_id == search_id).order_by(Strategy.kind.desc(), Strategy.idx)
    return list(s.scalars(q))


def strategies_with_mfu(s: Session, search_id: int, *, with_plans: bool = False) -> list[tuple[Strategy, float | None]]:
    """As `strategies`, each with its plan's predicted MFU (read from the stored plan's JSON in the
    database, without loading the plans unless `with_plans`; None for plans stored before they recorded it)."""
    mfu = Strategy.plan[("predicted", "mfu")].as_float()
    q = (select(Strategy, mfu).where(Strategy.search_id == search_id)
         .order_by(Strategy.kind.desc(), Strategy.idx))
    if with_plans:
        q = q.options(undefer(Strategy.plan))
    return [(st, m) for st, m in s.execute(q).all()]


def picked(s: Session, search: Search, *, with_plan: bool = False) -> Strategy | None:
    if search.picked_index is None:
        return None
    q = select(Strategy).where(Strategy.search_id == search.id, Strategy.kind == "frontier",
                               Strategy.idx == search.picked_index)
    if with_plan:
        q = q.options(undefer(Strategy.plan))
    return s.scalars(q).first()
