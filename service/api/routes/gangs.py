"""/api/gangs: runs that span nodes, claimed by a gang of workers at once (service.gang).

    POST /api/gangs/claim                  {worker, host, devices, port}
                                           -> 200 node of a run (token, node_rank, nnodes, endpoint, ...) | 204
    POST /api/gangs/run/{id}/result        {token, node_rank, report: this node's RunReport} -> 200 {complete}
    POST /api/gangs/run/{id}/fail          {token, node_rank, error, kind, retry, handback}  -> 200 {status}

A worker of K devices polls `claim` while idle; it is handed a node of a run only once the whole
gang (N workers of K devices for a plan of N * K) is there, all under the run's one lease. Each
node heartbeats the run through /api/tasks/run/{id}/heartbeat with the run's token, as a single
worker does. 409: the claim is over; 422: not a valid report of this node. Like /api/tasks, these
routes take the worker token alone (a user's token, even an admin's, is refused: 403), and a node's
report may be sent gzip-compressed.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Response
from pydantic import BaseModel, ConfigDict, Field

from search import RunReport
from service import gang
from service.api.auth import WORKER
from service.api.deps import DB, AppClock, Config, TaskId
from service.api.errors import StrictJSONRoute
from service.schemas import Error, StrictNumbers, TaskOut

router = APIRouter(prefix="/api/gangs", tags=["worker protocol"], route_class=StrictJSONRoute,
                   dependencies=[WORKER])
LOST: dict[int | str, dict[str, Any]] = {409: {"model": Error, "description": "the claim is over: drop the task"}}


class GangClaimIn(StrictNumbers):
    model_config = ConfigDict(extra="forbid")
    worker: str = Field(min_length=1, max_length=200, description="the worker's name (host:pid)")
    host: str = Field(min_length=1, max_length=255, description="an address the other nodes reach this host at")
    devices: int = Field(ge=1, le=4096, description="the devices (processes) this worker runs: one node's")
    port: int = Field(ge=1, le=65535, description="a free port of its host, for the rendezvous if it is node 0")


class GangTaskOut(TaskOut):
    """A node of a run: the run's claim (one token for every node) and where the nodes meet."""

    node_rank: int = Field(description="this worker's node; node 0 hosts the rendezvous")
    nnodes: int
    nproc_per_node: int
    endpoint: str = Field(description="host:port of the c10d rendezvous (node 0's)")
    rendezvous_id: str = Field(description="torchrun's --rdzv-id: the run and its attempt")


class NodeResultIn(StrictNumbers):
    model_config = ConfigDict(extra="forbid")
    token: str = Field(min_length=1, max_length=64)
    node_rank: int = Field(ge=0)
    report: RunReport


class NodeFailIn(StrictNumbers):
    model_config = ConfigDict(extra="forbid")
    token: str = Field(min_length=1, max_length=64)
    node_rank: int = Field(ge=0)
    error: str = Field(min_length=1, max_length=20000)
    kind: Literal["error", "death", "lost_peer"] = Field(description="a rank's own error, a process killed, or a "
                                                                     "rank that only lost its peers")
    retry: bool = Field(default=False, description="queue the run again (it resumes from its last checkpoint)")
    handback: bool = Field(default=False, description="the node's worker is stopping and hands the run back "
                                                      "unharmed: queued again, the claim not counted as an attempt")


class NodeResultOut(BaseModel):
    complete: bool = Field(description="this was the last node: the run is done with the merged report")


class NodeFailOut(BaseModel):
    status: str


@router.post("/claim", response_model=GangTaskOut, responses={204: {"description": "no whole gang yet"}},
             summary="Wait for (or take) a node of a run that spans nodes")
def claim(body: GangClaimIn, db: DB, settings: Config, clock: AppClock) -> GangTaskOut | Response:
    c = gang.claim(db, body.worker, body.host, body.devices, body.port, settings.lease_seconds,
                   settings.max_attempts, clock=clock)
    if c is None:
        return Response(status_code=204)
    return GangTaskOut(kind="run", id=c.run_id, token=c.token, attempt=c.attempt, lease_seconds=c.lease_seconds,
                       lease_expires_at=c.lease_expires_at, node_rank=c.node_rank, nnodes=c.nnodes,
                       nproc_per_node=c.nproc_per_node, endpoint=c.endpoint,
                       rendezvous_id=f"run-{c.run_id}-a{c.attempt}", **c.payload)


@router.post("/run/{task_id}/result", response_model=NodeResultOut, responses=LOST,
             summary="One node's RunReport; the last completes the run")
def node_result(task_id: TaskId, body: NodeResultIn, db: DB, clock: AppClock) -> NodeResultOut:
    return NodeResultOut(complete=gang.post_node_report(db, task_id, body.token, body.node_rank, body.report,
                                                        clock=clock))


@router.post("/run/{task_id}/fail", response_model=NodeFailOut, responses=LOST, summary="A node of the run failed")
def node_fail(task_id: TaskId, body: NodeFailIn, db: DB, settings: Config, clock: AppClock) -> NodeFailOut:
    return NodeFailOut(status=gang.fail_node(db, task_id, body.token, body.node_rank, body.error, body.kind,
                                             retry=body.retry, max_attempts=settings.max_attempts, clock=clock,
                                             handback=body.handback))
