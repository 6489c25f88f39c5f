// The dashboard: job list, new-job form, the open job's search progress, frontier chart and
// table, the plan panel, runs and resize. The open job lives in the address (`/?job=ID`, and
// `&point=ID` for the open plan), so a link opens the same view.

import { api, ApiError, follow } from "./api.js";
import { bytes, seconds, pct, when, mfu, stateBadge, stateOf, stateText, html, joinHtml, setHtml } from "./format.js";
import { initForm } from "./form.js";
import { draw, colorFor } from "./chart.js";
import { createTable } from "./table.js";
import { renderPanel, updateRuns, runCard } from "./panel.js";

const $ = (sel) => document.querySelector(sel);
// timings from the start of navigation (performance.now()), read by tests and bench/dashboard_render.py
const perf = (window.__paretoplan = { chartDrawnAt: null, chartPaintedAt: null, tableReadyAt: null, draws: 0 });

const state = {
  token: 0, jobId: null, job: null, frontier: null, series: [], baselines: [], points: new Map(),
  strategies: new Map(), selectedId: null, runs: [], followers: new Map(), stream: null,
  resizeTarget: null, estimate: null, steps: 20, runUi: {},
};

// ---- the address ------------------------------------------------------------------------------
function fromUrl() {
  const q = new URLSearchParams(location.search);
  const h = new URLSearchParams(location.hash.replace(/^#/, ""));
  const job = Number(q.get("job") || h.get("job")) || null;
  const point = Number(q.get("point") || h.get("point")) || null;
  return { job, point };
}
function setUrl({ job, point }, push) {
  const q = new URLSearchParams();
  if (job) q.set("job", job);
  if (job && point) q.set("point", point);
  const url = q.toString() ? `/?${q}` : "/";
  if (url === location.pathname + location.search) return;
  (push ? history.pushState : history.replaceState).call(history, null, "", url);
}

// ---- job list ---------------------------------------------------------------------------------
let jobsTimer = null;
async function refreshJobs() {
  clearTimeout(jobsTimer);
  let busy = false;
  try {
    const list = await api.jobs(100);
    $("#jobs-total").textContent = `(${list.total})`;
    busy = list.items.some((j) => j.status === "queued" || j.status === "running");
    const items = list.items.map((j) => html`<li><a href="/?job=${j.id}" data-job="${j.id}"${j.id === state.jobId ? html` aria-current="page"` : ""}><span class="jid">#${j.id}</span><span class="jname">${j.name}</span>${stateBadge(j.status)}<span class="jsub">${j.devices} × ${j.device || "custom cluster"}${j.alternates.length ? ` (+${j.alternates.map((a) => a.devices).join(", ")})` : ""} · ${when(j.created_at)}${j.frontier_size != null ? ` · ${j.frontier_size} points` : ""}${j.cached ? " · cached" : ""}</span></a></li>`);
    setHtml($("#job-list"), items.length ? html`${items}` : html`<li class="hint">no jobs yet</li>`);
  } catch (e) {
    setHtml($("#job-list"), html`<li class="error">${e.message}</li>`);
  }
  jobsTimer = setTimeout(refreshJobs, busy ? 3000 : 15000);
}
$("#job-list").addEventListener("click", (e) => {
  const a = e.target.closest("a[data-job]");
  if (!a || e.ctrlKey || e.metaKey || e.shiftKey) return;
  e.preventDefault();
  openJob(Number(a.dataset.job), { push: true });
});
function markCurrent() {
  for (const a of document.querySelectorAll("#job-list a[data-job]")) {
    if (Number(a.dataset.job) === state.jobId) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
}

// ---- one job ----------------------------------------------------------------------------------
function reset() {
  if (state.stream) state.stream.close();
  for (const f of state.followers.values()) f.close();
  Object.assign(state, { job: null, frontier: null, series: [], baselines: [], points: new Map(), selectedId: null,
    runs: [], followers: new Map(), stream: null, resizeTarget: null, estimate: null, lastFraction: null, lastStage: null,
    runUi: {} });
  closePanel(false);
  $("#frontier").hidden = true;
  $("#progress-box").hidden = true;
  $("#job-error").hidden = true;
  $("#alternates").hidden = true;
  $("#job-log").replaceChildren();
  $("#resize-result").replaceChildren();
  $("#estimate-result").replaceChildren();
  $("#confidence").textContent = "";
  $("#runs-box").hidden = true;
  $("#chart").removeAttribute("data-points");
  clearFormErrors("#resize-form");
  clearFormErrors("#estimate-form");
}

function jobMeta(job) {
  const r = job.request || {};
  const model = r.model || r.name || (r.hf_config ? "HF config" : r.graph ? "uploaded graph" : "?");
  const parts = [`${model} on ${job.devices} × ${r.device || "?"}`];
  if (r.global_batch) parts.push(`global batch ${r.global_batch}`);
  if (r.seq_len) parts.push(`seq ${r.seq_len}`);
  parts.push(String(r.precision || "bf16"));
  if (r.memory_budget) parts.push(`budget ${bytes(r.memory_budget)}`);
  parts.push(`submitted ${when(job.created_at)}`);
  if (job.cached) parts.push("answered from a stored frontier");
  return parts.join(" · ");
}

function showJob(job) {
  state.job = job;
  $("#empty").hidden = true;
  $("#job").hidden = false;
  $("#job-title").textContent = `Job #${job.id}: ${job.name}`;
  setJobBadge(job.status);
  $("#job-meta").textContent = jobMeta(job);
  if (job.status === "failed") {
    $("#job-error").textContent = `The search failed: ${job.error || "no reason given"}`;
    $("#job-error").hidden = false;
  }
  if (job.alternates.length) {
    $("#alternates").hidden = false;
    setHtml($("#alternates"), html`Also searched: ${joinHtml(job.alternates.map((a) =>
      stateBadge(a.status, {}, `${a.devices} devices: `)), " ")}`);
  }
}

function setJobBadge(status) {
  const badge = $("#job-status");
  badge.className = `badge ${status} state-${stateOf(status)}`;
  badge.dataset.state = stateOf(status);
  badge.textContent = stateText(status);
}

function progress(fraction, label) {
  const pctv = Math.round(100 * Math.max(0, Math.min(1, fraction || 0)));
  $("#progress-box").hidden = false;
  $("#progress-bar").style.width = `${pctv}%`;
  $("#progress").setAttribute("aria-valuenow", String(pctv));
  $("#progress-label").textContent = label;
}

async function openJob(id, { push = false, point = null } = {}) {
  const token = ++state.token;
  reset();
  state.jobId = id;
  setUrl({ job: id, point }, push);
  markCurrent();
  if (!id) { $("#empty").hidden = false; $("#job").hidden = true; return; }
  let job;
  try {
    job = await api.job(id);
  } catch (e) {
    if (token !== state.token) return;
    $("#empty").hidden = true; $("#job").hidden = false;
    $("#job-title").textContent = `Job #${id}`;
    $("#job-status").className = "badge failed"; $("#job-status").textContent = "not found";
    $("#job-meta").textContent = "";
    $("#job-error").textContent = e.message; $("#job-error").hidden = false;
    return;
  }
  if (token !== state.token) return;
  showJob(job);
  if (job.status === "done") return loadFrontier(token, point);
  if (job.status === "failed") return;
  watchSearch(token, point);
}

function watchSearch(token, point) {
  progress(state.job.progress, `${state.job.status}${state.job.stage ? `: ${state.job.stage}` : ""}`);
  const log = $("#job-log");
  state.stream = follow(`/api/jobs/${state.jobId}/events`, {
    onEvent: (kind, e) => {
      if (token !== state.token) return;
      const stage = e.stage || (kind === "info" ? null : kind);
      const frac = e.fraction ?? (stage === "done" ? 1 : null);
      if (frac !== null) state.lastFraction = frac;
      if (stage) state.lastStage = stage;
      const pctText = state.lastFraction != null ? ` (${Math.round(100 * state.lastFraction)}%)` : "";
      progress(state.lastFraction ?? 0, `${state.lastStage || "queued"}${pctText}${e.message ? ` — ${e.message}` : ""}`);
      if (e.message) {
        const li = document.createElement("li");
        li.textContent = e.message;
        log.appendChild(li);
        log.scrollTop = log.scrollHeight;
      }
      if (stage === "running" || stage === "queued") setJobBadge(stage);
    },
    onEnd: async () => {
      if (token !== state.token) return;
      const job = await api.job(state.jobId);
      if (token !== state.token) return;
      showJob(job);
      refreshJobs();
      if (job.status === "done") { progress(1, `done: ${job.frontier_size} Pareto-optimal plans`); await loadFrontier(token, point); }
    },
    onError: async () => {
      // the stream was refused: poll the job instead
      if (token !== state.token) return;
      const job = await api.job(state.jobId).catch(() => null);
      if (job && token === state.token) {
        showJob(job);
        if (job.status === "done") loadFrontier(token, point);
        else if (job.status !== "failed") setTimeout(() => token === state.token && watchSearch(token, point), 2000);
      }
    },
  });
}

function rowsOf() {
  const rows = [];
  for (const s of state.series) {
    for (const p of s.points) rows.push({ ...p, kind: "frontier", devices: s.devices, color: s.color, label: `#${p.index}` });
  }
  const budget = state.frontier.memory_budget_bytes;
  for (const b of state.baselines) {
    rows.push({ ...b, kind: "baseline", index: b.id, label: b.name, devices: state.frontier.num_devices,
      fits: b.memory_bytes <= budget, color: "#333" });
  }
  return rows;
}

async function loadFrontier(token, point) {
  let fr;
  try {
    performance.mark("pp:frontier-request");
    fr = await api.frontier(state.jobId);
    performance.mark("pp:frontier-parsed");
  } catch (e) {
    if (token !== state.token) return;
    $("#job-error").textContent = e.message; $("#job-error").hidden = false;
    return;
  }
  if (token !== state.token) return;
  state.frontier = fr;
  const counts = [fr.num_devices, ...state.job.alternates.map((a) => a.devices)];
  state.series = [{ devices: fr.num_devices, search_id: fr.search_id, color: colorFor(fr.num_devices, counts), points: fr.frontier }];
  state.baselines = fr.baselines;
  indexPoints();
  $("#frontier").hidden = false;
  setHtml($("#frontier-summary"), html`<b>${fr.frontier.length}</b> Pareto-optimal plans for ${fr.model} (${(fr.params / 1e6).toPrecision(3)} M params) on ${fr.cluster} · budget ${bytes(fr.memory_budget_bytes)}${fr.feasible ? "" : html` · <b class="nofit">no plan fits the budget</b>`} · searched in ${seconds(fr.search_seconds)}${fr.eps ? ` · ε = ${fr.eps}` : " · exact"}`);
  $("#confidence").textContent = fr.confidence ? fr.confidence.message : "";
  $("#r-devices").placeholder = String(fr.num_devices);
  await redraw();
  perf.chartDrawnAt = perf.chartDrawnAt ?? performance.now(); // the chart's SVG is in the document
  // the table after the chart is on screen: the next frame's paint, then a task
  await new Promise((r) => requestAnimationFrame(() => setTimeout(r, 0)));
  perf.chartPaintedAt = perf.chartPaintedAt ?? performance.now();
  if (token !== state.token) return;
  table.setRows(rowsOf());
  perf.tableReadyAt = perf.tableReadyAt ?? performance.now();
  loadRuns(token);
  loadAlternates(token, counts);
  if (point) openStrategy(point, { focusPanel: false });
}

function indexPoints() {
  state.points = new Map();
  for (const s of state.series) for (const p of s.points) state.points.set(p.id, { ...p, devices: s.devices, kind: "frontier" });
  for (const b of state.baselines) state.points.set(b.id, { ...b, kind: "baseline" });
}

async function loadAlternates(token, counts) {
  // a job asked for several device counts: each count's frontier in its own colour, where the
  // API serves it (GET /api/jobs/{id}/frontier?devices=N; the answer must be that search's)
  for (const alt of state.job.alternates.filter((a) => a.status === "done")) {
    let fr;
    try { fr = await api.frontier(state.jobId, alt.devices); } catch { continue; }
    if (token !== state.token) return;
    if (fr.search_id !== alt.search_id || fr.num_devices !== alt.devices) continue;
    state.series.push({ devices: alt.devices, search_id: alt.search_id, color: colorFor(alt.devices, counts), points: fr.frontier });
  }
  if (state.series.length > 1) {
    state.series.sort((a, b) => (a.devices === state.frontier.num_devices ? -1 : b.devices === state.frontier.num_devices ? 1 : a.devices - b.devices));
    indexPoints();
    table.setRows(rowsOf());
    await redraw();
  }
}

function chartModel() {
  const fr = state.frontier;
  return {
    series: state.series, baselines: state.baselines, memoryPerDevice: fr.memory_per_device, budget: fr.memory_budget_bytes,
    pickedId: fr.picked_strategy_id, selectedId: state.selectedId, runs: state.runs, resizeTarget: state.resizeTarget,
    estimate: state.estimate,
    xScale: $("#x-scale").value, yScale: $("#y-scale").value, revision: `${state.jobId}-${$("#x-scale").value}-${$("#y-scale").value}`,
  };
}

async function redraw() {
  if (!state.frontier) return;
  await draw($("#chart"), chartModel(), (id) => openStrategy(id));
  perf.draws++;
}
$("#x-scale").addEventListener("change", redraw);
$("#y-scale").addEventListener("change", redraw);

// ---- the plan panel ---------------------------------------------------------------------------
async function strategy(id) {
  if (!state.strategies.has(id)) state.strategies.set(id, await api.strategy(id));
  return state.strategies.get(id);
}

function neighbours(id) {
  const s = state.series.find((x) => x.points.some((p) => p.id === id));
  if (!s) return {};
  const sorted = [...s.points].sort((a, b) => a.time_s - b.time_s);
  const i = sorted.findIndex((p) => p.id === id);
  return { faster: sorted[i - 1] || null, leaner: sorted[i + 1] || null };
}

function currentPlanId() {
  return state.job && (state.job.selected_strategy_id || state.job.picked_strategy_id);
}

async function openStrategy(id, { focusPanel = true } = {}) {
  const token = state.token;
  let st;
  try { st = await strategy(id); } catch (e) {
    $("#job-error").textContent = e.message; $("#job-error").hidden = false; return;
  }
  if (token !== state.token) return;
  state.selectedId = id;
  setUrl({ job: state.jobId, point: id }, false);
  table.setSelected(id);
  const point = state.points.get(id);
  const target = state.resizeTarget && state.resizeTarget.strategy.id === id ? state.resizeTarget : null;
  let title;
  if (st.kind === "baseline") title = `Baseline: ${st.name}`;
  else if (target) title = `Resize target: ${target.devices} devices`;
  else title = `Point #${st.index}${point ? ` · ${point.devices} devices` : ""}`;
  $("#panel-title").textContent = title;
  const compareTo = [];
  const cur = currentPlanId();
  if (cur && cur !== id && (target || !point)) {
    const c = state.points.get(cur);
    if (c) compareTo.push({ label: `vs the job's current plan #${c.index}`, point: c });
  }
  if (target && state.points.size) {
    const fastest = [...state.points.values()].filter((p) => p.kind === "frontier").sort((a, b) => a.time_s - b.time_s)[0];
    if (fastest && fastest.id !== cur) compareTo.push({ label: `vs the fastest plan now (#${fastest.index})`, point: fastest });
  }
  renderPanel($("#panel-body"), {
    strategy: st, neighbours: point && point.kind === "frontier" ? neighbours(id) : {},
    // the baselines were planned for the job's own device count
    baselines: (point ? point.kind === "baseline" || point.devices === state.frontier.num_devices : !target) ? state.baselines : [],
    budget: state.frontier && state.frontier.memory_budget_bytes, memoryPerDevice: state.frontier && state.frontier.memory_per_device,
    selected: state.job && state.job.selected_strategy_id === id, runs: state.runs.filter((r) => r.strategy_id === id),
    compareTo, canLaunch: state.job && state.job.status === "done", steps: state.steps,
    confidence: runConfidence(), runUi: state.runUi,
  });
  const panel = $("#panel");
  const wasHidden = panel.hidden;
  panel.hidden = false;
  $("#layout").classList.add("with-panel");
  if (wasHidden) window.Plotly.Plots.resize($("#chart"));
  await redraw();
  if (focusPanel && document.activeElement && !document.activeElement.closest("#points-table")) panel.focus({ preventScroll: true });
}

function closePanel(update = true) {
  const panel = $("#panel");
  if (panel.hidden) return;
  panel.hidden = true;
  $("#layout").classList.remove("with-panel");
  state.selectedId = null;
  if (update) {
    setUrl({ job: state.jobId }, false);
    table.setSelected(null);
    if (state.frontier) { window.Plotly.Plots.resize($("#chart")); redraw(); }
  }
}
$("#panel-close").addEventListener("click", () => closePanel());
document.addEventListener("keydown", (e) => {
  if (e.key === "Escape" && !$("#panel").hidden) {
    const inPanel = e.target.closest && e.target.closest("#panel");
    closePanel();
    if (inPanel) table.focus();
  }
});

$("#panel-body").addEventListener("click", async (e) => {
  const open = e.target.closest("[data-open]");
  if (open) return openStrategy(Number(open.dataset.open));
  if (e.target.id === "select-plan") return selectPlan(e.target);
  if (e.target.id === "launch") return launch(e.target);
});
$("#panel-body").addEventListener("keydown", (e) => {
  if (e.target.id === "launch-steps" && e.key === "Enter") { e.preventDefault(); launch($("#launch")); }
});

async function selectPlan(button) {
  button.disabled = true;
  try {
    state.job = { ...state.job, ...(await api.select(state.jobId, state.selectedId)) };
    button.textContent = "selected for the job ✓";
  } catch (e) {
    button.disabled = false;
    showLaunchError(e.message);
  }
}

function showLaunchError(msg) {
  const p = $("#launch-error");
  p.textContent = msg; p.hidden = !msg;
  const steps = $("#launch-steps");
  if (steps) { if (msg) steps.setAttribute("aria-invalid", "true"); else steps.removeAttribute("aria-invalid"); }
}

async function launch(button) {
  if (button.disabled) return;
  const raw = $("#launch-steps").value.trim();
  const steps = /^-?\d+$/.test(raw) ? Number(raw) : raw;
  showLaunchError("");
  button.disabled = true;
  const id = state.selectedId;
  try {
    const run = await api.launch(state.jobId, id, steps);
    if (typeof steps === "number") state.steps = steps;
    state.runs.push(run);
    renderRuns();
    followRun(run, state.token);
  } catch (e) {
    if (!(e instanceof ApiError)) throw e;
    showLaunchError(e.detail);
  } finally {
    button.disabled = false;
  }
}

// ---- runs -------------------------------------------------------------------------------------
async function loadRuns(token) {
  let runs;
  try { runs = await api.jobRuns(state.jobId); } catch { return; }
  if (token !== state.token) return;
  state.runs = runs;
  renderRuns();
  for (const r of runs) if (r.status === "queued" || r.status === "running") followRun(r, token);
  if (runs.some((r) => r.measured)) redraw();
}

function pointLabel(id) {
  const p = state.points.get(id);
  if (!p) return `strategy ${id}`;
  return p.kind === "baseline" ? `baseline ${p.name}` : `#${p.index}`;
}

function renderRuns() {
  // the cards are drawn again on every event of a run: a resize field being typed in keeps its focus
  const active = document.activeElement;
  const typing = active && active.closest && active.closest("form.run-resize");
  const where = typing ? (active.closest("#runs") ? "#runs" : "#panel-body") : null;
  const caret = typing ? active.selectionStart : null;
  $("#runs-box").hidden = state.runs.length === 0;
  setHtml($("#runs"), html`${state.runs.slice().reverse().map((r) =>
    html`<li data-run="${r.id}"><button type="button" class="link" data-open="${r.strategy_id}">${pointLabel(r.strategy_id)}</button><div>${runCard(r, runConfidence(), state.runUi)}</div></li>`)}`);
  if (state.selectedId != null) updateRuns($("#panel-body"), state.runs.filter((r) => r.strategy_id === state.selectedId), runConfidence(), state.runUi);
  if (typing) {
    const again = document.querySelector(`${where} form.run-resize[data-run="${typing.dataset.run}"] input[name=devices]`);
    if (again) { again.focus(); try { again.setSelectionRange(caret, caret); } catch { /* a number field has no caret */ } }
  }
}

// ---- resizing a running run (POST /api/runs/{id}/resize) ---------------------------------------
document.addEventListener("input", (e) => {
  const form = e.target.closest && e.target.closest("form.run-resize");
  if (!form) return;
  const ui = (state.runUi[form.dataset.run] ||= {});
  ui.value = e.target.value;
  ui.error = null;
  const p = form.querySelector(".error");
  p.hidden = true; p.textContent = "";
  e.target.removeAttribute("aria-invalid");
});
document.addEventListener("submit", async (e) => {
  const form = e.target.closest && e.target.closest("form.run-resize");
  if (!form) return;
  e.preventDefault();
  const id = Number(form.dataset.run);
  const button = form.querySelector("button");
  if (button.disabled) return;
  const raw = form.querySelector("input[name=devices]").value.trim();
  const ui = (state.runUi[id] ||= {});
  ui.value = raw; ui.error = null; ui.message = null;
  button.disabled = true;
  const token = state.token;
  try {
    const order = await api.resizeRun(id, { devices: /^-?\d+$/.test(raw) ? Number(raw) : raw });
    ui.message = `resize ${order.id} sent: the run moves to ${order.devices} devices at its next step` +
      (order.strategy ? ` (${order.strategy.summary})` : " (its plan is searched first)");
    ui.value = "";
  } catch (err) {
    if (!(err instanceof ApiError)) throw err;
    ui.error = err.detail;
  } finally {
    button.disabled = false;
  }
  if (token !== state.token) return;
  const r = await api.run(id).catch(() => null);
  if (r && token === state.token) replaceRun(r); else renderRuns();
});

$("#runs").addEventListener("click", (e) => {
  const open = e.target.closest("[data-open]");
  if (open) openStrategy(Number(open.dataset.open));
});

function replaceRun(run) {
  const i = state.runs.findIndex((r) => r.id === run.id);
  if (i >= 0) state.runs[i] = run; else state.runs.push(run);
  renderRuns();
}

function followRun(run, token) {
  if (state.followers.has(run.id)) return;
  let pending = null;
  const refresh = () => {
    // coalesce: one GET per burst of events
    if (pending) return;
    pending = setTimeout(async () => {
      pending = null;
      const r = await api.run(run.id).catch(() => null);
      if (r && token === state.token) replaceRun(r);
    }, 150);
  };
  const f = follow(`/api/runs/${run.id}/events`, {
    onEvent: refresh,
    onEnd: async () => {
      state.followers.delete(run.id);
      const r = await api.run(run.id).catch(() => null);
      if (!r || token !== state.token) return;
      replaceRun(r);
      await redraw();
    },
    onError: () => { state.followers.delete(run.id); setTimeout(() => token === state.token && followRun(run, token), 2000); },
  });
  state.followers.set(run.id, f);
}

// how sure the job's prices are, for the run cards (with the model and device count a profile needs)
function runConfidence() {
  const fr = state.frontier;
  return fr && fr.confidence ? { ...fr.confidence, model: fr.model, devices: fr.num_devices } : null;
}

// ---- resize -----------------------------------------------------------------------------------
// a form's error lines and invalid marks, cleared before it is submitted again
function clearFormErrors(form) {
  for (const p of document.querySelectorAll(`${form} .error`)) { p.hidden = true; p.textContent = ""; }
  for (const el of document.querySelectorAll(`${form} [aria-invalid]`)) el.removeAttribute("aria-invalid");
}
// the request field a 422 names first (its loc without "body"), or []
function errorLoc(err) {
  const e = err.errors && err.errors[0];
  return e && e.loc ? e.loc.filter((x) => x !== "body") : [];
}
// the API names the field a resize error concerns (its errors[].loc); guessing from the words put a
// "node size" error under the memory field
function resizeField(err) {
  const loc = errorLoc(err);
  return loc[0] === "devices" || loc[0] === "memory_per_device" ? loc[0] : "form";
}
// an answer for other inputs than the form now holds is stale: it goes, with its mark on the chart
function clearResizeAnswer() {
  $("#resize-result").replaceChildren();
  if (state.resizeTarget) { state.resizeTarget = null; if (state.frontier) redraw(); }
}
for (const [id, field] of [["#r-devices", "devices"], ["#r-memory", "memory_per_device"]]) {
  $(id).addEventListener("input", () => {
    const p = $(`#rerr-${field}`);
    p.hidden = true; p.textContent = "";
    $(id).removeAttribute("aria-invalid");
    const form = $("#rerr-form"); form.hidden = true; form.textContent = "";
    clearResizeAnswer();
  });
}
$("#resize-form").addEventListener("submit", async (e) => {
  e.preventDefault();
  clearFormErrors("#resize-form");
  const form = e.target, button = $("#resize-submit");
  if (button.disabled || !state.jobId) return;
  const rawDevices = $("#r-devices").value.trim(), mem = $("#r-memory").value.trim();
  const body = { devices: /^-?\d+$/.test(rawDevices) ? Number(rawDevices) : rawDevices };
  if (mem) body.memory_per_device = mem;
  const out = $("#resize-result");
  clearResizeAnswer();
  button.disabled = true;
  const token = state.token;
  try {
    let r = await api.resize(state.jobId, body, 10);
    while (r.body.status === "pending" && token === state.token) {
      setHtml(out, html`<p>searching the frontier for ${r.body.devices} devices…</p>`);
      r = await api.resizeAnswer(r.location, 10);
    }
    if (token !== state.token) return;
    showResize(r.body);
  } catch (err) {
    if (!(err instanceof ApiError)) throw err;
    const field = resizeField(err);
    const p = form.querySelector(`#rerr-${field}`);
    p.textContent = err.detail; p.hidden = false;
    const input = form.querySelector(`[name="${field}"]`);
    if (input) { input.setAttribute("aria-invalid", "true"); input.focus(); }
  } finally {
    button.disabled = false;
  }
});

function showResize(r) {
  const out = $("#resize-result");
  if (r.status === "ready") {
    const st = r.strategy;
    state.strategies.set(st.id, st);
    state.resizeTarget = { devices: r.devices, strategy: st };
    const cur = state.points.get(r.current_strategy_id);
    const cmp = cur ? ` (vs the current plan #${cur.index}: time ${pct(st.time_s / cur.time_s - 1)}, memory ${pct(st.memory_bytes / cur.memory_bytes - 1)})` : "";
    setHtml(out, html`<div class="card" id="resize-card"><b>On ${r.devices} devices${r.memory_per_device ? ` with ${bytes(r.memory_per_device)} each` : ""} the job would move to:</b><br><code>${st.summary}</code><br>${seconds(st.time_s)} per iteration, ${bytes(st.memory_bytes)} per device${cmp} <button type="button" class="link" data-open="${st.id}">show this plan</button></div>`);
    redraw();
  } else if (r.status === "no_fit") {
    state.resizeTarget = null;
    setHtml(out, html`<div class="card"><b>No plan fits on ${r.devices} devices${r.memory_per_device ? ` with ${bytes(r.memory_per_device)} each` : ""}.</b>${r.least_memory_bytes ? ` The leanest plan needs ${bytes(r.least_memory_bytes)} per device.` : ""}</div>`);
    redraw();
  } else {
    setHtml(out, html`<div class="card error">The search for ${r.devices} devices ${r.status}${r.error ? `: ${r.error}` : ""}.</div>`);
  }
}
$("#resize-result").addEventListener("click", (e) => {
  const open = e.target.closest("[data-open]");
  if (open) openStrategy(Number(open.dataset.open));
});

// ---- your config (POST /api/estimate) ----------------------------------------------------------
// the job's model, cluster and job fields (a search.plans.api.JobRequest) from its stored request
const JOB_FIELDS = ["model", "name", "hf_config", "graph", "device", "devices", "devices_per_node", "cluster",
  "memory_budget", "global_batch", "seq_len", "precision", "profile"];
const ESTIMATE_FIELDS = ["tp", "pp", "micro_batch", "zero", "recompute"];

function estimateField(err) {
  const loc = errorLoc(err);
  if (ESTIMATE_FIELDS.includes(loc[0])) return loc[0];
  const m = /^--(tp|pp|micro-batch|zero|recompute)\b/.exec(err.detail) || /--(micro-batch|tp|pp)\b/.exec(err.detail);
  return m ? m[1].replace("-", "_") : "form";
}
function intOrText(raw) {
  const t = raw.trim();
  return /^-?\d+$/.test(t) ? Number(t) : t;
}
$("#estimate-form").addEventListener("submit", async (e) => {
  e.preventDefault();
  clearFormErrors("#estimate-form");
  const form = e.target, button = $("#estimate-submit");
  if (button.disabled || !state.jobId || !state.job) return;
  const req = state.job.request || {};
  const body = {};
  for (const k of JOB_FIELDS) if (req[k] !== null && req[k] !== undefined) body[k] = req[k];
  body.tp = intOrText($("#e-tp").value);
  body.pp = intOrText($("#e-pp").value);
  body.micro_batch = intOrText($("#e-micro-batch").value);
  body.zero = Number($("#e-zero").value);
  body.recompute = $("#e-recompute").value;
  body.sequence_parallel = $("#e-sequence-parallel").checked;
  body.job_id = state.jobId;
  const token = state.token;
  button.disabled = true;
  form.setAttribute("aria-busy", "true");
  try {
    const est = await api.estimate(body);
    if (token !== state.token) return;
    state.estimate = est;
    showEstimate(est);
    await redraw();
  } catch (err) {
    if (!(err instanceof ApiError)) throw err;
    if (token !== state.token) return;
    // the message under the whole form (the fields are narrow); the field it names is marked.
    // The last priced config stays on the chart and in its card.
    const field = estimateField(err);
    const p = $("#eerr-form");
    p.textContent = err.detail; p.hidden = false;
    const input = form.querySelector(`[name="${field}"]`);
    if (input) { input.setAttribute("aria-invalid", "true"); input.setAttribute("aria-describedby", "eerr-form"); input.focus(); }
  } finally {
    button.disabled = false;
    form.removeAttribute("aria-busy");
  }
});

function showEstimate(est) {
  const a = est.against_frontier;
  let where = "";
  if (a) {
    const dom = a.dominated_by != null ? state.frontier.frontier[a.dominated_by] : null;
    where = html`<br><span id="estimate-where">${a.message}</span>${dom ? html` <button type="button" class="link" data-open="${dom.id}">show #${a.dominated_by}</button>` : ""}`;
  }
  setHtml($("#estimate-result"), html`<div class="card" id="estimate-card"><b>${est.description}</b><br><code>${est.plan.summary}</code><br><span id="estimate-time">${seconds(est.time_s)}</span> per iteration, <span id="estimate-memory">${bytes(est.memory_bytes)}</span> per device${est.fits_budget ? "" : html` <b class="nofit">over the budget</b>`} · MFU <b id="estimate-mfu">${mfu(est.mfu)}</b> · ${est.launchable ? "launchable" : html`<span class="nofit">not launchable</span>: ${est.not_launchable_reason}`}${where}${est.notes.map((n) => html`<br><span class="hint">note: ${n}</span>`)}<br><span class="hint">${est.confidence.message}</span></div>`);
}
$("#estimate-result").addEventListener("click", (e) => {
  const open = e.target.closest("[data-open]");
  if (open) openStrategy(Number(open.dataset.open));
});

// ---- start ------------------------------------------------------------------------------------
const table = createTable($("#points-table"), { onSelect: (id) => openStrategy(id, { focusPanel: false }) });

window.addEventListener("popstate", () => {
  const { job, point } = fromUrl();
  if (job !== state.jobId) openJob(job, { point });
  else if (point && point !== state.selectedId) openStrategy(point);
  else if (!point) closePanel();
});
$("#home").addEventListener("click", (e) => { e.preventDefault(); openJob(null, { push: true }); });

async function start() {
  performance.mark("pp:start");
  const { job, point } = fromUrl();
  // a linked job's chart first; the form and the job list right after (they share the CPU)
  if (job) await Promise.race([openJob(job, { point }), new Promise((r) => setTimeout(r, 1500))]);
  initForm($("#job-form"), {
    onCreated: (created) => {
      refreshJobs();
      openJob(created.id, { push: true });
    },
  });
  refreshJobs();
}
if (window.Plotly) start();
else window.addEventListener("load", start, { once: true });
