"""Stored XSS (issue 20, failure 2): markup in every field the dashboard shows, posted as a
compromised worker or a user would post it, is shown as text; nothing of it runs. (A baseline's
`faster_point`, once a vector, is typed now: markup there is a 422, tests/service/test_hostile.py.)
And the login link is how a browser gets in."""

from __future__ import annotations

import json

import pytest

from search.plans.api import SearchRequest, run_search
from tests.service.svchelp import ADMIN_TOKEN, WORKER_TOKEN
from tests.web.webhelp import Page, start_service, stop_service, wait_for

pytestmark = [pytest.mark.browser, pytest.mark.processes]

X = '<img src=x onerror="window.__xss=(window.__xss||0)+1">'
# an HF config job: its name is the label the job list and title show
JOB = {"hf_config": {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                     "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 256,
                     "max_position_embeddings": 128}, "device": "cpu", "devices": 2}


def _forged_report() -> str:
    """A real FrontierReport with markup in every string the page shows of it."""
    d = json.loads(run_search(SearchRequest(model="gpt2-tiny", device="cpu", devices=2)).report.model_dump_json())
    for entry in d["frontier"] + d["baselines"]:
        plan = entry["plan"]
        plan["summary"] = X
        plan["cluster"] = X
        plan["model"] = X
        plan["mesh"]["axes"][0]["name"] = X
        for block in plan.get("blocks", []):
            block["prefix"] = X
            for ops in block["variants"]:
                for op in ops:
                    op["op"], op["kind"] = X, X
                    op["config"] = [X for _ in op["config"]]
                    op["params"] = {f"{X}.{i}": [X for _ in v] for i, v in enumerate(op["params"].values())}
                    op["output"] = [X for _ in op["output"]]
    for b in d["baselines"]:
        b["name"] = X
        b["description"] = X
    d["model"] = X
    d["cluster"] = X
    return json.dumps(d)


@pytest.fixture(scope="module")
def bare(browser, tmp_path_factory):
    """A service with no worker: the test plays a compromised one."""
    svc = start_service(tmp_path_factory.mktemp("hostile"), workers=())
    yield svc
    stop_service(svc)


def test_markup_in_every_shown_field_is_text(browser, bare, shot):
    worker = {"Authorization": f"Bearer {WORKER_TOKEN}"}
    with bare.client() as http:
        job = http.post("/api/jobs", json={**JOB, "name": X}).json()
        task = http.post("/api/tasks/claim", json={"worker": X, "kinds": ["search"]}, headers=worker).json()
        body = '{"token": ' + json.dumps(task["token"]) + ', "report": ' + _forged_report() + "}"
        r = http.post(f"/api/tasks/search/{task['id']}/result", content=body,
                      headers={"Content-Type": "application/json", **worker})
        assert r.status_code == 200, r.text
        fr = http.get(f"/api/jobs/{job['id']}/frontier").json()
        baseline = fr["baselines"][0]["id"]
        r = http.post(f"/api/jobs/{job['id']}/launch", json={"strategy_id": fr["frontier"][0]["id"]})
        assert r.status_code == 201, r.text
        rt = http.post("/api/tasks/claim", json={"worker": X, "kinds": ["run"]}, headers=worker).json()
        seg = {"from_step": 0, "to_step": 1, "devices": 2, "plan_summary": X, "cause": "launch", "ended": "resize",
               "error": X}
        r = http.post(f"/api/tasks/run/{rt['id']}/heartbeat", headers=worker, json={
            "token": rt["token"], "stage": X, "message": X, "step": 1,
            "segments": [seg, {**seg, "from_step": 1, "to_step": 2, "cause": "resize", "ended": "running"}]})
        assert r.status_code == 200, r.text

    page = Page(browser, bare.url, logged_in=False)
    try:
        p = page.page
        p.goto("/")
        assert "/login" in p.url  # no token, no dashboard
        p.goto(f"/login?token={ADMIN_TOKEN}")  # the link `paretoplan serve` prints
        cookie = next(c for c in page.context.cookies() if c["name"] == "paretoplan_token")
        assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
        assert p.evaluate("document.cookie") == ""  # the page's scripts never see the token
        p.goto(f"/?job={job['id']}&point={baseline}")
        wait_for(p, "(s) => (document.getElementById('panel-summary') || {}).textContent === s", arg=X)
        wait_for(p, "() => document.querySelectorAll('#runs li').length === 1")
        p.wait_for_selector("#runs table.segments")
        shot(p, "hostile")
        shown = p.inner_text("body")
        # each field, as text: job list, title, frontier summary, table, panel (summary, mesh, ops,
        # pipeline, against the frontier), run card (stage, segments)
        for where in ("#job-list", "#job-title", "#frontier-summary", "#points-table tbody", "#panel-summary",
                      "#panel-mesh", "#panel-sharding", "#panel-deltas", "#runs table.segments", "#runs .run-line"):
            assert X in p.inner_text(where) or X in p.locator(where).first.inner_text(), where
        assert shown.count(X) >= 10
        p.locator("#panel-sharding details").first.evaluate("(d) => { d.open = true; }")
        assert X in p.inner_text("#panel-sharding")
        assert p.locator("img[src=x]").count() == 0
        assert p.evaluate("window.__xss") is None
        assert not page.errors, page.errors
    finally:
        page.close()
