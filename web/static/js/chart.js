// The frontier chart (Plotly): iteration time against peak memory per device.
//
// Traces, in this order (tests and the bench find points by it): one frontier trace per device
// count (the first is the job's own), the baselines (one trace each, labelled), the picked point,
// the selected point, measured runs with their error, a resize target, the user's own config
// ("your config", priced by POST /api/estimate).

import { byteUnit, timeUnit, bytes, seconds, pct, mfu, esc } from "./format.js";

export const PALETTE = ["#2459c6", "#e45756", "#54a24b", "#f58518", "#b279a2", "#72b7b2", "#9d755d", "#eeca3b"];
const BASELINE_SYMBOLS = ["diamond", "square", "triangle-up", "cross", "pentagon", "hexagon", "triangle-down", "star-square"];
const LABEL_POS = ["top center", "bottom center", "middle right", "middle left", "top right", "bottom left"];

const seriesCache = new WeakMap(); // points array -> {key, trace}

export function colorFor(devices, allCounts) {
  const sorted = [...new Set(allCounts)].sort((a, b) => a - b);
  return PALETTE[Math.max(0, sorted.indexOf(devices)) % PALETTE.length];
}

function axisScale(choice, values) {
  if (choice === "linear" || choice === "log") return choice;
  const pos = values.filter((v) => v > 0);
  if (pos.length < 2) return "linear";
  return Math.max(...pos) / Math.min(...pos) > 50 ? "log" : "linear";
}

function range(scale, lo, hi) {
  if (scale === "log") return [Math.log10(lo / 1.4), Math.log10(hi * 1.4)];
  return [0, hi * 1.1 || 1];
}

// model: {series: [{devices, color, points}], baselines, memoryPerDevice, budget, pickedId,
//         selectedId, runs, resizeTarget, estimate, xScale, yScale}
export function figure(model) {
  const pts = model.series.flatMap((s) => s.points);
  const est = model.estimate || null;
  // a run that measured no memory is drawn at its predicted memory (only its time is known)
  const measured = (model.runs || []).filter((r) => r.measured && r.measured.time_s)
    .map((r) => ({ ...r, measured: { ...r.measured, memory_bytes: r.measured.memory_bytes ?? r.predicted.memory_bytes,
      memoryKnown: r.measured.memory_bytes != null } }));
  const target = model.resizeTarget && model.resizeTarget.strategy;
  const mems = [...pts.map((p) => p.memory_bytes), ...model.baselines.map((b) => b.memory_bytes),
    ...measured.map((r) => r.measured.memory_bytes), ...(target ? [target.memory_bytes] : []),
    ...(est ? [est.memory_bytes] : [])];
  const times = [...pts.map((p) => p.time_s), ...model.baselines.map((b) => b.time_s),
    ...measured.map((r) => r.measured.time_s), ...(target ? [target.time_s] : []), ...(est ? [est.time_s] : [])];
  const maxMem = Math.max(...mems, 1);
  // the device memory and budget lines: drawn where they sit near the points, else named at the edge
  const lines = [];
  const budget = model.budget, devMem = model.memoryPerDevice;
  if (devMem) lines.push({ x: devMem, label: budget === devMem ? "device memory = budget" : "device memory", dash: "solid", color: "#b3261e" });
  if (budget && budget !== devMem) lines.push({ x: budget, label: "budget", dash: "dash", color: "#a15c00" });
  const xScale = axisScale(model.xScale, mems);
  const near = xScale === "log" ? 100 : 4;
  const inside = lines.filter((l) => l.x <= maxMem * near);
  const outside = lines.filter((l) => l.x > maxMem * near);
  const xs = [...mems, ...inside.map((l) => l.x)];
  const xMax = Math.max(...xs);
  const xu = byteUnit(Math.max(...xs));
  const tu = timeUnit(Math.max(...times, 1e-9));
  const X = (b) => b / xu.scale, Y = (t) => t / tu.scale;
  const yScale = axisScale(model.yScale, times);

  const traces = [];
  for (const s of model.series) {
    // the same trace object while its points and units are the same: Plotly.react compares data
    // arrays by reference, so selecting a point does not recompute a 2,000-point trace
    const key = `${xu.name}|${tu.name}|${s.color}`;
    const hit = seriesCache.get(s.points);
    if (hit && hit.key === key) { traces.push(hit.trace); continue; }
    const sorted = [...s.points].sort((a, b) => a.memory_bytes - b.memory_bytes);
    const allFit = sorted.every((p) => p.fits);
    const trace = {
      type: "scatter", mode: "lines+markers", name: `${s.devices} devices: frontier`,
      x: sorted.map((p) => X(p.memory_bytes)), y: sorted.map((p) => Y(p.time_s)),
      text: sorted.map((p) => `${esc(p.summary)}<br>MFU ${mfu(p.mfu)}`), customdata: sorted.map((p) => [p.id, p.index, s.devices]),
      marker: { color: s.color, size: 8, symbol: allFit ? "circle" : sorted.map((p) => (p.fits ? "circle" : "circle-open")),
        line: { width: 1.5, color: s.color } },
      line: { color: s.color, width: 1, shape: "linear" }, opacity: 0.95,
      hovertemplate: `%{text}<br>time %{y:.4g} ${tu.name} · memory %{x:.4g} ${xu.name}<extra>${s.devices} devices #%{customdata[1]}</extra>`,
    };
    seriesCache.set(s.points, { key, trace });
    traces.push(trace);
  }
  model.baselines.forEach((b, i) => {
    traces.push({
      type: "scatter", mode: "markers+text", name: `baseline: ${b.name}`,
      x: [X(b.memory_bytes)], y: [Y(b.time_s)], text: [b.name], textposition: b.memory_bytes > 0.85 * xMax ? "top left" : LABEL_POS[i % LABEL_POS.length],
      textfont: { size: 11, color: "#333" }, cliponaxis: false, customdata: [[b.id, b.name]],
      hovertext: [`${esc(b.summary)}<br>MFU ${mfu(b.mfu)}`],
      marker: { symbol: BASELINE_SYMBOLS[i % BASELINE_SYMBOLS.length], size: 12, color: "#fff", line: { color: "#333", width: 2 } },
      hovertemplate: `<b>${b.name}</b> (baseline)<br>%{hovertext}<br>time %{y:.4g} ${tu.name} · memory %{x:.4g} ${xu.name}<extra></extra>`,
    });
  });
  const byId = new Map([...pts, ...model.baselines].map((p) => [p.id, p]));
  if (target) byId.set(target.id, target);
  const picked = byId.get(model.pickedId);
  traces.push({
    type: "scatter", mode: "markers", name: "fastest within budget", hoverinfo: "skip",
    x: picked ? [X(picked.memory_bytes)] : [], y: picked ? [Y(picked.time_s)] : [],
    marker: { symbol: "star", size: 17, color: "#f2b705", line: { color: "#6b5200", width: 1 } },
  });
  const sel = byId.get(model.selectedId);
  traces.push({
    type: "scatter", mode: "markers", name: "selected", hoverinfo: "skip", showlegend: !!sel,
    x: sel ? [X(sel.memory_bytes)] : [], y: sel ? [Y(sel.time_s)] : [],
    marker: { symbol: "circle-open", size: 22, color: "#111", line: { width: 3, color: "#111" } },
  });
  const annotations = [];
  if (measured.length) {
    const lx = [], ly = [];
    for (const r of measured) {
      lx.push(X(r.predicted.memory_bytes), X(r.measured.memory_bytes), null);
      ly.push(Y(r.predicted.time_s), Y(r.measured.time_s), null);
    }
    traces.push({ type: "scatter", mode: "lines", name: "predicted → measured", x: lx, y: ly, hoverinfo: "skip",
      line: { color: "#b3261e", width: 1.5, dash: "dot" }, showlegend: false });
    traces.push({
      type: "scatter", mode: "markers", name: "measured",
      x: measured.map((r) => X(r.measured.memory_bytes)), y: measured.map((r) => Y(r.measured.time_s)),
      customdata: measured.map((r) => [r.strategy_id, r.id]),
      text: measured.map((r) => runText(r)),
      marker: { symbol: "x", size: 13, color: "#b3261e", line: { width: 1, color: "#fff" } },
      hovertemplate: `%{text}<extra>measured</extra>`,
    });
    for (const r of measured) {
      const e = runErrors(r);
      annotations.push({ measured: true, x: X(r.measured.memory_bytes), y: Y(r.measured.time_s),
        text: `run ${r.id}: time ${pct(e.time)}, memory ${pct(e.memory)}`, showarrow: true, arrowhead: 0, arrowcolor: "#b3261e",
        font: { size: 11, color: "#b3261e" }, bgcolor: "rgba(255,255,255,.85)" });
    }
  }
  if (target) {
    traces.push({
      type: "scatter", mode: "markers+text", name: `resize → ${model.resizeTarget.devices} devices`,
      x: [X(target.memory_bytes)], y: [Y(target.time_s)], text: [`→ ${model.resizeTarget.devices} dev`],
      textposition: "middle right", customdata: [[target.id, model.resizeTarget.devices]], hovertext: [target.summary],
      marker: { symbol: "triangle-right", size: 15, color: "#7b3fb5" },
      hovertemplate: `resize target (${model.resizeTarget.devices} devices)<br>%{hovertext}<extra></extra>`,
    });
  }
  if (est) {
    const a = est.against_frontier;
    const where = a ? esc(a.message) : "no frontier to compare with";
    traces.push({
      type: "scatter", mode: "markers+text", name: "your config",
      x: [X(est.memory_bytes)], y: [Y(est.time_s)], text: ["your config"], textposition: "bottom center",
      textfont: { size: 11, color: "#0a7a5a" }, cliponaxis: false, customdata: [[null]],
      hovertext: [`${esc(est.description)}<br>MFU ${mfu(est.mfu)} · ${est.launchable ? "launchable" : `not launchable: ${esc(est.not_launchable_reason)}`}<br>${where}`],
      marker: { symbol: "star-diamond", size: 16, color: "#0a7a5a", line: { color: "#fff", width: 1 } },
      hovertemplate: `<b>your config</b><br>%{hovertext}<br>time %{y:.4g} ${tu.name} · memory %{x:.4g} ${xu.name}<extra></extra>`,
    });
  }
  const shapes = inside.map((l) => ({ type: "line", xref: "x", yref: "paper", x0: X(l.x), x1: X(l.x), y0: 0, y1: 1,
    line: { color: l.color, width: 1.5, dash: l.dash } }));
  inside.forEach((l) => annotations.push({ x: xScale === "log" ? Math.log10(X(l.x)) : X(l.x), xref: "x", yref: "paper", y: 1,
    yanchor: "bottom", text: `${l.label} ${bytes(l.x)}`, showarrow: false, font: { size: 11, color: l.color } }));
  // lines far beyond the points: named above the plot's right edge
  if (outside.length) {
    annotations.push({ x: 1, xref: "paper", xanchor: "right", y: 1, yref: "paper", yanchor: "bottom", showarrow: false,
      text: outside.map((l) => `<span style="color:${l.color}">${l.label} ${bytes(l.x)} →</span>`).join(" · "), font: { size: 11 } });
  }
  const xr = range(xScale, Math.min(...xs.filter((v) => v > 0).map(X), Infinity), Math.max(...xs.map(X)));
  const tpos = times.filter((v) => v > 0);
  const yr = range(yScale, Math.min(...tpos.map(Y), Infinity), Math.max(...tpos.map(Y), 1e-12));
  // measured points' labels: toward the inside of the plot, in axis units (log axes take log10)
  const at = (v, scale, r) => ((scale === "log" ? Math.log10(v) : v) - r[0]) / (r[1] - r[0]);
  for (const a of annotations.filter((x) => x.measured)) {
    const fx = at(a.x, xScale, xr), fy = at(a.y, yScale, yr);
    a.ax = fx > 0.6 ? -40 : 40;
    a.ay = fy > 0.7 ? 28 : -28;
    a.xanchor = fx > 0.6 ? "right" : "left";
    if (xScale === "log") a.x = Math.log10(a.x);
    if (yScale === "log") a.y = Math.log10(a.y);
    delete a.measured;
  }
  const layout = {
    margin: { l: 64, r: 16, t: 26, b: 48 }, hovermode: "closest", dragmode: "zoom", uirevision: model.revision,
    xaxis: { title: { text: `peak memory per device (${xu.name})` }, type: xScale, range: xr, zeroline: false },
    yaxis: { title: { text: `iteration time (${tu.name})` }, type: yScale, range: yr, zeroline: false },
    legend: { orientation: "h", y: -0.16, x: 0, font: { size: 11 } },
    shapes, annotations, font: { family: "system-ui, sans-serif", size: 12 }, plot_bgcolor: "#fff",
  };
  return { traces, layout };
}

export function runErrors(r) {
  const rel = (m, p) => (m != null && p ? (m - p) / p : null);
  const errs = (r.report && r.report.errors) || {};
  return {
    time: errs.time ?? rel(r.measured && r.measured.time_s, r.predicted.time_s),
    memory: errs.memory ?? rel(r.measured && r.measured.memory_bytes, r.predicted.memory_bytes),
  };
}

function runText(r) {
  const e = runErrors(r);
  return `run ${r.id} (strategy ${r.strategy_id})<br>measured ${seconds(r.measured.time_s)}, ${r.measured.memoryKnown ? bytes(r.measured.memory_bytes) : "–"}` +
    `${r.measured.memoryKnown ? "" : " (memory not measured: drawn at the predicted memory)"}` +
    `<br>predicted ${seconds(r.predicted.time_s)}, ${bytes(r.predicted.memory_bytes)}<br>error: time ${pct(e.time)}, memory ${pct(e.memory)}`;
}

// Draw (or redraw) the chart; resolves once it is on screen. onSelect(strategyId) on a click.
export async function draw(el, model, onSelect) {
  const { traces, layout } = figure(model);
  const config = { responsive: true, displaylogo: false, modeBarButtonsToRemove: ["select2d", "lasso2d"] };
  await window.Plotly.react(el, traces, layout, config);
  if (!el.dataset.wired) {
    el.dataset.wired = "1";
    el.on("plotly_click", (ev) => {
      const p = ev && ev.points && ev.points[0];
      const id = p && p.customdata && p.customdata[0];
      if (id) el.dispatchEvent(new CustomEvent("select-strategy", { detail: { id } }));
    });
    el.addEventListener("select-strategy", (e) => onSelect && onSelect(e.detail.id));
  }
  el.dataset.points = String(model.series.reduce((n, s) => n + s.points.length, 0));
}
