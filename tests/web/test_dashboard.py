"""The dashboard end to end: a real service, real workers (searches and 2-process gloo runs), Chromium.

Each flow saves a screenshot per step under tests/web/artifacts/<test>/ (see conftest.py).
"""

from __future__ import annotations

import json
import re
import time

import pytest

from tests.service.svchelp import count_rows, start_worker, wait_job
from tests.web.webhelp import start_service, stop_service, wait_for

pytestmark = [pytest.mark.browser, pytest.mark.processes]

TINY = {"model": "gpt2-tiny", "device": "cpu", "devices": 2}
RUN_TIMEOUT_MS = 300_000
STEPS = 5  # 2 warm-up steps, a memory step and timed steps (fewer: no memory measured)
# what the form sends besides the fields a test types
FORM_DEFAULTS = {"precision": "bf16", "eps": 0, "pipeline": True, "recompute": True, "baselines": True}


# ---- helpers ----------------------------------------------------------------------------------

def pct(rel: float | None) -> str:
    """format.js's pct: signed percentage with a real minus sign."""
    if rel is None:
        return "–"
    if abs(rel) < 5e-5:
        return "0%"
    s = f"{rel * 100:.{2 if abs(rel) < 0.01 else 1}f}"
    return f"+{s}%" if rel > 0 else f"−{s[1:]}%"


def fill_form(page, *, model="gpt2-tiny", device="cpu", devices="2", global_batch="8", **more):
    page.wait_for_selector("#f-model option[value]")
    page.fill("#f-model-filter", model)
    page.select_option("#f-device", device)
    page.fill("#f-devices", devices)
    page.fill("#f-global-batch", global_batch)
    for field, value in more.items():
        page.fill(f"#f-{field.replace('_', '-')}", value)


def job_id_of(page) -> int:
    page.wait_for_url(re.compile(r"[?&]job=\d+"))
    return int(re.search(r"job=(\d+)", page.url).group(1))


def wait_chart(page, n_points: int) -> None:
    page.wait_for_selector(f'#chart[data-points="{n_points}"] .scatterlayer .trace path.point')
    wait_for(page, "window.__paretoplan.tableReadyAt !== null")


def chart_position(page, strategy_id: int) -> tuple[int, int]:
    """(trace, point) of a strategy in the chart's data."""
    where = page.evaluate("""(id) => {
        const d = document.getElementById('chart').data;
        for (let t = 0; t < d.length; t++) {
            const cd = d[t].customdata || [];
            for (let i = 0; i < cd.length; i++) if (cd[i][0] === id) return [t, i];
        }
        return null; }""", strategy_id)
    assert where is not None, f"strategy {strategy_id} is not on the chart"
    return where[0], where[1]


def point_centre(page, strategy_id: int) -> tuple[float, float]:
    """The centre of the point's marker on screen (Plotly's drag layer lies over the markers, so a
    click there reaches Plotly, which picks the nearest point)."""
    trace, i = chart_position(page, strategy_id)
    marker = page.evaluate_handle("""([t, i]) => {
        for (const g of document.querySelectorAll('#chart .scatterlayer .trace')) {
            if (g.__data__ && g.__data__[0].trace.index === t) {
                return [...g.querySelectorAll('path.point')].find((p) => p.__data__ && p.__data__.i === i) || null;
            }
        }
        return null; }""", [trace, i]).as_element()
    assert marker is not None, f"no marker for strategy {strategy_id}"
    box = marker.bounding_box()
    return box["x"] + box["width"] / 2, box["y"] + box["height"] / 2


def wait_run_settled(page) -> None:
    wait_for(page,
        "document.querySelector('#runs .badge.done, #runs .badge.failed') !== null", timeout=RUN_TIMEOUT_MS)
    wait_for(page, "document.querySelector('#runs .badge.failed') !== null"
                           " || document.getElementById('chart').data.some(t => t.name === 'measured')")


def check_panel(page, http, strategy_id: int, *, baselines: bool = True) -> dict:
    """The panel shows the strategy's plan as the API stores it."""
    st = http.get(f"/api/strategies/{strategy_id}").json()
    plan = st["plan"]
    wait_for(page, "(s) => document.getElementById('panel-summary')?.textContent === s", arg=st["summary"])
    assert page.is_visible("#panel")
    mesh = " × ".join([f"pp {plan['mesh']['pp']}"] + [f"{a['name']} {a['size']}" for a in plan["mesh"]["axes"]])
    assert page.inner_text("#panel-mesh") == mesh
    # the memory breakdown: one bar segment per part, named in the legend
    assert page.locator("#panel-breakdown .stack span").count() == 5
    legend = page.inner_text("#panel-breakdown .legend")
    for part in ("parameters", "gradients", "optimizer states", "activations", "buffers"):
        assert part in legend
    assert page.locator("#panel-comm tbody tr").count() == len(plan["predicted"]["comm_bytes"])
    variants = sum(len(b["variants"]) for b in plan["blocks"]) + (1 if plan["ops"] else 0)
    assert page.locator("#panel-sharding details").count() == variants
    assert "Replicate()" in page.inner_html("#panel-sharding") or "Shard(" in page.inner_html("#panel-sharding")
    recompute = page.inner_text("#panel-recompute")
    assert (f"{len(plan['recompute'])} of" in recompute) if plan["recompute"] else recompute.startswith("none")
    pipe = page.inner_text("#panel-pipeline")
    assert (f"{plan['pipeline']['stages']}" in pipe) and ("no pipeline" in pipe) == (plan["pipeline"]["stages"] == 1)
    assert ("baseline" in page.inner_text("#panel-deltas")) == baselines
    assert f"point={strategy_id}" in page.url
    return st


def check_measured(page, http, job_id: int, strategy_id: int) -> dict:
    runs = [r for r in http.get(f"/api/jobs/{job_id}/runs").json() if r["strategy_id"] == strategy_id]
    assert runs, "no run of the strategy"
    run = runs[-1]
    assert run["status"] == "done", f"run {run['id']} {run['status']}: {run['error']}"
    assert run["step"] == run["steps"] and run["measured"]["time_s"] > 0
    measured = page.evaluate("document.getElementById('chart').data.find(t => t.name === 'measured').customdata")
    assert [strategy_id, run["id"]] in measured
    errors = run["report"]["errors"]
    card = page.locator(f'#panel-runs .run-card[data-run="{run["id"]}"]')
    assert card.locator(".run-err-time").inner_text() == pct(errors["time"])
    assert card.locator(".run-err-memory").inner_text() == pct(errors["memory"])
    assert f"run {run['id']}: time {pct(errors['time'])}" in page.inner_text("#chart")
    return run


# ---- flows ------------------------------------------------------------------------------------

def test_submit_watch_click_launch_with_the_mouse(web, service, http, shot):
    page = web.page
    page.goto("/")
    fill_form(page)
    assert page.input_value("#f-model") == "gpt2-tiny"  # the one model the filter leaves is chosen
    assert "137 K params" in page.inner_text("#f-model")
    shot(page, "form")
    page.click("#submit-job")
    job_id = job_id_of(page)
    shot(page, "submitted")
    job = wait_job(http, job_id)
    assert job["status"] == "done" and job["request"]["global_batch"] == 8 and job["request"]["device"] == "cpu"
    fr = http.get(f"/api/jobs/{job_id}/frontier").json()
    wait_chart(page, len(fr["frontier"]))
    assert page.inner_text("#job-status") == "done"
    names = page.evaluate("document.getElementById('chart').data.map(t => t.name)")
    assert names[0] == "2 devices: frontier"
    assert [f"baseline: {b['name']}" for b in fr["baselines"]] == [n for n in names if n.startswith("baseline: ")]
    assert page.locator("#points-table tbody tr").count() == len(fr["frontier"]) + len(fr["baselines"])
    assert "device memory" in page.inner_text("#chart")  # the device's memory is drawn (or named at the edge)
    assert page.locator(f'#job-list a[data-job="{job_id}"][aria-current="page"]').count() == 1
    shot(page, "frontier", full_page=True)

    # hover, then click the fastest plan within the budget (a plan the CPU executor runs)
    target = fr["picked_strategy_id"]
    summary = next(p["summary"] for p in fr["frontier"] if p["id"] == target)
    x, y = point_centre(page, target)
    page.mouse.move(x, y)
    page.wait_for_selector("#chart .hoverlayer .hovertext")
    assert summary in page.text_content("#chart .hoverlayer")
    shot(page, "hover")
    page.mouse.click(x, y)
    check_panel(page, http, target)
    assert page.get_attribute(f'#points-table tbody tr[data-id="{target}"]', "aria-selected") == "true"
    assert page.evaluate("document.getElementById('chart').data.find(t => t.name === 'selected').x.length") == 1
    shot(page, "panel")

    page.fill("#launch-steps", str(STEPS))
    page.click("#launch")
    page.wait_for_selector("#runs li")
    shot(page, "launched")
    wait_run_settled(page)
    run = check_measured(page, http, job_id, target)
    assert run["steps"] == STEPS
    shot(page, "measured")

    # offline: every request the page made went to the app itself (plotly.js included)
    assert any(u.endswith("/static/vendor/plotly-basic.min.js") for u in web.requests)
    assert all(u.startswith(service.url) for u in web.requests if not u.startswith("data:")), web.requests
    assert web.errors == []


def tab_until(page, js_predicate: str, limit: int = 80) -> None:
    for _ in range(limit):
        page.keyboard.press("Tab")
        if page.evaluate(f"(() => {{ const el = document.activeElement; return !!({js_predicate}); }})()"):
            return
    raise AssertionError(f"Tab never reached {js_predicate}")


def test_the_same_with_the_keyboard_through_the_table(web, http, shot):
    page = web.page
    page.goto("/")
    page.wait_for_selector("#f-model option[value]")
    tab_until(page, "el.id === 'f-model-filter'")
    page.keyboard.type("gpt2-ti")
    page.keyboard.press("Tab")  # the model list: the one match is chosen
    assert page.evaluate("document.activeElement.id") == "f-model"
    assert page.input_value("#f-model") == "gpt2-tiny"
    page.keyboard.press("Tab")
    page.keyboard.type("cpu")  # type-ahead in the device list
    assert page.input_value("#f-device") == "cpu"
    page.keyboard.press("Tab")
    page.keyboard.type("2")  # focusing by Tab selects the field's text: typing replaces it
    tab_until(page, "el.id === 'f-global-batch'")
    page.keyboard.type("4")
    shot(page, "form")
    page.keyboard.press("Enter")
    job_id = job_id_of(page)
    job = wait_job(http, job_id)
    assert job["status"] == "done" and job["request"]["global_batch"] == 4 and job["devices"] == 2
    fr = http.get(f"/api/jobs/{job_id}/frontier").json()
    wait_chart(page, len(fr["frontier"]))

    # sort by memory from its column header, then into the table
    tab_until(page, "el.closest('th') && el.textContent.startsWith('peak memory')")
    page.keyboard.press("Enter")
    assert page.get_attribute('#points-table th[data-key="memory_bytes"]', "aria-sort") == "ascending"
    ids = [int(i) for i in page.eval_on_selector_all("#points-table tbody tr", "rs => rs.map(r => r.dataset.id)")]
    mem = {p["id"]: p["memory_bytes"] for p in fr["frontier"] + fr["baselines"]}
    assert [mem[i] for i in ids] == sorted(mem[i] for i in ids)
    tab_until(page, "el.matches('#points-table tbody tr')")
    first = int(page.evaluate("document.activeElement.dataset.id"))
    assert first == ids[0]
    shot(page, "table-focused")

    # down the table to the DDP baseline, open it with Enter
    target = next(b["id"] for b in fr["baselines"] if b["name"] == "data-parallel")
    for _ in range(ids.index(target)):
        page.keyboard.press("ArrowDown")
    assert int(page.evaluate("document.activeElement.dataset.id")) == target
    page.keyboard.press("Enter")
    check_panel(page, http, target)
    assert page.inner_text("#panel-title") == "Baseline: data-parallel"
    assert page.evaluate("document.activeElement.matches('#points-table tbody tr')")  # focus stays in the table
    shot(page, "panel")
    page.keyboard.press("ArrowUp")
    page.keyboard.press("Home")
    assert int(page.evaluate("document.activeElement.dataset.id")) == ids[0]
    page.keyboard.press("Enter")
    check_panel(page, http, ids[0])
    # back to the baseline, then launch it from the panel with the keyboard
    for _ in range(ids.index(target)):
        page.keyboard.press("ArrowDown")
    page.keyboard.press(" ")
    check_panel(page, http, target)
    tab_until(page, "el.id === 'launch-steps'")
    page.keyboard.type(str(STEPS))
    page.keyboard.press("Enter")
    page.wait_for_selector("#runs li")
    shot(page, "launched")
    wait_run_settled(page)
    check_measured(page, http, job_id, target)
    shot(page, "measured")
    page.keyboard.press("Escape")  # closes the panel, back to the table
    assert page.is_hidden("#panel")
    assert page.evaluate("document.activeElement.matches('#points-table tbody tr')")
    assert "point=" not in page.url
    assert web.errors == []


def test_bad_input_shows_the_api_message_next_to_the_field_and_creates_nothing(web, service, http, shot):
    page = web.page
    page.goto("/")
    before = count_rows(service.db_url)

    def api_says(**fields) -> str:
        body = {**FORM_DEFAULTS, **TINY, "global_batch": 8, **fields}
        r = http.post("/api/jobs", json={k: v for k, v in body.items() if v is not None})
        assert r.status_code == 422, r.text
        return r.json()["detail"]

    def submit_and_expect(field: str, detail: str, step: str) -> None:
        page.click("#submit-job")
        err = page.locator(f"#err-{field}")
        err.wait_for(state="visible")
        assert err.inner_text() == detail
        visible = page.eval_on_selector_all("#job-form .error", "es => es.filter(e => !e.hidden).map(e => e.id)")
        assert visible == [f"err-{field}"], visible
        shot(page, step)

    fill_form(page, global_batch="0")
    submit_and_expect("global_batch", api_says(global_batch=0), "global-batch")
    assert page.get_attribute("#f-global-batch", "aria-invalid") == "true"
    page.fill("#f-global-batch", "8")  # typing clears the message
    assert page.is_hidden("#err-global_batch")

    page.fill("#f-memory-budget", "lots")
    submit_and_expect("memory_budget", api_says(memory_budget="lots"), "memory-budget")
    page.fill("#f-memory-budget", "")

    page.fill("#f-device-counts", "4, x")
    submit_and_expect("device_counts", api_says(device_counts=[4, "x"]), "device-counts")
    page.fill("#f-device-counts", "")

    page.fill("#f-seq-len", "100000")
    submit_and_expect("seq_len", api_says(seq_len=100000), "seq-len")
    page.fill("#f-seq-len", "")

    page.fill("#f-model-filter", "no-such-model")  # nothing left in the list: the name goes as typed
    submit_and_expect("model", api_says(model="no-such-model"), "model")

    page.fill("#f-model-filter", "gpt2-tiny")
    page.select_option("#f-device", "h100-80gb")
    page.fill("#f-devices", "12")
    submit_and_expect("devices", api_says(device="h100-80gb", devices=12), "devices")

    # an upload that is not JSON, and one that is no graph
    page.check('input[name="source"][value="file"]')
    page.select_option("#f-device", "cpu")
    page.fill("#f-devices", "2")
    page.set_input_files("#f-file", files=[{"name": "broken.json", "mimeType": "application/json", "buffer": b"{not json"}])
    page.click("#submit-job")
    page.locator("#err-file").wait_for(state="visible")
    assert page.inner_text("#err-file").startswith("not valid JSON")
    shot(page, "upload-not-json")
    page.set_input_files("#f-file", files=[{"name": "x.json", "mimeType": "application/json", "buffer": b'{"a": 1}'}])
    page.click("#submit-job")
    wait_for(page, "document.getElementById('err-file').textContent.startsWith('graph: invalid graph')")
    shot(page, "upload-not-a-graph")

    assert "job=" not in page.url and page.is_visible("#empty")
    assert count_rows(service.db_url) == before  # nothing half-submitted
    assert web.errors == []


def test_upload_an_hf_config(web, http, shot):
    page = web.page
    page.goto("/")
    page.wait_for_selector("#f-model option[value]")
    page.check('input[name="source"][value="file"]')
    cfg = {"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 512, "n_positions": 64}
    page.set_input_files("#f-file", files=[{"name": "tiny-hf.json", "mimeType": "application/json",
                                            "buffer": json.dumps(cfg).encode()}])
    page.select_option("#f-device", "cpu")
    page.fill("#f-devices", "2")
    page.fill("#f-global-batch", "4")
    shot(page, "form")
    page.click("#submit-job")
    job_id = job_id_of(page)
    job = wait_job(http, job_id)
    assert job["status"] == "done" and job["name"] == "tiny-hf" and job["request"]["hf_config"] == cfg
    wait_chart(page, job["frontier_size"])
    assert page.inner_text("#job-title") == f"Job #{job_id}: tiny-hf"
    shot(page, "frontier")
    assert web.errors == []


def test_a_link_opens_the_job_and_its_plan_and_resize_shows_the_target(web, http, shot):
    job = wait_job(http, http.post("/api/jobs", json={**TINY, "global_batch": 16}).json()["id"])
    fr = http.get(f"/api/jobs/{job['id']}/frontier").json()
    point = fr["frontier"][len(fr["frontier"]) // 2]["id"]
    page = web.page
    page.goto(f"/?job={job['id']}&point={point}")
    wait_chart(page, len(fr["frontier"]))
    check_panel(page, http, point)
    shot(page, "deep-link")
    page.goto(f"/#job={job['id']}")
    wait_chart(page, len(fr["frontier"]))
    assert page.is_hidden("#panel")

    # bad resize input: the API's message next to the field
    page.fill("#r-devices", "0")
    page.click("#resize-submit")
    page.locator("#rerr-devices").wait_for(state="visible")
    assert page.inner_text("#rerr-devices") == http.post(f"/api/jobs/{job['id']}/resize", json={"devices": 0}).json()["detail"]
    page.fill("#r-devices", "4")
    page.fill("#r-memory", "lots")
    page.click("#resize-submit")
    page.locator("#rerr-memory_per_device").wait_for(state="visible")
    assert "lots" in page.inner_text("#rerr-memory_per_device")
    shot(page, "resize-bad-input")

    page.fill("#r-memory", "")
    page.click("#resize-submit")
    page.wait_for_selector("#resize-card", timeout=120_000)
    target = page.evaluate("document.getElementById('chart').data.find(t => t.name === 'resize → 4 devices')")
    st = http.get(f"/api/strategies/{target['customdata'][0][0]}").json()
    assert st["plan"]["num_devices"] == 4 and target["customdata"][0][1] == 4
    assert st["summary"] in page.inner_text("#resize-card")
    assert "4 devices" in page.inner_text("#resize-card")
    shot(page, "resize")
    page.click("#resize-card [data-open]")
    wait_for(page, "document.getElementById('panel-title').textContent === 'Resize target: 4 devices'")
    assert page.inner_text("#panel-summary") == st["summary"]
    assert "current plan" in page.inner_text("#panel-deltas")
    shot(page, "resize-plan")

    # the job list opens a job too
    other = http.post("/api/jobs", json={**TINY, "global_batch": 8}).json()["id"]
    page.evaluate("document.querySelector('#home').click()")
    page.wait_for_selector(f'#job-list a[data-job="{other}"]', timeout=30_000)
    assert "2 × cpu" in page.inner_text(f'#job-list a[data-job="{other}"]')  # device count and type
    page.focus(f'#job-list a[data-job="{other}"]')
    page.keyboard.press("Enter")
    page.wait_for_url(re.compile(rf"job={other}\b"))
    page.wait_for_selector("#chart .scatterlayer .trace path.point")
    page.go_back()  # to the page with no job open
    page.wait_for_selector("#empty:not([hidden])")
    page.go_back()  # to the job, by the #job= form of its address
    wait_for(page, f"document.getElementById('job-title').textContent.startsWith('Job #{job['id']}')")
    wait_chart(page, len(fr["frontier"]))
    assert web.errors == []


def test_live_progress_follows_the_event_stream(open_page, tmp_path, shot):
    """No worker at first: the page shows the job queued; a worker started later claims it and the
    page follows the search over SSE to its frontier."""
    svc = start_service(tmp_path, workers=())
    try:
        web = open_page(svc.url)
        page = web.page
        page.goto("/")
        fill_form(page)
        page.click("#submit-job")
        job_id_of(page)
        page.wait_for_selector("#progress-box:not([hidden])")
        wait_for(page, "document.getElementById('job-log').textContent.includes('queued')")
        assert page.inner_text("#job-status") == "queued"
        shot(page, "queued")
        worker = start_worker(svc.url, "sse-late", tmp_path, kinds="search", wait=False)
        svc.workers.append(worker)
        wait_for(page, "document.getElementById('job-log').textContent.includes('claimed by sse-late')",
                               timeout=120_000)
        page.wait_for_selector("#chart .scatterlayer .trace path.point", timeout=120_000)
        assert page.inner_text("#job-status") == "done"
        assert "Pareto-optimal plans" in page.inner_text("#job-log")
        # the search reported each mesh it finished with the frontier's size so far
        assert re.search(r"pp1 x dp\d+ x tp\d+.*: \d+ frontier points so far", page.inner_text("#job-log"))
        assert page.get_attribute("#progress", "aria-valuenow") == "100"
        shot(page, "done")
        assert web.errors == []
    finally:
        stop_service(svc)


def test_one_colour_per_device_count(web, http, shot):
    """A job that asked for several device counts: each count's frontier in its own colour.

    The page asks GET /api/jobs/{id}/frontier?devices=N for the other counts; the answer is the
    stored frontier of that count's search (a job asking for 4 devices shares it)."""
    body = {**TINY, "global_batch": 12, "device_counts": [4]}
    job = wait_job(http, http.post("/api/jobs", json=body).json()["id"])
    four = wait_job(http, http.post("/api/jobs", json={**TINY, "global_batch": 12, "devices": 4}).json()["id"])
    end = time.monotonic() + 120
    while http.get(f"/api/jobs/{job['id']}").json()["alternates"][0]["status"] != "done":
        assert time.monotonic() < end
        time.sleep(0.2)
    alt = http.get(f"/api/jobs/{four['id']}/frontier").json()
    assert alt["search_id"] == job["alternates"][0]["search_id"] and alt["num_devices"] == 4
    own = http.get(f"/api/jobs/{job['id']}/frontier?devices=4").json()
    assert own["search_id"] == alt["search_id"] and own["num_devices"] == 4
    assert http.get(f"/api/jobs/{job['id']}/frontier?devices=3").status_code == 404
    page = web.page
    page.goto(f"/?job={job['id']}")
    wait_for(page, "document.getElementById('chart').data.filter(t => t.name.endsWith('devices: frontier')).length === 2")
    traces = page.evaluate("document.getElementById('chart').data.filter(t => t.name.endsWith('devices: frontier'))"
                           ".map(t => [t.name, t.marker.color, t.x.length])")
    assert [t[0] for t in traces] == ["2 devices: frontier", "4 devices: frontier"]
    assert traces[0][1] != traces[1][1] and traces[1][2] == len(alt["frontier"])
    fours = page.eval_on_selector_all("#points-table tbody tr", "rs => rs.filter(r => r.cells[1].textContent === '4').length")
    assert fours == len(alt["frontier"])
    assert "4 devices: done" in page.inner_text("#alternates")
    shot(page, "two-device-counts")
    # a 4-device point opens like any other, compared with its own neighbours
    target = alt["frontier"][0]["id"]
    x, y = point_centre(page, target)
    page.mouse.click(x, y)
    check_panel(page, http, target, baselines=False)  # the baselines were planned for 2 devices
    assert page.inner_text("#panel-title") == "Point #0 · 4 devices"
    shot(page, "four-device-point")
    assert web.errors == []


def test_your_config_is_priced_and_drawn_against_the_frontier(web, http, shot):
    """The "your config" form posts the job's model, cluster and job with a Megatron-style plan to
    /api/estimate; the answer is drawn as its own marker, its card says MFU and which frontier
    point dominates it, and a refusal is shown under the form, naming the flag."""
    page = web.page
    r = http.post("/api/jobs", json={"model": "gpt2-tiny", "device": "cpu", "devices": 4, "global_batch": 8})
    job_id = r.json()["id"]
    assert wait_job(http, job_id)["status"] == "done"
    fr = http.get(f"/api/jobs/{job_id}/frontier").json()
    page.goto(f"/?job={job_id}")
    wait_chart(page, len(fr["frontier"]))
    assert "priced from the catalog" in page.inner_text("#confidence")
    page.fill("#e-tp", "2")
    page.fill("#e-pp", "2")
    page.click("#estimate-submit")
    page.wait_for_selector("#estimate-card")
    want = http.post("/api/estimate", json={"model": "gpt2-tiny", "device": "cpu", "devices": 4, "global_batch": 8,
                                            "tp": 2, "pp": 2, "job_id": job_id}).json()
    card = page.inner_text("#estimate-card")
    assert want["description"] in card and want["against_frontier"]["message"] in card
    assert page.inner_text("#estimate-mfu").endswith("%")
    trace = page.evaluate("document.getElementById('chart').data.find(t => t.name === 'your config')")
    assert trace is not None and len(trace["x"]) == 1 and "MFU" in trace["hovertext"][0]
    frontier = page.evaluate("document.getElementById('chart').data[0].text")
    assert all("MFU" in t for t in frontier)
    shot(page, "your-config", full_page=True)
    page.fill("#e-tp", "3")
    page.click("#estimate-submit")
    page.wait_for_selector("#eerr-form:not([hidden])")
    assert "--tp 3 x --pp 2" in page.inner_text("#eerr-form")
    assert page.get_attribute("#e-tp", "aria-invalid") == "true"
    assert page.evaluate("document.getElementById('chart').data.some(t => t.name === 'your config')")  # kept
    assert web.errors == []
