"""Workers that lose nothing (issue 20, failure 5): a graceful hand-back is not an attempt, a claim
has a maximum hold, an operator can requeue, and a result is retried through a 503 (the worker's
real client against the real service)."""

from __future__ import annotations

import threading
import time

import pytest
import uvicorn
from fastapi.testclient import TestClient

from search import FrontierReport
from service.app import create_app
from service.settings import Settings
from tests.service.svchelp import AUTH_SETTINGS, WORKER_TOKEN, TokenAuth
from tests.service.test_api import app_client, claim, submit
from worker.client import LeaseLost, ServiceClient


def test_a_graceful_hand_back_is_not_an_attempt(databases, backend):
    with app_client(databases, backend, max_attempts=2) as c:
        job = submit(c)
        for _ in range(5):  # five stops in a row: more than max_attempts, and nothing fails
            t = claim(c, "w")
            assert t["attempt"] == 1
            r = c.post(f"/api/tasks/search/{t['id']}/fail", json={"token": t["token"], "error": "the worker was stopped",
                                                                 "retry": True, "handback": True})
            assert r.status_code == 200, r.text
        assert c.get(f"/api/jobs/{job['id']}").json()["status"] == "queued"


def test_a_claim_is_held_at_most_max_claim_seconds(databases, backend):
    with app_client(databases, backend, max_claim_seconds=60, lease_seconds=30) as c:
        submit(c)
        t = claim(c, "w")
        beat = f"/api/tasks/search/{t['id']}/heartbeat"
        for _ in range(3):
            c.clock.advance(20)
            assert c.post(beat, json={"token": t["token"]}).status_code == 200
        c.clock.advance(20)  # 80 s held: a worker that heartbeats forever lets go
        r = c.post(beat, json={"token": t["token"]})
        assert r.status_code == 409 and "maximum hold" in r.json()["detail"]


def test_an_admin_requeues_a_failed_task(databases, backend):
    with app_client(databases, backend) as c:
        job = submit(c)
        t = claim(c, "w")
        c.post(f"/api/tasks/search/{t['id']}/fail", json={"token": t["token"], "error": "out of disk"})
        assert c.get(f"/api/jobs/{job['id']}").json()["status"] == "failed"
        r = c.post(f"/api/admin/tasks/search/{t['id']}/requeue")
        assert r.status_code == 200 and r.json()["was"] == "failed"
        job = c.get(f"/api/jobs/{job['id']}").json()
        assert job["status"] == "queued" and job["error"] is None
        again = claim(c, "w2")
        assert again["id"] == t["id"] and again["attempt"] == 1
        # the first claim's token is void now
        r = c.post(f"/api/tasks/search/{t['id']}/heartbeat", json={"token": t["token"]})
        assert r.status_code == 409
        assert c.post("/api/admin/tasks/search/999/requeue").status_code == 404


class _FlakyDatabase:
    """Makes the service's result endpoint answer 503 for its first `n` calls: the database
    refusing connections, as during a failover (the real handler of OperationalError answers)."""

    def __init__(self, app, n: int) -> None:
        self.app, self.left = app, n

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"].endswith("/result") and self.left > 0:
            self.left -= 1
            from sqlalchemy.exc import OperationalError

            from service.api.errors import database_busy
            response = await database_busy(None, OperationalError("SELECT 1", {}, Exception("failover")))  # type: ignore[arg-type]
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


@pytest.fixture
def served(databases, backend, tmp_path):
    """The real app under uvicorn in a thread (the worker's client needs a socket)."""
    url = databases.fresh(backend)
    app = create_app(Settings(database_url=url, **AUTH_SETTINGS))
    flaky = _FlakyDatabase(app, 2)
    server = uvicorn.Server(uvicorn.Config(flaky, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", app, flaky
    finally:
        server.should_exit = True
        thread.join(10)


def test_a_result_is_retried_through_503s_until_stored(served, tiny_report):
    url, app, flaky = served
    with TestClient(app, base_url=url) as user:
        user.auth = TokenAuth()
        job = user.post("/api/jobs", json={"model": "gpt2-tiny", "device": "cpu", "devices": 2})
        assert job.status_code == 201, job.text
    with ServiceClient(url, worker_token=WORKER_TOKEN) as worker:
        task = worker.claim("w", ["search"])
        assert task is not None
        worker.search_result(task.id, task.token, FrontierReport.model_validate_json(tiny_report))
        assert flaky.left == 0  # it was refused twice, and retried
        with pytest.raises(LeaseLost):  # stored: the claim is over
            worker.heartbeat("search", task.id, task.token)
    with ServiceClient(url, worker_token="ppt_not-the-worker-token-000000000") as stranger:
        from worker.client import ServiceError

        with pytest.raises(ServiceError) as e:
            stranger.claim("x", ["search"])
        assert e.value.status == 401
