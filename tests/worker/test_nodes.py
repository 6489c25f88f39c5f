"""Runs that span nodes: torchrun agents meeting at a c10d rendezvous, one per node, on this
machine through the same code path real nodes take (worker.nodes)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from worker.nodes import Rendezvous, cause, merge_results


def _node(rank0: int, node: int) -> dict:
    ranks = [{"rank": r, "coord": {"dp": r}, "times": [0.1], "timed": [0], "time_s": 0.1, "memory_bytes": 10}
             for r in (rank0, rank0 + 1)]
    return {"losses": [1.0], "first_step": 0, "stopped": None, "ranks": ranks,
            "nodes": [{"node_rank": node, "host": f"h{node}", "ranks": [rank0, rank0 + 1]}]}


def test_node_results_merge_in_rank_order():
    raw = merge_results([_node(2, 1), _node(0, 0)])
    assert [r["rank"] for r in raw["ranks"]] == [0, 1, 2, 3]
    assert [(n["node_rank"], n["ranks"]) for n in raw["nodes"]] == [(0, [0, 1]), (1, [2, 3])]
    assert raw["losses"] == [1.0]


def test_the_first_node_hosts_the_store_and_the_run_id_is_the_rendezvous_id():
    r = Rendezvous(endpoint="10.0.0.1:29500", run_id="run-17", nnodes=2, nproc_per_node=4, node_rank=0)
    args = r.torchrun_args()
    assert "--nnodes=2" in args and "--nproc-per-node=4" in args and "--rdzv-id=run-17" in args
    assert any(a.startswith("--rdzv-conf=is_host=1,") for a in args)
    assert any(a.startswith("--rdzv-conf=is_host=0,") for a in r.model_copy(update={"node_rank": 1}).torchrun_args())


def test_a_rank_error_is_the_cause_before_a_lost_peer_or_a_stopped_node():
    from worker.launch import RunFailed

    lost = RunFailed("node 0: rank 1 lost its peers", rank=1, died=True)
    own = RunFailed("node 1: rank 2 failed: ValueError: x", rank=2)
    stopped = RunFailed("node 0: stopped: another node failed")
    assert cause([(1.0, stopped), (2.0, lost), (3.0, own)]) is own
    assert cause([(1.0, stopped), (2.0, lost)]) is lost


@pytest.mark.processes
@pytest.mark.slow
def test_run_on_two_nodes_trains_as_one_process(tmp_path):
    """The issue's done-when: 4 devices on 2 nodes give the single process's losses, and the
    report names each node and its ranks."""
    from worker.reference import reference_losses

    report = tmp_path / "r.json"
    p = subprocess.run([sys.executable, "-m", "paretoplan", "run", "--model", "llama-tiny", "--devices", "4",
                        "--nodes", "2", "--steps", "6", "--seed", "7", "--report", str(report), "--no-progress"],
                       capture_output=True, text=True, timeout=400, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "2 nodes of 2 ranks:" in p.stderr and "inside a node" in p.stderr
    rep = json.loads(report.read_text())
    assert [(n["node_rank"], n["ranks"]) for n in rep["nodes"]] == [(0, [0, 1]), (1, [2, 3])]
    ref = reference_losses("llama-tiny", 6, rep["plan"]["global_batch"], rep["plan"]["seq_len"], seed=7)
    assert max(abs(a - b) / abs(b) for a, b in zip(rep["losses"], ref, strict=True)) < 1e-4
    # every tensor group lies inside one node: the plan's devices_per_node is the launch's
    assert rep["plan"]["devices_per_node"] == 2


def _agent_of_node(node: int) -> int | None:
    """The pid of this test's torchrun agent for `node` (its command line names the node rank)."""
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"torch.distributed.run" in cmd and f"--node-rank={node}".encode() in cmd and \
                    int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == os.getpid():
                return int(d.name)
    return None


@pytest.mark.processes
@pytest.mark.slow
def test_a_killed_node_stops_the_other_and_the_run_names_it(tmp_path):
    from search import EstimateRequest, estimate
    from worker.analyze import analyze
    from worker.launch import RunFailed, _alive
    from worker.nodes import run_local_nodes
    from worker.spec import Job, RunSettings

    plan = estimate(EstimateRequest(model="gpt2-tiny", device="cpu", devices=4, devices_per_node=2, global_batch=8,
                                    precision="fp32", tp=2)).plan
    job = Job(spec=analyze(plan), settings=RunSettings(steps=10_000, warmup=1, measure_memory=False))
    stepped = threading.Event()
    outcome: dict = {}

    def run() -> None:
        try:
            run_local_nodes([job], 2, workdir=tmp_path, run_id="kill-test",
                            progress=lambda m: "step" in m and stepped.set(), timeout=600)
        except RunFailed as e:
            outcome["error"] = e

    t = threading.Thread(target=run)
    t.start()
    assert stepped.wait(300), "the run never trained a step"
    agent = _agent_of_node(1)
    assert agent is not None
    os.kill(agent, signal.SIGKILL)
    t.join(180)  # a hang detector: without the bound the surviving node would wait at a collective for ever
    assert not t.is_alive(), "the surviving node did not stop"
    e = outcome["error"]
    assert e.died and "node 1: torchrun was killed (SIGKILL)" in str(e), str(e)
    time.sleep(0.5)
    assert _agent_of_node(0) is None and not _alive(agent)
