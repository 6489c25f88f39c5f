"""The API in process (the real app on a real database, SQLite and PostgreSQL), playing the worker
through the REST protocol where a test needs a task to move."""

from __future__ import annotations

import copy
import gzip
import json
from contextlib import contextmanager

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.settings import Settings
from tests.service.svchelp import AUTH_SETTINGS, Clock, TokenAuth, count_rows, query, run_report

TINY = {"model": "gpt2-tiny", "device": "cpu", "devices": 2}


@contextmanager
def app_client(databases, backend, **settings):
    """The app on a fresh database; `c.clock` is the queue's clock, which only the test moves."""
    url = databases.fresh(backend)
    clock = Clock()
    app = create_app(Settings(database_url=url, **{"allowed_hosts": ["testserver"], **AUTH_SETTINGS, **settings}),
                     clock=clock)
    with TestClient(app) as c:
        c.auth = TokenAuth()
        c.db_url = url
        c.clock = clock
        yield c


@pytest.fixture
def client(databases, backend):
    with app_client(databases, backend) as c:
        yield c


def submit(c, **fields) -> dict:
    r = c.post("/api/jobs", json={**TINY, **fields})
    assert r.status_code == 201, r.text
    return r.json()


def claim(c, worker: str, kinds=("search",)):
    r = c.post("/api/tasks/claim", json={"worker": worker, "kinds": list(kinds)})
    assert r.status_code in (200, 204), r.text
    return None if r.status_code == 204 else r.json()


def post_result(c, task: dict, report_json: str):
    body = f'{{"token": {json.dumps(task["token"])}, "report": {report_json}}}'
    return c.post(f"/api/tasks/search/{task['id']}/result", content=gzip.compress(body.encode()),
                  headers={"Content-Type": "application/json", "Content-Encoding": "gzip"})


def test_smallest_body_gives_201_and_a_queued_job(client):
    r = client.post("/api/jobs", json={"model": "gpt2-medium", "devices": 8, "device": "h100-80gb",
                                       "global_batch": 32})
    assert r.status_code == 201, r.text
    job = r.json()
    assert job["status"] == "queued" and job["id"] >= 1 and job["cached"] is False
    assert client.get(f"/api/jobs/{job['id']}").json()["request"]["model"] == "gpt2-medium"
    listed = client.get("/api/jobs").json()
    assert listed["total"] == 1 and listed["items"][0]["id"] == job["id"]
    assert client.get("/api/jobs", params={"status": "done"}).json()["total"] == 0
    r = client.get(f"/api/jobs/{job['id']}/frontier")
    assert r.status_code == 409 and "queued" in r.json()["detail"]


def test_claim_lease_heartbeat_expiry_and_exactly_once(databases, backend, tiny_report):
    with app_client(databases, backend, lease_seconds=30.0) as c:
        job = submit(c)
        t1 = claim(c, "w1")
        assert t1["kind"] == "search" and t1["attempt"] == 1 and t1["request"]["model"] == "gpt2-tiny"
        assert claim(c, "w2") is None  # nothing else to do while w1 holds the lease
        r = c.post(f"/api/tasks/search/{t1['id']}/heartbeat", json={"token": t1["token"], "stage": "search",
                                                                    "fraction": 0.5})
        assert r.status_code == 200, r.text
        assert c.get(f"/api/jobs/{job['id']}").json()["stage"] == "search"
        c.clock.advance(29)  # the heartbeat renewed the lease: still w1's
        assert claim(c, "w2") is None
        c.clock.advance(2)  # w1 goes silent past its lease
        t2 = claim(c, "w2")
        assert t2 is not None and t2["id"] == t1["id"] and t2["attempt"] == 2 and t2["token"] != t1["token"]
        # w1's claim is over: every call of it is refused
        assert c.post(f"/api/tasks/search/{t1['id']}/heartbeat", json={"token": t1["token"]}).status_code == 409
        r = post_result(c, t1, tiny_report)
        assert r.status_code == 409 and "claimed again" in r.json()["detail"]
        assert c.post(f"/api/tasks/search/{t1['id']}/fail", json={"token": t1["token"], "error": "x"}).status_code == 409
        # w2 finishes it, once
        assert post_result(c, t2, tiny_report).status_code == 200
        assert post_result(c, t2, tiny_report).status_code == 409
        done = c.get(f"/api/jobs/{job['id']}").json()
        report = json.loads(tiny_report)
        assert done["status"] == "done" and done["frontier_size"] == len(report["frontier"])
        assert query(c.db_url, "SELECT attempts FROM searches") == [(2,)]
        assert query(c.db_url, "SELECT count(*) FROM events WHERE kind = 'status' AND stage = 'done'") == [(1,)]
        n = len(report["frontier"]) + len(report["baselines"])
        assert query(c.db_url, "SELECT count(*) FROM strategies") == [(n,)]


def test_a_task_whose_leases_keep_expiring_fails_with_a_message(databases, backend):
    with app_client(databases, backend, lease_seconds=30.0, max_attempts=2) as c:
        job = submit(c)
        assert claim(c, "w1")["attempt"] == 1
        c.clock.advance(31)
        assert claim(c, "w2")["attempt"] == 2
        c.clock.advance(31)
        assert claim(c, "w3") is None
        j = c.get(f"/api/jobs/{job['id']}").json()
        assert j["status"] == "failed" and "gave up after 2 attempts" in j["error"] and "w2" in j["error"]


def test_input_errors_are_final_other_failures_retry_on_resubmission(databases, backend):
    with app_client(databases, backend) as c:
        a = submit(c, global_batch=10)
        t = claim(c, "w1")
        r = c.post(f"/api/tasks/search/{t['id']}/fail", json={"token": t["token"], "error": "bad config",
                                                              "input_error": True})
        assert r.status_code == 200
        failed = c.get(f"/api/jobs/{a['id']}").json()
        assert failed["status"] == "failed" and failed["error"] == "bad config"
        again = submit(c, global_batch=10)  # the same request: the same (final) answer
        assert again["status"] == "failed" and again["search_id"] == a["search_id"] and claim(c, "w1") is None

        b = submit(c, global_batch=6)
        t = claim(c, "w1")
        c.post(f"/api/tasks/search/{t['id']}/fail", json={"token": t["token"], "error": "worker crashed"})
        assert c.get(f"/api/jobs/{b['id']}").json()["status"] == "failed"
        again = submit(c, global_batch=6)  # not the request's fault: queued again
        assert again["status"] == "queued" and again["search_id"] == b["search_id"]
        t = claim(c, "w1")
        assert t["id"] == b["search_id"]
        # fail with retry: back in the queue at once, attempts left
        c.post(f"/api/tasks/search/{t['id']}/fail", json={"token": t["token"], "error": "stopping", "retry": True})
        assert c.get(f"/api/jobs/{b['id']}").json()["status"] == "queued"
        assert claim(c, "w2")["attempt"] == 2


def test_select_launch_and_run_protocol(databases, backend, tiny_report):
    with app_client(databases, backend) as c:
        job = submit(c)
        r = c.post(f"/api/jobs/{job['id']}/launch", json={})
        assert r.status_code == 409 and "searching" in r.json()["detail"]
        t = claim(c, "w1")
        assert post_result(c, t, tiny_report).status_code == 200
        fr = c.get(f"/api/jobs/{job['id']}/frontier").json()
        assert fr["feasible"] and fr["picked_strategy_id"] == fr["frontier"][fr["picked"]]["id"]
        times = [p["time_s"] for p in fr["frontier"]]
        mems = [p["memory_bytes"] for p in fr["frontier"]]
        assert times == sorted(times) and all(a >= b for a, b in zip(mems, mems[1:], strict=False))
        assert fr["baselines"] and all(b["name"] for b in fr["baselines"])
        last = fr["frontier"][-1]
        st = c.get(f"/api/strategies/{last['id']}").json()
        assert st["plan"]["mesh"]["axes"] and st["time_s"] == last["time_s"] and st["kind"] == "frontier"

        other = submit(c, global_batch=4)
        r = c.post(f"/api/jobs/{other['id']}/select", json={"strategy_id": last["id"]})
        assert r.status_code == 422 and "not on a frontier" in r.json()["detail"]
        r = c.post(f"/api/jobs/{job['id']}/select", json={"strategy_id": last["id"]})
        assert r.status_code == 200 and r.json()["selected_strategy_id"] == last["id"]

        r = c.post(f"/api/jobs/{job['id']}/launch", json={"steps": 7})
        assert r.status_code == 201, r.text
        run = r.json()
        assert run["status"] == "queued" and run["strategy_id"] == last["id"] and run["steps"] == 7
        assert run["predicted"] == {"time_s": last["time_s"], "memory_bytes": last["memory_bytes"]}
        task = claim(c, "gpu-node", kinds=("run",))
        assert task["kind"] == "run" and task["id"] == run["id"] and task["steps"] == 7
        assert task["plan"] == st["plan"]
        r = c.post(f"/api/tasks/run/{task['id']}/heartbeat", json={"token": task["token"], "step": 3,
                                                                  "fraction": 3 / 7})
        assert r.status_code == 200
        mid = c.get(f"/api/runs/{run['id']}").json()
        assert mid["status"] == "running" and mid["step"] == 3 and mid["checkpoint"] is None
        report = run_report(st["plan"], 7)
        r = c.post(f"/api/tasks/run/{task['id']}/result", json={"token": task["token"], "report": report})
        assert r.status_code == 200, r.text
        done = c.get(f"/api/runs/{run['id']}").json()
        assert done["status"] == "done" and done["measured"] == {"time_s": 0.012, "memory_bytes": 123456}
        assert done["predicted"]["time_s"] == last["time_s"] and done["report"] == report
        assert [x["id"] for x in c.get(f"/api/jobs/{job['id']}/runs").json()] == [run["id"]]


def test_a_forged_or_malformed_report_is_refused_and_nothing_is_stored(databases, backend, tiny_report):
    with app_client(databases, backend) as c:
        job = submit(c)
        t = claim(c, "w1")
        frontier = json.loads(tiny_report)
        for what, forge, words in [
            ("negative time", lambda r: r["frontier"][0].update(time_s=-1.0), "frontier.0.time_s"),
            ("not a plan", lambda r: r["baselines"][0]["plan"].pop("mesh"), "not a valid Plan at mesh"),
            ("picked beyond", lambda r: r.update(picked=len(r["frontier"])), "is not an index"),
        ]:
            forged = copy.deepcopy(frontier)
            forge(forged)
            r = post_result(c, t, json.dumps(forged))
            assert r.status_code == 422 and words in r.json()["detail"], (what, r.text[:300])
        assert count_rows(c.db_url)["strategies"] == 0
        assert c.get(f"/api/jobs/{job['id']}").json()["status"] == "running"
        assert post_result(c, t, tiny_report).status_code == 200

        fr = c.get(f"/api/jobs/{job['id']}/frontier").json()
        plans = [c.get(f"/api/strategies/{p['id']}").json()["plan"] for p in fr["frontier"][:2]]
        run = c.post(f"/api/jobs/{job['id']}/launch", json={"strategy_id": fr["frontier"][0]["id"], "steps": 4}).json()
        task = claim(c, "gpu-node", kinds=("run",))
        good = run_report(plans[0], 4)
        before = count_rows(c.db_url)
        for what, report, words in [
            ("another strategy's plan", run_report(plans[1], 4), "is not the plan of run"),
            ("other steps", run_report(plans[0], 5), "5 steps, but run"),
            ("a negative time", {**good, "measured": {**good["measured"], "time_s": -0.5}}, "measured.time_s"),
            ("another summary", {**good, "plan_summary": "dp64"}, "plan_summary 'dp64' is not its plan's"),
            ("made-up errors", {**good, "errors": {"time": 0.0, "memory": 0.0}}, "errors.time"),
            ("one loss short", {**good, "losses": good["losses"][:-1]}, "3 losses for 4 steps"),
            ("no measurements", {k: v for k, v in good.items() if k != "measured"}, "measured: field required"),
            ("not an object", [good], "report"),
        ]:
            r = c.post(f"/api/tasks/run/{task['id']}/result", json={"token": task["token"], "report": report})
            assert r.status_code == 422 and words in r.json()["detail"], (what, r.text[:300])
        assert count_rows(c.db_url) == before
        got = c.get(f"/api/runs/{run['id']}").json()
        assert got["status"] == "running" and got["report"] is None and got["measured"] is None
        r = c.post(f"/api/tasks/run/{task['id']}/result", json={"token": task["token"], "report": good})
        assert r.status_code == 200, r.text
        assert c.get(f"/api/runs/{run['id']}").json()["report"] == good


def test_identical_request_is_answered_from_the_stored_frontier(databases, backend, tiny_report):
    with app_client(databases, backend) as c:
        first = submit(c)
        t = claim(c, "w1")
        assert post_result(c, t, tiny_report).status_code == 200
        # the same request written differently: defaults spelt out, zero stages in another order
        second = submit(c, zero_stages=[3, 2, 1, 0, 0], precision="bf16")
        assert second["cached"] is True and second["status"] == "done" and second["search_id"] == first["search_id"]
        assert claim(c, "w1") is None
        a = c.get(f"/api/jobs/{first['id']}/frontier").json()
        b = c.get(f"/api/jobs/{second['id']}/frontier").json()
        assert a["frontier"] == b["frontier"] and b["job_id"] == second["id"]
        assert query(c.db_url, "SELECT count(*), max(attempts) FROM searches") == [(1, 1)]
        assert submit(c, memory_budget="1GiB")["search_id"] != first["search_id"]


def test_device_counts_search_ahead_and_resize_is_answered_at_once(databases, backend, tiny_report):
    with app_client(databases, backend) as c:
        job = submit(c, device_counts=[4], global_batch=8)
        assert [a["devices"] for a in job["alternates"]] == [4]
        ids = set()
        while (t := claim(c, "w1")) is not None:
            ids.add(t["id"])
            assert post_result(c, t, tiny_report).status_code == 200  # (any frontier serves the protocol)
        assert ids == {job["search_id"], job["alternates"][0]["search_id"]}
        r = c.post(f"/api/jobs/{job['id']}/resize", json={"devices": 4})
        assert r.status_code == 200, r.text
        out = r.json()
        assert out["status"] == "ready" and out["search_id"] == job["alternates"][0]["search_id"]
        assert out["strategy"]["plan"]["mesh"] and out["current_strategy_id"] is not None
        # new resources nobody searched yet: 202 pending, then ready once a worker answers
        r = c.post(f"/api/jobs/{job['id']}/resize", json={"devices": 8, "memory_per_device": "1GiB"})
        assert r.status_code == 202 and r.json()["status"] == "pending"
        loc = r.headers["location"]
        t = claim(c, "w1")
        assert t["request"]["devices"] == 8 and t["request"]["global_batch"] == 8
        assert t["request"]["memory_budget"] == 2**30
        assert c.get(r.json()["frontier_url"]).status_code == 409  # its search has not run yet
        post_result(c, t, tiny_report)
        ready = c.get(loc).json()
        assert ready["status"] == "ready"
        # every frontier the job has is served by URL: its own, the one searched ahead, the resize's
        by_url = c.get(ready["frontier_url"]).json()
        by_count = c.get(f"/api/jobs/{job['id']}/frontier", params={"devices": 8}).json()
        assert by_url["search_id"] == by_count["search_id"] == ready["search_id"]
        assert by_url["frontier"][by_url["picked"]]["id"] == ready["strategy"]["id"]
        assert c.get(f"/api/jobs/{job['id']}/frontier", params={"devices": 4}).json()["search_id"] \
            == job["alternates"][0]["search_id"]
        missing = c.get(f"/api/jobs/{job['id']}/frontier", params={"devices": 5})
        assert missing.status_code == 404 and "it has: 2, 4, 8" in missing.json()["detail"]
        r = c.post(f"/api/jobs/{job['id']}/resize", json={"devices": 3, "devices_per_node": 2})
        assert r.status_code == 422 and "multiple" in r.json()["detail"]


def test_sse_stream_follows_a_search_to_its_end(databases, backend, tiny_report):
    with app_client(databases, backend) as c:
        job = submit(c)
        t = claim(c, "w1")
        c.post(f"/api/tasks/search/{t['id']}/heartbeat", json={"token": t["token"], "stage": "search", "fraction": 0.1})
        post_result(c, t, tiny_report)
        with c.stream("GET", f"/api/jobs/{job['id']}/events") as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            text = "".join(r.iter_text())
        kinds = [line.split(": ", 1)[1] for line in text.splitlines() if line.startswith("event: ")]
        assert kinds[-1] == "end" and "progress" in kinds
        datas = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]
        assert datas[-1] == {"status": "done"}
        assert any(d.get("stage") == "search" and d.get("fraction") == 0.1 for d in datas)
        ids = [int(line[4:]) for line in text.splitlines() if line.startswith("id: ")]
        assert ids == sorted(ids)
        # resume after an event: only what came later
        with c.stream("GET", f"/api/jobs/{job['id']}/events", headers={"Last-Event-ID": str(ids[-2])}) as r:
            later = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
        assert [d.get("id") for d in later[:-1]] == [ids[-1]]
        assert c.get("/api/jobs/999/events").status_code == 404


def test_profiles_upload_list_and_price_a_job(client):
    doc = {"format": "paretoplan.profile/1", "device": "cpu"}
    r = client.post("/api/profiles", json={"name": "this box", "profile": doc})
    assert r.status_code == 201, r.text
    p = r.json()
    assert p["device"] == "cpu" and p["name"] == "this box"
    assert [x["id"] for x in client.get("/api/profiles").json()] == [p["id"]]
    assert client.get(f"/api/profiles/{p['id']}").json()["profile"]["device"] == "cpu"
    r = client.post("/api/jobs", json={"model": "gpt2-tiny", "devices": 2, "profile_id": p["id"]})
    assert r.status_code == 201, r.text
    req = r.json()["request"]
    assert req["device"] == "cpu" and req["profile"]["format"] == "paretoplan.profile/1"
    r = client.post("/api/jobs", json={"model": "gpt2-tiny", "devices": 2, "device": "h100-80gb",
                                       "profile_id": p["id"]})
    assert r.status_code == 422 and "measured on 'cpu'" in r.json()["detail"]
    bad = client.post("/api/profiles", json={"name": "x", "profile": {"format": "nope/0", "device": "cpu"}})
    assert bad.status_code == 422 and "format" in bad.json()["detail"]
    assert client.post("/api/jobs", json={**TINY, "profile_id": 424242}).status_code == 422


def test_catalog_docs_and_placeholder(client):
    models = {m["name"]: m for m in client.get("/api/models").json()}
    from search.models.zoo import ZOO

    assert models["gpt2-tiny"]["params"] == ZOO["gpt2-tiny"].param_count()
    assert "cpu" in {d["name"] for d in client.get("/api/devices").json()}
    assert client.get("/docs").status_code == 200
    assert "/api/jobs" in client.get("/openapi.json").json()["paths"]
    assert "/docs" in client.get("/").text


def test_gzip_bodies_inflate_within_a_limit(databases, backend):
    with app_client(databases, backend, max_inflated_bytes=1 << 20) as c:
        body = json.dumps({**TINY, "name": None}).encode()
        r = c.post("/api/jobs", content=gzip.compress(body),
                   headers={"Content-Type": "application/json", "Content-Encoding": "gzip"})
        assert r.status_code == 201, r.text
        bomb = gzip.compress(b"[" + b"0," * (1 << 20) + b"0]")
        r = c.post("/api/jobs", content=bomb, headers={"Content-Type": "application/json", "Content-Encoding": "gzip"})
        assert r.status_code == 413 and "inflates" in r.json()["detail"]
        r = c.post("/api/jobs", content=b"not gzip", headers={"Content-Type": "application/json",
                                                               "Content-Encoding": "gzip"})
        assert r.status_code == 400 and "gzip" in r.json()["detail"]
        assert count_rows(c.db_url)["jobs"] == 1


def test_a_batch_no_mesh_splits_is_refused_at_submission(databases, backend):
    """2 CPU devices, one per node: only dp2 exists, and 3 does not split over it."""
    with app_client(databases, backend) as c:
        before = count_rows(c.db_url)
        r = c.post("/api/jobs", json={**TINY, "global_batch": 3})
        assert r.status_code == 422 and "global_batch 3 does not split over any data-parallel size" in r.text
        assert count_rows(c.db_url) == before


def test_rest_frontier_has_the_cli_shape(databases, backend, tiny_report):
    """One vocabulary: the served frontier carries every field of `paretoplan search --json` under the
    same name (`frontier`, `picked`, each point's time_s/memory_bytes/mfu/plan); REST only adds fields."""
    cli = json.loads(tiny_report)  # what run_search reports is what `search --json` writes
    with app_client(databases, backend) as c:
        job = submit(c)
        post_result(c, claim(c, "w1"), tiny_report)
        fr = c.get(f"/api/jobs/{job['id']}/frontier", params={"plans": "true"}).json()
        assert set(cli) <= set(fr), set(cli) - set(fr)
        assert fr["picked"] == cli["picked"] and len(fr["frontier"]) == len(cli["frontier"])
        for served, written in zip(fr["frontier"], cli["frontier"], strict=True):
            assert set(written) <= set(served), set(written) - set(served)
            assert {k: served[k] for k in written} == written
        for served, written in zip(fr["baselines"], cli["baselines"], strict=True):
            assert set(written) <= set(served) and served["plan"] == written["plan"]
        lean = c.get(f"/api/jobs/{job['id']}/frontier").json()  # without ?plans the plans stay by id
        assert all(p["plan"] is None for p in lean["frontier"]) and lean["picked"] == cli["picked"]


GPT2_SMALL = {"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4, "n_positions": 128, "vocab_size": 128}


@pytest.mark.parametrize(("change", "field", "words"), [
    ({"n_layer": -3}, "hf_config.n_layer", "must be a positive integer, got -3"),
    ({"n_embd": 0}, "hf_config.n_embd", "must be a positive integer, got 0"),
    ({"n_embd": 100, "n_head": 3}, "hf_config.n_head", "must divide n_embd (100)"),
    ({"model_type": "gtp2"}, "hf_config.model_type", "is not a model type transformers"),
    ({"model_type": ""}, "hf_config.model_type", "is missing"),
    ({"model_type": "llama", "num_key_value_heads": 3}, "hf_config.num_key_value_heads", "must divide"),
    ({"model_type": "detr"}, "hf_config.model_type", "cannot be captured"),
], ids=["negative layers", "zero width", "heads not dividing the width", "unknown model_type", "no model_type",
        "kv heads not dividing the heads", "not a trainable head capture supports"])
def test_a_bad_hf_config_is_a_422_naming_its_field_and_stores_nothing(client, change, field, words):
    before = count_rows(client.db_url)
    cfg = {**GPT2_SMALL, **change}
    if cfg["model_type"] == "llama":
        cfg = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
               "intermediate_size": 128, "vocab_size": 128, **change}
    r = client.post("/api/jobs", json={"hf_config": cfg, "device": "cpu", "devices": 2})
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert detail.startswith(field) and words in detail, detail
    assert count_rows(client.db_url) == before


def test_a_resize_error_names_its_field(client, tiny_report):
    job = submit(client, global_batch=8)
    post_result(client, claim(client, "w1"), tiny_report)
    bad_devices = client.post(f"/api/jobs/{job['id']}/resize", json={"devices": 3})
    assert bad_devices.status_code == 422 and bad_devices.json()["errors"][0]["loc"] == ["body", "devices"]
    assert "size" in bad_devices.json()["detail"]  # the words alone would have pointed at memory
    bad_memory = client.post(f"/api/jobs/{job['id']}/resize", json={"devices": 4, "memory_per_device": "lots"})
    assert bad_memory.status_code == 422 and bad_memory.json()["errors"][0]["loc"] == ["body", "memory_per_device"]
    assert "lots" in bad_memory.json()["detail"]


def test_a_strategy_says_whether_this_machine_can_run_it(client, tiny_report):
    from service.host import launch_blocker

    job = submit(client)
    post_result(client, claim(client, "w1"), tiny_report)
    fr = client.get(f"/api/jobs/{job['id']}/frontier").json()
    st = client.get(f"/api/strategies/{fr['frontier'][0]['id']}").json()
    assert st["launchable_here"] is True and st["not_launchable_reason"] is None  # 2 CPU processes of gpt2-tiny
    plan = st["plan"]
    assert "processes" in launch_blocker({**plan, "num_devices": 100_000}) or "GPUs" in launch_blocker(
        {**plan, "num_devices": 100_000})
    assert "not in the zoo" in launch_blocker({**plan, "model": "hf:gpt2:mine"})
    assert "uploaded OpGraph" in launch_blocker({**plan, "source": {"kind": "graph", "name": "mine"}})
    hf = {**plan, "model": "hf:gpt2:mine", "source": {"kind": "hf_config", "name": "mine", "config": {}, "params": 1000}}
    assert launch_blocker(hf) is None  # an HF config's plan is rebuilt from its config
    # PipeDream-2BW runs (worker/stale.py): its 1-stale weights are no reason to refuse a launch
    stale = {**plan, "pipeline": {**plan["pipeline"], "schedule": "2bw", "async_weights": True}}
    assert launch_blocker(stale) is None


def test_a_time_target_is_the_jobs_pick_rule_and_a_resize_keeps_it(client, tiny_report):
    """`time_target` travels in the job's request: the search it queues and a resize's search for
    other resources pick by it (the worker reads `picked` off what it searched)."""
    job = submit(client, global_batch=8, time_target="250ms")
    task = claim(client, "w1")
    assert task["request"]["time_target"] == 0.25
    post_result(client, task, tiny_report)
    r = client.post(f"/api/jobs/{job['id']}/resize", json={"devices": 4})
    assert r.status_code in (200, 202), r.text
    ahead = claim(client, "w1")
    assert ahead["request"]["devices"] == 4 and ahead["request"]["time_target"] == 0.25
    bad = client.post("/api/jobs", json={**TINY, "time_target": "soon"})
    assert bad.status_code == 422 and bad.json()["errors"][0]["loc"] == ["body", "time_target"], bad.text
    assert "cannot parse time 'soon'" in bad.json()["detail"]
