"""Resizing a running run from the dashboard: launched from the plan's panel, resized from its run
card while it trains, finished with every loss the single process's, its segments on the page."""

from __future__ import annotations

import pytest

from tests.service.svchelp import wait_job
from tests.web.test_dashboard import RUN_TIMEOUT_MS, check_panel, wait_chart, wait_run_settled
from tests.web.webhelp import wait_for
from worker.reference import reference_losses

pytestmark = [pytest.mark.browser, pytest.mark.processes]

STEPS = 150  # ~10 s of training on 2 processes: time enough to resize it while it runs
JOB = {"model": "llama-tiny", "device": "cpu", "devices": 2, "global_batch": 8, "precision": "fp32",
       "pipeline": False, "baselines": False, "device_counts": [1]}


def test_a_run_launched_here_is_resized_here_while_it_runs(web, http, shot):
    job = wait_job(http, http.post("/api/jobs", json=JOB).json()["id"])
    assert job["status"] == "done"
    fr = http.get(f"/api/jobs/{job['id']}/frontier").json()
    target = fr["picked_strategy_id"]
    page = web.page
    page.goto(f"/?job={job['id']}&point={target}")
    wait_chart(page, len(fr["frontier"]))
    check_panel(page, http, target, baselines=False)
    page.fill("#launch-steps", str(STEPS))
    page.click("#launch")
    field = "#runs form.run-resize input[name=devices]"
    wait_for(page, "/running step [1-9]/.test(document.querySelector('#runs .badge')?.textContent || '')",
                           timeout=RUN_TIMEOUT_MS)
    run_id = int(page.get_attribute("#runs li", "data-run"))
    shot(page, "running")

    # a count the job cannot run on: the API's words under the field, and nothing ordered
    page.fill(field, "0")
    page.click("#runs form.run-resize button")
    page.locator("#runs form.run-resize .error").wait_for(state="visible")
    said = http.post(f"/api/runs/{run_id}/resize", json={"devices": 0}).json()["detail"]
    assert page.inner_text("#runs form.run-resize .error") == said
    assert page.get_attribute(field, "aria-invalid") == "true"
    shot(page, "resize-refused")

    page.fill(field, "1")
    page.click("#runs form.run-resize button")
    page.wait_for_selector("#runs .resize-sent")
    assert "moves to 1 devices at its next step" in page.inner_text("#runs .resize-sent")
    shot(page, "resize-sent")
    # the run moves while it trains: its card shows the new segment before the run ends
    page.wait_for_selector('#runs table.segments tr.segment[data-devices="1"]', timeout=RUN_TIMEOUT_MS)
    shot(page, "resized")
    wait_run_settled(page)
    run = http.get(f"/api/runs/{run_id}").json()
    assert run["status"] == "done", run["error"]
    rep = run["report"]
    assert [(s["devices"], s["cause"], s["ended"]) for s in rep["segments"]] == [
        (2, "launch", "resize"), (1, "resize", "finished")]
    moved_at = rep["segments"][1]["from_step"]
    assert 0 < moved_at < STEPS and rep["restarts"] == 0 and run["devices"] == 1
    ref = reference_losses("llama-tiny", STEPS, 8, rep["plan"]["seq_len"])
    worst = max(abs(a - b) / abs(b) for a, b in zip(rep["losses"], ref, strict=True))
    assert len(rep["losses"]) == STEPS and worst < 1e-4, worst
    # the page: both segments, what the resize took, and no resize control on a finished run
    rows = page.locator("#runs table.segments tr.segment")
    assert rows.count() == 2
    assert f"{moved_at}–{STEPS}" in rows.nth(1).inner_text() and "re-plan" in rows.nth(1).inner_text()
    assert page.locator("#runs form.run-resize").count() == 0
    shot(page, "finished", full_page=True)
    assert web.errors == []
