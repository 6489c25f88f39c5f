"""Jobs: a user's request, its search, the strategy selected on its frontier."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import and_, func, select
from sqlalchemy.orm import Session, aliased, undefer

from search import InputError, SearchRequest, confidence, resized
from service import validation
from service.crud import events, searches
from service.crud.errors import Conflict, NotFound, get_or_404
from service.models import DONE, Job, Resize, Search, Strategy
from service.schemas import Alternate, BaselineOut, FrontierOut, JobCreate, JobDetail, JobOut, PointOut


@dataclass
class Prepared:
    """A submitted job, validated and normalised; nothing stored yet."""

    request: SearchRequest
    devices: int
    profile_id: int | None
    alternates: list[tuple[int, SearchRequest]]


def prepare(body: JobCreate, profile: dict | None) -> Prepared:
    """Validate everything that can be checked without searching (InputError otherwise); `profile`
    is the stored DeviceProfile that `profile_id` names."""
    req = body.search_request()
    if profile is not None:
        if req.profile is not None:
            raise InputError("give either profile or profile_id, not both")
        fields = body.model_dump(exclude={"profile_id", "device_counts"}, exclude_unset=True)
        req = SearchRequest.model_validate({**fields, "profile": profile})
    req, devices = validation.check(req)
    alternates = []
    for n in sorted(set(body.device_counts) - {devices}):
        try:
            alt, _ = validation.check(resized(req, n, None, None))
        except InputError as e:
            raise InputError(f"device_counts: {n}: {e}") from None
        alternates.append((n, alt))
    return Prepared(req, devices, body.profile_id, alternates)


def create(s: Session, p: Prepared) -> Job:
    search, how = searches.get_or_create(s, p.request, p.devices)
    alts = {}
    for n, req in p.alternates:
        alt, _ = searches.get_or_create(s, req, n)
        alts[str(n)] = alt.id
    job = Job(name=search.label, search_id=search.id, profile_id=p.profile_id,
              request=p.request.model_dump(mode="json"), alternates=alts, cached=how == searches.STORED)
    s.add(job)
    s.flush()
    msg = {searches.NEW: "submitted; search queued",
           searches.STORED: f"answered from the stored frontier of search {search.id}",
           searches.SHARED: f"submitted; shares search {search.id} with an identical earlier job",
           searches.REQUEUED: f"submitted; search {search.id} failed before and is queued again"}[how]
    events.add(s, "info", job_id=job.id, message=msg)
    return job


def get(s: Session, job_id: int, *, with_request: bool = False) -> Job:
    return get_or_404(s, Job, job_id, "job", options=[undefer(Job.request)] if with_request else [])


def _rows(s: Session, where, limit: int | None = None, offset: int = 0):
    picked = aliased(Strategy)
    # the device type from the stored request (a JSON path: one expression on SQLite and PostgreSQL)
    q = (select(Job, Search, picked.id, Job.request["device"].as_string())
         .join(Search, Search.id == Job.search_id)
         .outerjoin(picked, and_(picked.search_id == Search.id, picked.kind == "frontier",
                                 picked.idx == Search.picked_index))
         .order_by(Job.id.desc()))
    if where is not None:
        q = q.where(where)
    if limit is not None:
        q = q.limit(limit).offset(offset)
    return s.execute(q).all()


def _out(job: Job, search: Search, picked_id: int | None, device: str | None, alt_status: dict[int, str],
         cls=JobOut, **extra):
    return cls(id=job.id, name=job.name, status=search.status, stage=search.stage, progress=search.progress,
               error=search.error, search_id=search.id, devices=search.devices, device=device, cached=job.cached,
               frontier_size=search.frontier_size,
               feasible=None if search.status != DONE else search.picked_index is not None,
               picked_strategy_id=picked_id, selected_strategy_id=job.selected_strategy_id,
               profile_id=job.profile_id,
               alternates=[Alternate(devices=int(n), search_id=sid, status=alt_status.get(sid, "queued"))
                           for n, sid in sorted((job.alternates or {}).items(), key=lambda kv: int(kv[0]))],
               created_at=job.created_at, started_at=search.started_at, finished_at=search.finished_at, **extra)


def _alt_status(s: Session, jobs: list[Job]) -> dict[int, str]:
    ids = {sid for j in jobs for sid in (j.alternates or {}).values()}
    if not ids:
        return {}
    return dict(s.execute(select(Search.id, Search.status).where(Search.id.in_(ids))).all())


def detail(s: Session, job_id: int) -> JobDetail:
    rows = _rows(s, Job.id == job_id)
    if not rows:
        raise NotFound(f"no job {job_id}")
    job, search, picked_id, device = rows[0]
    request = s.scalar(select(Job.request).where(Job.id == job_id))
    return _out(job, search, picked_id, device, _alt_status(s, [job]), cls=JobDetail, request=request)


def listing(s: Session, status: str | None, limit: int, offset: int) -> tuple[int, list[JobOut]]:
    where = Search.status == status if status else None
    count = select(func.count()).select_from(Job).join(Search, Search.id == Job.search_id)
    if where is not None:
        count = count.where(where)
    total = s.execute(count).scalar_one()
    rows = _rows(s, where, limit, offset)
    alt = _alt_status(s, [r[0] for r in rows])
    return total, [_out(j, se, pid, dev, alt) for j, se, pid, dev in rows]


def frontier(s: Session, job_id: int, devices: int | None = None, *, plans: bool = False) -> FrontierOut:
    """The job's frontier, or with `devices` the frontier for that device count: one it asked to have
    searched ahead (`device_counts`), else its latest resize to that count. Every frontier a job has is
    reachable by URL, so a resize's preview can be drawn and compared like the job's own."""
    job = get(s, job_id)
    search = searches.get(s, job.search_id, with_summary=True)
    if devices is not None and devices != search.devices:
        ahead = {int(n): sid for n, sid in (job.alternates or {}).items()}
        by_count = dict(ahead)
        resized = s.execute(select(Resize.devices, Resize.search_id).where(Resize.job_id == job_id)
                            .order_by(Resize.id)).all()
        for n, sid in resized:  # ahead-of-time searches win; among resizes the latest to a count does
            if n not in ahead:
                by_count[n] = sid
        if devices not in by_count:
            counts = ", ".join(str(n) for n in sorted({search.devices, *by_count}))
            raise NotFound(f"job {job_id} has no search for {devices} devices (it has: {counts})")
        search = searches.get(s, by_count[devices], with_summary=True)
    if search.status != DONE:
        detail_ = f": {search.error}" if search.error else ""
        raise Conflict(f"job {job_id} has no frontier yet: its search is {search.status}{detail_}")
    return search_frontier(s, search, job_id, plans=plans)


def search_frontier(s: Session, search: Search, job_id: int, *, plans: bool = False) -> FrontierOut:
    """`plans`: each point and baseline carries its full Plan, as in `paretoplan search --json`."""
    summ = search.summary
    if summ is None:  # complete_search stores it with the frontier
        raise RuntimeError(f"search {search.id} is {search.status} but has no summary")
    budget = summ.memory_budget_bytes
    points, bases, picked_id = [], [], None
    for st, mfu in searches.strategies_with_mfu(s, search.id, with_plans=plans):
        plan = st.plan if plans else None
        if st.kind == "frontier":
            points.append(PointOut(id=st.id, index=st.idx, time_s=st.time_s, memory_bytes=st.memory_bytes, mfu=mfu,
                                   fits=st.memory_bytes <= budget, summary=st.summary, plan=plan))
            if st.idx == search.picked_index:
                picked_id = st.id
        else:
            bases.append(BaselineOut(id=st.id, name=st.name or "", description=st.description or "",
                                     time_s=st.time_s, memory_bytes=st.memory_bytes, mfu=mfu, summary=st.summary,
                                     against_frontier=st.against_frontier or {}, plan=plan))
    sure = confidence("profile" if "profile" in summ.stats else "catalog", summ.model, summ.num_devices, via="api")
    return FrontierOut(job_id=job_id, search_id=search.id, status=search.status, feasible=search.picked_index is not None,
                       picked=search.picked_index, picked_strategy_id=picked_id,
                       least_memory_bytes=search.least_memory_bytes, confidence=sure, frontier=points, baselines=bases,
                       **summ.model_dump())


def search_ids(s: Session, job: Job) -> set[int]:
    """Every search a job's strategies may come from: its own, its alternates, its resizes."""
    ids = {job.search_id, *(job.alternates or {}).values()}
    ids |= set(s.scalars(select(Resize.search_id).where(Resize.job_id == job.id)))
    return ids


def select_strategy(s: Session, job_id: int, strategy_id: int) -> None:
    job = get(s, job_id)
    st = get_or_404(s, Strategy, strategy_id, "strategy")
    if st.search_id not in search_ids(s, job):
        raise InputError(f"strategy {strategy_id} is not on a frontier of job {job_id}")
    job.selected_strategy_id = strategy_id
    events.add(s, "info", job_id=job_id, message=f"selected strategy {strategy_id}: {st.summary}")
