// Numbers as people read them.

const BYTE_UNITS = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];

export function byteUnit(max) {
  let i = 0;
  while (i < BYTE_UNITS.length - 1 && Math.abs(max) >= 1024 ** (i + 1)) i++;
  return { name: BYTE_UNITS[i], scale: 1024 ** i };
}

export function bytes(n, digits = 3) {
  if (n === null || n === undefined || !Number.isFinite(Number(n))) return "–";
  const { name, scale } = byteUnit(Number(n));
  const v = Number(n) / scale;
  return `${name === "B" ? v.toFixed(0) : Number(v.toPrecision(digits))} ${name}`;
}

export function timeUnit(max) {
  if (max >= 1) return { name: "s", scale: 1 };
  if (max >= 1e-3) return { name: "ms", scale: 1e-3 };
  return { name: "µs", scale: 1e-6 };
}

export function seconds(t, digits = 3) {
  if (t === null || t === undefined || !Number.isFinite(Number(t))) return "–";
  const { name, scale } = timeUnit(Math.abs(t));
  return `${Number((t / scale).toPrecision(digits))} ${name}`;
}

export function count(n) {
  if (n >= 1e12) return `${+(n / 1e12).toPrecision(3)} T`;
  if (n >= 1e9) return `${+(n / 1e9).toPrecision(3)} B`;
  if (n >= 1e6) return `${+(n / 1e6).toPrecision(3)} M`;
  if (n >= 1e3) return `${+(n / 1e3).toPrecision(3)} K`;
  return String(n);
}

// model FLOPs utilisation (a fraction) as a percentage: "41.2%", "0.034%"
export function mfu(x) {
  if (x === null || x === undefined || !Number.isFinite(Number(x))) return "–";
  const p = 100 * Number(x);
  return p >= 1 ? `${p.toFixed(1)}%` : `${Number(p.toPrecision(2))}%`;
}

// relative change of b against a, signed: "+12.3%" / "−4.0%"
export function pct(rel, digits = 1) {
  if (rel === null || rel === undefined || !Number.isFinite(rel)) return "–";
  if (Math.abs(rel) < 5e-5) return "0%";
  const s = (rel * 100).toFixed(Math.abs(rel) < 0.01 ? Math.max(digits, 2) : digits);
  return rel > 0 ? `+${s}%` : rel < 0 ? `−${s.slice(1)}%` : "0%";
}

export function when(iso) {
  if (!iso) return "";
  const d = new Date(iso);
  const diff = (Date.now() - d.getTime()) / 1000;
  if (diff < 60) return "just now";
  if (diff < 3600) return `${Math.floor(diff / 60)} min ago`;
  if (diff < 86400) return `${Math.floor(diff / 3600)} h ago`;
  return d.toLocaleString();
}

const ESC = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };
export const esc = (s) => String(s ?? "").replace(/[&<>"']/g, (c) => ESC[c]);

// The one way markup reaches the page. html`...` escapes every value it interpolates (a job's name,
// a worker's report, an op's name: whatever the API sent is text) unless the value is itself
// html`...` (markup this code wrote); arrays of either are concatenated; null and undefined are
// empty. setHtml(el, html`...`) is the only place that assigns innerHTML, and it refuses a plain
// string, so a template that forgot the tag fails loudly instead of inserting markup.
class Html {
  constructor(text) { this.text = text; }
  toString() { return this.text; }
}
function part(v) {
  if (v instanceof Html) return v.text;
  if (Array.isArray(v)) return v.map(part).join("");
  if (v === null || v === undefined || v === false) return "";
  return esc(v);
}
export function html(strings, ...values) {
  let out = strings[0];
  for (let i = 0; i < values.length; i++) out += part(values[i]) + strings[i + 1];
  return new Html(out);
}
export const joinHtml = (items, sep) => new Html(items.map(part).join(part(sep)));
export function setHtml(el, markup) {
  if (!(markup instanceof Html)) throw new TypeError("setHtml takes html`...` (a plain string would be inserted as markup)");
  el.innerHTML = markup.text;
}

// One wording and one look per state wherever a job, a search or a run is shown: a job's "running"
// is its search ("searching"), a run's says its step. The class keeps the API's status (scripts and
// tests find badges by it); state-* picks the look, and the CSS adds an icon, so the states differ in
// shape and word as well as colour.
export function stateOf(status, run = false) {
  return status === "running" ? (run ? "running" : "searching") : status;
}
export function stateText(status, { run = false, step = null, steps = null } = {}) {
  const state = stateOf(status, run);
  return state === "running" && steps ? `running step ${step ?? 0}/${steps}` : state;
}
export function stateBadge(status, opts = {}, prefix = "") {
  const state = stateOf(status, opts.run);
  return html`<span class="badge ${status} state-${state}" data-state="${state}">${prefix}${stateText(status, opts)}</span>`;
}
