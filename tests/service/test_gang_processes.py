"""A run that spans nodes, through the service with real processes: three workers of 2 devices,
a plan of 4; two of them run it as one gang (torchrun's multi-node agents meeting at a c10d
rendezvous) and the third gets none of it; then a gang whose node 1 loses its torchrun to SIGKILL
stops on both nodes and the run names the cause."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from search import RunReport
from tests.service.svchelp import Proc, _env, api_client, query, start_server, start_worker, wait_job, wait_ready
from tests.worker.parity import assert_losses_match
from worker.reference import reference_losses

pytestmark = [pytest.mark.processes, pytest.mark.slow]

JOB = {"model": "gpt2-tiny", "device": "cpu", "devices": 4, "devices_per_node": 2, "global_batch": 8,
       "precision": "fp32", "pipeline": False, "baselines": False}


def _gang_worker(url: str, name: str, tmp: Path) -> Proc:
    out, err = tmp / f"worker-{name}.out", tmp / f"worker-{name}.err"
    cmd = [sys.executable, "-m", "paretoplan", "worker", "--api", url, "--name", name, "--devices", "2",
           "--host", "127.0.0.1", "--poll", "0.2", "--rendezvous-timeout", "60"]
    popen = subprocess.Popen(cmd, stdout=out.open("w"), stderr=err.open("w"), cwd=tmp,
                             env=_env(PARETOPLAN_LOG_LEVEL="INFO"))
    proc = Proc(popen, out, err, url=name)
    wait_ready(proc)
    return proc


def _wait_run(http: httpx.Client, run_id: int, ok, timeout: float = 300.0) -> dict:
    end = time.monotonic() + timeout
    while True:
        run = http.get(f"/api/runs/{run_id}").json()
        if ok(run):
            return run
        assert time.monotonic() < end, f"run {run_id}: {run}"
        time.sleep(0.2)


def _torchruns(rendezvous_id: str) -> dict[int, int]:
    """node rank -> pid of the torchrun agents of this rendezvous."""
    out = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes().decode(errors="replace").split("\0")
            except OSError:
                continue
            if "torch.distributed.run" in cmd and f"--rdzv-id={rendezvous_id}" in cmd:
                node = next(int(a.split("=")[1]) for a in cmd if a.startswith("--node-rank="))
                out[node] = int(d.name)
    return out


def test_two_workers_run_a_four_device_plan_as_a_gang_and_a_killed_node_stops_both(databases, tmp_path):
    db_url = databases.fresh("sqlite")
    server = start_server(db_url, tmp_path, lease=20)
    searcher = start_worker(server.url, "searcher", tmp_path, kinds="search")
    gang = [_gang_worker(server.url, f"node{i}", tmp_path) for i in range(3)]
    try:
        with api_client(server.url, timeout=120) as http:
            job = http.post("/api/jobs", json=JOB).json()
            assert wait_job(http, job["id"])["status"] == "done"
            run = http.post(f"/api/jobs/{job['id']}/launch", json={"steps": 4}).json()
            done = _wait_run(http, run["id"], lambda r: r["status"] in ("done", "failed"))
            assert done["status"] == "done", done
            rep = RunReport.model_validate(done["report"])
            assert [(n.node_rank, n.ranks) for n in rep.nodes] == [(0, [0, 1]), (1, [2, 3])]
            assert [r.rank for r in rep.measured.per_rank] == [0, 1, 2, 3]
            ref = reference_losses("gpt2-tiny", 4, 8, rep.plan["seq_len"])
            assert_losses_match("gpt2-tiny on a gang of 2 nodes", rep.losses, ref, 4, 2e-5)
            owners = done["worker"].split(",")
            assert len(owners) == 2 and set(owners) < {"node0", "node1", "node2"}
            idle = ({"node0", "node1", "node2"} - set(owners)).pop()
            assert f"run {run['id']}" not in next(w for w in gang if w.url == idle).log()  # none of it

            # node 1's torchrun dies mid-run: node 0 stops too, and the run says why
            run = http.post(f"/api/jobs/{job['id']}/launch", json={"steps": 100_000}).json()
            rdzv = f"run-{run['id']}-a1"
            _wait_run(http, run["id"], lambda r: (r["step"] or 0) >= 2)
            agents = _torchruns(rdzv)
            assert sorted(agents) == [0, 1], agents
            killed_at = time.monotonic()
            os.kill(agents[1], signal.SIGKILL)
            failed = _wait_run(http, run["id"], lambda r: r["status"] != "running", timeout=180)
            stopped_in = time.monotonic() - killed_at
            assert failed["status"] == "failed", failed
            assert "node 1 (" in failed["error"] and "torchrun was killed (SIGKILL)" in failed["error"], failed
            deadline = time.monotonic() + 60
            while _torchruns(rdzv) and time.monotonic() < deadline:
                time.sleep(0.2)
            assert _torchruns(rdzv) == {}, "a node of the failed run is still running"
            print(f"the run failed {stopped_in:.1f} s after node 1's torchrun was killed")
    finally:
        for w in gang:
            w.stop()
        searcher.stop()
        server.stop()
    also = query(db_url, "SELECT message FROM events WHERE run_id = :r AND message LIKE 'also failed:%'", r=run["id"])
    assert len(also) <= 1  # the survivor's own report of the failure, when it came after the cause
