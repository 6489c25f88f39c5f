"""Gang claims through the REST protocol (the real app on SQLite and PostgreSQL, playing the
workers): a run of N x K devices goes to N workers of K devices together or to none; each node
posts its ranks' report and the last one completes the run with the merged report; a failed node
fails the run with the cause that says most."""

from __future__ import annotations

import json

from search import NodeRecord, RunReport
from tests.service.svchelp import query, run_report
from tests.service.test_api import app_client, claim, post_result, submit


def _gang_claim(c, worker: str, devices: int, port: int = 29400, host: str = "127.0.0.1") -> dict | None:
    r = c.post("/api/gangs/claim", json={"worker": worker, "host": host, "devices": devices, "port": port})
    assert r.status_code in (200, 204), r.text
    return None if r.status_code == 204 else r.json()


def _node_report(plan: dict, steps: int, node: int, per_node: int, time_s: float, memory: int) -> str:
    rep = RunReport.model_validate(run_report(plan, steps, time_s=time_s, memory_bytes=memory))
    ranks = list(range(node * per_node, (node + 1) * per_node))
    measured = rep.measured.model_copy(update={"per_rank": [r for r in rep.measured.per_rank if r.rank in ranks]})
    return rep.model_copy(update={"measured": measured, "nodes": [NodeRecord(node_rank=node, host=f"h{node}",
                                                                             ranks=ranks)]}).model_dump_json()


def _post_node(c, task: dict, report_json: str):
    body = f'{{"token": {json.dumps(task["token"])}, "node_rank": {task["node_rank"]}, "report": {report_json}}}'
    return c.post(f"/api/gangs/run/{task['id']}/result", content=body, headers={"Content-Type": "application/json"})


def _launched(c, tiny_report: str) -> tuple[dict, dict]:
    job = submit(c)  # gpt2-tiny on 2 devices
    assert post_result(c, claim(c, "searcher"), tiny_report).status_code == 200
    run = c.post(f"/api/jobs/{job['id']}/launch", json={"steps": 3}).json()
    return job, run


def test_two_workers_take_a_run_together_and_a_third_gets_none_of_it(databases, backend, tiny_report):
    with app_client(databases, backend) as c:
        job, run = _launched(c, tiny_report)
        assert _gang_claim(c, "a", 1, port=29411) is None  # alone it waits: nothing is claimed
        assert c.get(f"/api/runs/{run['id']}").json()["status"] == "queued"
        b = _gang_claim(c, "b", 1, port=29412)  # completes the gang: b learns its node at once
        assert b is not None and b["id"] == run["id"] and b["nnodes"] == 2 and b["nproc_per_node"] == 1
        assert _gang_claim(c, "third", 1) is None  # a third worker never gets a part of it
        a = _gang_claim(c, "a", 1, port=29411)
        assert a is not None and a["token"] == b["token"]  # one lease for the gang
        # the worker that completed the gang is node 0 (it starts at once) and hosts the rendezvous
        assert (b["node_rank"], a["node_rank"]) == (0, 1) and a["endpoint"] == b["endpoint"] == "127.0.0.1:29412"
        assert a["rendezvous_id"] == b["rendezvous_id"] == f"run-{run['id']}-a1"
        now = c.get(f"/api/runs/{run['id']}").json()
        assert now["status"] == "running" and now["attempts"] == 1
        # every node heartbeats the run with the run's token
        for t in (a, b):
            r = c.post(f"/api/tasks/run/{t['id']}/heartbeat", json={"token": t["token"], "step": 1})
            assert r.status_code == 200, r.text
        plan = a["plan"]
        first = _post_node(c, a, _node_report(plan, 3, a["node_rank"], 1, 0.010, 1000))
        assert first.status_code == 200 and first.json() == {"complete": False}
        assert c.get(f"/api/runs/{run['id']}").json()["status"] == "running"
        # a second report of a node that has reported is refused, and nothing is stored
        wrong = _post_node(c, b, _node_report(plan, 3, a["node_rank"], 1, 0.020, 2000))
        assert wrong.status_code == 422 and "reported already" in wrong.text, wrong.text
        last = _post_node(c, b, _node_report(plan, 3, b["node_rank"], 1, 0.020, 2000))
        assert last.status_code == 200 and last.json() == {"complete": True}, last.text
        done = c.get(f"/api/runs/{run['id']}").json()
        assert done["status"] == "done"
        rep = RunReport.model_validate(done["report"])
        assert [(n.node_rank, n.ranks) for n in rep.nodes] == [(0, [0]), (1, [1])]
        assert [r.rank for r in rep.measured.per_rank] == [0, 1]
        # merged: the slowest node per step, the peak over both
        assert rep.measured.time_s == 0.020 and rep.measured.memory_bytes == 2000
        assert query(c.db_url, "SELECT count(*) FROM gang_members WHERE run_id = :r", r=run["id"]) == [(0,)]
        # a worker of the run's whole size takes a run alone (a gang of one)
        run2 = c.post(f"/api/jobs/{job['id']}/launch", json={"steps": 3}).json()
        solo = _gang_claim(c, "big", 2)
        assert solo is not None and solo["id"] == run2["id"] and solo["nnodes"] == 1 and solo["node_rank"] == 0


def test_a_dead_node_fails_the_run_with_the_cause_that_says_most(databases, backend, tiny_report):
    with app_client(databases, backend) as c:
        _, run = _launched(c, tiny_report)
        assert _gang_claim(c, "a", 1) is None
        b = _gang_claim(c, "b", 1)
        a = _gang_claim(c, "a", 1)
        assert a is not None and b is not None
        survivor, dead, dead_name = (a, b, "b") if a["node_rank"] == 0 else (b, a, "a")
        # the survivor reports first: its ranks only lost their peers
        r = c.post(f"/api/gangs/run/{run['id']}/fail", json={"token": survivor["token"], "node_rank": 0,
                   "error": "rank 0 lost its peers", "kind": "lost_peer"})
        assert r.status_code == 200 and r.json()["status"] == "failed", r.text
        r = c.post(f"/api/gangs/run/{run['id']}/fail", json={"token": dead["token"], "node_rank": 1,
                   "error": "torchrun was killed (SIGKILL)", "kind": "death"})
        assert r.status_code == 200 and r.json()["status"] == "failed", r.text
        failed = c.get(f"/api/runs/{run['id']}").json()
        assert failed["status"] == "failed"
        assert failed["error"] == f"node 1 ({dead_name}): torchrun was killed (SIGKILL)"
        # the claim is over for both: another report is refused
        assert _post_node(c, survivor, "{}").status_code in (409, 422)
        r = c.post(f"/api/gangs/run/{run['id']}/result", json={"token": "x" * 32, "node_rank": 0, "report": {}})
        assert r.status_code == 422  # not a report


def test_a_gang_lost_whole_leaves_its_run_to_the_next_gang(databases, backend, tiny_report):
    with app_client(databases, backend) as c:
        _, run = _launched(c, tiny_report)
        assert _gang_claim(c, "a", 1) is None
        old = _gang_claim(c, "b", 1)
        assert old is not None and old["attempt"] == 1
        c.clock.advance(3600)  # neither node heartbeats: the run's lease expires
        assert _gang_claim(c, "c", 1) is None
        new = _gang_claim(c, "d", 1)
        assert new is not None and new["id"] == run["id"] and new["attempt"] == 2 and new["token"] != old["token"]
        assert new["rendezvous_id"] == f"run-{run['id']}-a2"
        # the lost gang's claim is over
        r = c.post(f"/api/tasks/run/{run['id']}/heartbeat", json={"token": old["token"]})
        assert r.status_code == 409


def test_the_gang_routes_take_the_worker_token_only(databases, backend, tiny_report):
    """/api/gangs is the worker protocol: a user's token, even an admin's, is refused (403), no
    token is 401, and a stored worker token gets in."""
    from tests.service.svchelp import ADMIN_TOKEN
    from tests.service.test_auth import tokens

    with app_client(databases, backend) as c:
        _launched(c, tiny_report)
        body = {"worker": "w", "host": "127.0.0.1", "devices": 2, "port": 29400}
        admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        r = c.post("/api/gangs/claim", json=body, headers=admin)
        assert r.status_code == 403 and "worker token" in r.json()["detail"], r.text
        for path in ("/api/gangs/run/1/result", "/api/gangs/run/1/fail"):
            r = c.post(path, json={"token": "x", "node_rank": 0}, headers=admin)
            assert r.status_code == 403, (path, r.text)
        c.auth = None  # the client sends no token of its own
        assert c.post("/api/gangs/claim", json=body).status_code == 401
        stored = tokens(c.db_url, "worker")
        r = c.post("/api/gangs/claim", json=body, headers={"Authorization": f"Bearer {stored}"})
        assert r.status_code == 200 and r.json()["nnodes"] == 1, r.text


def test_a_stopped_node_hands_the_run_back_without_using_an_attempt(databases, backend, tiny_report):
    """A gang worker stopped by SIGTERM hands its run back (`handback`): queued again for a new gang,
    and its claim not counted, as a single worker's hand-back is not."""
    with app_client(databases, backend) as c:
        _, run = _launched(c, tiny_report)
        assert _gang_claim(c, "a", 1) is None
        b = _gang_claim(c, "b", 1)
        assert b is not None and c.get(f"/api/runs/{run['id']}").json()["attempts"] == 1
        r = c.post(f"/api/gangs/run/{run['id']}/fail", json={
            "token": b["token"], "node_rank": b["node_rank"], "error": "the worker was stopped", "kind": "error",
            "retry": True, "handback": True})
        assert r.status_code == 200 and r.json()["status"] == "queued", r.text
        back = c.get(f"/api/runs/{run['id']}").json()
        assert back["status"] == "queued" and back["attempts"] == 0, back
        assert query(c.db_url, "SELECT count(*) FROM gang_members WHERE run_id = :r", r=run["id"]) == [(0,)]
        # a node of the old gang that reports its lost peer afterwards finds the claim over
        r = c.post(f"/api/gangs/run/{run['id']}/fail", json={
            "token": b["token"], "node_rank": 1 - b["node_rank"], "error": "lost its peers", "kind": "lost_peer"})
        assert r.status_code == 409, r.text
        assert _gang_claim(c, "c", 1) is None
        again = _gang_claim(c, "d", 1)
        assert again is not None and again["id"] == run["id"] and again["attempt"] == 1


def test_a_gang_worker_without_its_token_is_one_line(capsys, monkeypatch):
    """`paretoplan worker --devices K` speaks the worker protocol: without PARETOPLAN_WORKER_TOKEN it
    stops before its first claim, with one line and exit 2, as a plain worker does."""
    from paretoplan.cli import main

    monkeypatch.delenv("PARETOPLAN_WORKER_TOKEN", raising=False)
    assert main(["worker", "--api", "http://127.0.0.1:9", "--devices", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "PARETOPLAN_WORKER_TOKEN" in err, err
