"""Against a real `paretoplan serve` (uvicorn, a real database) with a real worker process."""

from __future__ import annotations

import json
import re
import time

from tests.service.svchelp import count_rows, query, start_worker, wait_job

TINY = {"model": "gpt2-tiny", "device": "cpu", "devices": 2}


def settle(live, http, timeout: float = 180.0) -> None:
    """Wait until no search is queued or running (the worker is idle)."""
    end = time.monotonic() + timeout
    while query(live.db_url, "SELECT count(*) FROM searches WHERE status IN ('queued', 'running')")[0][0]:
        assert time.monotonic() < end, "searches still pending"
        time.sleep(0.1)


def test_a_job_is_searched_in_the_background_and_its_frontier_served(live, http):
    r = http.post("/api/jobs", json={**TINY, "global_batch": 6})
    assert r.status_code == 201, r.text
    job = wait_job(http, r.json()["id"])
    assert job["status"] == "done" and job["feasible"] is True and job["frontier_size"] > 1
    fr = http.get(f"/api/jobs/{job['id']}/frontier").json()
    assert fr["model"] == "gpt2-tiny" and fr["num_devices"] == 2 and fr["job"]["global_batch"] == 6
    assert len(fr["frontier"]) == job["frontier_size"] and fr["picked_strategy_id"] == job["picked_strategy_id"]
    plan = http.get(f"/api/strategies/{job['picked_strategy_id']}").json()["plan"]
    assert plan["num_devices"] == 2 and plan["global_batch"] == 6 and plan["model"] == "gpt2-tiny"
    # the stream of a finished search replays its events and ends
    with http.stream("GET", f"/api/jobs/{job['id']}/events") as s:
        events = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: ")]
    stages = [e.get("stage") for e in events]
    assert "running" in stages and "done" in stages and events[-1] == {"status": "done"}
    claimed = [e["message"] for e in events if e.get("stage") == "running"]
    assert claimed == [f"claimed by live-{live.backend}"]


def test_the_stream_follows_a_search_while_it_runs(live, http):
    job = http.post("/api/jobs", json={**TINY, "global_batch": 14}).json()
    seen, data = [], []
    with http.stream("GET", f"/api/jobs/{job['id']}/events") as s:
        for line in s.iter_lines():
            if line.startswith("event: "):
                seen.append(line[7:])
            elif line.startswith("data: "):
                data.append(line[6:])
    assert seen[0] == "status" and seen[-1] == "end" and "progress" in seen
    # the search reports each mesh with the size of the frontier so far
    assert any(re.search(r"pp1 x dp\d+ x tp\d+[^:]*: \d+ frontier points so far", d) for d in data), data
    assert http.get(f"/api/jobs/{job['id']}").json()["status"] == "done"


def test_hf_config_jobs_and_a_bad_config_is_refused_on_submit(live, http):
    cfg = {"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 512, "n_positions": 64}
    ok = http.post("/api/jobs", json={"hf_config": cfg, "name": "tiny-hf", "device": "cpu", "devices": 2})
    searches_before = query(live.db_url, "SELECT count(*) FROM searches")
    bad = http.post("/api/jobs", json={"hf_config": {"model_type": "no-such-architecture"}, "device": "cpu",
                                       "devices": 2})
    assert ok.status_code == 201
    # refused at once with the field named, not queued to fail later in the worker
    assert bad.status_code == 422 and "hf_config.model_type 'no-such-architecture'" in bad.json()["detail"]
    assert len(bad.json()["detail"]) < 400
    assert query(live.db_url, "SELECT count(*) FROM searches") == searches_before
    done = wait_job(http, ok.json()["id"])
    assert done["status"] == "done" and done["name"] == "tiny-hf", done


def test_an_hf_config_job_with_infeasible_baselines_reaches_done_and_names_them(live, http):
    """Issue 23: jobs from HF configs were lost once their search was done, an infeasible baseline's
    1e30 sentinel being out of range for the database's BigInteger. GPTBigCode's fused query-key-value
    projection makes the Megatron baselines infeasible on 8 devices: the job reaches done on this backend (SQLite, and
    PostgreSQL where the suite has one), every stored baseline has a real price, and the infeasible
    ones are named with their reason in the frontier's stats."""
    hf = {"model_type": "gpt_bigcode", "n_layer": 2, "n_embd": 128, "n_head": 4, "vocab_size": 512,
          "n_positions": 128}
    r = http.post("/api/jobs", json={"hf_config": hf, "name": "hf-infeasible-baselines", "devices": 8,
                                     "seq_len": 64})
    assert r.status_code == 201, r.text
    job = wait_job(http, r.json()["id"])
    assert job["status"] == "done" and job["error"] is None, job
    fr = http.get(f"/api/jobs/{job['id']}/frontier").json()
    infeasible = fr["stats"]["infeasible_baselines"]
    assert infeasible and all(b["name"].startswith("megatron") and b["reason"] for b in infeasible)
    assert fr["baselines"] and {b["name"] for b in fr["baselines"]}.isdisjoint(b["name"] for b in infeasible)
    assert all(0 < b["memory_bytes"] < 2**63 and 0 < b["time_s"] < 1e6 for b in fr["baselines"])


def test_graph_upload(live, http):
    from search.models.capture import capture_model
    from search.models.zoo import get_model

    graph = capture_model(get_model("gpt2-tiny"), 4, None).to_json()
    r = http.post("/api/jobs/upload", files={"graph": ("g.json", graph, "application/json")},
                  data={"request": json.dumps({"device": "cpu", "devices": 2})})
    assert r.status_code == 201, r.text
    job = wait_job(http, r.json()["id"])
    assert job["status"] == "done" and job["frontier_size"] >= 1
    r = http.post("/api/jobs/upload", files={"graph": ("g.json", b"{not json", "application/json")})
    assert r.status_code == 422 and "JSON" in r.json()["detail"]


def test_resize_answers_with_the_plan_it_would_move_to(live, http):
    job = wait_job(http, http.post("/api/jobs", json={**TINY, "global_batch": 8}).json()["id"])
    r = http.post(f"/api/jobs/{job['id']}/resize", params={"wait": 120}, json={"devices": 4})
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["status"] == "ready" and out["devices"] == 4
    plan = out["strategy"]["plan"]
    assert plan["num_devices"] == 4 and plan["global_batch"] == 8  # same training job, more devices
    assert out["current_strategy_id"] == job["picked_strategy_id"]
    again = http.post(f"/api/jobs/{job['id']}/resize", json={"devices": 4})  # no wait: stored
    assert again.status_code == 200 and again.json()["search_id"] == out["search_id"]
    r = http.post(f"/api/jobs/{job['id']}/resize", params={"wait": 120}, json={"devices": 2, "memory_per_device": 1})
    assert r.status_code == 200 and r.json()["status"] == "no_fit" and r.json()["least_memory_bytes"] > 1
    # the job may select the plan it would move to, and launch it
    sel = http.post(f"/api/jobs/{job['id']}/select", json={"strategy_id": out["strategy"]["id"]})
    assert sel.status_code == 200 and sel.json()["selected_strategy_id"] == out["strategy"]["id"]


def _cycle_graph() -> dict:
    from search.models.capture import capture_model
    from search.models.zoo import get_model

    g = json.loads(capture_model(get_model("gpt2-tiny"), 4, None).to_json())
    first = next(op for op in g["ops"] if op["inputs"])
    first["inputs"][0]["source"] = g["ops"][-1]["name"]  # the loss feeds the first op: a cycle
    return g


def test_bad_inputs_get_4xx_with_a_message_and_leave_the_database_unchanged(live, http):
    settle(live, http)
    job = wait_job(http, http.post("/api/jobs", json={**TINY, "global_batch": 18}).json()["id"])
    settle(live, http)
    before = count_rows(live.db_url)
    big = b'{"model": "' + b"x" * (50 * 1024 * 1024) + b'"}'
    cases = [
        ("unknown model", {"json": {**TINY, "model": "gpt2-nope"}}, 422, "unknown model"),
        ("zero devices", {"json": {**TINY, "devices": 0}}, 422, "devices"),
        ("negative devices", {"json": {**TINY, "devices": -4}}, 422, "devices"),
        ("absurd devices", {"json": {**TINY, "devices": 10**12}}, 422, "devices"),
        ("absurd batch", {"json": {**TINY, "global_batch": 10**15}}, 422, "global_batch"),
        ("seq_len over the model's", {"json": {**TINY, "seq_len": 10**6}}, 422, "seq_len"),
        ("negative budget", {"json": {**TINY, "memory_budget": "-5GiB"}}, 422, "positive"),
        ("unreadable budget", {"json": {**TINY, "memory_budget": "lots"}}, 422, "cannot parse size"),
        ("malformed JSON", {"content": b'{"model": "gpt2-tiny",', "headers": {"content-type": "application/json"}},
         422, "JSON"),
        ("NaN", {"content": b'{"model": "gpt2-tiny", "eps": NaN}', "headers": {"content-type": "application/json"}},
         422, "NaN"),
        ("a graph with a cycle", {"json": {"graph": _cycle_graph(), "device": "cpu", "devices": 2}}, 422, "cycle"),
        ("a 50 MB body", {"content": big, "headers": {"content-type": "application/json"}}, 413, "limit"),
        ("two models", {"json": {**TINY, "hf_config": {"model_type": "gpt2"}}}, 422, "exactly one"),
        ("no model", {"json": {"devices": 2}}, 422, "exactly one"),
        ("unknown field", {"json": {**TINY, "modle": "x"}}, 422, "modle"),
        ("wrong type", {"json": {**TINY, "devices": "eight"}}, 422, "devices"),
        ("a list", {"json": [1, 2]}, 422, ""),
        ("empty body", {"content": b"", "headers": {"content-type": "application/json"}}, 422, "required"),
        ("unknown device", {"json": {**TINY, "device": "tpu-v9"}}, 422, "unknown device"),
        ("ragged nodes", {"json": {"model": "gpt2-tiny", "device": "h100-80gb", "devices": 12}}, 422, "multiple"),
        ("no such profile", {"json": {**TINY, "profile_id": 99999}}, 422, "no such profile"),
        ("bad device count ahead", {"json": {**TINY, "device_counts": [0]}}, 422, "device_counts"),
        ("NUL character", {"content": b'{"model": "gpt2-tiny\\u0000"}', "headers": {"content-type": "application/json"}},
         422, "NUL"),
    ]
    for what, kw, status, words in cases:
        r = http.post("/api/jobs", **kw)
        assert r.status_code == status, (what, r.status_code, r.text[:300])
        detail = r.json()["detail"]
        assert isinstance(detail, str) and detail and words in detail, (what, detail)
    others = [
        (http.post(f"/api/jobs/{job['id']}/resize", json={"devices": -1}), 422),
        (http.post(f"/api/jobs/{job['id']}/resize", json={"devices": 3, "devices_per_node": 2}), 422),
        (http.post("/api/jobs/424242/resize", json={"devices": 4}), 404),
        (http.post(f"/api/jobs/{job['id']}/select", json={"strategy_id": 424242}), 404),
        (http.post(f"/api/jobs/{job['id']}/launch", json={"steps": 0}), 422),
        (http.post("/api/profiles", json={"name": "x", "profile": {"device": "cpu", "format": "x"}}), 422),
        (http.post("/api/tasks/search/1/result", json={"token": "nope", "report": {}}), 422),
        (http.post(f"/api/tasks/search/{job['search_id']}/fail", json={"token": "nope", "error": "x"}), 409),
        (http.get("/api/jobs/0"), 422),
        (http.get("/api/strategies/424242"), 404),
    ]
    for r, status in others:
        assert r.status_code == status and r.json()["detail"], (r.request.url, r.status_code, r.text[:300])
    assert count_rows(live.db_url) == before


def test_a_launched_run_is_executed_by_a_worker_and_reports_measured_vs_predicted(live, http, tmp_path):
    job = wait_job(http, http.post("/api/jobs", json={**TINY, "global_batch": 10}).json()["id"])
    run = http.post(f"/api/jobs/{job['id']}/launch", json={"steps": 3}).json()
    assert run["status"] == "queued" and run["predicted"]["time_s"] > 0
    runner = start_worker(live.url, f"runner-{live.backend}", tmp_path, kinds="run")
    try:
        end = time.monotonic() + 300
        while (got := http.get(f"/api/runs/{run['id']}").json())["status"] not in ("done", "failed"):
            assert time.monotonic() < end, got
            time.sleep(0.2)
    finally:
        runner.stop()
    assert got["status"] == "done", got["error"]
    assert got["worker"] == f"runner-{live.backend}" and got["attempts"] == 1 and got["step"] == 3
    assert got["measured"]["time_s"] > 0 and got["predicted"]["time_s"] == run["predicted"]["time_s"]
    plan = http.get(f"/api/strategies/{run['strategy_id']}").json()["plan"]
    assert got["report"]["plan"] == plan and len(got["report"]["losses"]) == 3


def test_a_scheduler_job_carries_out_a_service_run_and_posts_its_merged_report(live, http, tmp_path, capsys,
                                                                              monkeypatch):
    """`paretoplan launch --api` claims the queued run for a Kubernetes job (the manifest carries
    the claim, and the worker token only as a reference to a Secret), and the job's merge posts the
    nodes' merged report back through the worker client: the run is done with both nodes. Without
    the worker token neither the launch nor the merge speaks to the service."""
    import pytest
    import yaml  # type: ignore[import-untyped]

    from paretoplan.cli import main
    from search import NodeRecord, RunReport
    from tests.service.svchelp import WORKER_TOKEN, run_report
    from worker.batch import main as batch_main

    job = http.post("/api/jobs", json={"model": "gpt2-tiny", "device": "cpu", "devices": 2,
                                       "global_batch": 6}).json()
    assert wait_job(http, job["id"])["status"] == "done"
    run = http.post(f"/api/jobs/{job['id']}/launch", json={"steps": 3}).json()
    manifest = tmp_path / "job.yaml"
    launch = ["launch", "--api", live.url, "--scheduler", "kubernetes", "--image", "img", "--nodes", "2",
              "--out", str(manifest), "--token-secret", "wtok"]
    monkeypatch.delenv("PARETOPLAN_WORKER_TOKEN", raising=False)
    assert main(launch) == 2
    assert "PARETOPLAN_WORKER_TOKEN" in capsys.readouterr().err and not manifest.exists()
    assert http.get(f"/api/runs/{run['id']}").json()["status"] == "queued"  # nothing was claimed
    monkeypatch.setenv("PARETOPLAN_WORKER_TOKEN", WORKER_TOKEN)
    assert main(launch) == 0
    out = capsys.readouterr().out
    assert f"claimed run {run['id']}" in out and "kubectl create secret generic wtok" in out
    claimed = http.get(f"/api/runs/{run['id']}").json()
    assert claimed["status"] == "running" and claimed["worker"].startswith("kubernetes:")
    assert WORKER_TOKEN not in manifest.read_text()  # the pods read it from the Secret
    pod = list(yaml.safe_load_all(manifest.read_text()))[1]["spec"]["pytorchReplicaSpecs"]["Master"]
    container = pod["template"]["spec"]["containers"][0]
    assert {"name": "PARETOPLAN_WORKER_TOKEN", "valueFrom": {"secretKeyRef": {"name": "wtok", "key": "token"}}} \
        in container["env"]
    command = container["command"][2]
    token = command.split("--token ")[1].split()[0]
    assert f"--api {live.url} --run-id {run['id']}" in command
    # what the two pods would have written: each its own rank's figures
    plan = http.get(f"/api/strategies/{run['strategy_id']}").json()["plan"]
    folder = tmp_path / "results"
    folder.mkdir()
    for node in (0, 1):
        rep = RunReport.model_validate(run_report(plan, 3, time_s=0.01 * (node + 1)))
        measured = rep.measured.model_copy(update={"per_rank": [r for r in rep.measured.per_rank if r.rank == node]})
        (folder / f"node-{node}.json").write_text(rep.model_copy(update={
            "measured": measured, "nodes": [NodeRecord(node_rank=node, host=f"pod{node}", ranks=[node])]})
            .model_dump_json())
    merge = ["merge", str(folder), "--nodes", "2", "--report", str(folder / "report.json"),
             "--api", live.url, "--run-id", str(run["id"]), "--token", token]
    monkeypatch.delenv("PARETOPLAN_WORKER_TOKEN")
    with pytest.raises(SystemExit) as refused:
        batch_main(merge)
    assert refused.value.code == 2 and "PARETOPLAN_WORKER_TOKEN" in capsys.readouterr().err
    monkeypatch.setenv("PARETOPLAN_WORKER_TOKEN", WORKER_TOKEN)
    assert batch_main(merge) == 0
    done = http.get(f"/api/runs/{run['id']}").json()
    assert done["status"] == "done", done
    assert [n["host"] for n in done["report"]["nodes"]] == ["pod0", "pod1"]
    assert done["report"]["measured"]["time_s"] == 0.02
