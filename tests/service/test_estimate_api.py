"""POST /api/estimate (a Megatron-style plan priced, placed against a job's stored frontier), MFU on
the served frontier points and how sure their prices are (the real app on a real database)."""

from __future__ import annotations

import json

import pytest

from search.plans.plan import Plan
from tests.service.svchelp import query
from tests.service.test_api import TINY, app_client, claim, post_result, submit

# the job of the conftest's tiny_report: gpt2-tiny on 2 cpu devices, global batch max(8, 2)
JOB = {**TINY}


@pytest.fixture
def client(databases, backend):
    with app_client(databases, backend) as c:
        yield c


@pytest.fixture
def done_job(databases, backend, tiny_report):
    with app_client(databases, backend) as c:
        job = submit(c)
        task = claim(c, "w1")
        assert post_result(c, task, tiny_report).status_code == 200
        c.job = job
        yield c


def test_smallest_body_prices_a_plan(client):
    r = client.post("/api/estimate", json={"model": "llama-tiny", "devices": 8, "global_batch": 16, "tp": 2, "pp": 2})
    assert r.status_code == 200, r.text
    e = r.json()
    assert (e["tp"], e["pp"], e["dp"], e["micro_batches"]) == (2, 2, 2, 8)
    assert e["mfu"] == pytest.approx(e["model_flops"] / (e["time_s"] * 8 * e["peak_flops"]))
    assert Plan.model_validate(e["plan"]).predicted.time_s == e["time_s"]
    assert e["launchable"] is True and e["against_frontier"] is None
    assert e["priced_from"] == "catalog" and "POST /api/profiles" in e["confidence"]["message"]


@pytest.mark.parametrize(("body", "needle"), [
    ({"tp": 3}, "--tp 3 x --pp 1 = 3 does not divide the 8 devices"),
    ({"micro_batch": 3}, "--micro-batch 3"),
    ({"zero": 4}, "zero"),
    ({"recompute": "half"}, "recompute"),
    ({"pp": 2, "model": "cnn-tiny"}, "no block stack"),
])
def test_bad_requests_are_422_with_a_message(client, body, needle):
    r = client.post("/api/estimate", json={"model": "gpt2-tiny", "devices": 8, "global_batch": 16, **body})
    assert r.status_code == 422, r.text
    assert needle in r.json()["detail"]


def test_a_job_that_does_not_exist_or_is_not_done(client):
    assert client.post("/api/estimate", json={**JOB, "job_id": 99}).status_code == 404
    job = submit(client)
    r = client.post("/api/estimate", json={**JOB, "job_id": job["id"]})
    assert r.status_code == 409 and "no frontier yet" in r.json()["detail"]


def test_against_the_jobs_stored_frontier(done_job):
    c = done_job
    fr = c.get(f"/api/jobs/{c.job['id']}/frontier").json()
    r = c.post("/api/estimate", json={**JOB, "job_id": c.job["id"], "tp": 2, "micro_batch": 4})  # dp 1, m 2
    assert r.status_code == 200, r.text
    a = r.json()["against_frontier"]
    assert a["points"] == len(fr["frontier"])
    e = r.json()
    if a["dominated_by"] is not None:
        p = fr["frontier"][a["dominated_by"]]
        assert p["time_s"] <= e["time_s"] * (1 + 1e-9) and p["memory_bytes"] <= e["memory_bytes"] * (1 + 1e-9)
        assert f"dominated by #{a['dominated_by']}" in a["message"]
    if a["faster_point"] is not None:
        assert a["speedup"] == pytest.approx(e["time_s"] / fr["frontier"][a["faster_point"]]["time_s"])


def test_a_plan_for_another_job_is_refused(done_job):
    c = done_job
    r = c.post("/api/estimate", json={**JOB, "global_batch": 16, "job_id": c.job["id"]})
    assert r.status_code == 422 and "another job" in r.json()["detail"]


def test_frontier_points_carry_mfu_and_how_sure(done_job):
    c = done_job
    fr = c.get(f"/api/jobs/{c.job['id']}/frontier").json()
    assert fr["confidence"]["priced_from"] == "catalog"
    assert "paretoplan profile" in fr["confidence"]["message"]
    for p in fr["frontier"][:3] + fr["baselines"][:2]:
        plan = c.get(f"/api/strategies/{p['id']}").json()["plan"]
        assert p["mfu"] == pytest.approx(plan["predicted"]["mfu"], rel=1e-12) and p["mfu"] > 0


def test_a_launch_priced_from_the_catalog_says_so(done_job):
    c = done_job
    run = c.post(f"/api/jobs/{c.job['id']}/launch", json={}).json()
    msgs = [m for (m,) in query(c.db_url, "SELECT message FROM events WHERE run_id = :r", r=run["id"])]
    assert any("priced from the catalog" in (m or "") and "POST /api/profiles" in m for m in msgs), json.dumps(msgs)
