"""What a new user meets on the dashboard, each checked in Chromium against a real service: resize
errors beside their field and cleared on change, one symbol per baseline and labels that do not
overlap, log ticks that carry their unit, state badges told apart by word and shape, launch
disabled with the reason for a plan this machine cannot run, and the prediction's error band with
a hint to profile this machine when a run misses it."""

from __future__ import annotations

import re

import pytest

from tests.service.svchelp import run_report, wait_job
from tests.web.test_dashboard import TINY, wait_chart
from tests.web.webhelp import start_service, stop_service, wait_for

pytestmark = [pytest.mark.browser, pytest.mark.processes]

# gpt2-tiny priced for 8 H100s: only a search (no run), and every baseline planner has a plan
EIGHT_H100 = {"model": "gpt2-tiny", "device": "h100-80gb", "devices": 8, "global_batch": 16}

# the text box of each annotation (its g.annotation also spans the leader line to the mark)
BOXES = """() => [...document.querySelectorAll('#chart g.annotation-text-g')].map((g) => {
  const r = g.getBoundingClientRect(); return {text: g.textContent, l: r.left, t: r.top, r: r.right, b: r.bottom}; })"""


def open_job(page, http, body: dict) -> tuple[dict, dict]:
    job = wait_job(http, http.post("/api/jobs", json=body).json()["id"])
    assert job["status"] == "done", job
    fr = http.get(f"/api/jobs/{job['id']}/frontier").json()
    page.goto(f"/?job={job['id']}")
    wait_chart(page, len(fr["frontier"]))
    return job, fr


def test_resize_error_sits_beside_its_field_and_goes_when_the_input_changes(web, http, shot):
    page = web.page
    job, _ = open_job(page, http, {**TINY, "global_batch": 16})
    page.fill("#r-devices", "4")
    page.click("#resize-submit")
    page.wait_for_selector("#resize-card", timeout=120_000)
    shot(page, "answer")

    # a new input makes the answer stale: it goes at once, with its mark on the chart
    page.fill("#r-devices", "3")
    assert page.locator("#resize-card").count() == 0
    wait_for(page, "!document.getElementById('chart').data.some((t) => t.name.startsWith('resize'))")
    page.click("#resize-submit")
    page.locator("#rerr-devices").wait_for(state="visible")
    detail = http.post(f"/api/jobs/{job['id']}/resize", json={"devices": 3}).json()["detail"]
    # the message speaks of sizes ("data-parallel size"): the page used to put it under memory
    assert page.inner_text("#rerr-devices") == detail
    assert page.is_hidden("#rerr-memory_per_device") and page.is_hidden("#rerr-form")
    assert page.get_attribute("#r-devices", "aria-invalid") == "true"
    assert page.locator("#resize-card").count() == 0
    shot(page, "error-under-devices")

    page.fill("#r-devices", "4")
    page.fill("#r-memory", "lots")
    page.click("#resize-submit")
    page.locator("#rerr-memory_per_device").wait_for(state="visible")
    assert "lots" in page.inner_text("#rerr-memory_per_device") and page.is_hidden("#rerr-devices")
    page.type("#r-memory", "x")  # editing the field clears its message
    assert page.is_hidden("#rerr-memory_per_device") and page.get_attribute("#r-memory", "aria-invalid") is None
    assert web.errors == []


def test_each_baseline_has_its_own_symbol_and_no_labels_overlap(web, http, shot):
    page = web.page
    _, fr = open_job(page, http, EIGHT_H100)
    assert len(fr["baselines"]) >= 8
    page.fill("#r-devices", "16")  # a resize target and its label too
    page.click("#resize-submit")
    page.wait_for_selector("#resize-card", timeout=120_000)
    wait_for(page, "document.getElementById('chart').data.some((t) => t.name.startsWith('resize'))")
    shot(page, "chart")
    traces = page.evaluate("document.getElementById('chart').data.map((t) => [t.name, t.marker && t.marker.symbol])")
    base = [s for n, s in traces if n.startswith("baseline: ")]
    own = {s for n, s in traces if not n.startswith("baseline: ") and isinstance(s, str)}
    assert len(base) == len(fr["baselines"]) and len(set(base)) == len(base), base
    assert not set(base) & own, (base, own)
    boxes = page.evaluate(BOXES)
    labels = [b for b in boxes if b["text"] in {x["name"] for x in fr["baselines"]} or b["text"].startswith("→")]
    assert len(labels) >= len(fr["baselines"]) // 2, boxes  # most marks are named beside them
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            apart = a["r"] <= b["l"] or b["r"] <= a["l"] or a["b"] <= b["t"] or b["b"] <= a["t"]
            assert apart, f"labels overlap: {a} and {b}"
    assert web.errors == []


def test_log_ticks_carry_their_units(web, http, shot):
    page = web.page
    open_job(page, http, EIGHT_H100)
    page.select_option("#x-scale", "log")
    page.select_option("#y-scale", "log")
    wait_for(page, "document.getElementById('chart').layout.xaxis.type === 'log' && "
                           "document.getElementById('chart').layout.yaxis.type === 'log'")
    shot(page, "log-axes")
    xt = page.eval_on_selector_all("#chart .xtick text", "els => els.map((e) => e.textContent)")
    yt = page.eval_on_selector_all("#chart .ytick text", "els => els.map((e) => e.textContent)")
    assert len(xt) >= 2 and len(yt) >= 2, (xt, yt)
    # every tick says its unit, so "2" can no longer be 2 GiB or 20 GiB
    assert all(re.fullmatch(r"[\d.]+ (B|KiB|MiB|GiB|TiB)", t) for t in xt), xt
    assert all(re.fullmatch(r"[\d.]+ (µs|ms|s)", t) for t in yt), yt
    assert len(set(xt)) == len(xt) and len(set(yt)) == len(yt)
    assert web.errors == []


def test_state_badges_differ_in_word_and_shape(web, http, shot):
    page = web.page
    job, _ = open_job(page, http, {**TINY, "global_batch": 4})
    words = page.evaluate("""import('/static/js/format.js').then((m) => [m.stateText('queued'), m.stateText('running'),
        m.stateText('running', {run: true, step: 3, steps: 20}), m.stateText('done'), m.stateText('failed')])""")
    assert words == ["queued", "searching", "running step 3/20", "done", "failed"]
    # each state its own icon (CSS ::before), not only its own colour
    icons = page.evaluate("""() => ['queued', 'searching', 'running', 'done', 'failed'].map((s) => {
        const el = document.createElement('span'); el.className = `badge state-${s}`; el.dataset.state = s;
        document.body.appendChild(el); const c = getComputedStyle(el, '::before').content; el.remove(); return c; })""")
    assert len(set(icons)) == 5 and "none" not in icons, icons
    assert page.get_attribute("#job-status", "data-state") == "done"
    badge = page.locator(f'#job-list a[data-job="{job["id"]}"] .badge')
    assert badge.get_attribute("data-state") == "done" and badge.inner_text() == "done"
    shot(page, "badges")
    assert web.errors == []


def test_launch_is_disabled_with_the_reason_for_a_plan_this_machine_cannot_run(web, http, shot):
    page = web.page
    _, fr = open_job(page, http, {"model": "gpt2-tiny", "device": "h100-80gb", "devices": 64, "global_batch": 64})
    point = fr["frontier"][0]["id"]
    st = http.get(f"/api/strategies/{point}").json()
    assert st["launchable_here"] is False and "processes" in st["not_launchable_reason"]
    page.goto(f"/?job={fr['job_id']}&point={point}")
    page.wait_for_selector("#launch")
    assert page.is_disabled("#launch")
    assert page.inner_text("#launch-why") == f"Not launchable here: {st['not_launchable_reason']}"
    assert page.get_attribute("#launch", "aria-describedby") == "launch-why"
    shot(page, "launch-disabled")
    # a plan this machine runs keeps its button
    _, small = open_job(page, http, {**TINY, "global_batch": 8})
    page.goto(f"/?job={small['job_id']}&point={small['frontier'][0]['id']}")
    page.wait_for_selector("#launch")
    assert page.is_enabled("#launch") and page.locator("#launch-why").count() == 0
    assert web.errors == []


def test_a_run_outside_the_error_band_says_to_profile_this_machine(open_page, tmp_path, shot):
    """No run worker: the test posts the run's report itself, as a worker would, with a step 50x
    slower than the catalog's price (what a CPU host priced as the catalog's CPU measures)."""
    svc = start_service(tmp_path / "svc", workers=("search",))
    try:
        with svc.client() as http:
            job = wait_job(http, http.post("/api/jobs", json={**TINY, "global_batch": 4}).json()["id"])
            fr = http.get(f"/api/jobs/{job['id']}/frontier").json()
            assert fr["confidence"]["priced_from"] == "catalog"
            point = fr["frontier"][0]
            run = http.post(f"/api/jobs/{job['id']}/launch", json={"strategy_id": point["id"], "steps": 4}).json()
            task = http.post("/api/tasks/claim", json={"worker": "test", "kinds": ["run"]}).json()
            plan = http.get(f"/api/strategies/{point['id']}").json()["plan"]
            report = run_report(plan, 4, time_s=50 * point["time_s"], memory_bytes=point["memory_bytes"])
            r = http.post(f"/api/tasks/run/{task['id']}/result", json={"token": task["token"], "report": report})
            assert r.status_code == 200, r.text
            page = open_page(svc.url).page
            page.goto(f"/?job={job['id']}&point={point['id']}")
            page.wait_for_selector(f'#panel-runs [data-run="{run["id"]}"] .error-band')
            band = page.inner_text(f'#panel-runs [data-run="{run["id"]}"] .error-band')
            assert f"time ±{100 * fr['confidence']['time_error']:.2g}%" in band and "outside it" in band
            hint = page.inner_text(f'#panel-runs [data-run="{run["id"]}"] .profile-hint')
            assert f"paretoplan profile --model gpt2-tiny --devices {fr['num_devices']}" in hint
            assert "profile_id" in hint
            shot(page, "profile-hint")
    finally:
        stop_service(svc)
