// The new-job form. Nothing is checked here that the API checks: what a user typed goes to the
// API as typed, and the API's message is shown next to the field it names. A rejected request
// creates nothing (the service validates before it writes), and the page navigates nowhere.

import { api, ApiError } from "./api.js";
import { bytes, count, html, setHtml } from "./format.js";

const FIELDS = ["model", "file", "device", "devices", "device_counts", "global_batch", "seq_len", "precision",
  "memory_budget", "eps"];

// An API message with no location names its field in words: which field it is about.
const HINTS = [
  [/^device_counts/, "device_counts"],
  [/^(--)?devices\b|devices.per.node|device count/i, "devices"],
  [/^size\b|cannot parse size|memory.budget/i, "memory_budget"],
  [/^seq_len|positions of model|takes no seq_len/i, "seq_len"],
  [/global.batch|batch must/i, "global_batch"],
  [/has no peak FLOP|^precision|dtype/i, "precision"],
  [/unknown device|^device[: ]|measured on/i, "device"],
  [/hf_config|HF config|graph|JSON|model_type|capture/i, "file"],
  [/unknown model|model '|^model/i, "model"],
  [/cluster/i, "devices"],
  [/\beps\b/i, "eps"],
];

export function fieldOf(err, source) {
  const modelField = source === "file" ? "file" : "model";
  const e = err.errors && err.errors[0];
  if (e && Array.isArray(e.loc)) {
    const loc = e.loc.filter((x) => x !== "body");
    if (loc.length === 0) return modelField;
    if (["hf_config", "graph", "name", "request"].includes(loc[0])) return "file";
    if (loc[0] === "model") return modelField;
    if (FIELDS.includes(loc[0])) return loc[0];
  }
  for (const [re, field] of HINTS) {
    if (re.test(err.detail)) return field === "model" || field === "file" ? (field === "file" ? "file" : modelField) : field;
  }
  return "form";
}

// "12" -> 12; anything else as typed (the API says what is wrong with it)
function num(text) {
  const t = text.trim();
  if (/^-?\d+$/.test(t)) return Number(t);
  if (/^-?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$/.test(t)) return Number(t);
  return t;
}

export function initForm(form, { onCreated }) {
  const $ = (sel) => form.querySelector(sel);
  const modelSel = $("#f-model"), filter = $("#f-model-filter"), info = $("#model-info");
  const deviceSel = $("#f-device");
  let models = [];

  function setError(field, message) {
    const p = form.querySelector(`#err-${field}`);
    if (!p) return setError("form", message);
    p.textContent = message;
    p.hidden = false;
    const input = field === "model" ? modelSel : field === "file" ? $("#f-file") : form.querySelector(`[name="${field}"]`);
    if (input) input.setAttribute("aria-invalid", "true");
  }
  function clearErrors() {
    for (const p of form.querySelectorAll(".error")) { p.hidden = true; p.textContent = ""; }
    for (const el of form.querySelectorAll("[aria-invalid]")) el.removeAttribute("aria-invalid");
  }
  form.addEventListener("input", (e) => {
    const field = e.target.closest(".field");
    if (!field) return;
    const p = field.querySelector(".error");
    if (p) { p.hidden = true; p.textContent = ""; }
    e.target.removeAttribute("aria-invalid");
  });

  function renderModels() {
    const q = filter.value.trim().toLowerCase();
    const keep = modelSel.value;
    const shown = models.filter((m) => !q || `${m.name} ${m.family} ${m.kind} ${m.description}`.toLowerCase().includes(q));
    setHtml(modelSel, html`${shown.map((m) => html`<option value="${m.name}">${m.name} — ${count(m.params)} params · ${m.kind}</option>`)}`);
    if (shown.some((m) => m.name === keep)) modelSel.value = keep;
    else if (shown.length === 1 || (q && shown.some((m) => m.name === q))) modelSel.value = shown.length === 1 ? shown[0].name : q;
    showInfo();
  }
  function showInfo() {
    const m = models.find((x) => x.name === modelSel.value);
    info.textContent = m ? `${m.description}${m.default_seq_len ? ` · default seq length ${m.default_seq_len}` : ""}` : "";
    $("#f-seq-len").placeholder = m && m.default_seq_len ? String(m.default_seq_len) : m ? "none (vision)" : "model's";
  }
  filter.addEventListener("input", renderModels);
  filter.addEventListener("keydown", (e) => {
    if (e.key === "ArrowDown") { e.preventDefault(); modelSel.focus(); if (!modelSel.value && modelSel.options.length) modelSel.selectedIndex = 0; showInfo(); }
    if (e.key === "Enter") e.preventDefault();
  });
  modelSel.addEventListener("change", showInfo);

  for (const r of form.querySelectorAll('input[name="source"]')) {
    r.addEventListener("change", () => {
      const file = form.querySelector('input[name="source"]:checked').value === "file";
      $("#zoo-fields").hidden = file;
      $("#file-fields").hidden = !file;
    });
  }

  const ready = Promise.all([api.models(), api.devices()]).then(([ms, ds]) => {
    models = ms;
    renderModels();
    setHtml(deviceSel, html`${ds.map((d) => html`<option value="${d.name}">${d.name} — ${bytes(d.memory_bytes)}</option>`)}`);
    deviceSel.value = ds.some((d) => d.name === "h100-80gb") ? "h100-80gb" : ds[0] && ds[0].name;
  }).catch((e) => setError("form", `cannot load the model zoo and device catalog: ${e.message}`));

  function body() {
    const b = {};
    const val = (name) => form.querySelector(`[name="${name}"]`).value;
    b.device = val("device");
    b.devices = num(val("devices"));
    const counts = val("device_counts").split(/[\s,;]+/).filter(Boolean);
    if (counts.length) b.device_counts = counts.map(num);
    for (const k of ["global_batch", "seq_len", "eps"]) if (val(k).trim()) b[k] = num(val(k));
    if (val("memory_budget").trim()) b.memory_budget = val("memory_budget").trim(); // bytes or "40GiB"
    b.precision = val("precision");
    for (const k of ["pipeline", "recompute", "baselines"]) b[k] = form.querySelector(`[name="${k}"]`).checked;
    return b;
  }

  async function submit() {
    const source = form.querySelector('input[name="source"]:checked').value;
    const b = body();
    if (source === "zoo") {
      const m = modelSel.value || filter.value.trim();
      if (m) b.model = m;
      return api.createJob(b);
    }
    const file = $("#f-file").files[0];
    const label = $("#f-name").value.trim();
    if (!file) return api.createJob(b); // the API says that a model is missing
    let parsed = null;
    try { parsed = JSON.parse(await file.text()); } catch { parsed = null; }
    if (parsed && typeof parsed === "object" && !Array.isArray(parsed) && typeof parsed.model_type === "string") {
      return api.createJob({ ...b, hf_config: parsed, name: label || file.name.replace(/\.json$/i, "") });
    }
    return api.uploadJob(file, b); // a graph (or not JSON: the API says so)
  }

  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const button = $("#submit-job");
    if (button.disabled) return;
    clearErrors();
    button.disabled = true;
    form.setAttribute("aria-busy", "true");
    const source = form.querySelector('input[name="source"]:checked').value;
    try {
      const job = await submit();
      onCreated(job);
    } catch (err) {
      if (!(err instanceof ApiError)) throw err;
      const errs = err.errors.length ? err.errors : [null];
      errs.forEach((x, i) => {
        const one = x ? new ApiError(err.status, { detail: i === 0 ? err.detail : `${x.loc.filter((l) => l !== "body").join(".")}: ${x.msg}`, errors: [x] }) : err;
        const field = fieldOf(one, source);
        const p = form.querySelector(`#err-${field}`);
        if (p && !p.hidden) p.textContent += `\n${one.detail}`;
        else setError(field, one.detail);
      });
      const first = form.querySelector('[aria-invalid="true"]');
      if (first) first.focus();
    } finally {
      button.disabled = false;
      form.removeAttribute("aria-busy");
    }
  });

  return { ready };
}
