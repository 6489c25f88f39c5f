"""One node of a run that a cluster's scheduler started (Slurm, Kubernetes), and the merge after.

    python -m worker.batch node --plan P.json --steps S --nnodes N --nproc-per-node K \\
        --endpoint HOST:PORT --rdzv-id ID --node-rank R --out DIR
    python -m worker.batch merge DIR --nodes N --report DIR/report.json

`node` runs this machine's share of the plan as workers do (worker.elastic with a `Rendezvous`:
torchrun's multi-node agent, c10d at the endpoint, on the first node) and writes its own ranks'
RunReport to DIR/node-<torchrun's node rank>.json; `merge` joins the nodes' reports into one
(search.plans.merge). DIR must be a folder every node sees (the job's shared file system).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from search import InputError, Plan, RunReport
from search.plans.merge import merge_node_reports


def run_node(args: argparse.Namespace) -> int:
    from worker.elastic import Elastic, run_plan
    from worker.launch import RunFailed, default_device
    from worker.nodes import Rendezvous
    from worker.spec import RunSettings

    plan = Plan.model_validate(json.loads(Path(args.plan).read_text()))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rdzv = Rendezvous(endpoint=args.endpoint, run_id=args.rdzv_id, nnodes=args.nnodes,
                      nproc_per_node=args.nproc_per_node, node_rank=args.node_rank, timeout_s=args.timeout)
    settings = RunSettings(steps=args.steps, warmup=min(2, args.steps - 1), seed=args.seed,
                           device=args.device or default_device())
    with _lease(args) as lease:
        def progress(step: int, total: int) -> None:
            if lease is not None:
                lease.progress(stage="training", step=step, fraction=min(1.0, step / max(total, 1)))

        try:
            report = run_plan(plan, settings=settings, progress=progress,
                              elastic=Elastic(run_dir=out / "run", rendezvous=rdzv, max_restarts=0, tag="batch-"))
        except RunFailed as e:
            (out / f"failed-node{args.node_rank}.txt").write_text(str(e))
            print(f"paretoplan: node {args.node_rank}: run failed: {str(e).splitlines()[0]}", file=sys.stderr)
            return 4
    node = report.nodes[0].node_rank if report.nodes else 0
    (out / f"node-{node}.json").write_text(report.model_dump_json())
    return 0


@contextmanager
def _lease(args: argparse.Namespace) -> Iterator[Any]:
    """Heartbeats of the service's run this job carries out (worker.agent.Lease), or None."""
    if not args.api:
        yield None
        return
    from worker.agent import Lease
    from worker.client import Task

    task = Task(kind="run", id=args.run_id, token=args.token, attempt=1, lease_seconds=args.lease)
    with Lease(args.api, args.worker_token, task) as lease:
        yield lease


def _post(args: argparse.Namespace, report: RunReport | None, error: str | None) -> None:
    """The merged report (or the failure) to the service's run, through the worker's REST client."""
    from worker.client import ServiceClient

    with ServiceClient(args.api, worker_token=args.worker_token) as client:
        if report is not None:
            client.run_result(args.run_id, args.token, report)
        else:
            client.fail("run", args.run_id, args.token, error or "failed")


def merge(folder: Path, nodes: int, wait_s: float = 0.0) -> RunReport:
    """The run's report from the node reports in `folder` (InputError when any is missing);
    `wait_s`: wait that long for the other nodes' reports (a node that merges after its own)."""
    import time

    end = time.monotonic() + wait_s
    while len(list(folder.glob("node-*.json"))) < nodes and not list(folder.glob("failed-node*.txt")) \
            and time.monotonic() < end:
        time.sleep(1.0)
    paths = sorted(folder.glob("node-*.json"))
    if len(paths) != nodes:
        failed = sorted(folder.glob("failed-node*.txt"))
        why = "; ".join(p.read_text().splitlines()[0] for p in failed if p.read_text()) or "no failure was written"
        raise InputError(f"{len(paths)} of {nodes} nodes reported in {folder} ({why})")
    return merge_node_reports([RunReport.model_validate_json(p.read_text()) for p in paths])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="worker.batch")
    sub = ap.add_subparsers(dest="command", required=True)
    n = sub.add_parser("node", help="run this machine's node of a plan")
    n.add_argument("--plan", required=True)
    n.add_argument("--steps", type=int, required=True)
    n.add_argument("--seed", type=int, default=0)
    n.add_argument("--nnodes", type=int, required=True)
    n.add_argument("--nproc-per-node", type=int, required=True)
    n.add_argument("--endpoint", required=True, help="host:port of the c10d rendezvous (the first node)")
    n.add_argument("--rdzv-id", required=True)
    n.add_argument("--node-rank", type=int, required=True, help="this node's task rank; 0 hosts the rendezvous")
    n.add_argument("--out", required=True)
    n.add_argument("--device", choices=["cpu", "cuda"], default=None)
    n.add_argument("--timeout", type=float, default=300.0, help="rendezvous and collective timeout, seconds")
    m = sub.add_parser("merge", help="join the nodes' reports")
    m.add_argument("folder")
    m.add_argument("--nodes", type=int, required=True)
    m.add_argument("--report", required=True)
    m.add_argument("--wait", type=float, default=0.0, help="seconds to wait for every node's report")
    for p in (n, m):
        p.add_argument("--api", default=None, help="the paretoplan service whose run this job carries out")
        p.add_argument("--run-id", type=int, default=None)
        p.add_argument("--token", default=None, help="the run's claim token")
        p.add_argument("--lease", type=float, default=30.0, help="the claim's lease, seconds")
    args = ap.parse_args(argv)
    if args.api and (args.run_id is None or not args.token):
        ap.error("--api needs --run-id and --token")
    args.worker_token = None
    if args.api:  # the worker protocol takes a worker token (from the job's environment: the scheduler's secret)
        args.worker_token = os.environ.get("PARETOPLAN_WORKER_TOKEN", "").strip()
        if not args.worker_token:
            ap.error("--api needs PARETOPLAN_WORKER_TOKEN: the service takes a worker token on the worker protocol")
    try:
        if args.command == "node":
            return run_node(args)
        report = merge(Path(args.folder), args.nodes, args.wait)
    except InputError as e:
        print(f"paretoplan: error: {e}", file=sys.stderr)
        if args.command == "merge" and args.api:
            _post(args, None, str(e))
        return 2
    if args.api:
        _post(args, report, None)
    Path(args.report).write_text(report.model_dump_json(indent=1))
    print(f"paretoplan: {len(report.nodes)} nodes reported; loss {report.losses[0]:.4f} -> {report.losses[-1]:.4f}; "
          f"report in {args.report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
