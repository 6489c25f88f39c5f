"""The ORM: one table per entity the service keeps (profiles, searches, strategies, jobs, runs, resizes,
events), the queue being two of them.

`searches` and `runs` are the queue (no second broker): each row carries its status, the lease
of the worker that claimed it (owner, token, expiry) and its attempts. A search is keyed by the
hash of its canonical request, so identical jobs share one search and its stored frontier;
`strategies` holds one row per Pareto point (and per baseline) with its Plan JSON. A search's
`summary` is the `SearchSummary` of its FrontierReport and a run's `report` its `RunReport`: JSON
columns holding the typed reports, validated on the way in and read back validated.

Times are naive UTC (`utcnow()`), the same on SQLite and PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

from pydantic import BaseModel
from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, deferred, mapped_column
from sqlalchemy.types import TypeDecorator

from search import RunReport, SearchSummary

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# task statuses (searches and runs); a job's status is its search's
QUEUED, RUNNING, DONE, FAILED = "queued", "running", "done", "failed"
STATUSES = (QUEUED, RUNNING, DONE, FAILED)


Clock = Callable[[], datetime]  # what the queue reads the time from (tests inject one they can advance)


def utcnow() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


M = TypeVar("M", bound=BaseModel)


class ModelJSON(TypeDecorator[M]):
    """A pydantic model in a JSON column: stored as its JSON object, read back validated."""

    impl = JSON
    cache_ok = True

    def __init__(self, model: type[M]) -> None:
        super().__init__()
        self.model = model

    def process_bind_param(self, value: M | None, dialect: Dialect) -> Any:
        return None if value is None else value.model_dump(mode="json")

    def process_result_value(self, value: Any, dialect: Dialect) -> M | None:
        return None if value is None else self.model.model_validate(value)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class LeaseMixin:
    """The queue columns shared by searches and runs."""

    status: Mapped[str] = mapped_column(String(16), default=QUEUED)  # indexed with id, per table
    stage: Mapped[str | None] = mapped_column(String(64))
    progress: Mapped[float] = mapped_column(Float, default=0.0)
    error: Mapped[str | None] = mapped_column(Text)
    error_kind: Mapped[str | None] = mapped_column(String(16))  # input | internal | lease
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    lease_owner: Mapped[str | None] = mapped_column(String(200))
    lease_token: Mapped[str | None] = mapped_column(String(64))
    lease_expires_at: Mapped[datetime | None] = mapped_column(DateTime)
    heartbeat_at: Mapped[datetime | None] = mapped_column(DateTime)
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(DateTime)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime)


class Profile(Base):
    """A DeviceProfile (search.prices.profile, format paretoplan.profile/1) as uploaded, under a name."""

    __tablename__ = "profiles"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    device: Mapped[str] = mapped_column(String(200))
    backend: Mapped[str] = mapped_column(String(16))
    ops: Mapped[int] = mapped_column(Integer)
    collectives: Mapped[int] = mapped_column(Integer)
    document: Mapped[Any] = deferred(mapped_column(JSON, nullable=False))
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)


class Search(LeaseMixin, Base):
    """One search of one canonical request; its result is the stored frontier."""

    __tablename__ = "searches"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    key: Mapped[str] = mapped_column(String(64), unique=True)
    label: Mapped[str] = mapped_column(String(200))
    devices: Mapped[int] = mapped_column(Integer)
    request: Mapped[Any] = deferred(mapped_column(JSON, nullable=False))
    summary: Mapped[SearchSummary | None] = deferred(mapped_column(ModelJSON(SearchSummary)))  # the frontier's header
    frontier_size: Mapped[int | None] = mapped_column(Integer)
    picked_index: Mapped[int | None] = mapped_column(Integer)
    least_memory_bytes: Mapped[int | None] = mapped_column(BigInteger)

    __table_args__ = (Index("ix_searches_status_id", "status", "id"),)


class Strategy(Base):
    """A point of a stored frontier (kind 'frontier', idx its position) or a baseline plan."""

    __tablename__ = "strategies"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    search_id: Mapped[int] = mapped_column(ForeignKey("searches.id", ondelete="CASCADE"), index=True)
    kind: Mapped[str] = mapped_column(String(16))  # frontier | baseline
    idx: Mapped[int] = mapped_column(Integer)
    name: Mapped[str | None] = mapped_column(String(200))
    description: Mapped[str | None] = mapped_column(Text)
    time_s: Mapped[float] = mapped_column(Float)
    memory_bytes: Mapped[int] = mapped_column(BigInteger)
    summary: Mapped[str] = mapped_column(Text, default="")
    against_frontier: Mapped[Any | None] = mapped_column(JSON)
    plan: Mapped[Any] = deferred(mapped_column(JSON, nullable=False))

    __table_args__ = (UniqueConstraint("search_id", "kind", "idx", name="uq_strategies_search_kind_idx"),)


class Job(Base):
    """A user's request; its status and frontier are those of its search."""

    __tablename__ = "jobs"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    search_id: Mapped[int] = mapped_column(ForeignKey("searches.id"), index=True)
    profile_id: Mapped[int | None] = mapped_column(ForeignKey("profiles.id"))
    request: Mapped[Any] = deferred(mapped_column(JSON, nullable=False))
    alternates: Mapped[Any] = mapped_column(JSON, default=dict)  # {"<devices>": search_id}
    cached: Mapped[bool] = mapped_column(Boolean, default=False)
    selected_strategy_id: Mapped[int | None] = mapped_column(ForeignKey("strategies.id"))
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)


class Run(LeaseMixin, Base):
    """A launched strategy: queued for a worker, then its RunReport (measured vs predicted)."""

    __tablename__ = "runs"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id"), index=True)
    strategy_id: Mapped[int] = mapped_column(ForeignKey("strategies.id"))
    steps: Mapped[int] = mapped_column(Integer)
    step: Mapped[int | None] = mapped_column(Integer)
    checkpoint: Mapped[str | None] = mapped_column(Text)  # the run directory its worker saves checkpoints to
    checkpoint_every: Mapped[int | None] = mapped_column(Integer)
    devices: Mapped[int | None] = mapped_column(Integer)  # what it runs on now (a resize changes it)
    segments: Mapped[Any | None] = mapped_column(JSON)  # its launches so far, as its worker reports them
    report: Mapped[RunReport | None] = deferred(mapped_column(ModelJSON(RunReport)))

    __table_args__ = (Index("ix_runs_status_id", "status", "id"),)


class GangMember(Base):
    """A worker of `devices` devices on `host` that waits to join a run spanning nodes (service.gang),
    or holds node `node_rank` of run `run_id` and, once it finished, its node's report."""

    __tablename__ = "gang_members"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    worker: Mapped[str] = mapped_column(String(200), unique=True)
    host: Mapped[str] = mapped_column(String(255))
    devices: Mapped[int] = mapped_column(Integer)
    port: Mapped[int] = mapped_column(Integer)  # a free port of its host: the rendezvous, when it is node 0
    expires_at: Mapped[datetime] = mapped_column(DateTime)  # waiting ends without a poll by then
    run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    token: Mapped[str | None] = mapped_column(String(64))  # the run's lease token when it was assigned
    node_rank: Mapped[int | None] = mapped_column(Integer)
    report: Mapped[Any | None] = deferred(mapped_column(JSON))  # its node's RunReport, once posted


class Resize(Base):
    """New resources recorded for a job, and the search that answers what plan it would move to;
    for a running run (`run_id`), an order its worker carries out at the next step boundary and
    answers (`outcome`)."""

    __tablename__ = "resizes"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id"), index=True)
    devices: Mapped[int] = mapped_column(Integer)
    memory_per_device: Mapped[int | None] = mapped_column(BigInteger)
    search_id: Mapped[int] = mapped_column(ForeignKey("searches.id"))
    run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id"), index=True)
    outcome: Mapped[str | None] = mapped_column(Text)  # a run's resize: what its worker did, once it answered
    answered_at: Mapped[datetime | None] = mapped_column(DateTime)
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)


class Event(Base):
    """The progress log: of a search (shared by its jobs), a job or a run."""

    __tablename__ = "events"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    search_id: Mapped[int | None] = mapped_column(ForeignKey("searches.id", ondelete="CASCADE"), index=True)
    job_id: Mapped[int | None] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    kind: Mapped[str] = mapped_column(String(32))  # status | progress | info
    stage: Mapped[str | None] = mapped_column(String(64))
    fraction: Mapped[float | None] = mapped_column(Float)
    message: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)


class ApiToken(Base):
    """An API token: only the sha256 of its secret is kept (a database dump gives no way in); its
    scopes are a comma-separated subset of read, submit, admin, worker (service.api.auth)."""

    __tablename__ = "api_tokens"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    secret_sha256: Mapped[str] = mapped_column(String(64), unique=True)
    scopes: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime)
