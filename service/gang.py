"""Gang claims: a run whose plan needs N nodes of K devices goes to N workers of K devices at once,
or to none.

A worker that advertises its devices (`paretoplan worker --devices K`) polls `claim`. Each poll
records it as waiting (its host, its devices, a free port of its host) until `lease` seconds
after the poll. When the oldest queued run of N * K devices (N >= 1) finds N waiting workers of
K devices (this one among them), one transaction claims the run under one lease, the run's, and
assigns each worker its node rank, node 0's host and port being the rendezvous endpoint. A
worker that waits gets nothing of a run until the whole gang is there: no half-claimed run holds
devices. A worker assigned a node learns it on its next poll (the one whose poll completed the
gang, at once).

Every node heartbeats the run with the run's token (any one keeps the lease); each posts its
node's RunReport (`post_node_report`), and the last one to arrive completes the run with the
merged report. A node that fails fails the run (`fail_node`): the first failure ends it, a later
one that says more (a rank's own error, or the death itself, after a lost peer) replaces the
cause; the other nodes' torchrun stop on their own (their collectives lose the dead node).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, Literal

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from search import InputError, RunReport
from search.plans.merge import merge_node_reports
from service import queue
from service.crud import events
from service.db import Database
from service.models import FAILED, QUEUED, RUNNING, Clock, GangMember, Job, Run, Strategy, utcnow

FailureKind = Literal["error", "death", "lost_peer"]
RANK_OF_KIND: dict[str, int] = {"error": 0, "death": 1, "lost_peer": 2}  # which cause says most


@dataclass
class GangClaim:
    run_id: int
    token: str
    attempt: int
    lease_seconds: float
    lease_expires_at: datetime
    node_rank: int
    nnodes: int
    nproc_per_node: int
    endpoint: str
    payload: dict[str, Any]


def _payload(s: Session, run: Run) -> dict[str, Any]:
    plan = s.scalar(select(Strategy.plan).where(Strategy.id == run.strategy_id))
    request = s.scalar(select(Job.request).where(Job.id == run.job_id))
    return {"plan": plan, "steps": run.steps, "job_id": run.job_id, "strategy_id": run.strategy_id,
            "request": request, "checkpoint": run.checkpoint, "checkpoint_every": run.checkpoint_every}


def _assignment(s: Session, me: GangMember) -> GangClaim | None:
    """The node this worker holds of a running run, or None (and its row waits again)."""
    if me.run_id is None:
        return None
    run = s.get(Run, me.run_id)
    if run is None or run.status != RUNNING or run.lease_token != me.token:
        me.run_id = me.token = me.node_rank = me.report = None
        return None
    if me.report is not None:  # its node is done; the row waits for the others' (the merge needs it)
        return None
    members = s.scalars(select(GangMember).where(GangMember.run_id == run.id, GangMember.token == me.token)
                        .order_by(GangMember.node_rank)).all()
    lead = members[0]
    assert me.node_rank is not None and me.token is not None and run.lease_expires_at is not None
    return GangClaim(run_id=run.id, token=me.token, attempt=run.attempts, lease_seconds=0.0,
                     lease_expires_at=run.lease_expires_at, node_rank=me.node_rank, nnodes=len(members),
                     nproc_per_node=me.devices, endpoint=f"{lead.host}:{lead.port}", payload=_payload(s, run))


def claim(db: Database, worker: str, host: str, devices: int, port: int, lease_seconds: float, max_attempts: int,
          *, clock: Clock = utcnow) -> GangClaim | None:
    """This worker's node of a run (assigned now or by an earlier poll of another), or None."""
    with db.write_session() as s:
        now = clock()
        queue.fail_exhausted(s, "run", now, max_attempts)
        me = s.scalars(select(GangMember).where(GangMember.worker == worker).with_for_update()).first()
        if me is None:
            me = GangMember(worker=worker, host=host, devices=devices, port=port, expires_at=now)
            s.add(me)
        me.host, me.devices, me.expires_at = host, devices, now + timedelta(seconds=lease_seconds)
        if me.run_id is None:
            me.port = port
        s.flush()
        held = _assignment(s, me)
        if held is not None:
            return replace(held, lease_seconds=lease_seconds)
        s.flush()
        return _form(s, me, lease_seconds, now)


def _waiting(s: Session, devices: int, now: datetime) -> list[GangMember]:
    return list(s.scalars(select(GangMember).where(GangMember.devices == devices, GangMember.run_id.is_(None),
                                                   GangMember.expires_at >= now)
                          .order_by(GangMember.id).with_for_update(skip_locked=True)).all())


def _form(s: Session, me: GangMember, lease_seconds: float, now: datetime) -> GangClaim | None:
    """Claim the oldest queued run a gang of waiting workers of `me`'s size can take, with `me` in it."""
    waiting = _waiting(s, me.devices, now)
    if me not in waiting:
        return None
    # queued, or running under a lease that expired (every node of its gang was lost)
    candidates = s.scalars(select(Run).where(queue._claimable(Run, now), Run.devices.is_not(None))
                           .order_by(Run.id).with_for_update(skip_locked=True)).all()
    for run in candidates:
        assert run.devices is not None
        if run.devices % me.devices or run.devices // me.devices > len(waiting):
            continue
        n = run.devices // me.devices
        gang = [me, *[w for w in waiting if w is not me][: n - 1]]
        token = uuid.uuid4().hex
        expires = now + timedelta(seconds=lease_seconds)
        owners = ",".join(w.worker for w in gang)
        taken = s.execute(update(Run).where(Run.id == run.id, queue._claimable(Run, now))
                          .values(status=RUNNING, lease_owner=owners[:200], lease_token=token,
                                  lease_expires_at=expires, heartbeat_at=now, attempts=Run.attempts + 1,
                                  stage="claimed", started_at=now)
                          .returning(Run.attempts)).first()
        if taken is None:
            continue
        for rank, w in enumerate(gang):
            w.run_id, w.token, w.node_rank, w.report = run.id, token, rank, None
        events.add(s, "status", run_id=run.id, job_id=run.job_id, stage=RUNNING,
                   message=f"claimed as a gang of {n} nodes of {me.devices} devices: "
                           + ", ".join(f"node {i} {w.worker} ({w.host})" for i, w in enumerate(gang))
                           + f"; rendezvous at {gang[0].host}:{gang[0].port}")
        s.flush()
        return GangClaim(run_id=run.id, token=token, attempt=int(taken[0]), lease_seconds=lease_seconds,
                         lease_expires_at=expires, node_rank=0 if gang[0] is me else gang.index(me), nnodes=n,
                         nproc_per_node=me.devices, endpoint=f"{gang[0].host}:{gang[0].port}",
                         payload=_payload(s, run))
    return None


def _member(s: Session, run_id: int, token: str, node_rank: int) -> GangMember:
    me = s.scalars(select(GangMember).where(GangMember.run_id == run_id, GangMember.token == token,
                                            GangMember.node_rank == node_rank).with_for_update()).first()
    if me is None:
        raise queue.LeaseLost(f"node {node_rank} of run {run_id} is not held under this token")
    return me


def post_node_report(db: Database, run_id: int, token: str, node_rank: int, report: RunReport, *,
                     clock: Clock = utcnow) -> bool:
    """Keep one node's report; with the last node's, complete the run with the merged report
    (True then). LeaseLost when the claim is over, InputError when the report is not this node's."""
    with db.write_session() as s:
        run = s.scalars(select(Run).where(Run.id == run_id).with_for_update()).first()  # one merge at a time
        if run is None or run.status != RUNNING or run.lease_token != token:
            raise queue.LeaseLost(f"run {run_id} is not running under this claim")
        me = _member(s, run_id, token, node_rank)
        # torchrun numbers the nodes as they join its rendezvous (its group rank), not as the gang
        # was assigned: the report's own node number is what its ranks ran as
        if len(report.nodes) != 1:
            raise InputError(f"report: of {len(report.nodes)} nodes, posted as one node's")
        members = s.scalars(select(GangMember).where(GangMember.run_id == run_id, GangMember.token == token)).all()
        taken = {RunReport.model_validate(m.report).nodes[0].node_rank for m in members
                 if m is not me and m.report is not None and "failed" not in m.report}
        if report.nodes[0].node_rank in taken:
            raise InputError(f"report: node {report.nodes[0].node_rank} of run {run_id} has reported already")
        me.report = report.model_dump(mode="json")
        events.add(s, "progress", run_id=run_id, job_id=run.job_id, stage="reporting",
                   message=f"node {report.nodes[0].node_rank} ({me.worker}) reported its ranks {report.nodes[0].ranks}")
        if any(m.report is None for m in members):
            return False
        merged = merge_node_reports([RunReport.model_validate(m.report) for m in members])
    queue.complete_run(db, run_id, token, merged, clock=clock)
    with db.write_session() as s:
        s.execute(delete(GangMember).where(GangMember.run_id == run_id, GangMember.token == token))
    return True


def fail_node(db: Database, run_id: int, token: str, node_rank: int, error: str, kind: FailureKind, *,
              retry: bool, max_attempts: int, clock: Clock = utcnow, handback: bool = False) -> str:
    """Node `node_rank` failed: the run fails (or is queued again, `retry`, while attempts remain)
    with this cause; when it already failed under this claim, a cause that says more replaces the
    first one. `handback`: the node's worker is stopping (SIGTERM) and returns the run unharmed,
    queued again without counting the claim, as queue.fail does for a single worker. The run's status."""
    with db.write_session() as s:
        run = s.scalars(select(Run).where(Run.id == run_id).with_for_update()).first()
        if run is None or run.lease_token != token:
            raise queue.LeaseLost(f"run {run_id} is not held under this claim")
        me = _member(s, run_id, token, node_rank)
        said = f"node {node_rank} ({me.worker}): {error}"
        me.report = {"failed": kind, "error": error}
        if run.status == FAILED:
            first = s.scalars(select(GangMember).where(GangMember.run_id == run_id, GangMember.token == token,
                                                       GangMember.node_rank != node_rank)).all()
            before = min((RANK_OF_KIND.get((m.report or {}).get("failed", ""), 3) for m in first), default=3)
            if RANK_OF_KIND[kind] < before:
                run.error = said
            events.add(s, "info", run_id=run_id, job_id=run.job_id, message=f"also failed: {said}")
            return FAILED
        if run.status != RUNNING:
            raise queue.LeaseLost(f"run {run_id} is {run.status} under this claim")
    status = queue.fail(db, "run", run_id, token, said, input_error=False, retry=retry, max_attempts=max_attempts,
                        clock=clock, handback=handback)
    if status == QUEUED:  # its gang is free again: the next claim forms a new one
        with db.write_session() as s:
            s.execute(delete(GangMember).where(GangMember.run_id == run_id, GangMember.token == token))
    return status
