// The side panel: one strategy's Plan, what it gains or costs against its neighbours and the
// baselines, and the actions on it (select, launch; its runs).

import { bytes, seconds, pct, mfu, stateBadge, html, joinHtml, setHtml } from "./format.js";
import { runErrors } from "./chart.js";

const PARTS = [["params", "parameters"], ["grads", "gradients"], ["optimizer", "optimizer states"],
  ["activations", "activations"], ["buffers", "buffers / workspace"]];
const ZERO = ["none: parameters, gradients and optimizer states replicated over dp",
  "ZeRO-1: optimizer states sharded over dp", "ZeRO-2: optimizer states and gradients sharded over dp",
  "ZeRO-3 / FSDP: parameters, gradients and optimizer states sharded over dp"];
const SCHEDULES = { none: "none", gpipe: "GPipe", "1f1b": "1F1B (PipeDream-Flush)", "2bw": "PipeDream-2BW (1-stale weights)" };

export function ranges(nums) {
  const out = [];
  let start = null, prev = null;
  for (const n of [...nums].sort((a, b) => a - b)) {
    if (start === null) { start = prev = n; continue; }
    if (n === prev + 1) { prev = n; continue; }
    out.push(start === prev ? `${start}` : `${start}–${prev}`);
    start = prev = n;
  }
  if (start !== null) out.push(start === prev ? `${start}` : `${start}–${prev}`);
  return out.join(", ");
}

function rel(a, b) { return b ? a / b - 1 : null; }
function cls(x) { return x === null ? "" : x < -1e-9 ? "better" : x > 1e-9 ? "worse" : ""; }
function delta(label, me, other, openId) {
  const dt = rel(me.time_s, other.time_s), dm = rel(me.memory_bytes, other.memory_bytes);
  const link = openId ? html` <button type="button" class="link" data-open="${openId}">open</button>` : "";
  return html`<li><span>${label}</span>: time <b class="${cls(dt)}">${pct(dt)}</b>, memory <b class="${cls(dm)}">${pct(dm)}</b>${link}</li>`;
}

function meshText(plan) {
  const axes = plan.mesh.axes.map((a) => `${a.name} ${a.size}`);
  return [`pp ${plan.mesh.pp}`, ...axes].join(" × ");
}

function breakdown(plan, budget, devMem) {
  const b = plan.predicted.breakdown;
  const total = PARTS.reduce((s, [k]) => s + (Number(b[k]) || 0), 0) || 1;
  const share = (k) => (100 * (Number(b[k]) || 0)) / total;
  const segs = PARTS.map(([k, name]) =>
    html`<span class="seg-${k}" style="width:${share(k)}%;background:var(--${k})" title="${name}: ${bytes(b[k])}"></span>`);
  const legend = PARTS.map(([k, name]) =>
    html`<li><i style="background:var(--${k})"></i>${name} <b>${bytes(b[k])}</b> (${share(k).toFixed(0)}%)</li>`);
  const peak = plan.predicted.memory_bytes;
  const note = budget ? `peak ${bytes(peak)} = ${((100 * peak) / budget).toPrecision(3)}% of the budget (${bytes(budget)})` +
    (devMem && devMem !== budget ? `, ${((100 * peak) / devMem).toPrecision(3)}% of the device's ${bytes(devMem)}` : "") : "";
  return html`<div class="stack" role="img" aria-label="memory breakdown">${segs}</div><ul class="legend">${legend}</ul><p class="budget-note">${note}</p>`;
}

function comm(plan) {
  const c = plan.predicted.comm_bytes || {};
  const sizes = Object.fromEntries(plan.mesh.axes.map((a) => [a.name, a.size]));
  sizes.pp = plan.mesh.pp;
  const keys = Object.keys(c);
  if (!keys.length) return html`<p class=hint>no communication recorded</p>`;
  const max = Math.max(...keys.map((k) => Number(c[k]) || 0), 1);
  const rows = keys.map((k) => html`<tr><td>${k}</td><td class="num">${sizes[k] ?? ""}</td><td class="num">${bytes(c[k])}</td><td><span class="hbar" style="width:${Math.round((80 * (Number(c[k]) || 0)) / max)}px"></span></td></tr>`);
  return html`<table class="mini comm"><thead><tr><th>axis</th><th class="num">size</th><th class="num">bytes / device / iteration</th><th></th></tr></thead><tbody>${rows}</tbody></table>`;
}

function pipeline(plan) {
  const p = plan.pipeline || {};
  const layers = (plan.blocks || []).reduce((n, b) => Math.max(n, b.layer_variant.length), 0);
  if (!p.stages || p.stages <= 1) {
    return html`<dl class="kv"><dt>stages</dt><dd>1 (no pipeline): every device holds all ${layers} layers</dd><dt>micro-batching</dt><dd>none: the global batch of ${plan.global_batch} in one step</dd></dl>`;
  }
  // interleaved 1F1B: stage_layers lists every chunk, chunk s on device s % stages (times and memory per device)
  const last = p.stage_layers.length - 1;
  const rows = p.stage_layers.map((lr, s) => html`<tr><td>${p.virtual_stages > 1 ? `${s} (device ${s % p.stages})` : s}</td><td>${lr[0]}–${lr[1] - 1}${s === 0 ? " + embeddings" : ""}${s === last ? " + head" : ""}</td><td class="num">${lr[1] - lr[0]}</td><td class="num">${seconds(p.stage_time_s[s % p.stages])}</td><td class="num">${bytes(p.stage_memory_bytes[s % p.stages])}</td></tr>`);
  const interleaved = p.virtual_stages > 1 ? `, interleaved: ${p.virtual_stages} chunks per device` : "";
  return html`<dl class="kv"><dt>stages</dt><dd>${p.stages}</dd><dt>schedule</dt><dd>${SCHEDULES[p.schedule] || p.schedule}${interleaved}</dd><dt>micro-batches</dt><dd>${p.micro_batches}${p.micro_batch_size ? ` × ${p.micro_batch_size} samples per dp rank` : ""}</dd></dl><table class="mini stages"><thead><tr><th>stage</th><th>layers</th><th class="num">#</th><th class="num">time</th><th class="num">memory</th></tr></thead><tbody>${rows}</tbody></table>`;
}

// "blocks.0.attn.q:linear" in layer 0 of "blocks" -> "attn.q"
function shortOp(name, prefix) {
  let n = String(name).split(":")[0];
  if (prefix && n.startsWith(`${prefix}.`)) n = n.slice(prefix.length + 1).replace(/^\d+\./, "");
  return n || name;
}

function opRows(ops, axes, prefix) {
  const br = html`<br>`;
  return ops.map((o) => {
    const cfg = joinHtml(o.config.map((c, i) => `${axes[i] ? axes[i].name : i}: ${c === "R" ? "rep" : c}`), br);
    const params = Object.entries(o.params || {}).map(([name, pl]) =>
      html`<code>${String(name).split(".").pop()}</code> ${[].concat(pl).join(", ")}`);
    params.push(html`<code>out</code> ${[].concat(o.output || []).join(", ")}`);
    return html`<tr><td><code title="${o.op}">${shortOp(o.op, prefix)}</code><br><span class="hint">${o.kind}</span></td><td>${cfg}</td><td>${joinHtml(params, br)}</td></tr>`;
  });
}

function sharding(plan) {
  const axes = plan.mesh.axes;
  const head = html`<thead><tr><th>op</th><th>mesh axis → dim</th><th>DTensor placements</th></tr></thead>`;
  const out = [];
  const rc = new Set((plan.recompute || []).map((r) => Number(String(r).split(".").pop())));
  for (const b of plan.blocks || []) {
    const n = b.layer_variant.length;
    b.variants.forEach((ops, v) => {
      const layers = b.layer_variant.map((x, i) => (x === v ? i : -1)).filter((i) => i >= 0);
      const recomputed = layers.filter((l) => rc.has(l));
      out.push(html`<details class="variant"${v === 0 ? html` open` : ""}><summary><b>${b.prefix}</b> layers ${ranges(layers)} (${layers.length} of ${n})${recomputed.length ? `, recomputed: ${ranges(recomputed)}` : ""}</summary><div class="scroll-x"><table class="mini ops">${head}<tbody>${opRows(ops, axes, b.prefix)}</tbody></table></div></details>`);
    });
  }
  if ((plan.ops || []).length) {
    out.push(html`<details class="variant"><summary>outside the layers (${plan.ops.length} ops: embeddings, head, loss)</summary><div class="scroll-x"><table class="mini ops">${head}<tbody>${opRows(plan.ops, axes, "")}</tbody></table></div></details>`);
  }
  return out.length ? html`${out}` : html`<p class=hint>no ops</p>`;
}

function recompute(plan) {
  const total = (plan.blocks || []).reduce((n, b) => Math.max(n, b.layer_variant.length), 0);
  const rc = plan.recompute || [];
  if (!rc.length) return `none: activations of all ${total} layers are kept for the backward pass`;
  const prefix = String(rc[0]).split(".").slice(0, -1).join(".");
  return `${rc.length} of ${total} layers recompute their activations in the backward pass (${prefix} ${ranges(rc.map((r) => Number(String(r).split(".").pop())))})`;
}

// The band the prediction claimed (its pricing's held-out error) beside what the run measured; where
// the plan was priced from the catalog and the run falls outside the band, how to profile this
// machine. A CPU host priced from the catalog is off by orders of magnitude, and the page used to
// show those errors with no word on why or what to do.
function errorBand(r, conf) {
  if (!conf || !(r.measured && r.measured.time_s)) return "";
  const band = conf.time_error != null ? `±${(100 * conf.time_error).toPrecision(2)}%` : null;
  const e = runErrors(r);
  const outside = band != null && e.time != null && Math.abs(e.time) > 2 * conf.time_error;
  const parts = [html`<div class="run-line error-band">prediction's error band: ${band ? `time ${band}` : "unknown"}${conf.memory_error != null ? `, memory ±${(100 * conf.memory_error).toPrecision(2)}%` : ""} (priced from the ${conf.priced_from})${outside ? html` · <b class="bad">this run is outside it</b>` : ""}</div>`];
  if (conf.priced_from === "catalog" && (outside || band == null)) {
    const cmd = `paretoplan profile --model ${conf.model || "MODEL"} --devices ${conf.devices || "N"} --out profile.json`;
    parts.push(html`<p class="hint profile-hint">Profile this machine: the catalog prices a datasheet device, not this one. Run <code>${cmd}</code> here, upload it (POST /api/profiles) and search again with its <code>profile_id</code>.</p>`);
  }
  return html`${parts}`;
}

// A run's launches: one row per segment (steps, devices, plan, how it started and ended, and what
// the resize or restart took: save, re-plan, restart, load). The report's when it is done, else what
// the worker reported so far.
function segments(r) {
  const segs = (r.report && r.report.segments && r.report.segments.length ? r.report.segments : r.segments) || [];
  if (segs.length < 2 && !(segs.length && segs[0].cause !== "launch")) return "";
  const t = (x) => (x === null || x === undefined ? "–" : seconds(x));
  const rows = segs.map((g, i) => {
    const rs = g.resize_s;
    const took = rs ? html`${t(rs.save_s + rs.replan_s + rs.restart_s + rs.load_s)} <span class="hint">(save ${t(rs.save_s)}, re-plan ${t(rs.replan_s)}, restart ${t(rs.restart_s)}, load ${t(rs.load_s)})</span>` : "–";
    const end = g.ended === "running" ? "…" : g.to_step;
    return html`<tr class="segment" data-devices="${g.devices}"><td class="num">${i}</td><td class="num">${g.from_step}–${end}</td><td class="num">${g.devices}</td><td><code>${g.plan_summary}</code></td><td>${g.cause}${g.ended !== "running" ? `, ${g.ended}` : ""}${g.error ? html` <span class="error">${g.error}</span>` : ""}</td><td>${took}</td></tr>`;
  });
  const restarts = r.report ? r.report.restarts : segs.filter((g) => g.cause === "restart").length;
  return html`<table class="mini segments" aria-label="run ${r.id} segments"><thead><tr><th class="num">#</th><th class="num">steps</th><th class="num">devices</th><th>plan</th><th>started by, ended by</th><th>resize took</th></tr></thead><tbody>${rows}</tbody></table><div class="hint">${segs.length} segments, ${restarts} restart${restarts === 1 ? "" : "s"}</div>`;
}

// The resize control of a running run: the device count to move to (the run saves at its next step,
// takes the job's plan for that many devices and goes on from the same step). `ui`: what the page
// keeps across re-renders ({value, message, error} by run id).
function resizeControl(r, ui = {}) {
  if (r.status !== "running") return "";
  const pending = r.resize ? html`<span class="resize-pending">resize to ${r.resize.devices} devices pending${r.resize.status === "pending" ? " (searching its plan)" : ""}</span>` : "";
  return html`<form class="run-resize" data-run="${r.id}" novalidate><label>resize to <input type="number" name="devices" min="1" inputmode="numeric" value="${ui.value ?? ""}" aria-label="run ${r.id}: new device count"${ui.error ? html` aria-invalid="true"` : ""}></label> devices <button type="submit">resize</button> ${pending}<p class="error" role="alert"${ui.error ? "" : html` hidden`}>${ui.error || ""}</p>${ui.message ? html`<p class="hint resize-sent">${ui.message}</p>` : ""}</form>`;
}

export function runCard(r, conf = null, ui = {}) {
  const pr = Math.round(100 * (Number(r.progress) || 0));
  const parts = [html`<div class="run-line"><b>run ${r.id}</b> ${stateBadge(r.status, { run: true, step: r.step, steps: r.steps })}${r.stage && r.stage !== r.status ? ` ${r.stage}` : ""}${r.status === "running" ? "" : ` · step ${r.step ?? 0}/${r.steps}`} <span class="progress" role="progressbar" aria-label="run ${r.id} progress" aria-valuenow="${pr}" aria-valuemin="0" aria-valuemax="100"><span class="bar" style="width:${pr}%;display:block"></span></span></div>`];
  if (r.measured && r.measured.time_s) {
    const e = runErrors(r);
    const mem = r.measured.memory_bytes != null ? bytes(r.measured.memory_bytes) : "memory not measured";
    parts.push(html`<div class="run-line">measured <b>${seconds(r.measured.time_s)}</b>, <b>${mem}</b> · predicted ${seconds(r.predicted.time_s)}, ${bytes(r.predicted.memory_bytes)} · error: time <b class="run-err-time ${cls(e.time)}">${pct(e.time)}</b>, memory <b class="run-err-memory ${cls(e.memory)}">${pct(e.memory)}</b></div>`);
    if (r.report && r.report.device) {
      parts.push(html`<div class="hint">on ${r.report.device}${r.report.notes && r.report.notes.length ? `; ${r.report.notes.join("; ")}` : ""}</div>`);
    }
  }
  if (r.error) parts.push(html`<div class="error">${String(r.error).split("\n").slice(-3).join(" ")}</div>`);
  return html`${parts}${resizeControl(r, ui[r.id])}${segments(r)}${errorBand(r, conf)}`;
}

const runCards = (runs, conf, ui) => runs.map((r) => html`<div class="run-card" data-run="${r.id}">${runCard(r, conf, ui)}</div>`);

// ctx: {title, strategy, neighbours: {faster, leaner}, baselines, budget, memoryPerDevice, selected,
//       runs, compareTo: [{label, point}], canLaunch}
export function renderPanel(root, ctx) {
  const st = ctx.strategy, plan = st.plan, pred = plan.predicted;
  const fits = ctx.budget ? pred.memory_bytes <= ctx.budget : true;
  const deltas = [];
  const me = { time_s: st.time_s, memory_bytes: st.memory_bytes };
  if (ctx.neighbours.faster) deltas.push(delta(`vs #${ctx.neighbours.faster.index} (the next faster point)`, me, ctx.neighbours.faster, ctx.neighbours.faster.id));
  if (ctx.neighbours.leaner) deltas.push(delta(`vs #${ctx.neighbours.leaner.index} (the next leaner point)`, me, ctx.neighbours.leaner, ctx.neighbours.leaner.id));
  for (const c of ctx.compareTo || []) deltas.push(delta(c.label, me, c.point, c.point.id));
  for (const b of ctx.baselines) if (b.id !== st.id) deltas.push(delta(`vs baseline ${b.name}`, me, b, b.id));
  let against = "";
  if (st.kind === "baseline" && st.against_frontier) {
    const a = st.against_frontier;
    against = html`<p>The frontier has ${a.faster_point != null ? html`a plan <b>${Number(a.speedup).toPrecision(3)}×</b> as fast within its memory (#${a.faster_point})` : "no faster plan within its memory"} and ${a.leaner_point != null ? html`a plan needing <b>${Number(a.memory_ratio).toPrecision(3)}×</b> less memory at no more time (#${a.leaner_point})` : "no leaner plan at its time"}.</p>`;
  }
  const priced = (pred.priced_from || (pred.estimated ? "catalog" : "profile")) === "profile"
    ? `a measured device profile${pred.estimated ? " (some costs from the catalog's roofline)" : ""}`
    : "the device catalog (roofline estimate)";
  setHtml(root, html`
    <p class="summary-line" id="panel-summary">${st.summary}</p>
    ${st.description ? html`<p class="hint">${st.description}</p>` : ""}
    <dl class="kv prediction">
      <dt>iteration time</dt><dd id="panel-time">${seconds(pred.time_s, 4)}</dd>
      <dt>peak memory / device</dt><dd id="panel-memory">${bytes(pred.memory_bytes, 4)} ${fits ? "" : html`<b class="nofit">over the budget</b>`}</dd>
      <dt>MFU</dt><dd id="panel-mfu">${mfu(pred.mfu)}${pred.model_flops ? html` <span class="hint">(${(pred.model_flops / 1e12).toPrecision(3)} TFLOP per iteration)</span>` : ""}</dd>
      <dt>priced from</dt><dd id="panel-priced">${priced}${ctx.confidence ? html`<br><span class="hint">${ctx.confidence.message}</span>` : ""}</dd>
    </dl>
    <div class="actions">
      <button type="button" id="select-plan" ${ctx.selected ? html`disabled` : ""}>${ctx.selected ? "selected for the job ✓" : "Select for the job"}</button>
      <span><label for="launch-steps">steps</label><input id="launch-steps" type="text" inputmode="numeric" value="${ctx.steps || 20}" aria-describedby="launch-error"></span>
      <button type="button" class="primary" id="launch" ${ctx.canLaunch && st.launchable_here !== false ? "" : html`disabled`}
        ${st.launchable_here === false ? html`aria-describedby="launch-why"` : ""}>Launch</button>
    </div>
    ${st.launchable_here === false ? html`<p class="hint launch-why" id="launch-why">Not launchable here: ${st.not_launchable_reason}</p>` : ""}
    <p class="error" id="launch-error" role="alert" hidden></p>
    <div id="panel-runs">${runCards(ctx.runs || [], ctx.confidence, ctx.runUi)}</div>
    ${against}
    <h3>Compared with</h3><ul class="deltas" id="panel-deltas">${deltas.length ? deltas : html`<li>nothing to compare with</li>`}</ul>
    <h3>Mesh</h3>
    <p class="mesh" id="panel-mesh">${meshText(plan)}</p>
    <dl class="kv"><dt>devices</dt><dd>${plan.num_devices} (${plan.devices_per_node} per node) · ${plan.cluster}</dd>
      <dt>sharded data parallel</dt><dd>${ZERO[plan.zero_stage] || `ZeRO-${plan.zero_stage}`}</dd>
      <dt>job</dt><dd>${plan.model}, global batch ${plan.global_batch}${plan.seq_len ? `, seq ${plan.seq_len}` : ""}, ${plan.precision}</dd></dl>
    <h3>Pipeline and micro-batching</h3><div id="panel-pipeline">${pipeline(plan)}</div>
    <h3>Recomputation</h3><p id="panel-recompute">${recompute(plan)}</p>
    <h3>Memory per device</h3><div id="panel-breakdown">${breakdown(plan, ctx.budget, ctx.memoryPerDevice)}</div>
    <h3>Communication per axis</h3><div id="panel-comm">${comm(plan)}</div>
    <h3>Sharding per layer</h3><div id="panel-sharding">${sharding(plan)}</div>`);
}

export function updateRuns(root, runs, conf = null, ui = {}) {
  const box = root.querySelector("#panel-runs");
  if (box) setHtml(box, html`${runCards(runs, conf, ui)}`);
}
