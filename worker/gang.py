"""`paretoplan worker --devices K`: a worker that runs one node of runs spanning nodes.

It advertises its host, its K devices and a free port of its host, and polls the service's gang
claim (/api/gangs/claim) instead of the plain one: the service hands it a node of a run only when
a whole gang of workers of K devices is there for the run's N * K (service.gang). Then it starts
torchrun's multi-node agent for its node (`worker.nodes.Rendezvous`: c10d at node 0's host and
port, the run and attempt as rendezvous id), heartbeats the run with the run's one token, and
posts its own ranks' RunReport; the service merges the nodes'.

When its node fails it tells the service what kind of failure it saw: a rank's own error, a
death (its torchrun or a rank killed), or only a lost peer (another node died), so the run's
cause is the one that says most. A run that saves checkpoints goes back to the queue after a
death, and the next gang resumes it from its last checkpoint (the run directory must be on a
file system every node shares); a run without checkpoints fails. A gang never restarts on its
own: the nodes must restart together, and only the service can gather them.
"""

from __future__ import annotations

import logging
import shutil
import socket
from pathlib import Path
from typing import Any

import httpx

from search import FrontierReport, Plan, RunReport
from worker.agent import Agent, Lease, worker_token_from_env
from worker.client import ServiceClient, ServiceError, Task, _raise_for
from worker.elastic import Elastic, run_plan
from worker.launch import RunFailed
from worker.nodes import Rendezvous, free_port

log = logging.getLogger("paretoplan.worker")


class GangTask(Task):
    """A node of a run, as the service hands it out (POST /api/gangs/claim)."""

    node_rank: int
    nnodes: int
    nproc_per_node: int
    endpoint: str
    rendezvous_id: str


def claim_node(client: ServiceClient, worker: str, host: str, devices: int, port: int) -> GangTask | None:
    r = client.http.post("/api/gangs/claim", json={"worker": worker, "host": host, "devices": devices, "port": port})
    _raise_for(r)
    return None if r.status_code == 204 else GangTask.model_validate(r.json())


def post_node_report(client: ServiceClient, task: GangTask, report: RunReport) -> bool:
    """This node's report (gzip, retried through outages); True when it was the last and the run is complete."""
    return client.node_result(task.id, task.token, task.node_rank, report)


def post_node_failure(client: ServiceClient, task: GangTask, error: str, kind: str, retry: bool,
                      handback: bool = False) -> str:
    body: dict[str, Any] = {"token": task.token, "node_rank": task.node_rank, "error": error[:20000] or "failed",
                            "kind": kind, "retry": retry}
    if handback:
        body["handback"] = True
    r = client.http.post(f"/api/gangs/run/{task.id}/fail", json=body)
    _raise_for(r)
    return str(r.json()["status"])


def failure_kind(e: BaseException) -> str:
    """error: a rank raised one of its own; death: a process was killed; lost_peer: its ranks only
    lost their peers on another node."""
    if not isinstance(e, RunFailed) or not e.died:
        return "error"
    return "lost_peer" if e.rank is not None or "lost its peers" in str(e) else "death"


class GangWorker(Agent):
    def __init__(self, api: str, *, devices: int, host: str | None = None, rendezvous_timeout_s: float = 300.0,
                 **kwargs: Any) -> None:
        super().__init__(api, kinds=("run",), **kwargs)
        self.devices = devices
        self.host = host or socket.gethostname()
        self.rendezvous_timeout_s = rendezvous_timeout_s
        self._failure: BaseException | None = None

    def _claim(self) -> Task | None:
        return claim_node(self.client, self.name, self.host, self.devices, free_port(""))

    def _deliver(self, task: Task, result: FrontierReport | RunReport) -> None:
        assert isinstance(task, GangTask) and isinstance(result, RunReport)
        done = post_node_report(self.client, task, result)
        if done:  # every node has reported: nothing resumes the run
            shutil.rmtree(self.checkpoints / f"run-{task.id}", ignore_errors=True)
        log.info("run %s: node %s reported%s", task.id, task.node_rank, "; the run is complete" if done else "")

    def _run(self, task: Task, lease: Lease) -> RunReport:
        assert isinstance(task, GangTask)
        if task.plan is None or task.steps is None:
            raise RuntimeError(f"the service handed out run {task.id} without its plan and steps")
        plan = Plan.model_validate(task.plan)
        rdzv = Rendezvous(endpoint=task.endpoint, run_id=task.rendezvous_id, nnodes=task.nnodes,
                          nproc_per_node=task.nproc_per_node, node_rank=task.node_rank,
                          timeout_s=self.rendezvous_timeout_s)
        lease.progress(stage="launching", fraction=0.0,
                       message=f"node {task.node_rank} of {task.nnodes} on {self.host}: rendezvous at {task.endpoint}")
        run_dir = Path(task.checkpoint) if task.checkpoint and Path(task.checkpoint).is_dir() else \
            self.checkpoints / f"run-{task.id}"
        resume = run_dir if task.checkpoint and run_dir.is_dir() else None
        # only the node that runs global rank 0 sees the progress lines (torchrun numbers the nodes
        # as they join, not as the gang was assigned): that node speaks for the run's progress

        def progress(step: int, total: int) -> None:
            lease.check()
            lease.progress(stage="training", step=step, fraction=min(1.0, step / max(total, 1)))

        def saved(where: str, step: int) -> None:
            lease.progress(checkpoint=where, message=f"checkpoint at step {step}")

        elastic = Elastic(run_dir=run_dir, every=task.checkpoint_every, resume=resume, tag=f"a{task.attempt}-",
                          max_restarts=0, rendezvous=rdzv, on_checkpoint=saved,
                          on_note=lambda note: lease.progress(message=f"node {task.node_rank}: {note}"))
        self._failure = None
        try:
            report = run_plan(plan, task.steps, elastic=elastic, progress=progress,
                              timeout=self.limits.run_seconds)  # bounded as a plain worker's run is
        except RunFailed as e:
            self._failure = e
            raise
        lease.check()
        lease.flush()
        return report

    def _give_back(self, task: Task, error: str, *, input_error: bool = False, retry: bool = False,
                   handback: bool = False) -> None:
        if not isinstance(task, GangTask):
            return super()._give_back(task, error, input_error=input_error, retry=retry, handback=handback)
        failure, self._failure = self._failure, None
        kind = "error" if failure is None else failure_kind(failure)
        # after a death the run goes on from its last checkpoint, when it saves any, on a new gang;
        # a stopped worker (SIGTERM) hands it back without counting the claim
        again = retry or handback or (kind != "error" and bool(task.checkpoint_every))
        try:
            status = post_node_failure(self.client, task, error, kind, again, handback=handback)
            log.info("run %s: node %s failed (%s); the run is %s", task.id, task.node_rank, kind, status)
        except (ServiceError, httpx.HTTPError) as e:
            log.warning("could not report the failure of node %s of run %s: %s", task.node_rank, task.id, e)


def main(api: str, *, devices: int, host: str | None = None, name: str | None = None, poll_seconds: float = 1.0,
         max_tasks: int | None = None, exit_with_parent: bool = False, checkpoint_dir: str | None = None,
         rendezvous_timeout_s: float = 300.0) -> int:
    import os
    import sys

    from search import InputError

    if devices < 1:
        raise InputError(f"--devices must be at least 1, got {devices}")
    token = worker_token_from_env()
    logging.basicConfig(level=os.environ.get("PARETOPLAN_LOG_LEVEL", "INFO"),
                        format="%(asctime)s worker %(levelname)s %(message)s", stream=sys.stderr)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    return GangWorker(api, devices=devices, host=host, name=name, poll_seconds=poll_seconds, max_tasks=max_tasks,
                      worker_token=token, exit_with_parent=exit_with_parent,
                      checkpoint_dir=checkpoint_dir, rendezvous_timeout_s=rendezvous_timeout_s).serve()
