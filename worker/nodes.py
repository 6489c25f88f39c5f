"""Runs that span nodes: torchrun's multi-node agent, one per node, meeting at a c10d rendezvous.

Every node runs the same command (`worker.launch.run_jobs` with a `Rendezvous`): torchrun
`--nnodes N --nproc-per-node K` with the c10d rendezvous at one endpoint and the run's id as the
rendezvous id. torchrun numbers the nodes as they join (its group rank) and gives node g the
global ranks g*K .. g*K + K - 1; the Plan's device d is rank d (search.plans.nodes), so every
rank's mesh coordinates are the Plan's, whichever machine plays node g (the nodes are alike).

Each node's first rank writes the figures of that node's ranks; `merge_results` joins them into
the one result a single-node launch writes. `run_local_nodes` starts N agents on this machine on
a loopback rendezvous - the same code path real nodes take, for tests and for trying it out.

A node that dies must not leave the others waiting: the surviving ranks' collectives fail when
their peers' connections close, and where a peer merely goes silent, every collective gives up
after `Rendezvous.timeout_s` (the process group's timeout); the rendezvous itself waits at most
as long for all nodes to join. Locally, the first node to fail stops the others at once.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from search import Plan
from search.plans.nodes import nodes_blocker
from worker.analyze import Unsupported
from worker.spec import Job

COLLECTIVE_TIMEOUT_ENV = "PARETOPLAN_COLLECTIVE_TIMEOUT_S"  # read by worker.executor


class Rendezvous(BaseModel):
    """Where and how the nodes of one run meet (torchrun's c10d rendezvous)."""

    endpoint: str = Field(description="host:port of the c10d store, on the first node")
    run_id: str = Field(description="the rendezvous id: the run's id, so two runs never meet")
    nnodes: int = Field(ge=1)
    nproc_per_node: int = Field(ge=1)
    node_rank: int = Field(ge=0, description="this node's place in the gang; node 0 hosts the store")
    timeout_s: float = Field(default=300.0, gt=0, description="most seconds to wait for all nodes to join, and "
                             "for any one collective: a node that dies stops the others within this bound")

    def torchrun_args(self) -> list[str]:
        is_host = 1 if self.node_rank == 0 else 0
        t = max(1, int(self.timeout_s))
        return [f"--nnodes={self.nnodes}", f"--nproc-per-node={self.nproc_per_node}", "--rdzv-backend=c10d",
                f"--rdzv-endpoint={self.endpoint}", f"--rdzv-id={self.run_id}", f"--node-rank={self.node_rank}",
                f"--rdzv-conf=is_host={is_host},join_timeout={t},read_timeout={t},close_timeout=10"]


def check_nodes(plan: Plan, nodes: int) -> None:
    """Refuse (Unsupported) a plan that should not run on `nodes` nodes, before anything starts."""
    if nodes == 1:
        return
    blocker = nodes_blocker(plan, nodes)
    if blocker is not None:
        raise Unsupported(blocker)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` now (the rendezvous store binds it moments later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def merge_results(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One launch's result from its nodes' results: every node's ranks and node record, the
    losses and stop of any node (every rank holds the same: they are all-reduced)."""
    if not parts:
        raise ValueError("no node results to merge")
    first = min(parts, key=lambda p: min(p["nodes"][0]["ranks"]))
    ranks = sorted((r for p in parts for r in p["ranks"]), key=lambda r: r["rank"])
    nodes = sorted((n for p in parts for n in p["nodes"]), key=lambda n: n["node_rank"])
    return {**first, "ranks": ranks, "nodes": nodes}


def run_local_nodes(jobs: list[Job], nodes: int, *, workdir: Path, run_id: str,
                    progress: Callable[[dict], None] | None = None, timeout: float | None = None,
                    rendezvous_timeout_s: float = 60.0) -> list[dict[str, Any]]:
    """Run jobs as `nodes` torchrun agents on this machine (loopback rendezvous); the merged raw
    result per job. The first agent to fail stops the others; its error is the run's (an agent
    whose ranks only lost their peers is the collateral of another's)."""
    from worker.launch import RunFailed, run_jobs

    n = jobs[0].spec.num_devices
    if n % nodes:
        raise ValueError(f"{n} processes do not split evenly over {nodes} nodes")
    rdzv = Rendezvous(endpoint=f"127.0.0.1:{free_port()}", run_id=run_id, nnodes=nodes,
                      nproc_per_node=n // nodes, node_rank=0, timeout_s=rendezvous_timeout_s)
    abort = threading.Event()
    results: list[list[dict[str, Any]] | None] = [None] * nodes
    errors: list[tuple[float, RunFailed]] = []
    lock = threading.Lock()

    def agent(i: int) -> None:
        try:
            results[i] = run_jobs(jobs, workdir=workdir / f"node-{i}", progress=progress, timeout=timeout,
                                  rendezvous=rdzv.model_copy(update={"node_rank": i}), abort=abort, keep=True)
        except RunFailed as e:
            with lock:
                errors.append((time.monotonic(), RunFailed(f"node {i}: {e}", rank=e.rank, log=e.log, died=e.died)))
            abort.set()  # the others would only wait for a peer that is gone

    threads = [threading.Thread(target=agent, args=(i,), name=f"node-{i}") for i in range(nodes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise cause(errors)
    done = [r for r in results if r is not None]
    return [merge_results([r[j] for r in done]) for j in range(len(jobs))]


def cause(errors: list[tuple[float, Any]]) -> Any:
    """The error that stands for a failed multi-node run: a rank's own error, then a death (a
    killed agent or rank), then a rank that lost its peers, then a node stopped for another's
    failure; the earliest of a kind first."""
    def weight(item: tuple[float, Any]) -> tuple[int, float]:
        _, e = item
        if "stopped: another node failed" in str(e):
            return (3, item[0])
        if not e.died:
            return (0, item[0])  # an error a rank raised
        return (2 if e.rank is not None else 1, item[0])  # a rank that lost its peers, after the death itself

    return min(errors, key=weight)[1]
