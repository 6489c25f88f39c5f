"""Resizing a running run through the service: the order (POST /api/runs/{id}/resize), how its
worker learns of it and answers (the heartbeat), what the run shows meanwhile; and, with real
processes, a worker SIGKILLed mid-run whose run another worker resumes from the checkpoint."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import httpx
import pytest

from search import RunReport
from tests.proctools import pids_mentioning
from tests.service.svchelp import ADMIN_TOKEN, api_client, query, run_report, start_server, start_worker, wait_job
from tests.service.test_api import app_client, claim, post_result, submit
from tests.worker.parity import assert_losses_match
from worker.reference import reference_losses


def _heartbeat(c, task: dict, **fields) -> dict:
    r = c.post(f"/api/tasks/run/{task['id']}/heartbeat", json={"token": task["token"], **fields})
    assert r.status_code == 200, r.text
    return r.json()


def test_resize_a_running_run_is_ordered_carried_and_answered(databases, backend, tiny_report):
    with app_client(databases, backend) as c:
        job = submit(c)
        assert post_result(c, claim(c, "w1"), tiny_report).status_code == 200
        run = c.post(f"/api/jobs/{job['id']}/launch", json={"steps": 9, "checkpoint_every": 3}).json()
        assert run["checkpoint_every"] == 3 and run["devices"] == 2 and run["segments"] == []
        r = c.post(f"/api/runs/{run['id']}/resize", json={"devices": 4})
        assert r.status_code == 409 and "queued, not running" in r.json()["detail"]
        assert c.post("/api/runs/999/resize", json={"devices": 4}).status_code == 404

        task = claim(c, "gpu-node", kinds=("run",))
        assert task["checkpoint"] is None and task["checkpoint_every"] == 3
        assert task["request"]["model"] == "gpt2-tiny"  # what the worker re-plans with
        assert _heartbeat(c, task, step=1)["resize"] is None
        for bad, field in (({"devices": 0}, "devices"), ({"devices": 4, "memory_per_device": "lots"},
                                                          "memory_per_device")):
            r = c.post(f"/api/runs/{run['id']}/resize", json=bad)
            assert r.status_code == 422 and field in r.text, r.text

        # 4 devices: the job has no frontier for them yet; the order goes out without a plan
        r = c.post(f"/api/runs/{run['id']}/resize", json={"devices": 4})
        assert r.status_code == 202 and r.headers["location"] == f"/api/runs/{run['id']}", r.text
        order = r.json()
        assert order["status"] == "pending" and order["run_id"] == run["id"] and order["outcome"] is None
        sent = _heartbeat(c, task, step=2)["resize"]
        assert sent["id"] == order["id"] and sent["devices"] == 4 and sent["plan"] is None
        assert sent["request"]["devices"] == 4 and sent["request"]["global_batch"] == 8  # the batch it trains with
        assert c.get(f"/api/runs/{run['id']}").json()["resize"]["id"] == order["id"]

        # the worker saves, moves and says so
        seg = {"from_step": 0, "to_step": 3, "devices": 2, "plan_summary": "a", "cause": "launch", "ended": "resize"}
        moved = {"from_step": 3, "to_step": 3, "devices": 4, "plan_summary": "b", "cause": "resize", "ended": "running",
                 "resize_s": {"save_s": 0.5, "replan_s": 2.0, "restart_s": 9.0, "load_s": 0.7}}
        answer = _heartbeat(c, task, step=3, checkpoint="/ckpt/run-1", devices=4, segments=[seg, moved],
                            resize_id=order["id"], resize_outcome="resized to 4 devices")
        assert answer["resize"] is None
        now = c.get(f"/api/runs/{run['id']}").json()
        assert now["checkpoint"] == "/ckpt/run-1" and now["devices"] == 4 and now["resize"] is None
        assert [s["devices"] for s in now["segments"]] == [2, 4] and now["segments"][1]["resize_s"]["load_s"] == 0.7
        done = c.get(f"/api/jobs/{job['id']}/resizes/{order['id']}").json()
        assert done["outcome"] == "resized to 4 devices"

        # the frontier for 4 devices comes in with no plan within the budget: a resize to 4 is a 422
        search = claim(c, "w1")
        none_fits = json.loads(tiny_report) | {"picked": None}
        assert post_result(c, search, json.dumps(none_fits)).status_code == 200
        r = c.post(f"/api/runs/{run['id']}/resize", json={"devices": 4})
        assert r.status_code == 422 and "fits its memory budget" in r.json()["detail"], r.text

        # back to 2 devices, whose frontier is stored: the order carries the plan; the run finishes first
        r = c.post(f"/api/runs/{run['id']}/resize", json={"devices": 2})
        assert r.status_code == 202 and r.json()["status"] == "ready"
        sent = _heartbeat(c, task)["resize"]
        assert sent["plan"]["num_devices"] == 2 and sent["strategy_id"] == r.json()["strategy"]["id"]
        st = c.get(f"/api/strategies/{run['strategy_id']}").json()
        r = c.post(f"/api/tasks/run/{task['id']}/result", json={"token": task["token"], "report": run_report(st["plan"], 9)})
        assert r.status_code == 200, r.text
        late = c.get(f"/api/jobs/{job['id']}/resizes/{sent['id']}").json()
        assert late["outcome"] == "not carried out: the run finished first"
        r = c.post(f"/api/runs/{run['id']}/resize", json={"devices": 2})
        assert r.status_code == 409 and "done, not running" in r.json()["detail"]


def _wait_run(http: httpx.Client, run_id: int, until, timeout: float = 600.0) -> dict:
    end = time.monotonic() + timeout
    while True:
        run = http.get(f"/api/runs/{run_id}").json()
        if until(run):
            return run
        assert run["status"] in ("queued", "running") and time.monotonic() < end, run
        time.sleep(0.2)


@pytest.mark.processes
def test_a_worker_killed_mid_run_is_resumed_from_its_checkpoint_by_another(databases, tmp_path, capsys):
    """The run checkpoints every 3 steps; its worker is SIGKILLed after the first checkpoint; its
    torchrun goes with it; once the lease expires another worker claims the run and goes on from
    the latest checkpoint (not from step 0), and every loss is the single process's."""
    db_url = databases.fresh("sqlite")
    server = start_server(db_url, tmp_path, lease=4)
    doomed = start_worker(server.url, "doomed", tmp_path, kinds="search,run")
    rescuer = None
    try:
        with api_client(server.url, timeout=120) as http:
            job = http.post("/api/jobs", json={"model": "llama-tiny", "device": "cpu", "devices": 2, "global_batch": 8,
                                               "precision": "fp32", "pipeline": False, "baselines": False}).json()
            assert wait_job(http, job["id"])["status"] == "done"
            run = http.post(f"/api/jobs/{job['id']}/launch", json={"steps": 24, "checkpoint_every": 3}).json()
            at = _wait_run(http, run["id"], lambda r: r["checkpoint"] is not None and (r["step"] or 0) >= 4)
            doomed.popen.send_signal(signal.SIGKILL)
            assert doomed.popen.wait(timeout=30) == -signal.SIGKILL
            assert at["status"] == "running" and at["worker"] == "doomed"
            run_dir = Path(at["checkpoint"])
            assert run_dir.parent == tmp_path / "paretoplan-checkpoints"
            rescuer = start_worker(server.url, "rescuer", tmp_path, kinds="run")
            done = _wait_run(http, run["id"], lambda r: r["status"] == "done")
            # `paretoplan resize` against the service: a finished run cannot move (409, one line, exit 2)
            from paretoplan.cli import main

            assert main(["resize", str(run["id"]), "--devices", "1", "--api", server.url, "--token", ADMIN_TOKEN]) == 2
            err = capsys.readouterr().err
            assert err.count("\n") == 1 and "is done, not running" in err and "(409)" in err, err
    finally:
        if rescuer is not None:
            rescuer.stop()
        doomed.stop()
        server.stop()
    rep = RunReport.model_validate(done["report"])
    assert done["attempts"] == 2 and done["worker"] == "rescuer" and rep.restarts == 1
    first, again = rep.segments
    assert (first.cause, first.ended, again.cause, again.ended) == ("launch", "failed", "restart", "finished")
    # not step 0: a checkpoint of every 3 steps, or a later one when the dying worker's torchrun
    # and ranks got SIGTERM from their lifeline in time to save first (seen under load: step 7)
    assert first.to_step >= 3 and again.from_step == first.to_step
    assert again.resize_s is not None and again.resize_s.load_s > 0
    ref = reference_losses("llama-tiny", 24, 8, rep.plan["seq_len"])
    assert_losses_match("llama-tiny resumed by another worker", rep.losses, ref, 24, 2e-5)
    # the killed worker's torchrun and ranks went with it: nothing of them is left
    left = pids_mentioning(str(run_dir / "launch-a1-"))
    assert left == [], left
    assert query(db_url, "SELECT count(*) FROM events WHERE run_id = :r AND message LIKE 'checkpoint at step%'",
                 r=run["id"])[0][0] >= 1


