"""Resizes: new resources for a job, answered with the plan it would move to."""

from __future__ import annotations

from sqlalchemy.orm import Session

from search import InputError, SearchRequest, parse_size, resized
from service import validation
from service.crud import events, jobs, searches, strategies
from service.crud.errors import Conflict, FieldError, NotFound, get_or_404
from service.models import DONE, FAILED, Resize
from service.schemas import FrontierOut, ResizeIn, ResizeOut


def prepare(job_request: dict, body: ResizeIn) -> tuple[SearchRequest, int, int | None]:
    """The job's request for the new resources, validated (FieldError naming the field otherwise)."""
    try:
        memory = parse_size(body.memory_per_device) if body.memory_per_device is not None else None
    except InputError as e:
        raise FieldError("memory_per_device", f"memory_per_device: {e}") from None
    if memory is not None and memory > 2**62:
        raise FieldError("memory_per_device", f"memory_per_device {body.memory_per_device!r} is beyond any device")
    # the job's other fields were valid when it was submitted: what fails now is the new device count
    # (or the node size that goes with it)
    field = "devices_per_node" if body.devices_per_node is not None else "devices"
    try:
        req = resized(SearchRequest.model_validate(job_request), body.devices, memory, body.devices_per_node)
        req, devices = validation.check(req)
    except FieldError:
        raise
    except InputError as e:
        raise FieldError(field, str(e)) from None
    return req, devices, memory


def create(s: Session, job_id: int, req: SearchRequest, devices: int, memory: int | None) -> Resize:
    job = jobs.get(s, job_id, with_request=True)
    own = searches.get(s, job.search_id)
    mine = SearchRequest.model_validate(job.request)
    if own.devices == devices and req == resized(mine, devices, None, None):
        # back to the job's own resources: its own frontier answers (its request may leave the
        # global batch to the default, which the resized request spells out: another key)
        search, how = own, searches.STORED if own.status == DONE else searches.SHARED
    else:
        search, how = searches.get_or_create(s, req, devices)
    r = Resize(job_id=job_id, devices=devices, memory_per_device=memory, search_id=search.id)
    s.add(r)
    s.flush()
    mem = f", {memory} bytes per device" if memory is not None else ""
    events.add(s, "info", job_id=job_id, message=f"resize {r.id} to {devices} devices{mem}: "
               + ("answered from a stored frontier" if how == searches.STORED else f"search {search.id} {search.status}"))
    return r


def get(s: Session, job_id: int, resize_id: int) -> Resize:
    r = get_or_404(s, Resize, resize_id, "resize")
    if r.job_id != job_id:  # another job's: not found under this one
        raise NotFound(f"job {job_id} has no resize {resize_id}")
    return r


def out(s: Session, r: Resize) -> ResizeOut:
    job = jobs.get(s, r.job_id)
    search = searches.get(s, r.search_id)
    current = job.selected_strategy_id
    if current is None:
        own = searches.get(s, job.search_id)
        p = searches.picked(s, own)
        current = p.id if p is not None else None
    status, strategy = "pending", None
    if search.status == DONE:
        st = searches.picked(s, search, with_plan=True)
        status = "ready" if st is not None else "no_fit"
        strategy = strategies.out(st) if st is not None else None
    elif search.status == FAILED:
        status = "failed"
    return ResizeOut(id=r.id, job_id=r.job_id, devices=r.devices, memory_per_device=r.memory_per_device,
                     search_id=r.search_id, status=status, error=search.error, current_strategy_id=current,
                     strategy=strategy, least_memory_bytes=search.least_memory_bytes,
                     frontier_url=f"/api/jobs/{r.job_id}/resizes/{r.id}/frontier", run_id=r.run_id,
                     outcome=r.outcome, created_at=r.created_at)


def frontier(s: Session, job_id: int, resize_id: int) -> FrontierOut:
    """The frontier searched for a resize's resources (its device count and memory per device)."""
    r = get(s, job_id, resize_id)
    search = searches.get(s, r.search_id, with_summary=True)
    if search.status != DONE:
        detail = f": {search.error}" if search.error else ""
        raise Conflict(f"resize {resize_id} of job {job_id} has no frontier yet: its search is {search.status}{detail}")
    return jobs.search_frontier(s, search, job_id)


def is_settled(s: Session, r: Resize) -> bool:
    search = searches.get(s, r.search_id)
    return search.status in (DONE, FAILED)


