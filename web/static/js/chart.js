// The frontier chart (Plotly): iteration time against peak memory per device.
//
// Traces, in this order (tests and the bench find points by it): one frontier trace per device
// count (the first is the job's own), the baselines (one trace each, labelled), the picked point,
// the selected point, measured runs with their error, a resize target, the user's own config
// ("your config", priced by POST /api/estimate).

import { byteUnit, timeUnit, bytes, seconds, pct, mfu, esc } from "./format.js";

export const PALETTE = ["#2459c6", "#e45756", "#54a24b", "#f58518", "#b279a2", "#72b7b2", "#9d755d", "#eeca3b"];
// One symbol per baseline, none shared with another baseline or with the marks the chart uses
// itself (circle: frontier, star: fastest within budget, x: measured, triangle-right: resize
// target, star-diamond: your config). A frontier with 9 baselines used to draw two diamonds.
export const BASELINE_SYMBOLS = ["diamond", "square", "triangle-up", "cross", "pentagon", "hexagon", "triangle-down",
  "star-square", "hourglass", "bowtie", "triangle-left", "hexagram", "diamond-tall", "octagon", "star-triangle-up",
  "square-x", "diamond-wide", "hexagon2", "asterisk", "y-up"];
export const OWN_SYMBOLS = ["circle", "circle-open", "star", "x", "triangle-right", "star-diamond"];
const LABEL_FONT = 11;

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
      type: "scatter", mode: "markers", name: `baseline: ${b.name}`,
      x: [X(b.memory_bytes)], y: [Y(b.time_s)], cliponaxis: false, customdata: [[b.id, b.name]],
      hovertext: [`${esc(b.summary)}<br>MFU ${mfu(b.mfu)}`],
      // past the list, the same shapes come again with a dot in the middle: still one per baseline
      marker: { symbol: BASELINE_SYMBOLS[i % BASELINE_SYMBOLS.length] + (i >= BASELINE_SYMBOLS.length ? "-dot" : ""),
        size: 12, color: "#fff", line: { color: "#333", width: 2 } },
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
  // text beside marks, placed by placeLabels so that no two overlap (nor cover a mark)
  const labels = model.baselines.map((b) => ({ x: X(b.memory_bytes), y: Y(b.time_s), text: b.name, color: "#333", cls: "baseline" }));
  if (target) labels.push({ x: X(target.memory_bytes), y: Y(target.time_s), text: `→ ${model.resizeTarget.devices} devices`, color: "#7b3fb5", cls: "resize" });
  if (est) labels.push({ x: X(est.memory_bytes), y: Y(est.time_s), text: "your config", color: "#0a7a5a", cls: "estimate" });
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
      labels.push({ x: X(r.measured.memory_bytes), y: Y(r.measured.time_s), cls: "measured",
        text: `run ${r.id}: time ${pct(e.time)}, memory ${pct(e.memory)}`, color: "#b3261e" });
    }
  }
  if (target) {
    traces.push({
      type: "scatter", mode: "markers", name: `resize → ${model.resizeTarget.devices} devices`,
      x: [X(target.memory_bytes)], y: [Y(target.time_s)], customdata: [[target.id, model.resizeTarget.devices]], hovertext: [target.summary],
      marker: { symbol: "triangle-right", size: 15, color: "#7b3fb5" },
      hovertemplate: `resize target (${model.resizeTarget.devices} devices)<br>%{hovertext}<extra></extra>`,
    });
  }
  if (est) {
    const a = est.against_frontier;
    const where = a ? esc(a.message) : "no frontier to compare with";
    traces.push({
      type: "scatter", mode: "markers", name: "your config",
      x: [X(est.memory_bytes)], y: [Y(est.time_s)], cliponaxis: false, customdata: [[null]],
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
  const margin = { l: 72, r: 16, t: 26, b: 48 };
  const marks = [...pts.map((p) => [X(p.memory_bytes), Y(p.time_s)]), ...model.baselines.map((b) => [X(b.memory_bytes), Y(b.time_s)])];
  // the plot area as Plotly last laid it out (the legend's automatic margin included), else a guess
  const width = model.width || 700, height = model.height || 420;
  const area = model.area || { l: margin.l, t: margin.t, w: width - margin.l - margin.r, h: height - margin.t - margin.b - 60 };
  annotations.push(...placeLabels(labels, marks, { xScale, yScale, xr, yr, area, width, height }));
  const byteTick = (v) => bytes(v * xu.scale), timeTick = (v) => seconds(v * tu.scale);
  const layout = {
    margin, hovermode: "closest", dragmode: "zoom", uirevision: model.revision,
    xaxis: { title: { text: `peak memory per device (${xu.name})` }, type: xScale, range: xr, zeroline: false,
      ...(xScale === "log" ? logTicks(xr, byteTick) : {}) },
    yaxis: { title: { text: `iteration time (${tu.name})` }, type: yScale, range: yr, zeroline: false,
      ...(yScale === "log" ? logTicks(yr, timeTick) : {}) },
    // anchored by its top below the axis title: a tall legend (many baselines) used to cover the title
    legend: { orientation: "h", y: -0.2, yanchor: "top", x: 0, font: { size: 11 },
      entrywidth: model.width && model.width < 900 ? 0.5 : 0.33, entrywidthmode: "fraction" },
    shapes, annotations, font: { family: "system-ui, sans-serif", size: 12 }, plot_bgcolor: "#fff",
  };
  return { traces, layout };
}

// Ticks of a log axis at 1-2-5 values (1-9 on a short axis), each written with its unit ("512 MiB",
// "2 GiB", "20 ms", "1 s"): Plotly's own log ticks label the minor steps "2", "5" without their
// decade, so nobody could tell which tick was 2 GiB.
export function logTicks(range, fmt) {
  const lo = 10 ** range[0], hi = 10 ** range[1];
  const pick = (mults) => {
    const vals = [];
    for (let e = Math.floor(range[0]) - 1; e <= Math.ceil(range[1]); e++)
      for (const m of mults) { const v = m * 10 ** e; if (v >= lo && v <= hi) vals.push(Number(v.toPrecision(6))); }
    return vals;
  };
  let vals = pick([1, 2, 5]);
  if (vals.length > 10) vals = pick([1]);
  if (vals.length < 3) vals = pick([1, 2, 3, 4, 5, 6, 7, 8, 9]);
  if (vals.length > 10) vals = vals.filter((_, i) => i % 2 === 0);
  return { tickmode: "array", tickvals: vals, ticktext: vals.map(fmt) };
}

// Place each label at the first of a ring of spots around its mark where it overlaps no label placed
// before it and no mark; a label with no free spot is left out (the legend and the hover still name
// it). Works in pixels from the axes' ranges and the plot's size.
export function placeLabels(labels, marks, g) {
  const { l: left, t: top, w: plotW, h: plotH } = g.area;
  const frac = (v, scale, r) => ((scale === "log" ? Math.log10(Math.max(v, 1e-300)) : v) - r[0]) / (r[1] - r[0]);
  const px = (x, y) => [left + frac(x, g.xScale, g.xr) * plotW, top + (1 - frac(y, g.yScale, g.yr)) * plotH];
  const boxes = marks.map(([x, y]) => { const [cx, cy] = px(x, y); return [cx - 6, cy - 6, cx + 6, cy + 6]; });
  const PAD = 3; // between two labels, beyond the estimate of their width
  const hits = (a, b) => a[0] < b[2] + PAD && b[0] < a[2] + PAD && a[1] < b[3] + PAD && b[1] < a[3] + PAD;
  const out = [];
  const placed = [];
  for (const lab of labels) {
    const [cx, cy] = px(lab.x, lab.y);
    const w = lab.text.length * LABEL_FONT * 0.6 + 6, h = LABEL_FONT + 6;
    let best = null;
    for (const r of [14, 30, 50]) {
      for (const [dx, dy] of [[0, -1], [1, 0], [0, 1], [-1, 0], [1, -1], [1, 1], [-1, 1], [-1, -1]]) {
        const ox = dx * (r + (dx ? w / 2 : 0)), oy = dy * (r * 0.8 + (dy ? h / 2 : 0));
        const box = [cx + ox - w / 2, cy + oy - h / 2, cx + ox + w / 2, cy + oy + h / 2];
        // inside the plot area: the margins hold the axis titles and the budget lines' names
        const inPlot = box[0] >= left && box[2] <= left + plotW && box[1] >= top && box[3] <= top + plotH;
        if (inPlot && !placed.some((p) => hits(p, box)) && !boxes.some((m) => hits(m, box))) { best = { box, ox, oy }; break; }
      }
      if (best) break;
    }
    if (!best) continue;
    placed.push(best.box);
    out.push({ x: g.xScale === "log" ? Math.log10(lab.x) : lab.x, y: g.yScale === "log" ? Math.log10(lab.y) : lab.y,
      text: lab.text, showarrow: true, arrowwidth: 1, arrowcolor: lab.color, arrowhead: 0, standoff: 6, ax: best.ox, ay: best.oy,
      xanchor: "center", yanchor: "middle", font: { size: LABEL_FONT, color: lab.color }, bgcolor: "rgba(255,255,255,.8)",
      name: `label:${lab.cls}` });
  }
  return out;
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
  el._lastDraw = [model, onSelect];
  if (!el._labelObserver && window.ResizeObserver) {
    // labels are placed in pixels: a chart that changes size (the plan panel opening, the window)
    // places them again, or they would overlap where they did not before
    let timer = null, lastWidth = el.clientWidth, lastHeight = el.clientHeight;
    el._labelObserver = new ResizeObserver(() => {
      if (el.clientWidth === lastWidth && el.clientHeight === lastHeight) return;
      lastWidth = el.clientWidth; lastHeight = el.clientHeight;
      clearTimeout(timer);
      timer = setTimeout(() => { if (el._lastDraw) draw(el, ...el._lastDraw); }, 150);
    });
    el._labelObserver.observe(el);
  }
  const config = { responsive: true, displaylogo: false, modeBarButtonsToRemove: ["select2d", "lasso2d"] };
  const size = () => { const s = el._fullLayout && el._fullLayout._size; return s ? { l: s.l, t: s.t, w: s.w, h: s.h } : null; };
  const sized = (area) => figure({ ...model, width: el.clientWidth, height: el.clientHeight, area });
  let area = size();
  let { traces, layout } = sized(area);
  await window.Plotly.react(el, traces, layout, config);
  // labels are placed in pixels: once Plotly has laid the plot out (its legend moves the bottom
  // margin), place them again if the area they assumed was not the one drawn
  const drawn = size();
  if (drawn && JSON.stringify(drawn) !== JSON.stringify(area)) {
    area = drawn;
    ({ traces, layout } = sized(area));
    await window.Plotly.react(el, traces, layout, config);
  }
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
